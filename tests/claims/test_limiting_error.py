"""Claim 5 (limiting error), on Hypothesis-drawn configurations and on the tiny profile.

A drawn configuration (m in 1..3, r in 1..4 of mixed sizes, H in 1..m+1, sigma in {0, 0.5};
L in {16, 32, 64} by default, {128, 256, 512} under ``--thorough``) trains the full model to
its converged loss and compares it with theory.exact's fixed point.  Every draw is decided by
one comparison, never skipped: inside the domain (factored, decomposable start, H = m,
converged, allocated) it must agree; a draw outside the domain, or a run that did not converge
or left the allocated set, is a boundary finding whose one-sided check (the side of the fixed
point theory puts it on, ``claims.limiting_error.check_trained_loss``) must hold.  The limit
row (L * loss -> Lambda) is drawn over (tasks, sigma); the tiny profile's run must pass
(trained rows at two L, the decay row, the bridge, the limit).
"""
from __future__ import annotations

import pytest
from hypothesis import Phase, given, note, settings, strategies as st

from claims import limiting_error as claim
from claims.core import Comparison, perturbation
from numerics.experiments.converged import TrainingSchedule, train_converged
from numerics.config import ProblemConfig
from numerics.model import TrainingDiverged
from numerics.exact_reduced import reduced_minima
from theory import exact as exact_theory
from theory import limiting_error as limit_theory

# the profiles' schedule with a smaller held-out sample (the se is in the tolerance)
TEST_SCHEDULE = TrainingSchedule(held_out_tokens=2 ** 21, held_out_min=16384)

# training runs cost seconds each: half the profile's examples (default 2, thorough 12)
HEAVY = settings(max_examples=max(2, settings.default.max_examples // 2),
                 phases=(Phase.explicit, Phase.reuse, Phase.generate))   # no shrinking: runs cost seconds
STATUSES = ("inside", "outside the domain", "saturated", "left the allocated set", "not converged")


@st.composite
def problems(draw, Ls):
    m = draw(st.integers(1, 3))
    tasks = tuple(draw(st.integers(1, 4)) for _ in range(m))
    return {"tasks": tasks, "heads": draw(st.integers(1, m + 1)), "L": draw(st.sampled_from(Ls)),
            "sigma": draw(st.sampled_from([0.0, 0.5]))}


def _decide(device, problem, seed, in_hypothesis=True):
    cfg = ProblemConfig(device=device, **problem)
    try:
        run = train_converged(cfg, TEST_SCHEDULE, seed)
    except TrainingDiverged as e:   # no converged loss: the draw is undecided, and says why
        print(f"[claim 5] tasks={list(cfg.tasks)} H={cfg.heads} L={cfg.L}: undecided: {e}")
        assert "diverged" in str(e)
        return None
    c = claim.check_trained(cfg, run, exact_theory.exact_fixed_point(cfg.tasks, cfg.L, cfg.sigma))
    if in_hypothesis:
        note(c.explain())
    status = c.details["status"]
    print(f"[claim 5] {c.name}: {status}: error {c.error:.4g} / tolerance {c.tolerance:.4g}")
    assert status.startswith(STATUSES), status
    assert status == "inside" or c.details["boundary_check"], c.details   # a boundary finding states its check
    if not claim.domain(cfg)["inside"]:
        assert status.startswith("outside the domain"), status
    assert c.agrees, c.explain()
    if status == "inside" and c.tolerance < 0.09 * c.predicted:
        # the resolution allows it: the perturbed predictions x1.1 and /1.1 are rejected
        assert c.discriminates, c.explain()
    return c


@HEAVY
@given(problem=problems((16, 32, 64)), seed=st.integers(0, 2 ** 16))
def test_trained_model_reaches_the_exact_fixed_point(device, problem, seed):
    _decide(device, problem, seed)


@pytest.mark.thorough
@HEAVY
@given(problem=problems((128, 256, 512)), seed=st.integers(0, 2 ** 16))
def test_trained_model_reaches_the_exact_fixed_point_large_L(device, problem, seed):
    _decide(device, problem, seed)


@settings(max_examples=1 if settings.default.max_examples < 10 else 6)
@given(tasks=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), sigma=st.sampled_from([0.0, 0.5]),
       seed=st.integers(0, 2 ** 16))
def test_L_times_loss_tends_to_Lambda(device, tasks, sigma, seed):
    fm = reduced_minima(tasks, sigma, 4096, 2 ** 24, 2 ** 16, device, seed=seed)[0]
    c = claim.check_limit(tasks, sigma, 4096, fm, limit_theory.limit_multi(tasks, sigma),
                          *(exact_theory.exact_fixed_point(tasks, k * 4096, sigma) for k in (1, 4)))
    note(c.explain())
    print(f"[claim 5] {c.name}: margin {c.margin:.3f}, tolerance / Lambda {c.tolerance / c.predicted:.3f}")
    assert c.agrees, c.explain()
    if c.tolerance < 0.18 * c.predicted:
        # the resolution allows it (at r = 1 the per-prompt loss is so heavy-tailed that 4096
        # prompts give a 5 % standard error, and it does not): Lambda x1.2 and /1.2 are rejected
        assert c.discriminates, c.explain()


@pytest.fixture(scope="module")
def tiny():
    return claim.SPEC.run("tiny")


def test_tiny_run_passes(tiny):
    res = tiny
    assert res.verdict == "pass", res.details.get("error") or res.details.get("comparisons")
    names = [row["name"] for row in res.headline]
    assert sum(n.startswith("converged loss of trained full model") for n in names) == 2, names
    assert any(n.startswith("decay of trained losses") for n in names), names
    assert any(n.startswith("exact reduced minimum (bridge)") for n in names), names
    assert any(n.startswith("L * loss -> Lambda") for n in names), names
    assert res.details["domain"]["conditions"] and res.details["ran"]
    for row in res.headline:
        assert set(row) == {"name", "theory", "measured", "se", "tolerance", "agrees", "side", "config", "resolving_power"}, row



def test_findings_read_fields_not_names(tiny):
    """The findings find their comparisons by the fields they were built with (details["role"],
    details["L"]: claims.core.comparisons_where), never by their names: every comparison renamed,
    the findings' sentences and numbers are unchanged."""
    import copy
    res = copy.deepcopy(tiny)
    before = [(f.kind, f.text, f.numbers) for f in claim.findings(res)]
    assert len(before) >= 3, before     # two trained runs and the limit row at least
    assert any("at L = " in text for _, text, _ in before), before
    for c in res.details["comparisons"]:
        c["name"] = "renamed"
    assert [(f.kind, f.text, f.numbers) for f in claim.findings(res)] == before


def test_undecided_run_is_undecided_not_a_pass(monkeypatch):
    """A run with no trained model inside the domain cannot decide the claim on trained models:
    verdict undecided with the reason, never pass (the runs are faked as unconverged)."""
    import claims.limiting_error as mod

    def unconverged(cfg, schedule, seed=0):     # a run that stopped while still descending
        return {"loss": 1.5, "se": 0.01, "n": 16384, "converged": False, "step_error": 0.0,
                "allocation": {"allocated": True, "same_sign_share": 0.0, "opposite_sign_share": 0.0},
                "mu": [[1.0] * cfg.m] * cfg.heads, "seconds": 0.0}
    def agreeing(name):     # bridge and limit rows that agree and discriminate (no Monte Carlo)
        def check(*a, **k):
            return Comparison(name=name, measured=1.0, predicted=1.0, error=0.0, tolerance=0.01, why="fake",
                              perturbations=[perturbation("x1.1", 0.1, 0.01)],
                              details={"minimum": {"se": 0.001, "L_times_se": 0.001}})
        return check
    from mutation import patch_kind
    patch_kind(monkeypatch, "converged", unconverged)
    monkeypatch.setattr(mod, "check_bridge", agreeing("exact reduced minimum (bridge)"))
    monkeypatch.setattr(mod, "check_limit", agreeing("L * loss -> Lambda"))
    prof = claim.LimitingErrorProfile(train_Ls=(32, 64), schedule=TEST_SCHEDULE)
    res = claim.SPEC.run(prof)
    assert all(c["agrees"] for c in res.details["comparisons"]), res.details   # every check holds ...
    assert res.verdict == "undecided" and "not decided" in res.details.get("undecided", ""), res.details  # ... undecided


def test_domain_is_decided_from_the_configuration():
    assert claim.domain(ProblemConfig(tasks=(2, 2), heads=2, L=32))["inside"]
    for bad in ({"heads": 1}, {"heads": 3}, {"param": "merged"}):
        d = claim.domain(ProblemConfig(**{"tasks": (2, 2), "heads": 2, "L": 32, **bad}))
        assert not d["inside"] and d["reasons"], d


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="profile"):
        claim.SPEC.run("huge")
    res = claim.SPEC.run("tiny", sweep="somewhere")
    assert res.verdict == "error" and "sweep" in res.details["error"]
    res = claim.SPEC.run("tiny", problem={"tasks": (2, 2), "heads": 0, "L": 32})
    assert res.verdict == "error" and "heads" in res.details["error"]
