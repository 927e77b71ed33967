"""atlas-initialisation (claims/atlas.py, issue 23): the atlas's initialisation panel (the initial scale and start), built
from a sweep.  Default suite: the refusal without a sweep, and the four-point sweep
(tests/claims/atlas_sweep.py, shared by the four atlas ids) read by this id.  The tiny grid end
to end (marker ``atlas``) and the atlas points' unit tests: tests/test_atlas.py."""
from __future__ import annotations

import pytest

import claims
from numerics.experiments.atlas import warmup_border
from atlas_sweep import assert_reads_the_sweep, assert_refuses_without_a_sweep

ID = "atlas-initialisation"


def test_refuses_without_a_sweep():
    assert_refuses_without_a_sweep(claims.spec_of(ID))


def test_the_four_point_sweep(four_point_sweep):
    assert_reads_the_sweep(claims.spec_of(ID), four_point_sweep)


def test_warmup_border_interpolates_in_log_log():
    """numerics.experiments.atlas.warmup_border (the initialisation panel's warm-up border in s0)."""
    # exponent = 50 s0^2: 1/2 at s0 = 0.1
    rows = {s: [{"warmup": {"exponent": 50 * s * s}}] for s in (0.01, 0.03, 0.3, 1.0)}
    assert warmup_border(rows) == pytest.approx(0.1, rel=1e-9)
    rows = {s: [{"warmup": {"exponent": 50 * s * s}}] for s in (0.3, 1.0)}   # extrapolated
    assert warmup_border(rows) == pytest.approx(0.1, rel=1e-9)
