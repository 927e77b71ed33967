"""Shared vocabulary of the claim checks: what a claim run returns and how it is judged.

A claim check runs an experiment (``numerics``), asks ``theory`` for its prediction,
compares the two at a tolerance that comes from an argument (Monte-Carlo error, O(1/L)
terms, step size) and returns a :class:`ClaimResult`.  The same functions are called by
``tests/`` (on Hypothesis-drawn configurations) and by ``reports/`` (on a profile), so the
two can never disagree.  The report only renders ``ClaimResult`` objects; everything it
shows, figures included, is data computed here.

Every check also runs itself against a *perturbed* prediction (a wrong constant, a wrong
winner, a wrong exponent) and records whether that was rejected at the same tolerance
(:class:`PerturbationCheck`).  A check that cannot reject the perturbation cannot
discriminate: its agreement decides nothing, and its verdict is ``"undecided"``, not ``"pass"``.
``"error"`` means only that the check raised.
"""
from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from numerics.io import jsonable

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
    """The comparison's resolving power (``claims.core.common.Comparison.resolving_power``): the
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
