"""Where claims 5 and 6 stop: trained models that leave the allocated set, and where they go.

With label noise the factored flow of the full model does not stay at the allocated fixed
point (an off-task OV value of the opposite sign grows: the allocated point is a saddle at
finite L, ``boundary-saddle``).  Theory's account of the regime has two parts, each a
prediction that can fail: a superposition lowers the loss (the trained held-out loss is not
above the allocated fixed point, ``claims.core.check_trained_loss`` at claim 5's
tolerance), and the flow ends at the best decomposable point of the same H, signs free
(:func:`check_best_decomposable`, two-sided).

The runs are claims 5 and 6's own (same configuration, schedule and seed: taken from the run
cache or a sweep store, trained once per report): the seed of a run is its case's,
``numerics.engine.trained_run_seed`` of (tasks, sigma, L) at the report's seed, the name claims
5 and 6 give their runs.  A run that stayed allocated did not reach
the boundary: it is reported, not compared.  A run that left is compared with the best
decomposable point only once it has converged for that comparison
(``numerics.experiments.converged.converged_for``); the trained runs have not (they leave the
saddle along the superposition valley during their polish), so each is followed on D by the
exact finite-L reduced flow from its readout (``numerics.experiments.converged.continue_on_D``:
on D the full model's flow is the reduced flow, claims 1-2, and the run is on D when its
off-D part carries no loss beyond noise) until converged, within a stated budget of flow time;
a run that leaves D, or is still descending when the budget is spent, is undecided with that
reason.  Where each run ended is reported: on or off D, the readout's words, its loss against
linear attention's.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from claims.core import (Z_SE, ClaimSpec, Comparison, Outcome, Tolerance, check_trained_loss, compare,
                         comparisons_where, config_label, domain, finding, headline_row, noise_term, reported_row,
                         run_status, term, theory_need, trained_need)
from numerics.config import ProblemConfig
from numerics.engine import need
from numerics.experiments.converged import (PAPER_CONTINUATION, PAPER_SCHEDULE, QUICK_CONTINUATION, QUICK_SCHEDULE,
                                            TINY_SCHEDULE, ContinuationSchedule, TrainingSchedule, converged_for)
from theory.optimality import linear_attention_loss


@dataclass(frozen=True)
class LeftAllocationProfile:
    # (tasks, heads, L, sigma): claims 5 and 6's noisy runs (their seeds: numerics.engine.trained_run_seed)
    runs: tuple = (((3, 3), 2, 32, 0.5),)
    schedule: TrainingSchedule = field(default_factory=TrainingSchedule)
    search_starts: int = 0          # random starts of the decomposable search besides the allocated/merged ones
    search_fit_elements: int = 2 ** 17
    search_eval_prompts: int = 4096
    continuation: ContinuationSchedule = QUICK_CONTINUATION   # the reduced flow on D, and its budget


PROFILES = {
    # tiny: claim 5's first tiny run (noiseless, stays allocated): the pipeline, undecided by design
    "tiny": LeftAllocationProfile(runs=(((2, 2), 2, 32, 0.0),), schedule=TINY_SCHEDULE),
    "quick": LeftAllocationProfile(runs=(((3, 3), 2, 32, 0.5), ((3, 3), 2, 64, 0.5),
                                         ((3, 3, 3), 3, 32, 0.5), ((3, 3, 3), 3, 64, 0.5)),
                                   schedule=QUICK_SCHEDULE),
    "paper": LeftAllocationProfile(runs=tuple(((3, 3), 2, L, 0.5) for L in (64, 128, 256, 512)),
                                   schedule=PAPER_SCHEDULE, search_starts=2, search_fit_elements=2 ** 19,
                                   continuation=PAPER_CONTINUATION),
}


def end_tolerance(end, best, followed: bool = False) -> Tolerance:
    """The tolerance of the flow's converged end (the trained run itself, or ``followed``: its continuation on D)
    against the best decomposable point, fixed before comparing: Z_SE x sqrt(se_end^2 + se_best^2) + the end's step
    error (the trained run's SGD excess; for the continuation the residual scatter of its last window)."""
    return Tolerance((noise_term(math.hypot(end["se"], best.se), "the difference of the two losses"),
                      term("the continuation's last-window scatter" if followed else "the run's step error",
                           end["jitter"] if followed else end["step_error"])))


def check_best_decomposable(cfg: ProblemConfig, end, best, allocated_loss: float, followed: bool) -> Comparison:
    """Where the flow ended against the best decomposable point of the same H, signs free
    (``numerics.experiments.probes.best_decomposable``: a search, so its loss bounds the optimum
    from above): two-sided.  ``end``: the converged end of the flow, the trained run itself
    (its held-out loss) or, ``followed``, its continuation on D (the exact reduced loss at the
    end).  Tolerance, from the two measurements' own noise: Z_SE x sqrt(se_end^2 + se_best^2)
    + the end's step error (the trained run's SGD excess; for the continuation the residual
    scatter of its last window, what the last iterate's fluctuation may add).  Perturbation:
    the allocated fixed point as the prediction (must be rejected: a superposition that merely
    equals the allocated loss is not "somewhere else")."""
    return compare(f"left allocation: converged loss vs best decomposable point of the same H, tasks={list(cfg.tasks)}, "
                   f"L={cfg.L}, sigma={cfg.sigma:g}", end["loss"], best.loss,
                   end_tolerance(end, best, followed),
                   wrong=(("the allocated fixed point", allocated_loss),), config=config_label(cfg),
                   details={"role": "best decomposable", "se": end["se"], "followed_on_D": followed,
                            "allocation": end["allocation"],
                            "status": "left the allocated set",
                            "best": {"loss": best.loss, "se": best.se, "family": best.family, "omega": best.omega,
                                     "mu": best.mu}})


def ended(cfg: ProblemConfig, run, cont) -> dict:
    """Where a run that left the allocated set ended: on or off D, the readout's words
    (numerics.evaluate.allocation of the end point), its loss over optimally scaled linear
    attention's (theory.optimality.linear_attention_loss: what a signed superposition tends to
    as omega -> 0, reachable on every task only with H >= m + 1)."""
    end = cont if cont is not None and cont.on_D else run
    a = end["allocation"]
    words = ("a signed superposition (every task carried by heads of both signs)" if all(a["signed_superposed"]) else
             "a superposition" if a["superposition"] else "allocated" if a["allocated"] else "mixed")
    lin = linear_attention_loss(tuple(cfg.tasks), cfg.L, cfg.sigma)
    return {"on_D": bool(cont is None or cont.on_D), "residual": float(run["residual"]), "words": words,
            "omega": end["omega"], "mu": end["mu"], "loss": float(end["loss"]), "se": float(end["se"]),
            "linear_attention": lin, "over_linear": float(end["loss"]) / lin,
            "flow_time": float(cont.time) if cont is not None else 0.0}


def _case(p, k: int, device: str):
    """The k-th noisy run's configuration, its converged-run need, and its own searches' name."""
    tasks, heads, L, sigma = p.runs[k]
    cfg = ProblemConfig(tasks=tuple(tasks), heads=heads, L=L, sigma=sigma, device=device)
    return cfg, trained_need(cfg, p.schedule), (tuple(tasks), heads, L, sigma)


def best_need(p, cfg, case, device):
    """The best decomposable point of the run's H, signs free (``numerics.experiments.probes``)."""
    return need("best_decomposable", tasks=tuple(cfg.tasks), heads=cfg.heads, L=cfg.L, sigma=float(cfg.sigma),
                device=device, random_starts=p.search_starts, fit_elements=p.search_fit_elements,
                eval_prompts=p.search_eval_prompts, stream=("left allocation: best decomposable", *case))


def continuation_need(p, cfg, case, run_need, best):
    """The run followed on D by the exact reduced flow, converged for the comparison with ``best``."""
    return need("continue_on_D", cfg=cfg, run=run_need, schedule=p.continuation, best=best,
                stream=("left allocation: flow on D", *case))


def plan(ctx, results=None) -> list:
    """Per noisy run: its converged run and theory's fixed point; for a run that left the allocated
    set, the best decomposable point of its H; for one not converged for that comparison, its
    continuation on D.  Asked with no results (the estimate), every conditional need."""
    p, out = ctx.p, []
    for k in range(len(p.runs)):
        cfg, run_need, case = _case(p, k, ctx.device)
        out += [run_need, theory_need("exact_fixed_point", tuple(cfg.tasks), cfg.L, float(cfg.sigma))]
        if results is not None and run_need not in results:
            continue
        run = None if results is None else results[run_need]
        if run is not None and not run_status(cfg, run, domain(cfg))[0].startswith("left the allocated set"):
            continue
        best = best_need(p, cfg, case, ctx.device)
        out.append(best)
        if results is None or (best in results and not converged_for(run, end_tolerance(run, results[best]).value)):
            out.append(continuation_need(p, cfg, case, run_need, best))
    return out


def compare_results(ctx, results) -> Outcome:
    p = ctx.p
    comps, rows, left, decided, undecided, where = [], [], 0, 0, [], []
    for k in range(len(p.runs)):
        cfg, run_need, case = _case(p, k, ctx.device)
        tasks, L, sigma = cfg.tasks, cfg.L, cfg.sigma
        run = results[run_need]
        fixed = results[theory_need("exact_fixed_point", tuple(tasks), L, float(sigma))]
        status = run_status(cfg, run, domain(cfg))
        name = f"left allocation: trained loss vs allocated fixed point, tasks={list(tasks)}, L={L}, sigma={sigma:g}"
        label = config_label(cfg)
        if status[0] == "inside":
            rows.append(reported_row(name + " (stayed allocated: boundary not reached)", run["loss"],
                                     theory=fixed["loss"], se=run["se"], config=label))
            continue
        c = check_trained_loss(cfg, run, fixed, name, status, target="the allocated fixed point")
        c.details["role"] = "trained loss vs allocated fixed point"      # what the findings look it up by
        comps.append(c)
        rows.append(headline_row(c, se=run["se"]))
        if not status[0].startswith("left the allocated set"):
            continue
        left += 1
        best_n = best_need(p, cfg, case, ctx.device)
        best = results[best_n]
        tol = end_tolerance(run, best).value
        rows.append(reported_row(f"left allocation: trained run's loss still to lose vs tolerance / {Z_SE:g}",
                                 run["descent_left"], theory=tol / Z_SE, config=label))
        cont = None
        if converged_for(run, tol):
            end, followed = run, False
        else:
            cont = results[continuation_need(p, cfg, case, run_need, best_n)]
            end, followed = cont, True
        where.append({"config": label, "trained_converged": cont is None, "trained_descent_left": run["descent_left"],
                      "trained_tolerance": tol, "trained_loss": run["loss"], "trained_se": run["se"],
                      "best_loss": best.loss, "best_se": best.se,
                      "continuation": cont.to_dict() if cont is not None else None, **ended(cfg, run, cont)})
        if followed and not (cont.on_D and cont.converged):
            undecided.append(f"{label}: {cont.reason}")
            rows.append(reported_row(f"left allocation: flow on D at the budget vs best decomposable point, {label}",
                                     cont.loss, theory=best.loss, se=cont.se, config=label))
            continue
        b = check_best_decomposable(cfg, end, best, fixed["loss"], followed)
        b.details["where"] = where[-1]
        comps.append(b)
        rows.append(headline_row(b, se=end["se"]))
        decided += 1
    reason = None
    if not left:
        reason = "no trained run left the allocated set"
    elif not decided:
        reason = "no run that left the allocated set converged within the budget: " + "; ".join(undecided)
    return Outcome(comps, rows, undecided=reason,
                   details={"ran": f"claims 5-6's noisy runs {list(p.runs)} (report seed {ctx.seed})",
                            "runs_left": left, "decided": decided, "undecided_runs": undecided, "where": where,
                            "continuation": asdict(p.continuation)})


def findings(result) -> list:
    """One sentence per run that left the allocated set: where it was when trained, and where
    the flow took it (converged at, above or below the best decomposable point, off D, or still
    descending at the budget)."""
    out, comps = [], result.details["comparisons"]
    for w in result.details.get("where", []):
        c = next(iter(comparisons_where(result, config=w["config"], role="best decomposable")), None)
        fixed = next(iter(comparisons_where(result, config=w["config"], role="trained loss vs allocated fixed point")),
                     None)
        cont = w["continuation"]
        text = ("At {config}, the trained model leaves allocation for a superposition (held-out loss {trained}, below "
                "the allocated fixed point {fixed}"
                + ("" if cont is None else "; still falling: it could lose {left} more, against {tol} allowed")
                + "); " + ("by the end of its schedule" if cont is None else
                           "followed on D by the exact reduced flow for t = {t}") + ", it ")
        if c is not None:
            verb = "sits at" if c["agrees"] else ("stops above" if c["measured"] > c["predicted"] else "ends below")
            text += ("converges to {loss} as " + w["words"] + ", " + verb + " the best decomposable point of the same "
                     "H, {best}, at {lin} x linear attention's loss.")
        elif not w["on_D"]:
            text += "has left D (its off-D part carries loss: full model {trained}, on D {start}): undecided."
        else:
            text += ("is still descending at the budget, at {loss} as " + w["words"] + ", against the best "
                     "decomposable point {best}: undecided.")
        out.append(finding(result, "stops", text, config=w["config"], trained=(w["trained_loss"], w["trained_se"]),
                           fixed=fixed["predicted"] if fixed else None, left=w["trained_descent_left"],
                           tol=w["trained_tolerance"] / Z_SE, t=w["flow_time"], loss=(w["loss"], w["se"]),
                           best=(w["best_loss"], w["best_se"]), lin=w["over_linear"],
                           start=(cont or {}).get("start_loss")))
    if not out:
        out.append(finding(result, "stops", "None of the {n} noisy runs left the allocated set.", n=len(comps)))
    return out


SPEC = ClaimSpec(
    id="boundary-left-allocation", kind="boundary",
    title="Boundary: trained models that leave allocation (label noise)",
    statement=("Where claims 5-6's trained models leave the allocated set, their loss is not above the allocated "
               "fixed point, and the flow, followed until converged, ends at the best decomposable point of the same H."),
    profiles=PROFILES, plan=plan, compare=compare_results, findings=findings, reads_sweep=True)
