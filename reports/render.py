"""The report document: its schema (derived from claims.core's dataclasses), the checks of a
file read back, and its pages.

**The schema** of ``claims.json`` is derived from the dataclasses of ``claims.core``: a claim
entry is ``ClaimResult.to_dict()`` with ``figures`` stored as ``figure_data`` and the report's
own ``figures`` (the drawn PNGs) and ``figure_errors`` added; its headline rows are
``HeadlineRow``, its findings ``Finding``, its perturbations ``PerturbationCheck``.  The keys and
their JSON types are read off those dataclasses' fields (:func:`fields_of`), so a field added to
``claims.core`` is in the schema without an edit here.  A field with a default is optional in a
claim's result (it gets the default: :func:`with_defaults`) and required in what a build
*writes* (:func:`check_report`).  A claims.json written by an older version of this code (no
``kind``, row ``side`` or ``findings``) is refused when read back (:func:`older_version`):
rebuild it.

Beyond the types, a file read back (``--from-json``, ``reports.compare``) must be consistent
(:func:`document_problems`): ids unique, short and plain, at least one claim, nesting bounded,
every number finite where it is a JSON number (``1e400`` is refused, not read as infinity),
every string encodable (no lone surrogate), the provenance's seed an integer, each verdict one
of its kind's outcomes -- and every agreement and every verdict *recomputed from the file's own
numbers* (:func:`judged_problems`): each comparison's ``agrees`` from its error and tolerance,
each perturbation's ``rejected`` likewise, each judged headline row's ``agrees`` from its
measured value, theory, tolerance and side, and the verdict by the one rule
(``claims.core.judge``).  A file that disagrees with itself -- a verdict or an agreement edited
by hand, numbers untouched -- is refused rather than rendered.  Every check is one pass over
the file (a 20,000-claim claims.json is read in seconds).

**The pages**: a ``claims.json`` document to one self-contained HTML page, each claim's
``claims.core.Figure`` data to PNG, and the forest plot of every comparison.  Matplotlib
(:func:`pyplot`) and jinja2 are imported only when a figure is drawn or a page rendered, so that
reports.build and reports.audit, which read the schema, refuse bad arguments without loading them.

Nothing here computes a result.  Every number on the page comes from ``claims.json`` (each
claim's ``claims.core.ClaimResult``, its ``Figure`` data, and the run's provenance); this module only chooses what
is shown where and how it is printed, and the markup lives in ``reports/templates`` (jinja2,
autoescaped: a claim's text can never become markup):

- :func:`scorecard`: the first screen, one line per claim id grouped as the paper's claims /
  where they stop / beyond the paper, a failing or contradicted id first in its group.  Each
  line is **the row that decided its outcome** (:func:`deciding`: for a failing id, its
  disagreeing comparison of largest error / tolerance; for one that could not decide, the
  reason; else the claim's headline, :func:`headline_row`), said as one sentence with its
  numbers and its configuration in words (:func:`sentence`; a structured value is summarised:
  how many numbers, the furthest pair, never the structure itself), beside the paper's
  statement for a paper claim (``paper``); how many of its comparisons agree; that row's
  resolving power in words (:func:`power_words`).
- :func:`findings_lists`: the sentences behind it (what holds / where it stops / beyond the
  paper), a finding that states a comparison which disagrees marked with its claim's outcome
  (:func:`finding_outcome`).
- :func:`render_html`: the page: scorecard and forest plot (drawn from this document alone,
  inline SVG), findings, the run, one section per claim.
- :func:`figure_png` draws a ``claims.core.Figure`` (kinds ``"lines"``, ``"heatmap"``,
  ``"panels"``, ``"mix"``) with Matplotlib's Agg backend and returns the PNG bytes.
- :func:`forest_rows` reads every comparison of a ``claims.json`` document
  (``details["comparisons"]`` of each claim; its judged headline rows where a claim recorded
  none) as one row of the forest plot; :func:`forest_svg` / :func:`forest_png` draw them: the
  normalised error (measured - predicted) / tolerance with se / tolerance as a bar, the band
  [-1, 1] shaded, one-sided checks as arrows against their bound.

Printed precision (:func:`printed`): a measured number with a standard error is printed to
the second significant digit of its se; without one, to a tenth of its tolerance, at most 4
significant digits; anything else to 4 significant digits.  No digit of a comparison that
agrees to rounding is printed (:data:`ROUNDING_LEVEL`): its residual reads "< tolerance" (a
bound the claim fixed from the dtype's eps and the problem's size), its structures "each
theory's to rounding", its resolving power "beyond rounding" -- those digits differ between
CPUs whose BLAS kernels round differently.

Colour convention of ``"lines"`` figures (:func:`series_colours`): lines take successive
colours, and each measured ``points`` series takes the colour of the line whose label it
shares most words with (``"full task 1"`` with ``"reduced task 1"``), so a measurement and
its prediction are drawn in the same colour; on a tie, points and lines are paired in order.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import io
import json
import math
import os
import re
import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Union

from claims.core import (BOUNDARY_OUTCOMES, FAILING, FINDING_KINDS, KINDS, SIDES, VERDICTS, ClaimResult, Figure, Finding,
                         HeadlineRow, PerturbationCheck, Series, judge, kind_from_id)
from numerics.io import PARSE_FACTOR, SEED_MAX, check_memory, parse_json

VERSIONED_PACKAGES = ("torch", "numpy", "scipy", "sympy", "mpmath", "matplotlib")
PROVENANCE_KEYS = {"versions": dict, "device": str, "seed": int, "profile": str, "wall_seconds": dict,
                   "cpu_seconds": dict, "git": dict, "command": list, "started_utc": str, "seeds": dict}
# Claim ids as the registry writes them: plain, short (they become anchors and file names).
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
MAX_DEPTH = 40            # nesting of a claims.json (the real ones stay under 10)
MAX_PROBLEMS_SHOWN = 5
NON_FINITE = ("nan", "inf", "-inf")   # how numerics.io.jsonable stores non-finite floats
OUTCOMES = {"claim": VERDICTS, "boundary": BOUNDARY_OUTCOMES}
PASSING = {"claim": "pass", "boundary": "located"}


#: Top-level keys a claims.json may carry besides claims/findings/provenance: ``model``, the audit of handed
#: checkpoints (``python -m reports.audit``, docs/audit.md), one object per checkpoint.
OPTIONAL_TOP_LEVEL = {"model": list}
#: The keys every ``model`` entry has (docs/audit.md describes them all).
MODEL_KEYS = ("index", "checkpoint", "readout", "held_out_loss", "theory", "position", "judged")


def model_problems(models: Any, claim_ids: list) -> list[str]:
    """What is wrong with a top-level ``model`` list: each entry an object with :data:`MODEL_KEYS`,
    ``judged`` naming one of the document's claims (or null)."""
    if not isinstance(models, list):
        return ["'model' must be a list of objects, one per audited checkpoint"]
    problems = []
    for k, m in enumerate(models):
        if not isinstance(m, dict):
            problems.append(f"model[{k}] is not an object")
            continue
        missing = [key for key in MODEL_KEYS if key not in m]
        if missing:
            problems.append(f"model[{k}] lacks {missing}")
        elif m["judged"] is not None and m["judged"] not in claim_ids:
            problems.append(f"model[{k}] is judged by {str(m['judged'])[:40]!r}, which is not a claim of the document")
    return problems


class BadArguments(ValueError):
    """Command-line arguments or input files that cannot work, with what to do instead (exit 2)."""


# --------------------------------------------------------------------------- derived schema


@functools.lru_cache(maxsize=None)
def fields_of(cls) -> dict[str, tuple[Any, bool]]:
    """``{field: (type hint, required)}`` of a dataclass of claims.core (computed once per class:
    ``typing.get_type_hints`` costs a compile per field, and a report has rows by the thousand)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls)}


def _defaults(cls) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


# the entry of a claim: ClaimResult with figures renamed; rows typed by their dataclass
ENTRY_FIELDS = {("figure_data" if name == "figures" else name): spec
                for name, spec in fields_of(ClaimResult).items()}
ENTRY_FIELDS.update(figures=(list, False), figure_errors=(list, False))
ROW_CLASSES = {"headline": HeadlineRow, "findings": Finding, "perturbations": PerturbationCheck}


def _type_ok(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin is Union:
        return any(_type_ok(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    target = origin or hint
    if target is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in NON_FINITE
    if target is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, target)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _walk_problems(obj: Any) -> list[str]:
    """What one pass over the whole document finds (without recursion: a hand-made file can nest
    thousands deep): nesting beyond :data:`MAX_DEPTH`, and a string or key that is not valid
    Unicode (a lone surrogate such as ``"\\ud800"``: JSON can carry one, UTF-8 cannot, so the
    writer would fail on it)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return [f"nested more than {MAX_DEPTH} levels deep"]
        if isinstance(item, dict):
            for key, value in item.items():
                if not _encodable(key):
                    return [_surrogate("a key", key)]
                stack.append((value, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str) and not _encodable(item):
            return [_surrogate("a string", item)]
    return []


def _surrogate(what: str, text: str) -> str:
    return (f"{what} {text.encode('utf-8', 'backslashreplace')[:60].decode()!r} holds a lone surrogate (not valid "
            "Unicode): this file was not written by reports.build")


def _encodable(text: str) -> bool:
    try:
        return text.isascii() or bool(text.encode("utf-8"))
    except UnicodeEncodeError:
        return False


def with_defaults(report: dict) -> dict:
    """A claims.json document with each entry's missing fields (those with a default in
    ``ClaimResult``) and each row's (side two-sided, config None) filled in, and the top-level
    ``findings`` gathered from the claims' where absent.  Entries that are not objects are left
    for :func:`document_problems` to name."""
    entries = report.get("claims")
    if not isinstance(entries, list):
        return report
    new_entries = [_entry_with_defaults(raw) if isinstance(raw, dict) else raw for raw in entries]
    out = dict(report, claims=new_entries)
    out.setdefault("findings", [f for e in new_entries if isinstance(e, dict)
                                for f in (e.get("findings") if isinstance(e.get("findings"), list) else [])])
    return out


def _entry_with_defaults(raw: dict) -> dict:
    entry = {**raw, **{name: value for name, value in _defaults(ClaimResult).items()
                       if name not in ("kind", "figures") and name not in raw}}
    for name, cls in ROW_CLASSES.items():
        if isinstance(entry.get(name, []), list):
            entry[name] = [{**_defaults(cls), **row} if isinstance(row, dict) else row for row in entry.get(name, [])]
    return entry


def older_version(report: dict) -> Optional[str]:
    """What marks ``report`` as written by an older version of this code (a claim without
    ``kind``, a headline row without ``side``, no top-level ``findings``), or None."""
    entries = [e for e in report["claims"] if isinstance(e, dict)]
    if "findings" not in report:
        return "no top-level 'findings'"
    if any("kind" not in e for e in entries):
        return "claims without 'kind'"
    if any(isinstance(r, dict) and "side" not in r for e in entries if isinstance(e.get("headline"), list)
           for r in e["headline"]):
        return "headline rows without 'side'"
    return None


def _field_problems(at: str, obj: dict, spec: dict, entry: bool = False) -> list[str]:
    """The keys and JSON types of ``obj`` against ``spec`` (:func:`fields_of`): an entry needs every
    field (it was written with its defaults); a row its required ones and no other."""
    unknown = [] if entry else sorted(set(obj) - set(spec))
    problems = [f"{at} has unknown keys {unknown}"] if unknown else []
    for key, (hint, required) in spec.items():
        if key not in obj and (entry or required):
            problems.append(f"{at}: missing key {key!r}" if entry else f"{at} lacks {key!r}")
        elif key in obj and not _type_ok(obj[key], hint):
            problems.append(f"{at}: {key!r} is {type(obj[key]).__name__}, not {_type_name(hint)}")
    return problems


def _row_problems(where: str, name: str, rows: list, cls) -> list[str]:
    return [problem for k, row in enumerate(rows)
            for problem in (_field_problems(f"{where}: {name}[{k}]", row, fields_of(cls)) if isinstance(row, dict)
                            else [f"{where}: {name}[{k}] is not an object"])]


# --------------------------------------------------------------------------- recomputed agreement


#: A headline row's agreement is recomputed from the numbers it shows; where the recomputed error lies within
#: this relative distance of the tolerance (a row that shows a ratio or a rounded number of a comparison made
#: in other units), the row is on the edge and its stored ``agrees`` stands.
ROW_EDGE = 1e-9


def scalar(v: Any) -> Optional[float]:
    """A float from a JSON number or ``jsonable``'s "nan"/"inf"/"-inf"; None for anything else."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, str) and v in NON_FINITE:
        return float(v)
    return None


def side_error(side: str, measured: float, predicted: float) -> float:
    """The error a comparison's side measures: |d| two-sided, the excess above (below) a bound."""
    d = measured - predicted
    return abs(d) if side == "two-sided" else max(0.0, d) if side == "not above" else max(0.0, -d)


def _decide(excess: float, scale: float) -> Optional[bool]:
    """Agreement from ``excess`` = error - tolerance (<= 0 agrees): None within :data:`ROW_EDGE`."""
    if math.isnan(excess):
        return False
    if abs(excess) <= ROW_EDGE * max(scale, 1e-300):
        return None
    return excess <= 0


def _flat(v: Any) -> Optional[list]:
    """The numbers of a (nested) list, or None if anything in it is not a number."""
    out, stack = [], [v]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            x = scalar(item)
            if x is None:
                return None
            out.append(x)
    return out


def row_agreement(row: dict) -> Optional[bool]:
    """Whether a judged headline row agrees, recomputed from the numbers it shows: a scalar
    against a scalar (its side's error against the tolerance), a scalar against a bracket
    ``[low, high]`` (None an open end: inside, widened by the tolerance), lists entry by entry
    (the tolerance one number or one per entry).  None where the row's numbers do not decide it
    (a theory given as text) or it lies on the edge (:data:`ROW_EDGE`)."""
    side = row.get("side") or "two-sided"
    if side not in SIDES or side == "reported":
        return None
    m, t, tol = row.get("measured"), row.get("theory"), row.get("tolerance")
    mv, tv, tolv = scalar(m), scalar(t), scalar(tol)
    if mv is not None and tv is not None and tolv is not None:
        err = side_error(side, mv, tv)
        if math.isnan(tolv):
            return False
        return _decide(err - tolv, max(abs(err), abs(tolv)))
    if mv is not None and tolv is not None and isinstance(t, list) and len(t) == 2 and all(
            b is None or scalar(b) is not None for b in t):
        lo, hi = (None if b is None else scalar(b) for b in t)
        excess = max(-math.inf if lo is None else lo - tolv - mv, -math.inf if hi is None else mv - hi - tolv)
        if math.isinf(excess) and excess < 0:
            return True
        return _decide(excess, max(abs(mv), abs(tolv), abs(lo or 0.0), abs(hi or 0.0)))
    if isinstance(m, list) and isinstance(t, list):
        ms, ts = _flat(m), _flat(t)
        tols = [tolv] * len(ms or []) if tolv is not None else (_flat(tol) if isinstance(tol, list) else None)
        if ms is None or ts is None or tols is None or not (len(ms) == len(ts) == len(tols)) or not ms:
            return None
        decided = [_decide(side_error(side, a, b) - e, max(abs(side_error(side, a, b)), abs(e)))
                   if not math.isnan(e) else False for a, b, e in zip(ms, ts, tols)]
        if any(d is False for d in decided):
            return False
        return None if any(d is None for d in decided) else True
    return None


def _agrees(record: Any, rejected: bool = False) -> Optional[bool]:
    """The rule of a stored record recomputed from its error and tolerance: a comparison agrees
    when error <= tolerance (``claims.core.Comparison.agrees``), a perturbation is
    ``rejected`` when error > tolerance (``claims.core.perturbation``); both False for a
    NaN error.  None where the record does not carry both numbers."""
    e, tol = (scalar(record.get(k)) for k in ("error", "tolerance")) if isinstance(record, dict) else (None, None)
    if e is None or tol is None:
        return None
    return bool(e > tol) if rejected else bool(e <= tol)


def _short(v: Any, limit: int = 60) -> str:
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _comparison_problems(where: str, comparisons: list) -> list[str]:
    """Where stored comparisons disagree with themselves: each ``agrees`` against its error and
    tolerance, each of its perturbations' ``rejected`` likewise."""
    problems = []
    for k, c in enumerate(comparisons):
        if not isinstance(c, dict):
            problems.append(f"{where}: details.comparisons[{k}] is not an object")
            continue
        recomputed = _agrees(c)
        if not isinstance(c.get("agrees"), bool) or (recomputed is not None and recomputed != c["agrees"]):
            problems.append(f"{where}: comparison {_short(c.get('name'))} says agrees={c.get('agrees')!r} but its "
                            f"error {_short(c.get('error'))} against its tolerance {_short(c.get('tolerance'))} says "
                            f"{recomputed}: the file disagrees with itself")
        stored = c.get("perturbations") if c.get("perturbations") is not None else []
        if not isinstance(stored, list):
            problems.append(f"{where}: comparison {_short(c.get('name'))}: 'perturbations' is not a list")
            stored = []
        for q in stored:
            rej = _agrees(q, rejected=True)
            if isinstance(q, dict) and rej is not None and q.get("rejected") is not rej:
                problems.append(f"{where}: comparison {_short(c.get('name'))}: perturbation "
                                f"{_short(q.get('description'))} says rejected={q.get('rejected')!r} but its error "
                                f"{_short(q.get('error'))} against {_short(q.get('tolerance'))} says {rej}")
    return problems


def judged_problems(entry: dict, where: str) -> list[str]:
    """Where an entry disagrees with itself: every stored comparison's ``agrees`` against its error
    and tolerance, every perturbation's ``rejected`` against its error and tolerance, every judged
    headline row's ``agrees`` against its own numbers (:func:`row_agreement`), and the verdict
    against the one rule (``claims.core.judge``) applied to the recomputed comparisons and
    perturbations, the ``undecided`` reason and an exception the run recorded.  An entry that
    records no comparison (a report from before they were stored) is judged on its rows: a
    passing verdict needs every judged row to agree and every perturbation rejected."""
    details = entry.get("details") if isinstance(entry.get("details"), dict) else {}
    comparisons = details.get("comparisons")
    comparisons = comparisons if isinstance(comparisons, list) else None
    problems = _comparison_problems(where, comparisons or [])
    perturbations = []
    for q in entry["perturbations"]:
        rej = _agrees(q.get("details"), rejected=True)
        if rej is not None and rej != q["rejected"]:
            problems.append(f"{where}: perturbation {_short(q['description'])} says rejected={q['rejected']} but its "
                            f"error {_short(q['details'].get('error'))} against its tolerance "
                            f"{_short(q['details'].get('tolerance'))} says {rej}: the file disagrees with itself")
        perturbations.append(SimpleNamespace(rejected=q["rejected"] if rej is None else rej))
    for row in entry["headline"]:
        if row["side"] == "reported" or not isinstance(row["agrees"], bool):
            continue
        recomputed = row_agreement(row)
        if recomputed is not None and recomputed != row["agrees"]:
            problems.append(f"{where}: headline row {_short(row['name'])} says agrees={row['agrees']} but its own "
                            f"numbers (measured {_short(row['measured'])}, theory {_short(row['theory'])}, tolerance "
                            f"{_short(row['tolerance'])}, {row['side']}) say {recomputed}: the file disagrees with itself")
    if problems:
        return problems
    verdict, kind = entry["verdict"], entry["kind"]
    if "error" in details and not comparisons:
        expected = "error"         # the run raised (claims.core.run_claim): no comparison to judge
    elif comparisons is not None:
        undecided = details.get("undecided") or (None if comparisons else "no comparison was made")
        expected = judge(all(c["agrees"] for c in comparisons), perturbations, kind, undecided, details.get("fault"))
    else:
        return problems
    if verdict != expected:
        problems.append(f"{where}: verdict {verdict!r}, but its own comparisons and perturbations give {expected!r} "
                        "(claims.core.judge): the file disagrees with itself (a verdict edited by hand?)")
    return problems


def entry_problems(entry: Any, k: int) -> list[str]:
    """What is wrong with one claim entry: keys and types (from the dataclasses), the id, the
    verdict for its kind, the side of each row, the kind of each finding, and a passing verdict
    with a judged headline row that does not agree."""
    if not isinstance(entry, dict):
        return [f"claims[{k}] is not an object"]
    cid = entry.get("id")
    where = f"claims[{k}] (id {str(cid)[:40]!r})"
    problems = _field_problems(where, entry, ENTRY_FIELDS, entry=True)
    if problems:
        return problems
    if not ID_PATTERN.fullmatch(cid):
        problems.append(f"{where}: the id must be letters, digits, '-', '_' or '.' and at most 80 characters")
    if entry["kind"] not in KINDS:
        return problems + [f"{where}: kind {entry['kind']!r} is not one of {KINDS}"]
    if entry["verdict"] not in OUTCOMES[entry["kind"]]:
        problems.append(f"{where}: verdict {entry['verdict']!r} is not one of {OUTCOMES[entry['kind']]} "
                        f"(the outcomes of a {entry['kind']})")
    for name, cls in ROW_CLASSES.items():
        problems += _row_problems(where, name, entry[name], cls)
    if problems:
        return problems
    for row in entry["headline"]:
        if row["side"] not in SIDES:
            problems.append(f"{where}: headline row {row['name'][:60]!r} has side {row['side']!r}, not one of {SIDES}")
    for finding in entry["findings"]:
        if finding["kind"] not in FINDING_KINDS:
            problems.append(f"{where}: a finding has kind {finding['kind']!r}, not one of {FINDING_KINDS}")
        if finding["claim"] != cid:
            problems.append(f"{where}: a finding names claim {finding['claim'][:40]!r}, not its own id")
    if entry["verdict"] == PASSING[entry["kind"]]:
        against = [r["name"] for r in entry["headline"] if r["side"] != "reported" and r["agrees"] is False]
        if against:
            problems.append(f"{where}: verdict {entry['verdict']!r} but headline row(s) {against[:3]} do not "
                            "agree; a passing verdict needs every judged row to agree")
        accepted = [p["description"][:60] for p in entry["perturbations"] if not p["rejected"]]
        if accepted:
            problems.append(f"{where}: verdict {entry['verdict']!r} but perturbed prediction(s) {accepted[:3]} were "
                            "accepted; a passing verdict needs every perturbation rejected (claims.core.judge)")
    return problems + judged_problems(entry, where)


def document_problems(report: Any, strict: bool = True) -> list[str]:
    """Everything wrong with a claims.json document (an empty list when it is sound).  ``strict``:
    as a build writes it (top-level keys exactly claims/findings/provenance, the provenance keys,
    the top-level findings those of the entries in order); otherwise as read back after
    :func:`with_defaults`."""
    if not isinstance(report, dict):
        return ["the top level is not an object"]
    walked = _walk_problems(report)
    if walked:
        return walked
    expected = {"claims", "findings", "provenance"}
    if strict and set(report) - set(OPTIONAL_TOP_LEVEL) != expected or not expected <= set(report):
        return [f"the top level must be an object with the keys {sorted(expected)} (and optionally "
                f"{sorted(OPTIONAL_TOP_LEVEL)}), has {sorted(report)[:10]}"]
    entries, prov = report["claims"], report["provenance"]
    if not isinstance(entries, list) or not isinstance(prov, dict) or not isinstance(report["findings"], list):
        return ["'claims' and 'findings' must be lists and 'provenance' an object"]
    if not entries:
        return ["'claims' is empty: a report of no claim says nothing"]
    problems = []
    for k, entry in enumerate(entries):
        problems += entry_problems(entry, k)
    ids = Counter(e.get("id") for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str))
    duplicates = sorted(str(i)[:40] for i, n in ids.items() if n > 1)
    if duplicates:
        problems.append(f"duplicate claim ids {duplicates}")
    if "model" in report:
        problems += model_problems(report["model"], ids)
    if not problems and report["findings"] != [f for e in entries for f in e["findings"]]:
        problems.append("the top-level 'findings' are not the claims' findings in report order")
    return problems + provenance_problems(prov, strict)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _scalar_value(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


#: The optional provenance fields a report writes and its page reads, with the shape the page needs: a handed
#: claims.json with another shape there is refused by the reader, not by a crash of the renderer
#: (``reports.render.run_summary``).
PROVENANCE_SHAPES = (
    ("problem", lambda v: isinstance(v, dict) and all(_scalar_value(x) for k, x in v.items() if k != "tasks")
     and (("tasks" not in v) or (isinstance(v["tasks"], list) and all(isinstance(r, int) and not isinstance(r, bool)
                                                                          for r in v["tasks"]))),
     "a configuration (tasks a list of integers, the other fields numbers or words)"),
    ("ran_at", lambda v: isinstance(v, dict) and all(_strings(v.get(k) or []) for k in ("configuration", "profile")),
     "{configuration: [claim ids], profile: [claim ids]}"),
    ("sweep_skipped", lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list of {file, reason}"),
    ("only", _strings, "a list of claim ids"),
    ("sweep", lambda v: isinstance(v, str), "a path"),
    ("started_utc", lambda v: isinstance(v, str), "a time"),
)


def provenance_problems(prov: dict, strict: bool = True) -> list[str]:
    """What is wrong with a provenance: the keys present always of their type (a float seed, a
    seed beyond 2^64, a numeric profile are refused when read back); with ``strict`` (what a build
    writes, and what a re-render will write again) every key and sub-key present."""
    problems = []
    for key, kind in PROVENANCE_KEYS.items():
        if key not in prov:
            if strict:
                problems.append(f"provenance: missing key {key!r}")
        elif not isinstance(prov[key], kind) or (kind is int and isinstance(prov[key], bool)):
            problems.append(f"provenance: {key!r} has type {type(prov[key]).__name__}, not {kind.__name__}")
    seed = prov.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= SEED_MAX:
        problems.append(f"provenance: seed {seed} is not a seed (an integer in 0 .. 2^64 - 1)")
    for key, ok, what in PROVENANCE_SHAPES:     # what the page reads of it beyond the required keys
        if prov.get(key) is not None and not ok(prov[key]):
            problems.append(f"provenance: {key!r} is not {what}")
    if strict:
        for package in ("python",) + VERSIONED_PACKAGES:
            if package not in (prov.get("versions") or {}):
                problems.append(f"provenance.versions: missing {package}")
        if not {"commit", "dirty"} <= set(prov.get("git") or {}):
            problems.append("provenance.git: needs 'commit' and 'dirty'")
        if not {"per_claim", "total"} <= set(prov.get("wall_seconds") or {}):
            problems.append("provenance.wall_seconds: needs 'per_claim' and 'total'")
    return problems


#: The largest claims.json read back (32 MiB; the quick report's is about 1 MB): parsed, a JSON document takes
#: up to numerics.io.PARSE_FACTOR times its size in memory.
MAX_BYTES = 32 * 2 ** 20
#: Figures a claims.json read back may ask to draw, each panel counted (a drawing takes 0.1-0.3 s of CPU, so
#: 400 are a minute or two; a file of 1,500 figures took 448 s to re-render).
MAX_DRAWINGS = 400


def drawings(report: dict) -> int:
    """The figures and panels the entries' ``figure_data`` would draw (without recursion)."""
    stack = [f for e in report.get("claims") or [] if isinstance(e, dict)
             for f in (e.get("figure_data") if isinstance(e.get("figure_data"), list) else [])]
    count = 0
    while stack and count <= MAX_DRAWINGS:
        figure = stack.pop()
        count += 1
        if isinstance(figure, dict) and isinstance(figure.get("panels"), list):
            stack += figure["panels"]
    return count


def load_report(path: str, flag: str) -> dict:
    """A claims.json document (or a report directory holding one), refused if an older version of
    this code wrote it (:func:`older_version`), its defaults filled in and checked (:func:`document_problems`); :class:`BadArguments` naming ``flag`` otherwise.  Its
    cost is bounded before the work: at most :data:`MAX_BYTES`, its parse within the memory this
    process can take, at most :data:`MAX_DRAWINGS` figures to draw."""
    from numerics.io import read_input_bytes

    file = Path(path)
    if file.is_dir() and (file / "claims.json").is_file():
        file = file / "claims.json"
    if not file.exists() and not file.is_symlink():
        raise BadArguments(f"{flag} {path}: no such file; give the claims.json of a report (or its directory)")
    try:
        raw = read_input_bytes(file, flag, max_bytes=MAX_BYTES)
        check_memory(PARSE_FACTOR * len(raw), f"{flag} {path}: parsing it")
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    try:
        report = parse_json(raw.decode("utf-8"))     # strict: no NaN/Infinity, no 1e400 read as infinity
    except UnicodeDecodeError as exc:
        raise BadArguments(f"{flag} {path}: cannot be read as UTF-8 text ({exc})") from None
    except ValueError as exc:
        raise BadArguments(f"{flag} {path}: not a claims.json of a report (not strict JSON: {exc})") from None
    if not (isinstance(report, dict) and isinstance(report.get("claims"), list)
            and isinstance(report.get("provenance"), dict)):
        raise BadArguments(f"{flag} {path}: not a claims.json of a report (it needs 'claims', a list of "
                           "objects with an id and a verdict, and 'provenance')")
    if drawings(report) > MAX_DRAWINGS:
        raise BadArguments(f"{flag} {path}: asks for more than {MAX_DRAWINGS} figures and panels, more than a report "
                           "of this project draws (re-rendering them would take many minutes); not read")
    older = older_version(report)
    if older:
        git = report["provenance"].get("git")
        commit = str(git.get("commit", "unknown"))[:12] if isinstance(git, dict) else "unknown"
        raise BadArguments(f"{flag} {path}: written by an older version of this code (commit {commit}: {older}); "
                           "rebuild it with python -m reports.build")
    report = with_defaults(report)
    problems = document_problems(report, strict=False)
    if problems:
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
        more = f" (and {len(problems) - MAX_PROBLEMS_SHOWN} more)" if len(problems) > MAX_PROBLEMS_SHOWN else ""
        raise BadArguments(f"{flag} {path}: not a consistent claims.json of a report: {shown}{more}")
    return report


def check_report(out_dir: Path) -> list[str]:
    """Problems with the report in ``out_dir`` (an empty list when it is valid): strict JSON, the
    document (:func:`document_problems`, strict), the PNG files, and an index.html holding the
    findings, every claim's section and every figure inline, and nothing remote."""
    out_dir = Path(out_dir)
    try:
        report = parse_json((out_dir / "claims.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"claims.json: {exc}"]
    problems = [f"claims.json: {p}" for p in document_problems(report, strict=True)]
    if problems:
        return problems
    entries = report["claims"]
    for k, entry in enumerate(entries):
        for fig in entry["figures"]:
            file = fig.get("file") if isinstance(fig, dict) else None
            if not isinstance(file, str) or not (out_dir / file).is_file():
                problems.append(f"claims[{k}] ({entry['id']}): figure {fig!r} has no PNG file in the report")
            elif (out_dir / file).read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
                problems.append(f"claims[{k}] ({entry['id']}): {file} is not a PNG")
    try:
        page = (out_dir / "index.html").read_text(encoding="utf-8")
    except OSError as exc:
        return problems + [f"index.html: {exc}"]
    anchors = set(re.findall(r"id='([^']*)'", page))      # once: a search of the page per claim is quadratic
    if "findings" not in anchors:        # the findings section's id (a claim's is "claim-...")
        problems.append("index.html: no findings section")
    for entry in entries:
        if anchor(entry["id"]) not in anchors:
            problems.append(f"index.html: no section for claim {entry['id']!r}")
    n_figures = sum(len(e["figures"]) for e in entries)
    n_inline = page.count('src="data:image/png;base64,')
    if n_inline != n_figures:
        problems.append(f"index.html: {n_inline} inline figures, claims.json lists {n_figures}")
    if "<script" in page.lower() or 'src="http' in page or "src='http" in page:
        problems.append("index.html: not self-contained (script or remote source)")
    return problems


# ---------------------------------------------------------------------------------------
# the pages: figures, the forest plot, the HTML page
# ---------------------------------------------------------------------------------------


def pyplot():
    """matplotlib.pyplot on the Agg backend: files only, never a display (the report runs on headless
    machines), whatever MPLBACKEND says -- a bad value there would otherwise stop ``import matplotlib``
    itself with a traceback.  Imported when a figure is first drawn, so that a command that refuses its
    arguments never loads matplotlib."""
    os.environ["MPLBACKEND"] = "Agg"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


FIGURE_KINDS = ("lines", "heatmap", "panels", "mix")
# Hollow markers under the lines: a prediction drawn through its measurements stays visible
# even where the points are dense.
SERIES_LOOK = {"line": dict(linestyle="-", lw=1.4, zorder=3),
               "points": dict(linestyle="none", marker="o", markersize=4.5, markerfacecolor="none",
                              markeredgewidth=1.0, zorder=2),
               "dashed": dict(linestyle="--", lw=1.4, zorder=3)}
SERIES_STYLES = tuple(SERIES_LOOK)
SCALES = ("linear", "log")

# Shading of successive spans (warm-up, emergence, convergence): light, distinct, and
# legible under the lines drawn on top.
SPAN_COLOURS = ("#fde0c5", "#c9e4f6", "#d5efd0", "#eadcf2", "#f6f2c4")
HLINE_COLOURS = ("#444444", "#b2182b", "#2166ac", "#1b7837")
# More than this many legend entries would cover the axes; the legend moves outside.
LEGEND_INSIDE_MAX = 8
# Size caps of a figure (a figure of 400 panels would be a 92-megapixel PNG): at most
# MAX_PANELS panels and LEGEND_MAX legend entries are drawn (the caption says so, the data stay
# in claims.json), heatmap labels only up to HEATMAP_LABELS_MAX per axis, and a PNG larger than
# MAX_PIXELS (a huge legend or title) is scaled down to it.
MAX_PANELS = 16
LEGEND_MAX = 40
HEATMAP_LABELS_MAX = 40
MAX_PIXELS = 4_000_000


class RenderError(ValueError):
    """A ``Figure`` that cannot be drawn, with what is wrong in it."""


# --------------------------------------------------------------------------- figures


def as_figure(obj: Any) -> Figure:
    """A ``Figure`` from a ``Figure`` or from its ``dataclasses.asdict`` form (as stored in
    ``claims.json``), so a figure can be redrawn from the JSON file alone."""
    if isinstance(obj, Figure):
        return obj
    if not isinstance(obj, dict):
        raise RenderError(f"a figure must be a claims.core.Figure or a dict, got {type(obj).__name__}")
    known = {f.name for f in dataclasses.fields(Figure)}
    unknown = set(obj) - known
    if unknown:
        raise RenderError(f"figure {obj.get('name', '?')!r} has unknown keys {sorted(unknown)}; "
                          f"known: {sorted(known)}")
    data = dict(obj)
    data["series"] = [s if isinstance(s, Series) else Series(**s) for s in data.get("series", [])]
    data["panels"] = [as_figure(p) for p in data.get("panels", [])]
    return Figure(**data)


def _number(v: Any) -> float:
    """A float from a figure coordinate; ``"nan"``/``"inf"`` strings are what ``jsonable``
    makes of non-finite floats, and ``None`` is a missing point."""
    if v is None:
        return math.nan
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise RenderError(f"figure coordinate {v!r} is not a number") from None
    return float(v)


def _check_lines(fig: Figure) -> None:
    if fig.xscale not in SCALES or fig.yscale not in SCALES:
        raise RenderError(f"figure {fig.name!r}: xscale/yscale must be one of {SCALES}, "
                          f"got {fig.xscale!r}/{fig.yscale!r}")
    for s in fig.series:
        if s.style not in SERIES_STYLES:
            raise RenderError(f"figure {fig.name!r}, series {s.label!r}: style must be one of "
                              f"{SERIES_STYLES}, got {s.style!r}")
        if len(s.x) != len(s.y):
            raise RenderError(f"figure {fig.name!r}, series {s.label!r}: x has {len(s.x)} points "
                              f"but y has {len(s.y)}; give one y per x")


def _label_tokens(label: str) -> set[str]:
    return set(re.split(r"[\s,;:()]+", label.lower())) - {""}


def series_colours(series: list[Series]) -> list[int]:
    """Palette index of each series, pairing measured points with their prediction.

    Lines (``line`` and ``dashed``) take successive colours.  A ``points`` series takes the
    colour of the line whose label shares the most words with its own ("measured m=3,
    sigma=0" with "theory m=3"; "full task 1" with "reduced task 1"), when that line is
    unique; otherwise the k-th points series takes the colour of the k-th line, or a colour
    no line uses."""
    line_indices = [j for j, s in enumerate(series) if s.style != "points"]
    line_colour = {j: c for c, j in enumerate(line_indices)}
    colours, unmatched = [], 0
    for j, s in enumerate(series):
        if s.style != "points":
            colours.append(line_colour[j])
            continue
        tokens = _label_tokens(s.label)
        overlaps = [(len(tokens & _label_tokens(series[i].label)), i) for i in line_indices]
        best = max((o for o, _ in overlaps), default=0)
        winners = [i for o, i in overlaps if o == best]
        if best > 0 and len(winners) == 1:
            colours.append(line_colour[winners[0]])
        else:
            colours.append(unmatched if unmatched < len(line_indices) else len(line_indices) + unmatched)
            unmatched += 1
    return colours


def _draw_lines(ax, fig: Figure) -> None:
    _check_lines(fig)
    palette = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    for span_index, span in enumerate(fig.spans):
        try:
            x0, x1 = _number(span["x0"]), _number(span["x1"])
        except KeyError as exc:
            raise RenderError(f"figure {fig.name!r}: a span needs keys 'x0', 'x1' (and 'label'); "
                              f"missing {exc}") from None
        if math.isfinite(x0) and math.isfinite(x1):
            ax.axvspan(x0, x1, color=SPAN_COLOURS[span_index % len(SPAN_COLOURS)], alpha=0.8,
                       zorder=0, lw=0, label=span.get("label") or None)
    colours = series_colours(fig.series)
    for s, colour_index in zip(fig.series, colours):
        colour = palette[colour_index % len(palette)]
        x = [_number(v) for v in s.x]
        y = [_number(v) for v in s.y]
        ax.plot(x, y, color=colour, label=s.label, **SERIES_LOOK[s.style])
    for line_index, hline in enumerate(fig.hlines):
        if "y" not in hline:
            raise RenderError(f"figure {fig.name!r}: an hline needs key 'y' (and 'label')")
        y = _number(hline["y"])
        if math.isfinite(y):
            ax.axhline(y, color=HLINE_COLOURS[line_index % len(HLINE_COLOURS)], lw=1.2,
                       linestyle=":", label=hline.get("label") or None, zorder=1)
    ax.set_xscale(fig.xscale)
    ax.set_yscale(fig.yscale)
    for axis, scale in ((ax.xaxis, fig.xscale), (ax.yaxis, fig.yscale)):
        if scale == "log":
            _log_ticks(axis)
    _label_axes(ax, fig)
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles, labels = handles[:LEGEND_MAX], labels[:LEGEND_MAX]
    if labels:
        if len(labels) <= LEGEND_INSIDE_MAX:
            ax.legend(handles, labels, fontsize=7, loc="best", framealpha=0.85)
        else:
            ax.legend(handles, labels, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      borderaxespad=0, ncol=1 + len(labels) // 24)


def _label_axes(ax, fig: Figure) -> None:
    ax.set_xlabel(fig.xlabel)
    ax.set_ylabel(fig.ylabel)
    ax.set_title(fig.title, fontsize=10)


def _log_ticks(axis) -> None:
    """Plain-number tick labels at 1, 2, 5 x 10^k on a log axis spanning at most two decades
    (1, 2, 3, 5 x 10^k within one), decades only on wider axes: Matplotlib's default labels
    of minor ticks on short log axes (3x10^-2 next to 4x10^-2) overlap."""
    from matplotlib import ticker

    lo, hi = axis.get_view_interval()
    if not (lo > 0 and hi > lo and math.isfinite(hi)):
        return
    plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    decades = math.log10(hi / lo)
    if decades <= 2:
        subs = (2.0, 3.0, 5.0) if decades <= 1 else (2.0, 5.0)
        axis.set_minor_locator(ticker.LogLocator(base=10, subs=subs))
        axis.set_minor_formatter(plain)
    else:
        axis.set_minor_formatter(ticker.NullFormatter())


def _draw_heatmap(fig_mpl, ax, fig: Figure) -> None:
    if not fig.matrix or not all(isinstance(row, (list, tuple)) and row for row in fig.matrix):
        raise RenderError(f"figure {fig.name!r}: a heatmap needs a non-empty matrix (list of rows)")
    widths = {len(row) for row in fig.matrix}
    if len(widths) != 1:
        raise RenderError(f"figure {fig.name!r}: heatmap rows have different lengths {sorted(widths)}")
    rows, cols = len(fig.matrix), widths.pop()
    if fig.row_labels and len(fig.row_labels) != rows:
        raise RenderError(f"figure {fig.name!r}: {len(fig.row_labels)} row labels for {rows} rows")
    if fig.col_labels and len(fig.col_labels) != cols:
        raise RenderError(f"figure {fig.name!r}: {len(fig.col_labels)} column labels for {cols} columns")
    values = [[_number(v) for v in row] for row in fig.matrix]
    finite = [v for row in values for v in row if math.isfinite(v)]
    if finite and min(finite) < 0 < max(finite):
        # signed values (e.g. the merged parametrisation's superposition): a diverging map
        # centred on zero, so that sign is read off the colour
        bound = max(abs(v) for v in finite)
        image = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        mid = None
    else:
        image = ax.imshow(values, cmap="viridis", aspect="auto")
        mid = (min(finite) + max(finite)) / 2 if finite else 0.0
    fig_mpl.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if cols <= HEATMAP_LABELS_MAX:  # beyond that the labels overlap: Matplotlib's own ticks
        ax.set_xticks(range(cols), fig.col_labels or [str(j) for j in range(cols)], fontsize=8)
    if rows <= HEATMAP_LABELS_MAX:
        ax.set_yticks(range(rows), fig.row_labels or [str(i) for i in range(rows)], fontsize=8)
    if rows * cols <= 144:  # beyond that the numbers would not fit in their cells
        bound = max((abs(v) for v in finite), default=1.0)
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if not math.isfinite(v):
                    dark_cell = False  # imshow leaves non-finite cells blank (white)
                elif mid is None:
                    dark_cell = abs(v) > 0.6 * bound
                else:
                    dark_cell = v < mid
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8,
                        color="white" if dark_cell else "black")
    _label_axes(ax, fig)


MIX_COLOURS = ("#1b7837", "#762a83", "#e08214", "#2166ac", "#bdbdbd", "#b2182b", "#35978f", "#8c510a")


def _draw_mix(ax, fig: Figure) -> None:
    """A class mix: one horizontal stacked bar per row (``row_labels``: a start), one segment
    per column (``col_labels``: a class) of length ``matrix[row][col]`` (a count), its count
    written inside; classes coloured in column order."""
    if not fig.matrix or not all(isinstance(row, (list, tuple)) for row in fig.matrix):
        raise RenderError(f"figure {fig.name!r}: a mix needs a non-empty matrix (a list of rows of counts)")
    cols = len(fig.col_labels)
    if cols == 0 or any(len(row) != cols for row in fig.matrix):
        raise RenderError(f"figure {fig.name!r}: a mix needs one column label per count of every row "
                          f"({cols} labels)")
    if len(fig.row_labels) != len(fig.matrix):
        raise RenderError(f"figure {fig.name!r}: {len(fig.row_labels)} row labels for {len(fig.matrix)} rows")
    values = [[_number(v) for v in row] for row in fig.matrix]
    if any(not math.isfinite(v) or v < 0 for row in values for v in row):
        raise RenderError(f"figure {fig.name!r}: a mix's counts must be finite and >= 0")
    rows = len(values)
    left = [0.0] * rows
    for j, label in enumerate(fig.col_labels):
        width = [row[j] for row in values]
        bars = ax.barh(range(rows), width, left=left, color=MIX_COLOURS[j % len(MIX_COLOURS)], label=str(label),
                       edgecolor="white")
        for bar, w in zip(bars, width):
            if w > 0:
                ax.text(bar.get_x() + w / 2, bar.get_y() + bar.get_height() / 2, f"{w:g}", ha="center",
                        va="center", fontsize=8, color="white")
        left = [a + w for a, w in zip(left, width)]
    ax.set_yticks(range(rows), [str(r) for r in fig.row_labels], fontsize=8)
    ax.invert_yaxis()
    _label_axes(ax, fig)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def figure_png(figure: Any, dpi: int = 110) -> bytes:
    """PNG bytes of one figure. Raises :class:`RenderError` saying what is wrong with it.  Panels
    stand side by side up to 4, more wrap into rows of at most 4 (2H panels of omega and mu per
    head give one row of omega and one of mu); beyond MAX_PANELS only the first are drawn
    (:func:`size_note` says so in the caption)."""
    plt = pyplot()
    fig = as_figure(figure)
    if fig.kind not in FIGURE_KINDS:
        raise RenderError(f"figure {fig.name!r}: kind must be one of {FIGURE_KINDS}, got {fig.kind!r}")
    if fig.kind == "panels":
        if not fig.panels:
            raise RenderError(f"figure {fig.name!r}: kind 'panels' needs a non-empty 'panels' list")
        for p in fig.panels:
            if p.kind != "lines":
                raise RenderError(f"figure {fig.name!r}: every panel must be of kind 'lines', got {p.kind!r}")
        n = min(len(fig.panels), MAX_PANELS)
        rows = math.ceil(n / 4)
        cols = math.ceil(n / rows)
        mpl_fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols + 1.0, 3.6 * rows + 0.4),
                                     squeeze=False, layout="constrained")
    else:
        mpl_fig, ax = plt.subplots(figsize=(6.4, 4.2))
    try:
        if fig.kind == "panels":
            for ax, panel in zip(axes.flat, fig.panels[:n]):
                _draw_lines(ax, panel)
            for ax in list(axes.flat)[n:]:
                ax.set_visible(False)
            mpl_fig.suptitle(fig.title, fontsize=11)
        elif fig.kind == "lines":
            _draw_lines(ax, fig)
        elif fig.kind == "mix":
            _draw_mix(ax, fig)
            mpl_fig.tight_layout()
        else:
            _draw_heatmap(mpl_fig, ax, fig)
        return _png(mpl_fig, dpi)
    finally:
        plt.close(mpl_fig)


def size_note(figure: Any) -> str:
    """What the size caps left out of a figure, for its caption ("" when nothing was)."""
    fig = as_figure(figure)
    notes = []
    if fig.kind == "panels" and len(fig.panels) > MAX_PANELS:
        notes.append(f"the first {MAX_PANELS} of its {len(fig.panels)} panels are drawn")
    for panel in ([fig] if fig.kind == "lines" else fig.panels[:MAX_PANELS] if fig.kind == "panels" else []):
        labelled = len([s for s in panel.series if s.label]) + len(panel.spans) + len(panel.hlines)
        if labelled > LEGEND_MAX:
            notes.append(f"the legend of {panel.name!r} lists the first {LEGEND_MAX} of {labelled} entries")
    return f"(Size cap: {'; '.join(notes)}; every value is in claims.json.)" if notes else ""


# Colours kept in a figure's PNG: Matplotlib's antialiased RGBA PNGs reduced to a 256-colour
# palette (no dithering) are about 2.7 times smaller and look the same; the tiny report's 16
# figures went from 511 kB to 189 kB, which keeps the quick report's page (figures inline as
# base64) well under 1 MB.
PNG_COLOURS = 256


def _png(mpl_fig, dpi: int) -> bytes:
    from PIL import Image  # Matplotlib's own dependency

    buffer = io.BytesIO()
    mpl_fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    buffer.seek(0)
    with Image.open(buffer) as image:
        image = image.convert("RGB")
        if image.width * image.height > MAX_PIXELS:
            scale = math.sqrt(MAX_PIXELS / (image.width * image.height))
            image = image.resize((max(1, int(image.width * scale)), max(1, int(image.height * scale))))
        palette = image.quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT,
                                               dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


# --------------------------------------------------------------------------- the forest plot


@dataclass(frozen=True)
class ForestRow:
    """One comparison of a report as the forest plot draws it.

    ``value`` is the normalised error (measured - predicted) / tolerance where the comparison
    compares two numbers in the units of its tolerance (``signed``), else its error /
    tolerance (the |normalised error|: the comparison of lists, brackets or dicts, or an error
    in other units); ``bar`` is se / tolerance (None: no standard error, or not in the
    tolerance's units); ``side`` one of two-sided / not above / not below."""

    claim: str
    name: str
    config: Optional[str]
    side: str
    value: float
    bar: Optional[float]
    signed: bool
    agrees: Optional[bool]


ONE_SIDED = ("not above", "not below")
# Agreement is |value| <= 1; values beyond FOREST_CLIP are drawn at the edge with their number.
FOREST_CLIP = 3.0
# Within this relative difference an error is the side's error function of (measured, predicted):
# the comparison is in the measured value's units and (measured - predicted) / tolerance means what
# it says; otherwise only error / tolerance is drawn.
SAME_ERROR = 1e-9
FOREST_FILE = "figures/forest.png"   # written beside the claims' figures (README links it)
AGREE_COLOUR, DISAGREE_COLOUR, BAND_COLOUR = "#0969da", "#cf222e", "#dcefdc"


def comparison_records(entry: dict) -> list[dict]:
    """The comparisons of one claims.json entry: ``details["comparisons"]`` (each a
    ``claims.core.Comparison.summary()``)."""
    details = entry.get("details") if isinstance(entry.get("details"), dict) else {}
    return [c for c in details.get("comparisons") or [] if isinstance(c, dict)]


def forest_row(claim_id: str, c: dict) -> Optional[ForestRow]:
    """The forest row of one comparison record (None where it has no tolerance to normalise by)."""
    measured, predicted = scalar(c.get("measured")), scalar(c.get("predicted"))
    error, tolerance, se = scalar(c.get("error")), scalar(c.get("tolerance")), scalar(c.get("se"))
    side = c.get("side") or "two-sided"
    if tolerance is None or math.isnan(tolerance) or tolerance < 0:
        return None
    agrees = c.get("agrees") if isinstance(c.get("agrees"), bool) else None
    common = dict(claim=claim_id, name=str(c.get("name", "")), config=c.get("config"), side=side, agrees=agrees)
    if measured is not None and predicted is not None and math.isfinite(measured) and math.isfinite(predicted):
        d = measured - predicted
        own = side_error(side, measured, predicted)
        if error is None or abs(own - error) <= SAME_ERROR * max(abs(own), abs(error), 1e-300):
            if tolerance > 0:
                bar = se / tolerance if se is not None and math.isfinite(se) and se > 0 else None
                return ForestRow(value=d / tolerance, bar=bar, signed=True, **common)
            return ForestRow(value=0.0 if d == 0 else math.copysign(math.inf, d), bar=None, signed=True, **common)
    if error is None or math.isnan(error):
        return None
    return ForestRow(value=_over(error, tolerance), bar=None, signed=False, **common)


def forest_rows(report: dict, order: Optional[list[str]] = None) -> tuple[list[ForestRow], int]:
    """The forest rows of a claims.json document, claims in ``order`` (ids; default report
    order), and how many comparisons could not be drawn (no tolerance or error to normalise)."""
    entries = {e.get("id"): e for e in report.get("claims") or [] if isinstance(e, dict)}
    ids = [cid for cid in (order or list(entries)) if cid in entries]
    rows, left_out = [], 0
    for cid in ids:
        for c in comparison_records(entries[cid]):
            row = forest_row(cid, c)
            if row is None:
                left_out += 1
            else:
                rows.append(row)
    return rows, left_out


def _forest_layout(rows: list[ForestRow]) -> tuple[list[float], list[tuple[str, float, float]]]:
    """The y of every row (top to bottom) and each claim's (id, y top, y bottom): rows one unit
    apart, a gap between claims, at least 1.8 units per claim (so that the labels of claims with
    a single comparison do not overlap)."""
    ys, groups, y = [], [], 0.0
    k = 0
    while k < len(rows):
        cid = rows[k].claim
        n = 1
        while k + n < len(rows) and rows[k + n].claim == cid:
            n += 1
        height = max(float(n), 1.8)
        pad = (height - n) / 2
        ys += [y + pad + j + 0.5 for j in range(n)]
        groups.append((cid, y, y + height))
        y += height + 0.8
        k += n
    return ys, groups


def _forest_label(claim_id: str) -> str:
    return claim_id[len("boundary-"):] if claim_id.startswith("boundary-") else claim_id


#: The most rows the forest plot draws (the quick report has about 100): a hand-made report of 20,000
#: comparisons would make a figure of 3,000 inches (hundreds of megapixels, minutes to draw); beyond, the
#: first rows in the scorecard's order (failing claims first) are drawn and the caption says how many were
#: left out (the page's forest caption).
FOREST_MAX_ROWS = 400


def forest_figure(rows: list[ForestRow], width: float = 5.4):
    """The Matplotlib figure of the forest plot (the caller saves and closes it): at most
    :data:`FOREST_MAX_ROWS` rows."""
    rows = rows[:FOREST_MAX_ROWS]
    ys, groups = _forest_layout(rows)
    total = (groups[-1][2] if groups else 1.0)
    height = 1.05 + 0.066 * total
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(width, height))
    fig.subplots_adjust(left=0.33, right=0.97, top=1 - 0.55 / height, bottom=0.42 / height)
    for j, (cid, top, bottom) in enumerate(groups):
        if j % 2:  # every other claim on a grey ground, under the band
            ax.axhspan(top - 0.4, bottom + 0.4, color="#f0f0f0", zorder=0, lw=0)
    ax.axvspan(-1, 1, color=BAND_COLOUR, alpha=0.75, zorder=0.5, lw=0)
    ax.axvline(0, color="#888888", lw=0.6, zorder=1)
    clip = FOREST_CLIP
    styles: dict[tuple, list[tuple[float, float]]] = {}
    for row, y in zip(rows, ys):
        colour = DISAGREE_COLOUR if row.agrees is False else AGREE_COLOUR
        x = max(-clip, min(clip, row.value)) if math.isfinite(row.value) or math.isinf(row.value) else 0.0
        if abs(row.value) > clip:
            ax.annotate(f"{row.value:.3g}".replace("-", "−") if math.isfinite(row.value)
                        else ("∞" if row.value > 0 else "−∞"), (x, y),
                        xytext=(-3 if row.value > 0 else 3, 0), textcoords="offset points",
                        ha="right" if row.value > 0 else "left", va="center", fontsize=5.5, color=colour)
        if row.bar is not None and abs(row.value) <= clip:
            ax.plot([max(-clip, x - row.bar), min(clip, x + row.bar)], [y, y], color=colour, lw=0.9, zorder=2,
                    solid_capstyle="butt")
        if row.side in ONE_SIDED:
            bound = 1.0 if (row.side == "not above" or not row.signed) else -1.0
            ax.plot([x, bound], [y, y], color=colour, lw=0.5, linestyle=":", zorder=2)
            ax.plot([bound], [y], marker="|", markersize=5, color=colour, zorder=3)
            marker = "<" if bound > 0 else ">"
        elif abs(row.value) > clip:
            marker = ">" if row.value > 0 else "<"
        else:
            marker = "o"
        filled = row.signed
        styles.setdefault((marker, colour, filled), []).append((x, y))
    for (marker, colour, filled), points in styles.items():
        xs, yy = zip(*points)
        ax.plot(xs, yy, linestyle="none", marker=marker, markersize=3.6, color=colour, zorder=4,
                markerfacecolor=colour if filled else "white", markeredgewidth=0.8)
    ax.set_xlim(-clip - 0.25, clip + 0.25)
    ax.set_ylim(total + 0.3, -0.3)
    ax.set_yticks([(top + bottom) / 2 for _, top, bottom in groups], [_forest_label(g[0]) for g in groups],
                  fontsize=7)
    ax.tick_params(axis="y", length=0)
    ax.set_xticks([-3, -2, -1, 0, 1, 2, 3])
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("(measured − predicted) / tolerance", fontsize=7.5)
    ax.grid(False)
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    handles = [plt.Line2D([], [], linestyle="none", marker=marker, color=colour, markersize=4, label=label, **face)
               for marker, colour, label, face in (("o", AGREE_COLOUR, "agrees", {}),
                                                   ("o", DISAGREE_COLOUR, "disagrees", {}),
                                                   ("o", "#555555", "|error| / tol (not scalars)",
                                                    {"markerfacecolor": "white"}),
                                                   ("<", "#555555", "one-sided, bound |", {}))]
    fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=6.5, frameon=False,
               bbox_to_anchor=(0.62, 1.0), handletextpad=0.3, columnspacing=1.0)
    return fig


def forest_svg(rows: list[ForestRow]) -> str:
    """The forest plot as an inline ``<svg>`` element (text kept as text, no script): the page
    embeds it, so it is drawn crisp at any size and counts as no claim figure."""
    fig = forest_figure(rows)
    try:
        with pyplot().rc_context({"svg.fonttype": "none", "svg.hashsalt": "forest"}):
            buffer = io.StringIO()
            fig.savefig(buffer, format="svg", facecolor="white", metadata={"Date": None})
    finally:
        pyplot().close(fig)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]
    # the page sizes it by CSS (its viewBox is kept): drop the fixed width and height in pt
    svg = re.sub(r'^<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1', svg, count=1)
    return svg.replace("<svg", '<svg id="forest-plot" role="img" aria-label="forest plot of every comparison"', 1)


def forest_png(rows: list[ForestRow], dpi: int = 150) -> bytes:
    """The forest plot as PNG bytes (the file the README links)."""
    fig = forest_figure(rows)
    try:
        return _png(fig, dpi)
    finally:
        pyplot().close(fig)


# --------------------------------------------------------------------------- the page


TEMPLATES = Path(__file__).with_name("templates")

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
def environment():
    """The templates' jinja2 environment: autoescaped, undefined names an error (a template that
    names a missing value fails in the tests, not silently on a reader's page)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update(value=format_value, seconds=_seconds, anchor=anchor,
                       flat=lambda d: [(k, format_value(v)) for k, v in flatten(d or {}).items()])
    env.globals.update(badge_class=badge_class, PERTURBATIONS_SHOWN_MAX=PERTURBATIONS_SHOWN_MAX)
    return env


def data_uri(png: bytes) -> str:
    """A PNG inline in the page (the page is one self-contained file)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


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
        items = [(f"{prefix}[{k}]", x) for k, x in enumerate(d)]
    elif isinstance(d, dict) and (d or not prefix):     # an empty dict inside is a leaf
        items = [(f"{prefix}.{key}" if prefix else str(key), x) for key, x in d.items()]
    else:
        return {prefix or "value": d}
    flat: dict[str, Any] = {}
    for path, value in items:
        flat.update(flatten(value, path))
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
    """Whether the entry's outcome makes the build exit 1 (``claims.core.FAILING``)."""
    return entry.get("verdict") in FAILING.get(kind_of(entry), ())


def anchor(claim_id: str) -> str:
    return "claim-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in str(claim_id))



def _verdict_reason(entry: dict) -> str:
    """Which rule of ``claims.core.judge`` (or of ``run_claim``) gave the verdict."""
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
# A judged row's allowed difference, and its marks (agreeing, its CSS class, disagreeing), by side.
SIDE_CELLS = {"two-sided": ("|Δ| ≤ {}", "yes ✓", "agree", "no ✗"),
              "not above": ("Δ ≤ +{}", "not above ✓", "bound", "above ✗"),
              "not below": ("Δ ≥ −{}", "not below ✓", "bound", "below ✗")}


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
    side, tol, agrees = r.get("side") or "two-sided", r.get("tolerance"), r.get("agrees")
    measured = _number_text(r.get("measured"))
    if r.get("se") is not None and r.get("measured") is not None:
        measured += f" ± {format_value(r.get('se'))}"
    if side == "reported":
        theory = "—" if r.get("theory") is None else f"{_number_text(r.get('theory'))} (for reference)"
        return dict(theory=theory, measured=measured, allowed="—", mark="reported, no comparison",
                    mark_class="reported")
    allowed, agree_mark, agree_class, disagree_mark = SIDE_CELLS.get(side, SIDE_CELLS["two-sided"])
    theory = (f"{SIDE_WORDS[side][0]} {_number_text(_bound(r.get('theory'), side))} ({side})" if side in SIDE_WORDS
              else _number_text(r.get("theory")))
    mark, cls = ((agree_mark, agree_class) if agrees is True else (disagree_mark, "disagree") if agrees is False
                 else ("—", ""))
    return dict(theory=theory, measured=measured, allowed="—" if tol is None else allowed.format(format_value(tol)),
                mark=mark, mark_class=cls)


def headline_row(entry: dict) -> Optional[dict]:
    """The row that is a claim's headline: the row of the comparison its spec names
    (``claims.core.Outcome.headline_comparison``, stored as
    ``details.resolving_power.headline.name``), or that comparison itself where no row shows it;
    else its first headline row (None without one)."""
    rows = [r for r in entry.get("headline") or [] if isinstance(r, dict)]
    if not rows:
        return None
    power = (entry.get("details") or {}).get("resolving_power")
    head = power.get("headline") if isinstance(power, dict) else None
    name = head.get("name") if isinstance(head, dict) else None
    if isinstance(name, str):
        for r in rows:
            if r.get("name") == name:
                return r
        for c in comparison_records(entry):
            if c.get("name") == name:
                return {**{k: c.get(k) for k in ("measured", "se", "tolerance", "agrees", "config", "resolving_power")},
                        "name": name, "theory": c.get("predicted"), "side": c.get("side", "two-sided")}
    return rows[0]


def _row_record(entry: dict, row: dict) -> dict:
    """A headline row as a comparison record: the comparison of its name (its error, margin and
    resolving power) with the numbers the row shows where it shows them (the claim chose those for a
    reader: a scalar for a ratio, theory as the prediction)."""
    same = [c for c in comparison_records(entry) if c.get("name") == row.get("name")]
    shown = {"predicted": row.get("theory"), **{k: row.get(k) for k in ("measured", "tolerance", "se", "side", "agrees",
                                                                        "config")}}
    if not same:
        return {**row, **shown}
    if shown["measured"] is None and shown["predicted"] is None:   # a structure the row could not show
        shown.pop("measured"), shown.pop("predicted"), shown.pop("tolerance")
    return {**same[0], **{k: v for k, v in shown.items() if v is not None}}


def deciding(entry: dict) -> tuple[str, Optional[dict]]:
    """The row that decided an id's outcome, and the words that lead to it: for a failing id, the
    disagreeing comparison of largest error / tolerance ("1 of 3 comparisons disagrees:"); for one
    that could not decide, the reason (no row); for the others, the claim's headline
    (:func:`headline_row`)."""
    verdict = str(entry.get("verdict"))
    if is_failing(entry) or verdict == "undecided":
        disagreeing = [c for c in comparison_records(entry) if c.get("agrees") is False]
        if disagreeing:
            _, judged = agreement_count(entry)
            lead = (f"{len(disagreeing)} of {judged} comparisons disagree; the worst:" if len(disagreeing) > 1
                    else f"1 of {judged} comparisons disagrees:" if judged > 1 else "")
            return lead, max(disagreeing, key=_margin)
        details = entry.get("details") or {}
        reason = details.get("error") if details.get("traceback") else None
        return f"{verdict}: {str(reason)[:300] + '.' if reason else _verdict_reason(entry)}", None
    row = headline_row(entry)
    return "", None if row is None else _row_record(entry, row)


_SETTING = re.compile(r"(\w+)=(\([^)]*\)|\[[^\]]*\]|[^\s,;]+)")
_WORD_SETTINGS = ("init", "param", "basis")   # "init decomposable"; the rest "H = 2", in the paper's notation


def config_words(text: Any) -> str:
    """A configuration label (or a name holding one) in words, in place, in the paper's notation:
    "tasks=(2, 2) H=2 sigma=0 init=decomposable at growing s0" -> "r = (2, 2), H = 2, σ = 0, init
    decomposable at growing s0"."""
    def word(match: re.Match) -> str:   # each setting marked (STX ... ETX) to join neighbours by commas
        key, value = {"sigma": "σ", "tasks": "r"}.get(match[1], match[1]), match[2]
        value = f"({value[1:-1]})" if value.startswith("[") else value   # r = (2, 2), as the paper writes it
        return f"\x02{key} {value}\x03" if key in _WORD_SETTINGS else f"\x02{key} = {value}\x03"
    marked = re.sub("\x03\\s+\x02", ", ", _SETTING.sub(word, " ".join(str(text).split())))
    return marked.replace("\x02", "").replace("\x03", "")


def _leaves(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """The leaves of a nested value with their place: dict keys as words, list items as "entry k"."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}, {k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [leaf for k, v in enumerate(value) for leaf in _leaves(v, f"{path}, entry {k + 1}" if path
                                                                       else f"entry {k + 1}")]
    return [(path, value)]


def _off(m: float, p: float) -> str:
    """How far a measured number is from its prediction, relatively: "1.1 % off", "off by a factor 5.3"."""
    if p == 0 or m == 0 or (m > 0) != (p > 0):
        return f"{format_value(abs(m - p))} apart"
    rel = abs(m - p) / abs(p)
    return f"{100 * rel:.2g} % off" if rel < 1 else f"off by a factor {max(m / p, p / m):.2g}"


def _pairs(c: dict) -> tuple[list[tuple[str, float, float]], int]:
    """The numbers a comparison compared, paired by their place in measured and predicted, and how
    many measured values are not numbers (an event a run did not reach, say)."""
    measured, predicted = _leaves(c.get("measured")), dict(_leaves(c.get("predicted")))
    pairs = [(where, scalar(m), scalar(predicted.get(where))) for where, m in measured if where in predicted]
    pairs = [(w, m, p) for w, m, p in pairs if m is not None and p is not None and math.isfinite(m) and math.isfinite(p)]
    return pairs, sum(scalar(m) is None for _, m in measured)


def _structured(c: dict) -> str:
    """Measured and predicted values that are not one number each, in words: how many numbers were
    compared and the furthest pair (where it is, measured against predicted, how far), never the
    whole structure; to rounding only that they agree (which pair is furthest is rounding)."""
    pairs, words = _pairs(c)
    undefined = f"; {words} measured value(s) not a number" if words else ""
    if not pairs:
        return f"{len(_leaves(c.get('measured')))} measured values against {_predicted_words(c.get('predicted'))}"
    if at_rounding(c):
        return f"{len(pairs)} numbers, each theory's to rounding{undefined}"
    where, m, p = max(pairs, key=lambda t: abs(t[1] - t[2]))
    return (f"{len(pairs)} numbers, the furthest{' at ' + where if where else ''}: measured {format_value(m)} "
            f"against {format_value(p)}, {_off(m, p)}{undefined}")


def _predicted_words(p: Any) -> str:
    """A prediction in words: a number, "between a and b" for a bracket, "n values" for a structure."""
    if scalar(p) is not None or isinstance(p, str) or p is None:
        return format_value(p) if p is not None else "no prediction"
    if isinstance(p, (list, tuple)) and len(p) == 2 and all(scalar(x) is not None for x in p):
        return format_value(p[0]) if p[0] == p[1] else f"between {format_value(p[0])} and {format_value(p[1])}"
    return f"{len(_leaves(p))} predicted values"


#: A comparison without a standard error that agrees to this fraction of its values' size (1 for a prediction
#: of 0), or whose tolerance is that small, is exact to rounding: what it measures below its tolerance is the
#: rounding of one CPU's BLAS kernels, which another CPU rounds differently (float64's eps is 2.2e-16; no
#: statistical or discretisation error of the claims comes near 1e-6).  The report prints such a residual as
#: "< tolerance", a bound the claim fixed from the dtype's eps and the problem's size, and its resolving power
#: in words: never digits of the residual.
ROUNDING_LEVEL = 1e-6


def at_rounding(c: dict) -> bool:
    """Whether a comparison record agrees to rounding (:data:`ROUNDING_LEVEL`)."""
    t = scalar(c.get("tolerance"))
    if c.get("agrees") is not True or scalar(c.get("se")) is not None or t is None or not math.isfinite(t):
        return False
    pairs, words = _pairs(c)
    if not pairs or words:
        return False
    size = max([1.0] + [max(abs(m), abs(p)) for _, m, p in pairs])
    return t <= ROUNDING_LEVEL * size or max(abs(m - p) for _, m, p in pairs) <= ROUNDING_LEVEL * size


def _distance(c: dict) -> Optional[float]:
    """The distance a comparison's side measures between its numbers: one measured number against a
    number or a bracket [low, high] (0 inside it), or the furthest pair of a structure; None without one."""
    m, p = scalar(c.get("measured")), c.get("predicted")
    ends = [scalar(p)] if scalar(p) is not None else [scalar(x) for x in p] if (
        isinstance(p, (list, tuple)) and len(p) == 2) else [None]
    if m is not None and None not in ends:
        low, high = min(ends), max(ends)
        return {"not above": max(0.0, m - high), "not below": max(0.0, low - m)}.get(
            c.get("side"), max(0.0, low - m, m - high))
    pairs, _ = _pairs(c)
    return max(abs(a - b) for _, a, b in pairs) if pairs else None


def _in_units(c: dict) -> bool:
    """Whether a comparison's error (so its tolerance) is in the units of its values: a headline row
    (no stored error), or an error that is the distance its side measures (:func:`_distance`)."""
    error, distance = scalar(c.get("error")), _distance(c)
    return error is None or (distance is not None and math.isclose(error, distance, rel_tol=1e-6, abs_tol=1e-300))


def _up(x: float) -> str:
    """``x`` to two significant digits, rounded up (a bound stays a bound)."""
    if x <= 0 or not math.isfinite(x):
        return format_value(x)
    quantum = 10.0 ** (math.floor(math.log10(x)) - 1)
    return f"{math.ceil(x / quantum - 1e-9) * quantum:.2g}"


def _scalar_values(c: dict) -> str:
    """"measured M against P" for one measured number: M at the precision its run resolves (a
    rounding residual against 0 as "< tolerance"), P a number, a bracket or a one-sided bound."""
    m, p, side, tol = c.get("measured"), c.get("predicted"), c.get("side") or "two-sided", c.get("tolerance")
    if at_rounding(c) and scalar(p) == 0 and scalar(tol):
        # a residual: bounded by its tolerance where the error is in its units (else "0 to rounding")
        measured = f"< {_up(scalar(tol))}" if _in_units(c) else "0 to rounding"
    else:
        measured = printed(m, c.get("se"), tol if scalar(tol) is not None else None)
    if side in SIDE_WORDS:
        return f"measured {measured}, {SIDE_WORDS[side][1]} {format_value(_bound(p, side))}"
    if side == "reported":
        return f"measured {measured}" + ("" if p is None else f" (theory, for reference: {_predicted_words(p)})")
    return f"measured {measured} against {_predicted_words(p)}"


def sentence(c: dict) -> str:
    """One comparison (or headline row, as a record) as a sentence: its name, the numbers compared
    (:func:`_scalar_values`, or :func:`_structured` for anything but one measured number), the tolerance
    (where the error is in the values' units; else the error in tolerances), by how many tolerances it
    misses where it disagrees, and its configuration in words."""
    m = c.get("measured")
    values = _scalar_values(c) if (scalar(m) is not None or m is None or isinstance(m, str)) else _structured(c)
    extras, tol, margin = [], c.get("tolerance"), _margin(c)
    if scalar(tol) is not None and _in_units(c):
        extras.append(f"tolerance {format_value(tol)}")
    elif isinstance(tol, (list, tuple)) and tol:
        ts = [x for _, v in _leaves(tol) if (x := scalar(v)) is not None]
        extras += [f"tolerance {format_value(min(ts))} to {format_value(max(ts))} per entry"] if ts else []
    elif math.isfinite(margin) and scalar(tol) and c.get("agrees") and not at_rounding(c):
        extras.append(f"error {margin:.2g} × its tolerance")
    if c.get("agrees") is False and math.isfinite(margin):
        extras.append(f"missed by {margin:.2g} × {'it' if extras else 'its tolerance'}")
    elif c.get("agrees") is False and scalar(c.get("error")) is not None:
        extras.append(f"error {format_value(c.get('error'))}")
    name, config = config_words(c.get("name", "")), c.get("config")
    if config and not _SETTING.search(str(c.get("name", ""))):
        extras.append(config_words(config))
    return f"{name}: {values}" + (f" ({'; '.join(extras)})" if extras else "") + "."


# --------------------------------------------------------------------------- the scorecard


def agreement_count(entry: dict) -> tuple[int, int]:
    """(comparisons that agree, comparisons) of a claim (its judged headline rows where it
    recorded no comparisons)."""
    judged = [c for c in comparison_records(entry) if isinstance(c.get("agrees"), bool)]
    return sum(c["agrees"] for c in judged), len(judged)


def power_words(c: Optional[dict]) -> str:
    """A comparison's resolving power (``claims.core.Comparison.resolving_power``, confirmed when the
    report was built) in words: "rejects a 3.1 % error", "rejects an absolute error of 0.012", "rejects a
    count off by 1"; one-sided: "rejects a prediction 3.1 % too low"; a power of 100 % or more: "rejects
    only order-of-magnitude errors (a factor 2.3)"; an exact comparison: "rejects any error"; within a
    rounding tolerance: "rejects any error beyond rounding" (its digits are rounding)."""
    if c is None:
        return "—"
    rp = c.get("resolving_power")
    if c.get("power_unconfirmed"):
        return f"not confirmed: {c['power_unconfirmed']}"
    if not isinstance(rp, dict):
        return "not recorded"
    side = c.get("side") or "two-sided"
    keys = {"not above": ("low",), "not below": ("high",)}.get(side, ("low", "high"))
    eps = [scalar(rp.get(k)) for k in keys]
    if any(e is None for e in eps):
        blind = [{"low": "too low", "high": "too high"}[k] for k, e in zip(keys, eps) if e is None]
        return f"blind to a prediction {' or '.join(blind)}"
    worst, units = max(eps), rp.get("units")
    if worst == 0:
        return "rejects its prediction itself"
    if set(keys) <= set(rp.get("bound") or ()):
        return "rejects any error (an exact comparison)"
    if at_rounding(c) and units != "count":
        return "rejects any error beyond rounding (its tolerance)"
    if units == "count":
        return f"rejects a count off by {worst:g}"
    if units != "absolute" and worst >= 1:
        return f"rejects only order-of-magnitude errors (a prediction off by a factor {1 + worst:.2g})"
    size = f"{worst:.2g}" if units == "absolute" else f"{100 * worst:.2g} %"
    if len(keys) == 1:
        return f"rejects a prediction {size} too {'low' if keys == ('low',) else 'high'}"
    return f"rejects an absolute error of {size}" if units == "absolute" else f"rejects a {size} error"


def _margin(c: dict) -> float:
    """error / tolerance of a comparison record; of a headline row (no stored error), its distance
    (:func:`_distance`) over its tolerance."""
    margin = scalar(c.get("margin"))
    if margin is not None and not math.isnan(margin):
        return margin
    error, tolerance = scalar(c.get("error")), scalar(c.get("tolerance"))
    error = _distance(c) if error is None else error
    return math.inf if error is None or tolerance is None else _over(error, tolerance)


def _over(error: float, tolerance: float) -> float:
    """error / tolerance; against a tolerance of 0 (an exact check), 0 or infinity."""
    return error / tolerance if tolerance > 0 else (0.0 if error <= 0 else math.inf)


def scorecard(report: dict) -> list[dict]:
    """The first screen as data: ``[{key, heading, rows}]`` per group (the paper's claims, where
    they stop, beyond the paper), each row ``{id, anchor, title, kind, verdict, failing, lead,
    headline, paper, agree, of, resolving}``: ``headline`` the sentence of the row that decided the
    outcome (:func:`deciding`, :func:`sentence`), ``lead`` the words before it, ``paper`` the paper's
    statement (a paper claim's), ``resolving`` that row's resolving power in words
    (:func:`power_words`); within a group a failing or contradicted id comes first (then report order)."""
    groups = []
    for key, heading in GROUPS:
        members = [e for e in report.get("claims") or [] if isinstance(e, dict) and group_of(e) == key]
        members.sort(key=lambda e: not is_failing(e))  # stable: report order otherwise
        rows = []
        for e in members:
            lead, record = deciding(e)
            agree, of = agreement_count(e)
            rows.append({
                "id": str(e.get("id")), "anchor": anchor(e.get("id", "")), "title": str(e.get("title", "")),
                "kind": kind_of(e), "verdict": str(e.get("verdict")), "failing": is_failing(e), "lead": lead,
                "headline": None if record is None else sentence(record),
                "paper": str(e["paper"]) if e.get("paper") else None, "agree": agree, "of": of,
                "resolving": power_words(record) if record is not None else "—"})
        if rows:
            groups.append({"key": key, "heading": heading, "rows": rows})
    return groups


def report_forest(report: dict, card: Optional[list] = None) -> tuple[list, int]:
    """The forest plot's rows of a document in the order of its scorecard (``card``, computed when
    not given), and how many were left out."""
    return forest_rows(report, [r["id"] for g in card or scorecard(report) for r in g["rows"]])


def report_figures(report: dict) -> dict[str, bytes]:
    """The report's own figures (beside the claims'): the forest plot as a PNG (the README
    links it; the page embeds it as SVG); none for a report without a comparison."""
    rows, _ = report_forest(report)
    return {FOREST_FILE: forest_png(rows)} if rows else {}


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
    groups: dict = {}     # by config, in order of first appearance (None first)
    for r in sorted((r for r in entry.get("headline") or [] if isinstance(r, dict)),
                    key=lambda r: r.get("config") is not None):
        groups.setdefault(r.get("config"), []).append(r)
    return [{"config": config, "rows": [{"name": str(r.get("name", "")), "side": str(r.get("side") or "two-sided"),
                                         **headline_cells(r)} for r in group]} for config, group in groups.items()]


def section(entry: dict, report: dict, pngs: dict[str, bytes]) -> dict:
    """Everything one claim's section shows, as text for its template."""
    prov = report["provenance"]
    at_configuration = set((prov.get("ran_at") or {}).get("configuration") or []) if prov.get("problem") else set()
    details = dict(entry.get("details") or {})
    traceback_text = details.pop("traceback", None)
    theory, numerics = flatten(entry.get("theory") or {}), flatten(entry.get("numerics") or {})
    figures = [{"title": fig["title"], "caption": fig.get("caption") or "", "file": fig["file"],
                "uri": data_uri(pngs[fig["file"]])} for fig in entry.get("figures") or [] if fig["file"] in pngs]
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
        "perturbations": [p for p in entry.get("perturbations") or [] if isinstance(p, dict)],
        "figures": figures, "figure_errors": [str(e) for e in entry.get("figure_errors") or []],
        "all_values": [(k, format_value(theory[k]) if k in theory else "—", format_value(numerics[k]) if k in numerics
                    else "—") for k in list(theory) + [k for k in numerics if k not in theory]],
        "tolerance": [(k, format_value(v)) for k, v in flatten(entry.get("tolerance") or {}).items()],
        "traceback": None if traceback_text is None else str(traceback_text),
        "details": [(k, format_value(v)) for k, v in flatten(details).items()] if details else [],
    }


# --------------------------------------------------------------------------- the run


PROBLEM_NAMES = {"heads": "H", "L": "L", "sigma": "σ", "param": "parametrisation", "init_scale": "init scale s0",
                 "logit_scale": "logit scale s", "basis": "basis", "dtype": "dtype"}


def describe_problem(problem: dict) -> str:
    """A configuration in the paper's notation: ``r = (3, 3, 3), H = 3, L = 256, σ = 0.5``."""
    parts = [f"r = ({', '.join(str(r) for r in problem['tasks'])})"] if "tasks" in problem else []
    return ", ".join(parts + [f"{name} = {problem[key] if key in ('heads', 'L') else format_value(problem[key])}"
                              for key, name in PROBLEM_NAMES.items() if key in problem])


def verdict_counts(claims: list[dict]) -> str:
    """"7 pass, 0 fail, 0 undecided, 0 error; boundaries: 3 located, 1 contradicted, 1 undecided, 0 error"."""
    parts = []
    for kind, outcomes, label in (("claim", VERDICTS, ""), ("boundary", BOUNDARY_OUTCOMES, "boundaries: ")):
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
    card = scorecard(report)
    rows, left_out = report_forest(report, card)
    counts = dict(rows=len(rows), disagree=sum(r.agrees is False for r in rows), signed=sum(r.signed for r in rows),
                  one_sided=sum(r.side != "two-sided" for r in rows), left_out=left_out,
                  beyond=len(rows) - FOREST_MAX_ROWS, drawn=FOREST_MAX_ROWS, clip=f"{FOREST_CLIP:g}")
    return render("index.html.j2", title=TITLE, tiny=report["provenance"].get("profile") == "tiny",
                  run=run_summary(report), scorecard=card, findings=findings_lists(report),
                  has_findings=bool(report.get("findings")), forest=forest_svg(rows) if rows else None,
                  counts=counts, forest_file=FOREST_FILE, sections=[section(c, report, pngs) for c in report["claims"]])
