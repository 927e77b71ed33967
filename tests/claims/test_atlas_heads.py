"""atlas-heads (claims/atlas.py, issue 23): the atlas's heads panel (the number of heads), built
from a sweep.  Default suite: the refusal without a sweep, and the four-point sweep
(tests/claims/atlas_sweep.py, shared by the four atlas ids) read by this id.  The tiny grid end
to end (marker ``atlas``) and the atlas points' unit tests: tests/test_atlas.py."""
from __future__ import annotations

import claims
from atlas_sweep import assert_reads_the_sweep, assert_refuses_without_a_sweep

ID = "atlas-heads"


def test_refuses_without_a_sweep():
    assert_refuses_without_a_sweep(claims.spec_of(ID))


def test_the_four_point_sweep(four_point_sweep):
    assert_reads_the_sweep(claims.spec_of(ID), four_point_sweep)
