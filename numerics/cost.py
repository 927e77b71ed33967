"""What a run costs before it runs: a calibrated model of the CPU seconds of the numerics' primitives.

Every claim's ``estimate`` is its own plan (which runs, how many steps, which evaluations) priced
through this module, so that ``reports.build`` can print an honest cost before it starts and refuse
an audit that would not finish.  One model, fitted once, used everywhere:

    seconds(primitive) = sum_k c_k x_k

with features x_k counted from the sizes (tasks, heads H, L, batch B, runs) and non-negative
coefficients c_k fitted by ``python -m numerics.bench --calibrate`` (relative least squares over a grid of
measured sizes: each point counts by its ratio measured / modelled, so small and large sizes are fitted
alike).  The primitives, with D = d + m the token width, m the tasks:

- :func:`step_seconds` -- one gradient step of the full model, ``numerics.train.train`` (one run) or a
  program of ``numerics.train.train_many`` (R runs of one shape, S distinct prompt streams, k = R / S
  runs per stream): features step (1), run (R), context (S B L D: drawing the prompts and reading the
  context), logits (R B L H: the logit-sized tensors and the softmax), flops (R B L D H: the four
  context products);
- :func:`forward_seconds` -- the held-out loss of ``models`` full models on n fresh prompts
  (``numerics.evaluate``: no gradient, chunks of 4096): chunk (n / 4096), context (n L D), logits
  (models n L H), flops (models n L D H);
- :func:`reduced_step_seconds` -- one step of ``numerics.train.train_reduced``: the whole-prompt
  estimator (draws the full prompts: context n L D, block scores n L m, the mix n L H m) or the
  Rao-Blackwellised ``marginal`` one (draws n L m, the mix n L H m);
- :func:`marginal_seconds` -- ``numerics.exact_reduced.evaluate`` of ``points`` (omega, mu) points on
  n marginal prompts (draws n L m once, the mix points n L H m);
- :func:`fit_seconds` -- one L-BFGS-B search of ``numerics.exact_reduced.minimise_family`` from one
  start: FIT_EVALUATIONS objective evaluations (forward and backward of the closed-form mu on the
  fit sample: the mix n L H m);
- :func:`theory_seconds` -- a call of theory's quadrature (``theory.exact``) or flows, by kind: the
  measured CPU seconds in :data:`THEORY_SECONDS` (they depend on the block sizes only mildly).

CPU seconds, one torch thread (the claims' policy, ``numerics.experiments.one_thread``), process time
(``time.process_time``): waiting for a core does not count, so the numbers hold on a shared machine
(sharing the caches inflates them by some 10-30 %).  The report's wall time on 2 cores is the larger of
its two processes' sums (``reports.build`` adds the claims up that way).  Measured on the machine of
:data:`CALIBRATION`; another machine should run ``python -m numerics.bench --calibrate`` and compare.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

MERGE_CONTEXT_ELEMENTS = 2 ** 20
"""On the CPU, runs of different prompt streams share a program only while the program's
contexts (streams x batch x L x (d + m)) hold at most this many numbers (8 MiB in float64).
Measured (one thread, 8 runs of 8 own streams against the 8 runs one after another, CPU time,
float64, H = 2; docs/performance.md): 1.49x at tasks 3,3, L = 32, batch 256 (8 streams: 0.5 M
numbers), 1.29x at tasks 2,2, L = 32, batch 512 (0.8 M), but 1.09x at tasks 3,3, L = 64,
batch 512 (2.1 M) and 0.9-1.0x at tasks 2,2, L = 64, batch 1024 (5 streams a program: 2 M):
beyond about a million numbers the merged contexts leave the cache and merging gains
nothing, so larger streams get programs of their own (their runs still share their draw)."""

CALIBRATION = {
    "machine": "Intel Xeon, 2 vCPUs (shared with four other engineers' jobs), 260 MiB L3, 23 GB RAM",
    "software": "torch 2.13.0+cpu, numpy 2, Python 3.11, one torch thread",
    "when": "docs/measurements.md, the cost model's calibration",
    "load": "load average 3-8 during the calibration (CPU time, not wall)",
    "how": "python -m numerics.bench --calibrate --out FILE (numerics/bench/calibrate.py)",
    "accuracy": "calibration points within a factor 1.6 of the fitted model, one (L = 12, 16,17,17) at 2.3 (numerics.bench --calibrate prints each)",
}
"""Where and how the coefficients below were measured."""

# coefficients (CPU seconds per unit of each feature), fitted by numerics.bench --calibrate
# (CALIBRATION; 28 CPU s).  float32 was not calibrated: its per-element coefficients are float64's x 0.67,
# the ratio numerics.bench section 4 measured at 16,17,17 / H = 3 / L = 100 / batch 10000 (566 / 846 ms)
STEP = {
    "float64": {"step": 1.65e-3, "run": 1.2e-3, "context": 1.88e-8, "logits": 9.45e-9, "flops": 6.57e-10},
    "float32": {"step": 1.65e-3, "run": 1.2e-3, "context": 1.26e-8, "logits": 6.3e-9, "flops": 4.4e-10},
}
FORWARD = {"chunk": 1.18e-3, "context": 1.06e-8, "logits": 0.0, "flops": 8.25e-10}
REDUCED_STEP = {
    "prompts": {"step": 2.65e-3, "context": 1.43e-8, "scores": 0.0, "mix": 0.0},
    "marginal": {"step": 5.0e-4, "draws": 3.65e-8, "mix": 0.0},
}
MARGINAL = {"call": 0.0, "draws": 3.99e-8, "mix": 4.63e-9}
FIT = {"evaluation": 2.5e-2, "mix": 1.78e-8}

REPORT_SCALE = 0.37
"""Every coefficient above and every theory time below is its fit times this factor: the quick
report's own needs, measured by CPU seconds (``reports.build``, seed 0, ``--jobs 2``, the CI's kind
of machine, 2 cores; docs/measurements.md), took 0.37 of what the fit priced them at
(438 CPU-s measured in the engine's jobs against 1175 priced).  The fit's grid times programs
of a few runs at a time on a machine loaded by other jobs; the report's programs fold many runs
onto one stream's context, which the per-run feature prices at a small program's rate (its
per-kind ratios, priced over measured: start runs 3-4, saddle runs 1.6-3.5, theory 3.9, the
converged runs 1.4), so one factor leaves each kind within a factor of about 2 and the
report's total within a few %; the build's comparisons and rendering add some
5 % more."""

for _table in (STEP["float64"], STEP["float32"], FORWARD, REDUCED_STEP["prompts"], REDUCED_STEP["marginal"],
               MARGINAL, FIT):
    for _name in _table:
        _table[_name] *= REPORT_SCALE

FIT_EVALUATIONS = 80
"""Objective evaluations of one L-BFGS-B search of ``minimise_family`` (its maxiter is 100; the
calibration's searches took 11, 41, 124 and 146 evaluations): a stated mean, not a bound."""

THEORY_SECONDS = {
    "exact_fixed_point": 3.2,      # theory.exact.exact_fixed_point, per distinct block size r_i: 2.8 s at (2, 2),
                                   # 7.1 s at (16, 17, 17) (L = 100; 6.4 s at L = 200)
    "finite_L_gain": 3.2,          # theory.exact.finite_L_gain: the fixed point (per distinct r_i, as above) plus the
                                   # one-head optimum, SINGLE_HEAD_SECONDS x (d / 4)^SINGLE_HEAD_POWER
    "phase_prediction": 2.9,       # claim 3 per init scale: run_length, the expansion flow's phases, the exact losses
                                   # (measured under load in the quick report; run_length alone 0.4-4.4 s)
    "exact_flow": 0.45,            # theory.exact.exact_flow, one head, per L
    "expansion_flow": 0.2,         # theory.reduced_ode flows (LSODA to t ~ 60)
}
"""CPU seconds of one call of theory's quadrature or flows, by kind, measured at the claims' sizes;
the quadrature's by the blocks (:func:`theory_seconds`)."""

THEORY_SECONDS = {name: seconds * REPORT_SCALE for name, seconds in THEORY_SECONDS.items()}

SINGLE_HEAD_SECONDS, SINGLE_HEAD_POWER = 1.0 * REPORT_SCALE, 1.85
"""The one-head optimum of theory.exact (one head serving all d = sum r_i coordinates): ~1 s at
d = 4 ((2, 2): finite_L_gain 3.7 s against the fixed point's 2.8 s), 108 s at d = 50 ((16, 17, 17),
L = 100: 114.7 s against 7.1 s): d^1.85 between them (two points: an interpolation, stated as such)."""


def _dims(tasks) -> tuple[int, int, int]:
    tasks = tuple(int(r) for r in tasks)
    if not tasks or any(r < 1 for r in tasks):
        raise ValueError(f"tasks must be positive block sizes, got {tasks!r}")
    d, m = sum(tasks), len(tasks)
    return d, m, d + m


def _priced(coef: dict, features: dict) -> float:
    return float(sum(coef[k] * v for k, v in features.items()))


def step_features(tasks, heads: int, L: int, batch: int, runs: int = 1, streams: Optional[int] = None) -> dict:
    """The features of one program step of ``runs`` full-model runs of one shape on ``streams``
    distinct prompt streams (default: one per run)."""
    _, _, D = _dims(tasks)
    S = runs if streams is None else int(streams)
    if runs < 1 or not 1 <= S <= runs:
        raise ValueError(f"need runs >= 1 and 1 <= streams <= runs, got runs={runs}, streams={streams}")
    B, H = int(batch), int(heads)
    return {"step": 1.0, "run": float(runs), "context": float(S) * B * L * D, "logits": float(runs) * B * L * H,
            "flops": float(runs) * B * L * D * H}


def step_seconds(tasks, heads: int, L: int, batch: int, *, dtype: str = "float64", runs: int = 1,
                 streams: Optional[int] = None) -> float:
    """CPU seconds of one gradient step of ``runs`` full-model runs trained as one program
    (``numerics.train.train_many``; runs = 1: ``train``), ``streams`` distinct prompt streams among
    them (default: every run its own)."""
    return _priced(STEP[dtype], step_features(tasks, heads, L, batch, runs, streams))


def train_seconds(tasks, heads: int, L: int, batch: int, steps: int, *, dtype: str = "float64", runs: int = 1,
                  streams: Optional[int] = None, records: int = 0) -> float:
    """CPU seconds of ``steps`` steps of such a program, plus ``records`` trajectory readouts per
    run (a readout is about one step's fixed part)."""
    per = step_seconds(tasks, heads, L, batch, dtype=dtype, runs=runs, streams=streams)
    return float(steps) * per + float(records) * runs * STEP[dtype]["run"]


def many_seconds(tasks, heads: int, L: int, batch: int, steps: int, streams: Sequence[int], *,
                 dtype: str = "float64", records: int = 0) -> float:
    """CPU seconds of ``numerics.train.train_many`` on runs of one shape, ``streams[s]`` runs on
    prompt stream s, all ``steps`` steps: programs formed as train_many forms them on a CPU (the
    runs of one stream together; streams of as many runs merged only while the program's contexts
    stay within MERGE_CONTEXT_ELEMENTS numbers), each priced by :func:`step_seconds`.  A
    program of one run is train() itself."""
    _, _, D = _dims(tasks)
    per_stream = int(batch) * int(L) * D
    budget = max(1, MERGE_CONTEXT_ELEMENTS // per_stream)
    by_count: dict = {}
    for k in streams:
        if int(k) > 0:
            by_count.setdefault(int(k), []).append(int(k))
    total = 0.0
    for counts in by_count.values():
        for lo in range(0, len(counts), budget):
            part = counts[lo:lo + budget]
            total += train_seconds(tasks, heads, L, batch, steps, dtype=dtype, runs=sum(part), streams=len(part),
                                   records=records)
    return total


def forward_features(tasks, heads: int, L: int, n: int, models: int = 1) -> dict:
    _, _, D = _dims(tasks)
    return {"chunk": math.ceil(n / 4096) * float(models), "context": float(n) * L * D,
            "logits": float(models) * n * L * heads, "flops": float(models) * n * L * D * heads}


def forward_seconds(tasks, heads: int, L: int, n: int, *, models: int = 1) -> float:
    """CPU seconds of the held-out loss of ``models`` full models on the same ``n`` fresh prompts
    (``numerics.evaluate.held_out_losses``; models = 1: ``held_out_loss``), float64."""
    return _priced(FORWARD, forward_features(tasks, heads, L, n, models))


def reduced_step_features(tasks, heads: int, L: int, batch: int, estimator: str = "prompts") -> dict:
    _, m, D = _dims(tasks)
    mix = float(batch) * L * heads * m
    if estimator == "marginal":
        return {"step": 1.0, "draws": float(batch) * L * m, "mix": mix}
    if estimator == "prompts":
        return {"step": 1.0, "context": float(batch) * L * D, "scores": float(batch) * L * m, "mix": mix}
    raise ValueError(f"estimator must be 'prompts' or 'marginal', got {estimator!r}")


def reduced_step_seconds(tasks, heads: int, L: int, batch: int, *, estimator: str = "prompts") -> float:
    """CPU seconds of one step of ``numerics.train.train_reduced`` (float64)."""
    return _priced(REDUCED_STEP[estimator], reduced_step_features(tasks, heads, L, batch, estimator))


def marginal_features(tasks, heads: int, L: int, n: int, points: int = 1) -> dict:
    _, m, _ = _dims(tasks)
    return {"call": float(points), "draws": float(n) * L * m, "mix": float(points) * n * L * heads * m}


def marginal_seconds(tasks, heads: int, L: int, n: int, *, points: int = 1) -> float:
    """CPU seconds of ``numerics.exact_reduced.evaluate`` of ``points`` points of H heads on the same
    ``n`` Rao-Blackwellised prompts (the gradient, ``loss_and_gradient``, about twice that)."""
    return _priced(MARGINAL, marginal_features(tasks, heads, L, n, points))


def fit_seconds(tasks, heads: int, L: int, n_fit: int, *, starts: int = 1) -> float:
    """CPU seconds of ``numerics.exact_reduced.minimise_family`` over H heads from ``starts`` starts
    on ``n_fit`` fit prompts: FIT_EVALUATIONS evaluations of the objective per start."""
    _, m, _ = _dims(tasks)
    per = FIT["evaluation"] + FIT["mix"] * float(n_fit) * L * heads * m
    return float(starts) * FIT_EVALUATIONS * per


def theory_seconds(kind: str, calls: int = 1, tasks: Optional[Sequence[int]] = None) -> float:
    """CPU seconds of ``calls`` calls of theory's ``kind`` (:data:`THEORY_SECONDS`); for the
    quadrature (exact_fixed_point, finite_L_gain) at the block sizes ``tasks`` (default: one
    distinct block of size 2)."""
    if kind not in THEORY_SECONDS:
        raise KeyError(f"no measured cost for theory call {kind!r}; known: {', '.join(THEORY_SECONDS)}")
    per = THEORY_SECONDS[kind]
    if kind in ("exact_fixed_point", "finite_L_gain"):
        blocks = tuple(int(r) for r in (tasks if tasks is not None else (2, 2)))
        per *= len(set(blocks))
        if kind == "finite_L_gain":
            per += SINGLE_HEAD_SECONDS * (sum(blocks) / 4.0) ** SINGLE_HEAD_POWER
    return float(calls) * per


def total(parts: Iterable[float]) -> float:
    """The sum of a plan's priced parts (a claim's estimate)."""
    return float(sum(parts))
