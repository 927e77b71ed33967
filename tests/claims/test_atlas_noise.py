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
