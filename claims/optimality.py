"""Claim 7: the gradient-flow limit is within a constant factor of the best multi-head
softmax attention.

What is compared
----------------
At context length L:

- L*_GF(L): the loss of the gradient-flow limit, the allocated point (one head per task),
  minimised over the exact finite-L reduced loss (``numerics.exact_reduced.allocated_minimum``);
- L*_best(L): the best *decomposable* attention found by direct minimisation of the same exact
  loss (``numerics.exact_reduced.best_found_minimum``) over signed (omega, mu) with K >= 2 heads per task (and, in the larger profiles, with
  heads shared between tasks).  Its starts include the allocated point, so the search can only
  improve on it, and the linear-attention construction (two heads omega = +-eps, mu = -+1/(2 eps)),
  which SPEC.md identifies as the better model.

The measured constant is C(L) = L*_GF(L) / L*_best(L) (paired on one evaluation sample).  The
best found is an upper bound on the true best loss, so C(L) is a *lower bound* on the true
constant over decomposable models; non-decomposable models are not searched.

Theory (``theory.optimality``): as L -> inf, L*_GF ~ limit_multi / L and the linear-attention
construction gives sum_i r_i (r_i + 1 + sigma^2) / L, so the constant tends to

    C_inf = limit_multi / linear_attention_limit  (-> e as r grows; 3.29 at r = 4),

finite and bounded in r: the claim "within a constant factor" holds, and the constant is not 1.
Checks:

1. ``check_constant_limit``: C(L) over several L, fitted by a + k/L, extrapolates to C_inf
   (tolerance Z_SE standard errors + the extrapolation's systematic error).  Perturbations: C = 1 (exact
   optimality) and C growing like sqrt(L) must be rejected.
2. ``check_best_is_linear_attention``: L * L*_best(L) extrapolates to the linear-attention
   constant sum_i r_i (r_i + 1 + sigma^2).
3. ``check_constant_bounded``: theory's C_inf(r) stays bounded as r grows (tends to e).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from claims.base import ClaimResult, Figure, Series, no_progress, run_claim
from claims.common import Z_SE, Comparison, check_profile, comparisons_result, fit_limit, paired_ratio, perturbation
from numerics.exact_reduced import FIT_ELEMENTS, allocated_minimum, best_found_minimum, measure, one_thread
from theory.limiting_error import limit_multi
from theory.optimality import linear_attention_limit

CLAIM_ID = "optimality"
TITLE = "The gradient-flow limit is within a constant factor of the best attention"
STATEMENT = ("The loss of the gradient-flow limit is within a constant factor of the best multi-head "
             "softmax attention (searched here over signed decomposable weights); the constant is measured, "
             "not assumed to be 1.")


@lru_cache(maxsize=None)
def theory_constant(tasks, sigma: float) -> dict:
    gf, lin = float(limit_multi(tasks, sigma)), float(linear_attention_limit(tasks, sigma))
    return {"limit_multi": gf, "linear_attention_limit": lin, "constant": gf / lin}


@one_thread
def constant_rows(tasks, sigma: float, Ls: Sequence[int], seed: int, device="cpu", heads_per_task: int = 2,
                  shared_heads: int = 0, eval_elements: int = 2 ** 21, fit_elements: int = FIT_ELEMENTS,
                  progress=no_progress) -> list[dict]:
    """Per L: GF-limit and best-found minima on one paired evaluation sample, and C(L)."""
    rows = []
    for k, L in enumerate(Ls):
        progress(f"optimality at L={L}", k / len(Ls))
        s = seed + 1000 * k
        gf = allocated_minimum(tasks, L, sigma, s, device, fit_elements)
        best = best_found_minimum(tasks, L, sigma, s + 1, heads_per_task, shared_heads, device, fit_elements)
        n = max(256, eval_elements // (best.omega.shape[0] * int(L)))
        measure([gf, best], n, s + 2, device)
        C, se = paired_ratio(gf.per_prompt, best.per_prompt)
        rows.append({"L": int(L), "constant": C, "se": se, "gf": gf.summary(), "best": best.summary()})
    return rows


def check_constant_limit(tasks, sigma: float, rows: Sequence[dict]) -> Comparison:
    """C(L) -> C_inf = limit_multi / linear_attention_limit (weighted fit C = a + k/L;
    tolerance Z se(a) + |a - a_without_smallest_L|).  Perturbations: C = 1 (the limit is
    optimal) and C(L) ~ C(L_min) sqrt(L / L_min) at the largest L (a constant that grows
    with L, i.e. no constant factor)."""
    th = theory_constant(tuple(tasks), sigma)
    L = np.array([r["L"] for r in rows], float)
    C = np.array([r["constant"] for r in rows], float)
    se = np.array([r["se"] for r in rows], float)
    fit = fit_limit(L, C, se)
    tol = Z_SE * fit["a_se"] + fit["systematic"]
    err = abs(fit["a"] - th["constant"])
    i_max, i_min = int(np.argmax(L)), int(np.argmin(L))
    grow = C[i_min] * math.sqrt(L[i_max] / L[i_min])
    tol_grow = Z_SE * math.hypot(se[i_max], se[i_min] * math.sqrt(L[i_max] / L[i_min]))
    why = (f"{Z_SE:g} standard errors of the extrapolated constant (weighted fits C = a + k L^-p, p = 1 and 1/2, on "
           f"paired Monte-Carlo errors) plus the extrapolation's systematic error ({fit['systematic']:.3g})")
    return Comparison(
        name=f"optimality constant C_inf, tasks={list(tasks)}, sigma={sigma:g}",
        measured=fit["a"], predicted=th["constant"], error=err, tolerance=tol, why=why,
        perturbations=[
            perturbation("constant = 1 (the gradient-flow limit is optimal)", abs(fit["a"] - 1.0), tol, predicted=1.0),
            perturbation("constant grows like sqrt(L) (no constant factor)", abs(C[i_max] - grow), tol_grow,
                         predicted=grow, L=L[i_max])],
        details={"tasks": list(tasks), "sigma": sigma, "fit": fit, "theory": th,
                 "rows": [{k: v for k, v in r.items()} for r in rows]})


def check_best_is_linear_attention(tasks, sigma: float, rows: Sequence[dict]) -> Comparison:
    """L * L*_best(L) -> sum_i r_i (r_i + 1 + sigma^2) (the linear-attention construction),
    with the same fit and tolerance as claim 5's trend.  Perturbation: the best model is the
    allocated limit itself (L * L*_best -> limit_multi)."""
    th = theory_constant(tuple(tasks), sigma)
    L = np.array([r["L"] for r in rows], float)
    y = L * np.array([r["best"]["loss"] for r in rows])
    se = L * np.array([r["best"]["se"] for r in rows])
    fit = fit_limit(L, y, se)
    tol = Z_SE * fit["a_se"] + fit["systematic"]
    err = abs(fit["a"] - th["linear_attention_limit"])
    return Comparison(
        name=f"best found -> linear attention, tasks={list(tasks)}, sigma={sigma:g}",
        measured=fit["a"], predicted=th["linear_attention_limit"], error=err, tolerance=tol,
        why=f"{Z_SE:g} standard errors of the extrapolated L*loss plus the extrapolation's systematic error "
            f"({fit['systematic']:.3g})",
        perturbations=[perturbation("best = allocated limit", abs(fit["a"] - th["limit_multi"]), tol,
                                    predicted=th["limit_multi"])],
        details={"tasks": list(tasks), "sigma": sigma, "fit": fit, "L": L.tolist(), "L_times_loss": y.tolist()})


def check_constant_bounded(rs: Sequence[int] = (1, 2, 4, 10, 40, 100, 1000, 10000), sigma: float = 0.0) -> Comparison:
    """Theory's C_inf(r) for one block of size r is finite at every r and tends to e.

    Measured: the Richardson extrapolation (r_n C_n - r_{n-1} C_{n-1}) / (r_n - r_{n-1}) of the
    last two values (it removes the 1/r term of C = e + k/r + ...); predicted: e; tolerance:
    the size of the next order left in it, |C_n - C_{n-1}| r_{n-1}/r_n (the 1/r term at r_n
    times the ratio 1/r of consecutive orders).  Perturbation: a constant growing like log r,
    C(r_1) + log(r_n / r_1) (no constant factor)."""
    vals = np.array([theory_constant((int(r),), sigma)["constant"] for r in rs])
    r = np.asarray(rs, float)
    extrapolated = float((r[-1] * vals[-1] - r[-2] * vals[-2]) / (r[-1] - r[-2]))
    tol = abs(vals[-1] - vals[-2]) * r[-2] / r[-1]
    err = abs(extrapolated - math.e)
    grow = vals[0] + math.log(r[-1] / r[0])
    return Comparison(
        name=f"C_inf(r) bounded, tends to e (sigma={sigma:g})", measured=extrapolated, predicted=math.e,
        error=err if np.all(np.isfinite(vals)) else math.inf, tolerance=tol, why="the next order left in the Richardson extrapolation of the mpmath-exact "
                                     "sequence, |C_n - C_(n-1)| r_(n-1)/r_n",
        perturbations=[perturbation("constant grows like log r", abs(vals[-1] - grow), tol, predicted=grow)],
        details={"r": list(rs), "constant": vals.tolist(), "max": float(vals.max())})


PROFILE_GRIDS = {
    "tiny": {"cases": [((2,), 0.0)], "Ls": (64, 128, 256), "heads_per_task": 2, "shared_heads": 0,
             "eval_elements": 2 ** 18, "fit_elements": 2 ** 16},
    "quick": {"cases": [((4,), 0.0), ((2,), 0.5)], "Ls": (256, 1024, 4096), "heads_per_task": 2,
              "shared_heads": 0, "eval_elements": 2 ** 22, "fit_elements": 2 ** 18},
    # paper: the SPEC sizes r = 4 (m = 3) and r = 10, three heads per task, L up to 8192
    "paper": {"cases": [((4, 4, 4), 0.0), ((10,), 0.0), ((4, 4), 1.0)], "Ls": (512, 1024, 2048, 4096, 8192),
              "heads_per_task": 3, "shared_heads": 6, "eval_elements": 2 ** 24, "fit_elements": 2 ** 21},
}


def run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None) -> ClaimResult:
    """Claim 7 on a profile (``sweep`` is not used: the best model is found by direct
    minimisation, not by training)."""
    check_profile(profile)

    def body() -> ClaimResult:
        grid = PROFILE_GRIDS[profile]
        comps, series = [], []
        for k, (tasks, sigma) in enumerate(grid["cases"]):
            progress(f"optimality: tasks={list(tasks)} sigma={sigma:g}", k / len(grid["cases"]))
            rows = constant_rows(tasks, sigma, grid["Ls"], seed + 10_000 * k, device, grid["heads_per_task"],
                                 grid["shared_heads"], grid["eval_elements"], grid["fit_elements"])
            comps += [check_constant_limit(tasks, sigma, rows), check_best_is_linear_attention(tasks, sigma, rows)]
            Ls = [r["L"] for r in rows]
            th = theory_constant(tuple(tasks), sigma)
            lab = f"tasks={list(tasks)} sigma={sigma:g}"
            series += [Series(f"gradient-flow limit, {lab}", Ls, [r["gf"]["L_times_loss"] for r in rows], "points"),
                       Series(f"best found, {lab}", Ls, [r["best"]["L_times_loss"] for r in rows], "points"),
                       Series(f"theory limit_multi, {lab}", Ls, [th["limit_multi"]] * len(Ls), "dashed"),
                       Series(f"theory linear attention, {lab}", Ls, [th["linear_attention_limit"]] * len(Ls), "dashed")]
        comps.append(check_constant_bounded())
        fig = Figure(name="optimality-gf-vs-best", title="L * loss: gradient-flow limit against the best found",
                     xlabel="L", ylabel="L * loss", xscale="log", yscale="log", series=series)
        constants = {c.name: c.measured for c in comps if c.name.startswith("optimality constant")}
        progress("optimality: done", 1.0)
        return comparisons_result(
            CLAIM_ID, TITLE, STATEMENT, comps, [fig],
            {"profile": profile, "seed": seed, "constants": constants,
             "note": "the best model is searched over decomposable weights only; the measured constant "
                     "is a lower bound on the constant over all decomposable models"},
            short_why=True)

    return run_claim(CLAIM_ID, TITLE, STATEMENT, body)
