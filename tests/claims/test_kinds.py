"""One "kind from id" (issue 32): a spec declares its kind; claims.core.kind_from_id is the rule
for where no spec can say (a claim module that failed to import, an older claims.json without
``kind``), and every reader of the reports uses it, so that ``atlas-...`` is a boundary
everywhere (the build, the schema and the page)."""
import pytest

import claims
from claims.core import KINDS, kind_from_id
from reports.render import kind_of


@pytest.mark.parametrize("claim_id", list(claims.REGISTRY))
def test_every_spec_declares_the_kind_its_id_names(claim_id):
    assert claims.spec_of(claim_id).kind == kind_from_id(claim_id)


@pytest.mark.parametrize("claim_id, kind", [("atlas-heads", "boundary"), ("boundary-saddle", "boundary"),
                                            ("limiting-error", "claim"), ("fake-plain", "claim"), (3, "claim")])
def test_the_readers_agree(claim_id, kind):
    assert kind_from_id(claim_id) == kind_of({"id": claim_id}) == kind in KINDS


def test_a_declared_kind_wins_over_the_id():
    assert kind_of({"id": "atlas-heads", "kind": "claim"}) == "claim"
