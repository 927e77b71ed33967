"""Gradient flow, discretised as plain gradient descent, on the full model or on the
exact finite-L reduced model.

    theta_{k+1} = theta_k - eta * grad L_batch_k(theta_k),     t = eta * k,

no momentum, no Adam, no weight decay; a fresh batch of prompts per step by default (so the
iteration is an unbiased Euler discretisation of the population flow dtheta/dt = -grad L),
or one fixed batch (``fresh_batches=False``: the exact flow on that batch).  The reduced
flow moves (omega, mu) with the metric factors of cfg.param (numerics/model.py):
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

Every run is a run of :class:`Program`, the one gradient-descent loop of the project (the
claims, the sweep and the bench all run through it): a single run is a program of one run,
and :func:`train_many` / :func:`train_reduced_many` train runs of one shape together, each
run's numbers those of the run alone to rounding.  Seams: ``batches`` (a callable step
-> Prompts replacing the default stream of fresh batches: a fixed symmetrised batch, a
deliberately asymmetric one), ``on_record`` (a hook called at every record with (step, t,
state, loss), state = a copy of the model or of (omega, mu) at the record), ``record_every``
(records every k steps besides the evenly spaced ones), a start point (``start``: a model for
:func:`train`, trained in place, (omega0, mu0) for :func:`train_reduced`) and, for the reduced
flow, ``metric`` (the metric factors; default theory's, through
``numerics.model.metric_factors``; a perturbation check passes a deliberately wrong one).

``TrainResult.fingerprint`` = {"prompts": digest of the run's first batch, "weights": digest
of its initial state} (numerics.engine.digest): runs counted as independent are checked to be
so by numerics.engine.check_independent.

On CUDA, TF32 matmuls are switched off (``numerics.config.use_precise_float32``): the
precision checks need true float32/float64.

CLI: ``python -m numerics.train --help``.

The program: R runs of one shape as one tensor program.  The runs' state carries a leading
run axis:

- the full model (:class:`StackedAttention`): the weights of all runs stacked, (R, H, D, D)
  and (R, H, m, D); with k runs per stream, the k H heads of a stream's runs read its context
  together (one bmm for the logits and one for the weighted context over all S B prompts),
  exactly numerics.model.MultiHeadAttention.forward with heads and runs folded into one axis;
  each run moves by plain GD, theta_r -= lr_r grad L_r;
- the reduced flow (:class:`StackedValues`): the semi-singular values stacked, omega and mu
  (R, H, m), the loss numerics.model.predict_from_scores's formula with the runs' heads on
  one axis (or, estimator "marginal", numerics.exact_reduced.marginal_mean_loss per run); each
  run moves with its metric factors, omega_r -= lr_r f_omega(omega_r, mu_r) dL_r/domega_r,
  mu_r likewise.

The prompts of each distinct stream are drawn once per step, (S, B, L, D), S <= R: runs that
draw the same prompts (same seed, sigma, symmetrize and fresh_batches, no batch source of
their own) share one draw.  One backward pass of the sum of the per-run losses (the runs share
no parameter, so the gradient of the sum with respect to run r's state is that of run r's
loss) and one update.  Why stacking and not torch.func.vmap (measured, one thread, forward +
backward of 8 runs, tasks 2,2, H = 2, float64, CPU ms; docs/performance.md): at L = 32, batch
512, on one shared batch vmap(grad) took 24.0 against 6.2 stacked (vmap expands the shared
context per run; 16.6 the runs one after another), on 8 batches of their own 13.3 against
10.2; at L = 64, batch 1024: 64.7 / 12.5 and 32.3 / 21.2.

A run leaves the program at its last step, when its batch loss diverges (its result is the
TrainingDiverged naming step, time and loss) or when its on_record hook raises (that
exception); the remaining runs are packed again (a copy of their state, rare).  A program of
one run may be checkpointed (:class:`_Checkpoint`): a resumed run ends bit-identical to the
run uninterrupted.  Each run's :func:`fingerprint`-s (its first batch, its initial state)
make its independence from the other runs a checked fact (numerics.engine.check_independent).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from numerics.io import (SEED_MAX, DiskFull, check_output_path, command_line, float_option, int_option, seed_option,
                         tasks_option, threads_option, write_output)

from .config import (INITS, PARAMS, STREAM_VERSION, ProblemConfig, Prompts, make_generator,
                     sample_prompts, use_precise_float32)
from .engine import MERGE_CONTEXT_ELEMENTS, digest
from .exact_reduced import marginal_mean_loss, sample_marginal_prompts
from .model import (MultiHeadAttention, TrainingDiverged, attend, block_scores, initial_semi_singular_values,
                    metric_factors, readout, stacked_metric_factors)


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
"""Batch losses of the reduced flow: whole prompts (numerics.model) or the Rao-Blackwellised
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
        if self.checkpoint is not None:
            object.__setattr__(self, "checkpoint", os.fspath(self.checkpoint))

    @property
    def steps(self) -> int:
        """Number of GD steps: round(time / lr); the run ends at t = lr * steps."""
        return max(1, int(round(self.time / self.lr)))

    def record_steps(self, every: Optional[int] = None) -> list[int]:
        """Steps at which a Record is taken: ``records`` evenly spaced, incl. 0 and steps (and
        every ``every``-th step)."""
        n = self.steps
        at = {int(round(k * n / (self.records - 1))) for k in range(self.records)}
        return sorted(at | set(range(0, n + 1, every)) if every else at)

    def to_dict(self) -> dict:
        return asdict(self)


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

    - ``"prompts"`` (default): :func:`numerics.model.reduced_loss` on whole prompts, the
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
    would (to rounding), the runs of one shape (:data:`SHAPE_FIELDS`) and batch size
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
    the compatible ones into one tensor program (:class:`Program`).  Returns one entry per
    run, in order: its TrainResult, or the exception that ended it.

    ``cfgs``, ``tcfgs``: sequences of ProblemConfig and TrainConfig of equal length (a single
    one is used for every run); ``batches``, ``on_record``, ``start`` (sequences, None entries
    allowed) and ``record_every`` (an int for all, or a sequence) are train()'s seams per run.

    What is batched: runs with the same tasks, heads, L, param, basis (and basis_seed), dtype,
    device and batch size form a group (:data:`SHAPE_FIELDS`), trained as one or a few
    programs: at most ``max_runs`` runs each (default: as many as fit in half the free memory,
    by step_memory_bytes); the runs of one prompt stream together; on the CPU, runs of
    different streams share a program only while its contexts hold at most
    numerics.engine.MERGE_CONTEXT_ELEMENTS numbers (beyond, programs per stream: merging
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
    return _train_all("full", cfgs, tcfgs, dict(batches=batches, on_record=on_record, record_every=record_every,
                                                start=start), max_runs=max_runs, read_records=read_records)


def _train_all(kind: str, cfgs, tcfgs, seams: dict, *, estimator: str = "prompts",
               max_runs: Optional[int] = None, alone: bool = False, read_records: bool = True) -> list:
    """Every run of the four entry points: checked (all before any is trained), grouped into
    programs (:func:`_programs`), each trained by :class:`Program`; one entry per run."""
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
    (:class:`_Layout`); with unequal counts every run reads a copy of its own (24 runs of
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
            metric = functools.partial(metric_factors, cfg=cfg)
        runs.append(Run(i, cfg, tcfg, keyed[key], set(tcfg.record_steps(seams["record_every"][i])), seams["on_record"][i],
                        start=seams["start"][i], metric=metric, estimator=estimator))
    return runs, streams


def _sampler(cfg: ProblemConfig, tcfg: TrainConfig, estimator: str) -> Callable:
    """A stream's draw: (generator, out=None) -> the step's batch.  Whole prompts: each fresh
    batch overwrites the last one's tensors (out=): it is dead once the step is taken, and
    drawing into memory already touched saves the fresh pages' faults.  Marginal prompts: m
    Gaussians per token (plus |q_i|) instead of d + m, drawn in float32 and cast as
    numerics.config draws whole prompts; symmetrize has nothing to do there (the labels are
    integrated out, so the sign-flip identities hold on every batch)."""
    if estimator == "marginal":
        return lambda g, out=None: sample_marginal_prompts(cfg.tasks, cfg.L, tcfg.batch, g, cfg.torch_dtype,
                                                           cfg.device, draw_dtype=torch.float32, blocks_major=True)
    return lambda g, out=None: sample_prompts(cfg, tcfg.batch, g, tcfg.symmetrize, out=out)


# --- the one program -----------------------------------------------------------------------

FACTORED = ("K", "Q", "V", "O")
MERGED = ("W", "U")

SHAPE_FIELDS = ("tasks", "heads", "L", "param", "basis", "basis_seed", "dtype", "device")
"""The ProblemConfig fields that fix a program's tensor shapes and arithmetic: runs that agree
on them (and on the batch size) can share one program; every other field (sigma, init,
init_scale, init_seed, init_omega, init_mu, logit_scale) may differ from run to run."""

def shape_key(cfg: ProblemConfig) -> tuple:
    return tuple(getattr(cfg, f) for f in SHAPE_FIELDS)


def stream_key(cfg: ProblemConfig, tcfg) -> tuple:
    """Runs of one shape_key and batch size with equal keys draw the same prompts (the stream
    make_generator(seed) and the sampler of cfg, which reads sigma, and symmetrize; a fixed
    batch when not fresh_batches)."""
    return (tcfg.seed, cfg.sigma, tcfg.symmetrize, tcfg.fresh_batches)


@dataclass
class Record:
    t: float
    loss: float
    omega: list
    mu: list
    residual: float


def diverged(loss: float, tcfg) -> bool:
    """The divergence rule: a batch loss that is not finite or exceeds ``tcfg.diverge_loss``."""
    return not math.isfinite(loss) or loss > tcfg.diverge_loss


def divergence(step: int, loss: float, cfg: ProblemConfig, tcfg) -> TrainingDiverged:
    """The error of a run whose batch loss at ``step`` broke the rule of :func:`diverged`."""
    why = "non-finite" if not math.isfinite(loss) else f"above diverge_loss = {tcfg.diverge_loss:g}"
    return TrainingDiverged(f"training diverged at step {step} (t = {step * tcfg.lr:.6g}): batch loss {loss!r} "
                            f"({why}); lower the learning rate (lr = {tcfg.lr:g}) or the initial scale "
                            f"(init_scale = {cfg.init_scale:g})")


def fingerprint(*items) -> str:
    """numerics.engine.digest of tensors (a Prompts or MarginalPrompts stands for its fields)."""
    flat = [t for x in items for t in ([getattr(x, f.name) for f in fields(x)] if is_dataclass(x) else [x])]
    return digest(*(t.detach().to("cpu", torch.float64).numpy() for t in flat))


class StackedAttention:
    """The weights of R runs of MultiHeadAttention of one shape on a leading run axis, and
    their readouts.  ``params``: name -> (R, ...) leaf tensor (K, Q, V, O or W, U);
    ``scale``: (R, 1, 1, 1) logit scales s_r (factored)."""
    kind = "full"

    def __init__(self, cfgs: Sequence[ProblemConfig], params: dict):
        self.cfgs = list(cfgs)
        cfg0 = self.cfgs[0]
        self.names = FACTORED if cfg0.param == "factored" else MERGED
        self.params = params
        self.scale = torch.tensor([c.logit_scale for c in self.cfgs], dtype=cfg0.torch_dtype,
                                  device=cfg0.device).view(-1, 1, 1, 1)

    @classmethod
    def from_models(cls, models: Sequence[MultiHeadAttention]) -> "StackedAttention":
        """The runs' current weights, copied into stacked tensors."""
        names = FACTORED if models[0].cfg.param == "factored" else MERGED
        params = {n: torch.stack([getattr(m, n).detach() for m in models]).requires_grad_(True) for n in names}
        return cls([m.cfg for m in models], params)

    @classmethod
    def from_runs(cls, runs: Sequence["Run"]) -> "StackedAttention":
        return cls.from_models([r.start if r.start is not None else MultiHeadAttention(r.cfg) for r in runs])

    def select(self, keep: Sequence[int]) -> "StackedAttention":
        """The runs ``keep`` (positions in this stack), in that order, as a new stack."""
        idx = torch.as_tensor(list(keep), dtype=torch.long, device=self.params[self.names[0]].device)
        return StackedAttention([self.cfgs[i] for i in keep],
                                {n: p.detach().index_select(0, idx).requires_grad_(True)
                                 for n, p in self.params.items()})

    @property
    def tensors(self) -> list:
        return [self.params[n] for n in self.names]

    def run_tensors(self, r: int) -> list:
        """Run r's parameters (views of the stack), in the model's parameter order."""
        return [self.params[n][r] for n in self.names]

    def model(self, r: int) -> MultiHeadAttention:
        """Run r as a MultiHeadAttention holding a copy of its current weights."""
        return MultiHeadAttention.from_parameters(self.cfgs[r], **{n: p[r].detach().clone()
                                                                   for n, p in self.params.items()})

    hook_state = model

    def merged_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W (R, H, D, D) = K^T Q / s_r and U (R, H, m, D) = O V (or the trained W, U)."""
        p = self.params
        if "W" in p:
            return p["W"], p["U"]
        return torch.matmul(p["K"].transpose(-1, -2), p["Q"]) / self.scale, torch.matmul(p["O"], p["V"])

    def readout(self, r: int, cache: dict):
        """Run r's (omega, mu, residual) by numerics.model.readout, the one readout; the merged
        weights of all runs formed once per ``cache`` (one per step)."""
        if "merged" not in cache:
            with torch.no_grad():
                cache["merged"] = self.merged_weights()
        W, U = cache["merged"]
        ro = readout(self.cfgs[r], W[r], U[r])
        return ro.omega.tolist(), ro.mu.tolist(), float(ro.residual)

    def losses(self, prompts: Prompts, k: int) -> torch.Tensor:
        """Per-run batch losses (R,) = mean over the batch of ||y_q - y_hat||^2, the runs in
        stream-major order with ``k`` runs per stream: run r reads stream r // k of context
        (S, B, L, D), query (S, B, D), target (S, B, m), S = R / k.

        The readout of numerics.model.MultiHeadAttention.forward with the k runs' H heads of
        a stream as k H heads: a_g = W_g[:, :d] q, logits z_l^T a_g over the context (one bmm
        for all S B prompts), softmax over l, c_g = sum_l p_gl z_l, y_hat_r = sum_h U_rh c_rh."""
        S = prompts.context.shape[0]
        return ((self.predictions(prompts, k) - prompts.target[:, None]) ** 2).sum(dim=-1).mean(dim=-1).reshape(S * k)

    def prompt_losses(self, prompts: Prompts) -> torch.Tensor:
        """Per-run per-prompt losses (R, B) ||y_q - y_hat||^2 of every run on the one batch
        ``prompts`` (context (B, L, D), query (B, D), target (B, m)): numerics.evaluate.
        prompt_losses of each run's model, to float rounding, as one program."""
        one = Prompts(prompts.context[None], prompts.query[None], prompts.target[None])
        R = len(self.cfgs)
        return ((self.predictions(one, R) - one.target[:, None]) ** 2).sum(dim=-1).reshape(R, -1)

    def predictions(self, prompts: Prompts, k: int) -> torch.Tensor:
        """y_hat (S, k, B, m) of the runs in stream-major order, ``k`` runs per stream (:meth:`losses`)."""
        context, query = prompts.context, prompts.query
        S, B, L, D = context.shape
        d, m, H = self.cfgs[0].d, self.cfgs[0].m, self.cfgs[0].heads
        W, U = self.merged_weights()
        # a: (S, B, k H D) = q (S, B, d) @ W[..., :d]^T, the runs of stream s in order
        A = W[..., :d].reshape(S, k * H * D, d)
        a = torch.matmul(query[..., :d], A.transpose(1, 2)).view(S * B, k * H, D)
        ctx = context.reshape(S * B, L, D)
        c = attend(a, ctx).view(S, B, k, H * D)
        # y_hat[s, j, b] = sum_(h, i) U[run (s, j), h, :, i] c[s, b, (j, h), i]
        Uf = U.transpose(1, 2).reshape(S, k, m, H * D)
        return torch.einsum("sbjx,sjmx->sjbm", c, Uf)

    def step(self, grads, lr: torch.Tensor) -> None:
        for n, g in zip(self.names, grads):
            self.params[n].sub_(lr.view(-1, *([1] * (g.dim() - 1))) * g)

    def leave(self, run: "Run", r: int) -> None:
        """A start model is trained in place: it holds the weights where its run stopped."""
        if run.start is not None:
            with torch.no_grad():
                for n, p in self.params.items():
                    getattr(run.start, n).copy_(p[r])
        run.final = run.start if run.start is not None else self.model(r) if run.error is None else None


class StackedValues:
    """The semi-singular values of R reduced flows of one shape, omega and mu (R, H, m) leaf
    tensors, each run with its metric (f_omega, f_mu) = metric(omega_r, mu_r)."""
    kind = "reduced"

    def __init__(self, cfgs, omega: torch.Tensor, mu: torch.Tensor, metrics: list, marginal: bool):
        self.cfgs, self.omega, self.mu, self.metrics, self.marginal = list(cfgs), omega, mu, metrics, marginal

    @classmethod
    def from_runs(cls, runs: Sequence["Run"]) -> "StackedValues":
        """``run.start``: (omega0, mu0) tensors of the run's dtype and device (copied here)."""
        omega, mu = (torch.stack([r.start[i] for r in runs]).requires_grad_(True) for i in (0, 1))
        return cls([r.cfg for r in runs], omega, mu, [r.metric for r in runs], runs[0].estimator == "marginal")

    def select(self, keep: Sequence[int]) -> "StackedValues":
        idx = torch.as_tensor(list(keep), dtype=torch.long, device=self.omega.device)
        omega, mu = (v.detach().index_select(0, idx).requires_grad_(True) for v in (self.omega, self.mu))
        return StackedValues([self.cfgs[i] for i in keep], omega, mu, [self.metrics[i] for i in keep], self.marginal)

    @property
    def tensors(self) -> list:
        return [self.omega, self.mu]

    def run_tensors(self, r: int) -> list:
        return [self.omega[r], self.mu[r]]

    def hook_state(self, r: int) -> tuple:
        return self.omega[r].detach().clone(), self.mu[r].detach().clone()

    def readout(self, r: int, cache: dict):
        return self.omega[r].detach().cpu().double().tolist(), self.mu[r].detach().cpu().double().tolist(), 0.0

    def losses(self, batch, k: int) -> torch.Tensor:
        """Per-run batch losses (R,), runs in stream-major order, k per stream.  Whole prompts:
        y_hat_i = sum_h mu[h,i] sum_l p_hl y_{l,i}, p_h = softmax_l(sum_j omega[h,j] s_{l,j})
        with the block scores s (numerics.model.block_scores, once per stream) and the k
        runs' H heads of a stream read as k H heads; marginal: each run's
        numerics.exact_reduced.marginal_mean_loss on its stream's MarginalPrompts."""
        H, m = self.omega.shape[1:]
        if self.marginal:
            return torch.stack([marginal_mean_loss(self.omega[r], self.mu[r], batch[r // k], c.tasks, c.sigma)
                                for r, c in enumerate(self.cfgs)])
        scores, labels = block_scores(batch, self.cfgs[0])                   # (S, B, L, m) each
        S, B = scores.shape[:2]
        logits = torch.matmul(self.omega.reshape(S, 1, k * H, m), scores.transpose(-1, -2))   # (S, B, k H, L)
        c = torch.matmul(torch.softmax(logits, dim=-1), labels).view(S, B, k, H, m)
        pred = (self.mu.reshape(S, 1, k, H, m) * c).sum(dim=3)                 # (S, B, k, m)
        return ((pred - batch.target[:, :, None]) ** 2).sum(dim=-1).mean(dim=1).reshape(S * k)

    def step(self, grads, lr: torch.Tensor) -> None:
        om, mu = self.omega.detach(), self.mu.detach()
        f_om, f_mu = self.factors(om, mu)
        self.omega.sub_(lr.view(-1, 1, 1) * f_om * grads[0])
        self.mu.sub_(lr.view(-1, 1, 1) * f_mu * grads[1])

    def factors(self, om: torch.Tensor, mu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each run's metric factors (R, H, m): where every run has its problem's own metric
        (numerics.model.metric_factors) of one param, logit scale and tasks, one stacked call
        (numerics.model.stacked_metric_factors); else run by run."""
        own = [f.keywords["cfg"] for f in self.metrics if isinstance(f, functools.partial) and f.func is metric_factors]
        if len(own) == len(self.metrics) and len({(c.param, c.logit_scale, c.tasks) for c in own}) == 1:
            return stacked_metric_factors(om, mu, own[0])
        factors = [f(om[r], mu[r]) for r, f in enumerate(self.metrics)]
        return torch.stack([f[0] for f in factors]), torch.stack([f[1] for f in factors])

    def leave(self, run: "Run", r: int) -> None:
        pass


@dataclass
class Run:
    """One run of a program: its configuration, its stream, its record steps and what it has
    produced so far."""
    index: int                     # position in the caller's arguments
    cfg: ProblemConfig
    tcfg: object                   # TrainConfig
    stream: int                    # index into the program's streams
    record_at: set
    on_record: Optional[Callable]
    start: object = None           # full: a model trained in place; reduced: (omega0, mu0) tensors
    metric: Optional[Callable] = None
    estimator: str = "prompts"
    read_records: bool = True      # False: (omega, mu, residual) read at the last step only (None before)
    losses: Optional[torch.Tensor] = None   # (steps + 1,) batch losses: a row of the program's table
    trajectory: list = field(default_factory=list)
    checked: int = 0               # losses[:checked] have passed the divergence rule
    final: Optional[MultiHeadAttention] = None
    error: Optional[BaseException] = None
    fingerprint: dict = field(default_factory=dict)
    wall_before: float = 0.0       # seconds of the run before a resumed checkpoint


@dataclass
class Stream:
    """A source of one batch per step shared by the runs that read it: fresh draws from its
    generator (``draw(generator, out)``), one fixed batch, or a run's own ``source(step)``."""
    draw: Callable
    seed: Optional[int] = None
    generator: Optional[torch.Generator] = None
    fixed: object = None
    source: Optional[Callable] = None

    def batch(self, step: int, out=None):
        if self.source is not None:
            return self.source(step)
        return self.fixed if self.fixed is not None else self.draw(self.generator, out)

    def first(self):
        """The stream's batch at step 0, drawn again (for the fingerprint of a resumed run)."""
        return self.fixed if self.fixed is not None else self.draw(make_generator(self.seed, self.generator.device))


class _Layout:
    """Which run sits where in the stack and which stream each batch slot holds: stream-major
    with k runs per slot when every stream has k runs (S = R / k slots), else one slot per run
    (a stream read by several such runs is drawn once and copied).  Whole prompts are held in
    one stacked buffer (S, B, ...) (one run's own batch is read where it is, of any size);
    other batches (MarginalPrompts) as a list of S."""

    def __init__(self, runs: list, active: Sequence[int], cfg: ProblemConfig, batch: int, stacked: bool):
        by_stream: dict = {}
        for a in active:
            by_stream.setdefault(runs[a].stream, []).append(a)
        counts = {len(v) for v in by_stream.values()}
        uniform = len(counts) == 1
        self.k = counts.pop() if uniform else 1
        self.order = sorted(active, key=lambda a: (runs[a].stream, a))
        self.slots = sorted(by_stream) if uniform else [runs[a].stream for a in self.order]
        self.cfg, self.size, self.stacked = cfg, batch, stacked
        self.buffer = self.current = None
        self.held = [None] * len(self.slots)     # what a slot last copied (a fixed batch is copied once)

    def slot(self, j: int):
        """Slot j's batch of the step filled last."""
        c = self.current
        return Prompts(c.context[j], c.query[j], c.target[j]) if self.stacked else c[j]

    def fill(self, streams: list, step: int):
        """Every slot's batch of this step: fresh streams drawn into the buffer (once per stream),
        fixed batches and batch sources copied -- a source's batch only when it is not the very
        tensors, unchanged, that the slot holds already (a fixed batch)."""
        drawn: dict = {}
        if not self.stacked:
            self.current = [drawn[s] if s in drawn else drawn.setdefault(s, streams[s].batch(step)) for s in self.slots]
            return self.current
        own = streams[self.slots[0]]
        if len(self.slots) == 1 and (own.fixed is not None or own.source is not None):
            pr = own.batch(step)
            self.current = Prompts(pr.context[None], pr.query[None], pr.target[None])
            return self.current
        if self.buffer is None:
            n, c, opts = len(self.slots), self.cfg, dict(dtype=self.cfg.torch_dtype, device=self.cfg.device)
            self.buffer = Prompts(context=torch.empty(n, self.size, c.L, c.token_dim, **opts),
                                  query=torch.empty(n, self.size, c.token_dim, **opts),
                                  target=torch.empty(n, self.size, c.m, **opts))
        self.current = self.buffer
        for j, s in enumerate(self.slots):
            st, view = streams[s], self.slot(j)
            fresh = st.fixed is None and st.source is None
            if fresh and s not in drawn:
                drawn[s] = st.batch(step, out=view)
                continue
            pr = drawn[s] if s in drawn else drawn.setdefault(s, st.batch(step))
            # a copy of this step's draw: always; a fixed batch or a source's: kept alive (its memory
            # cannot be reused) with its tensors' version counters (an in-place change is seen)
            held = None if fresh else (pr, tuple(t._version for t in (pr.context, pr.query, pr.target)))
            old = self.held[j]
            if held is None or old is None or old[0] is not pr or old[1] != held[1]:
                for name in ("context", "query", "target"):
                    getattr(view, name).copy_(getattr(pr, name))
                self.held[j] = held
        return self.buffer


class _Checkpoint:
    """The checkpoint of a program of one run (``tcfg.checkpoint``): the run's state every
    ``checkpoint_every`` steps, written through numerics.io.write_output (a temp file in the
    same directory and os.replace: never half a file; missing parent directories created), read
    back field by field by numerics.checkpoint.read (a file that is not this run's is refused)."""

    def __init__(self, run: Run, stack, stream: Stream):
        from numerics import checkpoint   # the weights-file reader: loaded only by a run that checkpoints
        cfg, tcfg = run.cfg, run.tcfg
        self.files = checkpoint
        self.path, self.every = tcfg.checkpoint, tcfg.checkpoint_every
        self.spec = checkpoint.Run(
            kind=stack.kind, estimator=run.estimator, stream=STREAM_VERSION, config=cfg.to_dict(),
            train=tcfg.to_dict(), params=stack.run_tensors(0), generator=stream.generator, steps=tcfg.steps,
            record_at=frozenset(run.record_at), lr=tcfg.lr, diverge_loss=tcfg.diverge_loss, heads=cfg.heads,
            m=cfg.m, dtype=cfg.torch_dtype)

    def resume(self, run: Run, stack, stream: Stream) -> int:
        """The step the run continues from: 0, or a checked checkpoint's, its state restored."""
        if not os.path.exists(self.path):
            return 0
        saved = self.files.read(self.path, self.spec)
        with torch.no_grad():
            for p, v in zip(stack.run_tensors(0), saved.params):
                p.copy_(v.to(p.device, p.dtype))
        stream.generator.set_state(saved.generator_state)
        run.losses[:saved.step] = saved.losses.to(run.losses.device, run.losses.dtype)
        run.trajectory = [Record(**r) for r in saved.trajectory]
        run.checked, run.wall_before = saved.step, saved.wall_seconds
        return saved.step

    def save(self, run: Run, stack, stream: Stream, step: int, wall: float) -> None:
        state = self.files.payload(self.spec, step, stack.run_tensors(0), stream.generator, run.losses,
                                   [asdict(r) for r in run.trajectory], wall)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        write_output(self.path, buf.getvalue())


def _first_divergence(r: Run, upto: int) -> Optional[TrainingDiverged]:
    """The error of the first of r's unchecked losses up to step ``upto`` that diverged."""
    for k, v in enumerate(r.losses[r.checked:upto + 1].cpu().tolist(), start=r.checked):
        if diverged(v, r.tcfg):
            return divergence(k, v, r.cfg, r.tcfg)
    r.checked = upto + 1
    return None


class Program:
    """Runs of one shape, batch size and kind (``stack_type``: StackedAttention or
    StackedValues) trained together by :meth:`run`, the one gradient-descent loop: step k's
    batches drawn, each run's loss recorded before its update, every run updated; a last batch
    at a run's last step gives its final record."""

    def __init__(self, runs: list, streams: list, stack_type, batch: int):
        use_precise_float32()
        self.runs, self.streams, self.batch, self.cfg0 = runs, streams, batch, runs[0].cfg
        self.stacked = runs[0].estimator != "marginal"
        self.n_max = max(r.tcfg.steps for r in runs)
        self.table = torch.zeros(len(runs), self.n_max + 1, dtype=self.cfg0.torch_dtype, device=self.cfg0.device)
        for a, r in enumerate(runs):
            r.losses = self.table[a, :r.tcfg.steps + 1]
        self.lay = _Layout(runs, range(len(runs)), self.cfg0, batch, self.stacked)
        self.stack = stack_type.from_runs([runs[a] for a in self.lay.order])
        for j, a in enumerate(self.lay.order):
            runs[a].fingerprint["weights"] = fingerprint(*self.stack.run_tensors(j))
        self.pack(self.lay.order)
        # a sync per step costs nothing on the CPU; on a GPU the losses are checked every 50 steps
        self.check_every = 1 if self.cfg0.torch_device.type == "cpu" else 50
        self.ckpt = _Checkpoint(runs[0], self.stack, streams[0]) if len(runs) == 1 and runs[0].tcfg.checkpoint else None
        self.first = self.ckpt.resume(runs[0], self.stack, streams[0]) if self.ckpt is not None else 0
        if self.first:
            runs[0].fingerprint["prompts"] = fingerprint(streams[0].first())

    def pack(self, order: list) -> None:
        """The stack's runs (positions in ``runs``, stack order), as an index, and their steps."""
        self.active = list(order)
        self.rows = torch.as_tensor(self.active, dtype=torch.long, device=self.cfg0.device)
        self.lr = torch.tensor([self.runs[a].tcfg.lr for a in order], dtype=self.cfg0.torch_dtype,
                               device=self.cfg0.device)

    def run(self) -> tuple[float, float]:
        """Train every run to its end (or its error); (wall, CPU) seconds of the loop."""
        t0, cpu0 = time.perf_counter(), time.process_time()
        kind, runs = self.stack.kind, self.runs
        bar = tqdm(total=self.n_max, initial=self.first, disable=not any(r.tcfg.progress for r in runs),
                   desc=f"{kind} GD" + (f", {len(runs)} runs" if len(runs) > 1 else ""), unit="step")
        try:
            for step in range(self.first, self.n_max + 1):
                if self.ckpt is not None and step > self.first and step % self.ckpt.every == 0:
                    self.ckpt.save(runs[0], self.stack, self.streams[0], step,
                                   runs[0].wall_before + time.perf_counter() - t0)
                batch = self.lay.fill(self.streams, step)
                if step == self.first:
                    self.fingerprint_prompts()
                per_run = self.stack.losses(batch, self.lay.k)
                vals = per_run.detach()
                self.table[self.rows, step] = vals
                leaving = self.account(step, vals)
                if len(leaving) == len(self.active):
                    break
                grads = torch.autograd.grad(per_run.sum(), self.stack.tensors)
                with torch.no_grad():
                    self.stack.step(grads, self.lr)
                if leaving:
                    self.repack(leaving)
                bar.update(1)
        finally:
            bar.close()
        return time.perf_counter() - t0, time.process_time() - cpu0

    def fingerprint_prompts(self) -> None:
        """Each run's first batch, by numerics.engine.digest (once per stream)."""
        seen: dict = {}
        for j, a in enumerate(self.active):
            r = self.runs[a]
            if r.stream not in seen:
                seen[r.stream] = fingerprint(self.lay.slot(j // self.lay.k))
            r.fingerprint.setdefault("prompts", seen[r.stream])

    def account(self, step: int, vals: torch.Tensor) -> set:
        """This step's divergence checks, records and hooks; the stack positions of the runs
        that leave now (their last step, a diverged loss, a raising hook or readout)."""
        host = vals.tolist() if self.check_every == 1 else None
        saves_next = self.ckpt is not None and (step + 1) % self.ckpt.every == 0
        leaving, cache = set(), {}
        for j, a in enumerate(self.active):
            r = self.runs[a]
            ends, records = step == r.tcfg.steps, step in r.record_at
            if host is not None:
                r.error = divergence(step, host[j], r.cfg, r.tcfg) if diverged(host[j], r.tcfg) else None
            elif step % self.check_every == 0 or ends or records or saves_next:
                r.error = _first_divergence(r, step)
            if r.error is None and records:
                loss, t = host[j] if host is not None else float(vals[j]), step * r.tcfg.lr
                try:
                    omega, mu, residual = (self.stack.readout(j, cache) if r.read_records or ends
                                           else (None, None, None))
                    r.trajectory.append(Record(t=t, loss=loss, omega=omega, mu=mu, residual=residual))
                    if r.on_record is not None:
                        r.on_record(step, t, self.stack.hook_state(j), loss)
                except Exception as exc:        # ends this run only
                    r.error = exc
            if r.error is not None or ends:
                leaving.add(j)
                self.stack.leave(r, j)
        return leaving

    def repack(self, leaving: set) -> None:
        keep = [a for j, a in enumerate(self.active) if j not in leaving]
        pos = {a: j for j, a in enumerate(self.active)}
        self.lay = _Layout(self.runs, keep, self.cfg0, self.batch, self.stacked)
        self.stack = self.stack.select([pos[a] for a in self.lay.order])
        self.pack(self.lay.order)


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
        return int(torch.cuda.mem_get_info(torch.device(device))[0]) if torch.cuda.is_available() else None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


DEFAULT_RECORDS = 61

_FLAGGED_FIELDS = ("time / lr", "tasks", "heads", "L", "sigma", "basis_seed", "logit_scale", "init_scale", "init_seed",
                   "device", "lr", "time", "batch", "seed", "records", "checkpoint_every", "diverge_loss", "checkpoint")


def _flag_message(text: str) -> str:
    """A message of ProblemConfig or TrainConfig ("lr must be ...") naming the flag the user typed
    ("--lr must be ..."): a field's flag is its name with dashes, but for --init and --time / --lr."""
    for name in _FLAGGED_FIELDS:
        if text.startswith(name + " "):
            flag = {"time / lr": "--time / --lr", "init_scale": "--init"}.get(name, "--" + name.replace("_", "-"))
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
