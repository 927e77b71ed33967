"""Hostile inputs, round 2 (issue 22): nothing a user types can destroy a file, lose an output
or hang.  Five parts:

1. the one output-path policy of ``numerics.io`` (``check_output_path``,
   ``check_output_dir``, ``write_output``, ``check_input_file``, ``parse_int``) on real files:
   devices written through, FIFOs and sockets refused, links followed or refused, inputs never
   overwritten, permission bits those of the umask, nothing half-written;
2. ``HOSTILE``: a bad-input table of the command lines (numerics.train, reports.theory, numerics.bench,
   numerics.sweep), run in-process like ``tests/test_bad_inputs.py``: exit status 2, the message
   names the flag (or the file), no traceback, no file created or changed, and the refusal comes
   before any computation (the compute entry points are replaced by a function that fails the
   test if it is called);
3. what must still work: an output that is a character device (/dev/null, or one made with
   mknod when root) written through and left a device, a symbolic link followed, a sweep
   with a FIFO in its points/ that neither hangs nor is read;
4. a handed folder, a forged store, a full disk, a killed parent, the environment;
5. handed files (numerics.checkpoint, the reader contract): crafted checkpoints (safetensors, npz,
   torch, run.json) and reports read back, each through its command (reports.audit,
   numerics.train --checkpoint, reports.build --from-json, reports.findings, reports.compare)
   in a worker under resource limits: exit 2, one line naming the file and the problem, no
   traceback, bounded CPU seconds and memory, nothing written;
6. the edges of every command: the audit's budget before its work (an input accepted, then
   failing or taking hours inside it: refused in one line, in the same worker), weights that
   overflow, degenerate time axes; every command wrapped alike (a closed pipe, an ascii
   terminal, a full disk, a deleted directory, a path 1,900 levels deep); writers of one --out
   taking turns.

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
import reports.theory as theory_cli
import numerics.bench as bench_cli
import numerics.sweep as sweep_cli
from numerics import io as V
from numerics.sweep import load_results, run_grid
from numerics.sweep.grid import MAX_GRID_POINTS

MAINS = {"numerics.train": train_cli.main, "reports.theory": theory_cli.main, "numerics.bench": bench_cli.main,
         "numerics.sweep": sweep_cli.main}
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
    (tmp / "date.toml").write_text(GRID_OK.replace("L = 8\n", "L = 8\nsigma = 1979-05-27\n"))
    (tmp / "date_cross.toml").write_text(GRID_OK + "[cross]\nseed = [0, 1979-05-27T07:32:00]\n")
    (tmp / "negzero.toml").write_text(GRID_OK + "[cross]\nsigma = [0.0, -0.0]\n")
    (tmp / "table.toml").write_text(GRID_OK.replace("L = 8\n", "L = 8\nsigma = {value = 0.5}\n"))


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
    ("reports.theory", PREDICT + ["--out", "{tmp}/fifo"], 2, ["--out", "FIFO"]),
    ("reports.theory", PREDICT + ["--out", "{tmp}/dangling"], 2, ["--out", "dangling link"]),
    ("reports.theory", PREDICT + ["--out", "{tmp}/loop"], 2, ["--out", "symbolic link loop"]),
    ("reports.theory", EXACT + ["--omega", "0.3", "--mu", "2", "--out", "{tmp}/a_dir"], 2, ["--out", "is a directory"]),
    ("reports.theory", EXACT + ["--omega", "0.3", "--mu", "2", "--out", "{tmp}/fifo"], 2, ["--out", "FIFO"]),
    ("numerics.bench", BENCH_SMOKE + ["--out", "{tmp}/fifo"], 2, ["--out", "FIFO"]),
    ("numerics.bench", BENCH_SMOKE + ["--out", "{tmp}/dangling"], 2, ["--out", "dangling link"]),
    ("numerics.bench", BENCH_SMOKE + ["--out", "{tmp}/loop"], 2, ["--out", "symbolic link loop"]),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/report"], 2, ["--out", "not an output of this command"]),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/notes"], 2, ["--out", "not an output of this command"]),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/loop"], 2, ["--out", "symbolic link loop"]),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/sweep_with_fifo_log"], 2,
     ["--out", "log.jsonl is a FIFO"]),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/sweep_with_fifo_point"], 2,
     ["--out", "points/0123456789abcdef.json is not a regular file"]),
    ("numerics.sweep", ["{tmp}/fifo.toml", "--out", "{tmp}/s"], 2, ["grid file", "not a regular file"]),
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
    ("reports.theory", ["predict", "--tasks", "3_3", "--heads", "1", "--L", "50"], 2, ["--tasks", "underscores"]),
    ("reports.theory", PREDICT + ["--heads", "1_0"], 2, ["--heads", "written in digits"]),
    ("reports.theory", PREDICT + ["--optimality", "--seed", "-1"], 2, ["--seed must be an integer >= 0"]),
    ("reports.theory", PREDICT + ["--optimality", "--seed", str(BIG)], 2, ["--seed must be at most"]),
    ("reports.theory", EXACT + ["--L", "6_4", "--omega", "0.3", "--mu", "2"], 2, ["--L", "written in digits"]),
    ("reports.theory", EXACT + ["--omega", "0_3", "--mu", "2"], 2, ["--omega", "one number or an H x m matrix"]),
    ("numerics.bench", ["--threads", "100000"], 2, ["--threads must be at most"]),
    ("numerics.bench", ["--seed", "-1"], 2, ["--seed must be an integer >= 0"]),
    ("numerics.bench", ["--repeats", "3_0"], 2, ["--repeats", "written in digits"]),
    ("numerics.bench", ["--reduced-time", "1e18"], 2, ["--reduced-time", "more than the trainer's limit"]),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/s", "--workers", "100000"], 2, ["--workers must be at most"]),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/s", "--workers", "1_0"], 2, ["--workers", "written in digits"]),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/s", "--retries", "-1"], 2, ["--retries must be an integer >= 0"]),
    ("numerics.sweep", ["{tmp}/steps.toml", "--out", "{tmp}/s"], 2, ["steps.toml", "train.time / train.lr", "limit"]),
    ("numerics.sweep", ["{tmp}/lr.toml", "--out", "{tmp}/s", "--dry-run"], 2, ["lr.toml", "train.time / train.lr"]),
    ("numerics.sweep", ["{tmp}/seed.toml", "--out", "{tmp}/s", "--dry-run"], 2,
     ["seed.toml", "train.seed = 18446744073709551616 is not a seed"]),
    # --- sizes ---------------------------------------------------------------------------------------
    ("numerics.sweep", ["{tmp}/big.toml", "--out", "{tmp}/s", "--dry-run"], 2,
     ["big.toml", "1,000,000,000 points", f"limit of {MAX_GRID_POINTS:,}"]),
    ("numerics.sweep", ["{tmp}/huge.toml", "--out", "{tmp}/s"], 2, ["grid file", "more than the limit of 16 MiB"]),
    ("reports.theory", ["predict", "--tasks", ",".join(["2"] * 1000), "--heads", "1000", "--L", "50"], 2,
     ["--heads must be at most 256"]),
    ("reports.theory", ["predict", "--tasks", ",".join(["2"] * 1000), "--heads", "1", "--L", "50"], 2,
     ["--tasks has 1000 blocks, more than the limit of 32"]),
    ("reports.theory", EXACT + ["--omega", "30", "--mu", "2"], 2, ["--omega", "beta = 424.3", "hard max"]),
    ("reports.theory", EXACT + ["--omega", "100", "--mu", "2"], 2, ["--omega", "beyond what the exact quadrature is built for"]),
    ("reports.theory", EXACT + ["--omega", "1e300", "--mu", "2"], 2, ["--omega", "beta = inf"]),
    # --- round 3 (issue 33): values of the wrong kind, a directory named as a file, the size limits ------
    ("numerics.sweep", ["{tmp}/date.toml", "--out", "{tmp}/s"], 2, ["problem.sigma = 1979-05-27 is a TOML date"]),
    ("numerics.sweep", ["{tmp}/date_cross.toml", "--out", "{tmp}/s"], 2, ["seed = 1979-05-27 07:32:00 is a TOML date-time"]),
    ("numerics.sweep", ["{tmp}/date.toml", "--out", "{tmp}/s", "--dry-run"], 2, ["is a TOML date"]),
    ("numerics.sweep", ["{tmp}/table.toml", "--out", "{tmp}/s"], 2, ["problem.sigma = {'value': 0.5} is a table"]),
    ("numerics.sweep", ["{tmp}/negzero.toml", "--out", "{tmp}/s"], 2, ["repeats a value", "0.0 and -0.0, are one value"]),
    ("reports.theory", PREDICT + ["--out", "{tmp}/newdir/"], 2, ["--out", "ends with '/'", "names a directory"]),
    ("reports.theory", PREDICT + ["--out", "{tmp}/a_dir/"], 2, ["--out", "ends with '/'"]),
    ("numerics.train", TRAIN + ["--out", "{tmp}/newdir/"], 2, ["--out", "ends with '/'"]),
    ("numerics.bench", BENCH_SMOKE + ["--out", "{tmp}/newdir/"], 2, ["--out", "ends with '/'"]),
    ("reports.theory", ["predict", "--tasks", ",".join(["2"] * 33), "--heads", "33", "--L", "50"], 2,
     ["--tasks has 33 blocks, more than the limit of 32"]),
    ("reports.theory", ["predict", "--tasks", ",".join(["2"] * 8), "--heads", "8", "--L", "50", "--optimality"], 2,
     ["--optimality at 8 tasks x 8 heads = 64, more than the limit of 32"]),
    # --- options that would be ignored ---------------------------------------------------------------
    ("reports.theory", EXACT + ["--fixed-point", "--omega", "1"], 2, ["--fixed-point", "ignores --omega"]),
    ("reports.theory", PREDICT + ["--seed", "3"], 2, ["--seed", "ignored without it", "--optimality"]),
    ("numerics.bench", BENCH_SMOKE + ["--reduced-time", "0.5"], 2, ["--smoke", "would ignore --reduced-time"]),
    ("numerics.bench", BENCH_SMOKE + ["--repeats", "3"], 2, ["--smoke", "would ignore --repeats"]),
    ("numerics.bench", BENCH_SMOKE + ["--expansion-time", "1"], 2, ["--smoke", "would ignore --expansion-time"]),
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


def test_exact_json_is_strict_and_bench_accepts_a_device(monkeypatch, capsys):
    """A non-finite number in an answer is written as the string "inf" / "nan" (strict JSON: no
    Infinity/NaN tokens), so that the output always parses."""
    import json

    monkeypatch.setattr(theory_cli, "exact", lambda args: {"loss": float("inf"), "rows": [1.0, float("nan")]})
    assert theory_cli.main(EXACT + ["--omega", "0.3", "--mu", "2"]) == 0

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    data = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert data == {"loss": "inf", "rows": [1.0, "nan"]}
    assert bench_cli.parse_args(["--smoke", "--out", "/dev/null"]).out == "/dev/null"


def test_bench_writes_its_json_through_a_device(tmp_path, monkeypatch, capsys):
    """numerics.bench --smoke --out DEVICE: the device stays a device (the timing itself is
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
    from numerics.sweep import expand_grid, point_id

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


# --- 4. round 3 (issue 33): a handed folder, a forged store, a full disk, a killed parent -----------
#
# The classes of the issue, each fixed once at its root: one link policy inside a folder the command
# writes (numerics.io.write_inside & co.), one reader of a stored point (numerics.stored.read_point),
# one disk-full path (DiskFull, exit 75), one way for workers to die with their command
# (die_with_parent).

import errno  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from numerics.stored import code_version, point_id, read_point  # noqa: E402
from numerics.sweep import expand_grid  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAST = f"{__name__}:fast_point"
VICTIM_TEXT = "export PATH=/usr/bin  # a shell start-up file\n"


def _victim(tmp: Path) -> Path:
    victim = tmp / "victim" / ".bashrc"
    victim.parent.mkdir(exist_ok=True)
    victim.write_text(VICTIM_TEXT)
    return victim


def _stale(path: Path) -> Path:
    os.utime(path, (time.time() - 7200, time.time() - 7200), follow_symlinks=False)
    return path


def _points(seeds=(0, 1)) -> list:
    return expand_grid({"problem": {"tasks": [2], "heads": 1, "L": 8}, "train": {"time": 0.1, "batch": 8},
                        "cross": {"seed": list(seeds)}})


# 4a. links inside the sweep's --out: refused before anything runs, never followed ---------------

SWEEP_LINKS = ["grid.toml", "summary.json", "log.jsonl", "points/{id}.json", "points", "summary.json:dangling"]


@pytest.mark.parametrize("entry", SWEEP_LINKS)
def test_a_link_inside_the_sweeps_folder_is_refused_never_followed(tmp_path, entry, capsys):
    """A handed sweep directory whose own files are symbolic links (to a shell start-up file, to a
    directory of the user's, to a file that does not exist yet): the sweep refuses it -- through the
    command line and through run_grid -- and the target is neither written, created nor cleaned."""
    victim = _victim(tmp_path)
    stale = victim.parent / V.temporary_name("notes.json")   # would be "cleaned" through a link
    stale.write_text("the user's")
    _stale(stale)
    out = tmp_path / "s"
    (out / "points").mkdir(parents=True)
    points = _points()
    name, _, how = entry.partition(":")
    name = name.format(id=point_id(points[0], point_fn=FAST))
    link = out / name
    if name == "points":
        (out / "points").rmdir()
        link.symlink_to(victim.parent, target_is_directory=True)
    else:
        link.symlink_to(victim if how != "dangling" else victim.parent / "new.rc")
    before = _tree(tmp_path / "victim")
    grid = tmp_path / "g.toml"
    grid.write_text(GRID_OK)
    assert sweep_cli.main([str(grid), "--out", str(out), "--scheduler", "serial", "--point-fn", FAST,
                           "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and "never follows a link" in err and "Traceback" not in err, err
    with pytest.raises(ValueError, match="is a symbolic link"):
        run_grid(points, out, scheduler="serial", progress=False, point_fn=FAST, grid_text=GRID_OK)
    assert _tree(tmp_path / "victim") == before and victim.read_text() == VICTIM_TEXT
    assert not (victim.parent / "new.rc").exists()


def test_links_swapped_in_after_the_check_are_still_refused(tmp_path, alarm):
    """The policy holds at the write itself (O_NOFOLLOW through directory descriptors), not only in
    the check before the run: a link put in place of a file, of a directory on the way, or a FIFO."""
    victim = _victim(tmp_path)
    folder = tmp_path / "f"
    (folder / "points").mkdir(parents=True)
    (folder / "a.json").symlink_to(victim)
    (folder / "sub").symlink_to(victim.parent, target_is_directory=True)
    os.mkfifo(folder / "fifo.jsonl")
    cases = [(V.write_inside, (folder, "a.json", "x")), (V.write_inside, (folder, "sub/b.json", "x")),
             (V.append_inside, (folder, "a.json", "x\n")), (V.append_inside, (folder, "sub/log", "x\n")),
             (V.append_inside, (folder, "fifo.jsonl", "x\n")), (V.read_inside, (folder, "a.json", "f")),
             (V.read_inside, (folder, "fifo.jsonl", "f")), (V.make_dirs_inside, (folder, "sub/deeper"))]
    for fn, argv in cases:
        with pytest.raises(V.LinkInside):
            fn(*argv)
    assert sorted(os.listdir(victim.parent)) == [".bashrc"] and victim.read_text() == VICTIM_TEXT
    V.write_inside(folder, "points/ok.json", "{}")                # and what is sound still works
    V.append_inside(folder, "log.jsonl", "one\n")
    assert V.read_inside(folder, "points/ok.json", "f") == b"{}" and (folder / "log.jsonl").read_text() == "one\n"


def test_a_report_temporary_is_written_without_following_links(tmp_path):
    from reports.build import new_temporary, write_tree

    victim = _victim(tmp_path)
    tmp = new_temporary(tmp_path / "r")
    (tmp / "figures").symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(V.LinkInside):
        write_tree(tmp, {"figures/forest.png": b"\x89PNG"})
    assert sorted(os.listdir(victim.parent)) == [".bashrc"]


# 4b. deleting only what the project made -----------------------------------------------------------

def _hard_link(d: Path, victim: Path) -> Path:
    link = d / V.temporary_name("h.json")
    os.link(victim, link)
    return link


STALE_LOOKALIKES = [
    # (what, make(points dir, victim) -> path): old enough, but not the project's own temporary
    ("an editor's .notes.tmp (the old pattern)", lambda d, v: _write(d / ".notes.tmp")),
    ("a .x.json.123.tmp (the old pattern)", lambda d, v: _write(d / ".x.json.123.tmp")),
    ("an unmarked .icl-tmp- name", lambda d, v: _write(d / (V.TEMP_PREFIX + "f.json.123.abcdef12"))),
    ("a .icl-tmp- name with a forged mark", lambda d, v: _write(d / (V.TEMP_PREFIX + "f.json.123.abcdef12.00000000"))),
    ("a marked name that is a hard link to the user's file", _hard_link),
    ("a marked name that is a symbolic link", lambda d, v: _symlink(d / V.temporary_name("s.json"), v)),
    ("a marked name that is a directory", lambda d, v: _mkdir(d / V.temporary_name("d.json"))),
]


def _write(path: Path) -> Path:
    path.write_text("the user's")
    return path


def _symlink(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


def _mkdir(path: Path) -> Path:
    path.mkdir()
    (path / "inside").write_text("the user's")
    return path


@pytest.mark.parametrize("what, make", STALE_LOOKALIKES, ids=[c[0] for c in STALE_LOOKALIKES])
def test_the_cleaner_deletes_only_the_projects_own_temporaries(tmp_path, what, make):
    victim = _victim(tmp_path)
    points = tmp_path / "s" / "points"
    points.mkdir(parents=True)
    kept = _stale(make(points, victim))
    mine = _stale(_write(points / V.temporary_name("0123456789abcdef.json")))     # a killed writer's
    assert V.clean_stale_temporaries(points) == [mine]
    assert os.path.lexists(kept) and victim.read_text() == VICTIM_TEXT
    run_grid(_points((0,)), tmp_path / "s", scheduler="serial", progress=False, point_fn=FAST)
    assert os.path.lexists(kept) and victim.read_text() == VICTIM_TEXT


def test_the_cleaner_never_cleans_through_a_symlinked_folder(tmp_path):
    victim = _victim(tmp_path)
    theirs = _stale(_write(victim.parent / V.temporary_name("x.json")))
    link = tmp_path / "points"
    link.symlink_to(victim.parent, target_is_directory=True)
    assert V.clean_stale_temporaries(link) == [] and theirs.exists()


# 4c. a handed store: a point is used only if everything that identifies it matches ----------------

def _record(point: dict, code=None, fn=FAST) -> dict:
    code = code_version() if code is None else code
    return {"id": point_id(point, code=code, point_fn=fn), "status": "done", "point": point, "result": {"loss": 0.5},
            "error": None, "code_version": code, "point_fn": fn}


def _huge(path: Path) -> None:
    with open(path, "wb") as fh:          # 1.5 GB, sparse: costs no disk
        fh.truncate(1536 * 2 ** 20)


POINT_FILES = [
    # (what, write(points dir, a sound record) -> file name, fragment of the reason)
    ("renamed: its id is not its file name", lambda d, r: _put(d, "0" * 16, r), "is not its file name"),
    ("edited: its point is not what its id hashes",
     lambda d, r: _put(d, r["id"], {**r, "point": {**r["point"], "model": "reduced"}}), "not the hash of its own point"),
    ("another code version (self-consistent)", lambda d, r: _put(d, None, _record(r["point"], code="0.0.1+src.0")),
     "computed by training code 0.0.1+src.0"),
    ("no code version at all", lambda d, r: _put(d, r["id"], {k: v for k, v in r.items() if k != "code_version"}),
     "records no code version"),
    ("truncated by a kill", lambda d, r: _raw(d, r["id"], json.dumps(r)[:40]), "not valid JSON"),
    ("a NaN token", lambda d, r: _raw(d, r["id"], json.dumps(r).replace('"loss": 0.5', '"loss": NaN')),
     "not valid JSON"),
    ("not UTF-8", lambda d, r: _raw(d, r["id"], b"\xff\xfe{}"), "not UTF-8"),
    ("a loss beyond the float range", lambda d, r: _raw(d, r["id"], json.dumps(r).replace('"loss": 0.5', '"loss": 1e400')),
     "1e400 is beyond the range of a float"),
    ("a loss stored as the text 'nan'", lambda d, r: _put(d, r["id"], {**r, "result": {"loss": "nan"}}),
     "its result's loss is 'nan', not a finite number"),
    ("a loss that is a list", lambda d, r: _put(d, r["id"], {**r, "result": {"loss": [0.5]}}),
     "its result's loss is a list"),
    ("neither a result nor an error", lambda d, r: _put(d, r["id"], {**r, "result": None}), "not a finished point"),
    ("a name that is no point id", lambda d, r: _put(d, "notes", r), "not a point file"),
    ("a symbolic link to a sound point elsewhere", lambda d, r: _link_point(d, r), "is a symbolic link"),
    ("1.5 GB (refused before a byte is read)", lambda d, r: (_huge(d / f"{r['id']}.json"), f"{r['id']}.json")[1],
     "more than the limit of 256 MiB"),
]


def _put(d: Path, name, record) -> str:
    name = (record["id"] if name is None else name) + ".json"
    (d / name).write_text(json.dumps(record))
    return name


def _raw(d: Path, pid: str, data) -> str:
    (d / f"{pid}.json").write_bytes(data if isinstance(data, bytes) else data.encode())
    return f"{pid}.json"


def _link_point(d: Path, r: dict) -> str:
    elsewhere = d.parent.parent / "elsewhere.json"
    elsewhere.write_text(json.dumps(r))
    (d / f"{r['id']}.json").symlink_to(elsewhere)
    return f"{r['id']}.json"


@pytest.mark.parametrize("what, write, reason", POINT_FILES, ids=[c[0] for c in POINT_FILES])
def test_a_point_is_used_only_if_it_identifies_itself(tmp_path, what, write, reason, alarm):
    """numerics.stored.read_point, the one reader (the library's Store, the report's warnings, the
    sweep's resume): a point file whose name, hash, code version, size or kind is not right is
    skipped with why -- and trained again -- never used."""
    from numerics.experiments import Store

    points = tmp_path / "s" / "points"
    points.mkdir(parents=True)
    sound = _record(_points((0,))[0])
    name = write(points, sound)
    t0 = time.perf_counter()
    record, why = read_point(tmp_path / "s", name, code=code_version())
    assert record is None and reason in why and time.perf_counter() - t0 < 5, why
    store = Store(tmp_path / "s")
    assert store.records == [] and [s["reason"] for s in store.skipped] == [why]


def test_a_resumed_sweep_reruns_an_edited_point_and_keeps_a_sound_one(tmp_path):
    points = _points()
    out = tmp_path / "s"
    assert run_grid(points, out, scheduler="serial", progress=False, point_fn=FAST).done == 2
    files = sorted((out / "points").glob("*.json"))
    forged = json.loads(files[0].read_text())
    forged["point"]["problem"]["L"] = 64                      # its id no longer its hash
    files[0].write_text(json.dumps(forged))
    again = run_grid(points, out, scheduler="serial", progress=False, point_fn=FAST)
    assert (again.done, again.skipped) == (1, 1)
    assert all(read_point(out, f.name)[0] is not None for f in files)


# 4d. a full disk: "disk full: N bytes needed at PATH", exit 75, nothing half-written ----------------

def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_one_error_and_leaves_the_old_content(tmp_path, monkeypatch):
    """Simulated (every machine): fsync reports ENOSPC, as a delayed-allocation file system does."""
    f = tmp_path / "f.json"
    f.write_text("old")
    monkeypatch.setattr(V.os, "fsync", _enospc)
    for write in (lambda: V.write_output(f, "x" * 5000), lambda: V.write_inside(tmp_path, "f.json", "x" * 5000)):
        with pytest.raises(V.DiskFull, match=f"disk full: 5,000 bytes needed at {tmp_path}/f.json"):
            write()
        assert f.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["f.json"]
    with pytest.raises(V.DiskFull, match="disk full: 65,536 bytes needed at"):
        V.check_output_path(tmp_path / "new.json", "--out")       # the probe writes (and syncs) a block
    assert sorted(os.listdir(tmp_path)) == ["f.json"]


def test_a_log_line_is_whole_or_absent(tmp_path, monkeypatch):
    V.append_inside(tmp_path, "log.jsonl", "first\n")
    real = os.write
    calls = []

    def half_then_full(fd, data):
        if calls:
            raise OSError(errno.ENOSPC, "No space left on device")
        calls.append(1)
        return real(fd, bytes(data)[:3])

    monkeypatch.setattr(V.os, "write", half_then_full)
    with pytest.raises(V.DiskFull):
        V.append_inside(tmp_path, "log.jsonl", "second line\n")
    assert (tmp_path / "log.jsonl").read_text() == "first\n"


def test_every_command_line_turns_enospc_into_exit_75(capsys):
    @V.command_line
    def main(argv=None):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.json")

    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == V.EXIT_DISK_FULL == 75
    err = capsys.readouterr().err
    assert "disk full" in err and "/data/out.json" in err and "Traceback" not in err


from full_disk import fill, small_fs  # noqa: E402,F401 - the tmpfs fixture (root only, else skipped)


def _listing(mnt: Path) -> list:
    return sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*") if ".filler" not in p.parts)


def test_on_a_real_full_disk_the_probe_refuses_up_front(small_fs, capsys):
    fill(small_fs)
    with pytest.raises(V.DiskFull, match="disk full: 65,536 bytes needed at"):
        V.check_output_path(small_fs / "run.json", "--out")
    with pytest.raises(SystemExit) as exc:       # before any computation (the table's no_compute is not needed)
        theory_cli.main(EXACT + ["--omega", "0.3", "--mu", "2", "--out", str(small_fs / "e.json")])
    assert exc.value.code == 75 and "disk full" in capsys.readouterr().err
    assert _listing(small_fs) == []


def fat_point(point: dict) -> dict:
    """A point whose result is 30 kB (a long trajectory): a 256 KiB disk holds a few."""
    return {"seed": point["train"]["seed"], "trajectory": [0.123456789] * 2500}


def test_a_sweep_that_fills_the_disk_keeps_what_it_stored(small_fs, capsys):
    grid = small_fs.parent / "g.toml"
    grid.write_text(GRID_OK + "[cross]\nseed = [" + ", ".join(str(k) for k in range(12)) + "]\n")
    fill(small_fs, leave=128 * 1024)
    out = small_fs / "s"
    with pytest.raises(SystemExit) as exc:
        sweep_cli.main([str(grid), "--out", str(out), "--scheduler", "serial", "--point-fn",
                        f"{__name__}:fat_point", "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 75 and "disk full:" in err and "bytes needed at" in err and "Traceback" not in err, err
    stored = load_results(out)
    assert 1 <= len(stored) < 12                          # what was stored is whole and used on resume
    assert [p for p in os.listdir(out / "points") if p.startswith(".")] == []   # no temporary left
    for line in (out / "log.jsonl").read_text().splitlines():
        json.loads(line)                                  # every log line whole


def test_train_on_a_disk_that_fills_prints_its_result(small_fs, monkeypatch, capsys):
    """The disk fills while the run trains: the result cannot be written, so it is printed (the
    run is not lost), exit 75, no temporary left."""
    real = train_cli.train

    def train_then_fill(*a, **k):
        result = real(*a, **k)
        fill(small_fs)
        return result

    monkeypatch.setattr(train_cli, "train", train_then_fill)
    with pytest.raises(SystemExit) as exc:
        train_cli.main(TRAIN + ["--records", "2", "--out", str(small_fs / "run.json")])
    captured = capsys.readouterr()
    assert exc.value.code == 75 and "disk full" in captured.err and '"trajectory"' in captured.out
    assert _listing(small_fs) == []


# 4e. a killed parent leaves nothing computing ---------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:        # a zombie (exited, not yet reaped) computes nothing
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _wait_gone(pids, seconds: float = 20.0) -> list:
    deadline = time.time() + seconds
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def test_a_worker_dies_with_its_parent(tmp_path):
    """numerics.io.die_with_parent, every pool's initializer: SIGKILL of the parent ends the worker."""
    pidfile = tmp_path / "worker"
    script = (f"import os, sys, time\npid = os.fork()\nif pid == 0:\n    from numerics.io import die_with_parent\n"
              f"    die_with_parent()\n    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n    time.sleep(120)\n"
              f"    os._exit(0)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.time() + 60
        while not pidfile.is_file() or not pidfile.read_text():
            assert time.time() < deadline and parent.poll() is None
            time.sleep(0.1)
        worker = int(pidfile.read_text())
        parent.kill()
        parent.wait()
        assert _wait_gone([worker], 10) == []
    finally:
        parent.kill()
        parent.wait()


def _spawned_workers(pid: int) -> list:
    """The multiprocessing workers among the children of ``pid`` (Linux /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    out.append(child)
            except OSError:
                continue
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads worker processes off Linux /proc")
def test_kill_9_of_a_build_with_jobs_leaves_no_worker_computing(tmp_path):
    """kill -9 of reports.build --jobs 2 while the engine's two workers compute leaves nothing
    computing: each worker dies with the build (die_with_parent in the pool's initializer)."""
    build = subprocess.Popen([sys.executable, "-m", "reports.build", "--jobs", "2", "--profile", "quick",
                              "--only", "limiting-error,multi-head-gain", "--no-progress", "--out", str(tmp_path / "r")],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240          # two spawned workers import torch on a busy machine
        while len(workers := _spawned_workers(build.pid)) < 2:
            assert time.time() < deadline and build.poll() is None, "the workers did not start"
            time.sleep(0.2)
        build.kill()
        build.wait()
        assert _wait_gone(workers, 15) == [], "workers still computing after their build was killed"
    finally:
        build.kill()
        build.wait()
    assert not (tmp_path / "r").exists()


# 4f. values of the wrong kind, sizes, the environment ---------------------------------------------

def test_zero_and_negative_zero_are_one_sweep_point():
    spec = {"problem": {"tasks": [2], "heads": 1, "L": 8}, "train": {"time": 0.1, "batch": 8}}
    (a,) = expand_grid({**spec, "problem": {**spec["problem"], "sigma": 0.0}})
    (b,) = expand_grid({**spec, "problem": {**spec["problem"], "sigma": -0.0}})
    (c,) = expand_grid({**spec, "problem": {**spec["problem"], "sigma": 0}})
    assert point_id(a) == point_id(b) == point_id(c) and json.dumps(b["problem"]["sigma"]) == "0.0"


@pytest.mark.thorough
def test_theory_predict_at_its_limit_runs_in_seconds():
    """32 distinct blocks (MAX_PREDICT_TASKS) and 256 heads: measured 5.4 s CPU; --optimality at its
    limit of 32 = 4 tasks x 8 heads: 8.8 s CPU (a shared 2-core machine)."""
    cpu = time.process_time()
    theory_cli.predict(tuple(range(1, theory_cli.MAX_PREDICT_TASKS + 1)), theory_cli.MAX_PREDICT_HEADS, 1000.0)
    assert time.process_time() - cpu < 30
    cpu = time.process_time()
    theory_cli.predict((2, 2, 2, 2), 8, 1000.0, optimality=True)
    assert time.process_time() - cpu < 40


def _python(argv, env=None, cwd=ROOT, shell_prefix=None, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, *argv]
    if shell_prefix:        # run through sh: e.g. a working directory deleted before the command starts
        command = ["sh", "-c", shell_prefix + " exec " + " ".join(f"'{a}'" for a in command)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv", [["-m", "reports.theory", "predict", "--tasks", "2", "--heads", "1", "--L", "50",
                                   "--out", "rel.json"],
                                  ["-m", "numerics.sweep", "g.toml", "--out", "s"],
                                  ["-m", "reports.audit", "x.npz", "--tasks", "2", "--L", "8", "--out", "r"]])
def test_a_deleted_working_directory_is_a_message(tmp_path, argv):
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = _python(argv, cwd=gone, shell_prefix=f"cd '{gone}' && rmdir '{gone}' &&")
    assert proc.returncode == 2, proc.stderr
    assert "the current directory no longer exists" in proc.stderr and "Traceback" not in proc.stderr
    assert not gone.exists()


def test_an_ascii_only_output_stream_is_written_escaped(capsys):
    """PYTHONIOENCODING=ascii: what a command prints is escaped, never a UnicodeEncodeError."""
    import io

    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")

    @V.command_line
    def main(argv=None):
        print("measured 0.26 ± 0.004 ✓", file=sys.stdout)
        return 0

    old = sys.stdout
    sys.stdout = ascii_out
    try:
        assert main([]) == 0
        sys.stdout.flush()
        text = ascii_out.buffer.getvalue().decode("ascii")
    finally:
        sys.stdout = old
    assert text == "measured 0.26 \\xb1 0.004 \\u2713\n"


# --- 5. handed files: a crafted checkpoint or report, read by the commands under resource limits -----
#
# Every case runs in one worker process (the project imported once), each in a child forked from it
# with its own working directory (the handed files only), RLIMIT_CPU and, where a budget is tested, a
# tight RLIMIT_AS; the worker itself runs under RLIMIT_AS (the subprocess's preexec).  os.wait4 gives
# each child's CPU seconds and peak resident memory: no wall clock is read.  Each case must exit 2
# with one error line naming its file and the problem, no traceback, in under CPU_S seconds of CPU
# and RSS_MB over the worker's own resident memory, and leave its directory as it found it.

import io  # noqa: E402
import math  # noqa: E402
import struct  # noqa: E402
import zipfile  # noqa: E402

import numpy as np  # noqa: E402

WORKER_AS = 4 * 2 ** 30     # the worker's address space (it maps about 0.9 GB once imported)
CPU_S, RSS_MB = 3.0, 150     # per case: the refusals take 0.1-0.5 s and a few MB
CK = ["ck.bin", "--tasks", "2,2", "--L", "8", "--out", "out", "--no-progress"]
TRAIN_CK = ["--tasks", "2,2", "--heads", "2", "--L", "8", "--batch", "8", "--time", "0.5", "--lr", "0.05",
            "--records", "3", "--no-progress", "--checkpoint", "ck.bin", "--out", "run.json"]

WORKER = r'''
import json, os, resource, signal, sys, traceback
jobs = json.load(sys.stdin)
import numerics.train, reports.audit, reports.build, reports.compare, reports.findings
import numpy.lib.format, safetensors.torch
MAINS = {"audit": lambda a: reports.audit.main(a, stream=sys.stderr), "train": numerics.train.main,
         "build": reports.build.main, "findings": reports.findings.main, "compare": reports.compare.main}
results = {"base_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "cases": {}}
for job in jobs:
    pid = os.fork()
    if pid == 0:
        rc = 98
        try:
            os.chdir(job["cwd"])
            log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            if job["headroom"]:
                used = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
                resource.setrlimit(resource.RLIMIT_AS, (used + job["headroom"],) * 2)
            resource.setrlimit(resource.RLIMIT_CPU, (30, 30))
            signal.alarm(120)          # a read that blocks (a FIFO) ends the child; no measurement
            rc = MAINS[job["cli"]](job["argv"])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 97
        except BaseException:
            traceback.print_exc()
            rc = 99
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc if isinstance(rc, int) else 98)
    _, status, usage = os.wait4(pid, 0)
    results["cases"][job["name"]] = {"rc": os.waitstatus_to_exitcode(status), "rss_kb": usage.ru_maxrss,
                                     "cpu": usage.ru_utime + usage.ru_stime}
print(json.dumps(results))
'''


def _limit_worker():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_AS, WORKER_AS))


def _weights(dtype=np.float64) -> dict:
    g = np.random.default_rng(0)
    return {"K": g.normal(size=(2, 6, 6)), "Q": g.normal(size=(2, 6, 6)), "V": g.normal(size=(2, 6, 6)),
            "O": g.normal(size=(2, 2, 6))}


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array))
    return buf.getvalue()


def _zip(members: dict, method=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _npz(**extra) -> bytes:
    return _zip({f"{k}.npy": _npy(v) for k, v in {**_weights(), "logit_scale": np.array(2.0), **extra}.items()})


def _patch_member(data: bytes, member: str, flag=None, method=None, size=None) -> bytes:
    """The archive with one member's local and central headers rewritten: its flag bits, its
    compression method, its declared (uncompressed) size."""
    b = bytearray(data)
    for signature, at in ((b"PK\x03\x04", (6, 8, 22, 26, 30)), (b"PK\x01\x02", (8, 10, 24, 28, 46))):
        i = b.find(signature)
        while i >= 0:
            n = struct.unpack_from("<H", b, i + at[3])[0]
            if bytes(b[i + at[4]:i + at[4] + n]) == member.encode():
                for offset, fmt, value in ((at[0], "<H", flag), (at[1], "<H", method), (at[2], "<I", size)):
                    if value is not None:
                        struct.pack_into(fmt, b, i + offset, value)
            i = b.find(signature, i + 4)
    return bytes(b)


def _npy_declaring(count: int) -> bytes:
    """An .npy member whose header declares ``count`` float64 elements over 32 bytes of data."""
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': ({count},), }}"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + bytes(32)


def _safetensors(header, data: bytes = b"") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _st_good(**meta) -> tuple[dict, bytes]:
    header, blobs, offset = {}, [], 0
    for name, array in _weights().items():
        raw = array.tobytes()
        header[name] = {"dtype": "F64", "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"logit_scale": "2.0", **meta}
    return header, b"".join(blobs)


def _st(change=None, **meta) -> bytes:
    header, data = _st_good(**meta)
    if change:
        change(header)
    return _safetensors(header, data)


def _torch(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _torch_pickle(pickled: bytes) -> bytes:
    """A torch archive whose data.pkl is ``pickled`` (crafted opcodes; no storages)."""
    genuine = zipfile.ZipFile(io.BytesIO(_torch({"a": 1})))
    return _zip({i.filename: pickled if i.filename.endswith("data.pkl") else genuine.read(i) for i in genuine.infolist()})


def _dag_key_pickle(levels: int) -> bytes:
    """{t_levels: 1}, t_0 = (), t_k = (t_{k-1}, t_{k-1}) through the memo: 2^levels nodes in a few
    hundred bytes, as a dict key (hashed by the loader itself)."""
    body = b"\x80\x02})q\x00"
    for k in range(1, levels + 1):
        body += b"h" + bytes([k - 1]) + b"\x86q" + bytes([k])
    return body + b"K\x01s."


def _deep_list_pickle(depth: int) -> bytes:
    return b"\x80\x02}X\x0a\x00\x00\x00trajectory" + b"]" * depth + b"a" * (depth - 1) + b"s."


def _dag(levels: int, kind=tuple):
    node = kind()
    for _ in range(levels):
        node = kind((node, node)) if kind is tuple else [node, node]
    return node


def _authors_sd(change=None) -> dict:
    import torch

    w = {k: torch.tensor(v) for k, v in _weights().items()}
    sd = {"q_proj.weight": torch.cat(list(w["Q"])), "k_proj.weight": torch.cat(list(w["K"])),
          "v_proj.weight": torch.cat(list(w["V"])), "o_proj.weight": torch.cat(list(w["O"]), 1)}
    return {**sd, **(change(sd) if change else {})}


def _project(**changes) -> dict:
    import torch
    from numerics.config import ProblemConfig

    record = {"t": 0.0, "loss": 1.0, "omega": [[0.1, 0.1]] * 2, "mu": [[0.1, 0.1]] * 2, "residual": 0.0}
    payload = {"version": 1, "stream": 3, "model": "full", "estimator": "plain",
               "config": ProblemConfig(tasks=(2, 2), heads=2, L=8).to_dict(), "train": {"lr": 0.05}, "step": 8,
               "params": [torch.tensor(v) for v in _weights().values()], "trajectory": [record]}
    for key, value in changes.items():
        outer, _, inner = key.partition(".")
        payload[outer] = {**payload[outer], inner: value} if inner else value
    return payload


def _run_json(text=None, **changes) -> bytes:
    from numerics.config import ProblemConfig

    doc = {"model": "full", "config": ProblemConfig(tasks=(2, 2), heads=2, L=8).to_dict(), "t_end": 0.5,
           "trajectory": [], "omega": [[0.1, 0.1]] * 2, "mu": [[0.1, 0.1]] * 2, "residual": 0.0, "loss": 1.0}
    raw = json.dumps({**doc, **changes})
    return (raw if text is None else raw.replace(*text)).encode()


def _claims_json(figures: int = 0) -> bytes:
    """A consistent claims.json of one claim carrying ``figures`` small figures."""
    entry = {"id": "c-1", "title": "t", "statement": "s", "verdict": "pass", "kind": "claim", "theory": {},
             "numerics": {}, "tolerance": {}, "details": {}, "perturbations": [], "seconds": 0.0, "headline": [],
             "findings": [], "figures": [], "figure_errors": [],
             "figure_data": [{"name": f"f{k}", "title": "t", "series": [{"label": "x", "x": [0, 1], "y": [0, 1]}]}
                             for k in range(figures)]}
    prov = {"versions": {p: "x" for p in ("python", "torch", "numpy", "scipy", "sympy", "mpmath", "matplotlib")},
            "device": "cpu", "seed": 0, "profile": "quick", "wall_seconds": {"per_claim": {}, "total": 0.0},
            "cpu_seconds": {}, "git": {"commit": "x", "dirty": False}, "command": [], "started_utc": "", "seeds": {}}
    return json.dumps({"claims": [entry], "findings": [], "provenance": prov}).encode()


def _st_set(name, key, value):
    return lambda h: h[name].__setitem__(key, value)


def _st_overlap(h):
    h["Q"]["data_offsets"] = h["K"]["data_offsets"]


def _f16_merged() -> bytes:
    """A merged safetensors file whose W is 1 x 3000 x 3000 float16 (18 MB on disk, 72 MB as float64)."""
    w = np.zeros((1, 3000, 3000), np.float16).tobytes()
    u = np.zeros((1, 2, 3000), np.float16).tobytes()
    return _safetensors({"W": {"dtype": "F16", "shape": [1, 3000, 3000], "data_offsets": [0, len(w)]},
                         "U": {"dtype": "F16", "shape": [1, 2, 3000], "data_offsets": [len(w), len(w) + len(u)]}},
                        w + u)


def _handed_cases() -> list:
    """(name, cli, argv, files {name: bytes | None for a FIFO | ("link", target)}, fragment of the
    one error line, RLIMIT_AS headroom or None)."""
    import torch

    wrap = lambda sd, **more: {"model": sd, **more}  # noqa: E731
    ckpt = [
        ("safetensors header nested 10^5 deep", _safetensors(b'{"K":' + b"[" * 10 ** 5 + b"]" * 10 ** 5 + b"}"),
         "nested too deep"),
        ("safetensors metadata nested 10^5 deep",
         _safetensors(b'{"__metadata__":{"step":' + b"[" * 10 ** 5 + b"]" * 10 ** 5 + b"}}"), "nested too deep"),
        ("safetensors header of 20 MiB", _safetensors(b"{}" + b" " * (20 * 2 ** 20)), "a model's header needs"),
        ("safetensors overlapping tensors", _st(_st_overlap), "'K' and 'Q' overlap"),
        ("safetensors offsets past the end", _st(_st_set("O", "data_offsets", [1728, 10 ** 6])), "outside the"),
        ("safetensors shape against bytes", _st(_st_set("O", "shape", [2, 2, 7])), "over 192 bytes of data"),
        ("safetensors shape 10^16 over 576 bytes", _st(_st_set("K", "shape", [10 ** 8, 10 ** 8])),
         "over 576 bytes of data"),
        ("safetensors metadata not a string", _st(lambda h: h["__metadata__"].__setitem__("step", 5)),
         "map of names to strings"),
        ("step written 2_0", _st(step="2_0"), "step must be a number written in decimal digits"),
        ("time 1e400", _st(time="1e400"), "time must be a finite number"),
        ("npz member declaring 10^15 elements", _zip({"K.npy": _npy_declaring(10 ** 15)}),
         "declares shape (1000000000000000,)"),
        ("npz member encrypted", _patch_member(_npz(), "K.npy", flag=1), "'K.npy' is encrypted"),
        ("npz unknown compression method", _patch_member(_npz(), "K.npy", method=99), "compressed by method 99"),
        ("npz bzip2 member", _zip({"K.npy": _npy(np.zeros(4))}, zipfile.ZIP_BZIP2), "compressed by method 12"),
        ("npz declaring 4 GB expanded", _patch_member(_npz(), "K.npy", size=2 ** 32 - 1), "bytes when expanded"),
        ("npz deflate bomb declared 1 KB", _patch_member(_zip({"K.npy": _npy(np.zeros(2 ** 23))}, zipfile.ZIP_DEFLATED),
                                                         "K.npy", size=1024), "'K.npy' cannot be read"),
        ("npz of 3000 members", _zip({f"m{k}.npy": b"" for k in range(3000)}), "declares 3,000 members"),
        ("time True", _npz(time=np.array(True)), "time must be a single real number, got an array of shape () and dtype bool"),
        ("step 2+1j", _npz(step=np.array(2 + 1j)), "dtype complex128"),
        ("step 1e20", _npz(step=np.array(1e20)), "step must be a whole number in 0 .. 2^53"),
        ("zero heads (npz)", _zip({"W.npy": _npy(np.zeros((0, 6, 6))), "U.npy": _npy(np.zeros((0, 2, 6)))}),
         "the weights have 0 heads"),
        ("zero heads (torch)", _torch(_authors_sd(lambda sd: {k: v[:0] if k[0] != "o" else v[:, :0]
                                                             for k, v in sd.items()})), "H >= 1 heads"),
        ("sparse tensor", _torch(_authors_sd(lambda sd: {"q_proj.weight": sd["q_proj.weight"].to_sparse()})),
         "q_proj.weight is a torch.sparse_coo tensor"),
        ("meta tensor", _torch(_authors_sd(lambda sd: {"q_proj.weight": torch.empty(12, 6, device="meta")})),
         "on the meta device"),
        ("a one-element storage seen as 15000 x 15000",
         _torch(_authors_sd(lambda sd: {"q_proj.weight": torch.zeros(1, dtype=torch.float64).expand(15000, 15000)})),
         "a view of shape (15000, 15000)"),
        ("step 10^400", _torch(wrap(_authors_sd(), step=10 ** 400)), "an integer beyond the range of a float"),
        ("step of 45 levels of shared tuples", _torch(wrap(_authors_sd(), step=_dag(45))), "shared references"),
        ("dict key of 45 levels of shared tuples", _torch_pickle(_dag_key_pickle(45)), "shared references"),
        ("trajectory nested 10^5 deep", _torch_pickle(_deep_list_pickle(10 ** 5)), "more than 32 levels deep"),
        ("trajectory of 45 levels of shared lists", _torch(_project(trajectory=_dag(45, list))), "shared references"),
        ("project lr inf", _torch(_project(**{"train.lr": math.inf})), "train.lr must be a finite number"),
        ("project lr nan", _torch(_project(**{"train.lr": math.nan})), "train.lr must be a finite number"),
        ("project lr -1", _torch(_project(**{"train.lr": -1.0})), "train.lr must be > 0"),
        ("project model kind unknown", _torch(_project(model="linear")), "its model is 'linear'"),
        ("project trajectory an int", _torch(_project(trajectory=5)), "trajectory must be a list of records"),
        ("project record time a list", _torch(_project(trajectory=[{**_project()["trajectory"][0], "t": [1.0]}])),
         "trajectory[0].t must be a single real number, got a list"),
        ("project sigma 10^400", _torch(_project(**{"config.sigma": 10 ** 400})),
         "config.sigma is an integer beyond the range of a float"),
        ("project seed 2^64", _torch(_project(**{"config.basis_seed": 2 ** 64, "config.basis": "random"})),
         "basis_seed must be an integer in 0 .. 2^64 - 1"),
        ("run.json t_end 1e400", _run_json(text=('"t_end": 0.5', '"t_end": 1e400')), "1e400 is beyond the range"),
        ("run.json t_end -5", _run_json(t_end=-5), "t_end must be >= 0"),
        ("run.json omega 'abc'", _run_json(omega=[["abc", 0.1], [0.1, 0.1]]), "omega[0][0] must be a single real number"),
        ("run.json residual a list", _run_json(residual=[1.0]), "residual must be a single real number, got a list"),
        ("run.json loss a dict", _run_json(loss={"a": 1}), "loss must be a single real number, got a dict"),
        ("run.json model kind unknown", _run_json(model="linear"), "its model is 'linear'"),
    ]
    cases = [(name, "audit", CK, {"ck.bin": data}, fragment, None) for name, data, fragment in ckpt]
    cases += [
        # d + m = 3000: the shapes agree with --tasks, the size does not
        ("weights over the memory budget", "audit", ["ck.bin", "--tasks", "1499,1499"] + CK[3:],
         {"ck.bin": _f16_merged()}, "weights as float64", 200 * 2 ** 20),
        ("a FIFO among the checkpoints", "audit", ["good.npz"] + CK, {"good.npz": _npz(), "ck.bin": None},
         "not a regular file (a FIFO", None),
        ("a device among the checkpoints", "audit", ["good.npz"] + CK, {"good.npz": _npz(),
                                                                             "ck.bin": ("link", "/dev/zero")},
         "(a character device)", None),
        ("a non-UTF-8 name", "audit", [os.fsdecode(b"\xff.npz")] + CK[1:], {b"\xff.npz": _npz()},
         "its name is not valid UTF-8", None),
        ("train: a dict key of shared tuples", "train", TRAIN_CK, {"ck.bin": _torch_pickle(_dag_key_pickle(45))},
         "shared references", None),
        ("train: a trajectory of shared lists", "train", TRAIN_CK,
         {"ck.bin": _torch(_project(trajectory=_dag(45, list)))}, "shared references", None),
    ]
    big = (32 * 2 ** 20 + 1, "more than the limit of 32 MiB")
    figures = (_claims_json(figures=1500), "more than 400 figures and panels")
    budget = (b'{"claims": [' + b"{}, " * (3 * 2 ** 20) + b"{}]}", "parsing it would take")
    for name, (content, fragment) in (("claims.json over its size bound", big), ("claims.json of 1,500 figures", figures),
                                      ("claims.json past the parse budget", budget)):
        headroom = 300 * 2 ** 20 if content is budget[0] else None
        for cli, argv in (("build", ["--from-json", "claims.json", "--out", "out"]), ("findings", ["claims.json"]),
                          ("compare", ["claims.json", "claims.json"])):
            cases.append((f"{cli}: {name}", cli, argv, {"claims.json": content}, fragment, headroom))
    return cases


def _place(directory: Path, files: dict) -> None:
    for name, content in files.items():
        path = os.path.join(os.fsencode(directory), name if isinstance(name, bytes) else name.encode())
        if content is None:
            os.mkfifo(path)
        elif isinstance(content, tuple):
            os.symlink(content[1], path)
        elif isinstance(content, int):
            with open(path, "wb") as fh:        # a sparse file of that size: no disk is used
                fh.truncate(content)
        else:
            with open(path, "wb") as fh:
                fh.write(content)


def _run_cases(tmp_path: Path, cases: list, named_of) -> list:
    """Run ``cases`` (:func:`_handed_cases`' rows, an optional seventh field the case's CPU bound in
    seconds) through the worker; the problems found (empty: every case exited 2 with one error line
    holding its fragment and ``named_of(cli, files)``, no traceback, within its CPU and RSS_MB, its
    directory as it was)."""
    jobs, before = [], {}
    for k, (name, cli, argv, files, fragment, headroom, *_) in enumerate(cases):
        cwd = tmp_path / f"case{k}"
        cwd.mkdir()
        _place(cwd, files)
        before[name] = sorted(os.listdir(os.fsencode(cwd)))
        jobs.append({"name": name, "cli": cli, "argv": argv, "cwd": str(cwd), "log": str(tmp_path / f"log{k}"),
                     "headroom": headroom})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", WORKER], input=json.dumps(jobs), capture_output=True, text=True,
                          env=env, cwd=tmp_path, preexec_fn=_limit_worker, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    problems = []
    for k, (name, cli, argv, files, fragment, headroom, *bound) in enumerate(cases):
        got = report["cases"][name]
        text = (tmp_path / f"log{k}").read_text(errors="backslashreplace")
        errors = [line for line in text.splitlines() if "error:" in line]
        named = named_of(cli, files)
        rss_mb = (got["rss_kb"] - report["base_rss_kb"]) / 1024
        if got["rc"] != 2 or "Traceback" in text or len(errors) != 1 or fragment not in errors[0]:
            problems.append(f"{name}: exit {got['rc']}, {text.strip()[-400:]!r}")
        elif named not in errors[0]:
            problems.append(f"{name}: the line does not name {named}: {errors[0]!r}")
        if got["cpu"] > (bound[0] if bound else CPU_S) or rss_mb > RSS_MB:
            problems.append(f"{name}: {got['cpu']:.2f} s CPU, {rss_mb:.0f} MB over the worker's memory")
        if sorted(os.listdir(os.fsencode(tmp_path / f"case{k}"))) != before[name]:
            problems.append(f"{name}: its directory changed: {sorted(os.listdir(tmp_path / f'case{k}'))}")
    return problems


def test_handed_files_are_refused_in_one_line_within_cpu_and_memory_bounds(tmp_path):
    problems = _run_cases(tmp_path, _handed_cases(), lambda cli, files: (
        "claims.json" if cli in ("build", "findings", "compare") else
        "\\xff.npz" if any(isinstance(f, bytes) for f in files) else "ck.bin"))
    assert not problems, "\n".join(problems)


def test_the_pickle_scan_passes_what_torch_save_writes_and_bounds_what_it_builds():
    """What torch.save writes passes the scan (a state_dict, a trajectory of 5,000 records, the
    legacy format); the scan refuses in a fraction of a second what torch's loader would walk for
    hours (shared references 45 levels deep, as a value or as a dict key), a list nested 10^5 deep
    and a list that contains itself."""
    import pickle

    import torch

    from numerics import checkpoint as handed

    record = _project()["trajectory"][0]
    genuine = [_torch(_authors_sd()), _torch(_project(trajectory=[{**record, "t": 0.1 * k} for k in range(5000)]))]
    buf = io.BytesIO()
    torch.save(_project(), buf, _use_new_zipfile_serialization=False)
    for data in genuine + [buf.getvalue()]:
        handed.check_torch_archive(data)
    loop = []
    loop.append(loop)
    cpu = time.process_time()
    for data, fragment in ((_torch_pickle(_dag_key_pickle(45)), "shared references"),
                           (_torch({"step": _dag(45)}), "shared references"),
                           (_torch({"t": _dag(45, list)}), "shared references"),
                           (_torch_pickle(_deep_list_pickle(10 ** 5)), "more than 32 levels deep"),
                           (_torch_pickle(pickle.dumps({"t": loop}, protocol=2)), "contains itself")):
        with pytest.raises(ValueError, match=fragment):
            handed.check_torch_archive(data)
    assert time.process_time() - cpu < 2.0


def test_declared_shapes_meet_the_tasks_before_any_array_is_read(tmp_path, monkeypatch):
    """With the problem's tasks, a layout's arrays are checked by their declared shapes first: an
    npz of d + m = 6 is refused for --tasks 2,3 (d + m = 7) without reading an array as float64."""
    from numerics import external as ex

    path = tmp_path / "w.npz"
    path.write_bytes(_npz())
    assert ex.read_checkpoint(path, tasks=(2, 2)).token_dim == 6

    def read(*a, **k):
        raise AssertionError("an array was read before its shape was checked")
    monkeypatch.setattr(ex, "_array", read)
    with pytest.raises(ex.CheckpointError, match=r"K has shape \(2, 6, 6\): --tasks 2,3 needs d \+ m = 7 on its axis 2"):
        ex.read_checkpoint(path, tasks=(2, 3))


def test_every_checkpoint_path_is_checked_before_any_is_read(tmp_path, monkeypatch):
    """A link loop, a FIFO, a device or a name that is not UTF-8 last in the list: refused in one
    line (numerics.external.check_paths) before the first file is opened."""
    from numerics import external as ex

    good = tmp_path / "good.npz"
    good.write_bytes(_npz())
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    os.mkfifo(tmp_path / "fifo")
    odd = os.path.join(os.fsencode(tmp_path), b"\xff.npz")
    with open(odd, "wb") as fh:
        fh.write(_npz())

    def opened(*a, **k):
        raise AssertionError("a file was read before every path was checked")
    monkeypatch.setattr(V, "_read_bounded", opened)
    for bad, fragment in ((tmp_path / "a", "is a symbolic link loop"), (tmp_path / "fifo", "(a FIFO (named pipe))"),
                          ("/dev/zero", "(a character device)"), (os.fsdecode(odd), "\\xff.npz: its name is not valid UTF-8")):
        with pytest.raises(ex.CheckpointError) as info:
            ex.check_paths([good, bad])
        assert fragment in str(info.value) and "\n" not in str(info.value)


# --- 6. the edges of every command ------------------------------------------------------------------

def _npz_of(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _sign_aligned() -> bytes:
    """A factored (2, 2), H = 2 model at small positive omega and mu (on D, balanced, sign-aligned):
    the first checkpoint of a run whose theory the audit computes (claims.audit.trajectory_domain)."""
    from numerics.config import ProblemConfig
    from numerics.model import MultiHeadAttention

    cfg = ProblemConfig(tasks=(2, 2), heads=2, L=32, logit_scale=math.sqrt(6.0))
    x = np.array([[0.02, 0.01], [0.01, 0.015]])
    model = MultiHeadAttention.from_semi_singular_values(cfg, x, x)
    return _npz_of(**{k: p.detach().numpy() for k, p in model.named_parameters()}, logit_scale=np.array(cfg.logit_scale))


def _work_cases() -> list:
    """Inputs accepted once and then failing, or taking minutes to hours, inside the work (issue 46):
    each refused before it (reports.audit's budget, its checks of the weights and the time axis;
    reports.build's profile check) in one line.  Rows as :func:`_handed_cases`' (+ a CPU bound)."""
    out = ["--out", "out", "--no-progress"]
    run = {f"t{k}.npz": _sign_aligned() for k in range(5)}
    run_argv = list(run) + ["--tasks", "2,2", "--L", "32"] + out
    g = np.random.default_rng(0)
    scaled = lambda scale, **more: _npz_of(**{k: v * scale for k, v in _weights().items()}, **more)  # noqa: E731
    many = {f"c{k:03d}.npz": _npz() for k in range(200)}
    return [
        ("10,000 heads at d = 2", "audit", ["ck.bin", "--tasks", "2", "--L", "8"] + out,
         {"ck.bin": _npz_of(W=0.01 * g.normal(size=(10 ** 4, 3, 3)), U=0.01 * g.normal(size=(10 ** 4, 1, 3)))},
         "best decomposable", None),
        ("L = 10^9", "audit", ["ck.bin", "--tasks", "2,2", "--L", str(10 ** 9)] + out, {"ck.bin": _npz()},
         "a held-out batch of 2 prompts at L = 1000000000", None),
        ("the seed 2^64 - 1", "audit", CK + ["--seed", str(2 ** 64 - 1)], {"ck.bin": _npz()},
         "--seed must be at most 9223372036854775807", None),
        ("--lr x --steps overflowing to inf", "audit", ["a.npz", "b.npz", "--tasks", "2,2", "--L", "8", "--lr",
                                                        "1e300", "--steps", "1,10000000000"] + out,
         {"a.npz": _npz(), "b.npz": _npz()}, "b.npz: its training time is inf", None),
        ("weights of 1e154", "audit", CK, {"ck.bin": scaled(1e154, logit_scale=np.array(2.0))},
         "ck.bin: the handed weights give NaN/inf at L = 8: their merged weights", None),
        ("a denormal logit scale", "audit", CK, {"ck.bin": scaled(1.0, logit_scale=np.array(5e-324))},
         "ck.bin: the handed weights give NaN/inf at L = 8", None),
        ("a logit scale of 1e-300", "audit", CK, {"ck.bin": scaled(1.0, logit_scale=np.array(1e-300))},
         "ck.bin: the handed weights give NaN/inf at L = 8", None),
        ("merged weights of 1e154", "audit", CK,
         {"ck.bin": _npz_of(W=np.full((2, 6, 6), 1e154), U=np.full((2, 2, 6), 1e154))},
         "ck.bin: the handed weights give NaN/inf at L = 8: the readout", None),
        ("every checkpoint at one time", "audit", run_argv + ["--times", "1,1,1,1,1"], run, "the same training time",
         None),
        ("a denormal --lr with --steps", "audit", run_argv + ["--steps", "0,1,2,3,4", "--loss-units", "sum", "--lr",
                                                             "5e-324"], run, "less than 1e-06", None),
        ("denormal --times", "audit", run_argv + ["--times", "1e-320,2e-320,3e-320,4e-320,5e-320"], run,
         "less than 1e-06", None),
        ("--times spanning 10^6", "audit", run_argv + ["--times", "0,1,10,1000,1000000"], run,
         "more than the trainer's 1e+07", None),
        ("--times spanning 10^6 at --lr 0.5", "audit", run_argv + ["--times", "0,1,10,1000,1000000", "--lr", "0.5",
                                                                  "--max-minutes", "1"], run,
         "more than --max-minutes 1", None, 8.0),        # theory's tables built once for the step map's probe
        ("200 checkpoints past --max-minutes 0.05", "audit", list(many) + ["--tasks", "2,2", "--L", "8",
                                                                          "--max-minutes", "0.05"] + out, many,
         "more than --max-minutes 0.05", None),
        ("--out named in bytes that are not UTF-8", "audit", CK[:5] + ["--out", os.fsdecode(b"r\xff")],
         {"ck.bin": _npz()}, "its name is not valid UTF-8", None),
        ("--profile authors --only block-structure", "build", ["--profile", "authors", "--only", "block-structure"]
         + out, {}, "block-structure has no such profile", None),
    ]


def test_what_would_fail_or_take_hours_inside_the_work_is_refused_before_it(tmp_path):
    """Each in one line, exit 2, no traceback, within its CPU bound and RSS_MB, nothing written; today:
    10,000 heads ran 106-222 s, L = 10^9 and the seed 2^64 - 1 were tracebacks inside the measurement,
    inf times were audited, overflowing weights a TrainingDiverged traceback, degenerate time axes ran
    past 400 s, --profile authors --only block-structure errored after starting (exit 1)."""
    problems = _run_cases(tmp_path, _work_cases(), lambda cli, files: "")
    assert not problems, "\n".join(problems)


ALLOCATED = ["--tasks", "2,2", "--L", "32", "--prompts", "256", "--skip", "one-head-optimum,best-decomposable",
             "--no-progress"]


@pytest.fixture(scope="module")
def allocated_npz(tmp_path_factory) -> Path:
    """The exact allocated fixed point of (2, 2) at L = 32, H = 2, factored (a cheap audit: 1-2 s)."""
    from numerics.config import ProblemConfig
    from numerics.model import MultiHeadAttention
    from theory.exact import exact_fixed_point

    fp = exact_fixed_point((2, 2), 32)
    cfg = ProblemConfig(tasks=(2, 2), heads=2, L=32, logit_scale=2.0)
    model = MultiHeadAttention.from_semi_singular_values(cfg, np.diag(fp["omega_star"]), np.diag(fp["mu_star"]))
    path = tmp_path_factory.mktemp("allocated") / "allocated.npz"
    path.write_bytes(_npz_of(**{k: p.detach().numpy() for k, p in model.named_parameters()},
                             logit_scale=np.array(2.0)))
    return path


def _audit(argv, stdout=None):
    """reports.audit's main in this process, its stdout ``stdout`` (a text stream) and its stderr
    captured: (exit status, stderr)."""
    import reports.audit as audit_cli

    err, old = io.StringIO(), (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = stdout if stdout is not None else io.StringIO(), err
    try:
        try:
            status = audit_cli.main(list(map(str, argv)))
        except SystemExit as exc:
            status = exc.code
    finally:
        sys.stdout, sys.stderr = old
    return status, err.getvalue()


def test_the_audit_writes_a_report_1900_levels_deep_and_prints_to_an_ascii_terminal(tmp_path, allocated_npz):
    """A deep --out raised RecursionError (Path.mkdir(parents=True)) after all the work; an ascii
    terminal raised UnicodeEncodeError on "\u00b1": now the report is written and "\u00b1" escaped."""
    deep = tmp_path.joinpath(*["a"] * 1900)
    terminal = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    try:
        status, err = _audit([allocated_npz, *ALLOCATED, "--out", deep], terminal)
        terminal.flush()
        printed = terminal.buffer.getvalue().decode("ascii")
        assert status == 0 and "Traceback" not in err, err
        assert "loss 0." in printed and "\\xb1" in printed and (deep / "claims.json").is_file()
    finally:
        _remove_deep(tmp_path / "a")


def _remove_deep(top: Path) -> None:
    """Delete a tree of any depth without recursion (shutil.rmtree, pytest's cleaner included, recurse
    once per level: a tree 1,900 deep left behind would break every later run's cleanup)."""
    folders, stack = [], [str(top)] if top.is_dir() else []
    while stack:
        folders.append(stack.pop())
        for entry in os.scandir(folders[-1]):
            stack.append(entry.path) if entry.is_dir(follow_symlinks=False) else os.unlink(entry.path)
    for folder in reversed(folders):
        os.rmdir(folder)


def test_the_audit_survives_a_reader_that_closes_its_pipe(tmp_path, allocated_npz):
    """``python -m reports.audit ... | head -1``: the rest of what it prints is dropped, the report
    is written, the exit status is the audit's own, no BrokenPipeError."""
    proc = subprocess.Popen([sys.executable, "-m", "reports.audit", str(allocated_npz), *ALLOCATED, "--out",
                             str(tmp_path / "r")], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0 and first and "Error" not in err and "Traceback" not in err, err
    assert (tmp_path / "r" / "claims.json").is_file()


def test_a_closed_pipe_drops_the_output_and_keeps_the_exit_status():
    """Every command line (numerics.io.command_line): a reader gone after the first line."""
    read, write = os.pipe()
    os.close(read)
    pipe = io.TextIOWrapper(io.FileIO(write, "w"), encoding="utf-8", line_buffering=True)

    @V.command_line
    def main(argv=None):
        for k in range(1000):
            print(f"line {k}")
        return 3

    old = sys.stdout
    sys.stdout = pipe
    try:
        assert main([]) == 3
    finally:
        sys.stdout = old
    pipe.close()


def test_every_command_line_is_wrapped_alike():
    """The one wrapper (closed pipe, ascii terminal, deleted directory, full disk) on every main."""
    import reports.audit
    import reports.build
    import reports.compare
    import reports.findings

    for main in (reports.audit.main, reports.build.main, reports.compare.main, reports.findings.main, train_cli.main,
                 theory_cli.main, sweep_cli.main, bench_cli.main):
        assert main.__code__ is V.command_line(lambda: 0).__code__, main.__module__


def test_the_audit_on_a_disk_that_fills_says_one_line_and_exits_75(small_fs, allocated_npz):
    """Room for the write probes, not for the report: "disk full: N bytes needed at PATH", exit 75 (as
    reports.build), no temporary left, no traceback."""
    fill(small_fs, leave=96 * 1024)
    status, err = _audit([allocated_npz, *ALLOCATED, "--out", small_fs / "r"])
    assert status == 75 and "disk full:" in err and "Traceback" not in err, err
    assert _listing(small_fs) == []


def _forked_builds(n: int, out: Path, tmp: Path) -> list:
    script = tmp / "writers.py"
    script.write_text(WRITERS)
    proc = subprocess.run([sys.executable, str(script), str(n), str(out), str(tmp / "log")], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


WRITERS = """
import json, os, sys, time, types
import claims
from claims.core import Comparison
from claims.core import ClaimSpec, Outcome
module = types.ModuleType("writer_claims")
def compare(ctx, results):
    time.sleep(0.3)                      # every writer past its checks before the first one writes
    return Outcome([Comparison("c", {}, {}, 0.0, 1.0, "w")])
module.quick = ClaimSpec("quick", "t", "s", {"tiny": None}, plan=lambda ctx, results: [], compare=compare)
sys.modules[module.__name__] = module
claims.REGISTRY = {"quick": "writer_claims:quick"}
from reports.build import main
n, out, logs = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pids = []
for k in range(n):
    pid = os.fork()
    if pid == 0:
        log = os.open(f"{logs}{k}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        try:
            rc = main(["--profile", "tiny", "--no-progress", "--out", out])
        except SystemExit as exc:
            rc = exc.code
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc if isinstance(rc, int) else 98)
    pids.append(pid)
print(json.dumps([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]))
"""


def test_writers_of_one_out_take_turns(tmp_path):
    """Four builds into one --out at once, twice (new, then over a previous report): they refused each
    other over the write probe, one report landed beside --out, a warning named a folder another had
    removed.  Now each waits its turn: all succeed, --out holds one whole report, nothing beside it."""
    from reports.build import foreign_entries
    from reports.render import check_report

    logs = tmp_path / "logs"
    logs.mkdir()
    out = tmp_path / "here" / "r"
    out.parent.mkdir()
    for _ in range(2):
        assert _forked_builds(4, out, logs) == [0] * 4
        assert os.listdir(out.parent) == ["r"] and check_report(out) == [] and foreign_entries(out) == []
        text = "".join(p.read_text() for p in logs.glob("log*"))
        assert "Traceback" not in text and "remove it by hand" not in text and "instead" not in text
