"""Where the paper's assumptions stop, on the exact finite-L reduced model: the merged
parametrisation, judged against theory's own account of its regime (``located``: measured, and
theory's account agrees; ``contradicted``: it disagrees; a measurement that cannot decide:
``undecided``).  Fewer heads than tasks: ``claims.boundary_fewer_heads``; the expansion's own
limits: ``claims.boundary_saturation``, ``claims.boundary_small_L``.

``boundary-merged-superposition`` (:func:`check_merged_superposition`): trained *merged*
(W, U directly) the exact reduced flow does not allocate; theory's account: the merged
metric does not vanish at the allocated point, where dL/dmu[h, j] != 0 for a head not
serving j (theory.task_allocation).  The superposition forms on a time scale ~ L (its
driving gradient there is (2/L) mu* Q (r + sigma^2)): short runs need short L.

"Serves several tasks" and "allocated" are numerics.evaluate's shares (SUPERPOSED_SHARE,
ALLOCATED_SHARE, argued there): docs/model.md's merged run has shares 1.8/3.42 = 0.53, its
factored run ~0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from claims.core import (Z_SE, ClaimSpec, Comparison, Outcome, config_label, finding, head_task_heatmap, headline_row,
                         perturbation, replace_fields, resolved)
from numerics.config import ProblemConfig
from numerics.engine import need
from numerics.experiments.probes import paired_difference
from numerics.evaluate import ALLOCATED_SHARE, SUPERPOSED_SHARE, allocation
from numerics.train import TrainConfig

PATTERNS = ("superposed", "allocated")


@dataclass(frozen=True)
class MergedProfile:
    tasks: tuple = (2, 2)      # block sizes r_i
    heads: int = 2             # H (the domain needs H >= 2, m >= 2)
    L: int = 64                # context length
    lr: float = 0.1            # GD step of the exact reduced flow
    time: float = 40.0         # flow time t_end
    batch: int = 512           # fresh prompts per step
    n_eval: int = 40000        # held-out Rao-Blackwellised prompts for the end points
    sigma: float = 0.0         # label noise


MERGED = {
    "tiny": MergedProfile(L=32, time=20.0, batch=256, n_eval=8000),
    "quick": MergedProfile(L=32),
    # docs/model.md's run: r = 4, m = H = 3, L = 256, batch 1024, lr 0.05
    "paper": MergedProfile(tasks=(4, 4, 4), heads=3, L=256, lr=0.05, time=150.0, batch=1024, n_eval=200000),
}


def _pattern_holds(shares: np.ndarray, pattern: str) -> bool:
    if pattern == "superposed":
        return bool(np.all(shares >= SUPERPOSED_SHARE))
    if pattern == "allocated":
        return bool(np.all(shares <= ALLOCATED_SHARE))
    raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")


def superposition_error(diff: float, se: float, share_merged, share_factored, predicted: dict,
                        bound: float = 0.0) -> float:
    """The one comparison of the merged boundary, for any prediction
    {"merged": pattern, "factored": pattern, "merged_lower": bool}: inf when a predicted
    pattern does not hold in the measured shares; otherwise how far the signed loss difference
    merged - factored is from the predicted side of ``bound`` (0: merged lower, or higher) by
    more than Z_SE standard errors (max(0, diff + Z_SE se - bound) if merged is predicted lower,
    else max(0, bound + Z_SE se - diff))."""
    if not (_pattern_holds(np.asarray(share_merged), predicted["merged"])
            and _pattern_holds(np.asarray(share_factored), predicted["factored"])):
        return math.inf
    return max(0.0, diff + Z_SE * se - bound) if predicted["merged_lower"] else max(0.0, bound + Z_SE * se - diff)


THEORY_MERGED = {"merged": "superposed", "factored": "allocated", "merged_lower": True}


def merged_needs(cfg, tcfg, n_eval: int) -> tuple:
    """(merged flow, factored flow, their end points' losses): the exact reduced flow trained with
    the merged and the factored metric from cfg's start on the same prompts (one named stream;
    cfg.param is overridden), both end points on the same ``n_eval`` held-out prompts.  Refused
    outside the domain (H = m >= 2) before any run."""
    if cfg.heads != cfg.m or cfg.m < 2:
        raise ValueError(f"the merged-superposition boundary needs heads == m >= 2 (one favoured head per task), got "
                         f"heads={cfg.heads}, m={cfg.m}")
    stream = ("merged vs factored", tuple(cfg.tasks), cfg.heads, cfg.L, float(cfg.sigma))
    merged, factored = (need("reduced_flow", cfg=cfg.replace(param=param), tcfg=tcfg, stream=stream)
                        for param in ("merged", "factored"))
    return merged, factored, need("paired_end_losses", first=merged, second=factored, cfg=cfg, n_eval=int(n_eval))


def check_merged_superposition(cfg, n_eval: int, merged, factored, losses) -> Comparison:
    """The exact reduced flow trained with the merged and the factored metric from the same
    start (``merged``, ``factored``: the flows of :func:`merged_needs`), both end points evaluated
    on the same held-out prompts (``losses``, (2, n_eval)).

    Measured: merged loss - factored loss (paired, with its standard error) and each head's
    off-task share.  Predicted (theory's account, docs/model.md): merged superposed (every share >=
    SUPERPOSED_SHARE), factored allocated (every share <= ALLOCATED_SHARE), merged lower
    beyond Z_SE paired standard errors (:func:`superposition_error`, tolerance 0).  The
    tolerance is the measurement's own noise (both losses are measured, none predicted).
    Perturbations, through the same function: "merged allocates too" (claim 4 read for merged
    weights) and "factored superposes too"."""
    diff, se = paired_difference(losses[0], losses[1])
    share_m = np.array(allocation(merged.omega, merged.mu).head_share)
    share_f = np.array(allocation(factored.omega, factored.mu).head_share)
    err = superposition_error(diff, se, share_m, share_f, THEORY_MERGED)
    perts = [perturbation(desc, superposition_error(diff, se, share_m, share_f, pred), 0.0, predicted=pred)
             for desc, pred in (("merged allocates too", {**THEORY_MERGED, "merged": "allocated"}),
                                ("factored superposes too", {**THEORY_MERGED, "factored": "superposed"}))]
    # one-sided (merged - factored below the bound 0); its resolving power is in loss units: how far below 0 a
    # predicted bound could lie and still be passed
    return resolved(Comparison(
        name=f"merged vs factored, tasks={list(cfg.tasks)}, H={cfg.heads}, L={cfg.L}",
        measured={"loss_merged": float(losses[0].mean()), "loss_factored": float(losses[1].mean()),
                  "difference": diff, "share_merged": share_m.tolist(), "share_factored": share_f.tolist()},
        predicted={"difference_below": 0.0, "share_merged": f">= {SUPERPOSED_SHARE}",
                   "share_factored": f"<= {ALLOCATED_SHARE}"},
        error=err, tolerance=0.0, side="not above",
        why=f"the difference must be negative beyond {Z_SE:g} standard errors of the paired loss difference on "
            f"{n_eval} held-out prompts ({Z_SE * se:.3g}), and each end point must show its predicted pattern",
        perturbations=perts,
        details={"config": cfg.to_dict(), "train": merged.train.to_dict(),
                 "merged": {"omega": np.round(merged.omega, 4).tolist(), "mu": np.round(merged.mu, 4).tolist()},
                 "factored": {"omega": np.round(factored.omega, 4).tolist(),
                              "mu": np.round(factored.mu, 4).tolist()},
                 "loss_ratio_factored_over_merged": float(losses[1].mean() / losses[0].mean()),
                 "se_difference": se}, config=config_label(cfg)),
        error=lambda m, p: superposition_error(diff, se, share_m, share_f, THEORY_MERGED, p["difference_below"]),
        units="absolute")


def _merged_case(ctx) -> tuple:
    """(cfg, tcfg) of the merged boundary at ctx's profile (the flows' prompt stream is their need's)."""
    p = ctx.p
    return (ProblemConfig(tasks=p.tasks, heads=p.heads, L=p.L, sigma=p.sigma, device=ctx.device),
            TrainConfig(lr=p.lr, time=p.time, batch=p.batch, records=21))


def plan_merged(ctx, results=None) -> list:
    cfg, tcfg = _merged_case(ctx)
    return list(merged_needs(cfg, tcfg, ctx.p.n_eval))


def compare_merged(ctx, results) -> Outcome:
    cfg, tcfg = _merged_case(ctx)
    details = {"ran": f"exact reduced flow, merged and factored, tasks={list(cfg.tasks)}, H={cfg.heads}, L={cfg.L}, "
                      f"sigma={cfg.sigma:g}",
               "domain": {"heads == m": cfg.heads == cfg.m, "m >= 2": cfg.m >= 2,
                          "why": "a superposition needs two heads, a share two tasks; with H > m the default init "
                                 "favours two heads equally on a task, which then stay tied by symmetry (a shared "
                                 "task, not allocation) in both parametrisations"}}
    comp = check_merged_superposition(cfg, ctx.p.n_eval, *(results[n] for n in merged_needs(cfg, tcfg, ctx.p.n_eval)))
    se = comp.details["se_difference"]
    rows = [headline_row(comp, "merged minus factored loss", theory=0.0, measured=comp.measured["difference"],
                         se=se, tolerance=Z_SE * se, side="not above"),
            headline_row(comp, "largest off-task share, factored (merged)",
                         theory=f"<= {ALLOCATED_SHARE} (>= {SUPERPOSED_SHARE})",
                         measured=[max(comp.measured["share_factored"]), min(comp.measured["share_merged"])],
                         side="two-sided")]
    figs = [head_task_heatmap(f"merged-superposition-{which}-{key}", f"{which}: final {key}[h, i]",
                              comp.details[which][key])
            for which in ("merged", "factored") for key in ("omega", "mu")]
    return Outcome([comp], rows, figs, details=details)


def findings_merged(result) -> list:
    c = result.details["comparisons"][0]
    m = c["measured"]
    return [finding(result, "beyond", "Trained merged, the exact reduced flow ends in a signed superposition (every "
                    "head's off-task share >= {smin}) at loss {lm}, below the factored flow's allocation {lf} from the "
                    "same start (difference {diff}).", smin=min(m["share_merged"]), lm=m["loss_merged"],
                    lf=m["loss_factored"], diff=(m["difference"], c["details"]["se_difference"]))]


def _merged_cannot(problem):
    tasks, heads = problem.get("tasks", (2, 2)), problem.get("heads", len(problem.get("tasks", (2, 2))))
    if heads != len(tasks) or len(tasks) < 2:
        return f"it needs heads == m >= 2 (one favoured head per task), got heads={heads}, m={len(tasks)}"
    return None


KEYS = ("tasks", "heads", "L", "sigma")
SPEC = ClaimSpec(
    id="boundary-merged-superposition", kind="boundary", title="Boundary: merged parametrisation finds a superposition",
    statement=("Trained merged, the flow ends in a signed superposition of heads with a lower loss than the allocated "
               "limit the factored flow reaches."),
    profiles=MERGED, plan=plan_merged, compare=compare_merged, resolve=lambda p, pr: replace_fields(p, pr, KEYS),
    fields=KEYS, cannot_run=_merged_cannot, findings=findings_merged)
