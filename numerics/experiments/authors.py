"""The authors' released experiment, trained by this project's trainer (issue 28).

Their script (AttentionNetwork + DataGenerator, docs/model.md) trains one layer of H
softmax heads on d_x = 50 inputs split over d_y tasks by their DataGenerator (blocks
int(i d_x / d_y): 16, 17, 17 for d_y = 3; one block of 50 for d_y = 1), L = 100 context tokens,
torch SGD at lr 0.01 on MSELoss over 10,000 fresh prompts a step, logits scaled by (d + m)^(-1/2),
from nn.Linear's default initialisation (init ``linear_default``); their small initialisation
(init ``authors_small``) is defined beside it.  Both are this project's factored model with
``logit_scale`` sqrt(d + m) (numerics.config, numerics.external's ``authors`` layout).

Units.  Their MSELoss averages over the m outputs, so its gradient is 1/m of this project's loss
(summed over tasks): one of their SGD steps at lr is one of ours at lr / m, and after S of their
steps our time is t = lr S / m.  :class:`AuthorsRun` is specified in their units (``lr``,
``steps``) and trains in ours (``cfg``, ``tcfg``).

:func:`train_runs` trains a list of runs with ``numerics.train.train_many`` (runs of one shape --
tasks, H -- as one program; the two starts of one configuration share a prompt stream, one draw a
step) and keeps ``snapshots`` copies of each run's weights, evenly spaced in t (the trainer's
records), as in-memory checkpoints (:func:`checkpoint`, a ``numerics.external.ExternalModel``):
what ``claims.model_audit`` audits, as it audits a file a researcher hands over.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from numerics import external
from numerics.config import ProblemConfig
from numerics.experiments import cached, identity, one_thread
from numerics.train import TrainConfig, train_many

__all__ = ["AuthorsRun", "AuthorsResult", "datagenerator_blocks", "train_runs", "checkpoint", "in_background",
           "AUTHORS_DX", "AUTHORS_L", "AUTHORS_LR", "AUTHORS_BATCH", "AUTHORS_INITS"]

AUTHORS_DX = 50
AUTHORS_L = 100
AUTHORS_LR = 0.01
"""Their torch SGD step on MSELoss (mean over the m tasks): ours is AUTHORS_LR / m."""
AUTHORS_BATCH = 10_000
AUTHORS_INITS = ("linear_default", "authors_small")
"""nn.Linear's default (what the released script trains from) and their small initialisation."""


def datagenerator_blocks(dx: int, dy: int) -> tuple[int, ...]:
    """The block sizes r_i of their DataGenerator: task i reads coordinates int(i dx / dy) ..
    int((i + 1) dx / dy) - 1, so 50 over 3 tasks is (16, 17, 17)."""
    if dy < 1 or dx < dy:
        raise ValueError(f"need 1 <= dy <= dx, got dx={dx}, dy={dy}")
    edges = [int(i * dx / dy) for i in range(dy + 1)]
    return tuple(b - a for a, b in zip(edges[:-1], edges[1:]))


@dataclass(frozen=True)
class AuthorsRun:
    """One run of their experiment, in their units: ``dy`` tasks over ``dx`` inputs, ``heads``,
    ``init`` (one of :data:`AUTHORS_INITS`, at init_scale 1: theirs), ``steps`` SGD steps at
    ``lr`` on ``batch`` fresh prompts each; ``snapshots`` checkpoints evenly spaced in t (0 and
    the end included); data seed ``seed``, init seed ``init_seed``; ``dtype`` float32 as their
    torch default."""

    dy: int
    heads: int
    init: str
    steps: int
    dx: int = AUTHORS_DX
    L: int = AUTHORS_L
    lr: float = AUTHORS_LR
    batch: int = AUTHORS_BATCH
    snapshots: int = 9
    seed: int = 0
    init_seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self):
        if self.init not in AUTHORS_INITS:
            raise ValueError(f"init must be one of {AUTHORS_INITS}, got {self.init!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a positive integer (the authors' SGD steps), got {self.steps!r}")
        if not 2 <= self.snapshots <= self.steps + 1:
            raise ValueError(f"snapshots must be in 2 .. steps + 1 = {self.steps + 1}, got {self.snapshots}")
        self.cfg  # noqa: B018 - validates the problem (ProblemConfig's messages)
        self.tcfg  # noqa: B018

    @property
    def tasks(self) -> tuple[int, ...]:
        return datagenerator_blocks(self.dx, self.dy)

    @property
    def m(self) -> int:
        return self.dy

    @property
    def logit_scale(self) -> float:
        """Their logits are scaled by (d + m)^(-1/2): s = sqrt(d + m)."""
        return math.sqrt(self.dx + self.dy)

    @property
    def cfg(self) -> ProblemConfig:
        return ProblemConfig(tasks=self.tasks, heads=self.heads, L=self.L, logit_scale=self.logit_scale,
                             init=self.init, init_scale=1.0, init_seed=self.init_seed, dtype=self.dtype,
                             device=self.device)

    @property
    def our_lr(self) -> float:
        """One of their steps at lr is one of ours at lr / m (their loss is ours / m)."""
        return self.lr / self.m

    @property
    def t_end(self) -> float:
        """t = lr steps / m, this project's time after their ``steps`` steps."""
        return self.our_lr * self.steps

    @property
    def tcfg(self) -> TrainConfig:
        return TrainConfig(lr=self.our_lr, time=self.t_end, batch=self.batch, seed=self.seed, records=self.snapshots)

    @property
    def label(self) -> str:
        """A short name: their settings (d_y, H) and the start."""
        start = {"linear_default": "nn.Linear default", "authors_small": "small init"}[self.init]
        return f"dy={self.dy} H={self.heads} {start}"


@dataclass(frozen=True)
class AuthorsResult:
    """A trained run: ``snapshots`` ((their step, our t, weights {K, Q, V, O} as float64 arrays)),
    ``records`` (the trainer's records: t, batch loss, omega, mu, residual), the batched
    program's size and cost (``seconds``, ``cpu_seconds``: the run's share of its program's),
    or ``error`` (the run diverged: its message)."""

    run: AuthorsRun
    snapshots: tuple = field(repr=False)
    records: tuple = field(repr=False)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    batched_runs: int = 1
    error: Optional[str] = None


def train_runs(runs, progress: Callable[[str, float], None] = lambda message, fraction: None) -> list[AuthorsResult]:
    """Train ``runs`` (AuthorsRun) with numerics.train.train_many, once per process and list
    (numerics.experiments.cached); one entry per run, in order."""
    runs = list(runs)
    key = identity("authors_runs", runs=[r.__dict__ for r in runs])
    return cached(key, lambda: _train_runs(runs, progress))


@one_thread
def _train_runs(runs: list, progress) -> list[AuthorsResult]:
    snaps: list = [[] for _ in runs]

    def keeper(i):
        def on_record(step, t, model, loss):
            w = {n: getattr(model, n).detach().to("cpu", torch.float64).numpy().copy() for n in ("K", "Q", "V", "O")}
            snaps[i].append((int(step), float(t), w))       # a step is one of theirs (at lr / m)
        return on_record

    # train_many groups by shape and trains the groups one after another: train them one shape at a
    # time here, so the progress says which
    out: list = [None] * len(runs)
    shapes: dict = {}
    for i, r in enumerate(runs):
        shapes.setdefault((r.tasks, r.heads, r.batch, r.device, r.dtype), []).append(i)
    done = 0
    total = sum(r.steps for r in runs)
    for (tasks, heads, batch, _, _), members in shapes.items():
        progress(f"training tasks {','.join(map(str, tasks))}, H = {heads}: {len(members)} run(s) x "
                 f"{max(runs[i].steps for i in members)} steps (their SGD steps, batch {batch})", done / max(total, 1))
        t0 = time.perf_counter()
        results = train_many([runs[i].cfg for i in members], [runs[i].tcfg for i in members],
                             on_record=[keeper(i) for i in members])
        wall = time.perf_counter() - t0
        for i, res in zip(members, results):
            run = runs[i]
            if isinstance(res, Exception):
                out[i] = AuthorsResult(run, tuple(snaps[i]), (), wall, 0.0, len(members), f"{type(res).__name__}: {res}")
                continue
            out[i] = AuthorsResult(run, tuple(snaps[i]), tuple(res.trajectory), res.wall_seconds, res.cpu_seconds,
                                   res.batched_runs)
        done += sum(runs[i].steps for i in members)
    return out


def checkpoint(result: AuthorsResult, k: int) -> external.ExternalModel:
    """Snapshot ``k`` of a trained run as an in-memory checkpoint (numerics.external.ExternalModel):
    the factored weights K, Q, V, O in float64, its logit scale sqrt(d + m), its time in this
    project's units and its step in theirs, and the run's problem as its ``config`` (what a
    project checkpoint carries), so claims.model_audit audits it as it audits a handed file."""
    run = result.run
    their_step, t, w = result.snapshots[k]
    cfg = run.cfg
    name = f"{run.label} at {their_step} steps"
    return external.ExternalModel(
        path=name, format="memory", layout="project", picked="trained in this process (numerics.experiments.authors)",
        param="factored", heads=cfg.heads, m=cfg.m, token_dim=cfg.token_dim, logit_scale=cfg.logit_scale,
        weights={n: np.asarray(v, float) for n, v in w.items()}, stored_dtype=run.dtype,
        config=cfg.to_dict(), time=float(t),
        time_source=f"trained here: t = lr x steps / m = {run.lr:g} x {their_step} / {run.m} (their SGD steps on "
                    "MSELoss, a mean over the m tasks)",
        step=their_step, notes=(f"numerics.train.train_many, {run.batch} fresh prompts a step, {run.dtype}, "
                                f"init {run.init}, init_seed {run.init_seed}, data seed {run.seed}",))


def in_background(fn: Callable, *args, **kwargs) -> tuple[Future, ProcessPoolExecutor]:
    """``fn(*args, **kwargs)`` in a fresh process (spawned: safe beside CUDA and forked report
    workers), with one torch thread: CPU work (theory's quadratures and searches) that runs while
    this process trains.  Returns (future, executor); the caller shuts the executor down."""
    import multiprocessing

    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    return pool.submit(_one_thread_call, fn, args, kwargs), pool


def _one_thread_call(fn, args, kwargs):
    return one_thread(fn)(*args, **kwargs)
