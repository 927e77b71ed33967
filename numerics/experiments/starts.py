"""Runs from starts outside the paper's "suitable initialisation" (the initialisation
boundaries, ``claims.boundary_initialisation`` and ``claims.boundary_allocation_race``), and the
one measurement of where a trained run ends (:func:`end_states`, used by these runs and by the
atlas points of ``numerics.experiments.atlas``).

Where a random start lands is a distribution over its seeds, not one outcome: every start is
trained for several seeds at once (``numerics.train.train_many``: one tensor program per shape),
each seed's end state classified by the one classifier (``numerics.evaluate.end_class``: allocated /
superposition on k of m tasks / off D / mixed / not converged / diverged), and the classes
counted (:func:`outcome_mix`, with each class's binomial interval and loss ratios).  The seeds of
one start share their prompt stream (common random numbers: the randomness of interest is the
initialisation, and runs that draw the same prompts share one draw per step, 2-5x cheaper on a
CPU than runs with their own streams; docs/initialisation.md holds the check that independent
streams give the same class mix).

The runs are two need kinds of ``numerics.engine``: ``start_runs`` (the starts of one prompt
stream, a tuple of end states, each with the run's fingerprint so that the claims can check that
the runs they count as independent are: numerics.engine.check_independent) and ``start_flows``
(the reduced flows on the same prompts).  Needs of one shape and batch size, from any claim, are
trained as one program (their ``run_many``), with one torch thread (:func:`one_thread`).  The
values are kept by the engine for the whole process: callers must not mutate them.
"""
from __future__ import annotations

import copy
import math
from collections import namedtuple
from dataclasses import fields, replace
from typing import Optional, Sequence

import numpy as np
import torch

from numerics import engine
from numerics.train import shape_key
from numerics.config import ProblemConfig
from numerics.engine import kind, need
from numerics.evaluate import (RACE_DECIDED_SHARE, ZERO_SUM_SHARE, allocation, binomial_interval, descent_left,
                               end_class, held_out_prompt_losses, mean_se, zero_sum_ratio)
from numerics.experiments import one_thread
from numerics.experiments.converged import converged_for, last_quarter, stage_tolerance
from numerics.model import MultiHeadAttention, TrainingDiverged, factor_balance
from numerics.engine import case_seed
from numerics.train import TrainConfig, train_many, train_reduced_many
from theory.initialisation import (authors_logit_scale, race_starts, random_start_scales, residual_split,
                                   unbalanced_metric_factors, warmup_norm_bound, warmup_quartic_constant)
from theory.three_phases import phase_times

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
"""The descent fit of a run (numerics.evaluate.descent_left) takes the records of its last
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


def merged_residual_split(model: MultiHeadAttention) -> dict:
    W, U = (x.detach().cpu().double().numpy() for x in model.merged_weights())
    return residual_split(W, U, model.cfg.tasks, model.cfg.basis_numpy())


def factor_norm_sq(model: MultiHeadAttention) -> float:
    return float(sum((p.detach().double() ** 2).sum() for p in model.parameters()))


def end_states(runs: list[dict]) -> list[dict]:
    """The end state of each trained run of ``runs`` ({"cfg", "tcfg", "result" (a TrainResult or
    the exception that ended it), "norm0_sq", "split0", "snapshots" [(t, model)] of its descent
    window, "n_eval", "eval_seed"}): its held-out loss at the final weights on ``n_eval`` prompts of the
    held-out stream of ``eval_seed`` (``loss``, ``se``, ``n``), the descent fit on the window's
    snapshots on the same prompts (``descent_fit``, ``descent_left``; numerics.evaluate.
    descent_left, horizon the window's span: a single fixed-step stage has no polish and is read
    at its end, so the test asks whether the last quarter again would move its loss beyond its
    comparison's tolerance), ``convergence_tolerance`` = Z_CONVERGED sqrt(se^2 + jitter^2) (the
    held-out se and the final iterate's fluctuation: numerics.experiments.converged.
    stage_tolerance), ``in_warmup`` (|theta_end|^2 < 2 |theta0|^2 while the warm-up law's exponent
    at t_end is <= 1/2: the warm-up bound's factor 2),
    ``converged`` (not in warm-up and converged_for at that tolerance), the residual split at the
    start and the end, the warm-up law and ``off_D`` (:func:`off_D_test`), the readout (``omega``,
    ``mu``, ``allocation``, ``zero_sum``) and the ``class`` (numerics.evaluate.end_class(...).
    to_dict()).  Runs of one problem and eval seed are evaluated on prompts drawn once for all of
    their snapshots (each run's numbers are those of its own evaluation)."""
    out: list = [None] * len(runs)
    groups: dict = {}
    for i, r in enumerate(runs):
        if isinstance(r["result"], BaseException):
            out[i] = _diverged_state(r)
        else:
            c = r["cfg"]       # runs whose held-out prompts are the same draw
            groups.setdefault((c.tasks, c.L, c.sigma, c.basis, c.basis_seed, c.dtype, c.device, r["eval_seed"],
                               r["n_eval"]), []).append(i)
    for (*_, seed, n_eval), idx in groups.items():
        models = [m for i in idx for _, m in runs[i]["snapshots"]]
        losses = held_out_prompt_losses(models, n_eval, seed, stack_heads=STACK_HEADS)
        at = 0
        for i in idx:
            k = len(runs[i]["snapshots"])
            out[i] = _end_state(runs[i], losses[at:at + k])
            at += k
    return out


STACK_HEADS = 16
"""Heads of the snapshot models evaluated as one stacked program (16 // H models;
numerics.evaluate.held_out_prompt_losses' stack_heads): they read a
chunk of 4096 prompts in one bmm, its logits within the cache (one thread, 352 race snapshots at
H = 2: 0.28 CPU-s 8 at a time, 0.35 16, 0.58 64, 0.8 one at a time; 11 at H = 4 on 8192 prompts:
0.04 CPU-s 4 at a time, 0.085 all 11, 0.093 one at a time)."""


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
    split1 = merged_residual_split(final)
    norm1_sq = factor_norm_sq(final)
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


def outcome_mix(states: Sequence[dict], z: float, refs: Optional[dict] = None) -> dict:
    """Where the seeds of one start ended: per class label (numerics.evaluate.EndClass.label, in
    the order of OUTCOME_CLASSES, superpositions by k) ``count`` of ``n`` seeds, the ``share``,
    its binomial ``interval`` (numerics.evaluate.binomial_interval at ``z``), the seeds, and the
    held-out loss over the allocated fixed point and over the best decomposable point of
    ``refs`` (:func:`references`), mean +- se over the class's seeds (``seeds``: their init seeds,
    or their data seeds where the init seeds do not tell them apart); ``classes`` (names: any k)
    the same counts by class name."""
    from numerics.evaluate import OUTCOME_CLASSES
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


# ---------------------------------------------------------------------------------------
# what each kind of start measures besides its end state
# ---------------------------------------------------------------------------------------

Measure = namedtuple("Measure", "start record end finish")
"""Hooks of one kind of start (each optional): ``start(model) -> dict`` before training,
``record(extra, step, t, model, loss)`` at each record (``extra``: that dict, to add to),
``end(extra, final model)`` after, all merged into the end state; ``finish(state)`` on every end
state, a diverged run's too."""


def _random_start(model) -> dict:
    return {"_Q0": model.Q.detach().clone(), "trajectory": []} if model.cfg.d else {"trajectory": []}


def _random_record(extra, step, t, m, loss) -> None:
    extra["trajectory"].append({"t": t, "loss": loss, **merged_residual_split(m)})


def _random_end(extra, model) -> None:
    """Q's y and x columns' moves (``dQ_y``, ``dQ_x``) and each head's OV singular values."""
    d, Q0 = model.cfg.d, extra.pop("_Q0")
    with torch.no_grad():
        U = model.merged_weights()[1].detach().cpu().double().numpy()
        extra["dQ_y"] = float((model.Q[:, :, d:] - Q0[:, :, d:]).norm())
        extra["dQ_x"] = float((model.Q[:, :, :d] - Q0[:, :, :d]).norm())
    sv = [np.linalg.svd(U[h], compute_uv=False) for h in range(model.cfg.heads)]
    top = max(float(s.max()) for s in sv) if sv else 0.0
    extra["ov_singular_values"] = [np.round(s, 4).tolist() for s in sv]
    extra["ov_above_5pct"] = [int(np.sum(s > 0.05 * top)) for s in sv]


def _unbalanced_start(model) -> dict:
    """The start's (omega0, mu0) and conserved balances (numerics.model.factor_balance)."""
    ro = model.semi_singular_values()
    c_om, c_mu = factor_balance(model)
    return {"omega0": ro.omega.tolist(), "mu0": ro.mu.tolist(), "c_omega": np.round(c_om, 4).tolist(),
            "c_mu": np.round(c_mu, 4).tolist()}


def _unbalanced_finish(state) -> None:
    """The outcome per task: its winning head where that head carries >= RACE_DECIDED_SHARE of
    sum_h |mu omega|, else -1 (shared, a superposition); a diverged run none for any task."""
    state["outcome"] = _outcome(state) if state["winners"] is not None else [None] * state["class"]["tasks"]


def _single_finish(state) -> None:
    """The zero-sum pair ratio |mu_a + mu_b| / (|mu_a| + |mu_b|) of the largest positive and the
    most negative OV value of the one task (nan: one sign only; the many-head form is the end
    state's ``zero_sum``, numerics.evaluate.zero_sum_ratio)."""
    mu = np.asarray(state["mu"], float)[:, 0] if state["mu"] is not None else np.array([])
    pos, neg = mu[mu > 0], mu[mu < 0]
    state["pair_ratio"] = (float(abs(pos.max() + neg.min()) / (abs(pos.max()) + abs(neg.min())))
                           if pos.size and neg.size else math.nan)


MEASURES = {
    "random": Measure(_random_start, _random_record, _random_end, None),   # boundary-initialisation, uniform_full
    "unbalanced": Measure(_unbalanced_start, None, None, _unbalanced_finish),
    "single": Measure(None, None, None, _single_finish),     # one task, PyTorch's default start
    "race": Measure(None, None, None, None),       # boundary-allocation-race: given (omega0, mu0)
    "large": Measure(None, None, None, None),      # the default decomposable start at a growing scale
}
"""What each kind of start measures besides :func:`end_states` (:class:`Measure`)."""


def _outcome(r: dict) -> list:
    return [int(w) if sh >= RACE_DECIDED_SHARE else -1 for w, sh in zip(r["winners"], r["share"])]


# ---------------------------------------------------------------------------------------
# the need kinds: starts of one prompt stream, trained together with every start of their shape
# ---------------------------------------------------------------------------------------

def _seed(seed: int, name) -> int:
    """A seed inside a need: None, the need's own seed; an int, that seed; a tuple of name parts,
    case_seed(need's seed, *name)."""
    if name is None:
        return int(seed)
    return int(name) if isinstance(name, int) else case_seed(int(seed), *name)


def _starts(cfgs) -> tuple:
    """``cfgs`` as (their first, per run the fields in which it differs from it as (name, value)
    pairs): a need's parameters that say what varies (``reports.build --plan`` prints them)."""
    first = cfgs[0]
    differ = lambda c: tuple((f.name, getattr(c, f.name)) for f in fields(c)  # noqa: E731
                             if getattr(c, f.name) != getattr(first, f.name))
    return first, tuple(differ(c) for c in cfgs)


def _runs_of(p: dict, seed: int) -> list[dict]:
    """The runs of one need's parameters ``p`` at its ``seed``: each start (``cfg`` with the fields of
    ``starts[i]``; its init seed ``inits[i]``, where given) on the prompt stream ``prompts`` (tcfg's
    seed), evaluated on the held-out stream ``held_out[i]`` (default: the prompt stream's)."""
    tcfg = replace(p["tcfg"], seed=_seed(seed, p["prompts"]))
    n = len(p["starts"])
    inits, held = p["inits"] or (None,) * n, p["held_out"] or (None,) * n
    cfgs = [p["cfg"].replace(**dict(d)) for d in p["starts"]]
    return [{"cfg": c if init is None else c.replace(init_seed=_seed(seed, init)), "tcfg": tcfg, "what": p["what"],
             "n_eval": int(p["n_eval"]), "eval_seed": tcfg.seed if h is None else _seed(seed, h)}
            for c, init, h in zip(cfgs, inits, held)]


@one_thread
def _train_measured(runs: list[dict]) -> list[dict]:
    """Train ``runs`` (:func:`_runs_of`) together (numerics.train.train_many: one program per
    shape, the runs of one prompt stream drawing it once a step), each measured by
    :func:`end_states` and its kind's :data:`MEASURES`, with its ``fingerprint`` (the
    TrainResult's: digests of its first batch and its initial weights; None for a diverged run).
    An end state reads a run's loss curve and its final readout, never a record's (omega, mu):
    the records before the last hold the loss alone (numerics.train.train_many's read_records)."""
    measures = [MEASURES[r["what"]] for r in runs]
    models = [MultiHeadAttention(r["cfg"]) for r in runs]
    extras = [me.start(m) if me.start else {} for me, m in zip(measures, models)]
    for r, m in zip(runs, models):
        r.update(norm0_sq=factor_norm_sq(m), split0=merged_residual_split(m), snapshots=[],
                 window=last_quarter(r["tcfg"].record_steps(), WINDOW_MOST))

    def hook(i):
        run, model, record_ = runs[i], models[i], measures[i].record

        def record(step, t, m, loss):
            m = copy.deepcopy(m) if m is model else m     # train() (a run alone) hands the live model
            if record_:
                record_(extras[i], step, t, m, loss)
            if step in run["window"]:
                run["snapshots"].append((t, m))
        return record

    results = train_many([r["cfg"] for r in runs], [r["tcfg"] for r in runs], start=models,
                         on_record=[hook(i) for i in range(len(runs))], read_records=False)
    for run, res in zip(runs, results):
        run["result"] = res
    states = end_states(runs)
    for state, res, extra, me in zip(states, results, extras, measures):
        if me.end and not isinstance(res, BaseException):
            me.end(extra, res.final_model)
        state.update(extra)
        state["fingerprint"] = None if isinstance(res, BaseException) else dict(res.fingerprint)
        if me.finish:
            me.finish(state)
    return states


def _start_runs_many(params: list, seeds: list) -> list:
    """Every need's runs in one call of :func:`_train_measured`; per need the tuple of its runs'
    end states."""
    runs = [_runs_of(p, s) for p, s in zip(params, seeds)]
    states = iter(_train_measured([r for rs in runs for r in rs]))
    return [tuple(next(states) for _ in rs) for rs in runs]


START_RUN_STEP = 1.0e-4
"""CPU seconds of a start run's share of a program step beyond its logits, flops and context
(numerics.engine's per-run term, 4.4e-4 float32, is fit on programs of few runs that read every
record out): the quick report's start programs, whose records hold the loss alone, took 0.8-1.3e-4
(128 race runs x 600 steps in 14.3 CPU-s, 96 single-task runs x 1200 in 14.9, 32 at H = 4 in 8.5,
end states apart)."""


def _start_runs_cost(what, cfg, starts, tcfg, n_eval, held_out=None, **_) -> float:
    """The program of the need's runs on one prompt stream (numerics.engine.many_seconds, its per-run
    term START_RUN_STEP; merged with other needs' programs it costs less: the steps' fixed part is
    shared) and each run's end-state evaluations (its descent window's snapshots on ``n_eval``
    held-out prompts, drawn once per held-out stream)."""
    c, runs, steps, snaps = cfg, len(starts), round(tcfg.time / tcfg.lr), min(WINDOW_MOST, tcfg.records // 4 + 1)
    train = (engine.many_seconds(c.tasks, c.heads, c.L, tcfg.batch, steps, [runs], dtype=c.dtype)
             - runs * steps * (engine.STEP[c.dtype]["run"] - START_RUN_STEP))
    streams = runs if held_out else 1
    evaluate = streams * engine.forward_seconds(c.tasks, c.heads, c.L, n_eval, models=runs * snaps // streams)
    return train + evaluate


@kind("start_runs", cost=_start_runs_cost, run_many=_start_runs_many,
      batch_key=lambda cfg, tcfg, **_: (shape_key(cfg), tcfg.batch))
def start_runs(what, cfg, starts, tcfg, n_eval, prompts, inits, held_out, seed) -> tuple:
    """The full model from each start (``cfg`` with ``starts[i]``'s fields) on one prompt stream,
    trained together: the tuple of their end states (:func:`end_states`, with what :data:`MEASURES` [what] adds and each
    run's fingerprint).  Seeds (:func:`_seed`, under the need's seed): the prompt stream
    ``prompts``, each start's init seed ``inits[i]`` (None: the cfg's own), each run's held-out
    stream ``held_out[i]`` (None: the prompt stream's).  Needs of one shape and batch size, from
    any claim, are trained as one program (``run_many``)."""
    return _start_runs_many([dict(what=what, cfg=cfg, starts=starts, tcfg=tcfg, n_eval=n_eval, prompts=prompts,
                                  inits=inits, held_out=held_out)], [seed])[0]


def start_runs_need(what: str, cfgs, tcfg: TrainConfig, n_eval: int, stream: tuple, *, prompts=None, inits=None,
                    held_out=None):
    """The ``start_runs`` need of the starts ``cfgs`` of kind ``what`` (:data:`MEASURES`) trained by
    ``tcfg`` (its seed is the need's: ``prompts`` under ``stream``) on one prompt stream."""
    cfg, starts = _starts(cfgs)
    return need("start_runs", what=what, cfg=cfg, starts=starts, tcfg=replace(tcfg, seed=0), n_eval=int(n_eval),
                prompts=prompts, inits=None if inits is None else tuple(inits),
                held_out=None if held_out is None else tuple(held_out), stream=tuple(stream))


def _flows_many(params: list, seeds: list) -> list:
    """Every need's reduced flows in one numerics.train.train_reduced_many program per shape: per
    start (its init seed set as in :func:`_runs_of`) on the need's prompt stream, for
    ``what`` = "unbalanced" the flow from its (omega0, mu0) with the unbalanced metric of its
    conserved balances and with the balanced one (theory's): {"reduced_unbalanced",
    "reduced_balanced"}; for "large" the flow from cfg's decomposable start; each a
    :func:`_readout`.  Per need the tuple of its starts' readouts."""
    starts, cfgs, tcfgs, begin, metrics = [], [], [], [], []
    for i, (p, s) in enumerate(zip(params, seeds)):
        for r in _runs_of(dict(p, n_eval=0, held_out=None), s):
            pair = p["what"] == "unbalanced"
            start, metric = _unbalanced_metric(r["cfg"]) if pair else (None, None)
            starts.append((i, pair))
            cfgs += [r["cfg"]] * (1 + pair)
            tcfgs += [r["tcfg"]] * (1 + pair)
            begin += [start] * (1 + pair)
            metrics += [metric, None] if pair else [None]
    res = one_thread(train_reduced_many)(cfgs, tcfgs, start=begin, metric=metrics)
    for r in res:
        if isinstance(r, BaseException):
            raise r
    flows, out = iter(res), [[] for _ in params]
    for i, pair in starts:
        out[i].append({"reduced_unbalanced": _readout(next(flows)), "reduced_balanced": _readout(next(flows))}
                      if pair else _readout(next(flows)))
    return [tuple(o) for o in out]


def _flows_cost(what, cfg, starts, tcfg, **_) -> float:
    """The program's steps, one reduced step each (numerics.engine): its stream's prompts drawn once
    and its flows stacked; the calibration resolves no part of a step that grows with the flows
    (its mix coefficient is 0), and the quick report's 48 large-init flows of 8 streams took 17 CPU
    ms a step, not 48 flows' fixed parts."""
    return round(tcfg.time / tcfg.lr) * engine.reduced_step_seconds(cfg.tasks, cfg.heads, cfg.L, tcfg.batch)


@kind("start_flows", cost=_flows_cost, run_many=_flows_many,
      batch_key=lambda cfg, tcfg, **_: (shape_key(cfg), tcfg.batch))
def start_flows(what, cfg, starts, tcfg, prompts, inits, seed) -> tuple:
    """The reduced flows of the starts (``cfg`` with ``starts[i]``'s fields) on the prompt stream of
    a ``start_runs`` need with the same stream and ``prompts`` (the same prompts as those full runs),
    :func:`_flows_many`."""
    return _flows_many([dict(what=what, cfg=cfg, starts=starts, tcfg=tcfg, prompts=prompts, inits=inits)], [seed])[0]


def start_flows_need(what: str, cfgs, tcfg: TrainConfig, stream: tuple, *, prompts=None, inits=None):
    """The ``start_flows`` need ("unbalanced" or "large") beside ``start_runs_need`` of the same
    arguments: the reduced flows on those runs' prompts."""
    cfg, starts = _starts(cfgs)
    return need("start_flows", what=what, cfg=cfg, starts=starts, tcfg=replace(tcfg, seed=0), prompts=prompts,
                inits=None if inits is None else tuple(inits), stream=tuple(stream))


@kind("single_task_references", cost=lambda L, r, n_eval: (
    engine.fit_seconds((r,), 2, L, 4096, starts=3) + engine.marginal_seconds((r,), 2, L, n_eval, points=1) + 1.0))
def single_task_references(L: int, r: int, n_eval: int, seed: int) -> dict:
    """The reference points of one task (r,) at context length L: theory.exact's one-head
    optimum (= the allocated point, surplus heads idle), theory.optimality's linear attention,
    and the best decomposable two-head point, signs free (numerics.exact_reduced.minimise_family
    from the linear-attention point and two sign patterns, fit on 4096 prompts, its loss and se
    measured on ``n_eval`` held-out prompts), as claims/optimality.py searches it (its fit and
    evaluation seeds are its own, 11 and 12, not the need's)."""
    from numerics.exact_reduced import measure, minimise_family
    from theory import exact as th_exact
    from theory import optimality as th_opt

    tasks = (int(r),)
    starts = [th_opt.linear_attention_point(tasks, 2, eps=0.02)[0] + 0.0, np.array([[0.5], [0.05]]),
              np.array([[0.3], [-0.3]])]
    fm = minimise_family(tasks, int(L), 0.0, np.ones((2, 1), bool), np.ones((2, 1), bool), starts, seed=11,
                         n_fit=4096, family="2 heads, signs free")
    measure([fm], int(n_eval), seed=12)
    return {"one_head": float(th_exact.single_head_optimum(tasks, int(L))["loss"]),
            "linear_attention": float(th_opt.linear_attention_loss(tasks, int(L))),
            "best_two_head": float(fm.loss), "best_two_head_se": float(fm.se),
            "best_two_head_point": {"omega": fm.omega.ravel().tolist(), "mu": fm.mu.ravel().tolist()}}


# ---------------------------------------------------------------------------------------
# the initialisation boundaries' runs: which starts, on which prompt streams (their plans)
# ---------------------------------------------------------------------------------------

def train_config(p, seed: int = 0, time_=None, records=None) -> TrainConfig:
    """The TrainConfig of a profile ``p``'s runs (lr, time, batch, records; in a need its seed is the need's)."""
    return TrainConfig(lr=p.lr, time=time_ or p.time, batch=p.batch, seed=seed, records=records or p.records)


START_DTYPE = "float32"
"""The arithmetic of every start's full runs and reduced flows.  What they are read for is
decided far above float32's rounding (unit round-off 6e-8): end classes by shares and ratios
cut at 0.1-0.5 (numerics.evaluate), the off-D part against OFF_D_RELATIVE = 0.5 of ||(W, U)||
where SGD's noise alone puts 1e-2, convergence against the held-out se and the iterate's
jitter (1e-3-1e-2 relative), phase times against tolerances of percents; the one exact
comparison, Q's y columns never moving, stays exact in any precision (their gradient is a
product with an exact zero).  The prompts are the same numbers in both types (numerics.config
draws float32 Gaussians), so a run differs from its float64 twin by rounding only; a step
costs 1.5x less (128 race runs, one thread: 34 against 51 CPU ms)."""


def _problem(p, device: str) -> ProblemConfig:
    return ProblemConfig(tasks=tuple(p.tasks), heads=p.heads, L=p.L, sigma=p.sigma, device=device, dtype=START_DTYPE)


def random_starts_need(p, device: str):
    """boundary-initialisation's random starts: each scale of ``p.scales`` (theory.initialisation.random_start_scales)
    x each init seed k (("init", k) under the need's seed ("random starts",): seed k at every scale), at the authors'
    logit scale, all on one prompt stream ("prompts": common random numbers, the randomness of interest is the
    initialisation)."""
    scales, _ = random_start_scales(p.scales, p.small_factor, p.tasks, p.heads, p.L, p.time, p.sigma)
    cfgs = [_problem(p, device).replace(init="uniform_full", init_scale=s0, logit_scale=authors_logit_scale(p.tasks))
            for s0 in scales for _ in p.init_seeds]
    return start_runs_need("random", cfgs, train_config(p), p.n_eval, ("random starts",), prompts=("prompts",),
                           inits=[("init", k) for _ in scales for k in p.init_seeds])


def unbalanced_needs(p, device: str) -> dict:
    """{(k, j): (full runs, reduced flows)} of boundary-initialisation's unbalanced starts k (``p.unbalanced_seeds``:
    need seed ("unbalanced start", k), its init seed "init" under it) on each stream j (``p.unbalanced_data_seeds``):
    a prompt stream per pair, ("prompts", j) under the start's seed (one stream per j shared by the starts missed one
    of six quick phase tolerances by 7 %); the full run and its two reduced flows name the same prompts."""
    cfg = _problem(p, device).replace(init="unbalanced_decomposable", init_scale=p.unbalanced_scale)
    tc = train_config(p, records=p.unbalanced_records)
    out = {}
    for k in p.unbalanced_seeds:
        for j in p.unbalanced_data_seeds:
            named = dict(stream=("unbalanced start", k), prompts=("prompts", j), inits=(("init",),))
            out[(k, j)] = (start_runs_need("unbalanced", [cfg], tc, p.n_eval, **named),
                           start_flows_need("unbalanced", [cfg], tc, **named))
    return out


def single_task_needs(sp, device: str) -> list:
    """Per head count H of ``sp.heads`` the runs of one task of ``sp.r`` from PyTorch's default start (uniform_full,
    s0 = 1, logit scale sqrt(r + 1)), seed s's start from ("init", s) under the need's seed ("single task", H), all on
    one prompt stream ("prompts": common random numbers), each seed evaluated on its own held-out prompts
    (("held-out", s)); then the references (:func:`single_task_references`)."""
    out = []
    for H in sp.heads:
        cfg = ProblemConfig(tasks=(sp.r,), heads=H, L=sp.L, init="uniform_full", init_scale=1.0,
                            logit_scale=math.sqrt(sp.r + 1), device=device, dtype=START_DTYPE)
        seeds = sp.seeds_of(H)
        out.append(start_runs_need("single", [cfg] * len(seeds), train_config(sp), sp.n_eval, ("single task", H),
                                   prompts=("prompts",), inits=[("init", s) for s in seeds],
                                   held_out=[("held-out", s) for s in seeds]))
    return out + [need("single_task_references", L=sp.L, r=sp.r, n_eval=sp.n_eval)]


def single_task_summary(states, ref: dict, z: float) -> dict:
    """The seeds of one head count: the mean held-out loss over seeds and its se (:func:`seed_mean_se`), the
    zero-sum pair ratios, the counts of seeds whose OV values form a zero-sum pair or group (ratio below
    numerics.evaluate.ZERO_SUM_SHARE), the class mix (:func:`outcome_mix` at ``z``, against the one-head optimum and
    the best decomposable two-head point)."""
    refs = {"allocated_loss": ref["one_head"], "best_decomposable": {"loss": ref["best_two_head"]}}
    m, se = seed_mean_se([r["loss"] for r in states], [r["se"] for r in states])
    return {"loss": m, "se": se, "pair_ratio": [r["pair_ratio"] for r in states],
            "zero_sum_pairs": sum(r["pair_ratio"] < ZERO_SUM_SHARE for r in states),
            "zero_sum_groups": sum(bool(r["zero_sum"]) and r["zero_sum"][0] <= ZERO_SUM_SHARE for r in states),
            "mix": outcome_mix(states, z, refs), "classes": [r["class"]["label"] for r in states]}


def seed_mean_se(losses, loss_ses) -> tuple[float, float]:
    """The mean held-out loss over seeds and its se: the seeds' spread and each seed's own
    held-out se (independent held-out prompts per seed), sqrt(s^2 / n + mean(se_i^2) / n);
    the one seed's se from one seed."""
    losses = np.asarray(losses, float)
    if losses.size < 2:
        return float(losses.mean()), float(np.asarray(loss_ses, float).ravel()[0])
    mean, se = mean_se(losses)     # the seeds' spread, s / sqrt(n)
    return mean, math.sqrt(se ** 2 + float(np.mean(np.square(loss_ses))) / losses.size)


def race_cell_needs(p, device: str) -> tuple[list, list]:
    """boundary-allocation-race's cells: per prompt stream k of ``p.data_seeds`` (("race", "prompts", k), shared by
    every cell: common random numbers) the full model from every cell's start (theory.initialisation.race_starts:
    omega ratio rho_w, mu ratio rho_m), trained together; per cell theory's ODE rule (a theory value:
    theory.initialisation.ode_winners)."""
    base = _problem(p, device)
    cfgs = [base.replace(init="given", init_omega=tuple(map(tuple, st["omega0"])), init_mu=tuple(map(tuple, st["mu0"])))
            for st in race_starts(p.s0, p.ratios, p.heads, base.m)]
    runs = [start_runs_need("race", cfgs, train_config(p), p.n_eval, ("race", "prompts", k)) for k in p.data_seeds]
    return runs, [need("theory", fn="ode_winners", args=(c.init_omega, c.init_mu, tuple(p.tasks), p.L, p.sigma))
                  for c in cfgs]


def large_init_needs(p, device: str) -> list[tuple]:
    """boundary-allocation-race's large init: per prompt stream k of ``p.large_seeds`` (("large init", "prompts", k),
    shared by every scale; the start is deterministic, so the streams are the seeds) the full models from the default
    decomposable start at each of ``p.large_scales``, trained together, and the reduced flows from the same starts on
    the same prompts (about a tenth of the full models' cost)."""
    base = ProblemConfig(tasks=tuple(p.large_tasks), heads=len(p.large_tasks), L=p.L, sigma=p.sigma, device=device,
                         dtype=START_DTYPE)
    cfgs = [base.replace(init_scale=s0) for s0 in p.large_scales]
    tc = train_config(p, 0, p.large_time, p.large_records)
    return [(start_runs_need("large", cfgs, tc, p.n_eval, ("large init", "prompts", k)),
             start_flows_need("large", cfgs, tc, ("large init", "prompts", k))) for k in p.large_seeds]


BEST_SEARCH = {"random_starts": 1, "fit_elements": 2 ** 17, "eval_prompts": 2048}
"""The best decomposable point's search (numerics.experiments.probes.best_decomposable) at a
size paid once per configuration: one random start besides theory.optimality's structured
starts, fit on 2^17 prompt tokens x heads, evaluated on 2048 prompts (se ~1%)."""


def reference_needs(tasks, heads: int, L: int, sigma: float, device: str, best: bool = True) -> list:
    """The needs of :func:`references`: theory.exact's allocated fixed point (H >= m only) and
    the best decomposable point (``best`` only)."""
    out = [need("theory", fn="exact_fixed_point", args=(tuple(tasks), int(L), float(sigma)))] \
        if heads >= len(tasks) else []
    if best:
        out.append(need("best_decomposable", tasks=tuple(tasks), heads=int(heads), L=int(L), sigma=float(sigma),
                        device=str(device), **BEST_SEARCH))
    return out


def references(results, tasks, heads: int, L: int, sigma: float, device: str, best: bool = True) -> dict:
    """The two points a trained run's loss is read against (:func:`outcome_mix`): theory.exact's
    allocated fixed point at (tasks, L, sigma) (the sum over tasks of the one-head fixed points,
    surplus heads idle; None for H < m: there is none) and the best decomposable point of the same
    H with signs free (loss, se, family, (omega, mu); None unless ``best``)."""
    needs = iter(reference_needs(tasks, heads, L, sigma, device, best))
    alloc = float(results[next(needs)]["loss"]) if heads >= len(tasks) else None
    b = None
    if best:
        x = results[next(needs)]
        b = {"loss": x.loss, "se": x.se, "n_eval": x.n_eval, "family": x.family,
             "omega": [list(r) for r in x.omega], "mu": [list(r) for r in x.mu]}
    return {"allocated_loss": alloc, "best_decomposable": b}
