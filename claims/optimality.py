"""Claim 7: the gradient-flow limit is within a constant factor of the best multi-head softmax
attention -- measured at EQUAL numbers of heads.

C_H = loss(limit) / loss(best found), at one L for each H of ``theory.optimality.heads_list``:
the limit is the allocated point (claim 4) at its exact reduced minimiser; the best found is the
better of a shared-head signed decomposable search and full merged models from random starts
(``numerics.experiments.probes.candidates_at_heads``).  A search bounds the optimum from above,
so the measured C_H is a LOWER bound on the true constant; every start's C is kept (the spread).
Compared: C_H against ``theory.optimality.constant_bracket`` (inside ``constant_domain``; outside
it only the rigorous edges), C at 2m heads extrapolated in L against theory's C_inf, and a bridge
(the best decomposable point run as a full merged model has the loss the reduced estimator says).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from claims.core import (ClaimSpec, Comparison, Outcome, Tolerance, agreement, compare, comparisons_where, finding,
                         headline_row, lines_figure, noise_term, replace_fields, term, theory_need)
from numerics.engine import need
from numerics.experiments import probes
from numerics.evaluate import SUPERPOSED_SHARE, allocation, fit_limit
from theory import optimality as th_opt


@dataclass(frozen=True)
class OptimalityProfile:
    tasks: tuple = (2, 2)            # block sizes r_i of the H table
    sigma: float = 0.0               # label noise
    L: int = 64                      # context length of the H table
    heads: tuple = ("m", "m+1", "2m")  # H values (expressions in m, or integers)
    decomposable_starts: int = 2     # random signed starts of the shared-head search (+ structured ones)
    full_starts: int = 2             # random starts of the full merged model
    train_lr: float = 0.05           # GD step of the full model
    train_time: float = 60.0         # t_end (steps = time / lr)
    train_batch: int = 1024          # fresh prompts per step
    init_scale: float = 1.0          # scale of the random full start (weights ~ s0 / sqrt(d + m))
    fit_elements: int = 2 ** 19      # fit sample of the decomposable search (prompts x heads x L)
    eval_prompts: int = 4096         # evaluation sample of the exact reduced loss (paired)
    held_out_prompts: int = 8192     # fresh prompts for each trained model's loss
    limit_tasks: tuple = (2,)        # problem of the L -> inf extrapolation at 2m heads (() = skipped)
    limit_Ls: tuple = (256, 1024, 4096)
    limit_eval_elements: int = 2 ** 24  # evaluation elements per L (C's se ~0.14 at L = 4096, r = 2)
    limit_fit_elements: int = 2 ** 17
    extra: tuple = ()                # a researcher's basis/dtype/logit_scale for the full models (sorted items)


PROFILES = {
    "tiny": OptimalityProfile(tasks=(1, 2), L=32, decomposable_starts=1, full_starts=1, train_time=20.0,
                              train_batch=512, eval_prompts=2048, held_out_prompts=4096, fit_elements=2 ** 17,
                              limit_tasks=(), limit_Ls=()),
    # quick: 16384 paired evaluation prompts (4096 before): the constant at H = m + 1 (the headline) resolves 3 %
    # instead of 6 %; the evaluation is a few % of the claim's time (86 against 90 s CPU under load, within noise)
    # quick: full merged models at a 256-prompt batch (a quarter of the CPU of 1024): the batch sets only
    # their SGD excess ~ lr tr(Sigma) / 4B, their loss is measured on held_out_prompts fresh prompts.
    # At (2, 2), L = 64 (H = 3, 4; two starts each) the four losses at B = 512 lay within the
    # four at B = 1024 (0.263-0.365 against 0.261-0.379); at B = 256 (seed 0) 0.228-0.315 against
    # 0.233-0.338 at 512, every one >= 26 % above the best decomposable point's 0.18, where C is
    # decided to its ~1 % standard error: the full models are candidates that do not decide C here
    "quick": OptimalityProfile(eval_prompts=16384, train_batch=256),
    # paper: docs/model.md's blocks (4,4,4) at L = 256 (the paper's size), more starts, longer runs
    "paper": OptimalityProfile(tasks=(4, 4, 4), L=256, decomposable_starts=4, full_starts=4, train_time=120.0,
                               train_batch=2048, fit_elements=2 ** 21, eval_prompts=16384, held_out_prompts=32768,
                               limit_tasks=(4,), limit_Ls=(512, 1024, 2048, 4096, 8192),
                               limit_eval_elements=2 ** 26, limit_fit_elements=2 ** 20),
}


def search_need(p: OptimalityProfile, H: int, device: str = "cpu"):
    """The signed decomposable search with H shared heads at the profile's table (the limit and
    every decomposable candidate on one evaluation sample; ``probes.decomposable_search``)."""
    return need("decomposable_search", tasks=tuple(p.tasks), H=int(H), L=int(p.L), sigma=float(p.sigma),
                device=str(device), random_starts=p.decomposable_starts, fit_elements=p.fit_elements,
                eval_prompts=p.eval_prompts, stream=("candidates", H))


def full_start_needs(p: OptimalityProfile, H: int, device: str = "cpu") -> list:
    """The full merged models with H heads from the profile's random full starts (``probes.full_merged_start``)."""
    return [need("full_merged_start", tasks=tuple(p.tasks), H=int(H), L=int(p.L), sigma=float(p.sigma), start=k,
                 device=str(device), init_scale=float(p.init_scale), extra=tuple(p.extra), train_lr=p.train_lr,
                 train_time=p.train_time, train_batch=p.train_batch, held_out_prompts=p.held_out_prompts,
                 stream=("candidates", H)) for k in range(p.full_starts)]


def bridge_need(p: OptimalityProfile, H: int, device: str = "cpu"):
    """The search's best decomposable point run as a full merged model (``probes.best_as_full_model``)."""
    return need("best_as_full_model", search=search_need(p, H, device), n=p.held_out_prompts, device=str(device),
                stream=("best as full model", H))


def row_needs(p: OptimalityProfile, device: str = "cpu") -> list:
    """The constant at 2m heads at each L of the extrapolation (``probes.constant_row``)."""
    tasks, sigma = tuple(p.limit_tasks), float(p.sigma)
    return [need("constant_row", tasks=tasks, sigma=sigma, L=int(L), device=str(device),
                 eval_elements=p.limit_eval_elements, fit_elements=p.limit_fit_elements,
                 stream=("constant row", tasks, sigma, int(L))) for L in p.limit_Ls] if p.limit_tasks else []


def candidates(p: OptimalityProfile, H: int, results, device: str = "cpu") -> dict:
    """The candidates at H (``probes.candidates_at_heads``) from the plan's results."""
    return probes.candidates_at_heads(results[search_need(p, H, device)],
                                      [results[n] for n in full_start_needs(p, H, device)])


def bracket_error(C: float, low: float, high: float) -> float:
    """Distance of C from the interval [low, high] (0 inside)."""
    return max(0.0, low - C, C - high)


def check_constant_at_heads(cand: dict, bracket: dict, dom: dict) -> Comparison:
    """C_H (best candidate) against theory's bracket (``theory.optimality.constant_bracket``).
    Tolerance: Z_SE standard errors of C (paired with the limit for a decomposable best,
    independent for a trained full model) plus the quadrature's stated error of the allocated
    loss; fixed before the comparison.  Perturbations, through the same bracket test:
    H <= m "reaches linear attention" (the bracket closed at allocated/linear), H >= m + 1
    "allocation is optimal" (the bracket closed at 1).  Outside the domain: only the edges
    that stay rigorous (C >= 1 where H >= m; C <= allocated/linear where H <= m cannot reach
    linear attention and L is large), no perturbation."""
    H, best = cand["H"], cand["best"]
    C, se = best["C"], best["C_se"]
    tol = Tolerance((noise_term(se, "C"), term("the quadrature error of the allocated loss",
                                               bracket["allocated_error"] / bracket["linear"])))
    low, high = bracket["low"], bracket["high"]
    wrong = []
    if not dom["inside"]:
        low = 1.0 if dom["heads_at_least_m"] else 0.0
        high = bracket["high"] if (dom["L_large"] and not bracket["reaches_linear"]) else math.inf
    elif bracket["reaches_linear"]:
        wrong = [("allocation is optimal (C = 1)", [1.0, 1.0])]
    else:
        wrong = [(f"H = {H} reaches linear attention (C = allocated/linear)", [bracket["high"]] * 2)]
    return compare(
        f"constant at H = {H}, tasks={cand['tasks']}, L={cand['L']}, sigma={cand['sigma']:g}", C, [low, high], tol,
        wrong=wrong,
        error=lambda C, edges: bracket_error(C, *edges), side="two-sided" if math.isfinite(high) else "not below",
        config=f"tasks={tuple(cand['tasks'])} H={H} L={cand['L']} sigma={cand['sigma']:g}",
        details={"bracket": bracket, "domain": dom, "best": best, "spread": cand["spread"], "starts": cand["starts"],
                 "candidates": cand["candidates"], "allocated": cand["allocated"]})


def check_best_as_full_model(cand: dict, bridge: dict) -> Comparison:
    """Bridge: the best decomposable point (omega, mu), built as a full merged model, has on
    fresh whole prompts the loss the exact reduced estimator gave it (``bridge``:
    ``probes.best_as_full_model``; tolerance Z_SE standard errors of the difference of the two
    independent estimates): the candidate is a genuine H-head softmax attention.  Perturbation:
    the reduced loss of the same point with its logits doubled, (2 omega, mu), on fresh reduced
    prompts (a wrong logit scale)."""
    fm, tasks = cand["best_decomposable"], tuple(cand["tasks"])
    est, doubled = bridge["full_model"], bridge["doubled"]
    tol = Tolerance((noise_term(math.hypot(est.se, fm.se), "the difference of two independent Monte-Carlo estimates"),))
    return compare(
        f"best decomposable point as a full model, H = {cand['H']}", est.mean, fm.loss, tol,
        wrong=[("logits doubled: the reduced loss at (2 omega, mu)", doubled)],
        config=f"tasks={tasks} H={cand['H']} L={cand['L']} sigma={cand['sigma']:g}",
        details={"full_model": asdict(est), "reduced": {"loss": fm.loss, "se": fm.se},
                 "omega": fm.omega.tolist(), "mu": fm.mu.tolist()})


def check_constant_limit(tasks, sigma: float, rows, limit_multi: float) -> Comparison:
    """C(L) at 2m heads (``probes.constant_row`` at each L), fitted by a + c L^-p (p = 1, 1/2),
    extrapolates to theory's C_inf = limit_multi / linear_attention_limit (F of claim 5;
    ``limit_multi``: theory.limiting_error.limit_multi at (tasks, sigma)).  Tolerance Z_SE se(a)
    + the extrapolation's systematic error.  Perturbations: C = 1; C_inf off by the factor
    e/C_inf (the large-r value e used at this r)."""
    C_inf = limit_multi / th_opt.linear_attention_limit(tasks, sigma)
    fit = fit_limit(np.array([r["L"] for r in rows], float), [r["constant"] for r in rows], [r["se"] for r in rows])
    tol = Tolerance((noise_term(fit["a_se"], "the extrapolated constant"),
                     term("the extrapolation's systematic error", fit["systematic"])))
    return compare(
        f"constant at 2m heads as L -> inf, tasks={list(tasks)}, sigma={sigma:g}", fit["a"], C_inf, tol,
        wrong=[("constant = 1", 1.0), ("constant = e (the large-r value)", math.e)],
        config=f"tasks={tuple(tasks)} H={2 * len(tasks)} L->inf sigma={sigma:g}",
        details={"role": "constant limit", "fit": fit, "rows": rows, "C_inf": C_inf})


def heads_of(p: OptimalityProfile) -> list[int]:
    """The H table: the profile's expressions at m (``theory.optimality.heads_list``)."""
    return th_opt.heads_list(p.heads, len(p.tasks))


def plan(ctx, results=None) -> list:
    """Per H: the search, the full merged starts, the bridge and theory's bracket; the constant's
    rows over L with theory's limit."""
    p, out = ctx.p, []
    tasks, L, sigma = tuple(p.tasks), int(p.L), float(p.sigma)
    for H in heads_of(p):
        out += [search_need(p, H, ctx.device), *full_start_needs(p, H, ctx.device), bridge_need(p, H, ctx.device),
                theory_need("constant_bracket", tasks, H, L, sigma)]
    if p.limit_tasks and p.limit_Ls:
        out += row_needs(p, ctx.device) + [theory_need("limit_multi", tuple(p.limit_tasks), sigma)]
    return out


def table_row(H: int, c: Comparison, cand: dict, dom: dict) -> dict:
    """The row of ``details["constant_against_H"]`` at H: the constant against its bracket, the
    candidates' spread and the best decomposable point found."""
    fm = cand["best_decomposable"]
    return {"H": H, "C": c.measured, "se": cand["best"]["C_se"], "bracket": c.predicted, "agrees": c.agrees,
            "tolerance": c.tolerance, "inside": dom["inside"],
            "best_kind": cand["best"]["kind"], "spread": cand["spread"], "starts": cand["starts"],
            "best_decomposable": {"loss": fm.loss, "se": fm.se, "omega": fm.omega.tolist(),
                                  "mu": fm.mu.tolist(), "linear": c.details["bracket"]["linear"],
                                  "signed_superposed": list(allocation(fm.omega, fm.mu).signed_superposed)}}


def compare_results(ctx, results) -> Outcome:
    """Claim 7: per H the constant against theory's bracket and the bridge; the L -> inf row."""
    p = ctx.p
    tasks, L, sigma, m = tuple(p.tasks), int(p.L), float(p.sigma), len(p.tasks)
    Hs = heads_of(p)
    comps, rows, doms, table = [], [], {}, []
    for H in Hs:
        doms[f"H={H}"] = dom = th_opt.constant_domain(tasks, H, L, sigma)
        cand = candidates(p, H, results, ctx.device)
        c = check_constant_at_heads(cand, results[theory_need("constant_bracket", tasks, H, L, sigma)], dom)
        name = {2 * m: "constant at H = 2m", m + 1: "constant at H = m+1", m: "constant at equal heads"}.get(
            H, f"constant at H = {H}")
        b = check_best_as_full_model(cand, results[bridge_need(p, H, ctx.device)])
        comps += [c, b]
        rows += [headline_row(c, name, theory=c.predicted, se=cand["best"]["C_se"]),
                 headline_row(b, f"bridge: best decomposable point as a full model, H = {H}",
                              se=b.details["full_model"]["se"])]
        table.append(table_row(H, c, cand, dom))
    if p.limit_tasks and p.limit_Ls:
        c = check_constant_limit(tuple(p.limit_tasks), sigma, [results[n] for n in row_needs(p, ctx.device)],
                                 results[theory_need("limit_multi", tuple(p.limit_tasks), sigma)])
        comps.append(c)
        rows.append(headline_row(c, "constant at 2m heads as L -> inf", se=c.details["fit"]["a_se"]))
    # the headline: the constant at H = m + 1, where theory predicts a value (allocated / linear: the bracket
    # closes); at equal heads theory gives only the bracket [1, allocated / linear], whose resolving power is its
    # width.  Without an H >= m + 1 row, the first row of the table.
    closed = [c for c in comps if c.name.startswith("constant at H =") and c.details.get("bracket", {}).get(
        "reaches_linear") and c.details.get("domain", {}).get("inside")]
    table_rows = [c for c in comps if c.name.startswith("constant at H =")]
    head = (closed or table_rows or comps or [None])[0]
    fig = lines_figure("optimality-constant-against-H", f"constant against H, tasks={list(tasks)}, L={L}",
                       [("measured (best found)", Hs, [t["C"] for t in table], "points"),
                        ("theory: upper edge", Hs, [t["bracket"][1] for t in table], "dashed"),
                        ("theory: lower edge", Hs, [t["bracket"][0] for t in table], "dashed")],
                       xlabel="H", ylabel="C_H = loss(limit) / loss(best found)")
    return Outcome(comps, rows, [fig], short_why=True, headline_comparison=head.name if head else None, details={
        "domain": doms, "constant_against_H": table,
        "ran": {"tasks": list(tasks), "L": L, "sigma": sigma, "heads": Hs, "problem": ctx.problem, "profile": asdict(p),
                "models": "the limit: allocated point (exact reduced estimator); candidates: decomposable points "
                          "with shared heads and full MERGED models (the best model is searched over free W, U)"},
        "note": "C_H is measured against the best found (a search bounds the optimum from above), so it is a lower "
                "bound on the true constant; the spread over starts is in constant_against_H"})


def findings(result) -> list:
    """Per H the constant with its bracket; the L -> inf constant; and (beyond the paper) what
    the best decomposable attention found is at the largest H: a signed superposition whose
    loss approaches linear attention's."""
    out, table, ran = [], result.details.get("constant_against_H", []), result.details.get("ran", {})
    for t in table:
        out.append(finding(result, agreement(t),
                           "With H = {H} heads (tasks {tasks}, L = {L}) the gradient-flow limit's loss is C = {C} "
                           "times the loss of the best H-head attention found (a lower bound on the constant), "
                           + ("within" if t["agrees"] else "outside") + " theory's bracket [{low}, {high}] (tolerance "
                           "{tol})" + ("" if t["inside"] else ", outside the bracket's domain: its rigorous edges only")
                           + ".", H=t["H"], tasks=str(tuple(ran.get("tasks", ()))), L=ran.get("L"),
                           C=(t["C"], t["se"]), low=t["bracket"][0], high=t["bracket"][1], tol=t["tolerance"]))
    for c in comparisons_where(result, role="constant limit"):
        out.append(finding(result, agreement(c), "At 2m heads the constant extrapolates to {a} as L -> inf, against "
                           "theory's C_inf = {C}.", a=(c["measured"], c["details"]["fit"]["a_se"]), C=c["predicted"]))
    if table:
        t = table[-1]
        bd = t["best_decomposable"]
        om, mu = np.abs(np.asarray(bd["omega"], float)), np.abs(np.asarray(bd["mu"], float))
        serving = mu >= SUPERPOSED_SHARE * mu.max(axis=0)          # the heads that carry each task
        out.append(finding(
            result, "beyond", "The best decomposable attention found with H = {H} heads is "
            + ("a signed superposition" if all(bd["signed_superposed"]) else "not a signed superposition")
            + " (heads of both signs on every task, their OV values cancelling to {cancel} of the largest; largest "
            "|omega| of a head carrying a task {om}) with loss {loss}, {ratio} times linear attention's {lin}: not the "
            "allocated limit, but a superposition tending to linear attention.", H=t["H"],
            om=float(np.max(om[serving])),
            cancel=float(np.max(np.abs(np.sum(bd["mu"], axis=0)) / mu.max(axis=0))),
            loss=(bd["loss"], bd["se"]), ratio=bd["loss"] / bd["linear"], lin=bd["linear"]))
    return out


def resolve(p: OptimalityProfile, problem: dict) -> OptimalityProfile:
    """The researcher's tasks, L, sigma for the table; H = its heads next to m (equal heads);
    init_scale, basis, dtype, logit_scale for the full models."""
    q = replace(replace_fields(p, problem, ("tasks", "L", "sigma", "init_scale")),
                extra=tuple(sorted((k, v) for k, v in problem.items() if k in ("basis", "dtype", "logit_scale"))))
    return replace(q, heads=tuple(sorted({int(problem["heads"]), len(q.tasks)}))) if "heads" in problem else q


SPEC = ClaimSpec(
    id="optimality",
    paper="the limit model is within a constant factor of the best multi-head softmax attention",
    title="The gradient-flow limit is within a constant factor of the best attention with as many heads",
    statement=("The loss of the gradient-flow limit is within a constant factor of the best multi-head softmax "
               "attention with the same number of heads H; the constant is measured against H = m, m + 1, 2m "
               "(signed decomposable points with shared heads, and full merged models from random starts)."),
    profiles=PROFILES, plan=plan, compare=compare_results, resolve=resolve, findings=findings,
    fields=("tasks", "heads", "L", "sigma", "init_scale", "logit_scale", "basis", "dtype"))
