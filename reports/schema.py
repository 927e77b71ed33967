"""The schema of ``claims.json``, derived from the dataclasses of ``claims.base``.

A claim entry is ``ClaimResult.to_dict()`` with ``figures`` stored as ``figure_data`` and the
report's own ``figures`` (the drawn PNGs) and ``figure_errors`` added; its headline rows are
``HeadlineRow``, its findings ``Finding``, its perturbations ``PerturbationCheck``.  The keys
and their JSON types are read off those dataclasses' fields (:func:`fields_of`), so a field
added to ``claims.base`` is in the schema without an edit here.  A field with a default is
optional when a file is *read* (a claims.json written before that field existed gets the
default; ``kind`` from the id: ``boundary-...`` is a boundary) and required in what a build
*writes* (:func:`check_report`).

Beyond the types, a file read back (``--from-json``, ``reports.compare``) must be consistent
(:func:`document_problems`): ids unique, short and plain, at least one claim, nesting bounded,
each verdict one of its kind's outcomes, and a ``pass``/``located`` only where every judged
headline row agrees and every perturbed prediction was rejected (``claims.base.judge``): a
hand-edited verdict is refused rather than rendered as passing.
"""
from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path
from typing import Any, Optional, Union

from claims.base import (BOUNDARY_OUTCOMES, FINDING_KINDS, KINDS, SIDES, VERDICTS, ClaimResult, Finding,
                         HeadlineRow, PerturbationCheck)

VERSIONED_PACKAGES = ("torch", "numpy", "scipy", "sympy", "mpmath", "matplotlib")
PROVENANCE_KEYS = {"versions": dict, "device": str, "seed": int, "profile": str, "wall_seconds": dict,
                   "cpu_seconds": dict, "git": dict, "command": list, "started_utc": str, "seeds": dict}
# Claim ids as the registry writes them: plain, short (they become anchors and file names).
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
MAX_DEPTH = 40            # nesting of a claims.json (the real ones stay under 10)
MAX_PROBLEMS_SHOWN = 5
NON_FINITE = ("nan", "inf", "-inf")   # how claims.base.jsonable stores non-finite floats
OUTCOMES = {"claim": VERDICTS, "boundary": BOUNDARY_OUTCOMES}
PASSING = {"claim": "pass", "boundary": "located"}
# how a claims.json written before kinds existed named a boundary's outcome (claims.base.judge)
OLD_BOUNDARY_VERDICT = {"pass": "located", "fail": "contradicted", "error": "error"}


OPTIONAL_TOP_LEVEL = {"model": list}
"""Top-level keys a claims.json may carry besides claims/findings/provenance: ``model``, the audit
of handed checkpoints (``python -m reports.audit``, docs/audit.md), one object per checkpoint."""
MODEL_KEYS = ("index", "checkpoint", "readout", "held_out_loss", "theory", "position", "judged")
"""The keys every ``model`` entry has (docs/audit.md describes them all)."""


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


def fields_of(cls) -> dict[str, tuple[Any, bool]]:
    """``{field: (type hint, required)}`` of a dataclass of claims.base."""
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


def _depth(obj: Any) -> int:
    """Nesting depth, without recursion (a hand-made file can nest thousands deep)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def default_kind(claim_id: Any) -> str:
    return "boundary" if str(claim_id).startswith("boundary-") else "claim"


def upgrade(report: dict) -> dict:
    """A claims.json document with the fields added since it was written filled in: ``kind`` from
    the id (and a boundary's old pass/fail/error named as its outcome), each headline row's
    defaults (side two-sided, config None), ``findings`` (per claim and the top-level list).
    Entries that are not objects are left for :func:`document_problems` to name."""
    entries = report.get("claims")
    if not isinstance(entries, list):
        return report
    new_entries = []
    for entry in entries:
        if not isinstance(entry, dict):
            new_entries.append(entry)
            continue
        entry = dict(entry)
        for name, value in _defaults(ClaimResult).items():
            if name not in ("kind", "figures") and name not in entry:
                entry[name] = value
        if "kind" not in entry:
            entry["kind"] = default_kind(entry.get("id"))
            if entry["kind"] == "boundary" and entry.get("verdict") in OLD_BOUNDARY_VERDICT:
                entry["verdict"] = OLD_BOUNDARY_VERDICT[entry["verdict"]]
        for name, cls in ROW_CLASSES.items():
            rows = entry.get(name, [])
            if isinstance(rows, list):
                entry[name] = [{**_defaults(cls), **row} if isinstance(row, dict) else row for row in rows]
        new_entries.append(entry)
    out = dict(report, claims=new_entries)
    out.setdefault("findings", [f for e in new_entries if isinstance(e, dict)
                                for f in (e.get("findings") if isinstance(e.get("findings"), list) else [])])
    return out


def _row_problems(where: str, name: str, rows: list, cls) -> list[str]:
    problems = []
    spec = fields_of(cls)
    for k, row in enumerate(rows):
        at = f"{where}: {name}[{k}]"
        if not isinstance(row, dict):
            problems.append(f"{at} is not an object")
            continue
        unknown = sorted(set(row) - set(spec))
        if unknown:
            problems.append(f"{at} has unknown keys {unknown}")
        for key, (hint, required) in spec.items():
            if key not in row:
                if required:
                    problems.append(f"{at} lacks {key!r}")
            elif not _type_ok(row[key], hint):
                problems.append(f"{at}: {key!r} is {type(row[key]).__name__}, not {_type_name(hint)}")
    return problems


def entry_problems(entry: Any, k: int) -> list[str]:
    """What is wrong with one claim entry: keys and types (from the dataclasses), the id, the
    verdict for its kind, the side of each row, the kind of each finding, and a passing verdict
    with a judged headline row that does not agree."""
    if not isinstance(entry, dict):
        return [f"claims[{k}] is not an object"]
    cid = entry.get("id")
    where = f"claims[{k}] (id {str(cid)[:40]!r})"
    problems = []
    for key, (hint, _) in ENTRY_FIELDS.items():
        if key not in entry:
            problems.append(f"{where}: missing key {key!r}")
        elif not _type_ok(entry[key], hint):
            problems.append(f"{where}: {key!r} is {type(entry[key]).__name__}, not {_type_name(hint)}")
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
                            "accepted; a passing verdict needs every perturbation rejected (claims.base.judge)")
    return problems


def document_problems(report: Any, strict: bool = True) -> list[str]:
    """Everything wrong with a claims.json document (an empty list when it is sound).  ``strict``:
    as a build writes it (top-level keys exactly claims/findings/provenance, the provenance keys,
    the top-level findings those of the entries in order); otherwise as read back after
    :func:`upgrade`."""
    if not isinstance(report, dict):
        return ["the top level is not an object"]
    if _depth(report) > MAX_DEPTH:
        return [f"nested more than {MAX_DEPTH} levels deep"]
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
    ids = [e.get("id") for e in entries if isinstance(e, dict)]
    duplicates = sorted({str(i)[:40] for i in ids if ids.count(i) > 1})
    if duplicates:
        problems.append(f"duplicate claim ids {duplicates}")
    if "model" in report:
        problems += model_problems(report["model"], ids)
    if not problems and report["findings"] != [f for e in entries for f in e["findings"]]:
        problems.append("the top-level 'findings' are not the claims' findings in report order")
    if strict:
        for key, kind in PROVENANCE_KEYS.items():
            if key not in prov:
                problems.append(f"provenance: missing key {key!r}")
            elif not isinstance(prov[key], kind):
                problems.append(f"provenance: {key!r} has type {type(prov[key]).__name__}")
        for package in ("python",) + VERSIONED_PACKAGES:
            if package not in (prov.get("versions") or {}):
                problems.append(f"provenance.versions: missing {package}")
        if not {"commit", "dirty"} <= set(prov.get("git") or {}):
            problems.append("provenance.git: needs 'commit' and 'dirty'")
        if not {"per_claim", "total"} <= set(prov.get("wall_seconds") or {}):
            problems.append("provenance.wall_seconds: needs 'per_claim' and 'total'")
    return problems


def _strict_constant(name: str):
    raise ValueError(f"non-strict JSON constant {name}")


def parse_strict(text: str) -> Any:
    """Strict JSON (no NaN/Infinity); a file nested too deep for the parser is a ValueError too."""
    try:
        return json.loads(text, parse_constant=_strict_constant)
    except RecursionError:
        raise ValueError(f"nested too deep (more than {MAX_DEPTH} levels allowed)") from None


# A claims.json larger than this is not one this command wrote (the quick report's is ~1 MB).
MAX_BYTES = 200 * 2**20


def load_report(path: str, flag: str) -> dict:
    """A claims.json document (or a report directory holding one), upgraded to the current schema
    and checked (:func:`document_problems`); :class:`BadArguments` naming ``flag`` otherwise."""
    from theory._validate import read_input_bytes

    file = Path(path)
    if file.is_dir() and (file / "claims.json").is_file():
        file = file / "claims.json"
    if not file.exists() and not file.is_symlink():
        raise BadArguments(f"{flag} {path}: no such file; give the claims.json of a report (or its directory)")
    try:
        raw = read_input_bytes(file, flag, max_bytes=MAX_BYTES)
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    try:
        report = parse_strict(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadArguments(f"{flag} {path}: cannot be read as UTF-8 text ({exc})") from None
    except ValueError as exc:
        raise BadArguments(f"{flag} {path}: not a claims.json of a report (not strict JSON: {exc})") from None
    if not (isinstance(report, dict) and isinstance(report.get("claims"), list)
            and isinstance(report.get("provenance"), dict)):
        raise BadArguments(f"{flag} {path}: not a claims.json of a report (it needs 'claims', a list of "
                           "objects with an id and a verdict, and 'provenance')")
    report = upgrade(report)
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
        report = parse_strict((out_dir / "claims.json").read_text(encoding="utf-8"))
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
    for entry in entries:
        if f"id='{anchor(entry['id'])}'" not in page:
            problems.append(f"index.html: no section for claim {entry['id']!r}")
    n_figures = sum(len(e["figures"]) for e in entries)
    n_inline = page.count('src="data:image/png;base64,')
    if n_inline != n_figures:
        problems.append(f"index.html: {n_inline} inline figures, claims.json lists {n_figures}")
    if "<script" in page.lower() or 'src="http' in page or "src='http" in page:
        problems.append("index.html: not self-contained (script or remote source)")
    return problems


def headline_rows(entry: Optional[dict]) -> list[dict]:
    return [r for r in (entry or {}).get("headline") or [] if isinstance(r, dict)]
