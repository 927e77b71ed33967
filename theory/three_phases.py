"""Claim 3: three phases -- warm-up, emergence, convergence.

One definition, measurable on any loss curve (the expansion flow's, the exact reduced
flow's, or a noisy Monte-Carlo training curve recorded at ~60 times):

1. Smooth the curve by the least-squares *non-increasing* fit (isotonic regression, pool
   adjacent violators).  Gradient flow on the population loss never increases the loss,
   so the monotone fit is the natural estimate of the underlying curve from Monte-Carlo
   noise; it needs no window, does not blur a drop that happens between two records, and
   makes every level crossing unique.
2. Start level  L0 = fit[0];  final level  Lend = median of the raw losses over the last
   10% of the records (at least 3);  drop  Delta = L0 - Lend.
3. warm-up ends at the first time the fit has fallen by ``low`` (10%) of Delta; emergence
   ends at the first time it has fallen by ``high`` (90%) of Delta; the rest is
   convergence.  Crossing times are linearly interpolated between records, so the times
   are resolved only to the record spacing: record the curve finely enough (a warm-up
   shorter than one record spacing is reported inside the first interval).
4. The phases are *defined* only if the drop is clear of the noise: Delta > 0 and
   Delta > ``min_snr`` (10) x the noise scale (1.4826 x the median absolute deviation of
   raw - fit, the Gaussian-consistent robust estimate).  Otherwise the times are NaN and
   ``reason`` says why.

The steepest-descent time (largest drop of the fit per unit time) is also
reported: it lies inside the emergence phase for a curve with the three phases.

The prediction (:func:`predicted_phase_times`) applies the same function to the expansion
flow started at the same initialisation.  Warm-up scaling with the init scale s0
(:func:`warmup_law`): factored ~ 1/s0 (the small-weight flow is quadratic and blows up in
finite time), merged ~ log(1/s0) (linear flow, exponential growth).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ._validate import check_finite_array
from .reduced_ode import default_init, integrate_expansion_flow


@dataclass
class PhaseTimes:
    """Phase boundaries of one loss curve (times in the curve's own units)."""

    warmup_end: float
    emergence_end: float
    loss_start: float = float("nan")
    loss_end: float = float("nan")
    steepest_time: float = float("nan")
    noise: float = float("nan")
    defined: bool = True
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def spans(self, t_end: float) -> list[dict]:
        """Shaded x-intervals for a figure: warm-up, emergence, convergence."""
        if not self.defined:
            return []
        return [{"x0": 0.0, "x1": self.warmup_end, "label": "warm-up"},
                {"x0": self.warmup_end, "x1": self.emergence_end, "label": "emergence"},
                {"x0": self.emergence_end, "x1": float(t_end), "label": "convergence"}]


def nonincreasing_fit(y: np.ndarray) -> np.ndarray:
    """Least-squares non-increasing fit of y (pool adjacent violators, O(n))."""
    values, weights, counts = [], [], []
    for v in np.asarray(y, dtype=float):
        values.append(v)
        weights.append(1.0)
        counts.append(1)
        # a later block above an earlier one violates monotonicity: pool them
        while len(values) > 1 and values[-1] > values[-2]:
            v2, w2, c2 = values.pop(), weights.pop(), counts.pop()
            v1, w1, c1 = values.pop(), weights.pop(), counts.pop()
            values.append((v1 * w1 + v2 * w2) / (w1 + w2))
            weights.append(w1 + w2)
            counts.append(c1 + c2)
    return np.repeat(values, counts)


def _first_crossing(t, y, level) -> float:
    below = np.nonzero(y <= level)[0]
    if below.size == 0:
        return float("nan")
    k = int(below[0])
    if k == 0:
        return float(t[0])
    # linear interpolation between records k-1 (above) and k (at or below)
    y0, y1 = y[k - 1], y[k]
    frac = (y0 - level) / (y0 - y1) if y0 != y1 else 1.0
    return float(t[k - 1] + frac * (t[k] - t[k - 1]))


def phase_times(t, loss, low: float = 0.1, high: float = 0.9, min_snr: float = 10.0) -> PhaseTimes:
    """Warm-up and emergence end times of a loss curve (see the module docstring).

    t: increasing record times (>= 5 records); loss: the losses at those times (finite)."""
    t = check_finite_array("t", t, ndim=1)
    loss = check_finite_array("loss", loss, ndim=1)
    if t.shape != loss.shape:
        raise ValueError(f"t and loss must have the same length, got {t.shape} and {loss.shape}")
    if t.size < 5:
        raise ValueError(f"a loss curve needs at least 5 records to define phases, got {t.size}")
    if np.any(np.diff(t) <= 0):
        raise ValueError("t must be strictly increasing")
    if not (0 < low < high < 1):
        raise ValueError(f"need 0 < low < high < 1, got low={low}, high={high}")
    smooth = nonincreasing_fit(loss)
    n_end = max(3, int(np.ceil(0.1 * loss.size)))
    L0 = float(smooth[0])
    Lend = float(np.median(loss[-n_end:]))
    drop = L0 - Lend
    noise = float(1.4826 * np.median(np.abs(loss - smooth)))
    slopes = -np.diff(smooth) / np.diff(t)
    k = int(np.argmax(slopes))
    steepest = float(0.5 * (t[k] + t[k + 1]))
    if drop <= 0 or drop <= min_snr * noise:
        return PhaseTimes(float("nan"), float("nan"), L0, Lend, steepest, noise, False,
                          f"loss drop {drop:.4g} is not clear of the noise ({noise:.3g} x {min_snr})")
    w_end = _first_crossing(t, smooth, L0 - low * drop)
    e_end = _first_crossing(t, smooth, L0 - high * drop)
    return PhaseTimes(w_end, e_end, L0, Lend, steepest, noise, True, "")


def predicted_phase_times(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0,
                          t_end=60.0, records=61):
    """Phase times the expansion flow predicts from (omega0, mu0): integrate on the same
    ``records`` evenly spaced times as the numerics and apply :func:`phase_times`.
    Returns (PhaseTimes, ExpansionTrajectory)."""
    t_eval = np.linspace(0.0, float(t_end), int(records))
    traj = integrate_expansion_flow(omega0, mu0, tasks, L, sigma, param, logit_scale, t_end=t_end, t_eval=t_eval)
    if traj.status != "t_end":
        raise RuntimeError(f"the expansion flow stopped early ({traj.status}: {traj.message}) at "
                           f"t = {traj.t[-1]:.4g}; phase times need the whole curve")
    return phase_times(traj.t, traj.loss), traj


def warmup_law(param: str) -> str:
    """How the warm-up length scales with the init scale s0 (small s0)."""
    if param == "factored":
        return "T_warmup = C / s0 + c0   (quadratic small-weight flow, finite-time blow-up)"
    if param == "merged":
        return "T_warmup = a + b log(1/s0)   (linear small-weight flow, exponential growth)"
    raise ValueError(f"param must be 'merged' or 'factored', got {param!r}")


def warmup_law_time(init_scale, C, c0, exponent: float = 1.0):
    """The factored warm-up law evaluated at init scale(s) s0: T = C / s0**exponent + c0
    (exponent = 1 is the law; other exponents exist for perturbation checks)."""
    s0 = np.asarray(init_scale, dtype=float)
    if np.any(~np.isfinite(s0)) or np.any(s0 <= 0):
        raise ValueError(f"init scales must be positive and finite, got {s0.tolist()}")
    return C / s0 ** exponent + c0


def ov_share(mu, task_of_head) -> np.ndarray:
    """Share of each head's OV mass on one task: |mu[..., h, i_h]| / sum_i |mu[..., h, i]|
    with i_h = task_of_head[h] (the task head h ends with).  mu: (..., H, m); returns
    (..., H); a head with mu = 0 on every task has share NaN (no mass to share)."""
    mu = np.abs(np.asarray(mu, dtype=float))
    idx = np.asarray(task_of_head, dtype=int)
    if mu.shape[-2] != idx.size:
        raise ValueError(f"task_of_head needs one task per head ({mu.shape[-2]}), got {idx.size}")
    if np.any(idx < 0) or np.any(idx >= mu.shape[-1]):
        raise ValueError(f"task_of_head entries must lie in 0..{mu.shape[-1] - 1}, got {idx.tolist()}")
    own = np.take_along_axis(mu, idx.reshape((1,) * (mu.ndim - 2) + (-1, 1)) + np.zeros(mu.shape[:-1] + (1,), int),
                             axis=-1)[..., 0]
    total = mu.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, own / np.where(total > 0, total, 1.0), np.nan)


def _linear_fit(x, y):
    """Least-squares y = slope x + intercept and the relative rms residual."""
    A = np.stack([x, np.ones_like(x)], axis=1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ coef
    return float(coef[0]), float(coef[1]), float(np.sqrt(np.mean(resid ** 2)) / np.mean(np.abs(y)))


def predicted_warmup_scaling(tasks, heads, L, sigma=0.0, param="factored",
                             init_scales=(0.005, 0.01, 0.02, 0.04), logit_scale=1.0, t_end=None,
                             records=401) -> dict:
    """Predicted warm-up end for each init scale s0 (default init of the numerics) and the
    fits of both laws, so that the right one can be told from the wrong one:

    - ``inverse``: T = C/s0 + c0  (factored's law); ``C_race`` is the leading constant of
      the decoupled warm-up race (:func:`task_allocation.warmup_race_times` x s0);
    - ``log``: T = a + b log(1/s0)  (merged's law);
    each with its relative rms residual; ``best_law`` is the one with the smaller residual.

    The warm-up end is the 10%-drop time of :func:`phase_times` on the expansion flow, on
    ``records`` evenly spaced times up to 20 x the slowest task's race time."""
    from .task_allocation import warmup_race_times

    scales = np.asarray(init_scales, dtype=float)
    if scales.ndim != 1 or scales.size < 3 or np.any(scales <= 0):
        raise ValueError("init_scales must hold at least three positive scales (two-parameter fits)")
    ends, race = [], []
    for s0 in scales:
        om, mu = default_init(tasks, heads, s0)
        # horizon: 20 x the slowest task's escape time of the decoupled warm-up flow, so the
        # warm-up is resolved by ~records/20 records whatever s0 is
        T = warmup_race_times(om, mu, tasks, param, logit_scale).min(axis=0)
        race.append(float(np.max(T)))
        horizon = t_end if t_end is not None else 20.0 * race[-1]
        pt, _ = predicted_phase_times(om, mu, tasks, L, sigma, param, logit_scale, horizon, records)
        ends.append(pt.warmup_end)
    ends = np.asarray(ends)
    C, c0, res_inv = _linear_fit(1.0 / scales, ends)
    b, a, res_log = _linear_fit(np.log(1.0 / scales), ends)
    return {"param": param, "init_scales": scales.tolist(), "warmup_end": ends.tolist(),
            "race_time": race,
            "inverse": {"C": C, "c0": c0, "rel_residual": res_inv,
                        "C_race": float(np.mean(np.asarray(race) * scales))},
            "log": {"a": a, "b": b, "rel_residual": res_log},
            "best_law": "inverse" if res_inv < res_log else "log",
            "law": warmup_law(param)}
