"""End to end: a sweep of the tiny profile's trained runs of claims 5 and 6, then the report
built from it (``--from-sweep``) gives the same numbers as the report that trains them itself,
and says how many runs it took from the sweep (``details["sweep_runs"]``).

Marker ``e2e`` (about 2 minutes on 2 cores: three trainings, then the two claims twice):
``python -m pytest -q --e2e -m e2e tests/test_sweep_report.py``, its own step of ``.ci/run``.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
IDS = ("limiting-error", "multi-head-gain")


def _run(*args, cwd=REPO):
    res = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{args}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _numbers(path: Path) -> dict:
    claims = {c["id"]: c for c in json.loads(path.read_text())["claims"]}
    return {cid: [(r["name"], r["measured"], r["theory"]) for r in claims[cid]["headline"]] for cid in IDS}, claims


@pytest.mark.e2e
def test_report_from_sweep_equals_report_that_trains(tmp_path):
    sweep = tmp_path / "D"
    _run("numerics.sweep", str(REPO / "examples" / "sweep_tiny.toml"), "--out", str(sweep), "--no-progress")
    stored = list((sweep / "points").glob("*.json"))
    assert len(stored) == 3, stored     # claim 6's H = 2 run at L = 64 is claim 5's (numerics.engine.trained_run_seed)
    _run("reports.build", "--profile", "tiny", "--only", ",".join(IDS), "--from-sweep", str(sweep),
         "--out", str(tmp_path / "from_sweep"))
    _run("reports.build", "--profile", "tiny", "--only", ",".join(IDS), "--out", str(tmp_path / "trained"))
    a, claims_a = _numbers(tmp_path / "from_sweep" / "claims.json")
    b, claims_b = _numbers(tmp_path / "trained" / "claims.json")
    assert a == b
    # every trained run came from the sweep: claim 5 trains H = 2 at L = 32, 64; claim 6 H = 2, 1 at L = 64.
    # The H = 2 run at L = 64 is one need of both (numerics.engine.trained_run_seed): the engine reads it once
    # and each claim counts the sweep runs it read (2 each, 3 points in all)
    used = {cid: claims_a[cid]["details"]["sweep_runs"] for cid in IDS}
    assert used == {"limiting-error": 2, "multi-head-gain": 2}, used
    assert isinstance(claims_a["limiting-error"]["details"]["sweep_runs"], int)
    assert "sweep_runs" not in claims_b["limiting-error"]["details"]
