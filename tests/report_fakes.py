"""The fake claims the report tests build reports of (tests/test_report.py,
test_report_frontdoor.py, test_report_glance.py, test_report_browser.py): claim functions that
return fixed ClaimResults of every shape a report must render (pass, fail, raise, a check that
cannot discriminate, a bad figure, an interrupt, boundaries, a configured claim), the registry
they are installed as, and the readers the tests share.  A helper module, not a test file
(tests/ is on sys.path while the suite runs)."""
from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import claims
from claims.core.base import ClaimResult, Figure, Finding, PerturbationCheck, Series, judge, run_claim


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


def fake_pass(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    progress("fake step 1 of 2", 0.5)
    progress("fake step 2 of 2", 1.0)
    perturbations = [PerturbationCheck("constant e replaced by 2", True, {"gap": 0.31})]
    return ClaimResult(
        id="fake-pass", title="A claim that holds", statement="omega stays block-diagonal.",
        verdict=judge(True, perturbations),
        theory={"residual": 0.0, "limit": {"omega": [[0.37, 0.0], [0.0, 0.37]], "mu": 2.645}},
        numerics={"residual": 1e-9, "limit": {"omega": [[0.36, 0.01], [0.0, 0.38]], "mu": 2.6},
                  "unstable": float("nan"), "far": float("inf")},
        tolerance={"value": 1e-6, "why": "float64 round-off over 1e4 steps"},
        details={"profile": profile, "seed": seed, "sweep": sweep, "long": list(range(100))},
        figures=_figures(), perturbations=perturbations)


def fake_plain(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    progress("fake step 1 of 2", 0.5)
    progress("fake step 2 of 2", 1.0)
    perturbations = [PerturbationCheck("constant doubled", True)]
    return ClaimResult(id="fake-plain", title="A claim without figures", statement="mu > 0.",
                       verdict=judge(True, perturbations), theory={"mu": 2.6}, numerics={"mu": 2.61},
                       tolerance={"value": 0.05, "why": "MC error"}, perturbations=perturbations,
                       details={"profile": profile, "device": device, "seed": seed, "sweep": sweep})


def fake_fail(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    perturbations = [PerturbationCheck("wrong winner", True)]
    return ClaimResult(id="fake-fail", title="A claim that fails", statement="ratio equals H.",
                       verdict=judge(False, perturbations), theory={"ratio": 3.0},
                       numerics={"ratio": 2.3}, tolerance={"value": 0.05, "why": "MC error"},
                       perturbations=perturbations)


def fake_raise(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    raise RuntimeError("fake claim exploded: loss diverged at step 17")


def fake_undiscriminating(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    perturbations = [PerturbationCheck("exponent 1 replaced by 2", False, {"error": 0.01})]
    return run_claim("fake-undiscriminating", "A check that cannot discriminate", "error ~ d/L.",
                     lambda: ClaimResult(id="fake-undiscriminating", title="A check that cannot discriminate",
                                         statement="error ~ d/L.", verdict=judge(True, perturbations),
                                         perturbations=perturbations))


def fake_bad_figure(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    bad = Figure(name="broken", title="x and y differ", series=[Series("s", [1, 2, 3], [1, 2])])
    return ClaimResult(id="fake-bad-figure", title="Bad figure", statement="s", verdict="pass",
                       figures=[bad, _figures()[0]])


def fake_interrupt(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    raise KeyboardInterrupt


def fake_boundary(profile="quick", device="cpu", seed=0, progress=None, sweep=None, measured=1.372):
    """A boundary whose regime was located: a one-sided row, a reported row, a finding of kind
    "stops" whose sentence is generated from the measured number (as a claim's template does)."""
    rows = [{"name": "held-out loss vs the allocated fixed point", "theory": 1.547, "measured": measured,
             "se": 0.012, "tolerance": 0.035, "agrees": measured <= 1.547 + 0.035, "side": "not above",
             "config": "tasks=(3, 3) H=2 L=32 sigma=0.5"},
            {"name": "held-out loss of linear attention", "theory": None, "measured": 1.2512345678,
             "se": 0.0034567, "tolerance": None, "agrees": None, "side": "reported",
             "config": "tasks=(3, 3) H=2 L=32 sigma=0.5"},
            {"name": "held-out loss vs the best decomposable point", "theory": 1.36, "measured": measured,
             "se": 0.012, "tolerance": 0.05, "agrees": abs(measured - 1.36) <= 0.05, "side": "two-sided",
             "config": "tasks=(3, 3) H=2 L=64 sigma=0.5"}]
    agrees = all(r["agrees"] for r in rows if r["side"] != "reported")
    perturbations = [PerturbationCheck("rate 0 instead of 2a", True)]
    return ClaimResult(
        id="fake-boundary", kind="boundary", title="Where allocation stops", statement="with noise, superposition.",
        verdict=judge(agrees, perturbations, kind="boundary"), headline=rows, perturbations=perturbations,
        findings=[Finding("fake-boundary", "stops", f"With label noise sigma = 0.5 the trained model leaves "
                          f"allocation: held-out loss {measured:.4g} ± 0.012 against the fixed point's 1.547.",
                          {"loss": {"value": measured, "se": 0.012}}),
                  Finding("fake-boundary", "holds", "Below sigma = 0.25 the allocated point is reached "
                          "(loss 0.4812 ± 0.002 vs 0.4770).", {"loss": {"value": 0.4812, "se": 0.002}})])


def fake_beyond(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    """A boundary the paper does not speak of, contradicted (a failing outcome: exit 1)."""
    rows = [{"name": "saddle: growth rate of off-task |mu| vs 2a", "theory": 0.084, "measured": 0.161,
             "se": 0.01, "tolerance": 0.04, "agrees": False, "side": "two-sided", "config": "tasks=(1, 1) H=2 L=32"},
            {"name": "saddle: escape time vs batch size", "theory": 20.0, "measured": 31.0, "se": 2.0,
             "tolerance": 8.0, "agrees": False, "side": "two-sided", "config": "tasks=(2, 2) H=2 L=64"}]
    perturbations = [PerturbationCheck("rate a instead of 2a", True)]
    return ClaimResult(
        id="fake-beyond", kind="boundary", title="The allocated point is a saddle", statement="saddle.",
        verdict=judge(False, perturbations, kind="boundary"), headline=rows, perturbations=perturbations,
        findings=[Finding("fake-beyond", "beyond", "The allocated point is a saddle: the off-task |mu| grows at "
                          "0.161 ± 0.01 per unit time, against theory's 2a = 0.084.",
                          {"rate": {"value": 0.161, "se": 0.01}, "2a": {"value": 0.084, "se": None}}),
                  Finding("fake-beyond", "beyond", "Escape takes 31 ± 2 time units at B = 1024, against "
                          "the predicted 20.", {"T": {"value": 31.0, "se": 2.0}})])


FAKES = {"fake-pass": fake_pass, "fake-plain": fake_plain, "fake-fail": fake_fail, "fake-raise": fake_raise,
         "fake-undiscriminating": fake_undiscriminating, "fake-bad-figure": fake_bad_figure,
         "fake-interrupt": fake_interrupt, "fake-boundary": fake_boundary, "fake-beyond": fake_beyond}


def install_registry(monkeypatch, name: str, functions: dict) -> dict:
    """claims.REGISTRY pointing at fake claims: each id maps to ``module:NAME`` where NAME is an
    object whose ``run`` is the fake function (as the real entries name a ClaimSpec)."""
    module = types.ModuleType(name)
    for fn in functions.values():
        setattr(module, fn.__name__, types.SimpleNamespace(run=fn))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    registry = {cid: f"{module.__name__}:{fn.__name__}" for cid, fn in functions.items()}
    monkeypatch.setattr(claims, "REGISTRY", registry)
    monkeypatch.setattr(claims, "claim_runner", lambda cid: getattr(module, registry[cid].split(":")[1]).run)
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


def fake_config(profile="quick", device="cpu", seed=0, progress=None, sweep=None, problem=None):
    """A claim that runs at the given configuration and echoes it (as a real one says what it ran)."""
    perturbations = [PerturbationCheck("constant doubled", True)]
    return ClaimResult(
        id="fake-config", title="A claim that takes a configuration", statement="ρ∞ = d/L.",
        verdict=judge(True, perturbations), theory={"rho": 0.25}, numerics={"rho": 0.26},
        tolerance={"value": 0.02, "why": "3 se"}, perturbations=perturbations,
        details={"ran": {"problem": problem, "profile": profile}}, headline=[dict(r) for r in HEADLINE],
        findings=[Finding("fake-config", "holds", f"ρ∞ = {HEADLINE[0]['measured']} ± 0.004 against d/L = 0.25.",
                          {"rho": {"value": HEADLINE[0]["measured"], "se": 0.004}})],
        figures=[Figure(name="rho", title="ρ∞ against d/L", caption="the points lie on the line y = x",
                        series=[Series("measured", [0.1, 0.2], [0.1, 0.21], "points"),
                                Series("theory", [0.1, 0.2], [0.1, 0.2], "line")])])
