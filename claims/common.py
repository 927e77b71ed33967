"""What the claim checks share: the comparison object every check returns, the one
tolerance policy (:data:`Z_SE`), headline rows, figure panels, and the optimisation error
left in a window of training losses (:func:`window_drift`).  The statistics of measured
numbers (batch-means standard errors, paired ratios, the L -> inf extrapolation) are
estimators: ``numerics.statistics``; the result constructor is ``claims.spec.build_result``.

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

from claims.base import HeadlineRow, Figure, PerturbationCheck, Series, jsonable

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
    se: Optional[float] = None
    """The standard error of a scalar ``measured`` (None: exact to rounding, or not a scalar):
    what the report's forest plot draws as the error bar of (measured - predicted) / tolerance."""
    resolving_power: Optional[dict] = None
    """The smallest error of the prediction this comparison rejects at its tolerance, each way:
    ``{"low": eps, "high": eps, "units": "relative" | "absolute"}`` -- relative: the prediction
    x (1 - eps) / x (1 + eps) is rejected; absolute: prediction - eps / + eps (a prediction of
    0, a fitted exponent, a count).  ``None`` for an eps that no factor up to
    :data:`RESOLVING_MAX` reaches (the comparison cannot see that direction at all).  Computed
    by :func:`compare` from the comparison's own error function (:func:`resolving_power`)."""

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
            "se": self.se,
            "resolving_power": self.resolving_power,
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


SIDE_ERRORS = {
    "two-sided": lambda measured, predicted: abs(measured - predicted),
    "not above": lambda measured, predicted: max(0.0, measured - predicted),
    "not below": lambda measured, predicted: max(0.0, predicted - measured),
}
"""The error of a scalar comparison on each side (claims.base.SIDES)."""


RESOLVING_MAX = {"relative": 10.0, "absolute": 1e6}
"""How far :func:`resolving_power` looks: a prediction up to a factor 11 above (relative; below,
down to 0), or up to 1e6 tolerances either way (absolute); a direction not rejected within
that range is reported None."""


def _scaled(value, factor: float, shift: float):
    """``value`` with every number x replaced by x * factor + shift (lists and tuples kept)."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_scaled(v, factor, shift) for v in value)
    if isinstance(value, np.ndarray):
        return value * factor + shift
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value) * factor + shift
    raise TypeError(f"cannot scale a prediction of type {type(value).__name__}")


def _numbers(value) -> list[float]:
    if isinstance(value, (list, tuple, np.ndarray)):
        return [x for v in value for x in _numbers(v)]
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return [float(value)]
    return []


def resolving_power(error, measured, predicted, tolerance: float, units: Optional[str] = None) -> Optional[dict]:
    """The smallest eps, each way, for which ``error(measured, prediction moved by eps)`` exceeds
    ``tolerance``: the resolving power of a comparison (the smallest error of the prediction it
    would catch).  ``units`` "relative" moves every number of the prediction to x (1 +- eps),
    "absolute" to x +- eps (default: relative, absolute where the prediction is 0).  Found by a
    geometric scan then bisection on the comparison's own error function (so a one-sided
    comparison has None on the side it cannot see).  0 where the prediction itself is already
    rejected; None for a prediction that is not numbers."""
    nums = _numbers(predicted)
    if not nums or not all(math.isfinite(x) for x in nums) or not math.isfinite(tolerance):
        return None
    if units is None:
        units = "relative" if any(x != 0 for x in nums) else "absolute"
    scale = 1.0 if units == "relative" else max(float(tolerance), 1e-300)

    def rejected(eps: float, sign: float) -> bool:
        moved = (_scaled(predicted, 1.0 + sign * eps, 0.0) if units == "relative"
                 else _scaled(predicted, 1.0, sign * eps * scale))
        e = float(error(measured, moved))
        return not (e <= tolerance)

    out = {"units": units}
    for key, sign in (("low", -1.0), ("high", 1.0)):
        if rejected(0.0, sign):
            out[key] = 0.0
            continue
        # relative: up to x11 above, down to 0 below (beyond it the prediction changes sign)
        top = 1.0 if (units == "relative" and sign < 0) else RESOLVING_MAX[units]
        lo, hi = 0.0, None
        eps = top * 1e-9
        while eps <= top:
            if rejected(eps, sign):
                hi = eps
                break
            lo, eps = eps, eps * 2.0
        if hi is None:
            out[key] = None
            continue
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if rejected(mid, sign):
                hi = mid
            else:
                lo = mid
        out[key] = hi if units == "relative" else hi * scale
    return out


def compare(name: str, measured, predicted, tolerance: float, why: str, *, wrong=(), error=None,
            side: str = "two-sided", details: Optional[dict] = None, config: Optional[str] = None,
            se: Optional[float] = None, units: Optional[str] = None) -> Comparison:
    """A comparison whose perturbations cannot be a second inequality: one error function,
    ``error(measured, prediction)`` (default :data:`SIDE_ERRORS` of ``side``), applied to the
    prediction under test and to each wrong prediction of ``wrong`` ((description, prediction)
    pairs, or a dict), at the one tolerance.  A wrong prediction is rejected when its error
    exceeds the tolerance; it is recorded with the prediction it stood for.  ``se``: the
    standard error of ``measured``; ``units``: how its resolving power is counted
    (:func:`resolving_power`)."""
    err = error or SIDE_ERRORS[side]
    pairs = wrong.items() if isinstance(wrong, dict) else wrong
    try:
        power = resolving_power(err, measured, predicted, tolerance, units)
    except (TypeError, ValueError):   # a prediction the error function cannot take scaled
        power = None
    return Comparison(name=name, measured=measured, predicted=predicted, error=float(err(measured, predicted)),
                      tolerance=tolerance, why=why, side=side, config=config, details=details or {},
                      se=None if se is None else float(se), resolving_power=power,
                      perturbations=[perturbation(d, float(err(measured, alt)), tolerance, predicted=alt)
                                     for d, alt in pairs])


def off_by(factor: float, predicted: float, what: str = "prediction") -> tuple:
    """The two wrong predictions ``what`` x factor and ``what`` / factor (a constant off by a
    stated factor, both ways)."""
    return ((f"{what} x{factor:g}", factor * predicted), (f"{what} /{factor:g}", predicted / factor))


def worst(comparisons: list[Comparison]) -> dict:
    """The worst agreement over a list of comparisons: the largest error/tolerance."""
    if not comparisons:
        return {"margin": None, "name": None}
    c = max(comparisons, key=lambda c: c.margin)
    return {"margin": c.margin, "name": c.name, "error": c.error, "tolerance": c.tolerance}


# ---------------------------------------------------------------------------------------
# trajectories
# ---------------------------------------------------------------------------------------

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


def lines_figure(name: str, title: str, curves, **figure) -> Figure:
    """A figure of kind "lines" from ``curves``: (label, x, y, style) with style "points" (measured),
    "line" (theory) or "dashed" (a border); ``figure``: the other Figure fields."""
    return Figure(name=name, title=title, series=[Series(label, [float(v) for v in x], [float(v) for v in y], style)
                                                  for label, x, y, style in curves], **figure)


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
        agrees=c.agrees, side=side or c.side, config=config or c.config,
        resolving_power=c.resolving_power))


def reported_row(name: str, measured=None, *, theory=None, se: float | None = None,
                 config: str | None = None) -> dict:
    """A headline row with no comparison (``side="reported"``, no tick): a measurement the paper
    is silent about, shown as what it is."""
    return asdict(HeadlineRow(name=name, theory=jsonable(theory), measured=jsonable(measured),
                              se=None if se is None else float(se), tolerance=None, agrees=None,
                              side="reported", config=config))


def config_label(cfg, basis: bool = False) -> str:
    """The short configuration string of a headline row: tasks, H, L, sigma (+ what differs
    from the defaults that matter: param, init; and with ``basis`` the basis when not identity,
    for claims 1-2, which run in a rotated basis too)."""
    parts = [f"tasks={tuple(cfg.tasks)}", f"H={cfg.heads}", f"L={cfg.L}", f"sigma={cfg.sigma:g}"]
    if cfg.param != "factored":
        parts.append(f"param={cfg.param}")
    if cfg.init != "decomposable":
        parts.append(f"init={cfg.init}")
    if basis and cfg.basis != "identity":
        parts.append(f"basis={cfg.basis}")
    return " ".join(parts)


def eps_of(cfg) -> float:
    """Unit round-off of the configuration's dtype (the scale of claims 1-2's rounding bounds)."""
    return float(np.finfo(np.float32 if cfg.dtype == "float32" else np.float64).eps)


SECONDS_PER_STEP, SECONDS_PER_MTOKEN_STEP = 1e-3, 0.25
"""Cost of a GD step of the small full models of claims 1-2, one thread: a fixed overhead plus a
part per million prompt tokens (CPU seconds measured on the quick profile under load: an exact
case, 5 runs x 60 steps of 512 tokens, 0.31 s; a fresh case, 388 steps of 16384 tokens, 2.0 s)."""


def gd_seconds(runs) -> float:
    """Estimated seconds of GD runs given as (steps, prompt tokens per step) pairs."""
    return sum(n * (SECONDS_PER_STEP + SECONDS_PER_MTOKEN_STEP * tok / 1e6) for n, tok in runs)
