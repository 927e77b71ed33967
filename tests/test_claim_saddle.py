"""boundary-saddle at the tiny profile: the growth rate at each step agrees with the discrete
map at the held point, its lr -> 0 extrapolation with theory's 2a, both reject a and 0; the
invariant flow stays at rounding; the findings are generated from the numbers."""
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
    assert growth["details"]["lrs"] == [0.2, 0.1] and growth["predicted"] == pytest.approx(2 * 0.0621012, rel=1e-5)
    steps = [c for n, c in comps.items() if n.startswith("saddle: growth rate at lr=")]
    assert len(steps) == 2 and all(c["agrees"] and all(p["rejected"] for p in c["perturbations"]) for c in steps)
    assert comps["saddle: noiseless flow on a G-invariant batch stays"]["agrees"]
    assert sum(f.kind == "beyond" for f in res.findings) >= 3
    # the sentence is the result's own numbers: change one, the sentence changes
    before = claim.findings(res)[0].text
    res.details["comparisons"][[c["name"] for c in res.details["comparisons"]].index(growth["name"])]["measured"] = 0.5
    assert claim.findings(res)[0].text != before and "0.5" in claim.findings(res)[0].text


def test_pooled_slope_ratio():
    """Inverse-variance pooling of the slopes in units of theory's 1/a; agrees with 1, rejects 1/2 and 2."""
    e1 = SimpleNamespace(slope=16.0, slope_se=1.0)
    e2 = SimpleNamespace(slope=11.0, slope_se=2.0)
    c = claim.check_pooled_slope([e1, e2], [16.2, 11.5], "two configurations")
    w = np.array([16.2 ** 2, (11.5 / 2) ** 2])
    r = np.array([16.0 / 16.2, 11.0 / 11.5])
    assert c.measured == pytest.approx((w * r).sum() / w.sum())
    assert c.agrees and c.discriminates, c.explain()


def test_extrapolated_rate_rejects_the_step_biased_rate():
    """The lr -> 0 extrapolation through the same comparison: rates that fall quadratically with
    lr towards 2a agree with 2a; the same rates all shifted by the step bias of the largest lr
    (the measurement at one step taken for the limit) are rejected."""
    sp = __import__("theory.saddle", fromlist=["saddle_point"]).saddle_point((1, 1), 2, 32)
    lrs = (0.2, 0.1, 0.05)
    def g(lr, shift=0.0):
        r = sp.rate - 0.5 * lr ** 2 - shift
        return SimpleNamespace(lr=lr, measured=r, se=2e-4, raw=r, config={"tasks": [1, 1], "heads": 2, "L": 32},
                               batch=512, seeds=(0, 1, 2), mu0=0.05)
    assert claim.check_growth_rate([g(x) for x in lrs], "toy").agrees
    assert not claim.check_growth_rate([g(x, 0.02) for x in lrs], "toy").agrees
