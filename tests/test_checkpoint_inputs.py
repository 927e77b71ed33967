"""A checkpoint read as the truth (issue 33): a file that loads safely (weights_only) but is
crafted -- empty params, a negative or huge step, wrong shapes, NaN weights, a garbage
generator state, a truncated loss history or trajectory, another run's configuration, a
payload that is no dict -- is refused by ``numerics.checkpoint.read`` with one line naming the
field, exit status 2 from ``python -m numerics.train``, before any batch is drawn, the file
untouched and no output written; never a traceback, never a silent fresh start.  A genuine
checkpoint still resumes (bit-identically: tests/test_numerics_train.py).

Each case is a mutation of one genuine checkpoint of a tiny run (10 steps, written at step 8).
"""
from __future__ import annotations

import datetime
import math

import numpy as np
import pytest
import torch

import numerics.train as T
from numerics import checkpoint as C
from numerics.config import ProblemConfig
from numerics.config import make_generator
from numerics.train import TrainConfig, train, train_reduced

ARGV = ["--tasks", "2,1", "--heads", "2", "--L", "8", "--batch", "8", "--time", "0.5", "--lr", "0.05",
        "--records", "3", "--checkpoint-every", "4", "--no-progress"]
CFG = ProblemConfig(tasks=(2, 1), heads=2, L=8)
TCFG = TrainConfig(lr=0.05, time=0.5, batch=8, records=3, checkpoint_every=4)


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """The checkpoints (step 8 of 10) a full and a reduced run of ARGV's configuration write."""
    tmp = tmp_path_factory.mktemp("ckpt")
    out = {}
    for kind, runner in (("full", train), ("reduced", train_reduced)):
        path = tmp / f"{kind}.ckpt"
        runner(CFG, TrainConfig(**{**TCFG.to_dict(), "checkpoint": str(path)}))
        out[kind] = torch.load(path, weights_only=True)
    assert out["full"]["step"] == 8 and out["reduced"]["step"] == 8
    return out


def _set(key, value):
    def mutate(ck):
        ck[key] = value(ck) if callable(value) else value
        return ck
    return mutate


def _param(i, change):
    def mutate(ck):
        ck["params"][i] = change(ck["params"][i])
        return ck
    return mutate


def _nan_at(t, value=math.nan):
    t = t.clone()
    t.view(-1)[0] = value
    return t


def _record(i, key, value):
    def mutate(ck):
        ck["trajectory"][i][key] = value(ck["trajectory"][i][key]) if callable(value) else value
        return ck
    return mutate


def _delete(key):
    def mutate(ck):
        del ck[key]
        return ck
    return mutate


def _config(what, key, value):
    def mutate(ck):
        ck[what][key] = value
        return ck
    return mutate


def _garbage_state(ck):
    ck["generator"] = torch.randint(0, 256, ck["generator"].shape, dtype=torch.uint8,
                                    generator=torch.Generator().manual_seed(1))
    return ck


# (id, mutation of the genuine full-model checkpoint dict, or a payload to save instead, fragments of the message)
CASES = [
    # --- the payload itself
    ("non-dict payload", lambda ck: [ck["params"], ck["step"]], ["not a numerics.train checkpoint",
                                                                "a dict of named fields"]),
    ("a bare tensor", lambda ck: torch.zeros(3), ["not a numerics.train checkpoint"]),
    ("non-string keys", lambda ck: {1: 2}, ["a dict whose keys are not all names"]),
    ("a field name with a line break", _set("bad\nname", 1), ["unknown field(s) ['bad\\nname']"]),
    ("a configuration key that is no name", _config("config", "L\nx", 1), ["config: checkpoint {", "not a dict of named fields"]),
    ("missing key", _delete("generator"), ["missing field(s) generator"]),
    ("missing every key but two", lambda ck: {"step": 8, "params": ck["params"]}, ["missing field(s) version"]),
    ("unknown key", _set("optimizer", 1), ["unknown field(s) ['optimizer']"]),
    ("a pickled object", _set("wall_seconds", datetime.date(2024, 1, 1)), ["objects other than tensors", "never unpickled"]),
    # --- params
    ("empty params", _set("params", []), ["params is a list of 0 tensor(s), this run trains 4 (full model)"]),
    ("one param too many", _set("params", lambda ck: ck["params"] + [torch.zeros(1)]), ["a list of 5 tensor(s)"]),
    ("params not a list", _set("params", {"w": 1}), ["params is {'w': 1}"]),
    ("wrong shape", _param(0, lambda p: torch.zeros(3, 5, 5, dtype=p.dtype)),
     ["params[0] has shape (3, 5, 5), this run's is (2, 5, 5)"]),
    ("wrong dtype", _param(3, lambda p: p.float()), ["params[3] has dtype torch.float32, this run's is torch.float64"]),
    ("NaN weight", _param(1, _nan_at), ["params[1] holds 1 non-finite value(s)"]),
    ("inf weight", _param(2, lambda p: _nan_at(p, math.inf)), ["params[2] holds 1 non-finite value(s)"]),
    ("param not a tensor", _param(0, lambda p: 0.5), ["params[0] is 0.5, not a tensor"]),
    ("sparse param", _param(0, lambda p: p.to_sparse()), ["params[0] is a torch.sparse_coo tensor"]),
    # --- step
    ("negative step", _set("step", -1), ["step is -1, not an integer in 0 .. 10"]),
    ("huge step", _set("step", 10 ** 12), ["step is 1000000000000, not an integer in 0 .. 10"]),
    ("step past the run", _set("step", 11), ["step is 11"]),
    ("float step", _set("step", 8.0), ["step is 8.0"]),
    ("bool step", _set("step", True), ["step is True"]),
    ("tensor step", _set("step", torch.tensor(8)), ["step is a tensor of shape ()"]),
    # --- the loss history
    ("truncated loss history", _set("losses", lambda ck: ck["losses"][:5]),
     ["losses has shape (5,), this run's is (8,)"]),
    ("loss history too long", _set("losses", lambda ck: torch.cat([ck["losses"], ck["losses"]])),
     ["losses has shape (16,)"]),
    ("NaN loss", _set("losses", lambda ck: _nan_at(ck["losses"])), ["losses holds 1 non-finite value(s)"]),
    ("diverged loss", _set("losses", lambda ck: ck["losses"].index_fill(0, torch.tensor([3]), 1e7)),
     ["losses[3] = 10000000.0 is above diverge_loss = 1e+06"]),
    ("loss history as a list", _set("losses", lambda ck: ck["losses"].tolist()), ["losses is [", "not a tensor"]),
    # --- the generator
    ("garbage generator state", _garbage_state, ["generator is not a valid generator state",
                                                 "Invalid mt19937 state"]),
    ("short generator state", _set("generator", lambda ck: ck["generator"][:100]),
     ["generator has shape (100,), this run's is (5056,)"]),
    ("float generator state", _set("generator", lambda ck: ck["generator"].double()), ["generator has dtype"]),
    ("generator state not a tensor", _set("generator", "mt19937"), ["generator is 'mt19937', not a tensor"]),
    ("generator of another seed", _set("generator", make_generator(7, "cpu").get_state()),
     ["generator was seeded with 7, this run's prompt stream with 0"]),
    # --- the trajectory
    ("truncated trajectory", _set("trajectory", lambda ck: ck["trajectory"][:1]),
     ["trajectory is 1 record(s), this run records 2 time(s) before step 8"]),
    ("empty trajectory", _set("trajectory", []), ["trajectory is 0 record(s)"]),
    ("trajectory not a list", _set("trajectory", "none"), ["trajectory is 'none'"]),
    ("record at the wrong time", _record(1, "t", 0.3), ["trajectory[1] has t = 0.3, the run records step 5 at t = 0.25"]),
    ("record loss not the history's", _record(0, "loss", 0.5), ["trajectory[0] has loss 0.5, but", "losses[0]"]),
    ("record omega of wrong shape", _record(1, "omega", [[0.1, 0.2]]), ["trajectory[1] field omega is",
                                                                          "2 lists of 2 finite numbers"]),
    ("record NaN mu", _record(0, "mu", lambda v: [[math.nan, v[0][1]], v[1]]), ["trajectory[0] field mu"]),
    ("record negative residual", _record(0, "residual", -1.0), ["trajectory[0] has residual -1.0 < 0"]),
    ("record missing a field", lambda ck: (ck["trajectory"][0].pop("residual"), ck)[1],
     ["trajectory[0] is {", "not a record of the fields"]),
    ("record not a dict", _set("trajectory", lambda ck: [1, 2]), ["trajectory[0] is 1"]),
    # --- the wall clock
    ("negative wall time", _set("wall_seconds", -3.0), ["wall_seconds is -3.0, not a finite number >= 0"]),
    ("NaN wall time", _set("wall_seconds", math.nan), ["wall_seconds is nan"]),
    ("wall time a string", _set("wall_seconds", "1 s"), ["wall_seconds is '1 s'"]),
    ("wall time beyond any float", _set("wall_seconds", 10 ** 400), ["wall_seconds is 1000", "not a finite number"]),
    ("huge step beyond any float", _set("step", 10 ** 400), ["step is 1000", "not an integer in 0 .. 10"]),
    ("record time beyond any float", _record(1, "t", 10 ** 400), ["trajectory[1] field t is 1000"]),
    # --- another run's checkpoint
    ("another configuration", _config("config", "L", 9), ["belongs to a different run",
                                                          "config.L: checkpoint 9, this run 8"]),
    ("another learning rate", _config("train", "lr", 0.1), ["train.lr: checkpoint 0.1, this run 0.05"]),
    ("a configuration field missing", lambda ck: (ck["config"].pop("sigma"), ck)[1],
     ["config.sigma: checkpoint None, this run 0.0"]),
    ("a configuration value of another type", _config("config", "L", 8.0), ["config.L: checkpoint 8.0, this run 8"]),
    ("a tensor in the configuration", _config("config", "heads", torch.tensor([2, 2])),
     ["config.heads: checkpoint a tensor of shape (2,)"]),
    ("configuration not a dict", _set("config", [1, 2]), ["config: checkpoint [1, 2], not a dict of named fields"]),
    ("another model", _set("model", "reduced"), ["model: checkpoint 'reduced', this run 'full'"]),
    ("another estimator", _set("estimator", "marginal"), ["estimator: checkpoint 'marginal', this run 'prompts'"]),
    ("another format version", _set("version", 2), ["version: checkpoint 2, this code 1"]),
    ("another prompt stream", _set("stream", 1), ["prompt stream: checkpoint version 1, this code version"]),
]


def _write(tmp_path, genuine, mutate, kind="full"):
    ck = mutate(_copy(genuine[kind]))
    path = tmp_path / "handed.ckpt"
    torch.save(ck, path)
    return path


def _copy(ck):
    """A deep copy of a checkpoint dict (tensors cloned, containers rebuilt)."""
    if torch.is_tensor(ck):
        return ck.clone()
    if isinstance(ck, dict):
        return {k: _copy(v) for k, v in ck.items()}
    if isinstance(ck, list):
        return [_copy(v) for v in ck]
    return ck


@pytest.fixture
def no_training(monkeypatch):
    """A refusal comes before the first batch is drawn."""
    def drawn(*a, **k):
        raise AssertionError("a batch was drawn before the checkpoint was refused")

    monkeypatch.setattr(T, "sample_prompts", drawn)


def test_the_cases_cover_the_issue():
    ids = {c[0] for c in CASES}
    assert {"empty params", "missing key", "wrong shape", "NaN weight", "negative step", "huge step",
            "truncated loss history", "garbage generator state", "another configuration", "non-dict payload"} <= ids
    assert len(CASES) == len(ids) >= 50


@pytest.mark.parametrize("what,mutate,fragments", CASES, ids=[c[0] for c in CASES])
def test_a_crafted_checkpoint_is_refused_by_the_cli(what, mutate, fragments, genuine, tmp_path, no_training, capsys):
    path = _write(tmp_path, genuine, mutate)
    before = path.read_bytes()
    out = tmp_path / "run.json"
    code = T.main(ARGV + ["--checkpoint", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: --checkpoint ") and lines[1:] == ["(no output written)"], err
    for fragment in fragments:
        assert fragment in lines[0], err
    assert path.read_bytes() == before and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["handed.ckpt"]


REDUCED_CASES = [
    ("empty params", _set("params", []), "params is a list of 0 tensor(s), this run trains 2 (reduced model)"),
    ("wrong shape", _param(1, lambda p: torch.zeros(2, 3, dtype=p.dtype)), "params[1] has shape (2, 3), this run's is (2, 2)"),
    ("NaN omega", _param(0, _nan_at), "params[0] holds 1 non-finite value(s)"),
    ("a full model's checkpoint", _set("model", "full"), "model: checkpoint 'full', this run 'reduced'"),
]


@pytest.mark.parametrize("what,mutate,fragment", REDUCED_CASES, ids=[c[0] for c in REDUCED_CASES])
def test_a_crafted_reduced_checkpoint_is_refused(what, mutate, fragment, genuine, tmp_path, no_training):
    path = _write(tmp_path, genuine, mutate, kind="reduced")
    with pytest.raises(C.CheckpointError) as exc:
        train_reduced(CFG, TrainConfig(**{**TCFG.to_dict(), "checkpoint": str(path)}))
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_the_full_models_checkpoint_is_refused_by_the_reduced_run(genuine, tmp_path):
    path = _write(tmp_path, genuine, lambda ck: ck)
    with pytest.raises(C.CheckpointError, match="model: checkpoint 'full', this run 'reduced'"):
        train_reduced(CFG, TrainConfig(**{**TCFG.to_dict(), "checkpoint": str(path)}))


def test_a_corrupt_or_empty_file_is_refused(tmp_path, capsys):
    for name, data in (("empty.ckpt", b""), ("cut.ckpt", b"PK\x03\x04 half a zip")):
        path = tmp_path / name
        path.write_bytes(data)
        assert T.main(ARGV + ["--checkpoint", str(path), "--out", str(tmp_path / "run.json")]) == 2
        err = capsys.readouterr().err
        assert "not a readable numerics.train checkpoint" in err and "Traceback" not in err
        assert path.read_bytes() == data


def test_a_genuine_checkpoint_resumes_at_every_admissible_step(genuine, tmp_path):
    """The reader accepts the genuine file, and a checkpoint at the run's last step (steps a
    multiple of checkpoint_every) resumes to the same result as the uninterrupted run."""
    path = _write(tmp_path, genuine, lambda ck: ck)
    whole = train(CFG, TCFG)
    resumed = train(CFG, TrainConfig(**{**TCFG.to_dict(), "checkpoint": str(path)}))
    assert np.array_equal(resumed.losses, whole.losses) and np.array_equal(resumed.mu, whole.mu)
    last = TrainConfig(**{**TCFG.to_dict(), "time": 0.4, "checkpoint": str(tmp_path / "last.ckpt")})
    first = train(CFG, last)
    assert torch.load(last.checkpoint, weights_only=True)["step"] == last.steps == 8
    again = train(CFG, last)
    assert np.array_equal(first.losses, again.losses) and np.array_equal(first.mu, again.mu)
    assert [vars(r) for r in first.trajectory] == [vars(r) for r in again.trajectory]


@pytest.mark.parametrize("runner,cfg_change,train_change,estimator", [
    (train, dict(dtype="float32"), {}, None),
    (train, {}, dict(fresh_batches=False, symmetrize=True), None),
    (train_reduced, dict(dtype="float32"), {}, "marginal"),
], ids=["float32", "fixed symmetrised batch", "reduced float32 marginal"])
def test_genuine_checkpoints_of_other_kinds_pass_the_reader(runner, cfg_change, train_change, estimator, tmp_path):
    """The reader's rules (dtype of the losses, record losses equal to the history's) hold for
    every kind of run the trainer checkpoints: it resumes each and ends where the whole run does."""
    cfg = CFG.replace(**cfg_change)
    tcfg = TrainConfig(**{**TCFG.to_dict(), **train_change, "batch": 8, "checkpoint": str(tmp_path / "ck.pt")})
    extra = {} if estimator is None else {"estimator": estimator}
    first = runner(cfg, tcfg, **extra)
    again = runner(cfg, tcfg, **extra)           # resumes from step 8
    assert np.array_equal(first.losses, again.losses) and np.array_equal(first.mu, again.mu)
