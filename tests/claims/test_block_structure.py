"""Claim 1 (block structure is preserved), on Hypothesis-drawn configurations.

Each property computes the claim's own needs and runs its check functions on them
(claims/block_structure.py) and asserts
(a) the measurement agrees with the prediction at the derived tolerance and (b) every
perturbed prediction (wrong symmetry groups, broken structures) is rejected at that same
tolerance.  Every draw is inside claim 1's domain (a start in D; no condition on tasks, H,
L, sigma, parametrisation or basis), so every draw must agree.  The drawn seeds are part of
the falsifying example Hypothesis prints, so a failing case can be re-run exactly.
"""
from __future__ import annotations

import pytest
from hypothesis import given, note, settings, strategies as st

from claims import block_structure as claim
from numerics.config import ProblemConfig
from numerics.engine import Engine
from numerics.train import TrainConfig
from theory.block_structure import group_order

PARAM = st.sampled_from(["factored", "merged"])
BASIS = st.sampled_from(["identity", "random"])
SIGMA = st.sampled_from([0.0, 0.5])
EXACT_TOKENS = 2 ** 14
"""Cost cap |G| L of one exactly symmetric batch in the default run (|G| = 2^(d+m) prod r_i)."""


def computed(need, seed: int):
    """The value of one need at the report seed ``seed`` (its error raised)."""
    return Engine(seed=seed).run([need])[need]


def wrong_predictions(c):
    """The perturbations that stand for a wrong theory (not the edge probes at the tolerance)."""
    return [p for p in c.perturbations if "edge" not in p.details]


@st.composite
def tasks_heads(draw, max_group=None):
    """m in 1..3, block sizes r in 1..4 (mixed), H in 1..m+1; optionally |G| <= max_group."""
    m = draw(st.integers(1, 3))
    tasks = tuple(draw(st.lists(st.integers(1, 4), min_size=m, max_size=m)))
    if max_group is not None:
        # shrink the largest block until the symmetrised batch is affordable
        tasks = list(tasks)
        while group_order(tuple(tasks)) > max_group:
            tasks[tasks.index(max(tasks))] -= 1
            if 0 in tasks:
                tasks.remove(0)
        tasks = tuple(tasks)
    heads = draw(st.integers(1, len(tasks) + 1))
    return tasks, heads


@settings(max_examples=8)
@given(th=tasks_heads(max_group=EXACT_TOKENS // 16), L=st.integers(16, 512), sigma=SIGMA, param=PARAM,
       basis=BASIS, init_scale=st.sampled_from([0.1, 0.3, 0.6]), seed=st.integers(0, 2 ** 16),
       basis_seed=st.integers(0, 100))
def test_symmetric_batch_keeps_D_to_rounding(device, th, L, sigma, param, basis, init_scale, seed, basis_seed):
    tasks, heads = th
    L = max(16, min(L, EXACT_TOKENS // group_order(tasks)))      # the cost cap, never below L = 16
    cfg = ProblemConfig(tasks=tasks, heads=heads, L=L, sigma=sigma, param=param, basis=basis,
                        basis_seed=basis_seed, init_scale=init_scale, device=device)
    runs = computed(claim.exact_need(cfg, 0.05, 12, 1, records=4), seed)
    c = claim.check_symmetrised_exact(cfg, runs, lr=0.05, steps=12)
    note(c.explain())
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()
    # the wrong-group predictions that theory says apply (a subgroup with a larger fixed set) were all made
    assert len(wrong_predictions(c)) == 1 + (cfg.d >= 2) + (cfg.m >= 2), c.explain()
    # and the prediction off by 1.5 x its resolving power, both ways (absolute: theory predicts 0)
    assert [p.details["edge"] for p in c.perturbations if "edge" in p.details] == ["low", "high"], c.explain()


@settings(max_examples=8)
@given(th=tasks_heads(), L=st.integers(16, 512), sigma=SIGMA, param=PARAM, basis=BASIS,
       batch=st.sampled_from([64, 128]), init=st.sampled_from(["decomposable", "random_decomposable"]),
       init_scale=st.sampled_from([0.1, 0.15, 0.3]), seed=st.integers(0, 2 ** 16))
def test_fresh_batches_residual_within_noise_bound(device, th, L, sigma, param, basis, batch, init, init_scale,
                                                    seed):
    tasks, heads = th
    cfg = ProblemConfig(tasks=tasks, heads=heads, L=L, sigma=sigma, param=param, basis=basis, init=init,
                        init_scale=init_scale, init_seed=seed % 97, device=device)
    tcfg = TrainConfig(lr=0.05, time=0.8, batch=batch, records=5, seed=seed)
    c = claim.check_structure_preserved(cfg, tcfg, computed(claim.fresh_need(cfg, tcfg, 4), seed), n_probe=4)
    note(c.explain())
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()
    assert len(wrong_predictions(c)) == 1 + (cfg.d >= 2 or cfg.m >= 2), c.explain()
    assert c.resolving_power["units"] == "absolute" and c.resolving_power["high"] > c.tolerance, c.explain()


@pytest.mark.thorough
@given(th=tasks_heads(), L=st.sampled_from([64, 128, 256, 512]), sigma=SIGMA, param=PARAM, basis=BASIS,
       seed=st.integers(0, 2 ** 16))
def test_fresh_batches_thorough(device, th, L, sigma, param, basis, seed):
    tasks, heads = th
    cfg = ProblemConfig(tasks=tasks, heads=heads, L=L, sigma=sigma, param=param, basis=basis, device=device)
    tcfg = TrainConfig(lr=0.05, time=5.0, batch=512, records=21, seed=seed)
    c = claim.check_structure_preserved(cfg, tcfg, computed(claim.fresh_need(cfg, tcfg, 3), seed), n_probe=3)
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


def test_non_decomposable_start_is_refused(device):
    cfg = ProblemConfig(tasks=(1, 1), heads=1, L=4, init="random_full", device=device)
    # refused when the plan is made, before any run
    with pytest.raises(ValueError, match="point of D"):
        claim.exact_need(cfg, 0.05, 60, 1)
    with pytest.raises(ValueError, match="point of D"):
        claim.fresh_need(cfg, TrainConfig(lr=0.05, time=0.1, batch=8, records=2), 4)


def test_run_tiny_profile(device):
    result = claim.SPEC.run(profile="tiny", device=device, seed=0)
    assert result.id == claim.SPEC.id
    assert result.verdict == "pass", result.details
    assert result.figures and result.perturbations
    assert result.details["domain"]["cases_outside"] == []
    assert [r["agrees"] for r in result.headline] == [True, True], result.headline
    assert all(r["config"] and r["side"] == "two-sided" for r in result.headline), result.headline
    # every row carries its comparison's resolving power; the headline one is the exact invariance's
    assert all(r["resolving_power"]["units"] == "absolute" for r in result.headline), result.headline
    head = result.details["resolving_power"]["headline"]
    assert head["name"].startswith("symmetrised-exact") and 0 < head["eps"] < 1e-10, head
    # the findings are generated from the result's own numbers
    assert [f.kind for f in result.findings] == ["holds", "holds"], result.findings
    result.details["comparisons"][0]["measured"] = 1.25e-15
    assert "1.25e-15" in claim.findings(result)[0].text
    with pytest.raises(ValueError, match="profile"):
        claim.SPEC.run(profile="huge")


def test_run_at_a_given_problem(device):
    prof = claim.PROFILES["tiny"]
    result = claim.SPEC.run(profile="tiny", device=device, seed=1,
                       problem={"tasks": (3, 1), "heads": 2, "L": 16, "sigma": 0.5, "param": "merged",
                                "basis": "random"})
    ran = result.details["ran"]
    assert result.verdict == "pass", result.details
    assert len(ran["exact"]) == 1 and len(ran["fresh"]) == 1 and "tasks=(3, 1)" in ran["fresh"][0], ran
    # a problem whose symmetrised batch is too large: the exact check is recorded as not run
    big = claim.cases(claim.SPEC.profile(prof, {"tasks": (4, 4, 4), "heads": 3, "L": 256}))
    assert big[0] == [] and len(big[1]) == 1 and "max_exact_tokens" in big[2][0]["reason"]


def test_wrong_group_batches_are_the_subgroup_orbits():
    # the batches of the wrong-group perturbations (numerics.model.symmetrize_subgroup):
    # output sign flips only (2^m elements, x untouched) and x symmetries only (|G| / 2^m, y untouched)
    from numerics.config import make_generator, sample_prompts
    from numerics.model import symmetrize_subgroup

    cfg = ProblemConfig(tasks=(2, 1), heads=1, L=5)
    base = sample_prompts(cfg, 3, make_generator(0, "cpu"))
    signs = symmetrize_subgroup(base, cfg, "output_signs")
    xsym = symmetrize_subgroup(base, cfg, "x_symmetries")
    assert signs.batch == 3 * 2 ** cfg.m and xsym.batch == 3 * group_order(cfg.tasks) // 2 ** cfg.m
    d = cfg.d
    assert (signs.context[..., :d].reshape(-1, 3, 5, d) == base.context[None, ..., :d]).all()
    assert (xsym.context[..., d:].reshape(-1, 3, 5, cfg.m) == base.context[None, ..., d:]).all()
    assert [len(claim.wrong_groups(ProblemConfig(tasks=t, heads=1, L=4))) for t in [(1,), (2,), (1, 1)]] == [0, 1, 2]
    with pytest.raises(ValueError, match="keep must be one of"):
        symmetrize_subgroup(base, cfg, "rotations")
