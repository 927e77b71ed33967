"""Claim 5 (limiting error ~ Lambda / L), on Hypothesis-drawn configurations.

Each property runs the claim's own check functions (claims/limiting_error.py) and asserts
that the measurement agrees with theory at the derived tolerance *and* that every perturbed
prediction (limit constant x1.5 and x2/3, exponent -1/2 and -2, prediction x1.5) is rejected at
that same tolerance.  The drawn seeds are in the falsifying example Hypothesis prints.
"""
from __future__ import annotations

import pytest
from hypothesis import given, note, settings, strategies as st

from claims import limiting_error as claim
from claims.common import fit_limit
from numerics.config import ProblemConfig
from numerics.exact_reduced import exact_minima
from numerics.train import TrainConfig

TASKS = st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple)
SIGMA = st.sampled_from([0.0, 0.5, 1.0])

# training runs and many-L minimisations: half the profile's examples (default 2, thorough 12)
HEAVY = settings(max_examples=max(2, settings.default.max_examples // 2))


def _points(tasks, sigma, Ls, seed, device, eval_elements, fit_elements):
    rows = exact_minima(tasks, sigma, Ls, None, seed, device, eval_elements=eval_elements,
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
    with pytest.raises(ValueError, match="at least 3"):
        fit_limit([16, 32], [1.0, 1.0], [0.1, 0.1])
    with pytest.raises(ValueError, match="heads must equal"):
        claim.check_converged_loss(ProblemConfig(tasks=(1, 1), heads=1, L=4), TrainConfig(time=0.1, lr=0.1))
    with pytest.raises(ValueError, match="profile"):
        claim.run(profile="huge")


def test_tiny_run_gives_a_verdict():
    res = claim.run("tiny")
    assert res.verdict in ("pass", "fail"), res.details
    assert res.figures and res.figures[0].xscale == "log"
