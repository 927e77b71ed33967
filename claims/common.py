"""What the claim checks share: the comparison object every check returns, the one
tolerance policy (:data:`Z_SE`), the one constructor of a claim's result
(:func:`comparisons_result`), trajectory arrays and figures, and the statistics of
measured numbers (batch-means standard errors, paired ratios, the L -> inf extrapolation).

A claim module is its experiment plan and its comparisons: every estimator and every loop
is in ``numerics``, every prediction in ``theory``.  Nothing here decides a verdict (that
is :func:`claims.base.judge`, from the :class:`Comparison` objects).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from claims.base import PROFILES, ClaimResult, HeadlineRow, judge, Figure, PerturbationCheck, Series, jsonable
from numerics.model import initial_semi_singular_values

EPS64 = float(np.finfo(np.float64).eps)
"""Unit round-off of float64 (2.2e-16): the scale of every 'exact to rounding' tolerance."""

Z_SE = 4.0
"""The one tolerance policy for Monte-Carlo comparisons: a measured number agrees with its
prediction within Z_SE = 4 standard errors of its Monte-Carlo noise (plus any systematic
error the theory states).  Why 4: a report holds of the order of 100 such comparisons; a
Gaussian deviation beyond 4 standard errors has probability 6e-5, so a correct prediction
fails somewhere in the report by chance with probability ~0.6% (at 3 standard errors,
probability 2.7e-3 each, it would be ~25%), while a real discrepancy of a few standard
errors -- what the perturbation checks send through the same comparison -- is still caught.
The same constant bounds one-sided statistics (a trend "p + Z_SE se(p) < 0") and tail
bounds of accumulated noise (Z_SE x rms)."""


# ---------------------------------------------------------------------------------------
# the comparison object every check function returns
# ---------------------------------------------------------------------------------------

@dataclass
class Comparison:
    """One comparison of a measurement with a prediction.

    ``measured`` and ``predicted`` are the numbers compared (scalars or small lists),
    ``error`` the discrepancy in the units of ``tolerance``, ``why`` the argument the
    tolerance comes from; :attr:`agrees` is computed: ``error <= tolerance`` (a check whose
    agreement has a structural condition besides the number sets error = inf when it fails).
    ``perturbations`` is
    the same comparison run against deliberately wrong predictions; each must be rejected.
    ``details`` carries the configuration, seeds and intermediate numbers; ``figures``
    optional figure data for the report.
    """

    name: str
    measured: object
    predicted: object
    error: float
    tolerance: float
    why: str
    perturbations: list[PerturbationCheck] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    side: str = "two-sided"
    """How ``error`` was computed: |measured - predicted| (``two-sided``), max(0, measured -
    predicted) (``not above``), max(0, predicted - measured) (``not below``); claims.base.SIDES."""
    config: Optional[str] = None
    """The configuration the comparison was measured at, for the headline row."""

    @property
    def agrees(self) -> bool:
        """error <= tolerance (false for a NaN error)."""
        return bool(self.error <= self.tolerance)

    @property
    def discriminates(self) -> bool:
        """True if every perturbed prediction was rejected (and there was at least one)."""
        return bool(self.perturbations) and all(p.rejected for p in self.perturbations)

    @property
    def margin(self) -> float:
        """error / tolerance: < 1 agrees; the 'worst agreement' reported is the max of this."""
        if self.tolerance > 0:
            return float(self.error / self.tolerance)
        return 0.0 if self.error == 0 else math.inf

    def summary(self) -> dict:
        """The JSON-able record of this comparison (what ClaimResult.details holds per case)."""
        return jsonable({
            "name": self.name,
            "measured": self.measured,
            "predicted": self.predicted,
            "error": self.error,
            "tolerance": self.tolerance,
            "why": self.why,
            "agrees": self.agrees,
            "margin": self.margin,
            "side": self.side,
            "config": self.config,
            "perturbations": [{"description": p.description, "rejected": p.rejected, **p.details}
                              for p in self.perturbations],
            "details": self.details,
        })

    def explain(self) -> str:
        """A one-paragraph message for a failing test (numbers, tolerance, perturbations)."""
        lines = [f"{self.name}: error {self.error:.4g} vs tolerance {self.tolerance:.4g} "
                 f"(agrees={self.agrees}); measured={_short(self.measured)}, predicted={_short(self.predicted)}",
                 f"  tolerance: {self.why}"]
        for p in self.perturbations:
            lines.append(f"  perturbation '{p.description}': rejected={p.rejected} {_short(p.details)}")
        lines.append(f"  details: {_short(self.details, 1500)}")
        return "\n".join(lines)


def _short(obj, limit: int = 400) -> str:
    s = str(jsonable(obj))
    return s if len(s) <= limit else s[:limit] + " ..."


def perturbation(description: str, error: float, tolerance: float, **details) -> PerturbationCheck:
    """A perturbed prediction is rejected when its error exceeds the same tolerance."""
    return PerturbationCheck(description=description, rejected=bool(error > tolerance),
                             details=jsonable({"error": error, "tolerance": tolerance, **details}))


def worst(comparisons: list[Comparison]) -> dict:
    """The worst agreement over a list of comparisons: the largest error/tolerance."""
    if not comparisons:
        return {"margin": None, "name": None}
    c = max(comparisons, key=lambda c: c.margin)
    return {"margin": c.margin, "name": c.name, "error": c.error, "tolerance": c.tolerance}


def check_profile(profile: str) -> str:
    """The one profile check of the claims layer: one of claims.base.PROFILES, or ValueError."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    return profile


# ---------------------------------------------------------------------------------------
# trajectories
# ---------------------------------------------------------------------------------------

@dataclass
class Trajectory:
    """A recorded run as arrays: t (n,), loss (n,), omega/mu (n, H, m), residual (n,)."""

    t: np.ndarray
    loss: np.ndarray
    omega: np.ndarray
    mu: np.ndarray
    residual: np.ndarray


def trajectory_of(result) -> Trajectory:
    """Arrays from a ``numerics.train.TrainResult`` (its ``trajectory`` of ``Record``)."""
    recs = result.trajectory
    return Trajectory(
        t=np.array([r.t for r in recs], float),
        loss=np.array([r.loss for r in recs], float),
        omega=np.array([r.omega for r in recs], float),
        mu=np.array([r.mu for r in recs], float),
        residual=np.array([r.residual for r in recs], float),
    )


def value_panels(name: str, title: str, t_points: np.ndarray, omega_points: np.ndarray,
                 mu_points: np.ndarray, t_line: np.ndarray, omega_line: np.ndarray,
                 mu_line: np.ndarray, points_label: str, line_label: str) -> Figure:
    """Figure of kind "panels": omega and mu per head (one panel each), points = measured,
    lines = predicted, one series per task."""
    H, m = omega_points.shape[1:]
    panels = []
    for which, P, Lr in (("omega", omega_points, omega_line), ("mu", mu_points, mu_line)):
        for h in range(H):
            series = []
            for i in range(m):
                series.append(Series(f"{line_label} task {i}", list(map(float, t_line)),
                                     list(map(float, Lr[:, h, i])), "line"))
                series.append(Series(f"{points_label} task {i}", list(map(float, t_points)),
                                     list(map(float, P[:, h, i])), "points"))
            panels.append(Figure(name=f"{name}-{which}-h{h}", title=f"{which}[{h}, i]", kind="lines",
                                 xlabel="t", ylabel=which, series=series))
    return Figure(name=name, title=title, kind="panels", panels=panels)


def log_comparison(c: Comparison, test: str) -> None:
    """Append one line (test, name, error, tolerance, margin, perturbations rejected) to the
    JSON-lines file named by $ICL_CLAIMS_LOG, if set: how the worst agreement over the drawn
    examples is collected for the documentation (``docs/claims_1_4.md``)."""
    path = os.environ.get("ICL_CLAIMS_LOG")
    if not path:
        return
    line = jsonable({"test": test, "name": c.name, "error": c.error, "tolerance": c.tolerance, "margin": c.margin,
                     "agrees": c.agrees, "perturbations": [[p.description, p.rejected, p.details.get("error")]
                                                           for p in c.perturbations]})
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def initial_values(cfg) -> tuple[np.ndarray, np.ndarray]:
    """(omega, mu) (H, m) float64 numpy of cfg's decomposable initialisation."""
    return tuple(a.numpy().copy() for a in initial_semi_singular_values(cfg))


def _scalar(x):
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, float, np.integer, np.floating)):
        return float(x)
    return None


def headline_row(c: Comparison, name: str | None = None, *, theory=None, measured=None,
                 se: float | None = None, tolerance: float | None = None, side: str | None = None,
                 config: str | None = None) -> dict:
    """The headline row (claims.base.HeadlineRow as a dict) of one comparison: its name,
    prediction, measurement, tolerance and agreement, taken from the comparison itself (so
    the row cannot disagree with the verdict).  ``theory``/``measured``/``tolerance``
    replace the comparison's numbers where those are not the scalar a reader wants (a
    bracket, a ratio); ``se`` is the measurement's standard error."""
    return asdict(HeadlineRow(
        name=name or c.name,
        theory=jsonable(theory if theory is not None else _scalar(c.predicted)),
        measured=jsonable(measured if measured is not None else _scalar(c.measured)),
        se=None if se is None else float(se),
        tolerance=float(tolerance if tolerance is not None else c.tolerance),
        agrees=c.agrees, side=side or c.side, config=config or c.config))


def reported_row(name: str, measured=None, *, theory=None, se: float | None = None,
                 config: str | None = None) -> dict:
    """A headline row with no comparison (``side="reported"``, no tick): a measurement the paper
    is silent about, shown as what it is."""
    return asdict(HeadlineRow(name=name, theory=jsonable(theory), measured=jsonable(measured),
                              se=None if se is None else float(se), tolerance=None, agrees=None,
                              side="reported", config=config))


def config_label(cfg) -> str:
    """The short configuration string of a headline row: tasks, H, L, sigma (+ what differs
    from the defaults that matter: param, init)."""
    parts = [f"tasks={tuple(cfg.tasks)}", f"H={cfg.heads}", f"L={cfg.L}", f"sigma={cfg.sigma:g}"]
    if cfg.param != "factored":
        parts.append(f"param={cfg.param}")
    if cfg.init != "decomposable":
        parts.append(f"init={cfg.init}")
    return " ".join(parts)


def comparisons_result(claim_id: str, title: str, statement: str, comps: list, figures: list, details: dict,
                       theory: dict | None = None, short_why: bool = False, numerics: dict | None = None,
                       tolerance: dict | None = None, headline: list | None = None) -> ClaimResult:
    """The one constructor of a claim's ClaimResult from its list of comparisons: verdict from
    ``judge`` (all agree and every perturbation is rejected), theory/numerics/tolerance keyed
    by comparison name (``theory``, ``numerics``, ``tolerance`` override them with a claim's
    own summary), the worst case and every comparison's summary in ``details``.
    ``short_why`` keeps each tolerance argument up to its first " (", where the per-case
    numbers start.  ``headline``: the claim's headline rows (:func:`headline_row`); by
    default one row per comparison."""
    perts = [p for c in comps for p in c.perturbations]
    whys = {c.why.split(" (")[0] if short_why else c.why for c in comps}
    return ClaimResult(
        id=claim_id, title=title, statement=statement, verdict=judge(all(c.agrees for c in comps), perts),
        theory=theory if theory is not None else {c.name: c.predicted for c in comps},
        numerics=numerics if numerics is not None else {c.name: c.measured for c in comps},
        tolerance=tolerance if tolerance is not None else {"value": {c.name: c.tolerance for c in comps},
                                                           "why": "; ".join(sorted(whys))},
        details={**details, "worst": worst(comps), "comparisons": [c.summary() for c in comps]},
        figures=figures, perturbations=perts,
        headline=headline if headline is not None else [headline_row(c) for c in comps])


# ---------------------------------------------------------------------------------------
# statistics of measured numbers (claims 5-7 and the boundaries)
# ---------------------------------------------------------------------------------------

def loss_standard_error(losses: np.ndarray, blocks: int = 10) -> float:
    """Standard error of the mean of per-step batch losses by batch means: the window is cut
    into ``blocks`` contiguous blocks and the block means treated as independent, which
    accounts for the autocorrelation the parameter noise of SGD puts between steps."""
    losses = np.asarray(losses, float)
    k = max(2, min(blocks, losses.size // 2))
    means = np.array([b.mean() for b in np.array_split(losses, k)])
    return float(means.std(ddof=1) / math.sqrt(k))


def window_drift(tail: np.ndarray) -> float:
    """The part of the change of the loss between the two halves of the final window that
    Monte-Carlo noise does not explain: max(0, |mean_1 - mean_2| - Z_SE se(mean_1 - mean_2)),
    the se by batch means within each half.  An estimate of the optimisation error left (a
    run still descending), zero for a run that has converged to within its noise."""
    halves = np.array_split(np.asarray(tail, float), 2)
    se = math.hypot(*(loss_standard_error(h, 5) for h in halves))
    return max(0.0, abs(float(halves[0].mean() - halves[1].mean())) - Z_SE * se)


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
