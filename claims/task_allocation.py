"""Claim 4: task allocation -- at the limit each head keeps exactly one nonzero OV value,
and task i goes to the head predicted from the initialisation.

What is run: the full model (``numerics.train.train``, fresh batches, factored weights:
the paper's architecture) from a decomposable init in which each task's favoured head is
drawn (``init="given"``: mu = 2 s0 on the favoured (head, task) pairs, s0 elsewhere).

Checks (:func:`check_allocation`):

- **precision and threshold.**  The end value of mu is read as its mean over the last 25%
  of the records; that reading is uncertain by its Monte-Carlo fluctuation (with fresh
  batches mu jitters from record to record).  Its standard error sigma_mu (:func:`mu_precision`:
  first-difference estimator of the per-record noise, insensitive to the slow drift along
  the loss valley, divided by sqrt of the effective number of records given their lag-1
  autocorrelation), the largest over all (head, task) entries, is the run's precision.  A
  value counts as nonzero when it is above threshold = 5 sigma_mu (a Gaussian reading
  exceeds 5 sigma with probability 6e-7), and at least 1e-6.
- **H = m:** every head has exactly one |mu| above the threshold, every task exactly one
  head, and the head carrying task i (argmax_h mu[h,i] omega[h,i], averaged over the last
  25% of records) is ``theory.task_allocation.predicted_winners`` (rule "ode": the
  expansion flow from the same init).  Perturbation: the predicted winners permuted
  cyclically (a wrong winner for every task) must be rejected.
- **H > m** (:func:`check_surplus_decay`): the surplus heads (those the theory does not
  assign a task) decay: their largest |mu| at the end is below its maximum over the run
  by more than the threshold, and the other heads win as predicted.  Whether the surplus
  values are already below the threshold at t_end is reported (the decay of a surplus
  head is slow when it holds a sizeable omega).  Perturbation: "the surplus heads keep
  their values" (peak - end within the threshold) must be rejected.
- **H < m** is run and reported (which head serves which tasks), not asserted: the paper
  says nothing about it (see also the boundary claims).
"""
from __future__ import annotations

import math

import numpy as np

from claims.base import ClaimResult, Figure, no_progress, run_claim
from claims.common import Comparison, check_profile, comparisons_result, initial_values, perturbation, trajectory_of, worst
from numerics.config import ProblemConfig
from numerics.train import TrainConfig, train
from theory.task_allocation import allocated_fixed_point, predicted_winners

CLAIM_ID = "task-allocation"
TITLE = "Task allocation: one task per head"
STATEMENT = ("At the limit each head's OV weight has exactly one nonzero semi-singular value; task i goes to "
             "the head whose OV value for i is largest (the head favoured by the initialisation).")

THRESHOLD_SIGMAS = 5.0
"""A value of mu counts as nonzero above 5 sigma_mu.  A detection threshold (which entries
are nonzero), not a comparison tolerance (claims.common.Z_SE): a zero entry's Gaussian
reading exceeds it with probability 6e-7, so among the H x m entries of every case none is
misread by chance."""
TAIL_FRACTION = 0.25


def favoured_init(tasks, heads: int, favourite: list[int], init_scale: float):
    """(omega0, mu0) nested tuples: omega = s0, mu = s0 except 2 s0 on (favourite[i], i)."""
    m = len(tasks)
    omega = [[init_scale] * m for _ in range(heads)]
    mu = [[init_scale] * m for _ in range(heads)]
    for i, h in enumerate(favourite):
        mu[h][i] = 2 * init_scale
    return tuple(map(tuple, omega)), tuple(map(tuple, mu))


def mu_precision(mu_tail: np.ndarray) -> float:
    """Standard error of the tail mean of mu, the largest over (head, task) entries.

    Per record the Monte-Carlo fluctuation is std(diff) / sqrt 2 (the first-difference
    estimator ignores the slow drift along the loss valley); successive records are
    correlated (lag-1 autocorrelation rho of the differenced-out fluctuation, clipped to
    [0, 0.95]), so the mean of n records has n_eff = n (1 - rho) / (1 + rho)."""
    n = len(mu_tail)
    if n < 4:
        raise ValueError("need at least 4 tail records to estimate the precision of mu; record more often")
    sig = np.std(np.diff(mu_tail, axis=0), axis=0, ddof=1) / math.sqrt(2)
    dev = mu_tail - mu_tail.mean(axis=0)
    num = np.sum(dev[1:] * dev[:-1], axis=0)
    den = np.maximum(np.sum(dev * dev, axis=0), 1e-300)
    rho = np.clip(num / den, 0.0, 0.95)
    n_eff = n * (1 - rho) / (1 + rho)
    return float(np.max(sig / np.sqrt(n_eff)))


def _tail(tr, fraction=TAIL_FRACTION):
    n = max(3, int(round(fraction * len(tr.t))))
    return slice(len(tr.t) - n, len(tr.t))


def _predicted(cfg):
    om0, mu0 = initial_values(cfg)
    return predicted_winners(om0, mu0, cfg.tasks, cfg.L, cfg.sigma, cfg.param, cfg.logit_scale, rule="ode")


def _train_with_threshold(cfg, tcfg):
    """Train the full model; return (result, trajectory, tail records, sigma_mu, threshold,
    mean final mu over the tail): the OV threshold is THRESHOLD_SIGMAS x the Monte-Carlo
    precision of mu measured on the run's own last records."""
    res = train(cfg, tcfg)
    tr = trajectory_of(res)
    tail = _tail(tr)
    sigma_mu = mu_precision(tr.mu[tail])
    threshold = max(THRESHOLD_SIGMAS * sigma_mu, 1e-6)
    return res, tr, tail, sigma_mu, threshold, tr.mu[tail].mean(axis=0)


def check_allocation(cfg, tcfg) -> Comparison:
    """H = m: one OV value above the precision threshold per head, the predicted head per task."""
    if cfg.heads != cfg.m or cfg.m < 2:
        raise ValueError(f"check_allocation needs H = m >= 2 (got H={cfg.heads}, m={cfg.m}); use "
                         "check_surplus_decay for H > m, and run_fewer_heads (reported only) for H < m")
    predicted = _predicted(cfg)
    res, tr, tail, sigma_mu, threshold, mu_end = _train_with_threshold(cfg, tcfg)
    carried = (tr.mu[tail] * tr.omega[tail]).mean(axis=0)           # B contributions mu omega
    above = np.abs(mu_end) > threshold
    per_head = above.sum(axis=1)
    per_task = above.sum(axis=0)
    measured = [int(h) for h in np.argmax(carried, axis=0)]
    m = cfg.m
    permuted = [predicted[(i + 1) % m] for i in range(m)]
    # a wrong winner is rejected when the measured winners differ from it for some task
    # (the same comparison, measured == predicted, applied to the permuted prediction)
    wrong_mismatch = sum(a != b for a, b in zip(measured, permuted))
    return Comparison(
        name=f"allocation tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} B={tcfg.batch} t={tcfg.time:g}",
        measured={"winners": measured, "values_above_threshold_per_head": per_head.tolist(),
                  "mu_end": mu_end},
        predicted={"winners": list(predicted), "values_above_threshold_per_head": [1] * cfg.heads},
        error=float(max(np.max(np.abs(per_head - 1)), np.max(np.abs(per_task - 1)),
                        sum(a != b for a, b in zip(measured, predicted)))),
        tolerance=0.0,
        why=(f"exact: counts of |mu| above {THRESHOLD_SIGMAS:g} x the Monte-Carlo precision of mu "
             f"(threshold {threshold:.3g}, sigma_mu {sigma_mu:.3g} from the last {TAIL_FRACTION:.0%} of records) "
             "must be one per head and task; winners must equal theory.task_allocation.predicted_winners"),
        perturbations=[perturbation(f"winners permuted cyclically {permuted}", float(wrong_mismatch), 0.0,
                                    permuted=permuted)],
        details={"config": cfg.to_dict(), "train": tcfg.to_dict(), "threshold": threshold, "sigma_mu": sigma_mu,
                 "omega_end": tr.omega[tail].mean(axis=0), "mu_end": mu_end, "t": tr.t, "omega": tr.omega,
                 "mu": tr.mu, "final_loss": res.loss, "wall_seconds": res.wall_seconds},
    )


def check_surplus_decay(cfg, tcfg) -> Comparison:
    """H > m: the heads the theory leaves without a task end below the threshold and decay."""
    if cfg.heads <= cfg.m:
        raise ValueError(f"check_surplus_decay needs H > m (got H={cfg.heads}, m={cfg.m})")
    predicted = _predicted(cfg)
    surplus = [h for h in range(cfg.heads) if h not in predicted]
    res, tr, tail, sigma_mu, threshold, mu_end = _train_with_threshold(cfg, tcfg)
    if not surplus:
        raise RuntimeError(f"the theory assigns every one of the {cfg.heads} heads a task ({predicted}); "
                           "no surplus head to check")
    s_end = float(np.max(np.abs(mu_end[surplus])))
    s_peak = float(np.max(np.abs(tr.mu[:, surplus, :])))
    decayed = s_peak - s_end
    winners_ok = [int(h) for h in np.argmax((tr.mu[tail] * tr.omega[tail]).mean(axis=0), axis=0)] == list(predicted)
    return Comparison(
        name=f"surplus tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} B={tcfg.batch} t={tcfg.time:g}",
        measured={"surplus_heads": surplus, "max_abs_mu_end": s_end, "peak": s_peak, "winners_ok": winners_ok,
                  "below_threshold_at_end": bool(s_end <= threshold)},
        predicted={"surplus_heads": surplus, "max_abs_mu_end": 0.0, "winners": list(predicted)},
        error=threshold / max(decayed, 1e-300) if winners_ok else math.inf, tolerance=1.0,
        why=(f"the surplus heads' largest |mu| has fallen from its peak by more than {THRESHOLD_SIGMAS:g} sigma_mu "
             f"(= {threshold:.3g}); the other heads win as predicted; whether it is already below the threshold "
             "is reported (below_threshold_at_end)"),
        perturbations=[perturbation("the surplus heads keep their values (no decay: peak - end within the threshold)",
                                    decayed / threshold, 1.0)],
        details={"config": cfg.to_dict(), "train": tcfg.to_dict(), "threshold": threshold, "sigma_mu": sigma_mu,
                 "mu_end": mu_end, "omega_end": tr.omega[tail].mean(axis=0), "t": tr.t, "mu": tr.mu,
                 "omega": tr.omega, "predicted_winners": list(predicted)},
    )


def run_fewer_heads(cfg, tcfg) -> dict:
    """H < m: run and report which head serves which tasks (not asserted)."""
    res = train(cfg, tcfg)
    tr = trajectory_of(res)
    tail = _tail(tr)
    sigma_mu = mu_precision(tr.mu[tail])
    threshold = max(THRESHOLD_SIGMAS * sigma_mu, 1e-6)
    mu_end = tr.mu[tail].mean(axis=0)
    return {"config": cfg.to_dict(), "train": tcfg.to_dict(), "mu_end": mu_end,
            "omega_end": tr.omega[tail].mean(axis=0), "threshold": threshold,
            "tasks_per_head": (np.abs(mu_end) > threshold).sum(axis=1).tolist(), "final_loss": res.loss}


def heatmap(mu_end, title, name="task-allocation-heatmap") -> Figure:
    mu_end = np.asarray(mu_end)
    return Figure(name=name, title=title, kind="heatmap", matrix=mu_end.tolist(),
                  row_labels=[f"head {h}" for h in range(mu_end.shape[0])],
                  col_labels=[f"task {i}" for i in range(mu_end.shape[1])], xlabel="task", ylabel="head")


def _cases(profile: str, device: str, seed: int):
    def given(tasks, heads, favourite, s0=0.15, **kw):
        om, mu = favoured_init(tasks, heads, favourite, s0)
        return ProblemConfig(tasks=tasks, heads=heads, init="given", init_omega=om, init_mu=mu, device=device,
                             init_scale=s0, **kw)

    if profile == "tiny":
        return ([(given((1, 1), 2, [1, 0], L=8), TrainConfig(lr=0.1, time=6.0, batch=64, records=31, seed=seed))],
                [], [])
    if profile == "quick":
        # the SPEC.md run (r = 3, m = 2, H = 2, L = 128, batch 2048, lr 0.05, init 0.15, t = 60;
        # ~25 s on 2 cores) beside two small, fast cases with other block sizes and H = 3
        alloc = [(given((3, 3), 2, [0, 1], L=128), TrainConfig(lr=0.05, time=60.0, batch=2048, seed=seed)),
                 (given((2, 2), 2, [1, 0], L=16), TrainConfig(lr=0.1, time=12.0, batch=128, records=41, seed=seed)),
                 (given((2, 1, 1), 3, [2, 0, 1], L=16),
                  TrainConfig(lr=0.1, time=12.0, batch=128, records=41, seed=seed))]
        surplus = [(given((2, 2), 3, [0, 1], L=16), TrainConfig(lr=0.1, time=12.0, batch=128, records=41, seed=seed))]
        fewer = [(given((2, 2, 2), 2, [0, 1, 0], L=16),
                  TrainConfig(lr=0.1, time=12.0, batch=128, records=41, seed=seed))]
        return alloc, surplus, fewer
    # paper scale: the SPEC.md run (r = 3, m = 2, H = 2, L = 128, batch 2048, lr 0.05, init 0.15, t = 60)
    alloc = [(given((3, 3), 2, [0, 1], L=128), TrainConfig(lr=0.05, time=60.0, batch=2048, seed=seed)),
             (given((3, 3, 3), 3, [2, 0, 1], L=128), TrainConfig(lr=0.05, time=60.0, batch=2048, seed=seed))]
    surplus = [(given((3, 3), 4, [1, 2], L=128), TrainConfig(lr=0.05, time=60.0, batch=2048, seed=seed))]
    fewer = [(given((3, 3, 3), 2, [0, 1, 0], L=128), TrainConfig(lr=0.05, time=60.0, batch=2048, seed=seed))]
    return alloc, surplus, fewer


def run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None) -> ClaimResult:
    """Claim 4 on a profile: H = m allocation, H > m surplus decay, H < m reported."""
    check_profile(profile)

    def body() -> ClaimResult:
        alloc, surplus, fewer = _cases(profile, device, seed)
        n = len(alloc) + len(surplus) + len(fewer)
        comps, reported = [], []
        for j, (cfg, tcfg) in enumerate(alloc):
            progress(f"{CLAIM_ID}: H = m = {cfg.m}", j / n)
            c = check_allocation(cfg, tcfg)
            om_star, mu_star = allocated_fixed_point(cfg.tasks, cfg.L, cfg.sigma)
            c.details["expansion_fixed_point"] = {"omega_star": om_star, "mu_star": mu_star}
            comps.append(c)
        for j, (cfg, tcfg) in enumerate(surplus):
            progress(f"{CLAIM_ID}: H = {cfg.heads} > m = {cfg.m}", (len(alloc) + j) / n)
            comps.append(check_surplus_decay(cfg, tcfg))
        for j, (cfg, tcfg) in enumerate(fewer):
            progress(f"{CLAIM_ID}: H = {cfg.heads} < m = {cfg.m} (reported)", (len(alloc) + len(surplus) + j) / n)
            reported.append(run_fewer_heads(cfg, tcfg))
        progress(f"{CLAIM_ID}: done", 1.0)
        figures = [heatmap(comps[0].details["mu_end"], f"final mu, head x task ({comps[0].name})")] if comps else []
        if reported:
            figures.append(heatmap(reported[0]["mu_end"], "final mu with fewer heads than tasks (reported)",
                                   "task-allocation-fewer-heads"))
        return comparisons_result(
            CLAIM_ID, TITLE, STATEMENT, comps, figures,
            {"profile": profile, "seed": seed, "fewer_heads_reported": reported},
            theory={"winners": [c.predicted for c in comps]},
            numerics={"measured": [c.measured for c in comps], "worst": worst([c for c in comps if c.tolerance > 0])},
            tolerance={"value": {c.name: c.details["threshold"] for c in comps}, "why": comps[0].why if comps else ""})

    return run_claim(CLAIM_ID, TITLE, STATEMENT, body)
