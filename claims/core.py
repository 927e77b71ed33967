"""What every claim module shares, and nothing a single claim owns.

A claim check runs an experiment (``numerics``), asks ``theory`` for its prediction, compares the
two at a tolerance that comes from an argument (Monte-Carlo error, O(1/L) terms, step size) and
returns a :class:`ClaimResult`.  The same functions are called by ``tests/`` (on Hypothesis-drawn
configurations) and by ``reports/`` (on a profile), so the two can never disagree.  The report only
renders ``ClaimResult`` objects; everything it shows, figures included, is data computed here.

Every check also runs itself against a *perturbed* prediction (a wrong constant, a wrong winner, a
wrong exponent) and records whether that was rejected at the same tolerance
(:class:`PerturbationCheck`).  A check that cannot reject the perturbation cannot discriminate: its
agreement decides nothing, and its verdict is ``"undecided"``, not ``"pass"``.  ``"error"`` means
only that the check raised.

In order: the result of a claim (:class:`ClaimResult`, headline rows, figures, findings) and the one
verdict rule (:func:`judge`); the comparison every check returns (:class:`Comparison`,
:func:`compare`), the tolerance policy (``Z_SE``), a tolerance of named terms (:class:`Tolerance`),
resolving powers; a claim as data (:class:`ClaimSpec`: a plan of needs and a comparison), its runner
(:func:`run_spec`) and the one constructor of a result (:func:`build_result`); findings; what the
claims on trained full models share (claims 5, 6 and boundary-left-allocation: :func:`run_status`,
:func:`check_trained_loss`); what the initialisation boundaries and the atlas share (phase times of
paired curves, discrete outcomes, shares of seeds).  Every estimator and every loop is in
``numerics``, every prediction in ``theory``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import time
import traceback
from dataclasses import asdict, dataclass, field
from functools import reduce
from operator import add
from typing import Any, Callable, Optional

import numpy as np

from numerics.engine import Engine, Results, need
from numerics.io import jsonable
from numerics.engine import check_independent
from numerics.evaluate import ALLOCATED_SHARE, Z_SE, binomial_interval, mean_se  # Z_SE: the one tolerance multiplier

PROFILES = ("tiny", "quick", "paper", "authors")
"""``tiny``: seconds, for the report's own end-to-end test; ``quick``: the default report
(about 10 minutes on 2 CPU cores in total); ``paper``: the scale of the paper's experiments,
meant for a GPU; ``authors``: the authors' released experiment (claims.authors_replica, the one
id that has it; meant for a GPU, reduced on a CPU)."""

VERDICTS = ("pass", "fail", "undecided", "error")
"""Verdicts of the paper's claims (``kind == "claim"``): ``pass`` (theory and numerics agree and
every wrong prediction was rejected), ``fail`` (they disagree), ``undecided`` (they agree, but the
measurement cannot decide: a wrong prediction accepted, or ``details["undecided"]`` says why),
``error`` (the check raised)."""

BOUNDARY_OUTCOMES = ("located", "contradicted", "undecided", "error")
"""Outcomes of a boundary (``kind == "boundary"``): ``located`` (its regime was measured
conclusively and theory's account of it agrees; the finding says where and what happens),
``contradicted`` (measured conclusively, and theory's account disagrees: the numbers say by how
much), ``undecided`` (the measurement could not decide; ``details["undecided"]`` says why),
``error`` (the check raised)."""

KINDS = ("claim", "boundary")
"""A ClaimResult is one of the paper's claims or a boundary (where a claim stops, or what the
paper does not say)."""

BOUNDARY_ID_PREFIXES = ("boundary-", "atlas-", "authors-")
"""The ids that name boundaries: ``boundary-...`` (where a claim stops), ``atlas-...`` (the
maps of where the claims hold) and ``authors-...`` (the authors' released experiment trained and
audited here: located or undecided, as an audited model is)."""


def kind_from_id(claim_id) -> str:
    """The kind an id names, for where its spec cannot say (a claim module that failed to
    import, an entry of an older claims.json without ``kind``): "boundary" for an id starting
    with one of :data:`BOUNDARY_ID_PREFIXES`, else "claim".  A spec's own ``kind`` is the
    authority; every registered spec declares the kind its id names (tests/claims/test_contract.py)."""
    return "boundary" if str(claim_id).startswith(BOUNDARY_ID_PREFIXES) else "claim"

FAILING = {"claim": ("fail", "error"), "boundary": ("contradicted", "error")}
"""The verdicts that make ``reports.build`` and ``reports.audit`` exit 1; ``undecided`` is not
among them for either kind (the result says what would decide it)."""

SIDES = ("two-sided", "not above", "not below", "reported")
"""How a headline row compares: |measured - theory| <= tolerance (``two-sided``); measured <=
theory + tolerance (``not above``); measured >= theory - tolerance (``not below``); or no
comparison at all (``reported``: a measurement shown with no tick)."""

FINDING_KINDS = ("holds", "stops", "beyond")
"""``holds``: the claim holds inside its stated domain, with how precisely; ``stops``: where it
stops, as a measured location with an error bar; ``beyond``: something the paper does not say."""

Progress = Callable[[str, float], None]
"""``progress(message, fraction_done)``: how a claim run reports how far it is."""


def no_progress(message: str, fraction: float) -> None:  # noqa: ARG001 - a sink
    return None


@dataclass
class Series:
    """One line or point set of a figure. ``style``: ``"line"``, ``"points"`` or ``"dashed"``."""

    label: str
    x: list[float]
    y: list[float]
    style: str = "line"


@dataclass
class Figure:
    """Data for one figure; ``reports`` turns it into a PNG and computes nothing.

    ``kind`` selects the renderer:

    - ``"lines"``: ``series`` on axes with ``xscale``/``yscale`` (``"linear"``/``"log"``),
      optional ``spans`` (shaded x-intervals: ``{"x0", "x1", "label"}``, used for the
      three phases) and ``hlines`` (``{"y", "label"}``, e.g. the line y = H).
    - ``"heatmap"``: ``matrix`` (rows x cols) with ``row_labels``/``col_labels``.
    - ``"panels"``: ``panels`` is a list of ``Figure`` of kind ``"lines"`` drawn side by side
      (e.g. omega and mu trajectories per head).
    """

    name: str
    title: str
    kind: str = "lines"
    xlabel: str = ""
    ylabel: str = ""
    xscale: str = "linear"
    yscale: str = "linear"
    series: list[Series] = field(default_factory=list)
    spans: list[dict] = field(default_factory=list)
    hlines: list[dict] = field(default_factory=list)
    matrix: Optional[list[list[float]]] = None
    row_labels: list[str] = field(default_factory=list)
    col_labels: list[str] = field(default_factory=list)
    panels: list["Figure"] = field(default_factory=list)
    caption: str = ""
    """One line under the figure saying what to look for."""


@dataclass
class PerturbationCheck:
    """The same comparison run against a deliberately wrong prediction."""

    description: str
    rejected: bool
    details: dict = field(default_factory=dict)


@dataclass
class HeadlineRow:
    """One line of a claim's headline: what theory says, what was measured, how far apart
    they may be, and whether they agree.

    ``theory`` is a number, or a bracket ``[low, high]`` where theory gives a range rather
    than a value (then ``agrees`` says whether ``measured`` lies in it, widened by
    ``tolerance``); ``se`` is the measurement's standard error (None when it is exact to
    rounding); ``tolerance`` the allowed |measured - theory|, fixed before the comparison.
    Any field but ``name`` may be None (a measurement with no prediction, say).
    """

    name: str
    theory: Any = None
    measured: Any = None
    se: Optional[float] = None
    tolerance: Any = None
    """A number, or a list of per-entry numbers where the comparison is entrywise (claim 4's
    served point), or None."""
    agrees: Optional[bool] = None
    side: str = "two-sided"
    """One of :data:`SIDES`, taken from the comparison behind the row."""
    config: Optional[str] = None
    """The configuration the row was measured at (``"tasks=(2, 2) H=2 L=32"``): tables group
    rows by it instead of repeating it in every name."""
    resolving_power: Optional[dict] = None
    """The comparison's resolving power (``Comparison.resolving_power``): the
    smallest error of the prediction, each way, that the row's comparison rejects."""


@dataclass
class Finding:
    """One sentence a reader takes away, generated from the result's own numbers by the claim's
    template (never typed in): ``claim`` (id), ``kind`` (one of :data:`FINDING_KINDS`), ``text``
    (the sentence, numbers in it), ``numbers`` ({name: {"value": v, "se": se or None}}: the
    values the sentence uses)."""

    claim: str
    kind: str
    text: str
    numbers: dict = field(default_factory=dict)


@dataclass
class ClaimResult:
    """The outcome of one claim check, in the schema of ``claims.json``.

    ``headline``: the rows a reader sees first (:class:`HeadlineRow`, stored as dicts with
    keys name, theory, measured, se, tolerance, agrees); ``theory``: the predicted values;
    ``numerics``: the measured values; ``tolerance``: the allowed discrepancy and the
    argument it comes from (``{"value": ..., "why": "..."}``); ``details``: anything else a
    reader needs (configurations, seeds, per-case numbers); ``paper``: the paper's statement
    in one line.
    """

    id: str
    title: str
    statement: str
    verdict: str
    kind: str = "claim"
    theory: dict = field(default_factory=dict)
    numerics: dict = field(default_factory=dict)
    tolerance: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    perturbations: list[PerturbationCheck] = field(default_factory=list)
    seconds: float = 0.0
    headline: list[dict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    paper: Optional[str] = None
    """What the paper states, in one line (a paper claim's ``ClaimSpec.paper``; None for a boundary):
    the report prints it beside the number tested."""

    def to_dict(self) -> dict:
        return jsonable(dataclasses.asdict(self))


def judge(agrees: bool, perturbations: list[PerturbationCheck], kind: str = "claim",
          undecided: Optional[str] = None, fault: Optional[str] = None) -> str:
    """The one verdict rule.  For a claim: ``pass`` only if theory and numerics agree *and*
    every perturbed prediction was rejected at the same tolerance; an agreement that accepts a wrong
    prediction cannot discriminate, and one whose measurement could not decide (``undecided``: the
    reason) decides nothing either: both are ``undecided``, never pass (``error`` is only a check
    that raised: :func:`run_claim`).  A disagreement is ``fail`` even then: a measurement outside
    a tolerance too wide to reject the perturbations lies outside any narrower one as well, so it
    contradicts theory conclusively; only an agreement needs the perturbations to mean something.

    ``fault``: what the check itself got wrong though it ran (a resolving power it printed that its
    own comparison does not confirm): an agreement then is ``error``, as a check that raised.

    For a boundary the same rule in :data:`BOUNDARY_OUTCOMES`' words: pass -> ``located``,
    fail -> ``contradicted``, undecided -> ``undecided``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not agrees:
        verdict = "fail"
    elif fault:
        return "error"
    elif undecided or (perturbations and not all(p.rejected for p in perturbations)):
        verdict = "undecided"
    else:
        verdict = "pass"
    if kind == "boundary":
        return {"pass": "located", "fail": "contradicted", "undecided": "undecided"}[verdict]
    return verdict


def run_claim(
    claim_id: str,
    title: str,
    statement: str,
    body: Callable[[], ClaimResult],
    kind: str = "claim",
) -> ClaimResult:
    """Run ``body`` and time it; an exception becomes a ``ClaimResult`` with verdict
    ``"error"`` and the traceback in ``details``, so one broken claim never hides the rest."""
    t0 = time.perf_counter()
    try:
        result = body()
    except Exception as exc:  # the report must go on and show the error
        result = ClaimResult(
            id=claim_id,
            title=title,
            statement=statement,
            verdict="error",
            kind=kind,
            details={"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()},
        )
    result.seconds = time.perf_counter() - t0
    allowed = VERDICTS if result.kind == "claim" else BOUNDARY_OUTCOMES
    if result.verdict not in allowed:
        raise ValueError(f"{result.kind} {claim_id}: verdict {result.verdict!r} is not one of {allowed}")
    return result


# ---------------------------------------------------------------------------------------
# the comparison every check returns: tolerances, resolving powers, rows, figures
# ---------------------------------------------------------------------------------------

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
    predicted) (``not above``), max(0, predicted - measured) (``not below``); SIDES."""
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
    resolved(), never written; the build confirms the printed power with them (unconfirmed_power)."""
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
"""The error of a scalar comparison on each side (SIDES)."""


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
    """The headline row (HeadlineRow as a dict) of one comparison: its name,
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


# ---------------------------------------------------------------------------------------
# a claim as a spec, and the one runner
# ---------------------------------------------------------------------------------------

PROBLEM_FIELDS = ("tasks", "heads", "L", "sigma", "param", "init_scale", "logit_scale", "basis", "dtype")
"""The ProblemConfig fields a researcher may set for an audit (``reports.build --tasks ...``)."""


def check_problem(problem: Optional[dict], device: str = "cpu", fields: tuple = PROBLEM_FIELDS) -> Optional[dict]:
    """The one parser of a researcher's configuration: a dict of ProblemConfig fields, each
    validated by ProblemConfig itself (missing tasks/heads/L are filled with placeholders only
    for the validation).  Unknown fields, and fields the claim would ignore (not in
    ``fields``), are refused with a ValueError naming them.  Returns a normalised copy."""
    if problem is None:
        return None
    if not isinstance(problem, dict):
        raise ValueError(f"problem must be a dict of ProblemConfig fields, got {type(problem).__name__}")
    unknown = sorted(set(problem) - set(PROBLEM_FIELDS))
    if unknown:
        raise ValueError(f"problem has unknown field(s) {unknown}; known: {', '.join(PROBLEM_FIELDS)}")
    ignored = sorted(set(problem) - set(fields))
    if ignored:
        raise ValueError(f"problem field(s) {ignored} would be ignored by this claim (it reads "
                         f"{', '.join(fields)}); drop them or audit another claim")
    out = dict(problem)
    if "tasks" in out:
        # integers only: int() would read 3.5 as 3 and "3" as 3 (a TOML [3.5] is not a block size)
        tasks = out["tasks"]
        if isinstance(tasks, (str, bytes)) or not isinstance(tasks, (list, tuple)) or not all(
                isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in tasks):
            raise ValueError(f"tasks must be a list of positive integers (the block sizes r_i, e.g. [3, 3]), got "
                             f"{tasks!r}")
        out["tasks"] = tuple(int(r) for r in tasks)
    probe = {"tasks": (1,), "heads": 1, "L": 2, **out, "device": device}
    from numerics.config import ProblemConfig  # torch only when a configuration is audited
    ProblemConfig.from_dict({k: (list(v) if k == "tasks" else v) for k, v in probe.items()})
    if out.get("L") == 1:
        raise ValueError("L = 1: with one context token softmax has no choice (its weight is 1 whatever the logits), "
                         "so the QK weights get no gradient and none of the claims' dynamics exist; give L >= 2")
    return out


@dataclass
class Context:
    """What ``evaluate`` gets: the resolved profile dataclass ``p`` (the researcher's problem
    already laid over it when the spec knows how), its name, the raw ``problem`` (None for a
    profile run), device, seed and a progress sink."""

    p: Any
    profile: str
    problem: Optional[dict]
    device: str = "cpu"
    seed: int = 0
    progress: Progress = no_progress


@dataclass
class Outcome:
    """What a claim's ``evaluate`` returns: its comparisons (``Comparison``), the
    headline rows (dicts of :class:`~HeadlineRow`; default one per comparison),
    figures, details, ``undecided`` (why the run could not decide the claim, or None) and
    ``headline_comparison``: the name of the comparison that is the claim's headline (the one
    whose resolving power is the claim's, ``details["resolving_power"]["headline"]``; None: the
    claim names none, as boundaries do not)."""

    comparisons: list
    headline: Optional[list] = None
    figures: list = field(default_factory=list)
    details: dict = field(default_factory=dict)
    undecided: Optional[str] = None
    theory: Optional[dict] = None
    numerics: Optional[dict] = None
    short_why: bool = False
    headline_comparison: Optional[str] = None


@dataclass(frozen=True)
class ClaimSpec:
    """One claim (or boundary) as data.  ``profiles``: {name: frozen dataclass};
    ``plan(ctx, results) -> [Need]``: what it needs computed (numerics.engine), asked again with
    the results until it asks for nothing new; ``compare(ctx, results) -> Outcome``: its
    comparisons, a pure function of the results; ``evaluate(ctx) -> Outcome``: the one other
    way, for the audit of handed weights (claims.audit), whose measurements are of the
    handed model itself; ``resolve(p, problem) -> p``: the researcher's problem laid over a
    profile (None: problems are refused); ``fields``: the problem fields it reads;
    ``cannot_run(problem) -> reason or None``: a configuration the claim cannot build its
    experiment for, decided before any run; ``findings(result) -> [Finding]``: the template of its sentences, from the result's own
    numbers; ``reads_sweep``: whether its trained runs may come from a sweep store
    (``--from-sweep``); ``paper``: what the paper states, one line in its own terms (a paper
    claim's; None for a boundary), printed beside the number the claim tests."""

    id: str
    title: str
    statement: str
    profiles: dict
    evaluate: Optional[Callable[[Context], Outcome]] = None
    kind: str = "claim"
    resolve: Optional[Callable[[Any, dict], Any]] = None
    fields: tuple = PROBLEM_FIELDS
    cannot_run: Optional[Callable[[dict], Optional[str]]] = None
    findings: Optional[Callable[[ClaimResult], list]] = None
    reads_sweep: bool = False
    plan: Optional[Callable[[Context, Optional[dict]], list]] = None
    compare: Optional[Callable[[Context, dict], Outcome]] = None
    paper: Optional[str] = None

    def profile(self, profile, problem: Optional[dict] = None):
        """The profile dataclass for a name (or a dataclass given directly), problem laid over it."""
        if isinstance(profile, str):
            if profile not in PROFILES or profile not in self.profiles:
                raise ValueError(f"profile must be one of {tuple(self.profiles)}, got {profile!r}")
            p = self.profiles[profile]
        else:
            p = profile
        if problem:
            if self.resolve is None:
                raise ValueError(f"{self.id} runs at its profiles' configurations only; drop the problem fields")
            p = self.resolve(p, problem)
        return p

    def run(self, profile="quick", device="cpu", seed=0, progress: Progress = no_progress, sweep=None,
            problem=None) -> ClaimResult:
        return run_spec(self, profile, device, seed, progress, sweep, problem)


def context(spec: ClaimSpec, profile="quick", device="cpu", seed=0, progress: Progress = no_progress,
            problem=None) -> Context:
    """The claim's Context: the researcher's problem parsed and laid over the profile."""
    parsed = check_problem(problem, device, spec.fields)
    if parsed and spec.cannot_run is not None:
        reason = spec.cannot_run(parsed)
        if reason:
            raise ValueError(f"{spec.id} cannot run at this configuration: {reason}")
    p = spec.profile(profile, parsed)
    return Context(p=p, profile=profile if isinstance(profile, str) else "custom", problem=parsed,
                   device=device, seed=int(seed), progress=progress)


def run_plan(spec: ClaimSpec, ctx: Context, engine) -> dict:
    """The results of the claim's plan: ``spec.plan(ctx, results)`` asked again with what has been
    computed until it asks for nothing new (a plan whose later needs depend on earlier results,
    e.g. a continuation of a run that left the allocated set)."""
    results = Results()
    while True:
        wanted = [n for n in spec.plan(ctx, results) if n not in results]
        if not wanted:
            return results
        results.update(engine.run(wanted))


def run_spec(spec: ClaimSpec, profile="quick", device="cpu", seed=0, progress: Progress = no_progress,
             sweep=None, problem=None) -> ClaimResult:
    """The one runner (module docstring)."""
    if isinstance(profile, str):
        spec.profile(profile)    # an unknown profile name is a bad argument, raised at once

    def body() -> ClaimResult:
        if sweep is not None and not spec.reads_sweep:
            raise ValueError(f"{spec.id} reads no sweep (its runs are not trained models); run it without --from-sweep")
        ctx = context(spec, profile, device, seed, progress, problem)
        from numerics import experiments  # torch only when a claim runs
        with experiments.store(sweep) as store:
            if spec.plan is not None:
                engine = Engine(seed=ctx.seed, store=store, progress=progress)
                results = run_plan(spec, ctx, engine)
                out = spec.compare(ctx, results)
                used = None if store is None else sum(engine.key(n) in engine.stored_ids for n in results)
            else:
                out = spec.evaluate(ctx)
                used = store.used if store is not None else None
        progress(f"{spec.id}: done", 1.0)
        return finished(spec, ctx, out, used)

    result = run_claim(spec.id, spec.title, spec.statement, body, kind=spec.kind)
    result.paper = spec.paper
    return result


def finished(spec: ClaimSpec, ctx: Context, out: Outcome, used: Optional[int] = None) -> ClaimResult:
    """The ClaimResult of an Outcome: judged once (:func:`build_result`), with its findings."""
    details = {"profile": ctx.profile, "seed": ctx.seed, **out.details}
    if used is not None:
        details["sweep_runs"] = int(used)
    if out.undecided:
        details["undecided"] = out.undecided
    result = build_result(spec, out, details)
    if spec.findings is not None:
        result.findings = [f for f in spec.findings(result) if f is not None]
        for f in result.findings:
            if f.kind not in FINDING_KINDS:
                raise ValueError(f"{spec.id}: finding kind {f.kind!r} is not one of {FINDING_KINDS}")
    return result


def build_result(spec: ClaimSpec, out: Outcome, details: dict) -> ClaimResult:
    """The one constructor of a ClaimResult from an Outcome: the verdict from
    :func:`judge` (all comparisons agree, every perturbation rejected, nothing
    undecided), theory/numerics/tolerance keyed by comparison name, the worst case, every
    comparison's summary in ``details`` and the summary of their resolving powers
    (``details["resolving_power"]``: headline, best, worst, by units, blind;
    :func:`resolving_summary`) read off those summaries.  Each printed resolving power is
    confirmed against its comparison's own error function (:func:`unconfirmed_power`); one
    that is not is said in the comparison's ``power_unconfirmed`` and, where every comparison agrees
    (a disagreement decides without it), makes the run an ``error`` of the check (a number it
    printed is wrong), the reason in ``details["fault"]``."""
    comps = out.comparisons
    perts = [p for c in comps for p in c.perturbations]
    whys = {c.why.split(" (")[0] if out.short_why else c.why for c in comps}
    summaries = [c.summary() for c in comps]
    undecided = out.undecided or (None if comps else "no comparison was made")
    faults = []
    for c, s in zip(comps, summaries):
        s["power_unconfirmed"] = unconfirmed_power(c, s["resolving_power"])
        if s["power_unconfirmed"] and all(c.agrees for c in comps):   # a disagreement decides without it
            faults.append(f"the resolving power printed for {c.name!r} is not confirmed: {s['power_unconfirmed']}")
    fault = "; ".join(faults) or None
    verdict = judge(all(c.agrees for c in comps), perts, spec.kind, undecided, fault)
    if fault:
        details = {**details, "fault": fault}
    return ClaimResult(
        id=spec.id, title=spec.title, statement=spec.statement, verdict=verdict, kind=spec.kind,
        theory=out.theory if out.theory is not None else {c.name: c.predicted for c in comps},
        numerics=out.numerics if out.numerics is not None else {c.name: c.measured for c in comps},
        tolerance={"value": {c.name: c.tolerance for c in comps}, "why": "; ".join(sorted(whys))},
        details={**details, "worst": worst(comps),
                 "resolving_power": resolving_summary(summaries, out.headline_comparison if comps else None),
                 "comparisons": summaries},
        figures=out.figures, perturbations=perts,
        headline=out.headline if out.headline is not None else [headline_row(c) for c in comps])


CONFIRM_BELOW = 0.5
"""The probe from below of a printed resolving power (:func:`unconfirmed_power`): the prediction moved by
CONFIRM_BELOW x the power must still be accepted, so that the printed number never overstates the
smallest error the comparison rejects by more than a factor 1 / CONFIRM_BELOW (nor understates it by more
than EDGE_MARGIN: the edge probe)."""


def unconfirmed_power(c, printed: Optional[dict] = None) -> Optional[str]:
    """Why the resolving power printed for the comparison ``c`` (``printed``: what claims.json holds,
    default its summary's) is not confirmed by the comparison's own error function and tolerance; None
    when it is.  Confirmed: in each direction ``c`` sees, a power of 0 is the prediction itself rejected
    (``c`` disagrees); a power eps > 0 moved by EDGE_MARGIN x eps is rejected, and moved by CONFIRM_BELOW
    x eps is not (unless eps is printed as a bound: ``bound``); a count k: moved by k rejected, by k - 1
    not.  :func:`build_result` calls this on every comparison, so a resolving power computed wrong, or
    changed after its edge probes were built, turns the claim's verdict into ``error`` with this reason (``details["fault"]``)."""
    power = c.summary()["resolving_power"] if printed is None else printed
    if not power:
        return None
    if c.error_function is None:
        return "it was set without the error function that could confirm it"
    if c.agrees and any(power.get(k) == 0.0 for k in SEES.get(c.side, ())):
        return "it is 0 (the prediction itself rejected), yet the comparison agrees"
    args = (c.error_function, c.measured, c.predicted, c.tolerance_function, power, c.side)
    try:
        above = [p.description for p in edge_probes(*args) if not p.rejected and p.details.get("eps") is not None]
        below = [p.description for p in edge_probes(*args, margin=CONFIRM_BELOW) if p.rejected]
    except (TypeError, ValueError, IndexError, KeyError, ArithmeticError) as exc:
        return f"its probes could not be computed ({type(exc).__name__}: {exc})"
    if above:
        return f"it is too small: a wrong prediction beyond it is accepted ({above[0]})"
    if below:
        return f"it is too large: a wrong prediction well inside it is already rejected ({below[0]})"
    return None


def resolving_summary(comparisons: list, headline: Optional[str] = None) -> dict:
    """The per-claim summary of the comparisons' resolving powers (``details["resolving_power"]``):
    ``headline`` (the claim's headline comparison, named by its evaluate: name, low, high, units,
    eps = ``claims.core.seen_eps``, ``meets_floor`` against ``claims.core.RESOLVING_FLOOR`` for relative units,
    None otherwise); ``best`` and ``worst`` (smallest and largest eps, each {name, eps, units}) over
    the relative-unit comparisons, or over those of the commonest unit where none is relative;
    ``by_units`` the same per unit; ``blind`` the comparisons with a numeric prediction that cannot
    see a direction they claim to (no resolving power there)."""
    comparisons = [c if isinstance(c, dict) else {"name": c.name, "side": c.side, "resolving_power": c.resolving_power}
                   for c in comparisons]
    rows, blind = [], []
    for d in comparisons:
        rp = d["resolving_power"]
        if not rp:
            continue
        eps = seen_eps(d)
        if eps is None:
            blind.append(d["name"])
        else:
            rows.append({"name": d["name"], "eps": eps, "units": rp["units"]})
    by_units = {}
    for u in RESOLVING_UNITS:
        rs = [r for r in rows if r["units"] == u]
        if rs:
            by_units[u] = {"best": min(rs, key=lambda r: r["eps"]), "worst": max(rs, key=lambda r: r["eps"]),
                           "n": len(rs)}
    main = by_units.get("relative") or (max(by_units.values(), key=lambda v: v["n"]) if by_units else None)
    head = None
    if headline is not None:
        hit = [c for c in comparisons if c["name"] == headline]
        if not hit:
            raise ValueError(f"headline comparison {headline!r} is not among the comparisons")
        d = hit[0]
        rp, eps = d["resolving_power"] or {}, seen_eps(d)
        head = {"name": d["name"], "low": rp.get("low"), "high": rp.get("high"), "units": rp.get("units"),
                "eps": eps, "side": d["side"],
                "meets_floor": (None if rp.get("units") != "relative" else bool(eps is not None
                                                                                  and eps <= RESOLVING_FLOOR))}
    return {"headline": head, "best": main["best"] if main else None, "worst": main["worst"] if main else None,
            "floor": RESOLVING_FLOOR, "by_units": by_units, "blind": blind}


# ---------------------------------------------------------------------------------------
# findings: sentences from a result's own numbers
# ---------------------------------------------------------------------------------------

def fmt(x, se=None) -> str:
    """A number for a sentence: 4 significant digits, '± se' (2 digits) when given."""
    if x is None:
        return "n/a"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    if isinstance(x, str):
        return x
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x.is_integer() and abs(x) < 1e9 and se is None:
        return str(int(x))
    s = f"{x:.4g}"
    return s if se is None or not math.isfinite(float(se)) else f"{s} ± {float(se):.2g}"


def finding(result: ClaimResult, kind: str, template: str, **numbers) -> Finding:
    """A Finding whose text is ``template.format(**formatted numbers)``: each number is a value
    or a (value, se) pair; the sentence and ``numbers`` come from the same values."""
    vals, text_vals = {}, {}
    for k, v in numbers.items():
        value, se = (v if isinstance(v, tuple) else (v, None))
        vals[k] = {"value": jsonable(value), "se": jsonable(se)}
        text_vals[k] = fmt(value, se)
    return Finding(claim=result.id, kind=kind, text=template.format(**text_vals), numbers=vals)


_ANY = object()


def comparisons_where(result: ClaimResult, config=_ANY, **fields) -> list[dict]:
    """The comparison summaries (``details["comparisons"]``, in their order) whose structured
    fields are the given values: ``config`` the summary's own config label, every other keyword
    a key of its ``details`` (set where the comparison is built, e.g. ``role="step rate"``,
    ``L=64``), compared by equality; a summary without the key does not match.  Findings find
    their comparisons so, never by parsing names."""
    if not fields and config is _ANY:
        raise ValueError("comparisons_where needs at least one field to match")
    missing = object()
    return [c for c in result.details.get("comparisons", [])
            if (config is _ANY or c.get("config") == config)
            and all(c.get("details", {}).get(k, missing) == v for k, v in fields.items())]


def agreement(comparison: dict) -> str:
    """The finding kind of one comparison summary: "holds" if it agrees, else "stops"."""
    return "holds" if comparison["agrees"] else "stops"


def replace_fields(p, problem: dict, keys: tuple):
    """``p`` with the problem's values for ``keys`` (the profile fields named like ProblemConfig's)."""
    return dataclasses.replace(p, **{k: (tuple(problem[k]) if k == "tasks" else problem[k])
                                     for k in keys if k in problem})


def with_problem(p, problem: dict):
    """The profile ``p`` with the researcher's problem laid over it whole (its sorted items: ``p.problem``)."""
    return dataclasses.replace(p, problem=tuple(sorted(problem.items())))


def theory_need(fn: str, *args):
    """A theory value ``fn(*args)`` (``numerics.experiments.theory_value``), as a need of a claim's plan."""
    return need("theory", fn=fn, args=tuple(tuple(a) if isinstance(a, list) else a for a in args))


# ---------------------------------------------------------------------------------------
# what the claims on trained full models share (claims 5, 6, boundary-left-allocation)
# ---------------------------------------------------------------------------------------

def default_schedule():
    """The TrainingSchedule defaults (explore + polish, held-out size): imported when a profile is made, so that
    ``claims.core`` loads without torch (reports.build and reports.audit check their arguments before it)."""
    from numerics.experiments.converged import TrainingSchedule
    return TrainingSchedule()


@dataclass(frozen=True)
class TrainedProfile:
    """The profile of claims 5 and 6: the trained family, the bridge and the large-L rows."""
    cases: tuple = (((2, 2), 0.0),)        # (tasks, sigma) of the trained models and the limit rows
    train_Ls: tuple = (32, 64)             # context lengths of the trained full models (>= 2 for claim 5's decay)
    schedule: Any = field(default_factory=lambda: default_schedule())   # explore + polish, held-out size
    bridge_elements: int = 2 ** 22         # exact reduced minima at the largest trained L: eval prompts x L
    limit_L: int = 4096                    # the L of the large-L row
    limit_elements: int = 2 ** 24          # its evaluation prompts x L
    fit_elements: int = 2 ** 17            # fit sample of the exact reduced minima (prompts x L)
    limit_fit_prompts: int = 512           # the limit row's fit sample, in prompts (see limit_fit_elements)
    problem: tuple = ()                    # a researcher's ProblemConfig fields (sorted items), if any

    @property
    def limit_fit_elements(self) -> int:
        """Fit sample of the limit row's minima (prompts x limit_L).  A minimum fitted on n prompts
        and measured on fresh ones lies above the true minimum by about p CV^2 / 2n of the loss
        (p fitted parameters, CV the per-prompt loss's coefficient of variation): a bias the
        evaluation's standard error does not see.  fit_elements / limit_L gave the floor of 128
        prompts at L = 4096, where claim 6's gain at (3,3,3), sigma 0.5 came out 2.087 +- 0.011
        against the exact 2.204 (seeds 1-2: 2.165, 2.188); 512 prompts gave 2.194-2.196 on three
        seeds."""
        return max(self.fit_elements, self.limit_fit_prompts * self.limit_L)


SATURATED_OMEGA = 1.0
"""A trained run whose largest |omega| readout exceeds SATURATED_OMEGA sits in the softmax's
saturation regime (2 omega^2 = 2, twice the edge 2 omega^2 = 1 beyond which theory's L -> inf
loss diverges), not at a point of theory's account: the allocated and one-head optima lie
inside the edge (omega* <= 0.71 for r <= 4 at L >= 32).  Seen: one head, tasks (3, 4, 4),
L = 128, sigma 0 (thorough draw) ended at omega ~ 3.2, mu ~ 0.58, loss 6.26 against the
one-head optimum 2.30 (omega* 0.30), still descending.  Decides which theory applies (a
boundary finding), never the agreement itself."""


TAIL_FACTOR = 2.0
"""The part of L * loss (or of the gain) still to come beyond L is bounded by TAIL_FACTOR times
theory.exact's change of it over [L, 4L]: for a correction c L^-p the tail is the change /
(1 - 4^-p), <= 2 for p >= 1/2 (the slowest correction of numerics.evaluate.CORRECTION_POWERS;
measured on theory.exact: the change of L * loss over [4096, 16384] is 0.38x that over
[1024, 4096] at r = 2, p ~ 0.7)."""


def domain(cfg, gain: bool = False) -> dict:
    """Where theory's account applies to a trained model, from the configuration alone (before
    any run): the factored parametrisation (the allocated point is a fixed point of the factored
    metric 2|mu|, which vanishes at mu = 0; the merged flow leaves it for a superposition,
    docs/model.md), the decomposable balanced start theory's flow starts from, and

    - one model (claim 5, boundary-left-allocation): H = m (with H < m some head serves several
      tasks; with H > m the surplus heads idle only at t -> inf, a race at finite t);
    - the gain (claim 6, ``gain``: m heads against one head): m >= 2 (with one task the gain
      is 1 = H, nothing can be told apart)."""
    reasons = ["m = 1: one task, the gain is 1 = H, nothing to tell apart"] if gain and cfg.m < 2 else []
    if cfg.param != "factored":
        reasons.append(f"param={cfg.param}: the allocated point is a fixed point of the factored metric only"
                       + ("" if gain else " (the merged flow ends in a superposition, docs/model.md)"))
    if cfg.init != "decomposable":
        reasons.append(f"init={cfg.init}: theory's flow starts decomposable and balanced")
    if not gain and cfg.heads < cfg.m:
        reasons.append(f"H={cfg.heads} < m={cfg.m}: some head serves several tasks, not the allocated point")
    if not gain and cfg.heads > cfg.m:
        reasons.append(f"H={cfg.heads} > m={cfg.m}: surplus heads idle only at t -> inf (a race at finite t)")
    conditions = ("m >= 2, factored parametrisation, decomposable balanced start; both trained runs converged and "
                  "the m-head run ended allocated" if gain else "factored parametrisation, decomposable balanced "
                  "start, H = m; the run converged (held-out loss no longer falling) and ended allocated")
    return {"inside": not reasons, "reasons": reasons, "conditions": conditions}


def configurations(p, device: str = "cpu") -> list[tuple]:
    """The trained family of claims 5 and 6 at the profile ``p``: each profile case (tasks, sigma) with H = m heads
    at the profile's train_Ls, or the researcher's problem at L and 2L."""
    from numerics.config import ProblemConfig  # torch only when a claim runs: claims.core loads without it
    if p.problem:
        base = ProblemConfig.from_dict({**dict(p.problem), "device": device})
        return [(base, (base.L, 2 * base.L))]
    return [(ProblemConfig(tasks=tuple(t), heads=len(t), L=p.train_Ls[0], sigma=s, device=device), p.train_Ls)
            for t, s in p.cases]


def trained_need(cfg, schedule):
    """The converged run of ``cfg`` by ``schedule``.  Its prompt stream is named by the problem
    (tasks, sigma, L) and not by the head count: claim 6's m-head and one-head runs of a problem
    see the same prompts (common random numbers, for the paired gain), and every claim that
    trains the problem at one schedule asks for the same run."""
    return need("converged", cfg=cfg, schedule=schedule,
                stream=("trained run", tuple(cfg.tasks), float(cfg.sigma), int(cfg.L)))


def minima_need(tasks, sigma: float, L: int, elements: int, fit_elements: int, device: str, stream: tuple):
    """(allocated, one head): the Monte-Carlo minima of the exact reduced loss at L on one
    evaluation sample (``numerics.exact_reduced.reduced_minima``)."""
    return need("reduced_minima", tasks=tuple(tasks), sigma=float(sigma), L=int(L), elements=int(elements),
                fit_elements=int(fit_elements), device=str(device), stream=stream)


def bridge_need(p, tasks, sigma, L, device):
    """The exact reduced minima at the largest trained L (the bridge of claims 5 and 6)."""
    return minima_need(tasks, sigma, L, p.bridge_elements, p.fit_elements, device, ("bridge", tasks, sigma))


def limit_need(p, tasks, sigma, device):
    """The exact reduced minima at limit_L (the limit row of claims 5 and 6)."""
    return minima_need(tasks, sigma, p.limit_L, p.limit_elements, p.limit_fit_elements, device,
                       ("limit", tasks, sigma))



def run_tolerance(run) -> Tolerance:
    """The tolerance of the comparison a trained run's held-out loss feeds first (claim 5's
    :func:`check_trained_loss`, less theory's quadrature bound of ~1e-12): Z_SE standard errors
    of the held-out loss + the SGD step's excess left after polishing, from the run's own
    numbers before any comparison."""
    return Tolerance((noise_term(run["se"], "the held-out loss", f"{run['n']} fresh prompts"),
                      term("the SGD step's excess left after polishing (from the run's own explore/polish losses)",
                           run["step_error"])))


def run_status(cfg, run, inside: dict, outside_sides: bool = False, tolerance: float | None = None) -> tuple[str, int]:
    """(status, sign) of a converged run (``numerics.experiments.converged``): "inside", or the
    boundary it is at with the side theory puts it on (+1: not below the prediction, -1: not
    above it, 0: no side).  Decided from the run's own readout, in this order: outside the
    claim's domain (``inside``, from the configuration alone); saturated (largest |omega| above
    :data:`SATURATED_OMEGA`); left the allocated set for a superposition (``numerics.evaluate``:
    an opposite-sign off-task mu above ALLOCATED_SHARE): -1, a superposition lowers the loss;
    not converged (``numerics.experiments.converged.converged_for`` at ``tolerance``, default
    :func:`run_tolerance`: the loss it could still lose is more than tolerance / Z_SE, or heads
    not yet pruned): +1; else inside, compared two-sidedly.

    ``outside_sides``: outside the domain, a factored decomposable run still has a side (claim
    5's family argument): H < m -> the best model with fewer heads is above the fixed point, and
    an unconverged run further above (+1); H > m -> the family contains the allocated point, so
    a converged run is not above it (-1), while an unconverged one has no side (its surplus
    heads race)."""
    if tolerance is not None:
        tol = float(tolerance)
    elif run.get("descent_left") is None:
        tol = None          # a run handed in without a descent fit is read by its own "converged"
    else:
        tol = run_tolerance(run).value
    from numerics.experiments.converged import converged_for  # torch only when a claim runs
    converged = converged_for(run, math.inf if tol is None else tol)
    if not inside["inside"]:
        status, sign = "outside the domain: " + "; ".join(inside["reasons"]), 0
        if outside_sides and cfg.param == "factored" and cfg.init == "decomposable":
            sign = +1 if cfg.heads < cfg.m else (-1 if converged else 0)
            if sign == 0:
                status += "; not converged (held-out loss still falling): no side of the fixed point"
        return status, sign
    om = float(np.max(np.abs(run["omega"]))) if run.get("omega") is not None else 0.0
    if om > SATURATED_OMEGA:
        return (f"saturated (largest |omega| {om:.2f} > {SATURATED_OMEGA:g}: the softmax's saturation regime, "
                "not a point of theory's account)"), (+1 if cfg.heads < cfg.m else 0)
    alloc = run["allocation"]
    if cfg.heads > 1 and alloc["opposite_sign_share"] > ALLOCATED_SHARE:
        return (f"left the allocated set (an off-task mu of opposite sign, share {alloc['opposite_sign_share']:.2f} "
                f"> {ALLOCATED_SHARE:g}: a superposition)"), -1
    if not converged:
        left = run.get("descent_left")
        if left is None or tol is None:
            return "not converged (held-out loss still falling)", +1
        return ("not converged (held-out loss still falling: it could still lose "
                f"{left:.3g} against tolerance / {Z_SE:g} = {tol / Z_SE:.3g})"), +1
    if cfg.heads > 1 and not alloc["allocated"]:
        return ("not converged (heads not yet pruned: off-task share "
                f"{alloc['same_sign_share']:.2f})"), +1
    return "inside", 0


def check_trained_loss(cfg, run, predicted: dict, name: str, status: tuple,
                       target: str = "the prediction") -> Comparison:
    """A trained run's converged (held-out) loss against theory's exact finite-L loss
    ``predicted`` ({"loss", "error_estimate"}).  Tolerance (fixed before comparing): Z_SE
    standard errors of the held-out loss + the SGD step's excess left after polishing
    (``run["step_error"]``, from the run's own losses) + the quadrature error bound.  Inside
    the domain: |measured - predicted| <= tolerance, perturbations prediction x1.1 and /1.1.
    Outside: the one-sided boundary check on theory's side (``status``), no perturbation; with
    no side, the check that the model learned something (below the zero model's loss sum r_i,
    at Z_SE standard errors)."""
    meas, pred = run["loss"], predicted["loss"]
    terms = run_tolerance(run).terms + (term("theory's quadrature error bound", predicted["error_estimate"]),)
    st, sign = status
    details = {"run": run.to_dict() if hasattr(run, "to_dict") else run, "prediction": predicted, "status": st}
    if st == "inside":
        return compare(name, meas, pred, Tolerance(terms), wrong=off_by(1.1, pred), details=details,
                       config=config_label(cfg))
    if sign == 0:
        bound, side = "below the zero model's loss sum r_i", "not above"
        pred, terms = float(sum(cfg.tasks)), terms[:1]
    else:
        side = "not below" if sign > 0 else "not above"
        bound = f"{side} {target}"
    details["boundary_check"] = bound
    return compare(f"{name} [boundary: {st.split(':')[0].split(' (')[0]}]", meas, pred,
                   Tolerance(terms, f"boundary finding ({st}); check: {bound}"), side=side, details=details,
                   config=config_label(cfg))


def trained_name(cfg, label: str | None = None) -> str:
    """The trained rows' name of a run's :func:`check_trained_loss` (``label``: which model of the pair, claim 6)."""
    return f"converged loss of trained full model{f' ({label})' if label else ''}, tasks={list(cfg.tasks)}, L={cfg.L}, " \
        f"sigma={cfg.sigma:g}"


def check_large_L(name: str, measured: float, se: float, se_what: str, limit: float, change: float,
                  quantity: str, wrong, details: dict, quadrature: float = 0.0) -> Comparison:
    """A Monte-Carlo measurement at a large L (standard error ``se``) against theory's L -> inf
    ``limit``.  Tolerance: Z_SE standard errors (of ``se_what``) + theory's approximation error at L, the part of
    the ``quantity`` still to come beyond L, TAIL_FACTOR x |``change``| (theory.exact's change of
    it over [L, 4L]: exact theory, never from the limit, so a wrong limit cannot widen its own
    tolerance) + ``quadrature`` (theory.exact's quadrature bound, where it enters)."""
    tail = TAIL_FACTOR * abs(change)
    tol = Tolerance((noise_term(se, se_what),
                     term(f"theory's approximation error at L: the part of {quantity} still to come beyond L, "
                          f"{TAIL_FACTOR:g} x theory.exact's change over [L, 4L]", tail))
                    + ((term("theory's quadrature bound", quadrature),) if quadrature else ()))
    return compare(name, measured, limit, tol, wrong=wrong, details={**details, "tail": tail})


def case_figure(name: str, title: str, points: dict, measured: str, theory: str, **figure) -> Figure:
    """Per case of ``points`` ({(tasks, sigma): [(x, measured, theory), ...]}) the measured points
    and theory's line; ``figure``: the other Figure fields."""
    curves = []
    for (tasks, sigma), rows in points.items():
        x, case = [r[0] for r in rows], f"tasks={list(tasks)} sigma={sigma:g}"
        curves += [(f"{measured}, {case}", x, [r[1] for r in rows], "points"),
                   (f"{theory}, {case}", x, [r[2] for r in rows], "line")]
    return lines_figure(name, title, curves, **figure)


# ---------------------------------------------------------------------------------------
# what the initialisation boundaries and the atlas share
# ---------------------------------------------------------------------------------------

FIELDS = ("tasks", "heads", "L", "sigma")
"""The problem fields both initialisation boundaries read (their profiles' own names)."""


def fields_config(ctx):
    """The problem of an initialisation boundary's profile: its :data:`FIELDS` on the context's device."""
    from numerics.config import ProblemConfig  # torch only when a claim runs
    p = ctx.p
    return ProblemConfig(tasks=p.tasks, heads=p.heads, L=p.L, sigma=p.sigma, device=ctx.device)
PHASES = {"warmup_end": "warm-up", "emergence_end": "emergence"}


def guard_needs(lr: float, parts) -> list:
    """The stability guard of each of ``parts`` ((label, cfg) pairs) at the step ``lr``
    (numerics.experiments.phases.unstable_need: the full model's Hessian, asked beyond d = 9 only)."""
    from numerics.experiments.phases import unstable_need   # the phase experiments: the initialisation boundaries' alone
    return [unstable_need(cfg, lr) for _, cfg in parts]


def not_run(lr: float, parts, results) -> str | None:
    """Why none of the runs of ``parts`` ((label, cfg) pairs) is trained (None: they are): the step ``lr`` at
    or past the full model's stability bound at every part's cfg (:func:`guard_needs`' values in ``results``),
    where no run is evidence either way.  Where only some parts are past it, all are
    trained and each run reported as it ends (diverged included): the paper profile's unbalanced starts, (4,4,4)
    at lr 0.05 against 2/lambda = 0.020, beside random starts that are not.  At the authors' blocks (16,17,17),
    H = 3, L = 100 the two boundaries' lr 0.1 lies past 2/lambda = 0.0017 (logit scale 1) and 0.0123 (the
    authors' 7.28): trained anyway every unbalanced start, every random start at s0 = 0.3
    and every race cell diverged, and no outcome was decided (boundary-initialisation: 14 CPU-min)."""
    why = [f"{label}: {w}" for (label, _), g in zip(parts, guard_needs(lr, parts)) if (w := results[g])]
    return "; ".join(why) if why and len(why) == len(parts) else None


def guarded_plan(lr: float, parts, results, needs: list) -> list:
    """A plan behind its stability guards: the guards, then (asked with no results, or once the
    guards let the runs be trained: :func:`not_run`) ``needs``."""
    guards = guard_needs(lr, parts)
    if results is not None and (any(g not in results for g in guards) or not_run(lr, parts, results)):
        return guards
    return guards + list(needs)


def independent(states: dict, what: str, shared_stream: bool = False) -> None:
    """numerics.engine.check_independent on the fingerprints of the runs ``states`` (id -> end state)
    a comparison counts as independent (ValueError naming the runs that share their randomness;
    ``shared_stream``: runs on one prompt stream on purpose, their starts checked).  A diverged run
    has no fingerprint and is left out: its class is 'diverged' whatever its seed."""
    check_independent({k: s["fingerprint"] for k, s in states.items() if s["fingerprint"] is not None}, what,
                      shared_stream)


# --- phase times of paired curves, judged as a family; comparisons that have nothing to compare

MIN_UNITS = 3
"""The fewest independent units (prompt streams) a pooled phase comparison judges from: the
standard error of their mean needs two degrees of freedom at least to be an estimate, not a guess."""


def phases_found(ph: dict | None, t) -> tuple[bool, str]:
    """Whether the readout finds the three phases in one run's loss curve (its phase times ``ph``,
    theory.three_phases.PhaseTimes as a dict, on record times ``t``): the three-phases claim's own
    criterion, theory.three_phases.phases_resolved (a drop clear of the noise, a warm-up and an
    emergence each at least one record spacing long, a convergence phase after them, the emergence
    the fastest).  Without a warm-up (a large start) the fit's 10% and 90% crossings are two levels
    of a curve already falling, not the phase ends of the paper's picture, so they are not compared.
    (found, why not)."""
    if ph is None:
        return False, "no loss curve (the run diverged or recorded too few points)"
    from theory.three_phases import PhaseTimes, phases_resolved   # as unstable_need: the initialisation boundaries' alone
    found, why = phases_resolved(PhaseTimes(**ph), np.asarray(t, float))
    return found, why.split(" (rates ")[0]      # the phases' mean rates: in the run's phase times


def phase_comparisons(name: str, pairs: list[dict], spacing: float, reference: str, config=None,
                      measured: str = "full model") -> list:
    """The warm-up and emergence ends of measured curves against reference curves on the same
    prompts, one comparison per phase, each judged as a family by a rule fixed before the runs.
    ``pairs``: {"where", "group", "unit", "measured", "reference", "t"} (phase-time dicts, the
    record times; ``unit``: the prompt stream, the independent unit).

    A pair is compared only where the readout finds the three phases in both curves
    (:func:`phases_found`); every other pair is listed with the reason, never counted as agreement.
    The rule: per unit the mean of (measured - reference) over its compared pairs (pairs sharing a
    stream are correlated: common random numbers), then the mean d over units and its standard
    error se; agreement when |d| <= 2 record spacings + Z_SE se (2 spacings: each crossing time is
    interpolated between records, so each is resolved to one spacing; Z_SE se: the seeds' spread).
    One seed far off moves d by its miss / n and widens se: no verdict turns on one seed.  Wrong
    prediction through the same comparison: the reference's phase times 50% longer (d predicted
    at half their mean).  Fewer than :data:`MIN_UNITS` units compared: not compared (undecided)."""
    found, skipped = [], []
    for p in pairs:
        (ok_m, why_m), (ok_r, why_r) = phases_found(p["measured"], p["t"]), phases_found(p["reference"], p["t"])
        if ok_m and ok_r:
            found.append(p)
        else:
            why = "; ".join(f"{what}: {w}" for what, ok, w in ((measured, ok_m, why_m), (reference, ok_r, why_r))
                            if not ok)
            skipped.append({"where": p["where"], "group": p["group"], "why": why})
    return [_pooled_phase(f"{name}: {PHASES[key]} end, mean over seeds of ({measured} - {reference})", key, found,
                          skipped, spacing, reference, config) for key in PHASES]


def _pooled_phase(label: str, key: str, found: list, skipped: list, spacing: float, reference: str, config):
    """One phase's family comparison (:func:`phase_comparisons`)."""
    units: dict = {}
    for p in found:
        units.setdefault(p["unit"], []).append((p["measured"][key], p["reference"][key]))
    diffs = [float(np.mean([a - b for a, b in v])) for v in units.values()]
    refs = [float(np.mean([b for _, b in v])) for v in units.values()]
    details = {"role": "phase times", "phase": key, "compared": len(found), "units": len(units),
               "pairs": [{"where": p["where"], "unit": p["unit"], "measured": p["measured"][key],
                          "reference": p["reference"][key]} for p in found], "not_compared": skipped}
    rule = ("the rule fixed in advance: per prompt stream the mean difference, then their mean d; compared where the "
            "readout finds the three phases in both runs")
    spacings = term("2 record spacings (each crossing is resolved to one spacing)", 2.0 * spacing)
    if len(units) < MIN_UNITS:
        why = (f"the three phases found in both runs on {len(units)} prompt stream(s), fewer than {MIN_UNITS}"
               + (f" (e.g. {skipped[0]['where']}: {skipped[0]['why']})" if skipped else ""))
        rule += f"; agree when |d| <= {spacings[0]} {spacings[1]:.3g} + {Z_SE:g} standard errors of d"
        return Comparison(name=label, measured=None, predicted=0.0, error=0.0, tolerance=0.0, why=rule, config=config,
                          perturbations=[perturbation(f"the {reference}'s phase times 50% longer", 0.0, 0.0)],
                          details={**details, "compared": 0, "cannot_decide": "not compared: " + why})
    d, se = mean_se(diffs)
    tol = Tolerance((spacings, noise_term(se, f"d over {len(units)} prompt streams")), rule)
    return compare(label, d, 0.0, tol, se=se, units="absolute", config=config,
                   wrong=[(f"the {reference}'s phase times 50% longer", 0.5 * float(np.mean(refs)))], details=details)


def phase_rows(comps: list) -> list:
    """The headline rows of a family of phase comparisons (:func:`phase_comparisons`): each
    phase's pooled difference (a reported row saying why where nothing was compared), then per
    group (an init scale, a start) the runs not compared and why."""
    rows = [headline_row(c) if c.details["compared"] else reported_row(f"{c.name}: {c.details['cannot_decide']}",
                                                                      config=c.config) for c in comps]
    by_group: dict = {}
    for s in comps[0].details["not_compared"]:
        by_group.setdefault(s["group"], []).append(s)
    for group, skipped in by_group.items():
        rows.append(reported_row(f"{group}: phase times not compared in {len(skipped)} run(s) (not counted as "
                                 f"agreement): {skipped[0]['why']}", len(skipped), config=comps[0].config))
    return rows


def phase_finding(result, what: str):
    """The sentence of a family of phase comparisons (:func:`phase_comparisons`, found in the
    result by ``role="phase times"``): on how many runs and streams the readout found the three
    phases in both, the pooled differences against the rule's tolerances, and the runs not
    compared with one reason.  None where the result holds no such family."""
    comps = {c["details"]["phase"]: c for c in comparisons_where(result, role="phase times")}
    if not comps:
        return None
    w, e = comps["warmup_end"], comps["emergence_end"]
    skipped = w["details"]["not_compared"]
    rest = (" The other {k} runs are not compared, never counted as agreement (e.g. " + skipped[0]["where"] + ": "
            + skipped[0]["why"].replace("{", "{{").replace("}", "}}") + ")." if skipped else "")
    if not w["details"]["compared"]:
        return finding(result, "beyond", what + ": the phase times are "
                       + w["details"]["cannot_decide"].replace("{", "{{").replace("}", "}}") + "." + rest, k=len(skipped))
    return finding(result, "beyond", what + ": where the readout finds the three phases in both runs ({n} runs on {u} "
                   "prompt streams), the full model's phase ends minus the reduced flow's average {dw} (warm-up) and "
                   "{de} (emergence) over the streams, against the rule's tolerances {tw} and {te} (2 record spacings + "
                   "4 standard errors): " + ("they agree." if w["agrees"] and e["agrees"] else "they differ.") + rest,
                   n=w["details"]["compared"], u=w["details"]["units"], dw=(w["measured"], w["se"]),
                   de=(e["measured"], e["se"]), tw=w["tolerance"], te=e["tolerance"], k=len(skipped))


def nothing_compared(comps: list) -> str | None:
    """Why the comparisons cannot decide (None when each decides): a comparison's own
    ``details["cannot_decide"]``, or an outcome comparison with no outcome decided."""
    why = []
    for c in comps:
        d = c.details
        if d.get("cannot_decide"):
            why.append(f"{c.name}: {d['cannot_decide']}")
        elif d.get("decided", 1) == 0:
            why.append(f"{c.name}: no outcome decided (data seeds disagree, a tied start, or a race not ended)")
    return "; ".join(why) or None


def outcome_comparison(name: str, outcomes: list, why: str, wrong: tuple, details: dict,
                       config=None) -> Comparison:
    """Discrete outcomes (winners) compared exactly: ``outcomes`` are the decided (measured,
    predicted) pairs, error = the number of pairs where they differ, tolerance 0 (an outcome
    is discrete; the undecided ones are counted by the caller, never compared); measured =
    the number where they agree, predicted = the number decided.  ``wrong``: (description,
    function of a predicted outcome -> another one), sent through the same count.  No pair
    decided: error 0 and the perturbation not rejected (undecided)."""
    differ = lambda swap: float(sum(m != swap(p) for m, p in outcomes))  # noqa: E731 - the one comparison
    description, swap = wrong
    return Comparison(name=name, measured=len(outcomes) - int(differ(lambda p: p)), predicted=len(outcomes),
                      error=differ(lambda p: p), tolerance=0.0, why=why, details=details, config=config,
                      perturbations=[perturbation(description, differ(swap), 0.0)])


# --- where the seeds of a start end: counted classes, and the share a theory predicts

ALLOCATION = ("allocated", "mixed")
"""The classes of the paper's picture from a balanced small start: allocated, or heads still
sharing a task with one sign (``mixed``: the race not ended by t_end; under the factored metric
the loser's mu decays like 1/t, so the limit is allocated).  A superposition, an end off D or a
divergence is outside it."""


def decided(states: list) -> list:
    """The seeds whose end state has a class to compare: converged (or diverged, an end state
    too); a seed still converging says nothing about where it ends."""
    return [s for s in states if s["class"]["name"] != "not converged"]


def share_comparison(name: str, k: int, n: int, predicted: float, why: str, wrong: tuple, config=None,
                     details=None) -> Comparison:
    """The share k / n of seeds in a class against a predicted share, through the seeds' own
    binomial interval: [lo, hi] = numerics.evaluate.binomial_interval(k, n, Z_SE) (Clopper-
    Pearson: a true share lies outside it with probability at most 6e-5, the report's Z_SE
    policy).  Error |k/n - p|, tolerance the interval's reach on the side of the prediction
    (k/n - lo below the share, hi - k/n above it), so the prediction agrees exactly when it lies
    in the interval; the interval is the measurement's alone (a prediction picks a side, it cannot
    widen it).  ``wrong``: (description, share) pairs sent through the same comparison (the other
    class: share 0 for a predicted 1).  Resolving power in absolute share units.  No seed decided
    (n = 0): error 0, every wrong prediction unrejected -- undecided, never located."""
    if n == 0:
        return Comparison(name=name, measured=None, predicted=predicted, error=0.0, tolerance=0.0, why=why,
                          perturbations=[perturbation(d, 0.0, 0.0) for d, _ in wrong], config=config,
                          details={"decided": 0, "count": 0, "n": 0, **(details or {})})
    lo, hi = binomial_interval(k, n, Z_SE)
    share = k / n

    def reach(p):
        return share - lo if p <= share else hi - share

    return compare(name, share, float(predicted), reach,
                   f"{why}; the prediction must lie in the Clopper-Pearson interval [{lo:.3g}, {hi:.3g}] of {k} of "
                   f"{n} seeds ({Z_SE:g}-sigma level)", wrong=wrong, units="absolute",
                   se=math.sqrt(share * (1 - share) / n), config=config,
                   details={"decided": n, "count": k, "n": n, "interval": [lo, hi], **(details or {})})


def share_at_least(name: str, k: int, n: int, least: float, why: str, config=None, details=None,
                   unit: str = "seeds") -> Comparison:
    """A claim that a class is typical -- the true share of seeds in it is at least ``least`` --
    against k of n seeds, one-sided, through their Clopper-Pearson interval [lo, hi] =
    numerics.evaluate.binomial_interval(k, n, Z_SE) (each end a one-sided bound at the report's
    Z_SE level: a true share lies above hi with probability at most 3e-5).  Contradicted when
    hi < ``least``: the seeds exclude a share that large.  Error max(0, least - k/n), tolerance
    hi - k/n: agreement exactly when ``least`` <= hi.  Wrong prediction through the same interval:
    its negation, 'the class is atypical' (share below ``least``), rejected when lo > ``least``;
    where neither is rejected the n seeds cannot tell the two apart, and the comparison says so
    (``details["cannot_decide"]``: 7 of 8 gives [0.17, 1], and even 0 of 8 leaves hi = 0.73, so 8
    seeds can neither contradict a share of 1/2 nor confirm it; 0 of 16 contradicts it, 38 of 48
    confirms it).  No verdict turns on one seed: a share of 1 against 7 of 8 did (error = 1.00003
    x tolerance)."""
    lo, hi = binomial_interval(k, n, Z_SE) if n else (0.0, 1.0)
    share = k / n if n else math.nan
    negation = perturbation(f"its negation: atypical (share below {least:g})", max(0.0, share - least) if n else 0.0,
                            share - lo if n else 0.0)
    out = {"count": k, "n": n, "decided": n, "interval": [lo, hi], "least": least, **(details or {})}
    if n == 0 or (hi >= least and not negation.rejected):
        out["cannot_decide"] = (f"{k} of {n} {unit} (interval [{lo:.3g}, {hi:.3g}] at {Z_SE:g} sigma) can neither exclude "
                            f"a share of at least {least:g} nor its negation")
    if n == 0:
        return Comparison(name=name, measured=None, predicted=least, error=0.0, tolerance=0.0, why=why, config=config,
                          perturbations=[negation], details=out, side="not below")
    c = compare(name, share, float(least), lambda p: hi - share if p > share else 0.0,
                f"{why}; one-sided: contradicted only when the Clopper-Pearson upper bound {hi:.3g} of {k} of {n} "
                f"seeds lies below {least:g} ({Z_SE:g}-sigma level)", side="not below", units="absolute",
                se=math.sqrt(share * (1 - share) / n), config=config, details=out)
    c.perturbations.insert(0, negation)
    return c


def share_phrase(c: dict) -> str:
    """What a :func:`share_at_least` comparison (its summary) decided, in words."""
    least = c["details"]["least"]
    if not c["agrees"]:
        return f"excludes a typical share (at least {least:g}, one-sided)"
    if c["details"].get("cannot_decide"):
        return f"cannot tell a typical share (at least {least:g}, one-sided) from an atypical one"
    return f"makes it typical (a share of at least {least:g}, one-sided; an atypical share is excluded)"


def mix_phrase(mix: dict, key: str = "m") -> tuple[str, dict]:
    """The sentence part naming every class a start's seeds ended in (numerics.experiments.starts.
    outcome_mix), and its numbers: "all 8 seeds end off D (...)" when they share one class, else
    "the 8 seeds end in 2 classes: off D in 5 of 8 (share interval [...]) ...; ..."; each class
    with its loss ratios to the allocated fixed point and the best decomposable point."""
    labels, n = mix["labels"], mix["n"]
    nums, parts = {f"{key}_n": n}, []
    for j, (label, e) in enumerate(labels.items()):
        p = f"{key}{j}"
        nums.update({f"{p}_k": e["count"], f"{p}_lo": e["interval"][0], f"{p}_hi": e["interval"][1],
                     f"{p}_a": (e["over_allocated"], e["over_allocated_se"]), f"{p}_b": (e["over_best"],
                                                                                           e["over_best_se"])})
        refs = [f"{{{p}_{x}}} x the {what}" for x, what, v in (("a", "allocated fixed point", e["over_allocated"]),
                                                                   ("b", "best decomposable point", e["over_best"]))
                if v is not None]
        ratio = ("the loss diverged" if label == "diverged" else
                 "held-out loss " + " and ".join(refs) if refs else "")
        count = "" if len(labels) == 1 else f" in {{{p}_k}} of {{{key}_n}} (share interval [{{{p}_lo}}, {{{p}_hi}}])"
        parts.append(label + count + (", " + ratio if ratio else ""))
    if len(labels) == 1:
        return (f"all {{{key}_n}} seeds end " if n > 1 else f"its {{{key}_n}} seed ends ") + parts[0], nums
    return f"the {{{key}_n}} seeds end in {len(labels)} classes: " + "; ".join(parts), nums


def mix_rows(prefix: str, mix: dict, config=None) -> list:
    """Reported headline rows of a start's class mix: one per class, "k of n" with its interval."""
    return [reported_row(f"{prefix}: {label} (seeds of {mix['n']}; share interval {fmt(e['interval'])})",
                         e["count"], config=config) for label, e in mix["labels"].items()]


def mix_figure(name: str, title: str, mixes: dict, caption: str = ""):
    """A 'mix' figure (reports.render): one stacked bar per start (``mixes``: bar label ->
    outcome_mix), one segment per class label, its count of seeds."""
    labels = []
    for m in mixes.values():
        labels += [k for k in m["labels"] if k not in labels]
    return Figure(name=name, title=title, kind="mix", row_labels=list(mixes), col_labels=labels,
                  matrix=[[float(m["labels"].get(k, {}).get("count", 0)) for k in labels] for m in mixes.values()],
                  xlabel="seeds", caption=caption)
