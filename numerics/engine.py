"""The one engine: what the claims need, as data, computed once and priced before it runs.

A claim's plan is a list of :class:`Need` s: frozen, hashable descriptions of a computation (a
trained full model, a reduced flow, a Monte-Carlo minimum, a theory value), each naming its
*kind* and every parameter that determines its result.  Two claims that ask for the same need
get one computation.  A need's value may depend on other needs: a parameter whose value is a
Need is a dependency, computed first and handed to the kind's function as its value.

Each kind (:class:`Kind`, registered with :func:`kind`) says how to compute a need
(``run(**params, seed=...)``), what it costs in CPU seconds before it runs (``cost(**params)``,
from the parameters alone, through the cost model below), and, for runs a sweep can store, the
sweep point it is (``point``) and how a stored result is read back (``load``).

Seeds come from identities only: a need's seed is ``case_seed(report_seed, *stream)`` with
``stream`` the need's own name parts, by default its kind and identity.  Needs that share a
prompt stream on purpose (common random numbers: the m-head and the one-head run of a gain)
name the same ``stream`` in the plan, where a reader sees it.

:class:`Engine` executes the union of needs: from its memo (this process), else from a sweep
store, else computed, dependencies first; with ``jobs`` > 1 the independent needs run in
worker processes, the costliest first.

Seeds by identity: the seed of a run is derived from the report's seed and the
stable name of the run's case, never by arithmetic on positions (``seed + 100 * k + j``, a
hard-coded 100 that must equal another claim's k = 1, j = 0); and the check that runs counted
as independent are (:func:`check_independent`, on the runs' fingerprints).

:func:`case_seed` hashes (seed, *name parts) with SHA-256, so a seed

- is the same in every process and on every machine (Python's ``hash()`` is salted per process
  and never used);
- differs between distinct case names (up to a collision of the 31-bit value: about 1 in 2^31
  per pair);
- moves with the report's ``--seed``: every case's seed changes when the report's does;
- does not depend on where the case stands in a profile's list, so two claims that train the
  same configuration under the same case name share the run (one need of the engine: the
  configuration, the schedule and this seed, numerics.experiments.converged.train_converged).

:func:`trained_run_seed` is the case name of a trained run of a problem, the one that claims
sharing trained runs (limiting-error, multi-head-gain, boundary-left-allocation) all call.

What a run costs before it runs: a calibrated model of the CPU seconds of the numerics' primitives.

Every claim's ``estimate`` is its own plan (which runs, how many steps, which evaluations) priced
through this module, so that ``reports.build`` can print an honest cost before it starts and refuse
an audit that would not finish.  One model, fitted once, used everywhere:

    seconds(primitive) = sum_k c_k x_k

with features x_k counted from the sizes (tasks, heads H, L, batch B, runs) and non-negative
coefficients c_k fitted by ``python -m numerics.bench --calibrate`` (relative least squares over a grid of
measured sizes: each point counts by its ratio measured / modelled, so small and large sizes are fitted
alike).  The primitives, with D = d + m the token width, m the tasks:

- :func:`step_seconds` -- one gradient step of the full model, ``numerics.train.train`` (one run) or a
  program of ``numerics.train.train_many`` (R runs of one shape, S distinct prompt streams, k = R / S
  runs per stream): features step (1), run (R), context (S B L D: drawing the prompts and reading the
  context), logits (R B L H: the logit-sized tensors and the softmax), flops (R B L D H: the four
  context products);
- :func:`forward_seconds` -- the held-out loss of ``models`` full models on n fresh prompts
  (``numerics.evaluate``: no gradient, chunks of 4096): chunk (n / 4096), context (n L D), logits
  (models n L H), flops (models n L D H);
- :func:`reduced_step_seconds` -- one step of ``numerics.train.train_reduced``: the whole-prompt
  estimator (draws the full prompts: context n L D, block scores n L m, the mix n L H m) or the
  Rao-Blackwellised ``marginal`` one (draws n L m, the mix n L H m);
- :func:`marginal_seconds` -- ``numerics.exact_reduced.evaluate`` of ``points`` (omega, mu) points on
  n marginal prompts (draws n L m once, the mix points n L H m);
- :func:`fit_seconds` -- one L-BFGS-B search of ``numerics.exact_reduced.minimise_family`` from one
  start: FIT_EVALUATIONS objective evaluations (forward and backward of the closed-form mu on the
  fit sample: the mix n L H m);
- :func:`theory_seconds` -- a call of theory's quadrature (``theory.exact``) or flows, by kind: the
  measured CPU seconds in :data:`THEORY_SECONDS` (they depend on the block sizes only mildly).

CPU seconds, one torch thread (the claims' policy, ``numerics.experiments.one_thread``), process time
(``time.process_time``): waiting for a core does not count, so the numbers hold on a shared machine
(sharing the caches inflates them by some 10-30 %).  The report's wall time on 2 cores is the larger of
its two processes' sums (``reports.build`` adds the claims up that way).  Measured on the machine of
:data:`CALIBRATION`; another machine should run ``python -m numerics.bench --calibrate`` and compare.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import numbers
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np


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
        return float(obj)       # 0 and 0.0 name the same need, as in case_seed
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
        """The seed of this need at the report's seed (:func:`case_seed`)."""
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


def _start_worker(parent_pid: int) -> None:
    """A worker's start: it ends with the command (numerics.io.die_with_parent) and keeps freed
    memory for reuse (numerics.io.keep_freed_memory)."""
    from numerics.io import die_with_parent, keep_freed_memory
    die_with_parent(parent_pid)
    keep_freed_memory()


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
    independent needs (1: in this process); ``progress(message, fraction)``.  The workers are
    started at the first parallel run and kept for every later one (a staged plan asks the
    engine several times; a fresh worker pays its imports and the theory's cached derivations
    again) until :meth:`close`."""

    seed: int = 0
    store: Any = None
    jobs: int = 1
    progress: Callable[[str, float], None] = lambda message, fraction: None
    cpu_seconds: dict = field(default_factory=dict)
    stored_ids: set = field(default_factory=set)
    local: dict = field(default_factory=dict)
    _pool: Any = field(default=None, repr=False)

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

    def _workers(self):
        """The pool of ``self.jobs`` worker processes, started at the first call."""
        if self._pool is None:
            import multiprocessing
            from numerics.io import worker_environment
            ctx = multiprocessing.get_context("spawn")
            with worker_environment():     # one BLAS thread in each worker (numerics.io.ONE_BLAS_THREAD)
                self._pool = ctx.Pool(self.jobs, initializer=_start_worker, initargs=(os.getpid(),))
        return self._pool

    def close(self) -> None:
        """End the worker processes (a later parallel run starts new ones)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()
            pool.join()

    def _run_parallel(self, jobs: list) -> None:
        """``jobs`` in the ``self.jobs`` worker processes, the costliest ready job first."""
        costs = {id(j): sum(cost_of(n) for n in j) for j in jobs}
        waiting, running, done = list(jobs), {}, 0.0
        total = sum(costs.values()) or 1.0
        pool = self._workers()
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
        except BaseException:
            self._pool = None
            pool.terminate()
            pool.join()
            raise


SEED_BITS = 31
"""A derived seed lies in [0, 2^31): a valid seed for torch, numpy (legacy seeds < 2^32) and a
sweep point, exact in JSON, and still valid after the small offsets a case adds to its own
streams (``s + 1``, ``s + 2`` for a case's fit and evaluation samples)."""


def _name_part(part):
    """One name part as JSON-ready data: a number is its value (0, 0.0 and numpy's 0.0 name the
    same case, as float), a string itself, a tuple or list the list of its parts."""
    if isinstance(part, str):
        return part
    if isinstance(part, bool) or part is None:
        raise TypeError(f"a case name part must be a string, a number or a tuple of them, got {part!r}")
    if isinstance(part, numbers.Real):
        value = float(part)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"a case name part must be a finite number, got {part!r}")
        return value
    if isinstance(part, (tuple, list)):
        return [_name_part(p) for p in part]
    raise TypeError(f"a case name part must be a string, a number or a tuple of them, got {part!r}")


def case_seed(seed: int, *name_parts) -> int:
    """The seed of the case named ``name_parts`` at the report's seed ``seed``: the first 8 bytes
    of SHA-256 of the JSON text of [seed, *name_parts] (numbers as floats, tuples as lists),
    shifted to :data:`SEED_BITS` bits.  ``name_parts``: at least one; strings, finite numbers,
    tuples or lists of them (anything else is a TypeError, before any run)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if not name_parts:
        raise ValueError("a case needs a name: case_seed(seed, 'what', ...)")
    text = json.dumps([int(seed), *(_name_part(p) for p in name_parts)], separators=(",", ":"))
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def trained_run_seed(seed: int, tasks, sigma: float, L: int) -> int:
    """The seed of the trained run of the problem (tasks, sigma, L) at the report's seed: the
    case ("trained run", tasks, sigma, L).  The head count is not part of the name, so claim 6's
    H-head and one-head runs of a problem see the same prompt stream; and every claim that
    trains the problem at the same schedule asks for the same run (one cache key)."""
    return case_seed(seed, "trained run", tuple(tasks), sigma, L)


DIGEST_CHARS = 16
"""A fingerprint is the first 64 bits of a SHA-256, in hex: two different inputs share one with
probability about 2^-64 per pair."""


def digest(*arrays) -> str:
    """The first :data:`DIGEST_CHARS` hex digits of SHA-256 over each array's shape and its
    float64 bytes (C order): the same numbers give the same digest in every process and on
    every machine (numerics.train fingerprints a run's first batch and its initial state)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.float64)
        h.update(repr(a.shape).encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()[:DIGEST_CHARS]


def check_independent(fingerprints: dict, what: str, shared_stream: bool = False) -> None:
    """Refuse runs counted as independent that share their randomness: ValueError naming the
    runs (and ``what`` they are) when two of them have the same fingerprint.

    ``fingerprints``: run id -> the run's ``TrainResult.fingerprint``, {"prompts": digest of
    its first batch, "weights": digest of its initial state}.  By default two runs clash when
    their first batches are the same (one prompt stream: their batch losses are not independent
    samples, whatever their starts).  ``shared_stream=True`` is for runs that share one stream
    on purpose (common random numbers: the same prompts, different starts): two clash when
    their initial states are the same (then nothing but the configuration tells them apart)."""
    part = "weights" if shared_stream else "prompts"
    by_value: dict = {}
    for run_id, fp in fingerprints.items():
        if not isinstance(fp, dict) or not isinstance(fp.get(part), str):
            raise ValueError(f"{what}: run {run_id!r} has no {part} fingerprint (got {fp!r}); pass each "
                             "run's TrainResult.fingerprint")
        by_value.setdefault(fp[part], []).append(run_id)
    clashes = [ids for ids in by_value.values() if len(ids) > 1]
    if clashes:
        shared, own = (("initial weights", "start (init_seed)") if shared_stream else
                       ("first batch of prompts", "data seed"))
        groups = "; ".join(", ".join(map(repr, ids)) for ids in clashes)
        raise ValueError(f"{what}: runs counted as independent share their {shared} ({groups}); give each "
                         f"its own {own} by numerics.engine.case_seed")


MERGE_CONTEXT_ELEMENTS = 2 ** 20
"""On the CPU, runs of different prompt streams share a program only while the program's
contexts (streams x batch x L x (d + m)) hold at most this many numbers (8 MiB in float64).
Measured (one thread, 8 runs of 8 own streams against the 8 runs one after another, CPU time,
float64, H = 2; docs/performance.md): 1.49x at tasks 3,3, L = 32, batch 256 (8 streams: 0.5 M
numbers), 1.29x at tasks 2,2, L = 32, batch 512 (0.8 M), but 1.09x at tasks 3,3, L = 64,
batch 512 (2.1 M) and 0.9-1.0x at tasks 2,2, L = 64, batch 1024 (5 streams a program: 2 M):
beyond about a million numbers the merged contexts leave the cache and merging gains
nothing, so larger streams get programs of their own (their runs still share their draw)."""

CALIBRATION = {
    "machine": "Intel Xeon, 2 vCPUs (shared with four other engineers' jobs), 260 MiB L3, 23 GB RAM",
    "software": "torch 2.13.0+cpu, numpy 2, Python 3.11, one torch thread",
    "when": "docs/measurements.md, the cost model's calibration",
    "load": "load average 3-8 during the calibration (CPU time, not wall)",
    "how": "python -m numerics.bench --calibrate --out FILE (numerics/bench/calibrate.py)",
    "accuracy": "calibration points within a factor 1.6 of the fitted model, one (L = 12, 16,17,17) at 2.3 (numerics.bench --calibrate prints each)",
}
"""Where and how the coefficients below were measured."""

# coefficients (CPU seconds per unit of each feature), fitted by numerics.bench --calibrate
# (CALIBRATION; 28 CPU s).  float32 was not calibrated: its per-element coefficients are float64's x 0.67,
# the ratio numerics.bench section 4 measured at 16,17,17 / H = 3 / L = 100 / batch 10000 (566 / 846 ms)
STEP = {
    "float64": {"step": 1.65e-3, "run": 1.2e-3, "context": 1.88e-8, "logits": 9.45e-9, "flops": 6.57e-10},
    "float32": {"step": 1.65e-3, "run": 1.2e-3, "context": 1.26e-8, "logits": 6.3e-9, "flops": 4.4e-10},
}
FORWARD = {"chunk": 1.18e-3, "context": 1.06e-8, "logits": 0.0, "flops": 8.25e-10}
REDUCED_STEP = {
    "prompts": {"step": 2.65e-3, "context": 1.43e-8, "scores": 0.0, "mix": 0.0},
    "marginal": {"step": 5.0e-4, "draws": 3.65e-8, "mix": 0.0},
}
MARGINAL = {"call": 0.0, "draws": 3.99e-8, "mix": 4.63e-9}
FIT = {"evaluation": 2.5e-2, "mix": 1.78e-8}

REPORT_SCALE = 0.37
"""Every coefficient above and every theory time below is its fit times this factor: the quick
report's own needs, measured by CPU seconds (``reports.build``, seed 0, ``--jobs 2``, the CI's kind
of machine, 2 cores; docs/measurements.md), took 0.37 of what the fit priced them at
(438 CPU-s measured in the engine's jobs against 1175 priced).  The fit's grid times programs
of a few runs at a time on a machine loaded by other jobs; the report's programs fold many runs
onto one stream's context, which the per-run feature prices at a small program's rate (its
per-kind ratios, priced over measured: start runs 3-4, saddle runs 1.6-3.5, theory 3.9, the
converged runs 1.4), so one factor leaves each kind within a factor of about 2 and the
report's total within a few %; the build's comparisons and rendering add some
5 % more."""

for _table in (STEP["float64"], STEP["float32"], FORWARD, REDUCED_STEP["prompts"], REDUCED_STEP["marginal"],
               MARGINAL, FIT):
    for _name in _table:
        _table[_name] *= REPORT_SCALE

FIT_EVALUATIONS = 80
"""Objective evaluations of one L-BFGS-B search of ``minimise_family`` (its maxiter is 100; the
calibration's searches took 11, 41, 124 and 146 evaluations): a stated mean, not a bound."""

THEORY_SECONDS = {
    "exact_fixed_point": 3.2,      # theory.exact.exact_fixed_point, per distinct block size r_i: 2.8 s at (2, 2),
                                   # 7.1 s at (16, 17, 17) (L = 100; 6.4 s at L = 200)
    "finite_L_gain": 3.2,          # theory.exact.finite_L_gain: the fixed point (per distinct r_i, as above) plus the
                                   # one-head optimum, SINGLE_HEAD_SECONDS x (d / 4)^SINGLE_HEAD_POWER
    "phase_prediction": 2.9,       # claim 3 per init scale: run_length, the expansion flow's phases, the exact losses
                                   # (measured under load in the quick report; run_length alone 0.4-4.4 s)
    "exact_flow": 0.45,            # theory.exact.exact_flow, one head, per L
    "expansion_flow": 0.2,         # theory.reduced_ode flows (LSODA to t ~ 60)
}
"""CPU seconds of one call of theory's quadrature or flows, by kind, measured at the claims' sizes;
the quadrature's by the blocks (:func:`theory_seconds`)."""

THEORY_SECONDS = {name: seconds * REPORT_SCALE for name, seconds in THEORY_SECONDS.items()}

SINGLE_HEAD_SECONDS, SINGLE_HEAD_POWER = 1.0 * REPORT_SCALE, 1.85
"""The one-head optimum of theory.exact (one head serving all d = sum r_i coordinates): ~1 s at
d = 4 ((2, 2): finite_L_gain 3.7 s against the fixed point's 2.8 s), 108 s at d = 50 ((16, 17, 17),
L = 100: 114.7 s against 7.1 s): d^1.85 between them (two points: an interpolation, stated as such)."""


def _dims(tasks) -> tuple[int, int, int]:
    d, m = sum(int(r) for r in tasks), len(tasks)
    return d, m, d + m


def _priced(coef: dict, features: dict) -> float:
    return float(sum(coef[k] * v for k, v in features.items()))


def step_features(tasks, heads: int, L: int, batch: int, runs: int = 1, streams: Optional[int] = None) -> dict:
    """The features of one program step of ``runs`` full-model runs of one shape on ``streams``
    distinct prompt streams (default: one per run)."""
    _, _, D = _dims(tasks)
    S = runs if streams is None else int(streams)
    B, H = int(batch), int(heads)
    return {"step": 1.0, "run": float(runs), "context": float(S) * B * L * D, "logits": float(runs) * B * L * H,
            "flops": float(runs) * B * L * D * H}


def step_seconds(tasks, heads: int, L: int, batch: int, *, dtype: str = "float64", runs: int = 1,
                 streams: Optional[int] = None) -> float:
    """CPU seconds of one gradient step of ``runs`` full-model runs trained as one program
    (``numerics.train.train_many``; runs = 1: ``train``), ``streams`` distinct prompt streams among
    them (default: every run its own)."""
    return _priced(STEP[dtype], step_features(tasks, heads, L, batch, runs, streams))


def train_seconds(tasks, heads: int, L: int, batch: int, steps: int, *, dtype: str = "float64", runs: int = 1,
                  streams: Optional[int] = None, records: int = 0) -> float:
    """CPU seconds of ``steps`` steps of such a program, plus ``records`` trajectory readouts per
    run (a readout is about one step's fixed part)."""
    per = step_seconds(tasks, heads, L, batch, dtype=dtype, runs=runs, streams=streams)
    return float(steps) * per + float(records) * runs * STEP[dtype]["run"]


def many_seconds(tasks, heads: int, L: int, batch: int, steps: int, streams: Sequence[int], *,
                 dtype: str = "float64", records: int = 0) -> float:
    """CPU seconds of ``numerics.train.train_many`` on runs of one shape, ``streams[s]`` runs on
    prompt stream s, all ``steps`` steps: programs formed as train_many forms them on a CPU (the
    runs of one stream together; streams of as many runs merged only while the program's contexts
    stay within MERGE_CONTEXT_ELEMENTS numbers), each priced by :func:`step_seconds`.  A
    program of one run is train() itself."""
    _, _, D = _dims(tasks)
    per_stream = int(batch) * int(L) * D
    budget = max(1, MERGE_CONTEXT_ELEMENTS // per_stream)
    by_count: dict = {}
    for k in streams:
        if int(k) > 0:
            by_count.setdefault(int(k), []).append(int(k))
    total = 0.0
    for counts in by_count.values():
        for lo in range(0, len(counts), budget):
            part = counts[lo:lo + budget]
            total += train_seconds(tasks, heads, L, batch, steps, dtype=dtype, runs=sum(part), streams=len(part),
                                   records=records)
    return total


def forward_features(tasks, heads: int, L: int, n: int, models: int = 1) -> dict:
    _, _, D = _dims(tasks)
    return {"chunk": math.ceil(n / 4096) * float(models), "context": float(n) * L * D,
            "logits": float(models) * n * L * heads, "flops": float(models) * n * L * D * heads}


def forward_seconds(tasks, heads: int, L: int, n: int, *, models: int = 1) -> float:
    """CPU seconds of the held-out loss of ``models`` full models on the same ``n`` fresh prompts
    (``numerics.evaluate.held_out_losses``; models = 1: ``held_out_loss``), float64."""
    return _priced(FORWARD, forward_features(tasks, heads, L, n, models))


def reduced_step_features(tasks, heads: int, L: int, batch: int, estimator: str = "prompts") -> dict:
    _, m, D = _dims(tasks)
    mix = float(batch) * L * heads * m
    if estimator == "marginal":
        return {"step": 1.0, "draws": float(batch) * L * m, "mix": mix}
    if estimator == "prompts":
        return {"step": 1.0, "context": float(batch) * L * D, "scores": float(batch) * L * m, "mix": mix}
    raise ValueError(f"estimator must be 'prompts' or 'marginal', got {estimator!r}")


def reduced_step_seconds(tasks, heads: int, L: int, batch: int, *, estimator: str = "prompts") -> float:
    """CPU seconds of one step of ``numerics.train.train_reduced`` (float64)."""
    return _priced(REDUCED_STEP[estimator], reduced_step_features(tasks, heads, L, batch, estimator))


def marginal_features(tasks, heads: int, L: int, n: int, points: int = 1) -> dict:
    _, m, _ = _dims(tasks)
    return {"call": float(points), "draws": float(n) * L * m, "mix": float(points) * n * L * heads * m}


def marginal_seconds(tasks, heads: int, L: int, n: int, *, points: int = 1) -> float:
    """CPU seconds of ``numerics.exact_reduced.evaluate`` of ``points`` points of H heads on the same
    ``n`` Rao-Blackwellised prompts (the gradient, ``loss_and_gradient``, about twice that)."""
    return _priced(MARGINAL, marginal_features(tasks, heads, L, n, points))


def fit_seconds(tasks, heads: int, L: int, n_fit: int, *, starts: int = 1) -> float:
    """CPU seconds of ``numerics.exact_reduced.minimise_family`` over H heads from ``starts`` starts
    on ``n_fit`` fit prompts: FIT_EVALUATIONS evaluations of the objective per start."""
    _, m, _ = _dims(tasks)
    per = FIT["evaluation"] + FIT["mix"] * float(n_fit) * L * heads * m
    return float(starts) * FIT_EVALUATIONS * per


def theory_seconds(kind: str, calls: int = 1, tasks: Optional[Sequence[int]] = None) -> float:
    """CPU seconds of ``calls`` calls of theory's ``kind`` (:data:`THEORY_SECONDS`); for the
    quadrature (exact_fixed_point, finite_L_gain) at the block sizes ``tasks`` (default: one
    distinct block of size 2)."""
    if kind not in THEORY_SECONDS:
        raise KeyError(f"no measured cost for theory call {kind!r}; known: {', '.join(THEORY_SECONDS)}")
    per = THEORY_SECONDS[kind]
    if kind in ("exact_fixed_point", "finite_L_gain"):
        blocks = tuple(int(r) for r in (tasks if tasks is not None else (2, 2)))
        per *= len(set(blocks))
        if kind == "finite_L_gain":
            per += SINGLE_HEAD_SECONDS * (sum(blocks) / 4.0) ** SINGLE_HEAD_POWER
    return float(calls) * per

