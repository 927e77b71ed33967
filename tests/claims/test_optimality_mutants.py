"""Mutants of claim 7 (issue 12): wrong theories and numerics applied with monkeypatch; the claim
run at a dedicated small profile must return a verdict other than "pass".  Run with
``python -m pytest -q --mutants -m mutants tests/claims/test_optimality_mutants.py -s``; each test prints
the mutant's name and the verdict it got.  The controls run the same profiles unmutated (they
must pass, so that a non-pass verdict is the mutant's doing)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import sympy as sp

from claims import optimality as claim
from numerics.experiments import clear_cache
from numerics.model import MultiHeadAttention
from theory import exact, limiting_error, optimality as th_opt

# the H table at H = m and m + 1 only (no training: the decomposable candidates and the bridge),
# with an evaluation sample large enough that C has ~1% standard error (so a 10% shift of a
# bracket edge is a > 4 standard-error discrepancy)
TABLE = replace(claim.PROFILES["tiny"], tasks=(2, 2), L=64, heads=("m", "m+1"), decomposable_starts=0,
                full_starts=0, fit_elements=2 ** 18, eval_prompts=16384, held_out_prompts=8192,
                limit_tasks=(), limit_Ls=())
# the L -> inf extrapolation at 2m heads only (the row that uses F)
LIMIT = replace(claim.PROFILES["tiny"], heads=(), full_starts=0, limit_tasks=(2,), limit_Ls=(256, 1024, 4096),
                limit_eval_elements=2 ** 24, limit_fit_elements=2 ** 17)


def _run(monkeypatch, profile, name):
    clear_cache()     # the engine keeps the decomposable searches: a mutant must not read the control's
    monkeypatch.setitem(claim.PROFILES, "tiny", profile)
    r = claim.SPEC.run(profile="tiny")
    print(f"[mutant] {name}: verdict {r.verdict}; " +
          "; ".join(f"{h['name']}: measured {h['measured']}, theory {h['theory']}, agrees {h['agrees']}"
                    for h in r.headline))
    return r


@pytest.mark.mutants
@pytest.mark.parametrize("profile_name", ["TABLE", "LIMIT"])
def test_control_unmutated_profiles_pass(monkeypatch, profile_name):
    r = _run(monkeypatch, {"TABLE": TABLE, "LIMIT": LIMIT}[profile_name], f"control ({profile_name})")
    assert r.verdict == "pass", r.details.get("error") or r.headline


@pytest.mark.mutants
def test_mutant_F_exponent_shifted(monkeypatch):
    """F = (1-2w)^{-D/2} ... with the exponent shifted by -1/2."""
    original = limiting_error.limit_expressions

    def shifted():
        e = dict(original())
        e["F"] = e["F"] * (1 - 2 * e["w"]) ** sp.Rational(-1, 2)
        return e

    monkeypatch.setattr(limiting_error, "limit_expressions", shifted)
    limiting_error._F_fn.cache_clear()
    try:
        r = _run(monkeypatch, LIMIT, "F exponent -D/2 -> -(D+1)/2")
    finally:
        limiting_error._F_fn.cache_clear()
    assert r.verdict != "pass"


@pytest.mark.mutants
def test_mutant_linear_attention_off_by_10_percent(monkeypatch):
    """The linear-attention loss (and its L -> inf limit) 10% too high."""
    loss, limit = th_opt.linear_attention_loss, th_opt.linear_attention_limit
    monkeypatch.setattr(th_opt, "linear_attention_loss", lambda *a, **k: 1.1 * loss(*a, **k))
    monkeypatch.setattr(th_opt, "linear_attention_limit", lambda *a, **k: 1.1 * limit(*a, **k))
    assert _run(monkeypatch, TABLE, "linear attention x 1.1").verdict != "pass"


@pytest.mark.mutants
def test_mutant_predicted_optimum_scaled(monkeypatch):
    """The predicted allocated optimum's loss (the bracket's edge) scaled by 1.1."""
    fixed_point = exact.exact_fixed_point

    def scaled(*a, **k):
        out = dict(fixed_point(*a, **k))
        out["loss"] = 1.1 * out["loss"]
        return out

    monkeypatch.setattr(exact, "exact_fixed_point", scaled)
    assert _run(monkeypatch, TABLE, "allocated optimum x 1.1").verdict != "pass"


@pytest.mark.mutants
def test_mutant_full_model_logits_doubled(monkeypatch):
    """The full model's logits doubled (W_h -> 2 W_h inside the forward pass)."""
    merged = MultiHeadAttention.merged_weights

    def doubled(self):
        W, U = merged(self)
        return 2.0 * W, U

    monkeypatch.setattr(MultiHeadAttention, "merged_weights", doubled)
    assert _run(monkeypatch, TABLE, "full model logits x 2").verdict != "pass"


@pytest.mark.mutants
def test_small_factor_constant_is_caught(monkeypatch):
    """Theory's bracket of the constant -- at H = m + 1 the value allocated / linear, the headline -- scaled by
    1 -+ twice the headline's own resolving power (TABLE: H = m, m + 1, no training): the claim must not pass.
    The decomposable searches do not depend on it and are shared by the control and the mutants (run cache)."""
    from mutation import assert_small_factor_caught

    clear_cache()
    original = th_opt.constant_bracket

    def patch(mp, factor):
        def scaled(*a, **k):
            out = dict(original(*a, **k))
            return {**out, "low": factor * out["low"], "high": factor * out["high"]}
        mp.setattr(th_opt, "constant_bracket", scaled)

    assert_small_factor_caught(monkeypatch, lambda: claim.SPEC.run(profile=TABLE), patch)
