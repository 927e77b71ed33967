"""boundary-left-allocation: the comparisons on faked runs and continuations (fast), the
findings template, and the tiny profile (a run that stays allocated: undecided, never
located)."""
from __future__ import annotations

from dataclasses import replace

from claims import boundary_left_allocation as claim
from mutation import patch_kind
from numerics.experiments.probes import BestDecomposable
from theory import exact as exact_theory


def _run(loss, opposite, left=0.0):
    """A trained run: converged for the boundary's comparison when ``left`` is small."""
    return {"loss": loss, "se": 0.005, "n": 16384, "converged": left == 0.0, "step_error": 0.002,
            "descent_left": left, "residual": 0.02, "omega": [[0.5, 0.0], [0.0, 0.5]], "mu": [[1.0, -opposite],
                                                                                           [0.0, 1.0]],
            "allocation": {"allocated": opposite <= 0.1, "same_sign_share": 0.0, "opposite_sign_share": opposite,
                           "superposition": opposite >= 0.2, "signed_superposed": [opposite >= 0.2] * 2}}


class _Continued(dict):
    """A stand-in for numerics.experiments.converged.ContinuedRun (read as a mapping and by
    attribute, as the claim reads it)."""
    __getattr__ = dict.__getitem__

    def to_dict(self):
        return dict(self)


def _continued(loss, on_D=True, converged=True):
    return _Continued(on_D=on_D, converged=converged, loss=loss, se=0.004, jitter=0.0005, time=60.0,
                      start_loss=1.37, reason="" if converged and on_D else ("off D: ..." if not on_D else
                                                                             "budget spent: ..."),
                      omega=((0.15, -0.15), (-0.15, 0.15)), mu=((2.6, -2.6), (-2.6, 2.6)),
                      allocation={"allocated": False, "superposition": True, "signed_superposed": [True, True],
                                  "opposite_sign_share": 1.0, "same_sign_share": 0.0})


def _best(loss):
    return BestDecomposable(loss=loss, se=0.005, n_eval=4096, omega=((0.5, 0.0), (0.0, 0.5)),
                            mu=((1.0, 0.0), (0.0, 1.0)), family="signed", allocated_loss=1.5, allocated_se=0.005,
                            C=1.5 / loss, C_se=0.01)


def _fake(monkeypatch, loss, opposite, best, left=0.0, continued=None):
    calls = []
    patch_kind(monkeypatch, "converged", lambda cfg, schedule, seed: _run(loss, opposite, left))
    patch_kind(monkeypatch, "best_decomposable", lambda **k: _best(best))
    patch_kind(monkeypatch, "continue_on_D", lambda **k: calls.append(k) or continued)
    monkeypatch.setattr(exact_theory, "exact_fixed_point", lambda *a: {"loss": 1.5, "error_estimate": 1e-9})
    prof = replace(claim.PROFILES["tiny"], runs=(((3, 3), 2, 32, 0.5),))
    res = claim.SPEC.run(prof)
    res.calls = calls
    return res


def test_superposition_at_the_best_point_is_located(monkeypatch):
    res = _fake(monkeypatch, 1.20, 0.4, 1.20)
    assert res.verdict == "located", res.details
    assert any(r["side"] == "not above" for r in res.headline) and any(r["side"] == "two-sided" for r in res.headline)
    assert not res.calls          # converged for the comparison: compared as trained, not followed


def test_superposition_short_of_the_best_point_is_contradicted(monkeypatch):
    res = _fake(monkeypatch, 1.37, 0.4, 1.16)
    assert res.verdict == "contradicted", res.details
    assert "stops above" in res.findings[0].text and "1.37" in res.findings[0].text


def test_findings_follow_the_numbers(monkeypatch):
    a = _fake(monkeypatch, 1.20, 0.4, 1.20).findings[0].text
    res = _fake(monkeypatch, 1.25, 0.4, 1.20)
    b = res.findings[0].text
    assert a != b and "1.25" in b
    # they read the comparisons' fields (details["role"], config), not their names
    for c in res.details["comparisons"]:
        c["name"] = "renamed"
    assert claim.findings(res)[0].text == b


def test_an_unconverged_run_is_followed_on_D_and_the_end_compared(monkeypatch):
    """The trained run still descends (it could lose 0.05 against 0.014 allowed): it is not
    compared itself but followed on D, with the best point's standard error as the reference;
    the converged end is compared, and the finding says where it went."""
    res = _fake(monkeypatch, 1.37, 0.45, 1.16, left=0.05, continued=_continued(1.17))
    assert len(res.calls) == 1 and res.calls[0]["best"].se == 0.005
    assert res.verdict == "located", res.details
    best = [c for c in res.details["comparisons"] if "best decomposable" in c["name"]][0]
    assert best["measured"] == 1.17 and best["details"]["followed_on_D"]
    text = res.findings[0].text
    assert "followed on D" in text and "signed superposition" in text and "sits at" in text
    rows = [r for r in res.headline if "still to lose" in r["name"]]
    assert rows and rows[0]["measured"] == 0.05 and rows[0]["side"] == "reported"


def test_a_flow_still_descending_at_the_budget_is_undecided(monkeypatch):
    res = _fake(monkeypatch, 1.37, 0.45, 1.16, left=0.05, continued=_continued(1.20, converged=False))
    assert res.verdict == "undecided" and "budget" in res.details["undecided"], res.details
    assert "still descending at the budget" in res.findings[0].text


def test_a_run_off_D_is_not_followed_and_undecided(monkeypatch):
    res = _fake(monkeypatch, 1.37, 0.45, 1.16, left=0.05, continued=_continued(1.37, on_D=False, converged=False))
    assert res.verdict == "undecided" and "off D" in res.details["undecided"], res.details
    assert "has left D" in res.findings[0].text


def test_allocated_run_is_reported_and_undecided(monkeypatch):
    res = _fake(monkeypatch, 1.50, 0.0, 1.20)
    assert res.verdict == "undecided" and "no trained run left" in res.details["undecided"]
    assert [r["side"] for r in res.headline] == ["reported"]


def test_the_runs_are_claims_5_and_6s_by_case_name(monkeypatch):
    """Every run, its search and its flow on D are seeded by their case's name at the report's
    seed (numerics.engine): the run is trained_run_seed(seed, tasks, sigma, L), the name claims 5
    and 6 give the same run; the report's --seed moves every one of the seeds."""
    from numerics.engine import trained_run_seed

    def seeds(report_seed):
        seen = {"run": [], "best": [], "flow": []}
        patch_kind(monkeypatch, "converged",
                   lambda cfg, schedule, seed: seen["run"].append(seed) or _run(1.37, 0.45, 0.05))
        patch_kind(monkeypatch, "best_decomposable", lambda seed, **k: seen["best"].append(seed) or _best(1.16))
        patch_kind(monkeypatch, "continue_on_D", lambda seed, **k: seen["flow"].append(seed) or _continued(1.17))
        monkeypatch.setattr(exact_theory, "exact_fixed_point", lambda *a: {"loss": 1.5, "error_estimate": 1e-9})
        runs = ((3, 3), 2, 32, 0.5), ((3, 3), 2, 64, 0.5), ((3, 3, 3), 3, 32, 0.5)
        claim.SPEC.run(replace(claim.PROFILES["tiny"], runs=runs), seed=report_seed)
        assert seen["run"] == [trained_run_seed(report_seed, t, s, L) for t, _, L, s in runs]
        return seen

    a, b = seeds(0), seeds(1)
    for what in ("run", "best", "flow"):
        assert len(a[what]) == 3 and len(set(a[what])) == 3, (what, a[what])        # distinct cases, distinct seeds
        assert not set(a[what]) & set(b[what]), (what, a[what], b[what])           # --seed moves every one
    assert len(set(a["run"]) | set(a["best"]) | set(a["flow"])) == 9       # a run, its search and its flow: three cases
