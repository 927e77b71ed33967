"""Mutation suite of boundary-fewer-heads: theory's predicted winners permuted must give a
non-pass verdict at a small dedicated profile.  Run: ``python -m pytest -q -s --mutants -m mutants
tests/claims/test_boundary_fewer_heads_mutants.py``."""
from __future__ import annotations

import numpy as np
import pytest

import theory.task_allocation as task_allocation
from claims import boundary_fewer_heads
from mutation import report_verdict, run_at_profile

pytestmark = pytest.mark.mutants

# the dedicated small profile (the quick one with a shorter run)
FEWER = boundary_fewer_heads.FewerHeadsProfile(tasks=(1, 1, 1), L=32, init_seed=6, lr=0.2, time=40.0, batch=256, n_eval=8000)


def test_winners_permuted(monkeypatch):
    """Theory's predicted winners permuted (head h -> h + 1 mod H) -> boundary-fewer-heads."""
    original = task_allocation.predicted_winners

    def permuted(omega0, mu0, *args, **kwargs):
        H = np.shape(omega0)[0]
        return [(h + 1) % H for h in original(omega0, mu0, *args, **kwargs)]

    monkeypatch.setattr(task_allocation, "predicted_winners", permuted)
    res = run_at_profile(monkeypatch, boundary_fewer_heads.FEWER, boundary_fewer_heads.SPEC.run, FEWER)
    report_verdict("winners permuted", res)
    assert res.verdict != "located", res.details
