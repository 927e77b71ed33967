"""The report's front door (issue 13): auditing a configuration of the researcher's choosing,
reading the page at a glance, re-rendering and comparing reports, and bad input and faults.

Every claim here is a fake (claims.REGISTRY monkeypatched, as in tests/test_report.py), so
the tests check the report and run in seconds.  Each bad input is checked for its exit
status, its message, the absence of a traceback and the absence of anything written.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import claims
from claims.base import ClaimResult, Figure, PerturbationCheck, Series, judge
from reports import build as report_build
from reports import compare as report_compare
from reports import render as report_render
from reports.build import check_report, main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_report import FAKES, _snapshot, strict_load  # noqa: E402 - the fake claims of test_report

REPO_ROOT = Path(__file__).resolve().parent.parent

HEADLINE = [
    {"name": "limiting error ρ∞", "theory": 0.25, "measured": 0.26, "se": 0.004, "tolerance": 0.02,
     "agrees": True},
    {"name": "emergence time", "theory": [10.0, 14.0], "measured": 12.5, "se": None, "tolerance": 0.5,
     "agrees": True},
    {"name": "gain ratio", "theory": 3.0, "measured": 2.3, "se": 0.05, "tolerance": 0.1, "agrees": False},
]


def fake_config(profile="quick", device="cpu", seed=0, progress=None, sweep=None, problem=None):
    """A claim that runs at the given configuration and echoes it (as a real one says what it ran)."""
    perturbations = [PerturbationCheck("constant doubled", True)]
    return ClaimResult(
        id="fake-config", title="A claim that takes a configuration", statement="ρ∞ = d/L.",
        verdict=judge(True, perturbations), theory={"rho": 0.25}, numerics={"rho": 0.26},
        tolerance={"value": 0.02, "why": "3 se"}, perturbations=perturbations,
        details={"ran": {"problem": problem, "profile": profile}}, headline=HEADLINE,
        figures=[Figure(name="rho", title="ρ∞ against d/L", caption="the points lie on the line y = x",
                        series=[Series("measured", [0.1, 0.2], [0.1, 0.21], "points"),
                                Series("theory", [0.1, 0.2], [0.1, 0.2], "line")])])


def fake_config_b(profile="quick", device="cpu", seed=0, progress=None, sweep=None, problem=None):
    """fake-config as a later version would report it: one headline number moved, one verdict flipped."""
    result = fake_config(profile, device, seed, progress, sweep, problem)
    result.headline = [dict(HEADLINE[0], measured=0.31, agrees=False), *HEADLINE[1:]]
    result.verdict = "fail"
    return result


EXTRA = {"fake-config": fake_config, "fake-config-b": fake_config_b}


@pytest.fixture
def registry(monkeypatch):
    module = types.ModuleType("fake_claims_frontdoor")
    functions = {**FAKES, **EXTRA}
    for fn in functions.values():
        setattr(module, fn.__name__, fn)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    registry = {cid: f"{module.__name__}:{fn.__name__}" for cid, fn in functions.items()}
    monkeypatch.setattr(claims, "REGISTRY", registry)
    return registry


def args(out: Path, only: str, *extra: str) -> list[str]:
    return ["--profile", "tiny", "--out", str(out), "--only", only, "--no-progress", *extra]


CONFIG = ["--tasks", "3,3", "--heads", "2", "--L", "32"]


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own errors
            status = exc.code
    return status, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- per-configuration audit


def test_configuration_reaches_claims_that_take_it_and_is_recorded(registry, tmp_path):
    out = tmp_path / "r"
    status, _, err = run_main(args(out, "fake-config,fake-plain", *CONFIG, "--sigma", "0.5", "--param",
                                   "merged", "--init", "0.1", "--logit-scale", "2", "--basis", "random",
                                   "--dtype", "float32"))
    assert status == 0, err
    report = strict_load(out / "claims.json")
    problem = {"tasks": [3, 3], "heads": 2, "L": 32, "sigma": 0.5, "param": "merged", "init_scale": 0.1,
               "logit_scale": 2.0, "basis": "random", "dtype": "float32"}
    entries = {c["id"]: c for c in report["claims"]}
    assert entries["fake-config"]["details"]["ran"]["problem"] == problem
    assert entries["fake-plain"]["details"] == {"profile": "tiny", "device": "cpu", "seed": 0, "sweep": None}
    prov = report["provenance"]
    assert prov["problem"] == problem
    assert prov["ran_at"] == {"configuration": ["fake-config"], "profile": ["fake-plain"]}
    assert prov["cost_estimate"]["runs"] == 1 and prov["cost_estimate"]["elements"] > 0
    assert "estimated 1 training run(s)" in err and "fake-plain cannot run at a given configuration" in err
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "r = (3, 3), H = 2, L = 32, σ = 0.5" in page
    assert "ran at the audited configuration" in page and "ran at profile tiny" in page
    assert check_report(out) == []


def test_configuration_from_a_toml_file_with_flags_overriding(registry, tmp_path):
    toml = tmp_path / "my.toml"
    toml.write_text('tasks = [4, 2]\nheads = 3\nL = 64\nsigma = 0.25\nbasis = "random"\n')
    out = tmp_path / "r"
    status, _, err = run_main(args(out, "fake-config", "--config", str(toml), "--L", "128"))
    assert status == 0, err
    problem = strict_load(out / "claims.json")["provenance"]["problem"]
    assert problem == {"tasks": [4, 2], "heads": 3, "L": 128, "sigma": 0.25, "basis": "random"}
    nested = tmp_path / "nested.toml"
    nested.write_text('[problem]\ntasks = [2]\nheads = 1\nL = 8\n')
    assert run_main(args(tmp_path / "r2", "fake-config", "--config", str(nested)))[0] == 0


def test_cost_estimate_refuses_and_says_how_to_raise_the_limit(registry, tmp_path):
    status, _, err = run_main(args(tmp_path / "r", "fake-config", *CONFIG, "--max-minutes", "0.0001"))
    assert status == 2 and "Traceback" not in err
    assert "over --max-minutes 0.0001" in err and "Raise the limit (--max-minutes 1)" in err
    assert "training run(s) x 1200 steps x batch 2048 x L 32" in err
    assert not (tmp_path / "r").exists()
    # the same configuration under the default limit runs
    assert run_main(args(tmp_path / "r", "fake-config", *CONFIG))[0] == 0


def test_estimate_scales_with_steps_batch_and_L():
    small = report_build.estimate_cost({"tasks": [3, 3], "heads": 2, "L": 32}, 1)
    double_l = report_build.estimate_cost({"tasks": [3, 3], "heads": 2, "L": 64}, 1)
    two_claims = report_build.estimate_cost({"tasks": [3, 3], "heads": 2, "L": 32}, 2)
    assert small.elements == 1200 * 2048 * 32
    assert double_l.elements == 2 * small.elements and two_claims.seconds == pytest.approx(2 * small.seconds)
    assert report_build.estimate_cost({"tasks": [3, 3], "heads": 2, "L": 32}, 0).seconds == 0


# --------------------------------------------------------------------------- bad input (exit 2)

NOT_A_REPORT = '{"claims": 3}'


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "2,,2", "--heads", "2", "--L", "8"], "an empty block size"),
    (["--tasks", "2,", "--heads", "2", "--L", "8"], "an empty block size"),
    (["--tasks", "2,x", "--heads", "2", "--L", "8"], "'x' is not an integer"),
    (["--tasks", "0,2", "--heads", "2", "--L", "8"], "every block size r_i must be >= 1"),
    (["--tasks", "3,3", "--heads", "0", "--L", "8"], "heads must be a positive integer, got 0"),
    (["--tasks", "3,3", "--heads", "2", "--L", "0"], "L must be a positive integer, got 0"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--sigma", "-1"], "sigma (label noise std) must be finite"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--sigma", "nan"], "sigma (label noise std) must be finite"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--init", "0"], "init_scale must be a finite number > 0"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--logit-scale", "-1"], "logit_scale s must be a finite"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--logit-scale", "inf"], "logit_scale s must be a finite"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--only", "fake-plain"],
     "none of the selected claims (fake-plain) can run at a given configuration yet"),
    (["--tasks", "3,3"], "needs --heads, --L as well"),
    (["--heads", "3", "--L", "8"], "needs --tasks as well"),
    (["--sigma", "0.5"], "needs --tasks, --heads, --L as well"),
    (["--tasks", "100000", "--heads", "3", "--L", "256"], "over --max-minutes 60"),
    (["--tasks", "3,3", "--heads", "1000", "--L", "100000"], "over --max-minutes 60"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--max-minutes", "0"], "--max-minutes must be a number > 0"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--max-minutes", "nan"], "--max-minutes must be a number > 0"),
    (["--config", "{tmp}/missing.toml"], "no such file"),
    (["--config", "{tmp}"], "not a file"),
    (["--config", "{file:bad.toml=tasks = [3, 3}"], "not valid TOML"),
    (["--config", "{file:unknown.toml=head = 3}"], "unknown field(s) ['head']"),
    (["--config", "{file:str.toml=tasks = [3]\nheads = \"3\"\nL = 8}"], "heads must be a positive integer, got '3'"),
    (["--config", "{file:nan.toml=tasks = [3]\nheads = 3\nL = 8\nsigma = nan}"], "sigma (label noise std)"),
    (["--config", "{file:huge.toml=tasks = [3]\nheads = 1000000000\nL = 8}"], "over --max-minutes 60"),
    (["--config", "{file:bin.toml=\x00\x01\x02}"], "not valid TOML"),
    (["--out", "{file:afile=x}"], "exists and is not a directory"),
    (["--out", "{file:afile=x}/sub/r"], "is a file where a directory is expected"),
    (["--out", "/proc/self/cannot/r"], "cannot write in"),
    (["--from-json", "{tmp}/none/claims.json"], "no such file"),
    (["--from-json", "{file:bad.json={nope}"], "not strict JSON"),
    (["--from-json", "{file:nan.json={\"claims\": [], \"provenance\": {\"x\": NaN}}}"], "not strict JSON"),
    (["--from-json", "{file:notreport.json=" + NOT_A_REPORT + "}"], "not a claims.json of a report"),
    (["--from-json", "{file:notreport.json=" + NOT_A_REPORT + "}", "--profile", "quick"], "--profile cannot go"),
    (["--from-json", "{file:notreport.json=" + NOT_A_REPORT + "}", "--tasks", "3"], "--tasks cannot go"),
    (["--from-json", "{file:notreport.json=" + NOT_A_REPORT + "}", "--max-minutes", "5"], "--max-minutes cannot go"),
])
def test_bad_input_exits_2_with_a_message(registry, tmp_path, argv, message):
    def expand(a: str) -> str:
        if a.startswith("{file:"):
            name, _, rest = a[len("{file:"):].partition("=")
            text, _, suffix = rest.rpartition("}")
            (tmp_path / name).write_text(text)
            return str(tmp_path / name) + suffix
        return a.replace("{tmp}", str(tmp_path))

    argv = [expand(a) for a in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    if "--out" not in argv:
        argv = ["--out", str(tmp_path / "r"), *argv]
    status, stdout, err = run_main(["--only", "fake-config", "--no-progress", *argv]
                                   if "--from-json" not in argv else argv)
    assert status == 2, err
    assert message in err and "Traceback" not in err and stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "3,3", "--heads", "1e9", "--L", "8"], "invalid int value: '1e9'"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--param", "tied"], "invalid choice: 'tied'"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--basis", "haar"], "invalid choice: 'haar'"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--dtype", "float16"], "invalid choice: 'float16'"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--sigma", "big"], "invalid float value: 'big'"),
])
def test_bad_values_through_the_real_command_line(tmp_path, argv, message):
    proc = subprocess.run([sys.executable, "-m", "reports.build", "--out", str(tmp_path / "r"), *argv],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_bad_configuration_in_a_subprocess_has_numerics_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "reports.build", "--out", str(tmp_path / "r"), "--tasks",
                           "3,3", "--heads", "2", "--L", "-5"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "L must be a positive integer, got -5" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- faults


def _kill_between_renames(out: Path) -> Path:
    """The state a SIGKILL between the two renames of the swap leaves: no report, the previous
    one stranded as .r.old-*."""
    stranded = out.parent / f".{out.name}.old-0123456789ab"
    os.rename(out, stranded)
    return stranded


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stranded_report_is_restored_and_survives_an_interrupted_rebuild(registry, tmp_path):
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    before = _snapshot(out)
    _kill_between_renames(out)
    killed_write = tmp_path / f".r.tmp-{_dead_pid()}-deadbeef"
    (killed_write / "figures").mkdir(parents=True)
    (killed_write / "claims.json").write_text('{"claims": [')  # half-written
    status, _, err = run_main(args(out, "fake-fail,fake-interrupt"))
    assert status == 130
    assert "recovered:" in err and "restored the previous report" in err
    assert "cleaned: removed .r.tmp-" in err
    assert _snapshot(out) == before  # the last good report is back, and the interrupted build kept it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


KILLED_WRITE_SCRIPT = """
import sys, time, types
import claims
from claims.base import ClaimResult
from reports import render
module = types.ModuleType("killed_write_claims")
module.quick = lambda profile, device, seed, progress, sweep: ClaimResult(
    id="quick", title="t", statement="s", verdict="pass")
sys.modules[module.__name__] = module
claims.REGISTRY = {"quick": "killed_write_claims:quick"}
def slow_render(report, pngs):
    print("writing", file=sys.stderr, flush=True)
    time.sleep(120)
render.render_html = slow_render
from reports.build import main
sys.exit(main(sys.argv[1:]))
"""


def test_real_sigkill_during_the_write_is_cleaned_by_the_next_build(registry, tmp_path):
    """A real SIGKILL while the report is being written (it cannot be caught): the previous
    report is intact, a .r.tmp-<pid>-* is left, and the next build removes it and says so."""
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    before = _snapshot(out)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITE_SCRIPT, "--profile", "tiny", "--out", str(out),
                             "--no-progress"], cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if line.startswith("writing"):
                break
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert _snapshot(out) == before
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "r"]
    assert len(leftovers) == 1 and leftovers[0].startswith(f".r.tmp-{proc.pid}-")
    status, _, err = run_main(args(out, "fake-fail"))
    assert status == 1 and f"cleaned: removed {leftovers[0]}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_leftover_old_report_beside_a_report_is_removed(registry, tmp_path):
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    shutil.copytree(out, tmp_path / ".r.old-feedfacecafe")  # killed after the swap, before the delete
    status, _, err = run_main(args(out, "fake-fail"))
    assert status == 1 and "cleaned: removed .r.old-feedfacecafe" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_recovery_touches_only_its_own_leftovers(registry, tmp_path):
    out = tmp_path / "r"
    foreign = tmp_path / ".r.old-notareport"  # no report marker: not ours
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = tmp_path / f".r.tmp-{live.pid}-running"  # a build still writing
        busy.mkdir()
        status, _, err = run_main(args(out, "fake-plain"))
    finally:
        live.kill()
        live.wait()
    assert status == 0 and "recovered" not in err and "cleaned" not in err
    assert (foreign / "notes.txt").read_text() == "keep" and busy.is_dir()


def test_rerender_recovers_a_stranded_report_too(registry, tmp_path):
    src = tmp_path / "src"
    assert run_main(args(src, "fake-config"))[0] == 0
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    _kill_between_renames(out)
    status, _, err = run_main(["--from-json", str(src / "claims.json"), "--out", str(out)])
    assert status == 0 and "restored the previous report" in err
    assert [c["id"] for c in strict_load(out / "claims.json")["claims"]] == ["fake-config"]


def _sweep(tmp_path: Path) -> Path:
    sweep = tmp_path / "sweep"
    (sweep / "points").mkdir(parents=True)
    (sweep / "points" / "aaaa.json").write_text(json.dumps({"id": "aaaa", "point": {"problem": {}}}))
    (sweep / "points" / "bbbb.json").write_text('{"id": "bbbb", "point": ')  # truncated by a kill
    (sweep / "points" / "cccc.json").write_text(json.dumps({"id": "other", "point": {}}))
    (sweep / "points" / ".dddd.json.tmp").write_text("in progress")  # a temporary: not a point
    return sweep


def test_unreadable_sweep_points_are_warned_recorded_and_shown(registry, tmp_path):
    sweep = _sweep(tmp_path)
    out = tmp_path / "r"
    status, _, err = run_main(args(out, "fake-plain", "--from-sweep", str(sweep)))
    assert status == 0
    assert "warning: --from-sweep: skipping" in err and "bbbb.json: not valid JSON" in err
    assert "cccc.json" in err and "aaaa.json" not in err
    skipped = strict_load(out / "claims.json")["provenance"]["sweep_skipped"]
    assert [Path(p["file"]).name for p in skipped] == ["bbbb.json", "cccc.json"]
    assert "not a point record" in skipped[1]["reason"]
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "2 point file(s) of the sweep" in page and "bbbb.json" in page


# --------------------------------------------------------------------------- reading at a glance


def _section(page: str, claim_id: str) -> str:
    start = page.index(f"id='claim-{claim_id}'")
    end = page.find("<section", start)
    return page[start:end if end > 0 else len(page)]


def test_headline_table_leads_each_section(registry, tmp_path):
    out = tmp_path / "r"
    assert run_main(args(out, "fake-config,fake-plain"))[0] == 0
    page = (out / "index.html").read_text(encoding="utf-8")
    section = _section(page, "fake-config")
    table = section.index("<table class='headline'>")
    assert table < section.index("Perturbation checks") < section.index("<details>")
    for text in ("theory predicts", "measured (± s.e.)", "allowed difference", "limiting error ρ∞",
                 "0.26 ± 0.004", "|Δ| ≤ 0.02", "between 10 and 14", "yes ✓", "no ✗"):
        assert text in section, text
    assert "the points lie on the line y = x" in section  # the figure's caption under it
    summary = page[page.index("<h2>Summary"):page.index("<section")]
    assert "2 of 3 agree" in summary  # the headline at a glance in the summary table
    plain = _section(page, "fake-plain")  # no headline rows: a short summary instead
    assert "gives no headline rows yet" in plain and plain.index("gives no headline") < plain.index("<details>")
    assert "Allowed difference: <b>0.05</b> — MC error" in plain


def test_many_perturbation_checks_fold_under_a_count():
    entry = {"perturbations": [{"description": f"wrong constant {k}", "rejected": k != 3, "details": {}}
                               for k in range(6)]}
    folded = report_render._perturbation_table(entry)
    assert folded.startswith("<details>") and "5 of 6 perturbed predictions rejected" in folded
    assert "class='accepted'" in folded  # one accepted: the count is shown in red
    entry["perturbations"] = entry["perturbations"][:2]
    assert report_render._perturbation_table(entry).startswith("<table>")


def test_tiny_banner_and_profile_in_the_summary(registry, tmp_path):
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    report = strict_load(out / "claims.json")
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "smoke tests of the pipeline, not evidence" in page
    assert page.index("class='banner'") < page.index("<h2>Summary")
    report["provenance"]["profile"] = "quick"
    quick_page = report_render.render_html(report, {})
    assert "class='banner'" not in quick_page and "Profile <b>quick</b>" in quick_page
    assert "profile <b>quick</b>" in quick_page  # every claim ran at the profile's configurations


# --------------------------------------------------------------------------- re-render and compare


def test_rerender_from_json_runs_nothing_and_redraws_figures(registry, tmp_path, monkeypatch):
    src = tmp_path / "a"
    assert run_main(args(src, "fake-pass,fake-config,fake-fail"))[0] == 1
    monkeypatch.setattr(claims, "REGISTRY", {})  # any claim run would now fail
    new = tmp_path / "b"
    status, stdout, err = run_main(["--from-json", str(src / "claims.json"), "--out", str(new)])
    assert status == 1 and "no claim is run" in err and "1 fail" in stdout
    assert check_report(new) == []
    old, redone = strict_load(src / "claims.json"), strict_load(new / "claims.json")
    assert old["claims"] == redone["claims"]  # same entries, same figure files
    assert redone["provenance"]["rerendered"]["from"] == str((src / "claims.json").absolute())
    assert {k: v for k, v in redone["provenance"].items() if k != "rerendered"} == old["provenance"]
    for entry in redone["claims"]:
        for fig in entry["figures"]:
            assert (new / fig["file"]).read_bytes() == (src / fig["file"]).read_bytes()
    assert "Re-rendered from" in (new / "index.html").read_text(encoding="utf-8")


def test_rerender_accepts_an_older_claims_json(registry, tmp_path):
    """A claims.json from before headline rows and captions existed still renders."""
    src = tmp_path / "a"
    assert run_main(args(src, "fake-pass"))[0] == 0
    report = strict_load(src / "claims.json")
    for entry in report["claims"]:
        entry.pop("headline")
        for fig in entry["figure_data"]:
            fig.pop("caption")
    (src / "claims.json").write_text(json.dumps(report))
    assert run_main(["--from-json", str(src), "--out", str(tmp_path / "b")])[0] == 0
    assert check_report(tmp_path / "b") == []


def test_rerender_refuses_its_own_directory(registry, tmp_path):
    src = tmp_path / "a"
    assert run_main(args(src, "fake-plain"))[0] == 0
    before = _snapshot(src)
    status, _, err = run_main(["--from-json", str(src / "claims.json"), "--out", str(src)])
    assert status == 2 and "is the directory of --from-json" in err and _snapshot(src) == before
    status, _, err = run_main(["--from-json", str(src), "--out", str(src)])  # the directory given
    assert status == 2 and "is the directory of --from-json" in err and _snapshot(src) == before


def test_compare_marks_changed_verdicts_and_numbers(registry, tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_main(args(a, "fake-config,fake-plain"))[0] == 0
    # B: the same claim ids, fake-config as the "new version" reports it
    registry["fake-config"] = registry["fake-config-b"]
    assert run_main(args(b, "fake-config,fake-plain,fake-fail"))[0] == 1
    status = report_compare.main([str(a / "claims.json"), str(b / "claims.json"), "--out", str(tmp_path / "d.html")])
    stdout = capsys.readouterr().out
    assert status == 1
    assert "fake-config  pass     fail     verdict changed" in stdout
    assert "limiting error ρ∞: A theory 0.25, measured 0.26 ± 0.004, tol 0.02, agrees" in stdout
    assert "measured 0.31 ± 0.004, tol 0.02, disagrees" in stdout
    assert "fake-fail" in stdout and "absent" in stdout
    assert "emergence time" not in stdout  # unchanged rows are not listed in the text summary
    assert "2 of 3 claim(s) changed" in stdout
    page = (tmp_path / "d.html").read_text(encoding="utf-8")
    assert page.count("class='changed'") == 3  # fake-config, its moved row, fake-fail
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "d.html"]  # no temporary left
    assert report_compare.main([str(a), str(a / "claims.json")]) == 0
    assert "no change in 2 claim(s)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["{tmp}/none.json", "{a}"], "A {tmp}/none.json: no such file"),
    (["{a}", "{file:bad.json=[1, 2}"], "not strict JSON"),
    (["{a}", "{file:list.json=[1, 2]}"], "not a claims.json of a report"),
    (["{a}", "{a}", "--out", "{tmp}"], "is a directory"),
    (["{a}", "{a}", "--out", "{tmp}/missing/d.html"], "is not an existing directory"),
    (["{a}", "{a}", "--out", "/proc/self/d.html"], "cannot write in"),
])
def test_compare_bad_input_exits_2(registry, tmp_path, capsys, argv, message):
    a = tmp_path / "a"
    assert run_main(args(a, "fake-plain"))[0] == 0

    def expand(x: str) -> str:
        if x.startswith("{file:"):
            name, _, text = x[len("{file:"):-1].partition("=")
            (tmp_path / name).write_text(text)
            return str(tmp_path / name)
        return x.replace("{tmp}", str(tmp_path)).replace("{a}", str(a / "claims.json"))

    argv = [expand(x) for x in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert report_compare.main(argv) == 2
    captured = capsys.readouterr()
    assert message.replace("{tmp}", str(tmp_path)) in captured.err and "Traceback" not in captured.err
    assert captured.out == "" and sorted(p.name for p in tmp_path.iterdir()) == before


def test_compare_from_the_real_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "reports.compare", str(tmp_path / "x.json"), str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no such file" in proc.stderr and "Traceback" not in proc.stderr
