"""Claim 3 (three phases), on Hypothesis-drawn configurations.

The measured loss curve of the full model must show warm-up, emergence and convergence as
``theory.three_phases.phase_times`` defines them, at times that agree with the expansion
ODE's within the derived tolerance, and the warm-up predicted with a wrong init-scale
exponent must be rejected (claims/three_phases.py).
"""
from __future__ import annotations

import pytest
from hypothesis import given, note, strategies as st

from claims import three_phases as claim
from claims.common import log_comparison
from numerics.config import ProblemConfig
from numerics.train import TrainConfig


@given(problem=st.sampled_from([((3,), 1), ((3,), 2), ((2, 2), 2)]), L=st.sampled_from([32, 40]),
       init_scale=st.sampled_from([0.03, 0.04]), batch=st.sampled_from([128, 192]), seed=st.integers(0, 2 ** 16))
def test_loss_curve_has_three_phases_at_predicted_times(device, problem, L, init_scale, batch, seed):
    # factored weights (the paper's architecture); logit scale 4 so that r s > 4 and the
    # emergence lands inside the expansion's domain; run length from the ODE (2 x emergence end)
    tasks, heads = problem
    cfg = ProblemConfig(tasks=tasks, heads=heads, L=L, param="factored", logit_scale=4.0,
                        init_scale=init_scale, device=device)
    tcfg = TrainConfig(lr=0.05, time=claim.horizon(cfg, 0.05), batch=batch, records=41, seed=seed)
    c = claim.check_three_phases(cfg, tcfg, eval_batch=1024)
    note(c.explain())
    log_comparison(c, __name__)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


@pytest.mark.thorough
@given(tasks=st.sampled_from([(3, 3), (4, 4), (3, 3, 3)]), L=st.sampled_from([64, 128]),
       param=st.sampled_from(["factored"]), init_scale=st.sampled_from([0.02, 0.03, 0.05]),
       seed=st.integers(0, 2 ** 16))
def test_three_phases_thorough(device, tasks, L, param, init_scale, seed):
    cfg = ProblemConfig(tasks=tasks, heads=len(tasks), L=L, param=param, logit_scale=4.0, init_scale=init_scale,
                        device=device)
    tcfg = TrainConfig(lr=0.05, time=claim.horizon(cfg, 0.05), batch=512, records=61, seed=seed)
    c = claim.check_three_phases(cfg, tcfg)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


def test_a_curve_without_emergence_is_not_three_phases(device):
    # one step of training: no drop clear of the noise, so the check must say "not three phases"
    cfg = ProblemConfig(tasks=(3,), heads=1, L=16, logit_scale=4.0, init_scale=0.05, device=device)
    c = claim.check_three_phases(cfg, TrainConfig(lr=0.05, time=0.25, batch=32, records=6), eval_batch=256)
    assert not c.agrees
    assert "three phases" in c.why


def test_run_tiny_profile(device):
    result = claim.run(profile="tiny", device=device, seed=0)
    assert result.id == claim.CLAIM_ID
    assert result.verdict == "pass", result.details
    assert result.figures and result.figures[0].spans
