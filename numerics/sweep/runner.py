"""Running a grid: :func:`run_grid` stores every point not yet stored, on the chosen scheduler.

Resume: a repeated or interrupted sweep skips the points whose file exists; points that
failed are skipped too unless ``retry_failed`` (a failure is usually deterministic; say so in
the summary rather than burn the time again). A point whose *worker process died* is
resubmitted up to ``retries`` times; a point that *raises* records the exception and the
sweep goes on.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from tqdm import tqdm

from numerics.io import clean_stale_temporaries, make_directories, make_dirs_inside, write_inside
from numerics.stored import DEFAULT_POINT_FN, REPO_ROOT, code_sources, code_version, point_id, read_point
from numerics.sweep.execute import PointFn, fn_name, resolve_point_fn
from numerics.sweep.schedulers import check_scheduler, require_dask, run_dask, run_pool, run_serial
from numerics.sweep.store import Item, Sink, check_sweep_files, utc_now


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
        if record is None:
            todo.append(item)
        elif record.get("error") and retry_failed:
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
        if not todo:
            pass
        elif mode == "serial":
            run_serial(todo, point_fn, code, sink)
        elif mode == "pool":
            run_pool(todo, point_fn, code, workers, retries, sink)
        else:
            run_dask(todo, point_fn, code, mode, workers, retries, sink)
    except KeyboardInterrupt:
        return True
    finally:
        bar.close()
    return False
