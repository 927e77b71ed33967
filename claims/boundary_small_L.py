"""Where the large-L expansion stops: its O(1/L) coefficient at small L, a boundary on theory's
own approximation, judged against theory's account of the regime (``located``: measured and
theory's account agrees; ``contradicted``: it disagrees; a measurement that cannot decide:
``undecided``).  The expansion's saturation edge: ``claims.boundary_saturation``.

``boundary-small-L`` (:func:`check_expansion_coefficient`, :func:`check_measured_exact_loss`):
the expansion's O(1/L) coefficient, from the gap expansion - exact loss at theory's allocated
point along L (theory.exact's quadrature; numerics' Monte Carlo where it resolves the gap).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from claims.core import (Z_SE, ClaimSpec, Comparison, Figure, Outcome, Series, Tolerance, compare, comparisons_where,
                         finding, headline_row, perturbation, term, theory_need)
from numerics.engine import need
from numerics.experiments import probes  # noqa: F401 -- registers the kinds this claim asks for
from theory.task_allocation import local_exponent

@dataclass(frozen=True)
class SmallLProfile:
    blocks: tuple = (3, 10)                       # block sizes r (one allocated task each)
    sigma: float = 0.0                            # label noise
    L_exact: tuple = (4096, 16384, 65536, 262144)   # theory.exact quadrature ladder (factor 4)
    L_mc: tuple = (64, 256)                       # Rao-Blackwellised Monte Carlo, where it resolves the gap
    mc_elements: int = 2 ** 23                    # prompts x L x m per Monte-Carlo point


SMALL_L = {
    "tiny": SmallLProfile(blocks=(4,), L_exact=(4096, 16384, 65536), L_mc=(64,), mc_elements=2 ** 20),
    "quick": SmallLProfile(),
    "paper": SmallLProfile(blocks=(1, 2, 3, 4, 10), L_exact=(1024, 4096, 16384, 65536, 262144, 1048576),
                           L_mc=(16, 64, 256, 1024), mc_elements=2 ** 27),
}

EXPONENT_RIGHT, EXPONENT_WRONG = -2.0, -1.0
"""Local exponents of the gap (expansion - exact) in L: a right O(1/L) coefficient leaves the
O(L^-2) remainder (-2), a wrong one its own error c/L (-1)."""
EXPONENT_TOLERANCE = 0.5 * abs(EXPONENT_RIGHT - EXPONENT_WRONG)
"""Half the distance between the two exponents theory allows: the measured local exponent is
assigned to the nearer one.  Fixed by theory alone (it is neither the measured discrepancy nor
depends on which prediction is tested); the local exponent's own error (quadrature) is added."""


def trend_error(steps: list[float], se: float, direction: float) -> float:
    """The comparison outside the O(L^-2) domain, for a predicted direction of the local
    exponents along the L ladder: direction -1 ('steepening', theory: the gap is o(1/L) and
    its exponent moves away from -1 as L grows, with the top exponent below -1), +1
    ('flattening toward -1', a wrong coefficient: gap -> c/L).  Returns how far the measured
    steps go against the predicted direction (<= 0: agrees; compared with tolerance 0), Z_SE
    quadrature errors included."""
    diffs = np.diff(np.asarray(steps, float))
    against = float(np.max(-direction * diffs)) if diffs.size else -math.inf
    if direction < 0:
        against = max(against, steps[-1] - EXPONENT_WRONG)
    return against + Z_SE * se


def ladder_need(r: int, Ls, sigma: float):
    """theory.task_allocation.gap_ladder of one block r at the context lengths ``Ls``."""
    return theory_need("gap_ladder", int(r), tuple(int(L) for L in Ls), float(sigma))


def coefficient_need(r: int, Ls, sigma: float):
    """The gap ladder of :func:`check_expansion_coefficient` (``Ls`` sorted; at least two)."""
    Ls = sorted(int(L) for L in Ls)
    if len(Ls) < 2:
        raise ValueError(f"the local exponent needs at least two context lengths, got {Ls}")
    return ladder_need(r, Ls, sigma)


def monte_carlo_need(r: int, Ls, sigma: float, mc_elements: int, device="cpu"):
    """numerics' Monte Carlo of the exact loss at theory's allocated points of the ladder at ``Ls``."""
    return need("monte_carlo_losses", points=ladder_need(r, Ls, sigma), r=int(r), sigma=float(sigma),
                mc_elements=int(mc_elements), device=str(device), stream=("monte-carlo exact loss", r, sigma))


def check_expansion_coefficient(r: int, sigma: float, rows: list[dict]) -> Comparison:
    """Does the expansion carry the exact loss's O(1/L) coefficient?  Measured: the local
    exponents of the gap along the L ladder ``rows`` (theory.task_allocation.gap_ladder at
    increasing L, :func:`coefficient_need`; theory.exact: deterministic, error ~1e-11).

    Domain (theory's own remainder analysis, ``expansion_reliable``): 6 omega*^2 < 1 at the
    top two L, where the remainder is O(L^-2).  Inside: the top exponent p is compared with -2
    (EXPONENT_RIGHT), |p + 2| against :data:`EXPONENT_TOLERANCE` + Z_SE se; perturbation
    through the same comparison: a wrong coefficient (-1).  An inconclusive p (within Z_SE se
    of the midpoint) lies within tolerance of both -2 and -1, so the wrong-coefficient
    perturbation is not rejected and the verdict is undecided, not pass.  Outside
    (a finding; theory gives o(1/L) only): :func:`trend_error` -- the exponents steepen along
    the ladder and the top one is below -1; perturbation through it: they flatten toward -1.
    The expansion must be finite (2 omega*^2 < 1) at the top two L, else ValueError."""
    Ls = [x["L"] for x in rows]
    if not rows[-1]["valid"] or not rows[-2]["valid"]:
        raise ValueError(f"theory's allocated point at L={Ls[-2]}, {Ls[-1]} (omega={rows[-1]['omega']:.3g}) is outside "
                         "the expansion's domain (2 omega^2 >= 1): no O(1/L) coefficient to check")
    p, se = local_exponent(rows)
    steps = [local_exponent(rows[k:k + 2])[0] for k in range(len(rows) - 1)]
    in_domain = rows[-1]["reliable"] and rows[-2]["reliable"]
    details = {"role": "gap exponent", "r": r, "sigma": sigma, "rows": rows, "exponent_se": se,
               "local_exponents": steps, "in_domain": in_domain, "relative_gap_at_top": rows[-1]["gap"] / rows[-1]["exact"],
               "L_span": [Ls[-2] if in_domain else Ls[0], Ls[-1]]}     # the L of the comparison: the top two, or all
    if in_domain:
        return compare(f"gap exponent, r={r}, sigma={sigma:g}, L={Ls[-2]}..{Ls[-1]}", p, EXPONENT_RIGHT,
                       Tolerance((term("half the distance between the exponents of a right (-2) and a wrong (-1) "
                                       "O(1/L) coefficient", EXPONENT_TOLERANCE),
                                  term(f"{Z_SE:g} quadrature errors of the exponent ({se:.2g})", Z_SE * se))),
                       wrong=(("wrong O(1/L) coefficient (gap ~ 1/L)", EXPONENT_WRONG),), details=details,
                       units="absolute")
    if len(steps) < 2:
        raise ValueError(f"outside the O(L^-2) domain (6 omega*^2 >= 1 at r={r}) the trend of the local exponent "
                         f"needs at least three context lengths, got {Ls}")
    return Comparison(
        name=f"gap exponent trend (o(1/L) domain), r={r}, sigma={sigma:g}, L={Ls[0]}..{Ls[-1]}",
        measured=steps, predicted="steepening, below -1", error=trend_error(steps, se, -1.0), tolerance=0.0,
        why=f"outside 6 omega*^2 < 1 theory gives o(1/L) only: every step of the local exponent must steepen and "
            f"the top one lie below -1, beyond {Z_SE:g} quadrature errors ({Z_SE * se:.2g})",
        perturbations=[perturbation("wrong O(1/L) coefficient (exponents flatten toward -1)",
                                    trend_error(steps, se, +1.0), 0.0, predicted="flattening toward -1")],
        details=details)


def check_measured_exact_loss(r: int, sigma: float, ladder: list[dict], mc: list[dict]) -> Comparison:
    """numerics' Rao-Blackwellised Monte Carlo of the exact loss at theory's allocated point
    (``mc``, :func:`monte_carlo_need`) against theory.exact's quadrature there (``ladder``), at
    the small L where the Monte Carlo resolves the expansion's gap.  error = max over L of
    |MC - prediction| / (Z_SE se + quadrature error), tolerance 1 (the MC's own noise).
    Perturbation through the same function: the expansion as the exact loss (must be rejected:
    the MC resolves the gap)."""
    rows = [{**x, **y} for x, y in zip(ladder, mc)]

    def error(measured, predicted):
        return max(abs(m - q) / (Z_SE * x["mc_se"] + x["exact_error"]) for m, q, x in zip(measured, predicted, rows))

    return compare(f"Monte-Carlo exact loss vs quadrature, r={r}, sigma={sigma:g}, L={[x['L'] for x in rows]}",
                   [x["mc"] for x in rows], [x["exact"] for x in rows], 1.0,
                   f"{Z_SE:g} Monte-Carlo standard errors plus the quadrature's error bound at every L", error=error,
                   wrong=(("the expansion is the exact loss", [x["expansion"] for x in rows]),),
                   details={"r": r, "sigma": sigma, "rows": rows}, config=f"one head, r={r} sigma={sigma:g}")


def plan_small_L(ctx, results=None) -> list:
    """Per block: theory's gap ladder at L_exact and at L_mc, and the Monte Carlo at L_mc."""
    p = ctx.p
    return [n for r in p.blocks for n in (coefficient_need(r, p.L_exact, p.sigma), ladder_need(r, p.L_mc, p.sigma),
                                          monte_carlo_need(r, p.L_mc, p.sigma, p.mc_elements, ctx.device))]


def compare_small_L(ctx, results) -> Outcome:
    p = ctx.p
    blocks, sigma, L_mc = p.blocks, p.sigma, p.L_mc
    comps, series, head, dom = [], [], [], {}
    for r in blocks:
        coef = check_expansion_coefficient(r, sigma, results[coefficient_need(r, p.L_exact, sigma)])
        mc = check_measured_exact_loss(r, sigma, results[ladder_need(r, L_mc, sigma)],
                                       results[monte_carlo_need(r, L_mc, sigma, p.mc_elements, ctx.device)])
        comps += [coef, mc]
        top = coef.details["rows"][-1]
        dom[f"r={r}"] = {"valid (2 omega*^2 < 1)": top["valid"],
                         "reliable (6 omega*^2 < 1): judged against -2": top["reliable"], "omega*": top["omega"]}
        head += [headline_row(coef, "local exponent of the gap, r={}, L={}..{}".format(r, *coef.details["L_span"])
                                    + ("" if coef.details["in_domain"] else " (o(1/L) domain: steepening)"),
                              theory=EXPONENT_RIGHT if coef.details["in_domain"] else EXPONENT_WRONG,
                              measured=coef.details["local_exponents"][-1], se=coef.details["exponent_se"],
                              tolerance=coef.tolerance if coef.details["in_domain"] else 0.0,
                              side="two-sided" if coef.details["in_domain"] else "not above"),
                 headline_row(mc, f"Monte-Carlo / quadrature exact loss, r={r}, L={max(L_mc)}",
                              theory=mc.predicted[-1], measured=mc.measured[-1], se=mc.details["rows"][-1]["mc_se"],
                              tolerance=Z_SE * mc.details["rows"][-1]["mc_se"])]
        rows = sorted(coef.details["rows"] + mc.details["rows"], key=lambda x: x["L"])
        series += [Series(f"|expansion - exact|, r={r}", [x["L"] for x in rows], [abs(x["gap"]) for x in rows],
                          "points"),
                   Series(f"slope -2 through the last point, r={r}", [x["L"] for x in rows],
                          [abs(rows[-1]["gap"]) * (rows[-1]["L"] / x["L"]) ** 2 for x in rows], "dashed")]
    fig = Figure(name="small-L", title="Gap between the expansion and the exact loss at theory's allocated point",
                 xlabel="L", ylabel="|expansion - exact|", xscale="log", yscale="log", series=series,
                 caption="A right O(1/L) coefficient leaves a gap parallel to the dashed L^-2 line at large L.")
    return Outcome(comps, head, [fig], details={
        "ran": f"allocated point of each block r in {list(blocks)}, sigma={sigma:g}: theory.exact at "
               f"L={list(p.L_exact)}, Rao-Blackwellised Monte Carlo at L={list(L_mc)}", "domain": dom})


def resolve_small_L(p: SmallLProfile, problem: dict) -> SmallLProfile:
    """The problem's blocks and noise; its L is where the Monte Carlo measures the gap."""
    return replace(p, blocks=tuple(sorted(set(problem.get("tasks", p.blocks)))), sigma=problem.get("sigma", p.sigma),
                   L_mc=(problem["L"],) if "L" in problem else p.L_mc)


def findings_small_L(result) -> list:
    out = []
    for c in comparisons_where(result, role="gap exponent"):
        d = c["details"]
        top = d["rows"][-1]
        out.append(finding(result, "stops",
                           "At r = {r}, the gap between the large-L expansion and the exact loss has local exponent "
                           "{p} at L = {L} (-2: the O(1/L) coefficient is right; -1: wrong), a relative gap of {gap} "
                           "there" + ("" if d["in_domain"] else " (outside 6 omega*^2 < 1: the approach to -2 is slow)")
                           + ".", r=d["r"], p=(d["local_exponents"][-1], d["exponent_se"]), L=top["L"],
                           gap=d["relative_gap_at_top"]))
    return out


SPEC = ClaimSpec(
    id="boundary-small-L", kind="boundary",
    title="Boundary: the expansion's O(1/L) coefficient (gap to the exact loss against L)",
    statement=("The expansion's O(1/L) term is the exact loss's: their gap falls like L^-2 (local exponent -> -2), "
               "not like L^-1 (a wrong coefficient)."),
    profiles=SMALL_L, plan=plan_small_L, compare=compare_small_L, resolve=resolve_small_L, findings=findings_small_L,
    fields=("tasks", "L", "sigma", "heads"))
