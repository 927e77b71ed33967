"""Where the large-L expansion stops: the saturation boundary on theory's own approximation,
judged against theory's account of the regime (``located``: measured and theory's account
agrees; ``contradicted``: it disagrees; a measurement that cannot decide: ``undecided``).  The
expansion's O(1/L) coefficient: ``claims.boundary_small_L``.

``boundary-saturation`` (:func:`check_saturation`): the expansion's Gaussian integrals diverge
for 2 omega^2 >= 1 while the exact loss stays finite, and its error grows toward that edge.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from claims.core import (Z_SE, ClaimSpec, Comparison, Figure, Outcome, Series, finding, headline_row, perturbation,
                         resolved)
from numerics.engine import need
from numerics.experiments import probes  # noqa: F401 -- registers the kinds this claim asks for
from theory import reduced_ode
from theory.reduced_ode import validity_edge

@dataclass(frozen=True)
class SaturationProfile:
    r: int = 16                # block size of the one head's one task
    L: int = 64                # context length
    omegas: tuple = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.68, 0.75, 0.9)   # scanned logit weights
    sigma: float = 0.0         # label noise
    n_eval: int = 40000        # Rao-Blackwellised prompts per point


SATURATION = {
    "tiny": SaturationProfile(omegas=(0.1, 0.3, 0.5, 0.8), n_eval=4000),
    "quick": SaturationProfile(),
    "paper": SaturationProfile(omegas=tuple(float(w) for w in np.round(np.linspace(0.05, 1.0, 20), 3)),
                               n_eval=400000),
}


def saturation_error(rows: list[dict], edge: float) -> tuple[float, float, float]:
    """The one comparison of the saturation boundary for a predicted validity edge (the omega
    beyond which the expansion is infinite): (error, growth, tolerance).  error = inf when
    the expansion is not finite exactly below the edge (rows with omega < edge finite with a
    finite relative error, rows beyond +inf) or the measured exact loss is not finite;
    otherwise max(0, Z_SE se - growth), growth = |relative error| at the largest kappa
    below the edge minus at the smallest (must exceed Z_SE of its standard error)."""
    below = [x for x in rows if x["omega"] < edge]
    finite_below = all(math.isfinite(x["expansion"]) and math.isfinite(x["relative_error"]) for x in below)
    inf_beyond = all(math.isinf(x["expansion"]) for x in rows if x["omega"] >= edge)
    exact_finite = all(math.isfinite(x["exact"]) for x in rows)
    if len(below) < 2 or not (finite_below and inf_beyond and exact_finite):
        return math.inf, math.nan, 0.0
    lo, hi = min(below, key=lambda x: x["kappa"]), max(below, key=lambda x: x["kappa"])
    growth = abs(hi["relative_error"]) - abs(lo["relative_error"])
    tol = Z_SE * math.hypot(hi["relative_error_se"], lo["relative_error_se"])
    return max(0.0, tol - growth), growth, tol


def saturation_need(r: int, L: int, omegas, sigma: float, n_eval: int, device="cpu"):
    """The exact loss of one head on one block along ``omegas`` (``numerics.experiments.probes``)."""
    return need("saturation_scan", r=int(r), L=int(L), omegas=tuple(float(w) for w in omegas), sigma=float(sigma),
                n_eval=int(n_eval), device=str(device))


def saturation_rows(scan: list[dict], r: int, L: int, sigma: float) -> list[dict]:
    """The scan's rows with theory's expansion at each (omega, mu) (reduced_ode.expansion_loss:
    +inf beyond its edge), its validity flag and its relative error against the exact loss."""
    rows = []
    for x in scan:
        om, mu = np.full((1, 1), x["omega"]), np.full((1, 1), x["mu"])
        with np.errstate(all="ignore"):
            exp_val = float(reduced_ode.expansion_loss(om, mu, (r,), L, sigma))
        loss, se = x["exact"], x["exact_se"]
        rows.append({"omega": x["omega"], "mu": x["mu"], "kappa": x["kappa"],
                     "valid": bool(reduced_ode.expansion_valid(om)), "exact": loss, "exact_se": se,
                     "expansion": exp_val, "relative_error": (exp_val - loss) / loss,
                     "relative_error_se": abs(exp_val) * se / loss ** 2 if math.isfinite(exp_val) else 0.0})
    return rows


def check_saturation(r: int, L: int, sigma: float, scan: list[dict]) -> Comparison:
    """Theory's account (theory.reduced_ode): the expansion's Gaussian integrals converge
    only while 2 omega^2 < 1 -- below the edge it is a finite number, beyond it +inf -- while
    the exact loss (measured, Monte Carlo: ``scan``, :func:`saturation_need`) is finite
    everywhere; the expansion's |relative error| against the measured exact loss grows with
    kappa toward the edge.  Compared by :func:`saturation_error` at theory's edge (tolerance:
    Z_SE standard errors of the growth).  Perturbation, through the same function: the edge at
    1/sqrt(6) (where the remainder's O(L^-2) coefficient diverges, ``expansion_reliable``) -- the
    expansion is finite beyond it."""
    rows = saturation_rows(scan, r, L, sigma)
    edge = validity_edge()
    err, growth, tol = saturation_error(rows, edge)
    wrong_edge = reduced_ode.OMEGA_RELIABLE
    p_err = saturation_error(rows, wrong_edge)[0]
    # resolving power of the edge: how far theory's edge may move before a scanned omega changes side of it
    return resolved(Comparison(
        name=f"saturation, r={r}, L={L}, sigma={sigma:g}", measured={"growth_of_relative_error": growth},
        predicted={"growth_of_relative_error": "> 0", "validity_edge_omega": edge},
        error=err, tolerance=0.0,
        why=f"the expansion finite exactly below theory's edge omega={edge:.4g} and the growth of its relative error "
            f"beyond {Z_SE:g} standard errors of the Monte-Carlo exact loss ({tol:.3g})",
        perturbations=[perturbation("validity edge at 6 omega^2 = 1 instead of 2 omega^2 = 1", p_err, 0.0,
                                    predicted=wrong_edge)],
        details={"r": r, "L": L, "sigma": sigma, "rows": rows, "growth_tolerance": tol, "edge": edge},
        config=f"one head, r={r} L={L} sigma={sigma:g}"),
        error=lambda m, p: saturation_error(rows, p["validity_edge_omega"])[0])


def plan_saturation(ctx, results=None) -> list:
    p = ctx.p
    return [saturation_need(p.r, p.L, p.omegas, p.sigma, p.n_eval, ctx.device)]


def compare_saturation(ctx, results) -> Outcome:
    p = ctx.p
    r, L, sigma = p.r, p.L, p.sigma
    comp = check_saturation(r, L, sigma, results[saturation_need(r, L, p.omegas, sigma, p.n_eval, ctx.device)])
    rows = comp.details["rows"]
    fig = Figure(name="saturation", title=f"Exact loss vs expansion, one block r={r}, L={L}",
                 xlabel="kappa = omega^2 d / log L", ylabel="loss (mu optimal for the exact loss)", yscale="log",
                 series=[Series("exact (Monte Carlo)", [x["kappa"] for x in rows], [x["exact"] for x in rows], "points"),
                         Series("expansion", [x["kappa"] for x in rows if x["valid"]],
                                [x["expansion"] for x in rows if x["valid"]], "line")],
                 spans=[{"x0": 0.5 * r / math.log(L), "x1": max(x["kappa"] for x in rows),
                         "label": "2 omega^2 >= 1: expansion invalid"}])
    head = [headline_row(comp, "growth of the expansion's relative error toward the edge", theory=0.0,
                         measured=comp.measured["growth_of_relative_error"],
                         tolerance=comp.details["growth_tolerance"], side="not below"),
            headline_row(comp, "validity edge omega: bracket [last finite, first +inf] of the expansion",
                         theory=comp.details["edge"],
                         measured=[max([x["omega"] for x in rows if math.isfinite(x["expansion"])], default=None),
                                   min([x["omega"] for x in rows if math.isinf(x["expansion"])], default=None)],
                         tolerance=0.0)]
    return Outcome([comp], head, [fig], details={
        "ran": f"one head on one block r={r} (the largest block of the problem), L={L}, sigma={sigma:g}, "
               f"omega in {list(p.omegas)}",
        "domain": "every omega: below theory's edge the expansion is compared, beyond it must be +inf"})


def resolve_saturation(p: SaturationProfile, problem: dict) -> SaturationProfile:
    """The problem's largest block, its L and sigma."""
    return replace(p, r=max(problem.get("tasks", (p.r,))), L=problem.get("L", p.L), sigma=problem.get("sigma", p.sigma))


def findings_saturation(result) -> list:
    c = result.details["comparisons"][0]
    rows, edge = c["details"]["rows"], c["details"]["edge"]
    below = [x for x in rows if x["omega"] < edge]
    worst = max(below, key=lambda x: x["kappa"]) if below else rows[0]
    return [finding(result, "stops", "The large-L expansion stops at 2 omega^2 = 1 (omega = {edge}): beyond it its "
                    "Gaussian integrals diverge while the exact loss stays finite ({exact} at omega = {w}); just "
                    "below, at kappa = {kappa}, it is off the exact loss by {rel} (relative).", edge=edge,
                    exact=(rows[-1]["exact"], rows[-1]["exact_se"]), w=rows[-1]["omega"], kappa=worst["kappa"],
                    rel=(worst["relative_error"], worst["relative_error_se"]))]


SPEC = ClaimSpec(
    id="boundary-saturation", kind="boundary", title="Boundary: saturation (omega^2 d >> log L)",
    statement=("Beyond 2 omega^2 < 1 the expansion is invalid (flagged, infinite); before, its error grows with "
               "omega^2 d / log L while the exact loss stays finite."),
    profiles=SATURATION, plan=plan_saturation, compare=compare_saturation, resolve=resolve_saturation,
    findings=findings_saturation, fields=("tasks", "L", "sigma", "heads"))
