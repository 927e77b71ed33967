"""Mutation suite of claim 6 (multi-head-gain): wrong theories applied by monkeypatching
theory/, each of which the claim must reject at a small dedicated profile.  Run:
``python -m pytest -q -s --mutants -m mutants tests/claims/test_multi_head_gain_mutants.py``.

Every test asserts ``verdict != "pass"`` *and* that a comparison disagrees, and prints the
mutant's name and verdict.  Blind spot by construction: with m = 1 the gain is 1 = H, so
"gain forced to H" changes nothing there (the claim's domain requires m >= 2)."""
from __future__ import annotations

import pytest

from claims import multi_head_gain as claim
from numerics.experiments.converged import TrainingSchedule
from theory import exact as exact_theory
from theory import limiting_error as limit_theory
from mutation import assert_caught, assert_control_passes

MUTANT_PROFILE = claim.MultiHeadGainProfile(
    cases=(((2, 2), 0.0),), train_Ls=(32,),
    schedule=TrainingSchedule(held_out_tokens=2 ** 21, held_out_min=65536),
    bridge_elements=2 ** 21, limit_L=4096, limit_elements=2 ** 24)


def _caught(name: str) -> None:
    assert_caught(claim, MUTANT_PROFILE, name)


@pytest.mark.mutants
def test_control_unmutated_profile_passes():
    assert_control_passes(claim, MUTANT_PROFILE)


@pytest.mark.mutants
def test_gain_limit_forced_to_H(monkeypatch):
    monkeypatch.setattr(limit_theory, "gain", lambda tasks, sigma=0.0: float(len(tasks)))
    _caught("rho_inf forced to H (theory.limiting_error.gain)")


@pytest.mark.mutants
def test_finite_L_gain_forced_to_H(monkeypatch):
    original = exact_theory.finite_L_gain

    def forced(tasks, L, sigma=0.0):
        out = dict(original(tasks, L, sigma))
        out["gain"] = float(len(tasks))
        return out
    monkeypatch.setattr(exact_theory, "finite_L_gain", forced)
    _caught("finite-L gain forced to H (theory.exact.finite_L_gain)")


@pytest.mark.mutants
def test_exact_loss_scaled(monkeypatch):
    """theory.exact.exact_loss x1.1: the one-head optimum's loss (and so the finite-L gain) is
    10 % high; the allocated fixed point's value comes from the profiled one-task loss."""
    original = exact_theory.exact_loss

    def scaled(*a, **k):
        e = original(*a, **k)
        e.loss *= 1.1
        return e
    monkeypatch.setattr(exact_theory, "exact_loss", scaled)
    _caught("theory.exact.exact_loss x1.1")


@pytest.mark.mutants
def test_small_factor_finite_L_gain_is_caught(monkeypatch):
    """theory.exact's finite-L gain (the headline's prediction: the trained gain) scaled by 1 -+ twice the
    headline's own resolving power: the claim must not pass.  The trained runs and the reduced minima do not
    depend on it and are shared by the control and the mutants."""
    from mutation import assert_small_factor_caught

    # the runs and the reduced minima are kept by the engine (shared kinds); only theory is computed again
    original = exact_theory.finite_L_gain

    def patch(mp, factor):
        def scaled(tasks, L, sigma=0.0):
            out = dict(original(tasks, L, sigma))
            return {**out, "gain": factor * out["gain"]}
        mp.setattr(exact_theory, "finite_L_gain", scaled)

    assert_small_factor_caught(monkeypatch, lambda: claim.SPEC.run(profile=MUTANT_PROFILE), patch)
