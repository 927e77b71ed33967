"""Claim 1: block structure is preserved.

The law of one prompt is invariant under a group G acting on tokens z = (x, y) in R^{d+m}:

- block rotations: x -> (I + Phi_i (R_i - I) Phi_i^T) x with R_i in O(r_i) (and q, g_i
  rotated alike, so y is unchanged);
- per-task sign flips: y_i -> -y_i (with g_i, eps_i -> -g_i, -eps_i; x, q unchanged).

An element acts on the weights of one head by W -> T W T^T and U -> S_Y U T^T, where
T = blockdiag(T_X, S_Y) acts on tokens and S_Y = diag(+-1) on outputs (the prediction
y_hat transforms like y).  Since the population loss is G-invariant, its gradient is
G-equivariant, and a point fixed by G stays fixed along the flow.  The fixed set

    D = { W = [[sum_i omega_i Phi_i Phi_i^T, 0], [0, 0]],  U = [0 | diag(mu)] }

(plus W_XY, W_YY, which never receive gradient because z_q = (q, 0) has no y part; the
X-Y and Y-X blocks are killed by the sign flips, W_YY's off-diagonal too, and its
diagonal is in ker of the gradient) is computed symbolically by :func:`commutant`.

The Frobenius-orthogonal projection P_D onto D and the coordinates (omega, mu) of a point of D
are theory.reduced_ode's (:func:`theory.reduced_ode.project_decomposable`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import sympy as sp
from scipy.linalg import expm

from ._validate import check_tasks
from .reduced_ode import _block_columns, _check_weights, project_decomposable


# ---------------------------------------------------------------------------------------
# the symmetry group and its commutant (sympy, exact)
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


def act_on_weights(generator: Generator, W, U, t: float = 0.3):
    """Apply a group element to numpy weights of one head (rotation generators are
    exponentiated at angle t): returns (T W T^T, S U T^T)."""
    T = np.array(generator.T.tolist(), dtype=float)
    S = np.array(generator.S.tolist(), dtype=float)
    if generator.kind == "rotation":
        T = expm(t * T)
    return T @ np.asarray(W, float) @ T.T, S @ np.asarray(U, float) @ T.T


# ---------------------------------------------------------------------------------------
# a finite symmetry group whose fixed set is D (exact symmetrisation of a batch), and the
# pieces of (W, U) outside D by the symmetry that kills them
# ---------------------------------------------------------------------------------------

def symmetry_group(tasks) -> tuple[np.ndarray, np.ndarray]:
    """A finite subgroup G of the data's symmetry group whose fixed set is exactly D.

    Returns ``(T, S)``: T (|G|, d, d) signed permutation matrices acting on the task-basis
    coordinates Phi^T x, S (|G|, m) output sign flips.  G is the product of

    - in each block i, the group generated by the r_i coordinate sign flips and the cyclic
      shift of the block's coordinates ((Z_2)^{r_i} semidirect Z_{r_i}, order r_i 2^{r_i});
      a matrix commuting with all of it is diagonal (sign flips) with equal entries in the
      block (the shift): the X-X block of D, and blocks i != j are not intertwined;
    - the 2^m per-task output sign flips y_i -> -y_i: they kill W_YX, W_XY, U_X and the
      off-diagonal of U_Y (S M S = M for all sign vectors S forces M diagonal; S M = M
      forces M = 0).

    |G| = 2^(d+m) prod r_i (:func:`group_order`).  Every element is a signed permutation
    (with Phi = I its action on a float tensor is exact), and the set is closed under
    composition, so a batch made of whole G-orbits is G-invariant as a multiset."""
    tasks = check_tasks(tasks)
    d, m = sum(tasks), len(tasks)
    per_block = []
    for r in tasks:
        elems = []
        for shift in range(r):
            P = np.roll(np.eye(r), shift, axis=0)
            for signs in itertools.product((1.0, -1.0), repeat=r):
                elems.append(np.diag(signs) @ P)
        per_block.append(elems)
    Ts = []
    for combo in itertools.product(*per_block):
        T = np.zeros((d, d))
        a = 0
        for r, M in zip(tasks, combo):
            T[a:a + r, a:a + r] = M
            a += r
        Ts.append(T)
    Ss = np.array(list(itertools.product((1.0, -1.0), repeat=m)))
    T_all = np.array([T for T in Ts for _ in Ss])
    S_all = np.array([S for _ in Ts for S in Ss])
    return T_all, S_all


def group_order(tasks) -> int:
    """|G| = 2^(d+m) prod r_i of :func:`symmetry_group`, as an exact Python integer (at the authors'
    d = 50, m = 3 it is 2^53 x 4624 ~ 4e19, beyond int64: numpy's product overflowed)."""
    tasks = check_tasks(tasks)
    return 2 ** (sum(tasks) + len(tasks)) * math.prod(int(r) for r in tasks)


def off_decomposable_parts(W, U, tasks, basis) -> dict:
    """Frobenius norms of the pieces of (W, U) outside D, by the symmetry that kills them.

    ``sign_flip_killed``: W_YX, U_X and the off-diagonal of U_Y (killed by the per-task
    output sign flips alone); ``rotation_killed``: the X-X block of W minus its block-scalar
    part (killed only by the block rotations); ``never_trained``: the y columns of W (z_q has
    no y part, so they get no gradient); ``total``: ||(W, U)||."""
    tasks = check_tasks(tasks)
    W, U = _check_weights(W, U, tasks)
    d, m = sum(tasks), len(tasks)
    W_XX = W[:, :d, :d]
    W_XX_D = project_decomposable(W, U, tasks, basis)[0][:, :d, :d]   # block-scalar part of W_XX
    U_Y = U[:, :, d:]
    off_UY = U_Y - np.einsum("hii->hi", U_Y)[..., None] * np.eye(m)[None]
    return {
        "sign_flip_killed": float(np.sqrt(np.sum(W[:, d:, :d] ** 2) + np.sum(U[:, :, :d] ** 2)
                                          + np.sum(off_UY ** 2))),
        "rotation_killed": float(np.sqrt(np.sum((W_XX - W_XX_D) ** 2))),
        "never_trained": float(np.sqrt(np.sum(W[:, :, d:] ** 2))),
        "total": float(np.sqrt(np.sum(W ** 2) + np.sum(U ** 2))),
    }
