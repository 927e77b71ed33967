"""The report's page: a ``claims.json`` document to one self-contained HTML page.

Nothing here computes a result.  Every number on the page comes from ``claims.json`` (each
claim's ``claims.base.ClaimResult`` and the run's provenance); this module only chooses what
is shown where and how it is printed, and the markup lives in ``reports/templates`` (jinja2,
autoescaped: a claim's text can never become markup):

- :func:`scorecard`: the first screen, one line per claim id grouped as the paper's claims /
  where they stop / beyond the paper, a failing or contradicted id first in its group with
  the sentence that says by how much; its headline number (:func:`headline_row`: the row a
  claim names with ``details["headline_row"]``, by index or name, else its first row), how
  many of its comparisons agree, and their resolving power (best and worst).
- :func:`findings_lists`: the sentences behind it (what holds / where it stops / beyond the
  paper), a finding that states a comparison which disagrees marked with its claim's outcome
  (:func:`finding_outcome`).
- :func:`render_html`: the page: scorecard and forest plot (``reports.figures``, drawn from
  this document alone, inline SVG), findings, the run, one section per claim.

Printed precision (:func:`printed`): a measured number with a standard error is printed to
the second significant digit of its se; without one, to a tenth of its tolerance (the finest
digit its comparison resolves: below it, an exact check's residual is rounding, which differs
between CPUs whose BLAS kernels round differently), at most 4 significant digits; anything
else to 4 significant digits.
"""
from __future__ import annotations

import base64
import functools
import math
from pathlib import Path
from typing import Any, Optional

import jinja2

from claims.base import FAILING, kind_from_id
from reports.figures import (FOREST_CLIP, FOREST_FILE, FOREST_MAX_ROWS, scalar, comparison_records, forest_png,
                             forest_rows, forest_svg)
# The figure functions' old home: callers of ``reports.render.figure_png`` and friends keep working
# (they live in reports.figures; patch them there).
from reports.figures import (FIGURE_KINDS, MAX_PANELS, MAX_PIXELS, RenderError, as_figure,  # noqa: F401,E402
                             figure_png, series_colours, size_note)

TEMPLATES = Path(__file__).with_name("templates")
CSS = (TEMPLATES / "report.css").read_text(encoding="utf-8")
"""The page's style sheet (``templates/report.css``, inlined by ``templates/base.html.j2``)."""

# Lists longer than this are shown on the page by their first and last LIST_SHOWN_EDGE values.
LIST_SHOWN_MAX = 40
LIST_SHOWN_EDGE = 8
BADGE_CLASSES = ("pass", "fail", "error", "located", "contradicted", "undecided")
# The headings of the scorecard's groups and of the findings lists.
GROUPS = (("claims", "The paper's claims"), ("stops", "Where they stop"), ("beyond", "Beyond the paper"))
FINDING_HEADINGS = {"holds": "What holds", "stops": "Where it stops", "beyond": "Beyond the paper"}
# Each findings list shows this many sentences open; the rest fold under a count.
FINDINGS_OPEN = 5
SUMMARY_ROWS_MAX = 6
SUMMARY_WHY_MAX = 300  # characters of the tolerance's argument in the short summary
# More perturbation checks than this are folded under a one-line count.
PERTURBATIONS_SHOWN_MAX = 4
# A finding states a comparison when its numbers hold the comparison's measured and predicted
# values: the same floats, written by the same claim (within printing of JSON floats).
SAME_NUMBER = 1e-12
TITLE = "Audit: Training Dynamics of Multi-Head Softmax Attention for In-Context Learning"


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The templates' environment: autoescaped, undefined names an error (a template that
    names a missing value fails in the tests, not silently on a reader's page)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update(value=format_value, seconds=_seconds, anchor=anchor)
    env.globals.update(badge_class=badge_class)
    return env


def render(template: str, **context: Any) -> str:
    """A template of ``reports/templates`` rendered with ``context``."""
    return environment().get_template(template).render(**context)


# --------------------------------------------------------------------------- values


def format_value(v: Any) -> str:
    """A short readable form of a JSON value: 4 significant digits, lists inline."""
    if isinstance(v, bool) or v is None:
        return str(v).lower() if v is not None else "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        if len(v) > LIST_SHOWN_MAX:  # the full list is in claims.json; the page shows its ends
            head = ", ".join(format_value(x) for x in v[:LIST_SHOWN_EDGE])
            tail = ", ".join(format_value(x) for x in v[-LIST_SHOWN_EDGE:])
            return f"[{head}, … ({len(v)} values in claims.json) …, {tail}]"
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {format_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def printed(measured: Any, se: Any = None, tolerance: Any = None) -> str:
    """A measured number at the precision its run resolves: with a standard error, to the
    second significant digit of the se ("0.15751 ± 0.0008"); without one, to a tenth of the
    tolerance and at most 4 significant digits ("< 1e-14" for a rounding residual inside its
    rounding tolerance: those digits differ between CPUs); anything else as
    :func:`format_value` prints it."""
    x = scalar(measured)
    if x is None or isinstance(measured, int) or not math.isfinite(x):
        text = format_value(measured)
        s = scalar(se)
        return text + (f" ± {s:.2g}" if s is not None and math.isfinite(s) and measured is not None else "")
    s, t = scalar(se), scalar(tolerance)
    if s is not None and math.isfinite(s) and s > 0:
        quantum, cap, suffix = 10.0 ** (math.floor(math.log10(s)) - 1), 6, f" ± {s:.2g}"
    elif t is not None and math.isfinite(t) and t > 0:
        quantum, cap, suffix = 10.0 ** math.floor(math.log10(t / 10)), 4, ""
    else:
        return format_value(x)
    if x == 0:
        return "0" + suffix
    digits = math.floor(math.log10(abs(x))) - round(math.log10(quantum)) + 1
    if digits <= 0:
        return (f"≈ 0{suffix}" if suffix else f"< {quantum:g}")
    return f"{x:.{min(digits, cap)}g}{suffix}"


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts to ``{"a.b.c": leaf}``; a list of dicts (e.g. one record per case) to
    ``a[0].b``, ``a[1].b``; other lists stay leaves (shown inline)."""
    if isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        flat: dict[str, Any] = {}
        for k, x in enumerate(d):
            flat.update(flatten(x, f"{prefix}[{k}]"))
        return flat
    if not isinstance(d, dict):
        return {prefix or "value": d}
    flat = {}
    for key, value in d.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if (isinstance(value, dict) and value) or (
                isinstance(value, list) and value and all(isinstance(x, dict) for x in value)):
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


def badge_class(verdict: Any) -> str:
    return verdict if verdict in BADGE_CLASSES else "error"


def _seconds(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def kind_of(entry: dict) -> str:
    """``claim`` or ``boundary`` (an entry written before kinds existed: from its id)."""
    return entry.get("kind") or kind_from_id(entry.get("id", ""))


def group_of(entry: dict) -> str:
    """The scorecard group: ``claims`` (the paper's), ``beyond`` (a boundary all of whose
    findings are of kind "beyond": what the paper does not say), ``stops`` (the other boundaries)."""
    if kind_of(entry) == "claim":
        return "claims"
    kinds = {f.get("kind") for f in entry.get("findings") or [] if isinstance(f, dict)}
    return "beyond" if kinds == {"beyond"} else "stops"


def is_failing(entry: dict) -> bool:
    """Whether the entry's outcome makes the build exit 1 (``claims.base.FAILING``)."""
    return entry.get("verdict") in FAILING.get(kind_of(entry), ())


def anchor(claim_id: str) -> str:
    return "claim-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in str(claim_id))


_anchor = anchor


def _verdict_reason(entry: dict) -> str:
    """Which rule of ``claims.base.judge`` (or of ``run_claim``) gave the verdict."""
    verdict = entry.get("verdict")
    details = entry.get("details") or {}
    reasons = {
        "pass": "theory and numerics agree within the tolerance, and every perturbed prediction was rejected.",
        "fail": "theory and numerics disagree beyond the tolerance (the numbers are below).",
        "located": "the regime was measured conclusively and theory's account of it agrees (the findings say "
                   "where and what happens).",
        "contradicted": "the regime was measured conclusively and theory's account of it disagrees (the numbers "
                        "below say by how much).",
    }
    if verdict in reasons:
        return reasons[verdict]
    if details.get("traceback"):
        return f"the check raised {details.get('error', 'an exception')} before reaching a verdict (traceback below)."
    if details.get("undecided"):
        return f"the measurement could not decide: {details['undecided']}"
    if any(not p.get("rejected") for p in entry.get("perturbations") or [] if isinstance(p, dict)):
        return ("a deliberately wrong prediction was accepted at the same tolerance: the check cannot "
                "discriminate, so its agreement is no evidence.")
    return "the check reported an error (see the details)." if verdict == "error" else "see the details."


# --------------------------------------------------------------------------- headline rows


def _number_text(v: Any) -> str:
    """A headline number: 4 significant digits; a bracket [low, high] as "between low and high"."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return f"between {format_value(v[0])} and {format_value(v[1])}"
    if v is None:
        return "—"
    return format_value(v)


SIDE_WORDS = {"not above": ("≤", "not above"), "not below": ("≥", "not below")}


def _bound(v: Any, side: str) -> Any:
    """The end of a bracket that a one-sided comparison uses."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return v[1] if side == "not above" else v[0]
    return v


def headline_cells(r: dict) -> dict[str, str]:
    """The cells of a headline row, by its side: ``theory``, ``measured`` (± se), ``allowed``
    (the allowed difference) and the outcome mark (``mark``, with its CSS class ``mark_class``).
    Two-sided rows read "|Δ| ≤ tol" with a tick; one-sided rows "≤ theory (not above)" with a
    bound mark (never the two-sided tick); reported rows have no comparison and no tick."""
    side = r.get("side") or "two-sided"
    measured = _number_text(r.get("measured"))
    if r.get("se") is not None and r.get("measured") is not None:
        measured += f" ± {format_value(r.get('se'))}"
    tol = r.get("tolerance")
    agrees = r.get("agrees")
    if side == "reported":
        theory = "—" if r.get("theory") is None else f"{_number_text(r.get('theory'))} (for reference)"
        return dict(theory=theory, measured=measured, allowed="—", mark="reported, no comparison",
                    mark_class="reported")
    if side in SIDE_WORDS:
        sign, words = SIDE_WORDS[side]
        theory = f"{sign} {_number_text(_bound(r.get('theory'), side))} ({words})"
        allowed = "—" if tol is None else (f"Δ ≤ +{format_value(tol)}" if side == "not above"
                                           else f"Δ ≥ −{format_value(tol)}")
        mark, cls = ((f"{words} ✓", "bound") if agrees is True else
                     (f"{'above' if side == 'not above' else 'below'} ✗", "disagree") if agrees is False
                     else ("—", ""))
        return dict(theory=theory, measured=measured, allowed=allowed, mark=mark, mark_class=cls)
    allowed = "—" if tol is None else f"|Δ| ≤ {format_value(tol)}"
    mark, cls = (("yes ✓", "agree") if agrees is True else ("no ✗", "disagree") if agrees is False
                 else ("—", ""))
    return dict(theory=_number_text(r.get("theory")), measured=measured, allowed=allowed, mark=mark,
                mark_class=cls)


def group_by_config(rows: list[dict]) -> list[tuple[Any, list[dict]]]:
    """Rows grouped by their ``config``, in order of first appearance (None first)."""
    groups: dict[Any, list[dict]] = {}
    for r in sorted(rows, key=lambda r: r.get("config") is not None):
        groups.setdefault(r.get("config"), []).append(r)
    return list(groups.items())


def headline_row(entry: dict) -> tuple[Optional[dict], str]:
    """The row a claim names as its headline, and a note when its name is not one of its rows.

    A claim names it with ``details["headline_row"]``: the index of the row in ``headline``
    (an int) or the row's name (a str; the first row of that name).  Without it the first
    headline row is the claim's headline."""
    rows = [r for r in entry.get("headline") or [] if isinstance(r, dict)]
    if not rows:
        return None, ""
    details = entry.get("details") or {}
    named = details.get("headline_row")
    if named is None:
        # the comparison the spec names as its headline (claims.spec.Outcome.headline_comparison,
        # stored as details.resolving_power.headline.name): its row, or the comparison itself
        power = details.get("resolving_power")
        head = power.get("headline") if isinstance(power, dict) else None
        name = head.get("name") if isinstance(head, dict) else None
        if isinstance(name, str):
            for r in rows:
                if r.get("name") == name:
                    return r, ""
            for c in details.get("comparisons") or []:
                if isinstance(c, dict) and c.get("name") == name:
                    return {"name": name, "theory": c.get("predicted"), "measured": c.get("measured"),
                            "se": c.get("se"), "tolerance": c.get("tolerance"), "agrees": c.get("agrees"),
                            "side": c.get("side", "two-sided"), "config": c.get("config"),
                            "resolving_power": c.get("resolving_power")}, ""
        return rows[0], ""
    if isinstance(named, int) and not isinstance(named, bool) and 0 <= named < len(rows):
        return rows[named], ""
    if isinstance(named, str):
        for r in rows:
            if r.get("name") == named:
                return r, ""
    return rows[0], f"details.headline_row {str(named)[:60]!r} names none of its {len(rows)} rows; the first is shown"


def theory_text(row: dict) -> str:
    """What a headline row compares with, in the scorecard: "vs 0.1748", "vs ≤ 1.547",
    "vs [1, 2.624]", "(reported)"."""
    side = row.get("side") or "two-sided"
    if side == "reported":
        return "(reported)" if row.get("theory") is None else f"(reported; theory {format_value(row.get('theory'))})"
    if side in SIDE_WORDS:
        return f"vs {SIDE_WORDS[side][0]} {format_value(_bound(row.get('theory'), side))}"
    return f"vs {format_value(row.get('theory'))}"


def headline_number(row: dict) -> str:
    """A headline row as one line of the scorecard: "measured ± se vs theory"."""
    tol = row.get("tolerance")
    return f"{printed(row.get('measured'), row.get('se'), tol if scalar(tol) is not None else None)} {theory_text(row)}"


# --------------------------------------------------------------------------- the scorecard


def agreement_count(entry: dict) -> tuple[int, int]:
    """(comparisons that agree, comparisons) of a claim (its judged headline rows where it
    recorded no comparisons)."""
    judged = [c for c in comparison_records(entry) if isinstance(c.get("agrees"), bool)]
    return sum(c["agrees"] for c in judged), len(judged)


def _percent(eps: float) -> str:
    return f"{100 * eps:.2g} %"


def resolving_text(entry: dict) -> str:
    """The claim's resolving power: the smallest error of its prediction that its comparisons
    reject at their tolerances (each comparison's ``resolving_power``, as computed by
    ``claims.common.compare``; the sharper side of each), best and worst over them, relative
    errors as percentages and absolute ones in the prediction's units; "n/a" for comparisons
    that record none; a comparison that already rejects the prediction (0) is left out."""
    values: dict[str, list[float]] = {"relative": [], "absolute": []}
    missing, rejecting = 0, 0
    records = comparison_records(entry)
    for c in records:
        rp = c.get("resolving_power")
        sides = []
        if isinstance(rp, dict):
            sides = [v for v in (scalar(rp.get("low")), scalar(rp.get("high"))) if v is not None and math.isfinite(v)]
        if not sides:
            missing += 1
            continue
        if min(sides) <= 0:
            rejecting += 1
            continue
        values["absolute" if rp.get("units") == "absolute" else "relative"].append(min(sides))
    parts = []
    for units, vals in values.items():
        if not vals:
            continue
        show = _percent if units == "relative" else (lambda v: f"±{v:.2g}")
        best, worst = show(min(vals)), show(max(vals))
        parts.append(best if best == worst else f"{best} – {worst}")
        if units == "absolute":
            parts[-1] += " abs."
    if not parts:
        return "n/a" if not rejecting else "0 (rejects the prediction)"
    text = "; ".join(parts)
    return text + (f" ({missing} n/a)" if missing else "")


def _stated(name: str, config: Optional[str]) -> str:
    name = str(name)
    # a name that states its configuration already ("..., tasks=[3, 3], L=32") is not given it twice
    return name if not config or str(config) in name or "tasks=" in name else f"{name} ({config})"


def _margin(c: dict) -> float:
    margin = scalar(c.get("margin"))
    if margin is not None and not math.isnan(margin):
        return margin
    error, tolerance = scalar(c.get("error")), scalar(c.get("tolerance"))
    if error is None or tolerance is None:
        return math.inf
    return error / tolerance if tolerance > 0 else (0.0 if error <= 0 else math.inf)


def by_how_much(entry: dict) -> Optional[str]:
    """The one sentence a failing or contradicted id carries in the scorecard: which of its
    comparisons disagree, and the worst of them in numbers (measured ± se against the
    prediction, the error and how many tolerances it is); for an error, why it could not
    decide.  None for an id that does not fail."""
    if not is_failing(entry):
        return None
    verdict = str(entry.get("verdict"))
    disagreeing = [c for c in comparison_records(entry) if c.get("agrees") is False]
    if not disagreeing:
        details = entry.get("details") or {}
        reason = details.get("error") if details.get("traceback") else None
        return f"{verdict}: {str(reason)[:200] if reason else _verdict_reason(entry)}"
    worst = max(disagreeing, key=_margin)
    _, judged = agreement_count(entry)
    lead = (f"{len(disagreeing)} of {judged} comparisons disagree; the worst, " if len(disagreeing) > 1
            else f"1 of {judged} comparisons disagrees: " if judged > 1 else "")
    error, tolerance = worst.get("error"), worst.get("tolerance")
    margin = _margin(worst)
    if scalar(error) is None:  # a headline row read as a comparison: no error was stored
        size = f"its tolerance {format_value(tolerance)}"
    elif math.isfinite(margin):
        size = f"error {format_value(error)}, {margin:.3g} × its tolerance {format_value(tolerance)}"
    else:
        size = f"error {format_value(error)} against a tolerance of {format_value(tolerance)}"
    measured = printed(worst.get("measured"), worst.get("se"))
    return (f"{verdict}: {lead}{_stated(worst.get('name', ''), worst.get('config'))}: measured {measured} "
            f"against {format_value(worst.get('predicted'))}; {size}.")


def scorecard(report: dict) -> list[dict]:
    """The first screen as data: ``[{key, heading, rows}]`` per group (the paper's claims, where
    they stop, beyond the paper), each row ``{id, anchor, title, kind, verdict, failing,
    headline (name, number, config, note) or None, agree, of, resolving, why}``; within a group
    a failing or contradicted id comes first (then report order)."""
    groups = []
    for key, heading in GROUPS:
        members = [e for e in report.get("claims") or [] if isinstance(e, dict) and group_of(e) == key]
        members.sort(key=lambda e: not is_failing(e))  # stable: report order otherwise
        rows = []
        for e in members:
            row, note = headline_row(e)
            agree, of = agreement_count(e)
            rows.append({
                "id": str(e.get("id")), "anchor": anchor(e.get("id", "")), "title": str(e.get("title", "")),
                "kind": kind_of(e), "verdict": str(e.get("verdict")), "failing": is_failing(e),
                "headline": None if row is None else {"name": str(row.get("name", "")), "number": headline_number(row),
                                                      "config": row.get("config"), "note": note},
                "agree": agree, "of": of, "resolving": resolving_text(e), "why": by_how_much(e)})
        if rows:
            groups.append({"key": key, "heading": heading, "rows": rows})
    return groups


def scorecard_order(report: dict) -> list[str]:
    """The claim ids in the scorecard's order (the forest plot's order too)."""
    return [r["id"] for g in scorecard(report) for r in g["rows"]]


def report_forest(report: dict) -> tuple[list, int]:
    """The forest plot's rows of a document, in the scorecard's order, and how many were left out."""
    return forest_rows(report, scorecard_order(report))


def report_figures(report: dict) -> dict[str, bytes]:
    """The report's own figures (beside the claims'): the forest plot as a PNG (the README
    links it; the page embeds it as SVG); none for a report without a comparison."""
    rows, _ = report_forest(report)
    return {FOREST_FILE: forest_png(rows)} if rows else {}


def forest_caption(rows: list, left_out: int) -> str:
    signed = sum(r.signed for r in rows)
    one_sided = sum(r.side != "two-sided" for r in rows)
    disagree = sum(r.agrees is False for r in rows)
    parts = [f"Every comparison of the report ({len(rows)}, {disagree} disagreeing, in red), one row each, grouped "
             f"by claim id in the scorecard's order (boundary ids without 'boundary-'). Filled: "
             f"(measured − predicted) / tolerance, with the standard error / tolerance as a bar ({signed} rows); "
             "the shaded band [−1, 1] is agreement. Hollow: comparisons of lists, brackets or several numbers, "
             "or whose error is not in the measured value's units: drawn at error / tolerance, the size of the "
             "normalised error without its sign. Triangles: one-sided checks "
             f"({one_sided}), pointing from the value to the side allowed, against their bound (|: +1 for "
             "'not above', −1 for 'not below'). A tolerance of 0 (an exact check) puts an agreeing row at 0. "
             f"Values beyond ±{FOREST_CLIP:g} sit at the edge with their number. Reported headline rows compare "
             "nothing and are not drawn."]
    if left_out:
        parts.append(f"{left_out} comparison(s) without a tolerance or error to normalise by are left out.")
    if len(rows) > FOREST_MAX_ROWS:
        parts.append(f"Only the first {FOREST_MAX_ROWS} rows (in the scorecard's order, failing claims first) are "
                     f"drawn; {len(rows) - FOREST_MAX_ROWS} more are in claims.json.")
    return " ".join(parts)


# --------------------------------------------------------------------------- findings


def _numbers_of(finding: dict) -> list:
    numbers = finding.get("numbers") if isinstance(finding.get("numbers"), dict) else {}
    return [v.get("value") for v in numbers.values() if isinstance(v, dict)]


def _same(a: Optional[float], b: Optional[float]) -> bool:
    return a is not None and b is not None and abs(a - b) <= SAME_NUMBER * max(abs(a), abs(b), 1e-300)


def finding_outcome(entry: Optional[dict], finding: dict) -> Optional[str]:
    """The outcome word a finding carries when it states a comparison that disagrees: the
    claim's outcome (``contradicted`` for a boundary, ``fail`` for a claim).  A finding states
    a comparison when its numbers hold the comparison's measured value and, where the
    prediction is one number, its prediction: the same floats, written by the same claim."""
    if not entry:
        return None
    scalars = [x for x in (scalar(v) for v in _numbers_of(finding)) if x is not None]
    for c in comparison_records(entry):
        if c.get("agrees") is not False:
            continue
        measured, predicted = scalar(c.get("measured")), scalar(c.get("predicted"))
        if measured is None or not any(_same(measured, x) for x in scalars):
            continue
        if predicted is not None and not any(_same(predicted, x) for x in scalars):
            continue
        return str(entry.get("verdict")) if is_failing(entry) else "disagrees"
    return None


def marked_findings(report: dict, findings: Optional[list] = None) -> list[dict]:
    """``findings`` (default: the document's top-level list) as ``{text, claim, anchor, kind,
    outcome}``: ``outcome`` the word a finding that states a disagreeing comparison carries."""
    entries = {e.get("id"): e for e in report.get("claims") or [] if isinstance(e, dict)}
    out = []
    for f in report.get("findings") or [] if findings is None else findings:
        if not isinstance(f, dict):
            continue
        claim = str(f.get("claim", ""))
        out.append({"text": " ".join(str(f.get("text", "")).split()), "claim": claim, "anchor": anchor(claim),
                    "kind": f.get("kind"), "outcome": finding_outcome(entries.get(f.get("claim")), f)})
    return out


def findings_lists(report: dict) -> list[dict]:
    """The three findings lists ``{kind, heading, shown, more}``: a marked finding first in its
    list, the first :data:`FINDINGS_OPEN` shown, the rest folded."""
    marked = marked_findings(report)
    lists = []
    for kind, heading in FINDING_HEADINGS.items():
        items = [f for f in marked if f["kind"] == kind]
        items.sort(key=lambda f: f["outcome"] is None)
        lists.append({"kind": kind, "heading": heading, "count": len(items),
                      "shown": items[:FINDINGS_OPEN], "more": items[FINDINGS_OPEN:]})
    return lists


# --------------------------------------------------------------------------- a claim's section


def _short_summary(entry: dict) -> Optional[dict]:
    """Without headline rows: the values theory and numerics share and the tolerance."""
    theory = flatten(entry.get("theory") or {})
    numerics = flatten(entry.get("numerics") or {})
    shared = [k for k in theory if k in numerics][:SUMMARY_ROWS_MAX]
    tolerance = entry.get("tolerance") or {}
    summary: dict[str, Any] = {"rows": [(k, format_value(theory[k]), format_value(numerics[k])) for k in shared],
                               "more": len(set(theory) | set(numerics)) - len(shared), "allowed": None, "why": ""}
    if "value" in tolerance or "why" in tolerance:
        value = tolerance.get("value", "—")
        summary["allowed"] = (format_value(value) if not isinstance(value, (dict, list)) or len(format_value(value)) <= 60
                              else "per case (the tolerance table below)")
        why = str(tolerance.get("why") or "")
        if len(why) > SUMMARY_WHY_MAX:
            why = why[:SUMMARY_WHY_MAX].rsplit(" ", 1)[0] + " … (in full below)"
        summary["why"] = why
    return summary if summary["rows"] or summary["allowed"] is not None else None


def headline_groups(entry: dict) -> list[dict]:
    """The headline table: ``[{config, rows: [{name, side, **headline_cells}]}]``."""
    rows = [r for r in entry.get("headline") or [] if isinstance(r, dict)]
    return [{"config": config, "rows": [{"name": str(r.get("name", "")), "side": str(r.get("side") or "two-sided"),
                                         **headline_cells(r)} for r in group]}
            for config, group in group_by_config(rows)]


def section(entry: dict, report: dict, pngs: dict[str, bytes]) -> dict:
    """Everything one claim's section shows, as text for its template."""
    prov = report["provenance"]
    at_configuration = set((prov.get("ran_at") or {}).get("configuration") or []) if prov.get("problem") else set()
    details = dict(entry.get("details") or {})
    traceback_text = details.pop("traceback", None)
    theory, numerics = flatten(entry.get("theory") or {}), flatten(entry.get("numerics") or {})
    perturbations = [p for p in entry.get("perturbations") or [] if isinstance(p, dict)]
    figures = []
    for fig in entry.get("figures") or []:
        data = pngs.get(fig["file"])
        if data is not None:
            figures.append({"title": fig["title"], "caption": fig.get("caption") or "", "file": fig["file"],
                            "uri": "data:image/png;base64," + base64.b64encode(data).decode("ascii")})
    return {
        "id": str(entry["id"]), "anchor": anchor(entry["id"]), "title": str(entry["title"]),
        "verdict": str(entry["verdict"]), "kind": kind_of(entry),
        "where": ("ran at the audited configuration" if entry["id"] in at_configuration
                  else f"ran at profile {prov.get('profile')}"),
        "seconds": _seconds(entry.get("seconds", "")), "statement": str(entry["statement"]),
        # the section's findings are its own claim's: marked against this entry alone (against the whole
        # report, every section would index every claim: quadratic in the claims)
        "findings": marked_findings({"claims": [entry]}, [f for f in entry.get("findings") or [] if isinstance(f, dict)]),
        "reason": _verdict_reason(entry),
        "headline": headline_groups(entry), "summary": None if entry.get("headline") else _short_summary(entry),
        "perturbations": [{"description": str(p.get("description", "")), "rejected": bool(p.get("rejected")),
                           "details": [(k, format_value(v)) for k, v in flatten(p.get("details") or {}).items()]}
                          for p in perturbations],
        "perturbations_folded": len(perturbations) > PERTURBATIONS_SHOWN_MAX,
        "rejected": sum(bool(p.get("rejected")) for p in perturbations),
        "figures": figures, "figure_errors": [str(e) for e in entry.get("figure_errors") or []],
        "all_values": [(k, format_value(theory[k]) if k in theory else "—", format_value(numerics[k]) if k in numerics
                    else "—") for k in list(theory) + [k for k in numerics if k not in theory]],
        "tolerance": [(k, format_value(v)) for k, v in flatten(entry.get("tolerance") or {}).items()],
        "traceback": None if traceback_text is None else str(traceback_text),
        "details": [(k, format_value(v)) for k, v in flatten(details).items()] if details else [],
    }


# --------------------------------------------------------------------------- the run


PROBLEM_NAMES = {"sigma": "σ", "param": "parametrisation", "init_scale": "init scale s0",
                 "logit_scale": "logit scale s", "basis": "basis", "dtype": "dtype"}


def describe_problem(problem: dict) -> str:
    """A configuration in the paper's notation: ``r = (3, 3, 3), H = 3, L = 256, σ = 0.5``."""
    parts = []
    if "tasks" in problem:
        parts.append(f"r = ({', '.join(str(r) for r in problem['tasks'])})")
    if "heads" in problem:
        parts.append(f"H = {problem['heads']}")
    if "L" in problem:
        parts.append(f"L = {problem['L']}")
    parts += [f"{name} = {format_value(problem[key])}" for key, name in PROBLEM_NAMES.items() if key in problem]
    return ", ".join(parts)


def verdict_counts(claims: list[dict]) -> str:
    """"7 pass, 0 fail, 0 error; boundaries: 3 located, 1 contradicted, 1 undecided, 0 error"."""
    parts = []
    for kind, outcomes, label in (("claim", ("pass", "fail", "error"), ""),
                                  ("boundary", ("located", "contradicted", "undecided", "error"), "boundaries: ")):
        of_kind = [c for c in claims if kind_of(c) == kind]
        if of_kind or kind == "claim":
            parts.append(label + ", ".join(f"{sum(c['verdict'] == v for c in of_kind)} {v}" for v in outcomes))
    return "; ".join(parts)


def run_summary(report: dict) -> dict:
    """Profile, configuration, which claims ran where, skipped sweep points, a re-render: what a
    reader must know before reading any verdict."""
    prov = report["provenance"]
    problem = prov.get("problem")
    ran_at = prov.get("ran_at") or {}
    return {"profile": str(prov.get("profile")), "device": str(prov.get("device")), "seed": str(prov.get("seed")),
            "counts": verdict_counts(report["claims"]),
            "problem": describe_problem(problem) if problem else None,
            "at": ", ".join(ran_at.get("configuration") or []) or "no claim",
            "rest": ", ".join(ran_at.get("profile") or []),
            "skipped": [(str(p.get("file")), str(p.get("reason"))) for p in prov.get("sweep_skipped") or []],
            "sweep": str(prov.get("sweep")), "rerendered": prov.get("rerendered"),
            "started": str(prov.get("started_utc")),
            "provenance": [(k, format_value(v)) for k, v in flatten(prov).items()]}


def render_html(report: dict, pngs: dict[str, bytes]) -> str:
    """The page of a ``claims.json`` document; ``pngs`` maps each figure's file name (as in
    ``claims[*].figures[*].file``) to its PNG bytes, embedded as data URIs.  First screen: the
    scorecard beside the forest plot (drawn here from the document, inline SVG); then the
    findings, the run, and one section per claim."""
    rows, left_out = report_forest(report)
    return render("index.html.j2", title=TITLE, tiny=report["provenance"].get("profile") == "tiny",
                  run=run_summary(report), scorecard=scorecard(report), findings=findings_lists(report),
                  has_findings=bool(report.get("findings")), forest=forest_svg(rows) if rows else None,
                  forest_caption=forest_caption(rows, left_out), forest_file=FOREST_FILE,
                  sections=[section(c, report, pngs) for c in report["claims"]])
