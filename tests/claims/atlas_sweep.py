"""The four-point atlas sweep the atlas ids' tests read (one point per panel, trained serially:
about 15-30 s on 2 cores, once per session: tests/claims/conftest.py's ``four_point_sweep``),
and the checks every atlas id passes on it.  A helper module, not a test file."""
from __future__ import annotations

import json
from pathlib import Path

from claims.core import BOUNDARY_OUTCOMES
from numerics.sweep import expand_grid, run_grid

FOUR = {
    "model": "atlas",
    "problem": {"tasks": [2, 2], "heads": 2, "L": 16},
    "train": {"time": 4.0, "batch": 64, "records": 11, "n_eval": 1024, "best_search": False},
    "zip": {"init": ["decomposable", "random_decomposable", "decomposable", "decomposable"],
            "start": ["config", "config", "allocated", "allocated"],
            "panel": ["initialisation", "heads", "noise", "batch"]},
}


def sweep_four_points(out: Path) -> Path:
    """FOUR swept into ``out`` (serial, no progress); every point done."""
    points = expand_grid(FOUR)
    summary = run_grid(points, out, scheduler="serial", progress=False, grid_text=json.dumps(FOUR))
    assert summary.done == 4 and summary.failed == 0
    return out


def assert_refuses_without_a_sweep(spec) -> None:
    """An atlas id trains nothing: run without a sweep it is an error, saying so."""
    res = spec.run()
    assert res.verdict == "error" and res.kind == "boundary"
    assert "trains nothing" in res.details["error"]


def assert_reads_the_sweep(spec, sweep: Path) -> None:
    """The id built from the four-point sweep: an outcome (not an error) from its one run, a
    heatmap, findings with numbers, and a 1 x 1 outcome matrix."""
    res = spec.run(sweep=str(sweep))
    assert res.verdict in BOUNDARY_OUTCOMES and res.verdict != "error", (spec.id, res.details.get("error"),
                                                                         res.details.get("traceback"))
    assert res.details["sweep_runs"] == 1
    assert any(f.kind == "heatmap" for f in res.figures)
    assert res.findings and all(f.numbers for f in res.findings)
    outcome = next(f for f in res.figures if f.name.endswith("-outcome"))
    assert len(outcome.matrix) == 1 and len(outcome.matrix[0]) == 1
