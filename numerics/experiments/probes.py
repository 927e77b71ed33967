"""Short runs and probes of claims 1, 2 and 7 and of the reduced-model boundaries: the
experiments behind the block-structure, spectral-reduction and optimality checks and the
boundaries' reduced flows, each returning a frozen result (claims compare, they never loop).

- claim 1: GD on one fixed (exactly G-invariant, or deliberately not) batch
  (:func:`fixed_batch_run`, :func:`symmetric_batch_runs`); training on fresh batches with the
  one-step probes of the off-D step noise at every record, a start kicked into D_+ \\ D and a
  non-decomposable start (:func:`fresh_batch_runs`);
- claim 2: the full velocity read out on D against the reduced gradient on the same batch
  (:func:`gradient_projection`); full GD and the reduced flow on one symmetric batch at lr and
  lr/2 (Richardson) and with a wrong metric (:func:`richardson_runs`); the full model on fresh
  batches (:func:`trend_run`, one per L and prompt stream) and its gaps to the expansion flow
  (:func:`expansion_gaps`);
- claim 7: the signed decomposable search with H shared heads (:func:`decomposable_search`,
  and its best point, :func:`best_decomposable`, also used by the boundary rows of claims 5-6),
  the full merged models trained from random starts (:func:`full_merged_start`), the table of
  candidates at H (:func:`candidates_at_heads`), the best point run as a full model
  (:func:`best_as_full_model`) and the constant at 2m heads at one L (:func:`constant_row`).

- the boundaries' runs of the exact reduced model: one flow (:func:`reduced_flow`), two end points
  on shared prompts (:func:`paired_end_losses`), fewer heads than tasks (:func:`fewer_heads_end`),
  one head on one block (:func:`saturation_scan`, :func:`monte_carlo_losses`).

Every function runs with one torch thread (``numerics.experiments.one_thread``).  The runs claims
1, 2 and 7 plan are need kinds (``numerics.engine``), registered beside the function each runs.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np
import torch

from numerics import engine, exact_reduced
from numerics.config import ProblemConfig
from numerics.engine import kind
from numerics.config import make_generator, sample_prompts
from numerics.evaluate import held_out_loss, mean_se, paired_ratio
from numerics.train import shape_key
from numerics.exact_reduced import (FamilyMinimum, allocated_minimum, best_found_minimum, evaluate, fit_sample_size,
                                    measure, minima_seconds, minimise_family, optimal_mu_at)
from numerics.experiments import one_thread
from numerics.experiments.converged import converged_for, last_quarter, stage_descent, stage_tolerance
from numerics.model import (MultiHeadAttention, TrainingDiverged, full_velocity_on_D, initial_semi_singular_values,
                            initial_values)
from numerics.model import metric_factors, per_prompt_reduced_gradients, reduced_gradient
from numerics.engine import case_seed
from numerics.model import symmetrize_full, symmetrize_subgroup
from numerics.train import TrainConfig, train, train_reduced, train_reduced_many
from theory import optimality as th_opt
from theory.block_structure import group_order, off_decomposable_parts
from theory.reduced_ode import expansion_gd_map, project_decomposable

TWIN_SIZE = 1e-9
"""Relative size of the off-D perturbation of the twin run that measures amplification (claim 1)."""


@dataclass(frozen=True)
class Run:
    """A recorded run as arrays: t (n,), loss (n,), omega/mu (n, H, m), residual (n,); ``parts``:
    the off-D parts of the merged weights per record (claim 1's fixed-batch runs), ``diverged``:
    a run stopped at divergence (its records up to the last finite one)."""

    t: np.ndarray
    loss: Optional[np.ndarray]
    omega: Optional[np.ndarray]
    mu: Optional[np.ndarray]
    residual: np.ndarray
    parts: tuple = ()
    diverged: bool = False


def _arrays(res, parts=()) -> Run:
    recs = res.trajectory
    return Run(t=np.array([r.t for r in recs], float), loss=np.array([r.loss for r in recs], float),
               omega=np.array([r.omega for r in recs], float), mu=np.array([r.mu for r in recs], float),
               residual=np.array([r.residual for r in recs], float), parts=tuple(parts))


def _merged_numpy(model) -> tuple[np.ndarray, np.ndarray]:
    W, U = model.merged_weights()
    return W.detach().cpu().double().numpy(), U.detach().cpu().double().numpy()


# ---------------------------------------------------------------------------------------
# claim 1 (and 2): GD on one fixed batch
# ---------------------------------------------------------------------------------------

@one_thread
def fixed_batch_run(cfg, prompts, lr: float, steps: int, every: int, start=None, until_divergence: bool = False,
                    parts: bool = False, metric_factor: Optional[float] = None) -> Run:
    """GD on one fixed batch from cfg's init (or ``start``), recorded every ``every`` steps:
    the full model (``numerics.train.train``), or with ``metric_factor`` the reduced flow with
    theory's metric times that factor (``train_reduced``).  ``parts``: also the off-D parts of
    the merged weights at each record.  ``until_divergence``: a run that diverges (a batch off
    the symmetry can make the flow blow up once it leaves D) returns its records up to the
    last finite one."""
    tcfg = TrainConfig(lr=lr, time=lr * steps, records=2)
    if metric_factor is not None:
        def metric(om, mu):
            return tuple(metric_factor * f for f in metric_factors(om, mu, cfg))
        return _arrays(train_reduced(cfg, tcfg, batches=lambda k: prompts, record_every=every, metric=metric))
    got, early = [], {"t": [], "residual": []}

    def record_parts(step, t, model, loss):
        W, U = _merged_numpy(model)
        got.append(off_decomposable_parts(W, U, cfg.tasks, cfg.basis_numpy()))
        if until_divergence and np.all(np.isfinite(W)) and np.all(np.isfinite(U)):
            early["t"].append(t)
            early["residual"].append(model.semi_singular_values().residual)

    try:
        res = train(cfg, tcfg, batches=lambda k: prompts, record_every=every,
                    on_record=record_parts if (parts or until_divergence) else None, start=start)
    except TrainingDiverged:
        if not until_divergence:
            raise
        return Run(t=np.array(early["t"]), loss=None, omega=None, mu=None, residual=np.array(early["residual"]),
                   parts=tuple(got), diverged=True)
    return _arrays(res, got)


@dataclass(frozen=True)
class SymmetricBatchRuns:
    """Claim 1 on one fixed batch of whole G-orbits: the run, its twin (a start moved off D by
    TWIN_SIZE, measuring the amplification of off-D errors), and the runs on the wrong batches
    ({keep: Run}: a subgroup's orbits, and "one_dropped": a G-orbit minus one element)."""

    run: Run
    twin: Run
    wrong: dict
    batch: int


def _gd_seconds(cfg, steps: int, prompts: int) -> float:
    """CPU seconds of ``steps`` full-model GD steps on ``prompts`` prompts at cfg's shape and dtype."""
    return float(steps) * engine.step_seconds(cfg.tasks, cfg.heads, cfg.L, prompts, dtype=cfg.dtype)


def _symmetric_cost(cfg, steps, base_prompts, wrong_keeps, **_) -> float:
    # the run, its twin, the one-dropped orbit and each wrong batch: |G| base_prompts prompts a step
    return _gd_seconds(cfg, (3 + len(wrong_keeps)) * steps, group_order(cfg.tasks) * base_prompts)


@kind("symmetric_batch_runs", cost=_symmetric_cost)
@one_thread
def symmetric_batch_runs(cfg, lr: float, steps: int, base_prompts: int, seed: int, records: int,
                         wrong_keeps: Sequence[str] = ()) -> SymmetricBatchRuns:
    """GD from cfg's init on ``base_prompts`` whole G-orbits (prompt stream ``seed``), recorded
    ``records`` times; the twin run (its off-D perturbation drawn from case ("twin") of ``seed``);
    the same GD on the orbits of each subgroup in ``wrong_keeps`` and on a G-orbit with one element
    dropped (stopped at divergence)."""
    base = sample_prompts(cfg, base_prompts, make_generator(seed, cfg.device))
    sym = symmetrize_full(base, cfg)
    every = max(1, steps // (records - 1))
    run = fixed_batch_run(cfg, sym, lr, steps, every, parts=True)
    twin = MultiHeadAttention(cfg)
    tgen = torch.Generator().manual_seed(case_seed(seed, "twin"))
    with torch.no_grad():
        for p in twin.parameters():
            p += TWIN_SIZE * (p.abs().max() + 1e-3) * torch.randn(p.shape, generator=tgen, dtype=torch.float64).to(p)
    run_twin = fixed_batch_run(cfg, sym, lr, steps, every, start=twin, parts=True)
    batches = [(keep, symmetrize_subgroup(base, cfg, keep)) for keep in wrong_keeps]
    batches.append(("one_dropped", symmetrize_full(base, cfg, drop=1)))
    wrong = {keep: fixed_batch_run(cfg, b, lr, steps, every, until_divergence=True) for keep, b in batches}
    return SymmetricBatchRuns(run=run, twin=run_twin, wrong=wrong, batch=sym.batch)


# ---------------------------------------------------------------------------------------
# claim 1: fresh batches, the off-D step noise probes, broken starts
# ---------------------------------------------------------------------------------------

def step_noise_probes(cfg, lr: float, batch: int, omega, mu, n_probe: int, seed: int) -> np.ndarray:
    """(records, n_probe): at each recorded decomposable point (omega, mu), ||P_perp(theta_1 -
    theta_0)||^2 on each of ``n_probe`` fresh batches: the squared norm of the off-D part of the
    change of the merged weights (W, U) in one GD step of size lr (``numerics.train.train``, one
    step on that batch); one probe prompt stream of ``seed`` drawn in record order."""
    gen = make_generator(seed, cfg.device)
    one_step = TrainConfig(lr=lr, time=lr, records=2)
    out = np.empty((len(omega), n_probe))
    for j, (om, m_) in enumerate(zip(omega, mu)):
        base = MultiHeadAttention.from_semi_singular_values(cfg, om, m_)
        W0, U0 = _merged_numpy(base)
        for k in range(n_probe):
            prompts = sample_prompts(cfg, batch, gen)
            res = train(cfg, one_step, batches=lambda i: prompts, start=copy.deepcopy(base))
            dW, dU = (x - x0 for x, x0 in zip(_merged_numpy(res.final_model), (W0, U0)))
            dWD, dUD = project_decomposable(dW, dU, cfg.tasks, cfg.basis_numpy())
            out[j, k] = float(np.sum((dW - dWD) ** 2) + np.sum((dU - dUD) ** 2))
    return out


def accumulated_noise(t: np.ndarray, lr: float, samples: np.ndarray, tail: float) -> dict:
    """The accumulated variance of the off-D noise of the GD steps up to each record time
    ``t``: sum over steps of nu^2 (between two records the larger of the two ends), nu^2 the
    mean of the probes' squared norms ``samples`` (records, n_probe), replaced by its upper
    confidence bound at tail probability ``tail``.

    nu^2 is a mean of n_probe squared norms of a Gaussian quadratic form, chi^2_k / k
    distributed about its mean for k effective dimensions (k = 2 / CV^2); k = 1 is the most
    likely to be underestimated.  k is estimated from the probes pooled over the records (each
    normalised by its record's mean) and halved for that estimate's own error (floor 1); the
    accumulated variance is replaced by var_hat N k / chi2_{N k}^{-1}(tail), N = the
    n_probe (j + 1) probes behind record j.  (Measured, (2,), H = 1, L = 179, B = 32: the
    probes' squared norms have median/mean 0.42 and max/mean 13 over 200 draws, i.e. k ~ 1;
    with the plain mean of 2 probes one Hypothesis draw in ~40 exceeded the bound.)
    Returns nu2, rms (sqrt of the bound), rms_point_estimate, confidence_factor,
    effective_dimensions."""
    from scipy.stats import chi2
    n_probe = samples.shape[1]
    nu2 = samples.mean(axis=1)
    steps = np.rint(np.diff(t) / lr)
    var_hat = np.concatenate([[0.0], np.cumsum(steps * np.maximum(nu2[:-1], nu2[1:]))])
    z = samples / np.maximum(nu2[:, None], 1e-300)
    cv2 = float(np.sum((z - 1.0) ** 2) / max(z.size - len(t), 1)) if n_probe > 1 else 2.0
    k_eff = max(1.0, 0.5 * 2.0 / max(cv2, 1e-12))
    n_used = n_probe * np.arange(1, len(t) + 1) * k_eff
    confidence = n_used / chi2.ppf(tail, n_used)
    return {"nu2": nu2, "rms": np.sqrt(var_hat * confidence), "rms_point_estimate": np.sqrt(var_hat),
            "confidence_factor": confidence, "effective_dimensions": k_eff}


def kicked_start(cfg, size: float, seed: int) -> MultiHeadAttention:
    """cfg's decomposable start moved off D inside D_+ = {W_XX, U_Y unrestricted}: a random
    kick of relative size ``size`` on the X-X block of the QK weight (K for factored, W for
    merged) and on the Y block of the OV weight (O for factored, U for merged), drawn from ``seed``."""
    model = MultiHeadAttention(cfg)
    d = cfg.d
    gen = torch.Generator().manual_seed(seed)
    qk, ov = ("K", "O") if cfg.param == "factored" else ("W", "U")
    with torch.no_grad():
        for name, block in ((qk, (slice(None), slice(0, d), slice(0, d))), (ov, (slice(None), slice(None), slice(d, None)))):
            p = getattr(model, name)
            view = p[block]
            noise = torch.randn(view.shape, generator=gen, dtype=torch.float64).to(p)
            view += size * view.abs().max() * noise / noise.abs().max()
    return model


@dataclass(frozen=True)
class FreshBatchRuns:
    """Claim 1 on fresh batches: the run from cfg's decomposable init, its step-noise probes
    ((records, n_probe), :func:`step_noise_probes`), the residuals of the broken starts (None
    where not run), the final batch loss and the wall time of the run."""

    run: Run
    probes: np.ndarray
    residual_kicked: Optional[np.ndarray]
    residual_random_full: Optional[np.ndarray]
    loss_tail: float
    wall_seconds: float


def _fresh_cost(cfg, tcfg, n_probe, kicked, random_full, **_) -> float:
    # the run and each broken start (round(time / lr) steps), and records x n_probe one-step probes
    return _gd_seconds(cfg, (1 + kicked + random_full) * round(tcfg.time / tcfg.lr) + tcfg.records * n_probe,
                       tcfg.batch)


@kind("fresh_batch_runs", cost=_fresh_cost)
@one_thread
def fresh_batch_runs(cfg, tcfg, n_probe: int, kick: float, kicked: bool, random_full: bool,
                     seed: int) -> FreshBatchRuns:
    """Train from cfg's init on fresh batches (prompt stream ``seed``; tcfg's own seed is not
    read); probe the off-D step noise at every record (stream of case ("probes") of ``seed``);
    train from :func:`kicked_start` (kick drawn from case ("kick")) where ``kicked`` and from a
    ``random_full`` start where ``random_full``, on the same prompt stream."""
    tcfg = replace(tcfg, seed=int(seed))
    res = train(cfg, tcfg)
    run = _arrays(res)
    probes = step_noise_probes(cfg, tcfg.lr, tcfg.batch, run.omega, run.mu, n_probe, case_seed(seed, "probes"))
    rk = (_arrays(train(cfg, tcfg, start=kicked_start(cfg, kick, case_seed(seed, "kick")))).residual
          if kicked else None)
    rf = (_arrays(train(cfg.replace(init="random_full", init_omega=None, init_mu=None), tcfg)).residual
          if random_full else None)
    return FreshBatchRuns(run=run, probes=probes, residual_kicked=rk, residual_random_full=rf, loss_tail=res.loss,
                          wall_seconds=res.wall_seconds)


# ---------------------------------------------------------------------------------------
# claim 2
# ---------------------------------------------------------------------------------------

@one_thread
def gradient_projection(cfg, omega, mu, batch: int, seed: int) -> dict:
    """On one batch (stream ``seed``) at the point (omega, mu) of D: the full model's velocity
    read out on D (``full_velocity_on_D``: v_om, v_mu and its off-D residual ``off``), the
    reduced gradient (g_om, g_mu) and the mean over prompts of |per-prompt gradient| (abs_om,
    abs_mu: the scale the rounding error is relative to)."""
    prompts = sample_prompts(cfg, batch, make_generator(seed, cfg.device))
    v_om, v_mu, off = full_velocity_on_D(cfg, omega, mu, prompts)
    g_om, g_mu = (g.cpu().double().numpy() for g in reduced_gradient(omega, mu, prompts, cfg))
    j_om, j_mu = per_prompt_reduced_gradients(omega, mu, prompts, cfg)
    return {"omega": np.asarray(omega, float), "mu": np.asarray(mu, float), "v_om": v_om, "v_mu": v_mu, "off": off,
            "g_om": g_om, "g_mu": g_mu, "abs_om": np.abs(j_om.cpu().double().numpy()).mean(axis=0),
            "abs_mu": np.abs(j_mu.cpu().double().numpy()).mean(axis=0)}


@kind("gradient_projection", cost=lambda cfg, batch, **_: _gd_seconds(cfg, 3, batch))
def gradient_projection_at_random_point(cfg, batch: int, omega_range: tuple, mu_range: tuple, seed: int) -> dict:
    """:func:`gradient_projection` at a point of D drawn uniformly from ``omega_range`` x
    ``mu_range`` per entry (case ("point of D") of ``seed``), prompt stream ``seed``."""
    rng = np.random.default_rng(case_seed(seed, "point of D"))
    omega, mu = rng.uniform(*omega_range, (cfg.heads, cfg.m)), rng.uniform(*mu_range, (cfg.heads, cfg.m))
    return gradient_projection(cfg, omega, mu, batch, seed)


def symmetric_prompts(cfg, base_prompts: int, seed: int):
    """``base_prompts`` whole G-orbits (prompt stream ``seed``)."""
    return symmetrize_full(sample_prompts(cfg, base_prompts, make_generator(seed, cfg.device)), cfg)


@one_thread
def stiffness_step(cfg, prompts, time: float, max_relative_step: float) -> float:
    """The GD step of a run of length ``time`` on the fixed batch ``prompts`` chosen from the
    stiffness of the reduced flow there: the largest relative velocity |x_dot / x| at cfg's init
    (theory's metric, ``numerics.model.metric_factors``) times lr is at most
    ``max_relative_step``, lr <= 0.05, and time / lr an integer >= 2."""
    om0, mu0 = (a.numpy().copy() for a in initial_semi_singular_values(cfg))
    g_om, g_mu = (g.cpu().double().numpy() for g in reduced_gradient(om0, mu0, prompts, cfg))
    f_om, f_mu = (f.cpu().double().numpy() for f in metric_factors(torch.as_tensor(om0, dtype=torch.float64),
                                                                    torch.as_tensor(mu0, dtype=torch.float64), cfg))
    x = np.abs(np.concatenate([om0.ravel(), mu0.ravel()]))
    v = np.abs(np.concatenate([(f_om * g_om).ravel(), (f_mu * g_mu).ravel()]))
    rel = float(np.max(v / np.maximum(x, 1e-12)))
    return time / max(2, int(math.ceil(time / min(0.05, max_relative_step / max(rel, 1e-12)))))


def _richardson_cost(cfg, lr, time, base_prompts, **_) -> float:
    # five fixed-batch runs (lr, lr/2 twice, the wrong metric: 7 x time/lr steps), the reduced ones priced as full
    # GD; a step chosen from the stiffness (lr None) priced at 0.05, the largest it can be
    return _gd_seconds(cfg, 7 * round(time / (lr or 0.05)), group_order(cfg.tasks) * base_prompts)


@kind("richardson_runs", cost=_richardson_cost)
@one_thread
def richardson_runs(cfg, lr: Optional[float], time: float, base_prompts: int, every: int, wrong_factor: float,
                    seed: int, max_relative_step: float = 0.01) -> dict:
    """On ``base_prompts`` whole G-orbits (:func:`symmetric_prompts`, stream ``seed``), full GD and
    the reduced flow (theory's metric) over ``time`` at lr and lr/2 (every record of the lr run
    compared with every second of the lr/2 run), and the reduced flow with the metric times
    ``wrong_factor``: {"full", "full_half", "red", "red_half", "wrong"}, with the step ``lr``
    (None: :func:`stiffness_step` at ``max_relative_step``) and the ``batch`` size."""
    prompts = symmetric_prompts(cfg, base_prompts, seed)
    lr = stiffness_step(cfg, prompts, time, max_relative_step) if lr is None else lr
    steps = int(round(time / lr))
    return {"full": fixed_batch_run(cfg, prompts, lr, steps, every),
            "full_half": fixed_batch_run(cfg, prompts, lr / 2, 2 * steps, 2 * every),
            "red": fixed_batch_run(cfg, prompts, lr, steps, every, metric_factor=1.0),
            "red_half": fixed_batch_run(cfg, prompts, lr / 2, 2 * steps, 2 * every, metric_factor=1.0),
            "wrong": fixed_batch_run(cfg, prompts, lr, steps, every, metric_factor=wrong_factor),
            "lr": lr, "steps": steps, "batch": prompts.batch}


@kind("trend_run", cost=lambda cfg, tcfg, **_: _gd_seconds(cfg, round(tcfg.time / tcfg.lr), tcfg.batch))
@one_thread
def trend_run(cfg, tcfg, seed: int) -> Run:
    """The full model trained on fresh batches (prompt stream ``seed``; tcfg's own seed is not
    read), as arrays."""
    return _arrays(train(cfg, replace(tcfg, seed=int(seed))))


def relative_gap(omega, mu, omega_ref, mu_ref) -> np.ndarray:
    """(omega - omega_ref)/max|omega_ref| and (mu - mu_ref)/max|mu_ref| over a run, flattened
    (each value over its scale: mu ~ 1/omega, so absolute errors of mu would hide omega's)."""
    so = max(float(np.max(np.abs(omega_ref))), 1e-12)
    sm = max(float(np.max(np.abs(mu_ref))), 1e-12)
    return np.concatenate([((omega - omega_ref) / so).ravel(), ((mu - mu_ref) / sm).ravel()])


def trajectory_gap(omega, mu, omega_ref, mu_ref) -> float:
    """The rms of :func:`relative_gap` over a run: the gap b of one noiseless trajectory to a
    reference (what :func:`noise_corrected_bias` estimates from noisy runs)."""
    return float(np.sqrt(np.mean(relative_gap(omega, mu, omega_ref, mu_ref) ** 2)))


def expansion_gaps(cfg, Ls, lr: float, per_L: dict) -> tuple[dict, list]:
    """Per metric (cfg's parametrisation's and the other's) the noise-corrected gap (b(L), se(b))
    (:func:`noise_corrected_bias`) of the full runs ``per_L`` ({L: [Run per prompt stream]}) to
    that metric's expansion flow discretised by the runs' GD step ``lr``
    (``theory.reduced_ode.expansion_gd_map``), each value relative to its scale
    (:func:`relative_gap`); and per L the first run beside cfg's metric's map (for a figure)."""
    metric = {cfg.param: [], ("merged" if cfg.param == "factored" else "factored"): []}
    runs = []
    for L in Ls:
        om0, mu0 = initial_values(cfg.replace(L=L))
        t = per_L[L][0].t
        ex = {param: expansion_gd_map(om0, mu0, cfg.tasks, L, cfg.sigma, param, cfg.logit_scale, lr, t)
              for param in metric}
        runs.append({"L": L, "t": t, "omega": per_L[L][0].omega, "mu": per_L[L][0].mu, "ex_t": t,
                     "ex_omega": ex[cfg.param][0], "ex_mu": ex[cfg.param][1]})
        for param, ref in ex.items():
            metric[param].append(noise_corrected_bias(np.array([relative_gap(r.omega, r.mu, *ref) for r in per_L[L]])))
    return {param: np.array(est).T for param, est in metric.items()}, runs


def noise_corrected_bias(G: np.ndarray) -> tuple[float, float]:
    """(b, se(b)) from the gap trajectories G (n streams x elements): b^2 = mean(Gbar^2) -
    mean(var_s G) / n (the variance across streams is the noise of one run), se = sqrt(mean
    var / n); b floored at 0.1 se (a log fit needs b > 0)."""
    n = G.shape[0]
    noise = float(np.mean(G.var(axis=0, ddof=1)))
    b2 = float(np.mean(G.mean(axis=0) ** 2)) - noise / n
    se = math.sqrt(noise / n)
    return math.sqrt(max(b2, (0.1 * se) ** 2)), se


def log_log_slope(x, y, y_se) -> tuple[float, float]:
    """Weighted least squares of log y on log x, weights (y / y_se)^2 (se(log y) = y_se / y):
    the slope and its standard error 1/sqrt(sum w (log x - mean)^2)."""
    lx, ly = np.log(np.asarray(x, float)), np.log(y)
    wt = (y / y_se) ** 2
    xm = np.sum(wt * lx) / np.sum(wt)
    sxx = np.sum(wt * (lx - xm) ** 2)
    return float(np.sum(wt * (lx - xm) * ly) / sxx), float(1.0 / math.sqrt(sxx))


# ---------------------------------------------------------------------------------------
# claim 7: the best decomposable attention with H shared heads, trained full models
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecomposableSearch:
    """The allocated minimum (the gradient-flow limit) and the H-head decomposable candidates,
    all measured on one paired evaluation sample: ``fixed`` constructions taken as they are
    (the limit itself as an H-head model where H >= m, optimally scaled linear attention where
    H >= m + 1), then one signed search per start of ``theory.optimality.search_starts``."""

    allocated: FamilyMinimum
    candidates: tuple
    fixed: int


def _search_cost(tasks, H, L, sigma, device, random_starts, fit_elements, eval_prompts) -> float:
    # the allocated minimum, one L-BFGS-B search per start and every candidate on the evaluation sample
    starts = (H >= len(tasks)) + (H >= len(tasks) + 1) + 1 + random_starts
    return (exact_reduced.minima_seconds(tasks, L, 0, fit_elements)
            + engine.fit_seconds(tasks, H, L, exact_reduced.fit_sample_size(H, L, fit_elements), starts=starts)
            + engine.marginal_seconds(tasks, H, L, eval_prompts, points=starts + 1))


@kind("decomposable_search", cost=_search_cost)
@one_thread
def decomposable_search(tasks, H: int, L: int, sigma: float, seed: int, device="cpu", random_starts: int = 2,
                        fit_elements: int = 2 ** 19, eval_prompts: int = 4096) -> DecomposableSearch:
    """See :class:`DecomposableSearch`.  Every omega and mu free (signs free, heads shared
    between tasks), one local search per start (numerics.exact_reduced.minimise_family) on a fit
    sample of ``fit_elements`` (prompts x H x L), evaluated on ``eval_prompts`` paired prompts.
    Seeds: the cases "allocated fit", "fit", "evaluation" and "random starts" of ``seed``."""
    tasks, H, L, sigma, seed = tuple(int(r) for r in tasks), int(H), int(L), float(sigma), int(seed)
    m = len(tasks)
    alloc = allocated_minimum(tasks, L, sigma, case_seed(seed, "allocated fit"), device, fit_elements)
    full = np.ones((H, m), bool)
    n_fit = max(128, fit_elements // (H * L))
    decs = [minimise_family(tasks, L, sigma, full, full, [start], case_seed(seed, "fit"), n_fit=n_fit,
                            family=f"{H} shared heads from {name}", device=device)
            for name, start in th_opt.search_starts(tasks, H, alloc.omega, random_starts,
                                                    case_seed(seed, "random starts"))]
    fixed = []
    if H >= m:
        om, mu_ = np.zeros((H, m)), np.zeros((H, m))
        om[:m], mu_[:m] = alloc.omega, alloc.mu
        fixed.append(FamilyMinimum(f"{H} heads: the limit itself", tasks, L, sigma, om, mu_, alloc.fit_loss))
    if th_opt.reaches_linear_attention(tasks, H):
        om, mu_ = th_opt.linear_attention_point(tasks, H, 1e-3, th_opt.linear_attention_scale(tasks, L, sigma))
        fixed.append(FamilyMinimum(f"{H} heads: linear-attention construction", tasks, L, sigma, om, mu_, math.nan))
    decs = fixed + decs
    measure([alloc] + decs, eval_prompts, case_seed(seed, "evaluation"), device)
    return DecomposableSearch(allocated=alloc, candidates=tuple(decs), fixed=len(fixed))


@dataclass(frozen=True)
class BestDecomposable:
    """The best H-head decomposable point found (signs free): its loss and standard error on
    ``n_eval`` evaluation prompts, (omega, mu) (H x m), the start it came from, and the paired
    ratio C = allocated / best (with se) against the allocated point on the same prompts."""

    loss: float
    se: float
    n_eval: int
    omega: tuple
    mu: tuple
    family: str
    allocated_loss: float
    allocated_se: float
    C: float
    C_se: float


def _best_cost(tasks, heads, L, sigma, device, random_starts, fit_elements, eval_prompts) -> float:
    n_fit = exact_reduced.fit_sample_size(heads, L, fit_elements)
    return (engine.fit_seconds(tasks, heads, L, n_fit, starts=2 + random_starts)
            + engine.marginal_seconds(tasks, heads, L, eval_prompts, points=3 + random_starts))


@kind("best_decomposable", cost=_best_cost)
def best_decomposable(tasks, heads: int, L: int, sigma: float, seed: int, device="cpu", random_starts: int = 2,
                      fit_elements: int = 2 ** 19, eval_prompts: int = 4096) -> BestDecomposable:
    """The best decomposable point of the same H, signs free (:func:`decomposable_search`): the
    candidate of highest paired C = allocated / candidate, i.e. lowest loss on the
    shared evaluation prompts.  Cost (quick profile's sizes, 2 idle cores, one thread):
    about 1-3 s per H at (2, 2), L = 64 (one L-BFGS search per start)."""
    s = decomposable_search(tasks, heads, L, sigma, seed, device, random_starts, fit_elements, eval_prompts)
    k, C, se = _best_index(s)
    fm, a = s.candidates[k], s.allocated
    return BestDecomposable(loss=float(fm.loss), se=float(fm.se), n_eval=int(fm.n_eval),
                            omega=tuple(map(tuple, np.asarray(fm.omega, float).tolist())),
                            mu=tuple(map(tuple, np.asarray(fm.mu, float).tolist())), family=fm.family,
                            allocated_loss=float(a.loss), allocated_se=float(a.se), C=C, C_se=se)


def _best_index(s: DecomposableSearch) -> tuple[int, float, float]:
    ratios = [paired_ratio(s.allocated.per_prompt, fm.per_prompt) for fm in s.candidates]
    k = int(np.argmax([C for C, _ in ratios]))
    return k, ratios[k][0], ratios[k][1]


def candidates_at_heads(search: DecomposableSearch, full_runs: Sequence[dict]) -> dict:
    """The gradient-flow limit and every H-head candidate, from the decomposable search
    (:func:`decomposable_search`) and the full merged models (:func:`full_merged_start`):
    each candidate with its loss, standard error and constant C = limit / candidate (paired with
    the limit for a decomposable point, independent for a trained model), the best, the spread
    of C per kind of candidate, and the best decomposable point."""
    alloc, decs = search.allocated, search.candidates
    rows = []
    for k, fm in enumerate(decs):
        C, se = paired_ratio(alloc.per_prompt, fm.per_prompt)
        rows.append({"kind": "construction" if k < search.fixed else "decomposable search", "start": fm.family,
                     "loss": fm.loss, "se": fm.se, "C": C, "C_se": se,
                     "omega": np.round(fm.omega, 4).tolist(), "mu": np.round(fm.mu, 3).tolist()})
    rows += [full_model_row(run, alloc) for run in full_runs]
    done = [r for r in rows if "C" in r]
    spread = {kind: [min(r["C"] for r in done if r["kind"] == kind), max(r["C"] for r in done if r["kind"] == kind)]
              for kind in ("construction", "decomposable search", "full merged") if any(r["kind"] == kind for r in done)}
    H = int(np.shape(decs[0].omega)[0])
    return {"H": H, "L": alloc.L, "tasks": list(alloc.tasks), "sigma": alloc.sigma, "allocated": alloc.summary(),
            "candidates": rows, "best": max(done, key=lambda r: r["C"]), "spread": spread,
            "starts": {"decomposable search": len(decs) - search.fixed, "full merged": len(full_runs)},
            "best_decomposable": decs[_best_index(search)[0]]}


# ---------------------------------------------------------------------------------------
# claim 7's needs: the search at each H, the full merged models, the bridge, the constant over L
# ---------------------------------------------------------------------------------------

def _full_start_cost(tasks, H, L, extra, train_lr, train_time, train_batch, held_out_prompts, **_) -> float:
    dtype = ProblemConfig(tasks=tuple(tasks), heads=H, L=L, **dict(extra)).dtype
    return (engine.train_seconds(tasks, H, L, train_batch, round(train_time / train_lr), dtype=dtype)
            + engine.forward_seconds(tasks, H, L, held_out_prompts))


@kind("full_merged_start", cost=_full_start_cost)
@one_thread
def full_merged_start(tasks, H: int, L: int, sigma: float, start: int, device: str, init_scale: float, extra: tuple,
                      train_lr: float, train_time: float, train_batch: int, held_out_prompts: int, seed: int) -> dict:
    """A full MERGED model (W_h, U_h free) with H heads trained from random full start
    ``start`` (init seed and prompt stream: numerics.engine.case_seed of ``seed`` and ("random
    full start", start, "init" / "prompts")), measured again at its final weights on
    ``held_out_prompts`` fresh prompts, with the descent fit of its last quarter
    (numerics.experiments.converged.stage_descent; None: under 3 records).  ``extra``:
    basis/dtype/logit_scale (sorted items)."""
    stream = case_seed(seed, "random full start", start, "prompts")     # training, then held-out prompts
    cfg = ProblemConfig(tasks=tuple(tasks), heads=H, L=L, sigma=sigma, param="merged", init="random_full",
                        init_scale=init_scale, init_seed=case_seed(seed, "random full start", start, "init"),
                        device=device, **dict(extra))
    tcfg = TrainConfig(lr=train_lr, time=train_time, batch=train_batch, seed=stream, records=17)
    window, snaps = last_quarter(tcfg.record_steps()), []

    def keep(step, t, model, loss):
        if step in window:
            snaps.append((t, copy.deepcopy(model)))
    try:
        res = train(cfg, tcfg, on_record=keep)
    except TrainingDiverged as exc:
        return {"kind": "full merged", "start": f"random full {start}", "diverged": str(exc)}
    est = held_out_loss(res.final_model, n=held_out_prompts, seed=stream)
    return {"kind": "full merged", "start": f"random full {start}", "loss": est.mean, "se": est.se,
            "off_D_residual": float(res.trajectory[-1].residual), "steps": res.steps,
            "descent": stage_descent(snaps, held_out_prompts, stream)}


def full_model_row(run: dict, allocated) -> dict:
    """A full merged model's row of the candidates (:func:`full_merged_start`): its constant
    C = allocated / loss (independent estimates) and the one convergence test
    (numerics.experiments.converged) at the tolerance of the comparison its loss feeds, C's
    standard error on the loss scale with the final iterate's fluctuation."""
    if "diverged" in run:
        return run
    d = run["descent"]
    C = allocated.loss / run["loss"]
    C_se = C * math.hypot(allocated.se / allocated.loss, run["se"] / run["loss"])
    tol = stage_tolerance(run["loss"] * C_se / C, d.jitter if d is not None else 0.0)
    left = d.left if d is not None else math.inf
    return {"kind": run["kind"], "start": run["start"], "loss": run["loss"], "se": run["se"], "C": C, "C_se": C_se,
            "off_D_residual": run["off_D_residual"], "steps": run["steps"], "descent_left": left,
            "descent": d.to_dict() if d is not None else None, "convergence_tolerance": tol,
            "converged": converged_for({"descent_left": left}, tol)}


def _bridge_cost(search, n, **_) -> float:
    tasks, H, L = search.args["tasks"], search.args["H"], search.args["L"]
    return engine.forward_seconds(tasks, H, L, n) + engine.marginal_seconds(tasks, H, L, n)


@kind("best_as_full_model", cost=_bridge_cost)
@one_thread
def best_as_full_model(search: DecomposableSearch, n: int, device: str, seed: int) -> dict:
    """The search's best decomposable point (omega, mu) built as a full merged model, its loss
    on ``n`` fresh whole prompts (held-out stream of ``seed``); and the reduced loss of the same
    point with its logits doubled, (2 omega, mu), on ``n`` fresh reduced prompts."""
    fm = search.candidates[_best_index(search)[0]]
    cfg = ProblemConfig(tasks=tuple(fm.tasks), heads=np.shape(fm.omega)[0], L=fm.L, sigma=fm.sigma, param="merged",
                        init="decomposable", device=device)
    est = held_out_loss(MultiHeadAttention.from_semi_singular_values(cfg, fm.omega, fm.mu), n=n, seed=seed)
    doubled = float(exact_reduced.evaluate([(2.0 * fm.omega, fm.mu)], fm.tasks, fm.L, fm.sigma, n,
                                           case_seed(seed, "logits doubled"), device).mean())
    return {"full_model": est, "doubled": doubled}


def _row_cost(tasks, L, eval_elements, fit_elements, **_) -> float:
    H = 2 * len(tasks)
    return (exact_reduced.minima_seconds(tasks, L, 0, fit_elements)
            + engine.fit_seconds(tasks, H, L, exact_reduced.fit_sample_size(H, L, fit_elements), starts=2)
            + engine.marginal_seconds(tasks, H, L, max(256, eval_elements // (H * L)), points=2))


@kind("constant_row", cost=_row_cost)
@one_thread
def constant_row(tasks, sigma: float, L: int, device: str, eval_elements: int, fit_elements: int, seed: int) -> dict:
    """The limit and the best two-heads-per-task (2m heads) decomposable point at L on one
    paired evaluation sample, and C(L) (the limit's fit, the best point's and the evaluation
    drawn from the cases "limit fit", "best fit" and "evaluation" of ``seed``)."""
    gf = allocated_minimum(tasks, L, sigma, case_seed(seed, "limit fit"), device, fit_elements)
    best = best_found_minimum(tasks, L, sigma, case_seed(seed, "best fit"), 2, 0, device, fit_elements)
    measure([gf, best], max(256, eval_elements // (best.omega.shape[0] * int(L))), case_seed(seed, "evaluation"),
            device)
    C, se = paired_ratio(gf.per_prompt, best.per_prompt)
    return {"L": int(L), "constant": C, "se": se, "gf": gf.summary(), "best": best.summary()}


# ---------------------------------------------------------------------------------------
# the boundaries' runs of the exact finite-L reduced model (merged parametrisation, fewer heads
# than tasks, saturation, small L): one flow on fresh prompts (flows of one shape and batch size
# asked together are one program), end points on shared held-out prompts, exact losses of one
# head on one block; every end point measured by the Rao-Blackwellised losses of
# numerics.exact_reduced
# ---------------------------------------------------------------------------------------

def paired_difference(a, b) -> tuple[float, float]:
    """mean(a - b) and its standard error on the same prompts."""
    return mean_se(np.asarray(a) - np.asarray(b))


def _flow_cost(cfg, tcfg: TrainConfig) -> float:
    return round(tcfg.time / tcfg.lr) * engine.reduced_step_seconds(cfg.tasks, cfg.heads, cfg.L, tcfg.batch)


def _flows_many(params: list, seeds: list) -> list:
    return one_thread(train_reduced_many)([p["cfg"] for p in params],
                                          [replace(p["tcfg"], seed=int(s)) for p, s in zip(params, seeds)])


@kind("reduced_flow", cost=_flow_cost, run_many=_flows_many,
      batch_key=lambda cfg, tcfg: (shape_key(cfg), tcfg.batch))
@one_thread
def reduced_flow(cfg, tcfg: TrainConfig, seed: int):
    """The exact reduced flow of cfg (cfg.param's metric, cfg's decomposable init) on fresh
    prompts (prompt stream ``seed``; tcfg's own seed is not read): a ``numerics.train.TrainResult``."""
    return train_reduced(cfg, replace(tcfg, seed=int(seed)))


@kind("paired_end_losses", cost=lambda cfg, n_eval, **_: engine.marginal_seconds(cfg.tasks, cfg.heads, cfg.L, n_eval,
                                                                               points=2))
def paired_end_losses(first, second, cfg, n_eval: int, seed: int) -> np.ndarray:
    """Per-prompt exact losses (2, n_eval) of the end points of the flows ``first`` and
    ``second`` on the same held-out prompts (paired; drawn from ``seed``)."""
    return evaluate([(first.omega, first.mu), (second.omega, second.mu)], cfg.tasks, cfg.L, cfg.sigma, n_eval,
                    seed, cfg.device)


@dataclass(frozen=True)
class FewerHeadsRun:
    """A reduced-flow run with H < m heads: the Polyak average of its last quarter of records
    (omega, mu), the partition minimum of the exact loss for theory's winners, the m-head
    allocated minimum, and their losses on the same held-out prompts (``losses[0]``: the
    averaged point, ``[1]``: the partition minimum, ``[2]``: the allocated minimum, ``[3:]``:
    each averaged record); the number of averaged records."""

    omega: np.ndarray
    mu: np.ndarray
    partition: object
    allocated: object
    losses: list
    averaged_records: int


def _fewer_cost(cfg, n_eval, **_) -> float:
    # the partition minimum (one L-BFGS-B search), the allocated minimum, and 3 points + the late records
    return (engine.fit_seconds(cfg.tasks, cfg.heads, cfg.L, fit_sample_size(cfg.heads, cfg.L))
            + minima_seconds(cfg.tasks, cfg.L, 0)
            + engine.marginal_seconds(cfg.tasks, cfg.heads, cfg.L, n_eval, points=3 + 16))


@kind("fewer_heads_end", cost=_fewer_cost, shared=False)
@one_thread
def fewer_heads_end(flow, winners, cfg, n_eval: int, seed: int) -> FewerHeadsRun:
    """The flow's end point (the iterates of its last quarter averaged: a finite-step run on
    fresh batches fluctuates around the flow's limit), the partition minimum of theory's
    ``winners`` (head of each task) and the m-head allocated minimum, each measured on the same
    ``n_eval`` held-out prompts.  Kept per engine: the partition is theory's."""
    late = [r for r in flow.trajectory if r.t >= 0.75 * flow.trajectory[-1].t]
    om_avg = np.mean([r.omega for r in late], axis=0)
    mu_avg = np.mean([r.mu for r in late], axis=0)
    serves = np.zeros((cfg.heads, cfg.m), bool)
    serves[list(winners), np.arange(cfg.m)] = True
    part = minimise_family(cfg.tasks, cfg.L, cfg.sigma, serves, serves,
                           [np.where(serves, np.maximum(np.abs(om_avg), 0.05), 0.0)], case_seed(seed, "partition fit"),
                           family="partition", device=cfg.device)
    alloc = allocated_minimum(cfg.tasks, cfg.L, cfg.sigma, case_seed(seed, "allocated fit"), cfg.device)
    points = [(om_avg, mu_avg), (part.omega, part.mu), (alloc.omega, alloc.mu)] + [(r.omega, r.mu) for r in late]
    losses = evaluate(points, cfg.tasks, cfg.L, cfg.sigma, n_eval, case_seed(seed, "evaluation"), cfg.device)
    return FewerHeadsRun(om_avg, mu_avg, part, alloc, losses, len(late))


@kind("saturation_scan", cost=lambda omegas, n_eval, **_: 0.05 * len(omegas) * n_eval / 4000)
@one_thread
def saturation_scan(r: int, L: int, omegas: tuple, sigma: float, n_eval: int, device: str, seed: int) -> list[dict]:
    """One head on one block of size r: at each omega, the mu minimising the exact loss (fit
    sample) and the exact loss there on ``n_eval`` independent prompts (each drawn from the
    case (what, omega) of ``seed``), with kappa = omega^2 r / log L."""
    rows = []
    for w in omegas:
        om = np.full((1, 1), float(w))
        mu = optimal_mu_at(om, (r,), L, sigma, case_seed(seed, "mu fit", w), device=device)
        loss, se = mean_se(evaluate([(om, mu)], (r,), L, sigma, n_eval, case_seed(seed, "evaluation", w), device)[0])
        rows.append({"omega": float(w), "mu": float(mu[0, 0]), "kappa": float(w) ** 2 * r / math.log(L),
                     "exact": loss, "exact_se": se})
    return rows


def _mc_cost(points, mc_elements, **_) -> float:
    ladder_Ls = points.args["args"][1]      # points: theory's gap_ladder(r, Ls, sigma) need
    return len(ladder_Ls) * mc_elements / 2 ** 23


@kind("monte_carlo_losses", cost=_mc_cost, shared=False)
@one_thread
def monte_carlo_losses(points, r: int, sigma: float, mc_elements: int, device: str, seed: int) -> list[dict]:
    """The Rao-Blackwellised Monte-Carlo exact loss of one head on one block at each
    {"L", "omega", "mu"} of ``points`` (theory's: kept per engine), on max(2000, mc_elements // L)
    prompts each (drawn from the case ("evaluation", L) of ``seed``)."""
    out = []
    for row in points:
        n = max(2000, mc_elements // row["L"])
        om, mu = np.array([[row["omega"]]]), np.array([[row["mu"]]])
        mc, se = mean_se(evaluate([(om, mu)], (r,), row["L"], sigma, n, case_seed(seed, "evaluation", row["L"]),
                                  device)[0])
        out.append({"mc": mc, "mc_se": se, "mc_n": n})
    return out
