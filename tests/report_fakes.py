"""The fake claims the report tests build reports of (tests/test_report.py,
test_report_frontdoor.py, test_report_glance.py, test_report_browser.py): claim specs (a plan
and a comparison, as every real claim is) whose comparisons give every shape a report must
render (pass, fail, raise, a check that cannot discriminate, a bad figure, an interrupt,
boundaries, a configured claim), run by the one path a real build takes (the engine computes
each fake's one theory need), the registry they are installed as, and the readers the tests
share.  A helper module, not a test file (tests/ is on sys.path while the suite runs)."""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
from pathlib import Path

import claims
from claims.core import (SIDE_ERRORS, ClaimSpec, Comparison, Figure, Finding, Outcome, PerturbationCheck, Series,
                         theory_need)


@dataclasses.dataclass(frozen=True)
class FakeProfile:
    """A fake claim's profile: the block sizes of its one theory need."""
    tasks: tuple = (3, 3)


FAKE_PROFILES = {name: FakeProfile() for name in ("tiny", "quick", "paper")}


def fake_need(ctx):
    """The one need every fake asks of the engine: theory's allocated limit at its tasks."""
    return theory_need("limit_multi", tuple(ctx.p.tasks), 0.0)


def fake_spec(claim_id: str, compare, title: str = "A fake claim", statement: str = "s.", **fields) -> ClaimSpec:
    """A claim as the real ones are: a plan (:func:`fake_need`) and a comparison ``compare(ctx, results)``."""
    return ClaimSpec(id=claim_id, title=title, statement=statement, profiles=FAKE_PROFILES,
                     plan=lambda ctx, results: [fake_need(ctx)], compare=compare, **fields)


def comparison(name: str, agrees: bool, perturbations=(), tolerance: float = 0.05, why: str = "MC error",
               **fields) -> Comparison:
    """A comparison that agrees or not at ``tolerance`` (measured/predicted as dicts: no resolving power)."""
    return Comparison(name=name, measured=fields.pop("measured", {}), predicted=fields.pop("predicted", {}),
                      error=tolerance / 2 if agrees else 2 * tolerance, tolerance=tolerance, why=why,
                      perturbations=list(perturbations), **fields)


def _figures() -> list[Figure]:
    t = [0.5 * k for k in range(40)]
    loss = [2.0 * math.exp(-0.1 * x) + 0.1 for x in t]
    return [
        Figure(name="loss", title="loss with phases", xlabel="t", ylabel="loss", yscale="log",
               series=[Series("full model", t, loss, "points"), Series("theory", t, loss, "line")],
               spans=[{"x0": 0, "x1": 5, "label": "warm-up"}, {"x0": 5, "x1": 10, "label": "emergence"},
                      {"x0": 10, "x1": 19.5, "label": "convergence"}],
               hlines=[{"y": 0.1, "label": "limit"}]),
        Figure(name="trajectories", title="omega and mu", kind="panels", panels=[
            Figure(name="omega", title="omega", series=[Series("omega[0,0] full", t, t, "points"),
                                                         Series("omega[0,0] ODE", t, t, "line")]),
            Figure(name="mu", title="mu", series=[Series("mu[0,0] full", t, loss, "points"),
                                                   Series("mu[0,0] ODE", t, loss, "dashed")]),
        ]),
        Figure(name="allocation", title="final allocation", kind="heatmap",
               matrix=[[2.6, 0.0, float("nan")], [0.0, 2.6, 0.0]], row_labels=["head 0", "head 1"],
               col_labels=["task 0", "task 1", "task 2"]),
        Figure(name="gain", title="gain vs r", xscale="log", yscale="log",
               series=[Series("measured", [4, 10, 40], [2.3, 2.6, 2.9], "points"),
                       Series("theory", [4, 10, 40], [2.316, 2.661, 2.904], "line")],
               hlines=[{"y": 3, "label": "H"}]),
        Figure(name="outcomes", title="where the seeds end", kind="mix", matrix=[[5.0, 3.0], [8.0, 0.0]],
               row_labels=["s0=1", "s0=0.3"], col_labels=["off D", "allocated"], xlabel="seeds"),
    ]


def row_comparisons(rows: list[dict], perturbations=()) -> list[Comparison]:
    """The comparisons of headline rows (a "reported" row is none): each row's numbers at its side's
    error (a bracket theory: the distance outside it); the perturbations go with the first."""
    comps = []
    for r in (r for r in rows if r["side"] != "reported"):
        m, t = r["measured"], r["theory"]
        error = max(0.0, t[0] - m, m - t[1]) if isinstance(t, list) else SIDE_ERRORS[r["side"]](m, t)
        comps.append(Comparison(name=r["name"], measured=m, predicted=t, error=error, tolerance=r["tolerance"],
                                why="MC error", side=r["side"], se=r["se"], config=r["config"],
                                perturbations=[] if comps else list(perturbations)))
    return comps


def _pass(ctx, results):
    perturbations = [PerturbationCheck("constant e replaced by 2", True, {"gap": 0.31})]
    return Outcome(
        [comparison("residual", True, perturbations, 1e-6, "float64 round-off over 1e4 steps")],
        theory={"residual": 0.0, "limit": {"omega": [[0.37, 0.0], [0.0, 0.37]], "mu": 2.645}},
        numerics={"residual": 1e-9, "limit": {"omega": [[0.36, 0.01], [0.0, 0.38]], "mu": 2.6},
                  "unstable": float("nan"), "far": float("inf")},
        details={"long": list(range(100)), "limit_multi": results[fake_need(ctx)]}, figures=_figures())


def _plain(ctx, results):
    return Outcome([comparison("mu", True, [PerturbationCheck("constant doubled", True)])],
                   theory={"mu": 2.6}, numerics={"mu": 2.61}, details={"device": ctx.device}, headline=[])


def _fail(ctx, results):
    return Outcome([comparison("ratio", False, [PerturbationCheck("wrong winner", True)])],
                   theory={"ratio": 3.0}, numerics={"ratio": 2.3})


def _raise(ctx, results):
    raise RuntimeError("fake claim exploded: loss diverged at step 17")


def _undiscriminating(ctx, results):
    return Outcome([comparison("error", True, [PerturbationCheck("exponent 1 replaced by 2", False, {"error": 0.01})])])


def _bad_figure(ctx, results):
    bad = Figure(name="broken", title="x and y differ", series=[Series("s", [1, 2, 3], [1, 2])])
    return Outcome([comparison("s", True)], figures=[bad, _figures()[0]])


def _interrupt(ctx, results):
    raise KeyboardInterrupt


BOUNDARY_MEASURED = 1.372


def boundary_rows(measured: float = BOUNDARY_MEASURED) -> list[dict]:
    """A boundary whose regime was located: a one-sided row, a reported row, a two-sided row."""
    return [{"name": "held-out loss vs the allocated fixed point", "theory": 1.547, "measured": measured,
             "se": 0.012, "tolerance": 0.035, "agrees": measured <= 1.547 + 0.035, "side": "not above",
             "config": "tasks=(3, 3) H=2 L=32 sigma=0.5"},
            {"name": "held-out loss of linear attention", "theory": None, "measured": 1.2512345678,
             "se": 0.0034567, "tolerance": None, "agrees": None, "side": "reported",
             "config": "tasks=(3, 3) H=2 L=32 sigma=0.5"},
            {"name": "held-out loss vs the best decomposable point", "theory": 1.36, "measured": measured,
             "se": 0.012, "tolerance": 0.05, "agrees": abs(measured - 1.36) <= 0.05, "side": "two-sided",
             "config": "tasks=(3, 3) H=2 L=64 sigma=0.5"}]


def _boundary(ctx, results):
    rows = boundary_rows()
    return Outcome(row_comparisons(rows, [PerturbationCheck("rate 0 instead of 2a", True)]), headline=rows)


def _boundary_findings(result):
    """Sentences generated from the measured number (as a claim's template does)."""
    return [Finding(result.id, "stops", f"With label noise sigma = 0.5 the trained model leaves allocation: "
                    f"held-out loss {BOUNDARY_MEASURED:.4g} ± 0.012 against the fixed point's 1.547.",
                    {"loss": {"value": BOUNDARY_MEASURED, "se": 0.012}}),
            Finding(result.id, "holds", "Below sigma = 0.25 the allocated point is reached "
                    "(loss 0.4812 ± 0.002 vs 0.4770).", {"loss": {"value": 0.4812, "se": 0.002}})]


def _beyond(ctx, results):
    """A boundary the paper does not speak of, contradicted (a failing outcome: exit 1)."""
    rows = [{"name": "saddle: growth rate of off-task |mu| vs 2a", "theory": 0.084, "measured": 0.161,
             "se": 0.01, "tolerance": 0.04, "agrees": False, "side": "two-sided", "config": "tasks=(1, 1) H=2 L=32"},
            {"name": "saddle: escape time vs batch size", "theory": 20.0, "measured": 31.0, "se": 2.0,
             "tolerance": 8.0, "agrees": False, "side": "two-sided", "config": "tasks=(2, 2) H=2 L=64"}]
    return Outcome(row_comparisons(rows, [PerturbationCheck("rate a instead of 2a", True)]), headline=rows)


def _beyond_findings(result):
    return [Finding(result.id, "beyond", "The allocated point is a saddle: the off-task |mu| grows at "
                    "0.161 ± 0.01 per unit time, against theory's 2a = 0.084.",
                    {"rate": {"value": 0.161, "se": 0.01}, "2a": {"value": 0.084, "se": None}}),
            Finding(result.id, "beyond", "Escape takes 31 ± 2 time units at B = 1024, against "
                    "the predicted 20.", {"T": {"value": 31.0, "se": 2.0}})]


fake_pass = fake_spec("fake-pass", _pass, "A claim that holds", "omega stays block-diagonal.")
fake_plain = fake_spec("fake-plain", _plain, "A claim without figures", "mu > 0.", reads_sweep=True)
fake_fail = fake_spec("fake-fail", _fail, "A claim that fails", "ratio equals H.")
fake_raise = fake_spec("fake-raise", _raise, "A claim that raises")
fake_undiscriminating = fake_spec("fake-undiscriminating", _undiscriminating, "A check that cannot discriminate",
                                  "error ~ d/L.")
fake_bad_figure = fake_spec("fake-bad-figure", _bad_figure, "Bad figure")
fake_interrupt = fake_spec("fake-interrupt", _interrupt, "A claim interrupted")
fake_boundary = fake_spec("fake-boundary", _boundary, "Where allocation stops", "with noise, superposition.",
                          kind="boundary", findings=_boundary_findings)
fake_beyond = fake_spec("fake-beyond", _beyond, "The allocated point is a saddle", "saddle.", kind="boundary",
                        findings=_beyond_findings)

FAKES = {s.id: s for s in (fake_pass, fake_plain, fake_fail, fake_raise, fake_undiscriminating, fake_bad_figure,
                           fake_interrupt, fake_boundary, fake_beyond)}


def install_registry(monkeypatch, name: str, specs: dict) -> dict:
    """claims.REGISTRY pointing at fake claim specs: each id maps to ``module:NAME`` where NAME is
    the spec in a module ``name`` (as the real entries name a ClaimSpec)."""
    module = types.ModuleType(name)
    registry = {}
    for cid, spec in specs.items():
        attr = cid.replace("-", "_")
        setattr(module, attr, spec)
        registry[cid] = f"{name}:{attr}"
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(claims, "REGISTRY", registry)
    return registry


def strict_load(path: Path) -> dict:
    def reject(name):
        raise ValueError(f"non-strict JSON constant {name}")
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=reject)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# the configured claim (reports.build --problem; tests/test_report_frontdoor.py)

HEADLINE = [
    {"name": "limiting error ρ∞", "theory": 0.25, "measured": 0.26, "se": 0.004, "tolerance": 0.02,
     "agrees": True, "side": "two-sided", "config": "tasks=(3, 3) H=2 L=32"},
    {"name": "emergence time", "theory": [10.0, 14.0], "measured": 12.5, "se": None, "tolerance": 0.5,
     "agrees": True, "side": "two-sided", "config": "tasks=(3, 3) H=2 L=32"},
    {"name": "loss not above the allocated fixed point", "theory": 1.547, "measured": 1.372, "se": 0.012,
     "tolerance": 0.035, "agrees": True, "side": "not above", "config": "tasks=(3, 3) H=2 L=64"},
    {"name": "gain ratio", "theory": None, "measured": 2.3, "se": 0.05, "tolerance": None, "agrees": None,
     "side": "reported", "config": "tasks=(3, 3) H=2 L=64"},
]


def configured(ctx, results, headline=HEADLINE):
    """A claim that runs at the given configuration and echoes it (as a real one says what it ran)."""
    return Outcome(
        row_comparisons(headline, [PerturbationCheck("constant doubled", True)]),
        theory={"rho": 0.25}, numerics={"rho": 0.26}, headline=[dict(r) for r in headline],
        details={"ran": {"problem": ctx.problem, "profile": ctx.profile}},
        figures=[Figure(name="rho", title="ρ∞ against d/L", caption="the points lie on the line y = x",
                        series=[Series("measured", [0.1, 0.2], [0.1, 0.21], "points"),
                                Series("theory", [0.1, 0.2], [0.1, 0.2], "line")])])


def _config_findings(result):
    return [Finding(result.id, "holds", f"ρ∞ = {result.headline[0]['measured']} ± 0.004 against d/L = 0.25.",
                    {"rho": {"value": result.headline[0]["measured"], "se": 0.004}})]


def _with_tasks(p, problem):
    return dataclasses.replace(p, tasks=tuple(problem.get("tasks", p.tasks)))


def training_need(ctx):
    """A converged training run at the configuration (the default one without a problem):
    what the configured claim's plan may ask for, priced by the engine's cost model."""
    from claims.core import trained_need
    from numerics.config import ProblemConfig
    from numerics.experiments.converged import TrainingSchedule
    problem = {"tasks": (3, 3), "heads": 2, "L": 32, **(ctx.problem or {})}
    return trained_need(ProblemConfig.from_dict({**problem, "tasks": list(problem["tasks"])}), TrainingSchedule())


def _config_plan(ctx, results):
    """The theory need, and a training run that is only a possibility (conditional, as a real
    plan's continuation is): asked when the plan is priced (results None), never run here."""
    return [fake_need(ctx)] + ([training_need(ctx)] if results is None else [])


fake_config = fake_spec("fake-config", configured, "A claim that takes a configuration", "ρ∞ = d/L.",
                        resolve=_with_tasks, findings=_config_findings)
fake_config = dataclasses.replace(fake_config, plan=_config_plan)
