"""The report at a glance (issue 29): the scorecard, the forest plot, the marked findings, the
printed precision, the templates.  Everything here is built from claims.json data (real
``claims.common.compare`` summaries inside fake claims), in seconds.
"""
from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import pytest

from claims.base import ClaimResult, Finding, judge
from claims.common import compare, headline_row
from reports import figures as report_figures
from reports import render as report_render
from reports.build import check_report, main

from report_fakes import install_registry, strict_load

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
    two = report_figures.forest_row("c", _summary(name="rate", measured=0.1575, predicted=0.1748, tolerance=0.00895,
                                                  se=0.0008))
    assert two.signed and two.side == "two-sided" and two.agrees is False
    assert two.value == pytest.approx((0.1575 - 0.1748) / 0.00895) and two.bar == pytest.approx(0.0008 / 0.00895)
    above = report_figures.forest_row("c", _summary(name="loss", measured=1.372, predicted=1.547, tolerance=0.035,
                                                    side="not above", se=0.012))
    assert above.signed and above.side == "not above" and above.value == pytest.approx(-5.0) and above.agrees
    # an error in other units (a ratio to a bound): only error / tolerance, no sign, no bar
    ratio = report_figures.forest_row("c", _summary(name="residual / bound", measured=0.0288, predicted=0.3585,
                                                    tolerance=1.0, error=lambda m, p: m / p, se=0.09))
    assert not ratio.signed and ratio.value == pytest.approx(0.0288 / 0.3585) and ratio.bar is None
    # lists: error / tolerance (the size of the normalised error)
    lists = report_figures.forest_row("c", _summary(name="served point", measured=[0.5, 1.9], predicted=[0.49, 1.8],
                                                    tolerance=1.0, error=lambda m, p: 0.64))
    assert not lists.signed and lists.value == pytest.approx(0.64)
    # an exact check (tolerance 0) that agrees sits at 0; one that does not sits beyond the edge
    exact = report_figures.forest_row("c", _summary(name="winners", measured=10, predicted=10, tolerance=0.0))
    assert exact.value == 0.0 and exact.agrees
    off = report_figures.forest_row("c", _summary(name="winners", measured=9, predicted=10, tolerance=0.0))
    assert math.isinf(off.value) and off.value < 0 and off.agrees is False


def test_forest_rows_come_from_the_comparisons_or_else_the_judged_rows():
    comparisons = [_summary(name="a", measured=1.0, predicted=1.1, tolerance=0.2, se=0.05),
                   _summary(name="b", measured=[1], predicted=[1], tolerance=0.0, error=lambda m, p: 0.0)]
    entry = {"id": "x", "details": {"comparisons": comparisons},
             "headline": [{"name": "a", "theory": 1.1, "measured": 1.0, "tolerance": 0.2, "agrees": True,
                           "side": "two-sided"}]}
    rows, left_out = report_figures.forest_rows({"claims": [entry]})
    assert [r.name for r in rows] == ["a", "b"] and left_out == 0
    older = {"id": "y", "details": {}, "headline": [
        {"name": "judged", "theory": 0.25, "measured": 0.26, "se": 0.004, "tolerance": 0.02, "agrees": True,
         "side": "two-sided"},
        {"name": "bracket", "theory": [10.0, 14.0], "measured": 12.5, "tolerance": 0.5, "agrees": True,
         "side": "two-sided"},
        {"name": "shown only", "theory": None, "measured": 2.3, "se": 0.05, "tolerance": None, "agrees": None,
         "side": "reported"}]}
    rows, left_out = report_figures.forest_rows({"claims": [older, entry]}, order=["x", "y"])
    assert [r.name for r in rows] == ["a", "b", "judged"]  # in the order given; the reported row is no comparison
    assert left_out == 1  # the bracket has no stored error to normalise
    assert rows[2].value == pytest.approx(0.5) and rows[2].bar == pytest.approx(0.2)


# --------------------------------------------------------------------------- fake claims with comparisons


def fake_measured(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    """A claim whose comparisons are real compare() summaries (se, resolving power) and whose
    headline is its second row, named by details["headline_row"]."""
    comps = [compare("off-D residual", 3.2e-16, 0.0, 1.42e-14, "rounding", wrong=[("residual 1e-12", 1e-12)]),
             compare("held-out loss", 0.7664, 0.7793, 0.01885, "4 se", se=0.0045, wrong=[("x1.1", 0.857)]),
             compare("gain", 1.491, 1.485, 0.05, "4 se", se=0.012, units="absolute", wrong=[("H", 2.0)])]
    perts = [p for c in comps for p in c.perturbations]
    return ClaimResult(id="fake-measured", title="A claim with comparisons", statement="loss -> fixed point.",
                       verdict=judge(all(c.agrees for c in comps), perts), perturbations=perts,
                       details={"comparisons": [c.summary() for c in comps], "headline_row": "held-out loss"},
                       headline=[headline_row(c, se=c.se) for c in comps],
                       findings=[Finding("fake-measured", "holds", "The held-out loss 0.7664 ± 0.0045 agrees with "
                                         "0.7793.", {"loss": {"value": 0.7664, "se": 0.0045},
                                                     "fixed": {"value": 0.7793, "se": None}})])


def fake_saddle(profile="quick", device="cpu", seed=0, progress=None, sweep=None):
    """A boundary beyond the paper, contradicted by one of its three comparisons."""
    comps = [compare("growth rate vs 2a, tasks=(2, 2)", 0.15750922, 0.17480074, 0.00895008, "4 se + shift",
                     se=0.000803, config="tasks=(2, 2) H=2 L=64", wrong=[("rate 0", 0.0)]),
             compare("growth rate vs 2a, tasks=(1, 1)", 0.12100595, 0.12420244, 0.00868582, "4 se",
                     se=0.00135, config="tasks=(1, 1) H=2 L=32", wrong=[("rate 0", 0.0)]),
             compare("invariant flow stays", 0.0, 0.0, 1.7e-8, "rounding", side="not above",
                     wrong=[("SGD's 0.64", -0.64)])]
    perts = [p for c in comps for p in c.perturbations]
    findings = [Finding("fake-saddle", "beyond", "At tasks=(2, 2) the off-task value grows at 0.1575 ± 0.0008 "
                        "against 2a = 0.1748.", {"rate": {"value": 0.15750922, "se": 0.000803},
                                                 "pred": {"value": 0.17480074, "se": None}}),
                Finding("fake-saddle", "beyond", "At tasks=(1, 1) it grows at 0.121 ± 0.0014 against 0.1242.",
                        {"rate": {"value": 0.12100595, "se": 0.00135}, "pred": {"value": 0.12420244, "se": None}})]
    return ClaimResult(id="boundary-fake-saddle", kind="boundary", title="A saddle", statement="saddle.",
                       verdict=judge(all(c.agrees for c in comps), perts, kind="boundary"), perturbations=perts,
                       details={"comparisons": [c.summary() for c in comps]},
                       headline=[headline_row(c, se=c.se) for c in comps],
                       findings=[Finding("boundary-fake-saddle", f.kind, f.text, f.numbers) for f in findings])


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
    assert measured["headline"]["name"] == "held-out loss"  # details["headline_row"] names it
    assert measured["headline"]["number"] == "0.7664 ± 0.0045 vs 0.7793"
    assert (measured["agree"], measured["of"], measured["why"]) == (3, 3, None)
    # resolving power: relative ones as percentages (best - worst), the absolute one in its units
    # (a prediction of 0 is counted in absolute units; "gain" asked for absolute ones)
    rp = [c["resolving_power"] for c in report["claims"][0]["details"]["comparisons"]]
    assert [r["units"] for r in rp] == ["absolute", "relative", "absolute"]
    sharp = [min(v for v in (r["low"], r["high"]) if v is not None) for r in rp]
    assert measured["resolving"] == (f"{100 * sharp[1]:.2g} %; ±{min(sharp[0], sharp[2]):.2g} – "
                                     f"±{max(sharp[0], sharp[2]):.2g} abs.")
    saddle = card["boundary-fake-saddle"]
    assert saddle["failing"] and saddle["verdict"] == "contradicted" and (saddle["agree"], saddle["of"]) == (2, 3)
    assert saddle["headline"]["number"] == "0.15751 ± 0.0008 vs 0.1748"
    assert saddle["why"] == ("contradicted: 1 of 3 comparisons disagrees: growth rate vs 2a, tasks=(2, 2): measured "
                             "0.15751 ± 0.0008 against 0.1748; error 0.01729, 1.93 × its tolerance 0.00895.")


def test_headline_row_by_index_name_or_default():
    rows = [{"name": "first"}, {"name": "second"}]
    assert report_render.headline_row({"headline": rows})[0]["name"] == "first"
    assert report_render.headline_row({"headline": rows, "details": {"headline_row": 1}})[0]["name"] == "second"
    assert report_render.headline_row({"headline": rows, "details": {"headline_row": "second"}})[0]["name"] == "second"
    row, note = report_render.headline_row({"headline": rows, "details": {"headline_row": "third"}})
    assert row["name"] == "first" and "names none of its 2 rows" in note
    assert report_render.headline_row({"headline": []}) == (None, "")


def test_a_failing_id_comes_first_in_its_group_and_its_finding_says_so(glance_report):
    out, _ = glance_report
    report = strict_load(out / "claims.json")
    marked = report_render.marked_findings(report)
    assert [f["outcome"] for f in marked] == [None, "contradicted", None]  # only the disagreeing one
    page = (out / "index.html").read_text(encoding="utf-8")
    card = page[page.index("<section id='scorecard'>"):page.index("<section id='findings'>")]
    row = card[card.index("data-id='boundary-fake-saddle'"):]
    assert "data-outcome='contradicted'" in row[:80] and "contradicted: 1 of 3 comparisons disagrees" in row
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
