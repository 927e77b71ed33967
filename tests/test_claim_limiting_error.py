"""Claim 5 (limiting error ~ Lambda / L), on Hypothesis-drawn configurations.

Each property runs the claim's own check functions (claims/limiting_error.py) and asserts
that the measurement agrees with theory at the derived tolerance *and* that every perturbed
prediction (limit constant x1.5 and x2/3, exponent -1/2 and -2, prediction x1.5) is rejected at
that same tolerance.  The drawn seeds are in the falsifying example Hypothesis prints.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, note, settings, strategies as st

from claims import limiting_error as claim
from numerics.config import ProblemConfig
from numerics.data import make_generator, sample_prompts
from numerics.reduced import reduced_predict
from numerics.train import TrainConfig

TASKS = st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple)
SIGMA = st.sampled_from([0.0, 0.5, 1.0])

# training runs and many-L minimisations: half the profile's examples (default 2, thorough 12)
HEAVY = settings(max_examples=max(2, settings.default.max_examples // 2))


@given(tasks=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple), heads=st.integers(1, 2),
       L=st.integers(2, 16), sigma=st.sampled_from([0.0, 0.7]), seed=st.integers(0, 2 ** 16))
def test_marginal_estimator_is_the_exact_reduced_loss(device, tasks, heads, L, sigma, seed):
    """The Rao-Blackwellised, importance-sampled estimator of claims.limiting_error equals
    numerics.reduced (plain Monte Carlo over whole prompts) within Z combined standard errors
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
    marg = claim.evaluate([(omega, mu)], tasks, L, sigma, n, seed + 1, device)
    est, est_se = marg[0].mean(), marg[0].std(ddof=1) / math.sqrt(n)
    tol = claim.Z * math.hypot(full_se, est_se)
    note(f"reduced_loss {full:.5g} +- {full_se:.3g}, marginal {est:.5g} +- {est_se:.3g}, tol {tol:.3g}")
    assert abs(full - est) <= tol


def _points(tasks, sigma, Ls, seed, device, eval_elements, fit_elements):
    rows = claim.exact_minima(tasks, sigma, Ls, None, seed, device, eval_elements=eval_elements,
                              fit_elements=fit_elements)
    return [{"L": r["L"], "loss": r["allocated"].loss, "se": r["allocated"].se} for r in rows]


@HEAVY
@given(tasks=TASKS, sigma=SIGMA, seed=st.integers(0, 2 ** 16))
def test_L_times_loss_tends_to_Lambda(request, device, tasks, sigma, seed):
    thorough = request.config._icl_thorough
    Ls = (256, 1024, 4096, 16384) if thorough else (256, 1024, 4096)
    pts = _points(tasks, sigma, Ls, seed, device, 2 ** 24 if thorough else 2 ** 21, 2 ** 20 if thorough else 2 ** 18)
    for check in (claim.check_limit_trend, claim.check_slope):
        c = check(tasks, sigma, pts)
        note(c.explain())
        print(f"[claim 5] {c.name}: margin {c.margin:.3f} (error {c.error:.4g} / tolerance {c.tolerance:.4g})")
        assert c.agrees, c.explain()
        assert c.discriminates, c.explain()


@HEAVY
@given(tasks=st.sampled_from([(1, 1), (2,), (1, 2)]), seed=st.integers(0, 2 ** 16))
def test_full_model_converges_to_exact_limit(device, tasks, seed):
    """The full (factored) model, trained from the default init, ends at the exact finite-L
    gradient-flow limit's loss: the bridge between training and the exact minima above."""
    cfg = ProblemConfig(tasks=tasks, heads=len(tasks), L=16, device=device)
    tcfg = TrainConfig(lr=0.1, time=20.0, batch=256, seed=seed, records=5)
    c = claim.check_converged_loss(cfg, tcfg, "full", n_eval=2 ** 15, seed=seed)
    note(c.explain())
    print(f"[claim 5] {c.name}: margin {c.margin:.3f}")
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


@pytest.mark.thorough
@given(tasks=st.sampled_from([(2, 2), (3, 3)]), L=st.sampled_from([32, 64]), seed=st.integers(0, 2 ** 16))
def test_full_model_converges_to_exact_limit_thorough(device, tasks, L, seed):
    cfg = ProblemConfig(tasks=tasks, heads=len(tasks), L=L, device=device)
    tcfg = TrainConfig(lr=0.1, time=40.0, batch=1024, seed=seed, records=11)
    c = claim.check_converged_loss(cfg, tcfg, "full", n_eval=2 ** 17, seed=seed)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="context length"):
        claim.allocated_minimum((2,), 0)
    with pytest.raises(ValueError, match="block sizes"):
        claim.allocated_minimum((0, 2), 16)
    with pytest.raises(ValueError, match="sigma"):
        claim.allocated_minimum((2,), 16, float("nan"))
    with pytest.raises(ValueError, match="at least 3"):
        claim.fit_limit([16, 32], [1.0, 1.0], [0.1, 0.1])
    with pytest.raises(ValueError, match="heads must equal"):
        claim.check_converged_loss(ProblemConfig(tasks=(1, 1), heads=1, L=4), TrainConfig(time=0.1, lr=0.1))
    with pytest.raises(ValueError, match="profile"):
        claim.run(profile="huge")


def test_tiny_run_gives_a_verdict():
    res = claim.run("tiny")
    assert res.verdict in ("pass", "fail"), res.details
    assert res.figures and res.figures[0].xscale == "log"
