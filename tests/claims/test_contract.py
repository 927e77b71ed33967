"""The contract every registered claim keeps, checked the same way for each id of
``claims.REGISTRY`` at the tiny profile (one run per id, shared by the checks):

- it runs: the outcome is a verdict of its kind, never a crash turned into ``error``;
- its kind is the one its spec declares, and the one its id names (claims.core.kind_from_id:
  what a report reads where the spec cannot say);
- it compares something, unless it says why it could not decide (``details["undecided"]``);
- every comparison that agrees rejects each of its wrong predictions, or the result is
  ``undecided`` (a check that accepts a wrong prediction cannot pass) or ``fail`` /
  ``contradicted`` (claims.core.judge: a disagreement is conclusive whatever the tolerance), and a
  passing claim has no comparison that disagrees;
- a measurement that could not decide (``details["undecided"]``) is never a pass;
- its findings are sentences with numbers in them, each of a known kind, naming the claim.

:func:`contract_problems` states the contract once; ``test_the_contract_can_fail`` sends it
results that break each clause.  (tests/claims has no ``__init__.py``: tests/ is on sys.path
during a run, and a package named ``claims`` there would shadow the library's.)"""
from __future__ import annotations

import re
import time

import pytest

import claims
from claims.core import BOUNDARY_OUTCOMES, FINDING_KINDS, VERDICTS, ClaimResult, Finding, kind_from_id

IDS = [i for i in claims.REGISTRY if i not in claims.OPT_IN]
"""The ids the contract runs at the tiny profile: every registered one but the opt-in atlas ids,
which train nothing and are built from a sweep (their refusal without one is checked below; their
contract at the atlas's tiny sweep belongs with the ``atlas`` marker's end-to-end test)."""
PASSING = {"claim": "pass", "boundary": "located"}
NOT_DECIDED = {"undecided"}
A_NUMBER = re.compile(r"[0-9]")


def contract_problems(claim_id: str, res: ClaimResult, declared_kind: str) -> list[str]:
    """What ``res`` (the result of ``claim_id``, whose spec declares ``declared_kind``) breaks
    of the contract; empty when it keeps it."""
    out = []
    if res.id != claim_id:
        out.append(f"id {res.id!r} is not the registry's {claim_id!r}")
    if not res.kind == declared_kind == kind_from_id(claim_id):
        out.append(f"kind {res.kind!r}, spec {declared_kind!r}, id {kind_from_id(claim_id)!r} disagree")
    if res.verdict not in (VERDICTS if res.kind == "claim" else BOUNDARY_OUTCOMES):
        out.append(f"verdict {res.verdict!r} is not one of its kind's")
    if "traceback" in res.details:
        out.append(f"crashed: {res.details.get('error')}")
        return out
    passed = res.verdict == PASSING.get(res.kind)
    comparisons = res.details.get("comparisons", [])
    if not comparisons and not (res.details.get("undecided") and res.verdict in NOT_DECIDED):
        out.append("no comparison in details['comparisons'] (and no reason it could not decide)")
    for c in comparisons:
        accepted = [p["description"] for p in c.get("perturbations", []) if not p["rejected"]]
        # claims.core.judge: an agreement that accepts a wrong prediction cannot pass (undecided);
        # a verdict of fail / contradicted stands on a disagreement, conclusive whatever
        # the tolerance, so a weak agreeing comparison beside it does not change it
        if c["agrees"] and accepted and passed:
            out.append(f"{c['name']} agrees but accepts the wrong predictions {accepted}, verdict {res.verdict}")
        if passed and not c["agrees"]:
            out.append(f"{c['name']} disagrees, verdict {res.verdict}")
    if res.details.get("undecided") and res.verdict not in NOT_DECIDED:
        out.append(f"undecided ({res.details['undecided']}) yet {res.verdict}")
    if not res.findings:
        out.append("no finding")
    for f in res.findings:
        if f.claim != claim_id or f.kind not in FINDING_KINDS:
            out.append(f"finding of {f.claim!r}, kind {f.kind!r}")
        if not (f.text.strip() and A_NUMBER.search(f.text)):
            out.append(f"a finding without a number: {f.text!r}")
    return out


@pytest.fixture(scope="module")
def results():
    """{id: (ClaimResult, CPU seconds)} of every registered claim at the tiny profile, seed 0."""
    out = {}
    for claim_id in IDS:
        t0 = time.process_time()
        res = claims.spec_of(claim_id).run(profile="tiny", device="cpu", seed=0)
        out[claim_id] = (res, time.process_time() - t0)
    return out


@pytest.mark.e2e   # 15 claims at the tiny profile: 144 s CPU in all (process_time, measured on a loaded machine)
@pytest.mark.parametrize("claim_id", IDS)
def test_every_registered_claim_keeps_the_contract(results, claim_id):
    res, cpu = results[claim_id]
    problems = contract_problems(claim_id, res, claims.spec_of(claim_id).kind)
    assert not problems, f"{claim_id} ({cpu:.1f} s CPU, verdict {res.verdict}): " + "; ".join(problems)


@pytest.mark.parametrize("claim_id", [i for i in claims.OPT_IN if i.startswith("atlas-")])
def test_an_opt_in_id_without_its_sweep_refuses_and_says_how_to_build_it(claim_id):
    res = claims.spec_of(claim_id).run(profile="tiny", device="cpu", seed=0)
    assert res.verdict == "error" and res.kind == claims.spec_of(claim_id).kind == kind_from_id(claim_id)
    assert "python -m numerics.sweep" in res.details["error"], res.details["error"]


def _good() -> ClaimResult:
    return ClaimResult(id="limiting-error", title="t", statement="s", verdict="pass", kind="claim",
                       details={"comparisons": [{"name": "L=64", "agrees": True,
                                                 "perturbations": [{"description": "x2", "rejected": True}]}]},
                       findings=[Finding(claim="limiting-error", kind="holds", text="L loss is 8.4 +- 0.1")])


def test_the_contract_can_fail():
    """A result that keeps the contract passes it; each broken clause is seen."""
    assert contract_problems("limiting-error", _good(), "claim") == []

    def broken(**change) -> list[str]:
        res = _good()
        for k, v in change.items():
            setattr(res, k, v)
        return contract_problems("limiting-error", res, "claim")

    assert broken(details={"error": "E", "traceback": "..."})
    assert broken(kind="boundary", verdict="located")
    assert broken(details={"comparisons": [{"name": "L=64", "agrees": True,
                                            "perturbations": [{"description": "x2", "rejected": False}]}]})
    assert broken(details={"comparisons": [{"name": "L=64", "agrees": False, "perturbations": []}]})
    assert broken(details={"comparisons": _good().details["comparisons"], "undecided": "budget spent"})
    assert broken(findings=[Finding(claim="limiting-error", kind="holds", text="it holds")])
    assert broken(findings=[])
    assert broken(details={})
    assert not broken(verdict="undecided", details={"undecided": "still descending at the budget"})
    assert broken(verdict="error", details={"undecided": "still descending at the budget"})  # error: only a raise
    # the same lax comparison is allowed when the claim says it cannot decide
    assert not broken(verdict="undecided", details={"comparisons": [{"name": "L=64", "agrees": True,
                                                                     "perturbations": [{"description": "x2",
                                                                                        "rejected": False}]}]})
    # ... and beside a disagreement, which decides the verdict on its own (claims.core.judge)
    lax = {"name": "L=64", "agrees": True, "perturbations": [{"description": "x2", "rejected": False}]}
    against = {"name": "L=32", "agrees": False, "perturbations": []}
    assert not broken(verdict="fail", details={"comparisons": [lax, against]})
