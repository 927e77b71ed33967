"""Point identity: the content hash that names a point, and the code version inside it.

A point is stored as ``DIR/points/<point_id>.json``; a sweep run again skips the points whose
file exists, so the id must change exactly when the numbers would: when the configuration
changes, when the training code changes (:func:`code_version`) or when the point function is
not the default training run.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import json
import re
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional, Union

REPO_ROOT = Path(__file__).resolve().parents[2]
# What a training point executes, for the code version (see code_version).
CODE_ENTRY_MODULES = ("numerics.train", "numerics.config")
PROJECT_PACKAGES = ("numerics", "theory")
ID_HEX_DIGITS = 16  # 64 bits: P(any collision) ~ n^2 / 2^65, 3e-8 for a million points
DEFAULT_POINT_FN = "tools.sweep:train_point"
# The default point function under its names past and present: none of them enters the id,
# so the points stored before the sweep moved out of numerics/ keep their ids.
DEFAULT_POINT_FN_NAMES = (DEFAULT_POINT_FN, "tools.sweep.execute:train_point", "numerics.sweep:train_point")

PointFn = Callable[[dict], Any]


def _module_file(name: str) -> Optional[Path]:
    parts = name.split(".")
    if parts[0] not in PROJECT_PACKAGES:
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
    ``ast``) of ``numerics.train`` and ``numerics.config`` within ``numerics``/``theory``."""
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


def fn_name(fn: Union[str, PointFn]) -> str:
    """``module:qualname`` of a point function; a ``functools.partial`` adds its bound
    arguments (they change what the function computes, hence the point ids)."""
    if isinstance(fn, str):
        return fn
    if isinstance(fn, functools.partial):
        return f"{fn_name(fn.func)}(*{fn.args!r}, **{fn.keywords!r})"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', type(fn).__module__)}:{qualname}"
