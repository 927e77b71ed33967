"""Claim 3: three phases -- warm-up, emergence, convergence.

What is run: the full model (``numerics.train.train``, fresh batches) from a small
decomposable init; its per-step batch losses are the measured loss curve.  The predicted
curve is the large-L expansion flow from the same init at the same L
(``theory.reduced_ode.integrate_expansion_flow``), on the same time grid (one point per
GD step); both are averaged over the same ~60 blocks of consecutive steps (the batch loss
of one step is too noisy: averaging k steps divides its noise by sqrt k).  The *single* definition ``theory.three_phases.phase_times`` is applied to both:
warm-up ends when the monotone fit has fallen by 10% of the total drop, emergence ends at
90%, convergence is the rest.

Checks (:func:`check_three_phases`):

1. the measured curve *has* the three phases as defined (:func:`has_three_phases`): the
   drop is clear of the noise (``PhaseTimes.defined``), 0 < warmup_end < emergence_end <
   t_end, and the mean descent rate of the emergence exceeds that of the warm-up and of
   the convergence;
2. measured and predicted phase ends agree within a tolerance built from
   - the grid: one bin width (a crossing is interpolated inside one bin);
   - the levels: a phase end is the crossing of a level L0 - f (L0 - Lend), f = 0.1, 0.9;
     an error dl in that level moves the crossing by dl / |dL/dt| (slope of the predicted
     curve there).  dl has two measured parts: the Monte-Carlo error of the measured curve
     relative to its own crossing level (Z_SE se over the evaluation prompts of
     l_b(t) - (1-f) l_b(0) - f l_b(end)), and f x the difference of the two curves' drops
     (a constant offset cancels; a different final level -- the expansion's O(L^-2) and
     saturation error, which claim 2 owns -- does not);
   - the time scale: the start-level difference beyond Z_SE se of the evaluation batch is the
     expansion's relative error at the init, a relative error of its rates too: add
     t x that / L0_pred;
   - the step size: GD with step lr is not the ODE; the same phase definition applied to
     the expansion loss along the GD *map* (:func:`discrete_expansion_curve`) gives the
     O(lr) shift of each phase end, added in full;
   - the run's own randomness: with fresh batches of B the warm-up growth is a noisy
     multiplicative process, and a phase time T moves by Z_SE sigma_v sqrt(lr T / B) / v
     (:func:`escape_time_spread`: relative growth rate v and its per-prompt std sigma_v
     measured at the init).
3. Perturbation: the warm-up end predicted with the wrong init-scale exponent.  The ODE's
   own warm-up ends at s0 and 2 s0 define its exponent p (T(s0) = T(2 s0) 2^-p; reported
   next to ``theory.three_phases.warmup_law``); the exponent off by -1 or +1 predicts
   T(s0) x 2 or T(s0) / 2, and both must be rejected at the same tolerance.
"""
from __future__ import annotations

import math

import numpy as np

import torch

from claims.base import ClaimResult, Figure, Series, no_progress, run_claim
from claims.common import (Z_SE, Comparison, check_profile, comparisons_result, initial_values, perturbation,
                           trajectory_of, worst)
from numerics.config import ProblemConfig
from numerics.data import make_generator, sample_prompts
from numerics.model import initial_semi_singular_values
from numerics.reduced import metric_factors, per_prompt_reduced_gradients, per_prompt_reduced_losses
from numerics.train import TrainConfig, train
from theory.reduced_ode import expansion_gd_map, expansion_loss, expansion_valid, integrate_expansion_flow
from theory.three_phases import nonincreasing_fit, phase_times

CLAIM_ID = "three-phases"
TITLE = "Three phases: warm-up, emergence, convergence"
STATEMENT = ("Training goes through a warm-up (loss falls slowly while heads build an inclination to tasks), "
             "an emergence (each head selects one task and the loss falls fast) and a convergence phase.")

def _crossing_slope(t, curve, time):
    """|dL/dt| of a curve at ``time`` (central difference over one grid step on each side)."""
    k = int(np.clip(np.searchsorted(t, time), 1, len(t) - 2))
    return abs(float((curve[k + 1] - curve[k - 1]) / (t[k + 1] - t[k - 1])))


def _pooled_points(fit, t, time):
    """Number of curve points the monotone fit pooled into its value at ``time``."""
    k = int(np.clip(np.searchsorted(t, time), 0, len(t) - 1))
    return int(np.sum(np.abs(fit - fit[k]) <= 1e-15 * max(1.0, abs(fit[k]))))


def discrete_expansion_curve(cfg, s0: float, lr: float, t: np.ndarray) -> np.ndarray:
    """Expansion loss along the *gradient-descent map* with step lr (not the ODE), at the
    times t (multiples of lr): what full GD does on D for the expansion loss.  Factored,
    balanced factors kappa = sqrt(s|omega|), nu = sqrt|mu|, one GD step on each factor:
    omega <- omega (1 - lr g_omega / (s r))^2, mu <- mu (1 - lr g_mu)^2; merged: the Euler
    step omega <- omega - lr g_omega / r, mu <- mu - lr g_mu.  Its phase times differ from
    the ODE's by the O(lr) discretisation shift that the comparison must allow."""
    om0, mu0 = initial_values(cfg.replace(init_scale=s0))
    oms, mus = expansion_gd_map(om0, mu0, cfg.tasks, cfg.L, cfg.sigma, cfg.param, cfg.logit_scale, lr, t,
                                on_exit="stop")
    out = [expansion_loss(om, mu, cfg.tasks, cfg.L, cfg.sigma) if expansion_valid(om) else math.nan
           for om, mu in zip(oms, mus)]
    return np.array(out + [math.nan] * (len(t) - len(out)))


def escape_time_spread(cfg, batch: int, lr: float, probe_batch: int = 512, seed: int = 77_777) -> dict:
    """Monte-Carlo spread of a phase time of an SGD run (fresh batches of ``batch``).

    In the warm-up every value grows at a relative rate v = x_dot / x (the metric makes it
    multiplicative for factored weights); a step adds lr v_B with noise lr sigma_v / sqrt B,
    so after time T log x has wandered by sigma_v sqrt(lr T / B) and the time at which it
    reaches a level moves by that over the mean rate: dT = sigma_v sqrt(lr T / B) / v.  v and
    sigma_v are measured at the init from the per-prompt gradients of the exact reduced
    loss on ``probe_batch`` prompts (theory's metric factors); the entry with the largest
    mean rate (the one that leads the emergence) is used.  Returns ``coef`` with
    dT = coef sqrt(T)."""
    om0, mu0 = (a.to(cfg.device, cfg.torch_dtype) for a in initial_semi_singular_values(cfg))
    prompts = sample_prompts(cfg, probe_batch, make_generator(seed, cfg.device))
    j_om, j_mu = per_prompt_reduced_gradients(om0, mu0, prompts, cfg)
    f_om, f_mu = (f.cpu().double().numpy() for f in metric_factors(om0, mu0, cfg))
    rel = np.concatenate([
        (-f_om[None] * j_om.cpu().double().numpy() / om0.cpu().numpy()[None]).reshape(probe_batch, -1),
        (-f_mu[None] * j_mu.cpu().double().numpy() / mu0.cpu().numpy()[None]).reshape(probe_batch, -1)], axis=1)
    v, sv = rel.mean(axis=0), rel.std(axis=0, ddof=1)
    k = int(np.argmax(v))
    if v[k] <= 0:
        return {"coef": math.inf, "rate": float(v[k]), "sigma": float(sv[k])}
    return {"coef": float(sv[k] * math.sqrt(lr / batch) / v[k]), "rate": float(v[k]), "sigma": float(sv[k])}


def phase_rates(pt, t_end: float) -> dict:
    """Mean rate of descent in each phase, in units of the total drop per unit time:
    0.1 / warm-up, 0.8 / emergence, 0.1 / convergence (the 10% / 90% definition)."""
    if not pt.defined:
        return {"warmup": math.nan, "emergence": math.nan, "convergence": math.nan}
    w, e = pt.warmup_end, pt.emergence_end
    rate = lambda frac, dt: frac / dt if dt > 0 else math.inf  # noqa: E731
    return {"warmup": rate(0.1, w), "emergence": rate(0.8, e - w), "convergence": rate(0.1, t_end - e)}


def has_three_phases(pt, t_end: float) -> bool:
    """The curve shows the three phases: the drop is clear of the noise (``pt.defined``),
    0 < warm-up end < emergence end < t_end, and the loss falls *faster* on average in the
    emergence than in the warm-up and in the convergence (without this any smooth
    decreasing curve would have a 10% and a 90% point)."""
    if not (pt.defined and 0 < pt.warmup_end < pt.emergence_end < t_end):
        return False
    r = phase_rates(pt, t_end)
    return bool(r["emergence"] > r["warmup"] and r["emergence"] > r["convergence"])


def check_three_phases(cfg, tcfg, eval_batch: int = 2048, eval_seed: int = 99_991) -> Comparison:
    """Train the full model from cfg's (small) init, find its phases with
    ``theory.three_phases.phase_times`` and compare with the expansion flow's.

    The measured curve is the loss of the trained model's decomposable part (omega, mu at
    each record; the off-D residual changes the loss only at second order) on one fixed
    evaluation batch of ``eval_batch`` prompts: common random numbers make the curve
    smooth in t (a single training batch loss has noise ~ sqrt(2 d / B), as large as the
    10% level that ends the warm-up), at the price of one level offset, the same at all
    times, of standard error ``eval_se``."""
    res = train(cfg, tcfg)
    tr = trajectory_of(res)
    t = tr.t
    evalset = sample_prompts(cfg, eval_batch, make_generator(eval_seed, cfg.device))
    per_prompt = []
    with torch.no_grad():
        for om, mu in zip(tr.omega, tr.mu):
            per = per_prompt_reduced_losses(torch.tensor(om, dtype=cfg.torch_dtype, device=cfg.device),
                                            torch.tensor(mu, dtype=cfg.torch_dtype, device=cfg.device), evalset, cfg)
            per_prompt.append(per.cpu().double().numpy())
    per_prompt = np.array(per_prompt)                 # (records, eval_batch)
    meas_curve = per_prompt.mean(axis=1)
    eval_se = float(np.max(per_prompt.std(axis=1, ddof=1)) / math.sqrt(eval_batch))
    meas = phase_times(t, meas_curve)
    width = float(t[1] - t[0])

    def ode_curve(s0):
        om0, mu0 = initial_values(cfg.replace(init_scale=s0))
        traj = integrate_expansion_flow(om0, mu0, cfg.tasks, cfg.L, cfg.sigma, cfg.param, cfg.logit_scale,
                                        t_end=float(t[-1]), t_eval=t)
        if traj.status != "t_end":
            raise RuntimeError(f"the expansion flow stopped early ({traj.status}) at t = {traj.t[-1]:.4g} for "
                               f"{cfg.tasks}, L={cfg.L}, s={cfg.logit_scale}: the phases need the whole curve; use a "
                               "logit scale with r s > 4 so the flow stays in 2 omega^2 < 1")
        return traj.loss

    pred_curve = ode_curve(cfg.init_scale)
    pred = phase_times(t, pred_curve)
    # the wrong-exponent perturbation: ODE warm-up at the reference scale 2 s0, rescaled
    pred_ref = phase_times(t, ode_curve(2 * cfg.init_scale))
    # T(s0) = T(2 s0) 2^-p with p the ODE's own exponent between s0 and 2 s0; the exponent
    # off by -1 / +1 predicts T(s0) x 2 / T(s0) / 2
    wrong_warmup = (2.0 * pred.warmup_end, 0.5 * pred.warmup_end) if pred.defined else (math.nan, math.nan)

    details = {"config": cfg.to_dict(), "train": tcfg.to_dict(), "measured": meas.to_dict(),
               "predicted": pred.to_dict(), "predicted_ref_2s0": pred_ref.to_dict(), "record_spacing": width,
               "eval_batch": eval_batch, "eval_se": eval_se,
               "t": t, "loss": meas_curve, "batch_loss": tr.loss, "ode_t": t, "ode_loss": pred_curve,
               "wall_seconds": res.wall_seconds}
    name = (f"phases tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} s={cfg.logit_scale:g} "
            f"s0={cfg.init_scale:g} B={tcfg.batch}")
    t_end = float(t[-1])
    shape_meas, shape_pred = phase_rates(meas, t_end), phase_rates(pred, t_end)
    details.update({"rates_measured": shape_meas, "rates_predicted": shape_pred})
    ordered = has_three_phases(meas, t_end)
    if not (ordered and has_three_phases(pred, t_end)):
        why = ("the measured curve does not show the three phases as defined" if not ordered
               else "the predicted curve does not show the three phases")
        return Comparison(name=name, measured=meas.to_dict(), predicted=pred.to_dict(), error=math.inf,
                          tolerance=0.0, why=why + f" ({meas.reason or pred.reason})",
                          perturbations=[perturbation("wrong init-scale exponent (no phases to compare)", math.inf, 0.0)], details=details)

    disc_curve = discrete_expansion_curve(cfg, cfg.init_scale, tcfg.lr, t)
    disc = phase_times(t, disc_curve) if np.all(np.isfinite(disc_curve)) else None
    details["predicted_gd_map"] = disc.to_dict() if disc is not None else None
    spread = escape_time_spread(cfg, tcfg.batch, tcfg.lr)
    details["escape_time_spread"] = spread
    fit = nonincreasing_fit(meas_curve)
    tols, errs, parts = {}, {}, {}
    for key, f in (("warmup_end", 0.1), ("emergence_end", 0.9)):
        tm, tp = getattr(meas, key), getattr(pred, key)
        slope = max(_crossing_slope(t, pred_curve, tp), 1e-12)
        # Monte-Carlo error of the curve *relative to its own crossing level*
        # l_f = (1-f) L(0) + f L(end), from the per-prompt losses of the evaluation batch:
        # the level offset common to all records cancels, what is left is the se of
        # l_b(t_cross) - (1-f) l_b(0) - f l_b(end) over prompts b
        k = int(np.clip(np.searchsorted(t, tm), 0, len(t) - 1))
        n_end = max(3, int(np.ceil(0.1 * len(t))))
        rel = per_prompt[k] - (1 - f) * per_prompt[0] - f * per_prompt[-n_end:].mean(axis=0)
        mc_level = Z_SE * max(float(rel.std(ddof=1)) / math.sqrt(eval_batch),
                             meas.noise / math.sqrt(max(1, _pooled_points(fit, t, tm))))
        # a constant offset between the curves cancels (each level is relative to its own
        # curve); what moves the crossing is the difference of the drops, by f x it
        level_offset = f * abs((meas.loss_start - meas.loss_end) - (pred.loss_start - pred.loss_end))
        # the start-level difference beyond the evaluation batch's Z_SE se is the expansion's
        # relative error at the init, a relative error of its rates as well
        rate = tp * max(abs(meas.loss_start - pred.loss_start) - Z_SE * eval_se, 0.0) / pred.loss_start
        # O(lr) discretisation: the GD map's phase time minus the ODE's (if the map left the
        # domain the whole prediction is refused rather than the term dropped)
        disc_shift = abs(getattr(disc, key) - tp) if disc is not None and disc.defined else math.inf
        sgd = Z_SE * spread["coef"] * math.sqrt(tp)
        tols[key] = width + (mc_level + level_offset) / slope + rate + disc_shift + sgd
        parts[key] = {"record_spacing": width, "mc_level": mc_level / slope, "level_offset": level_offset / slope,
                      "rate": rate, "gd_map_shift": disc_shift, "sgd_spread": sgd}
        errs[key] = abs(tm - tp)
    ratio = max(errs[k] / tols[k] for k in tols)
    wrong_ratios = [abs(meas.warmup_end - w) / tols["warmup_end"] for w in wrong_warmup]
    details.update({"tolerances": tols, "tolerance_parts": parts, "errors": errs, "wrong_warmup_end": wrong_warmup,
                    "ode_warmup_exponent": math.log(pred.warmup_end / pred_ref.warmup_end) / math.log(0.5)})
    return Comparison(
        name=name,
        measured={"warmup_end": meas.warmup_end, "emergence_end": meas.emergence_end},
        predicted={"warmup_end": pred.warmup_end, "emergence_end": pred.emergence_end},
        error=ratio, tolerance=1.0,
        why=(f"per phase end: one record spacing + GD-map shift + {Z_SE:g} x SGD escape-time spread + ({Z_SE:g} x "
             "max(eval-batch se, noise/sqrt(pooled)) + level offset of the expansion)/|dL/dt| + "
             "t x relative start-level error; compared as the max ratio |t_meas - t_pred| / tol"),
        perturbations=[perturbation(
            f"warm-up end with the init-scale exponent off by {dp:+d} (T(s0) x 2^{-dp:+d})", wr, 1.0,
            wrong_warmup_end=w) for dp, w, wr in zip((-1, 1), wrong_warmup, wrong_ratios)],
        details=details,
    )


def horizon(cfg, lr: float, factor: float = 2.0, t_max: float = 200.0) -> float:
    """A run length that shows all three phases: ``factor`` x the emergence end the
    expansion flow predicts (first found on [0, t_max]), rounded up to a multiple of lr."""
    om0, mu0 = initial_values(cfg)
    grid = np.linspace(0.0, t_max, 401)
    traj = integrate_expansion_flow(om0, mu0, cfg.tasks, cfg.L, cfg.sigma, cfg.param, cfg.logit_scale,
                                    t_end=t_max, t_eval=grid)
    if traj.status not in ("t_end",):
        raise RuntimeError(f"the expansion flow stopped early ({traj.status}) at t = {traj.t[-1]:.4g}; "
                           "use a logit scale with r s > 4 so the flow stays in 2 omega^2 < 1")
    # the drop on [0, t_max] includes the slow valley drift; take the 90% point of the
    # fast part: the first time the loss is within 10% of the drop of its value at t_max / 4
    quarter = grid <= t_max / 4
    pt = phase_times(grid[quarter], traj.loss[quarter])
    if not pt.defined:
        raise RuntimeError(f"the expansion flow shows no phases on [0, {t_max / 4:g}]: {pt.reason}")
    return float(math.ceil(factor * pt.emergence_end / lr) * lr)


def phases_figure(c: Comparison) -> Figure:
    """The measured loss curve (points), the ODE's (line) and the measured phases (spans)."""
    d = c.details
    t, loss = np.asarray(d["t"]), np.asarray(d["loss"])
    stride = 1
    meas = d["measured"]
    spans = []
    if meas.get("defined"):
        spans = [{"x0": 0.0, "x1": meas["warmup_end"], "label": "warm-up"},
                 {"x0": meas["warmup_end"], "x1": meas["emergence_end"], "label": "emergence"},
                 {"x0": meas["emergence_end"], "x1": float(t[-1]), "label": "convergence"}]
    return Figure(
        name="three-phases-loss", title=f"loss curve and its phases ({c.name})", xlabel="t", ylabel="loss",
        yscale="log",
        series=[Series("full model (loss on a fixed evaluation batch)", list(map(float, t[::stride])), list(map(float, loss[::stride])),
                       "points"),
                Series("expansion ODE", list(map(float, d["ode_t"])), list(map(float, d["ode_loss"])), "line")],
        spans=spans)


def _cases(profile: str, device: str, seed: int):
    """Factored weights (the paper's architecture); logit scale s = 4 so that r s > 4 and the
    emergence lands inside the expansion's domain 2 omega^2 < 1
    (claims/spectral_reduction.py); run length: 2 x the ODE's emergence end (:func:`horizon`)."""
    def case(batch, records, **kw):
        cfg = ProblemConfig(device=device, logit_scale=4.0, param="factored", **kw)
        return cfg, TrainConfig(lr=0.05, time=horizon(cfg, 0.05), batch=batch, records=records, seed=seed)

    if profile == "tiny":
        return [case(128, 31, tasks=(3,), heads=1, L=32, init_scale=0.04)]
    if profile == "quick":
        return [case(128, 61, tasks=(3, 3), heads=2, L=32, init_scale=s0) for s0 in (0.03, 0.05)] + \
               [case(128, 61, tasks=(4,), heads=1, L=64, init_scale=0.05)]
    return [case(2048, 121, tasks=(3, 3), heads=2, L=128, init_scale=s0) for s0 in (0.01, 0.02, 0.05)] + \
           [case(2048, 121, tasks=(4, 4, 4), heads=3, L=256, init_scale=0.02)]


def run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None) -> ClaimResult:
    """Claim 3 on a profile."""
    check_profile(profile)

    def body() -> ClaimResult:
        cases = _cases(profile, device, seed)
        comps = []
        for j, (cfg, tcfg) in enumerate(cases):
            progress(f"{CLAIM_ID}: {cfg.param} s0={cfg.init_scale:g} ({j + 1}/{len(cases)})", j / len(cases))
            comps.append(check_three_phases(cfg, tcfg))
        progress(f"{CLAIM_ID}: done", 1.0)
        return comparisons_result(
            CLAIM_ID, TITLE, STATEMENT, comps, [phases_figure(comps[0])] if comps else [],
            {"profile": profile, "seed": seed},
            theory={"definition": "theory.three_phases.phase_times (10% / 90% of the drop of the monotone fit)",
                    "predicted": [c.predicted for c in comps]},
            numerics={"measured": [c.measured for c in comps], "worst": worst(comps)},
            tolerance={"value": [c.details.get("tolerances") for c in comps], "why": comps[0].why if comps else ""})

    return run_claim(CLAIM_ID, TITLE, STATEMENT, body)
