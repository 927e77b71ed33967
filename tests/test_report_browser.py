"""The report page in a real headless browser (the system Chromium, no Playwright).

A small report of fake claims (every figure kind, a headline table, a failing and an erroring
claim; see tests/test_report.py) is built in a second and opened in ``chromium --headless``:

- no console message and no uncaught error: Chromium's own log (``--enable-logging=stderr
  --v=0``) prints every console message as ``CONSOLE`` lines and uncaught exceptions as
  ``Uncaught ...``; the report has no script of its own, so any such line is a fault;
- every figure ``<img>`` decodes, and every claim id has a section: the published page has no
  script (check_report refuses one), so a *test-only copy* carries a small script that, on
  the load event, writes the number of images with ``naturalWidth > 0`` and the section ids
  into the DOM, read back from ``--dump-dom``;
- a screenshot of the page is saved (the directory in $REPORT_BROWSER_ARTIFACTS, else the
  test's tmp directory; the path is printed).

The first screen (issue 29) is checked in a 1400x900 window, on a report of 15 ids (7 claims, 5
boundaries that say where they stop, 3 beyond the paper, two of them failing) re-rendered with
``--from-json`` from a synthetic claims.json: the scorecard shows every id within it, every
failing or contradicted id marked there with the word of its outcome, the forest plot is
visible beside it, and no one-sided or reported headline row shows the two-sided tick.

The same checks are first shown to catch faults, on a page with a broken image, a console
error and an uncaught exception, an id below the first screen, a failing row without its
word, a forest plot below the first screen and a one-sided row with a two-sided tick.  Skipped, with the reason, when no Chromium is installed
(``apt-get install chromium``; .ci/run installs it).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from claims.core import FAILING
from reports.build import check_report, main

from report_fakes import FAKES, fake_config, install_registry, strict_load

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for path in map(shutil.which, BROWSERS) if path), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason=f"no headless browser found (looked for {', '.join(BROWSERS)} on PATH); "
                            "install Chromium from the OS packages: apt-get install chromium")
BROWSER_TIMEOUT_S = 120
CHECK_ID = "browser-check"
# Runs on the load event of the test-only copy: which images decoded, which sections exist.
CHECK_SCRIPT = """<script>
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var result = {images: images.length,
                decoded: images.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
                sections: Array.prototype.map.call(document.querySelectorAll("section[id]"),
                                                   function (s) { return s.id; })};
  var findings = document.getElementById("findings"), viewport = 900, failing = %s;
  result.findings = findings ? {top: findings.getBoundingClientRect().top,
    items: findings.querySelectorAll("li").length} : null;
  var card = document.getElementById("scorecard");
  result.scorecard = card ? {
    visible: Array.prototype.filter.call(card.querySelectorAll("tr[data-id]"), function (tr) {
      var box = tr.getBoundingClientRect();
      return box.top >= 0 && box.bottom <= viewport && box.height > 0; })
      .map(function (tr) { return tr.getAttribute("data-id"); }),
    unmarked: Array.prototype.filter.call(card.querySelectorAll("tr[data-id]"), function (tr) {
      var outcome = tr.getAttribute("data-outcome");
      return failing.indexOf(outcome) >= 0 && tr.textContent.indexOf(outcome) < 0; })
      .map(function (tr) { return tr.getAttribute("data-id"); })} : null;
  var forest = document.getElementById("forest-plot");
  if (forest) {
    var box = forest.getBoundingClientRect();
    result.forest = {top: box.top, height: box.height, width: box.width,
                     shown: Math.max(0, Math.min(box.bottom, viewport) - Math.max(box.top, 0))};
  } else { result.forest = null; }
  result.ticks = Array.prototype.filter.call(document.querySelectorAll("tr[data-side]"), function (tr) {
      var cell = tr.cells[tr.cells.length - 1];
      return tr.getAttribute("data-side") !== "two-sided" &&
             (cell.className === "agree" || cell.textContent.indexOf("yes") >= 0); })
    .map(function (tr) { return tr.getAttribute("data-side") + ": " + tr.cells[0].textContent; });
  result.rows = document.querySelectorAll("tr[data-side]").length;
  result.sides = Array.prototype.map.call(document.querySelectorAll("tr[data-side]"),
                                          function (tr) { return tr.getAttribute("data-side"); });
  var out = document.createElement("pre");
  out.id = "%s";
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>""" % (json.dumps(sorted({v for words in FAILING.values() for v in words})), CHECK_ID)
CONSOLE_LINE = re.compile(r"CONSOLE|Uncaught")


def chromium(page: Path, *mode: str, profile_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([BROWSER, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
                           "--v=0", "--virtual-time-budget=5000", f"--user-data-dir={profile_dir}",
                           *mode, page.absolute().as_uri()],
                          capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)


def browser_check(page: Path, work: Path) -> tuple[dict, list[str]]:
    """Open a test-only copy of ``page`` (with CHECK_SCRIPT) in a 1400x900 window and return
    what the script saw and the console lines of Chromium's log."""
    copy = work / f"{page.stem}.browser-check.html"
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", CHECK_SCRIPT + "</body>"),
                    encoding="utf-8")
    proc = chromium(copy, "--dump-dom", "--window-size=1400,900", profile_dir=work / "chromium-profile")
    assert proc.returncode == 0, f"chromium exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    found = re.search(rf'<pre id="{CHECK_ID}">(.*?)</pre>', proc.stdout, re.S)
    assert found, "the check script wrote nothing: the page did not load or its load event never came"
    console = [line for line in proc.stderr.splitlines() if CONSOLE_LINE.search(line)]
    return json.loads(found.group(1)), console


def test_the_checks_catch_a_broken_page(tmp_path):
    """A broken image, a console error and an uncaught exception are all seen."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><section id='claim-x'>"
                   "<img src='data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlE"
                   "QVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=='>"
                   "<img src='data:image/png;base64,AAAA'></section>"
                   "<script>console.error('deliberate'); null.x;</script></body></html>")
    seen, console = browser_check(bad, tmp_path)
    assert {k: seen[k] for k in ("images", "decoded", "sections")} == {"images": 2, "decoded": 1,
                                                                       "sections": ["claim-x"]}
    assert any("deliberate" in line for line in console)
    assert any("Uncaught" in line for line in console)
    assert seen["findings"] is None and seen["scorecard"] is None and seen["forest"] is None
    assert seen["ticks"] == []
    # an id below the first screen, a contradicted row without its word, the forest plot below the
    # first screen, a one-sided row with a two-sided tick
    late = tmp_path / "late.html"
    late.write_text("<!DOCTYPE html><html><body><section id='scorecard'><table>"
                    "<tr data-id='a' data-outcome='pass'><td>a</td><td>pass</td></tr>"
                    "<tr data-id='b' data-outcome='contradicted'><td>b</td><td>!</td></tr>"
                    "<tr><td><div style='height:2000px'></div></td></tr>"
                    "<tr data-id='c' data-outcome='located'><td>c</td><td>located</td></tr></table></section>"
                    "<svg id='forest-plot' width='100' height='100'></svg>"
                    "<table><tr data-side='not above'><td>loss</td><td class='agree'>yes ✓</td></tr>"
                    "<tr data-side='two-sided'><td>gain</td><td class='agree'>yes ✓</td></tr></table></body></html>")
    seen, _ = browser_check(late, tmp_path)
    assert seen["scorecard"] == {"visible": ["a", "b"], "unmarked": ["b"]}
    assert seen["forest"]["top"] >= 900 and seen["forest"]["shown"] == 0
    assert seen["ticks"] == ["not above: loss"]


def test_report_page_in_headless_chromium(tmp_path, monkeypatch):
    install_registry(monkeypatch, "fake_claims_browser", {**FAKES, "fake-config": fake_config})
    out = tmp_path / "report"
    ids = ["fake-pass", "fake-plain", "fake-fail", "fake-raise", "fake-undiscriminating", "fake-config"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--profile", "tiny", "--out", str(out), "--only", ",".join(ids), "--no-progress"]) == 1
    assert check_report(out) == []
    report = strict_load(out / "claims.json")
    n_figures = sum(len(c["figures"]) for c in report["claims"])
    assert n_figures == 6          # the fakes' figures of tests/test_report.py, the outcome mix among them

    seen, console = browser_check(out / "index.html", tmp_path)
    assert console == [], "console messages from the report page:\n" + "\n".join(console)
    assert seen["images"] == n_figures and seen["decoded"] == n_figures, seen
    assert sorted(seen["sections"]) == sorted(["scorecard", "findings", "run"] + [f"claim-{cid}" for cid in ids])

    artifacts = Path(os.environ.get("REPORT_BROWSER_ARTIFACTS") or tmp_path / "artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "report-screenshot.png"
    proc = chromium(out / "index.html", f"--screenshot={shot}", "--window-size=1280,4000",
                    "--hide-scrollbars", profile_dir=tmp_path / "chromium-profile")
    assert proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines() if CONSOLE_LINE.search(line)]
    print(f"\nreport screenshot: {shot} ({shot.stat().st_size} bytes)")


def synthetic_report(source: dict) -> dict:
    """A claims.json of 15 ids shaped like the quick report's (7 claims, 5 boundaries that say where
    they stop, 3 beyond the paper; one claim fails, one boundary beyond the paper is contradicted),
    made of the fake claims' entries under new ids."""
    entries = {c["id"]: c for c in source["claims"]}
    plan = ([("fake-fail" if k == 2 else "fake-config", f"claim-{k}") for k in range(7)]
            + [("fake-boundary", f"boundary-stop-{k}") for k in range(5)]
            + [("fake-beyond", f"boundary-beyond-{k}") for k in range(3)])
    claims_out = []
    for template, cid in plan:
        entry = json.loads(json.dumps(entries[template]))
        entry["id"] = cid
        for f in entry["findings"]:
            f["claim"] = cid
        if template == "fake-beyond" and cid != "boundary-beyond-0":  # one contradicted, two located
            entry["verdict"] = "located"
            for r in entry["headline"]:
                r.update(measured=r["theory"], agrees=True)
            for c in entry["details"]["comparisons"]:
                c.update(measured=c["predicted"], error=0.0, margin=0.0, agrees=True)
            entry["findings"] = [f for f in entry["findings"] if "saddle" not in f["text"]]
        claims_out.append(entry)
    return {"claims": claims_out, "findings": [f for c in claims_out for f in c["findings"]],
            "provenance": source["provenance"]}


def test_first_screen_scorecard_forest_and_one_sided_rows(tmp_path, monkeypatch):
    """Issue 29, on a synthetic claims.json of 15 ids re-rendered with --from-json (no claim
    computes): in the first 1400x900 viewport the scorecard shows every id, each failing or
    contradicted one with the word of its outcome, and the forest plot is visible beside it; the
    findings follow; no "reported" or one-sided row shows the two-sided tick."""
    install_registry(monkeypatch, "fake_claims_browser_findings", {**FAKES, "fake-config": fake_config})
    source, out = tmp_path / "source", tmp_path / "report"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["--profile", "tiny", "--out", str(source), "--only", "fake-fail,fake-config,fake-boundary,fake-beyond",
              "--no-progress"])
        synthetic = tmp_path / "synthetic.json"
        report = synthetic_report(strict_load(source / "claims.json"))
        report["provenance"]["profile"] = "quick"  # no tiny banner: the first screen a quick report has
        synthetic.write_text(json.dumps(report))
        assert main(["--from-json", str(synthetic), "--out", str(out)]) == 1  # a failure, a contradiction
    report = strict_load(out / "claims.json")
    ids = [c["id"] for c in report["claims"]]
    assert len(ids) == 15 and (out / "figures" / "forest.png").is_file()
    sides = {r["side"] for c in report["claims"] for r in c["headline"]}
    assert {"two-sided", "not above", "reported"} <= sides

    seen, console = browser_check(out / "index.html", tmp_path)
    assert console == [], "console messages from the report page:\n" + "\n".join(console)
    assert sorted(seen["scorecard"]["visible"]) == sorted(ids), seen["scorecard"]
    assert seen["scorecard"]["unmarked"] == [], seen["scorecard"]
    assert seen["forest"] is not None and 0 <= seen["forest"]["top"] < 900, seen["forest"]
    assert seen["forest"]["shown"] >= min(400, seen["forest"]["height"]) > 200, seen["forest"]  # whole, or 400 px of it
    assert seen["forest"]["width"] >= 300, seen["forest"]
    assert seen["findings"] is not None and seen["findings"]["items"] == len(report["findings"])
    assert seen["rows"] == sum(len(c["headline"]) for c in report["claims"]), seen
    assert seen["ticks"] == [], f"one-sided or reported rows with a two-sided tick: {seen['ticks']}"
    artifacts = Path(os.environ.get("REPORT_BROWSER_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "first-screen.png"
    proc = chromium(out / "index.html", f"--screenshot={shot}", "--window-size=1400,900", "--hide-scrollbars",
                    profile_dir=tmp_path / "chromium-profile")
    assert proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"\nfirst screen: {shot}")
