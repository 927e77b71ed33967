"""Claim 4 (task allocation), on Hypothesis-drawn configurations.

Inside the domain (factored, H >= m, favoured positive start, L >= L_MIN, a horizon of at
least HORIZON_FACTOR warm-up race times): every comparison of claims.task_allocation.
check_allocation agrees (OV singular values above threshold per head, winners, the exact
allocated fixed point, surplus heads at 0, the held-out loss against the exact loss) and
rejects every different prediction.  Outside it (H < m, or L below L_MIN): the boundary
check (every task resolved) holds and its counts are recorded.
"""
from __future__ import annotations

import pytest
from hypothesis import Phase, given, note, settings, strategies as st

# a draw trains a model for seconds to a minute: no shrinking (a failure reports the drawn case)
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]

from claims import task_allocation as claim
from claims.core import Z_SE, context
from numerics.config import ProblemConfig
from numerics.engine import Engine
from numerics.experiments import phases as experiments
from numerics.model import initial_values
from numerics.train import TrainConfig
from theory import saddle
from theory import task_allocation as allocation_theory


def domain_of(cfg, time=None, lr=0.05) -> dict:
    """The claim's domain of cfg for a run of ``time`` (None: theory's horizon), from its domain needs computed by an
    engine (claim.case_domain, as its plan and comparison read them)."""
    p = claim.TaskAllocationProfile(lr=lr, time=time)
    n = claim.case_needs(context(claim.SPEC, p, cfg.device), cfg)
    return claim.case_domain(p, cfg, n, Engine().run([n[k] for k in ("horizon", "rate", "unstable") if k in n]))


def measured(cfg, tcfg, held_out, seed) -> dict:
    """The claim's run of (cfg, tcfg) (numerics.experiments.phases.allocation_run), held out on ``held_out`` prompts."""
    return experiments.allocation_run(cfg, tcfg, held_out, seed, Z_SE, claim.THRESHOLD_SIGMAS)


def predicted(cfg) -> dict:
    return allocation_theory.allocation_prediction(*initial_values(cfg), cfg.tasks, cfg.L, cfg.sigma, cfg.param,
                                                   cfg.logit_scale)


@st.composite
def problems(draw, inside: bool, thorough: bool = False):
    """m in 1..3, mixed r in 1..4, H in 1..m+1 (inside: H >= m), L in 16..512, sigma in {0, 0.5}
    (inside: 0),
    the favoured head of each task drawn."""
    m = draw(st.integers(1, 3))
    # inside: equal sizes (mixed sizes are mostly outside: the small task settles slowly while
    # the large one's off-task slope already drives the run off the saddle); outside: mixed
    tasks = (draw(st.integers(1, 4)),) * m if inside else tuple(draw(st.lists(st.integers(1, 4), min_size=m, max_size=m)))
    heads = draw(st.integers(m, m + 1) if inside else st.integers(1, m + 1))
    favourite = draw(st.permutations(list(range(heads))))[:m] if heads >= m else \
        [draw(st.integers(0, heads - 1)) for _ in range(m)]
    # L = 512 only in the thorough run: its horizon is long (t ~ 130-300) and one drawn surplus
    # case there left the allocation (claims.task_allocation.ESCAPE_EFOLDS, a known miss)
    L = draw(st.sampled_from(([claim.L_MIN, 48, 64, 128] + ([512] if thorough else [])) if inside
                             else [16, 24, 32, 128] + ([512] if thorough else [])))
    # sigma > 0 lies outside the domain (the allocation is left through the label noise)
    sigma = 0.0 if inside else draw(st.sampled_from([0.0, 0.5]))
    return tasks, heads, list(favourite), L, sigma


def _train_config(cfg, seed, t_end):
    # the horizon is the domain's (theory's race and settling times); where theory's flow keeps
    # surplus heads forever (an outside case) the run stops at 80.  The batch keeps the work
    # per step ~ B L constant so that a draw at L = 512 costs what one at 32 does; B L ~ 32768
    # because SGD's stationary cloud sits off the flow's fixed point along the flat valley by
    # O(lr / B): (3,), L = 48, lr 0.05, t = 24: omega 0.6545 at B = 341 (4.8% above omega*,
    # 1.10 tolerances), 0.6355 at B = 682, 0.632 at B = 1024 (0.41-0.46 tolerances); (2,2,2), H = 4,
    # L = 128, t = 87: omega 0.614 at B = 256 (2.2 tolerances), 0.594 at B = 512 (1.08) against 0.579:
    # B L ~ 65536 leaves a bias near the tolerance for m = 3 (a known limit of the tolerance, which
    # does not model the step's bias; see claims.task_allocation)
    B = max(128, min(2048, 65536 // cfg.L))
    # records = 81: a tail of 20 records (phases.TAIL_FRACTION), the fewest at which the tail's own AR(1)
    # standard error holds its promise at the correlations these runs show (simulated AR(1) tails under
    # the claim's 4 se + spread: 2.5 % false rejections at 10 records and rho = 0.8, 0.3 % at 20;
    # tests/test_tail_standard_errors.py); at 41 records the tail (10) is too short to see its own
    # correlation time
    return TrainConfig(lr=0.05, time=t_end, batch=B, records=81, seed=seed)


@settings(max_examples=1, phases=NO_SHRINK)
@given(problem=problems(inside=True), seed=st.integers(0, 2 ** 16))
def test_inside_the_domain_every_comparison_agrees(device, problem, seed):
    tasks, heads, favourite, L, sigma = problem
    # surplus heads start small (0.2 s0): from 1 x s0 theory's own flow keeps them past any run
    cfg = experiments.favoured_problem(tasks, heads, L, favourite, device=device, sigma=sigma, surplus_mu=0.2)
    dom = domain_of(cfg)
    if not dom["inside"]:
        # theory itself puts this draw outside (e.g. L < L_MIN, or the saddle's escape within the
        # horizon): it runs as a boundary finding, never skipped
        note(f"outside the domain: {dom['reasons']}")
        c = claim.check_boundary(cfg, measured(cfg, _train_config(cfg, seed, dom["t_end"]), 8192, seed), dom)
        assert c.details["boundary"] and c.agrees and c.discriminates, c.explain()
        return
    meas = measured(cfg, _train_config(cfg, seed, dom["t_end"]), 65536, seed)
    comps = claim.check_allocation(cfg, meas, predicted(cfg), dom)
    names = [c.name for c in comps]
    assert any(n.startswith("OV singular values above threshold per head") for n in names)
    assert any(n.startswith("allocated fixed point") for n in names)
    assert any(n.startswith("trained loss") for n in names)
    assert (heads > len(tasks)) == any(n.startswith("surplus") for n in names)
    for c in comps:
        note(c.explain())
        assert c.agrees, c.explain()
        assert c.discriminates, c.explain()


@settings(max_examples=1, phases=NO_SHRINK)
@given(problem=problems(inside=False), seed=st.integers(0, 2 ** 16))
def test_outside_the_domain_is_a_recorded_boundary(device, problem, seed):
    tasks, heads, favourite, L, sigma = problem
    cfg = experiments.favoured_problem(tasks, heads, L, favourite, device=device, sigma=sigma)
    dom = domain_of(cfg)
    tcfg = _train_config(cfg, seed, dom["t_end"])
    if dom["inside"]:
        comps = claim.check_allocation(cfg, measured(cfg, tcfg, 65536, seed), predicted(cfg), dom)
        assert all(c.agrees and c.discriminates for c in comps), "\n".join(c.explain() for c in comps)
        return
    c = claim.check_boundary(cfg, measured(cfg, tcfg, 8192, seed), dom)
    note(c.explain())
    assert c.details["boundary"] and c.details["domain"]["reasons"] == dom["reasons"]
    assert len(c.details["above_per_head"]) == heads
    assert c.agrees, c.explain()          # every task resolved: the finding is conclusive
    assert c.discriminates, c.explain()


@pytest.mark.thorough
@settings(max_examples=6, phases=NO_SHRINK)
@given(problem=problems(inside=True, thorough=True), seed=st.integers(0, 2 ** 16))
def test_inside_the_domain_thorough(device, problem, seed):
    test_inside_the_domain_every_comparison_agrees.hypothesis.inner_test(device, problem, seed)


def test_domain_and_bad_input(device):
    merged = experiments.favoured_problem((1, 1), 2, 32, device=device, param="merged")
    assert not domain_of(merged, 100.0)["inside"]
    fewer = experiments.favoured_problem((1, 1, 1), 2, 32, device=device)
    fewer_domain = domain_of(fewer, 100.0)
    assert any("H = 2 < m = 3" in r for r in fewer_domain["reasons"])
    short = experiments.favoured_problem((1, 1), 2, 32, device=device)
    assert any("horizon" in r for r in domain_of(short, 1.0)["reasons"])
    with pytest.raises(ValueError, match="inside the domain"):
        claim.check_allocation(fewer, None, None, fewer_domain)     # refused before reading any run
    with pytest.raises(ValueError, match="tail records"):
        experiments.tail_standard_errors([[[0.0]], [[1.0]]])
    res = claim.SPEC.run(profile="tiny", device=device, problem={"tasks": (1,), "L": 16})
    assert res.verdict == "error" and "problem must give" in res.details["error"], res.details
    with pytest.raises(ValueError, match="profile"):
        claim.SPEC.run(profile="huge")


def test_compare_is_the_one_comparison():
    # counts: the number of differing entries against 0; values: max |diff| / tolerance against 1
    assert claim._compare([1, 0], [1, 0], 0.0) == (0.0, 0.0)
    assert claim._compare([1, 1], [1, 0], 0.0) == (1.0, 0.0)
    err, tol = claim._compare([1.0, 2.0], [1.1, 2.0], [0.2, 0.1])
    assert tol == 1.0 and abs(err - 0.5) < 1e-12


def test_run_tiny_profile(device):
    result = claim.SPEC.run(profile="tiny", device=device, seed=0)
    assert result.id == claim.SPEC.id
    assert result.verdict == "pass", result.details
    names = [row["name"] for row in result.headline]
    assert any(n.startswith("OV singular values above threshold per head") for n in names), names
    assert result.details["ran"] and all(r["inside_domain"] for r in result.details["ran"])
    assert result.figures and result.figures[0].kind == "heatmap"
    assert result.findings and result.findings[0].kind == "holds", result.findings
    assert all(row["config"] for row in result.headline), result.headline


def test_off_task_slope_is_measured_two_sided(device):
    # the saddle's slope a behind the domain's escape rule: theory's quadrature against the Monte-Carlo gradient at
    # the same point; a slope 20 % low or of the wrong sign is rejected through the same comparison
    cfg = ProblemConfig(tasks=(1, 1), heads=2, L=32, device=device)
    om, mu = saddle.allocated_point(cfg.tasks, cfg.L, cfg.sigma, heads=cfg.heads)
    g = experiments.off_task_gradient(cfg.tasks, cfg.L, cfg.sigma, om, mu, 8192, 3, device)
    c = claim.check_off_task_slope(cfg, (om, mu), saddle.off_task_slope(cfg.tasks, cfg.L, cfg.sigma, heads=2), g, 8192)
    assert c.agrees, c.explain()
    assert c.discriminates and len(c.perturbations) >= 2, c.explain()
    assert c.resolving_power["entrywise"] and 0 < c.resolving_power["low"] < 0.2, c.resolving_power
    assert c.details["escape_rate"] > 0
    # its headline row fits the schema of claims.json (a scalar se: the largest entry's)
    row = claim.headline_of(c)
    assert isinstance(row["se"], float) and isinstance(row["tolerance"], list), row


def test_a_step_past_the_stability_bound_is_not_run(device, monkeypatch):
    """Beyond d = TUNED_D a step at or past 2 / lambda_full puts the case outside the domain and the claim does not
    train it (such a run is not the flow: at the authors' blocks lr 0.05 ended with every OV value 0 and failed the
    boundary's row); the verdict is undecided (a claim that could not decide), with the reason.  lambda_full is stubbed (the Hessian at d = 10 costs
    seconds); below the bound the same case is inside the domain."""
    from mutation import patch_kind
    from numerics.experiments import converged
    cfg = experiments.favoured_problem((5, 5), 2, 32, device=device)
    assert cfg.d > converged.TUNED_D
    monkeypatch.setattr(converged, "full_stiffness", lambda c: 100.0)
    dom = domain_of(cfg, 50.0, lr=0.05)
    assert dom["unstable"] and not dom["inside"] and "stability bound 2/lambda = 0.02" in dom["reasons"][0]
    assert not domain_of(cfg, 50.0, lr=0.01)["unstable"]
    patch_kind(monkeypatch, "allocation_run", lambda **k: pytest.fail("an unstable case was trained"))
    res = claim.SPEC.run(profile="quick", device=device, problem={"tasks": (5, 5), "heads": 2, "L": 32})
    assert res.verdict == "undecided" and "not run" in res.details["undecided"], res.details
    assert "stability bound" in res.details["undecided"] and res.details["not_run"], res.details
