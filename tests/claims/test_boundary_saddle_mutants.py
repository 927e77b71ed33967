"""Mutation suite of boundary-saddle: theory's off-task slope a halved (so 2a becomes a) must
be contradicted by the measured growth rate."""
from __future__ import annotations

import pytest

import theory.saddle
from claims import boundary_saddle as claim
from mutation import patch_everywhere

pytestmark = pytest.mark.mutants


def test_off_task_slope_halved(monkeypatch):
    original = theory.saddle.off_task_slope
    patch_everywhere(monkeypatch, original, lambda *a, **k: 0.5 * original(*a, **k))
    res = claim.SPEC.run("tiny")
    print(f"[mutant] boundary-saddle: slope a halved: {res.verdict}")
    assert res.verdict == "contradicted", res.details
