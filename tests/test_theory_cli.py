"""The command line ``python -m reports.theory``: help, JSON keys, unequal blocks and noise, the
exact loss at a point, the formulas, errors."""
import json
import subprocess
import sys

import pytest

from reports.theory import build_parser, main, predict
from theory.limiting_error import limit_multi

FLAGS = ["--tasks", "--heads", "--L", "--sigma", "--optimality", "--seed", "--out"]
KEYS = ["limit_multi", "limit_single", "gain", "omega_star", "mu_star", "loss_multi_at_L",
        "loss_single_at_L", "valid", "reliable"]


def test_help_explains_every_flag():
    for command in ("predict", "exact"):
        sub = build_parser()._subparsers._group_actions[0].choices[command]
        if command == "predict":
            text = sub.format_help()
            assert all(flag in text for flag in FLAGS)
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help and len(action.help) > 20, action.option_strings


def test_predict_subprocess_json(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, "-m", "reports.theory", "predict", "--tasks", "4,4,4", "--heads", "3",
                           "--L", "1000", "--sigma", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == data
    for k in KEYS:
        assert k in data
    assert abs(data["limit_multi"] - 197.49) < 0.01 and abs(data["gain"] - 2.316) < 1e-3
    assert len(data["omega_star"]) == 3 and data["valid"]


def test_predict_unequal_blocks_with_noise():
    data = predict((2, 5, 9), 3, 500.0, 0.5)
    assert len(data["omega_star"]) == 3
    # larger blocks get smaller omega*; noise raises the limit above the noiseless one
    assert data["omega_star"][0] > data["omega_star"][1] > data["omega_star"][2]
    assert data["limit_multi"] > limit_multi((2, 5, 9), 0.0)
    assert 1 < data["gain"] < 3 and data["loss_multi_at_L"] < data["loss_single_at_L"]


def test_exact_loss_at_a_point_and_matrix_input(capsys):
    """One head on r = 3 at L = 64 (omega = 0.3, mu = 2): the quadrature's 0.78792; two heads
    each serving one of two such tasks: twice that loss."""
    assert main(["exact", "--tasks", "3", "--heads", "1", "--L", "64", "--omega", "0.3", "--mu", "2.0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert abs(data["loss"] - 0.78792) <= 5e-6 and data["error_estimate"] < 1e-7
    assert main(["exact", "--tasks", "3,3", "--heads", "2", "--L", "64", "--omega", "0.3,0;0,0.3",
                 "--mu", "2,0;0,2"]) == 0
    assert json.loads(capsys.readouterr().out)["loss"] == pytest.approx(2 * data["loss"], rel=1e-12)


def test_formulas_print_the_expansion(capsys):
    assert main(["formulas"]) == 0
    text = capsys.readouterr().out
    assert "[expansion]" in text and "valid iff 2 omega[h,j]^2 < 1" in text and "[limit F]" in text


@pytest.mark.parametrize("argv,msg", [
    (["predict", "--tasks", "2,x", "--heads", "1", "--L", "10"], "comma-separated"),
    (["predict", "--tasks", "2,0", "--heads", "2", "--L", "10"], "positive integers"),
    (["predict", "--tasks", "2,2", "--heads", "0", "--L", "10"], "positive integer"),
    (["predict", "--tasks", "2,2", "--heads", "2", "--L", "-3"], "> 0"),
    (["predict", "--tasks", "2,2", "--heads", "2", "--L", "10", "--sigma", "nan"], "--sigma must be a finite number"),
    (["predict", "--tasks", "2,2", "--heads", "2", "--L", "10", "--sigma", "-0.5"], "--sigma must be >= 0"),
    (["exact", "--tasks", "3,3", "--heads", "2", "--L", "64", "--omega", "0.3,x", "--mu", "1"], "H x m matrix"),
    (["exact", "--tasks", "3,3", "--heads", "2", "--L", "0", "--omega", "0.3", "--mu", "1"], "positive integer"),
    (["exact", "--tasks", "3,3", "--heads", "2", "--L", "64", "--omega", "0.3,0.1;0.2", "--mu", "1"],
     "same number of entries"),
])
def test_bad_arguments_say_what_is_wrong(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["predict", "--tasks", "2,2,2", "--heads", "2", "--L", "10"], "at least one head per task"),
    (["exact", "--tasks", "3,3", "--heads", "2", "--L", "64", "--omega", "0.3,0.1", "--mu", "1"], "shape 1x2"),
    (["exact", "--tasks", "3", "--L", "64", "--omega", "0.3"], "--mu is required"),
])
def test_refused_before_computing_and_nothing_written(argv, msg, capsys, tmp_path):
    out = tmp_path / "never.json"
    assert main(argv + ["--out", str(out)]) == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()   # nothing half-written
