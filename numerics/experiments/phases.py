"""The runs and probes of claims 3 and 4 (three phases, task allocation).

- :func:`phase_run` (claim 3): the full factored model trained with fresh batches; the loss
  curve of the recorded readout on one fixed evaluation batch (common random numbers: a smooth
  curve), its phases, and the held-out losses at the final weights (:class:`PhaseRun`).
- :func:`escape_time_spread` (claim 3): the Monte-Carlo spread of a warm-up escape time of an
  SGD run, from per-prompt gradients at the init (a probe, no training).
- :func:`allocation_run` (claim 4): the full factored model trained with fresh batches, the
  tail means of its readout and OV matrices with their standard errors, their spectra and the
  held-out losses.
- :func:`off_task_gradient` (claim 4): the Monte-Carlo gradient of the exact reduced loss.

Each is a need kind of ``numerics.engine`` (end of file: "phase_run", "escape_time_spread",
"allocation_run", "off_task_gradient"; "unstable_step", the stability guard both claims ask
before they trust a run, is ``numerics.experiments.converged``'s), priced from its parameters by ``numerics.engine``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from numerics import engine
from numerics.config import ProblemConfig
from numerics.config import make_generator, sample_prompts
from numerics.engine import Need, kind, need
from numerics.evaluate import (LossEstimate, allocation, bounded_correlation_se, held_out_loss, held_out_reduced_loss,
                               mean_se)
from numerics.exact_reduced import evaluate as exact_reduced_losses, loss_and_gradient
from numerics.experiments import one_thread
from numerics.model import MultiHeadAttention, initial_semi_singular_values, initial_values
from numerics.engine import case_seed
from numerics.model import metric_factors, per_prompt_reduced_gradients, per_prompt_reduced_losses
from numerics.train import TrainConfig, train
from theory.task_allocation import favoured_init, served_relaxation_rates, warmup_race_times
from theory.three_phases import allocated_projection, phase_times, warmup_relative_rates

def _arrays(result) -> tuple:
    recs = result.trajectory
    return tuple(np.array([getattr(r, k) for r in recs], float) for k in ("t", "omega", "mu", "residual"))


# ---------------------------------------------------------------------------------------
# claim 3: three phases
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PhaseRun:
    """A trained run of claim 3: record times, the loss curve on the fixed evaluation batch
    (mean and per prompt), the readout mu/omega (records, H, m), the curve's phases, the
    standard error of the drop l(0) - l(end) (paired over prompts), the held-out loss of the
    full model at the final weights (``held_out``, at most 4096 prompts) and of the reduced
    model at the final readout's allocated projection on whole prompts of the same stream
    (``held_out_allocated_whole``, ``held_out`` prompts: their gap is what the off-D weights and the
    off-task mu add) and by the Rao-Blackwellised estimator on ``held_out`` fresh prompts
    (``held_out_allocated``,
    ``numerics.exact_reduced.evaluate``: the labels integrated analytically, about a fifth of
    the per-prompt variance); ``train``: the training configuration it ran."""

    t: np.ndarray
    loss: np.ndarray
    per_prompt: np.ndarray
    mu: np.ndarray
    omega: np.ndarray
    phases: object
    drop_se: float
    held_out: LossEstimate
    held_out_allocated: LossEstimate
    held_out_allocated_whole: LossEstimate
    final_omega: np.ndarray
    final_mu: np.ndarray
    residual: float
    wall_seconds: float
    train: TrainConfig


COARSE_RECORDS = 201
"""The records of a phase run's loss curve evaluated everywhere; between the two that bracket each phase end, every
record is evaluated (:func:`curve_records`)."""


def curve_records(t, losses_at, coarse: int = COARSE_RECORDS) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the records at which a run's loss curve is evaluated (``losses_at(indices)`` -> per-prompt losses,
    one row per index): about ``coarse`` evenly spaced ones, then every record between the two evaluated ones that
    bracket each phase end of the curve read so far, until the phase ends lie in fully evaluated stretches.  Each
    phase end is then read at the run's full record resolution (every step when the run records every step) while
    the curve is evaluated at a fraction of the records: the evaluation batch costs per evaluated record."""
    n, values = len(t), {}
    chosen = set(np.linspace(0, n - 1, min(n, coarse)).round().astype(int).tolist())

    def evaluated():
        idx = np.array(sorted(chosen))
        missing = [int(i) for i in idx if i not in values]
        values.update(zip(missing, losses_at(missing)))
        return idx, np.array([values[i] for i in idx])

    for _ in range(4):
        idx, per = evaluated()
        pt = phase_times(t[idx], per.mean(axis=1))
        new = set()
        for end in ((pt.warmup_end, pt.emergence_end) if pt.defined else ()):
            k = int(np.clip(np.searchsorted(t[idx], end), 1, len(idx) - 1))
            new |= set(range(idx[k - 1], idx[k] + 1))
        if new <= chosen:
            return idx, per
        chosen |= new
    return evaluated()


@one_thread
def phase_run(cfg: ProblemConfig, tcfg: TrainConfig, eval_batch: int, held_out: int) -> PhaseRun:
    """The run of (cfg, tcfg) measured as :class:`PhaseRun` says, on the records :func:`curve_records` evaluates.
    Its evaluation batch and held-out prompts are named by the run's seed (runs with independent prompt streams are
    evaluated on independent prompts too, so the noises of their curves are independent)."""
    res = train(cfg, tcfg)
    t, omega, mu, _ = _arrays(res)
    evalset = sample_prompts(cfg, eval_batch, make_generator(case_seed(tcfg.seed, "evaluation batch"), cfg.device))

    def losses_at(indices):
        with torch.no_grad():
            return [per_prompt_reduced_losses(torch.tensor(omega[i], dtype=cfg.torch_dtype, device=cfg.device),
                                              torch.tensor(mu[i], dtype=cfg.torch_dtype, device=cfg.device),
                                              evalset, cfg).cpu().double().numpy() for i in indices]

    idx, per = curve_records(t, losses_at)
    t, omega, mu = t[idx], omega[idx], mu[idx]
    n_end = max(3, int(np.ceil(0.1 * len(t))))
    drop = per[0] - per[-n_end:].mean(axis=0)
    ro = res.final_model.semi_singular_values()
    # both on the same fresh prompts (one held-out seed): their gap is the effect of the
    # off-D weights and of the off-task mu left at the end, reported with the comparison
    held_out_seed = case_seed(tcfg.seed, "held out")
    full = held_out_loss(res.final_model, n=min(held_out, 4096), seed=held_out_seed)
    winners = allocation(ro.omega, ro.mu).winners
    projection = allocated_projection(ro.mu, ro.omega, winners)
    whole = held_out_reduced_loss(*projection, cfg, n=held_out, seed=held_out_seed)
    per_rb = exact_reduced_losses([projection], cfg.tasks, cfg.L, cfg.sigma, held_out, held_out_seed, cfg.device)[0]
    alloc = LossEstimate(*mean_se(per_rb), int(per_rb.size))
    return PhaseRun(t, per.mean(axis=1), per, mu, omega, phase_times(t, per.mean(axis=1)),
                    mean_se(drop)[1], full, alloc, whole, ro.omega, ro.mu,
                    float(ro.residual), res.wall_seconds, tcfg)


@kind("escape_time_spread", cost=lambda cfg, batch, lr: 3 * engine.forward_seconds(cfg.tasks, cfg.heads, cfg.L, 384))
@one_thread
def escape_time_spread(cfg: ProblemConfig, batch: int, lr: float, seed: int, probe_batch: int = 384) -> dict:
    """Monte-Carlo spread of a phase time of an SGD run (fresh batches of ``batch``).

    In the warm-up every value grows at a relative rate v = x_dot / x; a step adds lr v_B with
    noise lr sigma_v / sqrt B, so after time T log x has wandered by sigma_v sqrt(lr T / B)
    and the time at which it reaches a level moves by dT = sigma_v sqrt(lr T / B) / v.  The
    mean rate v is theory's (``theory.three_phases.warmup_relative_rates``: expansion gradient
    and metric factors at the init; an estimate of a small mean from a few hundred noisy
    prompts was unstable, 0.74 -> 5.5 between two s0); its per-prompt std sigma_v is measured
    from the per-prompt gradients of the exact reduced loss on ``probe_batch`` prompts (of
    ``seed``).  The
    entry with the largest rate leads the emergence.  In the factored warm-up x blows up at
    T = 1/v (d log x / dt = v x / x0), and a kick delta to log x at time t moves the blow-up by
    (T - t) delta, so dT^2 = int_0^T (T - t)^2 sigma_v^2 lr / B dt = sigma_v^2 (lr / B) T^3 / 3:
    with T ~ 1/v, dT = coef sqrt(T) / sqrt 3.  Returns ``coef`` = sigma_v sqrt(lr / B) / v and
    ``log_noise`` = sigma_v sqrt(lr / B) (the rms wander of log x is log_noise sqrt t)."""
    om0_np, mu0_np = initial_values(cfg)
    v = warmup_relative_rates(om0_np, mu0_np, cfg.tasks, cfg.L, cfg.sigma, cfg.param, cfg.logit_scale)
    om0, mu0 = (a.to(cfg.device, cfg.torch_dtype) for a in initial_semi_singular_values(cfg))
    prompts = sample_prompts(cfg, probe_batch, make_generator(seed, cfg.device))
    j_om, j_mu = per_prompt_reduced_gradients(om0, mu0, prompts, cfg)
    f_om, f_mu = (f.cpu().double().numpy() for f in metric_factors(om0, mu0, cfg))
    rel = np.concatenate([
        (-f_om[None] * j_om.cpu().double().numpy() / om0.cpu().numpy()[None]).reshape(probe_batch, -1),
        (-f_mu[None] * j_mu.cpu().double().numpy() / mu0.cpu().numpy()[None]).reshape(probe_batch, -1)], axis=1)
    sv = rel.std(axis=0, ddof=1)
    k = int(np.argmax(v))
    log_noise = float(sv[k] * math.sqrt(lr / batch))
    coef = log_noise / v[k] if v[k] > 0 else math.inf
    return {"coef": float(coef), "rate": float(v[k]), "sigma": float(sv[k]), "log_noise": log_noise}


# ---------------------------------------------------------------------------------------
# claim 4: task allocation
# ---------------------------------------------------------------------------------------

def favoured_problem(tasks, heads, L, favourite=None, device="cpu", **fields) -> ProblemConfig:
    """ProblemConfig of claim 4's favoured start (``theory.task_allocation.favoured_init``; favourite: head of each
    task, default task i -> head i mod H; fields: ProblemConfig fields, init_scale (default 0.15), surplus_mu)."""
    tasks = tuple(int(r) for r in tasks)
    favourite = list(favourite) if favourite is not None else [i % heads for i in range(len(tasks))]
    s0 = float(fields.pop("init_scale", 0.15))
    om, mu = favoured_init(tasks, heads, favourite, s0, float(fields.pop("surplus_mu", 1.0)))
    return ProblemConfig(tasks=tasks, heads=heads, L=L, init="given", init_omega=om, init_mu=mu, init_scale=s0,
                         device=device, **fields)


TAIL_FRACTION = 0.25
"""The tail of a run whose records are averaged: the last 25% (at least 4 records)."""
LOSS_RESOLUTION = 0.03
HELD_OUT_MAX = 2 ** 20
"""The held-out sample grows (to at most HELD_OUT_MAX prompts) until z standard errors are
3% of the measured loss, a third of claim 4's 10% perturbation: at r = 1 the per-prompt loss
is heavy-tailed (65536 prompts: 2% relative se at L = 64)."""


def off_task_gradient(tasks, L: int, sigma: float, omega, mu, n: int, seed: int, device="cpu") -> dict:
    """d loss / d mu of the exact reduced loss at (omega, mu) by Monte Carlo (the
    Rao-Blackwellised estimator of ``numerics.exact_reduced.loss_and_gradient`` on ``n`` fresh
    prompts, standard errors from independent groups): claim 4 measures the off-task slope a of
    the saddle at theory's allocated point with it."""
    return one_thread(loss_and_gradient)(np.asarray(omega, float), np.asarray(mu, float), tuple(tasks), int(L),
                                         float(sigma), int(n), int(seed), device=device)


def tail_standard_errors(samples) -> tuple[np.ndarray, np.ndarray]:
    """(se, spread) per entry of the records ``samples`` (n, ...), reading the tail as an AR(1)
    process about its mean:

    - rho: the lag-1 autocorrelation, Marriott-Pope bias-corrected, (n r + 1)/(n - 3) (the plain
      estimate r is biased low by about (1 + 4 rho)/n: at n = 10 records that is most of it), clipped
      to [0, 0.95];
    - spread: the stationary width of the records, std(diff)/sqrt(2 (1 - rho)) (first differences
      ignore the slow drift along the loss valley; Var(x_t - x_{t-1}) = 2 Var(x) (1 - rho));
    - se = spread sqrt((1 + rho) / (n (1 - rho))), the standard error of the tail mean.

    Why the corrections: the plain std(diff)/sqrt(2) is the width times
    sqrt(1 - rho), and it entered the standard error unscaled, so a correlated tail was read as
    nearly independent.  Simulated AR(1) tails (3000 each, the claims' 4 se + spread): at n = 10,
    rho = 0.8 the plain estimate rejected the true mean 11 % of the time, this one 2.5 %; at
    n = 20, 0.3 %; at n = 40, 0.1 % (tests/test_tail_standard_errors.py checks it)."""
    x = np.asarray(samples, float)
    n = x.shape[0]
    if n < 4:
        raise ValueError("need at least 4 tail records to estimate the precision of a tail mean; record more often")
    dev = x - x.mean(axis=0)
    num = np.sum(dev[1:] * dev[:-1], axis=0)
    den = np.maximum(np.sum(dev * dev, axis=0), 1e-300)
    rho = np.clip((n * (num / den) + 1.0) / (n - 3), 0.0, 0.95)
    spread = np.std(np.diff(x, axis=0), axis=0, ddof=1) / np.sqrt(2.0 * (1.0 - rho))
    return spread * np.sqrt((1.0 + rho) / (n * (1.0 - rho))), spread


TAIL_BATCH_FROM = 0.6
"""Where a run with a tail batch (:func:`allocation_run`) switches to it: at the record nearest 60 % of the run, so
that the slowest relaxation of the served point (rate 0.25 at tasks (2, 2), L = 64: theory.task_allocation.
served_relaxation_rates) has 2.3 e-folds before the last 25 % (the tail) begins: what the larger batch moves (the
cloud's width and its O(lr / B) offset) has then settled to within 10 %, and within ~3 % averaged over the tail."""


def _trained(cfg: ProblemConfig, tcfg: TrainConfig, tail_batch, on_record) -> tuple:
    """(t, omega, mu, residual, final model, training loss) of the run (cfg, tcfg), from TAIL_BATCH_FROM of it on
    with ``tail_batch`` fresh prompts per step (None: tcfg.batch throughout) and a stream of its own; the records on
    tcfg's grid, ``on_record`` called once at each."""
    k = int(round(TAIL_BATCH_FROM * (tcfg.records - 1)))
    if tail_batch is None or tail_batch == tcfg.batch or k < 1:
        res = train(cfg, tcfg, on_record=on_record)
        return _arrays(res) + (res.final_model, res.loss)
    t_switch = tcfg.time * k / (tcfg.records - 1)
    head = train(cfg, dataclasses.replace(tcfg, time=t_switch, records=k + 1), on_record=on_record)

    def on_tail_record(step, t, model, loss):         # its first record is the head's last
        if step > 0:
            on_record(step, t_switch + t, model, loss)

    tail = train(cfg, dataclasses.replace(tcfg, time=tcfg.time - t_switch, records=tcfg.records - k, batch=tail_batch,
                                          seed=case_seed(tcfg.seed, "tail batch")),
                 on_record=on_tail_record, start=head.final_model)
    (t0, *rest0), (t1, *rest1) = _arrays(head), _arrays(tail)
    joined = [np.concatenate([x, y[1:]]) for x, y in zip(rest0, rest1)]
    return (np.concatenate([t0, t_switch + t1[1:]]), *joined, tail.final_model, tail.loss)


def _readout_tail_errors(cfg: ProblemConfig, t, omega, mu) -> tuple:
    """(rho, omega's se, omega's spread, mu's se, mu's spread) of the tail records (t, omega, mu), task i's entries
    read with autocorrelation at most rho_i^j over j records, rho_i = e^(-lambda_i dt) (theory's slowest relaxation
    of the served point, dt the record interval).  The served entries wander along the flow's slow valley (1 / lambda
    ~ 4 at tasks (2, 2), L = 64, against a tail of 14): the tail's own lag-1 correlation is too noisy a reading of it
    (:func:`tail_standard_errors` read one tail's se as 10 x the scatter of 8 independent runs' tail means)."""
    rho = np.exp(-served_relaxation_rates(cfg.tasks, cfg.L, cfg.sigma) * float(np.mean(np.diff(t))))
    return (rho, *bounded_correlation_se(omega, rho), *bounded_correlation_se(mu, rho))


@one_thread
def allocation_run(cfg: ProblemConfig, tcfg: TrainConfig, held_out: int, seed: int = 0, z: float = 4.0,
                   threshold_sigmas: float = 5.0, tail_batch: int | None = None) -> dict:
    """The run of (cfg, tcfg) for claim 4 (from TAIL_BATCH_FROM of it on with ``tail_batch`` prompts per step, where
    given: less SGD noise where the tail is read): its records of omega, mu, their tail means with standard errors
    and per-record spreads (``numerics.evaluate.bounded_correlation_se``: autocorrelation over j records at most
    ``tail_rho``^j, e^(-lambda_i dt) with lambda_i theory.task_allocation.served_relaxation_rates and dt the record
    interval), the tail-mean OV matrices U_h's singular values, the per-head ``threshold`` = max(threshold_sigmas x
    the Frobenius norm of their entries' standard errors (:func:`tail_standard_errors`), 1e-6) and the count of values
    ``above`` it (claim 4's detection threshold), W_h spectra (per block and whole), and the held-out losses: of the
    tail-averaged merged weights (``held_out``; ``z`` standard errors resolve LOSS_RESOLUTION of it), of the final
    weights, and of the reduced model at the tail-mean readout (same prompts); ``seed``: the held-out prompts'
    stream."""
    Us, Ws = [], []

    def on_record(step, t, model, loss):
        W, U = model.merged_weights()
        Us.append(U.detach().cpu().double().numpy().copy())
        Ws.append(W.detach().cpu().double().numpy().copy())

    t, omega, mu, residual, final_model, train_loss = _trained(cfg, tcfg, tail_batch, on_record)
    n = len(t)
    k = max(4, int(round(TAIL_FRACTION * n)))
    tail = slice(n - k, n)
    U_tail = np.array(Us[-k:])
    U_mean = U_tail.mean(axis=0)
    U_se, _ = tail_standard_errors(U_tail)
    threshold = np.maximum(threshold_sigmas * np.sqrt(np.sum(U_se ** 2, axis=(1, 2))), 1e-6)   # (H,)
    sv = [np.linalg.svd(U_mean[h], compute_uv=False) for h in range(cfg.heads)]
    W_mean = np.array(Ws[-k:]).mean(axis=0)
    d = cfg.d
    Phi = cfg.basis_matrix().cpu().double().numpy()
    W_blocks = [[np.linalg.svd(Phi[:, sl].T @ W_mean[h, :d, :d] @ Phi[:, sl], compute_uv=False).tolist()
                 for sl in cfg.block_slices] for h in range(cfg.heads)]
    om_mean, mu_mean = omega[tail].mean(axis=0), mu[tail].mean(axis=0)
    rho, om_se, om_spread, mu_se, mu_spread = _readout_tail_errors(cfg, t[tail], omega[tail], mu[tail])
    # the converged loss at the tail-averaged merged weights (W_h, U_h): the prediction depends
    # on the weights only through them, and averaging the tail removes the final step's SGD
    # jitter (r = 3, L = 32, lr 0.05, B = 512: final weights 0.774, 5% above theory's 0.735,
    # almost all of it off-D jitter)
    averaged = MultiHeadAttention.from_weights(dataclasses.replace(cfg, param="merged"),
                                               W=torch.as_tensor(W_mean), U=torch.as_tensor(U_mean))
    final = held_out_loss(final_model, n=held_out, seed=seed)
    full = held_out_loss(averaged, n=held_out, seed=seed)
    # the sample size (not the tolerance) follows the measurement's own precision: enough
    # prompts that z standard errors are LOSS_RESOLUTION of the measured loss (cap HELD_OUT_MAX)
    need = int(held_out * (z * full.se / (LOSS_RESOLUTION * full.mean)) ** 2) if full.mean > 0 else 0
    if need > held_out:
        held_out = min(HELD_OUT_MAX, -(-need // 4096) * 4096)
        full = held_out_loss(averaged, n=held_out, seed=seed)
    reduced_at_mean = held_out_reduced_loss(om_mean, mu_mean, cfg, n=held_out, seed=seed)   # same prompts
    return {"t": t, "omega": omega, "mu": mu, "omega_end": om_mean, "mu_end": mu_mean, "tail_rho": rho,
            "omega_se": om_se, "omega_spread": om_spread, "mu_se": mu_se, "mu_spread": mu_spread,
            "U_singular_values": [s.tolist() for s in sv], "threshold": threshold,
            "above": [int(np.sum(s > th)) for s, th in zip(sv, threshold)],
            "W_block_singular_values": W_blocks,
            "W_singular_values": [np.linalg.svd(W_mean[h], compute_uv=False).tolist() for h in range(cfg.heads)],
            "residual_end": float(residual[-1]), "held_out": full, "held_out_reduced_at_mean": reduced_at_mean,
            "held_out_final_weights": final, "train_tail_loss": train_loss, "tail_records": k, "train": tcfg,
            "tail_batch": tail_batch or tcfg.batch}


# ---------------------------------------------------------------------------------------
# the need kinds of claims 3 and 4 (numerics.engine), each priced from its parameters
# ---------------------------------------------------------------------------------------

BOUNDARY_TIME = 80.0
"""Claim 4's run length where theory's horizon is infinite (its own flow keeps the surplus heads):
such a case is a boundary finding, recorded at t = 80."""


def run_time(time: float) -> float:
    """The length of claim 4's run asked for ``time`` (BOUNDARY_TIME where it is infinite)."""
    return float(time) if math.isfinite(time) else BOUNDARY_TIME


def start_args(cfg: ProblemConfig) -> tuple:
    """(omega0, mu0, tasks, L, sigma, param, logit_scale) of cfg's start, as the hashable
    parameters of a theory need (omega0, mu0 as nested tuples of their float64 values)."""
    om, mu = initial_values(cfg)
    return (tuple(map(tuple, om.tolist())), tuple(map(tuple, mu.tolist())), tuple(cfg.tasks), cfg.L, cfg.sigma,
            cfg.param, cfg.logit_scale)


def _phase_run_cost(cfg, lr, batch, records, eval_batch, held_out, horizon_factor, forecast, **_) -> float:
    """The training steps, the reduced loss at every record on ``eval_batch`` prompts and the two
    held-out losses.  The run lasts ``horizon_factor`` x the warm-up race time
    (theory.task_allocation.warmup_race_times, closed form), which the emergence end of theory's
    expansion flow follows closely (quick profile: run lengths 28.7, 21.6, 9.0 against
    2 x 15.06, 11.30, 4.52); a flow with no finite race runs 40."""
    race = warmup_race_times(*initial_values(cfg), cfg.tasks, cfg.param, cfg.logit_scale)
    finite = race[np.isfinite(race)]
    t = horizon_factor * float(finite.max()) if finite.size else 40.0
    return (engine.train_seconds(cfg.tasks, cfg.heads, cfg.L, batch, round(t / lr), dtype=cfg.dtype)
            + min(records, 2 * COARSE_RECORDS) * engine.forward_seconds(cfg.tasks, cfg.heads, cfg.L, eval_batch)
            + engine.forward_seconds(cfg.tasks, cfg.heads, cfg.L, min(held_out, 4096))
            + engine.forward_seconds(cfg.tasks, cfg.heads, cfg.L, held_out))


@kind("phase_run", cost=_phase_run_cost)
def phase_run_need(cfg, lr, batch, records, eval_batch, held_out, horizon_factor, forecast, seed):
    """Claim 3's run (:func:`phase_run`) for the length theory's ``forecast`` gives it (a
    dependency: the "phase_prediction" theory value, ``forecast["time"]``); ``horizon_factor``
    prices it before the forecast exists."""
    tcfg = TrainConfig(lr=lr, time=forecast["time"], batch=batch, records=records, seed=seed)
    return phase_run(cfg, tcfg, eval_batch, held_out)


def _allocation_cost(cfg, lr, time, batch, records, held_out, tail_batch=None, **_) -> float:
    """The run (t / lr steps, t the run's time or, where it is theory's horizon, BOUNDARY_TIME:
    the horizon is a theory value not computed before pricing; the last 1 - TAIL_BATCH_FROM of them
    at ``tail_batch``), its records and the held-out loss."""
    t = BOUNDARY_TIME if isinstance(time, Need) else float(time)
    steps = round(t / lr)
    tail = round((1 - TAIL_BATCH_FROM) * steps) if tail_batch else 0
    return (engine.train_seconds(cfg.tasks, cfg.heads, cfg.L, batch, steps - tail, dtype=cfg.dtype, records=records)
            + (engine.train_seconds(cfg.tasks, cfg.heads, cfg.L, tail_batch, tail, dtype=cfg.dtype) if tail else 0.0)
            + engine.forward_seconds(cfg.tasks, cfg.heads, cfg.L, held_out))


@kind("allocation_run", cost=_allocation_cost)
def allocation_run_need(cfg, lr, time, batch, records, held_out, z, threshold_sigmas, seed, tail_batch=None):
    """Claim 4's run (:func:`allocation_run`) for ``time``: a number, or theory's horizon (a
    dependency), where infinite BOUNDARY_TIME; its held-out prompts named by its seed."""
    tcfg = TrainConfig(lr=lr, time=run_time(time), batch=batch, records=records, seed=seed)
    return allocation_run(cfg, tcfg, held_out, case_seed(seed, "held out"), z, threshold_sigmas, tail_batch)


@kind("off_task_gradient", cost=lambda tasks, heads, L, n, **_: 3 * engine.forward_seconds(tasks, heads, L, n))
def off_task_gradient_need(tasks, heads, L, sigma, point, n, device, seed):
    """:func:`off_task_gradient` at ``point`` (a dependency: theory's allocated point of
    ``heads`` heads, (omega, mu))."""
    return off_task_gradient(tasks, L, sigma, *point, n, seed, device)


def unstable_need(cfg: ProblemConfig, lr: float):
    """The "unstable_step" need of (cfg, lr): why a step ``lr`` does not follow the flow at cfg, or None
    (``converged.unstable_step``: the full model's Hessian at theory's end point, asked beyond d = TUNED_D only)."""
    return need("unstable_step", cfg=cfg, lr=float(lr))
