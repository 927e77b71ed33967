"""The allocated point is a saddle of the factored flow: its unstable direction, its rate,
and how SGD seeds it (the one definition; numpy/scipy, no torch).

Notation of docs/model.md: tasks r = (r_1..r_m), H heads, context length L, label noise sigma.
The *allocated point* puts head h < m on task h at theory.exact's one-head fixed point
(omega*_h, mu*_h) (:func:`theory.exact.exact_fixed_point`); every other entry (the
"off-task" entries, and the surplus heads h >= m) is zero.  With m = 1 the model needs
H >= 2: head 0 serves the task, head 1 is the off-task (surplus) entry.

1. The unstable direction and its rate (gradient flow)
------------------------------------------------------
Near an off-task entry mu = mu[h, i] = 0 the exact loss is, at fixed omega and the other
mu, L = L0 + a mu + (c/2) mu^2 + ..., with

    a = d L / d mu[h, i]  (:func:`off_task_slope`; theory.exact.exact_gradient; a > 0 here),
    c = d^2 L / d mu[h, i]^2 with the serving head's mu re-optimised = 2 (C_hh - C_hk^2/C_kk)
        (:func:`off_task_curvature`; C from theory.exact).

The factored weights carry mu = o v (o = O_h[i, d+i], v = V_h[d+i, d+i]; the inner index
d+i is the off-task channel).  Gradient flow: do/dt = -a v, dv/dt = -a o.  So x = o + v
decays, x(t) = x0 e^{-a t}, and y = o - v grows, y(t) = y0 e^{a t}; mu = (x^2 - y^2)/4.
The balanced positive branch (o = v, mu > 0: every sign-aligned balanced start) decays at
rate 2a; the opposite-sign branch mu = -(o - v)^2/4 grows at rate

    growth rate = 2a          (:func:`growth_rate`),

and with the curvature, d|mu|/dt = 2|mu| (a - c|mu|) on that branch (factored metric
2|mu|): logistic, so z = log(|mu| / (1 - |mu|/K)), K = a/c, grows at exactly 2a
(:func:`logistic_coordinate`).  Gradient descent with step lr multiplies y by (1 + lr a)
per step: rate 2 log(1 + lr a)/lr (:func:`gd_growth_rate`).

1b. The discrete step and the point a run holds
-----------------------------------------------
The step's factor is the balanced factored parametrisation's own map.  One GD step on the
channel (slope a of the loss in mu = o v, the other weights fixed) is o' = o - lr a v,
v' = v - lr a o, so y' = o' - v' = (1 + lr a) y exactly and x' = (1 - lr a) x: the
opposite-sign branch |mu| = y^2/4 is multiplied by (1 + lr a)^2 per step, i.e. grows at

    2 log(1 + lr a) / lr = 2a - lr a^2 + O(lr^2)    per unit time (t = lr x steps).

An SGD run does not hold theory's allocated point: its served (omega, mu) fluctuate about a
centre displaced by the finite step and batch (measured in docs/saddle.md), and a there is
theory.exact's slope at the served point the run holds (:func:`slope_at`).  Along a path of
served points theta_n the channel is multiplied by prod_n (1 + lr a(theta_n)), so the
discrete account of the rate over a window is the path mean
(2/lr) <log(1 + lr a(theta_n))>_n (:func:`discrete_rate_along`).  The batch's noise in a
adds -lr Var(a_hat)(...) ~ lr S/B to the rate (S the per-prompt variance of dl/dmu): below
1e-3 of 2a at the profiles' lr/B, not included.  As lr -> 0 at fixed B the served point's
displacement and the step's factor both vanish and the rate tends to 2a at theory's point.

2. Gradient flow never enters it: a conservation law
----------------------------------------------------
For U = O V and any loss of U, dO/dt = -G V^T, dV/dt = -O^T G (G = dL/dU) conserve the
inner-space matrix M = O^T O - V V^T.  Its entry on the off-task channel is
M_kk = |O[:, k]|^2 - |V[k, :]|^2 (k = d + i), and to leading order o^2 - v^2 = x y.  A
balanced start has M_kk = 0, so x y = 0: y stays 0 while x decays, and the run stays on
the decaying branch.  Also: an EMPTY channel (O[:, k] = 0, V[k, :] = 0, the exact allocated
point) stays empty under every gradient step on every batch (dO = -G V^T has no k column,
dV = -O^T G no k row): the exact allocated point is never left, with or without noise.

3. How SGD seeds it: the imbalance
----------------------------------
One SGD step O' = O - lr G^ V^T, V' = V - lr O^T G^ changes M exactly by

    Delta M = lr^2 (V G^T G V^T - O^T G G^T O)        (G = G^ the batch gradient).

On the balanced off-task channel (O[:, k] = o e_i, V[k, :] = v e_{d+i}, o = v):
Delta M_kk = lr^2 v^2 (|G^[:, d+i]|^2 - |G^[i, :]|^2), whose mean is lr^2 v^2 dS / B with

    dS = S_col - S_row,  S_col = sum_l Var_prompt(d l/d U_h[l, d+i]),
                         S_row = sum_c Var_prompt(d l/d U_h[i, c])

(per-prompt gradient variances at the allocated point: the measured input; the means, a^2
in both, cancel).  As the balanced part decays, v^2 = mu0 (1 - lr a)^{2n}, the imbalance
accumulates to (:func:`imbalance`)

    M = lr^2 mu0 dS / (B (1 - (1 - lr a)^2))  ~  lr mu0 dS / (2 a B),

and since x y = M with x = 2 sqrt(mu0) e^{-a t}, y(t) = M e^{a t} / (2 sqrt(mu0)) (the
accumulation does not change this: y e^{-a t} = M(t)/x0 at every t).  So the opposite-sign
branch starts from the seed (:func:`seed_level`)

    |mu|(t) = seed e^{2 a t},   seed = M^2 / (16 mu0)  ~  mu0 (lr dS / (2 a B))^2  ~ (lr/B)^2,

and reaches a share theta of the serving mu* at (:func:`escape_time`)

    T(B) = (1/(2a)) [log(theta mu* / (1 - theta mu*/K)) - log seed(B)],
    dT / d log B = 2 / (2a) = 1/a          (:func:`escape_time_slope`).

The additive-noise picture (the direction receives noise of variance lr^2 s2/B per step, an
unstable OU process: amplitude^2 -> lr s2 / (2 a B), seed ~ lr/B) gives half that slope,
1/(2a) (:func:`additive_noise_seed`, :func:`additive_noise_slope`): it does not apply at
the allocated point, where the per-prompt gradient has no component in the unstable
direction (section 2); the numerics test which slope the trained model follows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import exact as _exact
from . import check_sigma, check_tasks, in_range


def _heads(tasks, heads) -> int:
    m = len(tasks)
    H = max(m, 2) if heads is None else heads
    if isinstance(H, bool) or not isinstance(H, (int, np.integer)) or H < max(m, 2):
        raise ValueError(f"heads must be an integer >= max(m, 2) = {max(m, 2)} (a saddle needs an off-task "
                         f"entry), got {heads!r}")
    return int(H)


def allocated_point(tasks, L, sigma=0.0, heads=None) -> tuple[np.ndarray, np.ndarray]:
    """(omega, mu), each (H, m): head h < m serves task h at theory.exact's fixed point
    (omega*_h, mu*_h), every other entry 0 (H defaults to max(m, 2))."""
    tasks, sigma = check_tasks(tasks), check_sigma(sigma)
    H = _heads(tasks, heads)
    om, mu = _allocated(tuple(tasks), int(L), float(sigma), H)
    return om.copy(), mu.copy()


@lru_cache(maxsize=64)
def _allocated(tasks, L, sigma, H):
    m = len(tasks)
    fp = _exact.exact_fixed_point(tasks, L, sigma)
    om, mu = np.zeros((H, m)), np.zeros((H, m))
    om[np.arange(m), np.arange(m)] = np.ravel(fp["omega_star"])
    mu[np.arange(m), np.arange(m)] = np.ravel(fp["mu_star"])
    return om, mu


@lru_cache(maxsize=64)
def _slope(tasks, L, sigma, H):
    om, mu = _allocated(tasks, L, sigma, H)
    g = _exact.exact_gradient(om, mu, tasks, L, sigma, with_loss=False)
    a = np.asarray(g.d_mu, float).copy()
    a[mu != 0] = np.nan
    return a


def off_task_slope(tasks, L, sigma=0.0, heads=None) -> np.ndarray:
    """a[h, i] = d L / d mu[h, i] of the exact loss at the allocated point, (H, m), NaN on the
    served entries (where it is 0: a fixed point).  Off-task entries of the surplus heads
    (omega row 0) included.  Section 1 of the module docstring."""
    tasks, sigma = check_tasks(tasks), check_sigma(sigma)
    return in_range("theory.saddle.off_task_slope", "slope a", _slope(tuple(tasks), int(L), float(sigma),
                    _heads(tasks, heads)).copy(), why="finite off the served entries (NaN there)", nan_ok=True)


def growth_rate(tasks, L, sigma=0.0, heads=None) -> np.ndarray:
    """2 a[h, i]: the rate at which the opposite-sign branch mu = -(o - v)^2/4 of each
    off-task entry grows under the factored gradient flow (section 1), (H, m), NaN on the
    served entries.  An entry with a <= 0 is stable (rate <= 0)."""
    return 2.0 * off_task_slope(tasks, L, sigma, heads)


def max_growth_rate(tasks, L, sigma=0.0, heads=None) -> float:
    """2 max(0, a) over the off-task entries: the escape rate of the allocated point (0: not
    a saddle)."""
    r = growth_rate(tasks, L, sigma, heads)
    r = r[np.isfinite(r)]
    return in_range("theory.saddle.max_growth_rate", "escape rate", float(max(0.0, r.max())) if r.size else 0.0, 0.0,
                    why="2 max(0, a)")


def off_task_curvature(tasks, L, sigma=0.0, heads=None) -> np.ndarray:
    """c[h, i] = d^2 L / d mu[h, i]^2 at the allocated point with the serving head's mu
    re-optimised: 2 (C_hh,i - C_hk,i^2 / C_kk,i) (k the head serving task i; surplus heads
    and m = 1 likewise), (H, m), NaN on served entries.  On the opposite-sign branch the
    slope is a - c |mu| (section 1); C from theory.exact.one_head_terms and
    theory.exact.cross_moment."""
    tasks, sigma = check_tasks(tasks), check_sigma(sigma)
    om, mu = allocated_point(tasks, L, sigma, heads)
    H, m = om.shape
    out = np.full((H, m), np.nan)
    for h in range(H):
        _, C_h, _, _ = _exact.one_head_terms(om[h], tasks, L, sigma)
        for i in range(m):
            if mu[h, i] != 0:
                continue
            k = i   # head i serves task i
            _, C_k, _, _ = _exact.one_head_terms(om[k], tasks, L, sigma)
            C_hk, _ = _exact.cross_moment(om[h], om[k], tasks, L, sigma, i)
            out[h, i] = 2.0 * (C_h[i] - C_hk ** 2 / C_k[i])
    return out


def logistic_coordinate(mu_abs, K):
    """z = log(|mu| / (1 - |mu|/K)); dz/dt = 2a exactly on the logistic branch
    d|mu|/dt = 2|mu|(a - c|mu|) (section 1).  NaN where |mu| >= K."""
    u = np.asarray(mu_abs, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(u < K, np.log(u / (1.0 - u / K)), np.nan)


def gd_growth_rate(a, lr):
    """Growth rate of |mu| on the opposite-sign branch under gradient DESCENT with step lr:
    y is multiplied by (1 + lr a) per step, |mu| ~ y^2, so 2 log(1 + lr a) / lr (-> 2a)."""
    a = np.asarray(a, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = 2.0 * np.log1p(lr * a) / lr
    return in_range("theory.saddle.gd_growth_rate", "growth rate", rate,
                    why="finite only while lr a > -1: a step that overshoots 0 has no rate")


def imbalance(lr, mu0, dS, a, batch):
    """M = lr^2 mu0 dS / (B (1 - (1 - lr a)^2)): the off-task channel's imbalance
    |O[:, k]|^2 - |V[k, :]|^2 that SGD builds while a balanced off-task value mu0 decays
    (section 3); dS = S_col - S_row the per-prompt gradient variance difference.
    ~ lr mu0 dS / (2 a B)."""
    a = np.asarray(a, float)
    return lr ** 2 * mu0 * np.asarray(dS, float) / (batch * (1.0 - (1.0 - lr * a) ** 2))


def seed_level(M, mu0):
    """seed = M^2 / (16 mu0): the |mu| the opposite-sign branch extrapolates back to at t = 0
    (y(t) = M e^{a t}/x0, x0 = 2 sqrt(mu0), |mu| = y^2/4)."""
    return np.asarray(M, float) ** 2 / (16.0 * mu0)


def escape_time(rate, threshold, seed, K=math.inf):
    """T = (1/rate) [log(threshold / (1 - threshold/K)) - log seed]: the time at which the
    opposite-sign branch, |mu| = seed e^{rate t} (logistic with capacity K), reaches
    |mu| = threshold (absolute: theta mu*).  rate <= 0: inf (a minimum is never left)."""
    rate = np.asarray(rate, float)
    level = np.log(threshold) - np.log1p(-threshold / np.asarray(K, float))
    with np.errstate(divide="ignore"):
        T = np.where(rate > 0, (level - np.log(seed)) / np.where(rate > 0, rate, 1.0), np.inf)
    return in_range("theory.saddle.escape_time", "escape time", T, 0.0, infinite_ok=True,
                    why="a time from the start: the seed must lie below the threshold")


def escape_time_slope(rate):
    """dT/d log B = 2 / rate (seed ~ B^-2, section 3); 1/a for rate 2a."""
    rate = float(rate)
    return in_range("theory.saddle.escape_time_slope", "slope", math.inf if rate <= 0 else 2.0 / rate, 0.0,
                    why="dT/dlog B > 0, inf when there is no escape", infinite_ok=True)


def additive_noise_seed(lr, s2, a, batch):
    """The additive-noise picture: y receives noise of variance lr^2 s2 / B per step and grows
    at rate a (per step factor 1 + lr a); from 0, E y_n^2 = (lr^2 s2/B) sum_k (1+lr a)^{2k}, so
    E y^2 e^{-2 a t} -> lr^2 s2 / (B ((1 + lr a)^2 - 1)) ~ lr s2 / (2 a B); returns that
    variance (of the amplitude y; the |mu| seed is a quarter of it)."""
    return lr ** 2 * s2 / (batch * ((1.0 + lr * a) ** 2 - 1.0))


def additive_noise_slope(rate):
    """dT/d log B = 1/rate in the additive-noise picture (seed ~ 1/B)."""
    rate = float(rate)
    return in_range("theory.saddle.additive_noise_slope", "slope", math.inf if rate <= 0 else 1.0 / rate, 0.0,
                    why="dT/dlog B > 0, inf when there is no escape", infinite_ok=True)


# ---------------------------------------------------------------------------------------
# the seeded entries of one configuration, and the predictions the measurements are compared with
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SaddlePoint:
    """theory's numbers for one configuration: the allocated point (omega, mu), the off-task
    entries (h, i) a saddle run seeds (the serving heads' off-task entries with a > 0; with
    m = 1 the surplus head's entry (1, 0)), their slope a, curvature c, capacity K = a/c and
    the served mu* of task i."""
    tasks: tuple
    heads: int
    L: int
    sigma: float
    omega: np.ndarray
    mu: np.ndarray
    entries: tuple          # ((h, i), ...) off-task entries with a > 0
    a: np.ndarray           # (E,)
    c: np.ndarray           # (E,)
    K: np.ndarray           # (E,)
    mu_star: np.ndarray     # (E,) serving mu of task i

    @property
    def rate(self) -> float:
        """2a averaged over the entries (equal by symmetry in the profiles' configurations):
        the prediction under test."""
        return in_range("theory.saddle.SaddlePoint.rate", "growth rate", float(2.0 * self.a.mean()), 0.0,
                        why="2a over entries with a > 0")


def saddle_point(tasks, heads, L, sigma=0.0) -> SaddlePoint:
    """The :class:`SaddlePoint` of (tasks, heads, L, sigma).  Raises when no off-task entry has
    a > 0 (the allocated point is then not a saddle).  Cached, keyed also by the functions it is
    built from (:func:`off_task_slope`, :func:`off_task_curvature`), so a definition replaced
    after a first call (the mutation suite) is never answered from the cache."""
    tasks, sigma = check_tasks(tasks), check_sigma(sigma)
    key = (tuple(tasks), _heads(tasks, heads), int(L), float(sigma), off_task_slope, off_task_curvature)
    if key not in _SADDLE_POINTS:
        _SADDLE_POINTS[key] = _saddle_point(*key[:4])
    return _SADDLE_POINTS[key]


_SADDLE_POINTS: dict = {}


def _saddle_point(tasks, heads, L, sigma):
    om, mu = allocated_point(tasks, L, sigma, heads)
    a = off_task_slope(tasks, L, sigma, heads)
    c = off_task_curvature(tasks, L, sigma, heads)
    # the serving heads' off-task entries (h < m); the surplus heads' entries have their own
    # (smaller) slope and are not seeded
    m = len(tasks)
    entries = tuple((h, i) for h in range(min(heads, m)) for i in range(m) if mu[h, i] == 0 and a[h, i] > 0)
    if m == 1:
        entries = ((1, 0),) if a[1, 0] > 0 else ()
    if not entries:
        raise ValueError(f"no off-task entry with a > 0 at tasks={tasks}, H={heads}, L={L}: not a saddle")
    E = np.array([a[e] for e in entries])
    C = np.array([c[e] for e in entries])
    return SaddlePoint(tasks, heads, L, sigma, om, mu, entries, E, C, E / C, np.array([mu[i, i] for _, i in entries]))


def slope_at(omega, served_mu, tasks, L, sigma=0.0, heads=None) -> np.ndarray:
    """a (E,) at a served point a run holds: theory.exact's d L / d mu at the allocated pattern
    with the served omega taken from ``omega`` (H x m; its off-task entries are set to 0) and
    the served mu[i, i] from ``served_mu`` (E,), every off-task mu 0 (section 1b)."""
    sp = saddle_point(tasks, heads, L, sigma)
    om = np.where(sp.omega != 0, np.asarray(omega, float), 0.0)
    mu = sp.mu.copy()
    for (h, i), v in zip(sp.entries, np.asarray(served_mu, float)):
        mu[i, i] = v
    g = _exact.exact_gradient(om, mu, sp.tasks, sp.L, sp.sigma, with_loss=False)
    return in_range("theory.saddle.slope_at", "slope a", np.array([g.d_mu[e] for e in sp.entries], float),
                    why="a finite slope of the exact loss")


def discrete_rate_along(omega_path, served_path, lr, tasks, L, sigma=0.0, heads=None) -> float:
    """The discrete-time account of the growth rate over a window (section 1b):
    (2/lr) mean_n log(1 + lr a(theta_n)) over the served points theta_n of the window
    (``omega_path`` (n, H, m), ``served_path`` (n, E)), averaged over the entries."""
    a = np.array([slope_at(om, sv, tasks, L, sigma, heads) for om, sv in zip(omega_path, served_path)])
    return float(np.mean(gd_growth_rate(a, lr)))


def escape_prediction(tasks, heads, L, sigma, lr, batches, mu0, threshold, dS, dS_se) -> dict:
    """theory's escape times T(B) (section 3) at gradient descent's rate 2 log(1 + lr a)/lr,
    with the measured seed input dS (E,) +- dS_se: per batch size the imbalance M, the seed
    M^2/(16 mu0) and T (mean over entries) with its standard error (2/rate) mean|M_se/M|;
    the slope dT/dlog B = 2/rate and the additive-noise picture's 1/rate; the same T at rate a
    (half of it: a different prediction)."""
    sp = saddle_point(tasks, heads, L, sigma)
    dS, dS_se = np.asarray(dS, float), np.asarray(dS_se, float)
    rate = float(np.mean(gd_growth_rate(sp.a, lr)))
    M = np.array([[imbalance(lr, mu0, dS[e], sp.a[e], B) for e in range(len(sp.entries))] for B in batches])
    M_se = np.abs(np.array([[imbalance(lr, mu0, dS_se[e], sp.a[e], B) for e in range(len(sp.entries))]
                            for B in batches]))
    seed = seed_level(M, mu0)
    thr = threshold * sp.mu_star
    T = escape_time(rate, thr[None, :], seed, sp.K[None, :]).mean(axis=1)
    T_rate_a = escape_time(rate / 2, thr[None, :], seed, sp.K[None, :]).mean(axis=1)
    return {"a": float(sp.a.mean()), "rate_flow": sp.rate, "rate_gd": rate, "step_bias": abs(sp.rate - rate),
            "imbalance": M.mean(axis=1).tolist(), "seed_level": seed.tolist(),
            "T_pred": T.tolist(), "T_pred_se": ((2.0 / rate) * (M_se / np.abs(M)).mean(axis=1)).tolist(),
            "T_pred_rate_a": T_rate_a.tolist(), "slope_pred": escape_time_slope(rate),
            "slope_additive": additive_noise_slope(rate), "K": sp.K.tolist(), "mu_star": sp.mu_star.tolist(),
            "entries": [list(e) for e in sp.entries]}
