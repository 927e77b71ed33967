"""Claim 2 (spectral reduction), on Hypothesis-drawn configurations.

(a) gradient projection at drawn points of D, (b) full vs reduced trajectories on the same
(exactly symmetric) samples over the whole run, (c) the large-L expansion with an error
that shrinks as L grows (thorough only: not resolved reliably at default-run sizes).  Each asserts agreement at the derived tolerance and that the
perturbed predictions (metric off by a factor 2, wrong exponent, wrong metric) are
rejected at the same tolerance (claims/spectral_reduction.py).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note, strategies as st

from claims import spectral_reduction as claim
from claims.common import log_comparison
from numerics.config import ProblemConfig
from numerics.train import TrainConfig

PARAM = st.sampled_from(["factored", "merged"])
BASIS = st.sampled_from(["identity", "random"])


@st.composite
def decomposable_points(draw):
    tasks = draw(st.sampled_from([(1,), (2,), (1, 1), (2, 1), (3, 2), (1, 1, 1), (2, 2, 1)]))
    heads = draw(st.integers(1, 3))
    m = len(tasks)
    # |omega| <= 0.9: softmax logits stay moderate; mu of both signs
    om = draw(st.lists(st.floats(0.02, 0.9), min_size=heads * m, max_size=heads * m))
    om_sign = draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=heads * m, max_size=heads * m))
    mu = draw(st.lists(st.floats(-2.0, 2.0).filter(lambda v: abs(v) > 1e-3), min_size=heads * m, max_size=heads * m))
    return (tasks, heads, np.reshape(np.multiply(om, om_sign), (heads, m)), np.reshape(mu, (heads, m)))


@given(point=decomposable_points(), L=st.integers(1, 32), param=PARAM, basis=BASIS,
       logit_scale=st.sampled_from([1.0, 0.5, 4.0]), sigma=st.sampled_from([0.0, 0.5]),
       batch=st.sampled_from([8, 32]), seed=st.integers(0, 2 ** 16))
def test_projected_full_gradient_is_reduced_gradient(device, point, L, param, basis, logit_scale, sigma, batch, seed):
    tasks, heads, omega, mu = point
    cfg = ProblemConfig(tasks=tasks, heads=heads, L=L, param=param, basis=basis, logit_scale=logit_scale,
                        sigma=sigma, device=device)
    c = claim.check_gradient_projection(cfg, omega, mu, batch=batch, seed=seed)
    note(c.explain())
    log_comparison(c, __name__)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


@given(tasks=st.sampled_from([(1,), (1, 1), (2, 1), (1, 2)]), heads=st.integers(1, 3), L=st.integers(2, 8),
       param=PARAM, basis=BASIS, init_scale=st.sampled_from([0.2, 0.3, 0.5]), seed=st.integers(0, 2 ** 16))
def test_full_trajectory_follows_reduced_flow(device, tasks, heads, L, param, basis, init_scale, seed):
    cfg = ProblemConfig(tasks=tasks, heads=heads, L=L, param=param, basis=basis, init_scale=init_scale,
                        device=device)
    # a fixed batch of a few prompts can make the flow stiff (fast transients in the first
    # steps); lr=None picks the step from that stiffness (1% relative change per step) so
    # that the O(lr) Richardson tolerance lies below the effect of a wrong metric constant
    c = claim.check_trajectory_agreement(cfg, lr=None, time=0.5, base_prompts=4, seed=seed, record_every=2)
    note(c.explain())
    log_comparison(c, __name__)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


@pytest.mark.thorough
@given(seed=st.integers(0, 2 ** 16), tasks=st.sampled_from([(3,), (4,), (3, 3)]))
def test_expansion_error_shrinks_with_L_thorough(device, seed, tasks):
    # Only in the thorough run.  At default-run sizes (B = 256, L = 4..64, 3 streams) the
    # noise-corrected gap falls from ~0.05 to ~0.01 but its Monte-Carlo error (~0.01-0.02)
    # leaves p + 2 se(p) between -0.4 and +0.3 depending on the seeds: the trend is not
    # resolved reliably there (docs/claims_1_4.md), so a default test would be flaky.
    # Larger L and batch, a smaller step (the SGD bias ~ lr/B of the multiplicative factored
    # updates puts a floor under the gap that does not shrink with L).
    cfg = ProblemConfig(tasks=tasks, heads=len(tasks), L=8, logit_scale=8.0, init_scale=0.15, device=device)
    tcfg = TrainConfig(lr=0.02, time=4.0, batch=2048, records=9)
    c = claim.check_expansion_trend(cfg, [8, 32, 128, 512], tcfg, seeds=(seed, seed + 1, seed + 2))
    log_comparison(c, __name__)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


def test_bad_input_is_refused(device):
    cfg = ProblemConfig(tasks=(1, 1), heads=1, L=4, device=device)
    with pytest.raises(ValueError, match="shape"):
        claim.check_gradient_projection(cfg, [[0.1]], [[0.1]])
    with pytest.raises(ValueError, match="time/lr"):
        claim.check_trajectory_agreement(cfg, lr=0.05, time=0.07)
    with pytest.raises(ValueError, match=">= 3"):
        claim.check_expansion_trend(cfg, [8, 16], TrainConfig(lr=0.05, time=0.1, batch=8, records=2))


def test_run_tiny_profile(device):
    result = claim.run(profile="tiny", device=device, seed=0)
    assert result.id == claim.CLAIM_ID
    assert result.verdict == "pass", result.details
    assert result.figures and result.perturbations
