"""The atlas (issue 23): atlas points (numerics.experiments.atlas), their grids, the atlas ids'
registration, and the four ids (claims.atlas) built end to end from the tiny grid.

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
from claims.atlas import IDS
from claims.base import BOUNDARY_OUTCOMES
from numerics.experiments.atlas import CLASSES, check_point, classify, escape_time
from tools.sweep import expand_grid, load_grid

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- units

def test_escape_time_interpolates_and_censors():
    t = [0.0, 1.0, 2.0, 3.0]
    assert escape_time(t, [0.0, 0.01, 0.1, 0.4], 0.2) == pytest.approx(2.5)   # log-midpoint of 0.1 -> 0.4
    assert escape_time(t, [0.0, 0.01, 0.1, 0.15], 0.2) == math.inf
    assert escape_time(t, [0.3, 0.01, 0.1, 0.15], 0.2) == 0.0


def _result(**kw):
    r = {"converged": True, "off_D": False,
         "allocation": {"superposition": False, "allocated": True}}
    r.update(kw)
    return r


def test_classify_precedence():
    assert classify(_result()) == "allocated"
    assert classify(_result(allocation={"superposition": True, "allocated": False})) == "superposition"
    assert classify(_result(off_D=True, allocation={"superposition": True, "allocated": False})) == "off D"
    assert classify(_result(converged=False, off_D=True)) == "not converged"
    assert classify(_result(allocation={"superposition": False, "allocated": False})) == "mixed"
    assert classify(_result(diverged="TrainingDiverged: ...", converged=False)) == "diverged"
    assert set(CLASSES) == {"allocated", "superposition", "off D", "mixed", "not converged", "diverged"}


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
    from reports import plan
    from reports.build import BuildConfig
    assert not set(plan.selected(BuildConfig())) & set(claims.OPT_IN)


# --------------------------------------------------------------------------- the tiny grid (marker atlas)

def _run(*args):
    res = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode in (0, 1), f"{args}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.mark.atlas
def test_tiny_atlas_end_to_end(tmp_path):
    sweep = tmp_path / "D"
    res = _run("tools.sweep", str(REPO / "examples" / "atlas_tiny.toml"), "--out", str(sweep), "--workers", "2",
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
