"""The one engine: what the claims need, as data, computed once and priced before it runs.

A claim's plan is a list of :class:`Need` s: frozen, hashable descriptions of a computation (a
trained full model, a reduced flow, a Monte-Carlo minimum, a theory value), each naming its
*kind* and every parameter that determines its result.  Two claims that ask for the same need
get one computation.  A need's value may depend on other needs: a parameter whose value is a
Need is a dependency, computed first and handed to the kind's function as its value.

Each kind (:class:`Kind`, registered with :func:`kind`) says how to compute a need
(``run(**params, seed=...)``), what it costs in CPU seconds before it runs (``cost(**params)``,
from the parameters alone, through ``numerics.cost``), and, for runs a sweep can store, the
sweep point it is (``point``) and how a stored result is read back (``load``).

Seeds come from identities only: a need's seed is ``case_seed(report_seed, *stream)`` with
``stream`` the need's own name parts, by default its kind and identity.  Needs that share a
prompt stream on purpose (common random numbers: the m-head and the one-head run of a gain)
name the same ``stream`` in the plan, where a reader sees it.

:class:`Engine` executes the union of needs: from its memo (this process), else from a sweep
store, else computed, dependencies first; with ``jobs`` > 1 the independent needs run in
worker processes, the costliest first.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from numerics.seeds import case_seed

KINDS_BY_MODULE: dict[str, tuple] = {
    "numerics.experiments": ("theory",),
    "numerics.experiments.converged": ("converged", "continue_on_D", "unstable_step"),
    "numerics.exact_reduced": ("reduced_minima",),
    "numerics.experiments.probes": ("symmetric_batch_runs", "fresh_batch_runs", "gradient_projection",
                                    "richardson_runs", "trend_run", "best_decomposable", "decomposable_search",
                                    "full_merged_start", "best_as_full_model", "constant_row", "reduced_flow",
                                    "paired_end_losses", "fewer_heads_end", "saturation_scan", "monte_carlo_losses"),
    "numerics.experiments.phases": ("phase_run", "escape_time_spread", "allocation_run", "off_task_gradient"),
    "numerics.experiments.authors": ("authors_run", "reference_points", "authors_emergence"),
    "numerics.experiments.atlas": ("atlas", "atlas_grid"),
    "numerics.saddle": ("saddle_escape_runs", "saddle_variance", "saddle_step_sizes", "saddle_invariant"),
    "numerics.experiments.starts": ("start_runs", "start_flows", "single_task_references"),
}
"""The one registry of need kinds: the module that registers each (``kind`` refuses a
registration elsewhere), which a worker process imports to compute a need of that kind."""
KIND_MODULES = {name: module for module, names in KINDS_BY_MODULE.items() for name in names}


def _canonical(obj):
    """JSON-ready canonical form of a parameter (dataclasses as dicts, tuples as lists, needs
    by their identity)."""
    if isinstance(obj, Need):
        return {"need": obj.kind, "params": _canonical(dict(obj.params)), "stream": _canonical(obj.stream)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return float(obj)       # 0 and 0.0 name the same need, as in numerics.seeds.case_seed
    return obj


LABEL_ITEMS = 4
"""A parameter tuple longer than this is labelled by its length and first items (the seeds of 96
runs are one identity, not a line of the plan each)."""


@dataclass(frozen=True)
class Need:
    """One computation a claim needs: ``kind`` (a registered :class:`Kind`), ``params`` (sorted
    (name, value) pairs, every value hashable) and ``stream`` (the name parts of its seed; None:
    its kind and identity)."""

    kind: str
    params: tuple
    stream: Optional[tuple] = None

    @property
    def args(self) -> dict:
        return dict(self.params)

    @property
    def identity(self) -> str:
        """The need as canonical JSON: what the memo, the sweep store and the seed key it by."""
        return json.dumps(_canonical(self), sort_keys=True, separators=(",", ":"))

    def seed(self, report_seed: int) -> int:
        """The seed of this need at the report's seed (:func:`numerics.seeds.case_seed`)."""
        parts = self.stream if self.stream is not None else (self.kind, self.identity)
        return case_seed(int(report_seed), *parts)

    def dependencies(self) -> list:
        """The needs among its parameters (a parameter may be a need or a tuple of needs)."""
        return [d for _, v in self.params for d in (v if isinstance(v, tuple) else (v,)) if isinstance(d, Need)]

    def label(self) -> str:
        """A short human-readable description (``reports.build --plan``)."""
        parts = []
        for k, v in self.params:
            if isinstance(v, Need):
                parts.append(f"{k}=<{v.kind}>")
            elif dataclasses.is_dataclass(v) and hasattr(v, "tasks"):
                parts.append(f"{k}=tasks {list(v.tasks)} H {v.heads} L {v.L} sigma {v.sigma:g}")
            elif dataclasses.is_dataclass(v):
                parts.append(f"{k}={type(v).__name__}")
            elif isinstance(v, tuple) and len(v) > LABEL_ITEMS:
                parts.append(f"{k}=({len(v)} items: {', '.join(map(str, v[:2]))}, ...)")
            else:
                parts.append(f"{k}={v}")
        return f"{self.kind}(" + ", ".join(parts) + ")"


def memo_key(n: Need, report_seed: int) -> str:
    """What a computed need is kept under: its identity at the report's seed (one process may
    build reports at several seeds)."""
    return f"{n.identity}#{n.seed(report_seed)}"


def need(kind_name: str, *, stream: Optional[tuple] = None, **params) -> Need:
    """The Need of ``kind_name`` with ``params`` (keyword order does not matter)."""
    for k, v in params.items():
        try:
            hash(v)
        except TypeError:
            raise TypeError(f"need {kind_name!r}: parameter {k}={v!r} is not hashable (use tuples and frozen "
                            "dataclasses)") from None
    return Need(kind_name, tuple(sorted(params.items())), None if stream is None else tuple(stream))


@dataclass(frozen=True)
class Kind:
    """How to compute, price and store the needs of one kind."""

    name: str
    run: Callable[..., Any]
    cost: Callable[..., float]
    point: Optional[Callable[..., dict]] = None     # (**params, seed) -> the sweep point of this need
    normalise: Optional[Callable[[dict], Any]] = None   # a sweep point -> what two equal points share
    load: Optional[Callable[[dict], Any]] = None    # a stored result -> the value run returns
    shared: bool = True     # kept for the whole process (False: for one engine, i.e. one build or claim run)
    run_many: Optional[Callable[[list, list], list]] = None   # ([params], [seeds]) -> [value or exception]
    batch_key: Optional[Callable[..., Any]] = None            # (**params) -> what needs batched together share


KINDS: dict[str, Kind] = {}


def kind(name: str, *, cost: Callable[..., float], point=None, normalise=None, load=None, shared: bool = True,
         run_many=None, batch_key=None):
    """Register the decorated function as the run of kind ``name``.  ``shared``: its values are
    kept for the whole process (runs: a test's control and its mutants share them); False: for
    one engine only (theory values, which a mutation of theory must reach).  ``run_many`` with
    ``batch_key``: the needs of this kind with one key (from any claims) are computed as one
    program, ``run_many([params], [seeds])`` returning one value (or the exception that ended
    it) per need, each as ``run`` would give it."""
    def register(fn):
        home = KIND_MODULES.get(name, fn.__module__)
        if home != fn.__module__:
            raise ValueError(f"need kind {name!r} is registered in {fn.__module__}, but KIND_MODULES says {home}")
        KINDS[name] = Kind(name, fn, cost, point, normalise, load, shared, run_many, batch_key)
        return fn
    return register


def kind_of(name: str) -> Kind:
    if name not in KINDS and name in KIND_MODULES:
        importlib.import_module(KIND_MODULES[name])
    if name not in KINDS:
        raise KeyError(f"unknown need kind {name!r}; known: {', '.join(sorted(KINDS))}")
    return KINDS[name]


def closure(needs: Iterable[Need]) -> list[Need]:
    """Every need of ``needs`` and of their dependencies, each once, dependencies first."""
    out, seen = [], set()

    def visit(n: Need):
        if n in seen:
            return
        for d in n.dependencies():
            visit(d)
        seen.add(n)
        out.append(n)

    for n in needs:
        visit(n)
    return out


def cost_of(n: Need) -> float:
    """CPU seconds of one need (its kind's cost model, from its parameters alone)."""
    return float(kind_of(n.kind).cost(**n.args))


_MEMO: dict[str, Any] = {}


def clear_memo() -> None:
    """Forget every computed need (tests that patch theory or numerics call this first)."""
    _MEMO.clear()


@dataclass(frozen=True)
class Failed:
    """The value of a need whose computation raised: reading it raises the same error again, so
    only the claims that need it fail."""

    error: BaseException


class Results(dict):
    """{need: value} of a plan; a failed need raises its error when read."""

    def __getitem__(self, n: Need):
        value = super().__getitem__(n)
        if isinstance(value, Failed):
            raise value.error
        return value


def _resolved(n: Need, values: dict, report_seed: int) -> dict:
    def value(v):
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        if not isinstance(v, Need):
            return v
        v = values[memo_key(v, report_seed)]
        if isinstance(v, Failed):
            raise v.error
        return v
    return {k: value(v) for k, v in n.params}


def compute(n: Need, report_seed: int, values: Optional[dict] = None) -> Any:
    """The value of one need, its dependencies' values given in ``values`` (identity -> value);
    an error becomes :class:`Failed` (KeyboardInterrupt and the like propagate)."""
    try:
        return kind_of(n.kind).run(**_resolved(n, values or {}, report_seed), seed=n.seed(report_seed))
    except Exception as exc:        # noqa: BLE001 -- the claims that read it show it as their error
        return Failed(exc)


def compute_job(job: list, report_seed: int, values: Optional[dict] = None) -> list:
    """The values of one job: a need alone, or needs of one kind and batch key computed as one
    program (:class:`Kind`'s ``run_many``)."""
    if len(job) == 1:
        return [compute(job[0], report_seed, values)]
    k = kind_of(job[0].kind)
    try:
        out = k.run_many([_resolved(n, values or {}, report_seed) for n in job], [n.seed(report_seed) for n in job])
    except Exception as exc:        # noqa: BLE001
        return [Failed(exc)] * len(job)
    return [Failed(v) if isinstance(v, BaseException) else v for v in out]


def jobs_of(todo: list) -> list:
    """``todo`` cut into jobs: needs of a kind with ``run_many`` and no dependencies grouped by
    their batch key, every other need alone."""
    groups: dict = {}
    for n in todo:
        k = kind_of(n.kind)
        if k.run_many is not None and not n.dependencies():
            groups.setdefault((n.kind, k.batch_key(**n.args)), []).append(n)
        else:
            groups[("alone", n.identity)] = [n]
    return list(groups.values())


def _compute_in_worker(args):
    job, report_seed, deps = args
    import torch
    torch.set_num_threads(1)
    t0 = time.process_time()
    values = compute_job(job, report_seed, deps)
    return values, time.process_time() - t0


def _shared(n: Need) -> bool:
    return kind_of(n.kind).shared and all(_shared(d) for d in n.dependencies())


@dataclass
class Engine:
    """Executes needs at one report seed: memo, then sweep store, then computation.

    ``store``: a ``numerics.experiments.Store`` (or None); ``jobs``: worker processes for
    independent needs (1: in this process); ``progress(message, fraction)``."""

    seed: int = 0
    store: Any = None
    jobs: int = 1
    progress: Callable[[str, float], None] = lambda message, fraction: None
    cpu_seconds: dict = field(default_factory=dict)
    stored_ids: set = field(default_factory=set)
    local: dict = field(default_factory=dict)

    def memo(self, n: Need) -> dict:
        """Where the value of ``n`` is kept: the process's memo if its kind and every need it
        depends on are shared (a run that read a theory value is this engine's, so that a
        mutation of theory reaches it too), else this engine's own."""
        return _MEMO if _shared(n) else self.local

    def key(self, n: Need) -> str:
        return memo_key(n, self.seed)

    def known(self) -> dict:
        return {**_MEMO, **self.local}

    def stored(self, n: Need) -> Any:
        """The result a sweep store holds for ``n``, as stored (None: not held)."""
        k = kind_of(n.kind)
        if self.store is None or k.point is None or n.dependencies():
            return None
        return self.store.lookup(k.point(**n.args, seed=n.seed(self.seed)), k.normalise)

    def pending(self, needs: Iterable[Need], read: bool = True) -> list[Need]:
        """The needs of ``needs``' closure neither computed nor held by the sweep store (``read``:
        the held ones are read into the memo)."""
        todo = []
        for n in closure(needs):
            if self.key(n) in self.memo(n):
                continue
            rec = self.stored(n)
            if rec is None:
                todo.append(n)
            elif read:
                self.memo(n)[self.key(n)] = kind_of(n.kind).load(rec)
                self.stored_ids.add(self.key(n))
        return todo

    def price(self, needs: Iterable[Need]) -> dict:
        """{need: CPU seconds} of what :meth:`run` would compute (nothing is read or run)."""
        return {n: cost_of(n) for n in self.pending(needs, read=False)}

    def run(self, needs: Iterable[Need]) -> dict:
        """{need: value} of every need (and dependency), computing what is missing."""
        needs = list(needs)
        todo = self.pending(needs)
        jobs = jobs_of(todo)
        if self.jobs > 1 and len(jobs) > 1:
            self._run_parallel(jobs)
        else:
            total, done = sum(cost_of(n) for n in todo) or 1.0, 0.0
            for job in jobs:
                self.progress(job[0].label() + (f" and {len(job) - 1} more" if len(job) > 1 else ""), done / total)
                t0 = time.process_time()
                self._keep(job, compute_job(job, self.seed, self.known()), time.process_time() - t0)
                done += sum(cost_of(n) for n in job)
        return Results({n: self.memo(n)[self.key(n)] for n in closure(needs)})

    def _keep(self, job: list, values: list, cpu: float) -> None:
        for n, value in zip(job, values):
            self.memo(n)[self.key(n)] = value
            self.cpu_seconds[self.key(n)] = cpu / len(job)

    def _run_parallel(self, jobs: list) -> None:
        """``jobs`` in ``self.jobs`` fresh worker processes, the costliest ready job first."""
        import multiprocessing
        from numerics.io.command import die_with_parent, worker_environment

        costs = {id(j): sum(cost_of(n) for n in j) for j in jobs}
        waiting, running, done = list(jobs), {}, 0.0
        total = sum(costs.values()) or 1.0
        ctx = multiprocessing.get_context("spawn")
        with worker_environment():     # one BLAS thread in each worker (numerics.io.command.ONE_BLAS_THREAD)
            pool = ctx.Pool(min(self.jobs, len(jobs)), initializer=die_with_parent, initargs=(os.getpid(),))
        try:
            while waiting or running:
                ready = sorted((j for j in waiting if all(self.key(d) in self.memo(d) for n in j
                                                          for d in n.dependencies())), key=lambda j: -costs[id(j)])
                for job in ready[: max(0, self.jobs - len(running))]:
                    deps = {self.key(d): self.memo(d)[self.key(d)] for n in job for d in n.dependencies()}
                    running[id(job)] = (job, pool.apply_async(_compute_in_worker, ((job, self.seed, deps),)))
                    waiting.remove(job)
                finished = [key for key, (_, r) in running.items() if r.ready()]
                if not finished:
                    time.sleep(0.05)
                for key in finished:
                    job, r = running.pop(key)
                    values, cpu = r.get()
                    self._keep(job, values, cpu)
                    done += costs[key]
                    self.progress(job[0].label(), done / total)
            pool.close()
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
