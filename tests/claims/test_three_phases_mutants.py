"""Mutation suite of claim 3: wrong theories and wrong numerics, applied by monkeypatching
theory/ or numerics/, each of which the claim's run at a small dedicated profile must not
pass.  Each profile is first run unmutated and must pass (else a mutant's non-pass verdict
would mean nothing).  Run: python -m pytest -q -s --mutants -m mutants tests/claims/test_three_phases_mutants.py
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import numerics.config
import numerics.model
import theory.task_allocation
import theory.three_phases
from claims import three_phases as claim
from mutation import logits_doubled, patch_everywhere, patch_kind
from numerics import engine

pytestmark = pytest.mark.mutants

# the warm-up law needs >= 3 init scales; a 10 % error of C moves T(s0) by 0.1 C / s0 (1.4 at
# s0 = 0.015), so the tolerances must be below that: large batch (SGD spread ~ 1/sqrt B, and
# relative to T it shrinks as s0 grows) and fine records (one spacing is in every tolerance)
LAW = claim.ThreePhasesProfile(tasks=(3, 3), heads=2, L=32, init_scales=(0.015, 0.02, 0.03), batch=4096,
                               records=161, eval_batch=4096, held_out=4096)
# one case with two heads and two tasks: the selection mechanism and the converged loss
SMALL = claim.ThreePhasesProfile(tasks=(3, 3), heads=2, L=32, init_scales=(0.05,), batch=256, records=81,
                                 eval_batch=2048, held_out=16384)
# one precise case (small s0, large batch, fine records): tight phase-time tolerances
PRECISE = claim.ThreePhasesProfile(tasks=(3, 3), heads=2, L=32, init_scales=(0.02,), batch=1024, records=161,
                                   eval_batch=2048, held_out=4096)
# label noise that matters: small blocks, short context, sigma = 0.5
NOISY = claim.ThreePhasesProfile(tasks=(1, 1), heads=2, L=16, sigma=0.5, logit_scale=6.0, init_scales=(0.05,),
                                 batch=256, records=81, eval_batch=2048, held_out=16384)

_measurements: dict = {}


@pytest.fixture
def cached_measurement(monkeypatch):
    """For mutants of theory only: the training runs do not depend on the mutated function,
    so each is measured once for the module (keyed by its parameters, the run length theory's
    forecast gives it and its seed) and reused by every test."""
    real = engine.kind_of("phase_run").run

    def measure(forecast, **params):
        key = (forecast["time"], repr(sorted(params.items())))
        if key not in _measurements:
            _measurements[key] = real(forecast=forecast, **params)
        return _measurements[key]

    patch_kind(monkeypatch, "phase_run", measure)


def _report(name, result):
    print(f"MUTANT {name}: verdict {result.verdict}")
    for c in result.details.get("comparisons", []):
        print(f"    {c['name']}: error {c['error']} tolerance {c['tolerance']} agrees {c['agrees']}")
    return result.verdict


@pytest.mark.parametrize("profile", [LAW, SMALL, PRECISE, NOISY], ids=["law", "small", "precise", "noisy"])
def test_unmutated_profiles_pass(profile, cached_measurement):
    result = claim.SPEC.run(profile=profile)
    assert _report(f"none ({profile.tasks}, s0={profile.init_scales}, sigma={profile.sigma})", result) == "pass", \
        result.details.get("comparisons") or result.details


def test_mutant_warmup_constant_off_by_10_percent(monkeypatch, cached_measurement):
    real = theory.three_phases.predicted_warmup_scaling

    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        out["inverse"] = {**out["inverse"], "C": 1.1 * out["inverse"]["C"]}
        return out

    monkeypatch.setattr(theory.three_phases, "predicted_warmup_scaling", wrong)
    assert _report("warm-up constant C x 1.1", claim.SPEC.run(profile=LAW)) != "pass"


def test_mutant_law_exponent_1_2(monkeypatch, cached_measurement):
    real = theory.three_phases.warmup_law_time
    monkeypatch.setattr(theory.three_phases, "warmup_law_time",
                        lambda s0, C, c0, exponent=1.0: real(s0, C, c0, 1.2 * exponent))
    assert _report("warm-up law 1/s0 -> 1/s0^1.2", claim.SPEC.run(profile=LAW)) != "pass"


def test_mutant_law_without_c0(monkeypatch, cached_measurement):
    real = theory.three_phases.predicted_warmup_scaling

    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        out["inverse"] = {**out["inverse"], "c0": 0.0}
        return out

    monkeypatch.setattr(theory.three_phases, "predicted_warmup_scaling", wrong)
    assert _report("warm-up law c0 -> 0 (pure inverse)", claim.SPEC.run(profile=LAW)) != "pass"


def test_mutant_winners_permuted(monkeypatch):
    real = theory.task_allocation.predicted_winners

    def wrong(*args, **kwargs):
        w = real(*args, **kwargs)
        return w[1:] + w[:1]

    monkeypatch.setattr(theory.task_allocation, "predicted_winners", wrong)
    assert _report("predicted winners permuted", claim.SPEC.run(profile=SMALL)) != "pass"


def test_mutant_logits_doubled(monkeypatch):
    patch_everywhere(monkeypatch, numerics.model.attend, logits_doubled)   # the trainer's and the model's
    result = claim.SPEC.run(profile=PRECISE)
    assert _report("full model's logits doubled", result) != "pass"
    # caught by a comparison, not only by a perturbation that stopped being rejected
    assert not all(c["agrees"] for c in result.details["comparisons"])


@pytest.mark.xfail(strict=False, reason=(
    "a blind spot found at this round's merge (prompt stream v3): with label noise dropped, the NOISY profile's "
    "whole-prompt converged loss no longer leaves its tolerance, and the claim passes; it was caught at 0.063 "
    "against 0.038 with the earlier stream. Open for the next round: a noise-sensitive row with the resolving "
    "power to see sigma^2 = 0.25 of the loss at this profile"))
def test_mutant_label_noise_dropped(monkeypatch):
    real = numerics.config._assemble
    monkeypatch.setattr(numerics.config, "_assemble",
                        lambda x, q, g, eps, *args, **kwargs: real(x, q, g, None, *args, **kwargs))
    assert _report("label noise dropped (sigma = 0.5)", claim.SPEC.run(profile=NOISY)) != "pass"


def test_profiles_are_frozen_dataclasses():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LAW.batch = 1


def test_small_factor_warmup_constant_is_caught(monkeypatch):
    # theory's warm-up constant C (the headline) scaled by 1 -+ twice its own resolving power at the quick profile
    # (C resolves ~13 % there): claim 3 must not pass.  The runs (kept by the engine for the test) and the flow's
    # phase prediction do not depend on C and are shared by the control and the mutants.
    from mutation import assert_small_factor_caught, memoise

    memoise(monkeypatch, theory.three_phases, "run_length", "phase_prediction")
    real = theory.three_phases.predicted_warmup_scaling

    def patch(mp, factor):
        def scaled(*args, **kwargs):
            out = real(*args, **kwargs)
            return {**out, "inverse": {**out["inverse"], "C": factor * out["inverse"]["C"]}}
        mp.setattr(theory.three_phases, "predicted_warmup_scaling", scaled)

    assert_small_factor_caught(monkeypatch, lambda: claim.SPEC.run(profile="quick"), patch)
