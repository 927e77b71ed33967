"""Runs from starts outside the paper's "suitable initialisation" (the initialisation
boundaries, ``claims.initialisation`` and ``claims.allocation_race``, issues 14 and 34), and the
one measurement of where a trained run ends (:func:`end_states`, used by these runs and by the
atlas points of ``numerics.experiments.atlas``).

Where a random start lands is a distribution over its seeds, not one outcome: every start is
trained for several seeds at once (``numerics.train.train_many``: one tensor program per shape),
each seed's end state classified by the one classifier (``numerics.readout.end_class``: allocated /
superposition on k of m tasks / off D / mixed / not converged / diverged), and the classes
counted (:func:`outcome_mix`, with each class's binomial interval and loss ratios).  The seeds of
one start share their prompt stream (common random numbers: the randomness of interest is the
initialisation, and runs that draw the same prompts share one draw per step, 2-5x cheaper on a
CPU than runs with their own streams; docs/initialisation.md holds the check that independent
streams give the same class mix).

Each function returns plain dicts, one per run, keyed by its full configuration
(:func:`cached`: a run asked twice in a report is trained once; a batch trains only the runs
not cached yet) and trained with one torch thread (:func:`one_thread`).  The cached dicts are
shared: callers must not mutate them.
"""
from __future__ import annotations

import copy
import math
from functools import lru_cache
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from numerics.config import ProblemConfig
from numerics.evaluate import held_out_prompt_losses
from numerics.experiments import _CACHE, cached, identity, one_thread
from numerics.experiments.converged import converged_for, stage_tolerance
from numerics.model import MultiHeadAttention, TrainingDiverged, factor_balance
from numerics.readout import RACE_DECIDED_SHARE, allocation, end_class, zero_sum_ratio
from numerics.statistics import binomial_interval, descent_left, mean_se
from numerics.train import TrainConfig, train_many, train_reduced_many
from theory.initialisation import (residual_split, unbalanced_metric_factors, warmup_norm_bound,
                                   warmup_quartic_constant)
from theory.three_phases import phase_times

__all__ = ["OFF_D_RELATIVE", "WINDOW_MOST", "off_D_test", "descent_window", "end_states", "train_starts",
           "random_starts", "unbalanced_starts", "unbalanced_reduced", "race_cells", "large_init_starts",
           "large_init_reduced", "single_task_starts", "single_task_study", "references", "outcome_mix"]

OFF_D_RELATIVE = 0.5
"""A run ends off D when its movable off-D part (theory.initialisation.residual_split) exceeds
what its start can carry off D through the warm-up (:func:`off_D_test`) AND is at least half of
||(W, U)||: boundary-initialisation's random starts ended either at 0.0-0.1 or at 0.8-1.0 of
||(W, U)||, so the class does not hinge on the 1/2; a decomposable start has no movable part and
SGD's noise puts ~1e-2 there.

The carry bound: within the warm-up the weights obey u(t) = |theta(t)|^2 <= u0 / (1 - x),
x = 8 c4 u0 t (theory.initialisation.warmup_norm_bound), and every merged weight is of degree 2
in the factors, so an off-D part the start carries can grow by at most the factor 1 / (1 - x)
while x <= 1/2: bound = movable(0) / (1 - min(x(t_end), 1/2)).  A movable part above it was built
by the flow after the warm-up (it left D), not carried over from the start.  (theory's absolute
bound on ||(W, U)||, max(1, 1/s) u / 2, is far from tight for random factors -- 12.5 against a
measured movable part of 3.0 from PyTorch's default start at (2, 2), L = 32 -- so it cannot
classify.)"""

WINDOW_MOST = 11
"""The descent fit of a run (numerics.statistics.descent_left) takes the records of its last
quarter as paired snapshots, at most this many (evenly thinned): a run of 41 records has 11 there,
and the fit's rate se falls like jitter / (span sqrt(k)), so a run of 201 records gains little
from its 51 (each snapshot costs one held-out evaluation)."""


# ---------------------------------------------------------------------------------------
# the end state of a run: convergence, off D, the class
# ---------------------------------------------------------------------------------------

def off_D_test(cfg: ProblemConfig, norm0_sq: float, split0: dict, split1: dict, t_end: float) -> dict:
    """Whether a run's movable off-D part at t_end was built by the flow (:data:`OFF_D_RELATIVE`):
    theory's warm-up law for its start and run length (``c4``, ``exponent`` = 8 c4 |theta0|^2
    t_end, ``t_half`` (the time the exponent reaches 1/2), ``growth``, ``bound`` = movable(0) x
    growth, ``merged_norm_bound``) and ``off_D``."""
    c4 = warmup_quartic_constant(cfg.tasks, cfg.heads, cfg.L, cfg.sigma, cfg.logit_scale)
    t_half = 1.0 / (16.0 * c4 * norm0_sq) if norm0_sq > 0 else math.inf
    wb = warmup_norm_bound(norm0_sq, min(t_end, t_half), cfg.tasks, cfg.heads, cfg.L, cfg.sigma, cfg.logit_scale)
    growth = 1.0 / (1.0 - min(wb["exponent"], 0.5))
    bound = split0["movable"] * growth
    return {"c4": c4, "exponent": 8.0 * c4 * norm0_sq * t_end, "t_half": t_half, "growth": growth, "bound": bound,
            "merged_norm_bound": wb["merged"],
            "off_D": bool(split1["movable"] > bound and split1["movable_relative"] >= OFF_D_RELATIVE)}


def descent_window(record_steps: Sequence[int], most: int = WINDOW_MOST) -> set:
    """The record steps of a single fixed-step run's last quarter (its descent fit's snapshots),
    thinned evenly to at most ``most``, the last record always kept."""
    steps = np.asarray(sorted(record_steps))
    window = steps[steps >= 0.75 * steps[-1]]
    if window.size > most:
        window = window[np.unique(np.round(np.linspace(0, window.size - 1, most)).astype(int))]
    return set(int(x) for x in window)


def _split(model: MultiHeadAttention) -> dict:
    W, U = (x.detach().cpu().double().numpy() for x in model.merged_weights())
    return residual_split(W, U, model.cfg.tasks, model.cfg.basis_numpy())


def _norm_sq(model: MultiHeadAttention) -> float:
    return float(sum((p.detach().double() ** 2).sum() for p in model.parameters()))


def _eval_key(cfg: ProblemConfig) -> tuple:
    return (cfg.tasks, cfg.L, cfg.sigma, cfg.basis, cfg.basis_seed, cfg.dtype, cfg.device)


def end_states(runs: list[dict], n_eval: int) -> list[dict]:
    """The end state of each trained run of ``runs`` ({"cfg", "tcfg", "result" (a TrainResult or
    the exception that ended it), "norm0_sq", "split0", "snapshots" [(t, model)] of its descent
    window, "eval_seed"}): its held-out loss at the final weights on ``n_eval`` prompts of the
    held-out stream of ``eval_seed`` (``loss``, ``se``, ``n``), the descent fit on the window's
    snapshots on the same prompts (``descent_fit``, ``descent_left``; numerics.statistics.
    descent_left, horizon the window's span: a single fixed-step stage has no polish and is read
    at its end, so the test asks whether the last quarter again would move its loss beyond its
    comparison's tolerance), ``convergence_tolerance`` = Z_CONVERGED sqrt(se^2 + jitter^2) (the
    held-out se and the final iterate's fluctuation: numerics.experiments.converged.
    stage_tolerance), ``in_warmup`` (|theta_end|^2 < 2 |theta0|^2 while the warm-up law's exponent
    at t_end is <= 1/2: the warm-up bound's factor 2),
    ``converged`` (not in warm-up and converged_for at that tolerance), the residual split at the
    start and the end, the warm-up law and ``off_D`` (:func:`off_D_test`), the readout (``omega``,
    ``mu``, ``allocation``, ``zero_sum``) and the ``class`` (numerics.readout.end_class(...).
    to_dict()).  Runs of one problem and eval seed are evaluated on prompts drawn once for all of
    their snapshots (each run's numbers are those of its own evaluation)."""
    out: list = [None] * len(runs)
    groups: dict = {}
    for i, r in enumerate(runs):
        if isinstance(r["result"], BaseException):
            out[i] = _diverged_state(r)
        else:
            groups.setdefault((_eval_key(r["cfg"]), r["eval_seed"]), []).append(i)
    for (_, seed), idx in groups.items():
        models = [m for i in idx for _, m in runs[i]["snapshots"]]
        losses = held_out_prompt_losses(models, n_eval, seed)
        at = 0
        for i in idx:
            k = len(runs[i]["snapshots"])
            out[i] = _end_state(runs[i], losses[at:at + k])
            at += k
    return out


def _diverged_state(r: dict) -> dict:
    exc = r["result"]
    if not isinstance(exc, TrainingDiverged):
        raise exc
    nan = math.nan
    cls = end_class(None, off_D=False, converged=False, diverged=True, reason=str(exc)).to_dict()
    cls["tasks"] = r["cfg"].m
    return {"init_seed": r["cfg"].init_seed, "data_seed": r["tcfg"].seed, "init_scale": r["cfg"].init_scale,
            "diverged": str(exc), "class": cls, "converged": False, "in_warmup": False, "off_D": False,
            "loss": nan, "se": nan, "n": 0, "descent_left": math.inf, "descent_fit": None,
            "convergence_tolerance": nan, "norm0_sq": r["norm0_sq"], "residual_start": r["split0"],
            "residual_end": None, "omega": None, "mu": None, "allocation": None, "zero_sum": None,
            "winners": None, "share": None, "race_decided": False, "mass_allocated": False,
            "t": [], "loss_curve": [], "phases": None}


def _end_state(r: dict, losses: np.ndarray) -> dict:
    cfg, tcfg, res = r["cfg"], r["tcfg"], r["result"]
    final = res.final_model
    last = losses[-1]
    mean, se = mean_se(last)
    t = [x for x, _ in r["snapshots"]]
    fit = descent_left(t, losses, horizon=float(t[-1] - t[0])) if len(t) >= 3 else None
    split1 = _split(final)
    norm1_sq = _norm_sq(final)
    warm = off_D_test(cfg, r["norm0_sq"], r["split0"], split1, tcfg.time)
    # still in the warm-up: |theta|^2 has not doubled while theory's warm-up law still holds at t_end
    # (exponent 8 c4 |theta0|^2 t_end <= 1/2, where the law caps the growth at 2x); a larger start has
    # no warm-up to be in (its norm need not double), and the descent fit decides alone
    in_warmup = bool(norm1_sq < 2.0 * r["norm0_sq"] and warm["exponent"] <= 0.5)
    tol = stage_tolerance(se, fit.jitter) if fit is not None else math.nan
    converged = bool(not in_warmup and fit is not None and converged_for({"descent_left": fit.left}, tol))
    reason = ("in warm-up at t_end (|theta|^2 not doubled)" if in_warmup else
              "fewer than 3 snapshots in the last quarter" if fit is None else
              f"could still lose {fit.left:.3g} (tolerance {tol:.3g} / 4)" if not converged else "")
    a = allocation(res.omega, res.mu)
    cls = end_class(a, off_D=warm["off_D"], converged=converged, reason=reason)
    curve_t, curve = [x.t for x in res.trajectory], [x.loss for x in res.trajectory]
    return {"init_seed": cfg.init_seed, "data_seed": tcfg.seed, "init_scale": cfg.init_scale,
            "omega": np.round(res.omega, 4).tolist(), "mu": np.round(res.mu, 4).tolist(),
            "allocation": a.to_dict(), "winners": list(a.winners), "share": list(a.mass_share),
            "race_decided": a.race_decided, "mass_allocated": a.mass_allocated,
            "zero_sum": list(zero_sum_ratio(res.mu)),
            "residual_start": r["split0"], "residual_end": split1, "norm0_sq": r["norm0_sq"], "norm_end_sq": norm1_sq,
            "warmup": {k: v for k, v in warm.items() if k != "off_D"}, "off_D": warm["off_D"], "in_warmup": in_warmup,
            "loss": mean, "se": se, "n": int(last.size), "descent_fit": fit.to_dict() if fit is not None else None,
            "descent_left": fit.left if fit is not None else math.inf, "convergence_tolerance": tol,
            "converged": converged, "class": cls.to_dict(), "t": curve_t, "loss_curve": curve,
            "phases": phase_times(curve_t, curve).to_dict() if len(curve_t) >= 5 else None}


# ---------------------------------------------------------------------------------------
# many runs trained together, measured, cached per run
# ---------------------------------------------------------------------------------------

def _key(kind: str, cfg: ProblemConfig, tcfg: TrainConfig, **more) -> str:
    return identity(kind, problem=cfg.to_dict(), train=tcfg, **more)


def train_starts(kind: str, cfgs: Sequence[ProblemConfig], tcfgs: Sequence[TrainConfig], n_eval: int, *,
                 on_start: Optional[Callable] = None, on_record: Optional[Callable] = None,
                 on_end: Optional[Callable] = None, eval_seeds: Optional[Sequence[int]] = None) -> list[dict]:
    """Train the runs (cfgs[i], tcfgs[i]) from their configs' starts together
    (numerics.train.train_many), each measured by :func:`end_states` (held-out stream of its data
    seed, or of ``eval_seeds[i]``: runs that share a prompt stream but must be evaluated on
    independent held-out prompts), cached per run under ``kind``: only the runs not cached yet are trained.  Hooks per run
    (optional): ``on_start(model) -> dict`` before training, ``on_record(extra, step, t, model,
    loss)`` at each record (``extra``: that dict, to add to), ``on_end(extra, model)`` after; the
    extra dict is merged into the run's end state."""
    evals = [t.seed for t in tcfgs] if eval_seeds is None else [int(x) for x in eval_seeds]
    if len(evals) != len(cfgs):
        raise ValueError(f"train_starts: {len(evals)} eval seeds for {len(cfgs)} runs")
    keys = [_key(kind, c, t, n_eval=int(n_eval), **({} if eval_seeds is None else {"eval_seed": e}))
            for c, t, e in zip(cfgs, tcfgs, evals)]
    todo = [i for i, k in enumerate(keys) if k not in _CACHE]     # the cache only read here: filled by cached()
    if todo:
        states = _train_measured([cfgs[i] for i in todo], [tcfgs[i] for i in todo], n_eval, on_start, on_record,
                                 on_end, [evals[i] for i in todo])
        for i, state in zip(todo, states):
            cached(keys[i], lambda state=state: state)
    return [cached(k, _missing) for k in keys]


def _missing():
    raise RuntimeError("a run of the batch was not trained (numerics.experiments.starts.train_starts)")


@one_thread
def _train_measured(cfgs, tcfgs, n_eval, on_start, on_record, on_end, evals) -> list[dict]:
    models = [MultiHeadAttention(c) for c in cfgs]
    extras = [on_start(m) if on_start else {} for m in models]
    runs = [{"cfg": c, "tcfg": t, "norm0_sq": _norm_sq(m), "split0": _split(m), "snapshots": [],
             "window": descent_window(t.record_steps()), "eval_seed": e} for c, t, m, e in zip(cfgs, tcfgs, models, evals)]

    def hook(i):
        run, model = runs[i], models[i]

        def record(step, t, m, loss):
            m = copy.deepcopy(m) if m is model else m     # train() (a run alone) hands the live model
            if on_record:
                on_record(extras[i], step, t, m, loss)
            if step in run["window"]:
                run["snapshots"].append((t, m))
        return record

    results = train_many(list(cfgs), list(tcfgs), start=models, on_record=[hook(i) for i in range(len(cfgs))])
    for run, res in zip(runs, results):
        run["result"] = res
    states = end_states(runs, n_eval)
    for state, res, extra in zip(states, results, extras):
        if on_end and not isinstance(res, BaseException):
            on_end(extra, res.final_model)
        state.update(extra)
    return states


# ---------------------------------------------------------------------------------------
# the reference points of the loss ratios
# ---------------------------------------------------------------------------------------

BEST_SEARCH = {"random_starts": 1, "fit_elements": 2 ** 17, "eval_prompts": 2048, "seed": 0}
"""The best decomposable point's search (numerics.experiments.probes.best_decomposable) at a
size paid once per configuration (per sweep worker for the atlas): one random start besides
theory.optimality's structured starts, fit on 2^17 prompt tokens x heads, evaluated on 2048
prompts (se ~1%)."""


@lru_cache(maxsize=128)
def references(tasks: tuple, heads: int, L: int, sigma: float, device: str = "cpu", best: bool = True) -> dict:
    """The two points a trained run's loss is read against: theory.exact's allocated fixed point
    at (tasks, L, sigma) (the sum over tasks of the one-head fixed points, surplus heads idle;
    None for H < m: there is none) and the best decomposable point of the same H with signs free
    (numerics.experiments.probes.best_decomposable at :data:`BEST_SEARCH`: loss, se, family,
    (omega, mu); None unless ``best``)."""
    from theory.exact import exact_fixed_point
    alloc = float(exact_fixed_point(tuple(tasks), L, sigma)["loss"]) if heads >= len(tasks) else None
    b = None
    if best:
        from numerics.experiments.probes import best_decomposable
        x = best_decomposable(tuple(tasks), heads, L, sigma, BEST_SEARCH["seed"], device,
                              BEST_SEARCH["random_starts"], BEST_SEARCH["fit_elements"], BEST_SEARCH["eval_prompts"])
        b = {"loss": x.loss, "se": x.se, "n_eval": x.n_eval, "family": x.family,
             "omega": [list(r) for r in x.omega], "mu": [list(r) for r in x.mu]}
    return {"allocated_loss": alloc, "best_decomposable": b}


def outcome_mix(states: Sequence[dict], z: float, refs: Optional[dict] = None) -> dict:
    """Where the seeds of one start ended: per class label (numerics.readout.EndClass.label, in
    the order of OUTCOME_CLASSES, superpositions by k) ``count`` of ``n`` seeds, the ``share``,
    its binomial ``interval`` (numerics.statistics.binomial_interval at ``z``), the seeds, and the
    held-out loss over the allocated fixed point and over the best decomposable point of
    ``refs`` (:func:`references`), mean +- se over the class's seeds (``seeds``: their init seeds,
    or their data seeds where the init seeds do not tell them apart); ``classes`` (names: any k)
    the same counts by class name."""
    from numerics.readout import OUTCOME_CLASSES
    n = len(states)
    alloc = (refs or {}).get("allocated_loss")
    best = ((refs or {}).get("best_decomposable") or {}).get("loss")

    def entry(members):
        over_a = mean_se([s["loss"] / alloc for s in members], non_finite="drop") if alloc else (None, None)
        over_b = mean_se([s["loss"] / best for s in members], non_finite="drop") if best else (None, None)
        lo, hi = binomial_interval(len(members), n, z)
        return {"count": len(members), "n": n, "share": len(members) / n, "interval": [lo, hi],
                "seeds": [s.get(seed_key) for s in members],
                "over_allocated": over_a[0], "over_allocated_se": over_a[1],
                "over_best": over_b[0], "over_best_se": over_b[1]}

    # a seed is named by its init seed where those tell the seeds apart, else by its prompt stream
    # (a deterministic start's seeds are its streams)
    inits = [s.get("init_seed") for s in states]
    seed_key = "init_seed" if None not in inits and len(set(inits)) == n else "data_seed"
    order = lambda c: (OUTCOME_CLASSES.index(c["name"]), c.get("superposed", 0))  # noqa: E731
    labels: dict = {}
    names: dict = {}
    for s in sorted(states, key=lambda s: order(s["class"])):
        labels.setdefault(s["class"]["label"], []).append(s)
        names.setdefault(s["class"]["name"], []).append(s)
    return {"n": n, "labels": {k: entry(v) for k, v in labels.items()},
            "classes": {k: entry(v) for k, v in names.items()},
            "allocated_loss": alloc, "best_decomposable_loss": best}


# ---------------------------------------------------------------------------------------
# boundary-initialisation
# ---------------------------------------------------------------------------------------

def random_starts(cfgs: Sequence[ProblemConfig], tcfgs: Sequence[TrainConfig], n_eval: int) -> list[dict]:
    """The full factored model from each cfg's start (init uniform_full), trained together: the
    end state (:func:`end_states`), the residual split at every record (``trajectory``), Q's y and
    x columns' moves (``dQ_y``, ``dQ_x``) and each head's OV singular values."""
    def on_start(model):
        d = model.cfg.d
        return {"_Q0": model.Q.detach().clone(), "trajectory": []} if d else {"trajectory": []}

    def on_record(extra, step, t, m, loss):
        extra["trajectory"].append({"t": t, "loss": loss, **_split(m)})

    def on_end(extra, model):
        d, Q0 = model.cfg.d, extra.pop("_Q0")
        with torch.no_grad():
            U = model.merged_weights()[1].detach().cpu().double().numpy()
            extra["dQ_y"] = float((model.Q[:, :, d:] - Q0[:, :, d:]).norm())
            extra["dQ_x"] = float((model.Q[:, :, :d] - Q0[:, :, :d]).norm())
        sv = [np.linalg.svd(U[h], compute_uv=False) for h in range(model.cfg.heads)]
        top = max(float(s.max()) for s in sv) if sv else 0.0
        extra["ov_singular_values"] = [np.round(s, 4).tolist() for s in sv]
        extra["ov_above_5pct"] = [int(np.sum(s > 0.05 * top)) for s in sv]

    return train_starts("random_start", cfgs, tcfgs, n_eval, on_start=on_start, on_record=on_record, on_end=on_end)


def unbalanced_starts(cfgs: Sequence[ProblemConfig], tcfgs: Sequence[TrainConfig], n_eval: int) -> list[dict]:
    """The full model from each unbalanced start, trained together: the end state, the start's
    (omega0, mu0) and conserved balances (numerics.model.factor_balance), and the outcome per task
    (its winning head where that head carries >= RACE_DECIDED_SHARE of sum_h |mu omega|, else -1:
    shared, a superposition)."""
    def on_start(model):
        ro = model.semi_singular_values()
        c_om, c_mu = factor_balance(model)
        return {"omega0": ro.omega.tolist(), "mu0": ro.mu.tolist(), "c_omega": np.round(c_om, 4).tolist(),
                "c_mu": np.round(c_mu, 4).tolist()}

    states = train_starts("unbalanced_full", cfgs, tcfgs, n_eval, on_start=on_start)
    for s in states:   # a diverged run has no winners: no outcome for any task
        if "outcome" not in s:
            s["outcome"] = _outcome(s) if s["winners"] is not None else [None] * s["class"]["tasks"]
    return states


def _outcome(r: dict) -> list:
    return [int(w) if sh >= RACE_DECIDED_SHARE else -1 for w, sh in zip(r["winners"], r["share"])]


def unbalanced_reduced(cfgs: Sequence[ProblemConfig], tcfgs: Sequence[TrainConfig]) -> list[dict]:
    """Per unbalanced start (cfgs[i], tcfgs[i]): the reduced flow from its (omega0, mu0), on the
    full run's prompts, with the unbalanced metric (the conserved balances read off the start)
    and with the balanced one -- per curve the readout, the outcome per task
    (:func:`unbalanced_starts`), the phase times and the loss curve.  Every flow not cached yet
    is trained in one program (numerics.train.train_reduced_many: a start's two flows share its
    prompt stream, drawn once a step)."""
    keys = [_key("unbalanced_reduced", c, t) for c, t in zip(cfgs, tcfgs)]
    todo = [i for i, k in enumerate(keys) if k not in _CACHE]     # the cache only read here: filled by cached()
    if todo:
        for i, out in zip(todo, _unbalanced_reduced([cfgs[i] for i in todo], [tcfgs[i] for i in todo])):
            cached(keys[i], lambda out=out: out)
    return [cached(k, _missing) for k in keys]


def _unbalanced_metric(cfg: ProblemConfig):
    """The start's (omega0, mu0) and the unbalanced metric of its conserved balances."""
    model = MultiHeadAttention(cfg)
    ro = model.semi_singular_values()
    c_om, c_mu = factor_balance(model)

    def metric(o, m_):
        f = unbalanced_metric_factors(o.cpu().double().numpy(), m_.cpu().double().numpy(), c_om, c_mu, cfg.tasks,
                                      cfg.logit_scale)
        return tuple(torch.as_tensor(x, dtype=o.dtype, device=o.device) for x in f)
    return (ro.omega, ro.mu), metric


@one_thread
def _unbalanced_reduced(cfgs, tcfgs) -> list[dict]:
    starts, metrics = zip(*(_unbalanced_metric(c) for c in cfgs))
    # per start: the unbalanced metric's flow, then the balanced one (metric None: theory's);
    # train_reduced_many copies ``start`` (the caller's arrays are never updated in place)
    res = train_reduced_many([c for c in cfgs for _ in (0, 1)], [t for t in tcfgs for _ in (0, 1)],
                             start=[st for st in starts for _ in (0, 1)],
                             metric=[f for met in metrics for f in (met, None)])
    for r in res:
        if isinstance(r, BaseException):
            raise r
    return [{"init_seed": c.init_seed, "data_seed": t.seed, "reduced_unbalanced": _readout(res[2 * i]),
             "reduced_balanced": _readout(res[2 * i + 1])} for i, (c, t) in enumerate(zip(cfgs, tcfgs))]


def _readout(r) -> dict:
    """Winners (argmax mu omega), mass shares, the outcome per task, the rounded (omega, mu), the
    loss curve and phase times of a TrainResult (a reduced flow's)."""
    a = allocation(r.omega, r.mu)
    t, loss = [x.t for x in r.trajectory], [x.loss for x in r.trajectory]
    out = {"winners": list(a.winners), "share": list(a.mass_share), "race_decided": a.race_decided,
           "mass_allocated": a.mass_allocated, "omega": np.round(r.omega, 4).tolist(),
           "mu": np.round(r.mu, 4).tolist(), "phases": phase_times(t, loss).to_dict(), "t": t, "loss_curve": loss}
    out["outcome"] = _outcome(out)
    return out


def single_task_starts(cfgs: Sequence[ProblemConfig], tcfgs: Sequence[TrainConfig], n_eval: int,
                       eval_seeds: Optional[Sequence[int]] = None) -> list[dict]:
    """One task, several heads, from PyTorch's default start, trained together: the end state
    (held-out prompts of ``eval_seeds``, :func:`train_starts`) and the zero-sum pair ratio
    |mu_a + mu_b| / (|mu_a| + |mu_b|) of the largest positive and the most negative OV value
    (nan: one sign only; the many-head form is the end state's ``zero_sum``,
    numerics.readout.zero_sum_ratio)."""
    states = train_starts("single_task", cfgs, tcfgs, n_eval, eval_seeds=eval_seeds)
    for s in states:
        if "pair_ratio" not in s:
            mu = np.asarray(s["mu"], float)[:, 0] if s["mu"] is not None else np.array([])
            pos, neg = mu[mu > 0], mu[mu < 0]
            s["pair_ratio"] = (float(abs(pos.max() + neg.min()) / (abs(pos.max()) + abs(neg.min())))
                               if pos.size and neg.size else math.nan)
    return states


def single_task_study(sp, seed: int, device: str = "cpu", z: float = 4.0) -> tuple[dict, dict]:
    """One task of r from PyTorch's default start (uniform_full, s0 = 1, logit scale sqrt(r + 1))
    with each head count of ``sp.heads`` (``sp``: L, r, heads, seeds, lr, time, batch, n_eval,
    records), every H's seeds on one prompt stream (common random numbers), each seed on its own
    held-out prompts, all from identities (case_seed(seed, "single task", H, ...)): per H the
    mean held-out loss over seeds and its se (numerics.saddle.seed_mean_se), the zero-sum pair
    ratios, the counts of seeds whose OV values form a zero-sum pair or group (ratio below
    numerics.readout.ZERO_SUM_SHARE), the class mix (:func:`outcome_mix` at ``z``); and the
    references (numerics.saddle.single_task_references).  (summary {H: ...}, references)."""
    from numerics.readout import ZERO_SUM_SHARE
    from numerics.saddle import seed_mean_se, single_task_references
    from numerics.seeds import case_seed
    ref = single_task_references(sp.L, sp.r, sp.n_eval)
    refs = {"allocated_loss": ref["one_head"], "best_decomposable": {"loss": ref["best_two_head"]}}
    cfgs = [ProblemConfig(tasks=(sp.r,), heads=H, L=sp.L, init="uniform_full", init_scale=1.0,
                          init_seed=case_seed(seed, "single task", H, "init", s), logit_scale=math.sqrt(sp.r + 1),
                          device=device) for H in sp.heads for s in sp.seeds]
    tcfgs = [TrainConfig(lr=sp.lr, time=sp.time, batch=sp.batch, records=sp.records,
                         seed=case_seed(seed, "single task", H, "prompts")) for H in sp.heads for _ in sp.seeds]
    states = single_task_starts(cfgs, tcfgs, sp.n_eval, eval_seeds=[case_seed(seed, "single task", H, "held-out", s)
                                                                    for H in sp.heads for s in sp.seeds])
    summary, n = {}, len(sp.seeds)
    for j, H in enumerate(sp.heads):
        rs = states[j * n:(j + 1) * n]
        m, se = seed_mean_se([r["loss"] for r in rs], [r["se"] for r in rs])
        summary[H] = {"loss": m, "se": se, "pair_ratio": [r["pair_ratio"] for r in rs],
                      "zero_sum_pairs": sum(r["pair_ratio"] < ZERO_SUM_SHARE for r in rs),
                      "zero_sum_groups": sum(bool(r["zero_sum"]) and r["zero_sum"][0] <= ZERO_SUM_SHARE for r in rs),
                      "mix": outcome_mix(rs, z, refs), "classes": [r["class"]["label"] for r in rs]}
    return summary, ref


# ---------------------------------------------------------------------------------------
# boundary-allocation-race
# ---------------------------------------------------------------------------------------

def race_cells(cfgs: Sequence[ProblemConfig], tcfgs: Sequence[TrainConfig], n_eval: int) -> list[dict]:
    """The full model from each given (omega0, mu0), trained together: the end state (winners,
    mass shares, whether the race has ended: numerics.readout's race_decided, the class)."""
    return train_starts("race_cell", cfgs, tcfgs, n_eval)


def large_init_starts(cfgs: Sequence[ProblemConfig], tcfgs: Sequence[TrainConfig], n_eval: int) -> list[dict]:
    """The full model from the default decomposable start at each cfg's init_scale, trained
    together: the end state with its phase times."""
    return train_starts("large_init", cfgs, tcfgs, n_eval)


def large_init_reduced(cfgs: Sequence[ProblemConfig], tcfgs: Sequence[TrainConfig]) -> list[dict]:
    """The reduced flow from the default decomposable start on each full run's prompts, every
    flow not cached yet in one program (numerics.train.train_reduced_many: the scales of one
    stream draw it once a step)."""
    keys = [_key("large_init_reduced", c, t) for c, t in zip(cfgs, tcfgs)]
    todo = [i for i, k in enumerate(keys) if k not in _CACHE]
    if todo:
        res = one_thread(train_reduced_many)([cfgs[i] for i in todo], [tcfgs[i] for i in todo])
        for i, r in zip(todo, res):
            if isinstance(r, BaseException):
                raise r
            cached(keys[i], lambda r=r: _readout(r))
    return [cached(k, _missing) for k in keys]


# ---------------------------------------------------------------------------------------
# what a plan of starts costs, before it runs
# ---------------------------------------------------------------------------------------

FALLBACK_STEP_SECONDS = {"step": 1.0e-3, "context": 3.9e-8, "flops": 4.7e-9, "reduced": 0.57}
"""Until numerics.cost (the step-cost model, issue 28) is on this branch: CPU seconds of one step
of a program = step + context x (streams B L D) + flops x (runs B L D H), one torch thread, and a
reduced-flow step ``reduced`` x a one-run step.  Fitted to this branch's quick boundary-
initialisation (102 CPU s under load 9-14; cProfile shares: 24 random runs on one stream 30 ms
per step, 6 single-stream unbalanced runs 5.8 ms per run-step, 12 reduced flows 3.3 ms per step;
(2, 2), H = 2, L = 32, B = 512): sampling the prompts is the larger part of a one-run step.
Checked against boundary-allocation-race at quick: about 50 s priced, 59 CPU s measured.
numerics.cost replaces it where it is importable."""


def _step_cost(tasks, heads: int, L: int, batch: int, runs: int, streams: int) -> float:
    D = sum(tasks) + len(tasks)
    try:
        from numerics import cost
    except ImportError:
        c = FALLBACK_STEP_SECONDS
        return c["step"] + c["context"] * streams * batch * L * D + c["flops"] * runs * batch * L * D * heads
    return cost.step_seconds(tasks, heads, L, batch, runs=runs, streams=streams)


def _reduced_cost(tasks, heads: int, L: int, batch: int, runs: int = 1, streams: int = 1) -> float:
    """One step of a reduced-flow program (numerics.train.train_reduced_many) of ``runs`` flows
    on ``streams`` prompt streams: each stream's prompts drawn once (the context part of
    numerics.cost's reduced step, per stream), the rest of the step per run."""
    D = sum(tasks) + len(tasks)
    try:
        from numerics import cost
    except ImportError:
        one = FALLBACK_STEP_SECONDS["reduced"] * _step_cost(tasks, heads, L, batch, 1, 1)
        drawn = FALLBACK_STEP_SECONDS["context"] * batch * L * D
    else:
        one = cost.reduced_step_seconds(tasks, heads, L, batch)
        drawn = cost.REDUCED_STEP["prompts"]["context"] * batch * L * D
    return runs * max(one - drawn, 0.0) + streams * min(drawn, one)


def _forward_cost(tasks, heads: int, L: int, n: int, models: int) -> float:
    D = sum(tasks) + len(tasks)
    try:
        from numerics import cost
    except ImportError:
        c = FALLBACK_STEP_SECONDS     # the prompts drawn once; no backward pass: about a third of the products
        return math.ceil(n / 4096) * models * c["step"] + c["context"] * n * L * D \
            + c["flops"] * models * n * L * D * heads / 3
    return cost.forward_seconds(tasks, heads, L, n, models=models)


def plan_seconds(tasks, heads: int, L: int, batch: int, steps: int, runs_per_stream: Sequence[int], n_eval: int,
                 snapshots: int, reduced: int = 0, reduced_streams: Optional[int] = None) -> float:
    """CPU seconds of one plan of starts of one shape before it runs: train_many's programs
    (``runs_per_stream[s]`` runs on prompt stream s, programs formed as train_many forms them:
    numerics.cost.many_seconds), each run's end state (:func:`end_states`: ``snapshots`` held-out
    evaluations on ``n_eval`` prompts) and ``reduced`` reduced flows of the same steps in one
    program on ``reduced_streams`` prompt streams (default: one each).  Through numerics.cost
    where it is importable, else :data:`FALLBACK_STEP_SECONDS`."""
    runs = int(sum(runs_per_stream))
    try:
        from numerics import cost
        train = cost.many_seconds(tasks, heads, L, batch, steps, list(runs_per_stream))
    except ImportError:
        train = sum(steps * _step_cost(tasks, heads, L, batch, k, 1) for k in runs_per_stream if k > 0)
    evaluate = _forward_cost(tasks, heads, L, n_eval, runs * snapshots)
    flows = steps * _reduced_cost(tasks, heads, L, batch, reduced, reduced if reduced_streams is None else reduced_streams)
    return train + evaluate + (flows if reduced else 0.0)
