"""Runs of the exact finite-L reduced model behind the boundaries (merged parametrisation,
fewer heads than tasks, saturation, small L): training on (omega, mu) with fresh prompts and
the Rao-Blackwellised Monte-Carlo losses of the end points."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from numerics.exact_reduced import allocated_minimum, evaluate, minimise_family, optimal_mu_at
from numerics.experiments import one_thread
from numerics.statistics import mean_se
from numerics.train import TrainConfig, train_reduced


def paired_difference(a, b) -> tuple[float, float]:
    """mean(a - b) and its standard error on the same prompts."""
    return mean_se(np.asarray(a) - np.asarray(b))


@dataclass(frozen=True)
class MergedAndFactored:
    """The exact reduced flow trained merged and factored from the same start, both end points
    evaluated on the same held-out prompts (per-prompt losses, paired)."""

    merged_omega: np.ndarray
    merged_mu: np.ndarray
    factored_omega: np.ndarray
    factored_mu: np.ndarray
    loss_merged: np.ndarray
    loss_factored: np.ndarray


@one_thread
def merged_and_factored(cfg, tcfg: TrainConfig, n_eval: int, seed: int) -> MergedAndFactored:
    merged = train_reduced(cfg.replace(param="merged"), tcfg)
    factored = train_reduced(cfg.replace(param="factored"), tcfg)
    losses = evaluate([(merged.omega, merged.mu), (factored.omega, factored.mu)], cfg.tasks, cfg.L, cfg.sigma,
                      n_eval, seed + 17, cfg.device)
    return MergedAndFactored(np.asarray(merged.omega), np.asarray(merged.mu), np.asarray(factored.omega),
                             np.asarray(factored.mu), losses[0], losses[1])


@dataclass(frozen=True)
class FewerHeadsRun:
    """A reduced-flow run with H < m heads: the Polyak average of its last quarter of records
    (omega, mu), the partition minimum of the exact loss for theory's winners, the m-head
    allocated minimum, and their losses on the same held-out prompts (``losses[0]``: the
    averaged point, ``[1]``: the partition minimum, ``[2]``: the allocated minimum, ``[3:]``:
    each averaged record); the training losses (``train_losses``), steps, record count."""

    omega: np.ndarray
    mu: np.ndarray
    partition: object
    allocated: object
    losses: list
    train_losses: np.ndarray
    steps: int
    averaged_records: int


@one_thread
def fewer_heads_run(cfg, tcfg: TrainConfig, winners, n_eval: int, seed: int) -> FewerHeadsRun:
    res = train_reduced(cfg, tcfg)
    # the end point of a finite-step run fluctuates around the flow's limit (fresh batches):
    # average the iterates of the last quarter of the records (Polyak)
    late = [r for r in res.trajectory if r.t >= 0.75 * res.trajectory[-1].t]
    om_avg = np.mean([r.omega for r in late], axis=0)
    mu_avg = np.mean([r.mu for r in late], axis=0)
    serves = np.zeros((cfg.heads, cfg.m), bool)
    serves[list(winners), np.arange(cfg.m)] = True
    part = minimise_family(cfg.tasks, cfg.L, cfg.sigma, serves, serves,
                           [np.where(serves, np.maximum(np.abs(om_avg), 0.05), 0.0)], seed + 5,
                           family="partition", device=cfg.device)
    alloc = allocated_minimum(cfg.tasks, cfg.L, cfg.sigma, seed + 6, cfg.device)
    points = [(om_avg, mu_avg), (part.omega, part.mu), (alloc.omega, alloc.mu)] + [(r.omega, r.mu) for r in late]
    losses = evaluate(points, cfg.tasks, cfg.L, cfg.sigma, n_eval, seed + 7, cfg.device)
    return FewerHeadsRun(om_avg, mu_avg, part, alloc, losses, np.asarray(res.losses), res.steps, len(late))


@one_thread
def saturation_scan(r: int, L: int, omegas, sigma: float = 0.0, n_eval: int = 20000, seed: int = 0,
                    device="cpu", expansion=None, valid=None) -> list[dict]:
    """One head on one block of size r: at each omega, mu minimising the exact loss (fit
    sample), the exact loss there (independent sample) and theory's expansion at the same
    (omega, mu) (``expansion(om, mu)``, ``valid(om)``: theory's functions, passed in), with
    kappa = omega^2 r / log L."""
    rows = []
    for k, w in enumerate(omegas):
        om = np.full((1, 1), float(w))
        mu = optimal_mu_at(om, (r,), L, sigma, seed, device=device)
        loss, se = mean_se(evaluate([(om, mu)], (r,), L, sigma, n_eval, seed + 1000 + k, device)[0])
        with np.errstate(all="ignore"):
            exp_val = float(expansion(om, mu))
        rel = (exp_val - loss) / loss
        rows.append({"omega": float(w), "mu": float(mu[0, 0]), "kappa": float(w) ** 2 * r / math.log(L),
                     "valid": bool(valid(om)), "exact": loss, "exact_se": se,
                     "expansion": exp_val, "relative_error": rel,
                     "relative_error_se": abs(exp_val) * se / loss ** 2 if math.isfinite(exp_val) else 0.0})
    return rows


@one_thread
def monte_carlo_losses(points, r: int, sigma: float, mc_elements: int, seed: int, device="cpu") -> list[dict]:
    """The Rao-Blackwellised Monte-Carlo exact loss of one head on one block at each
    {"L", "omega", "mu"} of ``points`` (max(2000, mc_elements // L) prompts, seed + k)."""
    out = []
    for k, row in enumerate(points):
        n = max(2000, mc_elements // row["L"])
        om, mu = np.array([[row["omega"]]]), np.array([[row["mu"]]])
        mc, se = mean_se(evaluate([(om, mu)], (r,), row["L"], sigma, n, seed + k, device)[0])
        out.append({"mc": mc, "mc_se": se, "mc_n": n})
    return out
