"""Where claims 5 and 6 stop: trained models that leave the allocated set, and where they go.

With label noise the factored flow of the full model does not stay at the allocated fixed
point (an off-task OV value of the opposite sign grows: the allocated point is a saddle at
finite L, ``boundary-saddle``).  Theory's account of the regime has two parts, each a
prediction that can fail: a superposition lowers the loss (the trained held-out loss is not
above the allocated fixed point, ``claims.trained.check_trained_loss`` at claim 5's
tolerance), and it ends at the best decomposable point of the same H, signs free
(:func:`check_best_decomposable`).

The runs are claims 5 and 6's own (same configuration, schedule and seed: taken from the run
cache or a sweep store, trained once per report).  A run that stayed allocated did not reach
the boundary: it is reported, not compared; with no run leaving allocation the boundary is
undecided.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from claims.common import Z_SE, Comparison, compare, config_label, headline_row, reported_row
from claims.spec import ClaimSpec, Outcome, comparisons_named, finding
from claims.trained import check_trained_loss, domain, run_status
from numerics.config import ProblemConfig
from numerics.experiments.converged import (PAPER_SCHEDULE, QUICK_SCHEDULE, TINY_SCHEDULE, TrainingSchedule,
                                            converged_run)
from numerics.experiments.probes import best_decomposable
from theory import exact as exact_theory


@dataclass(frozen=True)
class LeftAllocationProfile:
    # (tasks, heads, L, sigma, seed): claims 5 and 6's noisy runs (seed 0 + 100 k + j of their case k, length j)
    runs: tuple = (((3, 3), 2, 32, 0.5, 100),)
    schedule: TrainingSchedule = field(default_factory=TrainingSchedule)
    search_starts: int = 0          # random starts of the decomposable search besides the allocated/merged ones
    search_fit_elements: int = 2 ** 17
    search_eval_prompts: int = 4096


PROFILES = {
    # tiny: claim 5's first tiny run (noiseless, stays allocated): the pipeline, undecided by design
    "tiny": LeftAllocationProfile(runs=(((2, 2), 2, 32, 0.0, 0),), schedule=TINY_SCHEDULE),
    "quick": LeftAllocationProfile(runs=(((3, 3), 2, 32, 0.5, 100), ((3, 3), 2, 64, 0.5, 101),
                                         ((3, 3, 3), 3, 32, 0.5, 100), ((3, 3, 3), 3, 64, 0.5, 101)),
                                   schedule=QUICK_SCHEDULE),
    "paper": LeftAllocationProfile(runs=tuple(((3, 3), 2, L, 0.5, 200 + j) for j, L in enumerate((64, 128, 256, 512))),
                                   schedule=PAPER_SCHEDULE, search_starts=2, search_fit_elements=2 ** 19),
}


def check_best_decomposable(cfg: ProblemConfig, run, best, allocated_loss: float) -> Comparison:
    """The trained loss against the best decomposable point of the same H, signs free
    (``numerics.experiments.probes.best_decomposable``: a search, so its loss bounds the optimum
    from above): two-sided, tolerance Z_SE x sqrt(se_run^2 + se_best^2) + the run's step error,
    all from the two measurements' own noise.  Perturbation: the allocated fixed point as the
    prediction (must be rejected: a superposition that merely equals the allocated loss is not
    "somewhere else")."""
    se = math.hypot(run["se"], best.se)
    return compare(f"left allocation: trained loss vs best decomposable point of the same H, tasks={list(cfg.tasks)}, "
                   f"L={cfg.L}, sigma={cfg.sigma:g}", run["loss"], best.loss, Z_SE * se + run["step_error"],
                   f"{Z_SE:g} standard errors of the difference of the two held-out losses ({se:.3g}) plus the run's "
                   f"step error ({run['step_error']:.3g})", wrong=(("the allocated fixed point", allocated_loss),),
                   config=config_label(cfg),
                   details={"run_se": run["se"], "allocation": run["allocation"], "status": "left the allocated set",
                            "best": {"loss": best.loss, "se": best.se, "family": best.family, "omega": best.omega,
                                     "mu": best.mu}})


def evaluate(ctx) -> Outcome:
    p = ctx.p
    comps, rows, left = [], [], 0
    for k, (tasks, heads, L, sigma, seed) in enumerate(p.runs):
        ctx.progress(f"left allocation: tasks={list(tasks)} H={heads} L={L}", k / len(p.runs))
        cfg = ProblemConfig(tasks=tuple(tasks), heads=heads, L=L, sigma=sigma, device=ctx.device)
        run = converged_run(cfg, p.schedule, seed + ctx.seed)
        fixed = exact_theory.exact_fixed_point(tuple(tasks), L, sigma)
        status = run_status(cfg, run, domain(cfg))
        name = f"left allocation: trained loss vs allocated fixed point, tasks={list(tasks)}, L={L}, sigma={sigma:g}"
        if status[0] == "inside":
            rows.append(reported_row(name + " (stayed allocated: boundary not reached)", run["loss"],
                                     theory=fixed["loss"], se=run["se"], config=config_label(cfg)))
            continue
        c = check_trained_loss(cfg, run, fixed, name, status, target="the allocated fixed point")
        comps.append(c)
        rows.append(headline_row(c, se=run["se"]))
        if status[0].startswith("left the allocated set"):
            left += 1
            best = best_decomposable(tuple(tasks), heads, L, sigma, seed + ctx.seed + 7, ctx.device,
                                     random_starts=p.search_starts, fit_elements=p.search_fit_elements,
                                     eval_prompts=p.search_eval_prompts)
            b = check_best_decomposable(cfg, run, best, fixed["loss"])
            comps.append(b)
            rows.append(headline_row(b, se=run["se"]))
    return Outcome(comps, rows, undecided=None if left else "no trained run left the allocated set",
                   details={"ran": f"claims 5-6's noisy runs {list(p.runs)} (seed offset {ctx.seed})",
                            "runs_left": left})


def findings(result) -> list:
    out, comps = [], result.details["comparisons"]
    for c in comparisons_named(result, "left allocation: trained loss vs best"):
        fixed = next((x for x in comps if x["config"] == c["config"] and "allocated fixed point" in x["name"]), None)
        verb = "sits at" if c["agrees"] else "does not reach"
        out.append(finding(result, "stops", "At {config}, the trained model leaves allocation (opposite-sign off-task "
                           "share {share}) for a superposition with held-out loss {loss}, below the allocated fixed "
                           "point {fixed}; it " + verb + " the best decomposable point of the same H, {best}.",
                           config=c["config"], share=c["details"]["allocation"]["opposite_sign_share"],
                           loss=(c["measured"], c["details"].get("run_se")),
                           fixed=fixed["predicted"] if fixed else None,
                           best=(c["predicted"], c["details"]["best"]["se"])))
    if not out:
        out.append(finding(result, "stops", "None of the {n} noisy runs left the allocated set.", n=len(comps)))
    return out


SPEC = ClaimSpec(
    id="boundary-left-allocation", kind="boundary",
    title="Boundary: trained models that leave allocation (label noise)",
    statement=("Where claims 5-6's trained models leave the allocated set, their loss is not above the allocated "
               "fixed point and equals the best decomposable point of the same H."),
    profiles=PROFILES, evaluate=evaluate, findings=findings, reads_sweep=True,
    estimate=lambda p: 12.0 * len(p.runs))
run = SPEC.run
