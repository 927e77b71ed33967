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
from dataclasses import dataclass, replace

import numpy as np

from claims.common import (Z_SE, Comparison, compare, config_label, eps_of, gd_seconds, headline_row, perturbation,
                           resolved, value_panels)
from claims.spec import ClaimSpec, Outcome, comparisons_where, finding
from numerics.model import initial_values
from numerics.config import ProblemConfig
from numerics.experiments import probes
from numerics.train import TrainConfig
from theory.block_structure import group_order
from theory.exact import exact_flow
from theory.reduced_ode import expansion_gd_map, expansion_reliable, integrate_expansion_flow, metric_factors


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


def check_gradient_projection(cfg, omega, mu, batch: int = 64, seed: int = 0) -> Comparison:
    """(a) at the point (omega, mu) of D, on one batch (``probes.gradient_projection``): the full
    model's gradient-flow velocity read out on D (omega_dot = tr(Phi_i^T W_dot Phi_i)/r_i, mu_dot =
    diag U_dot_Y; ``numerics.model.full_velocity_on_D``) against -f * grad L_L, f the metric
    factors of ``theory.reduced_ode.metric_factors`` and grad L_L the gradient of the exact
    finite-L reduced loss on the same batch (``numerics.reduced.reduced_gradient``).  Both sides
    are the same sums of B L per-token terms along different graphs, so they differ by rounding
    only: float64 pairwise summation errs by <= eps log2(B L D) relative to the sum of the
    *absolute* per-prompt terms; tolerance = 64 eps log2(B L D) f |g|_abs per entry (+ eps),
    |g|_abs the mean over prompts of |per-prompt gradient|, compared as the max ratio.
    Perturbation: the metric off by a factor 2 (the factored one without its 2, the merged one
    with a spurious 2)."""
    omega, mu = np.asarray(omega, float), np.asarray(mu, float)
    g = probes.gradient_projection(cfg, omega, mu, batch, seed)
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
        details={"role": "gradient", "config": cfg.to_dict(), "omega": omega, "mu": mu, "batch": batch, "seed": seed,
                 "velocity_off_D_residual": g["off"], "other_metric_ratio": ratio(measured, pred_other)})


def _signed_gap(a, b) -> np.ndarray:   # per record: (omega_a - omega_b, mu_a - mu_b) flattened
    return np.concatenate([(a.omega - b.omega).reshape(len(a.t), -1), (a.mu - b.mu).reshape(len(a.t), -1)], axis=1)


def check_trajectory_agreement(cfg, lr=0.05, time: float = 3.0, base_prompts: int = 1,
                               seed: int = 0, record_every: int = 1, max_relative_step: float = 0.01) -> Comparison:
    """(b) full GD vs the reduced flow on one fixed, exactly symmetric batch
    (``numerics.symmetry.symmetrize_full``), over the whole run (``probes.richardson_runs``).  On
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

    ``lr=None`` picks the step from the stiffness of the flow on this batch: the largest
    relative velocity |x_dot / x| at the init (reduced flow, theory's metric) times lr is at
    most ``max_relative_step`` (and lr <= 0.05), so that the O(lr) tolerance stays below
    the effect of a wrong metric constant."""
    prompts = probes.symmetric_prompts(cfg, base_prompts, seed)
    if lr is None:
        lr = probes.stiffness_step(cfg, prompts, time, max_relative_step)
    steps = int(round(time / lr))
    if steps < 2 or abs(steps * lr - time) > 1e-9 * time:
        raise ValueError(f"time/lr must be an integer >= 2, got time={time}, lr={lr}")
    runs = probes.richardson_runs(cfg, prompts, lr, steps, int(record_every), _wrong_factor(cfg.param))
    full, red = runs["full"], runs["red"]
    diff, diff_half = _signed_gap(full, red), _signed_gap(runs["full_half"], runs["red_half"])
    gap = np.max(np.abs(diff), axis=1)
    # the O(lr) part of the difference, 2 |D_lr - D_lr/2| per record and entry (Richardson, docstring)
    rich = 2.0 * np.max(np.abs(diff - diff_half), axis=1)
    scale = float(np.max(np.abs(np.concatenate([red.omega.ravel(), red.mu.ravel()]))))
    tol = RICHARDSON_SAFETY * float(np.max(rich)) + 64 * (2 * steps + 1) * eps_of(cfg) * scale
    measured, wrong_gap = float(np.max(gap)), float(np.max(np.abs(_signed_gap(full, runs["wrong"]))))
    # theory predicts no gap; the resolving power is in the gap's own units (absolute)
    return resolved(Comparison(
        name=f"trajectory tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} {cfg.basis} lr={lr:.4g} t={time:g}",
        measured=measured, predicted=0.0, error=measured, tolerance=tol, config=config_label(cfg, basis=True),
        why=(f"same samples, exactly symmetric batch ({prompts.batch} prompts): both runs discretise the same "
             f"ODE; tolerance {RICHARDSON_SAFETY:g} x the Richardson estimate 2|D_lr - D_lr/2| of the O(lr) part "
             "of their difference D (max over the run and entries) + rounding"),
        perturbations=[perturbation(f"reduced flow with the metric off by a factor {_wrong_factor(cfg.param):g}",
                                    wrong_gap, tol)],
        details={"role": "trajectory", "config": cfg.to_dict(), "lr": lr, "time": time, "seed": seed,
                 "batch": prompts.batch, "t": full.t, "gap": gap, "richardson": rich,
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
heads every mid-flow point needs the pair moments (theory.exact_pairs: minutes per point, (3, 3),
H = 2, L = 8 ran > 300 s), so above one head (c) falls back to the one-sided trend check."""


def predicted_expansion_gap(cfg, Ls, tcfg) -> dict:
    """Theory's gap b(L) between the exact finite-L reduced flow (``theory.exact.exact_flow``)
    and the expansion flow (``theory.reduced_ode.integrate_expansion_flow``), rms of the
    relative gap over the run's records (``probes.trajectory_gap``): what the full model's gap
    to the expansion is, if the full model follows the exact reduced flow -- the expansion's
    own error along the run.  ``discretisation``: the change of that gap when the expansion side
    is the GD map at the run's step instead of the flow (the measured gap is between two GD
    runs, theory's between two flows: their O(lr) parts nearly cancel, by at most this much)."""
    gap, disc = [], []
    for L in Ls:
        om0, mu0 = initial_values(cfg.replace(L=int(L)))
        t = np.linspace(0.0, tcfg.time, tcfg.records)
        exact = exact_flow(om0, mu0, cfg.tasks, int(L), cfg.sigma, cfg.param, cfg.logit_scale, t_end=tcfg.time,
                           t_eval=t)
        flow = integrate_expansion_flow(om0, mu0, cfg.tasks, int(L), cfg.sigma, cfg.param, cfg.logit_scale,
                                        t_end=tcfg.time, t_eval=t)
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


def check_expansion_trend(cfg, Ls, tcfg, seeds=(0, 1, 2)) -> Comparison:
    """(c) full model (fresh batches, ``probes.trend_runs``) against the large-L expansion flow
    at each L in ``Ls`` (>= 3), over the independent prompt streams ``seeds`` (>= 2).  The
    expansion flow (``theory.reduced_ode.expansion_gd_map``, theory's metric) is discretised by
    the same GD step as the full model, so that the O(lr) gap, which does not shrink with L, is
    not mistaken for the expansion's error.

    The gap of one run is bias (the expansion's error, the claim) plus Monte-Carlo noise of
    the SGD trajectory.  Per L, with X_s the relative gap trajectory of seed s (each value
    over its scale max|x_ref|; mu ~ 1/omega, so absolute errors of mu would hide the omega
    trend) and Xbar its mean over the n seeds, the squared bias is estimated without the
    noise: b^2 = mean(Xbar^2) - mean(var_s X) / n (the sample variance across seeds is the
    noise of one run); se(b) ~ sqrt(mean var / n), the noise left in Xbar
    (``probes.noise_corrected_bias``).

    Compared (H <= EXACT_GAP_MAX_HEADS), two-sided: the measured b(L) against theory's own gap
    of the expansion, the exact reduced flow minus the expansion flow
    (:func:`predicted_expansion_gap`), by :func:`expansion_gap_error` -- its pooled scale k
    against 1 and each L against its value; tolerance Z_SE standard errors + theory's
    discretisation allowance (from theory, never the measurement).  Wrong predictions through the
    same function: no gap (the expansion exact at every L), a gap 20x theory's, a gap that does
    not shrink (theory's at the smallest L, at every L); and the expansion flow with the other
    parametrisation's metric (the full model's gap to that flow held to theory's gap).  What (c)
    cannot see: an error in the O(1/L) terms (a wrong pair kernel) changes the expansion flow,
    and with it both the measured gap and theory's predicted one; that coefficient is checked by
    boundary-small-L against the exact loss (docs/claims_1_4.md, blind spots).

    Above EXACT_GAP_MAX_HEADS heads (theory's exact flow unaffordable) the one-sided trend: the
    exponent p of b ~ L^p by weighted least squares (weights (b / se(b))^2, ``probes.
    log_log_slope``) with p + Z_SE se(p) < 0 (the gap shrinks at Z_SE standard errors); its
    resolving power is an exponent bound (absolute); the other metric through the same statistic."""
    Ls, n = [int(L) for L in Ls], len(seeds)
    metric = {"theory": cfg.param, "other": "merged" if cfg.param == "factored" else "factored"}
    if len(Ls) < 3 or sorted(set(Ls)) != Ls:
        raise ValueError(f"need >= 3 increasing distinct context lengths, got {Ls}")
    if len(seeds) < 2:
        raise ValueError("need >= 2 prompt-stream seeds to estimate the Monte-Carlo error")
    est, runs = {k: [] for k in metric}, []   # per metric, per L: (b, se(b))
    for L, per_seed in zip(Ls, probes.trend_runs(cfg, Ls, tcfg, seeds)):
        om0, mu0 = initial_values(cfg.replace(L=L))
        t = per_seed[0].t
        ex = {k: expansion_gd_map(om0, mu0, cfg.tasks, L, cfg.sigma, param, cfg.logit_scale, tcfg.lr, t)
              for k, param in metric.items()}
        runs.append({"L": L, "t": t, "omega": per_seed[0].omega, "mu": per_seed[0].mu, "ex_t": t,
                     "ex_omega": ex["theory"][0], "ex_mu": ex["theory"][1]})
        for k, ref in ex.items():
            est[k].append(probes.noise_corrected_bias(np.array([probes.relative_gap(r.omega, r.mu, *ref)
                                                                 for r in per_seed])))
    (bias, bias_se), (bias_o, bias_o_se) = (np.array(est[k]).T for k in metric)
    (slope, se), (slope_o, se_o) = probes.log_log_slope(Ls, bias, bias_se), probes.log_log_slope(Ls, bias_o, bias_o_se)
    name = f"expansion-trend tasks={cfg.tasks} H={cfg.heads} L={Ls} {cfg.param} s={cfg.logit_scale:g} B={tcfg.batch}"
    config = config_label(cfg, basis=True).replace(f" L={cfg.L}", f" L={Ls}")
    details = {"role": "expansion", "config": cfg.to_dict(), "train": tcfg.to_dict(), "Ls": Ls, "seeds": list(seeds),
               "bias": bias, "bias_se": bias_se, "bias_other_metric": bias_o, "runs": runs}
    measured = {"bias": bias, "bias_se": bias_se, "exponent": slope, "exponent_se": se}
    if cfg.heads <= EXACT_GAP_MAX_HEADS:
        theory = predicted_expansion_gap(cfg, Ls, tcfg)
        p, disc = theory["gap"], theory["discretisation"]
        err = expansion_gap_error(bias, bias_se, disc)
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
                    f"the Monte-Carlo spread of {n} independent prompt streams", error=err, config=config,
                    wrong=[("no gap: the expansion exact at every L", [0.0] * len(Ls)),
                           ("a gap 20x theory's", [20.0 * x for x in p]),
                           ("a gap that does not shrink with L (theory's at the smallest L)", [p[0]] * len(Ls))],
                    details=details)
        # the other metric changes what is measured (the gap to that metric's expansion flow), through
        # the same error function and tolerance
        c.perturbations.insert(0, perturbation(
            f"expansion flow with the {metric['other']} metric: the full model's gap to it held to theory's gap",
            expansion_gap_error(bias_o, bias_o_se, disc)({}, p), 1.0, bias=bias_o))
        return c
    stat, stat_o = slope + Z_SE * se, slope_o + Z_SE * se_o
    # one-sided: p + Z_SE se(p) below the bound 0; resolving power: how far below 0 an exponent bound
    # could be and still be passed (absolute, in exponent units)
    return resolved(Comparison(
        name=name, measured=measured, predicted=0.0, error=stat, tolerance=0.0, side="not above", config=config,
        why=("noise-corrected rms gap b(L) between the full model and the expansion flow (relative to each value's "
             f"scale, over the run) must shrink: fitted exponent p of b ~ L^p with p + {Z_SE:g} se(p) < 0, se from the "
             f"Monte-Carlo spread of {n} independent prompt streams (one-sided: theory's exact gap needs the pair "
             f"moments at H = {cfg.heads})"),
        perturbations=[perturbation(f"expansion flow with the {metric['other']} metric (same fit and statistic: its "
                                    "gap must not shrink)", stat_o, 0.0, exponent=slope_o, exponent_se=se_o,
                                    bias=bias_o)],
        details=details), error=lambda m, bound: m["exponent"] + Z_SE * m["exponent_se"] - bound, units="absolute")


def plan(p: SpectralReductionProfile, device: str = "cpu", seed: int = 0, problem: dict | None = None) -> dict:
    """The cases of a run: ``grad`` [(cfg, omega, mu, batch)], ``traj`` [(cfg, kwargs)],
    ``trend`` (cfg, Ls, TrainConfig) or None, ``not_run`` [{case, reason}].  With a problem
    (given, or laid over the profile by ``resolve``): (a) and (b) at that configuration, (c)
    around it at L/8, L/4, L/2, L."""
    problem = dict(p.problem) if problem is None and p.problem else problem
    rng = np.random.default_rng(seed)
    tkw = dict(lr=p.traj_lr, time=p.traj_time, base_prompts=p.traj_base_prompts, record_every=p.traj_record_every)
    trend_tcfg = TrainConfig(lr=p.trend_lr, time=p.trend_time, batch=p.trend_batch, records=p.trend_records, seed=seed)
    if problem is not None:
        base = ProblemConfig(device=device, **dict(problem))
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
    grad = [(cfg, rng.uniform(0.05, 0.6, (cfg.heads, cfg.m)), rng.uniform(-1.5, 1.5, (cfg.heads, cfg.m)),
             p.grad_batch) for cfg in grad_cfgs]
    size = {cfg: group_order(cfg.tasks) * p.traj_base_prompts for cfg in traj_cfgs}
    traj = [(cfg, tkw) for cfg in traj_cfgs if size[cfg] <= p.max_traj_prompts]
    not_run = [{"case": f"trajectory tasks={cfg.tasks}", "reason": f"|G| base_prompts = {size[cfg]} prompts > "
                f"max_traj_prompts = {p.max_traj_prompts} (cost; (a) still runs)"}
               for cfg in traj_cfgs if size[cfg] > p.max_traj_prompts]
    if trend is None and problem is not None:
        not_run.append({"case": "expansion-trend",
                        "reason": f"needs >= 3 distinct L in L/8..L, L = {problem.get('L')}"})
    return {"grad": grad, "traj": traj, "trend": trend, "not_run": not_run}


def evaluate(ctx) -> Outcome:
    """Claim 2: (a) gradient projection, (b) trajectories, (c) expansion trend (a boundary
    finding, recorded and not judged, outside theory's O(L^-2) domain)."""
    p, seed, cases = ctx.p, ctx.seed, plan(ctx.p, ctx.device, ctx.seed)
    total = len(cases["grad"]) + len(cases["traj"]) + 1
    grad_c = [check_gradient_projection(cfg, om, mu, batch=batch, seed=seed) for cfg, om, mu, batch in cases["grad"]]
    ctx.progress("spectral-reduction: (b) full GD vs reduced flow", len(grad_c) / total)
    traj_c = [check_trajectory_agreement(cfg, seed=seed, **kw) for cfg, kw in cases["traj"]]
    domain, boundary, trend_c = {"condition": DOMAIN, "cases_outside": []}, [], []
    if cases["trend"]:
        cfg, Ls, tcfg = cases["trend"]
        domain["expansion_trend"] = dom = expansion_domain(cfg, Ls, tcfg)
        ctx.progress(f"spectral-reduction: (c) expansion vs full at L={Ls}", (total - 1) / total)
        try:
            c = check_expansion_trend(cfg, Ls, tcfg, seeds=tuple(seed + k for k in range(p.trend_seeds)))
        except RuntimeError as exc:     # only outside the domain: the expansion GD map left 2 omega^2 < 1
            c, dom["undefined"] = None, f"(c) not measured: {exc}, where the expansion is undefined"
        if c is not None and dom["in_domain"]:
            trend_c.append(c)
        elif c is not None:   # outside the expansion's O(L^-2) domain: a boundary finding, recorded, not judged
            domain["cases_outside"].append(c.name)
            boundary.append(c.summary())
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
    return Outcome(comps, headline, figures, short_why=True, headline_comparison=comps[0].name if comps else None,
                   details={
        "domain": domain, "boundary_findings": boundary,
        "ran": {"problem": dict(p.problem) or None, "cases": [c.name for c in comps] + domain["cases_outside"],
                "not_run": cases["not_run"]}})


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


def estimate(p: SpectralReductionProfile) -> float:
    """Seconds from the plan (block_structure's rates): (b) five fixed-batch runs per case (lr,
    lr/2 twice, the wrong metric: 7 x time/lr steps) of |G| base_prompts L tokens, (c) trend_seeds
    runs per L and, with one head, theory's exact flow per L (~0.45 s: 2.2 s for the quick
    profile's five L); (a) negligible.  Measured (CPU, quick, under load): (b) 0.47 s a case, (c)
    7.7 s of runs."""
    cases, steps = plan(p), round(p.traj_time / 0.05)
    runs = [(c, 7 * steps, group_order(c.tasks) * p.traj_base_prompts) for c, _ in cases["traj"]]
    trend = cases["trend"] or [None, []]
    runs += [(replace(trend[0], L=int(L)), p.trend_seeds * round(p.trend_time / p.trend_lr), p.trend_batch)
             for L in trend[1]]
    exact = 0.45 * len(trend[1]) if trend[0] is not None and trend[0].heads <= EXACT_GAP_MAX_HEADS else 0.0
    return gd_seconds(runs) + exact


SPEC = ClaimSpec(
    id="spectral-reduction", title="Spectral reduction to the semi-singular values", paper="gradient flow is an ODE on (omega, mu)",
    statement=("Gradient flow on the full weights becomes an ODE on the H(d+m) semi-singular values: per "
               "head, m distinct QK values omega[h,i] (equal within a task block) and m OV values mu[h,i]."),
    profiles=PROFILES, evaluate=evaluate, findings=findings, estimate=estimate,
    resolve=lambda p, q: replace(p, problem=tuple(sorted(q.items()))))
CLAIM_ID, TITLE, STATEMENT = SPEC.id, SPEC.title, SPEC.statement
run = SPEC.run
