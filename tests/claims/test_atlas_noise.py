"""atlas-noise (claims/atlas.py, issue 23): the atlas's noise panel (the label noise and L), built
from a sweep.  Default suite: the refusal without a sweep, and the four-point sweep
(tests/claims/atlas_sweep.py, shared by the four atlas ids) read by this id.  The tiny grid end
to end (marker ``atlas``) and the atlas points' unit tests: tests/test_atlas.py."""
from __future__ import annotations

import json
import shutil

import claims
from atlas_sweep import assert_reads_the_sweep, assert_refuses_without_a_sweep

ID = "atlas-noise"


def test_refuses_without_a_sweep():
    assert_refuses_without_a_sweep(claims.spec_of(ID))


def test_the_four_point_sweep(four_point_sweep):
    assert_reads_the_sweep(claims.spec_of(ID), four_point_sweep)


def test_findings_come_from_the_numbers(four_point_sweep, tmp_path):
    """Changing a stored measurement changes the sentence (the template reads the result)."""
    D = tmp_path / "D"
    shutil.copytree(four_point_sweep, D)
    noise = claims.spec_of(ID)
    before = [f.text for f in noise.run(sweep=str(D)).findings]
    for f in (D / "points").glob("*.json"):
        rec = json.loads(f.read_text())
        if rec["point"]["train"]["panel"] == "noise":
            rec["result"]["escape_time"] = 1.5
            f.write_text(json.dumps(rec))
    after = [f.text for f in noise.run(sweep=str(D)).findings]
    assert before != after


def test_a_point_the_sweep_does_not_hold_is_reported_not_trained(four_point_sweep, tmp_path):
    """A grid point whose file is gone and one stored as failed: neither is trained nor compared;
    both are in details["unheld_points"] with why, and the panel is built from what is held."""
    D = tmp_path / "D"
    shutil.copytree(four_point_sweep, D)
    gone = failed = None
    for f in sorted((D / "points").glob("*.json")):
        rec = json.loads(f.read_text())
        panel = rec["point"]["train"]["panel"]
        if panel == "heads":
            gone = rec["id"]
            f.unlink()
        elif panel == "batch":
            failed = rec["id"]
            rec.update(result=None, error="Traceback ...\nRuntimeError: boom")
            f.write_text(json.dumps(rec))
    res = claims.spec_of(ID).run(sweep=str(D))
    assert res.verdict != "error" and res.details["sweep_runs"] == 1, res.details.get("error")
    unheld = {u["id"]: u for u in res.details["unheld_points"]}
    assert res.details["missing_points"] == 2 and set(unheld) == {gone, failed}
    assert unheld[gone]["why"] == "no usable record (absent)" and unheld[gone]["panel"] is None
    assert unheld[failed]["why"] == "failed: RuntimeError: boom" and unheld[failed]["panel"] == "batch"
    batch = claims.spec_of("atlas-batch").run(sweep=str(D))
    assert batch.verdict == "error" and "holds no finished atlas point of panel 'batch'" in batch.details["error"]
