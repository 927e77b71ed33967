"""A full model trained to its converged loss (claims 5 and 6, the boundaries around them, and
the sweep point ``model = "converged"``)."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from numerics import engine, exact_reduced
from numerics.config import ProblemConfig
from numerics.engine import kind
from numerics.engine import case_seed
from numerics.evaluate import (ALLOCATED_SHARE, allocation, descent_left, held_out_loss, held_out_prompt_losses,
                               hessian_top_eigenvalue, mean_se)
from numerics.experiments import one_thread
from numerics.evaluate import Z_SE as Z_CONVERGED  # the report's one tolerance multiplier
from numerics.model import MultiHeadAttention, TrainingDiverged
from numerics.train import TrainConfig, train, train_reduced
from theory import exact as exact_theory
from theory.limiting_error import limit_multi_per_task
from theory.reduced_ode import metric_factors

WINDOW_POINTS = 5
"""Snapshots of the final stage's second half (its records 4/8 .. 8/8) on which the descent
rate is fitted (numerics.evaluate.descent_left): five give the residual scatter three
degrees of freedom, enough to see the iterates' jitter, at five model evaluations a run."""


@dataclass(frozen=True)
class TrainingSchedule:
    """How a full model is trained to its converged loss: gradient descent on fresh prompts in
    two phases (``numerics.train.train`` twice, the second from the first's model).

    explore: from cfg's initialisation to t = ``time`` at step ``lr`` with ``tokens`` prompt
    tokens per step (batch = tokens // L: the per-prompt loss falls like 1/L, so a fixed token
    count keeps the gradient noise per step comparable across L).  polish: ``polish_time``
    more at a ``polish_tokens`` batch, so the excess loss SGD's noise leaves at stationarity,
    ~ (lr / 4B) tr(Sigma) (Sigma the per-prompt gradient covariance), is cut by the ratio of
    lr/B of the two phases.  The converged loss is then measured again at the final weights on
    fresh prompts (``numerics.evaluate.held_out_loss``), never read from the training losses;
    the descent left (:func:`converged_for`) and the step error on ``descent_tokens`` paired
    prompt tokens.  A run not converged for its own comparison's tolerance goes on polishing,
    ``polish_time`` at a time, up to ``polish_extensions`` times (the budget), unless it has left
    the allocated set (:func:`train_converged` says why)."""

    time: float = 40.0            # explore: gradient-flow time t_end
    lr: float = 0.1               # explore: step eta
    tokens: int = 2 ** 14         # explore: prompt tokens per step (batch = tokens // L)
    polish_time: float = 3.0      # polish: extra time at a smaller step and a larger batch
    polish_lr: float = 0.03       # polish: step (at 0.1 the one-head runs at sigma = 0.5, r = 3..4, L = 64
                                  # kept ~2x the excess lr/B predicts: 1.97..2.02 against 1.883)
    polish_tokens: int = 2 ** 17  # polish: prompt tokens per step
    held_out_tokens: int = 2 ** 21  # held-out prompts: held_out_tokens // L, at least held_out_min
    held_out_min: int = 16384
    min_batch: int = 32           # smallest batch at large L
    descent_tokens: int = 2 ** 20   # paired prompts of the descent fit and the step error: // L, >= 4096
    polish_extensions: int = 2    # budget: the polish goes on, polish_time at a time, at most this often

    def batch(self, L: int, tokens: int) -> int:
        return max(self.min_batch, int(tokens) // int(L))

    def held_out(self, L: int) -> int:
        return max(self.held_out_min, int(self.held_out_tokens) // int(L))

    def descent_prompts(self, L: int) -> int:
        return max(4096, int(self.descent_tokens) // int(L))


# tiny and quick differ only in the held-out sample; paper is meant for a GPU
TINY_SCHEDULE = TrainingSchedule(held_out_tokens=2 ** 22, held_out_min=32768)
# quick: at least 2^17 held-out prompts (L = 64 had 65536): claims 5 and 6's headlines, the converged loss and the
# gain at L = 64, then resolve 5 % of theory's prediction (+1.1 s CPU per L = 64 run)
QUICK_SCHEDULE = TrainingSchedule(held_out_tokens=2 ** 22, held_out_min=2 ** 17)
PAPER_SCHEDULE = TrainingSchedule(time=100.0, lr=0.05, tokens=2 ** 18, polish_time=5.0, polish_lr=0.05,
                                  polish_tokens=2 ** 21, held_out_tokens=2 ** 24, held_out_min=65536,
                                  descent_tokens=2 ** 22)


END_STIFFNESS_PROMPTS = 2048   # marginal prompts of the end point's Hessian (numerics.experiments.converged.stable_step)


def end_point(cfg: ProblemConfig):
    """Theory's end of the flow a converged run of ``cfg`` follows, as (omega, mu) of shape (H, m),
    or None where theory names none: with H >= m heads the allocated fixed point
    (theory.exact.exact_fixed_point; head i serves task i, the other heads idle at zero), with one
    head the best one-head model (theory.exact.single_head_optimum)."""
    H, m = cfg.heads, len(cfg.tasks)
    omega, mu = np.zeros((H, m)), np.zeros((H, m))
    if H >= m:
        fp = exact_theory.exact_fixed_point(cfg.tasks, cfg.L, cfg.sigma)
        for i in range(m):
            omega[i, i], mu[i, i] = fp["omega_star"][i], fp["mu_star"][i]
        return omega, mu
    if H == 1:
        opt = exact_theory.single_head_optimum(cfg.tasks, cfg.L, cfg.sigma)
        return np.array([opt["omega"]]), np.array([opt["mu"]])
    return None


_END_STIFFNESS: dict = {}


def end_stiffness(cfg: ProblemConfig) -> float | None:
    """lambda_end: the largest eigenvalue of the metric-weighted Hessian F^1/2 Hess F^1/2 of the exact
    reduced loss at theory's end point (:func:`end_point`; :func:`stable_step` on
    END_STIFFNESS_PROMPTS marginal prompts of a fixed seed), or None where theory names no end
    point.  Gradient descent on D settles there only at steps below 2 / lambda_end; lambda_end grows
    with d (about 9 at d = 4..6, L = 64; 27.5 at the authors' blocks 16,17,17, L = 100), which is
    why one step cannot serve every size.  Memoised per (tasks, heads, L, sigma, param, logit scale)."""
    key = (tuple(cfg.tasks), cfg.heads, cfg.L, float(cfg.sigma), cfg.param, float(cfg.logit_scale))
    if key not in _END_STIFFNESS:
        end = end_point(cfg)
        _END_STIFFNESS[key] = (None if end is None else
                               1.0 / stable_step(cfg, end[0], end[1], math.inf, END_STIFFNESS_PROMPTS, 0))
    return _END_STIFFNESS[key]


FULL_STIFFNESS_PROMPTS = 2048   # fresh prompts of each Hessian-vector product of full_stiffness
FULL_STIFFNESS_ITERS = 16       # its power iterations (the last quarter's Rayleigh quotients averaged)
EXPLORE_LENGTHS = 2.0           # a stiff run's explore: this many of theory's run lengths (three_phases.run_length)
STIFF_POLISH_BATCHES = 4        # a stiff run's polish batch: at most this many explore batches (k = lr/B ratio 1/4)

_FULL_STIFFNESS: dict = {}


def full_stiffness(cfg: ProblemConfig) -> float | None:
    """lambda_full: the largest eigenvalue of the full model's population Hessian, every weight, at
    theory's end point (:func:`end_point`, the balanced model of D there;
    numerics.evaluate.hessian_top_eigenvalue on FULL_STIFFNESS_PROMPTS fresh prompts a product), or
    None where theory names no end point.  It sees what :func:`end_stiffness` cannot: directions off
    D.  At the authors' blocks (16,17,17), H = 3, L = 100 the top direction is K's y columns (the
    label of a context token entering its key), lambda_full ~ 1200 against lambda_end = 27.5 on D,
    and it grows like r mu*^2 along the flow (11 at the init s0 = 0.15), so a step stable on D
    (0.036) leaves D within a few steps (off-D residual 0.35 at t = 0.6) and the run never allocates;
    at (3, 3), L = 64 it is ~38 (on D 11.2).  Memoised per configuration (~25 s CPU at d = 50)."""
    key = (tuple(cfg.tasks), cfg.heads, cfg.L, float(cfg.sigma), cfg.param, float(cfg.logit_scale), cfg.dtype)
    if key not in _FULL_STIFFNESS:
        end = end_point(cfg)
        _FULL_STIFFNESS[key] = (None if end is None else hessian_top_eigenvalue(
            MultiHeadAttention.from_semi_singular_values(cfg, *end), FULL_STIFFNESS_PROMPTS, FULL_STIFFNESS_ITERS))
    return _FULL_STIFFNESS[key]


def stiffness_seconds(cfg: ProblemConfig) -> float:
    """CPU seconds of what :func:`unstable_step` asks at ``cfg`` (0 at d <= TUNED_D, where it asks nothing): theory's
    end point (~4 s: the exact fixed point's quadratures) and :func:`full_stiffness`'s FULL_STIFFNESS_ITERS
    Hessian-vector products, ~3 forward passes each (``numerics.engine``).  Measured (AMD EPYC, docs/measurements.md): 10.8 s at
    (16,17,17), H = 3, L = 100 (priced 11.9), 7.1 s at H = 4 (12.3)."""
    if cfg.d <= TUNED_D:
        return 0.0
    return 5.0 + FULL_STIFFNESS_ITERS * 3 * engine.forward_seconds(cfg.tasks, cfg.heads, cfg.L, FULL_STIFFNESS_PROMPTS)


PRICE_STIFFNESS_FACTOR = 1.3
"""lambda_full ~ PRICE_STIFFNESS_FACTOR d mu_inf^2 for pricing (:func:`priced_stiffness`): d mu*^2 at the limit
fixed point gives 953 at (16,17,17) and 37 at (3,3), against lambda_full 1200 at L = 100 and 38 at L = 64
(:func:`full_stiffness`); the larger ratio is kept, so a price errs toward the longer run."""


def priced_stiffness(cfg: ProblemConfig) -> float:
    """The stiffness a price assumes (:func:`converged_seconds`): PRICE_STIFFNESS_FACTOR d max_i mu*_i^2 at theory's
    L -> infinity fixed point (closed form, milliseconds), never the exact fixed point and the full model's Hessian
    that :func:`stiff_schedule` measures (minutes at d = 30, L = 512): a plan prices without computing."""
    mu = max(task["mu_star"] for task in limit_multi_per_task(cfg.tasks, cfg.sigma))
    return PRICE_STIFFNESS_FACTOR * cfg.d * mu ** 2


def stiff_schedule(cfg: ProblemConfig, schedule: "TrainingSchedule", lam: float | None = None) -> "TrainingSchedule":
    """The schedule a converged run of ``cfg`` takes where the schedule's own steps diverge: its
    steps were chosen at d <= 9, and at the authors' blocks (d = 50) the explore step 0.1 diverges
    within three steps.  Both phases step at min(the schedule's step, 1 / lambda), lambda the larger
    of theory's stiffness on D (:func:`end_stiffness`) and the full model's (:func:`full_stiffness`)
    at theory's end point: gradient descent settles there only below 2 / lambda, and the stiffness
    grows along the flow toward it, so the end point's bound holds the whole way (half of it kept).
    At so small a step the schedule's flow time is thousands of steps more than the flow needs, so
    the explore lasts EXPLORE_LENGTHS of theory's run length from cfg's start (its warm-up and
    emergence: theory.three_phases.run_length, ~2 x the emergence end) where that is shorter (the
    polish and its extensions follow as always, and the convergence test still decides), and the
    polish batch is at most STIFF_POLISH_BATCHES explore batches (the ratio of lr / B of the two
    phases, which the step error divides by, is then 1/4 instead of 1/8: at a step this small the
    explore's own lr / B, 5e-6 at d = 50, lies already below the quick polish's 1.5e-5).  Where
    theory names no end point the schedule stands; ``lam`` given (a price: :func:`priced_stiffness`), it is used as
    the stiffness instead."""
    if lam is None:
        lams = [lam for lam in (end_stiffness(cfg), full_stiffness(cfg)) if lam is not None and lam > 0]
        if not lams:
            return schedule
        lam = max(lams)
    lr, polish_lr = min(schedule.lr, 1.0 / lam), min(schedule.polish_lr, 1.0 / lam)
    time_ = schedule.time
    if cfg.init == "decomposable":
        from numerics.model import initial_values
        from theory.three_phases import run_length

        length, status = run_length(*initial_values(cfg), cfg.tasks, cfg.L, cfg.sigma, cfg.param, cfg.logit_scale,
                                    lr=lr)
        if status == "t_end" and math.isfinite(length):
            time_ = min(time_, EXPLORE_LENGTHS * length)
    polish_batch = min(schedule.batch(cfg.L, schedule.polish_tokens),
                       STIFF_POLISH_BATCHES * schedule.batch(cfg.L, schedule.tokens))
    return dataclasses.replace(schedule, lr=lr, polish_lr=polish_lr, time=time_,
                               polish_tokens=polish_batch * int(cfg.L))


TUNED_D = 9
"""The largest d at which the schedules' steps were chosen (every profile's sizes): beyond it an
estimate asks :func:`stiff_schedule` (theory's and the full model's stiffness, ~30 s at d = 50)
what a run will take, since there the schedule's own steps may diverge."""


@kind("unstable_step", cost=lambda cfg, lr: stiffness_seconds(cfg))
def unstable_step(cfg: ProblemConfig, lr: float, seed: int = 0) -> str | None:
    """Why gradient descent at step ``lr`` does not follow the flow at ``cfg`` (None: it may): beyond
    d = TUNED_D, lr at or past the full model's stability bound 2 / lambda_full at theory's end point
    (:func:`full_stiffness`; at the authors' blocks (16,17,17), L = 100, lr 0.05 is 59 x lambda's
    inverse: every OV value of such a run ends at 0).  Not asked at d <= TUNED_D, where lr lambda is
    0.4 at the tiny and quick profiles and 1.3 at paper (three-phases' schedule).  A need kind (its seed unused:
    the Hessian's prompts are FULL_STIFFNESS_PROMPTS of a fixed seed)."""
    lam = full_stiffness(cfg) if cfg.d > TUNED_D else None
    if lam is None or lr * lam < 2.0:
        return None
    return (f"the step {lr:g} lies beyond the full model's stability bound 2/lambda = {2 / lam:.3g} at theory's "
            f"end point (lambda = {lam:.4g}, off D): the run is not the gradient flow")


def converged_seconds(cfg: ProblemConfig, schedule: TrainingSchedule, pieces: int = 1) -> float:
    """CPU seconds (``numerics.engine``) of :func:`train_converged` at ``cfg`` with ``pieces`` polish
    pieces (1: converged after the first; the budget allows ``schedule.polish_extensions + 1``; a
    stiff schedule at least 2, as measured): the
    explore, and per piece its polish, the held-out loss and the paired descent sample
    (WINDOW_POINTS snapshots and the explore end)."""
    L, tasks, H, dt = cfg.L, cfg.tasks, cfg.heads, cfg.dtype
    if cfg.d > TUNED_D:
        # beyond the sizes the schedule was tuned at, a run whose steps diverge takes the stiff schedule
        stiff = stiff_schedule(cfg, schedule, priced_stiffness(cfg))
        if stiff.lr < schedule.lr:
            # the stiff runs of the authors' audit all took a second polish piece ((16,17,17), H = 3,
            # L = 100: 913 CPU s measured against 380 s priced with one)
            schedule, pieces = stiff, max(int(pieces), 2)
    lr, polish_lr = schedule.lr, schedule.polish_lr
    explore = engine.train_seconds(tasks, H, L, schedule.batch(L, schedule.tokens),
                                 round(schedule.time / lr), dtype=dt, records=5)
    piece = (engine.train_seconds(tasks, H, L, schedule.batch(L, schedule.polish_tokens),
                                round(schedule.polish_time / polish_lr), dtype=dt,
                                records=2 * WINDOW_POINTS - 1)
             + engine.forward_seconds(tasks, H, L, schedule.held_out(L))
             + engine.forward_seconds(tasks, H, L, schedule.descent_prompts(L), models=WINDOW_POINTS + 1))
    return explore + int(pieces) * piece


def converged_for(run, tolerance: float) -> bool:
    """The one convergence test: a run is converged for a comparison of tolerance ``tolerance``
    (fixed before comparing, from the comparison's own noise) when the loss it could still
    lose, ``run["descent_left"]`` (its descent rate over the second half of its final stage,
    one standard error up, times the stage's length: numerics.evaluate.descent_left), is at
    most tolerance / Z_CONVERGED, i.e. within about one standard error of the comparison.
    Small against the comparison's tolerance, not against the loss: a run that would still
    lose 0.02 is converged for a comparison of tolerance 0.1 and not for one of 0.05.  A run
    handed in without a descent fit (a test's stand-in) is read by its own ``converged``."""
    left = run.get("descent_left") if hasattr(run, "get") else None
    if left is None:
        return bool(run["converged"])
    return bool(float(left) <= float(tolerance) / Z_CONVERGED)


def last_quarter(record_steps, most: int | None = None) -> set:
    """The record steps of a single fixed-step stage's last quarter: the snapshots of its
    descent fit (:func:`stage_descent`), thinned evenly to at most ``most`` (None: all), the
    last record always kept."""
    steps = np.asarray(sorted(record_steps))
    window = steps[steps >= 0.75 * steps[-1]]
    if most is not None and window.size > most:
        window = window[np.unique(np.round(np.linspace(0, window.size - 1, most)).astype(int))]
    return set(int(x) for x in window)


def stage_descent(snapshots, n: int, seed: int):
    """The descent fit of a single fixed-step stage (an atlas point, an optimality candidate):
    numerics.evaluate.descent_left on its last quarter's snapshots ((t, model) pairs, at
    least 3, paired on ``n`` held-out prompts of ``seed``), horizon the quarter's length.  Such
    a stage has no polish and is read at its end, so the test asks whether the last quarter
    again would move its loss beyond its comparison's tolerance, which must then carry the
    final iterate's fluctuation (the fit's ``jitter``) besides the held-out standard error
    (:func:`stage_tolerance`).  None with fewer than 3 snapshots."""
    if len(snapshots) < 3:
        return None
    t = [x[0] for x in snapshots]
    return descent_left(t, held_out_prompt_losses([m for _, m in snapshots], n, seed), horizon=float(t[-1] - t[0]))


def stage_tolerance(se: float, jitter: float) -> float:
    """The tolerance of a single fixed-step stage's loss comparison: Z_CONVERGED x
    sqrt(se^2 + jitter^2), the held-out standard error and the final iterate's fluctuation (one
    draw of the fixed step's SGD cloud)."""
    return Z_CONVERGED * math.hypot(se, jitter)


class _RunRecord:
    """Read like the dict the runs once were (``run["loss"]``, ``run.get(...)``) and written as one."""

    def __getitem__(self, key):
        return getattr(self, key)

    def get(self, key, default=None):
        return getattr(self, key, default)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ConvergedRun(_RunRecord):
    """A full model trained by a :class:`TrainingSchedule` and measured at its final weights.

    ``loss``, ``se``, ``n``: held-out loss on fresh prompts of the held-out stream of ``seed``;
    ``step_error``: the excess loss SGD's step leaves after the polish (if the excess is
    proportional to lr/B, the explore-end minus polish-end held-out loss, ``excess``, paired on
    the descent prompts, is (1 - k) of the explore excess, k the ratio of lr/B of the two
    phases, so the polish's own excess is k/(1-k) times it); ``descent``: the descent fit over
    the polish's second half (numerics.evaluate.DescentLeft.to_dict(), horizon the polish's
    length) and ``descent_left`` its loss still to lose; ``converged``: :func:`converged_for`
    at the run's own comparison tolerance ``convergence_tolerance`` = Z_CONVERGED se +
    step_error (claim 5's, less theory's ~1e-12 quadrature bound); the readout omega, mu,
    residual and its ``allocation`` (``numerics.evaluate.allocation(...).to_dict()``).  Read as a
    mapping too (``run["loss"]``)."""

    loss: float
    se: float
    n: int
    converged: bool
    convergence_tolerance: float
    descent_left: float
    descent: dict
    excess: float
    excess_se: float
    loss_explore_end: float
    step_error: float
    lr_over_batch_ratio: float
    omega: tuple
    mu: tuple
    residual: float
    allocation: dict
    config: dict
    schedule: dict
    seed: int
    explore_batch: int
    polish_batch: int
    seconds: float
    steps_taken: dict | None = None   # the stiff schedule (:func:`stiff_schedule`) where the schedule's steps diverged



def pop_seed(fields: dict) -> int:
    """A sweep point's ``train.seed`` (default 0), taken out of its [train] fields: an integer in [0, 2^63)."""
    seed = fields.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise ValueError(f"grid: train.seed must be an integer in [0, 2^63), got {seed!r}")
    return seed


def check_schedule(fields: dict, L: int = 1) -> TrainingSchedule:
    """A sweep point's [train] section of a converged run (TrainingSchedule fields and
    ``seed``) validated before any point runs: both phases must be valid TrainConfigs (positive
    finite step and time, a sane step count), the token counts positive integers."""
    fields = dict(fields)
    seed = pop_seed(fields)
    sch = TrainingSchedule(**fields)
    for name in ("tokens", "polish_tokens", "held_out_tokens", "held_out_min", "min_batch", "descent_tokens"):
        v = getattr(sch, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"grid: train.{name} must be a positive integer, got {v!r}")
    v = sch.polish_extensions
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 100:
        raise ValueError(f"grid: train.polish_extensions must be an integer in 0 .. 100, got {v!r}")
    for lr, t, tokens, what in ((sch.lr, sch.time, sch.tokens, "lr/time"),
                                (sch.polish_lr, sch.polish_time, sch.polish_tokens, "polish_lr/polish_time")):
        try:
            TrainConfig(lr=lr, time=t, batch=sch.batch(L, tokens), seed=seed)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"grid: train.{what}: {exc}") from None
    return sch


def converged_point(cfg: ProblemConfig, schedule: TrainingSchedule, seed: int) -> dict:
    """The sweep point of this run (``numerics.sweep``, ``model = "converged"``): its identity."""
    return {"model": "converged", "problem": cfg.to_dict(), "train": {**asdict(schedule), "seed": int(seed)}}


def _normalise_point(point: dict):
    cfg = ProblemConfig.from_dict(point["problem"])
    train_fields = dict(point["train"])
    seed = int(train_fields.pop("seed", 0))
    return (point.get("model"), json.dumps(cfg.to_dict(), sort_keys=True), TrainingSchedule(**train_fields), seed)


def from_dict(d: dict) -> ConvergedRun:
    """A ConvergedRun from its ``to_dict()`` (a sweep point's stored result)."""
    names = {f.name for f in dataclasses.fields(ConvergedRun)}
    d = {k: v for k, v in d.items() if k in names}
    d["omega"] = tuple(tuple(r) for r in d["omega"])
    d["mu"] = tuple(tuple(r) for r in d["mu"])
    d["step_error"] = float(d["step_error"]) if d["step_error"] not in ("inf", "nan") else math.inf
    return ConvergedRun(**d)


def run_point(point: dict) -> dict:
    """The sweep's point function for ``model = "converged"``: train and return ``to_dict()``."""
    _, _, schedule, seed = _normalise_point(point)
    return train_converged(ProblemConfig.from_dict(point["problem"]), schedule, seed).to_dict()


def _window_snapshots(snaps, total: float) -> list:
    """WINDOW_POINTS records (t, ...) evenly spaced over the second half [total / 2, total] of a
    stage (the records nearest to those times)."""
    times = np.array([x[0] for x in snaps])
    return [snaps[i] for i in sorted({int(np.argmin(np.abs(times - w)))
                                      for w in np.linspace(0.5 * total, total, WINDOW_POINTS)})]


@kind("converged", cost=converged_seconds, point=lambda cfg, schedule, seed: converged_point(cfg, schedule, seed),
      normalise=_normalise_point, load=from_dict)
@one_thread
def train_converged(cfg: ProblemConfig, schedule: TrainingSchedule, seed: int = 0) -> ConvergedRun:
    """Train the full model of ``cfg`` by ``schedule`` and measure its converged loss
    (:class:`ConvergedRun` says what each number is).

    The polish runs ``polish_time`` at a time (piece e on the prompt stream named ("polish", e)); after
    each piece the descent left is fitted over the second half of the whole polish (horizon:
    the polish's length so far, "as long again") and, while the run is not converged for its
    own tolerance, another piece follows, at most ``polish_extensions`` of them.  A run that
    has left the allocated set for a superposition (an opposite-sign off-task mu above
    numerics.evaluate.ALLOCATED_SHARE of the serving one) is not extended: its descent is the
    flow leaving the saddle along the superposition valley, which more polish at this step does
    not settle within the budget (the boundary follows it on D instead:
    :func:`continue_on_D`)."""
    t0 = time.perf_counter()
    L = cfg.L
    # the schedule's steps first; only a run they diverge on pays for theory's end stiffness (2-4 s CPU
    # per configuration, which every quick-size run would otherwise pay for nothing) and is re-run at
    # phase_steps' capped steps
    lr, polish_lr = schedule.lr, schedule.polish_lr
    explore = TrainConfig(lr=lr, time=schedule.time, batch=schedule.batch(L, schedule.tokens), seed=seed,
                          records=5)
    steps = schedule
    try:
        first = train(cfg, explore)
    except TrainingDiverged:
        steps = stiff_schedule(cfg, schedule)
        if steps.lr >= lr:
            raise
        lr, polish_lr = steps.lr, steps.polish_lr
        explore = dataclasses.replace(explore, lr=lr, time=steps.time)
        first = train(cfg, explore)
    snaps, model, total = [], first.final_model, 0.0

    for piece in range(schedule.polish_extensions + 1):
        polish = TrainConfig(lr=polish_lr, time=schedule.polish_time,
                             batch=steps.batch(L, steps.polish_tokens), seed=case_seed(seed, "polish", piece),
                             records=2 * (WINDOW_POINTS - 1) + 1)

        def keep(step, t, m, loss, offset=total):
            snaps.append((offset + t, copy.deepcopy(m)))     # compared later on the same prompts (paired)

        second = train(cfg, polish, start=copy.deepcopy(model), on_record=keep)
        model, total = second.final_model, total + polish.time
        final = held_out_loss(model, schedule.held_out(L), seed)
        window = _window_snapshots(snaps, total)
        # the descent fit and the explore-end excess on one paired sample: snapshots, then the explore end
        paired = held_out_prompt_losses([m for _, m in window] + [first.final_model], schedule.descent_prompts(L), seed)
        descent = descent_left([t for t, _ in window], paired[:-1], horizon=total)
        diff = paired[-1] - paired[-2]
        diff_mean, excess_se = mean_se(diff)
        excess = max(0.0, diff_mean)
        k = (polish.lr / polish.batch) / (explore.lr / explore.batch)
        step_error = excess * k / (1.0 - k) if k < 1 else math.inf
        tol = Z_CONVERGED * final.se + step_error
        readout = model.semi_singular_values()
        alloc = allocation(readout.omega, readout.mu)
        converged = converged_for({"descent_left": descent.left}, tol)
        if converged or (cfg.heads > 1 and alloc.opposite_sign_share > ALLOCATED_SHARE):
            break
    return ConvergedRun(
        loss=final.mean, se=final.se, n=final.n, converged=converged,
        convergence_tolerance=tol, descent_left=descent.left, descent={**descent.to_dict(), "polish_time": total,
                                                                         "pieces": piece + 1},
        excess=excess, excess_se=excess_se, loss_explore_end=final.mean + float(diff.mean()), step_error=step_error,
        lr_over_batch_ratio=k,
        omega=tuple(map(tuple, readout.omega.tolist())), mu=tuple(map(tuple, readout.mu.tolist())),
        residual=float(readout.residual), allocation=alloc.to_dict(),
        config=cfg.to_dict(), schedule=asdict(schedule), seed=int(seed), explore_batch=explore.batch,
        polish_batch=polish.batch, seconds=time.perf_counter() - t0,
        steps_taken=None if steps is schedule else asdict(steps))


# ---------------------------------------------------------------------------------------
# a run that left the allocated set, followed on D by the exact reduced flow
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ContinuationSchedule:
    """How a trained run is followed on D to where its flow goes (:func:`continue_on_D`): the
    exact finite-L reduced flow (``numerics.train.train_reduced``, theory's factored balanced
    metric, the Rao-Blackwellised ``marginal`` estimator on tokens // L fresh prompts a step, at
    least ``min_batch``: a fixed token count keeps the gradient noise per step comparable across
    L, as the trained schedule's) in pieces of ``chunk`` flow time, at most ``time`` in all (the
    budget), each piece at the step
    min(``lr``, 1/lambda_max) (lambda_max: the largest eigenvalue of the metric-weighted Hessian
    F^1/2 Hess F^1/2 of the exact reduced loss at the piece's start on ``hessian_prompts``
    prompts: gradient descent is stable below 2/lambda_max, and the valley the superposition
    runs along stiffens as mu grows), the descent fit and the loss on ``eval_prompts`` common
    prompts."""

    lr: float = 0.1
    tokens: int = 2 ** 14
    min_batch: int = 64
    chunk: float = 20.0
    time: float = 100.0
    eval_prompts: int = 8192
    hessian_prompts: int = 2048
    records: int = 21             # records per piece (the window's snapshots are taken from them)

    def batch(self, L: int) -> int:
        return max(self.min_batch, int(self.tokens) // int(L))


QUICK_CONTINUATION = ContinuationSchedule()
PAPER_CONTINUATION = ContinuationSchedule(tokens=2 ** 17, time=1000.0, eval_prompts=65536)


@dataclass(frozen=True)
class ContinuedRun(_RunRecord):
    """A trained run that left the allocated set, followed on D (:func:`continue_on_D`).

    ``on_D``: the run's held-out loss (full model, ``start_full`` +- ``start_full_se``) agrees
    with the exact reduced loss at its readout (``start_loss`` +- ``start_se``) within
    Z_CONVERGED standard errors of the difference: its off-D part (``residual`` of ||(W, U)||)
    carries no loss beyond noise, so on D the full model's flow is the reduced flow (claims 1-2)
    and the continuation follows the run; off D it is not continued.  ``time``: flow time
    followed; ``converged``: the descent left (``descent``: numerics.evaluate.descent_left over
    the continuation's second half, horizon its length) is at most hypot(se, ``reference_se``),
    i.e. within tolerance / Z_CONVERGED of a two-sided comparison with a prediction of standard
    error ``reference_se`` at Z_CONVERGED standard errors; else ``reason``.  ``loss`` +- ``se``:
    the exact reduced loss at the end on the eval prompts; ``jitter`` the window's residual
    scatter (what the last iterate's fluctuation may add); (``omega``, ``mu``) and their
    ``allocation``; per piece its step (``steps_lr``)."""

    on_D: bool
    start_full: float
    start_full_se: float
    start_loss: float
    start_se: float
    residual: float
    time: float
    converged: bool
    reason: str
    descent: dict
    descent_left: float
    reference_se: float
    loss: float
    se: float
    jitter: float
    omega: tuple
    mu: tuple
    allocation: dict
    steps_lr: tuple
    steps: int
    schedule: dict
    seconds: float



def stable_step(cfg: ProblemConfig, omega, mu, lr_max: float, n: int, seed: int) -> float:
    """min(lr_max, 1/lambda_max): lambda_max the largest eigenvalue of F^1/2 Hess F^1/2 of the
    exact reduced loss at (omega, mu) (``n`` marginal prompts of ``seed``; F theory's metric
    factors, theory.reduced_ode.metric_factors).  The linearised step x' = x - lr F Hess x is
    stable while lr lambda_max < 2; half of that bound is kept."""
    omega, mu = np.asarray(omega, float), np.asarray(mu, float)
    H, m = omega.shape
    prompts = next(exact_reduced.marginal_chunks(cfg.tasks, cfg.L, n, seed, H))

    def loss(x):
        return exact_reduced.marginal_losses(x[:H * m].view(H, m), x[H * m:].view(H, m), prompts, cfg.tasks,
                                             cfg.sigma).mean()

    x0 = torch.tensor(np.concatenate([omega.ravel(), mu.ravel()]), dtype=torch.float64)
    hess = torch.autograd.functional.hessian(loss, x0).numpy()
    f_om, f_mu = metric_factors(cfg.param, omega, mu, cfg.tasks, cfg.logit_scale)
    s = np.sqrt(np.concatenate([f_om.ravel(), f_mu.ravel()]))
    lam = float(np.linalg.eigvalsh(0.5 * (hess + hess.T) * s[:, None] * s[None, :]).max())
    return float(min(lr_max, 1.0 / lam)) if lam > 0 else float(lr_max)


@one_thread
def continue_on_D(cfg: ProblemConfig, run, seed: int, sch: ContinuationSchedule = QUICK_CONTINUATION,
                  reference_se: float = 0.0) -> ContinuedRun:
    """The run (a :class:`ConvergedRun`, of ``cfg``) followed on D by the exact reduced flow
    until converged for a comparison with a prediction of standard error ``reference_se``, or
    the budget is spent (:class:`ContinuedRun`, :class:`ContinuationSchedule`); prompt streams
    named from ``seed``: piece k ("piece", k), the eval prompts ("evaluation"), the Hessians
    ("hessian", k)."""
    seed, reference_se = int(seed), float(reference_se)
    t0 = time.perf_counter()
    tasks, L, sigma = cfg.tasks, cfg.L, cfg.sigma
    eval_seed = case_seed(seed, "evaluation")
    om, mu = np.array(run["omega"], float), np.array(run["mu"], float)

    def evaluate(points):
        return exact_reduced.evaluate(points, tasks, L, sigma, sch.eval_prompts, eval_seed, cfg.device)

    first = evaluate([(om, mu)])[0]
    start_loss, start_se = mean_se(first)
    on_D = abs(run["loss"] - start_loss) <= Z_CONVERGED * math.hypot(run["se"], start_se)
    records, steps_lr, steps, t = [(0.0, om.copy(), mu.copy())], [], 0, 0.0
    descent, loss, se, converged = None, start_loss, start_se, False
    reason = "" if on_D else (f"off D: the full model's held-out loss {run['loss']:.4g} +- {run['se']:.2g} and the "
                              f"reduced loss at its readout {start_loss:.4g} +- {start_se:.2g} differ by more than "
                              f"{Z_CONVERGED:g} standard errors (off-D residual {run['residual']:.3g}): not followed")
    piece = 0
    while on_D and t < sch.time - 1e-9:
        lr = stable_step(cfg, om, mu, sch.lr, sch.hessian_prompts, case_seed(seed, "hessian", piece))
        span = min(sch.chunk, sch.time - t)
        lr = span / max(2, int(math.ceil(span / lr)))          # a whole number of steps per piece
        tcfg = TrainConfig(lr=lr, time=span, batch=sch.batch(L), seed=case_seed(seed, "piece", piece), records=sch.records)

        def keep(step, tt, state, batch_loss, offset=t):
            records.append((offset + tt, *(x.detach().cpu().double().numpy().copy() for x in state)))

        try:
            res = train_reduced(cfg, tcfg, start=(om, mu), estimator="marginal", on_record=keep)
        except TrainingDiverged as exc:
            reason = f"the reduced flow diverged at t = {t:.3g} ({exc})"
            break
        om, mu = np.asarray(res.omega, float), np.asarray(res.mu, float)
        t, steps, piece = t + span, steps + res.steps, piece + 1
        steps_lr.append(lr)
        window = _window_snapshots(records, t)
        per = evaluate([(r[1], r[2]) for r in window])
        descent = descent_left([r[0] for r in window], per, horizon=t)
        loss, se = mean_se(per[-1])
        converged = descent.left <= math.hypot(se, reference_se)
        if converged:
            break
    if on_D and not converged and not reason:
        reason = (f"budget spent: after t = {t:g} of the reduced flow it could still lose {descent.left:.3g} "
                  f"(rate {descent.rate:.3g} per unit time), more than hypot(se, reference se) = "
                  f"{math.hypot(se, reference_se):.3g}")
    d = descent.to_dict() if descent is not None else {}
    return ContinuedRun(
        on_D=bool(on_D), start_full=float(run["loss"]), start_full_se=float(run["se"]), start_loss=start_loss,
        start_se=start_se, residual=float(run["residual"]), time=float(t), converged=bool(converged), reason=reason,
        descent=d, descent_left=float(d.get("left", math.inf)), reference_se=reference_se, loss=loss, se=se,
        jitter=float(d.get("jitter", 0.0)), omega=tuple(map(tuple, om.tolist())), mu=tuple(map(tuple, mu.tolist())),
        allocation=allocation(om, mu).to_dict(), steps_lr=tuple(steps_lr), steps=int(steps), schedule=asdict(sch),
        seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------
# a full model trained to its converged loss (claims 5, 6, boundary-left-allocation; sweep model "converged")
# ---------------------------------------------------------------------------------------


def _continuation_cost(cfg, run, schedule, best) -> float:
    c = schedule
    return (round(c.time / c.lr) * engine.reduced_step_seconds(cfg.tasks, cfg.heads, cfg.L, c.batch(cfg.L),
                                                            estimator="marginal")
            + engine.marginal_seconds(cfg.tasks, cfg.heads, cfg.L, c.eval_prompts, points=c.records))


@kind("continue_on_D", cost=_continuation_cost)
def continuation_run(cfg, run, schedule, best, seed: int):
    """A trained run that left the allocated set followed on D (``converged.continue_on_D``),
    converged for a comparison with the best decomposable point ``best`` (its standard error)."""
    return continue_on_D(cfg, run, seed, schedule, best.se)
