"""Where the large-L expansion stops: two boundaries on theory's own approximation, judged
against theory's account of each regime (``located``: measured and theory's account agrees;
``contradicted``: it disagrees; a measurement that cannot decide: ``undecided``).

- ``boundary-saturation`` (:func:`check_saturation`): the expansion's Gaussian integrals diverge
  for 2 omega^2 >= 1 while the exact loss stays finite, and its error grows toward that edge.
- ``boundary-small-L`` (:func:`check_expansion_coefficient`, :func:`check_measured_exact_loss`):
  the expansion's O(1/L) coefficient, from the gap expansion - exact loss at theory's allocated
  point along L (theory.exact's quadrature; numerics' Monte Carlo where it resolves the gap).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from claims.base import Figure, Series
from claims.common import Z_SE, Comparison, compare, headline_row, perturbation, resolved
from claims.spec import ClaimSpec, Outcome, comparisons_where, finding
from claims.trained import theory_need
from numerics.engine import need
from numerics.experiments import reduced_flows  # noqa: F401 -- registers the kinds this claim asks for
from theory import reduced_ode
from theory.expansion_gap import local_exponent, validity_edge


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
    """The exact loss of one head on one block along ``omegas`` (``numerics.experiments.reduced_flows``)."""
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
    p_err, p_growth, p_tol = saturation_error(rows, wrong_edge)
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
    """theory.expansion_gap.gap_ladder of one block r at the context lengths ``Ls``."""
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
    exponents of the gap along the L ladder ``rows`` (theory.expansion_gap.gap_ladder at
    increasing L, :func:`coefficient_need`; theory.exact: deterministic, error ~1e-11).

    Domain (theory's own remainder analysis, ``expansion_reliable``): 6 omega*^2 < 1 at the
    top two L, where the remainder is O(L^-2).  Inside: the top exponent p is compared with -2
    (EXPONENT_RIGHT), |p + 2| against :data:`EXPONENT_TOLERANCE` + Z_SE se; perturbation
    through the same comparison: a wrong coefficient (-1).  An inconclusive p (within Z_SE se
    of the midpoint) lies within tolerance of both -2 and -1, so the wrong-coefficient
    perturbation is not rejected and the verdict is error, not pass.  Outside
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
                       EXPONENT_TOLERANCE + Z_SE * se,
                       f"half the distance between the exponents of a right (-2) and a wrong (-1) O(1/L) coefficient, "
                       f"plus {Z_SE:g} quadrature errors of the exponent ({Z_SE * se:.2g})",
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


SATURATION_SPEC = ClaimSpec(
    id="boundary-saturation", kind="boundary", title="Boundary: saturation (omega^2 d >> log L)",
    statement=("Beyond 2 omega^2 < 1 the expansion is invalid (flagged, infinite); before, its error grows with "
               "omega^2 d / log L while the exact loss stays finite."),
    profiles=SATURATION, plan=plan_saturation, compare=compare_saturation, resolve=resolve_saturation,
    findings=findings_saturation, fields=("tasks", "L", "sigma", "heads"))
SMALL_L_SPEC = ClaimSpec(
    id="boundary-small-L", kind="boundary",
    title="Boundary: the expansion's O(1/L) coefficient (gap to the exact loss against L)",
    statement=("The expansion's O(1/L) term is the exact loss's: their gap falls like L^-2 (local exponent -> -2), "
               "not like L^-1 (a wrong coefficient)."),
    profiles=SMALL_L, plan=plan_small_L, compare=compare_small_L, resolve=resolve_small_L, findings=findings_small_L,
    fields=("tasks", "L", "sigma", "heads"))
run_saturation, run_small_L = SATURATION_SPEC.run, SMALL_L_SPEC.run
