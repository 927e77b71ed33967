"""Claim 5: the limiting error vanishes as d/L -> 0 (like Lambda / L at fixed d).

What is compared
----------------
The gradient-flow limit of H = m heads from a decomposable start is the allocated fixed point
(claim 4: head h(i) serves task i alone).  Theory gives its loss at every finite L exactly
(``theory.exact.exact_fixed_point``: per task the one-head one-block minimum of the exact
loss, by quadrature) and its L -> inf law (``theory.limiting_error.limit_multi``):

    L * loss(L) -> Lambda = sum_i min_w F(w; r_i, r_i, sigma)   (F: SPEC.md; Lambda ~ e sum r_i (r_i + sigma^2)).

Rows (each a Comparison; the headline shows them in this order):

1. "converged loss of trained full model, L=..": at two or more L, the full (factored) model
   trained to convergence (``numerics.experiments.converged``: held-out loss at the final
   weights on fresh prompts, with its standard error) against exact_fixed_point's loss.
2. "decay of trained losses": the ratio of those converged losses between the smallest and
   largest trained L against theory's exact ratio (the error vanishing with L, on trained
   models).  Perturbations: the limit law applied at these L (ratio L2/L1) and an L^-1/2 law.
3. "exact reduced minimum (bridge)": the minimum of the exact reduced loss over the allocated
   family, measured by Monte Carlo (``numerics.exact_reduced.allocated_minimum``), against
   exact_fixed_point at the largest trained L: the bridge between training and the reduced model.
4. "L * loss -> Lambda": L * (exact reduced allocated minimum) at a large L (4096) against
   Lambda.  Tolerance: Z_SE standard errors + theory's stated approximation error at that L,
   the part of L * loss still to come beyond L, bounded by twice theory's own exact change
   over [L, 4L] (a correction falling at least like L^-1/2, CORRECTION_POWERS; exact theory,
   independent of F, so a wrong F cannot widen its own tolerance).

Domain (decided from the configuration before any run, ``domain``): factored parametrisation
(the allocated point is a fixed point of the factored metric 2|mu|, which vanishes at mu = 0;
the merged flow leaves it for a superposition, SPEC.md), decomposable balanced start, H = m.
A trained run is compared with the fixed point only if it is in the domain, has converged
(held-out loss no longer falling) and ended allocated (``numerics.readout``; status rule in
``claims.trained``).
Otherwise it is a boundary finding with its own check: not converged -> its loss is not below
the fixed point (minus the tolerance); left the allocated set -> its loss is not above it
(a superposition lowers the loss); H < m -> not below; H > m -> not above (the allocated model
with idle surplus heads is in its family; unconverged: no side); merged or another start ->
recorded, check "loss below sum r_i" (it learned).  ``details["findings"]`` lists the boundary
rows of a run.  A run with no trained model inside the domain does not decide the claim on
trained models: verdict error with ``details["undecided"]``, never pass.

Findings are generated from each run's own numbers (``findings``; the report's first section).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from claims.base import Figure, Series
from claims.common import Z_SE, Comparison, headline_row, perturbation
from claims.spec import ClaimSpec, Outcome, finding
from claims.trained import check_trained_loss, run_status
from numerics import exact_reduced
from numerics.config import ProblemConfig
from numerics.experiments.converged import (PAPER_SCHEDULE, QUICK_SCHEDULE, TINY_SCHEDULE, TrainingSchedule,
                                            converged_run)
from theory import exact as exact_theory
from theory import limiting_error as limit_theory

TAIL_FACTOR = 2.0
"""The part of L * loss still to come beyond L is bounded by TAIL_FACTOR times theory's exact
change over [L, 4L]: for a correction c L^-p the tail is the change / (1 - 4^-p), <= 2 for
p >= 1/2 (the slowest correction of CORRECTION_POWERS; measured on theory.exact: the change
over [4096, 16384] is 0.38x that over [1024, 4096] at r = 2, p ~ 0.7)."""


@dataclass(frozen=True)
class LimitingErrorProfile:
    cases: tuple = (((2, 2), 0.0),)        # (tasks, sigma) of the trained models and the limit rows
    train_Ls: tuple = (32, 64)             # context lengths of the trained full models (>= 2 for the decay row)
    schedule: TrainingSchedule = field(default_factory=TrainingSchedule)   # explore + polish, held-out size
    bridge_elements: int = 2 ** 22         # exact reduced minimum at the largest trained L: eval prompts x L
    limit_L: int = 4096                    # the L of the L * loss -> Lambda row
    limit_elements: int = 2 ** 24          # its evaluation prompts x L
    fit_elements: int = 2 ** 17            # fit sample of the exact reduced minima (prompts x L)
    problem: tuple = ()                    # a researcher's ProblemConfig fields (sorted items), if any


TINY = LimitingErrorProfile(train_Ls=(32, 64), schedule=TINY_SCHEDULE, bridge_elements=2 ** 21)
QUICK = LimitingErrorProfile(cases=(((2, 2), 0.0), ((3, 3), 0.5)), train_Ls=(32, 64), schedule=QUICK_SCHEDULE,
                             limit_elements=2 ** 25)
PAPER = LimitingErrorProfile(cases=(((4, 4, 4), 0.0), ((10, 10, 10), 0.0), ((3, 3), 0.5)),
                             train_Ls=(64, 128, 256, 512), schedule=PAPER_SCHEDULE,
                             bridge_elements=2 ** 24, limit_L=16384, limit_elements=2 ** 27, fit_elements=2 ** 21)
PROFILES = {"tiny": TINY, "quick": QUICK, "paper": PAPER}


def domain(cfg: ProblemConfig) -> dict:
    """Where theory predicts that a trained model ends at the allocated fixed point, from the
    configuration alone: factored parametrisation, decomposable (balanced) start, H = m."""
    reasons = []
    if cfg.param != "factored":
        reasons.append(f"param={cfg.param}: the allocated point is a fixed point of the factored metric only "
                       "(the merged flow ends in a superposition, SPEC.md)")
    if cfg.init != "decomposable":
        reasons.append(f"init={cfg.init}: theory's flow starts decomposable and balanced")
    if cfg.heads < cfg.m:
        reasons.append(f"H={cfg.heads} < m={cfg.m}: some head serves several tasks, not the allocated point")
    if cfg.heads > cfg.m:
        reasons.append(f"H={cfg.heads} > m={cfg.m}: surplus heads idle only at t -> inf (a race at finite t)")
    return {"inside": not reasons, "reasons": reasons,
            "conditions": "factored parametrisation, decomposable balanced start, H = m; the run converged "
                          "(held-out loss no longer falling) and ended allocated"}


def fixed_point_loss(tasks, L: int, sigma: float) -> dict:
    """theory.exact.exact_fixed_point at (tasks, L, sigma)."""
    return exact_theory.exact_fixed_point(tuple(tasks), int(L), float(sigma))


def check_trained(cfg: ProblemConfig, run, predicted: dict, inside: dict | None = None) -> Comparison:
    """A trained run's converged loss against the exact fixed point (claims.trained: two-sided
    inside the domain, on theory's side outside it)."""
    inside = domain(cfg) if inside is None else inside
    name = f"converged loss of trained full model, tasks={list(cfg.tasks)}, L={cfg.L}, sigma={cfg.sigma:g}"
    return check_trained_loss(cfg, run, predicted, name, run_status(cfg, run, inside, outside_sides=True),
                              target="the fixed point")


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
    tol = Z_SE * se + R * (r1["step_error"] / r1["loss"] + r2["step_error"] / r2["loss"])
    return Comparison(
        name=f"decay of trained losses L={L1}->{L2}, tasks={list(tasks)}, sigma={sigma:g}",
        measured=R, predicted=pred, error=abs(R - pred), tolerance=tol,
        why=f"{Z_SE:g} standard errors of the ratio ({se:.3g}, delta method on the two held-out losses) plus the "
            "runs' relative step errors",
        perturbations=[perturbation(f"limit law at these L (ratio {L2 / L1:g})", abs(R - L2 / L1), tol,
                                    predicted=L2 / L1),
                       perturbation("loss ~ L^-1/2", abs(R - math.sqrt(L2 / L1)), tol, predicted=math.sqrt(L2 / L1))],
        details={"tasks": list(tasks), "sigma": sigma, "L1": L1, "L2": L2, "se": se})


def check_bridge(tasks, sigma: float, L: int, elements: int, fit_elements: int, seed: int,
                 device="cpu") -> Comparison:
    """The exact reduced loss minimised over the allocated family by Monte Carlo
    (numerics.exact_reduced) against theory's exact fixed-point loss at L: Z_SE standard errors
    + the quadrature bound; perturbations x1.1 and /1.1."""
    fm = exact_reduced.allocated_minimum(tasks, L, sigma, seed, device, fit_elements)
    (fm,) = exact_reduced.measure([fm], max(2000, elements // L), seed + 1, device)
    pred = fixed_point_loss(tasks, L, sigma)
    tol = Z_SE * fm.se + pred["error_estimate"]
    return Comparison(
        name=f"exact reduced minimum (bridge), tasks={list(tasks)}, L={L}, sigma={sigma:g}",
        measured=fm.loss, predicted=pred["loss"], error=abs(fm.loss - pred["loss"]), tolerance=tol,
        why=f"{Z_SE:g} standard errors of the Monte-Carlo minimum ({fm.se:.3g}, {fm.n_eval} independent prompts) "
            "plus the quadrature bound",
        perturbations=[perturbation("prediction x1.1", abs(fm.loss - 1.1 * pred["loss"]), tol),
                       perturbation("prediction /1.1", abs(fm.loss - pred["loss"] / 1.1), tol)],
        details={"minimum": fm.summary(), "theory": pred})


def check_limit(tasks, sigma: float, L: int, elements: int, fit_elements: int, seed: int,
                device="cpu") -> Comparison:
    """L * (exact reduced allocated minimum at L) against Lambda = limit_multi(tasks, sigma).
    Tolerance: Z_SE standard errors of L * loss + the part still to come beyond L,
    TAIL_FACTOR * |L loss_th(L) - 4L loss_th(4L)| from theory.exact (never from Lambda, so a
    wrong F cannot widen it).  Perturbations: Lambda x1.2 and /1.2."""
    Lam = float(limit_theory.limit_multi(tuple(tasks), sigma))
    fm = exact_reduced.allocated_minimum(tasks, L, sigma, seed, device, fit_elements)
    (fm,) = exact_reduced.measure([fm], max(2000, elements // L), seed + 1, device)
    y, y_se = L * fm.loss, L * fm.se
    here, far = fixed_point_loss(tasks, L, sigma), fixed_point_loss(tasks, 4 * L, sigma)
    tail = TAIL_FACTOR * abs(4 * L * far["loss"] - L * here["loss"])
    tol = Z_SE * y_se + tail + L * here["error_estimate"]
    return Comparison(
        name=f"L * loss -> Lambda, tasks={list(tasks)}, sigma={sigma:g}, L={L}",
        measured=y, predicted=Lam, error=abs(y - Lam), tolerance=tol,
        why=f"{Z_SE:g} standard errors of L * loss ({y_se:.3g}) plus theory's approximation error at L: the part of "
            f"L * loss still to come beyond L, {TAIL_FACTOR:g} x theory.exact's change over [L, 4L] ({tail:.3g})",
        perturbations=[perturbation("Lambda x1.2", abs(y - 1.2 * Lam), tol, predicted=1.2 * Lam),
                       perturbation("Lambda /1.2", abs(y - Lam / 1.2), tol, predicted=Lam / 1.2)],
        details={"minimum": fm.summary(), "L_times_exact": L * here["loss"], "L4_times_exact": 4 * L * far["loss"],
                 "tail": tail, "relative_gap": (y - Lam) / Lam})



def _figure(trained: dict) -> Figure:
    series = []
    for (tasks, sigma), rows in trained.items():
        d = sum(tasks)
        series.append(Series(f"trained full model, tasks={list(tasks)} sigma={sigma:g}",
                             [d / L for L, _, _ in rows], [r["loss"] for _, r, _ in rows], "points"))
        series.append(Series(f"theory exact fixed point, tasks={list(tasks)} sigma={sigma:g}",
                             [d / L for L, _, _ in rows], [p["loss"] for _, _, p in rows], "line"))
    return Figure(name="limiting-error-vs-d-over-L", title="Converged loss of trained models against d/L",
                  xlabel="d / L", ylabel="loss", xscale="log", yscale="log", series=series,
                  caption="points: held-out loss at the final weights; line: theory.exact's fixed point")


def configurations(ctx) -> list[tuple[ProblemConfig, tuple]]:
    """The trained family: each profile case (H = m, factored) at train_Ls, or the researcher's
    problem at L and 2L."""
    p = ctx.p
    if p.problem:
        base = ProblemConfig.from_dict({**dict(p.problem), "device": ctx.device})
        return [(base, (base.L, 2 * base.L))]
    return [(ProblemConfig(tasks=tuple(t), heads=len(t), L=p.train_Ls[0], sigma=s, device=ctx.device), p.train_Ls)
            for t, s in p.cases]


def evaluate(ctx) -> Outcome:
    """Claim 5: per case, the trained runs at each L against the exact fixed point, the decay
    between in-domain runs, the bridge and the limit rows."""
    p, seed, device = ctx.p, ctx.seed, ctx.device
    configs = configurations(ctx)
    comps, rows, trained = [], [], {}
    steps, done = sum(len(Ls) + 2 for _, Ls in configs), 0
    for k, (base, Ls) in enumerate(configs):
        tasks, sigma = base.tasks, base.sigma
        inside = domain(base)
        runs, preds = [], {}
        for j, L in enumerate(Ls):
            ctx.progress(f"limiting error: training tasks={list(tasks)} L={L}", done / steps)
            cfg = replace(base, L=int(L))
            res = converged_run(cfg, p.schedule, seed + 100 * k + j)
            preds[L] = fixed_point_loss(tasks, L, sigma)
            c = check_trained(cfg, res, preds[L], inside)
            comps.append(c)
            rows.append(headline_row(c, se=res["se"]))
            runs.append((L, res, c.details["status"]))
            done += 1
        trained[(tuple(tasks), sigma)] = [(L, r, preds[L]) for L, r, _ in runs]
        good = [(L, r) for L, r, st in runs if st == "inside"]
        if len(good) >= 2:
            c = check_decay(tasks, sigma, good, preds)
            comps.append(c)
            rows.append(headline_row(c, "decay of trained losses " + c.name.split("losses ")[1]))
        ctx.progress(f"limiting error: bridge and limit tasks={list(tasks)}", done / steps)
        c = check_bridge(tasks, sigma, max(Ls), p.bridge_elements, p.fit_elements, seed + 7 + k, device)
        comps.append(c)
        rows.append(headline_row(c, se=c.details["minimum"]["se"]))
        c = check_limit(tasks, sigma, p.limit_L, p.limit_elements, p.fit_elements, seed + 11 + k, device)
        comps.append(c)
        rows.append(headline_row(c, se=c.details["minimum"]["L_times_se"]))
        done += 2
    doms = {f"tasks={list(b.tasks)} heads={b.heads} param={b.param}": domain(b) for b, _ in configs}
    ran = (f"problem {configs[0][0].to_dict()} trained at L = {list(configs[0][1])}" if p.problem else
           f"profile cases {list(p.cases)} trained at L = {list(p.train_Ls)}")
    undecided = None
    if not any(c.details.get("status") == "inside" for c in comps if "run" in c.details):
        undecided = ("no trained run was inside the domain (converged and allocated): the claim on trained models "
                     "is not decided here")
    return Outcome(comps, rows, [_figure(trained)], short_why=True, undecided=undecided,
                   details={"ran": ran, "domain": {"conditions": domain(configs[0][0])["conditions"], "cases": doms},
                            "boundary_rows": [c.name for c in comps if "boundary_check" in c.details]})


def resolve(p: LimitingErrorProfile, problem: dict) -> LimitingErrorProfile:
    return replace(p, problem=tuple(sorted(problem.items())))


def findings(result) -> list:
    """One sentence per trained run (in-domain agreement, or the boundary it reached) and the
    limit row."""
    out = []
    for c in result.details["comparisons"]:
        d = c["details"]
        if "run" not in d:
            continue
        if d["status"] == "inside":
            out.append(finding(result, "holds", "At {config}, the trained model's held-out loss {loss} agrees with "
                               "theory's exact finite-L fixed point {theory} (tolerance {tol}).", config=c["config"],
                               loss=(c["measured"], d["run"]["se"]), theory=c["predicted"], tol=c["tolerance"]))
        else:
            out.append(finding(result, "stops", "At {config}, the trained run is outside claim 5's account ("
                               + d["status"].split(" (")[0] + "): held-out loss {loss} against theory's allocated fixed point {theory} (check: "
                               + d["boundary_check"] + ").", config=c["config"], loss=(c["measured"], d["run"]["se"]),
                               theory=d["prediction"]["loss"]))
    for c in result.details["comparisons"]:
        if c["name"].startswith("L * loss"):
            out.append(finding(result, "holds" if c["agrees"] else "stops",
                               "L x (exact reduced allocated minimum) at L = {L} is {m} against Lambda = {lam} "
                               "(tolerance {tol}).", L=c["name"].split("L=")[-1], m=c["measured"],
                               lam=c["predicted"], tol=c["tolerance"]))
    return out


SPEC = ClaimSpec(
    id="limiting-error", title="Limiting error vanishes as d/L -> 0",
    statement=("The ICL prediction error of the gradient-flow limit vanishes as d/L -> 0: trained full models "
               "converge to theory's exact finite-L fixed-point loss, which falls with L, and L * loss tends to "
               "Lambda = sum_i min_w F(w; r_i, r_i, sigma)."),
    profiles=PROFILES, evaluate=evaluate, resolve=resolve, findings=findings, reads_sweep=True,
    fields=("tasks", "heads", "L", "sigma", "param", "init_scale", "logit_scale", "basis", "dtype"))
CLAIM_ID, TITLE, STATEMENT = SPEC.id, SPEC.title, SPEC.statement
run = SPEC.run
