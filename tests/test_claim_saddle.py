"""boundary-saddle at the tiny profile: the growth rate agrees with theory's 2a and rejects a
and 0, the invariant flow stays at rounding, the findings are generated from the numbers."""
from __future__ import annotations

from claims import saddle as claim


def test_tiny_saddle_rows_and_findings():
    res = claim.run("tiny")
    assert res.kind == "boundary" and res.verdict in ("located", "undecided"), res.details
    comps = {c["name"].split(",")[0]: c for c in res.details["comparisons"]}
    growth = comps["saddle: growth rate of off-task |mu| vs 2a"]
    assert growth["agrees"] and all(p["rejected"] for p in growth["perturbations"]), growth
    assert comps["saddle: noiseless flow on a G-invariant batch stays"]["agrees"]
    assert sum(f.kind == "beyond" for f in res.findings) >= 3
    # the sentence is the result's own numbers: change one, the sentence changes
    before = claim.findings(res)[0].text
    res.details["comparisons"][[c["name"] for c in res.details["comparisons"]].index(growth["name"])]["measured"] = 0.5
    assert claim.findings(res)[0].text != before and "0.5" in claim.findings(res)[0].text
