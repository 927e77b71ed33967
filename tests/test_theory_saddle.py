"""The allocated point's saddle: theory.saddle (unit tests, numpy toys).  The claim
(boundary-saddle) and one tiny measurement of numerics.saddle compared with it:
tests/claims/test_boundary_saddle.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from theory import exact
from theory import saddle as th

TASKS, L = (1, 1), 32


@pytest.fixture(scope="module")
def alloc():
    return th.allocated_point(TASKS, L)


def test_allocated_point_and_slope(alloc):
    om, mu = alloc
    fp = exact.exact_fixed_point(TASKS, L)
    assert om.shape == mu.shape == (2, 2)
    assert np.allclose(np.diag(om), fp["omega_star"]) and np.allclose(np.diag(mu), fp["mu_star"])
    a = th.off_task_slope(TASKS, L)
    assert np.all(np.isnan(np.diag(a)))
    off = a[~np.eye(2, dtype=bool)]
    assert np.all(off > 0)                                  # a saddle: the slope is positive
    assert off == pytest.approx(0.0621012, rel=1e-5)        # the value quoted in docs/claims_1_4.md
    assert np.allclose(th.growth_rate(TASKS, L)[~np.eye(2, dtype=bool)], 2 * off)
    assert th.max_growth_rate(TASKS, L) == pytest.approx(2 * off.max())


def test_one_task_needs_a_second_head():
    with pytest.raises(ValueError, match="heads"):
        th.off_task_slope((2,), 32, heads=1)
    a = th.off_task_slope((1,), 32)                         # m = 1: head 1 is the off-task entry
    assert a.shape == (2, 1) and np.isnan(a[0, 0]) and a[1, 0] > 0


def test_curvature_against_monte_carlo(alloc):
    """c = 2 (C_hh - C_hk^2/C_kk): C_hh,i = E (sum_l p_hl y_li)^2 for head 0 (omega on task 0
    only) and task 1, by Monte Carlo in numpy, within 4 standard errors."""
    om, _ = alloc
    c = th.off_task_curvature(TASKS, L)
    rng = np.random.default_rng(0)
    n = 20000
    x = rng.standard_normal((n, L, 2))
    q = rng.standard_normal((n, 2))
    g = rng.standard_normal(n)
    s = om[0, 0] * x[:, :, 0] * q[:, None, 0]
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y1 = g[:, None] * x[:, :, 1]
    z = (p * y1).sum(axis=1) ** 2
    C_hh_mc, se = z.mean(), z.std(ddof=1) / math.sqrt(n)
    _, C_h, _, _ = exact.one_head_terms(om[0], TASKS, L)
    assert abs(C_h[1] - C_hh_mc) <= 4 * se
    assert 0 < c[0, 1] <= 2 * C_h[1]
    assert th.off_task_slope(TASKS, L)[0, 1] / c[0, 1] > 0      # the carrying level K = a / c


def test_logistic_coordinate_grows_at_2a():
    a, c = 0.06, 0.16
    K = a / c
    t = np.linspace(0, 80, 81)
    u0 = 1e-6
    # exact solution of d|mu|/dt = 2|mu|(a - c|mu|)
    u = K / (1 + (K / u0 - 1) * np.exp(-2 * a * t))
    z = th.logistic_coordinate(u, K)
    assert np.allclose(np.diff(z) / np.diff(t), 2 * a, rtol=1e-9)
    assert np.isnan(th.logistic_coordinate(np.array([K]), K))[0]


def test_gd_growth_rate():
    assert th.gd_growth_rate(0.06, 1e-6) == pytest.approx(0.12, rel=1e-5)
    assert th.gd_growth_rate(0.06, 0.2) < 0.12


def test_escape_time_and_slope():
    rate, thr = 0.12, 0.1
    assert th.escape_time(rate, thr, 1e-8) == pytest.approx(math.log(thr / 1e-8) / rate)
    assert th.escape_time(rate, thr, 1e-8, K=0.4) > th.escape_time(rate, thr, 1e-8)
    assert np.isinf(th.escape_time(0.0, thr, 1e-8)) and np.isinf(th.escape_time(-0.1, thr, 1e-8))
    # the chain imbalance -> seed -> T gives dT/dlog B = 2/rate
    a, lr, mu0, dS = rate / 2, 0.1, 0.05, -0.9
    T = [th.escape_time(rate, thr, th.seed_level(th.imbalance(lr, mu0, dS, a, B), mu0)) for B in (64, 256)]
    assert (T[1] - T[0]) / math.log(4) == pytest.approx(th.escape_time_slope(rate), rel=1e-12)
    assert th.escape_time_slope(rate) == pytest.approx(2 * th.additive_noise_slope(rate))
    assert math.isinf(th.escape_time_slope(0.0))


def test_additive_noise_seed_on_a_linear_sde():
    """y <- (1 + lr a) y + xi, Var xi = lr^2 s2 / B: Var(y_n (1 + lr a)^-n) -> additive_noise_seed."""
    rng = np.random.default_rng(1)
    a, lr, s2, B, steps, paths = 0.06, 0.1, 2.0, 64, 800, 10000
    y = np.zeros(paths)
    sd = math.sqrt(lr ** 2 * s2 / B)
    for _ in range(steps):
        y = (1 + lr * a) * y + sd * rng.standard_normal(paths)
    w = y * (1 + lr * a) ** -steps
    pred = th.additive_noise_seed(lr, s2, a, B)
    var, se = w.var(), w.var() * math.sqrt(2 / (paths - 1))
    assert abs(var - pred) <= 4 * se + pred * (1 + lr * a) ** (-2 * steps)


def test_imbalance_identity_and_drift():
    """One SGD step on U = O V changes M = O^T O - V V^T by lr^2 (V G^T G V^T - O^T G G^T O)
    exactly; on a balanced channel with noisy gradients the accumulated imbalance is
    theory.saddle.imbalance (toy: one channel, gradient a e_i e_c^T + noise with per-entry
    variances of given row and column sums)."""
    rng = np.random.default_rng(2)
    O, V, G = rng.standard_normal((2, 5)), rng.standard_normal((5, 6)), rng.standard_normal((2, 6))
    lr = 0.3
    O2, V2 = O - lr * G @ V.T, V - lr * O.T @ G
    dM = (O2.T @ O2 - V2 @ V2.T) - (O.T @ O - V @ V.T)
    assert np.allclose(dM, lr ** 2 * (V @ G.T @ G @ V.T - O.T @ G @ G.T @ O), atol=1e-12)

    # toy: o (m,), v (D,), mu = o[0] v[0]; batch gradient of U: a at (0, 0) + N/sqrt(B)
    m, D, a, mu0, B, paths = 2, 4, 0.06, 0.05, 16, 4000
    sd = np.array([[1.0, 0.7, 0.5, 0.3], [0.4, 0.2, 0.2, 0.2]])        # per-prompt sd of dl/dU entries
    S_col, S_row = (sd[:, 0] ** 2).sum(), (sd[0] ** 2).sum()
    steps = int(12 / (a * lr))
    o = np.zeros((paths, m)); v = np.zeros((paths, D))
    o[:, 0] = v[:, 0] = math.sqrt(mu0)
    for _ in range(steps):
        Gb = sd * rng.standard_normal((paths, m, D)) / math.sqrt(B)
        Gb[:, 0, 0] += a
        o, v = o - lr * np.einsum("pic,pc->pi", Gb, v), v - lr * np.einsum("pi,pic->pc", o, Gb)
    M = (o ** 2).sum(1) - (v ** 2).sum(1)
    pred = th.imbalance(lr, mu0, S_col - S_row, a, B)
    assert abs(M.mean() - pred) <= 4 * M.std(ddof=1) / math.sqrt(paths) + 0.05 * abs(pred)


def test_theory_saddle_imports_no_torch():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(th))
    names = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not names & {"torch", "numerics", "claims"}


# ---------------------------------------------------------------------------------------
# the saddle point, its discrete-time account and the escape chain
# ---------------------------------------------------------------------------------------

def test_saddle_point_and_slope_at(alloc):
    """theory.saddle.saddle_point seeds the serving heads' off-task entries; slope_at at theory's
    own served point is off_task_slope; the discrete account along a constant path is GD's
    2 log(1 + lr a)/lr, and tends to 2a as lr -> 0."""
    sp = th.saddle_point(TASKS, 2, L)
    assert sp.entries == ((0, 1), (1, 0)) and sp.rate == pytest.approx(2 * 0.0621012, rel=1e-5)
    assert np.allclose(th.slope_at(sp.omega, sp.mu_star, TASKS, L), sp.a, rtol=1e-9)
    path_om, path_mu = np.array([sp.omega] * 3), np.array([sp.mu_star] * 3)
    assert th.discrete_rate_along(path_om, path_mu, 0.2, TASKS, L) == pytest.approx(
        float(np.mean(th.gd_growth_rate(sp.a, 0.2))), rel=1e-12)
    assert th.discrete_rate_along(path_om, path_mu, 1e-6, TASKS, L) == pytest.approx(sp.rate, rel=1e-5)
    # a served point displaced to a larger omega and smaller mu (as SGD holds it) has a smaller slope
    om = sp.omega.copy()
    om[0, 0] = om[1, 1] = 1.08 * sp.omega[0, 0]
    assert np.all(th.slope_at(om, 0.98 * sp.mu_star, TASKS, L) < sp.a)


def test_gd_map_of_the_channel():
    """The balanced factored channel's own GD map: y = o - v is multiplied by 1 + lr a per step
    exactly (o' = o - lr a v, v' = v - lr a o), so |mu| = y^2/4 grows at 2 log(1 + lr a)/lr per
    unit time (theory.saddle section 1b)."""
    a, lr, steps = 0.07, 0.2, 200
    o, v = 1e-4, -1e-4
    for _ in range(steps):
        o, v = o - lr * a * v, v - lr * a * o
    rate = math.log(abs(o * v) / 1e-8) / (lr * steps)
    assert rate == pytest.approx(float(th.gd_growth_rate(a, lr)), rel=1e-9)


def test_saddle_point_cache_follows_a_replaced_slope(monkeypatch):
    """The cache is keyed by the functions the point is built from: a replaced off_task_slope
    (the mutation suite's) is never answered from a value cached before."""
    before = th.saddle_point(TASKS, 2, L).rate
    original = th.off_task_slope
    monkeypatch.setattr(th, "off_task_slope", lambda *a, **k: 0.5 * original(*a, **k))
    assert th.saddle_point(TASKS, 2, L).rate == pytest.approx(before / 2, rel=1e-12)


def test_escape_prediction_is_the_chain():
    """escape_prediction is imbalance -> seed -> T at GD's rate, per batch size, and its slope
    2/rate; the values quoted in docs/saddle.md ((2,2), L = 64, lr 0.2, quick's dS)."""
    p = th.escape_prediction((2, 2), 2, 64, 0.0, 0.2, (128, 362, 1024), 0.05, 0.1, [-1.62, -1.59], [0.038, 0.063])
    assert np.allclose(p["T_pred"], [72.53, 84.53, 96.53], atol=0.01)
    assert (p["T_pred"][2] - p["T_pred"][0]) / math.log(1024 / 128) == pytest.approx(p["slope_pred"], rel=1e-9)
    assert p["slope_pred"] == pytest.approx(2 * p["slope_additive"]) and p["step_bias"] > 0
    assert all(Ta > T for Ta, T in zip(p["T_pred_rate_a"], p["T_pred"]))
