"""Mutation suite of boundary-saturation: theory's validity edge of the expansion moved out and
in must each give a non-pass verdict at a small dedicated profile.  Run: ``python -m pytest -q -s
--mutants -m mutants tests/claims/test_boundary_saturation_mutants.py``."""
from __future__ import annotations

import numpy as np
import pytest

import theory.reduced_ode as reduced_ode
from claims import boundary_saturation
from mutation import report_verdict, run_at_profile

pytestmark = pytest.mark.mutants

# the dedicated small profile (a grid of omegas on both sides of the edge)
SATURATION = boundary_saturation.SaturationProfile(omegas=(0.1, 0.3, 0.5, 0.6, 0.75, 0.9), n_eval=6000)


def test_validity_edge_moved_out(monkeypatch):
    """Theory's validity threshold of the expansion wrong: omega^2 < 1 instead of 2 omega^2 < 1
    (the edge's size doubled) -> boundary-saturation."""
    monkeypatch.setattr(reduced_ode, "expansion_valid",
                        lambda omega, margin=0.0: bool(np.all(np.asarray(omega, float) ** 2 < 1.0 - margin)))
    res = run_at_profile(monkeypatch, boundary_saturation.SATURATION, boundary_saturation.SPEC.run, SATURATION)
    report_verdict("validity edge at omega^2 = 1", res)
    assert res.verdict != "located", res.details


def test_validity_edge_moved_in(monkeypatch):
    """Theory's validity threshold halved in omega^2 (4 omega^2 < 1, edge 0.5) -> boundary-saturation.
    Caught only as verdict 'error': no measurement contradicts an edge moved inward (the exact
    loss is smooth across the true edge), but on this grid (no omega in [1/sqrt 6, 0.5)) the
    comparison can no longer tell the mutant's edge from the wrong-edge perturbation 1/sqrt 6,
    so the check declares itself unable to discriminate.  A grid with a point in that interval
    would let it pass: a known blind spot (docs/claims_5_7.md)."""
    monkeypatch.setattr(reduced_ode, "expansion_valid",
                        lambda omega, margin=0.0: bool(np.all(4.0 * np.asarray(omega, float) ** 2 < 1.0 - margin)))
    res = run_at_profile(monkeypatch, boundary_saturation.SATURATION, boundary_saturation.SPEC.run, SATURATION)
    report_verdict("validity edge at 4 omega^2 = 1", res)
    assert res.verdict != "located", res.details
