"""Claim 6 (multi-head beats single-head, by theory's ratio, rising towards H), on
Hypothesis-drawn configurations: agreement at the derived tolerance, and rejection of the
perturbed predictions (gain exactly H; the wrong winner) at the same tolerance."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, note, settings, strategies as st

from claims import multi_head_gain as claim

# training runs and many-L minimisations: half the profile's examples (default 2, thorough 12)
HEAVY = settings(max_examples=max(2, settings.default.max_examples // 2))


# r >= 2: at r = 1 the per-prompt loss at the single head's optimum (omega ~ 0.43, a tilt
# e^{omega^2 q^2} of a chi^2 with one degree of freedom) is so heavy-tailed that its sample
# variance does not settle: the ratio's standard error at L = 4096 ranged 0.03..0.135 across
# seeds and stayed ~0.13 with 4x the prompts (CI run, hypothesis blob AEEBQQJBAEIwzA==), so a
# "4 standard errors" tolerance has no valid argument there and cannot separate the ratio
# (1.31) from the wrong winner's 1/1.31.  r = 1 stays in the theory sequence of
# test_gain_rises_towards_H.
@HEAVY
@given(r=st.integers(2, 3), m=st.integers(2, 3), sigma=st.sampled_from([0.0, 0.5]), seed=st.integers(0, 2 ** 16))
def test_gain_matches_theory(request, device, r, m, sigma, seed):
    thorough = request.config._icl_thorough
    # m = 2 only in the thorough run: there theory's gain (1.48 at r = 2, 1.58 at r = 3) lies
    # 0.4..0.5 from the perturbation "gain exactly H = 2", while the default budget's tolerance
    # on the extrapolated limit is ~0.41 (CI run: measured 1.62, tolerance 0.41, so "exactly 2"
    # was not rejected): the default budget has no power to tell them apart.  With m = 3 the
    # perturbation is >= 0.7 away.  The thorough run uses 4 L values and 4x the prompts.
    assume(thorough or m == 3)
    tasks = (r,) * m
    Ls = (256, 1024, 4096, 16384) if thorough else (256, 1024, 4096)
    rows = claim.gain_rows(tasks, sigma, Ls, seed, device, eval_elements=2 ** 23 if thorough else 2 ** 21,
                           fit_elements=2 ** 20 if thorough else 2 ** 17)
    lim = claim.check_gain_limit(tasks, sigma, rows)
    # at the largest L, where the expansion's neglected terms are smallest, measured again on 4x
    # (thorough 2x) more prompts: the evaluation budget per L is fixed, so the error grows with L
    last = claim.gain_rows(tasks, sigma, Ls[-1:], seed + 7, device, eval_elements=2 ** 24 if thorough else 2 ** 23,
                           fit_elements=2 ** 20 if thorough else 2 ** 17)[0]
    at_L = claim.check_gain_at_L(tasks, sigma, last, lim.predicted)
    for c in (lim, at_L):
        note(c.explain())
        print(f"[claim 6] {c.name}: margin {c.margin:.3f} (error {c.error:.4g} / tolerance {c.tolerance:.4g})")
        assert c.agrees, c.explain()
        assert c.discriminates, c.explain()


@given(m=st.integers(2, 8), sigma=st.sampled_from([0.0, 1.0]))
def test_gain_rises_towards_H(m, sigma):
    c = claim.check_gain_rises(m, rs=(1, 2, 4, 10, 40, 100), sigma=sigma)
    note(c.explain())
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


def test_spec_reference_values():
    """SPEC.md's table (sigma = 0): the ratios of L*loss limits, multi against single."""
    for tasks, ratio in (((4, 4, 4), 2.316), ((10, 10, 10), 2.661), ((40, 40, 40), 2.904)):
        assert abs(claim.theory_gain(tasks, 0.0) - ratio) < 5e-4


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="profile"):
        claim.run(profile="paperish")
    with pytest.raises(ValueError, match="at least 3"):
        claim.check_gain_limit((2, 2), 0.0, [{"L": 16, "ratio": 1.5, "se": 0.1}])
