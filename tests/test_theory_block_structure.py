"""Claim 1 (theory side): the symmetry group of the data fixes exactly the decomposable
set D (derived here: the commutant of the group's generators, solved exactly with sympy), and
P_D is the orthogonal projection onto it."""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, strategies as st
from scipy.linalg import expm

from theory._validate import check_tasks
from theory.block_structure import group_order, off_decomposable_parts, symmetry_group
from theory.reduced_ode import (_block_columns, decomposable_residual, decomposable_weights, project_decomposable,
                                semi_singular_values)


# ---------------------------------------------------------------------------------------
# claim 1 derived: the symmetry group's generators and their commutant (sympy, exact)
# ---------------------------------------------------------------------------------------

@dataclass
class Generator:
    """One generator of the data's symmetry group acting on tokens and outputs.

    kind "rotation": an infinitesimal rotation A (antisymmetric, inside one x block) of
    SO(r_i); the group element exp(tA) acts by T = exp(tA) on x (q and g_i rotate alike, y
    unchanged); fixed weights satisfy the linearised equations A W + W A^T = 0, U A^T = 0.
    kind "reflection": T = diag(1.., -1, 1..) flipping one coordinate of an x block (with
    rotations it generates O(r_i)).
    kind "sign": S_Y = diag(.., -1, ..) flipping y_i (g_i, eps_i -> -), T = diag(I_d, S_Y).
    Fixed weights of a discrete element: T W T^T = W, S_Y U T^T = U."""

    name: str
    kind: str
    T: sp.Matrix          # (d+m) x (d+m): for "rotation" the generator A, else the element
    S: sp.Matrix          # m x m action on outputs (identity for rotations/reflections)


def symmetry_generators(tasks, group: str = "data") -> list[Generator]:
    """Generators of the symmetry group of the prompt distribution, in the task basis
    (Phi = I; for another orthonormal basis conjugate every T by blockdiag(Phi, I_m), the
    statement is basis-covariant).

    group="data": the true group, prod_i O(r_i) x {+-1}^m (block rotations and reflections,
    per-task sign flips).  Wrong groups, for tests that a wrong commutant is detected:
    "no_signs" (only block rotations/reflections), "joint_rotation" (one O(d) rotating all of
    x at once, which does NOT preserve the data law when m > 1, plus sign flips)."""
    tasks = check_tasks(tasks)
    if group not in ("data", "no_signs", "joint_rotation"):
        raise ValueError(f"group must be 'data', 'no_signs' or 'joint_rotation', got {group!r}")
    d, m = sum(tasks), len(tasks)
    n = d + m
    blocks = [(sl.start, sl.stop) for sl in _block_columns(tasks)]
    if group == "joint_rotation":
        blocks = [(0, d)]
    gens: list[Generator] = []
    for bi, (a, b) in enumerate(blocks):
        for p in range(a, b):
            for q in range(p + 1, b):
                A = sp.zeros(n, n)
                A[p, q], A[q, p] = 1, -1
                gens.append(Generator(f"rot[{bi}]({p},{q})", "rotation", A, sp.eye(m)))
        T = sp.eye(n)
        T[a, a] = -1
        gens.append(Generator(f"reflect[{bi}]({a})", "reflection", T, sp.eye(m)))
    if group != "no_signs":
        for i in range(m):
            S = sp.eye(m)
            S[i, i] = -1
            T = sp.eye(n)
            T[d + i, d + i] = -1
            gens.append(Generator(f"sign[{i}]", "sign", T, S))
    return gens


def _weight_symbols(tasks):
    d, m = sum(tasks), len(tasks)
    n = d + m
    W = sp.Matrix(n, n, lambda a, b: sp.Symbol(f"W_{a}_{b}"))
    U = sp.Matrix(m, n, lambda a, b: sp.Symbol(f"U_{a}_{b}"))
    unknowns = list(W) + list(U)
    return W, U, unknowns


@dataclass
class Commutant:
    """The weights (W, U) of one head fixed by a group: ``basis`` spans them (each element
    a pair of sympy matrices), ``dimension`` its size.  ``equals_D`` says whether, after
    dropping the inert columns W[:, d:] (they multiply the zero y-part of the query token,
    so they neither affect the model nor receive gradient), the fixed set is exactly the
    decomposable set D (same dimension and same span)."""

    tasks: tuple
    group: str
    dimension: int
    basis: list
    dimension_active: int
    equals_D: bool


def _D_basis(tasks):
    """Basis of D for one head in the task basis: Phi_i Phi_i^T in W_XX, E_ii in U_Y."""
    d, m = sum(tasks), len(tasks)
    n = d + m
    out = []
    for (a, b) in [(sl.start, sl.stop) for sl in _block_columns(tasks)]:
        W = sp.zeros(n, n)
        for p in range(a, b):
            W[p, p] = 1
        out.append((W, sp.zeros(m, n)))
    for i in range(m):
        U = sp.zeros(m, n)
        U[i, d + i] = 1
        out.append((sp.zeros(n, n), U))
    return out


@lru_cache(maxsize=None)
def commutant(tasks, group: str = "data") -> Commutant:
    """Solve the fixed-point (commutant) equations of the group exactly with sympy and
    compare the solution space with D.

    Unknowns: every entry of W ((d+m)^2) and U (m(d+m)).  Each generator contributes
    linear equations (rotation: A W + W A^T = 0, U A^T = 0; discrete: T W T^T - W = 0,
    S U T^T - U = 0); the fixed space is intersected generator by generator (nullspace of
    the equations restricted to the current solution basis).  Exact rational arithmetic;
    meant for small blocks (d + m up to ~8)."""
    tasks = check_tasks(tasks)
    d, m = sum(tasks), len(tasks)
    n = d + m
    W, U, unknowns = _weight_symbols(tasks)
    N = len(unknowns)
    basis = sp.eye(N)  # columns span the current solution space
    for g in symmetry_generators(tasks, group):
        if g.kind == "rotation":
            eqW = g.T * W + W * g.T.T
            eqU = U * g.T.T
        else:
            eqW = g.T * W * g.T.T - W
            eqU = g.S * U * g.T.T - U
        eqs = list(eqW) + list(eqU)
        M = sp.Matrix([[sp.diff(e, x) for x in unknowns] for e in eqs])
        ns = (M * basis).nullspace()
        if not ns:
            basis = sp.zeros(N, 0)
            break
        basis = basis * sp.Matrix.hstack(*ns)

    def unpack(col):
        Wv = sp.Matrix(n, n, list(col[: n * n]))
        Uv = sp.Matrix(m, n, list(col[n * n:]))
        return Wv, Uv

    sols = [unpack(basis[:, j]) for j in range(basis.shape[1])]
    # drop the inert columns W[:, d:] and compare spans with D
    def active_vec(Wv, Uv):
        Wa = Wv.copy()
        Wa[:, d:] = sp.zeros(n, m)
        return sp.Matrix(list(Wa) + list(Uv))

    act = [active_vec(*s) for s in sols]
    A_fixed = sp.Matrix.hstack(*act) if act else sp.zeros(N, 0)
    rank_fixed = A_fixed.rank() if act else 0
    Dvecs = sp.Matrix.hstack(*[sp.Matrix(list(Wv) + list(Uv)) for Wv, Uv in _D_basis(tasks)])
    rank_D = Dvecs.rank()
    rank_union = sp.Matrix.hstack(A_fixed, Dvecs).rank() if act else rank_D
    equals = rank_fixed == rank_D == rank_union
    return Commutant(tasks=tasks, group=group, dimension=len(sols), basis=sols,
                     dimension_active=rank_fixed, equals_D=bool(equals))

tasks_st = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


def _random_setup(tasks, heads, seed, random_basis=True):
    rng = np.random.default_rng(seed)
    d, m = sum(tasks), len(tasks)
    Phi = np.linalg.qr(rng.normal(size=(d, d)))[0] if random_basis else np.eye(d)
    W = rng.normal(size=(heads, d + m, d + m))
    U = rng.normal(size=(heads, m, d + m))
    return Phi, W, U


@given(tasks=tasks_st, heads=st.integers(1, 3), seed=st.integers(0, 10_000), random_basis=st.booleans())
def test_projection_is_orthogonal_and_idempotent(tasks, heads, seed, random_basis):
    Phi, W, U = _random_setup(tasks, heads, seed, random_basis)
    W_D, U_D = project_decomposable(W, U, tasks, Phi)
    W_DD, U_DD = project_decomposable(W_D, U_D, tasks, Phi)
    # idempotent and the residual is orthogonal to D (Pythagoras), to rounding
    assert np.allclose(W_DD, W_D, atol=1e-12) and np.allclose(U_DD, U_D, atol=1e-12)
    inner = np.sum((W - W_D) * W_D) + np.sum((U - U_D) * U_D)
    assert abs(inner) < 1e-10 * (np.sum(W ** 2) + np.sum(U ** 2))
    # P_D(D) = D: a decomposable point is its own projection, residual 0
    om, mu = semi_singular_values(W, U, tasks, Phi)
    W0, U0 = decomposable_weights(om, mu, tasks, Phi)
    assert np.allclose(W0, W_D) and np.allclose(U0, U_D)
    assert decomposable_residual(W0, U0, tasks, Phi) < 1e-12
    # the residual can fail: a known component orthogonal to D (an X-Y entry of W) gives
    # exactly delta / ||theta||
    delta = 0.3
    W1 = W0.copy()
    W1[0, 0, sum(tasks)] += delta
    expected = delta / np.sqrt(np.sum(W1 ** 2) + np.sum(U0 ** 2))
    assert abs(decomposable_residual(W1, U0, tasks, Phi) - expected) < 1e-12


def test_projection_minimises_distance_over_D():
    """No other point of D is closer than P_D(theta) (a perturbed omega or mu is farther)."""
    tasks = (2, 3)
    Phi, W, U = _random_setup(tasks, 2, 3)
    W_D, U_D = project_decomposable(W, U, tasks, Phi)
    best = np.sum((W - W_D) ** 2) + np.sum((U - U_D) ** 2)
    om, mu = semi_singular_values(W, U, tasks, Phi)
    for delta in (1e-3, -1e-3):
        W2, U2 = decomposable_weights(om + delta, mu, tasks, Phi)
        assert np.sum((W - W2) ** 2) + np.sum((U - U2) ** 2) > best
        W3, U3 = decomposable_weights(om, mu - delta, tasks, Phi)
        assert np.sum((W - W3) ** 2) + np.sum((U - U3) ** 2) > best


@pytest.mark.parametrize("tasks", [(1, 2), (2, 2)])
def test_commutant_of_the_data_group_is_D(tasks):
    c = commutant(tasks, "data")
    assert c.equals_D
    # dimension: m omegas + m mus, plus the m inert diagonal entries of W_YY
    assert c.dimension_active == 2 * len(tasks)
    assert c.dimension == 3 * len(tasks)


@pytest.mark.parametrize("group", ["no_signs", "joint_rotation"])
def test_commutant_of_a_wrong_group_is_not_D(group):
    """Dropping the sign flips leaves U_Y and W_XY free (too big); rotating all of x at once
    forces one omega for all tasks (too small): both are detected."""
    c = commutant((1, 2), group)
    assert not c.equals_D
    assert (c.dimension_active > 4) if group == "no_signs" else (c.dimension_active < 4)


def act_on_weights(generator: Generator, W, U, t: float = 0.3):
    """Apply a group element to numpy weights of one head (rotation generators are
    exponentiated at angle t): returns (T W T^T, S U T^T)."""
    T = np.array(generator.T.tolist(), dtype=float)
    S = np.array(generator.S.tolist(), dtype=float)
    if generator.kind == "rotation":
        T = expm(t * T)
    return T @ np.asarray(W, float) @ T.T, S @ np.asarray(U, float) @ T.T


@given(tasks=st.sampled_from([(1, 2), (2, 2), (3, 1, 2)]), seed=st.integers(0, 1000))
def test_group_fixes_D_and_moves_generic_weights(tasks, seed):
    rng = np.random.default_rng(seed)
    m = len(tasks)
    om, mu = rng.normal(size=(1, m)), rng.normal(size=(1, m))
    W, U = decomposable_weights(om, mu, tasks, np.eye(sum(tasks)))
    _, Wr, Ur = _random_setup(tasks, 1, seed, random_basis=False)
    moved = False
    for g in symmetry_generators(tasks):
        W2, U2 = act_on_weights(g, W[0], U[0])
        assert np.allclose(W2, W[0]) and np.allclose(U2, U[0])
        W3, U3 = act_on_weights(g, Wr[0], Ur[0])
        moved |= not (np.allclose(W3, Wr[0]) and np.allclose(U3, Ur[0]))
    assert moved


def test_projection_rejects_bad_input():
    Phi = np.eye(3)
    W, U = np.zeros((1, 5, 5)), np.zeros((1, 2, 5))
    with pytest.raises(ValueError, match="shape"):
        project_decomposable(np.zeros((1, 4, 4)), U, (1, 2), Phi)
    with pytest.raises(ValueError, match="orthonormal"):
        project_decomposable(W, U, (1, 2), 2 * Phi)
    with pytest.raises(ValueError, match="NaN"):
        project_decomposable(np.full((1, 5, 5), np.nan), U, (1, 2), Phi)
    with pytest.raises(ValueError, match=">= 1"):
        project_decomposable(W, U, (0, 3), Phi)
    with pytest.raises(ValueError, match="same number of heads"):
        project_decomposable(np.zeros((2, 5, 5)), U, (1, 2), Phi)


@pytest.mark.thorough
@pytest.mark.parametrize("tasks", [(1, 1, 2), (3, 2)])
def test_commutant_larger_blocks(tasks):
    assert commutant(tasks, "data").equals_D
    assert not commutant(tasks, "no_signs").equals_D


# --- the finite symmetry group of the exact symmetrisation (claims 1 and 2) -------------------

def test_symmetry_group_is_a_group_of_signed_permutations_with_the_stated_order():
    tasks = (2, 1)
    T, S = symmetry_group(tasks)
    assert len(T) == len(S) == group_order(tasks) == 2 ** 5 * 2
    assert np.all(np.abs(T).sum(axis=1) == 1) and np.all(np.abs(T).sum(axis=2) == 1)   # signed permutations
    elems = {(t.tobytes(), s.tobytes()) for t, s in zip(T, S)}
    assert len(elems) == len(T)
    # closed under composition
    for k in range(0, len(T), 7):
        for j in range(0, len(T), 5):
            assert ((T[k] @ T[j]).tobytes(), (S[k] * S[j]).tobytes()) in elems
    # off-D parts: zero at a point of D, and each piece is seen
    d = 3
    W, U = decomposable_weights([[0.3, -0.2]], [[1.0, 2.0]], tasks, np.eye(d))
    parts = off_decomposable_parts(W, U, tasks, np.eye(d))
    assert parts["sign_flip_killed"] == parts["rotation_killed"] == parts["never_trained"] == 0.0
    W2, U2 = W.copy(), U.copy()
    W2[0, d, 0] = 1.0          # W_YX
    W2[0, 0, 1] = 1.0          # off-diagonal inside block 0 (rotation-killed)
    W2[0, 0, d] = 1.0          # y column (never trained)
    parts = off_decomposable_parts(W2, U2, tasks, np.eye(d))
    assert parts["sign_flip_killed"] == pytest.approx(1.0) and parts["rotation_killed"] == pytest.approx(1.0)
    assert parts["never_trained"] == pytest.approx(1.0)
