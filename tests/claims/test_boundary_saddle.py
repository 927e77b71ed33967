"""boundary-saddle at the tiny profile: the growth rate at each step agrees with the discrete
map at the held point, its lr -> 0 extrapolation with theory's 2a, both reject a and 0; the
invariant flow stays at rounding; the findings are generated from the numbers.  And one tiny
measurement of numerics.saddle (the growth rate, no prediction) through the claim's comparison.
theory.saddle's unit tests: tests/test_theory_saddle.py."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from claims import boundary_saddle as claim

TASKS, L = (1, 1), 32     # the tiny measurement's problem


def test_tiny_saddle_rows_and_findings():
    res = claim.SPEC.run("tiny")
    assert res.kind == "boundary" and res.verdict in ("located", "undecided"), res.details
    comps = {c["name"].split(",")[0]: c for c in res.details["comparisons"]}
    growth = comps["saddle: growth rate of off-task |mu| vs 2a"]
    assert growth["agrees"] and all(p["rejected"] for p in growth["perturbations"]), growth
    assert growth["details"]["lrs"] == [0.2, 0.1] and growth["predicted"] == pytest.approx(2 * 0.0621012, rel=1e-5)
    steps = [c for n, c in comps.items() if n.startswith("saddle: growth rate at lr=")]
    assert len(steps) == 2 and all(c["agrees"] and all(p["rejected"] for p in c["perturbations"]) for c in steps)
    assert comps["saddle: noiseless flow on a G-invariant batch stays"]["agrees"]
    assert sum(f.kind == "beyond" for f in res.findings) >= 3
    # the sentence is the result's own numbers: change one, the sentence changes
    before = claim.findings(res)[0].text
    res.details["comparisons"][[c["name"] for c in res.details["comparisons"]].index(growth["name"])]["measured"] = 0.5
    assert claim.findings(res)[0].text != before and "0.5" in claim.findings(res)[0].text
    # the findings read the comparisons' fields (details["role"], config), not their names
    texts = [f.text for f in claim.findings(res)]
    for c in res.details["comparisons"]:
        c["name"] = "renamed"
    assert [f.text for f in claim.findings(res)] == texts


def test_pooled_slope_ratio():
    """Inverse-variance pooling of the slopes in units of theory's 1/a; agrees with 1, rejects 1/2 and 2."""
    e1 = SimpleNamespace(slope=16.0, slope_se=1.0)
    e2 = SimpleNamespace(slope=11.0, slope_se=2.0)
    c = claim.check_pooled_slope([e1, e2], [16.2, 11.5], "two configurations")
    w = np.array([16.2 ** 2, (11.5 / 2) ** 2])
    r = np.array([16.0 / 16.2, 11.0 / 11.5])
    assert c.measured == pytest.approx((w * r).sum() / w.sum())
    assert c.agrees and c.discriminates, c.explain()


def test_extrapolated_rate_rejects_the_step_biased_rate():
    """The lr -> 0 extrapolation through the same comparison: rates that fall quadratically with
    lr towards 2a agree with 2a; the same rates all shifted by the step bias of the largest lr
    (the measurement at one step taken for the limit) are rejected."""
    sp = __import__("theory.saddle", fromlist=["saddle_point"]).saddle_point((1, 1), 2, 32)
    lrs = (0.2, 0.1, 0.05)
    def g(lr, shift=0.0):
        r = sp.rate - 0.5 * lr ** 2 - shift
        return SimpleNamespace(lr=lr, measured=r, se=2e-4, raw=r, config={"tasks": [1, 1], "heads": 2, "L": 32},
                               batch=512, seeds=(0, 1, 2), mu0=0.05)
    assert claim.check_growth_rate([g(x) for x in lrs], "toy").agrees
    assert not claim.check_growth_rate([g(x, 0.02) for x in lrs], "toy").agrees


# ---------------------------------------------------------------------------------------
# numerics: one tiny measurement
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_growth():
    from numerics import saddle as S
    from numerics.config import ProblemConfig

    cfg = ProblemConfig(tasks=TASKS, heads=2, L=L)
    runs = S.saddle_runs(cfg, lr=0.2, batches=[256], seeds=[0, 1], mu0=0.1, t_max=250.0, seed=0, stop_share=0.05,
                         record_dt=1.0)
    return S, cfg, runs, S.growth_rate_measurement(cfg, 0.2, 256, [0, 1], runs)


def test_exact_allocated_point_is_never_left(tiny_growth):
    """The floor runs start at the exact allocated point: the empty off-task channel stayed
    exactly 0 (saddle_runs raises otherwise); the off-task |mu| is the served channel's noise."""
    S, cfg, runs, g = tiny_growth
    assert 0 < runs.floor[256] < 0.01 * runs.theory.mu_star.min()


def test_tiny_growth_rate_is_measured(tiny_growth):
    """Measurements only: the rate, its window and the path of served points the runs held
    (where theory evaluates its discrete-time account), no prediction."""
    S, cfg, runs, g = tiny_growth
    assert not any(hasattr(g, k) for k in ("predicted", "a", "step_bias", "rate_at_held_point"))
    assert g.e_folds > 2 and g.points >= 5 and len(g.per_seed) == 2 and g.se > 0
    assert len(g.path_omega) == len(g.path_served) == 2
    assert all(p.shape == (min(S.PATH_POINTS, g.points), 2, 2) or p.shape[1:] == (2, 2) for p in g.path_omega)
    assert 0 <= g.off_task_omega < 0.01
    # every run left through the opposite-sign branch
    assert all(r.escaped and np.all(r.mu_off[-1] < 0) for r in runs.runs.values())


def test_tiny_growth_rate_agrees_with_the_discrete_map(tiny_growth):
    """The claim's comparison of this measurement: agrees with the discrete map at the held
    point, rejects the amplitude's rate and rate 0."""
    from claims.boundary_saddle import check_step_rate

    c = check_step_rate(tiny_growth[3], "tiny")
    assert c.agrees, c.explain()
    names = [p.description for p in c.perturbations]
    assert any("amplitude" in n for n in names) and any("rate 0" in n for n in names)
    assert c.discriminates, c.explain()


def test_run_is_reproducible(tiny_growth):
    S, cfg, runs, g = tiny_growth
    a = S.saddle_run(cfg, 0.2, 64, 3, 0.1, 4.0, record_dt=1.0)
    b = S.saddle_run(cfg, 0.2, 64, 3, 0.1, 4.0, record_dt=1.0)
    assert np.array_equal(a.mu_off, b.mu_off) and np.array_equal(a.o, b.o)


def test_invariant_run_halves_a_step_that_leaves_D(monkeypatch):
    """numerics.saddle.invariant_flow_measurement lowers the step until GD on the fixed batch keeps
    its off-D residual at rounding (a step past the batch's stability edge is not the flow), records
    the steps that left, and the claim's finding names them; a run that leaves at every step is
    not compared (no twin is run for it) and said so."""
    from numerics import saddle as ns
    from numerics.config import ProblemConfig
    calls = []

    def fake_run(cfg, lr, batch, seed, mu0, t_max, stop_share=0.1, record_dt=0.5, batches=None, start=None,
                 stop_residual=np.inf):
        calls.append(lr)
        leaves = lr > leave_above
        t = np.arange(0.0, 4.0 if leaves else t_max + 1e-9, 1.0)
        resid = np.full(t.shape, 1e-17)
        if leaves:
            resid[-1] = 1e-3
        z = np.zeros((len(t), 2))
        return ns.SaddleRun(batch=batch, seed=seed, lr=lr, mu0=mu0, t=t, mu_off=z + mu0, served=z + 1, o=z, v=z,
                            omega=np.zeros((len(t), 2, 2)), t_stop=float(t[-1]), escaped=leaves, wall=0.0,
                            residual=resid)

    monkeypatch.setattr(ns, "saddle_run", fake_run)
    cfg = ProblemConfig(tasks=(1, 1), heads=2, L=16)
    leave_above = 0.06
    inv = ns.invariant_flow_measurement(cfg, 0.2, 10.0, 0.05, 64, seed=7)
    assert inv.stable and inv.lr == 0.05 and inv.requested_lr == 0.2 and inv.steps == 200
    assert calls == [0.2, 0.1, 0.05, 0.05]              # the steps tried, then the twin at the one kept
    assert [u["lr"] for u in inv.unstable] == [0.2, 0.1] and all(u["residual"] == 1e-3 for u in inv.unstable)
    comp = claim.check_invariant_flow(inv, 0.7, "cfg")
    assert comp.agrees and comp.details["unstable"][0]["lr"] == 0.2
    res = SimpleNamespace(id="boundary-saddle", details={"comparisons": [comp.summary()]})
    text, = [f.text for f in claim.invariant_findings(res)]
    assert "at lr 0.2, 0.1 leaves D by a step-size instability" in text and "at lr 0.05 the flow stays" in text
    leave_above = 0.0                                   # every step leaves D: not compared, said so
    calls.clear()
    inv = ns.invariant_flow_measurement(cfg, 0.2, 10.0, 0.05, 64, seed=7)
    assert not inv.stable and inv.lr == 0.2 / 2 ** ns.MAX_STEP_HALVINGS and len(inv.unstable) == ns.MAX_STEP_HALVINGS
    assert len(calls) == ns.MAX_STEP_HALVINGS + 1      # every step tried; no twin: nothing is compared
    assert np.isnan(inv.amplification)
    comp, row, note = claim.invariant_outcome(inv, 0.7, "cfg")
    assert comp is None and row["side"] == "reported" and note["res"] == 1e-3 and note["lr"] == inv.lr
    res.details.update(comparisons=[], not_measured=[note])
    text, = [f.text for f in claim.invariant_findings(res)]
    assert "left D at every step tried, down to lr 0.0125" in text and "flow was not measured" in text
