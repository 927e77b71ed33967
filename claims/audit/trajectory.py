"""The audit of a run's checkpoints: claims 3-4 (phase times and final winners) against theory from
the first checkpoint (claims.audit.model: the judged model, the sizing, the comparisons)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from claims.core import Z_SE, ClaimResult, Outcome, compare, config_label, finding, fmt, headline_row, reported_row
from claims.audit.model import (AuditPlan, BALANCED_SHARE, MIN_PHASE_CHECKPOINTS, ON_D_SHARE, PHASE_FACTOR, _entrywise, _share, undecided_reason, words)


# --------------------------------------------------------------------------- a trajectory

@dataclass(frozen=True)
class TrajectoryCase:
    """The profile of the trajectory's spec: the plan, the measurements, and what
    :func:`prepare_trajectory` decided before any comparison."""

    plan: object
    measurements: tuple
    prepared: dict


def trajectory_domain(plan: AuditPlan, meas0) -> dict:
    """Where theory's phase and winner predictions from the first checkpoint apply: on D, factored
    and balanced (:data:`BALANCED_SHARE`), every omega and mu positive (the flow of a sign-aligned
    start), H >= m, at least MIN_PHASE_CHECKPOINTS checkpoints."""
    c0 = plan.cases[0]
    cfg = c0.cfg
    reasons = []
    share, how = _share(meas0)
    if share is None or share > ON_D_SHARE:
        reasons.append(f"the first checkpoint is not on D ({how} {fmt(share)} > {ON_D_SHARE:g}): theory's flow starts "
                       "on D")
    if cfg.param != "factored" and c0.ext.param != "reduced":
        reasons.append("merged weights: theory's phase law is stated for the factored parametrisation")
    b = meas0.balance
    if b is not None and max(b["omega"], b["mu"]) > BALANCED_SHARE:
        reasons.append(f"unbalanced factors at the first checkpoint (|k^2 - q^2| / 2 s|omega| = {b['omega']:.3g}, "
                       f"|o^2 - v^2| / 2|mu| = {b['mu']:.3g} > {BALANCED_SHARE:g}): theory's flow is the balanced one")
    if np.any(meas0.omega <= 0) or np.any(meas0.mu <= 0):
        reasons.append("the first checkpoint is not sign-aligned (some omega or mu <= 0)")
    if cfg.heads < cfg.m:
        reasons.append(f"H={cfg.heads} < m={cfg.m}")
    if len(plan.cases) < MIN_PHASE_CHECKPOINTS:
        reasons.append(f"{len(plan.cases)} checkpoints: the phase readout needs at least {MIN_PHASE_CHECKPOINTS}")
    return {"inside": not reasons, "reasons": reasons,
            "conditions": f"first checkpoint on D, factored and balanced, omega and mu > 0, H >= m, >= "
                          f"{MIN_PHASE_CHECKPOINTS} checkpoints"}


def bracketing_gap(t, time: float) -> float:
    """The gap between the two checkpoints around ``time``: a crossing interpolated between them is
    resolved to it."""
    k = int(np.clip(np.searchsorted(t, time), 1, len(t) - 1))
    return float(t[k] - t[k - 1])


def phases_resolved_between(pt, t) -> tuple[bool, str]:
    """theory.three_phases.phases_resolved with each phase end resolved to the gap of the checkpoints
    around it (:func:`bracketing_gap`), not to the run's largest gap, so that a schedule dense around
    the crossings resolves them: a drop clear of the noise, warm-up and emergence longer than the gaps
    at their ends (else "too sparse: ..."), the final window (the last 10% of checkpoints, >= 3) in the
    convergence, the emergence the fastest phase.  ``pt`` on ``t`` from the first checkpoint."""
    from theory.three_phases import phase_rates

    if not pt.defined:
        return False, f"no drop clear of the noise ({pt.reason})"
    gw, ge = bracketing_gap(t, pt.warmup_end), bracketing_gap(t, pt.emergence_end)
    if pt.warmup_end < gw:
        return False, f"too sparse: the warm-up ({pt.warmup_end:.3g}) is shorter than the gap around its end ({gw:.3g})"
    if pt.emergence_end - pt.warmup_end < max(gw, ge):
        return False, (f"too sparse: the emergence ({pt.emergence_end - pt.warmup_end:.3g}) is shorter than the gaps "
                       f"around its ends ({max(gw, ge):.3g})")
    n_end = max(3, int(np.ceil(0.1 * len(t))))
    if pt.emergence_end > t[-n_end]:
        return False, f"emergence end {pt.emergence_end:.4g} inside the final window (t >= {t[-n_end]:.4g})"
    r = phase_rates(pt, float(t[-1]))
    if not (r["emergence"] > r["warmup"] and r["emergence"] > r["convergence"]):
        return False, f"the emergence is not the fastest phase (rates {r})"
    return True, ""


def prepare_trajectory(plan: AuditPlan, ms: list) -> dict:
    """Theory's predictions from the first checkpoint and the measured phase readout, both on t - t_0,
    before any comparison: the domain, ``prediction`` (theory.three_phases.phase_prediction: the
    expansion flow, its GD map, its errors against theory.exact), the measured PhaseTimes, and
    ``phase_undecided``: why no phase comparison can be made (:func:`phases_resolved_between`)."""
    from theory import three_phases as phase_theory
    from theory.task_allocation import predicted_winners

    t, cfg = np.array([c.time for c in plan.cases], float), plan.cases[0].cfg
    losses = [m.loss if m.loss is not None else m.projected_loss for m in ms]
    y, rel = np.array([e.mean for e in losses]), t - t[0]
    out = {"t": t, "rel": rel, "loss": y, "se": np.array([e.se for e in losses]), "n": losses[0].n,
           "domain": trajectory_domain(plan, ms[0]), "prediction": None, "winners": None, "undecided": None,
           "measured": phase_theory.phase_times(rel, y) if t.size >= MIN_PHASE_CHECKPOINTS else None,
           "lr_used": plan.lr if plan.lr is not None else (float(np.min(np.diff(t))) / 100.0 if t.size > 1 else None)}
    if not out["domain"]["inside"]:
        out["undecided"] = ("outside the domain of theory's predictions from the first checkpoint: "
                            + "; ".join(out["domain"]["reasons"]))
        return out
    om0, mu0, s = ms[0].omega, ms[0].mu, cfg.logit_scale
    if cfg.heads >= 2:
        out["winners"] = list(predicted_winners(om0, mu0, cfg.tasks, cfg.L, cfg.sigma, "factored", s))
    try:
        pred = phase_theory.phase_prediction(om0, mu0, cfg.tasks, cfg.L, cfg.sigma, "factored", s, out["lr_used"], t=rel)
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        out["phase_undecided"] = f"theory's phase prediction failed ({type(exc).__name__}: {exc})"
        return out
    out["prediction"] = pred
    ok_m, why_m = phases_resolved_between(out["measured"], rel)
    ok_p, why_p = ((False, f"the expansion flow left its domain ({pred.flow_status})") if pred.phases is None
                   else phases_resolved_between(pred.phases, rel))
    out["measured_resolved"] = (ok_m, why_m)
    if not ok_p and not why_p.startswith("too sparse"):
        out["phase_undecided"] = f"theory's flow from the first checkpoint shows no three resolved phases here ({why_p})"
    elif not ok_p or (not ok_m and why_m.startswith("too sparse")):
        out["phase_undecided"] = (f"the checkpoints around {'theory' if not ok_p else 'the measured curve'}'s phase ends "
                                  f"are {why_p if not ok_p else why_m}: save them more often there")
    return out


def expansion_offset(pred, fixed: Optional[dict], se_end: float) -> Optional[dict]:
    """How far the curve drawn as theory's (the expansion flow from the first checkpoint; the exact flow
    needs the pair moments at every step: minutes at H = 2) ends from the exact allocated fixed point
    (else PhasePrediction.end_error), and whether beyond the fixed-point loss comparison's tolerance
    (Z_SE held-out se + the quadrature bound): then the figure names the offset."""
    if pred is None or pred.loss is None or not np.isfinite(pred.loss[-1]):
        return None
    end, ok = float(pred.loss[-1]), bool(fixed and fixed.get("available"))
    exact, bound = (float(fixed["loss"]), fixed["error_estimate"]) if ok else (None, 0.0)
    return {"expansion_end": end, "end_error": pred.end_error, "exact": exact,
            "relative": (end - exact) / exact if ok else None,
            "beyond_tolerance": bool((abs(end - exact) if ok else pred.end_error) > Z_SE * se_end + bound)}


def check_phase_times(pr: dict, lr_known: bool, config: str):
    """The measured phase ends against theory's from the first checkpoint (on t - t_0, shown in the run's
    times).  Tolerance per end, fixed before comparing: the larger gap of the checkpoints around the
    measured and the predicted crossing (each is interpolated between its two) + Z_SE x the held-out
    se / |dL/dt| (the part more prompts shrink) + theory's level error / |dL/dt| + T x its relative
    error + the GD map's O(lr) shift (step known).  Wrong predictions: both ends x2 and /2."""
    from theory.three_phases import loss_slope

    pred, rel, se, t0 = pr["prediction"], pr["rel"], pr["se"], float(pr["t"][0])
    ok_m, why_m = pr["measured_resolved"]
    tols, predicted, meas_d = {}, {}, {}
    for key, f in (("warmup_end", 0.1), ("emergence_end", 0.9)):
        tp, tm = getattr(pred.phases, key), getattr(pr["measured"], key)
        slope = max(loss_slope(rel, pred.loss, tp), 1e-12)
        k = int(np.clip(np.searchsorted(rel, tp), 0, rel.size - 1))
        gd = getattr(pred.gd_map_phases, key) if (lr_known and pred.gd_map_phases is not None) else math.nan
        parts = {"bracketing_gap": max(bracketing_gap(rel, tp), bracketing_gap(rel, tm) if ok_m else 0.0),
                 "level_noise": Z_SE * float(max(se[k], se[0], se[-1])) / slope,
                 "level_theory": (f * pred.end_error + (1 - f) * pred.start_error) / slope,
                 "gd_map_shift": abs(gd - tp) if math.isfinite(gd) else 0.0,
                 "rate": tp * max(pred.start_error / pred.phases.loss_start, (pred.rate_error or {}).get(key, 0.0))}
        tols[key] = {"tolerance": float(sum(parts.values())), "parts": parts}
        predicted[key], meas_d[key] = float(tp + t0), float(tm + t0) if ok_m else math.nan
    tol = [tols[k]["tolerance"] for k in predicted]
    noise = [tols[k]["parts"]["level_noise"] for k in predicted]
    why = ("per phase end: the gap of the checkpoints around the crossings + (Z_SE x the held-out se + theory's "
           "expansion-vs-exact level error)/|dL/dt| + T x the expansion's relative error + the GD map's O(lr) shift "
           "(0 if the trainer's step is unknown: give --lr); no SGD escape spread (the batch is unknown); max |dt|/tol")
    if not ok_m:
        why = f"the measured curve does not show three resolved phases ({why_m}); " + why
    wrong = [(f"both phase ends x{PHASE_FACTOR:g}", {k: t0 + PHASE_FACTOR * (v - t0) for k, v in predicted.items()}),
             (f"both phase ends /{PHASE_FACTOR:g}", {k: t0 + (v - t0) / PHASE_FACTOR for k, v in predicted.items()})]
    err = (lambda a, b: _entrywise(list(a.values()), list(b.values()), tol)) if ok_m else (lambda a, b: math.inf)
    return compare(f"phase times from the first checkpoint, {config}", meas_d, predicted, 1.0, why, wrong=wrong,
                   error=err, config=config, details={"role": "phase times", "tolerances": tols, "tolerance_parts": {
                       "noise": noise, "fixed": [a - b for a, b in zip(tol, noise)], "n": pr["n"]}})


def check_winners(winners: list, last, cfg, config: str):
    """The head carrying each task at the last checkpoint (numerics.evaluate: argmax_h mu omega) against
    theory.task_allocation.predicted_winners from the first; exact, counted.  Wrong: the first
    task's winner moved to the next head."""
    wrong = [(winners[0] + 1) % cfg.heads] + list(winners[1:])
    return compare(f"winners at the last checkpoint vs theory from the first, {config}", list(last.allocation["winners"]),
                   list(winners), 0.0, "exact: the head carrying each task (numerics.evaluate: argmax_h mu omega) is "
                   "theory.task_allocation.predicted_winners (rule ode) from the first checkpoint; counted",
                   wrong=[(f"winners {wrong}", wrong)], config=config, units="absolute",
                   error=lambda a_, b_: float(sum(int(x != y) for x, y in zip(a_, b_))), details={"role": "winners"})


def evaluate_trajectory(ctx) -> Outcome:
    """Claims 3 and 4 on someone else's run (module docstring), from :func:`prepare_trajectory`; a
    comparison not made is a row saying why, and with none made the run is undecided."""
    tc: TrajectoryCase = ctx.p
    plan, ms, pr = tc.plan, list(tc.measurements), tc.prepared
    t, se, pred = pr["t"], pr["se"], pr["prediction"]
    cfg, ends = plan.cases[0].cfg, ("warmup_end", "emergence_end", "steepest_time")
    config = config_label(cfg)
    absolute = lambda pt: None if pt is None else {k: v + t[0] if k in ends else v  # noqa: E731 (of t - t_0)
                                                   for k, v in pt.to_dict().items()}
    details = {"t": t.tolist(), "loss": pr["loss"].tolist(), "se": se.tolist(), "omega": [m.omega.tolist() for m in ms],
               "mu": [m.mu.tolist() for m in ms], "domain": pr["domain"], "config": config,
               "measured_phases": absolute(pr["measured"]), "lr": plan.lr, "lr_source": plan.lr_source,
               "lr_used": pr["lr_used"], "words": [words(m, c.cfg)[0] for m, c in zip(ms, plan.cases)],
               "predicted_t": None if pred is None else (np.asarray(pred.t, float) + t[0]).tolist(),
               "predicted_loss": None if pred is None or pred.loss is None else np.asarray(pred.loss, float).tolist(),
               "predicted_phases": None if pred is None else absolute(pred.phases),
               "expansion_offset": expansion_offset(pred, pr.get("fixed_point"), float(se[-1])),
               "phase_undecided": pr.get("phase_undecided"), "winners": None}
    comps, not_made = [], []
    if pr["undecided"]:
        not_made = [("phase times and winners", pr["undecided"])]
    elif pred is None or pr.get("phase_undecided"):
        not_made.append(("phase times", pr.get("phase_undecided")))
    else:
        comps.append(check_phase_times(pr, plan.lr is not None, config))
    rows = [headline_row(c, theory=list(c.predicted.values()), measured=list(c.measured.values()), tolerance=1.0,
                         name="phase ends (warm-up, emergence) from the first checkpoint (max |dt|/tol)") for c in comps]
    last = ms[-1]
    if pr["winners"] is not None and last.allocation["allocated"]:
        comps.append(check_winners(pr["winners"], last, cfg, config))
        rows.append(headline_row(comps[-1], theory=None, measured=None))
    elif pr["winners"] is not None:
        not_made.append((f"winners at the last checkpoint {list(last.allocation['winners'])} vs theory's "
                         f"{pr['winners']}", f"not allocated at the end: {words(last, cfg)[0]}"))
    elif not pr["undecided"]:
        not_made.append(("winners", "one head: no race between heads to predict"))
    if pr["winners"] is not None:
        details["winners"] = {"predicted": pr["winners"], "measured": list(last.allocation["winners"]),
                              "allocated_at_end": last.allocation["allocated"]}
    rows.extend(reported_row(f"not compared: {what} ({why})", None, config=config) for what, why in not_made)
    details["not_compared"] = [{"what": w, "why": y} for w, y in not_made]
    rate = sum(m.seconds for m in ms) / (len(ms) * pr["n"])
    undecided = (undecided_reason(comps, pr["n"], rate) if comps else
                 "; ".join(f"{w}: {y}" for w, y in not_made) or "no comparison could be made")
    return Outcome(comps, rows, details=details, undecided=undecided)


def trajectory_findings(result: ClaimResult) -> list:
    d = result.details
    out = []
    for c in d.get("comparisons", []):
        kind = "holds" if c["agrees"] and all(p["rejected"] for p in c["perturbations"]) else "stops"
        if c["details"].get("role") == "phase times":
            m, p = c["measured"], c["predicted"]
            out.append(finding(result, kind, "On this run ({config}) the warm-up ends at t = {mw} and the emergence at "
                               "{me}, against theory's {pw} and {pe} from the first checkpoint (worst |dt|/tolerance "
                               "{err}).", config=d["config"], mw=m.get("warmup_end"), me=m.get("emergence_end"),
                               pw=p["warmup_end"], pe=p["emergence_end"], err=c["error"]))
        elif c["details"].get("role") == "winners":
            out.append(finding(result, kind, "On this run ({config}) the tasks end on heads {m}, theory's winners from "
                               "the first checkpoint are {p}.", config=d["config"], m=c["measured"], p=c["predicted"]))
    for x in d.get("not_compared", []):
        out.append(finding(result, "stops", "Claims 3-4 on this run ({config}): {what} not compared, {why}.",
                           config=d.get("config", "?"), what=x["what"], why=x["why"]))
    return out


