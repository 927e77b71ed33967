"""numerics.experiments.phases.tail_standard_errors on simulated AR(1) tails: the claims' tolerance
(4 standard errors of the tail mean + the records' spread) holds the true mean about as often as it
promises, where the earlier estimator (first-difference spread, unscaled) did not."""
import math

import numpy as np
import pytest

from numerics.experiments.phases import tail_standard_errors


def _ar1(rho, n, reps, rng):
    x = np.zeros((n + 200, reps))
    e = rng.standard_normal((n + 200, reps))
    for i in range(1, n + 200):
        x[i] = rho * x[i - 1] + math.sqrt(1 - rho ** 2) * e[i]
    return x[200:]                                        # stationary, mean 0, variance 1


def _rejections(x):
    se, spread = tail_standard_errors(x)                  # per column: each a tail of its own
    return float(np.mean(np.abs(x.mean(axis=0)) > 4 * se + spread))


@pytest.mark.parametrize("rho, n, most", [(0.0, 10, 0.005), (0.6, 10, 0.02), (0.8, 20, 0.015), (0.9, 40, 0.02)])
def test_the_tolerance_holds_the_true_mean_of_a_correlated_tail(rho, n, most):
    rng = np.random.default_rng(1)
    assert _rejections(_ar1(rho, n, 3000, rng)) <= most


def test_the_spread_is_the_stationary_width_and_the_se_shrinks_with_n():
    rng = np.random.default_rng(2)
    x = _ar1(0.5, 2000, 4, rng)
    se, spread = tail_standard_errors(x)
    assert np.allclose(spread, 1.0, rtol=0.1)             # Var(x) = 1
    assert np.allclose(se, math.sqrt(1.5 / (2000 * 0.5)), rtol=0.15)   # sqrt((1 + rho)/(n (1 - rho)))


def test_the_earlier_estimate_would_fail_the_same_check():
    # the different estimator through the same check: std(diff)/sqrt 2 unscaled, plain lag-1 rho
    rng = np.random.default_rng(1)
    x = _ar1(0.8, 10, 3000, rng)
    n = x.shape[0]
    dev = x - x.mean(axis=0)
    rho = np.clip(np.sum(dev[1:] * dev[:-1], axis=0) / np.sum(dev * dev, axis=0), 0, 0.95)
    spread = np.std(np.diff(x, axis=0), axis=0, ddof=1) / math.sqrt(2)
    se = spread / np.sqrt(n * (1 - rho) / (1 + rho))
    assert np.mean(np.abs(x.mean(axis=0)) > 4 * se + spread) > 0.05
    assert _rejections(x) < 0.05


def test_too_few_records_are_refused():
    with pytest.raises(ValueError, match="at least 4"):
        tail_standard_errors(np.zeros((3, 2)))
