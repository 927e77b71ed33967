"""Storage of a sweep directory: one JSON file per point, written atomically by the client.

    DIR/points/<id>.json   one record per finished point (result or error)
    DIR/log.jsonl          append-only log of what each run did, one JSON object a line
    DIR/summary.json       the summary of the last run
    DIR/grid.toml          the grid it ran

Only the client process writes (:class:`Sink`), each file through a temporary and
``os.replace``, so a sweep killed at any instant leaves no half-written file.
"""
from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from numerics.io import append_inside, check_inside, write_inside
from numerics.sweep.grid import canonical
from numerics.stored import canonical_json, read_points


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
    try:
        check_inside(out, SWEEP_FILES, "--out", directories=("points",))
    except ValueError as exc:
        raise ValueError(str(exc)) from None
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
