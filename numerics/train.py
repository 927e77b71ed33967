"""Gradient flow, discretised as plain gradient descent, on the full model or on the
exact finite-L reduced model.

    theta_{k+1} = theta_k - eta * grad L_batch_k(theta_k),     t = eta * k,

no momentum, no Adam, no weight decay; a fresh batch of prompts per step by default (so the
iteration is an unbiased Euler discretisation of the population flow dtheta/dt = -grad L),
or one fixed batch (``fresh_batches=False``: the exact flow on that batch).  The reduced
flow moves (omega, mu) with the metric factors of cfg.param (numerics/reduced.py):
omega -= eta f_omega dL/domega, mu -= eta f_mu dL/dmu, drawing the same prompt stream as
:func:`train` for the same seed (one ``sample_prompts`` call per step, same generator); or,
with ``estimator="marginal"``, driven by the Rao-Blackwellised batch loss of
``numerics.exact_reduced`` (m Gaussians per token instead of d + m: ~5x cheaper per step than
the full model at tasks 4,4,4, H = 3, L = 256, docs/performance.md), a stream of its own.

Step k's batch is drawn, its loss recorded (before the update), the parameters updated; a
last batch at k = steps gives the final record.  ``TrainResult.loss`` is the mean of the
per-step batch losses over the last 10% of steps (at least one step): each batch loss is an
unbiased estimate of the population loss, so the average smooths the Monte-Carlo noise.

Divergence (a non-finite batch loss, or one above ``diverge_loss``) raises
:class:`TrainingDiverged` naming step, time and loss.  Checkpoints (``checkpoint=PATH``,
every ``checkpoint_every`` steps, written atomically) hold the parameters, the generator
state, the step, the losses and the trajectory; a run given an existing checkpoint resumes
from it and ends bit-identical to an uninterrupted run with the same configuration.  The
file's every field is checked against the run first (:func:`numerics.checkpoint.read`): a
checkpoint that is not this run's, or not whole, is refused, never resumed or replaced.

Every run is a run of numerics.batched.Program, the one gradient-descent loop of the project
(the claims, the sweep and the bench all run through it): a single run is a program of one
run, and :func:`train_many` / :func:`train_reduced_many` train runs of one shape together,
each run's numbers those of the run alone to rounding.  Seams: ``batches`` (a callable step
-> Prompts replacing the default stream of fresh batches: a fixed symmetrised batch, a
deliberately asymmetric one), ``on_record`` (a hook called at every record with (step, t,
state, loss), state = a copy of the model or of (omega, mu) at the record), ``record_every``
(records every k steps besides the evenly spaced ones), a start point (``start``: a model for
:func:`train`, trained in place, (omega0, mu0) for :func:`train_reduced`) and, for the reduced
flow, ``metric`` (the metric factors; default theory's, through
``numerics.reduced.metric_factors``; a perturbation check passes a deliberately wrong one).

``TrainResult.fingerprint`` = {"prompts": digest of the run's first batch, "weights": digest
of its initial state} (numerics.seeds.digest): runs counted as independent are checked to be
so by numerics.seeds.check_independent.

On CUDA, TF32 matmuls are switched off (``numerics.config.use_precise_float32``): the
precision checks need true float32/float64.

CLI: ``python -m numerics.train --help``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from numerics.io import (SEED_MAX, DiskFull, check_output_path, command_line, float_option, int_option, seed_option,
                         tasks_option, threads_option, write_output)

from .cost import MERGE_CONTEXT_ELEMENTS
from .batched import (Program, Record, Run, StackedAttention, StackedValues, Stream,
                      shape_key, stream_key)
from .config import INITS, PARAMS, ProblemConfig, check_known_fields
from .data import Prompts, make_generator, sample_prompts
from .model import MultiHeadAttention, TrainingDiverged, initial_semi_singular_values
from .exact_reduced import sample_marginal_prompts
from .reduced import metric_factors

BatchSource = Callable[[int], Prompts]
"""step -> the batch of prompts of that step."""
OnRecord = Callable[[int, float, object, float], None]
"""(step, t, state, batch loss) at every record; state: the model (full) or (omega, mu) (reduced)."""
Metric = Callable[[torch.Tensor, torch.Tensor], tuple]
"""(omega, mu) -> (f_omega, f_mu): the reduced flow moves omega -= lr f_omega dL/domega, mu likewise."""

MAX_STEPS = 10 ** 7
"""The most gradient steps (round(time / lr)) a run may have: a step takes a millisecond at the
least, so 10^7 is hours to days; the per-step loss record of a run holds steps + 1 numbers.
More is a typo (time 1e18, lr 1e-300), refused before anything is allocated."""

ESTIMATORS = ("prompts", "marginal")
"""Batch losses of the reduced flow: whole prompts (numerics.reduced) or the Rao-Blackwellised
marginals (numerics.exact_reduced); see :func:`train_reduced`."""


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 0.05           # eta: time step of gradient flow; t = lr * steps
    time: float = 60.0         # final time t_end
    batch: int = 2048          # fresh prompts each step
    seed: int = 0              # data seed (prompt stream); init uses cfg.init_seed
    records: int = 61          # trajectory records, evenly spaced in t (incl. 0 and t_end)
    fresh_batches: bool = True # False: one fixed batch (deterministic flow on that batch)
    symmetrize: bool = False
    checkpoint: Optional[str] = None     # path; resume from it if present
    checkpoint_every: int = 500       # steps
    progress: bool = False            # tqdm bar
    diverge_loss: float = 1e6         # loss above this, or non-finite -> TrainingDiverged

    def __post_init__(self):
        for name in ("lr", "time", "diverge_loss"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        for name, low in (("batch", 1), ("seed", 0), ("records", 2), ("checkpoint_every", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.seed > SEED_MAX:
            raise ValueError(f"seed must be an integer in 0 .. 2^64 - 1 (a 64-bit seed), got {self.seed}")
        if self.time < self.lr:
            raise ValueError(f"time ({self.time}) must be at least one step lr ({self.lr}); the run has "
                             "round(time / lr) steps")
        if not self.time / self.lr <= MAX_STEPS:
            raise ValueError(f"time / lr = {self.time:g} / {self.lr:g} = {self.time / self.lr:.3g} steps is more than "
                             f"the limit of {MAX_STEPS:,} steps (days of training even at a millisecond a step); "
                             "raise lr or lower time")
        if self.records > MAX_STEPS + 1:
            raise ValueError(f"records must be at most steps + 1, got {self.records}")
        if self.checkpoint is not None and not isinstance(self.checkpoint, (str, os.PathLike)):
            raise TypeError(f"checkpoint must be a path or None, got {self.checkpoint!r}")
        if self.checkpoint is not None:
            object.__setattr__(self, "checkpoint", os.fspath(self.checkpoint))

    @property
    def steps(self) -> int:
        """Number of GD steps: round(time / lr); the run ends at t = lr * steps."""
        return max(1, int(round(self.time / self.lr)))

    def record_steps(self) -> list[int]:
        """Steps at which a Record is taken: ``records`` evenly spaced, incl. 0 and steps."""
        n = self.steps
        return sorted({int(round(k * n / (self.records - 1))) for k in range(self.records)})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        check_known_fields(cls, d)
        return cls(**d)


@dataclass
class TrainResult:
    config: ProblemConfig
    train: TrainConfig
    trajectory: list[Record]
    omega: np.ndarray
    mu: np.ndarray
    loss: float                # mean of the losses of the last 10% of steps
    wall_seconds: float
    steps: int
    model: str = "full"        # "full" (train) or "reduced" (train_reduced)
    losses: Optional[np.ndarray] = field(default=None, repr=False)  # per-step batch losses (steps,)
    cpu_seconds: float = 0.0   # process CPU time (all threads) of this invocation's steps
    final_model: Optional[MultiHeadAttention] = field(default=None, repr=False)  # full model at the end (not serialised)
    batched_runs: int = 1      # runs of the one program it was trained in (not serialised)
    fingerprint: Optional[dict] = None   # {"prompts", "weights"}: digests of its first batch and initial state

    def to_dict(self) -> dict:
        """The JSON schema of the CLI (docs/numerics.md)."""
        final = self.trajectory[-1]
        return {
            "model": self.model,
            "config": self.config.to_dict(),
            "train": self.train.to_dict(),
            "steps": self.steps,
            "t_end": self.train.lr * self.steps,
            "trajectory": [asdict(r) for r in self.trajectory],
            "omega": np.asarray(self.omega).tolist(),
            "mu": np.asarray(self.mu).tolist(),
            "residual": final.residual,
            "loss": self.loss,
            "wall_seconds": self.wall_seconds,
            "seconds_per_step": self.wall_seconds / max(self.steps, 1),
            "cpu_seconds": self.cpu_seconds,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TrainResult":
        """The TrainResult of :meth:`to_dict`'s JSON, typed again (without the per-step losses
        and the final model, which are not serialised)."""
        missing = {"config", "train", "trajectory", "omega", "mu", "loss", "wall_seconds", "steps"} - set(d)
        if missing:
            raise ValueError(f"not a TrainResult dict: missing key(s) {sorted(missing)}")
        return cls(config=ProblemConfig.from_dict(d["config"]), train=TrainConfig.from_dict(d["train"]),
                   trajectory=[Record(**r) for r in d["trajectory"]], omega=np.asarray(d["omega"], float),
                   mu=np.asarray(d["mu"], float), loss=float(d["loss"]), wall_seconds=float(d["wall_seconds"]),
                   steps=int(d["steps"]), model=d.get("model", "full"), cpu_seconds=float(d.get("cpu_seconds", 0.0)),
                   fingerprint=d.get("fingerprint"))


def record_steps(tcfg: TrainConfig, record_every: Optional[int] = None) -> set:
    """The steps at which a run records: ``tcfg.record_steps()`` and every ``record_every``-th."""
    at = set(tcfg.record_steps())
    if record_every is not None:
        at |= set(range(0, tcfg.steps + 1, record_every))
    return at


def make_result(run: Run, kind: str, wall: float, cpu: float, batched_runs: int) -> TrainResult:
    """The TrainResult of a finished run of a program: the final record's values, and the loss =
    mean of the last 10% of its per-step batch losses."""
    step_losses = run.losses[:run.tcfg.steps].cpu().double().numpy()
    tail = max(1, int(math.ceil(0.1 * len(step_losses))))
    final = run.trajectory[-1]
    return TrainResult(config=run.cfg, train=run.tcfg, trajectory=run.trajectory, omega=np.asarray(final.omega),
                       mu=np.asarray(final.mu), loss=float(step_losses[-tail:].mean()), wall_seconds=wall,
                       steps=len(step_losses), model=kind, losses=step_losses, cpu_seconds=cpu,
                       final_model=run.final, batched_runs=batched_runs,
                       fingerprint={part: run.fingerprint[part] for part in ("prompts", "weights")})


def train(cfg: ProblemConfig, tcfg: TrainConfig, *, batches: Optional[BatchSource] = None,
          on_record: Optional[OnRecord] = None, record_every: Optional[int] = None,
          start: Optional[MultiHeadAttention] = None) -> TrainResult:
    """Plain GD (step lr = time step) on every weight of the full model from cfg's init (or
    from ``start``, a model trained in place), on fresh batches (or ``batches(step)``)."""
    return _alone("full", cfg, tcfg, dict(batches=batches, on_record=on_record, record_every=record_every,
                                          start=start))


def train_reduced(cfg: ProblemConfig, tcfg: TrainConfig, *, batches: Optional[BatchSource] = None,
                  on_record: Optional[OnRecord] = None, record_every: Optional[int] = None,
                  start: Optional[tuple] = None, metric: Optional[Metric] = None,
                  estimator: str = "prompts") -> TrainResult:
    """GD on (omega, mu) of the exact finite-L reduced model with cfg.param's metric factors
    (or ``metric``), from cfg's (decomposable) init (or ``start`` = (omega0, mu0), H x m; the
    caller's arrays are copied, never updated in place).

    ``estimator`` chooses the batch loss whose gradient drives the flow (both unbiased for
    L_L and its gradient):

    - ``"prompts"`` (default): :func:`numerics.reduced.reduced_loss` on whole prompts, the
      same prompt stream as :func:`train` for the same seed (or ``batches(step)`` -> Prompts);
    - ``"marginal"``: the Rao-Blackwellised estimator of ``numerics.exact_reduced``
      (:func:`~numerics.exact_reduced.marginal_losses` on
      :func:`~numerics.exact_reduced.sample_marginal_prompts`: the task vectors, the noise and
      the components of x orthogonal to q integrated out, m Gaussians per token instead of
      d + m, drawn in float32 and cast), a stream of its own from ``tcfg.seed`` (or
      ``batches(step)`` -> MarginalPrompts); ``symmetrize`` is a no-op (the labels are
      integrated out).  Its records are importance-weighted batch means of the same loss.
      Checkpoints record the estimator and refuse to resume under the other one."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    return _alone("reduced", cfg, tcfg, dict(batches=batches, on_record=on_record, record_every=record_every,
                                             start=start, metric=metric), estimator)


def _alone(kind: str, cfg, tcfg, seams: dict, estimator: str = "prompts") -> TrainResult:
    """One run: a program of one run; its error raised."""
    out = _train_all(kind, [cfg], [tcfg], {k: [v] for k, v in seams.items()}, estimator=estimator, alone=True)[0]
    if isinstance(out, BaseException):
        raise out
    return out


def train_reduced_many(cfgs, tcfgs, *, start: Optional[Sequence] = None, metric: Optional[Sequence] = None,
                       on_record: Optional[Sequence] = None) -> list:
    """Train many reduced flows, each exactly as :func:`train_reduced` (estimator "prompts")
    would (to rounding), the runs of one shape (numerics.batched.SHAPE_FIELDS) and batch size
    as one program: runs that draw the same prompts share one draw per step.  Returns one entry
    per run, in order: its TrainResult, or the exception that ended it (TrainingDiverged, or
    the one its on_record hook raised).  ``cfgs``, ``tcfgs`` as in :func:`train_many`;
    ``start`` ((omega0, mu0) or None), ``metric``, ``on_record`` (its state a copy of
    (omega, mu)) per run.  A run with a checkpoint is a program of its own."""
    return _train_all("reduced", cfgs, tcfgs, dict(batches=None, on_record=on_record, record_every=None,
                                                   start=start, metric=metric))


def train_many(cfgs, tcfgs, *, batches: Optional[Sequence] = None, on_record: Optional[Sequence] = None,
               record_every=None, start: Optional[Sequence] = None, max_runs: Optional[int] = None,
               read_records: bool = True) -> list:
    """Train many full-model runs, each exactly as :func:`train` would (to rounding), batching
    the compatible ones into one tensor program (``numerics.batched``).  Returns one entry per
    run, in order: its TrainResult, or the exception that ended it.

    ``cfgs``, ``tcfgs``: sequences of ProblemConfig and TrainConfig of equal length (a single
    one is used for every run); ``batches``, ``on_record``, ``start`` (sequences, None entries
    allowed) and ``record_every`` (an int for all, or a sequence) are train()'s seams per run.

    What is batched: runs with the same tasks, heads, L, param, basis (and basis_seed), dtype,
    device and batch size form a group (numerics.batched.SHAPE_FIELDS), trained as one or a few
    programs: at most ``max_runs`` runs each (default: as many as fit in half the free memory,
    by step_memory_bytes); the runs of one prompt stream together; on the CPU, runs of
    different streams share a program only while its contexts hold at most
    numerics.cost.MERGE_CONTEXT_ELEMENTS numbers (beyond, programs per stream: merging
    large streams gains nothing on a CPU).  Within a group everything else may differ: seed,
    sigma, init, init_scale, init_seed, given (omega, mu), logit_scale, start model, lr, time
    (so the number of steps: a run leaves the program at its last step), records and
    record_every, fresh_batches, symmetrize, diverge_loss, on_record and batches.  Runs that
    draw the same prompts (same seed, sigma, symmetrize and fresh_batches, no batch source of
    their own) share one draw per step.  A run with a checkpoint is a program of its own.

    How a run ends early without ending the others: a diverging run's entry is the
    TrainingDiverged train() would raise (same message); a run whose on_record hook raises
    gets that exception as its entry (the hook stops its run as it would stop train(), e.g.
    numerics.saddle's early stop).  A hook receives a copy of the run's model at the record
    (its weights then), as in train().  A start model is trained in place and is the result's
    final_model; a run that ends early leaves it at the weights of the step that ended it.
    ``wall_seconds`` and ``cpu_seconds`` of a batched run are its share of the program's (in
    proportion to its steps); ``batched_runs`` says how many runs the program had.
    ``read_records=False``: a record before a run's last step holds its loss only (omega, mu and
    residual None; the readout is most of a record's cost), for callers that read the loss curve
    and the end state alone."""
    if max_runs is not None and (isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1):
        raise ValueError(f"max_runs must be a positive integer or None, got {max_runs!r}")
    return _train_all("full", cfgs, tcfgs, dict(batches=batches, on_record=on_record, record_every=record_every,
                                                start=start), max_runs=max_runs, read_records=read_records)


def _train_all(kind: str, cfgs, tcfgs, seams: dict, *, estimator: str = "prompts",
               max_runs: Optional[int] = None, alone: bool = False, read_records: bool = True) -> list:
    """Every run of the four entry points: checked (all before any is trained), grouped into
    programs (:func:`_programs`), each trained by numerics.batched.Program; one entry per run."""
    cfgs, tcfgs, seams = _per_run(cfgs, tcfgs, seams)
    for i in range(len(cfgs)):
        _check_run(kind, i, cfgs, tcfgs, seams, estimator, "" if alone else f"[{i}]")
    starts = [s for s in seams["start"] if s is not None] if kind == "full" else []
    if len({id(s) for s in starts}) < len(starts):
        raise ValueError("a start model appears twice: each run trains its own start in place")
    out: list = [None] * len(cfgs)
    stack_type = StackedAttention if kind == "full" else StackedValues
    for part in _programs(kind, cfgs, tcfgs, seams["batches"], max_runs):
        runs, streams = _program_runs(part, cfgs, tcfgs, seams, estimator)
        for r in runs:
            r.read_records = read_records
        try:
            wall, cpu = Program(runs, streams, stack_type, tcfgs[part[0]].batch).run()
        except Exception as exc:        # a program of one run: ends this run only
            if len(part) > 1:
                raise
            out[part[0]] = exc
            continue
        total = sum(r.tcfg.steps for r in runs)
        for r in runs:
            share = r.tcfg.steps / total
            out[r.index] = r.error if r.error is not None else make_result(
                r, kind, r.wall_before + wall * share, cpu * share, len(runs))
    return out


def _per_run(cfgs, tcfgs, seams: dict) -> tuple[list, list, dict]:
    """cfgs and tcfgs as lists of one length (a single config for every run), and each seam as
    a list of one entry per run (None: none for every run; record_every also an int)."""
    cfgs = [cfgs] if isinstance(cfgs, ProblemConfig) else list(cfgs)
    tcfgs = [tcfgs] if isinstance(tcfgs, TrainConfig) else list(tcfgs)
    n = max(len(cfgs), len(tcfgs))
    cfgs, tcfgs = (cfgs * n if len(cfgs) == 1 else cfgs), (tcfgs * n if len(tcfgs) == 1 else tcfgs)
    if len(cfgs) != n or len(tcfgs) != n:
        raise ValueError(f"cfgs and tcfgs must have the same length (or one of them a single config), got "
                         f"{len(cfgs)} and {len(tcfgs)}")
    out = {}
    for name, value in seams.items():
        value = [value] * n if value is None or (name == "record_every" and isinstance(value, int)) else list(value)
        if len(value) != n:
            raise ValueError(f"{name} must have one entry per run ({n}), got {len(value)}")
        out[name] = value
    return cfgs, tcfgs, out


def _check_run(kind: str, i: int, cfgs: list, tcfgs: list, seams: dict, estimator: str, where: str) -> None:
    """Run i's arguments, refused with a one-line error; a reduced start made (omega0, mu0)
    tensors of the run's dtype and device (a copy: the caller's arrays are never updated)."""
    cfg, tcfg, run = cfgs[i], tcfgs[i], f"run {i}: " if where else ""
    if not isinstance(cfg, ProblemConfig):
        raise TypeError(f"cfg{where} must be a ProblemConfig, got {type(cfg).__name__}")
    if not isinstance(tcfg, TrainConfig):
        raise TypeError(f"tcfg{where} must be a TrainConfig, got {type(tcfg).__name__}")
    for name in ("batches", "on_record", "metric"):
        if seams.get(name, [None] * len(cfgs))[i] is not None and not callable(seams[name][i]):
            raise TypeError(f"{name}{where} must be callable, got {type(seams[name][i]).__name__}")
    every = seams["record_every"][i]
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(f"record_every{where} must be a positive integer or None, got {every!r}")
    if seams["batches"][i] is not None and tcfg.checkpoint is not None:
        raise ValueError(f"{run}a run with its own batch source cannot be checkpointed (the source's state is not "
                         "saved); drop checkpoint or the batches")
    if tcfg.symmetrize and estimator != "marginal" and tcfg.batch % 2 ** cfg.m:
        raise ValueError(f"{run}symmetrize=True needs batch to be a multiple of 2^m = {2 ** cfg.m} (every prompt "
                         f"is used under all per-task sign flips); got batch={tcfg.batch}")
    start = seams["start"][i]
    if kind == "reduced":
        seams["start"][i] = _start_values(cfg, start)
    elif start is not None and not isinstance(start, MultiHeadAttention):
        raise TypeError(f"start{where} must be a MultiHeadAttention (the model to train), got {type(start).__name__}")
    elif start is not None and start.cfg != cfg:
        raise ValueError(f"start{where} was built for a different ProblemConfig than cfg{where}")


def _start_values(cfg: ProblemConfig, start) -> tuple[torch.Tensor, torch.Tensor]:
    """(omega0, mu0) of a reduced flow: cfg's decomposable start or ``start``, copied (torch.as_tensor
    shares memory with a float64 numpy array) to the run's dtype and device."""
    omega0, mu0 = initial_semi_singular_values(cfg) if start is None else start
    out = tuple(torch.as_tensor(np.asarray(v.detach().cpu() if torch.is_tensor(v) else v, dtype=float))
                .to(cfg.device, cfg.torch_dtype).clone() for v in (omega0, mu0))
    for name, v in zip(("omega0", "mu0"), out):
        if tuple(v.shape) != (cfg.heads, cfg.m):
            raise ValueError(f"start {name} must have shape (heads, m) = ({cfg.heads}, {cfg.m}), got {tuple(v.shape)}")
    return out


def _programs(kind: str, cfgs: list, tcfgs: list, batches: list, max_runs: Optional[int]) -> list:
    """The runs (indices) of each program: a group of one shape and batch size (a checkpointed run
    alone); a full-model group cut into programs of at most ``max_runs`` runs (default: what fits
    in half the free memory), the runs of one stream together, and on the CPU several streams
    together only while their contexts hold at most MERGE_CONTEXT_ELEMENTS numbers.  Streams share
    a program only with streams of as many runs: then each stream's runs read its context as one
    (numerics.batched._Layout); with unequal counts every run reads a copy of its own (24 runs of
    one stream beside 6 runs of their own: 1.7x the CPU time of the two programs, float32)."""
    groups: dict = {}
    for i, (cfg, tcfg) in enumerate(zip(cfgs, tcfgs)):
        groups.setdefault(("alone", i) if tcfg.checkpoint is not None else (shape_key(cfg), tcfg.batch), []).append(i)
    parts: list = []
    for members in groups.values():
        cfg0, tcfg0 = cfgs[members[0]], tcfgs[members[0]]
        if kind == "reduced" or len(members) == 1:
            parts.append(members)
            continue
        free = _available_memory(cfg0.device) if max_runs is None else None
        cap = max_runs or (len(members) if free is None else
                           max(1, int(free // 2 // max(step_memory_bytes(cfg0, tcfg0.batch), 1))))
        streams: dict = {}
        for i in members:
            streams.setdefault(("source", i) if batches[i] is not None else stream_key(cfgs[i], tcfgs[i]), []).append(i)
        per_stream = tcfg0.batch * cfg0.L * cfg0.token_dim
        budget = max(1, MERGE_CONTEXT_ELEMENTS // per_stream) if cfg0.torch_device.type == "cpu" else len(streams)
        chunks: dict = {}
        for runs_of_stream in streams.values():
            for lo in range(0, len(runs_of_stream), cap):
                chunk = runs_of_stream[lo:lo + cap]
                chunks.setdefault(len(chunk), []).append(chunk)
        for same_count in chunks.values():
            part, held = [], 0
            for chunk in same_count:
                if part and (held + 1 > budget or len(part) + len(chunk) > cap):
                    parts.append(part)
                    part, held = [], 0
                part, held = part + chunk, held + 1
            parts.append(part)
    return parts


def _program_runs(part: list, cfgs: list, tcfgs: list, seams: dict, estimator: str) -> tuple[list, list]:
    """The Run of each index of ``part`` and the streams they read: one per distinct stream_key
    (a shared draw), one per batch source."""
    streams, keyed, runs = [], {}, []
    for i in part:
        cfg, tcfg, source = cfgs[i], tcfgs[i], seams["batches"][i]
        key = ("source", i) if source is not None else stream_key(cfg, tcfg)
        if key not in keyed:
            keyed[key], draw = len(streams), _sampler(cfg, tcfg, estimator)
            fixed = None if tcfg.fresh_batches or source is not None else draw(make_generator(tcfg.seed, cfg.device))
            streams.append(Stream(draw, source=source) if source is not None else
                           Stream(draw, tcfg.seed, make_generator(tcfg.seed, cfg.device), fixed))
        metric = seams.get("metric", [None] * len(cfgs))[i]
        if "metric" in seams and metric is None:
            metric = lambda o, m_, cfg=cfg: metric_factors(o, m_, cfg)  # noqa: E731
        runs.append(Run(i, cfg, tcfg, keyed[key], record_steps(tcfg, seams["record_every"][i]), seams["on_record"][i],
                        start=seams["start"][i], metric=metric, estimator=estimator))
    return runs, streams


def _sampler(cfg: ProblemConfig, tcfg: TrainConfig, estimator: str) -> Callable:
    """A stream's draw: (generator, out=None) -> the step's batch.  Whole prompts: each fresh
    batch overwrites the last one's tensors (out=): it is dead once the step is taken, and
    drawing into memory already touched saves the fresh pages' faults.  Marginal prompts: m
    Gaussians per token (plus |q_i|) instead of d + m, drawn in float32 and cast as
    numerics.data draws whole prompts; symmetrize has nothing to do there (the labels are
    integrated out, so the sign-flip identities hold on every batch)."""
    if estimator == "marginal":
        return lambda g, out=None: sample_marginal_prompts(cfg.tasks, cfg.L, tcfg.batch, g, cfg.torch_dtype,
                                                           cfg.device, draw_dtype=torch.float32, blocks_major=True)
    return lambda g, out=None: sample_prompts(cfg, tcfg.batch, g, tcfg.symmetrize, out=out)



# --- command line ------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m numerics.train",
        description="Train the one-layer multi-head softmax attention model (or its exact finite-L "
                    "reduced model) by plain gradient descent = discretised gradient flow, and write "
                    "the trajectory of the semi-singular values (omega, mu) as JSON.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("problem")
    g.add_argument("--tasks", type=tasks_option(), default=(3, 3), help="comma-separated task block sizes r_1,..,r_m (d = sum)")
    g.add_argument("--heads", type=int_option("--heads", 1), default=2, help="number of heads H")
    g.add_argument("--L", type=int_option("--L", 1), default=128, help="context length L")
    g.add_argument("--sigma", type=float_option("--sigma", finite=False), default=0.0, help="label noise standard deviation")
    g.add_argument("--basis", choices=("identity", "random"), default="identity",
                   help="task basis Phi: contiguous blocks or a seeded Haar-random orthonormal basis")
    g.add_argument("--basis-seed", type=seed_option("--basis-seed"), default=None,
                   help="seed of the random basis (with --basis random; default 0)")
    g.add_argument("--param", choices=PARAMS, default="factored",
                   help="factored: train K,Q,V,O with W=K^T Q/s, U=O V; merged: train W, U")
    g.add_argument("--logit-scale", type=float_option("--logit-scale", finite=False), default=None,
                   help="s in W = K^T Q / s (--param factored only; default 1)")
    g.add_argument("--init", type=float_option("--init", finite=False), default=0.15,
                   help="initial scale s0: omega = s0, mu = s0 (2 s0 on head h's task h mod m)")
    g.add_argument("--init-pattern", choices=[i for i in INITS if i != "given"], default="decomposable",
                   help="initialisation pattern (see docs/numerics.md; init='given' needs the Python API)")
    g.add_argument("--init-seed", type=seed_option("--init-seed"), default=None,
                   help="seed of the random initialisation patterns (not with the deterministic 'decomposable'; default 0)")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float64", help="floating point type")
    g.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (TF32 is switched off on cuda)")
    g.add_argument("--threads", type=threads_option("--threads"), default=None,
                   help="torch CPU threads (torch.set_num_threads), at most 4 x the CPUs; default: torch's own choice")
    g = p.add_argument_group("training")
    g.add_argument("--time", type=float_option("--time", finite=False), default=60.0, help="final time t_end; steps = round(time / lr)")
    g.add_argument("--lr", type=float_option("--lr", finite=False), default=0.05, help="GD step = time step of the gradient flow")
    g.add_argument("--batch", type=int_option("--batch", 1), default=2048, help="prompts per step")
    g.add_argument("--seed", type=seed_option("--seed"), default=0, help="seed of the prompt stream (0 .. 2^64 - 1)")
    g.add_argument("--records", type=int_option("--records", 2), default=None,
                   help="trajectory records, evenly spaced in t, at most steps + 1 (default: 61, or steps + 1 "
                        "for a run of fewer than 60 steps)")
    g.add_argument("--fixed-batch", action="store_true",
                   help="one fixed batch for all steps instead of fresh batches")
    g.add_argument("--symmetrize", action="store_true",
                   help="apply the per-task sign-flip group to every prompt (batch multiple of 2^m)")
    g.add_argument("--diverge-loss", type=float_option("--diverge-loss", finite=False), default=1e6, help="stop with an error above this loss")
    g.add_argument("--reduced", action="store_true",
                   help="train the exact finite-L reduced model on (omega, mu) instead of the full model")
    g = p.add_argument_group("output")
    g.add_argument("--out", default="run.json", help="JSON result file (written atomically at the end)")
    g.add_argument("--checkpoint", default=None,
                   help="checkpoint file: written every --checkpoint-every steps, resumed from if present")
    g.add_argument("--checkpoint-every", type=int_option("--checkpoint-every", 1), default=None,
                   help="steps between checkpoints (with --checkpoint; default 500)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def step_memory_bytes(cfg: ProblemConfig, batch: int) -> int:
    """Rough peak bytes of one training step, for refusing a run that cannot fit before it
    allocates: with D = d + m, E = B L D context elements and G = B L H logit-sized ones, a
    step holds the context and the sampler's inputs (2 E), the logits, softmax weights and
    their gradients (about 5 G), the parameters and their gradients (about 4 H D^2 + 2 H m D),
    and the basis (d^2), each ``itemsize`` bytes. A lower-order estimate: it decides only
    whether the run is hopeless, not how close it comes."""
    item = 4 if cfg.dtype == "float32" else 8
    D, H, L, d, m = cfg.token_dim, cfg.heads, cfg.L, cfg.d, cfg.m
    E, G = batch * L * D, batch * L * H
    return item * (2 * E + 5 * G + 4 * H * D * D + 2 * H * m * D + d * d)


def _available_memory(device: str) -> Optional[int]:
    """Bytes free for the run: MemAvailable on CPU (Linux), free device memory on CUDA;
    None where it cannot be read (then no refusal)."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


DEFAULT_RECORDS = 61

# configuration fields -> the flag that sets them, so that a message of ProblemConfig or
# TrainConfig ("lr must be ...") names the flag the user typed ("--lr must be ...")
_FIELD_FLAGS = (("time / lr", "--time / --lr"), ("tasks", "--tasks"), ("heads", "--heads"), ("L", "--L"),
                ("sigma", "--sigma"), ("basis_seed", "--basis-seed"), ("logit_scale", "--logit-scale"),
                ("init_scale", "--init"), ("init_seed", "--init-seed"), ("device", "--device"),
                ("lr", "--lr"), ("time", "--time"), ("batch", "--batch"), ("seed", "--seed"),
                ("records", "--records"), ("checkpoint_every", "--checkpoint-every"),
                ("diverge_loss", "--diverge-loss"), ("checkpoint", "--checkpoint"))


def _flag_message(text: str) -> str:
    for name, flag in _FIELD_FLAGS:
        if text.startswith(name + " "):
            return flag + text[len(name):]
    return text


def _configs(parser: argparse.ArgumentParser, args) -> tuple[ProblemConfig, TrainConfig]:
    """The run's configurations from the parsed flags, after every check that does not need the
    computation (parser.error: exit 2, nothing computed)."""
    # options that would be silently ignored are refused: the user meant something by them
    ignored = [(args.basis_seed is not None and args.basis != "random",
                "--basis-seed is used only with --basis random (the identity basis has no seed)"),
               (args.init_seed is not None and args.init_pattern == "decomposable",
                "--init-seed is used only by the random --init-pattern values (the default 'decomposable' "
                "start is deterministic)"),
               (args.logit_scale is not None and args.param != "factored",
                "--logit-scale is used only with --param factored (merged weights have no logit scale)"),
               (args.checkpoint_every is not None and args.checkpoint is None,
                "--checkpoint-every is used only with --checkpoint PATH")]
    for bad, why in ignored:
        if bad:
            parser.error(f"{why}; drop it or add what it needs")
    try:
        cfg = ProblemConfig(tasks=args.tasks, heads=args.heads, L=args.L, sigma=args.sigma, basis=args.basis,
                            basis_seed=args.basis_seed or 0, param=args.param,
                            logit_scale=1.0 if args.logit_scale is None else args.logit_scale,
                            init=args.init_pattern, init_scale=args.init, init_seed=args.init_seed or 0,
                            dtype=args.dtype, device=args.device)
        tcfg = TrainConfig(lr=args.lr, time=args.time, batch=args.batch, seed=args.seed,
                           records=args.records if args.records is not None else DEFAULT_RECORDS,
                           fresh_batches=not args.fixed_batch,
                           symmetrize=args.symmetrize, checkpoint=args.checkpoint,
                           checkpoint_every=args.checkpoint_every or 500, progress=not args.no_progress,
                           diverge_loss=args.diverge_loss)
    except (ValueError, TypeError) as exc:
        parser.error(_flag_message(str(exc)))
    # every check that does not need the computation, before it
    if args.records is None and tcfg.records > tcfg.steps + 1:   # the default, for a short run: what it records
        tcfg = dataclasses.replace(tcfg, records=tcfg.steps + 1)
    if tcfg.records > tcfg.steps + 1:
        parser.error(f"--records {tcfg.records} is more than the run has steps + 1 = {tcfg.steps + 1} "
                     f"(time {tcfg.time:g} / lr {tcfg.lr:g} = {tcfg.steps} steps); pass --records "
                     f"{tcfg.steps + 1} or fewer, or a longer --time")
    if tcfg.symmetrize and tcfg.batch % 2 ** cfg.m:
        parser.error(f"--symmetrize needs --batch to be a multiple of 2^m = {2 ** cfg.m} (every prompt is used "
                     f"under all {2 ** cfg.m} per-task sign flips); got --batch {tcfg.batch}: pass --batch "
                     f"{max(1, tcfg.batch // 2 ** cfg.m) * 2 ** cfg.m}")
    need, free = step_memory_bytes(cfg, tcfg.batch), _available_memory(cfg.device)
    if free is not None and need > free:
        parser.error(f"this run needs about {need / 2**30:.3g} GiB per step (batch {tcfg.batch} x L {cfg.L} x "
                     f"D {cfg.token_dim} context, batch x L x heads {cfg.heads} attention weights, heads x D^2 "
                     f"weights) but {free / 2**30:.3g} GiB is available on {cfg.device}; lower --batch, --L, "
                     "--heads or the task sizes")
    return cfg, tcfg


@command_line
def main(argv=None) -> int:
    """Exit status: 0 done; 1 training diverged; 2 bad arguments (nothing computed, nothing
    written); 75 the disk is full (numerics.io.EXIT_DISK_FULL: the checkpoint written last is
    whole, and a result that cannot be written is printed on stdout instead)."""
    parser = _parser()
    args = parser.parse_args(argv)
    cfg, tcfg = _configs(parser, args)
    try:
        if tcfg.checkpoint is not None:
            ckpt = check_output_path(tcfg.checkpoint, "--checkpoint")
            if os.path.exists(ckpt) and not os.path.isfile(ckpt):      # a device: never a checkpoint
                raise ValueError(f"--checkpoint {tcfg.checkpoint} is not a regular file; a checkpoint is written "
                                 "and read back: choose a file path")
        # the checkpoint is this run's input when it resumes: the result never overwrites it
        out = check_output_path(args.out, "--out", inputs=(tcfg.checkpoint,))
    except ValueError as exc:
        parser.error(str(exc))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        result = (train_reduced if args.reduced else train)(cfg, tcfg)
    except TrainingDiverged as exc:
        print(f"error: {exc}\n(no output written)", file=sys.stderr)
        return 1
    except ValueError as exc:   # e.g. a checkpoint of another run: a usage error
        print(f"error: {_flag_message(str(exc))}\n(no output written)", file=sys.stderr)
        return 2
    text = json.dumps(result.to_dict(), indent=1)
    try:
        write_output(out, text)
    except DiskFull:   # the run is not lost: its JSON on stdout; command_line says "disk full", exit 75
        print(text)
        raise
    print(f"wrote {args.out}: {result.steps} steps in {result.wall_seconds:.1f} s "
          f"({result.wall_seconds / result.steps * 1e3:.2f} ms/step), final loss {result.loss:.5g}")
    print("omega =", np.array2string(result.omega, precision=4))
    print("mu    =", np.array2string(result.mu, precision=4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
