"""Claim 2: gradient flow on the full weights is an ODE on the semi-singular values.

Three checks, each against a prediction of ``theory.reduced_ode``:

(a) :func:`check_gradient_projection` -- same batch, one point of D.  The full model's
    gradient-flow velocity, read out on D (omega_dot = tr(Phi_i^T W_dot Phi_i)/r_i,
    mu_dot = diag U_dot_Y, with W_dot = -(dK^T Q + K^T dQ)/s, U_dot = -(dO V + O dV) for
    the factored weights; ``numerics.model.full_velocity_on_D``), must equal the theory's
    reduced velocity -f * grad L_L with the metric factors f of
    ``theory.reduced_ode.metric_factors`` and grad L_L the gradient of the exact finite-L
    reduced loss on the same batch (``numerics.reduced.reduced_gradient``).  Both sides are the same
    sums of B L per-token terms, computed along different graphs, so they differ by
    rounding only: float64 pairwise summation errs by <= eps log2(B L D) relative to the
    sum of the *absolute* per-prompt terms; tolerance = 64 eps log2(B L D) f |g|_abs, with
    |g|_abs the mean over prompts of |per-prompt gradient| (measured).
    Perturbation: the metric off by a factor 2 (the factored metric without its 2; the
    merged metric with a spurious 2) must be rejected.

(b) :func:`check_trajectory_agreement` -- the whole run, same samples.  On a batch made of
    whole orbits of the symmetry group (``numerics.symmetry.symmetrize_full``) the full flow
    never leaves D, so full gradient descent and the reduced flow are two first-order
    discretisations of the *same* ODE on the same samples; they differ by O(lr) only (for
    merged weights not at all: GD on W restricted to D *is* the Euler step of the reduced
    flow).  The O(lr) error of each is estimated by Richardson: for a first-order scheme
    x_lr - x = C lr + O(lr^2), so |x_lr - x| ~ 2 |x_lr - x_{lr/2}|; tolerance = 1.5 x
    (that estimate for the full run + that for the reduced run), the 1.5 covering the
    O(lr^2) remainder, plus a rounding floor.  Compared as the max over the run and over
    heads/tasks.  Perturbation: the reduced flow with the metric off by a factor 2.

(c) :func:`check_expansion_trend` -- large L.  The full model trained on fresh batches
    against the large-L expansion flow (``theory.reduced_ode.expansion_gradient`` with the
    theory's metric, discretised by the same GD step as the full model so that the O(lr)
    gap, which does not shrink with L, is not mistaken for the expansion's error; the
    continuous flow ``integrate_expansion_flow`` differs from it by that O(lr)) over the same run,
    for >= 3 context lengths; the expansion drops O(L^-2) terms of the loss, so the error
    e(L) (root-mean-square over the run of full - expansion, relative to each value's
    scale) must shrink as L grows.  The expansion is a delta-method series whose next term involves
    E exp(2 omega q.x), finite only while 4 omega^2 < 1: where the flow lands beyond
    omega = 1/2 (logit scale s = 1, r <= 16: the emergence lands near (r s)^(-1/4)), the
    O(L^-2) remainder is not small at any accessible L and the trend is not seen (measured:
    r = 3, H = 1, L = 16..512, relative error 0.4-0.7 without a trend; reported, see
    docs/claims_1_4.md).  The asserted cases use a logit scale that lands inside omega < 1/2.  The Monte-Carlo
    part of e(L) is estimated from two independent prompt streams per L; the fitted
    exponent p of e ~ L^p has standard error se(p) propagated from it.  Agreement: p + 2
    Z_SE se(p) < 0 (the error shrinks, at Z_SE standard errors).  Perturbations: (i) the prediction "the
    error does not shrink" (exponent 0) must be rejected by the same statistic; (ii) the
    expansion flow with the other parametrisation's metric must be further from the full
    model at the largest L than the right one by more than Z_SE Monte-Carlo standard errors.
"""
from __future__ import annotations

import math

import numpy as np

from claims.base import ClaimResult, no_progress, run_claim
from claims.common import (EPS64, Z_SE, Comparison, check_profile, comparisons_result, initial_values, perturbation,
                           trajectory_of, value_panels, worst)
from numerics.config import ProblemConfig
from numerics.data import make_generator, sample_prompts
from numerics.model import full_velocity_on_D
from numerics.reduced import metric_factors, per_prompt_reduced_gradients, reduced_gradient
from numerics.symmetry import symmetrize_full
from numerics.train import TrainConfig, train, train_reduced
from theory.reduced_ode import expansion_gd_map
from theory.reduced_ode import metric_factors as theory_metric_factors

CLAIM_ID = "spectral-reduction"
TITLE = "Spectral reduction to the semi-singular values"
STATEMENT = ("Gradient flow on the full weights becomes an ODE on the H(d+m) semi-singular values: per "
             "head, m distinct QK values omega[h,i] (equal within a task block) and m OV values mu[h,i].")

RICHARDSON_SAFETY = 1.5


def _theory_metric(param, omega, mu, tasks, logit_scale, factor_error=1.0):
    f_om, f_mu = theory_metric_factors(param, np.asarray(omega, float), np.asarray(mu, float), tasks, logit_scale)
    return factor_error * f_om, factor_error * f_mu


def _wrong_factor(param: str) -> float:
    """The factor-2 metric error: the factored metric without its 2, the merged one with a 2."""
    return 0.5 if param == "factored" else 2.0


# ---------------------------------------------------------------------------------------
# (a) projected full gradient = reduced gradient on the same batch
# ---------------------------------------------------------------------------------------

def check_gradient_projection(cfg, omega, mu, batch: int = 64, seed: int = 0) -> Comparison:
    """(a) at the point (omega, mu) of D, on one batch: full velocity read out on D against
    -f * grad L_L (theory's metric, numerics' reduced loss)."""
    omega = np.asarray(omega, float)
    mu = np.asarray(mu, float)
    prompts = sample_prompts(cfg, batch, make_generator(seed, cfg.device))
    v_om, v_mu, off = full_velocity_on_D(cfg, omega, mu, prompts)
    g_om, g_mu = (g.cpu().double().numpy() for g in reduced_gradient(omega, mu, prompts, cfg))
    # mean over prompts of |per-prompt gradient|: the scale the rounding error is relative to
    j_om, j_mu = per_prompt_reduced_gradients(omega, mu, prompts, cfg)
    abs_om = np.abs(j_om.cpu().double().numpy()).mean(axis=0)
    abs_mu = np.abs(j_mu.cpu().double().numpy()).mean(axis=0)

    f_om, f_mu = _theory_metric(cfg.param, omega, mu, cfg.tasks, cfg.logit_scale)
    pred_om, pred_mu = -f_om * g_om, -f_mu * g_mu
    n_terms = batch * cfg.L * cfg.token_dim
    slack = 64 * EPS64 * max(1.0, math.log2(n_terms))
    tol_om = slack * f_om * abs_om + EPS64
    tol_mu = slack * f_mu * abs_mu + EPS64
    ratio = max(float(np.max(np.abs(v_om - pred_om) / tol_om)), float(np.max(np.abs(v_mu - pred_mu) / tol_mu)))

    k = _wrong_factor(cfg.param)
    wrong = max(float(np.max(np.abs(v_om - k * pred_om) / tol_om)), float(np.max(np.abs(v_mu - k * pred_mu) / tol_mu)))
    other = "merged" if cfg.param == "factored" else "factored"
    fo_om, fo_mu = _theory_metric(other, omega, mu, cfg.tasks, cfg.logit_scale)
    wrong_other = max(float(np.max(np.abs(v_om + fo_om * g_om) / tol_om)),
                      float(np.max(np.abs(v_mu + fo_mu * g_mu) / tol_mu)))
    return Comparison(
        name=f"gradient-projection tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} {cfg.basis} B={batch}",
        measured={"omega_dot": v_om, "mu_dot": v_mu}, predicted={"omega_dot": pred_om, "mu_dot": pred_mu},
        error=ratio, tolerance=1.0,
        why=(f"rounding: |full - reduced| <= 64 eps log2(B L D) f |grad|_abs per entry (B L D = {n_terms}); "
             "compared as the max ratio"),
        perturbations=[perturbation(f"metric off by a factor {k:g}", wrong, 1.0)],
        details={"config": cfg.to_dict(), "omega": omega, "mu": mu, "batch": batch, "seed": seed,
                 "velocity_off_D_residual": off, "other_metric_ratio": wrong_other},
    )


# ---------------------------------------------------------------------------------------
# (b) full trajectory = reduced flow on the same samples, over the whole run
# ---------------------------------------------------------------------------------------

def _fixed_batch_runs(cfg, prompts, lr: float, steps: int, record_every: int, factor_error: float = None) -> dict:
    """Records (every ``record_every`` steps) of GD on one fixed batch from cfg's init
    (``numerics.train``): the full model (``factor_error`` None) or the reduced flow with
    theory's metric times ``factor_error``."""
    tcfg = TrainConfig(lr=lr, time=lr * steps, records=2)
    if factor_error is None:
        res = train(cfg, tcfg, batches=lambda k: prompts, record_every=record_every)
    else:
        def metric(om, mu):
            return tuple(factor_error * f for f in metric_factors(om, mu, cfg))
        res = train_reduced(cfg, tcfg, batches=lambda k: prompts, record_every=record_every, metric=metric)
    if res.steps != steps:
        raise ValueError(f"time/lr must give {steps} steps, got {res.steps}")
    tr = trajectory_of(res)
    return {"t": tr.t, "omega": tr.omega, "mu": tr.mu, "loss": tr.loss, "residual": tr.residual}


def _max_gap(a: dict, b: dict) -> np.ndarray:
    """Per record: max over heads/tasks of |omega_a - omega_b| and |mu_a - mu_b|."""
    return np.maximum(np.abs(a["omega"] - b["omega"]).max(axis=(1, 2)), np.abs(a["mu"] - b["mu"]).max(axis=(1, 2)))


def check_trajectory_agreement(cfg, lr=0.05, time: float = 3.0, base_prompts: int = 1,
                               seed: int = 0, record_every: int = 1, max_relative_step: float = 0.01) -> Comparison:
    """(b) full GD vs the reduced flow on one fixed, exactly symmetric batch, over the whole
    run, at the Richardson tolerance (module docstring).  Compared every ``record_every``
    steps: a fixed small batch can bring the flow to its fixed point within a few steps,
    and a wrong metric only changes the speed, so the transient must be resolved.

    ``lr=None`` picks the step from the stiffness of the flow on this batch: the largest
    relative velocity |x_dot / x| at the init (reduced flow, theory's metric) times lr is at
    most ``max_relative_step`` (and lr <= 0.05), so that the O(lr) tolerance stays below
    the effect of a wrong metric constant."""
    prompts = symmetrize_full(sample_prompts(cfg, base_prompts, make_generator(seed, cfg.device)), cfg)
    if lr is None:
        om0, mu0 = initial_values(cfg)
        g_om, g_mu = (g.cpu().double().numpy() for g in reduced_gradient(om0, mu0, prompts, cfg))
        f_om, f_mu = _theory_metric(cfg.param, om0, mu0, cfg.tasks, cfg.logit_scale)
        x = np.abs(np.concatenate([om0.ravel(), mu0.ravel()]))
        v = np.abs(np.concatenate([(f_om * g_om).ravel(), (f_mu * g_mu).ravel()]))
        rel = float(np.max(v / np.maximum(x, 1e-12)))
        steps = max(2, int(math.ceil(time / min(0.05, max_relative_step / max(rel, 1e-12)))))
        lr = time / steps
    steps = int(round(time / lr))
    if steps < 2 or abs(steps * lr - time) > 1e-9 * time:
        raise ValueError(f"time/lr must be an integer >= 2, got time={time}, lr={lr}")
    every = int(record_every)
    full = _fixed_batch_runs(cfg, prompts, lr, steps, every)
    full_half = _fixed_batch_runs(cfg, prompts, lr / 2, 2 * steps, 2 * every)
    red = _fixed_batch_runs(cfg, prompts, lr, steps, every, factor_error=1.0)
    red_half = _fixed_batch_runs(cfg, prompts, lr / 2, 2 * steps, 2 * every, factor_error=1.0)
    gap = _max_gap(full, red)
    rich = 2.0 * (_max_gap(full, full_half) + _max_gap(red, red_half))
    scale = float(np.max(np.abs(np.concatenate([red["omega"].ravel(), red["mu"].ravel()]))))
    tol = RICHARDSON_SAFETY * float(np.max(rich)) + 64 * (2 * steps + 1) * EPS64 * scale
    measured = float(np.max(gap))
    wrong = _fixed_batch_runs(cfg, prompts, lr, steps, every, factor_error=_wrong_factor(cfg.param))
    wrong_gap = float(np.max(_max_gap(full, wrong)))
    return Comparison(
        name=f"trajectory tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} {cfg.basis} lr={lr:.4g} t={time:g}",
        measured=measured, predicted=0.0, error=measured, tolerance=tol,
        why=(f"same samples, exactly symmetric batch ({prompts.batch} prompts): both runs discretise the same "
             f"ODE; tolerance {RICHARDSON_SAFETY:g} x Richardson estimate 2(|x_lr - x_lr/2|) of each run's "
             "O(lr) error (max over the run) + rounding"),
        perturbations=[perturbation(f"reduced flow with the metric off by a factor {_wrong_factor(cfg.param):g}",
                                    wrong_gap, tol)],
        details={"config": cfg.to_dict(), "lr": lr, "time": time, "seed": seed, "batch": prompts.batch,
                 "t": full["t"], "gap": gap, "richardson": rich, "max_residual_full": float(np.max(full["residual"])),
                 "full_omega": full["omega"], "full_mu": full["mu"], "red_omega": red["omega"], "red_mu": red["mu"]},
    )


# ---------------------------------------------------------------------------------------
# (c) large L: the expansion ODE, error shrinking with L
# ---------------------------------------------------------------------------------------

def check_expansion_trend(cfg, Ls, tcfg, seeds=(0, 1, 2)) -> Comparison:
    """(c) full model (fresh batches, ``numerics.train.train``) against the expansion flow
    at each L in ``Ls`` (>= 3), over the independent prompt streams ``seeds`` (>= 2).

    The gap of one run is bias (the expansion's error, the claim) plus Monte-Carlo noise of
    the SGD trajectory.  Per L, with X_s the relative gap trajectory of seed s (each value
    over its scale max|x_ref|; mu ~ 1/omega, so absolute errors of mu would hide the omega
    trend) and Xbar its mean over the n seeds, the squared bias is estimated without the
    noise: b^2 = mean(Xbar^2) - mean(var_s X) / n (the sample variance across seeds is the
    noise of one run); se(b) ~ sqrt(mean var / n), the noise left in Xbar.  The exponent p of
    b ~ L^p is fitted by weighted least squares in log-log (weights 1/se(log b)^2,
    se(log b) = se(b)/b), se(p) = 1/sqrt(sum w (log L - mean)^2)."""
    Ls = [int(L) for L in Ls]
    if len(Ls) < 3 or sorted(set(Ls)) != Ls:
        raise ValueError(f"need >= 3 increasing distinct context lengths, got {Ls}")
    if len(seeds) < 2:
        raise ValueError("need >= 2 prompt-stream seeds to estimate the Monte-Carlo error")
    other = "merged" if cfg.param == "factored" else "factored"
    n = len(seeds)
    bias, bias_se, bias_other, runs = [], [], [], []
    for L in Ls:
        c = cfg.replace(L=L)
        gaps, gaps_other = [], []
        for s in seeds:
            res = train(c, tcfg.__class__(**{**tcfg.to_dict(), "seed": int(s)}))
            tr = trajectory_of(res)
            if s == seeds[0]:
                om0, mu0 = initial_values(c)
                ex_om, ex_mu = expansion_gd_map(om0, mu0, c.tasks, L, c.sigma, c.param, c.logit_scale, tcfg.lr, tr.t)
                exo_om, exo_mu = expansion_gd_map(om0, mu0, c.tasks, L, c.sigma, other, c.logit_scale, tcfg.lr, tr.t)
                runs.append({"L": L, "t": tr.t, "omega": tr.omega, "mu": tr.mu, "ex_t": tr.t,
                             "ex_omega": ex_om, "ex_mu": ex_mu})
            gaps.append(_gap_vector(tr.omega, tr.mu, ex_om, ex_mu))
            gaps_other.append(_gap_vector(tr.omega, tr.mu, exo_om, exo_mu))
        for G, out, out_se in ((np.array(gaps), bias, bias_se), (np.array(gaps_other), bias_other, None)):
            noise = float(np.mean(G.var(axis=0, ddof=1)))            # per-element variance of one run
            b2 = float(np.mean(G.mean(axis=0) ** 2)) - noise / n
            se = math.sqrt(noise / n)
            out.append(math.sqrt(max(b2, (0.1 * se) ** 2)))        # floor: the log fit needs b > 0
            if out_se is not None:
                out_se.append(se)
    bias, bias_se, bias_other = np.array(bias), np.array(bias_se), np.array(bias_other)
    # weighted least squares of log b on log L, weights 1 / se(log b)^2 with se(log b) =
    # se(b) / b: a point whose bias is within its noise carries little weight
    lx, ly = np.log(Ls), np.log(bias)
    wt = (bias / bias_se) ** 2
    xm = np.sum(wt * lx) / np.sum(wt)
    sxx = np.sum(wt * (lx - xm) ** 2)
    slope = float(np.sum(wt * (lx - xm) * ly) / sxx)
    se = float(1.0 / math.sqrt(sxx))
    stat = slope + Z_SE * se                  # < 0: shrinks at Z_SE standard errors
    other_margin = float((bias_other[-1] - bias[-1]) / max(Z_SE * bias_se[-1], 1e-300))
    return Comparison(
        name=f"expansion-trend tasks={cfg.tasks} H={cfg.heads} L={Ls} {cfg.param} B={tcfg.batch}",
        measured={"bias": bias, "bias_se": bias_se, "exponent": slope, "exponent_se": se},
        predicted={"exponent": "< 0 (asymptotically -1: O(1/L) flow error from the O(L^-2) dropped terms)"},
        error=stat, tolerance=0.0,
        why=("noise-corrected rms gap b(L) between the full model and the expansion flow (relative to each value's "
             f"scale, over the run) must shrink: fitted exponent p of b ~ L^p with p + {Z_SE:g} se(p) < 0, se from the "
             f"Monte-Carlo spread of {n} independent prompt streams"),
        perturbations=[
            perturbation("error does not shrink with L (exponent 0)", -stat, 0.0, exponent=slope, se=se),
            perturbation(f"expansion flow with the {other} metric (further from the full model at the largest L "
                         f"by > {Z_SE:g} MC standard errors)", other_margin, 1.0, bias_other=bias_other),
        ],
        details={"config": cfg.to_dict(), "train": tcfg.to_dict(), "Ls": Ls, "seeds": list(seeds),
                 "bias": bias, "bias_se": bias_se, "bias_other_metric": bias_other, "runs": runs},
    )


def _gap_vector(omega, mu, omega_ref, mu_ref) -> np.ndarray:
    """(omega - omega_ref)/max|omega_ref| and (mu - mu_ref)/max|mu_ref| over the run, flattened."""
    so = max(float(np.max(np.abs(omega_ref))), 1e-12)
    sm = max(float(np.max(np.abs(mu_ref))), 1e-12)
    return np.concatenate([((omega - omega_ref) / so).ravel(), ((mu - mu_ref) / sm).ravel()])


# ---------------------------------------------------------------------------------------
# the claim run of the report
# ---------------------------------------------------------------------------------------

def _cases(profile: str, device: str, seed: int):
    def pc(**kw):
        return ProblemConfig(device=device, **kw)

    rng = np.random.default_rng(seed)
    if profile == "tiny":
        grad = [(pc(tasks=(1, 1), heads=2, L=4, param="factored"), 8)]
        traj = [(pc(tasks=(1, 1), heads=2, L=4, param="factored", init_scale=0.3), dict(time=0.5))]
        trend = None
    elif profile == "quick":
        grad = [(pc(tasks=(2, 1), heads=2, L=8, param=p, basis=b), 32)
                for p in ("factored", "merged") for b in ("identity", "random")]
        traj = [(pc(tasks=(2, 1), heads=2, L=8, param=p, init_scale=0.3), dict(time=3.0))
                for p in ("factored", "merged")]
        # logit scale 8: the emergence lands at omega < 1/2, inside the expansion's accuracy
        # batch 1024: at 256 the exponent's standard error (0.17) does not resolve p ~ -0.4 at
        # Z_SE = 4 standard errors (p + 4 se = +0.31); at 1024, p = -0.52 +- 0.08 (measured)
        trend = (pc(tasks=(3,), heads=1, L=4, param="factored", logit_scale=8.0), [4, 8, 16, 32, 64],
                 TrainConfig(lr=0.05, time=4.0, batch=1024, records=9, seed=seed))
    else:
        grad = [(pc(tasks=(3, 3), heads=2, L=128, param=p, basis=b), 256)
                for p in ("factored", "merged") for b in ("identity", "random")]
        traj = [(pc(tasks=(2, 2), heads=2, L=32, param=p, init_scale=0.15), dict(time=10.0, base_prompts=2, record_every=5))
                for p in ("factored", "merged")]
        trend = (pc(tasks=(3, 3), heads=2, L=64, param="factored", logit_scale=8.0), [64, 128, 256, 512, 1024],
                 TrainConfig(lr=0.05, time=4.0, batch=2048, records=41, seed=seed))
    points = []
    for cfg, batch in grad:
        om = rng.uniform(0.05, 0.6, (cfg.heads, cfg.m))
        mu = rng.uniform(-1.5, 1.5, (cfg.heads, cfg.m))
        points.append((cfg, om, mu, batch))
    return points, traj, trend


def run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None) -> ClaimResult:
    """Claim 2 on a profile: (a) gradient projection, (b) trajectories, (c) expansion trend."""
    check_profile(profile)

    def body() -> ClaimResult:
        points, traj, trend = _cases(profile, device, seed)
        comps: list[Comparison] = []
        total = len(points) + len(traj) + (1 if trend else 0)
        done = 0
        for cfg, om, mu, batch in points:
            progress(f"{CLAIM_ID}: (a) gradient projection {cfg.param} {cfg.basis}", done / total)
            comps.append(check_gradient_projection(cfg, om, mu, batch=batch, seed=seed))
            done += 1
        for cfg, kw in traj:
            progress(f"{CLAIM_ID}: (b) full vs reduced trajectory {cfg.param}", done / total)
            comps.append(check_trajectory_agreement(cfg, seed=seed, **kw))
            done += 1
        if trend:
            progress(f"{CLAIM_ID}: (c) expansion vs full at L={trend[1]}", done / total)
            comps.append(check_expansion_trend(trend[0], trend[1], trend[2], seeds=(seed, seed + 1, seed + 2)))
        progress(f"{CLAIM_ID}: done", 1.0)
        figures = []
        traj_c = [c for c in comps if c.name.startswith("trajectory")]
        if traj_c:
            d = traj_c[0].details
            figures.append(value_panels(
                "spectral-reduction-trajectories", f"full model (points) vs reduced flow (lines): {traj_c[0].name}",
                d["t"], d["full_omega"], d["full_mu"], d["t"], d["red_omega"], d["red_mu"],
                "full", "reduced"))
        trend_c = [c for c in comps if c.name.startswith("expansion")]
        if trend_c:
            r = trend_c[0].details["runs"][-1]
            figures.append(value_panels(
                "spectral-reduction-expansion", f"full model (points) vs expansion flow (lines) at L={r['L']}",
                r["t"], r["omega"], r["mu"], r["ex_t"], r["ex_omega"], r["ex_mu"], "full", "expansion"))
        return comparisons_result(
            CLAIM_ID, TITLE, STATEMENT, comps, figures, {"profile": profile, "seed": seed},
            theory={"metric": "merged: f_omega = 1/r_i, f_mu = 1; factored: 2|omega|/(s r_i), 2|mu|",
                    "expansion_error_exponent": "< 0 (asymptotically -1)"},
            numerics={"worst": worst([c for c in comps if c.tolerance > 0]),
                      "trend": trend_c[0].measured if trend_c else None,
                      "trajectory_gap": [c.measured for c in traj_c]},
            tolerance={"value": {c.name: c.tolerance for c in comps},
                       "why": " | ".join(c.why for c in comps[:1] + traj_c[:1] + trend_c[:1])})

    return run_claim(CLAIM_ID, TITLE, STATEMENT, body)
