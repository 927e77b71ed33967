"""Measurements of the allocated point's saddle in the full factored model.  Theory:
:mod:`theory.saddle` (derivations there).

Every function returns a frozen dataclass of measurements: values, standard errors over
seeds, and what a tolerance is built from (the record spacing, the amplification of a twin
run, the path of served points a run held); every prediction (2a, the discrete map's rate
at the held point, T(B), the slope 1/a) is theory.saddle's, and the comparisons, their
tolerances and perturbed predictions are claims.boundary_saddle's.  Training runs go through
:func:`numerics.train.train_many` (:func:`saddle_many`: the one GD loop, runs of one shape as
one program, ``start=`` the model at theory's allocated point, ``on_record=`` the readout); one
torch thread.  The need kinds of boundary-saddle (end of file) are measurements of one
configuration each; their runs' prompt streams are named from the need's seed
(numerics.engine.case_seed).

The start.  The exact allocated point (off-task entries 0: O[:, d+i] = 0, V[d+i, :] = 0 in
the off-task head) is NEVER left, with or without SGD noise: an empty inner channel receives
no gradient on any batch (theory.saddle, section 2; :func:`saddle_runs` runs it for the floor:
the off-task |mu| stays at the noise floor of the served channel, O[i,d+j] V[d+j,d+i]).
A trained run reaches the allocated point with each off-task value still balanced and
positive, decaying at rate 2a.  So the saddle runs start at the allocated point with every
off-task value set to a small balanced mu0 > 0 (``mu0``, stated per profile): the value a
run passing the allocation has.  From there gradient flow decays to the allocated point
and stays (the conservation law); SGD builds an imbalance ~ lr mu0 dS / (2 a B) and the
opposite-sign branch grows at 2a from seed ~ (lr/B)^2.  The growth rate at several steps
(:func:`step_size_measurement`) is measured from runs seeded on the opposite-sign branch
directly (o = -v), just below the fit window, so that every step size sees the same window
without the long plateau of the escape runs.

Sizes in docs/saddle.md (the saddle's configurations: claims.boundary_saddle.PROFILES): ``tiny`` (seconds),
``quick`` (40-70 s CPU, the invariant batch's GD half of it where it stays on D; one core), ``paper`` (not run
here).
"""
from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from numerics.evaluate import crossing_time, line_fit, mean_se, standard_error_along
from theory import saddle as th

from . import engine
from .config import ProblemConfig
from .config import make_generator, one_thread as _one_thread, sample_prompts
from .engine import case_seed, kind
from .model import MultiHeadAttention, symmetrize_full
from .train import TrainConfig, train_many


class _Stop(Exception):
    """Raised by a run's on_record hook once every off-task share has crossed the threshold."""


# ---------------------------------------------------------------------------------------
# the setting
# ---------------------------------------------------------------------------------------

def allocated_model(cfg: ProblemConfig, mu0: float = 0.0) -> MultiHeadAttention:
    """The full factored model at theory's allocated point of cfg, every seeded off-task entry
    (theory.saddle.SaddlePoint.entries) set to the balanced value mu0 (> 0: o = v; < 0: o = -v, the
    opposite-sign branch; 0: the exact allocated point, off-task channel empty)."""
    st = th.saddle_point(cfg.tasks, cfg.heads, cfg.L, cfg.sigma)
    mu = st.mu.copy()
    for e in st.entries:
        mu[e] = mu0
    return MultiHeadAttention.from_semi_singular_values(cfg, st.omega, mu)


def _problem(cfg: ProblemConfig) -> dict:
    """The configuration a measurement names: its tasks, heads, L and sigma."""
    return {"tasks": list(cfg.tasks), "heads": cfg.heads, "L": cfg.L, "sigma": cfg.sigma}


def _off_task_readout(model: MultiHeadAttention, entries) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mu_off (E,), serving mu (E,), o (E,), v (E,)) read from the weights: mu[h, i] =
    (O_h V_h)[i, d+i]; the off-task channel o = O_h[i, d+i], v = V_h[d+i, d+i]."""
    d = model.cfg.d
    with torch.no_grad():
        U = torch.einsum("hik,hkc->hic", model.O, model.V).double().cpu().numpy()
        O = model.O.detach().double().cpu().numpy()
        V = model.V.detach().double().cpu().numpy()
    mu_off = np.array([U[h, i, d + i] for h, i in entries])
    served = np.array([U[i, i, d + i] for h, i in entries])
    o = np.array([O[h, i, d + i] for h, i in entries])
    v = np.array([V[h, d + i, d + i] for h, i in entries])
    return mu_off, served, o, v


# ---------------------------------------------------------------------------------------
# the runs
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SaddleRun:
    """One SGD run from the seeded allocated point: records t (T,), off-task mu (T, E),
    serving mu (T, E), the off-task channel o, v (T, E) (``anti`` = o - v, ``imbalance`` =
    o^2 - v^2), the readout omega (T, H, m); stopped early once every entry's share
    |mu_off|/|mu_serving| passed ``stop_share`` (t_stop), or once the off-D residual of the
    merged weights (``residual``, (T,): numerics.model's readout) passed ``stop_residual``; wall
    seconds."""
    batch: int
    seed: int
    lr: float
    mu0: float
    t: np.ndarray
    mu_off: np.ndarray
    served: np.ndarray
    o: np.ndarray
    v: np.ndarray
    omega: np.ndarray
    t_stop: float
    escaped: bool
    wall: float
    residual: Optional[np.ndarray] = None

    @property
    def anti(self) -> np.ndarray:
        return self.o - self.v

    @property
    def imbalance(self) -> np.ndarray:
        return self.o ** 2 - self.v ** 2


def _recorder(cfg: ProblemConfig, entries, stop_share: float, stop_residual: float, fixed: bool):
    """The record of one saddle run and its on_record hook: the off-task channel and readout at
    every record; stops the run (:class:`_Stop`) once the off-D residual passes ``stop_residual``
    or, without a ``fixed`` batch, once every entry's share passed ``stop_share`` on the
    opposite-sign branch."""
    rec = {k: [] for k in ("t", "mu_off", "served", "o", "v", "omega", "residual")}

    def hook(step, t, state, loss):
        o, s, oo, vv = _off_task_readout(state, entries)
        readout = state.semi_singular_values()
        for k, v in zip(rec, (t, o, s, oo, vv, readout.omega, readout.residual)):
            rec[k].append(v)
        if readout.residual > stop_residual:
            raise _Stop
        if not fixed and np.all(np.abs(o) >= stop_share * np.abs(s)) and np.all(o < 0):
            raise _Stop

    return rec, hook


@_one_thread
def saddle_many(cfg: ProblemConfig, runs: Sequence[dict]) -> list[SaddleRun]:
    """Each run of ``runs`` (dicts of :func:`saddle_run`'s keyword arguments lr, batch, seed, mu0,
    t_max and optionally stop_share, record_dt, batches, start, stop_residual) trained from
    :func:`allocated_model` (cfg, mu0) (or its ``start``) with SGD, as numerics.train.train_many
    trains them: runs of one batch size in one program, runs of one data seed drawing each
    batch once (each run as train() gives it, to rounding).  An error other than the early stop
    ends the measurement (as it ended a run alone)."""
    st = th.saddle_point(cfg.tasks, cfg.heads, cfg.L, cfg.sigma)
    runs = [{"stop_share": 0.1, "record_dt": 0.5, "batches": None, "start": None, "stop_residual": math.inf, **r}
            for r in runs]
    recs, hooks = zip(*[_recorder(cfg, st.entries, r["stop_share"], r["stop_residual"], r["batches"] is not None)
                        for r in runs])
    t0 = _time.perf_counter()
    out = train_many([cfg] * len(runs), [TrainConfig(lr=r["lr"], time=r["t_max"], batch=r["batch"], seed=r["seed"],
                                                     records=2) for r in runs],
                     batches=[r["batches"] for r in runs], on_record=list(hooks),
                     record_every=[max(1, int(round(r["record_dt"] / r["lr"]))) for r in runs],
                     start=[allocated_model(cfg, r["mu0"]) if r["start"] is None else r["start"] for r in runs])
    wall = (_time.perf_counter() - t0) / len(runs)
    for res in out:
        if isinstance(res, BaseException) and not isinstance(res, _Stop):
            raise res
    return [SaddleRun(batch=r["batch"], seed=r["seed"], lr=r["lr"], mu0=r["mu0"], t_stop=float(rec["t"][-1]),
                      escaped=isinstance(res, _Stop), wall=wall, **{k: np.array(v) for k, v in rec.items()})
            for rec, r, res in zip(recs, runs, out)]


def saddle_run(cfg: ProblemConfig, lr: float, batch: int, seed: int, mu0: float, t_max: float, **options) -> SaddleRun:
    """Train the full model from :func:`allocated_model` (cfg, mu0) with SGD (lr, batch, data
    seed) up to t_max, recording the off-task channel every ``record_dt``; stops once every
    seeded entry's share has passed ``stop_share`` (``batches``: numerics.train's seam, e.g. a
    fixed symmetrised batch; then no early stop on the share; ``start``: another start model;
    ``stop_residual``: stop once the off-D residual passes it, e.g. a fixed batch's GD leaving D
    by a step-size instability).  One run of :func:`saddle_many`."""
    return saddle_many(cfg, [dict(lr=lr, batch=batch, seed=seed, mu0=mu0, t_max=t_max, **options)])[0]


@dataclass(frozen=True)
class SaddleRuns:
    """The escape runs of one configuration: runs[(batch, s)] (s a replicate), the exact-start floors
    floor[batch] (max |mu_off| from the exact allocated point over t_floor), the theory."""
    cfg: ProblemConfig
    theory: th.SaddlePoint
    lr: float
    mu0: float
    runs: dict
    floor: dict
    t_floor: float
    wall: float


def saddle_runs(cfg: ProblemConfig, lr: float, batches: Sequence[int], seeds: Sequence[int], mu0: float,
                t_max: float, seed: int, stop_share: float = 0.1, t_floor: float = 10.0,
                record_dt: float = 0.5) -> SaddleRuns:
    """Every (batch, s) escape run (s in ``seeds``: the replicates; replicate s's runs at every
    batch size on one prompt stream, case_seed(seed, "escape run", s): common random numbers
    across B, whose slope the escape times measure), plus one exact-start run per batch for the
    noise floor (case_seed(seed, "floor", batch)), trained together
    (:func:`saddle_many`)."""
    t0 = _time.perf_counter()
    st = th.saddle_point(cfg.tasks, cfg.heads, cfg.L, cfg.sigma)
    keys = [(B, s) for B in batches for s in seeds]
    specs = [dict(lr=lr, batch=B, seed=case_seed(seed, "escape run", s), mu0=mu0, t_max=t_max,
                  stop_share=stop_share, record_dt=record_dt) for B, s in keys]
    specs += [dict(lr=lr, batch=B, seed=case_seed(seed, "floor", B), mu0=0.0, t_max=t_floor, stop_share=math.inf,
                   record_dt=record_dt) for B in batches]
    done = saddle_many(cfg, specs)
    floor = {}
    for B, f in zip(batches, done[len(keys):]):
        if np.any(f.o != 0) or np.any(f.v != 0):
            raise RuntimeError("the exact allocated point's empty off-task channel received a gradient "
                               "(theory.saddle section 2 says it cannot)")
        floor[B] = float(np.abs(f.mu_off).max())
    return SaddleRuns(cfg, st, lr, mu0, dict(zip(keys, done)), floor, t_floor, _time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------
# (a) the growth rate
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GrowthRateMeasurement:
    """Rate of the off-task |mu| on the opposite-sign branch at step ``lr``, batch ``batch``:
    ``measured`` +- ``se`` (over seeds; each seed the mean over entries of the fitted slope of
    the logistic coordinate), ``raw`` +- ``raw_se`` (plain log|mu| fit), the window [lo, hi]
    (absolute |mu|), the floor, e-folds and points per fit, and the path the runs held in the
    window: per seed the readout omega (n, H, m) and the serving mu (n, E) at up to
    PATH_POINTS evenly spaced records of the window (where theory.saddle evaluates its
    discrete-time account), the largest |omega| of an off-task entry there."""
    config: dict
    lr: float
    batch: int
    seeds: tuple
    mu0: float
    measured: float
    se: float
    raw: float
    raw_se: float
    per_seed: tuple
    window: tuple
    floor: float
    e_folds: float
    points: int
    path_omega: tuple = ()
    path_served: tuple = ()
    off_task_omega: float = math.nan


PATH_POINTS = 8
"""Records of a fit window at which the held served point is read out for theory's
discrete-time account (the path mean of 2 log(1 + lr a)/lr): the SGD cloud is sampled evenly
over the window; eight records put the sampling error of that mean below the seeds' spread."""


def _window(t, mu_off, lo, hi):
    """Indices of one entry's fit window: after the last record with |mu| < lo (or mu >= 0)
    before the first record with |mu| >= hi on the opposite-sign branch, up to it; None if
    there is none or it has fewer than 5 records."""
    u = np.abs(mu_off)
    above = np.flatnonzero((u >= hi) & (mu_off < 0))
    if above.size == 0:
        return None
    j = int(above[0])
    below = np.flatnonzero((u[:j] < lo) | (mu_off[:j] >= 0))
    if below.size == 0:
        return None
    sel = np.arange(int(below[-1]) + 1, j + 1)
    return sel if sel.size >= 5 else None


def _window_fit(t, mu_off, lo, hi, K):
    """Fit over :func:`_window`: (slope of the logistic coordinate, slope of log|mu|, e-folds,
    points) or None."""
    sel = _window(t, mu_off, lo, hi)
    if sel is None:
        return None
    u = np.abs(mu_off)
    tt = t[sel]
    z = th.logistic_coordinate(u[sel], K)
    raw = np.log(u[sel])
    return line_fit(tt, z).slope, line_fit(tt, raw).slope, float(raw[-1] - raw[0]), int(sel.size)


def growth_rate_measurement(cfg: ProblemConfig, lr: float, batch: int, seeds: Sequence[int], runs: SaddleRuns,
                            floor_factor: float = 10.0, top_fraction: float = 0.05,
                            floor: Optional[float] = None) -> GrowthRateMeasurement:
    """The log-growth rate of each off-task |mu| on the opposite-sign branch, from the runs
    (batch, s) of ``runs`` (:func:`saddle_runs`).

    Window, fixed in advance: from where |mu| exceeds ``floor_factor`` x the noise floor
    (max |mu_off| of a run from the exact allocated point at the same lr, B; or ``floor``) to
    where it reaches ``top_fraction`` x mu* of its task, on the opposite-sign branch (mu < 0).
    The fitted coordinate is theory's logistic z = log(|mu|/(1 - |mu|/K)) (K = a/c, the
    curvature's correction, <= top_fraction mu*/K of the rate); the plain log fit is reported."""
    st = runs.theory
    floor = runs.floor[batch] if floor is None else float(floor)
    per_seed, raws, e_folds, points, path_om, path_sv, off_om = [], [], [], [], [], [], []
    lo, his = floor_factor * floor, top_fraction * st.mu_star
    off_task = st.omega == 0
    for s in seeds:
        run = runs.runs[(batch, s)]
        fits = [_window_fit(run.t, run.mu_off[:, e], lo, his[e], st.K[e]) for e in range(len(st.entries))]
        wins = [w for w in (_window(run.t, run.mu_off[:, e], lo, his[e]) for e in range(len(st.entries)))
                if w is not None]
        fits = [f for f in fits if f is not None]
        if not fits:
            continue
        per_seed.append(float(np.mean([f[0] for f in fits])))
        raws.append(float(np.mean([f[1] for f in fits])))
        e_folds += [f[2] for f in fits]
        points += [f[3] for f in fits]
        span = np.arange(min(w[0] for w in wins), max(w[-1] for w in wins) + 1)
        pick = span[np.unique(np.linspace(0, span.size - 1, min(PATH_POINTS, span.size)).round().astype(int))]
        path_om.append(run.omega[pick].copy())
        path_sv.append(run.served[pick].copy())
        off_om.append(float(np.abs(run.omega[span][:, off_task]).max()) if off_task.any() else 0.0)
    if len(per_seed) < 2:
        raise ValueError(f"fewer than 2 seeds gave a fit window (floor {floor:.3g}, lo {lo:.3g}, hi {his.min():.3g}): "
                         "raise t_max, B or lower floor_factor")
    (meas, se), (raw, raw_se) = mean_se(per_seed), mean_se(raws)
    return GrowthRateMeasurement(config=_problem(cfg),
                                 lr=lr, batch=batch, seeds=tuple(seeds), mu0=runs.mu0, measured=meas, se=se, raw=raw,
                                 raw_se=raw_se, per_seed=tuple(per_seed), window=(float(lo), float(his.min())),
                                 floor=floor, e_folds=float(np.mean(e_folds)), points=int(np.min(points)),
                                 path_omega=tuple(path_om), path_served=tuple(path_sv),
                                 off_task_omega=float(max(off_om)))


START_BELOW = 2.0
"""The step-size runs start on the opposite-sign branch at |mu| = lo / START_BELOW (lo the
window's lower edge): log(START_BELOW) / (2a) = 4..6 time units below the window, in which the
served point settles into its SGD cloud (measured: the served mu moves to its displaced level
within 1-2 time units)."""


def step_size_measurement(cfg: ProblemConfig, lrs: Sequence[float], batch: int, seeds: Sequence[int], floor: float,
                          seed: int, floor_factor: float = 10.0, top_fraction: float = 0.05, t_max: float = 300.0,
                          record_dt: float = 1.0) -> tuple:
    """The growth rate at each step ``lr`` of ``lrs`` (same batch, seeds, window; the floor
    of the largest step, ``floor``, the noisiest, so the window is the same at every lr):
    runs from theory's allocated point with each seeded entry on the opposite-sign branch
    (o = -v) at |mu| = lo / START_BELOW, stopped once every share passed 2 top_fraction, all
    trained together (:func:`saddle_many`); replicate s's runs at every lr see one prompt stream,
    case_seed(seed, "step-size run", s), drawn once a step (common random numbers across lr).
    Returns one :class:`GrowthRateMeasurement` per lr."""
    t0 = _time.perf_counter()
    st = th.saddle_point(cfg.tasks, cfg.heads, cfg.L, cfg.sigma)
    mu0 = -floor_factor * float(floor) / START_BELOW
    keys = [(lr, s) for lr in lrs for s in seeds]
    done = dict(zip(keys, saddle_many(cfg, [dict(lr=lr, batch=batch, seed=case_seed(seed, "step-size run", s),
                                                  mu0=mu0, t_max=t_max,
                                                  stop_share=2 * top_fraction, record_dt=record_dt)
                                             for lr, s in keys])))
    wall = _time.perf_counter() - t0
    return tuple(growth_rate_measurement(
        cfg, lr, batch, seeds, SaddleRuns(cfg, st, lr, mu0, {(batch, s): done[(lr, s)] for s in seeds}, {}, 0.0,
                                          wall / len(lrs)), floor_factor, top_fraction, floor=floor)
        for lr in lrs)


# ---------------------------------------------------------------------------------------
# (b) the escape time against the batch size; the measured seed input
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GradientVariance:
    """Per-prompt gradient variances of dl/dU_h at the allocated point, per off-task entry:
    S_col (column d+i), S_row (row i), dS = S_col - S_row with its standard error (16 groups)."""
    n: int
    S_col: np.ndarray
    S_row: np.ndarray
    dS: np.ndarray
    dS_se: np.ndarray


@kind("saddle_variance", cost=lambda cfg, n: 3 * engine.forward_seconds(cfg.tasks, cfg.heads, cfg.L, n))
@_one_thread
def gradient_variance_measurement(cfg: ProblemConfig, n: int, seed: int, groups: int = 16) -> GradientVariance:
    """dS = S_col - S_row at the exact allocated point (the measured input of the seed,
    theory.saddle section 3).  dl/dU_h[l, c] = 2 (yhat_l - y_l) c_h[c], c_h = sum_l p_hl z_l;
    the prediction is recomputed from the model's weights and checked against its forward.  The need
    kind "saddle_variance"."""
    st = th.saddle_point(cfg.tasks, cfg.heads, cfg.L, cfg.sigma)
    model = allocated_model(cfg, 0.0)
    d = cfg.d
    pr = sample_prompts(cfg, n, make_generator(seed, cfg.device))
    with torch.no_grad():
        W, U = model.merged_weights()
        q = pr.query[:, :d]
        a_h = torch.einsum("hcx,bx->bhc", W[:, :, :d], q)                    # (n, H, D)
        p = torch.softmax(torch.einsum("blc,bhc->bhl", pr.context, a_h), dim=-1)
        c_h = torch.einsum("bhl,blc->bhc", p, pr.context)                   # (n, H, D)
        yhat = torch.einsum("hic,bhc->bi", U, c_h)
        ref = model(pr.context, pr.query)
        if not torch.allclose(yhat, ref, rtol=1e-10, atol=1e-12):
            raise RuntimeError("the recomputed prediction disagrees with the model's forward pass")
        r = 2.0 * (yhat - pr.target)                                         # (n, m)
        r, c_h = r.double().cpu().numpy(), c_h.double().cpu().numpy()
    cols, rows = [], []
    for h, i in st.entries:
        col = r[:, :, None] * c_h[:, h, d + i][:, None, None]                 # (n, m, 1): dl/dU[l, d+i]
        row = r[:, i][:, None] * c_h[:, h, :]                                # (n, D):   dl/dU[i, c]
        cols.append(col.reshape(n, -1))
        rows.append(row)
    S_col = np.array([x.var(axis=0, ddof=1).sum() for x in cols])
    S_row = np.array([x.var(axis=0, ddof=1).sum() for x in rows])
    g = np.array_split(np.arange(n), groups)
    parts = np.array([[cols[e][k].var(axis=0, ddof=1).sum() - rows[e][k].var(axis=0, ddof=1).sum()
                       for e in range(len(st.entries))] for k in g])
    return GradientVariance(n=n, S_col=S_col, S_row=S_row, dS=S_col - S_row,
                            dS_se=standard_error_along(parts))


@dataclass(frozen=True)
class EscapeTimeMeasurement:
    """Escape time T (first time the off-task share |mu_off|/|mu_serving| reaches ``threshold``
    on the opposite-sign branch; mean over entries per run) per batch size: ``T`` and ``T_se``
    (over seeds); the OLS slope dT/dlog B +- se over ``slope_runs`` escaped runs (residual sd
    ``slope_resid_sd``, pooled over B); the record ``spacing``; the measured seed input (the
    per-prompt gradient variances, ``variance``) and the imbalance o^2 - v^2 read from the
    runs.  theory.saddle.escape_prediction turns the variances into T(B) and the slope."""
    config: dict
    lr: float
    batches: tuple
    seeds: tuple
    mu0: float
    threshold: float
    T: tuple
    T_se: tuple
    T_per_seed: tuple
    spacing: float
    slope: float
    slope_se: float
    slope_runs: int
    slope_resid_sd: float
    variance: dict
    imbalance_measured: tuple
    all_escaped: bool


def escape_times(runs: SaddleRuns, batches: Sequence[int], seeds: Sequence[int], threshold: float) -> tuple:
    """Per batch size the escape time T and its se over the seeds that escaped (each run's T the
    mean over entries of the first time an off-task value on the opposite-sign branch reaches
    ``threshold`` of the served one, numerics.evaluate.crossing_time; inf where none, or one,
    escaped), the per-seed times, and whether every entry of every run escaped."""
    T, T_se, per, all_escaped = [], [], [], True
    for B in batches:
        ts = []
        for s in seeds:
            run = runs.runs[(B, s)]
            te = [crossing_time(run.t, np.abs(run.mu_off[:, e]) / np.abs(run.served[:, e]), threshold,
                                eligible=run.mu_off[:, e] < 0) for e in range(len(runs.theory.entries))]
            all_escaped &= bool(np.all(np.isfinite(te)))
            ts.append(float(np.mean(te)))
        per.append(tuple(ts))
        mean, se = mean_se([x for x in ts if math.isfinite(x)])
        T.append(mean if mean is not None else math.inf)
        T_se.append(se if se is not None else math.inf)
    return T, T_se, per, all_escaped


def escape_time_measurement(cfg: ProblemConfig, lr: float, batches: Sequence[int], seeds: Sequence[int],
                            threshold: float, runs: SaddleRuns, variance: GradientVariance) -> EscapeTimeMeasurement:
    """Escape time against the batch size at fixed step from the escape runs ``runs``
    (:func:`saddle_runs`), the OLS slope of every escaped run's T on log B (residual variance
    pooled over B), and the seed input dS (``variance``: :func:`gradient_variance_measurement`)
    theory's T(B) needs."""
    st, var = runs.theory, variance
    T, T_se, per, all_escaped = escape_times(runs, batches, seeds, threshold)
    xs, ys = [], []
    for B, ts in zip(batches, per):
        fin = [x for x in ts if math.isfinite(x)]
        xs += [math.log(B)] * len(fin)
        ys += fin
    imb_meas = []
    spacing = float(np.max([np.diff(r.t).max() for r in runs.runs.values()]))
    x, y = np.array(xs), np.array(ys)
    if x.size < 3 or np.ptp(x) == 0:
        raise ValueError("the slope needs escaped runs at >= 2 batch sizes")
    fit = line_fit(x, y)             # >= 3 runs: the residual variance has a degree of freedom
    # the imbalance o^2 - v^2 each run actually built, read at t = 4/a (the balanced part
    # decayed by 4 e-folds, the opposite-sign one not yet grown; median over seeds and entries)
    for B in batches:
        vals = []
        for s in seeds:
            run = runs.runs[(B, s)]
            k = int(np.argmin(np.abs(run.t - 4.0 / float(st.a.mean()))))
            vals += list(run.imbalance[k])
        imb_meas.append(float(np.median(vals)))
    return EscapeTimeMeasurement(
        config=_problem(cfg), lr=lr,
        batches=tuple(batches), seeds=tuple(seeds), mu0=runs.mu0, threshold=threshold, T=tuple(T), T_se=tuple(T_se),
        T_per_seed=tuple(per), spacing=spacing, slope=fit.slope, slope_se=fit.slope_se, slope_runs=fit.n,
        slope_resid_sd=fit.residual_sd,
        variance={"dS": var.dS.tolist(), "dS_se": var.dS_se.tolist(), "S_col": var.S_col.tolist(),
                  "S_row": var.S_row.tolist(), "n": var.n},
        imbalance_measured=tuple(imb_meas), all_escaped=bool(all_escaped))


def anti_at_escape(runs: SaddleRuns, batch: int, seeds: Sequence[int]) -> float:
    """The SGD runs' opposite-sign amplitude |o - v| at escape: per seed the smallest over entries
    at the run's last record, median over seeds."""
    return float(np.median([np.abs(runs.runs[(batch, s)].anti[-1]).min() for s in seeds]))


# ---------------------------------------------------------------------------------------
# (c) the noiseless flow on an exactly G-invariant batch
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InvariantFlowMeasurement:
    """GD on one fixed, exactly G-invariant batch (numerics.model.symmetrize_full) from the
    same seeded start, over the same time (``steps`` GD steps at ``lr``): the max |o - v|
    (opposite-sign amplitude) and the min off-task mu over the run; ``amplification`` A the
    largest growth of an opposite-sign perturbation along the run (twin run on the same batch
    kicked by o += k, v -= k, k = TWIN_KICK sqrt(mu0): A = max_t |(o - v)_twin - (o - v)| / (2k)).

    ``lr`` is the largest of requested_lr / 2^k (k = 0 .. MAX_STEP_HALVINGS) at which GD on the
    batch stays on D (its off-D residual ``max_residual`` within :func:`rounding_bound`): a GD
    step past the fixed batch's stability edge leaves D through rounding, amplified about
    tenfold a step, which is a step-size instability and not the flow the check is about.
    ``unstable``: the larger steps tried, each {lr, t (when the residual passed the bound),
    residual, max_anti}.  ``stable`` is False when even the smallest step left D (then the run
    at that step is the one reported, and ``amplification`` is nan: no twin runs)."""
    config: dict
    lr: float
    time: float
    prompts: int
    mu0: float
    steps: int
    max_anti: float
    min_mu_off: float
    final_mu_off: float
    amplification: float
    wall: float
    requested_lr: float = float("nan")
    max_residual: float = float("nan")
    unstable: tuple = ()
    stable: bool = True


TWIN_KICK = 1e-7
"""Relative size of the twin run's opposite-sign kick (x sqrt(mu0)): far above rounding, far
below the nonlinear scale."""


MIN_BASE_PROMPTS = 8
"""Base prompts of the invariant batch at least (each symmetrised over G): at (2,2), |G| = 256, 512
prompts were 2 base prompts, whose fixed-batch GD at lr 0.2 diverged at step 25 with stream v3's
draw (loss 5e12) -- the curvature of two prompts, not the invariance the run checks; 8 run to the
horizon."""

MAX_STEP_HALVINGS = 4
"""How far the invariant run lowers its step (requested lr / 2^k, k <= 4) looking for a GD that stays
on D.  Measured at (2,2), H = 2, L = 64, 8 base prompts (2048 prompts), seed 7, t = 100: the off-D
residual of GD at lr 0.2 grows about tenfold a step from rounding (6e-10 at step 14, 2e-3 at 22,
0.24 at 25; the loss 0.19 -> 3.2) and |o - v| follows it (3e-16 at step 20, 5.7e-6 at 25, 2.2e-4 at
the end); at lr 0.1 the residual reaches 2e-2, at 0.05 9e-3 (t = 10, then decays), at 0.025 it stays
below 1e-16 and |o - v| is exactly 0 to t = 100."""


def rounding_bound(steps: int) -> float:
    """What rounding alone leaves in the off-D residual of an exactly invariant run of ``steps``
    GD steps (relative: 64 eps per step, summed; claim 1's rounding argument)."""
    return 64 * float(np.finfo(np.float64).eps) * (int(steps) + 1)


def invariant_flow_measurement(cfg: ProblemConfig, lr: float, time: float, mu0: float, prompts: int,
                               seed: int) -> InvariantFlowMeasurement:
    """The seeded start trained on one fixed G-invariant batch of ~``prompts`` prompts (theory:
    the batch gradient lies in D to rounding, so o and v receive the same update and |o - v|
    stays at rounding), at the largest step lr / 2^k that keeps GD on D, with its twin run for
    the amplification.  Where every step tried left D the run is not compared (the claim says
    why), so no twin runs: its amplification would bound nothing (``amplification`` nan)."""
    from theory.block_structure import group_order
    base = max(MIN_BASE_PROMPTS, int(prompts) // int(group_order(cfg.tasks)))
    fixed = symmetrize_full(sample_prompts(cfg, base, make_generator(seed, cfg.device)), cfg)
    t0 = _time.perf_counter()
    n = int(fixed.query.shape[0])
    unstable = []
    for k in range(MAX_STEP_HALVINGS + 1):
        step = float(lr) / 2 ** k
        steps = max(1, int(round(time / step)))
        bound = rounding_bound(steps)
        run = saddle_run(cfg, step, n, seed, mu0, time, stop_share=math.inf, record_dt=1.0,
                         batches=lambda i: fixed, stop_residual=bound)
        left = float(np.max(run.residual)) > bound
        if not left or k == MAX_STEP_HALVINGS:
            break
        unstable.append({"lr": step, "t": float(run.t[-1]), "residual": float(run.residual[-1]),
                         "max_anti": float(np.abs(run.anti).max())})
    A = math.nan if left else _twin_amplification(cfg, run, step, fixed, seed, mu0, time)
    return InvariantFlowMeasurement(config=_problem(cfg), lr=step, time=time, prompts=n, mu0=mu0, steps=steps,
                                    max_anti=float(np.abs(run.anti).max()), min_mu_off=float(run.mu_off.min()),
                                    final_mu_off=float(np.abs(run.mu_off[-1]).max()), amplification=A,
                                    wall=_time.perf_counter() - t0, requested_lr=float(lr),
                                    max_residual=float(np.max(run.residual)), unstable=tuple(unstable),
                                    stable=not left)


def _twin_amplification(cfg: ProblemConfig, run: SaddleRun, step: float, fixed, seed: int, mu0: float,
                        time: float) -> float:
    """A = max_t |(o - v)_twin - (o - v)_run| / (2k): the twin of ``run`` on the same fixed batch
    at the same step, its seeded entries kicked by o += k, v -= k (k = TWIN_KICK sqrt(mu0))."""
    st = th.saddle_point(cfg.tasks, cfg.heads, cfg.L, cfg.sigma)
    kick = TWIN_KICK * math.sqrt(mu0)
    twin_model = allocated_model(cfg, mu0)
    d = cfg.d
    with torch.no_grad():
        for h, i in st.entries:
            twin_model.O[h, i, d + i] += kick
            twin_model.V[h, d + i, d + i] -= kick
    twin = saddle_run(cfg, step, int(fixed.query.shape[0]), seed, mu0, time, stop_share=math.inf, record_dt=1.0,
                      batches=lambda i: fixed, start=twin_model)
    m = min(len(twin.anti), len(run.anti))
    return float(np.max(np.abs(twin.anti[:m] - run.anti[:m])) / (2 * kick))


# ---------------------------------------------------------------------------------------
# the need kinds of boundary-saddle (numerics.engine), each priced from its parameters
# ---------------------------------------------------------------------------------------

PRICED_ESCAPE_TIME = 0.4
"""The share of t_max an escape run is priced at: the runs stop at their escape, which theory
puts at T(B), but its seed input dS is measured with the runs; measured at quick's (1, 1): the
nine runs stopped at 0.28 - 0.5 t_max, 0.38 on average."""

PRICED_STEP_TIME = 45.0
"""The length a step-size run is priced at: from |mu| = lo / START_BELOW to a share of
2 top_fraction, log(4 top_fraction mu* / lo) / (2a); measured at quick's (1, 1): 43 - 45."""


SGD_DTYPE = "float32"
"""The arithmetic of the SGD runs of the need kinds (the escape runs, their floors, the
step-size runs), whatever the need's cfg says: a run differs from its float64 twin by rounding
only (numerics.config draws float32 Gaussians, so the prompts are the same numbers), so the
precision is not part of what a need names (its identity, hence its seed and prompt streams).
What the runs are read for is far above float32's unit round-off 6e-8: the growth rates are
fitted over 3.6 e-folds of |mu| from ~1e-3 and compared within 2-9 % (tolerances 0.003-0.016
on rates 0.12-0.18); the escape times enter through dT/dlog B, pooled within 0.5-0.8 of a
ratio 1, and rounding adds ~1e-8 a step to o - v against the imbalance seed
M / (2 sqrt(mu0)) ~ 1e-4 it grows from: log|o - v| moves by < 1e-3, T by < 0.02 time units
against its se of 2-8 and the record spacing 1.  The floors' check that an empty channel never
moves stays exact (its gradient is a product with exact zeros).  Measured at quick, seed 0: every
escape time and growth rate equals its float64 value to the printed digits (T to 0.01, rates to
1e-5) for 0.76 of the CPU time.  The invariant batch's GD (compared at rounding) and the
gradient-variance probe (checked against the forward pass at 1e-10) stay in cfg's dtype."""


def _sgd_seconds(cfg: ProblemConfig, batch: int, time: float, lr: float, record_dt: float, runs: int = 1) -> float:
    """``runs`` runs of ``time`` / lr SGD steps at ``batch`` in SGD_DTYPE, each on its own prompt
    stream, in numerics.train.train_many's programs, with two readouts a record (the trainer's
    and the hook's) every ``record_dt``."""
    steps = max(1, round(float(time) / float(lr)))
    records = 2 * steps // max(1, round(float(record_dt) / float(lr)))
    return engine.many_seconds(cfg.tasks, cfg.heads, cfg.L, int(batch), steps, [1] * int(runs), dtype=SGD_DTYPE,
                             records=records)


def _escape_cost(cfg, lr, batches, seeds, mu0, t_max, stop_share, record_dt) -> float:
    """Per batch size its runs (PRICED_ESCAPE_TIME x t_max) and its floor (t = 10)."""
    return sum(_sgd_seconds(cfg, B, PRICED_ESCAPE_TIME * t_max, lr, record_dt, len(seeds))
               + _sgd_seconds(cfg, B, 10.0, lr, record_dt) for B in batches)


@kind("saddle_escape_runs", cost=_escape_cost)
def escape_runs_need(cfg, lr, batches, seeds, mu0, t_max, stop_share, record_dt, seed) -> SaddleRuns:
    """The escape runs of one configuration and their floors (:func:`saddle_runs`), in SGD_DTYPE."""
    return saddle_runs(cfg.replace(dtype=SGD_DTYPE), lr, batches, seeds, mu0, t_max, seed, stop_share=stop_share, record_dt=record_dt)


def _steps_cost(cfg, lrs, batch, seeds, escape, floor_factor, top_fraction, t_max, record_dt) -> float:
    return sum(_sgd_seconds(cfg, batch, PRICED_STEP_TIME, lr, record_dt, len(seeds)) for lr in lrs)


@kind("saddle_step_sizes", cost=_steps_cost)
def step_sizes_need(cfg, lrs, batch, seeds, escape, floor_factor, top_fraction, t_max, record_dt, seed) -> tuple:
    """The growth rate at each step of ``lrs`` (:func:`step_size_measurement`), its window from
    the floor of the escape runs (``escape``, a dependency) at ``batch``, in SGD_DTYPE."""
    return step_size_measurement(cfg.replace(dtype=SGD_DTYPE), lrs, batch, seeds, escape.floor[batch], seed, floor_factor, top_fraction,
                                 t_max, record_dt)


def _invariant_cost(cfg, lr, escape, batches, seeds, threshold, t_max, mu0, prompts) -> float:
    """The GD run and its twin on the fixed batch (no prompts drawn: a step less its stream's
    draw) over PRICED_ESCAPE_TIME x t_max, at the requested step halved three times where the
    batch has only MIN_BASE_PROMPTS base prompts, else at the requested step (the halvings a
    fixed batch's stability edge forces are known only when it runs: quick's (1, 1), 128 base
    prompts, stayed on D at lr 0.3; its (2, 2), 8 base prompts, left D at 0.2, 0.1 and 0.05 and
    ran at 0.025; the steps that left are stopped within a few time units and not priced)."""
    from theory.block_structure import group_order
    G = int(group_order(cfg.tasks))
    base = max(MIN_BASE_PROMPTS, int(prompts) // G)
    step = float(lr) / (2 ** 3 if base == MIN_BASE_PROMPTS else 1)
    steps = max(1, round(PRICED_ESCAPE_TIME * t_max / step))
    n = base * G
    drawn = engine.STEP[cfg.dtype]["context"] * n * cfg.L * cfg.token_dim
    return 2 * steps * (engine.step_seconds(cfg.tasks, cfg.heads, cfg.L, n, dtype=cfg.dtype) - drawn)


@kind("saddle_invariant", cost=_invariant_cost)
def invariant_need(cfg, lr, escape, batches, seeds, threshold, t_max, mu0, prompts, seed) -> InvariantFlowMeasurement:
    """The invariant batch's flow (:func:`invariant_flow_measurement`) over the escape runs' horizon: the largest
    finite escape time over the batch sizes of ``escape`` (a dependency; t_max where none escaped)."""
    T = escape_times(escape, batches, seeds, threshold)[0]
    return invariant_flow_measurement(cfg, lr, float(np.nanmax([x for x in T if math.isfinite(x)] or [t_max])), mu0,
                                      prompts, seed)
