"""The resolving power of a comparison (claims.core.resolving_power) and the probes at the
tolerance's edge (claims.core.edge_probes): right for each side, each unit and custom error
functions, recomputing a tolerance made from the prediction, and fast; and the build's confirmation
of every power it prints (claims.core.unconfirmed_power through claims.core.build_result): a power
computed wrong, or changed after its probes were built, makes the claim an error.  Unit tests (no runs)."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from claims.core import (RESOLVING_FLOOR, Z_SE, Comparison, Tolerance, compare, edge_probes, judge, moved_prediction,
                         noise_term, resolved, resolving_power, resolving_summary, seen_eps, term, unconfirmed_power)
import doctest

import claims.core


def test_two_sided_relative_matches_closed_form():
    # |m - p (1 -+ eps)| > tol: low eps = (tol - (m - p)) / p ... solved by hand
    m, p, tol = 1.02, 1.0, 0.05
    c = compare("x", m, p, tol, "why")
    rp = c.resolving_power
    assert rp["units"] == "relative"
    assert rp["low"] == pytest.approx((tol - (m - p)) / p, rel=1e-5)
    assert rp["high"] == pytest.approx((tol + (m - p)) / p, rel=1e-5)
    assert seen_eps(c) == pytest.approx(rp["high"])


@pytest.mark.parametrize("side, sees", [("not above", "low"), ("not below", "high")])
def test_one_sided_comparison_is_blind_on_the_side_it_cannot_see(side, sees):
    c = compare("x", 1.0, 1.0, 0.1, "why", side=side)
    other = "high" if sees == "low" else "low"
    assert c.resolving_power[other] is None
    assert c.resolving_power[sees] == pytest.approx(0.1, rel=1e-5)
    # only the side it sees is probed, and the probe is rejected
    edges = [p for p in c.perturbations if "edge" in p.details]
    assert [p.details["edge"] for p in edges] == [sees] and all(p.rejected for p in edges)
    assert judge(c.agrees, c.perturbations) == "pass"


def test_absolute_units_for_a_prediction_of_zero():
    c = compare("gap", 0.3, 0.0, 1.0, "why")
    assert c.resolving_power == {"low": pytest.approx(0.7, rel=1e-5), "high": pytest.approx(1.3, rel=1e-5),
                                 "units": "absolute"}


def test_count_units_move_by_whole_steps():
    exact = lambda m, p: float(sum(a != b for a, b in zip(m, p)))  # noqa: E731
    c = compare("counts", [1, 1, 0], [1, 1, 0], 0.0, "exact", error=exact, units="count")
    assert c.resolving_power == {"low": 1.0, "high": 1.0, "units": "count"}
    # within 2 of the prediction: the first rejected move is 3
    c = compare("n", 5, 5, 2.0, "w", units="count")
    assert (c.resolving_power["low"], c.resolving_power["high"]) == (3.0, 3.0)


def test_custom_error_function_and_labels_kept():
    # ints are labels (a head index) outside count units: only the float moves
    seen = []

    def error(measured, predicted):
        seen.append(predicted[1])
        return abs(measured - predicted[0]) / 0.1

    c = compare("share", 0.95, [0.9, [0, 1]], 1.0, "why", error=error)
    assert all(w == [0, 1] for w in seen)
    assert c.resolving_power["low"] == pytest.approx((0.1 - 0.05) / 0.9, rel=1e-5)
    assert c.resolving_power["high"] == pytest.approx((0.1 + 0.05) / 0.9, rel=1e-5)


def test_dict_predictions_are_moved():
    m = {"a": np.array([1.0, 2.0]), "b": 3.0}
    err = lambda x, p: max(float(np.max(np.abs(x["a"] - p["a"]))), abs(x["b"] - p["b"]))  # noqa: E731
    c = compare("d", m, {"a": np.array([1.0, 2.0]), "b": 3.0, "note": "labels stay"}, 0.3, "w", error=err)
    # the largest entry (3.0) is the first to leave the tolerance: eps = 0.3 / 3
    assert c.resolving_power["low"] == pytest.approx(0.1, rel=1e-5)
    assert moved_prediction({"b": 2.0, "s": "x"}, 0.5, 1.0, "relative") == {"b": 3.0, "s": "x"}


def test_entrywise_is_the_worst_entry():
    err = lambda m, p: max(abs(a - b) for a, b in zip(m, p))  # noqa: E731
    c = compare("fp", [1.0, 10.0], [1.0, 10.0], 0.1, "w", error=err, entrywise=True)
    rp = c.resolving_power
    # moved alone, the small entry needs 10 %, the large one 1 %: any one entry off by 10 % is caught
    assert rp["entrywise"] and rp["low"] == pytest.approx(0.1, rel=1e-5)
    assert [e["low"] for e in rp["entries"]] == [pytest.approx(0.1, rel=1e-5), pytest.approx(0.01, rel=1e-5)]
    edges = [p for p in c.perturbations if "edge" in p.details]
    assert len(edges) == 2 and all(p.rejected for p in edges)


def test_a_tolerance_of_named_terms_gives_compare_its_value_and_its_why():
    assert doctest.testmod(claims.core).failed == 0
    se, step, quad = 0.1, 0.3, 0.2       # (4 x 0.1 + 0.3) + 0.2 != 4 x 0.1 + (0.3 + 0.2) in floating point
    tol = Tolerance((noise_term(se, "the loss", 64), term("step error", step), term("quadrature", quad)), "because")
    c = compare("x", 1.0, 1.5, tol)
    assert c.tolerance == Z_SE * se + step + quad != Z_SE * se + (step + quad)
    assert c.why == (f"{Z_SE:g} standard errors of the loss (0.1, 64 prompts) 0.4 + step error 0.3 + quadrature 0.2 "
                     "= 0.9; because")
    assert c.agrees and not compare("x", 1.0, 2.0, tol).agrees
    with pytest.raises(ValueError, match="states its own why"):
        compare("x", 1.0, 1.5, tol, "a second why")
    with pytest.raises(ValueError, match="a number or a function needs one"):
        compare("x", 1.0, 1.5, 0.9)


def test_tolerance_made_from_the_prediction_is_recomputed():
    # a relative tolerance 10 % of the prediction: resolving power 1/11 below, 1/9 above (not 10 %)
    c = compare("rel", 1.0, 1.0, lambda p: 0.1 * p, "w")
    assert c.resolving_power["low"] == pytest.approx(1 / 11, rel=1e-5)
    assert c.resolving_power["high"] == pytest.approx(1 / 9, rel=1e-5)
    # and the wrong predictions are held to their own tolerance through the same function
    c = compare("rel", 1.0, 1.0, lambda p: 0.1 * p, "w", wrong=[("x 1.12", 1.12)])
    assert c.perturbations[0].details["tolerance"] == pytest.approx(0.112)


def test_a_tolerance_that_grows_as_fast_as_the_error_is_undecided_not_a_pass():
    # the tolerance swallows any move of the prediction: no resolving power, the edge probe passes,
    # and the judge calls the comparison undecided
    c = compare("lax", 1.0, 1.0, lambda p: abs(1.0 - p) + 0.05, "w", wrong=[("x 2", 2.0)])
    assert c.agrees and c.resolving_power["low"] is None and c.resolving_power["high"] is None
    edges = [p for p in c.perturbations if "edge" in p.details]
    assert edges and not any(p.rejected for p in edges)
    assert judge(c.agrees, c.perturbations) == "undecided"
    assert resolving_summary([c])["blind"] == ["lax"]


def test_prediction_already_rejected_has_power_zero_and_no_probe():
    c = compare("off", 2.0, 1.0, 0.1, "w")
    assert c.resolving_power["low"] == 0.0 and c.resolving_power["high"] == 0.0
    assert not [p for p in c.perturbations if "edge" in p.details]


def test_non_numeric_or_non_finite_predictions_have_none():
    assert resolving_power(lambda m, p: 0.0, 1.0, "< 0", 0.0) is None
    assert resolving_power(lambda m, p: 0.0, 1.0, [1.0, math.inf], 0.1) is None
    assert edge_probes(lambda m, p: 0.0, 1.0, "< 0", 0.0, None) == []


def test_hand_built_comparisons():
    # a scalar comparison built by hand with its side's default error gets its power on construction
    c = Comparison(name="n", measured=3, predicted=0, error=3.0, tolerance=4.0, why="w", side="not above")
    assert c.resolving_power == {"low": 2.0, "high": None, "units": "count"}
    assert [p.details["edge"] for p in c.perturbations] == ["low"]
    # resolved(): the error function must reproduce the stored error
    c = Comparison(name="r", measured={"x": 1.0}, predicted=1.0, error=0.0, tolerance=0.5, why="w")
    resolved(c, error=lambda m, p: abs(m["x"] - p))
    assert c.resolving_power["high"] == pytest.approx(0.5, rel=1e-5)
    with pytest.raises(ValueError, match="error function"):
        resolved(Comparison(name="r", measured=1.0, predicted=1.0, error=0.3, tolerance=0.5, why="w"))
    # calling it twice does not duplicate the edge probes
    resolved(c, error=lambda m, p: abs(m["x"] - p))
    assert len([p for p in c.perturbations if "edge" in p.details]) == 2


def test_summary_picks_headline_best_and_worst():
    cs = [compare("a", 1.0, 1.0, 0.01, "w"), compare("b", 1.0, 1.0, 0.2, "w"), compare("z", 0.0, 0.0, 0.1, "w")]
    s = resolving_summary(cs, "b")
    assert s["headline"]["name"] == "b" and s["headline"]["eps"] == pytest.approx(0.2, rel=1e-5)
    assert s["headline"]["meets_floor"] is False and s["floor"] == RESOLVING_FLOOR
    assert s["best"]["name"] == "a" and s["worst"]["name"] == "b"          # relative units first
    assert s["by_units"]["absolute"]["best"]["name"] == "z"
    with pytest.raises(ValueError, match="headline comparison"):
        resolving_summary(cs, "nope")


def test_fast():
    # a scalar comparison with its power and probes costs well under a millisecond
    t0 = time.perf_counter()
    for _ in range(200):
        compare("x", 1.02, 1.0, 0.05, "w", wrong=[("x 1.1", 1.1)])
    assert (time.perf_counter() - t0) / 200 < 5e-3


def test_exact_comparison_with_zero_tolerance_terminates():
    # tolerance 0 and a measurement equal to the prediction: every move is rejected, the scan ends at once
    t0 = time.perf_counter()
    c = compare("exact", 0.0, 0.0, 0.0, "w")
    assert time.perf_counter() - t0 < 0.5
    assert 0 < c.resolving_power["low"] < 1e-20 and 0 < c.resolving_power["high"] < 1e-20
    assert all(p.rejected for p in c.perturbations)


def test_an_error_undefined_at_a_zero_prediction():
    # a ratio to the prediction: the downward scan stops short of 0 instead of dividing by it
    c = compare("ratio", 0.03, 0.36, 1.0, "w", error=lambda m, p: m / p)
    assert c.resolving_power["low"] is not None and c.resolving_power["high"] is None


# --------------------------------------------------------------------------- the build confirms what it prints


def _build(comparisons):
    """The result the one constructor (claims.core.build_result) makes of these comparisons."""
    from claims.core import ClaimSpec, Outcome, build_result
    spec = ClaimSpec(id="fake-power", title="t", statement="s", profiles={}, evaluate=lambda ctx: None)
    return build_result(spec, Outcome(comparisons, headline_comparison=comparisons[0].name), {})


def _comparisons():
    err = lambda m, p: max(abs(a - b) for a, b in zip(m, p))  # noqa: E731
    return [compare("rate", 1.02, 1.0, 0.05, "4 se", se=0.0125, wrong=[("x1.2", 1.2)]),
            compare("count", 5, 5, 2.0, "w", units="count"),
            compare("exact", 0.0, 0.0, 0.0, "rounding"),
            compare("points", [1.0, 10.0], [1.0, 10.0], 0.1, "w", error=err, entrywise=True),
            Comparison(name="bound", measured=3, predicted=0, error=3.0, tolerance=4.0, why="w", side="not above")]


def test_the_build_confirms_every_resolving_power_it_prints():
    result = _build(_comparisons())
    assert result.verdict == "pass" and "undecided" not in result.details
    assert [c["power_unconfirmed"] for c in result.details["comparisons"]] == [None] * 5
    # the exact comparison's power is printed as a bound (every move the scan tried was rejected)
    assert result.details["comparisons"][2]["resolving_power"]["bound"] == ["low", "high"]


@pytest.mark.parametrize("factor, why", [(1 / 3, "too small"), (3.0, "too large")])
def test_a_wrong_resolving_power_makes_the_claim_undecided(monkeypatch, factor, why):
    """The power computed wrong (divided or multiplied by 3, its edge probes built from it) and the power
    changed after the edge probes were built from the true one (only what is printed is wrong): either way
    the build says the printed power is not confirmed, and the claim reads error with the reason."""
    import claims.core as common
    real_power, real_summary = common.resolving_power, common.Comparison.summary

    def scaled(power):
        out = dict(power)
        for key in ("low", "high"):
            if isinstance(out.get(key), float) and out[key] > 0:
                out[key] = out[key] * factor if out["units"] != "count" else float(max(1, round(out[key] * factor)))
        return out

    with monkeypatch.context() as mp:   # the computation itself
        mp.setattr(common, "resolving_power", lambda *a, **k: scaled(real_power(*a, **k)))
        result = _build([compare("rate", 1.02, 1.0, 0.05, "4 se", se=0.0125)])
    assert result.verdict == "error" and why in result.details["comparisons"][0]["power_unconfirmed"]
    assert "the resolving power printed for 'rate' is not confirmed" in result.details["fault"]
    with monkeypatch.context() as mp:   # only the printed number: the edge probes keep the true power
        mp.setattr(common.Comparison, "summary",
                   lambda self: {**real_summary(self), "resolving_power": scaled(real_summary(self)["resolving_power"])})
        comps = _comparisons()
        assert judge(all(c.agrees for c in comps), [p for c in comps for p in c.perturbations]) == "pass"
        result = _build(comps)
    assert result.verdict == "error", result.details
    unconfirmed = [c["name"] for c in result.details["comparisons"] if c["power_unconfirmed"]]
    # every printed power that moves is caught; the exact one's bound only from above, the count's by whole steps
    assert {"rate", "points", "bound"} <= set(unconfirmed) and "exact" not in unconfirmed
    assert all(why in c["power_unconfirmed"] for c in result.details["comparisons"] if c["power_unconfirmed"])


def test_a_disagreeing_comparison_still_fails_and_a_power_of_zero_needs_a_disagreement():
    result = _build([compare("off", 2.0, 1.0, 0.1, "w")])
    assert result.verdict == "fail" and result.details["comparisons"][0]["power_unconfirmed"] is None
    c = compare("x", 1.0, 1.0, 0.1, "w")
    assert "yet the comparison agrees" in unconfirmed_power(c, {"low": 0.0, "high": 0.0, "units": "relative"})
    hand = Comparison(name="h", measured={"a": 1.0}, predicted=1.0, error=0.0, tolerance=0.5, why="w",
                      resolving_power={"low": 0.5, "high": 0.5, "units": "relative"})
    assert "without the error function" in unconfirmed_power(hand)
