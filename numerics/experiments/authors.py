"""The authors' released experiment, trained by this project's trainer.

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
what ``claims.audit`` audits, as it audits a file a researcher hands over.

Need kinds (``numerics.engine``, end of file): "authors_run" (one run, the runs of one shape as
one program: ``run_many``), "reference_points" (theory's reference points of the audit,
numerics.reference_points, for some head counts: the independent pieces of one configuration's
points are separate needs, so worker processes compute them side by side) and
"authors_emergence" (theory's expansion flow from a small-init start to its emergence end).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from numerics import engine, external
from numerics.config import ProblemConfig
from numerics.engine import kind, kind_of
from numerics.experiments import one_thread
from numerics.engine import case_seed
from numerics.train import TrainConfig, train_many


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
    or ``error`` (the run diverged: its message); ``held_out_prompts`` of ``held_out_seed``: the
    held-out prompts its checkpoints are audited on (claims.audit), named with the run."""

    run: AuthorsRun
    snapshots: tuple = field(repr=False)
    records: tuple = field(repr=False)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    batched_runs: int = 1
    error: Optional[str] = None
    held_out_prompts: int = 0
    held_out_seed: int = 0


@one_thread
def train_runs(runs) -> list[AuthorsResult]:
    """Train ``runs`` (AuthorsRun) with numerics.train.train_many, the runs of one shape (tasks, H,
    batch, device, dtype) as one program; one entry per run, in order (a run that diverged: its
    ``error``)."""
    snaps: list = [[] for _ in runs]

    def keeper(i):
        def on_record(step, t, model, loss):
            w = {n: getattr(model, n).detach().to("cpu", torch.float64).numpy().copy() for n in ("K", "Q", "V", "O")}
            snaps[i].append((int(step), float(t), w))       # a step is one of theirs (at lr / m)
        return on_record

    out: list = [None] * len(runs)
    shapes: dict = {}
    for i, r in enumerate(runs):
        shapes.setdefault((r.tasks, r.heads, r.batch, r.device, r.dtype), []).append(i)
    for members in shapes.values():
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
    return out


def checkpoint(result: AuthorsResult, k: int) -> external.ExternalModel:
    """Snapshot ``k`` of a trained run as an in-memory checkpoint (numerics.external.ExternalModel):
    the factored weights K, Q, V, O in float64, its logit scale sqrt(d + m), its time in this
    project's units and its step in theirs, and the run's problem as its ``config`` (what a
    project checkpoint carries), so claims.audit audits it as it audits a handed file."""
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


def emergence(run: AuthorsRun) -> Optional[dict]:
    """Theory's expansion flow from a small-init run's start: when its emergence ends (in our time
    and in their steps) -- reported, so a reader sees how far the run is from it; None for a start
    off D (no reduced flow starts there)."""
    if run.init != "authors_small":
        return None
    from numerics.model import initial_values
    from theory.three_phases import run_length

    om0, mu0 = initial_values(run.cfg)
    try:
        t2, status = run_length(om0, mu0, run.tasks, run.L, 0.0, "factored", run.logit_scale, lr=run.our_lr, factor=1.0)
    except (RuntimeError, ValueError) as exc:
        return {"t": None, "status": f"{type(exc).__name__}: {exc}"}
    if not math.isfinite(t2):
        return {"t": None, "status": status}
    return {"t": float(t2), "steps": int(round(t2 / run.our_lr)), "status": status}


# ---------------------------------------------------------------------------------------
# need kinds (numerics.engine)
# ---------------------------------------------------------------------------------------

CPU_SAMPLE_NS = 3.7
CPU_MODEL_NS = 0.45
"""Fitted to the reduced run's training CPU seconds (one thread, load ~7 per core): 0.34 s a step at
tasks (16, 17, 17), H = 3, 0.58 at H = 8 (a program of the two starts, 5.3e7 context numbers drawn
once: CPU_SAMPLE_NS per number drawn, CPU_MODEL_NS per number, head and run)."""
AUDIT_CHECKPOINT_SECONDS = 1.45
"""CPU seconds to measure one checkpoint at 4096 held-out prompts (readout, two evaluations), at
the stated sizes (d_x = 50, L = 100)."""


def _run_of(settings: dict, seed: int) -> AuthorsRun:
    """The run a need of seed ``seed`` names: its settings, its prompts drawn from ``seed`` (the
    two starts of a shape name one stream: one draw a step), its start from the stream "init"."""
    return AuthorsRun(**settings, seed=seed, init_seed=case_seed(seed, "init"))


def _run_cost(dy, heads, steps, dx, L, batch, snapshots, held_out, **_) -> float:
    """CPU seconds of one run and of the audit of its checkpoints: the training step's share of its
    program (the two starts of a shape draw their prompts once: half the draw each), and
    ``snapshots`` checkpoints measured on ``held_out`` prompts by the audit (claims.audit, in
    the comparison: numerics cannot call the claims layer, so the run that makes the checkpoints
    carries their price)."""
    numbers = batch * L * (dx + dy)
    train = steps * numbers * 1e-9 * (CPU_SAMPLE_NS / len(AUTHORS_INITS) + CPU_MODEL_NS * heads)
    return train + snapshots * AUDIT_CHECKPOINT_SECONDS * held_out / 4096


def _shape(dx, dy, heads, L, batch, device, dtype, **_) -> tuple:
    """What the runs trained as one program share (numerics.train.train_many's groups)."""
    return (datagenerator_blocks(dx, dy), heads, L, batch, device, dtype)


def _trained(params: list, seeds: list) -> list:
    """The runs of ``params`` (needs' parameters) trained together (:func:`train_runs`), each with
    the held-out prompts its audit measures."""
    settings = [{k: v for k, v in p.items() if k != "held_out"} for p in params]
    results = train_runs([_run_of(s, seed) for s, seed in zip(settings, seeds)])
    return [dataclasses.replace(r, held_out_prompts=int(p["held_out"]), held_out_seed=case_seed(seed, "held out"))
            for r, p, seed in zip(results, params, seeds)]


@kind("authors_run", cost=_run_cost, run_many=_trained, batch_key=_shape)
def authors_run_need(seed: int, **params) -> AuthorsResult:
    """One run of their experiment (:class:`AuthorsRun`'s settings, ``held_out`` prompts per
    checkpoint for its audit); the runs of one shape from any claims train as one program."""
    return _trained([params], [seed])[0]


def _references_cost(tasks, heads, L, sigma, search, skip, **_) -> float:
    """CPU seconds of numerics.reference_points.references_for_heads: the fixed point's quadrature,
    the one-head optimum (m > 1; with one task it is the fixed point), the best decomposable point
    per H (its kind's price); linear attention is a closed form."""
    seconds = 0.0
    if "allocated_fixed_point" not in skip and max(heads) >= len(tasks):
        seconds += engine.theory_seconds("exact_fixed_point", tasks=tasks)
    if "one_head_optimum" not in skip and len(tasks) > 1:
        seconds += engine.SINGLE_HEAD_SECONDS * (sum(tasks) / 4.0) ** engine.SINGLE_HEAD_POWER
    if "best_decomposable" not in skip:
        best = kind_of("best_decomposable").cost
        seconds += sum(best(tasks=tasks, heads=H, L=L, sigma=sigma, device="cpu", **dict(search)) for H in heads)
    return seconds


@kind("reference_points", cost=_references_cost, shared=False)
def reference_points_need(tasks, heads, L, sigma, search, skip, seed):
    """numerics.reference_points.references_for_heads at (tasks, L, sigma) for ``heads`` on the CPU
    ({H: references}), ``skip`` the points not computed; the best decomposable point's search drawn
    from the need's seed."""
    from numerics.reference_points import references_for_heads
    return references_for_heads(tuple(tasks), list(heads), L, sigma, seed, "cpu", dict(search), skip=tuple(skip))


@kind("authors_emergence", cost=lambda **_: engine.theory_seconds("phase_prediction"), shared=False)
def emergence_need(seed: int, **settings) -> Optional[dict]:
    """:func:`emergence` of the run of ``settings`` (its start: a need of its run's stream has its
    run's seed, so its init seed; priced as claim 3's forecast, run_length and its phases)."""
    return emergence(_run_of(settings, seed))
