"""What a worker runs: one point through its point function, errors caught and recorded.

The same :func:`execute_point` runs in the client (``scheduler="serial"``), in a pool worker
and on a Dask worker; it is pickled by reference, so it and the default point function
:func:`train_point` live in an importable module (this one), never in ``__main__``.
"""
from __future__ import annotations

import importlib
import os
import socket
import time
import traceback
import functools
from typing import Any, Callable, Optional, Union

import torch

from numerics.io import jsonable
from numerics.config import ProblemConfig
from numerics.train import TrainConfig, train, train_reduced
from numerics.sweep.grid import MODELS
from numerics.stored import DEFAULT_POINT_FN_NAMES, code_version

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
