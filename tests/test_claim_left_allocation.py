"""boundary-left-allocation: the comparisons on faked runs (fast), the findings template, and
the tiny profile (a run that stays allocated: undecided, never located)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from claims import left_allocation as claim
from numerics.config import ProblemConfig
from numerics.experiments.probes import BestDecomposable


def _run(loss, opposite):
    return {"loss": loss, "se": 0.005, "n": 16384, "converged": True, "step_error": 0.002,
            "omega": [[0.5, 0.0], [0.0, 0.5]], "mu": [[1.0, -opposite], [0.0, 1.0]],
            "allocation": {"allocated": opposite <= 0.1, "same_sign_share": 0.0, "opposite_sign_share": opposite}}


def _best(loss):
    return BestDecomposable(loss=loss, se=0.005, n_eval=4096, omega=((0.5, 0.0), (0.0, 0.5)),
                            mu=((1.0, 0.0), (0.0, 1.0)), family="signed", allocated_loss=1.5, allocated_se=0.005,
                            C=1.5 / loss, C_se=0.01)


def _fake(monkeypatch, loss, opposite, best):
    monkeypatch.setattr(claim, "converged_run", lambda cfg, schedule, seed: _run(loss, opposite))
    monkeypatch.setattr(claim, "best_decomposable", lambda *a, **k: _best(best))
    monkeypatch.setattr(claim.exact_theory, "exact_fixed_point", lambda *a: {"loss": 1.5, "error_estimate": 1e-9})
    prof = replace(claim.PROFILES["tiny"], runs=(((3, 3), 2, 32, 0.5, 100),))
    return claim.SPEC.run(prof)


def test_superposition_at_the_best_point_is_located(monkeypatch):
    res = _fake(monkeypatch, 1.20, 0.4, 1.20)
    assert res.verdict == "located", res.details
    assert any(r["side"] == "not above" for r in res.headline) and any(r["side"] == "two-sided" for r in res.headline)


def test_superposition_short_of_the_best_point_is_contradicted(monkeypatch):
    res = _fake(monkeypatch, 1.37, 0.4, 1.16)
    assert res.verdict == "contradicted", res.details
    assert "does not reach" in res.findings[0].text and "1.37" in res.findings[0].text


def test_findings_follow_the_numbers(monkeypatch):
    a = _fake(monkeypatch, 1.20, 0.4, 1.20).findings[0].text
    b = _fake(monkeypatch, 1.25, 0.4, 1.20).findings[0].text
    assert a != b and "1.25" in b


def test_allocated_run_is_reported_and_undecided(monkeypatch):
    res = _fake(monkeypatch, 1.50, 0.0, 1.20)
    assert res.verdict == "undecided" and "no trained run left" in res.details["undecided"]
    assert [r["side"] for r in res.headline] == ["reported"]
