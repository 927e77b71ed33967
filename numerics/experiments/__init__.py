"""The experiment layer: what the claims measure, as need kinds (``numerics.engine``) computed
once per report from their full configuration.

Every training run a claim needs is a function here (or in the module that owns the
estimator), returning a frozen result type; claims plan and compare, they never loop.
Two policies live here once:

- **threads** (:func:`one_thread`): every run uses one torch CPU thread.  Why: on a shared
  2-core machine the small batched matmuls of these runs ran ~12x slower with 2 threads than
  with 1 (20.8 s against 1.7 s for (2, 2), L = 64: a descheduled thread stalls every parallel
  region); parallelism comes from running several runs side by side (``numerics.sweep``).
- **the sweep store** (:func:`store`): inside ``with store(DIR)``, a run that a sweep
  (``python -m numerics.sweep``) has already stored in DIR is read from there instead of being
  trained, and counted (``Store.used``).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Optional

from numerics.engine import clear_memo as clear_cache   # forget every computed need (tests that patch call it)
from numerics.exact_reduced import one_thread

__all__ = ["one_thread", "clear_cache", "store", "active_store", "Store"]

_STORE: Optional["Store"] = None


class Store:
    """A sweep directory read as a store of finished runs: ``lookup(point)`` returns the stored
    result of a point equal to ``point`` (compared after normalisation by ``normalise``), or
    None; ``used`` counts the runs taken from it.  Each point file is read by the one reader,
    :func:`numerics.stored.read_point`, against this training code: a point is used only if
    its id is its file name and its own hash and it was computed by this code version;
    ``skipped`` lists the others (``{"file", "reason"}``), which are trained instead."""

    def __init__(self, path: str | Path):
        from numerics.stored import code_version, read_points

        self.path = Path(path)
        records, self.skipped = read_points(self.path, "--from-sweep", code=code_version())
        self.records = [rec for rec in records if rec.get("result") is not None and not rec.get("error")]
        self.used = 0

    def lookup(self, point: dict, normalise: Callable[[dict], Any]) -> Optional[dict]:
        want = normalise(point)
        for rec in self.records:
            try:
                if normalise(rec["point"]) == want:
                    self.used += 1
                    return rec["result"]
            except (KeyError, TypeError, ValueError):
                continue
        return None


@contextlib.contextmanager
def store(path):
    """Within the block, runs are read from the sweep at ``path`` where stored (None: no store)."""
    global _STORE
    before = _STORE
    _STORE = Store(path) if path is not None else None
    try:
        yield _STORE
    finally:
        _STORE = before


def active_store() -> Optional[Store]:
    return _STORE
