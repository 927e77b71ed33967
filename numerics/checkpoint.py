"""Checkpoints of numerics.train: what one holds, and the one reader that checks every field
of a checkpoint file against the run that would resume from it.

A checkpoint taken at step s (at the start of iteration s, before batch s is drawn) is a
dict of exactly :data:`FIELDS`:

    version, stream, model, estimator   plain str/int: the file format, the prompt stream
                                        (numerics.config.STREAM_VERSION), full or reduced,
                                        the reduced flow's estimator
    config, train                       ProblemConfig.to_dict(), TrainConfig.to_dict()
    step                                s, an int in 0 .. steps
    params                              the trained tensors after s updates, in the run's
                                        order, each of the run's shape and dtype, finite
    generator                           the prompt generator's state (a uint8 tensor of the
                                        generator's own size, seeded with the run's seed)
    losses                              the s batch losses 0 .. s - 1 (the run's dtype),
                                        finite and at most diverge_loss (a diverged run is
                                        never checkpointed)
    trajectory                          one record {t, loss, omega, mu, residual} per
                                        record step k < s, t = k lr, loss = losses[k],
                                        omega and mu (heads, m), residual >= 0
    wall_seconds                        a finite number >= 0

:func:`read` refuses a file that breaks any of these with a :class:`CheckpointError` (a
ValueError; the CLI exits 2) naming the field and what to do, before the run uses any of it,
so that a checkpoint file that exists is either resumed or refused, never silently replaced
by a fresh start.  torch.load runs with ``weights_only=True``: a checkpoint is never unpickled.

What the reader cannot see: a file whose every field is consistent with the run but whose
values were changed (other finite parameters of the right shapes, other Mersenne-Twister
words under the run's seed) resumes as if genuine; telling it apart would take replaying
the run up to step s.  The checks prove consistency with the run, not authenticity.
"""
from __future__ import annotations

import io
import math
import os
import pickle
from dataclasses import dataclass
from typing import Sequence

import torch

from numerics.io import handed
from numerics.io.files import read_input_bytes

CHECKPOINT_VERSION = 1

FIELDS = ("version", "stream", "model", "estimator", "config", "train", "step", "params", "generator",
          "losses", "trajectory", "wall_seconds")
"""The keys of a checkpoint, all required, no others."""

RECORD_FIELDS = ("t", "loss", "omega", "mu", "residual")
"""The keys of one trajectory record (numerics.train.Record)."""

BOOKKEEPING = ("checkpoint", "checkpoint_every", "progress")
"""TrainConfig fields that change how a run is watched, not what it computes: they may differ on resume."""

_DAMAGED = ("the file is damaged or was not written by numerics.train for this run: delete it to start afresh, "
            "or pass the configuration it was written for")


class CheckpointError(ValueError):
    """A checkpoint file this run cannot resume from; the message is one line naming the
    file, the field and what to do."""


@dataclass(frozen=True)
class Run:
    """What a checkpoint must match: the run about to resume.  ``params`` and ``generator``
    are the run's own freshly made tensors and prompt generator (their shapes, dtypes, state
    size and seed are the reference); ``record_at`` the steps at which the run records."""
    kind: str                       # "full" or "reduced"
    estimator: str
    stream: int
    config: dict                    # ProblemConfig.to_dict()
    train: dict                     # TrainConfig.to_dict()
    params: Sequence[torch.Tensor]
    generator: torch.Generator
    steps: int
    record_at: frozenset
    lr: float
    diverge_loss: float
    heads: int
    m: int
    dtype: torch.dtype


@dataclass
class Resume:
    """A checked checkpoint: everything a run continues from."""
    step: int
    params: list                    # CPU tensors, the run's shapes and dtypes
    generator_state: torch.Tensor
    losses: torch.Tensor            # (step,)
    trajectory: list                # dicts of RECORD_FIELDS
    wall_seconds: float


def payload(run: Run, step: int, params, generator: torch.Generator, losses: torch.Tensor, trajectory: list,
            wall_seconds: float) -> dict:
    """The dict a checkpoint at ``step`` holds (:data:`FIELDS`); ``losses`` the run's whole
    loss buffer, of which the first ``step`` are kept."""
    return {"version": CHECKPOINT_VERSION, "stream": run.stream, "model": run.kind, "estimator": run.estimator,
            "config": run.config, "train": run.train, "step": step,
            "params": [p.detach().cpu().clone() for p in params],
            "generator": generator.get_state(), "losses": losses[:step].cpu().clone(),
            "trajectory": trajectory, "wall_seconds": wall_seconds}


def _show(value, limit: int = 60) -> str:
    text = repr(value) if not torch.is_tensor(value) else f"a tensor of shape {tuple(value.shape)}, {value.dtype}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _plain_equal(a, b) -> bool:
    """a == b for the plain values of a configuration (str, int, float, bool, None, lists and
    dicts of them), False for anything else (a tensor, an object) rather than an error."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_plain_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_plain_equal(a[k], b[k]) for k in a)
    plain = (str, int, float, bool, type(None))
    return type(a) is type(b) and isinstance(a, plain) and a == b


def _is_number(v) -> bool:
    """A finite int or float (not a bool); an int beyond the float range is not."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


MAX_BYTES = 2 ** 30
"""The largest checkpoint read: the trainer's longest run (10^7 steps) keeps 80 MB of losses."""


def _load_bytes(path: str) -> bytes:
    """The file's bytes, its size within MAX_BYTES and the memory budget, its archive and pickle
    bounded before torch sees them (numerics.io.handed.check_torch_archive: a structure of shared
    references that torch's own loader would hash for hours is refused here)."""
    try:
        size = os.stat(path).st_size
        handed.check_memory(2 * size, f"loading its {size:,} bytes")
        data = read_input_bytes(path, "checkpoint", max_bytes=MAX_BYTES)
        handed.check_torch_archive(data, handed.memory_available())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path!r} is not a readable numerics.train checkpoint ({str(exc)[:300]}); "
                              "delete it to start afresh, or choose another checkpoint path") from None
    return data


def load(path: str) -> dict:
    """The checkpoint dict of the file at ``path`` (weights_only: plain tensors and
    containers, nothing unpickled; checked before loading by :func:`_load_bytes`), with exactly
    the keys :data:`FIELDS`; its values are checked by :func:`read`."""
    data = _load_bytes(path)
    try:
        ck = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        what = ("holds objects other than tensors and plain containers, which are never unpickled (weights_only): "
                "not a readable numerics.train checkpoint" if isinstance(exc, pickle.UnpicklingError)
                and "weights_only" in str(exc) else "exists but is not a readable numerics.train checkpoint "
                "(corrupt, truncated or another kind of file)")
        raise CheckpointError(f"checkpoint {path!r} {what}; delete it to start afresh, or choose another checkpoint "
                              "path") from None
    if not isinstance(ck, dict) or not all(isinstance(k, str) for k in ck):
        what = "a dict whose keys are not all names" if isinstance(ck, dict) else f"a {type(ck).__name__}"
        raise CheckpointError(f"checkpoint {path!r} is a torch file of {what}, not a numerics.train checkpoint (a "
                              "dict of named fields); delete it to start afresh, or choose another "
                              "checkpoint path")
    missing, extra = [k for k in FIELDS if k not in ck], sorted(set(ck) - set(FIELDS))
    if missing or extra:
        what = "; ".join(([f"missing field(s) {', '.join(missing)}"] if missing else [])
                         + ([f"unknown field(s) {_show(extra)}"] if extra else []))
        raise CheckpointError(f"checkpoint {path!r} is a torch file but not a numerics.train checkpoint ({what}); "
                              "delete it to start afresh, or choose another checkpoint path")
    return ck


def _identity_differences(ck: dict, run: Run) -> list:
    """What says the checkpoint is of another run: format, stream, model, estimator, configs."""
    diffs = []
    if not _plain_equal(ck["version"], CHECKPOINT_VERSION):
        diffs.append(f"version: checkpoint {_show(ck['version'])}, this code {CHECKPOINT_VERSION}")
    if not _plain_equal(ck["stream"], run.stream):    # the generator state continues only the same stream
        diffs.append(f"prompt stream: checkpoint version {_show(ck['stream'])}, this code version {run.stream} "
                     "(numerics.config changed how prompts are drawn)")
    for key, mine in (("estimator", run.estimator), ("model", run.kind)):
        if not _plain_equal(ck[key], mine):
            diffs.append(f"{key}: checkpoint {_show(ck[key])}, this run {mine!r}")
    for what, mine in (("config", run.config), ("train", run.train)):
        theirs = ck[what]
        if not isinstance(theirs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in theirs):
            diffs.append(f"{what}: checkpoint {_show(theirs)}, not a dict of named fields")
            continue
        skip = BOOKKEEPING if what == "train" else ()
        for k in sorted((set(theirs) | set(mine)) - set(skip)):
            if not _plain_equal(theirs.get(k), mine.get(k)):
                diffs.append(f"{what}.{k}: checkpoint {_show(theirs.get(k))}, this run {_show(mine.get(k))}")
    return diffs


def dense_problem(t: torch.Tensor) -> str | None:
    """Why a loaded tensor is not an array of values the file holds (None when it is): nested,
    sparse or another layout than strided, on the meta device (a shape without data) or another,
    or a view of more elements than its storage holds (a one-element storage seen as 15,000 x
    15,000 by zero strides: reading it would build 1.8 GB the file never held)."""
    if t.is_nested:
        return "a nested tensor, not a dense one"
    if t.layout != torch.strided:
        return f"a {t.layout} tensor, not a dense one"
    if t.device.type != "cpu":
        return f"a tensor on the {t.device.type} device, whose values are not in the file"
    held = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    if t.numel() > held:
        return (f"a view of shape {tuple(t.shape)} ({t.numel():,} values) on a storage of {held:,}: reading it would "
                "build values the file does not hold")
    return None


def _tensor_problem(t, shape, dtype) -> str | None:
    if not torch.is_tensor(t):
        return f"is {_show(t)}, not a tensor"
    dense = dense_problem(t)
    if dense:
        return f"is {dense}"
    if t.dtype != dtype:
        return f"has dtype {t.dtype}, this run's is {dtype}"
    if tuple(t.shape) != tuple(shape):
        return f"has shape {tuple(t.shape)}, this run's is {tuple(shape)}"
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        return f"holds {int((~torch.isfinite(t)).sum())} non-finite value(s)"
    return None


def _record_problem(r, k: int, losses: torch.Tensor, run: Run) -> str | None:
    if not isinstance(r, dict) or set(r) != set(RECORD_FIELDS):
        return f"is {_show(r)}, not a record of the fields {', '.join(RECORD_FIELDS)}"
    for name in ("t", "loss", "residual"):
        if not _is_number(r[name]):
            return f"field {name} is {_show(r[name])}, not a finite number"
    if r["t"] != k * run.lr:
        return f"has t = {r['t']!r}, the run records step {k} at t = {k * run.lr!r}"
    if r["loss"] != float(losses[k]):
        return f"has loss {r['loss']!r}, but the checkpoint's losses[{k}] is {float(losses[k])!r}"
    if r["residual"] < 0:
        return f"has residual {r['residual']!r} < 0"
    for name in ("omega", "mu"):
        v = r[name]
        if not (isinstance(v, list) and len(v) == run.heads
                and all(isinstance(row, list) and len(row) == run.m and all(map(_is_number, row)) for row in v)):
            return f"field {name} is {_show(v)}, not {run.heads} lists of {run.m} finite numbers (heads x m)"
    return None


def read(path: str, run: Run) -> Resume:
    """The checkpoint at ``path`` checked field by field against ``run`` (module docstring);
    :class:`CheckpointError` naming the first wrong field otherwise."""
    ck = load(path)
    diffs = _identity_differences(ck, run)
    if diffs:
        raise CheckpointError(f"checkpoint {path!r} belongs to a different run and cannot be resumed ("
                              + "; ".join(diffs) + "); use another --checkpoint path, pass the configuration it "
                              "was written for, or delete the file to start afresh")

    def bad(field: str, problem: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path!r}: {field} {problem}; {_DAMAGED}")

    step = ck["step"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= run.steps:
        raise bad("step", f"is {_show(step)}, not an integer in 0 .. {run.steps} (this run's steps)")

    params = ck["params"]
    if not isinstance(params, (list, tuple)) or len(params) != len(run.params):
        n = len(params) if isinstance(params, (list, tuple)) else None
        raise bad("params", f"is {_show(params) if n is None else f'a list of {n} tensor(s)'}, this run trains "
                            f"{len(run.params)} ({run.kind} model)")
    for i, (saved, mine) in enumerate(zip(params, run.params)):
        problem = _tensor_problem(saved, mine.shape, mine.dtype)
        if problem:
            raise bad(f"params[{i}]", problem)

    state = ck["generator"]
    fresh = run.generator.get_state()
    problem = _tensor_problem(state, fresh.shape, fresh.dtype)
    if problem:
        raise bad("generator", f"{problem} (a {run.generator.device.type} generator's state)")
    probe = torch.Generator(device=run.generator.device)
    try:
        probe.set_state(state)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise bad("generator", f"is not a valid generator state (torch: {str(exc).splitlines()[0]})") from None
    if probe.initial_seed() != run.generator.initial_seed():
        raise bad("generator", f"was seeded with {probe.initial_seed()}, this run's prompt stream with "
                               f"{run.generator.initial_seed()} (train.seed)")

    losses = ck["losses"]
    problem = _tensor_problem(losses, (step,), run.dtype)
    if problem:
        raise bad("losses", f"{problem} (one batch loss per step before step {step})")
    if step and float(losses.max()) > run.diverge_loss:
        k = int(losses.argmax())
        raise bad(f"losses[{k}]", f"= {float(losses[k])!r} is above diverge_loss = {run.diverge_loss:g}: a "
                            "diverged run is never checkpointed")

    trajectory = ck["trajectory"]
    recorded = sorted(k for k in run.record_at if k < step)
    if not isinstance(trajectory, list) or len(trajectory) != len(recorded):
        held = f"{len(trajectory)} record(s)" if isinstance(trajectory, list) else _show(trajectory)
        raise bad("trajectory", f"is {held}, this run records {len(recorded)} time(s) before step {step} (records, "
                                "record_every)")
    for i, (r, k) in enumerate(zip(trajectory, recorded)):
        problem = _record_problem(r, k, losses, run)
        if problem:
            raise bad(f"trajectory[{i}]", problem)

    wall = ck["wall_seconds"]
    if not _is_number(wall) or wall < 0:
        raise bad("wall_seconds", f"is {_show(wall)}, not a finite number >= 0")
    return Resume(step=step, params=list(params), generator_state=state, losses=losses, trajectory=trajectory,
                  wall_seconds=float(wall))
