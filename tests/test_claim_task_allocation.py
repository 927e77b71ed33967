"""Claim 4 (task allocation), on Hypothesis-drawn configurations.

H = m: each head ends with exactly one OV value above the run's precision threshold and
the predicted head wins each task; a permuted (wrong) winner list must be rejected.
H > m: the surplus heads decay below the threshold (claims/task_allocation.py).
"""
from __future__ import annotations

import pytest
from hypothesis import given, note, strategies as st

from claims import task_allocation as claim
from claims.common import log_comparison
from numerics.config import ProblemConfig
from numerics.train import TrainConfig


def _given(tasks, heads, favourite, s0, L, device, **kw):
    om, mu = claim.favoured_init(tasks, heads, favourite, s0)
    return ProblemConfig(tasks=tasks, heads=heads, L=L, init="given", init_omega=om, init_mu=mu, init_scale=s0,
                         device=device, **kw)


@st.composite
def allocation_problems(draw):
    m = draw(st.integers(2, 3))
    tasks = tuple(draw(st.lists(st.integers(1, 2), min_size=m, max_size=m)))
    favourite = draw(st.permutations(list(range(m))))
    return tasks, list(favourite)


# L = 8 is left out on purpose, and reported (docs/claims_1_4.md): there a head can pick up a
# *negative* off-task value through the noise (O V changes sign when O and V drift apart),
# e.g. tasks (2, 1, 1), H = 3, L = 8, B = 128, t = 16: mu[1, 0] = -0.098 against a threshold of
# 0.056 -- a finite-L boundary of the claim, towards the superposition of SPEC.md
@given(problem=allocation_problems(), L=st.sampled_from([16, 24]), s0=st.sampled_from([0.1, 0.15]),
       batch=st.sampled_from([128, 256]), seed=st.integers(0, 2 ** 16))
def test_each_head_ends_with_one_task_the_predicted_one(device, problem, L, s0, batch, seed):
    tasks, favourite = problem
    cfg = _given(tasks, len(tasks), favourite, s0, L, device)
    # the threshold is 5 standard errors of the tail mean of mu; at B = 64 and lr = 0.1 that
    # exceeds a saturated head's on-task mu (~0.35 at r = 2, L = 8), so the precision could
    # not certify a nonzero value: batch >= 128, lr = 0.05
    # and long enough (t = 16) for the off-task values to decay below it
    tcfg = TrainConfig(lr=0.05, time=16.0, batch=batch, records=41, seed=seed)
    c = claim.check_allocation(cfg, tcfg)
    note(c.explain())
    log_comparison(c, __name__)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


@given(tasks=st.sampled_from([(1, 1), (2, 2), (2, 1)]), extra=st.integers(1, 2), seed=st.integers(0, 2 ** 16))
def test_surplus_heads_decay(device, tasks, extra, seed):
    m = len(tasks)
    cfg = _given(tasks, m + extra, list(range(m)), 0.15, 16, device)
    c = claim.check_surplus_decay(cfg, TrainConfig(lr=0.1, time=10.0, batch=128, records=41, seed=seed))
    note(c.explain())
    log_comparison(c, __name__)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


@pytest.mark.thorough
@given(seed=st.integers(0, 2 ** 16), favourite=st.permutations([0, 1, 2]))
def test_allocation_thorough(device, seed, favourite):
    cfg = _given((3, 3, 3), 3, list(favourite), 0.15, 64, device)
    c = claim.check_allocation(cfg, TrainConfig(lr=0.05, time=30.0, batch=512, records=61, seed=seed))
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


def test_wrong_head_counts_are_refused(device):
    with pytest.raises(ValueError, match="H = m"):
        claim.check_allocation(ProblemConfig(tasks=(1, 1), heads=3, L=4, device=device),
                               TrainConfig(lr=0.1, time=0.5, batch=8, records=5))
    with pytest.raises(ValueError, match="H > m"):
        claim.check_surplus_decay(ProblemConfig(tasks=(1, 1), heads=2, L=4, device=device),
                                  TrainConfig(lr=0.1, time=0.5, batch=8, records=5))
    with pytest.raises(ValueError, match="tail records"):
        claim.mu_precision([[[0.0]], [[1.0]]])


def test_run_tiny_profile(device):
    result = claim.run(profile="tiny", device=device, seed=0)
    assert result.id == claim.CLAIM_ID
    assert result.verdict == "pass", result.details
    assert result.figures[0].kind == "heatmap"
