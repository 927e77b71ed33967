"""What the claim checks share: the comparison object every check returns, the one
tolerance policy (:data:`Z_SE`), headline rows, figure panels, the optimisation error
left in a window of training losses (:func:`window_drift`).  The statistics of measured
numbers (batch-means standard errors, paired ratios, the L -> inf extrapolation) are
estimators: ``numerics.statistics``; the result constructor is ``claims.core.spec.build_result``.

A claim module is its experiment plan and its comparisons: every estimator and every loop
is in ``numerics``, every prediction in ``theory``.  Nothing here decides a verdict (that
is :func:`claims.core.base.judge`, from the :class:`Comparison` objects).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import reduce
from operator import add
from typing import Callable, Optional

import numpy as np

from numerics.io import jsonable
from claims.core.base import HeadlineRow, Figure, PerturbationCheck, Series
from numerics.statistics import Z_SE  # the one tolerance multiplier, defined where the estimators are

EPS64 = float(np.finfo(np.float64).eps)
"""Unit round-off of float64 (2.2e-16): the scale of every 'exact to rounding' tolerance."""


# ---------------------------------------------------------------------------------------
# a tolerance of named terms
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tolerance:
    """A tolerance built from named terms -- Z_SE standard errors, a step error, theory's stated approximation
    error -- whose sentence (``why``) is generated from the same terms, so that the argument a report prints cannot
    disagree with the number it compares at (:func:`compare` takes both from it).

    The sum of ``terms``, ``(label, value)`` pairs (:func:`noise_term`, :func:`term`), added
    left to right as ``a + b + c`` is (floating-point addition is not associative: the order is
    the formula's), and :meth:`why`, the sentence listing the terms and their sum, then
    ``reason``: the argument for a term beyond its name.

    >>> t = Tolerance((noise_term(0.0021, "the held-out loss", 131072), term("SGD step error", 0.0012)))
    >>> t.value == Z_SE * 0.0021 + 0.0012
    True
    >>> t.why()
    '4 standard errors of the held-out loss (0.0021, 131072 prompts) 0.0084 + SGD step error 0.0012 = 0.0096'
    """

    terms: tuple
    reason: str = ""

    @property
    def value(self) -> float:
        return reduce(add, (value for _, value in self.terms))

    def why(self) -> str:
        total = f" = {_g(self.value)}" if len(self.terms) > 1 else ""     # one term: its own value
        return (" + ".join(f"{label} {_g(value)}" for label, value in self.terms) + total
                + (f"; {self.reason}" if self.reason else ""))


def noise_term(se: float, what: str, n=None) -> tuple:
    """The Monte-Carlo term: Z_SE x ``se`` (a number, or an array entrywise), the standard error of ``what``; ``n``, its sample (an
    int counts prompts; a string is printed as it is)."""
    sample = "" if n is None else f", {n} prompts" if isinstance(n, (int, np.integer)) else f", {n}"
    return f"{Z_SE:g} standard errors of {what} ({_g(se)}{sample})", Z_SE * se


def _g(x) -> str:
    """A number (3 digits), or per entry an array's (a tolerance entrywise)."""
    return f"{x:.3g}" if np.ndim(x) == 0 else "[" + ", ".join(f"{v:.3g}" for v in np.ravel(x)) + "]"


def term(label: str, value: float) -> tuple:
    """Any other named term: a step error, a resolution, theory's stated approximation error."""
    return label, value


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
    predicted) (``not above``), max(0, predicted - measured) (``not below``); claims.core.base.SIDES."""
    config: Optional[str] = None
    """The configuration the comparison was measured at, for the headline row."""
    se: Optional[float] = None
    """The standard error of a scalar ``measured`` (None: exact to rounding, or not a scalar):
    what the report's forest plot draws as the error bar of (measured - predicted) / tolerance."""
    resolving_power: Optional[dict] = None
    """The smallest error of the prediction this comparison rejects at its tolerance, each way:
    ``{"low": eps, "high": eps, "units": "relative" | "absolute" | "count"}`` -- relative: the
    prediction x (1 - eps) / x (1 + eps) is rejected; absolute: prediction - eps / + eps (a
    prediction of 0, a fitted exponent); count: - k / + k (counts, indices).  ``None`` for a side
    that nothing up to :data:`RESOLVING_MAX` reaches (the comparison cannot see that direction);
    None as a whole for a prediction with no quantities.  An entrywise comparison moves each
    entry alone (``entrywise``, ``entries``).  Computed by :func:`compare` (or :func:`resolved`)
    from the comparison's own error function and tolerance (:func:`resolving_power`); each
    direction it sees is also probed at 1.5 x its eps (:func:`edge_probes`, in ``perturbations``).
    ``bound`` (where present) lists the directions whose eps is only an upper bound: every move the
    scan tried was rejected (an exact comparison)."""
    error_function: Optional[Callable] = field(default=None, repr=False, compare=False)
    """``error`` as a function of (measured, prediction), its tolerance of the prediction: set by compare() and
    resolved(), never written; the build confirms the printed power with them (claims.core.spec.unconfirmed_power)."""
    tolerance_function: Optional[Callable] = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        # a comparison built by hand whose error is its side's default error of two scalars gets its
        # resolving power and edge probes here (the others through compare() or resolved())
        if self.resolving_power is None and self.side in SIDE_ERRORS:
            m, p = _scalar(self.measured), _scalar(self.predicted)
            if m is not None and p is not None and math.isfinite(self.tolerance) and math.isfinite(self.error):
                if math.isclose(SIDE_ERRORS[self.side](m, p), self.error, rel_tol=1e-9, abs_tol=1e-300):
                    counts = all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                                 for x in (self.measured, self.predicted))
                    resolved(self, units="count" if counts else None)

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
        return jsonable({**{k: getattr(self, k) for k in SUMMARY_KEYS},
                         "perturbations": [{"description": p.description, "rejected": p.rejected, **p.details}
                                           for p in self.perturbations], "details": self.details})

    def explain(self) -> str:
        """A one-paragraph message for a failing test (numbers, tolerance, perturbations)."""
        lines = [f"{self.name}: error {self.error:.4g} vs tolerance {self.tolerance:.4g} "
                 f"(agrees={self.agrees}); measured={_short(self.measured)}, predicted={_short(self.predicted)}",
                 f"  tolerance: {self.why}"]
        for p in self.perturbations:
            lines.append(f"  perturbation '{p.description}': rejected={p.rejected} {_short(p.details)}")
        lines.append(f"  details: {_short(self.details, 1500)}")
        return "\n".join(lines)


SUMMARY_KEYS = ("name", "measured", "predicted", "error", "tolerance", "why", "agrees", "margin", "side", "config", "se",
                "resolving_power")
"""The fields of a comparison's summary (then its perturbations and details), in claims.json's order."""


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
"""The error of a scalar comparison on each side (claims.core.base.SIDES)."""


RESOLVING_UNITS = ("relative", "absolute", "count")
"""How a resolving power is counted: ``relative`` (the prediction x (1 -+ eps)), ``absolute`` (the
prediction -+ eps, in its own units: a prediction of 0, a fitted exponent), ``count`` (the
prediction -+ k, k = 1, 2, ...: counts, head indices, outcomes)."""

RESOLVING_MAX = {"relative": 10.0, "absolute": 1e6, "count": 2 ** 20}
"""How far :func:`resolving_power` looks: a prediction up to a factor 11 above (relative; below,
down to 0, beyond which it changes sign), up to 1e6 of its scale (absolute: the tolerance, or the
measurement's size where the tolerance is 0), up to 2^20 (count); a direction not rejected within
that range is reported None: the comparison cannot see it."""

RESOLVING_FLOOR = 0.05
"""The resolving power every paper claim's headline comparison must reach at the quick profile:
a prediction 5 % off, either way, is rejected.  Where a claim cannot reach it (a
bracket, or noise the quick profile cannot afford), its docs say the number reached and why."""

EDGE_MARGIN = 1.5
"""The edge probes (:func:`edge_probes`): the prediction moved by EDGE_MARGIN x its own resolving
power, each way the comparison sees, must be rejected -- through the comparison's own error
function and its tolerance recomputed from the moved prediction.  A comparison whose tolerance
grows with the prediction as fast as its error (so that no move is ever rejected) fails its probe:
its verdict is ``undecided``, never pass.  Counts move by whole steps: by the power k itself."""


def _is_quantity(x, units: str) -> bool:
    """A number the resolving power moves: floats always; integers only when counting (elsewhere
    an int is a label: a head index, a task; bools never)."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, (float, np.floating)):
        return True
    return units == "count" and isinstance(x, (int, np.integer))


def _map_quantities(value, fn, units: str, only: Optional[int] = None, _seen: Optional[list] = None):
    """``value`` with ``fn`` applied to every quantity in it (:func:`_is_quantity`; dict values,
    list/tuple items and array entries are walked, strings and None kept), or only to the quantity
    numbered ``only`` in walking order."""
    seen = [0] if _seen is None else _seen
    if isinstance(value, dict):
        return {k: _map_quantities(v, fn, units, only, seen) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_quantities(v, fn, units, only, seen) for v in value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" or (units == "count" and value.dtype.kind in "iu"):
            flat = np.array(value, dtype=float).ravel()
            if only is None:
                out = np.array([fn(float(x)) for x in flat])
            else:
                out = flat.copy()
                if seen[0] <= only < seen[0] + flat.size:
                    out[only - seen[0]] = fn(float(flat[only - seen[0]]))
            seen[0] += flat.size
            return out.reshape(value.shape)
        return value
    if _is_quantity(value, units):
        k = seen[0]
        seen[0] += 1
        return fn(float(value)) if only is None or only == k else value
    return value


def _quantities(value, units: str) -> list[float]:
    out: list[float] = []
    _map_quantities(value, lambda x: out.append(x) or x, units)
    return out


def _tolerance_at(tolerance):
    """The tolerance as a function of the prediction (a number is the same for every prediction)."""
    return tolerance if callable(tolerance) else (lambda predicted: tolerance)


def moved_prediction(predicted, eps: float, sign: float, units: str, only: Optional[int] = None):
    """``predicted`` moved by ``eps`` (:data:`RESOLVING_UNITS`): x (1 + sign eps), x + sign eps, or
    x + sign eps for counts (eps an integer); ``only``: move that quantity alone."""
    if units == "relative":
        fn = lambda x: x * (1.0 + sign * eps)  # noqa: E731
    else:
        fn = lambda x: x + sign * eps  # noqa: E731
    return _map_quantities(predicted, fn, units, only)


def _side(rejected, units: str, sign: float, scale: float) -> tuple[Optional[float], bool]:
    """The smallest eps >= 0 that ``rejected(eps)`` accepts as rejected, and whether it is only a
    bound: a geometric scan (factor 4) then bisection to 1e-6 relative, at most 60 halvings (integers
    for counts); None beyond RESOLVING_MAX.  A bound (True): every move the scan tried was rejected,
    down to the smallest (an exact comparison, tolerance 0), so the true power is at most eps."""
    if rejected(0.0):
        return 0.0, False
    if units == "count":
        lo, k = 0, 1
        while k <= RESOLVING_MAX["count"] and not rejected(float(k)):
            lo, k = k, 2 * k
        if k > RESOLVING_MAX["count"]:
            return None, False
        hi = k
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if rejected(float(mid)) else (mid, hi)
        return float(hi), False
    # relative, downwards: up to (not onto) 0 -- an error function may be undefined there (a ratio to the prediction)
    top = 1.0 - 1e-9 if (units == "relative" and sign < 0) else RESOLVING_MAX[units]
    lo, hi, eps = 0.0, None, top * 4.0 ** -28
    while eps <= top * (1 + 1e-12):
        if rejected(eps):
            hi = eps
            break
        lo, eps = eps, min(4.0 * eps, top) if eps < top else 2 * top
    if hi is None:
        return None, False
    # to 1e-6 relative; at most 60 halvings (an exact comparison, tolerance 0, rejects every move: its
    # power is the first scanned eps halved 60 times, ~1e-29 of the scale, and only a bound)
    for _ in range(60):
        if hi - lo <= 1e-6 * hi:
            break
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if rejected(mid) else (mid, hi)
    return hi * scale, lo == 0.0


def resolving_power(error, measured, predicted, tolerance, units: Optional[str] = None,
                    entrywise: bool = False) -> Optional[dict]:
    """The smallest eps, each way, for which ``error(measured, prediction moved by eps)`` exceeds
    the tolerance: the resolving power of a comparison (the smallest error of the prediction it
    catches), ``{"low": eps, "high": eps, "units": units}``.

    ``units`` (:data:`RESOLVING_UNITS`; default relative, absolute where every quantity of the
    prediction is 0): relative moves every quantity of the prediction to x (1 -+ eps), absolute to
    x -+ eps (eps in the prediction's units), count to x -+ k.  ``tolerance``: a number, or a
    function of the prediction -- then it is recomputed from each moved prediction, through the same
    code path as for the prediction itself, so a tolerance that grows with the prediction shows as a
    weaker (or absent) resolving power.  ``entrywise``: each quantity is moved alone; ``low``/``high``
    are then the largest over the entries (an error of that size in any one entry is caught) and
    ``entries`` lists each entry's.  Found by a geometric scan then bisection on the comparison's own
    error function, so a one-sided comparison has None on the side it cannot see.  0 where the
    prediction itself is already rejected; None (the whole result) for a prediction without
    quantities, or a non-finite one."""
    units_guess = units or "relative"
    nums = _quantities(predicted, units_guess)
    tol_at = _tolerance_at(tolerance)
    if not nums or not all(math.isfinite(x) for x in nums):
        return None
    if not math.isfinite(float(tol_at(predicted))):
        return None
    if units is None:
        units = "relative" if any(x != 0 for x in nums) else "absolute"
    if units not in RESOLVING_UNITS:
        raise ValueError(f"units must be one of {RESOLVING_UNITS}, got {units!r}")
    scale = 1.0
    if units == "absolute":
        t0 = float(tol_at(predicted))
        size = [abs(x) for x in _quantities(measured, "count") if math.isfinite(x)]
        scale = t0 if t0 > 0 else max([1.0] + size)

    def power(only: Optional[int]) -> dict:
        out, bound = {}, []
        for key, sign in (("low", -1.0), ("high", 1.0)):
            def rejected(eps: float) -> bool:
                moved = moved_prediction(predicted, eps * (1.0 if units == "relative" else scale) if units != "count"
                                         else eps, sign, units, only)
                return not (float(error(measured, moved)) <= float(tol_at(moved)))
            out[key], is_bound = _side(rejected, units, sign, 1.0 if units == "relative" or units == "count" else scale)
            bound += [key] if is_bound else []
        return {**out, "bound": bound} if bound else out

    if not entrywise or len(nums) == 1:
        return {**power(None), "units": units}
    entries = [power(k) for k in range(len(nums))]
    worst = {key: (None if any(e[key] is None for e in entries) else max(e[key] for e in entries))
             for key in ("low", "high")}
    bound = [key for key in ("low", "high") if any(key in e.get("bound", ()) for e in entries)]
    return {**worst, **({"bound": bound} if bound else {}), "units": units, "entrywise": True, "entries": entries}


SEES = {"two-sided": ("low", "high"), "not above": ("low",), "not below": ("high",)}
"""The directions of a prediction error each side of comparison can see: a 'not above' check
(measured <= predicted + tol) rejects a prediction that is too low, never one too high."""


def edge_probes(error, measured, predicted, tolerance, power: Optional[dict], side: str = "two-sided",
                margin: float = EDGE_MARGIN) -> list[PerturbationCheck]:
    """The perturbations at the tolerance's edge: for each direction the comparison sees
    (:data:`SEES`), the prediction moved by ``margin`` (default :data:`EDGE_MARGIN`) x its resolving
    power (each entry alone, all of them to be rejected, for an entrywise power), sent through the
    same error function and the tolerance recomputed from the moved prediction.  A direction with no
    resolving power (None: nothing up to RESOLVING_MAX is rejected) is probed at the end of that
    range, which is not rejected -- the comparison cannot see a direction it claims to, and the judge
    makes it ``undecided``.  A direction already at 0 (the prediction itself rejected) needs no probe.
    A margin below 1 (the build's probe from below) skips a bound; counts move by whole steps: by the
    power k itself (to be rejected), or from below by k - 1 (to be accepted)."""
    if power is None:
        return []
    units, tol_at, out = power["units"], _tolerance_at(tolerance), []
    entries = power.get("entries") if power.get("entrywise") else None
    for key in SEES.get(side, ("low", "high")):
        sign = -1.0 if key == "low" else 1.0
        eps = power.get(key)
        if eps == 0.0 or (margin < 1 and (eps is None or key in power.get("bound", ()))):
            continue
        what = f"{margin:g} x its resolving power {eps:{'g' if units == 'count' else '.3g'}}" if eps is not None else \
            f"no resolving power {key} (nothing rejected up to the end of the scan)"
        if eps is None:
            step = (1.0 - 1e-9 if sign < 0 else RESOLVING_MAX["relative"]) if units == "relative" else (
                RESOLVING_MAX[units] * (1.0 if units == "count" else float(tol_at(predicted)) or 1.0))
        elif units == "count":   # whole steps: the power k itself is rejected, k - 1 (the probe from below) is not
            step, what = (eps, f"its resolving power {eps:g}") if margin >= 1 else (eps - 1, f"one below its power {eps:g}")
        else:
            step = min(margin * eps, 1.0 - 1e-9) if (units == "relative" and sign < 0) else margin * eps
        if step == 0.0:
            continue
        targets = range(len(entries)) if entries else [None]
        moves = [moved_prediction(predicted, step, sign, units, k) for k in targets]
        errs = [(float(error(measured, mv)), float(tol_at(mv))) for mv in moves]
        rejected = all(not (e <= t) for e, t in errs)
        how = {"relative": f"x (1 {'-' if sign < 0 else '+'} {step:.3g})",
               "absolute": f"{'-' if sign < 0 else '+'} {step:.3g}",
               "count": f"{'-' if sign < 0 else '+'} {step:g}"}[units]
        desc = f"edge: prediction {how}{' (each entry alone)' if entries else ''}, {what}"
        details = {"edge": key, "eps": eps, "step": step, "units": units, "error": max(e for e, _ in errs),
                   "tolerance": min(t for _, t in errs)}
        if not entries:
            details["predicted"] = moves[0]
        out.append(PerturbationCheck(description=desc, rejected=bool(rejected), details=jsonable(details)))
    return out


def compare(name: str, measured, predicted, tolerance, why: Optional[str] = None, *, wrong=(), error=None,
            side: str = "two-sided", details: Optional[dict] = None, config: Optional[str] = None,
            se: Optional[float] = None, units: Optional[str] = None, entrywise: bool = False) -> Comparison:
    """A comparison whose perturbations cannot be a second inequality: one error function,
    ``error(measured, prediction)`` (default :data:`SIDE_ERRORS` of ``side``), applied to the
    prediction under test, to each wrong prediction of ``wrong`` ((description, prediction)
    pairs, or a dict) and to the edge probes (:func:`edge_probes`), each at the tolerance.  ``tolerance``:
    a :class:`Tolerance` (its value and its why), or a number or a function of the prediction with its ``why`` (a
    function is recomputed for every wrong or moved prediction: a relative tolerance, theory's stated error).  A
    wrong prediction is rejected when its error exceeds its tolerance; it is recorded with the prediction it stood
    for.  ``se``: the standard error of ``measured``; ``units``, ``entrywise``: its resolving power's count."""
    if isinstance(tolerance, Tolerance) == (why is not None):
        raise ValueError(f"{name}: a Tolerance states its own why; a number or a function needs one")
    tolerance, why = (tolerance.value, tolerance.why()) if isinstance(tolerance, Tolerance) else (tolerance, why)
    err = error or SIDE_ERRORS[side]
    tol_at = _tolerance_at(tolerance)
    pairs = wrong.items() if isinstance(wrong, dict) else wrong
    try:
        power = resolving_power(err, measured, predicted, tolerance, units, entrywise)
    except (TypeError, ValueError, IndexError, KeyError, ArithmeticError):
        power = None        # a prediction the error function cannot take moved
    perts = [perturbation(d, float(err(measured, alt)), float(tol_at(alt)), predicted=alt) for d, alt in pairs]
    perts += edge_probes(err, measured, predicted, tolerance, power, side)
    return Comparison(name=name, measured=measured, predicted=predicted, error=float(err(measured, predicted)),
                      tolerance=float(tol_at(predicted)), why=why, side=side, config=config, details=details or {},
                      se=None if se is None else float(se), resolving_power=power, perturbations=perts,
                      error_function=err, tolerance_function=tol_at)


def resolved(c: Comparison, error=None, units: Optional[str] = None, tolerance=None,
             entrywise: bool = False) -> Comparison:
    """A comparison built by hand (its perturbations are other runs or other statistics, which
    :func:`compare` cannot express) given its resolving power and edge probes from ``error`` --
    the function its ``error`` was computed by (default :data:`SIDE_ERRORS` of its side), which
    must reproduce it -- and ``tolerance`` (default its own number; a function of the prediction
    where the tolerance is made from it).  Returns ``c``."""
    err = error or SIDE_ERRORS[c.side]
    tol = c.tolerance if tolerance is None else tolerance
    here = float(err(c.measured, c.predicted))
    if not (here == c.error or (math.isnan(here) and math.isnan(c.error))
            or math.isclose(here, c.error, rel_tol=1e-9, abs_tol=1e-300)):
        raise ValueError(f"{c.name}: the error function gives {here!r}, the comparison holds {c.error!r}")
    c.resolving_power = resolving_power(err, c.measured, c.predicted, tol, units, entrywise)
    c.perturbations = [p for p in c.perturbations if "edge" not in p.details] + edge_probes(err, c.measured, c.predicted, tol, c.resolving_power, c.side)
    c.error_function, c.tolerance_function = err, _tolerance_at(tol)
    return c



def seen_eps(c: Comparison | dict) -> Optional[float]:
    """The resolving power of a comparison (object or summary) over the directions it sees
    (:data:`SEES`): the larger of the two for a two-sided one; None where it has none, or is blind
    in a direction it should see."""
    rp = c["resolving_power"] if isinstance(c, dict) else c.resolving_power
    side = c["side"] if isinstance(c, dict) else c.side
    if not rp:
        return None
    vals = [rp.get(k) for k in SEES.get(side, ("low", "high"))]
    return None if any(v is None for v in vals) else float(max(vals))


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


def head_task_heatmap(name: str, title: str, M) -> Figure:
    """A head x task heatmap of final semi-singular values."""
    return Figure(name=name, title=title, kind="heatmap", matrix=M, row_labels=[f"head {h}" for h in range(len(M))],
                  col_labels=[f"task {i}" for i in range(len(M[0]))])


def _scalar(x):
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, float, np.integer, np.floating)):
        return float(x)
    return None


def headline_row(c: Comparison, name: str | None = None, *, theory=None, measured=None,
                 se: float | None = None, tolerance: float | None = None, side: str | None = None,
                 config: str | None = None, agrees: bool | None = None) -> dict:
    """The headline row (claims.core.base.HeadlineRow as a dict) of one comparison: its name,
    prediction, measurement, tolerance and agreement, taken from the comparison itself (so
    the row cannot disagree with the verdict).  ``theory``/``measured``/``tolerance``
    replace the comparison's numbers where those are not the scalar a reader wants (a
    bracket, a ratio); ``se`` is the measurement's standard error; ``agrees`` the agreement
    of those replaced numbers, where the row shows one part of a comparison of several (a
    row must agree with its own numbers; the verdict stays the comparison's)."""
    return asdict(HeadlineRow(
        name=name or c.name,
        theory=jsonable(theory if theory is not None else _scalar(c.predicted)),
        measured=jsonable(measured if measured is not None else _scalar(c.measured)),
        se=None if se is None else float(se),
        tolerance=float(tolerance if tolerance is not None else c.tolerance),
        agrees=c.agrees if agrees is None else bool(agrees), side=side or c.side, config=config or c.config,
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
