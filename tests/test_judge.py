"""claims.core.judge: the verdict of a comparison (pass / fail / undecided) and its precedence; ``error`` is
only a check that raised (claims.core.run_claim)."""
from claims.core import ClaimResult, PerturbationCheck, judge, run_claim


def _p(rejected: bool) -> PerturbationCheck:
    return PerturbationCheck(description="x 1.1", rejected=rejected)


def test_agreement_needs_every_perturbation_rejected():
    assert judge(True, [_p(True), _p(True)]) == "pass"
    assert judge(True, [_p(True), _p(False)]) == "undecided"  # cannot discriminate


def test_disagreement_is_fail_even_when_the_check_is_blunt():
    # outside a tolerance too wide to reject the perturbations is outside any narrower one
    assert judge(False, [_p(False)]) == "fail"
    assert judge(False, [_p(True)]) == "fail"
    assert judge(False, []) == "fail"


def test_a_boundary_gets_the_same_rule_in_its_own_words():
    from claims.core import BOUNDARY_OUTCOMES, FAILING

    assert judge(True, [_p(True)], kind="boundary") == "located"
    assert judge(False, [_p(True)], kind="boundary") == "contradicted"
    assert judge(True, [_p(False)], kind="boundary") == "undecided"
    assert judge(True, [_p(True)], kind="boundary", undecided="the run ended before the escape") == "undecided"
    assert judge(True, [_p(True)], undecided="too few seeds") == "undecided"  # a claim that cannot decide
    assert set(FAILING["boundary"]) == {"contradicted", "error"} and "undecided" in BOUNDARY_OUTCOMES
    assert set(FAILING["claim"]) == {"fail", "error"}


def test_a_claim_that_agrees_but_cannot_decide_is_undecided_and_only_a_raise_is_error():
    assert judge(True, [_p(False)]) == "undecided"                  # a wrong prediction accepted
    assert judge(True, [], undecided="no run inside the domain") == "undecided"
    assert judge(False, [], undecided="no run inside the domain") == "fail"   # a disagreement decides

    def body():
        raise RuntimeError("diverged at step 17")
    raised = run_claim("c", "t", "s", body)
    assert (raised.kind, raised.verdict) == ("claim", "error") and "diverged" in raised.details["error"]
    agreeing = run_claim("c", "t", "s", lambda: ClaimResult(id="c", title="t", statement="s",
                                                           verdict=judge(True, [_p(False)])))
    assert agreeing.verdict == "undecided" and "error" not in agreeing.details


def test_an_unknown_kind_is_refused():
    import pytest

    with pytest.raises(ValueError, match="kind must be one of"):
        judge(True, [], kind="lemma")
