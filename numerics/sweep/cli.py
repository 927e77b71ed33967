"""``python -m numerics.sweep GRID --out DIR [...]``: run a grid from the command line."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Optional

from numerics.io import EXIT_DISK_FULL, DiskFull, check_output_dir
from numerics.io import command_line
from numerics.io import int_option, threads_option
from numerics.sweep.execute import resolve_point_fn
from numerics.sweep.grid import expand_grid, load_grid
from numerics.stored import DEFAULT_POINT_FN, point_id
from numerics.sweep.runner import run_grid
from numerics.sweep.schedulers import check_scheduler
from numerics.sweep.store import SWEEP_MARKER, check_sweep_files


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
            fn_name = args.point_fn or DEFAULT_POINT_FN
            print(json.dumps([{"id": point_id(p, point_fn=fn_name), "point": p} for p in points], indent=1))
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
