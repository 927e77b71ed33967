"""Statistics of measured numbers: batch-means standard errors, paired ratios on common
prompts, and the L -> inf extrapolation of L * loss (claims 5-7 and the boundaries)."""
from __future__ import annotations

import math

import numpy as np


def loss_standard_error(losses: np.ndarray, blocks: int = 10) -> float:
    """Standard error of the mean of per-step batch losses by batch means: the window is cut
    into ``blocks`` contiguous blocks and the block means treated as independent, which
    accounts for the autocorrelation the parameter noise of SGD puts between steps."""
    losses = np.asarray(losses, float)
    k = max(2, min(blocks, losses.size // 2))
    means = np.array([b.mean() for b in np.array_split(losses, k)])
    return float(means.std(ddof=1) / math.sqrt(k))


def paired_ratio(single: np.ndarray, multi: np.ndarray) -> tuple[float, float]:
    """R = mean(single) / mean(multi) on the same prompts, and its delta-method standard error
    sqrt(var(single - R multi) / n) / mean(multi) (pairing removes the common prompt noise)."""
    single, multi = np.asarray(single, float), np.asarray(multi, float)
    R = single.mean() / multi.mean()
    se = float(np.std(single - R * multi, ddof=1) / math.sqrt(single.size) / multi.mean())
    return float(R), se


def _wls(L: np.ndarray, y: np.ndarray, se: np.ndarray, power: float):
    """Weighted least squares of y = a + c L^-power: (a, c), covariance, chi^2."""
    X = np.stack([np.ones_like(L), L ** -power], axis=1)
    wt = 1.0 / se ** 2
    cov = np.linalg.inv(X.T @ (X * wt[:, None]))
    coef = cov @ (X.T @ (wt * y))
    chi2 = float(np.sum(((y - X @ coef) / se) ** 2))
    return coef, cov, chi2


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
    fits = {}
    for p in CORRECTION_POWERS:
        coef, cov, chi2 = _wls(L, y, se, p)
        fits[p] = {"a": float(coef[0]), "a_se": float(math.sqrt(cov[0, 0])), "c": float(coef[1]), "chi2": chi2}
    a1, a2 = (fits[p]["a"] for p in CORRECTION_POWERS)
    return {"a": 0.5 * (a1 + a2), "a_se": max(f["a_se"] for f in fits.values()),
            "systematic": 0.5 * abs(a1 - a2), "dof": int(L.size - 2),
            "fits": {f"p={p:g}": f for p, f in fits.items()}}


def window_drift(tail: np.ndarray, z: float) -> float:
    """The part of the change of the loss between the two halves of the final window that
    Monte-Carlo noise does not explain: max(0, |mean_1 - mean_2| - z se(mean_1 - mean_2)), the
    se by batch means within each half (z: the caller's standard errors, claims.common.Z_SE).
    An estimate of the optimisation error left (a run still descending), zero for a run that
    has converged to within its noise."""
    halves = np.array_split(np.asarray(tail, float), 2)
    se = math.hypot(*(loss_standard_error(h, 5) for h in halves))
    return max(0.0, abs(float(halves[0].mean() - halves[1].mean())) - z * se)
