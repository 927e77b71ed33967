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

from . import exact as exact_theory
from . import task_allocation as allocation_theory
from . import check_finite_array
from .reduced_ode import (default_init, expansion_gd_map, expansion_gradient, expansion_loss, integrate_expansion_flow,
                          metric_factors)
from .task_allocation import warmup_race_times


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


def phase_rates(pt: PhaseTimes, t_end: float) -> dict:
    """Mean rate of descent in each phase, in units of the total drop per unit time."""
    if not pt.defined:
        return {"warmup": float("nan"), "emergence": float("nan"), "convergence": float("nan")}
    w, e = pt.warmup_end, pt.emergence_end
    rate = lambda frac, dt: frac / dt if dt > 0 else float("inf")  # noqa: E731
    return {"warmup": rate(0.1, w), "emergence": rate(0.8, e - w), "convergence": rate(0.1, t_end - e)}


def phases_resolved(pt: PhaseTimes, t, drop_se: float = 0.0, z: float = 4.0) -> tuple[bool, str]:
    """Whether a curve (measured or predicted) shows the three phases, each resolved: the drop
    is clear of the noise (``pt.defined``: 10 x the scatter about the monotone fit; and > z x
    ``drop_se``, the standard error of the drop over the evaluation prompts), warm-up and
    emergence each last at least one record spacing, the final window that sets the end level
    (the last 10% of records, >= 3) lies inside the convergence, and the loss falls faster on
    average in the emergence than in the warm-up and in the convergence.  (ok, why not)."""
    t = np.asarray(t, float)
    if not pt.defined:
        return False, f"no drop clear of the noise ({pt.reason})"
    drop = pt.loss_start - pt.loss_end
    if drop <= z * drop_se:
        return False, f"drop {drop:.4g} is not clear of {z:g} x its standard error {drop_se:.3g}"
    spacing = float(np.max(np.diff(t)))
    n_end = max(3, int(np.ceil(0.1 * t.size)))
    if pt.warmup_end < spacing:
        return False, f"warm-up ({pt.warmup_end:.3g}) shorter than one record spacing ({spacing:.3g})"
    if pt.emergence_end - pt.warmup_end < spacing:
        return False, "emergence shorter than one record spacing"
    if pt.emergence_end > t[-n_end]:
        return False, (f"emergence end {pt.emergence_end:.4g} inside the final window (t >= {t[-n_end]:.4g}): "
                       "no convergence phase resolved")
    r = phase_rates(pt, float(t[-1]))
    if not (r["emergence"] > r["warmup"] and r["emergence"] > r["convergence"]):
        return False, f"the emergence is not the fastest phase (rates {r})"
    return True, ""


def predicted_phase_times(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0,
                          t_end=60.0, records=61, t_eval=None, strict: bool = True):
    """Phase times the expansion flow predicts from (omega0, mu0): integrate on the same
    ``records`` evenly spaced times as the numerics (or on the run's own record times
    ``t_eval``, which then fix t_end) and apply :func:`phase_times`.
    Returns (PhaseTimes, FlowTrajectory); a flow that stops early raises, or with
    ``strict=False`` returns (None, trajectory) (its ``status`` says why)."""
    if t_eval is None:
        t_eval = np.linspace(0.0, float(t_end), int(records))
    t_eval = np.asarray(t_eval, float)
    traj = integrate_expansion_flow(omega0, mu0, tasks, L, sigma, param, logit_scale, t_end=float(t_eval[-1]),
                                    t_eval=t_eval)
    if traj.status != "t_end":
        if not strict:
            return None, traj
        raise RuntimeError(f"the expansion flow stopped early ({traj.status}: {traj.message}) at "
                           f"t = {traj.t[-1]:.4g}; phase times need the whole curve")
    return phase_times(traj.t, traj.loss), traj


def loss_slope(t, curve, time) -> float:
    """|dL/dt| of a recorded curve at ``time`` (central difference at the nearest interior record)."""
    k = int(np.clip(np.searchsorted(t, time), 1, len(t) - 2))
    return abs(float((curve[k + 1] - curve[k - 1]) / (t[k + 1] - t[k - 1])))


def run_length(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0, lr=0.05,
               factor: float = 2.0) -> tuple[float, str]:
    """A run length showing all three phases: ``factor`` x the expansion flow's emergence end,
    a multiple of lr; and the flow's status ("t_end", or "left_domain" = saturation: nan)."""
    race = warmup_race_times(omega0, mu0, tasks, param, logit_scale)
    finite = race[np.isfinite(race)]
    if finite.size == 0:
        raise ValueError("no (head, task) pair escapes the warm-up from this init: no phases to check")
    # the warm-up race time (finite-time blow-up of the small-weight flow) scales the horizon;
    # the emergence follows within a few race times
    t_max = 3.0 * float(finite.max()) + 5.0
    for _ in range(3):
        grid = np.linspace(0.0, t_max, 241)
        traj = integrate_expansion_flow(omega0, mu0, tasks, L, sigma, param, logit_scale, t_end=t_max, t_eval=grid)
        if traj.status != "t_end":
            return float("nan"), traj.status
        pt = phase_times(grid, traj.loss)
        # the emergence must end well before t_max, or the end level (last 10%) is not yet flat
        if pt.defined and pt.emergence_end < 0.6 * t_max:
            return float(np.ceil(factor * pt.emergence_end / lr) * lr), "t_end"
        t_max *= 2.0
    raise RuntimeError(f"the expansion flow shows no completed emergence on [0, {t_max / 2:g}]: {pt.reason}")


def allocated_projection(mu, omega, winners=None) -> tuple[np.ndarray, np.ndarray]:
    """(omega, mu) with each task's mu kept only on the head carrying it (``winners``, default
    argmax_h mu omega, the readout's winning head) and on heads whose omega row equals that
    head's to rounding (rtol 1e-9: with the default init heads h and h + m start equal and
    stay equal but for float rounding; their rows are set bitwise equal so that theory.exact
    merges them -- same softmax, their mu add); zero elsewhere."""
    mu, omega = np.asarray(mu, float), np.asarray(omega, float)
    om, keep = np.array(omega, float), np.zeros_like(mu)
    winners = np.argmax(mu * omega, axis=0) if winners is None else winners
    for i, c in enumerate(winners):
        same = np.all(np.isclose(omega, omega[c], rtol=1e-9, atol=0.0), axis=1)
        om[same] = omega[c]
        keep[same, i] = mu[same, i]
    return om, keep


@dataclass
class PhasePrediction:
    """What theory says for one run, from its init and on its record times ``t`` (before the
    run): the expansion flow's loss and mu, its phase times (``phases``; None if the flow left
    the expansion's domain, ``flow_status``), the phase times of the expansion along the GD
    map (None if that left it), the winners and the task each winning head ends with, and the
    expansion's own approximation error against theory.exact: at the init (``start_error``),
    at the flow's end point (``end_error``), relative at each phase end (``rate_error``), and
    the shift of the warm-up end that its level error makes (``level_shift``)."""

    horizon: float
    t: np.ndarray
    loss: np.ndarray | None
    mu: np.ndarray | None
    phases: PhaseTimes | None
    gd_map_phases: PhaseTimes | None
    winners: list
    task_of_head: list
    start_error: float
    end_error: float
    flow_status: str = "t_end"
    rate_error: dict | None = None
    level_shift: float | None = None


def phase_prediction(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0, lr=0.05,
                     t=(), run_status: str = "t_end") -> PhasePrediction:
    """Theory's prediction on a run's record times ``t`` (multiples of ``lr``): the expansion
    flow (:func:`predicted_phase_times`), the GD map, the winners
    (``task_allocation.predicted_winners``), the expansion's errors against theory.exact.
    ``run_status``: :func:`run_length`'s status; other than "t_end" (the flow saturates before
    its emergence ends) there is no prediction: an empty one with that status."""
    t = np.asarray(t, float)
    om0, mu0 = np.asarray(omega0, float), np.asarray(mu0, float)
    if run_status != "t_end":
        return PhasePrediction(float(t[-1]), t, None, None, None, None, [], [None] * om0.shape[0], float("nan"),
                               float("nan"), run_status)
    pt, traj = predicted_phase_times(om0, mu0, tasks, L, sigma, param, logit_scale, t_eval=t, strict=False)
    winners = allocation_theory.predicted_winners(om0, mu0, tasks, L, sigma, param, logit_scale, t_end=float(t[-1]))
    task_of_head = [None] * om0.shape[0]
    for i, h in enumerate(winners):
        task_of_head[h] = i
    if pt is None:
        return PhasePrediction(float(t[-1]), t, np.full(t.size, np.nan), np.full((t.size,) + om0.shape, np.nan),
                               None, None, winners, task_of_head, float("nan"), float("nan"), traj.status)
    oms, mus = expansion_gd_map(om0, mu0, tasks, L, sigma, param, logit_scale, lr, t, on_exit="stop")
    gd = None
    if len(oms) == t.size:
        gd = phase_times(t, [expansion_loss(o, m_, tasks, L, sigma) for o, m_ in zip(oms, mus)])
    # theory's own approximation error of the expansion: against the exact loss at the init
    # and at the end point of the flow (near a stationary point the difference of the two
    # losses at one point is, to first order, the difference of their minimum levels)
    start_err = abs(exact_theory.exact_loss(om0, mu0, tasks, L, sigma).loss - float(traj.loss[0]))
    # at the end point, on its allocated projection (each task's mu kept on its carrying head
    # only: the exact loss is then a sum of one-head terms, fast; both losses at that one point)
    om_end, mu_end = allocated_projection(traj.mu[-1], traj.omega[-1])
    end_err = abs(exact_theory.exact_loss(om_end, mu_end, tasks, L, sigma).loss
                  - expansion_loss(om_end, mu_end, tasks, L, sigma))
    rate_err = level_shift = None
    if pt.defined:
        # theory's relative error of the expansion at the flow's point at each predicted phase
        # end: a relative error of the loss there is one of its gradient, hence of the rates
        # that carry the flow to that time (exact loss with the pair moments: every mu is
        # nonzero mid-flow)
        rate_err = {}
        for key in ("warmup_end", "emergence_end"):
            k = int(np.argmin(np.abs(t - getattr(pt, key))))
            ex = exact_theory.exact_loss(traj.omega[k], traj.mu[k], tasks, L, sigma).loss
            rate_err[key] = abs(ex - float(traj.loss[k])) / max(float(traj.loss[k]), 1e-300)
        # theory's own level error moves its warm-up end by (0.1 end_err + 0.9 start_err) / |dL/dt|
        level_shift = float((0.1 * end_err + 0.9 * start_err) / max(loss_slope(t, traj.loss, pt.warmup_end), 1e-12))
    return PhasePrediction(float(t[-1]), t, traj.loss, traj.mu, pt, gd, winners, task_of_head, start_err, end_err,
                           traj.status, rate_err, level_shift)


def warmup_relative_rates(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0) -> np.ndarray:
    """The mean relative growth rate x_dot / x of every entry (omega first, then mu, flattened)
    at the init, on the expansion flow (its gradient and metric factors)."""
    om0, mu0 = np.asarray(omega0, float), np.asarray(mu0, float)
    g_om, g_mu = expansion_gradient(om0, mu0, tasks, L, sigma)
    f_om, f_mu = metric_factors(param, om0, mu0, tasks, logit_scale)
    return np.concatenate([(-f_om * g_om / om0).ravel(), (-f_mu * g_mu / mu0).ravel()])


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


def warmup_law_prediction(tasks, heads, L, sigma, param, init_scales, logit_scale=1.0) -> dict:
    """Theory's warm-up ends T(s0) = C/s0 + c0 at ``init_scales`` (C, c0: :func:`predicted_warmup_scaling`'s fit
    of the expansion flow's warm-up ends), with the law's own fit residual against those ends and the whole fit."""
    s = np.asarray(init_scales, float)
    law = predicted_warmup_scaling(tasks, heads, L, sigma, param, tuple(s), logit_scale)
    C, c0 = law["inverse"]["C"], law["inverse"]["c0"]
    return {"C": C, "c0": c0, "T": np.asarray(warmup_law_time(s, C, c0)),
            "residual": np.abs(np.asarray(law["warmup_end"]) - C / s - c0), "law": law}
