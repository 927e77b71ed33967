"""Claim 5: the limiting error vanishes as d/L -> 0 (like Lambda / L at fixed d).

The gradient-flow limit of H = m heads from a decomposable start is the allocated fixed point
(claim 4: head h(i) serves task i alone).  Theory gives its loss at every finite L exactly
(``theory.exact.exact_fixed_point``: per task the one-head one-block minimum of the exact
loss, by quadrature) and its L -> inf law (``theory.limiting_error.limit_multi``):

    L * loss(L) -> Lambda = sum_i min_w F(w; r_i, r_i, sigma)   (F: docs/model.md; Lambda ~ e sum r_i (r_i + sigma^2)).

Rows, in the headline's order: the converged losses of trained full models at two or more L
(:func:`check_trained`; a run outside the domain, unconverged or not allocated is a boundary
row on theory's side, ``claims.core``), their decay with L (:func:`check_decay`), the exact
reduced minimum at the largest trained L (:func:`check_bridge`: the bridge between training
and the reduced model), and L * loss at a large L against Lambda (:func:`check_limit`).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from claims.core import (ClaimSpec, Comparison, Outcome, Tolerance, TrainedProfile, agreement, bridge_need, case_figure,
                         check_large_L, check_trained_loss, compare, comparisons_where, configurations, domain, finding,
                         headline_row, limit_need, noise_term, off_by, run_status, term, theory_need, trained_name,
                         trained_need, with_problem)
from numerics.config import ProblemConfig
from numerics.experiments.converged import PAPER_SCHEDULE, QUICK_SCHEDULE, TINY_SCHEDULE


class LimitingErrorProfile(TrainedProfile):
    """Claim 5's profile."""


TINY = LimitingErrorProfile(train_Ls=(32, 64), schedule=TINY_SCHEDULE, bridge_elements=2 ** 21)
QUICK = LimitingErrorProfile(cases=(((2, 2), 0.0), ((3, 3), 0.5)), train_Ls=(32, 64), schedule=QUICK_SCHEDULE,
                             limit_elements=2 ** 25)
PAPER = LimitingErrorProfile(cases=(((4, 4, 4), 0.0), ((10, 10, 10), 0.0), ((3, 3), 0.5)),
                             train_Ls=(64, 128, 256, 512), schedule=PAPER_SCHEDULE,
                             bridge_elements=2 ** 24, limit_L=16384, limit_elements=2 ** 27, fit_elements=2 ** 21)
PROFILES = {"tiny": TINY, "quick": QUICK, "paper": PAPER}


def plan(ctx, results=None) -> list:
    """Per case: the converged runs at each L with theory's exact fixed point there, the bridge's
    and the limit row's reduced minima with theory's values at limit_L and 4 limit_L."""
    p, out = ctx.p, []
    for base, Ls in configurations(ctx.p, ctx.device):
        tasks, sigma = tuple(base.tasks), float(base.sigma)
        for L in Ls:
            out += [trained_need(replace(base, L=int(L)), p.schedule), theory_need("exact_fixed_point", tasks, int(L), sigma)]
        out += [bridge_need(p, tasks, sigma, max(Ls), ctx.device), limit_need(p, tasks, sigma, ctx.device),
                theory_need("limit_multi", tasks, sigma)]
        out += [theory_need("exact_fixed_point", tasks, int(k * p.limit_L), sigma) for k in (1, 4)]
    return out


def fixed_point_loss(results, tasks, L: int, sigma: float) -> dict:
    """theory.exact.exact_fixed_point at (tasks, L, sigma), from the plan's results."""
    return results[theory_need("exact_fixed_point", tuple(tasks), int(L), float(sigma))]


def check_trained(cfg: ProblemConfig, run, predicted: dict, inside: dict | None = None) -> Comparison:
    """A trained run's converged loss against the exact fixed point (claims.core: two-sided
    inside the domain, on theory's side outside it)."""
    status = run_status(cfg, run, domain(cfg) if inside is None else inside, outside_sides=True)
    c = check_trained_loss(cfg, run, predicted, trained_name(cfg), status, target="the fixed point")
    c.details["role"] = "trained loss"      # what the findings look it up by
    return c


def check_decay(tasks, sigma: float, runs: Sequence[tuple], predictions: dict) -> Comparison:
    """The converged loss falls with L as theory's exact fixed point does: the ratio
    loss(L1)/loss(L2) of two in-domain trained runs (L1 < L2) against the exact ratio.
    Standard error by the delta method on the two independent held-out estimates; tolerance
    Z_SE of it plus the two runs' step errors (relative).  Perturbations: the limit law applied
    at these L (ratio L2/L1) and an L^-1/2 law (ratio sqrt(L2/L1))."""
    (L1, r1), (L2, r2) = runs[0], runs[-1]
    R = r1["loss"] / r2["loss"]
    se = R * math.hypot(r1["se"] / r1["loss"], r2["se"] / r2["loss"])
    pred = predictions[L1]["loss"] / predictions[L2]["loss"]
    tol = Tolerance((noise_term(se, "the ratio", "delta method on the two held-out losses"),
                     term("the runs' relative step errors",
                          R * (r1["step_error"] / r1["loss"] + r2["step_error"] / r2["loss"]))))
    return compare(f"decay of trained losses L={L1}->{L2}, tasks={list(tasks)}, sigma={sigma:g}", R, pred, tol,
                   wrong=((f"limit law at these L (ratio {L2 / L1:g})", L2 / L1),
                          ("loss ~ L^-1/2", math.sqrt(L2 / L1))),
                   details={"tasks": list(tasks), "sigma": sigma, "L1": L1, "L2": L2, "se": se})


def check_bridge(tasks, sigma: float, L: int, minimum, pred: dict) -> Comparison:
    """The exact reduced loss minimised over the allocated family by Monte Carlo (the plan's
    reduced minima) against theory's exact fixed-point loss at L: Z_SE standard errors + the
    quadrature bound; perturbations x1.1 and /1.1."""
    fm = minimum
    return compare(f"exact reduced minimum (bridge), tasks={list(tasks)}, L={L}, sigma={sigma:g}", fm.loss,
                   pred["loss"], Tolerance((noise_term(fm.se, "the Monte-Carlo minimum",
                                                       f"{fm.n_eval} independent prompts"),
                                            term("the quadrature bound", pred["error_estimate"]))),
                   wrong=off_by(1.1, pred["loss"]), details={"minimum": fm.summary(), "theory": pred})


def check_limit(tasks, sigma: float, L: int, minimum, Lam: float, here: dict, far: dict) -> Comparison:
    """L * (exact reduced allocated minimum at L) against Lambda = limit_multi(tasks, sigma), at
    the tolerance of ``claims.core.check_large_L``: Z_SE standard errors of L * loss + the part
    still to come beyond L (from theory.exact's L * loss at L and 4L, never from Lambda, so a
    wrong F cannot widen it) + L x the quadrature bound.  Perturbations: Lambda x1.2 and /1.2."""
    fm, Lam = minimum, float(Lam)
    y = L * fm.loss
    return check_large_L(
        f"L * loss -> Lambda, tasks={list(tasks)}, sigma={sigma:g}, L={L}", y, L * fm.se, "L * loss",
        Lam, 4 * L * far["loss"] - L * here["loss"], "L * loss", off_by(1.2, Lam, "Lambda"),
        {"role": "limit", "L": int(L), "minimum": fm.summary(), "L_times_exact": L * here["loss"],
         "L4_times_exact": 4 * L * far["loss"], "relative_gap": (y - Lam) / Lam}, quadrature=L * here["error_estimate"])


def compare_results(ctx, results) -> Outcome:
    """Claim 5: per case, the trained runs at each L against the exact fixed point, the decay
    between in-domain runs, the bridge and the limit rows.  With no trained run inside the
    domain the claim on trained models is not decided: verdict undecided, never pass."""
    p = ctx.p
    configs = configurations(ctx.p, ctx.device)
    comps, rows, points, head = [], [], {}, None
    for k, (base, Ls) in enumerate(configs):
        tasks, sigma = tuple(base.tasks), float(base.sigma)
        inside = domain(base)
        runs, preds = [], {}
        for L in Ls:
            cfg = replace(base, L=int(L))
            res = results[trained_need(cfg, p.schedule)]
            preds[L] = fixed_point_loss(results, tasks, L, sigma)
            c = check_trained(cfg, res, preds[L], inside)
            if k == 0 and L == max(Ls):
                head = c.name     # the headline: the trained loss at the first case's largest L
            comps.append(c)
            rows.append(headline_row(c, se=res["se"]))
            runs.append((L, res, c.details["status"]))
        points[(tasks, sigma)] = [(sum(tasks) / L, r["loss"], preds[L]["loss"]) for L, r, _ in runs]
        good = [(L, r) for L, r, st in runs if st == "inside"]
        if len(good) >= 2:
            c = check_decay(tasks, sigma, good, preds)
            comps.append(c)
            rows.append(headline_row(c))
        bridge = results[bridge_need(p, tasks, sigma, max(Ls), ctx.device)][0]
        c = check_bridge(tasks, sigma, max(Ls), bridge, fixed_point_loss(results, tasks, max(Ls), sigma))
        comps.append(c)
        rows.append(headline_row(c, se=c.details["minimum"]["se"]))
        limit = results[limit_need(p, tasks, sigma, ctx.device)][0]
        c = check_limit(tasks, sigma, p.limit_L, limit, results[theory_need("limit_multi", tasks, sigma)],
                        fixed_point_loss(results, tasks, p.limit_L, sigma),
                        fixed_point_loss(results, tasks, 4 * p.limit_L, sigma))
        comps.append(c)
        rows.append(headline_row(c, se=c.details["minimum"]["L_times_se"]))
    doms = {f"tasks={list(b.tasks)} heads={b.heads} param={b.param}": domain(b) for b, _ in configs}
    ran = (f"problem {configs[0][0].to_dict()} trained at L = {list(configs[0][1])}" if p.problem else
           f"profile cases {list(p.cases)} trained at L = {list(p.train_Ls)}")
    undecided = None
    if not any(c.details.get("status") == "inside" for c in comps if "run" in c.details):
        undecided = ("no trained run was inside the domain (converged and allocated): the claim on trained models "
                     "is not decided here")
    figure = case_figure("limiting-error-vs-d-over-L", "Converged loss of trained models against d/L", points,
                                 "trained full model", "theory exact fixed point", xlabel="d / L", ylabel="loss",
                                 xscale="log", yscale="log",
                                 caption="points: held-out loss at the final weights; line: theory.exact's fixed point")
    return Outcome(comps, rows, [figure], short_why=True, undecided=undecided, headline_comparison=head,
                   details={"ran": ran, "domain": {"conditions": domain(configs[0][0])["conditions"], "cases": doms},
                            "boundary_rows": [c.name for c in comps if "boundary_check" in c.details]})


def findings(result) -> list:
    """One sentence per trained run (in-domain agreement, or the boundary it reached) and the
    limit row."""
    out = []
    for c in comparisons_where(result, role="trained loss"):
        d = c["details"]
        if d["status"] == "inside":
            out.append(finding(result, "holds", "At {config}, the trained model's held-out loss {loss} agrees with "
                               "theory's exact finite-L fixed point {theory} (tolerance {tol}).", config=c["config"],
                               loss=(c["measured"], d["run"]["se"]), theory=c["predicted"], tol=c["tolerance"]))
        else:
            out.append(finding(result, "stops", "At {config}, the trained run is outside claim 5's account ("
                               + d["status"].split(" (")[0] + "): held-out loss {loss} against theory's allocated "
                               "fixed point {theory} (check: " + d["boundary_check"] + ").", config=c["config"],
                               loss=(c["measured"], d["run"]["se"]), theory=d["prediction"]["loss"]))
    for c in comparisons_where(result, role="limit"):
        out.append(finding(result, agreement(c), "L x (exact reduced allocated minimum) at L = {L} is {m} against "
                           "Lambda = {lam} (tolerance {tol}).", L=c["details"]["L"], m=c["measured"],
                           lam=c["predicted"], tol=c["tolerance"]))
    return out


SPEC = ClaimSpec(
    id="limiting-error", title="Limiting error vanishes as d/L -> 0",
    paper="the limit model's in-context error vanishes as d/L -> 0",
    statement=("The ICL prediction error of the gradient-flow limit vanishes as d/L -> 0: trained full models "
               "converge to theory's exact finite-L fixed-point loss, which falls with L, and L * loss tends to "
               "Lambda = sum_i min_w F(w; r_i, r_i, sigma)."),
    profiles=PROFILES, plan=plan, compare=compare_results, resolve=with_problem, findings=findings, reads_sweep=True,
    fields=("tasks", "heads", "L", "sigma", "param", "init_scale", "logit_scale", "basis", "dtype"))
