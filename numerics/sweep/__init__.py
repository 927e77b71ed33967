"""Parameter sweeps: cross ranges of configurations, train every point, keep every result.

A *grid* (a small TOML file, see ``examples/grid.toml`` and ``docs/sweep.md``) names fixed
values and ranges; :func:`numerics.sweep.grid.expand_grid` crosses the ranges into *points*

    point = {"model": "full" | "reduced", "problem": {ProblemConfig fields},
             "train": {TrainConfig fields}}

and :func:`run_grid` trains each point (``numerics.train.train`` for ``"full"``,
``train_reduced`` for ``"reduced"``) serially, in a local process pool, or on Dask (a
``LocalCluster`` or any running scheduler). By concern:

- :mod:`numerics.sweep.grid`: the TOML grid, its validation, its expansion into points;
- :mod:`numerics.stored`: :func:`point_id`, a content hash of a point's full configuration
  and of :func:`code_version` (the same point run by a different version of the training code
  is a different point), beside the one reader of a stored point;
- this module: what a worker runs (:func:`execute_point`, :func:`train_point`), the sweep directory (``DIR/points/<id>.json`` written atomically by the client
  alone as each point completes, ``log.jsonl``, ``summary.json``, ``grid.toml``;
  :func:`load_results`), where the points run (serial, a process pool that survives (and
  retries) worker deaths and whose workers die with the client, Dask), :func:`run_grid`
  (resume: stored points are skipped) and ``python -m numerics.sweep``.

Resume: a repeated or interrupted sweep skips the points whose file exists; points that
failed are skipped too unless ``retry_failed`` (a failure is usually deterministic; say so in
the summary rather than burn the time again). A point whose *worker process died* is
resubmitted up to ``retries`` times; a point that *raises* records the exception and the
sweep goes on.  Only the client process writes (:class:`Sink`), each file through a temporary
and ``os.replace``, so a sweep killed at any instant leaves no half-written file.

Determinism: the default point function sets ``torch.set_num_threads(1)`` before training,
so a point gives bit-identical numbers serially, in a pool and on Dask (intra-op thread
pools change the order of floating-point reductions; one thread fixes it).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime
import functools
import importlib
import json
import logging
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

import torch
from tqdm import tqdm

from numerics.config import ProblemConfig
from numerics.io import (EXIT_DISK_FULL, DiskFull, append_inside, check_inside, check_output_dir,
                         clean_stale_temporaries, command_line, die_with_parent, int_option, jsonable, make_directories,
                         make_dirs_inside, threads_option, write_inside)
from numerics.stored import (DEFAULT_POINT_FN, DEFAULT_POINT_FN_NAMES, REPO_ROOT, canonical_json, code_sources,
                             code_version, point_id, read_point, read_points)
from numerics.sweep.grid import MODELS, canonical, expand_grid, load_grid
from numerics.train import TrainConfig, train, train_reduced

# --- what a worker runs ----------------------------------------------------------------------------
#
# The same execute_point runs in the client (scheduler "serial"), in a pool worker and on a Dask
# worker; it is pickled by reference, so it and the default point function train_point live in an
# importable module (this one), never in __main__.

PointFn = Callable[[dict], Any]


def fn_name(fn: Union[str, PointFn]) -> str:
    """``module:qualname`` of a point function; a ``functools.partial`` adds its bound
    arguments (they change what the function computes, hence the point ids)."""
    if isinstance(fn, str):
        return fn
    if isinstance(fn, functools.partial):
        return f"{fn_name(fn.func)}(*{fn.args!r}, **{fn.keywords!r})"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', type(fn).__module__)}:{qualname}"


def train_point(point: dict) -> dict:
    """The default point function: train the point and return ``TrainResult.to_dict()``.

    ``model == "full"``: ``numerics.train.train`` (gradient descent on the full weights);
    ``"reduced"``: ``train_reduced`` (the exact finite-L reduced flow on (omega, mu)).
    One torch thread, so the numbers do not depend on where the point runs."""
    torch.set_num_threads(1)
    if point.get("model") not in MODELS:
        raise ValueError(f"point model must be one of {MODELS}, got {point.get('model')!r}")
    if point["model"] == "converged":     # a claim's trained run: explore, polish, held-out loss
        from numerics.experiments.converged import run_point
        return run_point(point)
    if point["model"] == "atlas":         # an atlas point: a full model from a stated start, measured
        from numerics.experiments.atlas import run_point as run_atlas_point
        return run_atlas_point(point)
    cfg = ProblemConfig.from_dict(point["problem"])
    tcfg = TrainConfig(**point["train"], progress=False, checkpoint=None)
    run = train if point["model"] == "full" else train_reduced
    return run(cfg, tcfg).to_dict()


def resolve_point_fn(fn: Union[None, str, PointFn]) -> PointFn:
    """``None`` -> :func:`train_point`; ``"module:function"`` -> that function; a callable
    as is (for a process pool or Dask it must be importable: a module-level function)."""
    if fn is None or fn in DEFAULT_POINT_FN_NAMES:     # the default under each of its names (ids survive)
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
        out["result"] = jsonable(resolve_point_fn(point_fn)(point))
        out["torch"] = torch.__version__  # recorded, not enforced (CPU client, CUDA workers)
    except Exception as exc:  # the sweep goes on; the point file says what went wrong
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    out["wall_seconds"] = time.perf_counter() - t0
    return out


# --- the sweep directory ---------------------------------------------------------------------------

def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load_results(out_dir: Union[str, Path], code: Optional[str] = None) -> list[dict]:
    """Every stored point of a sweep directory that passes :func:`numerics.stored.read_point`
    (any code version, or only ``code``), sorted by id.

    Each record: ``{"id", "point", "result": TrainResult.to_dict() or None, "error": str or
    None, "wall_seconds", ...}`` (plus ``status``, ``traceback``, ``worker``,
    ``worker_deaths``, ``code_version``, ``point_fn``, ``finished_at``). Files that are not
    point records (temporaries of a sweep in progress, edited or foreign files) are ignored."""
    return read_points(out_dir, "sweep", code)[0]


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
            if name not in section or section[name] != canonical(want, ""):  # tuples as lists; 0 == 0.0
                return False
        return True

    latest: dict[str, dict] = {}
    for record in records:
        if (record.get("error") and not include_failed) or not matches(record["point"]):
            continue
        key = canonical_json(record["point"])
        if key not in latest or record.get("finished_at", "") >= latest[key].get("finished_at", ""):
            latest[key] = record
    return list(latest.values())


SWEEP_MARKER = "points"
"""The entry that makes a directory a sweep's own output (``check_output_dir(..., marker=SWEEP_MARKER)``):
a rerun resumes it; any other non-empty directory is refused as ``--out``."""
SWEEP_FILES = ("log.jsonl", "summary.json", "grid.toml")


def check_sweep_files(out: Path) -> None:
    """Refuse a sweep directory whose own entries are not what the sweep writes (``points``
    a directory; ``log.jsonl``, ``summary.json``, ``grid.toml`` regular files or absent; every
    ``points/*.json`` a regular file), all checked without following a link: a symbolic link
    there would make the sweep write (or clean) wherever it points -- a shell start-up file
    included -- so it is refused, never followed; a FIFO would block the sweep, a device would
    be replaced."""
    check_inside(out, SWEEP_FILES, "--out", directories=("points",))
    points = out / "points"
    if points.is_dir() and not points.is_symlink():
        for entry in os.scandir(points):
            if entry.name.endswith(".json") and not entry.is_file(follow_symlinks=False):
                what = "a symbolic link" if entry.is_symlink() else "not a regular file (a FIFO, device or directory)"
                raise ValueError(f"--out {out}: points/{entry.name} is {what}: the sweep never follows a link (or "
                                 "reads a special file) inside its folder, so it is neither read nor replaced; "
                                 "remove it and run again")


@dataclass
class Item:
    id: str
    point: dict
    deaths: int = 0


class Sink:
    """The client's side of a run: writes point files and the log, moves the progress bar."""

    def __init__(self, out: Path, run_token: str, code: str, fn_name: str, bar, retries: int):
        self.out, self.run_token, self.code, self.fn_name, self.bar = out, run_token, code, fn_name, bar
        self.retries = retries
        self.done = self.failed = self.deaths = 0
        self.point_seconds = 0.0
        self.failed_ids: list[str] = []

    def log(self, event: str, **fields_) -> None:
        line = canonical_json({"event": event, "run": self.run_token, "time": utc_now(), **fields_})
        # no link followed, a FIFO put in place of the log fails at once (O_NONBLOCK), a line is
        # whole or absent (a full disk cuts it back)
        append_inside(self.out, "log.jsonl", line + "\n")

    def record(self, item: Item, out: dict) -> None:
        status = "failed" if out.get("error") else "done"
        record = {"id": item.id, "status": status, "point": item.point, "result": out.get("result"),
                  "error": out.get("error"), "traceback": out.get("traceback"),
                  "wall_seconds": out.get("wall_seconds"), "worker": out.get("worker"), "torch": out.get("torch"),
                  "worker_deaths": item.deaths, "code_version": self.code, "point_fn": self.fn_name,
                  "finished_at": utc_now()}
        write_inside(self.out, f"points/{item.id}.json", json.dumps(record, indent=1, allow_nan=False) + "\n")
        self.point_seconds += out.get("wall_seconds") or 0.0
        self.log(status, id=item.id, worker=out.get("worker"))
        if status == "done":
            self.done += 1
        else:
            self.failed += 1
            self.failed_ids.append(item.id)
        self.bar.update(1)
        self.bar.set_postfix(failed=self.failed, refresh=False)

    def died(self, items: list[Item], charged: bool) -> None:
        """One worker death; ``items`` were in flight (the culprit among them if not charged)."""
        self.deaths += 1
        self.log("worker_died", ids=[item.id for item in items], charged=charged,
                 deaths=[item.deaths for item in items])

    def death_failure(self, item: Item, detail: str, retries: Optional[int] = None) -> dict:
        retries = self.retries if retries is None else retries
        return {"result": None, "traceback": None, "worker": None, "wall_seconds": None,
                "error": f"WorkerDied: the worker process died while running this point {detail} "
                         f"(killed, crashed or out of memory); gave up after {retries} retries"}


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
    mode, workers, fn_label = _check_arguments(points, scheduler, workers, retries, point_fn)
    t0 = time.perf_counter()
    out = _prepare_out_dir(Path(out_dir), grid_text)
    points_dir = out / "points"
    code = code_version(refresh=True)
    ids, items = _unique_items(points, code, fn_label)
    todo, skipped, skipped_failed = _not_stored(items, points_dir, code, retry_failed)
    run_token = uuid.uuid4().hex[:12]
    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc="sweep", unit="point",
               file=sys.stderr, dynamic_ncols=True, disable=not progress)
    sink = Sink(out, run_token, code, fn_label, bar, retries)
    sink.log("sweep_start", points=len(items), todo=len(todo), scheduler=mode, workers=workers,
             code_version=code, point_fn=fn_label)
    interrupted = _run_todo(todo, mode, point_fn, code, workers, retries, sink, bar)
    summary = SweepSummary(done=sink.done, skipped=skipped, failed=sink.failed,
                           wall_seconds=time.perf_counter() - t0, ids=ids, skipped_failed=skipped_failed,
                           duplicates=len(points) - len(items),
                           worker_deaths=None if mode not in ("serial", "pool") else sink.deaths,
                           interrupted=interrupted, point_seconds=sink.point_seconds, scheduler=mode, workers=workers, code_version=code,
                           failed_ids=sink.failed_ids)
    write_inside(out, "summary.json", json.dumps({**summary.to_dict(), "finished_at": utc_now(),
                                                  "code_sources": [p.relative_to(REPO_ROOT).as_posix()
                                                                   for p in code_sources()]},
                                                 indent=1, allow_nan=False) + "\n")
    sink.log("sweep_end", **{k: v for k, v in summary.to_dict().items() if k not in ("ids", "failed_ids")})
    if interrupted:
        raise KeyboardInterrupt
    return summary


def _check_arguments(points, scheduler, workers, retries, point_fn) -> tuple[str, Optional[int], str]:
    """run_grid's arguments checked before anything is written: (the scheduler mode, the
    worker count (1 serial; the CPU count for a pool or LocalCluster when not given), the point
    function's name); the point function and Dask are looked up now, not in every worker."""
    mode = check_scheduler(scheduler)
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
    fn_label = fn_name(point_fn) if point_fn is not None else DEFAULT_POINT_FN
    resolve_point_fn(point_fn)
    if mode not in ("serial", "pool"):
        require_dask(mode)
    return mode, workers, fn_label


def _prepare_out_dir(out: Path, grid_text: Optional[str]) -> Path:
    """The output folder and its points/ made (an existing one whose sweep entries are links,
    FIFOs or of the wrong kind is refused: writing there would follow them), stale temporaries
    of an interrupted run removed, the grid's TOML copied in."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {str(out)!r} exists and is not a directory")
    if out.is_dir():
        check_sweep_files(out)
    make_directories(out)                           # --out itself: the user's path (a link there is followed)
    make_dirs_inside(out, "points")                 # inside it, nothing is reached through a link
    clean_stale_temporaries(out / "points")
    if grid_text is not None:
        write_inside(out, "grid.toml", grid_text)
    return out


def _unique_items(points: list[dict], code: str, fn_label: str) -> tuple[list[str], list[Item]]:
    """Every point's id in grid order, and one item per distinct id (a repeated point runs once)."""
    ids, items, seen = [], [], set()
    for point in points:
        pid = point_id(point, code=code, point_fn=fn_label)
        ids.append(pid)
        if pid not in seen:
            seen.add(pid)
            items.append(Item(pid, point))
    return ids, items


def _not_stored(items: list[Item], points_dir: Path, code: str, retry_failed: bool) -> tuple[list[Item], int, int]:
    """(the items to run, how many are skipped, how many of those are stored failures): a point
    whose file is absent or unreadable runs (and is replaced); a stored failure only with
    ``retry_failed``."""
    todo, skipped, skipped_failed = [], 0, 0
    for item in items:
        record = read_point(points_dir.parent, f"{item.id}.json", code=code)[0]   # None: absent or not usable
        if record is None or (record.get("error") and retry_failed):
            todo.append(item)
        else:
            skipped += 1
            skipped_failed += bool(record.get("error"))
    return todo, skipped, skipped_failed


def _run_todo(todo: list[Item], mode: str, point_fn, code: str, workers: Optional[int], retries: int,
              sink: Sink, bar) -> bool:
    """Run the items on the scheduler ``mode``; True when interrupted (Ctrl-C: what finished
    is stored and summarised before the interrupt is raised again)."""
    try:
        if todo and mode == "serial":
            run_serial(todo, point_fn, code, sink)
        elif todo and mode == "pool":
            run_pool(todo, point_fn, code, workers, retries, sink)
        elif todo:
            run_dask(todo, point_fn, code, mode, workers, retries, sink)
    except KeyboardInterrupt:
        return True
    finally:
        bar.close()
    return False


# --- where the points run -------------------------------------------------------------------------

def _mp_context():
    # forkserver: workers fork from a clean single-threaded server that imported torch once
    # (cheaper to replace a dead worker; no fork of a process with live OpenMP threads).
    # spawn where forkserver does not exist (Windows).
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        # torch only: the project's modules are imported by each worker when it unpickles
        # its first point, from the files then on disk, which its code version hashes
        ctx.set_forkserver_preload(["torch"])
        return ctx
    return multiprocessing.get_context("spawn")


def run_serial(items: list[Item], fn, code: str, sink: Sink) -> None:
    """One point after the other in this process (the default point function sets one torch
    thread; the client's setting is restored afterwards)."""
    threads = torch.get_num_threads()
    try:
        for item in items:
            sink.record(item, execute_point(item.point, fn, code))
    finally:
        torch.set_num_threads(threads)


def run_pool(items: list[Item], fn, code: str, workers: int, retries: int, sink: Sink) -> None:
    """A process pool that survives the death of its workers.

    At most ``workers`` points are in flight, so each is running. When a worker dies the
    pool is broken and every in-flight future fails with ``BrokenProcessPool``; the culprit
    is unknown, so each of those points is rerun *alone* ("suspect"), uncharged. A point that
    kills its worker while alone is charged one death and, within ``retries``, rerun alone
    again; beyond, it is recorded as failed. Each worker exits when the client dies
    (:func:`numerics.io.die_with_parent`: a worker waits on the pool's call queue,
    whose write end it holds itself, so without it a SIGKILLed client would leave its workers
    behind for good, ~220 MB each)."""
    ctx = _mp_context()
    client = os.getpid()

    def new_pool() -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=die_with_parent,
                                      initargs=(client,))

    pending = deque(items)
    suspects: deque[Item] = deque()
    inflight: dict[cf.Future, Item] = {}
    pool = new_pool()
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
                pool = new_pool()
                continue
            done, _ = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
            broken: list[Item] = []
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
                pool = new_pool()
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


def run_dask(items: list[Item], fn, code: str, scheduler: str, workers: Optional[int], retries: int,
              sink: Sink) -> None:
    """On Dask the scheduler resubmits a task whose worker died, up to its
    ``distributed.scheduler.allowed-failures`` times, then fails it with ``KilledWorker``.
    For ``local`` we set that to ``retries`` (and worker-saturation 1.0, so no task waits
    queued on a worker and only the running one is blamed for its death); a remote
    scheduler keeps its own setting."""
    require_dask(scheduler)
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


def require_dask(scheduler: str) -> None:
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        raise RuntimeError(f"scheduler={scheduler!r} needs dask.distributed, an optional extra: "
                           f"pip install -e .[dask] (or run with no scheduler: a local process pool)") from None


def check_scheduler(scheduler: Optional[str]) -> str:
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


# --- the command line -----------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m numerics.sweep",
        description="Run a grid of training runs (a TOML file, see examples/grid.toml) and store one JSON file "
                    "per point under OUT/points/<id>.json, the id a content hash of the point's full configuration "
                    "and of the training code. Rerunning resumes: stored points are skipped.",
        epilog="Exit status: 0 every point of the grid is stored without error; 1 some point failed (its file holds "
               f"the error); 2 bad arguments or grid; {EXIT_DISK_FULL} the disk is full (\"disk full: N bytes needed at "
               "PATH\"; the points stored before are kept whole: free space and run the same command to resume); "
               "130 interrupted (what finished is kept). Inside --out nothing is ever reached through a symbolic "
               "link: a link there (grid.toml, summary.json, log.jsonl, points/ or a point file) is refused.")
    add = p.add_argument
    add("grid", help="the grid TOML file ([problem], [train], [cross], [zip]; docs/sweep.md)")
    add("--out", required=True, help="output directory: new, empty, or this sweep's own earlier output (resumed)")
    add("--scheduler", default=None, help="omitted: a local process pool; 'serial'; 'local': a Dask LocalCluster; "
                                          "an address (tcp://HOST:8786): a running Dask scheduler")
    add("--workers", type=threads_option("--workers"), default=None,
        help="processes of the pool or LocalCluster (default: the CPU count)")
    add("--retries", type=int_option("--retries", 0, 100), default=1,
        help="times a point whose worker process died is resubmitted (default 1)")
    add("--retry-failed", action="store_true", help="rerun points stored as failed (default: skip and count them)")
    add("--point-fn", default=None, help=f"MODULE:FUNCTION to call on each point (default {DEFAULT_POINT_FN})")
    add("--dry-run", action="store_true", help="print the points and their ids as JSON and run nothing")
    add("--no-progress", action="store_true", help="no progress bar")
    return p


@command_line
def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec, text = load_grid(args.grid)
        try:
            points = expand_grid(spec)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{args.grid}: {exc}") from None     # name the file the mistake is in
        if args.dry_run:
            label = args.point_fn or DEFAULT_POINT_FN
            print(json.dumps([{"id": point_id(p, point_fn=label), "point": p} for p in points], indent=1))
            return 0
        if args.workers is not None and args.scheduler not in (None, "local", "serial"):
            print("note: --workers is ignored with a scheduler address (the cluster has its own workers)",
                  file=sys.stderr)
            args.workers = None
        check_scheduler(args.scheduler)
        resolve_point_fn(args.point_fn)
        # before anything is created or run: a new or empty directory, or a sweep's own (resumed);
        # never a report directory or any other non-empty one
        if Path(args.out).is_dir():
            check_sweep_files(Path(args.out))
        check_output_dir(args.out, "--out", marker=SWEEP_MARKER, inputs=(args.grid,))
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
    except DiskFull:
        raise                          # command_line: its message, exit EXIT_DISK_FULL; stored points kept
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary.line(), file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.to_dict().items() if k != "ids"}, indent=1))
    return 0 if summary.complete else 1
