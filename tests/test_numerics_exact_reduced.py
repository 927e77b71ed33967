"""The Rao-Blackwellised estimator of the exact finite-L reduced loss (numerics/exact_reduced.py):
against plain Monte Carlo of the reduced model on whole prompts (numerics/model.py), its
gradient against finite differences, and theory's large-L expansion against it (the
expansion's tests that need the exact loss live here: theory may not import numerics).

Tolerances: Z_SE combined standard errors (claims.core.Z_SE, the project's one policy)
for Monte-Carlo comparisons; rounding (1e-6 relative) for a finite difference of a sample
mean against the autograd derivative of the same sample mean (common random numbers).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, note, strategies as st

import numerics.exact_reduced as er
from claims.core import Z_SE
from numerics.config import ProblemConfig
from numerics.config import make_generator, sample_prompts
from numerics.model import reduced_predict
from theory import reduced_ode as ro


@given(tasks=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple), heads=st.integers(1, 2),
       L=st.integers(2, 16), sigma=st.sampled_from([0.0, 0.7]), seed=st.integers(0, 2 ** 16))
def test_marginal_estimator_is_the_exact_reduced_loss(device, tasks, heads, L, sigma, seed):
    """The Rao-Blackwellised, importance-sampled estimator of numerics.exact_reduced equals
    numerics.model (plain Monte Carlo over whole prompts) within Z_SE combined standard errors
    (a bridge between two estimators of one quantity, not a claim: no perturbation)."""
    rng = np.random.default_rng(seed)
    m = len(tasks)
    # |omega| <= 0.45: 4 omega^2 < 1, where plain Monte Carlo of the reduced loss has finite variance
    omega = rng.uniform(-0.45, 0.45, size=(heads, m))
    mu = rng.uniform(-2.0, 2.0, size=(heads, m))
    cfg = ProblemConfig(tasks=tasks, heads=heads, L=L, sigma=sigma, device=device)
    n = 6000
    prompts = sample_prompts(cfg, n, make_generator(seed, device))
    with torch.no_grad():
        pred = reduced_predict(torch.tensor(omega, device=device), torch.tensor(mu, device=device), prompts, cfg)
    per = ((pred - prompts.target) ** 2).sum(dim=1).cpu().numpy()
    full, full_se = per.mean(), per.std(ddof=1) / math.sqrt(n)
    marg = er.evaluate([(omega, mu)], tasks, L, sigma, n, seed + 1, device)
    est, est_se = marg[0].mean(), marg[0].std(ddof=1) / math.sqrt(n)
    tol = Z_SE * math.hypot(full_se, est_se)
    note(f"reduced_loss {full:.5g} +- {full_se:.3g}, marginal {est:.5g} +- {est_se:.3g}, tol {tol:.3g}")
    assert abs(full - est) <= tol


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="context length"):
        er.allocated_minimum((2,), 0)
    with pytest.raises(ValueError, match="block size"):
        er.allocated_minimum((0, 2), 16)
    with pytest.raises(ValueError, match="sigma"):
        er.allocated_minimum((2,), 16, float("nan"))
    with pytest.raises(ValueError, match="heads_per_task"):
        er.best_found_minimum((2,), 64, heads_per_task=0)
    with pytest.raises(ValueError, match="context length"):
        er.best_found_minimum((2,), -5)


# --- theory's expansion against the exact finite-L loss (ported from the theory tests) ---

def _exact(om, mu, tasks, L, sigma, n, seed):
    per = er.evaluate([(om, mu)], tasks, L, sigma, n, seed)[0]
    return float(per.mean()), float(per.std(ddof=1) / math.sqrt(per.size))


def test_expansion_agrees_with_the_exact_loss_as_L_grows():
    """At omega = 0.25, mu = 1/omega (B = 1, so the loss is the O(1/L) term), r = 2: the gap
    L*(exact - expansion) is O(1/L) (the O(L^-2) remainder is finite since 6 omega^2 < 1).
    Checks: the gap is resolved at L = 4 (> Z_SE sigma: the comparison can fail), it shrinks
    significantly from L = 4 to L = 64, and at L = 64 it is within Z_SE sigma.  A wrong
    expansion (tilt term of the pair kernel dropped) is rejected at L = 64."""
    om, mu = np.array([[0.25]]), np.array([[4.0]])
    tasks = (2,)
    gaps = {}
    for L in (4, 16, 64):
        ex, se = _exact(om, mu, tasks, L, 0.0, 100_000, L)
        gaps[L] = (L * (ex - ro.expansion_loss(om, mu, tasks, L)), L * se, L * ex)
    g4, s4, _ = gaps[4]
    g64, s64, ex64 = gaps[64]
    assert abs(g4) > Z_SE * s4, gaps
    assert abs(g4) - abs(g64) > Z_SE * np.hypot(s4, s64), gaps
    assert abs(g64) < Z_SE * s64, gaps
    # perturbed prediction: pair kernel without its tilt term c (g^T q)^2
    c, r = 0.25 ** 2, 2
    wrong = 16.0 * (r + 0.0) * (1 - 2 * c) ** (-r / 2)   # mu^2 (r + s2) block_factor
    assert abs(ex64 - wrong) > Z_SE * s64


def test_exact_gradient_is_the_derivative_and_matches_the_expansion():
    """The estimator's gradient (numerics.exact_reduced.loss_and_gradient) is the derivative
    of the sample loss on the same prompts (finite differences, common random numbers: only
    rounding, ~1e-9 relative), and agrees with the expansion's gradient at L = 64 within Z_SE
    standard errors per entry (8 entries; the O(L^-2) remainder is below one standard error
    here).  The leading-order gradient (1/L terms dropped) is rejected."""
    om = np.array([[0.3, 0.1], [-0.1, 0.25]])
    mu = np.array([[2.5, 0.5], [-0.4, 3.0]])
    tasks, sigma = (2, 3), 0.3
    G = er.loss_and_gradient(om, mu, tasks, 16, sigma, 500, 3)
    e = np.zeros_like(om)
    e[1, 0] = 1e-6
    fd_om = (er.evaluate([(om + e, mu)], tasks, 16, sigma, 500, 3).mean()
             - er.evaluate([(om - e, mu)], tasks, 16, sigma, 500, 3).mean()) / 2e-6
    fd_mu = (er.evaluate([(om, mu + e)], tasks, 16, sigma, 500, 3).mean()
             - er.evaluate([(om, mu - e)], tasks, 16, sigma, 500, 3).mean()) / 2e-6
    assert abs(fd_om - G["grad_omega"][1, 0]) < 1e-6 * (1 + abs(fd_om))
    assert abs(fd_mu - G["grad_mu"][1, 0]) < 1e-6 * (1 + abs(fd_mu))
    G = er.loss_and_gradient(om, mu, tasks, 64, sigma, 10_000, 5)
    g_om, g_mu = ro.expansion_gradient(om, mu, tasks, 64, sigma)
    z = np.concatenate([((G["grad_omega"] - g_om) / G["grad_omega_se"]).ravel(),
                        ((G["grad_mu"] - g_mu) / G["grad_mu_se"]).ravel()])
    assert np.all(np.abs(z) < Z_SE), z
    l_om, l_mu = ro.expansion_gradient(om, mu, tasks, 1e15, sigma)    # leading order only
    z_wrong = np.concatenate([((G["grad_omega"] - l_om) / G["grad_omega_se"]).ravel(),
                              ((G["grad_mu"] - l_mu) / G["grad_mu_se"]).ravel()])
    assert np.any(np.abs(z_wrong) > Z_SE), z_wrong


@pytest.mark.thorough
def test_expansion_against_the_exact_loss_two_tasks_with_noise():
    """Two heads, two tasks, sigma = 0.5, a generic point (B != 1, so the bias term counts):
    the gap shrinks from L = 8 to L = 128 and is within Z_SE standard errors at L = 128."""
    om = np.array([[0.3, 0.1], [-0.1, 0.25]])
    mu = np.array([[2.5, 0.5], [-0.4, 3.0]])
    tasks, sigma = (2, 3), 0.5
    gaps = {}
    for L in (8, 32, 128):
        ex, se = _exact(om, mu, tasks, L, sigma, 200_000, L)
        gaps[L] = (L * (ex - ro.expansion_loss(om, mu, tasks, L, sigma)), L * se)
    assert abs(gaps[8][0]) - abs(gaps[128][0]) > Z_SE * np.hypot(gaps[8][1], gaps[128][1])
    assert abs(gaps[128][0]) < Z_SE * gaps[128][1]
