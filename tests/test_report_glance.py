"""The report at a glance (issue 29): the scorecard, the forest plot, the marked findings, the
printed precision, the templates.  Everything here is built from claims.json data (real
``claims.core.compare`` summaries inside fake claims), in seconds.
"""
from __future__ import annotations

import contextlib
import copy
import io
import math
import re
from pathlib import Path

import pytest

from claims.core import ClaimResult, Comparison, Finding, Outcome, PerturbationCheck, compare, headline_row
from reports import findings as report_findings
from reports import render as report_render
from reports.build import check_report, main

from report_fakes import fake_spec, install_registry, strict_load

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- printed precision


@pytest.mark.parametrize("measured, se, tolerance, text", [
    (0.15750922046624344, 0.0008030459733072055, None, "0.15751 ± 0.0008"),   # to the se's second digit
    (0.7664, 0.0045, 0.01885, "0.7664 ± 0.0045"),
    (1.3716335709, 0.006867, 0.0566, "1.3716 ± 0.0069"),
    (350316000.0, 430000.0, None, "3.5032e+08 ± 4.3e+05"),
    (0.0288, 0.0896, 0.3585, "0.029 ± 0.09"),
    (0.0004, 0.0896, 0.3585, "≈ 0 ± 0.09"),                                   # below its se's resolution
    (9.629328987721105e-17, None, 2.0662393097877622e-13, "< 1e-14"),           # rounding residual
    (3.2060209067835894e-16, None, 1.4210854715202004e-14, "< 1e-15"),
    (0.0016927190239788851, None, 1.0, "< 0.1"),                               # a ratio to a rounding tolerance
    (20.330803541961775, None, 4.322216837471541, "20.3"),                     # to a tenth of the tolerance
    (1234.5678, None, 0.02, "1235"),                                           # at most 4 digits without se
    (0.0, None, 1.0, "0"),
    (10, None, 0.0, "10"),                                                     # counts as they are
    ([1, 1], None, 0.0, "[1, 1]"),
    ("3 of 3", None, None, "3 of 3"),
    (2.5, None, None, "2.5"),
    (None, None, None, "null"),
])
def test_numbers_are_printed_at_the_precision_their_run_resolves(measured, se, tolerance, text):
    assert report_render.printed(measured, se, tolerance) == text


def test_rounding_level_digits_are_never_printed():
    """What the README shows does not move with the digits that differ between CPUs: an exact check's
    residual anywhere below a tenth of its tolerance (0.006327 on one machine's BLAS, 0.009038 on
    another's, 0.01064 on a third: issue 29), a trained number at 1e-12 relative."""
    assert (report_render.printed(0.006326902496669466, None, 1.0) == report_render.printed(0.009038432138, None, 1.0)
            == report_render.printed(0.01063784946, None, 1.0))
    assert report_render.printed(3.2e-16, None, 1.42e-14) == report_render.printed(9.6e-17, None, 1.42e-14)
    for x, se in ((0.1575092204662, 0.000803), (1.491234, 0.012), (2.7015611718, 0.0445), (-1.8015781, 3e-5)):
        assert report_render.printed(x * (1 + 1e-12), se) == report_render.printed(x, se)


# --------------------------------------------------------------------------- forest rows


def _summary(**kw) -> dict:
    return compare(why="test", **kw).summary()


def test_forest_rows_normalise_by_the_comparisons_own_tolerance():
    two = report_render.forest_row("c", _summary(name="rate", measured=0.1575, predicted=0.1748, tolerance=0.00895,
                                                  se=0.0008))
    assert two.signed and two.side == "two-sided" and two.agrees is False
    assert two.value == pytest.approx((0.1575 - 0.1748) / 0.00895) and two.bar == pytest.approx(0.0008 / 0.00895)
    above = report_render.forest_row("c", _summary(name="loss", measured=1.372, predicted=1.547, tolerance=0.035,
                                                    side="not above", se=0.012))
    assert above.signed and above.side == "not above" and above.value == pytest.approx(-5.0) and above.agrees
    # an error in other units (a ratio to a bound): only error / tolerance, no sign, no bar
    ratio = report_render.forest_row("c", _summary(name="residual / bound", measured=0.0288, predicted=0.3585,
                                                    tolerance=1.0, error=lambda m, p: m / p, se=0.09))
    assert not ratio.signed and ratio.value == pytest.approx(0.0288 / 0.3585) and ratio.bar is None
    # lists: error / tolerance (the size of the normalised error)
    lists = report_render.forest_row("c", _summary(name="served point", measured=[0.5, 1.9], predicted=[0.49, 1.8],
                                                    tolerance=1.0, error=lambda m, p: 0.64))
    assert not lists.signed and lists.value == pytest.approx(0.64)
    # an exact check (tolerance 0) that agrees sits at 0; one that does not sits beyond the edge
    exact = report_render.forest_row("c", _summary(name="winners", measured=10, predicted=10, tolerance=0.0))
    assert exact.value == 0.0 and exact.agrees
    off = report_render.forest_row("c", _summary(name="winners", measured=9, predicted=10, tolerance=0.0))
    assert math.isinf(off.value) and off.value < 0 and off.agrees is False


def test_forest_rows_come_from_the_comparisons():
    comparisons = [_summary(name="a", measured=1.0, predicted=1.1, tolerance=0.2, se=0.05),
                   _summary(name="b", measured=[1], predicted=[1], tolerance=0.0, error=lambda m, p: 0.0)]
    entry = {"id": "x", "details": {"comparisons": comparisons},
             "headline": [{"name": "a", "theory": 1.1, "measured": 1.0, "tolerance": 0.2, "agrees": True,
                           "side": "two-sided"}]}
    rows, left_out = report_render.forest_rows({"claims": [entry]})
    assert [r.name for r in rows] == ["a", "b"] and left_out == 0
    assert rows[0].value == pytest.approx(-0.5) and rows[0].bar == pytest.approx(0.25)


# --------------------------------------------------------------------------- fake claims with comparisons


def _measured(ctx, results):
    """A claim whose comparisons are real compare() summaries (se, resolving power) and whose
    headline is its second row, named as its headline comparison."""
    comps = [compare("off-D residual", 3.2e-16, 0.0, 1.42e-14, "rounding", wrong=[("residual 1e-12", 1e-12)]),
             compare("held-out loss", 0.7664, 0.7793, 0.01885, "4 se", se=0.0045, wrong=[("x1.1", 0.857)]),
             compare("gain", 1.491, 1.485, 0.05, "4 se", se=0.012, units="absolute", wrong=[("H", 2.0)])]
    return Outcome(comps, headline=[headline_row(c, se=c.se) for c in comps], headline_comparison="held-out loss")


fake_measured = fake_spec("fake-measured", _measured, "A claim with comparisons", "loss -> fixed point.",
                          findings=lambda r: [Finding(r.id, "holds", "The held-out loss 0.7664 ± 0.0045 agrees with "
                                                      "0.7793.", {"loss": {"value": 0.7664, "se": 0.0045},
                                                                  "fixed": {"value": 0.7793, "se": None}})])


def _saddle(ctx, results):
    """A boundary beyond the paper, contradicted by one of its three comparisons."""
    comps = [compare("growth rate vs 2a, tasks=(2, 2)", 0.15750922, 0.17480074, 0.00895008, "4 se + shift",
                     se=0.000803, config="tasks=(2, 2) H=2 L=64", wrong=[("rate 0", 0.0)]),
             compare("growth rate vs 2a, tasks=(1, 1)", 0.12100595, 0.12420244, 0.00868582, "4 se",
                     se=0.00135, config="tasks=(1, 1) H=2 L=32", wrong=[("rate 0", 0.0)]),
             compare("invariant flow stays", 0.0, 0.0, 1.7e-8, "rounding", side="not above",
                     wrong=[("SGD's 0.64", -0.64)])]
    return Outcome(comps, headline=[headline_row(c, se=c.se) for c in comps])


def _saddle_findings(result):
    return [Finding(result.id, "beyond", "At tasks=(2, 2) the off-task value grows at 0.1575 ± 0.0008 "
                        "against 2a = 0.1748.", {"rate": {"value": 0.15750922, "se": 0.000803},
                                                 "pred": {"value": 0.17480074, "se": None}}),
            Finding(result.id, "beyond", "At tasks=(1, 1) it grows at 0.121 ± 0.0014 against 0.1242.",
                    {"rate": {"value": 0.12100595, "se": 0.00135}, "pred": {"value": 0.12420244, "se": None}})]


fake_saddle = fake_spec("boundary-fake-saddle", _saddle, "A saddle", "saddle.", kind="boundary",
                        findings=_saddle_findings)


@pytest.fixture(scope="module")
def glance_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("glance") / "r"
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        install_registry(mp, "fake_claims_glance", {"fake-measured": fake_measured, "boundary-fake-saddle": fake_saddle})
        status = main(["--profile", "tiny", "--out", str(out), "--only", "fake-measured,boundary-fake-saddle",
                       "--no-progress"])
    return out, status


def test_the_scorecard_line_of_each_id(glance_report):
    out, status = glance_report
    assert status == 1 and check_report(out) == []
    report = strict_load(out / "claims.json")
    card = {r["id"]: r for g in report_render.scorecard(report) for r in g["rows"]}
    measured = card["fake-measured"]
    # a passing id: its named headline row ("held-out loss", its headline comparison), as one sentence
    assert measured["headline"] == "held-out loss: measured 0.7664 ± 0.0045 against 0.7793 (tolerance 0.01885)."
    assert (measured["agree"], measured["of"], measured["lead"]) == (3, 3, "")
    # its resolving power in words: the larger side of the held-out loss's (a two-sided relative power)
    rp = report["claims"][0]["details"]["comparisons"][1]["resolving_power"]
    assert measured["resolving"] == f"rejects a {100 * max(rp['low'], rp['high']):.2g} % error"
    saddle = card["boundary-fake-saddle"]
    assert saddle["failing"] and saddle["verdict"] == "contradicted" and (saddle["agree"], saddle["of"]) == (2, 3)
    # a contradicted id: the comparison that decided it, never its agreeing headline row
    assert saddle["lead"] == "1 of 3 comparisons disagrees:"
    assert saddle["headline"] == ("growth rate vs 2a, r = (2, 2): measured 0.15751 ± 0.0008 against 0.1748 "
                                  "(tolerance 0.00895; missed by 1.9 × it).")
    assert saddle["resolving"] == "rejects its prediction itself"


def test_headline_row_named_by_the_headline_comparison_or_the_first():
    rows = [{"name": "first"}, {"name": "second"}]
    named = {"resolving_power": {"headline": {"name": "second"}}}
    assert report_render.headline_row({"headline": rows})["name"] == "first"
    assert report_render.headline_row({"headline": rows, "details": named})["name"] == "second"
    unshown = {**named, "comparisons": [{"name": "second", "predicted": 2.0, "measured": 2.1, "tolerance": 0.2}]}
    row = report_render.headline_row({"headline": rows[:1], "details": unshown})
    assert (row["name"], row["theory"], row["measured"], row["side"]) == ("second", 2.0, 2.1, "two-sided")
    assert report_render.headline_row({"headline": []}) is None


def test_a_failing_id_comes_first_in_its_group_and_its_finding_says_so(glance_report):
    out, _ = glance_report
    report = strict_load(out / "claims.json")
    marked = report_render.marked_findings(report)
    assert [f["outcome"] for f in marked] == [None, "contradicted", None]  # only the disagreeing one
    page = (out / "index.html").read_text(encoding="utf-8")
    card = page[page.index("<section id='scorecard'>"):page.index("<section id='findings'>")]
    row = card[card.index("data-id='boundary-fake-saddle'"):]
    assert "data-outcome='contradicted'" in row[:80] and "1 of 3 comparisons disagrees:" in row
    own = page[page.index("id='claim-boundary-fake-saddle'"):]
    assert "<b class='outcome contradicted'>contradicted:</b> At tasks=(2, 2)" in own  # wherever it appears


def test_the_forest_plot_is_drawn_from_claims_json_alone(glance_report, tmp_path):
    out, _ = glance_report
    page = (out / "index.html").read_text(encoding="utf-8")
    svg = page[page.index("<svg id=\"forest-plot\""):page.index("</svg>")]
    assert "<script" not in svg and "6 rows" not in svg
    assert "(measured − predicted) / tolerance" in svg and "fake-saddle" in svg  # the id, without 'boundary-'
    assert (out / "figures" / "forest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    caption = page[page.index("<figure id='forest'>"):page.index("</figure>", page.index("<figure id='forest'>"))]
    assert "Every comparison of the report (6, 1 disagreeing" in caption and "Hollow:" in caption
    # a re-render redraws it from the JSON file: the same picture
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--from-json", str(out / "claims.json"), "--out", str(tmp_path / "again")]) == 1
    assert (tmp_path / "again" / "figures" / "forest.png").read_bytes() == (out / "figures" / "forest.png").read_bytes()
    again = (tmp_path / "again" / "index.html").read_text(encoding="utf-8")
    assert again[again.index("<svg"):again.index("</svg>")] == page[page.index("<svg"):page.index("</svg>")]


def test_the_page_and_the_comparison_come_from_templates():
    """No markup in the Python of the page: index.html and reports.compare's page are the templates'
    (jinja2, autoescaped), and the templates ship with the package."""
    for module in ("render.py", "compare.py", "findings.py"):
        source = (REPO_ROOT / "reports" / module).read_text(encoding="utf-8")
        assert not re.search(r"<(table|tr|td|section|ul|li|h2|details)\b", source), module
    assert report_render.environment().autoescape is True
    names = {p.name for p in (REPO_ROOT / "reports" / "templates").iterdir()}
    assert {"base.html.j2", "index.html.j2", "macros.html.j2", "compare.html.j2", "report.css"} <= names
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'reports = ["templates/*"]' in pyproject


def test_markup_in_a_claims_text_stays_text(tmp_path):
    entry = ClaimResult(id="c-1", title="<b>t</b>", statement="<script>alert(1)</script>", verdict="fail",
                        headline=[{"name": "<i>rate</i>", "theory": 1.0, "measured": 2.0, "se": None, "tolerance": 0.1,
                                   "agrees": False, "side": "two-sided", "config": None, "resolving_power": None}],
                        findings=[Finding("c-1", "holds", "<img src=x onerror=alert(1)>", {})]).to_dict()
    entry.update(figure_data=entry.pop("figures"), figures=[], figure_errors=[])
    report = {"claims": [entry], "findings": entry["findings"], "provenance": {"profile": "quick"}}
    page = report_render.render_html(report, {})
    assert "<script>alert" not in page and "<img src=x" not in page and "<i>rate" not in page
    assert "&lt;script&gt;" in page and "&lt;i&gt;rate&lt;/i&gt;" in page


# --------------------------------------------------------------------------- the first screen: the deciding row


def _entry(claim_id, comparisons, headline=None, kind="claim", paper=None, headline_comparison=None):
    """A claims.json entry made by the one constructor (claims.core.build_result) from real comparisons:
    verdict, summaries, the resolving powers confirmed as a build confirms them."""
    from claims.core import ClaimSpec, Outcome, build_result
    spec = ClaimSpec(id=claim_id, title=claim_id, statement="s", profiles={}, evaluate=lambda ctx: None,
                     kind=kind, paper=paper)
    result = build_result(spec, Outcome(comparisons, headline=headline, headline_comparison=headline_comparison), {})
    result.paper = paper
    return result.to_dict()


def _document(*entries) -> dict:
    return {"claims": list(entries), "findings": [], "provenance": {"profile": "quick", "seed": 0, "device": "cpu"}}


def _largest_gap(m, p) -> float:
    return max(abs(a - b) for k in m for a, b in zip(m[k], p[k]) if isinstance(a, float) and isinstance(b, float))


PHASES_MEASURED = {"s0=0.2 seed 0": [0.08043, 1.117], "s0=0.4 seed 0": ["warm-up undefined by t_end", "emergence "
                                                                          "undefined by t_end"],
                   "s0=0.8 seed 0": [0.02305, 1.055]}
PHASES_PREDICTED = {"s0=0.2 seed 0": [0.082, 0.97], "s0=0.4 seed 0": ["warm-up undefined", "emergence undefined"],
                    "s0=0.8 seed 0": [0.02207, 0.1986]}


def race_entry() -> dict:
    """A boundary whose headline row agrees (9 against 9) and whose verdict is decided by another
    comparison, of a structured measurement (phase times per start, two of them undefined)."""
    winners = compare("race winner = theory's ODE rule", 9, 9, 0.0, "exact", units="count")
    phases = compare("phase times against init scale: full model vs reduced flow", PHASES_MEASURED, PHASES_PREDICTED,
                     0.4, "phase readout", error=_largest_gap, config="tasks=(2, 2) H=2 L=32 sigma=0")
    return _entry("boundary-race", [winners, phases], headline=[headline_row(winners)], kind="boundary")


def test_a_contradicted_id_is_headlined_by_the_row_that_decided_it():
    entry = race_entry()
    assert entry["verdict"] == "contradicted"
    row = report_render.scorecard(_document(entry))[0]["rows"][0]
    assert row["lead"] == "1 of 2 comparisons disagrees:"
    assert row["headline"] == (
        "phase times against init scale: full model vs reduced flow: 4 numbers, the furthest at s0=0.8 seed 0, "
        "entry 2: measured 1.055 against 0.1986, off by a factor 5.3; 2 measured value(s) not a number "
        "(tolerance 0.4; missed by 2.1 × it; r = (2, 2), H = 2, L = 32, σ = 0).")
    assert "winner" not in row["headline"] and row["resolving"] == "rejects its prediction itself"
    # the README's line says the same, and no dump of per-seed numbers follows it
    text = report_findings.markdown(_document(entry))
    line = next(x for x in text.splitlines() if x.startswith("| `boundary-race`"))
    assert row["headline"] in line and "| 1/2 |" in line
    assert not [x for x in text.splitlines() if "0.08043" in x or "seed 0:" in x]


def structured_document() -> dict:
    """Every kind of value a first screen has to say in words: dicts of arrays at rounding, lists that agree,
    a bracket, a residual, a string prediction, trained numbers."""
    grad = {"omega_dot": [[-0.3477, 2.266], [-0.02812, 0.3088]], "mu_dot": [[-0.1446, -1.147], [-0.174, -1.006]]}
    moved = {k: [[x * (1 + 3e-16) for x in row] for row in v] for k, v in grad.items()}
    err = lambda m, p: max(abs(a - b) for k in m for r, q in zip(m[k], p[k]) for a, b in zip(r, q)) / 1e-9  # noqa
    spectral = _entry("spectral", [compare("gradient-projection tasks=(2, 1) H=2 L=8", moved, grad, 1.0, "rounding",
                                           error=err)], paper="gradient flow is an ODE on (omega, mu)",
                      headline_comparison="gradient-projection tasks=(2, 1) H=2 L=8")
    err = lambda m, p: max(abs(a - b) / 0.05 for a, b in zip(m, p))  # noqa: E731
    point = compare("allocated fixed point (omega*, mu*)", [0.6889, 0.6899, 1.381, 1.381],
                    [0.6804, 0.6803, 1.397, 1.397], 1.0, "ODE end", error=err, config="tasks=(2, 2) H=2 L=64")
    allocation = _entry("allocation", [point], paper="one task per head")
    optimality = _entry("optimality", [compare("constant at H = 3", 2.6234519, [2.624153, 2.624153], 0.0834, "w",
                                               error=lambda m, p: max(0.0, p[0] - m, m - p[1]))])
    residual = _entry("block", [compare("off-D residual", 1.7335822577166026e-16, 0.0, 5e-13, "rounding")])
    trend = Comparison(name="gap exponent trend", measured=[-1.2, -1.6], predicted="steepening, below -1",
                       error=0.0, tolerance=0.0, why="w", perturbations=[PerturbationCheck("flat", True)])
    trained = compare("converged loss, tasks=[2, 2], L=64, sigma=0", 0.4812284114781861, 0.47711879057636963,
                      0.01413, "4 se", se=0.0033)
    return _document(spectral, allocation, optimality, residual, _entry("boundary-trend", [trend], kind="boundary"),
                     _entry("trained", [trained]), race_entry())


RAW = re.compile(r"[{}]|\[\s*[-+\d.]|\d\]|': |\bnan\b|e\+\d")


def test_no_raw_structure_on_the_first_screen():
    doc = structured_document()
    rows = {r["id"]: r for g in report_render.scorecard(doc) for r in g["rows"]}
    for row in rows.values():
        assert not RAW.search(f"{row['headline']} {row['resolving']}"), row
    assert rows["spectral"]["headline"] == ("gradient-projection r = (2, 1), H = 2, L = 8: 8 numbers, each "
                                            "theory's to rounding.")
    assert rows["spectral"]["paper"] == "gradient flow is an ODE on (omega, mu)"
    assert rows["allocation"]["headline"] == (
        "allocated fixed point (omega*, mu*): 4 numbers, the furthest at entry 3: measured 1.381 against 1.397, "
        "1.1 % off (error 0.32 × its tolerance; r = (2, 2), H = 2, L = 64).")
    assert rows["optimality"]["headline"] == "constant at H = 3: measured 2.623 against 2.624 (tolerance 0.0834)."
    assert rows["block"]["headline"] == "off-D residual: measured < 5e-13 against 0 (tolerance 5e-13)."
    assert rows["boundary-trend"]["headline"] == "gap exponent trend: 2 measured values against steepening, below -1."
    assert rows["trained"]["headline"] == ("converged loss, r = (2, 2), L = 64, σ = 0: measured 0.4812 ± 0.0033 "
                                           "against 0.4771 (tolerance 0.01413).")
    # the page's first screen and the README's block: no raw structure either
    page = report_render.render_html(doc, {})
    card = page[page.index("<section id='scorecard'>"):page.index("</section>", page.index("<section id='scorecard'>"))]
    assert not RAW.search(re.sub(r"<[^>]*>", " ", card)), card
    assert "Paper: gradient flow is an ODE on (omega, mu)." in card
    block = report_findings.markdown(doc)
    assert not RAW.search(block.split("![Forest plot")[0]), block
    assert "*Paper: one task per head.*" in block


@pytest.mark.parametrize("kw, words", [
    (dict(measured=1.001, predicted=1.0, tolerance=0.029), "rejects a 3 % error"),
    (dict(measured=0.002, predicted=0.0, tolerance=0.01), "rejects an absolute error of 0.012"),
    (dict(measured=1.2, predicted=1.0, tolerance=1.5, side="not below"),
     "rejects only order-of-magnitude errors (a prediction off by a factor 2.7)"),
    (dict(measured=1.02, predicted=1.1, tolerance=0.05, side="not above"), "rejects a prediction 12 % too low"),
    (dict(measured=-0.2, predicted=0.0, tolerance=0.01, side="not above"), "rejects a prediction 0.21 too low"),
    (dict(measured=5, predicted=5, tolerance=0.0, units="count"), "rejects a count off by 1"),
    (dict(measured=0.0, predicted=0.0, tolerance=0.0), "rejects any error (an exact comparison)"),
    (dict(measured=2e-16, predicted=0.0, tolerance=1.5e-13), "rejects any error beyond rounding (its tolerance)"),
    (dict(measured=2.0, predicted=1.0, tolerance=0.1), "rejects its prediction itself"),
    (dict(measured=1.0, predicted=1.0, tolerance=lambda p: abs(1.0 - p) + 0.05), "blind to a prediction too low or "
                                                                                 "too high"),
    (dict(measured=1.1, predicted=1.0, tolerance=1.4), "blind to a prediction too low"),
])
def test_resolving_power_in_words(kw, words):
    c = compare("c", why="w", **kw).summary()
    assert report_render.power_words(c) == words
    assert not re.search(r"e[+-]\d|\d{3,} %", words)
    assert report_render.power_words({**c, "power_unconfirmed": "it is too small: ..."}) == ("not confirmed: it is "
                                                                                              "too small: ...")


def _perturbed(doc: dict, residual: float, relative: float) -> dict:
    """``doc`` with what differs between two CPUs of one kind moved: every rounding residual measured
    against 0 (no standard error, below ROUNDING_LEVEL, and ``residual`` inside its tolerance) set to
    ``residual``, every other measured number moved by ``relative`` (rounding in training)."""
    doc = copy.deepcopy(doc)
    for entry in doc["claims"]:
        for c in entry["details"]["comparisons"] + entry["headline"]:
            key = "predicted" if "predicted" in c else "theory"
            if c.get("measured") == c.get(key) or c.get("side") == "reported":
                continue
            m, tol = report_render.scalar(c.get("measured")), report_render.scalar(c.get("tolerance"))
            if (report_render.scalar(c.get(key)) == 0 and c.get("se") is None and m is not None
                    and abs(m) <= report_render.ROUNDING_LEVEL and tol is not None and residual <= tol):
                c["measured"] = residual
                c["error"] = residual if "error" in c else None
            else:
                c["measured"] = _moved(c["measured"], relative)
    return doc


def _moved(value, relative):
    if isinstance(value, dict):
        return {k: _moved(v, relative) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, relative) for v in value]
    return value * (1 + relative) if isinstance(value, float) else value


def test_the_readme_block_does_not_move_with_rounding():
    """Two quick reports of one commit on two CPUs of one kind differ in their rounding only: a residual
    against 0 (2e-13 here, 7e-14 there, inside its tolerance of 5e-13) and trained numbers at 1e-12
    relative.  Their README blocks are the same; a number moved by its own standard error is not."""
    doc = structured_document()
    block = report_findings.block(doc)
    for residual, relative in ((2e-13, 1e-12), (7e-14, -1e-12), (0.0, 3e-13)):
        assert report_findings.block(_perturbed(doc, residual, relative)) == block, (residual, relative)
    moved = copy.deepcopy(doc)
    trained = next(e for e in moved["claims"] if e["id"] == "trained")
    trained["headline"][0]["measured"] += 0.0033
    assert report_findings.block(moved) != block


def test_each_paper_claim_states_the_paper_and_the_report_prints_it_beside_its_number():
    import claims
    specs = [claims.spec_of(cid) for cid in claims.REGISTRY]
    papers = {s.id: s.paper for s in specs if s.kind == "claim"}
    assert len(papers) == 7 and all(p and "\n" not in p and len(p) <= 160 for p in papers.values()), papers
    assert all(s.paper is None for s in specs if s.kind == "boundary")
    entry = _entry("multi-head-gain", [compare("gain at L=64", 1.505, 1.512, 0.0695, "4 se")],
                   paper=papers["multi-head-gain"])
    assert entry["paper"] == papers["multi-head-gain"]
    row = report_render.scorecard(_document(entry))[0]["rows"][0]
    assert row["paper"] == papers["multi-head-gain"] and row["headline"].startswith("gain at L = 64: measured 1.505")
