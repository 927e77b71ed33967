"""Claim 1 (theory side): the symmetry group of the data fixes exactly the decomposable
set D (theory.block_structure.commutant: the commutant of the group's generators, solved
exactly with sympy), and P_D is the orthogonal projection onto it."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from theory.block_structure import (act_on_weights, commutant, group_order, off_decomposable_parts,
                                   symmetry_generators, symmetry_group)
from theory.reduced_ode import decomposable_residual, decomposable_weights, project_decomposable, semi_singular_values


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
