"""Runs of the exact finite-L reduced model behind the boundaries (merged parametrisation,
fewer heads than tasks, saturation, small L), as need kinds (``numerics.engine``):

- ``reduced_flow``: one flow on (omega, mu) with fresh prompts; flows of one shape and batch
  size asked together (by any claims of a build) are trained as one program
  (``numerics.train.train_reduced_many``);
- ``paired_end_losses``: the end points of two flows on the same held-out prompts;
- ``fewer_heads_end``: a flow with H < m heads read out (Polyak average of its last quarter),
  the partition minimum of theory's winners and the m-head allocated minimum, all on the same
  held-out prompts;
- ``saturation_scan``: one head on one block, the exact loss at the mu that minimises it, along omega;
- ``monte_carlo_losses``: the exact loss of one head on one block at theory's points.

The Rao-Blackwellised Monte-Carlo losses of ``numerics.exact_reduced`` measure every end point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from numerics import engine
from numerics.train import shape_key
from numerics.engine import kind
from numerics.exact_reduced import (allocated_minimum, evaluate, fit_sample_size, minima_seconds, minimise_family,
                                    optimal_mu_at)
from numerics.experiments import one_thread
from numerics.engine import case_seed
from numerics.statistics import mean_se
from numerics.train import TrainConfig, train_reduced, train_reduced_many


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
