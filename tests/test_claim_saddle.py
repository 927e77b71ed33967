"""boundary-saddle at the tiny profile: the growth rate agrees with theory's 2a and rejects a
and 0, the invariant flow stays at rounding, the findings are generated from the numbers."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

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


def test_pooled_slope_ratio():
    """Inverse-variance pooling of the slopes in units of theory's 1/a; agrees with 1, rejects 1/2 and 2."""
    e1 = SimpleNamespace(slope=16.0, slope_pred=16.2, slope_se=1.0)
    e2 = SimpleNamespace(slope=11.0, slope_pred=11.5, slope_se=2.0)
    c = claim.check_pooled_slope([e1, e2], "two configurations")
    w = np.array([16.2 ** 2, (11.5 / 2) ** 2])
    r = np.array([16.0 / 16.2, 11.0 / 11.5])
    assert c.measured == pytest.approx((w * r).sum() / w.sum())
    assert c.agrees and c.discriminates, c.explain()
