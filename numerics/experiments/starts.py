"""Runs from starts outside the paper's "suitable initialisation" (the initialisation
boundaries, ``claims.initialisation`` and ``claims.allocation_race``, issue 14).

Each function trains (or probes) once per configuration and returns a plain dict (the claims
read many of its keys); every run is keyed by its full configuration (:func:`cached`), so a run
asked twice in a report is trained once, and uses one torch thread (:func:`one_thread`).
Winners, mass shares and signed superposition come from the one readout
(``numerics.readout.allocation``).  The cached dicts are shared: callers must not mutate them.
"""
from __future__ import annotations

import numpy as np
import torch

from numerics.config import ProblemConfig
from numerics.evaluate import held_out_loss, held_out_reduced_loss
from numerics.exact_reduced import allocated_minimum
from numerics.experiments import cached, identity, one_thread
from numerics.model import MultiHeadAttention, factor_balance
from numerics.readout import RACE_DECIDED_SHARE, allocation
from numerics.train import TrainConfig, train, train_reduced
from theory.initialisation import residual_split, unbalanced_metric_factors
from theory.three_phases import phase_times

__all__ = ["random_start_run", "unbalanced_run", "race_cell", "large_init_run", "allocated_loss"]


def _key(kind: str, cfg: ProblemConfig, tcfg: TrainConfig, **more) -> str:
    return identity(kind, problem=cfg.to_dict(), train=tcfg, **more)


def _curve(r) -> tuple[list, list]:
    return [x.t for x in r.trajectory], [x.loss for x in r.trajectory]


def _readout(r) -> dict:
    """Final winners (argmax mu omega), their mass shares, whether the race has ended
    (``race_decided``) and every task is allocated to its winner (``mass_allocated``), the rounded
    (omega, mu) and the phase times of a TrainResult."""
    a = allocation(r.omega, r.mu)
    t, loss = _curve(r)
    return {"winners": list(a.winners), "share": list(a.mass_share), "race_decided": a.race_decided,
            "mass_allocated": a.mass_allocated, "omega": np.round(r.omega, 4).tolist(),
            "mu": np.round(r.mu, 4).tolist(), "phases": phase_times(t, loss).to_dict()}


# ---------------------------------------------------------------------------------------
# boundary-initialisation
# ---------------------------------------------------------------------------------------

def random_start_run(cfg: ProblemConfig, tcfg: TrainConfig, n_eval: int) -> dict:
    """Train the full factored model from cfg (init uniform_full): the residual split at every
    record, Q's y columns before and after, OV singular values, the held-out loss."""
    return cached(_key("random_start", cfg, tcfg, n_eval=int(n_eval)), lambda: _random_start_run(cfg, tcfg, n_eval))


@one_thread
def _random_start_run(cfg: ProblemConfig, tcfg: TrainConfig, n_eval: int) -> dict:
    model = MultiHeadAttention(cfg)
    d = cfg.d
    Q_y0 = model.Q.detach()[:, :, d:].clone()
    Q_x0 = model.Q.detach()[:, :, :d].clone()
    norm0_sq = float(sum((p.detach().double() ** 2).sum() for p in model.parameters()))
    rows = []

    def on_record(step, t, m, loss):
        W, U = (x.detach().cpu().double().numpy() for x in m.merged_weights())
        rows.append({"t": t, "loss": loss, **residual_split(W, U, cfg.tasks, cfg.basis_numpy())})

    res = train(cfg, tcfg, start=model, on_record=on_record)
    with torch.no_grad():
        U = model.merged_weights()[1].detach().cpu().double().numpy()
        dQy = float((model.Q[:, :, d:] - Q_y0).norm())
        dQx = float((model.Q[:, :, :d] - Q_x0).norm())
    sv = [np.linalg.svd(U[h], compute_uv=False) for h in range(cfg.heads)]
    top = max(float(s.max()) for s in sv) if sv else 0.0
    est = held_out_loss(model, n=n_eval, seed=tcfg.seed)
    a = allocation(res.omega, res.mu)
    return {"init_scale": cfg.init_scale, "seed": cfg.init_seed, "norm0_sq": norm0_sq, "trajectory": rows,
            "dQ_y": dQy, "dQ_x": dQx, "ov_singular_values": [np.round(s, 4).tolist() for s in sv],
            "ov_above_5pct": [int(np.sum(s > 0.05 * top)) for s in sv], "loss": est.mean, "loss_se": est.se,
            "omega": np.round(res.omega, 4).tolist(), "mu": np.round(res.mu, 4).tolist(),
            "winners": list(a.winners), "winner_share": list(a.mass_share),
            "superposed_tasks": list(a.signed_superposed),
            "phases": phase_times([r["t"] for r in rows], [r["loss"] for r in rows]).to_dict()}


def unbalanced_run(cfg: ProblemConfig, tcfg: TrainConfig) -> dict:
    """Full model from the unbalanced start; the reduced flow from the same (omega0, mu0) on the
    same prompts with the unbalanced metric (the conserved balances read off the start) and
    with the balanced one.  Each curve's outcome per task: its winning head where that head
    carries >= RACE_DECIDED_SHARE of sum_h |mu omega|, else -1 (shared: a superposition)."""
    return cached(_key("unbalanced", cfg, tcfg), lambda: _unbalanced_run(cfg, tcfg))


@one_thread
def _unbalanced_run(cfg: ProblemConfig, tcfg: TrainConfig) -> dict:
    model = MultiHeadAttention(cfg)
    ro = model.semi_singular_values()
    omega0, mu0 = ro.omega.copy(), ro.mu.copy()
    c_om, c_mu = factor_balance(model)
    full = train(cfg, tcfg, start=model)
    s, tasks = cfg.logit_scale, cfg.tasks

    def metric(o, m_):
        f = unbalanced_metric_factors(o.cpu().double().numpy(), m_.cpu().double().numpy(), c_om, c_mu, tasks, s)
        return tuple(torch.as_tensor(x, dtype=o.dtype, device=o.device) for x in f)

    # train_reduced copies ``start`` (the caller's arrays are never updated in place)
    red_u = train_reduced(cfg, tcfg, start=(ro.omega, ro.mu), metric=metric)
    red_b = train_reduced(cfg, tcfg, start=(ro.omega, ro.mu))
    out = {"seed": cfg.init_seed, "data_seed": tcfg.seed, "omega0": omega0.tolist(), "mu0": mu0.tolist(),
           "c_omega": np.round(c_om, 4).tolist(), "c_mu": np.round(c_mu, 4).tolist(),
           "spacing": tcfg.time / (tcfg.records - 1), "t_end": tcfg.time}
    for key, r in (("full", full), ("reduced_unbalanced", red_u), ("reduced_balanced", red_b)):
        ro_ = _readout(r)
        t, loss = _curve(r)
        ro_["outcome"] = [int(w) if sh >= RACE_DECIDED_SHARE else -1 for w, sh in zip(ro_["winners"], ro_["share"])]
        out[key] = {**ro_, "t": t, "loss": loss}
    return out


def allocated_loss(cfg: ProblemConfig, n_eval: int, seed: int) -> dict | None:
    """The allocated minimum at cfg's (tasks, L, sigma) (``numerics.exact_reduced``), surplus
    heads at zero, and its held-out loss on ``n_eval`` prompts of cfg (None for H < m: there is
    no allocated point)."""
    def compute():
        if cfg.heads < cfg.m:
            return None
        alloc = allocated_minimum(cfg.tasks, cfg.L, cfg.sigma, seed=seed, device=cfg.device)
        om, mu = (np.vstack([a, np.zeros((cfg.heads - cfg.m, cfg.m))])[:cfg.heads] for a in (alloc.omega, alloc.mu))
        est = held_out_reduced_loss(om, mu, cfg, n=n_eval, seed=seed)
        return {"mean": est.mean, "se": est.se, "omega": om.tolist(), "mu": mu.tolist()}

    return cached(identity("allocated_loss", problem=cfg.to_dict(), n_eval=int(n_eval), seed=int(seed)), compute)


# ---------------------------------------------------------------------------------------
# boundary-allocation-race
# ---------------------------------------------------------------------------------------

def race_cell(cfg: ProblemConfig, tcfg: TrainConfig) -> dict:
    """Full model from the given (omega0, mu0): final winners, shares and phase times."""
    return cached(_key("race_cell", cfg, tcfg), lambda: one_thread(lambda: _readout(train(cfg, tcfg)))())


def large_init_run(cfg: ProblemConfig, tcfg: TrainConfig) -> dict:
    """Full model and reduced flow from the default decomposable start at cfg.init_scale."""
    def compute():
        return {key: _readout(fn(cfg, tcfg)) for key, fn in (("full", train), ("reduced", train_reduced))}

    return cached(_key("large_init", cfg, tcfg), one_thread(compute))
