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

Here too the need kind ``theory``: a value of theory's, computed once per build and priced by
``numerics.engine.THEORY_SECONDS``.  The other kinds live beside the experiment they run
(``numerics.engine.KIND_MODULES``).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Optional

from numerics import engine
from numerics.engine import clear_memo as clear_cache   # forget every computed need (tests that patch call it)
from numerics.engine import kind
from numerics.config import one_thread

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


CALL_SECONDS = {
    "constant_bracket": lambda tasks, *_: engine.theory_seconds("exact_fixed_point", tasks=tasks),   # its quadrature
    "gap_ladder": lambda r, Ls, *_: 0.3 * len(Ls),      # theory.exact's loss per L (0.02-0.7 s measured)
    "predicted_winners": lambda *_: 0.5,                # an expansion flow to the race's end (0.4 s measured)
    "ode_winners": lambda *_: 0.15,                     # the same at coarser tolerances (0.1 s measured)
}
"""CPU seconds of the theory values not in ``numerics.engine.THEORY_SECONDS``, from their arguments."""


def _theory_cost(fn: str, args: tuple) -> float:
    if fn in CALL_SECONDS:
        return CALL_SECONDS[fn](*args)
    return engine.theory_seconds(fn, tasks=args[0]) if fn in engine.THEORY_SECONDS else 0.1


@kind("theory", cost=_theory_cost, shared=False)
def theory_value(fn: str, args: tuple, seed: int):
    """``theory.<module>.<fn>(*args)`` (no seed: theory is deterministic)."""
    return _theory_function(fn)(*args)


def _phase_prediction(omega0, mu0, tasks, L, sigma, param, logit_scale, lr, factor, records, saturated_time) -> dict:
    """Claim 3's prediction of one run, made before it: the run's length (``time``:
    theory.three_phases.run_length, ``factor`` x the expansion flow's emergence end, or
    ``saturated_time`` where the flow saturates first, ``status``) and
    theory.three_phases.phase_prediction on that run's record times (``records`` of them,
    numerics.train.TrainConfig.record_steps x lr)."""
    import numpy as np
    from numerics.train import TrainConfig
    from theory import three_phases
    start = (np.asarray(omega0, float), np.asarray(mu0, float), tuple(tasks), L, sigma, param, logit_scale, lr)
    t_end, status = three_phases.run_length(*start, factor)
    time = t_end if status == "t_end" else saturated_time
    steps = TrainConfig(lr=lr, time=time, records=records).record_steps()
    return {"time": time, "status": status,
            "prediction": three_phases.phase_prediction(*start, float(lr) * np.array(steps, float), status)}


THEORY_FUNCTIONS = {
    "exact_fixed_point": "exact.exact_fixed_point", "finite_L_gain": "exact.finite_L_gain",
    "single_head_optimum": "exact.single_head_optimum", "limit_multi": "limiting_error.limit_multi",
    "gain": "limiting_error.gain", "exact_flow": "exact.exact_flow",
    "expansion_flow": "reduced_ode.integrate_expansion_flow",
    "warmup_law_prediction": "three_phases.warmup_law_prediction",
    "allocation_horizon": "task_allocation.horizon", "allocation_prediction": "task_allocation.allocation_prediction",
    "max_growth_rate": "saddle.max_growth_rate", "saddle_allocated_point": "saddle.allocated_point",
    "off_task_slope": "saddle.off_task_slope", "constant_bracket": "optimality.constant_bracket",
    "gap_ladder": "task_allocation.gap_ladder", "predicted_winners": "task_allocation.predicted_winners",
    "default_start_winners": "initialisation.default_start_winners", "ode_winners": "initialisation.ode_winners",
}
"""The theory values a plan may ask for, by name: ``theory.<module>.<function>`` (the module loaded
when a value of it is asked, so a build loads only the theory its claims use)."""


def _theory_function(fn: str):
    """The function named ``fn`` (:data:`THEORY_FUNCTIONS`, or this module's ``phase_prediction``)."""
    import importlib
    if fn == "phase_prediction":
        return _phase_prediction
    module, name = THEORY_FUNCTIONS[fn].split(".")
    return getattr(importlib.import_module(f"theory.{module}"), name)
