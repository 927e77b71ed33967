"""Claim 3 (theory side): the phase definition on loss curves, and the predicted warm-up
scaling with the init scale for each parametrisation."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from theory.reduced_ode import default_init
from theory.three_phases import nonincreasing_fit, phase_times, predicted_phase_times, predicted_warmup_scaling


def _curve(t, t_mid, width, top=10.0, bottom=1.0):
    return bottom + (top - bottom) / (1 + np.exp((t - t_mid) / width))


@given(t_mid=st.floats(10, 40), width=st.floats(0.5, 3), noise=st.floats(0, 0.02), seed=st.integers(0, 1000))
def test_phase_times_of_a_logistic_drop(t_mid, width, noise, seed):
    """For L(t) = 1 + 9/(1 + e^{(t - t_mid)/w}) the 10% and 90% drop times are
    t_mid -+ w ln 9 (computed exactly below for the actual start/end levels).  Tolerance:
    one record spacing (0.1, linear interpolation) + 3 x the crossing shift caused by noise:
    a level error of noise x 9 (relative noise at the level ~9) over the slope there,
    9 p (1 - p) / w = 0.81 / w at p = 0.1, i.e. 11 noise w (the monotone fit only averages
    it down, so this is conservative)."""
    t = np.linspace(0, 60, 601)
    rng = np.random.default_rng(seed)
    y = _curve(t, t_mid, width) * (1 + noise * rng.standard_normal(t.size))
    pt = phase_times(t, y)
    assert pt.defined
    L0, Lend = _curve(0, t_mid, width), _curve(60, t_mid, width)
    drop = L0 - Lend
    # exact crossing of the noiseless curve at levels L0 - 0.1 drop and L0 - 0.9 drop
    exact = [t_mid + width * np.log((10 - 1) / (L0 - f * drop - 1) - 1) for f in (0.1, 0.9)]
    tol = 0.1 + 3 * 11 * noise * width
    assert abs(pt.warmup_end - exact[0]) < tol
    assert abs(pt.emergence_end - exact[1]) < tol
    assert pt.warmup_end < pt.steepest_time < pt.emergence_end
    # a wrong prediction (boundaries shifted by 2.5 time units) is rejected at that tolerance
    assert abs(pt.warmup_end - (exact[0] + 2.5)) > tol


def test_phases_undefined_on_noise_and_bad_input():
    rng = np.random.default_rng(0)
    t = np.linspace(0, 10, 61)
    pt = phase_times(t, 1 + 0.05 * rng.standard_normal(61))
    assert not pt.defined and np.isnan(pt.warmup_end) and "noise" in pt.reason
    with pytest.raises(ValueError, match="same length"):
        phase_times(t, np.ones(60))
    with pytest.raises(ValueError, match="increasing"):
        phase_times(t[::-1], np.ones(61))
    with pytest.raises(ValueError, match="NaN"):
        phase_times(t, np.full(61, np.nan))
    with pytest.raises(ValueError, match="at least 5"):
        phase_times(t[:3], np.ones(3))


def test_nonincreasing_fit_is_the_least_squares_monotone_fit():
    y = np.array([3.0, 4.0, 2.0, 2.5, 1.0])
    f = nonincreasing_fit(y)
    assert np.all(np.diff(f) <= 0)
    assert np.allclose(f, [3.5, 3.5, 2.25, 2.25, 1.0])


def test_predicted_phases_of_the_expansion_flow():
    om, mu = default_init((4, 4, 4), 3, 0.02)
    pt, traj = predicted_phase_times(om, mu, (4, 4, 4), 1000, t_end=40, records=201)
    assert pt.defined and 0 < pt.warmup_end < pt.emergence_end < 40
    # the warm-up is a plateau: the loss at half the warm-up has barely moved (< 2% of drop)
    half = np.interp(pt.warmup_end / 2, traj.t, traj.loss)
    assert traj.loss[0] - half < 0.02 * (pt.loss_start - pt.loss_end)


def test_warmup_scaling_laws():
    """factored: T = C/s0 + c0 with C close to the decoupled race constant (the coupling and
    1/L terms shift it by a few per cent); merged: T = a + b log(1/s0) with b = 1/(2 sqrt r)
    (the growth rate of the linear flow is 2 sqrt r; B ~ mu omega grows at twice that);
    each law fits its own parametrisation better than the other's (the wrong law is
    rejected)."""
    fac = predicted_warmup_scaling((4, 4, 4), 3, 1000, 0.0, "factored", (0.005, 0.01, 0.02, 0.04))
    mer = predicted_warmup_scaling((4, 4, 4), 3, 1000, 0.0, "merged", (0.005, 0.01, 0.02, 0.04))
    assert fac["best_law"] == "inverse" and mer["best_law"] == "log"
    assert abs(fac["inverse"]["C"] / fac["inverse"]["C_race"] - 1) < 0.05
    assert abs(mer["log"]["b"] - 1 / (2 * np.sqrt(4))) < 0.1 * 0.25
    assert fac["inverse"]["rel_residual"] < 0.02 and mer["log"]["rel_residual"] < 0.02
