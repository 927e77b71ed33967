"""Bad input across the command lines (issue 13): every case below is refused before any
long computation with a message saying what is wrong, exit status 2 for bad usage (0 where
the answer is given but flagged, as for a prediction outside the expansion's range), no
Python traceback, and nothing written: the files of the case's directory are the same
before and after.

The CLIs: ``python -m numerics.train``, ``python -m reports.theory predict``, ``python -m numerics.bench``,
``python -m numerics.sweep``. The table runs each ``main(argv)`` in-process (a subprocess per
case would cost a torch import each); ``test_entry_point_in_a_subprocess`` checks that a
``python -m`` entry point gives the same exit status and message without a traceback.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import numerics.train as train_cli
import reports.theory as theory_cli
import numerics.bench as bench_cli
import numerics.sweep as sweep_cli
from numerics.config import ProblemConfig
from numerics.train import TrainConfig, train

ROOT = Path(__file__).resolve().parent.parent
MAINS = {"numerics.train": train_cli.main, "reports.theory": theory_cli.main, "numerics.bench": bench_cli.main,
         "numerics.sweep": sweep_cli.main}

# a run of two steps on a tiny problem: any refusal below is due to the one flag changed
TRAIN = ["--tasks", "2", "--heads", "1", "--L", "8", "--batch", "8", "--time", "0.1", "--no-progress"]
TRAIN_OUT = TRAIN + ["--out", "{tmp}/run.json"]
GRID_OK = '[problem]\ntasks = [2]\nheads = 1\nL = 8\n[train]\ntime = 0.1\nbatch = 8\nrecords = 2\n'
NOT_A_DIR = "/etc/passwd"    # a regular file on every POSIX machine: nothing can be created under it
UNWRITABLE = "/proc"         # a directory where no file can be created, even by root


def _fixtures(tmp: Path) -> None:
    """The files some cases read: a corrupt checkpoint, a torch file that is no checkpoint,
    a checkpoint of another run, a binary file, grids with a non-finite value, a non-TOML grid."""
    (tmp / "corrupt.ckpt").write_bytes(b"PK\x03\x04 this is not a checkpoint")
    torch.save({"weights": torch.zeros(2)}, tmp / "foreign.ckpt")
    cfg = ProblemConfig(tasks=(2,), heads=1, L=8)
    train(cfg, TrainConfig(lr=0.05, time=0.1, batch=8, seed=1, records=2, checkpoint=str(tmp / "other.ckpt"),
                           checkpoint_every=1))
    (tmp / "binary.toml").write_bytes(bytes(range(256)))
    (tmp / "nan.toml").write_text(GRID_OK.replace("heads = 1\n", "heads = 1\nsigma = nan\n"))
    (tmp / "nan_range.toml").write_text(GRID_OK + "[cross]\nsigma = [0.0, nan]\n")
    (tmp / "inf_lr.toml").write_text(GRID_OK.replace("time = 0.1\n", "time = 0.1\nlr = inf\n"))
    (tmp / "not_toml.toml").write_text("tasks = [2\n")
    (tmp / "ok.toml").write_text(GRID_OK)
    (tmp / "a_file").write_text("x")


# (cli, argv, exit status, fragment of the message on stderr); {tmp}: the case's directory
CASES = [
    # --- numerics.train -------------------------------------------------------------------
    ("numerics.train", TRAIN + ["--out", "{tmp}"], 2, "is a directory"),
    ("numerics.train", TRAIN + ["--out", NOT_A_DIR + "/run.json"], 2, "is a file, not a directory"),
    ("numerics.train", TRAIN + ["--out", UNWRITABLE + "/run.json"], 2, "cannot write in"),
    ("numerics.train", TRAIN_OUT + ["--checkpoint", NOT_A_DIR + "/c.ckpt"], 2, "--checkpoint"),
    ("numerics.train", TRAIN_OUT + ["--checkpoint", "{tmp}"], 2, "--checkpoint {tmp} is a directory"),
    ("numerics.train", TRAIN_OUT + ["--checkpoint", "{tmp}/corrupt.ckpt"], 2,
     "not a readable numerics.train checkpoint"),
    ("numerics.train", TRAIN_OUT + ["--checkpoint", "{tmp}/foreign.ckpt"], 2, "not a numerics.train checkpoint"),
    ("numerics.train", TRAIN_OUT + ["--checkpoint", "{tmp}/other.ckpt"], 2, "belongs to a different run"),
    ("numerics.train", TRAIN_OUT + ["--records", "100000"], 2, "--records 100000 is more than the run has"),
    ("numerics.train", TRAIN_OUT + ["--records", "1"], 2, "--records must be an integer >= 2"),
    ("numerics.train", TRAIN_OUT + ["--tasks", "2,2", "--heads", "2", "--symmetrize", "--batch", "6"], 2,
     "multiple of 2^m = 4"),
    ("numerics.train", TRAIN_OUT + ["--tasks", "2,,2"], 2, "no empty entries"),
    ("numerics.train", TRAIN_OUT + ["--tasks", "3,x"], 2, "--tasks must be comma-separated positive integers"),
    ("numerics.train", TRAIN_OUT + ["--heads", "1e9"], 2, "written in digits"),
    ("numerics.train", TRAIN_OUT + ["--heads", "0"], 2, "--heads must be a positive integer"),
    ("numerics.train", TRAIN_OUT + ["--heads", "100000000000"], 2, "GiB is available"),
    ("numerics.train", TRAIN_OUT + ["--batch", "1000000000000"], 2, "GiB is available"),
    ("numerics.train", TRAIN_OUT + ["--L", "1000000000000"], 2, "GiB is available"),
    ("numerics.train", TRAIN_OUT + ["--tasks", "100000000"], 2, "GiB is available"),
    ("numerics.train", TRAIN_OUT + ["--sigma", "nan"], 2, "sigma (label noise std) must be finite"),
    ("numerics.train", TRAIN_OUT + ["--lr", "0"], 2, "lr must be a finite number > 0"),
    ("numerics.train", TRAIN_OUT + ["--time", "0.01"], 2, "must be at least one step"),
    ("numerics.train", TRAIN_OUT + ["--device", "tpu"], 2, "device"),
    ("numerics.train", TRAIN_OUT + ["--threads", "0"], 2, "--threads must be a positive integer"),
    # --- theory predict ---------------------------------------------------------------------
    ("reports.theory", ["predict", "--tasks", "2", "--heads", "1", "--L", "50", "--out", "{tmp}"], 2, "is a directory"),
    ("reports.theory", ["predict", "--tasks", "2", "--heads", "1", "--L", "50", "--out", NOT_A_DIR + "/p.json"], 2,
     "is a file, not a directory"),
    ("reports.theory", ["predict", "--tasks", "3", "--heads", "1", "--L", "1", "--out", "{tmp}/p.json"], 2,
     "no allocated fixed point for the task of block size r = 3 at L = 1"),
    ("reports.theory", ["predict", "--tasks", "3", "--heads", "1", "--L", "100", "--sigma", "1e10"], 0,
     "collapsed onto the trivial point"),
    ("reports.theory", ["predict", "--tasks", "3,3", "--heads", "2", "--L", "5"], 0,
     "the 1/L correction is not small"),
    ("reports.theory", ["predict", "--tasks", "2,2", "--heads", "1", "--L", "50", "--out", "{tmp}/p.json"], 2,
     "at least one head per task"),
    ("reports.theory", ["predict", "--tasks", "2,,2", "--heads", "2", "--L", "50"], 2,
     "comma-separated positive integers"),
    ("reports.theory", ["predict", "--tasks", "2", "--heads", "1", "--L", "inf"], 2, "--L must be a finite number"),
    # --- numerics.bench ------------------------------------------------------------------------
    ("numerics.bench", ["--smoke", "--out", "{tmp}"], 2, "is a directory"),
    ("numerics.bench", ["--smoke", "--out", NOT_A_DIR + "/b.json"], 2, "is a file, not a directory"),
    ("numerics.bench", ["--smoke", "--out", UNWRITABLE + "/b.json"], 2, "cannot write in"),
    ("numerics.bench", ["--smoke", "--repeats", "0"], 2, "--repeats must be a positive integer"),
    ("numerics.bench", ["--smoke", "--dtype", "float16"], 2, "unknown dtype"),
    ("numerics.bench", ["--smoke", "--reduced-time", "nan"], 2, "--reduced-time must be a finite number"),
    # --- numerics.sweep ------------------------------------------------------------------------
    ("numerics.sweep", ["{tmp}/binary.toml", "--out", "{tmp}/sweep"], 2, "is not a text file"),
    ("numerics.sweep", ["{tmp}", "--out", "{tmp}/sweep"], 2, "is a directory; pass the grid TOML file"),
    ("numerics.sweep", ["{tmp}/missing.toml", "--out", "{tmp}/sweep"], 2, "does not exist"),
    ("numerics.sweep", ["{tmp}/not_toml.toml", "--out", "{tmp}/sweep"], 2, "is not valid TOML"),
    ("numerics.sweep", ["{tmp}/nan.toml", "--out", "{tmp}/sweep"], 2, "problem.sigma = nan is not a finite number"),
    ("numerics.sweep", ["{tmp}/nan_range.toml", "--out", "{tmp}/sweep"], 2, "problem.sigma = nan"),
    ("numerics.sweep", ["{tmp}/inf_lr.toml", "--out", "{tmp}/sweep"], 2, "train.lr = inf"),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/a_file"], 2, "exists and is not a directory"),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", NOT_A_DIR + "/sweep"], 2, "is a file, not a directory"),
    ("numerics.sweep", ["{tmp}/ok.toml", "--out", "{tmp}/sweep", "--workers", "0"], 2,
     "--workers must be a positive integer"),
]


def _ids():
    seen: dict = {}
    out = []
    for cli, argv, _, _ in CASES:
        flag = next((a for a in reversed(argv) if a.startswith("--") and a not in ("--no-progress", "--out")),
                    argv[0])
        name = f"{cli}:{flag}"
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


@pytest.fixture(scope="module")
def fixtures_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_inputs")
    _fixtures(tmp)
    return tmp


def _tree(tmp: Path) -> dict:
    """Every file and directory under tmp (hidden temporaries included) with its size."""
    return {str(p.relative_to(tmp)): (p.stat().st_size if p.is_file() else -1) for p in tmp.rglob("*")}


def _run_main(cli: str, argv: list[str]) -> int:
    try:
        code = MAINS[cli](argv)
    except SystemExit as exc:
        code = exc.code
    return 0 if code is None or isinstance(code, dict) else code   # numerics.bench.main returns its results


def test_the_table_is_large_and_covers_every_cli():
    assert len(CASES) >= 30
    assert {c[0] for c in CASES} == set(MAINS)


@pytest.mark.parametrize("cli,argv,code,fragment", CASES, ids=_ids())
def test_bad_input_is_refused_with_a_message(cli, argv, code, fragment, fixtures_dir, capsys):
    tmp = fixtures_dir
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    fragment = fragment.replace("{tmp}", str(tmp))
    before = _tree(tmp)
    got = _run_main(cli, argv)
    err = capsys.readouterr().err
    assert got == code, err
    assert fragment in err, err
    assert "Traceback" not in err
    if cli == "numerics.train":
        assert "weights_only" not in err          # torch's loader advice is not the user's business
    assert _tree(tmp) == before                   # nothing written, nothing half-written


def test_prediction_at_short_L_is_flagged_unreliable(capsys):
    """tasks 3,3 at L = 5 (e r / L = 1.6): the expansion still has a strict local minimum per task
    (omega*, mu*) = (0.306, 0.606), loss 2.63 below the trivial point's r = 3, but its 1/L
    correction is not small: the JSON says valid: true, reliable: false with the reason, and so does
    a warning on stderr."""
    assert theory_cli.main(["predict", "--tasks", "3,3", "--heads", "2", "--L", "5"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["valid"] is True and out["reliable"] is False and out["fixed_point_is_local_min"]
    assert out["omega_star"][0] == pytest.approx(0.30645, abs=1e-5) and out["mu_star"][0] == pytest.approx(0.60599, abs=1e-5)
    assert any("not small" in r for r in out["unreliable_reasons"]) and out["expansion_size"] > 1
    assert "not reliable" in captured.err


def test_entry_point_in_a_subprocess(fixtures_dir):
    """``python -m numerics.train`` (one subprocess: each costs a torch import; the other CLIs'
    ``__main__`` is the same one line, ``sys.exit(main())``)."""
    argv = TRAIN + ["--out", str(fixtures_dir)]
    before = _tree(fixtures_dir)
    proc = subprocess.run([sys.executable, "-m", "numerics.train", *argv], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert _tree(fixtures_dir) == before
