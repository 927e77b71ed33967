"""Beyond the paper: the allocated point is a saddle of the factored flow at finite L.

Theory (``theory.saddle``, derivations there and in docs/saddle.md): at the allocated fixed
point an off-task OV value mu = o v has slope a = dL/dmu > 0 (theory.exact); the flow
do/dt = -a v, dv/dt = -a o makes o - v grow at rate a, so the opposite-sign branch
mu = -(o - v)^2 / 4 grows at rate **2a**.  Gradient flow conserves O^T O - V V^T, so a balanced
channel never enters that branch; SGD seeds it through the imbalance it builds while a small
balanced off-task value mu0 decays (M = lr mu0 dS / (2 a B), dS the measured per-prompt
gradient variance difference), so the seed scales like (lr/B)^2 and the escape time
T(B) = (1/2a) log(threshold / seed(B)) grows with slope **1/a** in log B (additive noise,
seed ~ lr/B, would give 1/(2a)).  An exactly G-invariant batch gives no imbalance: its
noiseless flow does not leave.

The discrete step (theory.saddle section 1b): at step lr the channel is multiplied by
1 + lr a per step, a at the served point the SGD run actually holds (its finite step and
batch displace it from theory's point), so the rate is the path mean of 2 log(1 + lr a)/lr;
as lr -> 0 both effects vanish and the rate tends to 2a.

``numerics.saddle`` measures (the plan: per configuration four needs, :func:`configuration_needs`);
this module asks theory for every prediction and compares, per configuration, the growth rate at
each step with the discrete map at the held point (:func:`check_step_rate`), its lr -> 0
extrapolation with 2a (:func:`check_growth_rate`) and the invariant batch's flow with 0
(:func:`check_invariant_flow`), and the escape-time slopes pooled over configurations with
theory's 1/a (:func:`check_pooled_slope`); the per-B escape times against T(B) are reported rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from claims.core import (EPS64, ClaimSpec, Comparison, Outcome, Tolerance, compare, comparisons_where, finding,
                         headline_row, noise_term, reported_row, term)
from numerics import saddle as measure
from numerics.config import ProblemConfig
from numerics.engine import need
from numerics.evaluate import extrapolate_to_zero, mean_se
from theory import saddle as th


# ---------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SaddleProfile:
    """One configuration's saddle measurements: (tasks, heads, L), step lr and batch sizes of
    the escape runs, ``seeds`` (the replicates: each names its runs' prompt streams, drawn from
    the report's seed by numerics.saddle), the seeded off-task mu0, the escape threshold
    (share), the growth window (floor_factor, top_fraction), t_max, the invariant check's batch
    size, the probe size of dS, the record spacing, and the steps ``lrs`` of the growth-rate
    runs (at the largest batch; their lr -> 0 extrapolation is compared with 2a)."""
    tasks: tuple
    heads: int
    L: int
    lr: float
    batches: tuple
    seeds: tuple
    mu0: float = 0.05
    threshold: float = 0.1
    floor_factor: float = 10.0
    top_fraction: float = 0.05
    t_max: float = 300.0
    invariant_prompts: int = 512       # at least numerics.saddle.MIN_BASE_PROMPTS base prompts x |G|
    n_var: int = 65536
    record_dt: float = 1.0
    lrs: tuple = ()


@dataclass(frozen=True)
class SaddleClaimProfile:
    name: str
    configurations: tuple      # SaddleProfile per configuration measured (sizes in docs/saddle.md)


PROFILES = {
    "tiny": SaddleClaimProfile("tiny", (SaddleProfile((1, 1), 2, 32, lr=0.2, batches=(32, 128, 512), seeds=(0, 1),
                                                      mu0=0.1, lrs=(0.2, 0.1)),)),
    "quick": SaddleClaimProfile("quick", (
        SaddleProfile((1, 1), 2, 32, lr=0.3, batches=(64, 256, 1024), seeds=(0, 1, 2), lrs=(0.3, 0.15)),
        SaddleProfile((2, 2), 2, 64, lr=0.2, batches=(128, 362, 1024), seeds=(0, 1, 2), lrs=(0.2, 0.1, 0.05)))),
    "paper": SaddleClaimProfile("paper", (
        SaddleProfile((1, 1), 2, 32, lr=0.05, batches=(64, 256, 1024, 4096), seeds=tuple(range(8)), mu0=0.01,
                      t_max=600.0, n_var=65536, lrs=(0.1, 0.05, 0.025)),
        SaddleProfile((2, 2), 2, 64, lr=0.05, batches=(64, 256, 1024, 4096), seeds=tuple(range(8)), mu0=0.01,
                      t_max=600.0, n_var=65536, lrs=(0.1, 0.05, 0.025)),
        SaddleProfile((3, 1, 4), 3, 64, lr=0.05, batches=(256, 1024, 4096), seeds=tuple(range(8)), mu0=0.01,
                      t_max=600.0, n_var=65536, lrs=(0.1, 0.05, 0.025)))),
}


def configuration_needs(p: SaddleProfile) -> dict:
    """The needs of one configuration: its escape runs with their floors, the per-prompt
    gradient variances (the seed input of theory's T(B)), the growth rate at each step of
    ``lrs`` (at the largest batch, its window from that batch's floor: a dependency on the
    escape runs) and the invariant batch's flow over the escape runs' horizon (a dependency too)."""
    cfg = ProblemConfig(tasks=tuple(p.tasks), heads=p.heads, L=p.L)
    batches, seeds = tuple(p.batches), tuple(p.seeds)
    escape = need("saddle_escape_runs", cfg=cfg, lr=p.lr, batches=batches, seeds=seeds, mu0=p.mu0, t_max=p.t_max,
                  stop_share=max(p.threshold, p.top_fraction), record_dt=p.record_dt)
    return {"cfg": cfg, "escape": escape, "variance": need("saddle_variance", cfg=cfg, n=p.n_var),
            "steps": need("saddle_step_sizes", cfg=cfg, lrs=tuple(p.lrs) or (p.lr,), batch=max(batches), seeds=seeds,
                          escape=escape, floor_factor=p.floor_factor, top_fraction=p.top_fraction, t_max=p.t_max,
                          record_dt=p.record_dt),
            "invariant": need("saddle_invariant", cfg=cfg, lr=p.lr, escape=escape, batches=batches, seeds=seeds,
                              threshold=p.threshold, t_max=p.t_max, mu0=p.mu0, prompts=p.invariant_prompts)}


def plan(ctx, results=None) -> list:
    """Every configuration's needs (:func:`configuration_needs`)."""
    return [n for p in ctx.p.configurations for k, n in configuration_needs(p).items() if k != "cfg"]


def measurements(p: SaddleProfile, results) -> dict:
    """One configuration's measurements from the plan's results: the growth rates, the escape
    times against B (numerics.saddle.escape_time_measurement of the escape runs and variances),
    the invariant flow and the SGD runs' |o - v| at escape (the largest batch)."""
    n = configuration_needs(p)
    runs = results[n["escape"]]
    escape = measure.escape_time_measurement(n["cfg"], p.lr, p.batches, p.seeds, p.threshold, runs,
                                             results[n["variance"]])
    inv = results[n["invariant"]]
    return {"growth": results[n["steps"]], "escape": escape, "invariant": inv,
            "sgd_anti": measure.anti_at_escape(runs, max(p.batches), p.seeds),
            "seconds": {"escape_runs": runs.wall, "invariant": inv.wall}}


def escape_prediction(e, heads: int) -> dict:
    """theory.saddle's escape account of the escape measurement ``e`` (its own lr, batches, mu0,
    threshold and measured dS)."""
    cfg = e.config
    return th.escape_prediction(tuple(cfg["tasks"]), heads, cfg["L"], cfg.get("sigma", 0.0), e.lr, e.batches, e.mu0,
                                e.threshold, e.variance["dS"], e.variance["dS_se"])


# ---------------------------------------------------------------------------------------
# the comparisons
# ---------------------------------------------------------------------------------------

def _label(cfg: dict) -> str:
    return f"tasks={tuple(cfg['tasks'])} H={cfg['heads']} L={cfg['L']} sigma={cfg.get('sigma', 0.0):g}"


def _allowance(g) -> float:
    """Half the mean logistic correction |raw - measured|: what the logistic coordinate may miss
    (the serving head's and omega's slower response), from the measurement's own two fits."""
    return 0.5 * abs(g.raw - g.measured)


def discrete_prediction(g) -> tuple[float, tuple]:
    """theory.saddle's discrete-time account of one step size's measurement: per seed the path
    mean of 2 log(1 + lr a)/lr, a at the served points the runs held in the window
    (theory.saddle.discrete_rate_along); returns (mean over seeds, per seed)."""
    cfg = g.config
    per = tuple(th.discrete_rate_along(om, sv, g.lr, tuple(cfg["tasks"]), cfg["L"], cfg.get("sigma", 0.0),
                                       cfg["heads"]) for om, sv in zip(g.path_omega, g.path_served))
    return float(np.mean(per)), per


def check_step_rate(g, config: str) -> Comparison:
    """The growth rate measured at step lr (numerics.saddle.step_size_measurement: the logistic
    coordinate's slope over a window fixed in advance, +- se over seeds) against the discrete
    map's rate at the point the runs held (:func:`discrete_prediction`).

    Tolerance (fixed before comparing): Z_SE x the standard error over seeds of the paired
    difference measured - predicted (the prediction reads each seed's own path) + half the
    logistic correction.  Perturbations through the same comparison: the amplitude's rate (half
    the prediction) and rate 0 (a true minimum)."""
    pred, per = discrete_prediction(g)
    d = np.asarray(g.per_seed) - np.asarray(per)
    se_d = mean_se(d)[1]
    tol = Tolerance((noise_term(se_d, "measured - predicted", f"{d.size} seeds"),
                     term("half the logistic correction", _allowance(g))))
    return compare(f"saddle: growth rate at lr={g.lr:g} vs the discrete map at the held point, {config}", g.measured,
                   pred, tol, wrong=(("rate of the amplitude |o - v| (half)", pred / 2),
                                          ("rate 0 (a true minimum)", 0.0)),
                   config=config, details={"role": "step rate", "se": g.se, "se_difference": se_d, "lr": g.lr,
                                           "batch": g.batch,
                                           "seeds": g.seeds, "per_seed": g.per_seed, "predicted_per_seed": per,
                                           "window": g.window, "e_folds": g.e_folds, "off_task_omega":
                                           g.off_task_omega, "held": _held(g), "mu0": g.mu0})


def _held(g) -> tuple[list, list]:
    """The served (omega, mu) per seeded entry that the runs held in the window: mean over seeds
    and path records (theory's allocated point: theory.saddle.saddle_point)."""
    sp = th.saddle_point(tuple(g.config["tasks"]), g.config["heads"], g.config["L"], g.config.get("sigma", 0.0))
    om = np.mean([np.mean(p, axis=0) for p in g.path_omega], axis=0)
    sv = np.mean([np.mean(p, axis=0) for p in g.path_served], axis=0)
    return [round(float(om[i, i]), 6) for _, i in sp.entries], np.round(sv, 6).tolist()


def check_growth_rate(gs, config: str) -> Comparison:
    """The growth rates measured at several steps (one per lr, same batch and window),
    extrapolated to lr -> 0 (numerics.evaluate.extrapolate_to_zero: the polynomial through
    every point, Richardson), against theory's 2a at the allocated point (theory.exact; the
    prediction under test, unchanged by any run).

    Tolerance: Z_SE x the extrapolation's standard error (propagated from each step's se over
    seeds) + its systematic error (half its change when the largest step is left out: the
    measurements' own) + half the mean logistic correction.  Perturbations through the same
    comparison: rate a (the amplitude's, not |mu|'s) and rate 0 (a true minimum)."""
    sp = th.saddle_point(tuple(gs[0].config["tasks"]), gs[0].config["heads"], gs[0].config["L"],
                         gs[0].config.get("sigma", 0.0))
    ex = extrapolate_to_zero([g.lr for g in gs], [g.measured for g in gs], [g.se for g in gs])
    allowance = float(np.mean([_allowance(g) for g in gs]))
    tol = Tolerance((noise_term(ex["a_se"], "the lr -> 0 extrapolation", f"{len(gs)} steps"),
                     term("its systematic error (half its change without the largest step)", ex["systematic"]),
                     term("half the logistic correction", allowance)))
    return compare(f"saddle: growth rate of off-task |mu| vs 2a, {config}", ex["a"], sp.rate, tol,
                   wrong=(("rate a (amplitude, not |mu|)", sp.rate / 2), ("rate 0 (a true minimum)", 0.0)),
                   config=config, details={"role": "growth rate", "se": ex["a_se"], "systematic": ex["systematic"],
                                           "a": float(sp.a.mean()),
                                           "lrs": [g.lr for g in gs], "rates": [g.measured for g in gs],
                                           "rates_se": [g.se for g in gs], "lower_order": ex["lower_order"],
                                           "batch": gs[0].batch, "seeds": gs[0].seeds, "mu0": gs[0].mu0})


def check_invariant_flow(inv, sgd_anti: float, config: str) -> Comparison:
    """The largest opposite-sign amplitude |o - v| of GD on one exactly G-invariant batch
    (numerics.saddle.invariant_flow_measurement) against 0: the batch gradient lies in D (to
    rounding), so o and v receive the same update.

    Tolerance (claim 1's rounding argument): 64 eps (steps + 1) sqrt(mu0) x A, with A the
    largest amplification of an opposite-sign perturbation along the run, measured by a twin
    run on the same batch (the fixed batch's landscape is not the population's, and GD at a
    finite step can amplify more than e^{a t}).  Perturbation: "it leaves like SGD", the SGD
    runs' amplitude |o - v| at escape (``sgd_anti``), held to the same tolerance.

    The run is GD at the largest step (the requested one halved at most
    numerics.saddle.MAX_STEP_HALVINGS times) whose off-D residual stays within rounding: a step
    past the fixed batch's stability edge leaves D through rounding (a step-size instability,
    not the flow); the steps that did are in details["unstable"].  A run that left D at every
    step tried is not compared (:func:`invariant_outcome`)."""
    A = inv.amplification
    tol = 64 * EPS64 * (inv.steps + 1) * math.sqrt(inv.mu0) * max(A, 1.0)
    why = (f"64 eps (steps+1) sqrt(mu0) A: rounding per step, amplified at most by A = {A:.3g} (twin run); GD at "
           f"lr {inv.lr:g}" + (f" (lr {inv.requested_lr:g} halved until GD stays on D)" if inv.unstable else ""))
    return compare(f"saddle: noiseless flow on a G-invariant batch stays, {config}", inv.max_anti, 0.0, tol, why,
                   wrong=(("it leaves like SGD", sgd_anti),), config=config,
                   details={"role": "invariant flow", "time": inv.time, "min_mu_off": inv.min_mu_off,
                            "amplification": A, "lr": inv.lr, "requested_lr": inv.requested_lr,
                            "max_residual": inv.max_residual, "rounding_residual": measure.rounding_bound(inv.steps),
                            "stable": inv.stable, "unstable": [dict(u) for u in inv.unstable]})


def check_pooled_slope(escapes, slopes_pred, config: str) -> Comparison:
    """The escape-time slopes dT/dlog B of several configurations
    (numerics.saddle.escape_time_measurement), each divided by its own prediction 2/rate
    (theory.saddle.escape_prediction's slope_pred: theory's 1/a, so each ratio has expectation
    1), pooled with weights 1/se^2, against 1 (seed ~ (lr/B)^2).

    Tolerance: Z_SE x the pooled standard error.  Each slope's se is that of the ordinary
    least-squares fit of every run's T on log B (residual variance pooled over B); nothing
    systematic enters it (theory's nonlinear end phase and the record spacing are the same at
    every B).  Perturbations: the additive-noise picture (seed ~ lr/B: ratio 1/2) and rate a
    instead of 2a (ratio 2)."""
    r = np.array([e.slope / sp for e, sp in zip(escapes, slopes_pred)])
    s = np.array([e.slope_se / sp for e, sp in zip(escapes, slopes_pred)])
    w = 1.0 / s ** 2
    ratio, se = float((w * r).sum() / w.sum()), float(1.0 / math.sqrt(w.sum()))
    return compare("saddle: escape time vs batch size (pooled slope / theory's 1/a)", ratio, 1.0,
                   Tolerance((noise_term(se, "the inverse-variance pooled ratio"),)),
                   wrong=(("additive noise: seed ~ lr/B (ratio 1/2)", 0.5), ("rate a instead of 2a (ratio 2)", 2.0)),
                   config=config, details={"role": "pooled slope", "se": se,
                                           "per_config": tuple(zip(r.tolist(), s.tolist()))})


# ---------------------------------------------------------------------------------------
# the claim
# ---------------------------------------------------------------------------------------

NOT_MEASURED = ("GD on the G-invariant batch left D at every step tried, down to lr {lr} (off-D residual {res} "
                "against rounding {rounding}: the fixed batch's step-size instability), so its flow was not measured "
                "at {config}")
"""Why an invariant batch's run is not compared (:func:`invariant_outcome`), a template of its numbers."""


def invariant_outcome(inv, sgd_anti: float, config: str) -> tuple:
    """(comparison or None, headline row, the numbers of :data:`NOT_MEASURED` or None) of the
    invariant batch's run.

    Where GD left D at every step tried (down to numerics.saddle.MAX_STEP_HALVINGS halvings), the
    run is governed by the fixed batch's step-size instability: its off-D residual grew from
    rounding far past it, and its |o - v| is that instability's, which the twin's amplification
    of an o - v kick does not bound; the flow the comparison is about was not measured, and the
    claim says so (undecided) instead of comparing."""
    if inv.stable:
        c = check_invariant_flow(inv, sgd_anti, config)
        return c, headline_row(c, "saddle: noiseless flow on a G-invariant batch stays (max |o - v|)",
                               config=config), None
    note = {"config": config, "lr": inv.lr, "res": inv.max_residual, "rounding": measure.rounding_bound(inv.steps)}
    return None, reported_row("saddle: noiseless flow on a G-invariant batch (not measured: GD left D at every step)",
                              inv.max_anti, config=config), note


def compare_results(ctx, results) -> Outcome:
    """Per configuration the growth rates (extrapolated and at each step), the invariant flow and
    the escape times as reported rows; the escape-time slopes pooled over configurations."""
    comps, rows, escapes, slopes, details = [], [], [], [], {"configurations": [], "not_measured": []}
    for sp in ctx.p.configurations:
        res = measurements(sp, results)
        gs, e, inv = res["growth"], res["escape"], res["invariant"]
        cfg = _label(e.config)
        c = check_growth_rate(gs, cfg)
        comps.append(c)
        rows.append(headline_row(c, "saddle: growth rate of off-task |mu|, lr -> 0, vs 2a", se=c.details["se"],
                                 config=cfg))
        for g in gs:
            c = check_step_rate(g, cfg)
            comps.append(c)
            rows.append(headline_row(c, f"saddle: growth rate at lr={g.lr:g} vs the discrete map at the held point",
                                     se=g.se, config=cfg))
        inv_c, row, note = invariant_outcome(inv, res["sgd_anti"], cfg)
        comps += [inv_c] if inv_c is not None else []
        rows.append(row)
        details["not_measured"] += [note] if note else []
        pred = escape_prediction(e, sp.heads)
        for B, T, Tse, Tp in zip(e.batches, e.T, e.T_se, pred["T_pred"]):
            rows.append(reported_row(f"saddle: escape time at B={B}", T, theory=Tp, se=Tse, config=cfg))
        rows.append(reported_row("saddle: escape-time slope dT/dlog B (theory 1/a)", e.slope, theory=pred["slope_pred"],
                                 se=e.slope_se, config=cfg))
        escapes.append(e)
        slopes.append(pred["slope_pred"])
        details["configurations"].append({"config": e.config, "lr": sp.lr, "lrs": [g.lr for g in gs],
                                          "batches": sp.batches, "seeds": sp.seeds, "escape_T": e.T,
                                          "escape_T_pred": pred["T_pred"], "slope": e.slope, "slope_se": e.slope_se,
                                          "slope_pred": pred["slope_pred"], "seconds": res["seconds"]})
    c = check_pooled_slope(escapes, slopes, "pooled over " + ", ".join(_label(e.config) for e in escapes))
    comps.append(c)
    rows.insert(0, headline_row(c, "saddle: escape time vs batch size", se=c.details["se"]))
    why = "; ".join(NOT_MEASURED.format(config=n["config"], lr=f"{n['lr']:g}", res=f"{n['res']:.2g}",
                                        rounding=f"{n['rounding']:.2g}") for n in details["not_measured"])
    return Outcome(comps, rows, details=details, undecided=why or None)


def findings(result) -> list:
    out = []
    for c in comparisons_where(result, role="growth rate"):
        d = c["details"]
        mine = comparisons_where(result, config=c["config"], role="step rate")
        held = "; at each step the discrete map 2 log(1 + lr a)/lr at the served point the runs hold gives {preds}"
        verdicts = [s["agrees"] for s in mine]
        held += (" (agrees at every step)" if all(verdicts) else
                 " (disagrees at lr = " + ", ".join(f"{s['details']['lr']:g}" for s in mine if not s["agrees"]) + ")")
        out.append(finding(result, "beyond", "At {config}, the allocated point is a saddle: an off-task OV value on the "
                           "opposite-sign branch grows at rate {rates} at lr = {lrs}, extrapolated to lr -> 0 {rate} "
                           "against theory's 2a = {pred} (a true minimum: 0)" + held + ".", config=c["config"],
                           rates=", ".join(f"{x:.4g}" for x in d["rates"]), lrs=", ".join(f"{x:g}" for x in d["lrs"]),
                           rate=(c["measured"], d["se"]), pred=c["predicted"],
                           preds=", ".join(f"{s['predicted']:.4g}" for s in mine)))
    pooled, = comparisons_where(result, role="pooled slope")
    out.append(finding(result, "beyond", "The escape time grows with the batch size with slope {ratio} x theory's 1/a "
                       "in log B (the seed scales like (lr/B)^2); the additive-noise law (1/2) is "
                       + ("rejected" if pooled["perturbations"][0]["rejected"] else "not rejected") + ".",
                       ratio=(pooled["measured"], pooled["details"]["se"])))
    out.extend(invariant_findings(result))
    return out


def invariant_findings(result) -> list:
    """One sentence per invariant-batch comparison: the steps that left D (a step-size
    instability of GD on the fixed batch), the step measured, whether the flow stayed; and one
    per run not compared, as it left D at every step tried (details["not_measured"])."""
    out = []
    for c in comparisons_where(result, role="invariant flow"):
        d = c["details"]
        left = d.get("unstable") or []
        pre = ("GD on the G-invariant batch at lr " + ", ".join(f"{u['lr']:g}" for u in left) + " leaves D by a "
               "step-size instability (its off-D residual, rounding at the start, reaches "
               + ", ".join(f"{u['residual']:.2g} by t = {u['t']:.3g}" for u in left) + ": past the fixed batch's "
               "stability edge, not the flow); " if left else "")
        at = f"at lr {d['lr']:g}"
        stays = ("the flow stays off the unstable direction" if c["agrees"] else
                 "the flow enters the unstable direction beyond rounding")
        out.append(finding(result, "beyond", "At {config}, " + pre + at + " " + stays + ": largest |o - v| {amp} "
                           "(rounding tolerance {tol}; off-D residual {res}), against {sgd} reached by SGD.",
                           config=c["config"], amp=c["measured"], tol=c["tolerance"], res=d.get("max_residual"),
                           sgd=c["perturbations"][0]["predicted"]))
    return out + [finding(result, "beyond", "At {config}, " + NOT_MEASURED.replace(" at {config}", "") + ".",
                          **note) for note in result.details.get("not_measured", [])]


SPEC = ClaimSpec(
    id="boundary-saddle", kind="boundary", title="Beyond the paper: the allocated point is a saddle under SGD",
    statement=("At finite L the allocated point is a saddle of the factored flow: an off-task value's opposite-sign "
               "direction grows at rate 2a (a = dL/dmu from theory.exact), at a step lr at the discrete map's rate "
               "2 log(1 + lr a)/lr of the point the run holds; SGD noise seeds it, so trained runs leave allocation "
               "after a time growing with the batch size, while a noiseless flow on an exactly invariant batch stays."),
    profiles=PROFILES, plan=plan, compare=compare_results, findings=findings)
