"""Parameter sweeps: cross ranges of configurations, train every point, keep every result.

A *grid* (a small TOML file, see ``examples/grid.toml`` and ``docs/sweep.md``) names fixed
values and ranges; :func:`expand_grid` crosses the ranges into *points*

    point = {"model": "full" | "reduced", "problem": {ProblemConfig fields},
             "train": {TrainConfig fields}}

and :func:`run_grid` trains each point (``numerics.train.train`` for ``"full"``,
``train_reduced`` for ``"reduced"``) serially, in a local process pool, or on Dask (a
``LocalCluster`` or any running scheduler). By concern:

- :mod:`numerics.sweep.grid`: the TOML grid, its validation, its expansion into points;
- :mod:`numerics.stored`: :func:`point_id`, a content hash of a point's full configuration
  and of :func:`code_version` (the same point run by a different version of the training code
  is a different point), beside the one reader of a stored point;
- :mod:`numerics.sweep.execute`: what a worker runs (:func:`execute_point`, :func:`train_point`);
- :mod:`numerics.sweep.store`: ``DIR/points/<id>.json`` written atomically by the client alone
  as each point completes, ``log.jsonl``, ``summary.json``; :func:`load_results`;
- :mod:`numerics.sweep.schedulers`: serial, a process pool that survives (and retries) worker
  deaths and whose workers die with the client, Dask;
- :mod:`numerics.sweep.runner`: :func:`run_grid` (resume: stored points are skipped);
- :mod:`numerics.sweep.cli`: ``python -m numerics.sweep``.

Determinism: the default point function sets ``torch.set_num_threads(1)`` before training,
so a point gives bit-identical numbers serially, in a pool and on Dask (intra-op thread
pools change the order of floating-point reductions; one thread fixes it).
"""
from numerics.io import write_json_atomic
from numerics.sweep.cli import main
from numerics.sweep.execute import execute_point, resolve_point_fn, train_point
from numerics.sweep.grid import MODELS, complete_point, config_fields, expand_grid, load_grid
from numerics.stored import DEFAULT_POINT_FN, code_sources, code_version, point_id
from numerics.sweep.runner import SweepSummary, run_grid
from numerics.sweep.store import load_results, select_results

__all__ = ["DEFAULT_POINT_FN", "MODELS", "SweepSummary", "code_sources", "code_version", "complete_point",
           "config_fields", "execute_point", "expand_grid", "load_grid", "load_results", "main", "point_id",
           "resolve_point_fn", "run_grid", "select_results", "train_point", "write_json_atomic"]
