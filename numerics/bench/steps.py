"""The contenders: our step (bare and inside the real trainer), the standard-way reference
(:mod:`numerics.bench.reference`), the sampling they share, and the step without sampling."""
from __future__ import annotations

import time
from collections import Counter
from typing import Callable

import torch

from numerics.config import ProblemConfig
from numerics.config import make_generator, sample_prompts
from numerics.model import MultiHeadAttention, mse_loss
from numerics.train import TrainConfig, train, train_many
from numerics.bench.config import LR
from numerics.bench.timing import sync
from numerics.bench.reference import ReferenceAttention, gd_step


def problem(sizes: dict, dtype: str, device: str, **over) -> ProblemConfig:
    return ProblemConfig(tasks=tuple(sizes["tasks"]), heads=sizes["heads"], L=sizes["L"],
                         dtype=dtype, device=device, **over)


def our_step(cfg: ProblemConfig, batch: int, seed: int = 0, which: str = "ours") -> Callable[[], torch.Tensor]:
    """One step written out: sample a fresh batch, forward, backward, plain GD update, of our
    model or (``which="reference"``) of the standard-way reference on the same prompt stream and
    weights.  The trainer's own step is timed inside ``train`` (:class:`TrainerSteps`); this bare
    version isolates the step from the trainer's bookkeeping."""
    model = MultiHeadAttention(cfg)
    if which == "reference":
        model = ReferenceAttention.from_model(model)
    gen = make_generator(seed, cfg.device)
    held = []
    return lambda: gd_step(model, _draw(cfg, batch, gen, held), LR, mse_loss)


def _draw(cfg: ProblemConfig, batch: int, gen, held: list):
    """A fresh batch drawn as the trainer draws it: into the previous batch's tensors
    (``sample_prompts(out=)``), which ``held`` keeps from call to call."""
    held[:] = [sample_prompts(cfg, batch, gen, out=held[0] if held else None)]
    return held[0]


def sampling_only(cfg: ProblemConfig, batch: int, seed: int = 0) -> Callable[[], object]:
    """Drawing one fresh batch, as the trainer does (into the previous batch's tensors)."""
    gen = make_generator(seed, cfg.device)
    held = []
    return lambda: _draw(cfg, batch, gen, held)


def model_only_step(cfg: ProblemConfig, batch: int, which: str = "ours",
                    seed: int = 0) -> Callable[[], torch.Tensor]:
    """Forward + backward + update on one fixed batch, no sampling: the part of the step
    where the two implementations differ."""
    model = MultiHeadAttention(cfg)
    if which == "reference":
        model = ReferenceAttention.from_model(model)
    prompts = sample_prompts(cfg, batch, make_generator(seed, cfg.device))
    return lambda: gd_step(model, prompts, LR, mse_loss)


class TrainerSteps:
    """Seconds per step of ``numerics.train.train`` itself, from inside a real run.

    Calling the object runs ``train`` for ``steps`` (at least 3: the first and last hold a
    record) steps and returns the durations of its steps.  The trainer draws one batch per step with
    its ``batches`` seam; the source given here samples the trainer's own stream and records
    a (device-synchronised) timestamp at each draw, so the interval between two
    draws is exactly one step of the trainer: sampling, loss, divergence check, gradient,
    update.  Intervals that contain a record (trajectory readout, at the first and last
    step with ``records=2``) are dropped, so what remains is the step a long run repeats;
    the per-run set-up is left out (``setup_seconds`` of the last call shows its size)."""

    def __init__(self, cfg: ProblemConfig, batch: int, steps: int = 3, seed: int = 0):
        self.cfg = cfg
        self.tcfg = TrainConfig(lr=LR, time=LR * steps, batch=batch, seed=seed, records=2,
                                progress=False)
        self.setup_seconds = float("nan")

    def __call__(self) -> list[float]:
        # the trainer's batch-source seam: our source draws from the same stream the trainer
        # would (same generator, same seed) and stamps the time of each draw
        stamps: list[float] = []
        cpu_stamps: list[float] = []
        gen = make_generator(self.tcfg.seed, self.cfg.device)

        held = []

        def stamped(step: int):
            sync(self.cfg.device)
            stamps.append(time.perf_counter())
            cpu_stamps.append(time.process_time())
            return _draw(self.cfg, self.tcfg.batch, gen, held)   # as the trainer's own stream

        t0 = time.perf_counter()
        res = train(self.cfg, self.tcfg, batches=stamped)
        if len(stamps) != res.steps + 1:
            raise RuntimeError(f"expected one batch per step ({res.steps + 1}), saw {len(stamps)}: "
                               "numerics.train changed, update numerics.bench.steps.TrainerSteps")
        self.setup_seconds = stamps[0] - t0
        # interval k covers step k; step 0 holds the first record's readout
        return [(b - a, cb - ca) for a, b, ca, cb in
                zip(stamps[1:-1], stamps[2:], cpu_stamps[1:-1], cpu_stamps[2:])]


def run_set(sizes: dict, dtype: str, device: str, kind: str, runs: int, steps: int, seed: int = 0):
    """``runs`` runs of one configuration, ``steps`` steps each (records at the ends), as an
    experiment asks for them: ``one_stream`` -- init scales 0.05 .. 0.4 on one prompt stream
    (an init-scale sweep, three-phases' runs, a race grid's cells at one data seed);
    ``own_streams`` -- one init scale, seeds seed .. seed + runs - 1 (replicates);
    ``mixed`` -- runs / 2 init scales x 2 seeds (boundary-allocation-race: cells x data seeds).
    Returns (cfgs, tcfgs)."""
    if kind == "one_stream":
        pairs = [(0.05 + 0.35 * k / max(1, runs - 1), seed) for k in range(runs)]
    elif kind == "own_streams":
        pairs = [(0.15, seed + k) for k in range(runs)]
    elif kind == "mixed":
        half = max(1, runs // 2)
        pairs = [(0.05 + 0.35 * (k % half) / max(1, half - 1), seed + k // half) for k in range(runs)]
    else:
        raise ValueError(f"unknown run set kind {kind!r}")
    cfgs = [problem(sizes, dtype, device, init_scale=s0) for s0, _ in pairs]
    tcfgs = [TrainConfig(lr=LR, time=LR * steps, batch=sizes["batch"], seed=s, records=2, progress=False)
             for _, s in pairs]
    return cfgs, tcfgs


def one_after_another(cfgs, tcfgs) -> Callable[[], object]:
    """The runs trained one by one by ``numerics.train.train`` (returns None: time_interleaved
    reads a returned list as timing samples)."""
    def call() -> None:
        for c, t in zip(cfgs, tcfgs):
            train(c, t)
    return call


class AsPrograms:
    """The runs trained by ``numerics.train.train_many`` (as one or a few batched programs);
    ``programs`` after a call: the runs per program, as train_many grouped them."""

    def __init__(self, cfgs, tcfgs):
        self.cfgs, self.tcfgs, self.programs = cfgs, tcfgs, None

    def __call__(self) -> None:
        out = train_many(self.cfgs, self.tcfgs)
        bad = [o for o in out if not hasattr(o, "batched_runs")]
        if bad:
            raise RuntimeError(f"a benchmark run did not finish: {bad[0]!r}")
        count = Counter(o.batched_runs for o in out)      # a program of s runs: s results saying s
        self.programs = sorted((s for s, c in count.items() for _ in range(c // s)), reverse=True)
