"""The report's front door (issue 13): auditing a configuration of the researcher's choosing,
reading the page at a glance, re-rendering and comparing reports, and bad input and faults.

Every claim here is a fake (claims.REGISTRY monkeypatched, as in tests/test_report.py), so
the tests check the report and run in seconds.  Each bad input is checked for its exit
status, its message, the absence of a traceback and the absence of anything written.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import claims
from claims.core import Figure, Outcome, Series, context
from reports import build as report_build
from reports import compare as report_compare
from reports import render as report_render
from reports.build import check_report, main
from reports.render import document_problems

from numerics.engine import cost_of
from report_fakes import (FAKES, HEADLINE, configured, fake_config, fake_spec, install_registry, snapshot,
                          strict_load, training_need)

REPO_ROOT = Path(__file__).resolve().parent.parent

def fake_config_b_outcome(ctx, results):
    """fake-config as a later version would report it: one headline number moved, one verdict flipped."""
    return configured(ctx, results, [dict(HEADLINE[0], measured=0.31, agrees=False), *HEADLINE[1:]])


fake_config_b = dataclasses.replace(fake_config, id="fake-config-b", compare=fake_config_b_outcome)


def _spec(claim_id: str, measured: float, undecided=None, kind: str = "claim"):
    """A claim whose comparisons are made by claims.core.compare (so details["comparisons"]
    holds each one's error, tolerance, agreement and perturbations, and the verdict is
    claims.core.judge's)."""
    from claims.core import compare, headline_row, off_by, reported_row

    def outcome(ctx, results):
        loss = compare("converged loss, tasks=[2, 2], L=32", measured, 0.7792937908845126, 0.018848,
                       "4 se", wrong=off_by(1.5, 0.7792937908845126), se=0.0047)
        bracket = compare("emergence time in its bracket", 12.5, [10.0, 14.0], 0.5, "the step",
                          error=lambda m, b: max(0.0, b[0] - m, m - b[1]), wrong=[("bracket 20-30", [20.0, 30.0])])
        rows = [headline_row(loss), headline_row(bracket, theory=[10.0, 14.0], measured=12.5),
                reported_row("gain ratio", 2.3, se=0.05)]
        return Outcome(comparisons=[loss, bracket], headline=rows, undecided=undecided)

    return fake_spec(claim_id, outcome, "A claim run as a spec", "the loss converges to the fixed point's.",
                     kind=kind)


EXTRA = {"fake-config": fake_config, "fake-config-b": fake_config_b,
         "fake-spec-pass": _spec("fake-spec-pass", 0.781), "fake-spec-fail": _spec("fake-spec-fail", 5.0),
         "fake-spec-undecided": _spec("fake-spec-undecided", 0.781, undecided="the run did not converge"),
         "boundary-spec": _spec("boundary-spec", 5.0, kind="boundary")}


@pytest.fixture
def registry(monkeypatch):
    return install_registry(monkeypatch, "fake_claims_frontdoor", {**FAKES, **EXTRA})


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
    status, _, err = run_main(args(out, "fake-config", *CONFIG, "--sigma", "0.5", "--param",
                                   "merged", "--init", "0.1", "--logit-scale", "2", "--basis", "random",
                                   "--dtype", "float32"))
    assert status == 0, err
    report = strict_load(out / "claims.json")
    problem = {"tasks": [3, 3], "heads": 2, "L": 32, "sigma": 0.5, "param": "merged", "init_scale": 0.1,
               "logit_scale": 2.0, "basis": "random", "dtype": "float32"}
    entries = {c["id"]: c for c in report["claims"]}
    assert entries["fake-config"]["details"]["ran"]["problem"] == problem
    prov = report["provenance"]
    assert prov["problem"] == problem
    assert prov["ran_at"] == {"configuration": ["fake-config"], "profile": []}
    assert prov["cost_estimate"]["per_claim"]["fake-config"] == prov["cost_estimate"]["seconds"] > 0
    assert "estimated about" in err
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "r = (3, 3), H = 2, L = 32, σ = 0.5" in page
    assert "ran at the audited configuration" in page
    # a claim that runs at its profiles only is named before any run, never run at a profile instead
    status, _, err = run_main(args(tmp_path / "r2", "fake-config,fake-plain", *CONFIG))
    assert status == 2 and "fake-plain cannot run: it runs at its profiles' configurations only" in err
    assert "These can: --only fake-config" in err and not (tmp_path / "r2").exists()
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
    # its plan's needs priced by numerics.engine's model (the sum itself: test_the_estimate_is_the_claims_plans)
    assert re.search(r"estimated cost: about \d+ s \(fake-config \d+ s\)", err), err
    assert not (tmp_path / "r").exists()
    # the same configuration under the default limit runs
    assert run_main(args(tmp_path / "r", "fake-config", *CONFIG))[0] == 0


def test_the_estimate_is_the_claims_plans(registry, monkeypatch):
    """The cost is the engine's cost model over the claims' plans, their conditional needs included
    (a need two claims share counts half to each); a claim whose plan cannot be asked (it does not
    import) is named, not guessed."""
    from reports.build import BuildConfig

    cfg = BuildConfig(profile="tiny", only=("fake-config", "fake-plain"), problem={"tasks": [3, 3], "heads": 2, "L": 64})
    ctx = context(fake_config, "tiny", problem=cfg.problem)
    theory, training = (cost_of(n) for n in fake_config.plan(ctx, None))
    cost = report_build.estimate(BuildConfig(profile="tiny", only=("fake-config",), problem=cfg.problem))
    assert cost["seconds"] == pytest.approx(theory + cost_of(training_need(ctx))) and cost["unknown"] == []
    cost = report_build.estimate(dataclasses.replace(cfg, problem=None))
    assert cost["per_claim"]["fake-plain"] == pytest.approx(theory / 2)   # the theory need both ask for
    monkeypatch.setitem(claims.REGISTRY, "fake-plain", "no_such_module:SPEC")
    assert report_build.estimate(cfg)["unknown"] == ["fake-plain"]


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
     "fake-plain cannot run: it runs at its profiles' configurations only. No selected claim can"),
    (["--tasks", "100000", "--heads", "3", "--L", "256"], "GiB of memory; choose smaller sizes"),
    (["--tasks", "3,3", "--heads", "1000", "--L", "100000"], "over --max-minutes 60"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--max-minutes", "0"], "--max-minutes must be a number > 0"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--max-minutes", "nan"], "--max-minutes must be a number > 0"),
    (["--config", "{tmp}/missing.toml"], "no such file"),
    (["--config", "{tmp}"], "not a file"),
    (["--config", "{file:bad.toml=tasks = [3, 3}"], "not valid TOML"),
    (["--config", "{file:unknown.toml=head = 3}"], "unknown field(s) ['head']"),
    (["--config", "{file:str.toml=tasks = [3]\nheads = \"3\"\nL = 8}"], "heads must be a positive integer, got '3'"),
    (["--config", "{file:nan.toml=tasks = [3]\nheads = 3\nL = 8\nsigma = nan}"], "sigma (label noise std)"),
    (["--config", "{file:huge.toml=tasks = [3]\nheads = 1000000000\nL = 8}"], "GiB of memory; choose smaller sizes"),
    (["--config", "{file:big2.toml=tasks = [3]\nheads = 100000\nL = 8}"], "over --max-minutes 60"),
    (["--config", "{file:bin.toml=\x00\x01\x02}"], "not valid TOML"),
    # issue 33: values of the wrong kind, never read as something else
    (["--config", "{file:f35.toml=tasks = [3.5]\nheads = 1\nL = 8}"], "tasks must be a list of positive integers"),
    (["--config", "{file:fs3.toml=tasks = [3, \"3\"]\nheads = 2\nL = 8}"], "tasks must be a list of positive integers"),
    (["--config", "{file:fb.toml=tasks = [true]\nheads = 1\nL = 8}"], "tasks must be a list of positive integers"),
    (["--config", "{file:fd.toml=tasks = [2]\nheads = 1\nL = 8\nsigma = 1979-05-27}"], "sigma (label noise std)"),
    (["--config", "{file:h63.toml=tasks = [2]\nheads = 9223372036854775807\nL = 8}"],
     "GiB of memory; choose smaller sizes"),
    (["--tasks", "3", "--heads", "1", "--L", "1"], "L = 1: with one context token softmax has no choice"),
    (["--config", "{file:l1.toml=tasks = [3]\nheads = 1\nL = 1}"], "L = 1: with one context token"),
    (["--seed", "3_3"], "got '3_3'"),
    (["--seed", "18446744073709551616"], "--seed must be at most 18446744073709551615"),
    (["--config", "{file:big.toml=" + "#" * (2**20 + 1) + "}"], "more than the limit of 1 MiB"),
    (["--config", "{file:deep.toml=x = " + "[" * 5000 + "]" * 5000 + "}"], "--config"),
    (["--out", "{file:afile=x}"], "exists and is not a directory"),
    (["--out", "{file:afile=x}/sub/r"], "is a file, not a directory"),
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
    (["--tasks", "3,3", "--heads", "1e9", "--L", "8"], "--heads must be an integer written in digits"),
    (["--tasks", "3,3", "--heads", "3_3", "--L", "8"], "got '3_3'"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--param", "tied"], "invalid choice: 'tied'"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--basis", "haar"], "invalid choice: 'haar'"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--dtype", "float16"], "invalid choice: 'float16'"),
    (["--tasks", "3,3", "--heads", "2", "--L", "8", "--sigma", "big"], "--sigma must be a number"),
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
    one stranded as .r.old-<token>, its marker holding the same token (what replace_with writes
    before it renames)."""
    token = "0123456789ab"
    (out / report_build.REPORT_MARKER).write_text(report_build.marker_text(token))
    stranded = out.parent / f".{out.name}.old-{token}"
    os.rename(out, stranded)
    return stranded


def _killed_write(parent: Path, name: str, pid: int, token: str = "deadbeef") -> Path:
    """What a build killed while writing leaves: .NAME.tmp-<pid>-<token>, its marker written first."""
    tmp = parent / f".{name}.tmp-{pid}-{token}"
    (tmp / "figures").mkdir(parents=True)
    (tmp / report_build.REPORT_MARKER).write_text(report_build.marker_text(token, pid))
    return tmp


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stranded_report_is_restored_and_survives_an_interrupted_rebuild(registry, tmp_path):
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    before = snapshot(_kill_between_renames(out))    # the report as the swap left it (its marker's token)
    killed_write = _killed_write(tmp_path, "r", _dead_pid())
    (killed_write / "claims.json").write_text('{"claims": [')  # half-written
    status, _, err = run_main(args(out, "fake-fail,fake-interrupt"))
    assert status == 130
    assert "recovered:" in err and "restored the previous report" in err
    assert "cleaned: removed .r.tmp-" in err
    assert snapshot(out) == before  # the last good report is back, and the interrupted build kept it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


KILLED_WRITE_SCRIPT = """
import sys, time, types
import claims
from claims.core import Comparison
from claims.core import ClaimSpec, Outcome
from reports import render
module = types.ModuleType("killed_write_claims")
module.quick = ClaimSpec("quick", "t", "s", {"tiny": None}, plan=lambda ctx, results: [],
                         compare=lambda ctx, results: Outcome([Comparison("c", {}, {}, 0.0, 1.0, "w")]))
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
    before = snapshot(out)
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
    assert snapshot(out) == before
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "r"]
    assert len(leftovers) == 1 and leftovers[0].startswith(f".r.tmp-{proc.pid}-")
    status, _, err = run_main(args(out, "fake-fail"))
    assert status == 1 and f"cleaned: removed {leftovers[0]}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_leftover_old_report_beside_a_report_is_removed(registry, tmp_path):
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    shutil.copytree(out, tmp_path / ".r.old-feedfacecafe")  # killed after the swap, before the delete
    (tmp_path / ".r.old-feedfacecafe" / report_build.REPORT_MARKER).write_text(report_build.marker_text("feedfacecafe"))
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


LOOKALIKES = [
    # (what, make(tmp) -> the directory beside --out that must survive the next build)
    ("a .r.tmp-<dead pid>-x of the user's, no marker", lambda t: _user_dir(t / f".r.tmp-{_dead_pid()}-mine")),
    ("a .r.tmp- whose marker holds another token", lambda t: _with_marker(_user_dir(t / f".r.tmp-{_dead_pid()}-abcdef12"),
                                                                         "0f0f0f0f")),
    ("a .r.tmp- whose marker is a symbolic link to a real one", lambda t: _linked_marker(t, f".r.tmp-{_dead_pid()}-cafe1234",
                                                                                        "cafe1234")),
    ("a copy of a report named .r.old-<not its token>", lambda t: _with_marker(_user_dir(t / ".r.old-feedface0000"),
                                                                               "123456789abc")),
    ("an .r.old-<its token> holding a user's file", lambda t: _with_marker(_user_dir(t / ".r.old-0badc0de0000"),
                                                                           "0badc0de0000")),
    ("an .r.old- that is a symbolic link to a report", lambda t: _link_to_report(t)),
]


def _user_dir(d: Path) -> Path:
    d.mkdir()
    (d / "thesis.tex").write_text("months of work")
    return d


def _with_marker(d: Path, token: str) -> Path:
    (d / report_build.REPORT_MARKER).write_text(report_build.marker_text(token))
    return d


def _linked_marker(t: Path, name: str, token: str) -> Path:
    real = _with_marker(_user_dir(t / "elsewhere"), token)
    d = _user_dir(t / name)
    (d / report_build.REPORT_MARKER).symlink_to(real / report_build.REPORT_MARKER)
    return d


def _link_to_report(t: Path) -> Path:
    real = _report_dir(t, "kept-report")
    (t / ".r.old-0a1b2c3d4e5f").symlink_to(real)
    return real


@pytest.mark.parametrize("what, make", LOOKALIKES, ids=[c[0] for c in LOOKALIKES])
def test_directories_that_only_look_like_leftovers_are_never_deleted(registry, tmp_path, what, make):
    """Issue 33: a directory beside --out is deleted (or restored) only if it carries the build's own
    marker with the token of its own name; the user's files inside a look-alike survive every build."""
    kept = make(tmp_path)
    before = snapshot(kept)
    for _ in range(2):     # with and without a previous report at --out
        status, _, err = run_main(args(tmp_path / "r", "fake-plain"))
        assert status == 0 and "cleaned" not in err and "recovered" not in err, err
    assert snapshot(kept) == before


def test_from_sweep_with_a_symlinked_points_is_refused(registry, tmp_path):
    elsewhere = _sweep_in(tmp_path / "elsewhere")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "summary.json").write_text("{}")
    (sweep / "points").symlink_to(elsewhere / "points")
    status, _, err = run_main(args(tmp_path / "r", "fake-plain", "--from-sweep", str(sweep)))
    assert status == 2 and "points is a symbolic link" in err and not (tmp_path / "r").exists(), err


def test_rerender_recovers_a_stranded_report_too(registry, tmp_path):
    src = tmp_path / "src"
    assert run_main(args(src, "fake-config"))[0] == 0
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    _kill_between_renames(out)
    status, _, err = run_main(["--from-json", str(src / "claims.json"), "--out", str(out)])
    assert status == 0 and "restored the previous report" in err
    assert [c["id"] for c in strict_load(out / "claims.json")["claims"]] == ["fake-config"]


def _point_record(point: dict, code: str = None, **extra) -> dict:
    """A point record as numerics.sweep stores it (its id the hash of its point and code version)."""
    from numerics.stored import code_version, point_id

    code = code_version() if code is None else code
    return {"id": point_id(point, code=code), "status": "done", "point": point, "result": {"loss": 0.5},
            "error": None, "code_version": code, "point_fn": "numerics.sweep:train_point", **extra}


def _sweep(tmp_path: Path) -> Path:
    """A sweep holding one sound point and the kinds of file a sweep must not use."""
    sweep = tmp_path / "sweep"
    (sweep / "points").mkdir(parents=True)

    def put(name: str, record) -> None:
        (sweep / "points" / name).write_text(record if isinstance(record, str) else json.dumps(record))

    good = _point_record({"model": "full", "problem": {"L": 8}, "train": {}})
    put(f"{good['id']}.json", good)                                       # used: nothing said
    put("bbbbbbbbbbbbbbbb.json", '{"id": "bbbbbbbbbbbbbbbb", "point": ')  # truncated by a kill
    put("cccccccccccccccc.json", good)                                    # its id is not its file name...
    forged = dict(_point_record({"model": "full", "problem": {"L": 16}, "train": {}}), result={"loss": 5.0})
    forged["point"] = {"model": "full", "problem": {"L": 8}, "train": {}}  # ...or not its own hash (edited)
    put(f"{forged['id']}.json", forged)
    foreign = _point_record({"model": "full", "problem": {"L": 32}, "train": {}}, code="0.0.1+src.0123456789abcdef")
    put(f"{foreign['id']}.json", foreign)                                  # another code version
    put("aaaa.json", {"id": "aaaa", "point": {}})                          # not a point file name
    (sweep / "points" / ".dddd.json.tmp").write_text("in progress")        # hidden: not looked at
    return sweep


def test_unreadable_sweep_points_are_warned_recorded_and_shown(registry, tmp_path):
    """Issue 33: a point is used only if everything that identifies it matches; every other file
    is named, with why, on stderr and in the report, and is not used."""
    sweep = _sweep(tmp_path)
    out = tmp_path / "r"
    status, _, err = run_main(args(out, "fake-plain", "--from-sweep", str(sweep)))
    assert status == 0
    assert "warning: --from-sweep: not using" in err and "bbbbbbbbbbbbbbbb.json: not valid JSON" in err
    skipped = {Path(p["file"]).name: p["reason"] for p in strict_load(out / "claims.json")["provenance"]["sweep_skipped"]}
    assert len(skipped) == 5 and all(name in err for name in skipped)
    assert "is not its file name" in skipped["cccccccccccccccc.json"]
    assert sum("not the hash of its own point" in r for r in skipped.values()) == 1
    assert sum("computed by training code 0.0.1+src.0123456789abcdef" in r for r in skipped.values()) == 1
    assert "not a point file" in skipped["aaaa.json"]
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "5 point file(s) of the sweep" in page and "bbbbbbbbbbbbbbbb.json" in page


def test_the_store_uses_only_points_that_identify_themselves(tmp_path):
    """numerics.experiments.Store (what a claim reads with --from-sweep): the forged, renamed and
    foreign points of _sweep are skipped -- the claim trains them -- never used."""
    from numerics.experiments import Store

    store = Store(_sweep(tmp_path))
    assert len(store.records) == 1 and store.records[0]["result"] == {"loss": 0.5}
    assert len(store.skipped) == 5
    assert store.lookup({"model": "full", "problem": {"L": 8}, "train": {}}, lambda p: p) == {"loss": 0.5}
    assert store.lookup({"model": "full", "problem": {"L": 32}, "train": {}}, lambda p: p) is None   # foreign
    assert store.used == 1


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
                 "0.26 ± 0.004", "|Δ| ≤ 0.02", "between 10 and 14", "yes ✓",
                 "≤ 1.547 (not above)", "Δ ≤ +0.035", "not above ✓", "reported, no comparison"):
        assert text in section, text
    # rows grouped by configuration: one sub-heading per config, not repeated in the names
    headline = section[table:section.index("Perturbation checks")]
    assert headline.count("tasks=(3, 3) H=2 L=32") == 1 and headline.count("tasks=(3, 3) H=2 L=64") == 1
    assert section.index("tasks=(3, 3) H=2 L=32") < section.index("emergence time") < section.index("L=64")
    assert "the points lie on the line y = x" in section  # the figure's caption under it
    card = page[page.index("<section id='scorecard'>"):page.index("<section id='findings'>")]
    row = card[card.index("data-id='fake-config'"):]
    assert "<td class='num'>3/3</td>" in row[:row.index("</tr>")]  # the reported row is no comparison
    plain = _section(page, "fake-plain")  # no headline rows: a short summary instead
    assert "gives no headline rows yet" in plain and plain.index("gives no headline") < plain.index("<details>")
    allowed = plain[plain.index("Allowed difference: <b>"):]
    assert "0.05" in allowed[:allowed.index("</b>")] and allowed.index("</b> — MC error") < allowed.index("</p>")


def test_many_perturbation_checks_fold_under_a_count():
    entry = {"id": "c", "title": "t", "statement": "s", "verdict": "undecided", "kind": "claim",
             "perturbations": [{"description": f"wrong constant {k}", "rejected": k != 3, "details": {}}
                               for k in range(6)]}
    macros = report_render.environment().get_template("macros.html.j2").module

    def table(e: dict) -> str:
        return str(macros.perturbation_table(report_render.section(e, {"provenance": {}, "claims": [e]}, {}))).strip()

    folded = table(entry)
    assert folded.startswith("<details>") and "5 of 6 perturbed predictions rejected" in folded
    assert "class='accepted'" in folded  # one accepted: the count is shown in red
    entry["perturbations"] = entry["perturbations"][:2]
    assert table(entry).startswith("<table>")


def test_tiny_banner_and_profile_in_the_summary(registry, tmp_path):
    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    report = strict_load(out / "claims.json")
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "smoke tests of the pipeline, not evidence" in page
    assert page.index("class='banner'") < page.index("<section id='scorecard'>")
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


def test_rerender_refuses_its_own_directory(registry, tmp_path):
    src = tmp_path / "a"
    assert run_main(args(src, "fake-plain"))[0] == 0
    before = snapshot(src)
    status, _, err = run_main(["--from-json", str(src / "claims.json"), "--out", str(src)])
    assert status == 2 and "is the directory of --from-json" in err and snapshot(src) == before
    status, _, err = run_main(["--from-json", str(src), "--out", str(src)])  # the directory given
    assert status == 2 and "is the directory of --from-json" in err and snapshot(src) == before


def test_compare_marks_changed_verdicts_and_numbers(registry, tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_main(args(a, "fake-config,fake-plain"))[0] == 0
    # B: the same claim ids, fake-config as the "new version" reports it
    monkeypatch.setattr(sys.modules["fake_claims_frontdoor"], "fake_config",
                        dataclasses.replace(fake_config_b, id="fake-config"))
    assert run_main(args(b, "fake-config,fake-plain,fake-fail"))[0] == 1
    status = report_compare.main([str(a / "claims.json"), str(b / "claims.json"), "--out", str(tmp_path / "d.html")])
    stdout = capsys.readouterr().out
    assert status == 1
    assert "fake-config  pass     fail     verdict changed" in stdout
    # rows matched by (claim id, name, config)
    assert "limiting error ρ∞ [tasks=(3, 3) H=2 L=32]: A theory 0.25, measured 0.26 ± 0.004, tol 0.02, agrees" in stdout
    assert "measured 0.31 ± 0.004, tol 0.02, disagrees" in stdout
    assert "fake-fail" in stdout and "absent" in stdout
    assert "emergence time" not in stdout  # unchanged rows are not listed in the text summary
    assert "2 of 3 claim(s) changed" in stdout
    page = (tmp_path / "d.html").read_text(encoding="utf-8")
    assert page.count("class='changed'") == 4  # fake-config, its moved row, fake-fail and its row
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "d.html"]  # no temporary left
    assert report_compare.main([str(a), str(a / "claims.json")]) == 0
    assert "no change in 2 claim(s)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["{tmp}/none.json", "{a}"], "A {tmp}/none.json: no such file"),
    (["{a}", "{file:bad.json=[1, 2}"], "not strict JSON"),
    (["{a}", "{file:list.json=[1, 2]}"], "not a claims.json of a report"),
    (["{a}", "{a}", "--out", "{tmp}"], "is a directory"),
    (["{a}", "{a}", "--out", "{tmp}/missing/d.html"], "does not exist"),
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


# --------------------------------------------------------------------------- findings first (issue 21)

FINDINGS_IDS = "fake-fail,fake-config,fake-boundary,fake-beyond"


@pytest.fixture(scope="module")
def findings_report(tmp_path_factory):
    """A report of a failing claim, a passing one, a located boundary and a contradicted
    boundary the paper does not speak of: (directory, exit status)."""
    out = tmp_path_factory.mktemp("findings") / "r"
    with pytest.MonkeyPatch.context() as mp:
        install_registry(mp, "fake_claims_findings", {**FAKES, **EXTRA})
        status = run_main(args(out, FINDINGS_IDS))[0]
    return out, status


def test_findings_are_data_and_come_first(findings_report):
    out, status = findings_report
    assert status == 1 and check_report(out) == []
    report = strict_load(out / "claims.json")
    assert set(report) == {"claims", "findings", "provenance"}
    assert report["findings"] == [f for c in report["claims"] for f in c["findings"]]  # report order
    assert [c["id"] for c in report["claims"]] == ["fake-fail", "fake-boundary", "fake-beyond", "fake-config"]
    assert [f["claim"] for f in report["findings"]] == ["fake-boundary", "fake-boundary", "fake-beyond",
                                                         "fake-beyond", "fake-config"]
    assert {c["id"]: c["kind"] for c in report["claims"]} == {
        "fake-fail": "claim", "fake-config": "claim", "fake-boundary": "boundary", "fake-beyond": "boundary"}
    assert {c["id"]: c["verdict"] for c in report["claims"]}["fake-beyond"] == "contradicted"
    page = (out / "index.html").read_text(encoding="utf-8")
    assert page.index("<section id='scorecard'>") < page.index("<section id='findings'>")  # the scorecard first
    findings = page[page.index("<section id='findings'>"):page.index("<section id='run'>")]
    holds, stops, beyond = (findings.index(h) for h in ("What holds", "Where it stops", "Beyond the paper"))
    assert holds < findings.index("Below sigma = 0.25") < findings.index("ρ∞ = 0.26") < stops
    assert stops < findings.index("leaves allocation") < beyond
    assert beyond < findings.index("The allocated point is a saddle")
    assert findings.count("<li") == 5 and "href='#claim-fake-beyond'" in findings
    # the saddle sentence states the row that disagrees (0.161 against 0.084): it says so in its own words
    saddle = findings[:findings.index("The allocated point is a saddle")]
    assert saddle.endswith("<b class='outcome contradicted'>contradicted:</b> ")
    escape = findings[:findings.index("Escape takes 31")]
    assert not escape.endswith("</b> ")  # it states 31 and 2 (se), not the prediction 20: no mark
    card = page[page.index("<section id='scorecard'>"):page.index("<section id='findings'>")]
    claims_part, stops_part, beyond_part = (card.index(h) for h in
                                            ("The paper&#39;s claims", "Where they stop", "Beyond the paper"))
    assert claims_part < card.index("fake-fail") < card.index("fake-config") < stops_part  # failing first
    assert stops_part < card.index("fake-boundary") < beyond_part < card.index("fake-beyond")
    assert 'class="badge located"' in card and 'class="badge contradicted"' in card
    assert 'class="badge pass"' not in card[stops_part:]  # no green pass on a boundary


def test_page_prints_4_significant_digits_and_json_keeps_all(findings_report):
    out, _ = findings_report
    report = strict_load(out / "claims.json")
    row = next(r for c in report["claims"] for r in c["headline"] if r["name"] == "held-out loss of linear attention")
    assert row["measured"] == 1.2512345678 and row["se"] == 0.0034567 and row["side"] == "reported"
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "1.251 ± 0.003457" in page and "1.2512345678" not in page.split("<details>")[0]


@pytest.mark.parametrize("outcomes, status", [
    ({"claim": "pass", "boundary": "located"}, 0),
    ({"claim": "pass", "boundary": "undecided"}, 0),
    ({"claim": "pass", "boundary": "contradicted"}, 1),
    ({"claim": "pass", "boundary": "error"}, 1),
    ({"claim": "fail", "boundary": "located"}, 1),
    ({"claim": "error", "boundary": "located"}, 1),
    ({"claim": "undecided", "boundary": "located"}, 0),
    ({"claim": "undecided", "boundary": "undecided"}, 0),
])
def test_exit_status_follows_failing(outcomes, status):
    entries = [{"id": kind, "kind": kind, "verdict": verdict, "figure_errors": []} for kind, verdict in outcomes.items()]
    assert report_build.exit_status({"claims": entries}) == status


OLDER = [("findings", lambda r: r.pop("findings"), "no top-level 'findings'"),
         ("kind", lambda r: r["claims"][0].pop("kind"), "claims without 'kind'"),
         ("side", lambda r: _c(r, "fake-config")["headline"][0].pop("side"), "headline rows without 'side'")]


@pytest.mark.parametrize("field, edit, what", OLDER, ids=[o[0] for o in OLDER])
def test_a_claims_json_of_an_older_version_is_refused_with_rebuild_it(registry, tmp_path, field, edit, what):
    """A claims.json written by an older version of this code (before kinds, sides or findings) is
    not upgraded: --from-json and compare refuse it in one line naming its commit."""
    src = tmp_path / "a"
    assert run_main(args(src, "fake-config,fake-plain"))[0] == 0
    report = strict_load(src / "claims.json")
    edit(report)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(report))
    message = (f"written by an older version of this code (commit {report['provenance']['git']['commit'][:12]}: "
               f"{what}); rebuild it with python -m reports.build")
    status, stdout, err = run_main(["--from-json", str(old), "--out", str(tmp_path / "b")])
    assert status == 2 and message in err and "Traceback" not in err and not (tmp_path / "b").exists()
    out, errb = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errb):
        assert report_compare.main([str(old), str(old)]) == 2
    assert message in errb.getvalue()


# --------------------------------------------------------------------------- hand-edited claims.json (issue 22)


@pytest.fixture(scope="module")
def good_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("good") / "r"
    with pytest.MonkeyPatch.context() as mp:
        install_registry(mp, "fake_claims_good", {**FAKES, **EXTRA})
        assert run_main(args(out, "fake-pass,fake-config,fake-boundary"))[0] == 0
    return strict_load(out / "claims.json")


def _nest(depth: int):
    value: object = 1
    for _ in range(depth):
        value = {"x": value}
    return value


def _c(report: dict, cid: str) -> dict:
    return next(c for c in report["claims"] if c["id"] == cid)


EDITS = [
    ("wrong type of verdict", lambda r: _c(r, "fake-pass").update(verdict=3), "'verdict' is int, not str"),
    ("wrong type of headline", lambda r: _c(r, "fake-config").update(headline="all good"), "'headline' is str"),
    ("wrong type of seconds", lambda r: _c(r, "fake-pass").update(seconds="fast"), "'seconds' is str"),
    ("a row's agrees as text", lambda r: _c(r, "fake-config")["headline"][0].update(agrees="yes"), "'agrees' is str"),
    ("duplicate ids", lambda r: r["claims"].append(r["claims"][0]), "duplicate claim ids ['fake-pass']"),
    ("a 300-character id", lambda r: _c(r, "fake-pass").update(id="x" * 300), "at most 80 characters"),
    ("markup in an id", lambda r: _c(r, "fake-pass").update(id="<script>"), "the id must be letters"),
    ("empty claims list", lambda r: r.update(claims=[], findings=[]), "'claims' is empty"),
    ("nesting 60 deep", lambda r: _c(r, "fake-pass")["details"].update(deep=_nest(60)), "nested more than 40 levels"),
    ("verdict edited to pass", lambda r: _c(r, "fake-config")["headline"][0].update(agrees=False),
     "verdict 'pass' but headline row(s) ['limiting error ρ∞'] do not agree"),
    ("boundary edited to located", lambda r: _c(r, "fake-boundary")["headline"][2].update(agrees=False),
     "verdict 'located' but headline row(s)"),
    ("pass with a perturbation accepted", lambda r: _c(r, "fake-pass")["perturbations"][0].update(rejected=False),
     "were accepted; a passing verdict needs every perturbation rejected"),
    ("a boundary said pass", lambda r: _c(r, "fake-boundary").update(verdict="pass"), "the outcomes of a boundary"),
    ("an unknown kind", lambda r: _c(r, "fake-boundary").update(kind="lemma"), "kind 'lemma' is not one of"),
    ("an unknown side", lambda r: _c(r, "fake-config")["headline"][0].update(side="sideways"), "has side 'sideways'"),
    ("an unknown finding kind", lambda r: _c(r, "fake-config")["findings"][0].update(kind="maybe"), "kind 'maybe'"),
    ("a finding of another claim", lambda r: _c(r, "fake-config")["findings"][0].update(claim="fake-pass"),
     "not its own id"),
    ("top-level findings edited", lambda r: r["findings"][0].update(text="the paper is right"),
     "the top-level 'findings' are not the claims' findings"),
    ("an unknown key in a row", lambda r: _c(r, "fake-config")["headline"][0].update(colour="green"), "unknown keys"),
]


@pytest.mark.parametrize("what, edit, message", EDITS, ids=[e[0] for e in EDITS])
def test_hand_edited_claims_json_is_refused_before_drawing(registry, good_report, tmp_path, monkeypatch,
                                                           what, edit, message):
    report = json.loads(json.dumps(good_report))
    edit(report)
    source = tmp_path / "edited.json"
    source.write_text(json.dumps(report))
    drawn = []
    monkeypatch.setattr(report_render, "figure_png", lambda *a, **k: drawn.append(1))
    before = sorted(p.name for p in tmp_path.iterdir())
    status, stdout, err = run_main(["--from-json", str(source), "--out", str(tmp_path / "r")])
    assert status == 2 and "--from-json" in err and message in err, err
    assert "Traceback" not in err and stdout == "" and not drawn
    out, errb = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errb):
        assert report_compare.main([str(source), str(source)]) == 2
    assert "error: A " in errb.getvalue() and message in errb.getvalue() and out.getvalue() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


# --------------------------------------------------------------------------- a claims.json that disagrees with itself (issue 33)


@pytest.fixture(scope="module")
def spec_report(tmp_path_factory):
    """A report of claims run as specs (their comparisons stored): one passes, one fails (measured 5.0
    against 0.779 at a tolerance of 0.019), one is undecided, one boundary is contradicted."""
    out = tmp_path_factory.mktemp("spec") / "r"
    with pytest.MonkeyPatch.context() as mp:
        install_registry(mp, "fake_claims_spec", {**FAKES, **EXTRA})
        status, _, err = run_main(args(out, "fake-spec-pass,fake-spec-fail,fake-spec-undecided,boundary-spec"))
    assert status == 1, err
    report = strict_load(out / "claims.json")
    assert [c["verdict"] for c in report["claims"]] == ["pass", "fail", "undecided", "contradicted"]
    return report


def _forge_pass(report: dict, cid: str) -> None:
    """The issue's forgery: the verdict and every agreement flipped to pass, the numbers untouched."""
    entry = _c(report, cid)
    entry["verdict"] = "located" if entry["kind"] == "boundary" else "pass"
    for row in entry["headline"]:
        if row["side"] != "reported":
            row["agrees"] = True
    for c in entry["details"]["comparisons"]:
        c["agrees"] = True
        for q in c["perturbations"]:
            q["rejected"] = True
    for q in entry["perturbations"]:
        q["rejected"] = True


def _drop_comparisons(report: dict, cid: str) -> None:
    _forge_pass(report, cid)
    del _c(report, cid)["details"]["comparisons"]


FORGED = [
    # (what, edit, message): each a file whose numbers say otherwise than its words
    ("a fail flipped to pass, every agreement too, numbers untouched", lambda r: _forge_pass(r, "fake-spec-fail"),
     "its own numbers (measured 5.0, theory 0.7792937908845126, tolerance 0.018848, two-sided) say False"),
    ("a contradicted boundary flipped to located", lambda r: _forge_pass(r, "boundary-spec"), "the file disagrees"),
    ("the flip with the comparisons deleted", lambda r: _drop_comparisons(r, "fake-spec-fail"),
     "says agrees=True but its own numbers"),
    ("only the verdict edited to pass", lambda r: _c(r, "fake-spec-fail").update(verdict="pass"),
     "do not agree; a passing verdict needs every judged row to agree"),
    ("an honest pass edited to fail", lambda r: _c(r, "fake-spec-pass").update(verdict="fail"),
     "verdict 'fail', but its own comparisons and perturbations give 'pass'"),
    ("an undecided claim edited to pass", lambda r: _c(r, "fake-spec-undecided").update(verdict="pass"),
     "give 'undecided' (claims.core.judge)"),
    ("a comparison's agrees flipped", lambda r: _c(r, "fake-spec-fail")["details"]["comparisons"][0].update(agrees=True),
     "says agrees=True but its error"),
    ("a row's agrees flipped, numbers untouched", lambda r: _c(r, "fake-spec-fail")["headline"][0].update(agrees=True),
     "says agrees=True but its own numbers"),
    ("a bracket row flipped", lambda r: _c(r, "fake-spec-pass")["headline"][1].update(agrees=False),
     "says agrees=False but its own numbers (measured 12.5, theory [10.0, 14.0]"),
    ("a perturbation's rejected flipped against its error", lambda r: _c(r, "fake-spec-pass")["perturbations"][0].update(
        rejected=False), "were accepted"),
    ("a stored perturbation flipped", lambda r: _c(r, "fake-spec-pass")["details"]["comparisons"][0]["perturbations"][0]
     .update(rejected=False), "says rejected=False but its error"),
    ("a row's measured edited into agreement", lambda r: _c(r, "fake-spec-fail")["headline"][0].update(measured=0.78),
     "says agrees=False but its own numbers (measured 0.78"),
]


@pytest.mark.parametrize("what, edit, message", FORGED, ids=[f[0] for f in FORGED])
def test_a_claims_json_that_disagrees_with_itself_is_refused(registry, spec_report, tmp_path, monkeypatch,
                                                             what, edit, message):
    """A re-render (--from-json) and reports.compare recompute every agreement and verdict from the
    file's own numbers and refuse the file, before drawing anything: no hand edit changes a verdict."""
    report = json.loads(json.dumps(spec_report))
    edit(report)
    report["findings"] = [f for c in report["claims"] for f in c["findings"]]
    source = tmp_path / "forged.json"
    source.write_text(json.dumps(report))
    drawn = []
    monkeypatch.setattr(report_render, "figure_png", lambda *a, **k: drawn.append(1))
    status, stdout, err = run_main(["--from-json", str(source), "--out", str(tmp_path / "r")])
    assert status == 2 and message in err and "Traceback" not in err and stdout == "" and not drawn, err
    out, errb = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errb):
        assert report_compare.main([str(source), str(source)]) == 2
    assert message in errb.getvalue() and out.getvalue() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forged.json"]


def test_the_genuine_spec_report_rerenders_and_compares(registry, spec_report, tmp_path, capsys):
    source = tmp_path / "claims.json"
    source.write_text(json.dumps(spec_report))
    status, _, err = run_main(["--from-json", str(source), "--out", str(tmp_path / "r")])
    assert status == 1, err           # the same verdicts, the fail kept
    assert [c["verdict"] for c in strict_load(tmp_path / "r" / "claims.json")["claims"]] == \
        ["pass", "fail", "undecided", "contradicted"]
    assert report_compare.main([str(source), str(tmp_path / "r")]) == 0
    capsys.readouterr()


def test_an_undecided_claim_passes_the_schema_and_renders_with_its_badge(registry, spec_report, tmp_path):
    """A claim that agrees but cannot decide reads ``undecided`` (its reason beside it), with the badge a
    boundary's undecided has."""
    assert document_problems(spec_report) == []
    source = tmp_path / "claims.json"
    source.write_text(json.dumps(spec_report))
    status, _, err = run_main(["--from-json", str(source), "--out", str(tmp_path / "r")])
    assert status == 1, err           # the fail and the contradicted boundary; the undecided claim alone would be 0
    report = strict_load(tmp_path / "r" / "claims.json")
    assert _c(report, "fake-spec-undecided")["verdict"] == "undecided" and document_problems(report) == []
    page = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    assert '<span class="badge undecided">undecided</span>' in _section(page, "fake-spec-undecided")
    assert "the run did not converge" in _section(page, "fake-spec-undecided")
    assert "1 pass, 1 fail, 1 undecided, 0 error" in page


def _text(report: dict, **provenance) -> str:
    return json.dumps({**report, "provenance": {**report["provenance"], **provenance}}, indent=1)


READ_BACK = [
    # (what, the genuine claims.json -> an edited text, message): values JSON can hold but a report cannot
    ("1e400 (a float overflow)", lambda r: _text(r).replace('"seconds": ', '"seconds": 1e400, "_": ', 1),
     "the number 1e400 is beyond the range of a float"),
    ("a float seed", lambda r: _text(r, seed=0.5), "'seed' has type float, not int"),
    ("a seed beyond 2^64", lambda r: _text(r, seed=2 ** 70), "is not a seed"),
    ("a boolean seed", lambda r: _text(r, seed=True), "'seed' has type bool"),
    ("a lone surrogate in a string", lambda r: _text(r).replace('"title": "', '"title": "\\ud800', 1),
     "lone surrogate"),
    ("a lone surrogate in a key", lambda r: _text(r).replace('"details": {', '"details": {"\\udc00": 1, ', 1),
     "lone surrogate"),
    ("a profile that is a number", lambda r: _text(r, profile=7), "'profile' has type int, not str"),
    ("ran_at naming a claim by a number (found by fuzzing: the page crashed)",
     lambda r: _text(r, ran_at={"configuration": [], "profile": ["fake-pass", -1]}), "'ran_at' is not"),
    ("a configuration whose tasks is a number", lambda r: _text(r, problem={"tasks": 3, "heads": 1, "L": 8}),
     "'problem' is not a configuration"),
    ("sweep_skipped of strings", lambda r: _text(r, sweep_skipped=["x"]), "'sweep_skipped' is not"),
    ("a provenance without versions (re-rendered, it would break the schema)",
     lambda r: _text(r, versions={}), "its provenance is not a report's (provenance.versions: missing python"),
]


@pytest.mark.parametrize("what, edit, message", READ_BACK, ids=[c[0] for c in READ_BACK])
def test_values_a_report_cannot_hold_are_refused_by_the_reader(registry, spec_report, tmp_path, what, edit, message):
    """Refused by the reader with exit 2, never a crash of the writer after the read."""
    edited = edit(spec_report)
    assert edited != _text(spec_report)
    source = tmp_path / "x.json"
    source.write_text(edited)
    status, stdout, err = run_main(["--from-json", str(source), "--out", str(tmp_path / "r")])
    assert status == 2 and message in err and "Traceback" not in err and not (tmp_path / "r").exists(), err


_ENTRY = json.dumps({
    "id": "@ID@", "title": "A claim", "statement": "s", "verdict": "pass", "kind": "claim", "theory": {}, "numerics": {},
    "tolerance": {}, "figure_data": [], "seconds": 1.0, "figures": [], "figure_errors": [],
    "details": {"comparisons": [{"name": "x", "measured": 0.26, "predicted": 0.25, "error": 0.01, "tolerance": 0.02,
                                 "agrees": True, "side": "two-sided", "perturbations": []}]},
    "perturbations": [{"description": "doubled", "rejected": True, "details": {"error": 0.25, "tolerance": 0.02}}],
    "headline": [{"name": "x", "theory": 0.25, "measured": "@M@", "se": 0.004, "tolerance": 0.02, "agrees": True,
                  "side": "two-sided", "config": None, "resolving_power": None}],
    "findings": [{"claim": "@ID@", "kind": "holds", "text": "x holds.", "numbers": {}}]})
_FINDING = '{"claim": "@ID@", "kind": "holds", "text": "x holds.", "numbers": {}}'
_PROVENANCE = json.dumps({"versions": {p: "1" for p in ("python", "torch", "numpy", "scipy", "sympy", "mpmath",
                                                         "matplotlib")},
                          "device": "cpu", "seed": 0, "profile": "tiny", "wall_seconds": {"per_claim": {}, "total": 1.0},
                          "cpu_seconds": {}, "git": {"commit": "x", "dirty": False}, "command": [], "started_utc": "",
                          "seeds": {}})


def test_a_figure_of_the_wrong_shape_is_one_figure_error(registry, spec_report, findings_report, tmp_path):
    """Found by fuzzing --from-json: a caption that is a number crashed the re-render (outside the
    per-figure guard); now what a figure's data decides is inside it: the number is shown as text,
    and anything that cannot be drawn is one figure error, never a traceback."""
    out, _ = findings_report
    report = strict_load(out / "claims.json")
    entry = next(c for c in report["claims"] if c["figure_data"])
    entry["figure_data"][0]["caption"] = -1e308
    source = tmp_path / "x.json"
    source.write_text(json.dumps(report))
    status, _, err = run_main(["--from-json", str(source), "--out", str(tmp_path / "r")])
    assert status == 1 and "Traceback" not in err, err
    written = strict_load(tmp_path / "r" / "claims.json")
    assert any(f["caption"].startswith("-1e+308") for c in written["claims"] for f in c["figures"])
    assert check_report(tmp_path / "r") == []


def _many_claims(n: int, forged: int = -1) -> str:
    """The text of a claims.json of ``n`` consistent claims (about 850 bytes each) as a build writes
    it; claim ``forged``'s headline row says it agrees while it measures 5.0 against 0.25."""
    ids = [f"c-{k:05d}" for k in range(n)]
    entries = [_ENTRY.replace("@ID@", cid).replace('"@M@"', "5.0" if k == forged else "0.26") for k, cid in enumerate(ids)]
    findings = [_FINDING.replace("@ID@", cid) for cid in ids]
    return '{"claims": [' + ", ".join(entries) + '], "findings": [' + ", ".join(findings) + '], "provenance": ' \
        + _PROVENANCE + "}"


def test_a_20000_claim_claims_json_is_checked_in_linear_time(tmp_path):
    """Issue 33: the checks were quadratic (ids.count per id, a type-hint evaluation per row):
    a 20,000-claim claims.json took minutes.  Now one pass: seconds (CPU time, the machine may be
    shared); a forged row among them is found."""
    import time

    from reports.render import load_report

    source = tmp_path / "big.json"
    source.write_text(_many_claims(20000))
    assert source.stat().st_size > 15 * 2 ** 20
    cpu = time.process_time()
    assert len(load_report(str(source), "--from-json")["claims"]) == 20000
    assert time.process_time() - cpu < 20
    source.write_text(_many_claims(2000, forged=1999))
    with pytest.raises(report_build.BadArguments, match="c-01999.*its own numbers"):
        load_report(str(source), "--from-json")


@pytest.mark.thorough
def test_a_20000_claim_claims_json_rerenders_in_seconds(tmp_path):
    """The whole re-render of 20,000 claims (the page, the forest plot capped at FOREST_MAX_ROWS
    rows, the check of what was written): linear, under a minute of CPU (measured 18.5 s CPU for
    20 MB on the shared 2-core machine; before, more than 5 minutes and a 318-megapixel image)."""
    import time

    source = tmp_path / "big.json"
    source.write_text(_many_claims(20000))
    cpu = time.process_time()
    status, _, err = run_main(["--from-json", str(source), "--out", str(tmp_path / "r")])
    assert status == 0, err
    assert time.process_time() - cpu < 60


@pytest.mark.parametrize("what, text, message", [
    ("nested 100000 deep", "[" * 100000 + "]" * 100000, "nested too deep"),
    ("not UTF-8", b"\xff\xfe{}", "cannot be read as UTF-8"),
])
def test_unparseable_claims_json_is_refused(tmp_path, what, text, message):
    source = tmp_path / "bad.json"
    (source.write_bytes if isinstance(text, bytes) else source.write_text)(text)
    status, stdout, err = run_main(["--from-json", str(source), "--out", str(tmp_path / "r")])
    assert status == 2 and message in err and "Traceback" not in err and not (tmp_path / "r").exists()


def test_a_fifo_as_claims_json_is_refused_unopened(tmp_path):
    fifo = tmp_path / "claims.json"
    os.mkfifo(fifo)
    status, _, err = run_main(["--from-json", str(fifo), "--out", str(tmp_path / "r")])  # would block if opened
    assert status == 2 and "not a regular file" in err


def test_a_figure_of_400_panels_is_capped(monkeypatch):
    """Only MAX_PANELS panels are drawn (4 here, to keep the test fast; 16 by default: a 4 x 4
    grid of 2046 x 1628 pixels), the caption says so, and no PNG exceeds MAX_PIXELS."""
    monkeypatch.setattr(report_render, "MAX_PANELS", 4)
    panel = Figure(name="p", title="p", series=[Series("s", [0.0, 1.0], [0.0, 1.0])])
    fig = Figure(name="many", title="400 panels", kind="panels", panels=[panel] * 400)
    entries, pngs = report_build.draw_figures([{"id": "c", "figure_data": [fig]}])
    assert entries[0]["figure_errors"] == []
    assert "the first 4 of its 400 panels are drawn" in entries[0]["figures"][0]["caption"]
    from PIL import Image

    with Image.open(io.BytesIO(pngs[entries[0]["figures"][0]["file"]])) as image:
        assert image.width * image.height <= report_render.MAX_PIXELS
    many = Figure(name="legend", title="t", series=[Series(f"s{k}", [0.0], [0.0]) for k in range(300)])
    assert "first 40 of 300 entries" in report_render.size_note(many)


# --------------------------------------------------------------------------- output paths (issue 22)


def _report_dir(tmp_path: Path, name: str = "prev") -> Path:
    """A previous report (its marker and files), made by hand: no build needed; named .X.old-TOKEN,
    its marker holds that token (as the build writes it before moving a report aside)."""
    d = tmp_path / name
    (d / "figures").mkdir(parents=True)
    token = name.rsplit(".old-", 1)[1] if ".old-" in name else "0a1b2c3d4e5f"
    (d / ".icl-audit-report").write_text(report_build.marker_text(token))
    (d / "claims.json").write_text("{}")
    return d


def _sweep_in(d: Path) -> Path:
    (d / "points").mkdir(parents=True, exist_ok=True)
    (d / "points" / "aaaa.json").write_text(json.dumps({"id": "aaaa", "point": {}}))
    return d


OUT_CASES = [
    # (what, setup(tmp) -> extra argv, message)
    ("a sweep stored in a previous report", lambda t: ["--out", str(_sweep_in(_report_dir(t)))],
     "which this command did not write"),
    ("a sweep in a directory that is no report", lambda t: ["--out", str(_sweep_in(t / "sw"))], "holds a sweep"),
    ("--out is the --from-sweep source", lambda t: ["--out", str(_sweep_in(_report_dir(t))), "--from-sweep",
                                                     str(t / "prev")], "inputs are never overwritten"),
    ("--out holds the --config file", lambda t: ["--out", str(_report_dir(t)), "--config",
                                                  str(_write(t / "prev" / "c.toml", "tasks = [2]\nheads = 1\nL = 8\n"))],
     "an input of this command"),
    ("a symlink loop", lambda t: ["--out", str(_symlink(t / "loop", t / "loop"))], "symbolic link loop"),
    ("a dangling symlink", lambda t: ["--out", str(_symlink(t / "dangling", t / "nowhere"))], "dangling link"),
    ("a file", lambda t: ["--out", str(_write(t / "afile", "x"))], "exists and is not a directory"),
    # a deletion on replace touches only what the build wrote and listed in its marker
    ("a user's folder named claims.json in a previous report", lambda t: ["--out", str(_named_folder(_report_dir(t)))],
     "holds ['claims.json'], which this command did not write"),
    ("a user's figure in a previous report's figures/", lambda t: ["--out", str(_user_figure(_report_dir(t)))],
     "holds ['figures/mine.png'], which this command did not write"),
    ("a previous report's claims.json changed since it was written", lambda t: ["--out", str(_changed(_report_dir(t)))],
     "claims.json (changed since it was written)"),
]


def _named_folder(d: Path) -> Path:
    (d / "claims.json").unlink()
    (d / "claims.json").mkdir()
    (d / "claims.json" / "thesis.tex").write_text("months of work")
    return d


def _user_figure(d: Path) -> Path:
    """A report whose marker lists its files (what a build writes) and a PNG the user put in it."""
    (d / ".icl-audit-report").write_text(report_build.marker_text("0a1b2c3d4e5f", files={"claims.json": 2}))
    (d / "figures" / "mine.png").write_bytes(b"\x89PNG months of work")
    return d


def _changed(d: Path) -> Path:
    (d / ".icl-audit-report").write_text(report_build.marker_text("0a1b2c3d4e5f", files={"claims.json": 2}))
    (d / "claims.json").write_text('{"my": "notes"}')
    return d


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _symlink(link: Path, target: Path) -> Path:
    os.symlink(target, link)
    return link


@pytest.mark.parametrize("what, setup, message", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_out_that_cannot_be_replaced_is_refused_before_any_claim(registry, tmp_path, what, setup, message):
    extra = setup(tmp_path)
    before = snapshot(tmp_path)
    names = sorted(os.listdir(tmp_path))
    status, stdout, err = run_main(["--profile", "tiny", "--only", "fake-interrupt", "--no-progress", *extra])
    assert status == 2, err  # 130 would mean the claim ran
    assert message in err and "Traceback" not in err and stdout == ""
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == names


@contextlib.contextmanager
def _read_only(path: Path):
    """``path`` unwritable for the block: chattr +i as root (permission bits do not bind root), chmod a-w
    otherwise; skipped where neither takes."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this file system cannot make a folder immutable")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


@pytest.mark.parametrize("frozen, message", [("r/figures", "['figures'] cannot be written (read-only)"),
                                             (".", "cannot write in")], ids=["its figures", "the folder holding it"])
def test_a_previous_report_that_cannot_be_replaced_whole_is_refused(registry, tmp_path, frozen, message):
    """A previous report in a read-only folder, or holding one: replacing it left a .r.old-* folder
    behind (the swap done, the delete refused).  Now refused before any claim runs, by the build and
    the audit alike, nothing changed."""
    from reports import audit as report_audit

    out = tmp_path / "r"
    assert run_main(args(out, "fake-plain"))[0] == 0
    checkpoint = _write(tmp_path.parent / f"{tmp_path.name}-x.npz", "not read: --out is checked first")
    before, names = snapshot(tmp_path), sorted(os.listdir(tmp_path))
    with _read_only(tmp_path / frozen):
        status, stdout, err = run_main(["--profile", "tiny", "--only", "fake-interrupt", "--no-progress", "--out",
                                        str(out)])
        audit_err = io.StringIO()
        audit_status = report_audit.main([str(checkpoint), "--tasks", "2", "--L", "8", "--out", str(out)],
                                         stream=audit_err)
    assert status == 2 and message in err and "Traceback" not in err and stdout == "", err
    assert audit_status == 2 and message in audit_err.getvalue(), audit_err.getvalue()
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == names


def test_out_where_nothing_can_be_written_is_refused_before_any_claim(registry, tmp_path, monkeypatch):
    """An immutable empty directory (chattr +i where the filesystem and user allow it; else
    simulated by a failing write probe, since root ignores permission bits): refused before
    any claim runs, not after all the compute."""
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    chattr = shutil.which("chattr")
    immutable = chattr is not None and subprocess.run([chattr, "+i", str(frozen)], capture_output=True).returncode == 0
    if not immutable:
        import numerics.io as policy

        real = policy.tempfile.mkstemp

        def refuse(*a, dir=None, **k):
            if dir is not None and Path(dir) == frozen:
                raise PermissionError(1, "Operation not permitted")
            return real(*a, dir=dir, **k)

        monkeypatch.setattr(policy.tempfile, "mkstemp", refuse)
    try:
        status, _, err = run_main(["--profile", "tiny", "--only", "fake-interrupt", "--no-progress", "--out",
                                   str(frozen)])
    finally:
        if immutable:
            subprocess.run([chattr, "-i", str(frozen)], check=True)
    assert status == 2 and "cannot write in" in err and "Operation not permitted" in err  # 130: the claim ran
    assert os.listdir(frozen) == [] and sorted(os.listdir(tmp_path)) == ["frozen"]


def test_a_symlinked_out_is_followed_and_kept(registry, tmp_path):
    target = tmp_path / "real"
    link = _symlink(tmp_path / "link", target.absolute())
    target.mkdir()
    assert run_main(args(link, "fake-plain"))[0] == 0
    assert link.is_symlink() and (target / "claims.json").is_file()
    assert run_main(args(link, "fake-plain"))[0] == 0  # a previous report through the link: replaced
    assert link.is_symlink() and check_report(target) == []


def test_an_empty_directory_is_filled_in_place_with_umask_permissions(registry, tmp_path):
    empty = tmp_path / "mine"
    empty.mkdir()
    inode = empty.stat().st_ino
    old = os.umask(0o027)
    try:
        assert run_main(args(empty, "fake-pass"))[0] == 0
        fresh = tmp_path / "fresh"
        assert run_main(args(fresh, "fake-pass"))[0] == 0
    finally:
        os.umask(old)
    assert empty.stat().st_ino == inode  # the user's directory, never deleted
    assert check_report(empty) == []
    assert fresh.stat().st_mode & 0o777 == 0o750  # not mkdtemp's 0700
    assert (fresh / "index.html").stat().st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["fresh", "mine"]


def test_stale_leftovers_are_cleaned_for_real_or_not_claimed(registry, tmp_path, monkeypatch):
    out = _report_dir(tmp_path, "r")
    stale = _report_dir(tmp_path, ".r.old-0123456789ab")
    real = shutil.rmtree

    def stuck(path, *a, **k):
        if Path(path) == stale:
            raise PermissionError(1, "Operation not permitted", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(shutil, "rmtree", stuck)
    status, _, err = run_main(args(out, "fake-plain"))
    assert status == 0 and "cleaned" not in err and "could not remove .r.old-0123456789ab" in err
    assert stale.is_dir()
    monkeypatch.setattr(shutil, "rmtree", real)
    status, _, err = run_main(args(out, "fake-plain"))
    assert status == 0 and "cleaned: removed .r.old-0123456789ab" in err and not stale.exists()


COMPARE_OUT_CASES = [
    ("--out is A", lambda a, t: str(a / "claims.json"), "same file as the input"),
    ("--out is A through a symlink", lambda a, t: str(_symlink(t / "alias.json", a / "claims.json")),
     "same file as the input"),
    ("--out a FIFO", lambda a, t: (os.mkfifo(t / "fifo"), str(t / "fifo"))[1], "a FIFO"),
    ("--out a dangling symlink", lambda a, t: str(_symlink(t / "d.html", t / "gone" / "d.html")), "dangling"),
    ("--out dir/ (it names a directory)", lambda a, t: str(t / "dir") + "/", "ends with '/'"),
]


@pytest.mark.parametrize("what, out, message", COMPARE_OUT_CASES, ids=[c[0] for c in COMPARE_OUT_CASES])
def test_compare_never_overwrites_its_inputs(registry, tmp_path, capsys, what, out, message):
    a = tmp_path / "a"
    assert run_main(args(a, "fake-plain"))[0] == 0
    target = out(a, tmp_path)
    before = snapshot(tmp_path)
    assert report_compare.main([str(a), str(a / "claims.json"), "--out", target]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "--out" in captured.err and "Traceback" not in captured.err
    assert captured.out == "" and snapshot(tmp_path) == before


def test_compare_writes_through_a_device_and_with_umask_permissions(registry, tmp_path, capsys):
    a = tmp_path / "a"
    assert run_main(args(a, "fake-plain"))[0] == 0
    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device like /dev/null
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device file here: {exc}")
    assert report_compare.main([str(a), str(a), "--out", str(device)]) == 0
    assert os.path.exists(device) and os.stat(device).st_rdev == os.makedev(1, 3)
    assert (os.stat(device).st_mode & 0o170000) == 0o020000  # still a device, not a regular file
    old = os.umask(0o022)
    try:
        assert report_compare.main([str(a), str(a), "--out", str(tmp_path / "d.html")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "d.html").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


# --------------------------------------------------------------------------- what the claims say (issue 22)


def test_from_sweep_with_claims_that_read_none_is_refused(registry, tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "reads_sweep", lambda cid: cid == "fake-config", raising=False)
    sweep = _sweep_in(tmp_path / "sweep")
    status, _, err = run_main(args(tmp_path / "r", "fake-plain,fake-interrupt", "--from-sweep", str(sweep)))
    assert status == 2 and "none of the selected claims (fake-plain, fake-interrupt) reads a sweep" in err
    assert "the claims that do: fake-config" in err and not (tmp_path / "r").exists()
    status, _, err = run_main(args(tmp_path / "r", "fake-plain,fake-config", "--from-sweep", str(sweep)))
    assert status == 0 and "fake-plain read no sweep" in err
    # and it does run as without --from-sweep, as the note says: no sweep runs counted for it
    entries = {c["id"]: c for c in json.loads((tmp_path / "r" / "claims.json").read_text())["claims"]}
    assert "sweep_runs" not in entries["fake-plain"]["details"] and entries["fake-config"]["details"]["sweep_runs"] == 0


def test_claims_that_cannot_run_at_a_configuration_are_named_before_any_runs(registry, tmp_path, monkeypatch):
    def cannot_run(cid, problem):
        return f"L = {problem['L']} leaves no room for its family of L" if cid == "fake-config" else None

    monkeypatch.setattr(claims, "cannot_run", cannot_run, raising=False)
    status, _, err = run_main(args(tmp_path / "r", "fake-config,fake-config-b", "--tasks", "2", "--heads", "1",
                                   "--L", "2"))
    assert status == 2 and "fake-config cannot run: L = 2 leaves no room" in err
    assert "These can: --only fake-config-b" in err and not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- README's findings (issue 21)

from reports import findings as report_findings  # noqa: E402


def test_readme_block_is_the_scorecard_generated_from_claims_json(findings_report, tmp_path, capsys):
    out, _ = findings_report
    report = strict_load(out / "claims.json")
    text = report_findings.markdown(report)
    for c in report["claims"]:
        assert f"| `{c['id']}` | " in text
    assert text.index("**The paper's claims**") < text.index("**Where they stop**") < text.index("**Beyond the paper**")
    # a contradicted id: the row that decided it, with by how much, on its own line and nowhere else
    assert ("| `fake-beyond` | **contradicted** | 2 of 2 comparisons disagree; the worst: saddle: growth rate of "
            "off-task \\|mu\\| vs 2a: measured 0.161 ± 0.01 against 0.084 (tolerance 0.04; missed by 1.9 × it; "
            "r = (1, 1), H = 2, L = 32). | 0/2 |") in text
    assert not [line for line in text.splitlines() if line.startswith("- ")]
    assert "(reports/out/figures/forest.png)" in text and "started" not in text and "run of" not in text
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{report_findings.START}\nold, hand-written\n{report_findings.END}\n\nafter\n")
    assert report_findings.main([str(out / "claims.json"), "--check", str(readme)]) == 1
    assert "old, hand-written" in capsys.readouterr().err  # the lines that differ are shown
    assert report_findings.main([str(out / "claims.json"), "--readme", str(readme)]) == 0
    written = readme.read_text()
    assert written.startswith("# x\n\nbefore\n\n") and written.endswith("\n\nafter\n") and text in written
    assert report_findings.main([str(out / "claims.json"), "--check", str(readme)]) == 0

    def check(edit) -> int:
        changed = json.loads(json.dumps(report))
        edit(changed)
        changed["findings"] = [f for c in changed["claims"] for f in c["findings"]]
        (tmp_path / "changed.json").write_text(json.dumps(changed))
        return report_findings.main([str(tmp_path / "changed.json"), "--check", str(readme)])

    # what a reader would not see change: the time of the run, its commit, digits below the printed ones
    assert check(lambda r: r["provenance"].update(started_utc="2031-01-01T00:00:00+00:00",
                                                  git={"commit": "f" * 40, "dirty": True})) == 0
    def measured(r, value):   # the first headline row and its comparison (theory 0.25, tolerance 0.02)
        _c(r, "fake-config")["headline"][0].update(measured=value)
        _c(r, "fake-config")["details"]["comparisons"][0].update(measured=value, error=abs(value - 0.25),
                                                                  margin=abs(value - 0.25) / 0.02)

    assert check(lambda r: measured(r, 0.2600001)) == 0
    # what a reader would see change: an outcome, a headline number at its printed precision
    assert check(lambda r: measured(r, 0.261)) == 1
    assert "measured 0.261 ± 0.004 against 0.25" in capsys.readouterr().err
    assert check(lambda r: (_c(r, "fake-boundary").update(verdict="undecided"),
                            _c(r, "fake-boundary")["details"].update(undecided="the run did not converge"))) == 1
    # whitespace and line wrapping of the README's block are not what a reader reads
    readme.write_text(readme.read_text().replace(" | ", " |  ").replace("Each id's line", "Each id's\nline"))
    assert report_findings.main([str(out / "claims.json"), "--check", str(readme)]) == 0
    assert report_findings.main([str(out / "claims.json"), "--readme", str(tmp_path / "none.md")]) == 2
    assert report_findings.main([str(out / "claims.json"), "--findings"]) == 0
    listed = capsys.readouterr().out
    assert "- **contradicted:** The allocated point is a saddle" in listed and "**Beyond the paper**" in listed


def test_the_readme_block_matches_the_quick_report_when_there_is_one():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert report_findings.START in readme and report_findings.END in readme
    assert "reports/out/index.html#scorecard" in readme and "reports/out/figures/forest.png" in readme
    built = REPO_ROOT / "reports" / "out" / "claims.json"
    if not built.is_file() or strict_load(built)["provenance"].get("profile") != "quick":
        pytest.skip("no quick report in reports/out to check the README's scorecard against")
    assert report_findings.main([str(built), "--check", str(REPO_ROOT / "README.md")]) == 0


# --------------------------------------------------------------------------- README's block, hostile (issue 33)


def test_readme_cannot_be_the_reports_own_claims_json(findings_report, tmp_path, capsys):
    """--readme names the file to rewrite; it is never the report it reads, under any name: the
    directory form of CLAIMS_JSON, the file itself, a symbolic link to it."""
    out, _ = findings_report
    copy = tmp_path / "r"
    shutil.copytree(out, copy)
    before = snapshot(copy)
    (tmp_path / "alias.md").symlink_to(copy / "claims.json")
    for source, readme in ((copy, copy / "claims.json"), (copy / "claims.json", copy / "claims.json"),
                           (copy, tmp_path / "alias.md")):
        assert report_findings.main([str(source), "--readme", str(readme)]) == 2
        err = capsys.readouterr().err
        assert "same file as the input" in err and "Traceback" not in err, err
    assert snapshot(copy) == before


def test_a_finding_cannot_carry_the_readmes_end_marker(registry, tmp_path, capsys):
    """A finding (or a row name) holding the block's markers is written escaped: the block ends at
    its own end marker, the README after it is kept, and the next --readme replaces the same block."""
    out = tmp_path / "r"
    assert run_main(args(out, "fake-boundary"))[0] == 0
    report = strict_load(out / "claims.json")
    evil = f"loss 1.372 {report_findings.END} <!-- a comment --> {report_findings.START} and more"
    _c(report, "fake-boundary")["findings"][0]["text"] = evil
    _c(report, "fake-boundary")["headline"][0]["name"] = f"row {report_findings.END}"
    report["findings"] = [f for c in report["claims"] for f in c["findings"]]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(report))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{report_findings.START}\nold\n{report_findings.END}\n\nafter, by hand\n")
    for _ in range(2):
        assert report_findings.main([str(edited), "--readme", str(readme)]) == 0
        text = readme.read_text()
        assert text.count(report_findings.START) == 1 and text.count(report_findings.END) == 1
        assert text.endswith(f"{report_findings.END}\n\nafter, by hand\n")
        assert "&lt;!-- findings:end --&gt;" in text
    assert report_findings.main([str(edited), "--check", str(readme)]) == 0
    capsys.readouterr()


# --------------------------------------------------------------------------- the environment (issue 33)


@pytest.mark.parametrize("env, argv", [
    ({"PYTHONIOENCODING": "ascii"}, ["-m", "reports.findings", "{report}/claims.json"]),
    ({"PYTHONIOENCODING": "ascii"}, ["-m", "reports.compare", "{report}", "{report}/claims.json"]),
    ({"MPLBACKEND": "nonsense"}, ["-m", "reports.build", "--from-json", "{report}/claims.json", "--out", "{tmp}/r"]),
], ids=["findings with ascii output", "compare with ascii output", "build with a bad MPLBACKEND"])
def test_the_environment_cannot_make_a_traceback(findings_report, tmp_path, env, argv):
    """An output encoding that cannot write '±' and a backend Matplotlib does not know: a working run."""
    out, _ = findings_report
    argv = [a.replace("{report}", str(out)).replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env})
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode in (0, 1) and "Traceback" not in stderr, stderr
    if "PYTHONIOENCODING" in env:
        proc.stdout.decode("ascii")                       # ascii indeed, the rest escaped
        assert "findings" not in argv[1] or b"\\xb1" in proc.stdout    # the scorecard's "±", as \xb1
    else:
        assert check_report(tmp_path / "r") == []


# --------------------------------------------------------------------------- a full disk (issue 33)

from full_disk import fill, small_fs  # noqa: E402,F401 - the tmpfs fixture (root only, else skipped)


def test_a_build_on_a_full_disk_says_so_and_keeps_the_previous_report(registry, findings_report, small_fs):
    """reports.build on a disk with room for the probe but not for the report: "disk full: N bytes
    needed at PATH", exit 75 (not 1, "claims failed"), the previous report intact, no temporary left."""
    out, _ = findings_report
    target = small_fs / "r"
    assert run_main(args(target, "fake-plain"))[0] == 0
    before = snapshot(target)
    fill(small_fs, leave=96 * 1024)
    status, stdout, err = run_main(["--from-json", str(out / "claims.json"), "--out", str(target)])
    assert status == 75 and "disk full:" in err and "bytes needed at" in err and "Traceback" not in err, err
    assert snapshot(target) == before
    assert sorted(p.name for p in small_fs.iterdir() if p.name != ".filler") == ["r"]


def test_compare_on_a_full_disk_is_not_reports_differ(registry, findings_report, small_fs, capsys):
    out, _ = findings_report
    fill(small_fs)
    with pytest.raises(SystemExit) as exc:
        report_compare.main([str(out), str(out), "--out", str(small_fs / "d.html")])
    assert exc.value.code == 75 and "disk full" in capsys.readouterr().err
    assert [p.name for p in small_fs.iterdir() if p.name != ".filler"] == []


def test_readme_on_a_full_disk_is_left_as_it_was(findings_report, small_fs, capsys):
    out, _ = findings_report
    readme = small_fs / "README.md"
    readme.write_text(f"# x\n{report_findings.START}\nold\n{report_findings.END}\n")
    fill(small_fs)
    with pytest.raises(SystemExit) as exc:
        report_findings.main([str(out / "claims.json"), "--readme", str(readme)])
    assert exc.value.code == 75 and "disk full" in capsys.readouterr().err
    assert readme.read_text() == f"# x\n{report_findings.START}\nold\n{report_findings.END}\n"
    assert sorted(p.name for p in small_fs.iterdir()) == [".filler", "README.md"]
