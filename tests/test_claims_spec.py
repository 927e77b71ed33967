"""claims.core's lookup of comparisons by structured fields (issue 32): findings read the
fields a comparison was built with (``details["role"]``, ``details["L"]``, its config label),
never its name."""
from __future__ import annotations

import pytest

from claims.core import ClaimResult, compare, comparisons_where


def _result(*comparisons) -> ClaimResult:
    return ClaimResult(id="fake-plain", title="", statement="", verdict="pass",
                       details={"comparisons": [c.summary() for c in comparisons]})


def test_comparisons_are_found_by_their_fields_not_their_names():
    a = compare("a sentence that says L=32", 1.0, 1.0, 0.1, "why", config="x", details={"role": "rate", "L": 64})
    b = compare("rate", 1.0, 1.0, 0.1, "why", config="y", details={"role": "rate", "L": 32})
    c = compare("rate, L=32", 1.0, 1.0, 0.1, "why", config="x", details={"role": "slope"})
    res = _result(a, b, c)
    assert [x["config"] for x in comparisons_where(res, role="rate")] == ["x", "y"]          # in their order
    assert [x["details"]["L"] for x in comparisons_where(res, L=32)] == [32]                 # not the name's 32
    assert [x["name"] for x in comparisons_where(res, config="x", role="slope")] == ["rate, L=32"]
    assert comparisons_where(res, role="rate", L=16) == [] and comparisons_where(res, config="z") == []
    assert [x["config"] for x in comparisons_where(res, config="x")] == ["x", "x"]
    with pytest.raises(ValueError, match="at least one field"):
        comparisons_where(res)


def test_a_comparison_without_the_field_does_not_match():
    res = _result(compare("plain", 1.0, 1.0, 0.1, "why"))
    assert comparisons_where(res, role=None) == []        # absent is not None
