"""The atlas (issue 23): atlas points (numerics.experiments.atlas), their grids, the atlas ids'
registration, and the four ids (claims.atlas: atlas-initialisation, atlas-heads, atlas-noise,
atlas-batch) built end to end from the tiny grid.

Default suite: unit tests, the example grids, the registration.  Each atlas id's own tests (its
refusal without a sweep, a 4-point sweep, one point per panel, read by it):
tests/claims/test_atlas_<panel>.py.  Marker ``atlas``: examples/atlas_tiny.toml swept with the
CLI, then ``python -m reports.build --only atlas-... --from-sweep D`` (about 3 minutes on 2
cores): ``python -m pytest -q --atlas -m atlas tests/test_atlas.py``, its own step of ``.ci/run``.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import claims
from claims.atlas import ATLAS_IDS as IDS, classes_finding, outcome_maps
from claims.core import BOUNDARY_OUTCOMES, ClaimResult
from numerics.experiments import atlas
from numerics.experiments.atlas import cell_class, cell_mix, check_point, class_counts, point_class
from numerics.evaluate import crossing_time as escape_time
from numerics.evaluate import OUTCOME_CLASSES
from numerics.sweep import expand_grid, load_grid

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- units

def test_escape_time_interpolates_and_censors():
    t = [0.0, 1.0, 2.0, 3.0]
    assert escape_time(t, [0.0, 0.01, 0.1, 0.4], 0.2) == pytest.approx(2.5)   # log-midpoint of 0.1 -> 0.4
    assert escape_time(t, [0.0, 0.01, 0.1, 0.15], 0.2) == math.inf
    assert escape_time(t, [0.3, 0.01, 0.1, 0.15], 0.2) == 0.0


def _result(k=0, **kw):
    """A stored point's result: converged, on D, allocated unless told (k tasks of 2 in signed superposition)."""
    r = {"converged": True, "off_D": False, "loss": 1.0, "seed": 0, "config": {"init_seed": 0, "tasks": [2, 2]},
         "allocated_loss": 1.0, "best_decomposable": None,
         "allocation": {"allocated": k == 0, "superposition": k > 0, "signed_superposed": [True] * k + [False] * (2 - k)}}
    r.update(kw)
    return r


def test_point_class_is_the_one_readout():
    """The atlas classifies with numerics.evaluate.end_class (no classifier of its own), by precedence."""
    name = lambda r: point_class(r)["name"]  # noqa: E731
    assert name(_result()) == "allocated"
    assert point_class(_result(1))["label"] == "superposition on 1 of 2 tasks"
    assert name(_result(2, off_D=True)) == "off D"
    assert name(_result(converged=False, off_D=True)) == "not converged"
    assert name(_result(allocation={"allocated": False, "signed_superposed": [False, False]})) == "mixed"
    assert point_class({"diverged": "TrainingDiverged: ...", "config": {"tasks": [2, 2]}})["name"] == "diverged"
    assert "classify" not in vars(atlas) and "CLASSES" not in vars(atlas)


def test_a_cell_whose_seeds_disagree_is_its_counted_mix():
    """Seeds in different classes: no class for the cell, a blank in the outcome map, the counted mix
    (k of n per class, its interval) in a 'mix' figure and in the findings."""
    cell = [_result(), _result(), _result(1, loss=0.8)]
    assert cell_class(cell) == (None, False) and cell_class(cell[:2]) == ("allocated", True)
    mix = cell_mix(cell)
    assert mix["n"] == 3 and {k: e["count"] for k, e in mix["labels"].items()} == {
        "superposition on 1 of 2 tasks": 1, "allocated": 2}
    assert mix["labels"]["superposition on 1 of 2 tasks"]["over_allocated"] == pytest.approx(0.8)
    figs, info = outcome_maps("x", "X", {("a", 1): cell, ("a", 2): cell[:2]}, ["a"], [1, 2], str, str, "c", "r", "")
    assert figs[0].matrix == [[None, OUTCOME_CLASSES.index("allocated")]]
    mixfig = next(f for f in figs if f.kind == "mix")
    assert mixfig.row_labels == ["a | 1"] and sum(mixfig.matrix[0]) == 3
    assert "2-3 seeds per cell" in mixfig.caption
    counts = class_counts({("a", 1): cell, ("a", 2): cell[:2]})
    assert counts["allocated"] == 1 and counts["seeds_disagree"] == 1 and counts["seeds"]["allocated"] == 4
    result = ClaimResult(id="atlas-heads", title="", statement="", verdict="located", kind="boundary",
                         details={"classes": counts, "cells": info})
    texts = [f.text for f in classes_finding(result, "heads")]
    assert "(2-3 seeds per cell, the grid's): the seeds of 1 cells all end allocated" in texts[0], texts
    assert texts[1].startswith("Cell a | 1 of the heads panel: the 3 seeds end in 2 classes: allocated in 2 of 3 "), texts
    assert "superposition on 1 of 2 tasks in 1 of 3" in texts[1] and len(texts) == 2


def test_schedule_mistakes_are_structural():
    base = {"model": "atlas", "problem": {"tasks": [2, 2], "heads": 2, "L": 16}}
    with pytest.raises(ValueError, match="start"):
        expand_grid({**base, "train": {"start": "nowhere"}})
    with pytest.raises(ValueError, match="AtlasSchedule|unknown field"):
        expand_grid({**base, "train": {"steps": 3}})
    with pytest.raises(ValueError, match="atlas"):
        expand_grid({"problem": base["problem"], "cross": {"model": ["atlas", "full"]}})
    with pytest.raises(ValueError, match="heads >= max"):
        check_point({**base, "problem": {"tasks": [2, 2], "heads": 1, "L": 16}, "train": {"start": "allocated"}})


def test_example_grids():
    """The tiny grid has a few points per panel; the full grid >= 5 values per axis of each panel
    and 2 seeds per point."""
    for name, n in (("atlas_tiny.toml", 15), ("atlas.toml", 196)):
        spec, _ = load_grid(REPO / "examples" / name)
        points = expand_grid(spec)
        assert len(points) == n and {p["model"] for p in points} == {"atlas"}
        assert {p["train"]["panel"] for p in points} == {"initialisation", "heads", "noise", "batch"}
    by = lambda panel, f: {f(p) for p in points if p["train"]["panel"] == panel}  # noqa: E731
    assert len(by("initialisation", lambda p: p["problem"]["init_scale"])) >= 5
    assert len(by("initialisation", lambda p: p["problem"]["init"])) >= 4
    assert len(by("heads", lambda p: p["problem"]["heads"])) >= 5
    assert len(by("noise", lambda p: p["problem"]["sigma"])) >= 5 and len(by("noise", lambda p: p["problem"]["L"])) >= 5
    assert len(by("batch", lambda p: p["train"]["lr"])) >= 5 and len(by("batch", lambda p: p["train"]["batch"])) >= 5
    assert {p["train"]["seed"] for p in points} == {0, 1}


def test_registered_and_opt_in():
    # the atlas ids are opt-in (with authors-replica, which is not an atlas id: it has a profile of its own)
    assert set(IDS) == {c for c in claims.OPT_IN if c.startswith("atlas-")} and all(cid in claims.REGISTRY for cid in IDS)
    assert all(claims.reads_sweep(cid) for cid in IDS)


def test_default_report_skips_the_atlas():
    """reports.build with no --only must not run the atlas ids (issue 23)."""
    from reports.build import BuildConfig
    from reports.build import selected
    assert not set(selected(BuildConfig())) & set(claims.OPT_IN)


# --------------------------------------------------------------------------- the tiny grid (marker atlas)

def _run(*args):
    res = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode in (0, 1), f"{args}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.mark.atlas
def test_tiny_atlas_end_to_end(tmp_path):
    sweep = tmp_path / "D"
    res = _run("numerics.sweep", str(REPO / "examples" / "atlas_tiny.toml"), "--out", str(sweep), "--workers", "2",
               "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(list((sweep / "points").glob("*.json"))) == 15
    _run("reports.build", "--only", ",".join(IDS), "--from-sweep", str(sweep), "--out", str(tmp_path / "R"),
         "--no-progress")
    report = json.loads((tmp_path / "R" / "claims.json").read_text())
    got = {c["id"]: c for c in report["claims"]}
    assert set(got) == set(IDS)
    for cid, c in got.items():
        assert c["verdict"] in BOUNDARY_OUTCOMES and c["verdict"] != "error", (cid, c["details"].get("error"))
        assert c["figures"] and any(f["kind"] == "heatmap" for f in c["figures"])
        mine = [f for f in report["findings"] if f["claim"] == cid]
        assert mine and all(f["numbers"] for f in mine)
        assert c["details"]["sweep_runs"] >= 3


def test_an_atlas_need_is_read_never_trained():
    """The engine asked for an atlas point no sweep holds computes nothing: reading it raises,
    saying the atlas trains nothing; it costs nothing to plan."""
    from numerics.config import ProblemConfig
    from numerics.engine import Engine, cost_of
    n = atlas.atlas_need(ProblemConfig(tasks=(2, 2), heads=2, L=16), atlas.AtlasSchedule(panel="noise"), 0)
    results = Engine().run([n])
    with pytest.raises(ValueError, match="trains nothing"):
        results[n]
    assert cost_of(n) == 0.0
    for cid in IDS:                       # no sweep: no point to read, the build's own cost priced
        plan, = claims.plan_of(cid, "tiny")
        assert plan.kind == "atlas_grid" and plan.args["sweep"] == "" and claims.estimate_seconds(cid, "quick") > 0
