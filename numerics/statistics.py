"""Statistics of measured numbers, each estimator once: the tolerance multiplier
:data:`Z_SE`, the mean and its standard error (:func:`mean_se`), batch-means standard
errors, the standard errors of several means over the same groups (:func:`standard_error_along`),
paired ratios on common prompts, the least-squares line and its slope's standard error
(:func:`line_fit`), the L -> inf extrapolation of L * loss (claims 5-7 and the
boundaries), the loss a run could still lose (the one convergence measure:
:func:`descent_left`) and the lr -> 0 extrapolation of a rate (the saddle)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import scipy.linalg
import scipy.optimize

Z_SE = 4.0
"""The one tolerance policy for Monte-Carlo comparisons: a measured number agrees with its
prediction within Z_SE = 4 standard errors of its Monte-Carlo noise (plus any systematic
error the theory states).  Why 4: a report holds of the order of 100 such comparisons; a
Gaussian deviation beyond 4 standard errors has probability 6e-5, so a correct prediction
fails somewhere in the report by chance with probability ~0.6% (at 3 standard errors,
probability 2.7e-3 each, it would be ~25%), while a real discrepancy of a few standard
errors -- what the perturbation checks send through the same comparison -- is still caught.
The same constant bounds one-sided statistics (a trend "p + Z_SE se(p) < 0") and tail
bounds of accumulated noise (Z_SE x rms), and decides convergence: a run is converged for a
comparison of tolerance tol when the loss it could still lose is at most tol / Z_SE
(numerics.experiments.converged.converged_for).  Defined here, beside the estimators, so that
claims.core and numerics.experiments read the same number."""

NON_FINITE_POLICIES = ("keep", "drop")


def mean_se(values, *, non_finite: str = "keep") -> tuple[Optional[float], Optional[float]]:
    """The sample mean xbar = sum x_i / n and its standard error s / sqrt(n), with
    s^2 = sum (x_i - xbar)^2 / (n - 1) (the unbiased variance, ``ddof=1``).

    ``non_finite``: ``"keep"`` (a NaN or infinite value -- a diverged run -- shows in the mean
    instead of vanishing) or ``"drop"`` (None, NaN and infinities are left out first: a point
    that could not be measured is not a number of the sample).  The standard error is None from
    fewer than two values; both are None from no value."""
    if non_finite not in NON_FINITE_POLICIES:
        raise ValueError(f"non_finite must be one of {NON_FINITE_POLICIES}, got {non_finite!r}")
    if non_finite == "drop":
        values = [v for v in values if v is not None and math.isfinite(v)]
    x = np.asarray(values, float).ravel()
    if x.size == 0:
        return None, None
    with np.errstate(invalid="ignore"):   # "keep": inf - inf in the variance is the NaN it should be
        se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None
        return float(x.mean()), se


@dataclass(frozen=True)
class LineFit:
    """The ordinary least-squares line y = slope x + intercept through n points:
    slope = sum (x_i - xbar)(y_i - ybar) / sum (x_i - xbar)^2, intercept = ybar - slope xbar,
    and the slope's standard error sqrt(s^2 / sum (x_i - xbar)^2) with the residual variance
    s^2 = sum r_i^2 / (n - 2) (nan from two points: no degree of freedom left); ``residual_sd``
    is s."""

    slope: float
    intercept: float
    slope_se: float
    n: int
    residual_sd: float


def line_fit(x, y) -> LineFit:
    """The least-squares line of y on x (:class:`LineFit`); ValueError from fewer than two
    points, a length mismatch or a single distinct x (the slope is not defined)."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    if x.size != y.size:
        raise ValueError(f"line_fit needs as many y as x values, got {x.size} x and {y.size} y")
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError(f"line_fit needs at least two distinct x values, got {x.tolist()}")
    A = np.stack([x, np.ones_like(x)], axis=1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ coef
    s2 = float(resid @ resid / (x.size - 2)) if x.size > 2 else math.nan
    return LineFit(slope=float(coef[0]), intercept=float(coef[1]),
                   slope_se=float(math.sqrt(s2 / np.sum((x - x.mean()) ** 2))), n=int(x.size),
                   residual_sd=math.sqrt(s2))


def standard_error_along(values, axis: int = 0):
    """The standard error s / sqrt(n) of the mean of each slice along ``axis`` (n its length,
    s^2 = sum (x_i - xbar)^2 / (n - 1)): :func:`mean_se`'s standard error for several
    quantities measured on the same n independent groups at once (e.g. one per entry).
    ValueError from fewer than two values along ``axis``."""
    x = np.asarray(values, float)
    n = x.shape[axis]
    if n < 2:
        raise ValueError(f"a standard error needs at least two values along axis {axis}, got {n}")
    return np.std(x, axis=axis, ddof=1) / math.sqrt(n)


def bounded_correlation_se(records, rho) -> tuple[np.ndarray, np.ndarray]:
    """(se, width) per entry of the mean of the n records ``records`` (n, ...) of a stationary process whose lag-k
    autocorrelation is at most ``rho``^k (rho per entry where an array, 0 <= rho < 1): the reading with all the
    variance in that slowest mode, no autocorrelation estimated.  With g = 1 + 2 sum_{k<n} (1 - k/n) rho^k,

        width^2 = sum (x_i - xbar)^2 / (n - g),    se = width sqrt(g / n).

    Both are the exact unbiased AR(1) readings at that rho; for any process within the bound
    Var(xbar) = sigma^2 f / n and E sum (x_i - xbar)^2 = sigma^2 (n - f) with f <= g, so neither is below the truth in
    expectation.  Why not estimate rho: from a tail a few correlation times long the lag-1 estimate scatters by
    ~1/sqrt(n), and the AR(1) se scales as 1/(1 - rho): one such tail read 10 x the scatter of independent runs' tail
    means, another a third of it."""
    x = np.asarray(records, float)
    n = x.shape[0]
    rho = np.asarray(rho, float)
    if n < 2 or np.any(rho < 0) or np.any(rho >= 1):
        raise ValueError(f"need at least 2 records and 0 <= rho < 1; got {n} records, rho {rho.tolist()}")
    k = np.arange(1, n).reshape((-1,) + (1,) * rho.ndim)
    g = 1.0 + 2.0 * np.sum((1.0 - k / n) * rho[None] ** k, axis=0)
    width = np.sqrt(np.sum((x - x.mean(axis=0)) ** 2, axis=0) / (n - g))
    return width * np.sqrt(g / n), width


def loss_standard_error(losses: np.ndarray, blocks: int = 10) -> float:
    """Standard error of the mean of per-step batch losses by batch means: the window is cut
    into ``blocks`` contiguous blocks and the block means treated as independent, which
    accounts for the autocorrelation the parameter noise of SGD puts between steps."""
    losses = np.asarray(losses, float)
    k = max(2, min(blocks, losses.size // 2))
    means = np.array([b.mean() for b in np.array_split(losses, k)])
    return mean_se(means)[1]


def paired_ratio(single: np.ndarray, multi: np.ndarray) -> tuple[float, float]:
    """R = mean(single) / mean(multi) on the same prompts, and its delta-method standard error
    sqrt(var(single - R multi) / n) / mean(multi) (pairing removes the common prompt noise)."""
    single, multi = np.asarray(single, float), np.asarray(multi, float)
    R = single.mean() / multi.mean()
    se = float(mean_se(single - R * multi)[1] / multi.mean())
    return float(R), se


CORRECTION_POWERS = (1.0, 0.5)
"""The finite-L correction of L * loss (and of ratios of such losses) is fitted as c L^-p with
p = 1 (the expansion's O(1/L) term) and p = 1/2.  Why both: the expansion's remainder is
O(L^-2) only while the third cumulant of the softmax weights has a finite Gaussian average
(6 omega^2 < 1); at the optimum omega ~ 0.39..0.55 for r <= 4 it is not, the remainder is
O(L^{-1-alpha}) with 0 < alpha < 1, and the measured approach of L * loss to its limit is
indeed slower than 1/L (r = 1: 7.08, 7.52, 8.08, 8.36 at L = 256, 1024, 4096, 8192 against
8.44).  The two fits bracket the extrapolation; their midpoint is reported and half their
difference is the systematic error of the extrapolation."""

def fit_limit(L, y, se) -> dict:
    """Extrapolate y(L) to L -> inf from the weighted fits y = a + c L^-p, p in
    CORRECTION_POWERS: a = midpoint of the two intercepts, a_se = the larger of their
    Monte-Carlo standard errors, systematic = half their difference."""
    L, y, se = (np.asarray(v, float) for v in (L, y, se))
    if L.size < 3:
        raise ValueError(f"the L -> inf extrapolation needs at least 3 context lengths, got {L.size}")
    if np.any(~np.isfinite(se)) or np.any(se <= 0):
        raise ValueError(f"standard errors must be positive and finite, got {se.tolist()}")
    fits, wt = {}, 1.0 / se ** 2
    for p in CORRECTION_POWERS:     # weighted least squares of y = a + c L^-p: (a, c), covariance, chi^2
        X = np.stack([np.ones_like(L), L ** -p], axis=1)
        cov = np.linalg.inv(X.T @ (X * wt[:, None]))
        coef = cov @ (X.T @ (wt * y))
        fits[p] = {"a": float(coef[0]), "a_se": float(math.sqrt(cov[0, 0])), "c": float(coef[1]),
                   "chi2": float(np.sum(((y - X @ coef) / se) ** 2))}
    a1, a2 = (fits[p]["a"] for p in CORRECTION_POWERS)
    return {"a": 0.5 * (a1 + a2), "a_se": max(f["a_se"] for f in fits.values()),
            "systematic": 0.5 * abs(a1 - a2), "dof": int(L.size - 2),
            "fits": {f"p={p:g}": f for p, f in fits.items()}}


def window_drift(tail: np.ndarray, z: float) -> float:
    """The part of the change of the loss between the two halves of the final window that
    Monte-Carlo noise does not explain: max(0, |mean_1 - mean_2| - z se(mean_1 - mean_2)), the
    se by batch means within each half (z: the caller's standard errors, claims.core.Z_SE).
    An estimate of the optimisation error left (a run still descending), zero for a run that
    has converged to within its noise."""
    halves = np.array_split(np.asarray(tail, float), 2)
    se = math.hypot(*(loss_standard_error(h, 5) for h in halves))
    return max(0.0, abs(float(halves[0].mean() - halves[1].mean())) - z * se)


def extrapolate_to_zero(x, y, se) -> dict:
    """y(x) extrapolated to x -> 0 from measurements y +- se at n >= 2 distinct x > 0 (the
    saddle's growth rate at several steps lr): the polynomial of degree n - 1 through every
    point (Richardson), a = sum_k w_k y_k with the Lagrange weights w_k of the points at 0,
    a_se = sqrt(sum_k (w_k se_k)^2); ``systematic`` = half the change of a when the largest x
    is left out (degree n - 2 through the others; with n = 2 the value at the smallest x): the
    part of the extrapolation its own points cannot pin, from the measurements alone."""
    x, y, se = (np.asarray(v, float) for v in (x, y, se))
    if x.ndim != 1 or x.size < 2 or y.shape != x.shape or se.shape != x.shape:
        raise ValueError(f"the extrapolation needs >= 2 points (x, y, se of one length), got {x.size}")
    if np.any(~np.isfinite(x)) or np.any(x <= 0) or np.unique(x).size != x.size:
        raise ValueError(f"x must be distinct, positive and finite, got {x.tolist()}")
    if np.any(~np.isfinite(y)) or np.any(~np.isfinite(se)) or np.any(se < 0):
        raise ValueError(f"y and se must be finite (se >= 0), got y={y.tolist()}, se={se.tolist()}")

    def at_zero(idx):
        xs = x[idx]
        w = np.array([np.prod([-xj / (xi - xj) for j, xj in enumerate(xs) if j != i]) for i, xi in enumerate(xs)])
        return float(w @ y[idx]), float(math.sqrt(np.sum((w * se[idx]) ** 2))), w

    order = np.argsort(x)
    a, a_se, w = at_zero(order)
    b, _, _ = at_zero(order[:-1])
    return {"a": a, "a_se": a_se, "systematic": 0.5 * abs(a - b), "lower_order": b, "weights": w.tolist(),
            "x": x[order].tolist(), "degree": int(x.size - 1)}


@dataclass(frozen=True)
class DescentLeft:
    """The loss a run could still lose, from paired snapshots at the end of its final stage
    (:func:`descent_left`): ``rate`` (descent per unit time, > 0 while the loss falls) +-
    ``rate_se``, ``jitter`` (the residual sd of the snapshots' losses about the fitted line: the
    iterates' fluctuation plus Monte-Carlo noise), the ``window`` (first and last snapshot time),
    ``points`` snapshots, the ``horizon`` and ``left`` = max(0, rate + rate_se) x horizon."""

    rate: float
    rate_se: float
    jitter: float
    window: tuple
    points: int
    horizon: float
    left: float

    def to_dict(self) -> dict:
        return asdict(self)


def descent_left(t, losses, horizon: float) -> DescentLeft:
    """The loss a run could still lose over ``horizon`` at its recent descent rate.

    ``t`` (k,): snapshot times over the second half of the run's final stage (the first half
    absorbs the relaxation from the previous stage's SGD noise level to this one's, so the
    window sees the descent left, not the noise's relaxation); ``losses`` (k, n): each
    snapshot's per-prompt loss on the SAME n prompts.  The rate is minus the least-squares
    slope of the snapshots' mean losses in t.  Its standard error is the larger of the paired
    Monte-Carlo one (the sd over prompts of each prompt's own slope, / sqrt n: common prompts
    cancel the prompt noise) and the one the residual scatter about the line gives
    (jitter / sqrt(sum (t - tbar)^2)): the iterates fluctuate together on every prompt, which
    pairing cannot remove.  ``left`` counts the rate one standard error above its estimate, so
    a descent the noise hides is not taken for none; the horizon is the caller's (the
    converged schedule: the final stage's length, "as long again")."""
    t = np.asarray(t, float)
    losses = np.asarray(losses, float)
    if t.ndim != 1 or t.size < 3 or losses.ndim != 2 or losses.shape[0] != t.size or losses.shape[1] < 2:
        raise ValueError(f"descent_left needs >= 3 snapshot times and a (snapshots, prompts) loss array, got t of "
                         f"shape {t.shape} and losses of shape {losses.shape}")
    if np.ptp(t) <= 0 or not (math.isfinite(horizon) and horizon > 0):
        raise ValueError(f"the snapshot times must differ and the horizon be positive, got t={t.tolist()}, "
                         f"horizon={horizon!r}")
    tc = t - t.mean()
    sxx = float(tc @ tc)
    means = losses.mean(axis=1)
    slope = float(tc @ means / sxx)
    per_prompt = tc @ losses / sxx
    se_mc = mean_se(per_prompt)[1]
    resid = means - means.mean() - slope * tc
    jitter = float(math.sqrt(resid @ resid / (t.size - 2)))
    rate, rate_se = -slope, max(se_mc, jitter / math.sqrt(sxx))
    return DescentLeft(rate=rate, rate_se=rate_se, jitter=jitter, window=(float(t[0]), float(t[-1])),
                       points=int(t.size), horizon=float(horizon), left=max(0.0, rate + rate_se) * float(horizon))


def binomial_interval(k: int, n: int, z: float) -> tuple[float, float]:
    """The Clopper-Pearson interval [lo, hi] of a share k / n at two-sided level
    alpha = erfc(z / sqrt 2) (the probability that a normal deviate exceeds z standard errors
    either way: z = 4 gives 6.3e-5):

        lo = Beta^-1(alpha / 2; k, n - k + 1)   (0 for k = 0),
        hi = Beta^-1(1 - alpha / 2; k + 1, n - k)   (1 for k = n).

    Why Clopper-Pearson and not Wilson: it inverts the two one-sided binomial tests exactly, so
    its coverage is at least 1 - alpha for every true share and every n (Wilson's dips below
    its nominal level at small n, and a report's seed counts are small: 8 or 16); a true share
    lies outside it with probability at most alpha, so a share comparison at z = Z_SE fails a
    right prediction as rarely as a Monte-Carlo one does (claims.core.Z_SE).  At n = 8 and
    z = 4: 8 of 8 gives [0.27, 1], 4 of 8 [0.026, 0.97], 7 of 8 [0.17, 1 - 4e-6] (one run of
    another class rejects a share of 1); at n = 16, 16 of 16 gives [0.52, 1]."""
    from scipy.special import betaincinv, erfc

    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise ValueError(f"a binomial interval needs integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"z must be a finite number > 0, got {z!r}")
    k, n = int(k), int(n)
    alpha = float(erfc(z / math.sqrt(2.0)))
    lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, alpha / 2))
    hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - alpha / 2))
    return lo, hi


def least_tolerance_weights(scales, variance, linear) -> np.ndarray:
    """The weights a of the unbiased linear estimate C = sum_j a_j T_j of T(s0) = C/s0 + c0 (sum_j a_j / s_j = 1,
    sum_j a_j = 0: exact for every c0) whose tolerance sqrt(sum_j a_j^2 variance_j) + sum_j |a_j| linear_j is
    smallest: weighted least squares with the runs' own noise (``variance``: Z_SE^2 x the variance of T_j) and
    resolution/theory parts (``linear``), all fixed before any T is compared.  With two scales the weights are
    determined (1 / (1/s_1 - 1/s_2) and its negative); with more, the ordinary least-squares weights are moved along
    the constraints' null space (the SGD escape spread grows fast as s0 falls, so the smallest s0 is weighted less)."""
    s = np.asarray(scales, float)
    A = np.stack([1.0 / s, np.ones_like(s)])
    start = np.linalg.pinv(A.T)[0]
    null = scipy.linalg.null_space(A)
    if null.shape[1] == 0:
        return start

    def tolerance(x):
        a = start + null @ x
        return math.sqrt(float(np.sum(a ** 2 * variance))) + float(np.abs(a) @ linear)

    best = scipy.optimize.minimize(tolerance, np.zeros(null.shape[1]), method="Nelder-Mead",
                                   options={"xatol": 1e-10, "fatol": 1e-14})
    return start + null @ best.x if best.fun < tolerance(np.zeros(null.shape[1])) else start
