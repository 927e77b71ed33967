"""The schema of ``claims.json``, derived from the dataclasses of ``claims.core``.

A claim entry is ``ClaimResult.to_dict()`` with ``figures`` stored as ``figure_data`` and the
report's own ``figures`` (the drawn PNGs) and ``figure_errors`` added; its headline rows are
``HeadlineRow``, its findings ``Finding``, its perturbations ``PerturbationCheck``.  The keys
and their JSON types are read off those dataclasses' fields (:func:`fields_of`), so a field
added to ``claims.core`` is in the schema without an edit here.  A field with a default is
optional in a claim's result (it gets the default: :func:`with_defaults`) and required in what a
build *writes* (:func:`check_report`).  A claims.json written by an older version of this code
(no ``kind``, row ``side`` or ``findings``) is refused when read back (:func:`older_version`):
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
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import typing
from collections import Counter
from types import SimpleNamespace
from pathlib import Path
from typing import Any, Optional, Union

from numerics.io import PARSE_FACTOR, SEED_MAX, check_memory, parse_json
from claims.core import (BOUNDARY_OUTCOMES, FINDING_KINDS, KINDS, SIDES, VERDICTS, ClaimResult, Finding,
                         HeadlineRow, PerturbationCheck, judge)

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
    from reports.render import anchor

    if "<section id='findings'>" not in page:
        problems.append("index.html: no findings section")
    anchors = set(re.findall(r"id='([^']*)'", page))      # once: a search of the page per claim is quadratic
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

