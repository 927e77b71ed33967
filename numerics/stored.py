"""A run stored by a sweep: what identifies it, and the one reader that checks it before use.

``python -m numerics.sweep`` stores each finished point as ``DIR/points/<id>.json``; a report built
with ``--from-sweep DIR`` (``numerics.experiments.Store``) takes those runs instead of training
them, and a resumed sweep skips them.  Both read a point only through :func:`read_point`, which
uses it only if everything that identifies it agrees:

- the file is a regular file reached without following a link, of bounded size, named
  ``<16 hex digits>.json``, strict JSON (no number beyond the float range);
- its ``id`` is its file name, and is the hash (:func:`point_id`) of its own ``point``, its
  ``code_version`` and its point function: a record edited by hand, or copied under another
  name, fails here;
- with ``code`` given, its ``code_version`` is that code: a run of other training code is not
  a run of this code, however its numbers look;
- its result is bounded in depth and its ``loss`` a finite number (what a claim computes with).

Anything else is skipped with the reason (the caller says so and trains the run itself); a
handed sweep can make a point be recomputed, never make a foreign number be used.

The identity lives here, in the package whose code it hashes, so that numerics (the store) and
numerics.sweep (the writer) share it without the library importing the sweep: :func:`point_id` is a
content hash of a point's full configuration and of :func:`code_version` (the same point run by
a different version of the training code is a different point).
"""
from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import math
import os
import re
from collections import deque
from pathlib import Path
from typing import Any, Optional

from numerics.io import MAX_DEPTH, PARSE_FACTOR, LinkInside, check_inside, check_memory, parse_json, read_inside

REPO_ROOT = Path(__file__).resolve().parents[1]
# What a training point executes, for the code version (see code_version).
CODE_ENTRY_MODULES = ("numerics.train", "numerics.config")
PROJECT_PACKAGES = ("numerics", "theory")
# Imported by the trainer but computing no number of a run (options, files, the command wrapper):
# not hashed, so editing how a command line reads and writes keeps the stored points.
UNHASHED_PACKAGES = ("numerics.io",)
ID_HEX_DIGITS = 16  # 64 bits: P(any collision) ~ n^2 / 2^65, 3e-8 for a million points
DEFAULT_POINT_FN = "numerics.sweep:train_point"
# The default point function under its names past and present (the sweep's package was once a
# top-level ``tools``): none of them enters the id, so points stored under an earlier name keep their ids.
DEFAULT_POINT_FN_NAMES = (DEFAULT_POINT_FN, "numerics.sweep.execute:train_point", "tools.sweep:train_point",
                          "tools.sweep.execute:train_point")
POINT_FILE = re.compile(r"[0-9a-f]{%d}\.json\Z" % ID_HEX_DIGITS)
MAX_POINT_FILE_BYTES = 256 * 2 ** 20
"""A point file is a few kB (a trajectory of 61 records); a long trajectory makes it MBs.  A
larger file is not one: it is refused before a byte is read (a 1.5 GB file is never loaded)."""


def _module_file(name: str) -> Optional[Path]:
    parts = name.split(".")
    if parts[0] not in PROJECT_PACKAGES or any(name == p or name.startswith(p + ".") for p in UNHASHED_PACKAGES):
        return None
    base = REPO_ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(path: Path, module: str) -> set[str]:
    """Every module name an import statement in ``path`` may load (static: no execution)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import submodule`
    expanded = set()
    for name in names:  # importing a.b.c runs a/__init__ and a/b/__init__ too
        parts = name.split(".")
        expanded.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return expanded


def code_sources() -> list[Path]:
    """The project source files a training point executes: the import closure (static, by
    ``ast``) of ``numerics.train`` and ``numerics.config`` within ``numerics``/``theory``, less
    :data:`UNHASHED_PACKAGES`."""
    seen: dict[str, Path] = {}
    queue = deque(CODE_ENTRY_MODULES)
    while queue:
        name = queue.popleft()
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        queue.extend(_imported_names(path, name))
    return sorted(set(seen.values()))


def package_version() -> str:
    try:
        return importlib.metadata.version("icl-attention-audit")
    except importlib.metadata.PackageNotFoundError:
        pyproject = REPO_ROOT / "pyproject.toml"
        if pyproject.is_file():
            match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
            if match:
                return match.group(1)
        return "unknown"


_CODE_VERSION: Optional[str] = None


def code_version(refresh: bool = False) -> str:
    """``"<package version>+src.<sha256 of code_sources()>"`` (computed once per process).

    Why a hash of the sources and not the git commit: (1) an uncommitted edit to the model
    would keep the commit and silently reuse results of the old code; (2) any commit, even
    to the docs or the report, would invalidate every stored result; (3) cluster workers
    often run from an installed package with no ``.git``. Hashing exactly the files that a
    training point imports changes the id when, and only when, the code that produced the
    numbers changes (the sweep machinery itself is not among them). ``refresh``: hash the
    files again (``run_grid`` does at its start; a worker hashes once, at its first point,
    and refuses to run if its version differs from the sweep's)."""
    global _CODE_VERSION
    if _CODE_VERSION is None or refresh:
        digest = hashlib.sha256()
        for path in code_sources():
            digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        _CODE_VERSION = f"{package_version()}+src.{digest.hexdigest()[:16]}"
    return _CODE_VERSION


def canonical_json(obj: Any) -> str:
    """The one JSON text of ``obj``: sorted keys, no spaces, ASCII (what the ids hash)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def point_id(point: dict, *, code: Optional[str] = None, point_fn: Optional[str] = None) -> str:
    """Content hash of a point: sha256 of the canonical JSON (sorted keys, no spaces) of the
    point and of the code version (``code``, default :func:`code_version`), first
    ``ID_HEX_DIGITS`` hex digits. A non-default point function (its ``module:name``) is
    hashed too, so its results never pass for those of a training run."""
    payload = {"point": point, "code": code_version() if code is None else code}
    if point_fn is not None and point_fn not in DEFAULT_POINT_FN_NAMES:
        payload["point_fn"] = point_fn
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:ID_HEX_DIGITS]


FINITE_LOSS_MODELS = ("full", "reduced", "converged")
"""Point models whose stored loss is always a finite number: their runs that diverge are stored as
errors (an atlas point stores a diverged start as a result of class "diverged", its loss NaN)."""


def _result_problem(point: dict, result: Any) -> Optional[str]:
    """What makes a finished point's result unusable by a claim, said before a claim reads it:
    nested deeper than numerics.io.MAX_DEPTH, or, for :data:`FINITE_LOSS_MODELS`, a ``loss``
    that is not a finite number (``"nan"`` -- jsonable's text for a NaN -- or a list there is not
    such a run's, and would reach a claim as a string)."""
    stack = [(result, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"its result is nested more than {MAX_DEPTH} levels deep"
        if isinstance(item, dict):
            stack += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, depth + 1) for v in item]
    loss = result.get("loss", 0.0) if isinstance(result, dict) and point.get("model") in FINITE_LOSS_MODELS else 0.0
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        shown = repr(loss)[:40] if isinstance(loss, (str, int, float)) else f"a {type(loss).__name__}"
        return f"its result's loss is {shown}, not a finite number (a diverged run is stored as an error)"
    return None


def read_point(sweep, name: str, *, code: Optional[str] = None) -> tuple[Optional[dict], Optional[str]]:
    """The record of the point file ``points/<name>`` of the sweep directory ``sweep``, checked
    against itself and, with ``code``, against this training code: ``(record, None)``, or
    ``(None, reason)`` saying why it is not used (absent, a link, too large, not strict JSON,
    not a point record, an id that is not its own hash, another code version).  Never raises
    for the file's content; a point is read whole only after its size is checked."""
    if not POINT_FILE.match(name):
        return None, f"not a point file (a point is stored as <{ID_HEX_DIGITS} hex digits>.json)"
    try:
        data = read_inside(sweep, f"points/{name}", "--from-sweep", max_bytes=MAX_POINT_FILE_BYTES)
    except FileNotFoundError:
        return None, "absent"
    except LinkInside as exc:
        return None, str(exc).split(": ", 1)[-1]
    except ValueError as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    try:
        check_memory(PARSE_FACTOR * len(data), "parsing it")
    except ValueError as exc:
        return None, str(exc)
    try:
        record = parse_json(data.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except ValueError as exc:
        return None, f"not valid JSON ({str(exc)[:200]})"
    if not isinstance(record, dict) or not isinstance(record.get("point"), dict):
        return None, "not a point record of a sweep (no 'point')"
    stem = name[:-len(".json")]
    if record.get("id") != stem:
        return None, f"its id {str(record.get('id'))[:40]!r} is not its file name {stem!r}"
    stored_code, fn = record.get("code_version"), record.get("point_fn")
    if not isinstance(stored_code, str) or not (fn is None or isinstance(fn, str)):
        return None, "it records no code version (or no point function), so nothing says what computed it"
    try:
        own = point_id(record["point"], code=stored_code, point_fn=fn)
    except (TypeError, ValueError) as exc:
        return None, f"its point cannot be hashed ({exc})"
    if own != stem:
        return None, (f"its id is not the hash of its own point and code version ({own}): the record was edited, "
                      "or copied from another point")
    if code is not None and stored_code != code:
        return None, (f"computed by training code {stored_code}, and this is {code}: a run of other code is not "
                      "this code's run (run the sweep again to bring it up to date)")
    if record.get("error") is None and record.get("result") is None:
        return None, "neither a result nor an error: not a finished point"
    problem = None if record.get("result") is None else _result_problem(record["point"], record["result"])
    return (None, problem) if problem else (record, None)


def read_points(sweep, label: str, code: Optional[str] = None) -> tuple[list, list]:
    """Every point file of the sweep directory ``sweep`` through :func:`read_point`, sorted by
    name: (the usable records, ``{"file", "reason"}`` of the others).  A directory without
    ``points/`` (or whose ``points`` is a link) is refused, naming it as ``label``."""
    sweep = Path(sweep)
    points = sweep / "points"
    if not points.is_dir():
        raise FileNotFoundError(f"{label} {str(sweep)!r} is not a sweep directory (no points/ inside); "
                                f"run `python -m numerics.sweep GRID --out {sweep}` first")
    check_inside(sweep, (), label, directories=("points",))
    records, skipped = [], []
    for name in sorted(n for n in os.listdir(points) if n.endswith(".json") and not n.startswith(".")):
        rec, reason = read_point(sweep, name, code=code)
        if rec is None:
            skipped.append({"file": str(points / name), "reason": reason})
        else:
            records.append(rec)
    return records, skipped
