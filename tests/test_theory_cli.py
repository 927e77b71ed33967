"""The command line ``python -m theory``: help, JSON keys, unequal blocks and noise, errors."""
import json
import subprocess
import sys

import pytest

from theory.__main__ import build_parser, main, predict
from theory.limiting_error import limit_multi

FLAGS = ["--tasks", "--heads", "--L", "--sigma", "--optimality", "--seed", "--dps", "--out"]
KEYS = ["limit_multi", "limit_single", "gain", "omega_star", "mu_star", "loss_multi_at_L",
        "loss_single_at_L", "valid", "reliable"]


def test_help_explains_every_flag():
    sub = build_parser()._subparsers._group_actions[0].choices["predict"]
    text = sub.format_help()
    for flag in FLAGS:
        assert flag in text
    for action in sub._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 20, action.option_strings


def test_predict_subprocess_json(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, "-m", "theory", "predict", "--tasks", "4,4,4", "--heads", "3",
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


@pytest.mark.parametrize("argv,msg", [
    (["predict", "--tasks", "2,x", "--heads", "1", "--L", "10"], "comma-separated"),
    (["predict", "--tasks", "2,0", "--heads", "2", "--L", "10"], "positive integers"),
    (["predict", "--tasks", "2,2", "--heads", "0", "--L", "10"], "positive integer"),
    (["predict", "--tasks", "2,2", "--heads", "2", "--L", "-3"], "> 0"),
    (["predict", "--tasks", "2,2", "--heads", "2", "--L", "10", "--sigma", "nan"], "--sigma must be a finite number"),
    (["predict", "--tasks", "2,2", "--heads", "2", "--L", "10", "--sigma", "-0.5"], "--sigma must be >= 0"),
])
def test_bad_arguments_say_what_is_wrong(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_too_few_heads_is_an_error(capsys, tmp_path):
    out = tmp_path / "never.json"
    assert main(["predict", "--tasks", "2,2,2", "--heads", "2", "--L", "10", "--out", str(out)]) == 2
    assert "at least one head per task" in capsys.readouterr().err
    assert not out.exists()   # nothing half-written
