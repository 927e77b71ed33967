"""Claim 6: multi-head beats single-head H-fold (H = m heads for m tasks).

At context length L the gradient-flow limit of m heads is the allocated fixed point and the
best single head is the one-head optimum; theory gives both losses exactly at finite L
(``theory.exact.exact_fixed_point``, ``single_head_optimum``), their ratio, the gain
(``theory.exact.finite_L_gain``), and the L -> inf gain rho_inf (``theory.limiting_error.gain``:
not H at finite block size r; it rises towards H = m as r grows -- unit tests of theory in
tests/test_theory_limiting_error.py).

Rows: the converged losses of the full model trained with m heads and with one head on the
same prompt stream, at two or more L (``claims.core``); the gain of each trained pair
against theory's finite-L gain (:func:`check_gain_pair`; the largest L of the first case
carries the plain name and heads the headline); the gain of the exact reduced minima at the
largest trained L (:func:`check_bridge_gain`) and at a large L against rho_inf
(:func:`check_gain_limit`).
"""
from __future__ import annotations

import math
from dataclasses import replace

from claims.core import (ClaimSpec, Comparison, Outcome, Tolerance, TrainedProfile, agreement, bridge_need, case_figure,
                         check_large_L, check_trained_loss, compare, comparisons_where, config_label, configurations,
                         domain, finding, headline_row, limit_need, noise_term, run_status, term, theory_need,
                         trained_name, trained_need, with_problem)
from numerics.config import ProblemConfig
from numerics.experiments.converged import PAPER_SCHEDULE, QUICK_SCHEDULE, TINY_SCHEDULE
from numerics.evaluate import paired_ratio


class MultiHeadGainProfile(TrainedProfile):
    """Claim 6's profile (cases with m >= 2)."""


TINY = MultiHeadGainProfile(train_Ls=(64,), schedule=TINY_SCHEDULE, bridge_elements=2 ** 21)
QUICK = MultiHeadGainProfile(cases=(((2, 2), 0.0), ((3, 3, 3), 0.5)), train_Ls=(32, 64), schedule=QUICK_SCHEDULE,
                             limit_elements=2 ** 25)
PAPER = MultiHeadGainProfile(cases=(((4, 4, 4), 0.0), ((10, 10, 10), 0.0), ((3, 3), 0.5)),
                             train_Ls=(64, 128, 256, 512), schedule=PAPER_SCHEDULE,
                             bridge_elements=2 ** 24, limit_L=16384, limit_elements=2 ** 27, fit_elements=2 ** 21)
PROFILES = {"tiny": TINY, "quick": QUICK, "paper": PAPER}


def wrong_gains(m: int, gain: float, what: str = "gain") -> tuple:
    """The wrong predictions of a gain: exactly H = m (the paper's round number) and the wrong
    winner 1/gain."""
    return ((f"gain exactly H = {m}", m), (f"wrong winner (1/{what})", 1 / gain))


def check_trained_gain(cfg: ProblemConfig, multi: dict, single: dict, theory_gain: dict,
                       name: str = "gain of trained full models") -> Comparison:
    """single / multi held-out loss ratio against theory's finite-L gain.  Standard error by the
    delta method on the two held-out estimates (treated as independent, which overstates it:
    both use the same held-out prompts); tolerance Z_SE of it + the runs' relative step errors +
    the quadrature bounds.  Perturbations: gain exactly H = m; the wrong winner 1/gain."""
    R = single["loss"] / multi["loss"]
    se = R * math.hypot(single["se"] / single["loss"], multi["se"] / multi["loss"])
    g = theory_gain["gain"]
    quad = (theory_gain["single"]["error_estimate"] / theory_gain["loss_single"]
            + theory_gain["allocated"]["error_estimate"] / theory_gain["loss_allocated"])
    fixed = Tolerance((noise_term(se, "the ratio", "delta method on the two held-out losses"),
                       term("the runs' relative step errors",
                            R * (single["step_error"] / single["loss"] + multi["step_error"] / multi["loss"]))))

    def tol(gain):
        # theory's quadrature bound is relative to the gain it predicts: recomputed for a wrong or moved gain
        return fixed.value + abs(float(gain)) * quad

    return compare(name, R, g, tol, f"{fixed.why()}, plus |gain| x the quadrature bounds' relative error ({quad:.3g})",
                   wrong=wrong_gains(cfg.m, g), config=config_label(cfg),
                   details={"role": "trained gain", "tasks": list(cfg.tasks), "L": cfg.L, "sigma": cfg.sigma, "se": se,
                            "theory": {
                       k: theory_gain[k] for k in ("gain", "loss_single", "loss_allocated")}})


def check_gain_pair(cfg: ProblemConfig, multi: dict, single: dict, theory_gain: dict, status_multi: tuple,
                    status_single: tuple, name: str = "gain of trained full models") -> Comparison | dict:
    """The gain of one trained pair (the m-head run ``multi``, the one-head run ``single``, on
    the same prompt stream) decided by the runs' statuses (:func:`run_status`):

    - both inside: :func:`check_trained_gain` (two-sided, perturbations gain = H and 1/gain);
    - m = 1 (outside: one task): the two runs are the same model, so the ratio is 1 = H:
      |R - 1| <= the same tolerance;
    - otherwise a boundary finding, one-sided by the sides theory puts the runs on: the m-head
      run below its prediction (it left the allocated set for a superposition) or the one-head
      run above its own (not converged) raise the ratio -> "not below theory's gain"; an
      unconverged m-head run lowers it -> "not above".  Same tolerance, no perturbation.
    - sides that conflict, or a run outside the domain for another reason: no prediction of the
      ratio.  Returned as ``{"undecided": reason}`` (never a passing comparison)."""
    (st_m, sign_m), (st_s, sign_s) = status_multi, status_single
    c = check_trained_gain(cfg, multi, single, theory_gain, name)
    if st_m == "inside" and st_s == "inside":
        return c
    R, g, tol = c.measured, c.predicted, c.tolerance
    details = {**c.details, "status_multi": st_m, "status_single": st_s}
    if cfg.m == 1:
        return compare(f"{name} [boundary: one task]", R, 1.0, tol, "boundary finding (m = 1: the m-head and "
                       "one-head models coincide); check: ratio 1; " + c.why,
                       details={**details, "boundary_check": "ratio 1"}, config=c.config)
    sides = set()
    if st_m != "inside":
        sides.add(0 if st_m.startswith("outside") else -sign_m)   # multi below (-1) -> ratio up (+1)
    if st_s != "inside":
        sides.add(0 if st_s.startswith("outside") else sign_s)    # single above (+1) -> ratio up
    if len(sides) != 1 or 0 in sides:
        return {"undecided": f"no side of theory's gain: m-head run {st_m}; one-head run {st_s}",
                "measured": R, "predicted": g}
    side = "not below" if sides.pop() > 0 else "not above"
    bound = f"{side} theory's gain"
    tag = ("m-head run " + st_m if st_m != "inside" else "one-head run " + st_s).split(" (")[0].split(":")[0]
    return compare(f"{name} [boundary: {tag}]", R, g, tol,
                   f"boundary finding (m-head run: {st_m}; one-head run: {st_s}); check: {bound}; " + c.why,
                   side=side, details={**details, "boundary_check": bound}, config=c.config)


def plan(ctx, results=None) -> list:
    """Per case and L the m-head and the one-head converged runs (one prompt stream) and theory's
    finite-L gain; with m >= 2 the bridge's and the limit row's minima (allocated and one head)
    with theory's rho_inf and its finite-L gain at limit_L and 4 limit_L."""
    p, out = ctx.p, []
    for base, Ls in configurations(ctx.p, ctx.device):
        tasks, sigma = tuple(base.tasks), float(base.sigma)
        for L in sorted(Ls):
            out += [trained_need(replace(base, heads=heads, L=int(L)), p.schedule) for heads in (base.m, 1)]
            out.append(theory_need("finite_L_gain", tasks, int(L), sigma))
        if base.m >= 2:
            out += [bridge_need(p, tasks, sigma, max(Ls), ctx.device),
                    limit_need(p, tasks, sigma, ctx.device), theory_need("gain", tasks, sigma)]
            out += [theory_need("finite_L_gain", tasks, int(k * p.limit_L), sigma) for k in (1, 4)]
    return out


def _reduced_gain(minima) -> tuple:
    """The paired ratio (one head / allocated) of the exact reduced minima, its standard error,
    and the details of the two minima."""
    multi, single = minima
    R, se = paired_ratio(single.per_prompt, multi.per_prompt)
    return R, se, {"se": se, "multi": multi.summary(), "single": single.summary()}


def check_bridge_gain(tasks, sigma: float, L: int, minima, g: float) -> Comparison:
    """Paired ratio of the Monte-Carlo minima of the exact reduced loss (one head / allocated)
    against theory.exact.finite_L_gain at L: Z_SE paired standard errors; perturbations gain =
    H and 1/gain."""
    R, se, details = _reduced_gain(minima)
    return compare(f"gain of exact reduced minima (bridge), tasks={list(tasks)}, L={L}, sigma={sigma:g}", R, g,
                   Tolerance((noise_term(se, "the paired ratio", "one evaluation sample for both minima"),)),
                   wrong=wrong_gains(len(tasks), g), details=details)


def check_gain_limit(tasks, sigma: float, L: int, minima, rho: float, here: float, far: float) -> Comparison:
    """Paired ratio of the exact reduced minima at a large L against rho_inf = gain(tasks, sigma),
    at the tolerance of ``claims.core.check_large_L``: Z_SE paired standard errors + the part
    of the gain still to come beyond L (from theory.exact's gain at L and 4L, independent of
    rho_inf).  Perturbations: gain = H (the paper's round number) and 1/rho_inf (the wrong winner)."""
    R, se, details = _reduced_gain(minima)
    rho = float(rho)
    return check_large_L(f"gain at large L -> rho_inf, tasks={list(tasks)}, sigma={sigma:g}, L={L}", R, se,
                                 "the paired ratio", rho, far - here, "the gain",
                                 wrong_gains(len(tasks), rho, "rho_inf"),
                                 {**details, "role": "gain limit", "gain_exact_L": here, "gain_exact_4L": far})


def _gain_at(results, tasks, L, sigma) -> dict:
    return results[theory_need("finite_L_gain", tuple(tasks), int(L), float(sigma))]


def compare_results(ctx, results) -> Outcome:
    """Claim 6: per case and L, the m-head and one-head runs (same prompt stream) against
    theory's exact losses, their gain, then the bridge and limit rows.  Only pairs with both
    runs inside the domain decide the claim on trained models; with none: verdict undecided."""
    p = ctx.p
    configs = configurations(ctx.p, ctx.device)
    if p.problem:
        base = configs[0][0]
        ran = (f"problem {base.to_dict()}: m = {base.m} heads and one head (problem heads = {base.heads} "
               f"replaced), trained at L = {base.L}, {2 * base.L}")
    else:
        ran = f"profile cases {list(p.cases)}: m heads and one head trained at L = {list(p.train_Ls)}"
    comps, rows, gains, points, undecided = [], [], [], {}, []
    for base, Ls in configs:
        tasks, sigma = tuple(base.tasks), float(base.sigma)
        inside = domain(base, gain=True)
        for L in sorted(Ls):
            theory_gain = _gain_at(results, tasks, L, sigma)
            runs = {}
            for heads, label, pred in ((base.m, f"H = {base.m}", theory_gain["allocated"]),
                                       (1, "one head", theory_gain["single"])):
                cfg = replace(base, heads=heads, L=int(L))
                r = results[trained_need(cfg, p.schedule)]
                st = run_status(cfg, r, inside)
                c = check_trained_loss(cfg, r, pred, trained_name(cfg, label), st)
                comps.append(c)
                rows.append(headline_row(c, se=r["se"]))
                runs[heads] = (r, st)
            c = check_gain_pair(replace(base, L=int(L)), runs[base.m][0], runs[1][0], theory_gain,
                                runs[base.m][1], runs[1][1],
                                name=f"gain of trained full models at L={L}, tasks={list(tasks)}, sigma={sigma:g}")
            if isinstance(c, dict):
                undecided.append({"L": int(L), "tasks": list(tasks), "sigma": sigma, **c})
            elif "boundary_check" in c.details:
                comps.append(c)
                rows.append(headline_row(c, se=c.details["se"]))
            else:
                comps.append(c)
                gains.append(c)
                points.setdefault((tasks, sigma), []).append((L, c.measured, c.predicted))
        if base.m >= 2:
            bridge = results[bridge_need(p, tasks, sigma, max(Ls), ctx.device)]
            limit = results[limit_need(p, tasks, sigma, ctx.device)]
            for c in (check_bridge_gain(tasks, sigma, max(Ls), bridge, _gain_at(results, tasks, max(Ls), sigma)["gain"]),
                      check_gain_limit(tasks, sigma, p.limit_L, limit, results[theory_need("gain", tasks, sigma)],
                                       _gain_at(results, tasks, p.limit_L, sigma)["gain"],
                                       _gain_at(results, tasks, 4 * p.limit_L, sigma)["gain"])):
                comps.append(c)
                rows.append(headline_row(c, se=c.details["se"]))
    # the headline's first row: the trained gain at the largest L of the first case
    gain_rows = [headline_row(c, se=c.details["se"]) for c in gains]
    if gain_rows:
        first = max(range(len(gains)), key=lambda i: (gains[i].details["L"] if
                                                     gains[i].details["tasks"] == list(configs[0][0].tasks) else -1))
        gain_rows.insert(0, {**gain_rows.pop(first), "name": "gain of trained full models"})
    doms = {f"tasks={list(b.tasks)} param={b.param}": domain(b, gain=True) for b, _ in configs}
    figure = case_figure("multi-head-gain-vs-L", "Single-head / multi-head converged loss against L", points,
                                 "trained", "theory finite-L gain", xlabel="L", ylabel="loss(1 head) / loss(m heads)",
                                 xscale="log", caption="points: held-out losses of trained full models; line: "
                                         "theory.exact.finite_L_gain",
                                 hlines=[{"y": float(len(t)), "label": f"H = {len(t)}"} for t, _ in points])
    # the headline: the trained gain at the largest L of the first case (the row that heads the headline)
    head = gains[first].name if gain_rows else None
    return Outcome(comps, gain_rows + rows, [figure], short_why=True, headline_comparison=head,
                   undecided=None if gains else ("no L had both trained runs inside the domain (converged, the m-head "
                                                 "run allocated): the gain of trained models is not decided here"),
                   details={"ran": ran, "domain": {"conditions": domain(configs[0][0], gain=True)["conditions"], "cases": doms},
                            "gain_undecided": undecided,
                            "boundary_rows": [c.name for c in comps if "boundary_check" in c.details]})


def findings(result) -> list:
    """The trained gain against theory's finite-L gain, and each boundary gain row."""
    out = []
    for c in comparisons_where(result, role="trained gain"):
        d = c["details"]
        kind = "holds" if "boundary_check" not in d and c["agrees"] else "stops"
        text = ("At tasks {tasks}, L = {L}, sigma {sigma}, trained single-head over multi-head loss is {gain} against "
                "theory's finite-L gain {theory} (the paper's round number H = {H})"
                + ("; " + d["status_multi"].split(" (")[0] + ", check: " + d["boundary_check"]
                   if "boundary_check" in d else "") + ".")
        out.append(finding(result, kind, text, tasks=str(tuple(d["tasks"])), L=d["L"], sigma=d["sigma"],
                           gain=(c["measured"], d["se"]), theory=c["predicted"], H=len(d["tasks"])))
    for c in comparisons_where(result, role="gain limit"):
        out.append(finding(result, agreement(c), "At large L the exact reduced gain is {g} against rho_inf = {rho}, "
                           "not H.", g=(c["measured"], c["details"]["se"]), rho=c["predicted"]))
    return out


SPEC = ClaimSpec(
    id="multi-head-gain", title="Multi-head beats single-head H-fold",
    paper="H = m heads err a factor H less than the best single head, as L -> infinity",
    statement=("Trained multi-head models (H = m) beat trained single heads by theory's finite-L gain, the exact "
               "ratio of the one-head optimum to the allocated fixed point; the gain tends to theory's rho_inf as "
               "L grows, which is below H at finite block size and rises towards H = m with r."),
    profiles=PROFILES, plan=plan, compare=compare_results, resolve=with_problem, findings=findings, reads_sweep=True)
