"""Parameter sweeps: cross ranges of configurations, train every point, keep every result.

A *grid* (a small TOML file, see ``examples/grid.toml`` and ``docs/sweep.md``) names fixed
values and ranges; :func:`expand_grid` crosses the ranges into *points*

    point = {"model": "full" | "reduced", "problem": {ProblemConfig fields},
             "train": {TrainConfig fields}}

and :func:`run_grid` trains each point (``numerics.train.train`` for ``"full"``,
``train_reduced`` for ``"reduced"``) serially, in a local process pool, or on Dask
(a ``LocalCluster`` or any running scheduler: Slurm, PBS, Kubernetes, ... through
dask-jobqueue / dask-kubernetes, with no change here).

Bookkeeping, which is the point of this module:

- A point is identified by :func:`point_id`, a content hash of its full configuration
  (defaults filled in) and of :func:`code_version`; the same point run by a different
  version of the training code is a different point.
- Every finished point is written, as it completes, to ``DIR/points/<id>.json`` by the
  client process alone (temporary file + ``os.replace``: a reader sees the whole file or
  none of it, so a sweep killed at any instant leaves nothing half-written).
- A repeated or interrupted sweep skips the points whose file exists; points that failed
  are skipped too unless ``retry_failed`` (a failure is usually deterministic; say so in
  the summary rather than burn the time again).
- A point whose *worker process died* (``os._exit``, a signal, the OOM killer) is
  resubmitted up to ``retries`` times; a point that *raises* records the exception and
  the sweep goes on.
- ``DIR/log.jsonl`` is an append-only log of what each run did (one JSON object a line);
  ``DIR/summary.json`` the summary of the last run; ``DIR/grid.toml`` the grid it ran.

Determinism: the default point function sets ``torch.set_num_threads(1)`` before training,
so a point gives bit-identical numbers serially, in a pool and on Dask (intra-op thread
pools change the order of floating-point reductions; one thread fixes it).
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import dataclasses
import datetime
import functools
import hashlib
import importlib
import importlib.metadata
import itertools
import json
import logging
import math
import multiprocessing
import os
import re
import signal
import socket
import sys
import time
import traceback
import uuid
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the backport named in pyproject.toml
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS = ("full", "reduced")
GRID_SECTIONS = ("description", "model", "problem", "train", "cross", "zip")
# TrainConfig fields the sweep owns: its own progress bar replaces the per-run one, and a
# point's checkpoint would be a path outside the content hash.
SWEEP_MANAGED_TRAIN_FIELDS = ("progress", "checkpoint")
# What a training point executes, for the code version (see code_version).
CODE_ENTRY_MODULES = ("numerics.train", "numerics.config")
PROJECT_PACKAGES = ("numerics", "theory")
ID_HEX_DIGITS = 16  # 64 bits: P(any collision) ~ n^2 / 2^65, 3e-8 for a million points

PointFn = Callable[[dict], Any]


# ----------------------------------------------------------------------------- grid -> points

@dataclass(frozen=True)
class _Field:
    default: Any  # dataclasses.MISSING when the field is required
    type: str     # the annotation as written ("float", "tuple[int, ...]", ...)


def _dataclass_fields(cls) -> dict[str, _Field]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = dataclasses.MISSING
        out[f.name] = _Field(default, f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type)))
    return out


def config_fields() -> tuple[dict[str, _Field], dict[str, _Field]]:
    """The fields (default, annotation) of ``ProblemConfig`` and of ``TrainConfig``, less the
    training fields the sweep manages itself (progress bar, checkpoint path)."""
    from numerics.config import ProblemConfig
    from numerics.train import TrainConfig

    problem = _dataclass_fields(ProblemConfig)
    train = {k: v for k, v in _dataclass_fields(TrainConfig).items() if k not in SWEEP_MANAGED_TRAIN_FIELDS}
    return problem, train


def _canonical(value: Any, annotation: str) -> Any:
    """JSON form of a field value: tuples become lists, and an integer given for a ``float``
    field becomes a float (``sigma = 0`` and ``sigma = 0.0`` are the same point)."""
    if isinstance(value, (list, tuple)):
        return [_canonical(v, "") for v in value]
    if annotation.replace(" ", "") in ("float", "float|None", "Optional[float]") and isinstance(value, int) \
            and not isinstance(value, bool):
        return float(value)
    return value


def _flatten_ranges(table: dict, where: str, problem: dict, train: dict) -> list[tuple[tuple[str, str], Any]]:
    """``{"L": [..], "train": {"seed": [..]}}`` -> ``[(("problem", "L"), [..]), (("train", "seed"), [..])]``.

    A bare name is looked up in ProblemConfig, then TrainConfig (they share no field name);
    ``problem.X`` / ``train.X`` (TOML dotted keys or sub-tables) name the section explicitly."""
    out = []
    for key, values in table.items():
        if key in ("problem", "train") and isinstance(values, dict):
            fields_ = problem if key == "problem" else train
            for sub, sub_values in values.items():
                if sub not in fields_:
                    raise ValueError(f"{where}: {key}.{sub} is not a {'ProblemConfig' if key == 'problem' else 'TrainConfig'} "
                                     f"field; the fields are: {', '.join(sorted(fields_))}")
                out.append(((key, sub), sub_values))
            continue
        if key == "model":
            out.append((("model", "model"), values))
        elif key in problem and key in train:
            raise ValueError(f"{where}: {key!r} is a field of both ProblemConfig and TrainConfig; "
                             f"write problem.{key} or train.{key}")
        elif key in problem:
            out.append((("problem", key), values))
        elif key in train:
            out.append((("train", key), values))
        elif key in SWEEP_MANAGED_TRAIN_FIELDS:
            raise ValueError(f"{where}: {key!r} is set by the sweep itself and cannot be swept")
        else:
            raise ValueError(f"{where}: unknown field {key!r}; ranges may name 'model', a ProblemConfig field "
                             f"({', '.join(sorted(problem))}) or a TrainConfig field ({', '.join(sorted(train))})")
    return out


def _check_range(where: str, name: str, values: Any, problem: dict, unique: bool = True) -> list:
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: the range of {name} must be a non-empty list of values, got {values!r} "
                         f"(a fixed value belongs in [problem] or [train])")
    if name in problem and "tuple" in problem[name].type:
        bad = [v for v in values if not isinstance(v, list)]
        if bad:
            raise ValueError(f"{where}: {name} takes a list per point, so its range is a list of lists, "
                             f"e.g. {name} = [[3, 3], [4, 4]]; got {values!r}")
    canon = [json.dumps(v, sort_keys=True) for v in values]
    if unique and len(set(canon)) != len(canon):
        raise ValueError(f"{where}: the range of {name} repeats a value: {values!r}")
    return values


def expand_grid(spec: dict) -> list[dict]:
    """A grid spec (a parsed TOML file) -> the list of its points, in a fixed order.

    Sections (all optional but ``tasks``, ``heads`` and ``L`` must be given somewhere):

    - ``model = "full" | "reduced"`` (default ``"full"``);
    - ``[problem]`` fixed ProblemConfig fields; ``[train]`` fixed TrainConfig fields;
    - ``[cross]`` ranges, crossed with each other: ``L = [64, 128, 256]``,
      ``tasks = [[3, 3], [4, 4]]``, ``model = ["full", "reduced"]``, ``seed = [0, 1]``;
      a name may be qualified, ``train.seed`` or ``problem.L``;
    - ``[zip]`` (or several ``[[zip]]``): ranges of equal length taken together, each group
      one more factor of the cross: ``tasks = [[3, 3], [3, 3, 3]]`` with ``heads = [2, 3]``.

    The points are the Cartesian product of the factors in the order they are written
    (``[cross]`` keys, then the ``[zip]`` groups), the last factor varying fastest. Every
    point carries every field, defaults filled in, so that its content hash identifies the
    full configuration. Structural mistakes (an unknown field, a key both fixed and swept,
    an empty or repeated range, an unknown model) raise ``ValueError`` here; a *value* that
    ProblemConfig rejects (say ``heads = 0``) does not: that point fails when it runs, with
    ProblemConfig's message, and the rest of the sweep goes on.
    """
    if not isinstance(spec, dict):
        raise TypeError(f"a grid spec is a dict (a parsed TOML file), got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(GRID_SECTIONS))
    if unknown:
        raise ValueError(f"grid: unknown top-level key(s) {unknown}; allowed: {', '.join(GRID_SECTIONS)}")
    problem_fields, train_fields = config_fields()

    fixed_problem = spec.get("problem", {})
    fixed_train = spec.get("train", {})
    for name, section, fields_, cls in (("[problem]", fixed_problem, problem_fields, "ProblemConfig"),
                                        ("[train]", fixed_train, train_fields, "TrainConfig")):
        if not isinstance(section, dict):
            raise ValueError(f"grid: {name} must be a table of {cls} fields")
        for key in section:
            if key in SWEEP_MANAGED_TRAIN_FIELDS and cls == "TrainConfig":
                raise ValueError(f"grid: {name} {key!r} is set by the sweep itself; remove it")
            if key not in fields_:
                raise ValueError(f"grid: {name} has unknown field {key!r}; {cls} fields are: "
                                 f"{', '.join(sorted(fields_))}")
    fixed_model = spec.get("model", "full")

    factors: list[tuple[list[tuple[str, str]], list[tuple]]] = []
    swept: dict[tuple[str, str], str] = {}

    def claim(target: tuple[str, str], where: str) -> None:
        section, name = target
        label = name if section == "model" else f"{section}.{name}"
        if target in swept:
            raise ValueError(f"grid: {label} is swept twice ({swept[target]} and {where}); keep one")
        if (section == "problem" and name in fixed_problem) or (section == "train" and name in fixed_train) \
                or (section == "model" and "model" in spec):
            raise ValueError(f"grid: {label} is both fixed and swept in {where}; keep one")
        swept[target] = where

    cross = spec.get("cross", {})
    if not isinstance(cross, dict):
        raise ValueError("grid: [cross] must be a table of ranges")
    for target, values in _flatten_ranges(cross, "[cross]", problem_fields, train_fields):
        claim(target, "[cross]")
        values = _check_range("[cross]", target[1], values, problem_fields)
        factors.append(([target], [(v,) for v in values]))

    zips = spec.get("zip", [])
    zips = [zips] if isinstance(zips, dict) else zips
    if not isinstance(zips, list) or not all(isinstance(z, dict) for z in zips):
        raise ValueError("grid: [zip] must be a table (or [[zip]] tables) of equal-length ranges")
    for n, group in enumerate(zips):
        where = f"[zip] group {n + 1}"
        entries = _flatten_ranges(group, where, problem_fields, train_fields)
        if not entries:
            raise ValueError(f"grid: {where} is empty")
        for target, values in entries:
            claim(target, where)
            _check_range(where, target[1], values, problem_fields, unique=False)  # (4,4) with 1 and 2 heads
        lengths = {target[1]: len(values) for target, values in entries}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"grid: the ranges of {where} are taken together, so they need equal lengths; got {lengths}")
        rows = list(zip(*[values for _, values in entries]))
        if len({json.dumps(row, sort_keys=True) for row in rows}) != len(rows):
            raise ValueError(f"grid: {where} repeats a row: {rows}")
        factors.append(([t for t, _ in entries], rows))

    points = []
    for combo in itertools.product(*[values for _, values in factors]):
        model, problem, train = fixed_model, dict(fixed_problem), dict(fixed_train)
        for (targets, _), values in zip(factors, combo):
            for (section, name), value in zip(targets, values):
                if section == "model":
                    model = value
                elif section == "problem":
                    problem[name] = value
                else:
                    train[name] = value
        if model not in MODELS:
            raise ValueError(f"grid: model must be one of {MODELS}, got {model!r}")
        points.append({"model": model,
                       "problem": _fill(problem, problem_fields, "problem"),
                       "train": _fill(train, train_fields, "train")})
    return points


def _fill(given: dict, fields_: dict[str, _Field], section: str) -> dict:
    out = {}
    for name, f in fields_.items():
        if name in given:
            out[name] = _canonical(given[name], f.type)
        elif f.default is dataclasses.MISSING:
            raise ValueError(f"grid: every point needs {section}.{name}; give it in [{section}] or as a range in [cross]")
        else:
            out[name] = _canonical(f.default, f.type)
    return out


def complete_point(point: dict) -> dict:
    """A hand-made point (``{"model", "problem": {...}, "train": {...}}`` naming only some
    fields) in the canonical form of :func:`expand_grid`: every field, defaults filled in,
    so that it has the same :func:`point_id` as the same configuration coming from a grid."""
    if not isinstance(point, dict) or not isinstance(point.get("problem"), dict):
        raise TypeError("a point is a dict {'model': ..., 'problem': {...}, 'train': {...}}")
    spec = {"model": point.get("model", "full"), "problem": point["problem"], "train": point.get("train", {})}
    unknown = sorted(set(point) - {"model", "problem", "train"})
    if unknown:
        raise ValueError(f"a point has only the keys model, problem, train; got also {unknown}")
    (completed,) = expand_grid(spec)
    return completed


def load_grid(path: Union[str, Path]) -> tuple[dict, str]:
    """Read a grid file: ``(parsed spec, its text)``; a clear error if missing or not TOML."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"grid file {str(path)!r} does not exist (see examples/grid.toml for the format)")
    text = path.read_text()
    try:
        spec = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"grid file {str(path)!r} is not valid TOML: {exc}") from None
    return spec, text


# ----------------------------------------------------------------------------- identity

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


def _package_version() -> str:
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
    files again (``run_grid`` does at its start; a worker hashes once, before it imports the
    training code, and refuses to run if its version differs from the sweep's)."""
    global _CODE_VERSION
    if _CODE_VERSION is None or refresh:
        digest = hashlib.sha256()
        for path in code_sources():
            digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        _CODE_VERSION = f"{_package_version()}+src.{digest.hexdigest()[:16]}"
    return _CODE_VERSION


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def point_id(point: dict, *, code: Optional[str] = None, point_fn: Optional[str] = None) -> str:
    """Content hash of a point: sha256 of the canonical JSON (sorted keys, no spaces) of the
    point and of the code version (``code``, default :func:`code_version`), first
    ``ID_HEX_DIGITS`` hex digits. A non-default point function (its ``module:name``) is
    hashed too, so its results never pass for those of a training run."""
    payload = {"point": point, "code": code_version() if code is None else code}
    if point_fn is not None and point_fn != DEFAULT_POINT_FN:
        payload["point_fn"] = point_fn
    return hashlib.sha256(_canonical_json(payload).encode()).hexdigest()[:ID_HEX_DIGITS]


# ----------------------------------------------------------------------------- one point

DEFAULT_POINT_FN = "numerics.sweep:train_point"


def train_point(point: dict) -> dict:
    """The default point function: train the point and return ``TrainResult.to_dict()``.

    ``model == "full"``: ``numerics.train.train`` (gradient descent on the full weights);
    ``"reduced"``: ``train_reduced`` (the exact finite-L reduced flow on (omega, mu)).
    One torch thread, so the numbers do not depend on where the point runs."""
    import torch

    from numerics.config import ProblemConfig
    from numerics.train import TrainConfig, train, train_reduced

    torch.set_num_threads(1)
    if point.get("model") not in MODELS:
        raise ValueError(f"point model must be one of {MODELS}, got {point.get('model')!r}")
    cfg = ProblemConfig.from_dict(point["problem"])
    tcfg = TrainConfig(**point["train"], progress=False, checkpoint=None)
    run = train if point["model"] == "full" else train_reduced
    return run(cfg, tcfg).to_dict()


def _fn_name(fn: Union[str, PointFn]) -> str:
    """``module:qualname`` of a point function; a ``functools.partial`` adds its bound
    arguments (they change what the function computes, hence the point ids)."""
    if isinstance(fn, str):
        return fn
    if isinstance(fn, functools.partial):
        return f"{_fn_name(fn.func)}(*{fn.args!r}, **{fn.keywords!r})"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', type(fn).__module__)}:{qualname}"


def resolve_point_fn(fn: Union[None, str, PointFn]) -> PointFn:
    """``None`` -> :func:`train_point`; ``"module:function"`` -> that function; a callable
    as is (for a process pool or Dask it must be importable: a module-level function)."""
    if fn is None:
        return train_point
    if callable(fn):
        return fn
    if not isinstance(fn, str) or ":" not in fn:
        raise ValueError(f"point function must be a callable or 'module:function', got {fn!r}")
    module_name, _, attr = fn.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"point function {fn!r}: cannot import module {module_name!r} ({exc}); "
                         f"is it on PYTHONPATH?") from None
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise ValueError(f"point function {fn!r}: {module_name} has no callable {attr!r}")
    return obj


def _jsonable(obj: Any) -> Any:
    """numpy/torch values, tuples and non-finite floats -> strict JSON (non-finite floats
    become the strings "nan", "inf", "-inf", as in claims.base.jsonable)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return _jsonable(obj.tolist())
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float) or hasattr(obj, "__float__"):
        value = float(obj)
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    return str(obj)


def execute_point(point: dict, point_fn: Union[None, str, PointFn], expected_code: Optional[str]) -> dict:
    """Run one point wherever this is called (client, pool worker, Dask worker).

    Never raises for the point's own error: the exception becomes ``error``/``traceback``.
    Refuses to run when this process's :func:`code_version` differs from the client's (a
    cluster worker with other code would store numbers under the wrong id)."""
    t0 = time.perf_counter()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    out = {"result": None, "error": None, "traceback": None, "worker": worker}
    try:
        if expected_code is not None and code_version() != expected_code:
            raise RuntimeError(f"this worker runs code version {code_version()} but the sweep started with "
                               f"{expected_code}: the training sources changed during the sweep, or this worker "
                               f"has another installation; rerun the sweep with the code you mean to measure")
        out["result"] = _jsonable(resolve_point_fn(point_fn)(point))
        torch = sys.modules.get("torch")
        out["torch"] = getattr(torch, "__version__", None)  # recorded, not enforced (CPU client, CUDA workers)
    except Exception as exc:  # the sweep goes on; the point file says what went wrong
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    out["wall_seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- storage

def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so that ``path`` holds either its old content or the whole new one, never
    a part: write a temporary file in the same directory, fsync, ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=1, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_point_file(path: Path) -> Optional[dict]:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or record.get("id") != path.stem or "point" not in record:
        return None
    return record


def load_results(out_dir: Union[str, Path]) -> list[dict]:
    """Every stored point of a sweep directory, sorted by id.

    Each record: ``{"id", "point", "result": TrainResult.to_dict() or None, "error": str or
    None, "wall_seconds", ...}`` (plus ``status``, ``traceback``, ``worker``,
    ``worker_deaths``, ``code_version``, ``point_fn``, ``finished_at``). Files that are not
    point records (temporaries of a sweep in progress) are ignored."""
    points_dir = Path(out_dir) / "points"
    if not points_dir.is_dir():
        raise FileNotFoundError(f"{str(out_dir)!r} is not a sweep directory (no points/ inside); "
                                f"run `python -m numerics.sweep GRID --out {out_dir}` first")
    records = []
    for path in sorted(points_dir.glob("*.json")):
        if path.name.startswith("."):
            continue
        record = _read_point_file(path)
        if record is not None:
            records.append(record)
    return records


def select_results(records: list[dict], model: Optional[str] = None, include_failed: bool = False,
                   **fields_) -> list[dict]:
    """The records of :func:`load_results` whose point matches, one per distinct point.

    ``model``: ``"full"``/``"reduced"``; ``fields_``: ProblemConfig or TrainConfig field
    values (``heads=3``, ``L=128``, ``tasks=[4, 4, 4]``, ``seed=0``). Failed points are left
    out unless ``include_failed``. A directory that several code versions wrote to holds
    one record per (point, code version): the most recently finished one is kept."""
    def matches(point: dict) -> bool:
        if model is not None and point.get("model") != model:
            return False
        for name, want in fields_.items():
            section = point["problem"] if name in point.get("problem", {}) else point.get("train", {})
            if name not in section or section[name] != _canonical(want, ""):  # tuples as lists; 0 == 0.0
                return False
        return True

    latest: dict[str, dict] = {}
    for record in records:
        if (record.get("error") and not include_failed) or not matches(record["point"]):
            continue
        key = _canonical_json(record["point"])
        if key not in latest or record.get("finished_at", "") >= latest[key].get("finished_at", ""):
            latest[key] = record
    return list(latest.values())


# ----------------------------------------------------------------------------- running

@dataclass
class SweepSummary:
    """What one ``run_grid`` call did. ``done``: points run to completion now; ``skipped``:
    points already stored (``skipped_failed`` of them failures not retried); ``failed``:
    points that failed now; ``ids``: the grid's point ids in grid order."""

    done: int
    skipped: int
    failed: int
    wall_seconds: float
    ids: list[str]
    skipped_failed: int = 0
    duplicates: int = 0
    worker_deaths: Optional[int] = 0  # None on Dask: its scheduler resubmits lost tasks itself
    interrupted: bool = False
    point_seconds: float = 0.0  # sum of the points' own wall times: work / (wall * workers) = efficiency
    scheduler: str = "pool"
    workers: Optional[int] = None
    code_version: str = ""
    failed_ids: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every point of the grid stored without error."""
        return self.failed == 0 and self.skipped_failed == 0 and not self.interrupted

    def line(self) -> str:
        parts = [f"{len(self.ids)} points: {self.done} done", f"{self.skipped - self.skipped_failed} skipped (already done)"]
        if self.skipped_failed:
            parts.append(f"{self.skipped_failed} skipped (failed earlier; rerun with --retry-failed)")
        parts.append(f"{self.failed} failed")
        if self.worker_deaths:
            parts.append(f"{self.worker_deaths} worker deaths")
        text = ", ".join(parts) + f"; wall {self.wall_seconds:.1f} s"
        return ("INTERRUPTED: " if self.interrupted else "") + text

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class _Item:
    id: str
    point: dict
    deaths: int = 0


class _Sink:
    """The client's side of a run: writes point files and the log, moves the progress bar."""

    def __init__(self, out: Path, run_token: str, code: str, fn_name: str, bar, retries: int):
        self.out, self.run_token, self.code, self.fn_name, self.bar = out, run_token, code, fn_name, bar
        self.retries = retries
        self.done = self.failed = self.deaths = 0
        self.point_seconds = 0.0
        self.failed_ids: list[str] = []

    def log(self, event: str, **fields_) -> None:
        line = _canonical_json({"event": event, "run": self.run_token, "time": _utc_now(), **fields_})
        with open(self.out / "log.jsonl", "a") as fh:
            fh.write(line + "\n")

    def record(self, item: _Item, out: dict) -> None:
        status = "failed" if out.get("error") else "done"
        record = {"id": item.id, "status": status, "point": item.point, "result": out.get("result"),
                  "error": out.get("error"), "traceback": out.get("traceback"),
                  "wall_seconds": out.get("wall_seconds"), "worker": out.get("worker"), "torch": out.get("torch"),
                  "worker_deaths": item.deaths, "code_version": self.code, "point_fn": self.fn_name,
                  "finished_at": _utc_now()}
        write_json_atomic(self.out / "points" / f"{item.id}.json", record)
        self.point_seconds += out.get("wall_seconds") or 0.0
        self.log(status, id=item.id, worker=out.get("worker"))
        if status == "done":
            self.done += 1
        else:
            self.failed += 1
            self.failed_ids.append(item.id)
        self.bar.update(1)
        self.bar.set_postfix(failed=self.failed, refresh=False)

    def died(self, items: list[_Item], charged: bool) -> None:
        """One worker death; ``items`` were in flight (the culprit among them if not charged)."""
        self.deaths += 1
        self.log("worker_died", ids=[item.id for item in items], charged=charged,
                 deaths=[item.deaths for item in items])

    def death_failure(self, item: _Item, detail: str, retries: Optional[int] = None) -> dict:
        retries = self.retries if retries is None else retries
        return {"result": None, "traceback": None, "worker": None, "wall_seconds": None,
                "error": f"WorkerDied: the worker process died while running this point {detail} "
                         f"(killed, crashed or out of memory); gave up after {retries} retries"}


def _mp_context():
    # forkserver: workers fork from a clean single-threaded server that imported torch once
    # (cheaper to replace a dead worker; no fork of a process with live OpenMP threads).
    # spawn where forkserver does not exist (Windows).
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        # torch only: the project's modules are imported by each worker just before it
        # computes its code version, so that the version describes the code it runs
        ctx.set_forkserver_preload(["torch"])
        return ctx
    return multiprocessing.get_context("spawn")


def _run_serial(items: list[_Item], fn, code: str, sink: _Sink) -> None:
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    try:
        for item in items:
            sink.record(item, execute_point(item.point, fn, code))
    finally:
        if threads is not None:
            torch.set_num_threads(threads)


def _run_pool(items: list[_Item], fn, code: str, workers: int, retries: int, sink: _Sink) -> None:
    """A process pool that survives the death of its workers.

    At most ``workers`` points are in flight, so each is running. When a worker dies the
    pool is broken and every in-flight future fails with ``BrokenProcessPool``; the culprit
    is unknown, so each of those points is rerun *alone* ("suspect"), uncharged. A point that
    kills its worker while alone is charged one death and, within ``retries``, rerun alone
    again; beyond, it is recorded as failed."""
    ctx = _mp_context()
    pending = deque(items)
    suspects: deque[_Item] = deque()
    inflight: dict[cf.Future, _Item] = {}
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    try:
        while pending or suspects or inflight:
            source = suspects if suspects else pending
            room = (0 if inflight else 1) if suspects else workers - len(inflight)
            batch = [source.popleft() for _ in range(min(len(source), room))]
            for n, item in enumerate(batch):
                try:
                    inflight[pool.submit(execute_point, item.point, fn, code)] = item
                except BrokenProcessPool:  # a worker died while idle: nobody to blame, start afresh
                    source.extendleft(reversed(batch[n:]))
                    break
            if not inflight:
                pool.shutdown(wait=True, cancel_futures=True)
                pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
                continue
            done, _ = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
            broken: list[_Item] = []
            if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                cf.wait(inflight)  # the others of a broken pool fail at once too
                done = set(inflight)
            for f in done:
                item = inflight.pop(f)
                exc = f.exception()
                if isinstance(exc, BrokenProcessPool):
                    broken.append(item)
                elif exc is not None:  # e.g. the point function cannot be pickled
                    sink.record(item, {"result": None, "error": f"{type(exc).__name__}: {exc}",
                                       "traceback": "".join(traceback.format_exception(exc)),
                                       "worker": None, "wall_seconds": None})
                else:
                    sink.record(item, f.result())
            if broken:
                pool.shutdown(wait=True, cancel_futures=True)
                pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
                if len(broken) == 1:
                    item = broken[0]
                    item.deaths += 1
                    sink.died(broken, charged=True)
                    if item.deaths > retries:
                        sink.record(item, sink.death_failure(item, f"{item.deaths} times"))
                    else:
                        suspects.append(item)
                else:
                    sink.died(broken, charged=False)
                    suspects.extend(broken)
    except BaseException:
        # interrupted (Ctrl-C, SIGTERM): stop the points in flight now rather than let the
        # interpreter wait for them at exit; the executor has no public way to (before 3.14)
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _run_dask(items: list[_Item], fn, code: str, scheduler: str, workers: Optional[int], retries: int,
              sink: _Sink) -> None:
    """On Dask the scheduler resubmits a task whose worker died, up to its
    ``distributed.scheduler.allowed-failures`` times, then fails it with ``KilledWorker``.
    For ``local`` we set that to ``retries`` (and worker-saturation 1.0, so no task waits
    queued on a worker and only the running one is blamed for its death); a remote
    scheduler keeps its own setting."""
    _require_dask(scheduler)
    import dask
    import distributed
    from distributed import Client, LocalCluster, as_completed

    cluster = None
    if scheduler == "local":
        with dask.config.set({"distributed.scheduler.allowed-failures": retries,
                              "distributed.scheduler.worker-saturation": 1.0}):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout="30s")
        except OSError as exc:
            raise RuntimeError(f"cannot reach the Dask scheduler at {scheduler!r}: {exc}") from None
    futures: dict = {}
    try:
        futures = {client.submit(execute_point, item.point, fn, code, key=f"sweep-point-{item.id}-{sink.run_token}",
                                 pure=False): item for item in items}
        for future in as_completed(futures):
            item = futures[future]
            if future.status == "finished":
                sink.record(item, future.result())
                future.release()
                continue
            exc = future.exception() if future.status == "error" else RuntimeError(
                f"the Dask future ended as {future.status!r} (scheduler restarted or task cancelled)")
            if isinstance(exc, distributed.KilledWorker):
                allowed = exc.args[2] if len(exc.args) > 2 and isinstance(exc.args[2], int) else retries
                item.deaths = allowed + 1
                sink.record(item, sink.death_failure(item, f"on {allowed + 1} Dask workers (KilledWorker)", allowed))
            else:
                sink.record(item, {"result": None, "error": f"{type(exc).__name__}: {exc}", "traceback": None,
                                   "worker": None, "wall_seconds": None})
            future.release()
    except BaseException:
        client.cancel(list(futures))  # a remote cluster would otherwise go on computing them
        raise
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _require_dask(scheduler: str) -> None:
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        raise RuntimeError(f"scheduler={scheduler!r} needs dask.distributed, an optional extra: "
                           f"pip install -e .[dask] (or run with no scheduler: a local process pool)") from None


def _check_scheduler(scheduler: Optional[str]) -> str:
    if scheduler is None or scheduler == "pool":
        return "pool"
    if not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be None, 'serial', 'local' or a Dask address, got {scheduler!r}")
    if scheduler in ("serial", "local"):
        return scheduler
    if re.fullmatch(r"(tcp|tls|inproc|ucx|ws|wss)://\S+|[\w.\-\[\]:]+:\d+", scheduler):
        return scheduler
    raise ValueError(f"unknown scheduler {scheduler!r}: use none (a local process pool), 'serial' (in this "
                     f"process), 'local' (a Dask LocalCluster) or a Dask scheduler address such as "
                     f"tcp://10.0.0.1:8786")


def _clean_stale_temporaries(points_dir: Path, older_than_s: float = 3600.0) -> None:
    # temporaries of a writer killed between write and rename; a live writer's are younger
    now = time.time()
    for tmp in points_dir.glob(".*.tmp"):
        try:
            if now - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
        except OSError:
            pass


class _NoBar:
    def update(self, n=1): pass
    def set_postfix(self, **kw): pass
    def close(self): pass


def run_grid(points: list[dict], out_dir: Union[str, Path], scheduler: Optional[str] = None,
             workers: Optional[int] = None, retries: int = 1, progress: bool = True,
             point_fn: Union[None, str, PointFn] = None, retry_failed: bool = False,
             grid_text: Optional[str] = None) -> SweepSummary:
    """Run every point not yet stored in ``out_dir`` and store each result as it completes.

    ``scheduler``: ``None`` a local process pool of ``workers`` processes (default: the CPU
    count); ``"serial"`` one by one in this process; ``"local"`` a Dask ``LocalCluster`` of
    ``workers`` single-threaded worker processes; any other string the address of a running
    Dask scheduler (``workers`` is then the cluster's business). ``retries``: how many times a
    point whose worker process died is resubmitted. ``retry_failed``: rerun points stored as
    failed (default: skip them, and say so in the summary). ``point_fn``: the function of a
    point (default :func:`train_point`), a callable or ``"module:function"``. ``grid_text``:
    the TOML to copy to ``DIR/grid.toml``.
    """
    mode = _check_scheduler(scheduler)
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
        raise TypeError("points must be a list of point dicts (see expand_grid)")
    if mode == "serial":
        workers = 1
    elif workers is None and mode in ("pool", "local"):
        workers = os.cpu_count() or 1
    fn_name = _fn_name(point_fn) if point_fn is not None else DEFAULT_POINT_FN
    resolve_point_fn(point_fn)  # fail now, not in every worker, when it cannot be found
    if mode not in ("serial", "pool"):
        _require_dask(mode)

    t0 = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {str(out)!r} exists and is not a directory")
    points_dir = out / "points"
    points_dir.mkdir(parents=True, exist_ok=True)
    _clean_stale_temporaries(points_dir)
    if grid_text is not None:
        _write_text_atomic(out / "grid.toml", grid_text)

    code = code_version(refresh=True)
    ids, items, seen = [], [], set()
    for point in points:
        pid = point_id(point, code=code, point_fn=fn_name)
        ids.append(pid)
        if pid not in seen:
            seen.add(pid)
            items.append(_Item(pid, point))
    todo, skipped, skipped_failed = [], 0, 0
    for item in items:
        record = _read_point_file(points_dir / f"{item.id}.json")
        if record is None:  # absent (or unreadable: then it is rerun and replaced)
            todo.append(item)
        elif record.get("error") and retry_failed:
            todo.append(item)
        else:
            skipped += 1
            skipped_failed += bool(record.get("error"))

    run_token = uuid.uuid4().hex[:12]
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(items), initial=len(items) - len(todo), desc="sweep", unit="point",
                   file=sys.stderr, dynamic_ncols=True)
    else:
        bar = _NoBar()
    sink = _Sink(out, run_token, code, fn_name, bar, retries)
    sink.log("sweep_start", points=len(items), todo=len(todo), scheduler=mode, workers=workers,
             code_version=code, point_fn=fn_name)
    interrupted = False
    try:
        if not todo:
            pass
        elif mode == "serial":
            _run_serial(todo, point_fn, code, sink)
        elif mode == "pool":
            _run_pool(todo, point_fn, code, workers, retries, sink)
        else:
            _run_dask(todo, point_fn, code, mode, workers, retries, sink)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
    summary = SweepSummary(done=sink.done, skipped=skipped, failed=sink.failed,
                           wall_seconds=time.perf_counter() - t0, ids=ids, skipped_failed=skipped_failed,
                           duplicates=len(points) - len(items),
                           worker_deaths=None if mode not in ("serial", "pool") else sink.deaths,
                           interrupted=interrupted, point_seconds=sink.point_seconds, scheduler=mode, workers=workers, code_version=code,
                           failed_ids=sink.failed_ids)
    write_json_atomic(out / "summary.json", {**summary.to_dict(), "finished_at": _utc_now(),
                                             "code_sources": [p.relative_to(REPO_ROOT).as_posix() for p in code_sources()]})
    sink.log("sweep_end", **{k: v for k, v in summary.to_dict().items() if k not in ("ids", "failed_ids")})
    if interrupted:
        raise KeyboardInterrupt
    return summary


# ----------------------------------------------------------------------------- CLI

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m numerics.sweep",
        description="Run a grid of training runs (a TOML file, see examples/grid.toml) and store one JSON file "
                    "per point under OUT/points/<id>.json, the id a content hash of the point's full configuration "
                    "and of the training code. Rerunning resumes: stored points are skipped.",
        epilog="Exit status: 0 every point of the grid is stored without error; 1 some point failed (its file holds "
               "the error); 2 bad arguments or grid; 130 interrupted (what finished is kept).")
    p.add_argument("grid", help="the grid TOML file: [problem]/[train] fixed values, [cross] ranges to cross, "
                                "[zip] ranges taken together; see docs/sweep.md")
    p.add_argument("--out", required=True, help="output directory (created); holds points/, grid.toml, "
                                                "summary.json, log.jsonl")
    p.add_argument("--scheduler", default=None,
                   help="where points run: omitted = a local process pool; 'serial' = one by one in this process; "
                        "'local' = a Dask LocalCluster; an address (tcp://HOST:8786) = a running Dask scheduler "
                        "(needs pip install -e .[dask])")
    p.add_argument("--workers", type=int, default=None,
                   help="processes of the pool or of the LocalCluster (default: the number of CPUs); ignored with "
                        "a scheduler address")
    p.add_argument("--retries", type=int, default=1,
                   help="times a point whose worker process died is resubmitted (default 1)")
    p.add_argument("--retry-failed", action="store_true",
                   help="rerun points stored as failed (by default they are skipped and counted in the summary)")
    p.add_argument("--point-fn", default=None,
                   help="MODULE:FUNCTION to call on each point dict instead of training it (default "
                        f"{DEFAULT_POINT_FN}); must be importable by the workers")
    p.add_argument("--dry-run", action="store_true", help="print the points and their ids as JSON and run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec, text = load_grid(args.grid)
        points = expand_grid(spec)
        if args.dry_run:
            fn_name = args.point_fn or DEFAULT_POINT_FN
            print(json.dumps([{"id": point_id(p, point_fn=fn_name), "point": p} for p in points], indent=1))
            return 0
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be a positive integer, got {args.workers}")
        if args.workers is not None and args.scheduler not in (None, "local", "serial"):
            print("note: --workers is ignored with a scheduler address (the cluster has its own workers)",
                  file=sys.stderr)
            args.workers = None
        _check_scheduler(args.scheduler)
        resolve_point_fn(args.point_fn)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def _terminate(signum, frame):  # Slurm & co. send SIGTERM before killing: stop cleanly
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        summary = run_grid(points, args.out, scheduler=args.scheduler, workers=args.workers, retries=args.retries,
                           progress=not args.no_progress, point_fn=args.point_fn, retry_failed=args.retry_failed,
                           grid_text=text)
    except KeyboardInterrupt:
        print("interrupted; finished points are kept, run the same command again to resume "
              f"(summary in {Path(args.out) / 'summary.json'})", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary.line(), file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.to_dict().items() if k != "ids"}, indent=1))
    return 0 if summary.complete else 1


if __name__ == "__main__":
    # Run main from the importable module, not from __main__, so that the functions sent to
    # pool and Dask workers pickle by reference as numerics.sweep.*.
    from numerics.sweep import main as _main

    sys.exit(_main())
