"""Claims 5-6 (theory side): the limits of L * loss, the gain and its large-r limit."""
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, strategies as st

from theory.limiting_error import (F, gain, gain_limit_symbolic, limit_multi, limit_single,
                                   minimise_F, minimise_single, single_head_objective)
from theory.task_allocation import allocated_loss_at_L

# docs/model.md's reference table (sigma = 0, equal blocks, totals over tasks)
REFERENCE = [((4,) * 3, 197.49, 457.45, 2.316), ((10,) * 3, 980.84, 2610.40, 2.661),
             ((40,) * 3, 13702.7, 39796.5, 2.904), ((100,) * 8, 221818.9, 1744052.7, 7.863)]


def _sig4(a, b):
    """a and b agree to 4 significant figures (relative 5e-4 of rounding)."""
    return abs(a - b) <= 5e-4 * abs(b)


@pytest.mark.parametrize("tasks,multi,single,ratio", REFERENCE)
def test_reference_table(tasks, multi, single, ratio):
    lm, ls = limit_multi(tasks), limit_single(tasks)
    assert _sig4(lm, multi) and _sig4(ls, single) and _sig4(ls / lm, ratio)
    # perturbed predictions fail at the same tolerance: the single head's exponent D = r
    # instead of d (no shared softmax), or the multi head seeing all blocks (D = d)
    r, m = tasks[0], len(tasks)
    assert not _sig4(m * minimise_F(r, r * m)[1], multi)
    assert not _sig4(m * minimise_F(r, r)[1] * 1.01, multi)


def test_F_minimum_against_a_grid():
    w = np.linspace(1e-4, 0.5 - 1e-4, 200_001)
    for r, D, s in [(1, 1, 0.0), (4, 4, 0.0), (5, 16, 0.5)]:
        w_star, val = minimise_F(r, D, s)
        grid = F(w, r, D, s)
        assert val <= grid.min() * (1 + 1e-12)
        assert abs(w[np.argmin(grid)] - w_star) < 1e-4


@given(tasks=st.lists(st.integers(1, 8), min_size=1, max_size=3).map(tuple), sigma=st.sampled_from([0.0, 0.7]))
def test_single_head_is_a_joint_minimum_and_one_task_is_consistent(tasks, sigma):
    w, val = minimise_single(tasks, sigma)
    assert abs(single_head_objective(w, tasks, sigma) / val - 1) < 1e-12
    rng = np.random.default_rng(0)
    for _ in range(20):   # no nearby point is lower
        assert single_head_objective(w * np.exp(0.01 * rng.standard_normal(w.size)), tasks, sigma) >= val
    if len(tasks) == 1:   # one task: one head = allocated
        assert abs(limit_multi(tasks, sigma) / val - 1) < 1e-12
    else:
        assert val > limit_multi(tasks, sigma)


def test_gain_tends_to_m():
    """Symbolic limit: gain -> m; the exact sequence rises towards it."""
    assert str(gain_limit_symbolic()["gain_limit"]) == "m"
    assert gain_limit_symbolic()["gain_limit"].subs(sp.Symbol("m", positive=True), 3) == 3
    seq = [gain((r,) * 3) for r in (10, 100, 1000, 10_000)]
    assert all(a < b < 3 for a, b in zip(seq, seq[1:]))
    assert 3 - seq[-1] < 1e-3 and not 3 - seq[-1] < 1e-5   # approaches m like 1/r, not faster


def test_L_times_loss_at_L_tends_to_the_limit():
    """L * (allocated expansion minimum at L) -> limit_multi with an O(1/L) gap: the gap
    shrinks ~4x per 4x in L."""
    tasks = (4, 4, 4)
    lim = limit_multi(tasks)
    gaps = [abs(L * allocated_loss_at_L(tasks, L) - lim) for L in (250, 1000, 4000)]
    assert gaps[0] > gaps[1] > gaps[2]
    assert 3 < gaps[0] / gaps[1] < 5 and 3 < gaps[1] / gaps[2] < 5


# ---------------------------------------------------------------------------------------
# claim 6's theory, unit-tested against itself (the claim compares trained models with it)
# ---------------------------------------------------------------------------------------

@given(m=st.integers(2, 8), sigma=st.sampled_from([0.0, 1.0]))
def test_gain_rises_towards_H(m, sigma):
    """rho_inf(r) for m equal blocks rises with r, above 1 and below H = m at every finite r
    (the paper's round number H is the r -> inf limit, not the value at finite r)."""
    seq = [gain((r,) * m, sigma) for r in (1, 2, 4, 10, 40, 100)]
    assert 1 < seq[0], seq
    assert all(a < b for a, b in zip(seq, seq[1:])), seq
    assert seq[-1] < m and m - seq[-1] < m - seq[0], seq
    # a perturbed theory (gain exactly H at every r) is far from it at small r
    assert m - seq[0] > 0.1 * m, seq


@pytest.mark.parametrize("tasks", [(2, 2), (1, 3)])
def test_finite_L_gain_tends_to_rho_inf(tasks):
    """theory.exact's finite-L gain (one-head optimum / allocated fixed point of the exact loss)
    lies between 1 and H and tends to rho_inf: its gap shrinks from L = 1024 to 4096, and the
    O(1/L) expansion's gain at L (single_head_at_L / allocated_loss_at_L) approaches it."""
    from theory import exact
    from theory.limiting_error import single_head_at_L

    rho = gain(tasks)
    gaps, exp_gaps = [], []
    for L in (1024, 4096):
        g = exact.finite_L_gain(tasks, L)["gain"]
        assert 1 < g < len(tasks), g
        gaps.append(abs(g - rho))
        g_exp = single_head_at_L(tasks, L)["loss"] / allocated_loss_at_L(tasks, L)
        exp_gaps.append(abs(g_exp - g))
    assert gaps[1] < gaps[0] and gaps[1] < 0.02, gaps
    assert exp_gaps[1] < exp_gaps[0], exp_gaps
