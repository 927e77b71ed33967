"""claims.base.judge: the verdict of a comparison (pass / fail / error) and its precedence."""
from claims.base import PerturbationCheck, judge


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
