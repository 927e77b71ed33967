"""Hostile inputs, round 2 (issue 22): nothing a user types can destroy a file, lose an output
or hang.  Three parts:

1. the one output-path policy of ``theory._validate`` (``check_output_path``,
   ``check_output_dir``, ``write_output``, ``check_input_file``, ``parse_int``) on real files:
   devices written through, FIFOs and sockets refused, links followed or refused, inputs never
   overwritten, permission bits those of the umask, nothing half-written;
2. ``HOSTILE``: a bad-input table of the command lines (numerics.train, theory, tools.bench,
   tools.sweep), run in-process like ``tests/test_bad_inputs.py``: exit status 2, the message
   names the flag (or the file), no traceback, no file created or changed, and the refusal comes
   before any computation (the compute entry points are replaced by a function that fails the
   test if it is called);
3. what must still work: an output that is a character device (/dev/null, or one made with
   mknod when root) written through and left a device, a symbolic link followed, a sweep
   with a FIFO in its points/ that neither hangs nor is read.

Every case that could block (a FIFO) runs under an alarm: a hang fails the test instead of
stalling the suite.
"""
from __future__ import annotations

import os
import signal
import socket
import stat
import time
from pathlib import Path

import pytest

import numerics.train as train_cli
import theory.__main__ as theory_cli
import tools.bench.cli as bench_cli
import tools.sweep.cli as sweep_cli
from theory import _validate as V
from tools.sweep import load_results, run_grid
from tools.sweep.grid import MAX_GRID_POINTS

MAINS = {"numerics.train": train_cli.main, "theory": theory_cli.main, "tools.bench": bench_cli.main,
         "tools.sweep": sweep_cli.main}
TRAIN = ["--tasks", "2", "--heads", "1", "--L", "8", "--batch", "8", "--time", "0.1", "--no-progress"]
TRAIN_OUT = TRAIN + ["--out", "{tmp}/run.json"]
PREDICT = ["predict", "--tasks", "2", "--heads", "1", "--L", "50"]
EXACT = ["exact", "--tasks", "3", "--L", "64"]
GRID_OK = '[problem]\ntasks = [2]\nheads = 1\nL = 8\n[train]\ntime = 0.1\nbatch = 8\nrecords = 2\n'
BIG = 2 ** 64


@pytest.fixture
def alarm():
    """Fail instead of hanging: SIGALRM after 30 s raises in the test."""
    def ring(signum, frame):
        raise TimeoutError("the command blocked (a FIFO opened for reading or writing?)")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _char_device(path: Path) -> bool:
    """A character device like /dev/null (c 1 3) at ``path``; False where this process may not
    make one (not root, or a container without CAP_MKNOD)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return True
    except (PermissionError, OSError):
        return False


def _tree(tmp: Path) -> dict:
    """Every entry under tmp (hidden temporaries included): kind, size, mode and mtime."""
    out = {}
    for p in tmp.rglob("*"):
        st = p.lstat()
        out[str(p.relative_to(tmp))] = (stat.S_IFMT(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0,
                                       st.st_mode, st.st_mtime_ns)
    return out


# --- 1. the output-path policy ---------------------------------------------------------------------

def test_new_and_existing_regular_files_are_accepted(tmp_path):
    assert V.check_output_path(tmp_path / "new.json", "--out") == tmp_path / "new.json"
    (tmp_path / "old.json").write_text("x")
    assert V.check_output_path(tmp_path / "old.json", "--out") == tmp_path / "old.json"
    assert list(tmp_path.iterdir()) == [tmp_path / "old.json"]      # the check creates nothing


@pytest.mark.parametrize("make,fragment", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: os.mkfifo(p), "is a FIFO (named pipe), not a regular file"),
    (lambda p: p.symlink_to(p.parent / "nowhere"), "a dangling link"),
    (lambda p: p.symlink_to(p), "symbolic link loop"),
    (lambda p: None, None),        # placeholder: replaced below by the missing parent
])
def test_paths_that_are_refused(tmp_path, make, fragment):
    target = tmp_path / "out.json"
    if fragment is None:
        target, fragment = tmp_path / "missing" / "out.json", "does not exist; create it first"
    else:
        make(target)
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match="--out") as exc:
        V.check_output_path(target, "--out")
    assert fragment in str(exc.value)
    assert _tree(tmp_path) == before


def test_a_socket_and_an_unwritable_directory_are_refused(tmp_path):
    sock_path = tmp_path / "s"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sock_path))
        with pytest.raises(ValueError, match="--out .* is a socket"):
            V.check_output_path(sock_path, "--out")
    finally:
        s.close()
    with pytest.raises(ValueError, match="--out /proc/x.json: cannot write in /proc"):
        V.check_output_path("/proc/x.json", "--out")


def test_inputs_are_never_outputs(tmp_path):
    grid = tmp_path / "a.json"
    grid.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(grid)
    for out in (grid, link, tmp_path / "." / "a.json"):
        with pytest.raises(ValueError, match="same file as the input .*inputs are never overwritten"):
            V.check_output_path(out, "--out", inputs=(grid,))
    # two paths that do not exist yet but are the same (a checkpoint and an --out)
    with pytest.raises(ValueError, match="same file as the input"):
        V.check_output_path(tmp_path / "c.ckpt", "--out", inputs=(str(tmp_path / "c.ckpt"),))


def test_a_symlink_to_a_file_is_followed_not_replaced(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    V.write_output(V.check_output_path(link, "--out"), "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_previous_marker_accepts_only_the_commands_own_file(tmp_path):
    mine, other = tmp_path / "mine.html", tmp_path / "other.html"
    mine.write_text("<!-- icl-attention-audit --> report")
    other.write_text("someone's notes")
    V.check_output_path(mine, "--out", previous_marker="icl-attention-audit")
    with pytest.raises(ValueError, match="not an output of this command"):
        V.check_output_path(other, "--out", previous_marker="icl-attention-audit")


def test_a_character_device_is_written_through(tmp_path):
    V.write_output(V.check_output_path("/dev/null", "--out"), "x" * 1000)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    dev = tmp_path / "null"
    if not _char_device(dev):
        pytest.skip("cannot mknod here (not root)")
    V.write_output(V.check_output_path(dev, "--out"), b"through")
    assert stat.S_ISCHR(os.lstat(dev).st_mode) and sorted(os.listdir(tmp_path)) == ["null"]


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_get_the_umask_default(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        V.write_output(tmp_path / "f.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f.json").st_mode) == mode


def test_replaced_files_keep_their_mode_and_nothing_half_written_is_left(tmp_path, monkeypatch):
    f = tmp_path / "f.json"
    f.write_text("old")
    f.chmod(0o640)
    V.write_output(f, "new")
    assert f.read_text() == "new" and stat.S_IMODE(f.stat().st_mode) == 0o640

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        V.write_output(f, "newer")
    assert f.read_text() == "new" and sorted(os.listdir(tmp_path)) == ["f.json"]


def test_stale_temporaries_are_cleaned_and_reported(tmp_path):
    stale = tmp_path / V.temporary_name("f.json")
    fresh = tmp_path / V.temporary_name("g.json")
    stale.write_text("half")
    fresh.write_text("half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert V.clean_stale_temporaries(tmp_path) == [stale]
    assert not stale.exists() and fresh.exists()
    # the next write of the same file removes its own stale temporary (a SIGKILLed writer's)
    os.utime(fresh, (time.time() - 7200, time.time() - 7200))
    V.write_output(tmp_path / "g.json", "{}")
    assert sorted(os.listdir(tmp_path)) == ["g.json"]


def test_output_directories(tmp_path):
    assert V.check_output_dir(tmp_path / "new", "--out", marker="points") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    V.check_output_dir(tmp_path / "empty", "--out", marker="points")
    own = tmp_path / "own"
    (own / "points").mkdir(parents=True)
    V.check_output_dir(own, "--out", marker="points")
    report = tmp_path / "report"
    report.mkdir()
    (report / "claims.json").write_text("{}")
    (report / "index.html").write_text("")
    for d, fragment in ((report, "not an output of this command"), (own, "holds a sweep")):
        marker = "points" if d is report else "claims.json"
        with pytest.raises(ValueError, match=f"--out {d} .*{fragment}"):
            V.check_output_dir(d, "--out", marker=marker)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ValueError, match="symbolic link loop"):
        V.check_output_dir(tmp_path / "loop", "--out", marker="points")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        V.check_output_dir(report / "claims.json", "--out", marker="points")
    with pytest.raises(ValueError, match="same file as the input"):
        V.check_output_dir(own, "--out", marker="points", inputs=(own,))
    assert sorted(os.listdir(report)) == ["claims.json", "index.html"]


@pytest.mark.parametrize("text", ["3_3", " 3", "3 ", "1e9", "2.5", "0x10", "", "３"])
def test_the_strict_integer_parser(text):
    with pytest.raises(ValueError, match="--heads must be a positive integer written in digits"):
        V.parse_int(text, "--heads", low=1)


def test_the_strict_integer_parser_accepts_digits_and_bounds():
    assert V.parse_int("+12", "--x") == 12 and V.parse_int("-3", "--x") == -3
    with pytest.raises(ValueError, match="--seed must be at most 18446744073709551615"):
        V.parse_int(str(BIG), "--seed", low=0, high=V.SEED_MAX)


def test_input_files_fifo_and_size(tmp_path, alarm):
    fifo = tmp_path / "grid.toml"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="--config .* is not a regular file .*FIFO"):
        V.read_input_bytes(fifo, "--config")
    huge = tmp_path / "huge.toml"
    with open(huge, "wb") as fh:          # 100 MB, sparse: costs no disk
        fh.truncate(100 * 2 ** 20)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="--config .* is 100.0 MiB, more than the limit of 16 MiB"):
        V.read_input_bytes(huge, "--config")
    assert time.perf_counter() - t0 < 1.0


# --- 2. the command lines: a bad-input table ---------------------------------------------------------

def _fixtures(tmp: Path) -> None:
    os.mkfifo(tmp / "fifo")
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    (tmp / "loop").symlink_to(tmp / "loop")
    (tmp / "ok.toml").write_text(GRID_OK)
    (tmp / "big.toml").write_text(GRID_OK + "[cross]\n" + "".join(
        f"{name} = [{', '.join(str(v) for v in values)}]\n"
        for name, values in (("seed", range(10)), ("init_seed", range(10)), ("basis_seed", range(10)),
                             ("checkpoint_every", range(1, 11)), ("logit_scale", range(1, 11)),
                             ("diverge_loss", range(1, 11)), ("lr", [0.01 * k for k in range(1, 11)]),
                             ("init_scale", [0.1 * k for k in range(1, 11)]),
                             ("sigma", [0.1 * k for k in range(10)]))))
    (tmp / "steps.toml").write_text(GRID_OK.replace("time = 0.1\n", "time = 1e18\n"))
    (tmp / "seed.toml").write_text(GRID_OK + f"[cross]\nseed = [0, {2 ** 64}]\n")
    (tmp / "lr.toml").write_text(GRID_OK.replace("time = 0.1\n", "time = 0.1\nlr = 1e-300\n"))
    os.mkfifo(tmp / "fifo.toml")
    with open(tmp / "huge.toml", "wb") as fh:
        fh.truncate(100 * 2 ** 20)
    report = tmp / "report"
    report.mkdir()
    (report / "claims.json").write_text("{}")
    (report / "index.html").write_text("<html></html>")
    (tmp / "notes").mkdir()
    (tmp / "notes" / "todo.txt").write_text("mine")
    sweep = tmp / "sweep_with_fifo_log"
    (sweep / "points").mkdir(parents=True)
    os.mkfifo(sweep / "log.jsonl")
    (tmp / "sweep_with_fifo_point" / "points").mkdir(parents=True)
    os.mkfifo(tmp / "sweep_with_fifo_point" / "points" / "0123456789abcdef.json")
    (tmp / "a_dir").mkdir()


BENCH_SMOKE = ["--smoke", "--no-progress"]

# (cli, argv, exit status, fragments of the message on stderr); {tmp}: the table's directory
HOSTILE = [
    # --- paths: devices, FIFOs, links, same path twice -----------------------------------------------
    ("numerics.train", TRAIN + ["--out", "{tmp}/fifo"], 2, ["--out", "FIFO"]),
    ("numerics.train", TRAIN + ["--out", "{tmp}/dangling"], 2, ["--out", "dangling link"]),
    ("numerics.train", TRAIN + ["--out", "{tmp}/loop"], 2, ["--out", "symbolic link loop"]),
    ("numerics.train", TRAIN + ["--out", "{tmp}/missing/run.json"], 2, ["--out", "does not exist"]),
    ("numerics.train", TRAIN_OUT + ["--checkpoint", "{tmp}/fifo"], 2, ["--checkpoint", "not a regular file"]),
    ("numerics.train", TRAIN_OUT + ["--checkpoint", "{tmp}/loop"], 2, ["--checkpoint", "symbolic link loop"]),
    ("numerics.train", TRAIN + ["--out", "{tmp}/same.ckpt", "--checkpoint", "{tmp}/same.ckpt"], 2,
     ["--out", "same file as the input", "inputs are never overwritten"]),
    ("theory", PREDICT + ["--out", "{tmp}/fifo"], 2, ["--out", "FIFO"]),
    ("theory", PREDICT + ["--out", "{tmp}/dangling"], 2, ["--out", "dangling link"]),
    ("theory", PREDICT + ["--out", "{tmp}/loop"], 2, ["--out", "symbolic link loop"]),
    ("theory", EXACT + ["--omega", "0.3", "--mu", "2", "--out", "{tmp}/a_dir"], 2, ["--out", "is a directory"]),
    ("theory", EXACT + ["--omega", "0.3", "--mu", "2", "--out", "{tmp}/fifo"], 2, ["--out", "FIFO"]),
    ("tools.bench", BENCH_SMOKE + ["--out", "{tmp}/fifo"], 2, ["--out", "FIFO"]),
    ("tools.bench", BENCH_SMOKE + ["--out", "{tmp}/dangling"], 2, ["--out", "dangling link"]),
    ("tools.bench", BENCH_SMOKE + ["--out", "{tmp}/loop"], 2, ["--out", "symbolic link loop"]),
    ("tools.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/report"], 2, ["--out", "not an output of this command"]),
    ("tools.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/notes"], 2, ["--out", "not an output of this command"]),
    ("tools.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/loop"], 2, ["--out", "symbolic link loop"]),
    ("tools.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/sweep_with_fifo_log"], 2,
     ["--out", "log.jsonl is a FIFO"]),
    ("tools.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/sweep_with_fifo_point"], 2,
     ["--out", "points/0123456789abcdef.json is not a regular file"]),
    ("tools.sweep", ["{tmp}/fifo.toml", "--out", "{tmp}/s"], 2, ["grid file", "not a regular file"]),
    # --- numbers: strict integers, step counts, threads, seeds -----------------------------------------
    ("numerics.train", TRAIN_OUT + ["--heads", "3_3"], 2, ["--heads", "written in digits"]),
    ("numerics.train", TRAIN_OUT + ["--batch", " 8"], 2, ["--batch", "written in digits"]),
    ("numerics.train", TRAIN_OUT + ["--tasks", "3_3"], 2, ["--tasks", "no spaces or underscores"]),
    ("numerics.train", TRAIN_OUT + ["--lr", "1_0"], 2, ["--lr", "without underscores"]),
    ("numerics.train", TRAIN_OUT + ["--time", "1e18"], 2, ["--time / --lr", "more than the limit"]),
    ("numerics.train", TRAIN_OUT + ["--lr", "1e-300"], 2, ["--time / --lr", "more than the limit"]),
    ("numerics.train", TRAIN_OUT + ["--threads", "100000"], 2, ["--threads must be at most", "CPUs"]),
    ("numerics.train", TRAIN_OUT + ["--seed", str(BIG)], 2, ["--seed must be at most", "64-bit"]),
    ("numerics.train", TRAIN_OUT + ["--seed", "-1"], 2, ["--seed must be an integer >= 0"]),
    ("numerics.train", TRAIN_OUT + ["--basis", "random", "--basis-seed", str(BIG)], 2, ["--basis-seed must be at most"]),
    ("numerics.train", TRAIN_OUT + ["--init-pattern", "random_full", "--init-seed", "-5"], 2,
     ["--init-seed must be an integer >= 0"]),
    ("numerics.train", TRAIN_OUT + ["--records", "2_0"], 2, ["--records", "written in digits"]),
    ("theory", ["predict", "--tasks", "3_3", "--heads", "1", "--L", "50"], 2, ["--tasks", "underscores"]),
    ("theory", PREDICT + ["--heads", "1_0"], 2, ["--heads", "written in digits"]),
    ("theory", PREDICT + ["--optimality", "--seed", "-1"], 2, ["--seed must be an integer >= 0"]),
    ("theory", PREDICT + ["--optimality", "--seed", str(BIG)], 2, ["--seed must be at most"]),
    ("theory", EXACT + ["--L", "6_4", "--omega", "0.3", "--mu", "2"], 2, ["--L", "written in digits"]),
    ("theory", EXACT + ["--omega", "0_3", "--mu", "2"], 2, ["--omega", "one number or an H x m matrix"]),
    ("tools.bench", ["--threads", "100000"], 2, ["--threads must be at most"]),
    ("tools.bench", ["--seed", "-1"], 2, ["--seed must be an integer >= 0"]),
    ("tools.bench", ["--repeats", "3_0"], 2, ["--repeats", "written in digits"]),
    ("tools.bench", ["--reduced-time", "1e18"], 2, ["--reduced-time", "more than the trainer's limit"]),
    ("tools.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/s", "--workers", "100000"], 2, ["--workers must be at most"]),
    ("tools.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/s", "--workers", "1_0"], 2, ["--workers", "written in digits"]),
    ("tools.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/s", "--retries", "-1"], 2, ["--retries must be an integer >= 0"]),
    ("tools.sweep", ["{tmp}/steps.toml", "--out", "{tmp}/s"], 2, ["steps.toml", "train.time / train.lr", "limit"]),
    ("tools.sweep", ["{tmp}/lr.toml", "--out", "{tmp}/s", "--dry-run"], 2, ["lr.toml", "train.time / train.lr"]),
    ("tools.sweep", ["{tmp}/seed.toml", "--out", "{tmp}/s", "--dry-run"], 2,
     ["seed.toml", "train.seed = 18446744073709551616 is not a seed"]),
    # --- sizes ---------------------------------------------------------------------------------------
    ("tools.sweep", ["{tmp}/big.toml", "--out", "{tmp}/s", "--dry-run"], 2,
     ["big.toml", "1,000,000,000 points", f"limit of {MAX_GRID_POINTS:,}"]),
    ("tools.sweep", ["{tmp}/huge.toml", "--out", "{tmp}/s"], 2, ["grid file", "more than the limit of 16 MiB"]),
    ("theory", ["predict", "--tasks", ",".join(["2"] * 1000), "--heads", "1000", "--L", "50"], 2,
     ["--heads must be at most 256"]),
    ("theory", ["predict", "--tasks", ",".join(["2"] * 1000), "--heads", "1", "--L", "50"], 2,
     ["--tasks has 1000 blocks, more than the limit of 32"]),
    ("theory", PREDICT + ["--dps", "100000"], 2, ["--dps must be at most 1000"]),
    ("theory", EXACT + ["--omega", "30", "--mu", "2"], 2, ["--omega", "beta = 424.3", "hard max"]),
    ("theory", EXACT + ["--omega", "100", "--mu", "2"], 2, ["--omega", "beyond what the exact quadrature handles"]),
    ("theory", EXACT + ["--omega", "1e300", "--mu", "2"], 2, ["--omega", "beta = inf"]),
    ("theory", EXACT + ["--omega", "30", "--mu", "2", "--gradient"], 2, ["--omega", "beta = 424.3"]),
    # --- options that would be ignored ---------------------------------------------------------------
    ("theory", EXACT + ["--gain"], 2, ["--gain is used only with --fixed-point"]),
    ("theory", EXACT + ["--fixed-point", "--omega", "1"], 2, ["--fixed-point", "ignores --omega"]),
    ("theory", EXACT + ["--fixed-point", "--gradient"], 2, ["--fixed-point", "ignores --gradient"]),
    ("theory", EXACT + ["--benchmark", "--sigma", "0.5"], 2, ["--benchmark", "ignores --sigma"]),
    ("theory", PREDICT + ["--seed", "3"], 2, ["--seed", "ignored without it", "--optimality"]),
    ("tools.bench", BENCH_SMOKE + ["--reduced-time", "0.5"], 2, ["--smoke", "would ignore --reduced-time"]),
    ("tools.bench", BENCH_SMOKE + ["--repeats", "3"], 2, ["--smoke", "would ignore --repeats"]),
    ("tools.bench", BENCH_SMOKE + ["--expansion-time", "1"], 2, ["--smoke", "would ignore --expansion-time"]),
    ("tools.bench", ["--report-timeout", "10"], 2, ["--report-timeout is used only with --report-profiles"]),
    ("numerics.train", TRAIN_OUT + ["--basis-seed", "3"], 2, ["--basis-seed is used only with --basis random"]),
    ("numerics.train", TRAIN_OUT + ["--init-seed", "3"], 2, ["--init-seed is used only"]),
    ("numerics.train", TRAIN_OUT + ["--param", "merged", "--logit-scale", "2"], 2,
     ["--logit-scale is used only with --param factored"]),
    ("numerics.train", TRAIN_OUT + ["--checkpoint-every", "5"], 2, ["--checkpoint-every is used only with --checkpoint"]),
]


def _ids():
    seen: dict = {}
    out = []
    for cli, argv, _, _ in HOSTILE:
        flags = [a for a in argv if a.startswith("--") and a not in ("--no-progress", "--smoke")]
        name = f"{cli}:{flags[-1] if flags else argv[0]}"
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    _fixtures(tmp)
    return tmp


@pytest.fixture
def no_compute(monkeypatch):
    """The compute entry points of the four CLIs fail the test if reached: every refusal of
    the table must come before any computation."""
    def computed(*a, **k):
        raise AssertionError("the command computed before refusing its input")

    for mod, name in ((train_cli, "train"), (train_cli, "train_reduced"), (theory_cli, "predict"),
                      (theory_cli, "exact"), (bench_cli, "run_bench"), (sweep_cli, "run_grid")):
        monkeypatch.setattr(mod, name, computed)


def _run_main(cli: str, argv: list[str]) -> int:
    try:
        code = MAINS[cli](argv)
    except SystemExit as exc:
        code = exc.code
    return 0 if code is None or isinstance(code, dict) else code


def test_the_table_covers_every_cli_and_class():
    assert len(HOSTILE) >= 60
    assert {c[0] for c in HOSTILE} == set(MAINS)


@pytest.mark.parametrize("cli,argv,code,fragments", HOSTILE, ids=_ids())
def test_hostile_input_is_refused_before_any_compute(cli, argv, code, fragments, hostile_dir, no_compute, alarm,
                                                      capsys):
    tmp = hostile_dir
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    before = _tree(tmp)
    t0 = time.perf_counter()
    got = _run_main(cli, argv)
    err = capsys.readouterr().err
    assert got == code, err
    for fragment in fragments:
        assert fragment in err, err
    assert "Traceback" not in err
    assert time.perf_counter() - t0 < 20, "a refusal must not take long"
    assert _tree(tmp) == before                  # nothing created, changed or half-written


# --- 3. what must still work ------------------------------------------------------------------------

def test_train_writes_through_a_device_and_refuses_nothing_else(tmp_path, capsys):
    """``--out /dev/null`` (and a device made with mknod, as root) stays a character device."""
    outs = ["/dev/null"]
    if _char_device(tmp_path / "dev"):
        outs.append(str(tmp_path / "dev"))
    for out in outs:
        assert train_cli.main(TRAIN + ["--out", out]) == 0, capsys.readouterr().err
        assert stat.S_ISCHR(os.lstat(out).st_mode)
    assert sorted(os.listdir(tmp_path)) == (["dev"] if len(outs) == 2 else [])


def test_predict_follows_a_link_and_writes_through_a_device(tmp_path, capsys):
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "p.json"
    link.symlink_to(target)
    old = os.umask(0o022)
    try:
        assert theory_cli.main(PREDICT + ["--out", str(link)]) == 0
        assert theory_cli.main(PREDICT + ["--out", str(tmp_path / "new.json")]) == 0
    finally:
        os.umask(old)
    assert link.is_symlink() and '"limit_multi"' in target.read_text()
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644      # not 0600
    dev = tmp_path / "dev"
    if _char_device(dev):
        assert theory_cli.main(PREDICT + ["--out", str(dev)]) == 0
        assert stat.S_ISCHR(os.lstat(dev).st_mode)
    capsys.readouterr()


def test_exact_json_is_strict_and_bench_accepts_a_device(tmp_path):
    import json

    text = theory_cli.json_text({"loss": float("inf"), "rows": [1.0, float("nan")]})

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    data = json.loads(text, parse_constant=refuse)      # strict JSON: no Infinity/NaN tokens
    assert data["loss"] is None and data["rows"] == [1.0, None] and len(data["non_finite"]["values"]) == 2
    assert bench_cli.parse_args(["--smoke", "--out", "/dev/null"]).out == "/dev/null"


def test_bench_writes_its_json_through_a_device(tmp_path, monkeypatch, capsys):
    """tools.bench --smoke --out DEVICE: the device stays a device (the timing itself is
    replaced by a stub: the writer is under test)."""
    monkeypatch.setattr(bench_cli, "run_bench", lambda bc: {"stub": 1.0})
    monkeypatch.setattr(bench_cli, "render", lambda res: "stub")
    dev = tmp_path / "dev"
    outs = ["/dev/null"] + ([str(dev)] if _char_device(dev) else [])
    for out in outs:
        bench_cli.main(["--smoke", "--no-progress", "--out", out])
        assert stat.S_ISCHR(os.lstat(out).st_mode)
    bench_cli.main(["--smoke", "--no-progress", "--out", str(tmp_path / "b.json")])
    assert (tmp_path / "b.json").read_text().startswith("{")
    capsys.readouterr()


def fast_point(point: dict) -> dict:
    """A point function that returns at once (the sweep's bookkeeping is under test)."""
    return {"seed": point["train"]["seed"]}


def test_a_fifo_in_points_neither_hangs_nor_is_read(tmp_path, alarm):
    from tools.sweep import expand_grid, point_id

    points = expand_grid({"problem": {"tasks": [2], "heads": 1, "L": 8}, "train": {"time": 0.1, "batch": 8},
                          "cross": {"seed": [0, 1]}})
    fn = f"{__name__}:fast_point"
    (tmp_path / "points").mkdir()
    fifo = tmp_path / "points" / f"{point_id(points[0], point_fn=fn)}.json"
    os.mkfifo(fifo)
    assert load_results(tmp_path) == []                    # the FIFO is skipped, unread
    with pytest.raises(ValueError, match=f"points/{fifo.name} is not a regular file"):
        run_grid(points, tmp_path, scheduler="serial", progress=False, point_fn=fn)
    assert sorted(os.listdir(tmp_path)) == ["points"] and not fifo.is_file()   # refused before anything ran
    fifo.unlink()
    assert run_grid(points, tmp_path, scheduler="serial", progress=False, point_fn=fn).done == 2
    assert len(load_results(tmp_path)) == 2
