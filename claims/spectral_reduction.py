"""Claim 2: gradient flow on the full weights is an ODE on the semi-singular values.

Three checks against ``theory.reduced_ode`` (runs and probes in ``numerics.experiments.probes``): (a)
:func:`check_gradient_projection`, the full model's velocity read out on D against the reduced velocity, one batch;
(b) :func:`check_trajectory_agreement`, full GD against the reduced flow over a run on an exactly symmetric batch;
(c) :func:`check_expansion_trend`, the full model against the large-L expansion flow, whose gap must shrink as L
grows.  Each also against a metric off by a factor (or the other parametrisation's), which must be rejected.
Domain (:data:`DOMAIN`, decided from theory before any run; (b)'s |G| base_prompts is a cost, not a condition):
outside :func:`expansion_domain` (c) is a boundary finding (recorded, not judged; not even recorded where the
expansion GD map leaves 2 omega^2 < 1, where the expansion is undefined: the reason is)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from claims.core import (Z_SE, ClaimSpec, Comparison, Outcome, Tolerance, compare, comparisons_where, config_label,
                         eps_of, finding, headline_row, perturbation, resolved, term, theory_need, value_panels,
                         with_problem)
from numerics.model import initial_values
from numerics.config import ProblemConfig
from numerics.engine import need
from numerics.experiments import probes
from numerics.train import TrainConfig
from theory.block_structure import group_order
from theory.reduced_ode import expansion_gd_map, expansion_reliable, metric_factors


@dataclass(frozen=True)
class SpectralReductionProfile:
    """What claim 2 runs at one profile ((a) at each param x basis, (b) at each param)."""

    # (a) gradient projection at random points of D
    grad_tasks: tuple = ((2, 1),)       # block sizes of the (a) cases
    grad_heads: int = 2
    grad_L: int = 8
    grad_batch: int = 32                # prompts of the one batch
    # (b) full GD vs reduced flow on one exactly symmetric batch
    traj_tasks: tuple = ((2, 1),)
    traj_heads: int = 2
    traj_L: int = 8
    traj_init_scale: float = 0.3
    traj_time: float = 3.0              # t_end
    traj_base_prompts: int = 1          # prompts whose whole G-orbits make the batch
    traj_record_every: int = 1          # compare every k steps (resolve the transient)
    traj_lr: float | None = 0.05        # None: chosen from the stiffness of the flow (1% per step)
    max_traj_prompts: int = 4096        # cost cap |G| base_prompts of the (b) batch
    # (c) expansion trend (trend_tasks None: not run)
    trend_tasks: tuple | None = (3,)
    trend_heads: int = 1
    trend_logit_scale: float = 8.0      # s = 8: the emergence lands at omega < 1/sqrt(6)
    trend_Ls: tuple = (4, 8, 16, 32, 64)
    trend_lr: float = 0.05
    trend_time: float = 4.0
    trend_batch: int = 1024             # at 256 se(p) = 0.17 does not resolve p ~ -0.4 at Z_SE (measured)
    trend_records: int = 9
    trend_seeds: int = 3                # independent prompt streams per L (>= 2)
    sigma: float = 0.0
    params: tuple = ("factored", "merged")
    bases: tuple = ("identity", "random")
    problem: tuple = ()                 # a researcher's ProblemConfig fields (sorted items): (a), (b) there, (c) around


PROFILES = {
    "tiny": SpectralReductionProfile(grad_tasks=((1, 1),), grad_L=4, grad_batch=8, traj_tasks=((1, 1),), traj_L=4,
                                     traj_time=0.5, trend_tasks=None, params=("factored",), bases=("identity",)),
    "quick": SpectralReductionProfile(),
    "paper": SpectralReductionProfile(grad_tasks=((3, 3),), grad_L=128, grad_batch=256, traj_tasks=((2, 2),),
                                      traj_L=32, traj_init_scale=0.15, traj_time=10.0, traj_base_prompts=2,
                                      traj_record_every=5, trend_tasks=(3, 3), trend_heads=2,
                                      trend_Ls=(64, 128, 256, 512, 1024), trend_batch=2048, trend_records=41),
}

RICHARDSON_SAFETY = 1.5   # the factor on the Richardson estimate that covers the O(lr^2) remainder (check (b))
DOMAIN = {
    "gradient_projection": "every point of D, every configuration (chain rule on D, exact to rounding)",
    "trajectory": "every start in D, every configuration (a G-invariant batch keeps the full flow in D)",
    "expansion_trend": "6 omega^2 < 1 along the expansion flow from the start (theory.reduced_ode."
                       "expansion_reliable on the expansion GD map at the smallest L): the remainder is O(L^-2)",
}


def _wrong_factor(param: str) -> float:   # the factored metric without its 2, the merged one with a 2
    return 0.5 if param == "factored" else 2.0


def check_gradient_projection(cfg, g: dict, batch: int) -> Comparison:
    """(a) at the point (omega, mu) of D, on one batch of ``batch`` prompts (``g``:
    ``probes.gradient_projection``): the full model's gradient-flow velocity read out on D
    (omega_dot = tr(Phi_i^T W_dot Phi_i)/r_i, mu_dot = diag U_dot_Y;
    ``numerics.model.full_velocity_on_D``) against -f * grad L_L, f the metric
    factors of ``theory.reduced_ode.metric_factors`` and grad L_L the gradient of the exact
    finite-L reduced loss on the same batch (``numerics.model.reduced_gradient``).  Both sides
    are the same sums of B L per-token terms along different graphs, so they differ by rounding
    only: float64 pairwise summation errs by <= eps log2(B L D) relative to the sum of the
    *absolute* per-prompt terms; tolerance = 64 eps log2(B L D) f |g|_abs per entry (+ eps),
    |g|_abs the mean over prompts of |per-prompt gradient|, compared as the max ratio.
    Perturbation: the metric off by a factor 2 (the factored one without its 2, the merged one
    with a spurious 2)."""
    omega, mu = g["omega"], g["mu"]
    f_om, f_mu = metric_factors(cfg.param, omega, mu, cfg.tasks, cfg.logit_scale)
    fo_om, fo_mu = metric_factors("merged" if cfg.param == "factored" else "factored", omega, mu, cfg.tasks,
                                  cfg.logit_scale)
    pred, pred_other = ({"omega_dot": -a * g["g_om"], "mu_dot": -b * g["g_mu"]}
                        for a, b in ((f_om, f_mu), (fo_om, fo_mu)))
    n_terms, eps = batch * cfg.L * cfg.token_dim, eps_of(cfg)
    slack = 64 * eps * max(1.0, math.log2(n_terms))
    grad, absolute, metric = {"omega_dot": g["g_om"], "mu_dot": g["g_mu"]}, \
        {"omega_dot": g["abs_om"], "mu_dot": g["abs_mu"]}, {"omega_dot": f_om, "mu_dot": f_mu}

    def tol(predicted):
        # the rounding scale f |grad|_abs of each entry, f the metric factor the prediction applies
        # (|predicted| / |grad|: theory's f for theory's prediction, k f for a metric off by k), so a
        # wrong or moved prediction is held to its own rounding tolerance through this same function
        out = {}
        for v in ("omega_dot", "mu_dot"):
            gv = np.abs(grad[v])
            f = np.where(gv > 0, np.abs(np.asarray(predicted[v], float)) / np.where(gv > 0, gv, 1.0), metric[v])
            out[v] = slack * f * absolute[v] + eps
        return out

    def ratio(measured, predicted):
        t = tol(predicted)
        return max(float(np.max(np.abs(measured[v] - predicted[v]) / t[v])) for v in ("omega_dot", "mu_dot"))

    measured, k = {"omega_dot": g["v_om"], "mu_dot": g["v_mu"]}, _wrong_factor(cfg.param)
    return compare(
        f"gradient-projection tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} {cfg.basis} B={batch}",
        measured, pred, 1.0, f"rounding: |full - reduced| <= 64 eps log2(B L D) f |grad|_abs per entry "
        f"(B L D = {n_terms}); compared as the max ratio", error=ratio, config=config_label(cfg, basis=True),
        wrong=[(f"metric off by a factor {k:g}", {v: k * x for v, x in pred.items()})],
        details={"role": "gradient", "config": cfg.to_dict(), "omega": omega, "mu": mu, "batch": batch,
                 "velocity_off_D_residual": g["off"], "other_metric_ratio": ratio(measured, pred_other)})


def _signed_gap(a, b) -> np.ndarray:   # per record: (omega_a - omega_b, mu_a - mu_b) flattened
    return np.concatenate([(a.omega - b.omega).reshape(len(a.t), -1), (a.mu - b.mu).reshape(len(a.t), -1)], axis=1)


def check_trajectory_agreement(cfg, runs: dict, time: float) -> Comparison:
    """(b) full GD vs the reduced flow on one fixed, exactly symmetric batch
    (``numerics.model.symmetrize_full``), over the whole run of length ``time`` (``runs``:
    ``probes.richardson_runs``, :func:`trajectory_need`).  On
    such a batch the full flow never leaves D, so the two are first-order discretisations of the
    *same* ODE on the same samples and their difference D_lr is O(lr) only (zero for merged
    weights: GD on W restricted to D *is* the Euler step of the reduced flow).  Tolerance:
    D_lr = C lr + O(lr^2), so |D_lr| ~ 2 |D_lr - D_lr/2| (Richardson); RICHARDSON_SAFETY = 1.5 x
    that estimate (max over the run and entries; the 1.5 covers the O(lr^2) remainder) + a
    rounding floor.  A wrong ODE adds a part that does not vanish with lr, which the tolerance
    does not cover; perturbation: the reduced flow with the metric off by a factor 2.  Compared
    every ``record_every`` steps: a fixed small batch can bring the flow to its fixed point
    within a few steps, and a wrong metric only changes the speed, so the transient must be
    resolved.

    A step chosen from the stiffness of the flow on this batch (:func:`trajectory_need`, lr None)
    keeps the O(lr) tolerance below the effect of a wrong metric constant."""
    lr, steps = runs["lr"], runs["steps"]
    full, red = runs["full"], runs["red"]
    diff, diff_half = _signed_gap(full, red), _signed_gap(runs["full_half"], runs["red_half"])
    gap = np.max(np.abs(diff), axis=1)
    # the O(lr) part of the difference, 2 |D_lr - D_lr/2| per record and entry (Richardson, docstring)
    rich = 2.0 * np.max(np.abs(diff - diff_half), axis=1)
    scale = float(np.max(np.abs(np.concatenate([red.omega.ravel(), red.mu.ravel()]))))
    tol = Tolerance((term(f"{RICHARDSON_SAFETY:g} x the Richardson estimate 2|D_lr - D_lr/2| of the O(lr) part of "
                          "their difference D (max over the run and entries)", RICHARDSON_SAFETY * float(np.max(rich))),
                     term(f"rounding 64 x {2 * steps + 1} steps x eps x the largest |omega|, |mu|",
                          64 * (2 * steps + 1) * eps_of(cfg) * scale)),
                    f"same samples, exactly symmetric batch ({runs['batch']} prompts): both runs discretise the same ODE")
    measured, wrong_gap = float(np.max(gap)), float(np.max(np.abs(_signed_gap(full, runs["wrong"]))))
    # theory predicts no gap; the resolving power is in the gap's own units (absolute)
    return resolved(Comparison(
        name=f"trajectory tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} {cfg.basis} lr={lr:.4g} t={time:g}",
        measured=measured, predicted=0.0, error=measured, tolerance=tol.value, config=config_label(cfg, basis=True),
        why=tol.why(), perturbations=[perturbation(
            f"reduced flow with the metric off by a factor {_wrong_factor(cfg.param):g}", wrong_gap, tol.value)],
        details={"role": "trajectory", "config": cfg.to_dict(), "lr": lr, "time": time,
                 "batch": runs["batch"], "t": full.t, "gap": gap, "richardson": rich,
                 "max_residual_full": float(np.max(full.residual)), "full_omega": full.omega, "full_mu": full.mu,
                 "red_omega": red.omega, "red_mu": red.mu}),
        units="absolute")


def expansion_domain(cfg, Ls, tcfg) -> dict:
    """Theory's decision, before any training, whether (c) is inside its domain: the
    expansion GD map from cfg's start over the run at each L stays where its remainder is
    O(L^-2) (6 omega^2 < 1, ``theory.reduced_ode.expansion_reliable``), so the noise-corrected
    gap to the full model must shrink as L grows (with logit scale s = 1 and small r the emergence
    lands near (r s)^(-1/4) > 1/sqrt(6): outside)."""
    om0, mu0 = initial_values(cfg)
    t = np.linspace(0.0, tcfg.time, tcfg.records)
    worst_w2, left = 0.0, []
    for L in Ls:
        om, _ = expansion_gd_map(om0, mu0, cfg.tasks, int(L), cfg.sigma, cfg.param, cfg.logit_scale, tcfg.lr, t,
                                 on_exit="stop")
        if len(om):
            worst_w2 = max(worst_w2, float(np.max(6.0 * om ** 2)))
        if len(om) < len(t) or not all(expansion_reliable(o) for o in om):
            left.append(int(L))
    return {"in_domain": not left, "max_6_omega2": worst_w2, "Ls_outside": sorted(set(left))}


EXACT_GAP_MAX_HEADS = 1
"""Theory's predicted gap of (c) needs theory.exact's flow: one head at any L (seconds); with two
heads every mid-flow point needs the pair moments (theory.exact.cross_moments: minutes per point, (3, 3),
H = 2, L = 8 ran > 300 s), so above one head (c) falls back to the one-sided trend check."""


def predicted_expansion_gap(cfg, Ls, tcfg, flows) -> dict:
    """Theory's gap b(L) between the exact finite-L reduced flow (``theory.exact.exact_flow``)
    and the expansion flow (``theory.reduced_ode.integrate_expansion_flow``), rms of the
    relative gap over the run's records (``probes.trajectory_gap``): what the full model's gap
    to the expansion is, if the full model follows the exact reduced flow -- the expansion's
    own error along the run.  ``discretisation``: the change of that gap when the expansion side
    is the GD map at the run's step instead of the flow (the measured gap is between two GD
    runs, theory's between two flows: their O(lr) parts nearly cancel, by at most this much).
    ``flows(L)``: the two flows at L (:func:`flow_needs`)."""
    gap, disc = [], []
    for L in Ls:
        om0, mu0 = initial_values(cfg.replace(L=int(L)))
        t = np.linspace(0.0, tcfg.time, tcfg.records)
        exact, flow = flows(L)
        gd = expansion_gd_map(om0, mu0, cfg.tasks, int(L), cfg.sigma, cfg.param, cfg.logit_scale, tcfg.lr, t)
        if exact.status != "t_end" or flow.status != "t_end" or len(gd[0]) < t.size:
            raise ValueError(f"theory's flows stop before t_end at L={L} (exact: {exact.status}, expansion: "
                             f"{flow.status}): no predicted gap")
        b = probes.trajectory_gap(exact.omega, exact.mu, flow.omega, flow.mu)
        gap.append(b)
        disc.append(abs(probes.trajectory_gap(exact.omega, exact.mu, *gd) - b))
    return {"gap": gap, "discretisation": disc}


def expansion_gap_error(bias, bias_se, discretisation):
    """THE error function of (c) against a predicted gap p(L) (tolerance 1): the larger of
    |k - 1| / (Z_SE se(k) + d_k), k the weighted least-squares scale of the measured b(L) on p(L)
    (weights 1/se(b)^2: k = sum w b p / sum w p^2, se(k) = 1/sqrt(sum w p^2), d_k the
    discretisation allowance carried the same way), and max_L |b - p| / (Z_SE se(b) + d) (the
    shape, L by L).  A prediction of no gap at all (p = 0) has no scale: error inf."""
    b, se, d = (np.asarray(x, float) for x in (bias, bias_se, discretisation))
    w = 1.0 / se ** 2

    def error(measured, predicted):
        p = np.asarray(predicted, float)
        spp = float(np.sum(w * p * p))
        per_L = float(np.max(np.abs(b - p) / (Z_SE * se + d)))
        if not spp > 0:
            return math.inf
        k = float(np.sum(w * b * p)) / spp
        return max(abs(k - 1.0) / (Z_SE / math.sqrt(spp) + float(np.sum(w * d * p)) / spp), per_L)

    return error


def check_expansion_trend(cfg, Ls, tcfg, n: int, results, seed: int) -> Comparison:
    """(c) the full model on fresh batches against the large-L expansion flow discretised by the
    same GD step (the O(lr) gap, which does not shrink with L, is not the expansion's error), at
    each L in ``Ls`` (>= 3) over ``n`` (>= 2) prompt streams (``results`` of :func:`trend_needs`
    and :func:`flow_needs`, at the report's ``seed``): the gap of one run is bias (the expansion's
    error, the claim) plus Monte-Carlo noise, separated by ``probes.expansion_gaps``.

    Up to EXACT_GAP_MAX_HEADS heads, two-sided: b(L) against theory's own gap of the expansion
    (exact reduced flow minus expansion flow, :func:`predicted_expansion_gap`) by
    :func:`expansion_gap_error`; tolerance Z_SE standard errors + theory's discretisation
    allowance (from theory, never the measurement).  Wrong predictions through the same
    function: no gap, a gap 20x theory's, a gap that does not shrink (theory's at the smallest L);
    and the expansion flow with the other metric.  What (c) cannot see: an error in the O(1/L)
    terms (a wrong pair kernel) moves the measured and the predicted gap together; boundary-small-L
    checks that coefficient (docs/claims_1_4.md, blind spots).  Above, one-sided: the exponent p
    of b ~ L^p by weighted least squares (``probes.log_log_slope``) with p + Z_SE se(p) < 0; the
    other metric through the same statistic."""
    Ls, needs = [int(L) for L in Ls], trend_needs(cfg, Ls, tcfg, n)
    gaps, runs = probes.expansion_gaps(cfg, Ls, tcfg.lr, {L: [results[r] for r in needs[L]] for L in Ls})
    other = [param for param in gaps if param != cfg.param][0]
    (bias, bias_se), (bias_o, bias_o_se) = gaps[cfg.param], gaps[other]
    (slope, se), (slope_o, se_o) = probes.log_log_slope(Ls, bias, bias_se), probes.log_log_slope(Ls, bias_o, bias_o_se)
    name = f"expansion-trend tasks={cfg.tasks} H={cfg.heads} L={Ls} {cfg.param} s={cfg.logit_scale:g} B={tcfg.batch}"
    config = config_label(cfg, basis=True).replace(f" L={cfg.L}", f" L={Ls}")
    details = {"role": "expansion", "config": cfg.to_dict(), "Ls": Ls, "streams": n,
               "train": tcfg.to_dict() | {"seed": [r.seed(seed) for r in needs[Ls[0]]]},   # the streams' seeds
               "bias": bias, "bias_se": bias_se, "bias_other_metric": bias_o, "runs": runs}
    measured = {"bias": bias, "bias_se": bias_se, "exponent": slope, "exponent_se": se}
    if cfg.heads <= EXACT_GAP_MAX_HEADS:
        theory = predicted_expansion_gap(cfg, Ls, tcfg, lambda L: tuple(results[f] for f in flow_needs(cfg, L, tcfg)))
        p, disc = theory["gap"], theory["discretisation"]
        w = 1.0 / np.asarray(bias_se) ** 2
        spp = float(np.sum(w * np.square(p)))
        scale, scale_se = float(np.sum(w * bias * np.asarray(p))) / spp, 1.0 / math.sqrt(spp)
        measured |= {"scale": scale, "scale_se": scale_se}
        details |= {"predicted_gap": p, "discretisation": disc, "scale": scale, "scale_se": scale_se,
                    "scale_tolerance": Z_SE * scale_se + float(np.sum(w * np.asarray(disc) * np.asarray(p))) / spp,
                    "exponent_predicted": probes.log_log_slope(Ls, np.asarray(p), np.asarray(bias_se))[0]}
        c = compare(name, measured, list(p), 1.0,
                    "the noise-corrected gap b(L) between the full model and the expansion flow against theory's gap "
                    f"of the expansion (exact reduced flow minus expansion flow): pooled scale k = 1 within {Z_SE:g} "
                    f"se(k) and each L within {Z_SE:g} se(b), plus theory's O(lr) discretisation allowance; se from "
                    f"the Monte-Carlo spread of {n} independent prompt streams",
                    error=expansion_gap_error(bias, bias_se, disc), config=config,
                    wrong=[("no gap: the expansion exact at every L", [0.0] * len(Ls)),
                           ("a gap 20x theory's", [20.0 * x for x in p]),
                           ("a gap that does not shrink with L (theory's at the smallest L)", [p[0]] * len(Ls))],
                    details=details)
        # the other metric changes what is measured (the gap to that metric's expansion flow), through
        # the same error function and tolerance
        c.perturbations.insert(0, perturbation(
            f"expansion flow with the {other} metric: the full model's gap to it held to theory's gap",
            expansion_gap_error(bias_o, bias_o_se, disc)({}, p), 1.0, bias=bias_o))
        return c
    # one-sided: p + Z_SE se(p) below the bound 0; resolving power: how far below 0 an exponent bound
    # could be and still be passed (absolute, in exponent units)
    return resolved(Comparison(
        name=name, measured=measured, predicted=0.0, error=slope + Z_SE * se, tolerance=0.0, side="not above",
        config=config,
        why=("noise-corrected rms gap b(L) between the full model and the expansion flow (relative to each value's "
             f"scale, over the run) must shrink: fitted exponent p of b ~ L^p with p + {Z_SE:g} se(p) < 0, se from the "
             f"Monte-Carlo spread of {n} independent prompt streams (one-sided: theory's exact gap needs the pair "
             f"moments at H = {cfg.heads})"),
        perturbations=[perturbation(f"expansion flow with the {other} metric (same fit and statistic: its "
                                    "gap must not shrink)", slope_o + Z_SE * se_o, 0.0, exponent=slope_o,
                                    exponent_se=se_o, bias=bias_o)],
        details=details), error=lambda m, bound: m["exponent"] + Z_SE * m["exponent_se"] - bound, units="absolute")


def cases(p: SpectralReductionProfile, device: str = "cpu") -> dict:
    """The cases: ``grad`` [cfg], ``traj`` [cfg], ``trend`` (cfg, Ls, TrainConfig) or
    None, ``not_run`` [{case, reason}]; with a researcher's problem (laid over the profile by
    ``resolve``) (a) and (b) at that configuration, (c) around it at L/8, L/4, L/2, L."""
    trend_tcfg = TrainConfig(lr=p.trend_lr, time=p.trend_time, batch=p.trend_batch, records=p.trend_records)
    if p.problem:
        base = ProblemConfig(device=device, **dict(p.problem))
        grad_cfgs = traj_cfgs = [base]
        Ls = sorted({max(1, base.L // k) for k in (8, 4, 2, 1)})
        trend = (base, Ls, trend_tcfg) if len(Ls) >= 3 else None
    else:
        pc = lambda **kw: ProblemConfig(device=device, sigma=p.sigma, **kw)  # noqa: E731
        grad_cfgs = [pc(tasks=tuple(t), heads=p.grad_heads, L=p.grad_L, param=pa, basis=b)
                     for t in p.grad_tasks for pa in p.params for b in p.bases]
        traj_cfgs = [pc(tasks=tuple(t), heads=p.traj_heads, L=p.traj_L, param=pa, init_scale=p.traj_init_scale)
                     for t in p.traj_tasks for pa in p.params]
        trend = None if p.trend_tasks is None else (
            pc(tasks=tuple(p.trend_tasks), heads=p.trend_heads, L=int(p.trend_Ls[0]), param="factored",
               logit_scale=p.trend_logit_scale), list(p.trend_Ls), trend_tcfg)
    size = {cfg: group_order(cfg.tasks) * p.traj_base_prompts for cfg in traj_cfgs}
    not_run = [{"case": f"trajectory tasks={cfg.tasks}", "reason": f"|G| base_prompts = {size[cfg]} prompts > "
                f"max_traj_prompts = {p.max_traj_prompts} (cost; (a) still runs)"}
               for cfg in traj_cfgs if size[cfg] > p.max_traj_prompts]
    if trend is None and p.problem:
        not_run.append({"case": "expansion-trend",
                        "reason": f"needs >= 3 distinct L in L/8..L, L = {dict(p.problem).get('L')}"})
    return {"grad": grad_cfgs, "traj": [cfg for cfg in traj_cfgs if size[cfg] <= p.max_traj_prompts], "trend": trend,
            "not_run": not_run}


def gradient_need(cfg, batch: int):
    """(a)'s probe on one batch at a random point of D, omega in [0.05, 0.6] and mu in [-1.5, 1.5]
    per entry (``probes.gradient_projection_at_random_point``)."""
    return need("gradient_projection", cfg=cfg, batch=int(batch), omega_range=(0.05, 0.6), mu_range=(-1.5, 1.5))


def trajectory_need(cfg, lr, time: float, base_prompts: int, record_every: int):
    """(b)'s runs on one exactly symmetric batch (``probes.richardson_runs``; ``lr`` None: the
    step from the stiffness of the flow); a given lr must divide ``time`` into >= 2 steps."""
    if lr is not None and (round(time / lr) < 2 or abs(round(time / lr) * lr - time) > 1e-9 * time):
        raise ValueError(f"time/lr must be an integer >= 2, got time={time}, lr={lr}")
    return need("richardson_runs", cfg=cfg, lr=None if lr is None else float(lr), time=float(time),
                base_prompts=int(base_prompts), every=int(record_every), wrong_factor=_wrong_factor(cfg.param))


def trend_needs(cfg, Ls, tcfg, n: int) -> dict:
    """{L: [the full model's run on fresh batches, per prompt stream k]} of (c) (``probes.trend_run``;
    stream k is case ("expansion trend", k) at every L): >= 3 increasing distinct L, >= 2 streams."""
    Ls = [int(L) for L in Ls]
    if len(Ls) < 3 or sorted(set(Ls)) != Ls:
        raise ValueError(f"need >= 3 increasing distinct context lengths, got {Ls}")
    if n < 2:
        raise ValueError("need >= 2 prompt-stream seeds to estimate the Monte-Carlo error")
    return {L: [need("trend_run", cfg=cfg.replace(L=L), tcfg=tcfg, stream=("expansion trend", k)) for k in range(n)]
            for L in Ls}


def flow_needs(cfg, L: int, tcfg) -> tuple:
    """Theory's exact reduced flow and expansion flow at L from cfg's start, at the run's records."""
    om0, mu0 = (tuple(map(tuple, a.tolist())) for a in initial_values(cfg.replace(L=int(L))))
    args = (om0, mu0, tuple(cfg.tasks), int(L), float(cfg.sigma), cfg.param, float(cfg.logit_scale),
            float(tcfg.time), tuple(np.linspace(0.0, tcfg.time, tcfg.records).tolist()))
    return theory_need("exact_flow", *args), theory_need("expansion_flow", *args)


def plan(ctx, results=None) -> list:
    """Claim 2's needs: (a)'s probes, (b)'s runs, (c)'s runs and, up to EXACT_GAP_MAX_HEADS
    heads, theory's two flows at each L."""
    p, c = ctx.p, cases(ctx.p, ctx.device)
    out = [gradient_need(cfg, p.grad_batch) for cfg in c["grad"]]
    out += [trajectory_need(cfg, p.traj_lr, p.traj_time, p.traj_base_prompts, p.traj_record_every) for cfg in c["traj"]]
    if c["trend"]:
        cfg, Ls, tcfg = c["trend"]
        out += [r for runs in trend_needs(cfg, Ls, tcfg, p.trend_seeds).values() for r in runs]
        if cfg.heads <= EXACT_GAP_MAX_HEADS:
            out += [f for L in Ls for f in flow_needs(cfg, L, tcfg)]
    return out


def trend_comparison(ctx, results, domain: dict) -> tuple[list, list]:
    """(c) inside its domain ([comparison], []), outside it a boundary finding ([], [summary]);
    ``domain`` receives theory's decision (:func:`expansion_domain`)."""
    cfg, Ls, tcfg = cases(ctx.p, ctx.device)["trend"]
    domain["expansion_trend"] = dom = expansion_domain(cfg, Ls, tcfg)
    try:
        c = check_expansion_trend(cfg, Ls, tcfg, ctx.p.trend_seeds, results, ctx.seed)
    except RuntimeError as exc:     # only outside the domain: the expansion GD map left 2 omega^2 < 1
        dom["undefined"] = f"(c) not measured: {exc}, where the expansion is undefined"
        return [], []
    if dom["in_domain"]:
        return [c], []
    domain["cases_outside"].append(c.name)      # outside the expansion's O(L^-2) domain: recorded, not judged
    return [], [c.summary()]


def compare_results(ctx, results) -> Outcome:
    """Claim 2: (a) gradient projection, (b) trajectories, (c) expansion trend (a boundary
    finding, recorded and not judged, outside theory's O(L^-2) domain)."""
    p, cs = ctx.p, cases(ctx.p, ctx.device)
    grad_c = [check_gradient_projection(cfg, results[gradient_need(cfg, p.grad_batch)], p.grad_batch)
              for cfg in cs["grad"]]
    traj_c = [check_trajectory_agreement(cfg, results[trajectory_need(cfg, p.traj_lr, p.traj_time, p.traj_base_prompts,
                                                                      p.traj_record_every)], p.traj_time)
              for cfg in cs["traj"]]
    domain = {"condition": DOMAIN, "cases_outside": []}
    trend_c, boundary = trend_comparison(ctx, results, domain) if cs["trend"] else ([], [])
    comps = grad_c + traj_c + trend_c
    domain["cases_in_domain"] = [c.name for c in comps]
    figures = [value_panels("spectral-reduction-trajectories", f"full model (points) vs reduced flow (lines): {c.name}",
                            c.details["t"], c.details["full_omega"], c.details["full_mu"], c.details["t"],
                            c.details["red_omega"], c.details["red_mu"], "full", "reduced") for c in traj_c[:1]]
    figures += [value_panels("spectral-reduction-expansion",
                             f"full model (points) vs expansion flow (lines) at L={r['L']}", r["t"], r["omega"],
                             r["mu"], r["ex_t"], r["ex_omega"], r["ex_mu"], "full", "expansion")
                for r in [c.details["runs"][-1] for c in trend_c[:1]]]
    headline = ([headline_row(c, "(a) full velocity on D = -f grad L_L: max |diff| / rounding tolerance, "
                              + c.name[len("gradient-projection "):], theory=0.0, measured=c.error) for c in grad_c]
                + [headline_row(c, "(b) full GD vs reduced flow, max gap over the run: " + c.name[len("trajectory "):])
                   for c in traj_c]
                + [trend_row(c) for c in trend_c])
    # the headline: (a), the velocity on D is theory's reduced velocity (the reduction itself, to rounding)
    ran = {"problem": dict(p.problem) or None, "cases": [c.name for c in comps] + domain["cases_outside"],
           "not_run": cs["not_run"]}
    return Outcome(comps, headline, figures, short_why=True, headline_comparison=comps[0].name if comps else None,
                   details={"domain": domain, "boundary_findings": boundary, "ran": ran})


def trend_row(c: Comparison) -> dict:
    """The headline row of (c): the pooled scale k of the measured gap over theory's (two-sided
    against 1), or, above EXACT_GAP_MAX_HEADS heads, the exponent with its one-sided bound."""
    tag = c.name[len("expansion-trend "):]
    if "scale" in c.measured:
        return headline_row(c, "(c) full-vs-expansion gap over theory's (exact minus expansion flow), pooled over L: "
                            + tag, theory=1.0, measured=c.measured["scale"], se=c.measured["scale_se"],
                            tolerance=c.details["scale_tolerance"])
    return headline_row(c, "(c) exponent of the full-vs-expansion gap in L (p + Z_SE se < 0): " + tag,
                        theory=[None, 0.0], measured=c.measured["exponent"], se=c.measured["exponent_se"])


def findings(result) -> list:
    """(a) the largest rounding ratio, (b) the largest gap against its Richardson tolerance,
    (c) the exponent of the expansion gap (or where (c) stops: outside its domain)."""
    out, group = [], {k: comparisons_where(result, role=k) for k in ("gradient", "trajectory", "expansion")}
    kind = {k: "holds" if all(c["agrees"] for c in v) else "stops" for k, v in group.items()}
    if grad := group["gradient"]:
        out.append(finding(result, kind["gradient"], "The full model's velocity read out on D equals theory's reduced "
                           "velocity -f grad L_L to rounding: at most {r} of the rounding tolerance ({n} points of D); "
                           "a metric off by a factor 2 is {w}x outside it.", n=len(grad),
                           r=max(c["error"] for c in grad), w=min(p["error"] for c in grad for p in c["perturbations"])))
    if group["trajectory"]:
        c = max(group["trajectory"], key=lambda c: c["margin"])
        out.append(finding(result, kind["trajectory"], "On the same samples full gradient descent follows the reduced "
                           "ODE over the whole run: largest gap {g} against the O(lr) Richardson tolerance {tol} ({n} "
                           "runs).", g=c["measured"], tol=c["tolerance"], n=len(group["trajectory"])))
    for c in group["expansion"] + result.details.get("boundary_findings", []):
        inside = c in group["expansion"]
        tail = "." if inside else " (outside the expansion's O(L^-2) domain: recorded, not judged)."
        if "scale" in c["measured"]:
            out.append(finding(result, "holds" if inside and c["agrees"] else "stops",
                               "At large L the full model approaches the expansion ODE as theory says: its "
                               "noise-corrected gap {b} over L = {Ls} is {k} times theory's own gap of the expansion "
                               "(exact minus expansion flow, {pred}; tolerance {tol}), falling like L^{p}" + tail,
                               b=c["measured"]["bias"], Ls=c["details"]["Ls"], pred=c["predicted"],
                               k=(c["measured"]["scale"], c["measured"]["scale_se"]),
                               tol=c["details"]["scale_tolerance"],
                               p=(c["measured"]["exponent"], c["measured"]["exponent_se"])))
            continue
        out.append(finding(result, "holds" if inside and c["agrees"] else "stops",
                           "At large L the full model approaches the expansion ODE: the noise-corrected gap falls "
                           "like L^{p} over L = {Ls}" + tail,
                           p=(c["measured"]["exponent"], c["measured"]["exponent_se"]), Ls=c["details"]["Ls"]))
    return out


SPEC = ClaimSpec(
    id="spectral-reduction", title="Spectral reduction to the semi-singular values", paper="gradient flow is an ODE on (omega, mu)",
    statement=("Gradient flow on the full weights becomes an ODE on the H(d+m) semi-singular values: per "
               "head, m distinct QK values omega[h,i] (equal within a task block) and m OV values mu[h,i]."),
    profiles=PROFILES, plan=plan, compare=compare_results, findings=findings,
    resolve=with_problem)
