"""claims.core.base.judge: the verdict of a comparison (pass / fail / error) and its precedence."""
from claims.core.base import PerturbationCheck, judge


def _p(rejected: bool) -> PerturbationCheck:
    return PerturbationCheck(description="x 1.1", rejected=rejected)


def test_agreement_needs_every_perturbation_rejected():
    assert judge(True, [_p(True), _p(True)]) == "pass"
    assert judge(True, [_p(True), _p(False)]) == "error"      # cannot discriminate: undecided


def test_disagreement_is_fail_even_when_the_check_is_blunt():
    # outside a tolerance too wide to reject the perturbations is outside any narrower one
    assert judge(False, [_p(False)]) == "fail"
    assert judge(False, [_p(True)]) == "fail"
    assert judge(False, []) == "fail"


def test_a_boundary_gets_the_same_rule_in_its_own_words():
    from claims.core.base import BOUNDARY_OUTCOMES, FAILING

    assert judge(True, [_p(True)], kind="boundary") == "located"
    assert judge(False, [_p(True)], kind="boundary") == "contradicted"
    assert judge(True, [_p(False)], kind="boundary") == "undecided"
    assert judge(True, [_p(True)], kind="boundary", undecided="the run ended before the escape") == "undecided"
    assert judge(True, [_p(True)], undecided="too few seeds") == "error"  # a claim that cannot decide
    assert set(FAILING["boundary"]) == {"contradicted", "error"} and "undecided" in BOUNDARY_OUTCOMES
    assert set(FAILING["claim"]) == {"fail", "error"}


def test_an_unknown_kind_is_refused():
    import pytest

    with pytest.raises(ValueError, match="kind must be one of"):
        judge(True, [], kind="lemma")
