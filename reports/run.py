"""Running the selected claims of a build: one after another, or side by side in fresh
worker processes (``--jobs``), each claim through ``claims.claim_runner`` with its result
checked against the claims.json schema as soon as it returns."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import time
from typing import Optional, TextIO

import claims
from claims.base import ClaimResult, kind_from_id, no_progress, run_claim
from reports.plan import _ask, selected
from reports.progress import ClaimProgress
from reports.schema import OUTCOMES, entry_problems, upgrade
from numerics.io.processes import die_with_parent

ONE_BLAS_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""The environment of a build's worker processes (set before they start, so numpy's and scipy's
OpenBLAS start with one thread).  Why: numpy's convolve and dot call OpenBLAS's ddot, threaded
above a few thousand elements; each call then wakes a second thread for microseconds of work,
and on 2 shared cores the two wait for each other.  theory.exact's moment tables (direct
Gaussian convolutions) took 13x the CPU time (3.8 against 0.30 s for 3 convolutions of 60000
by 20001, load 7) and multi-head-gain 227 CPU-s in a quick run, 54 with one thread.  It also
makes the numbers independent of the BLAS thread count (a threaded ddot sums in another order:
6e-16 relative)."""

_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
                 "openblas_set_num_threads")


@contextlib.contextmanager
def worker_environment():
    """Within the block, this process's environment holds ``ONE_BLAS_THREAD`` (for worker
    processes started in it); restored on exit, values set before included."""
    saved = {k: os.environ.get(k) for k in ONE_BLAS_THREAD}
    os.environ.update(ONE_BLAS_THREAD)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def one_blas_thread() -> int:
    """Set every OpenBLAS loaded in this process to one thread (the ``ONE_BLAS_THREAD`` policy
    for a process whose numpy is already loaded: a build run in-process, ``--jobs 1``), through
    the library's own ``*openblas_set_num_threads*`` (Linux: the loaded libraries are read off
    /proc/self/maps; elsewhere nothing is done).  Returns how many libraries were set."""
    import ctypes
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return 0
    done = 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _BLAS_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(1))
                done += 1
                break
    return done


def run_one(claim_id: str, cfg, progress=None) -> ClaimResult:
    """Run one claim through ``claims.claim_runner``; any exception (an import error, a claim
    that breaks its contract) becomes a ``ClaimResult`` with verdict ``error`` and the
    traceback, so one broken claim never hides the rest.  KeyboardInterrupt propagates."""

    def body() -> ClaimResult:
        run = claims.claim_runner(claim_id)
        # a claim that reads no sweep runs as without --from-sweep (the build says so before it starts)
        reads = cfg.sweep is not None and _ask("reads_sweep", claim_id, default=True)
        kwargs = dict(profile=cfg.profile, device=cfg.device, seed=cfg.seed, sweep=cfg.sweep if reads else None)
        if cfg.problem is not None and "problem" in inspect.signature(run).parameters:
            kwargs["problem"] = dict(cfg.problem)
        if progress is not None:
            kwargs["progress"] = progress
        return checked(claim_id, run(**kwargs))

    try:    # the spec's declared kind; the id's, where the spec itself cannot be loaded
        kind = claims.spec_of(claim_id).kind
    except Exception:   # noqa: BLE001 -- the same failure then shows as the claim's error below
        kind = kind_from_id(claim_id)
    return run_claim(claim_id, claim_id, "(not available: the claim check raised before returning "
                     "its result; see the error below)", body, kind=kind)


def checked(claim_id: str, result) -> ClaimResult:
    """``result`` if it keeps the contract of a claim's result (its type, its id, a verdict of its
    kind, the claims.json schema), checked as soon as it is returned; ValueError/TypeError else."""
    if not isinstance(result, ClaimResult):
        raise TypeError(f"{claims.REGISTRY[claim_id]} returned {type(result).__name__}, "
                        "not a claims.base.ClaimResult")
    if result.verdict not in OUTCOMES.get(result.kind, ()):
        raise ValueError(f"{claims.REGISTRY[claim_id]} returned verdict {result.verdict!r}, not one of "
                         f"{OUTCOMES.get(result.kind)} (kind {result.kind!r})")
    if result.id != claim_id:
        raise ValueError(f"{claims.REGISTRY[claim_id]} returned id {result.id!r} for registry id "
                         f"{claim_id!r}; the ids of claims.json are the registry's")
    entry = result.to_dict()  # the schema's checks now, not after every claim has run
    entry.update(figure_data=entry.pop("figures"), figures=[], figure_errors=[])
    problems = entry_problems(upgrade({"claims": [entry]})["claims"][0], 0)
    if problems:
        raise ValueError(f"{claims.REGISTRY[claim_id]} returned a result that breaks the schema of "
                         f"claims.json: {'; '.join(problems[:5])}")
    return result


def planned(ids: list[str]) -> list[str]:
    """The ids whose claims are a plan and a comparison (run together by :func:`run_planned`)."""
    out = []
    for cid in ids:
        try:
            if claims.spec_of(cid).plan is not None and parallel_safe():
                out.append(cid)
        except Exception:  # noqa: BLE001 -- a claim that does not import shows its error when run alone
            continue
    return out


def run_planned(cfg, ids: list[str], stream: TextIO, cpu_seconds: Optional[dict]) -> dict:
    """The claims ``ids`` (each a plan and a comparison) as one build: the union of their plans
    executed once by one engine (a need two claims share is computed once; with ``cfg.jobs`` > 1
    the needs run in worker processes, the costliest first), then each claim's comparison.  A
    claim whose plan or comparison raises, or reads a need that failed, reads ``error``."""
    from claims.spec import context, finished
    from numerics import experiments
    from numerics.engine import Engine, Results, closure

    at = set(claims_at_configuration_ids(cfg, ids))
    specs = {cid: claims.spec_of(cid) for cid in ids}
    ctxs, errors = {}, {}
    for cid in ids:
        try:
            ctxs[cid] = context(specs[cid], cfg.profile, cfg.device, cfg.seed, no_progress,
                                dict(cfg.problem) if cid in at and cfg.problem is not None else None)
        except Exception as exc:  # noqa: BLE001
            errors[cid] = exc
    bar = ClaimProgress(f"{len(ctxs)} claims' needs", stream, cfg.progress)
    results = {cid: Results() for cid in ctxs}
    with experiments.store(cfg.sweep) as store:
        engine = Engine(seed=cfg.seed, store=store, jobs=max(1, cfg.jobs if not str(cfg.device).startswith("cuda")
                                                            else 1), progress=bar)
        while True:
            wanted = {}
            for cid in list(ctxs):
                try:
                    wanted[cid] = [n for n in specs[cid].plan(ctxs[cid], results[cid]) if n not in results[cid]]
                except Exception as exc:  # noqa: BLE001
                    errors[cid] = exc
                    del ctxs[cid]
            if not any(wanted.values()):
                break
            computed = engine.run([n for ns in wanted.values() for n in ns])
            for cid, ns in wanted.items():
                results[cid].update({n: dict.__getitem__(computed, n) for n in closure(ns)})
    if bar.bar is not None:
        bar.bar.close()
    shares = need_shares(results, engine)
    out = {}
    for cid in ids:
        def body(cid=cid):
            if cid in errors:
                raise errors[cid]
            used = None if store is None else sum(engine.key(n) in engine.stored_ids for n in results[cid])
            return checked(cid, finished(specs[cid], ctxs[cid], specs[cid].compare(ctxs[cid], results[cid]), used))
        t0 = time.process_time()
        out[cid] = run_claim(cid, specs[cid].title, specs[cid].statement, body, kind=specs[cid].kind)
        out[cid].paper = specs[cid].paper
        spent = time.process_time() - t0 + shares.get(cid, 0.0)
        out[cid].seconds += shares.get(cid, 0.0)
        if cpu_seconds is not None:
            cpu_seconds[cid] = spent
        print(f"{cid}: {out[cid].verdict}", file=stream, flush=True)
    return out


def need_shares(results: dict, engine) -> dict:
    """Each claim's share of the CPU seconds of the needs it read (a need read by k claims counts
    1/k to each)."""
    readers: dict = {}
    cpu = engine.cpu_seconds
    for cid, res in results.items():
        for n in res:
            readers.setdefault(engine.key(n), []).append(cid)
    shares: dict = {}
    for ident, cids in readers.items():
        for cid in cids:
            shares[cid] = shares.get(cid, 0.0) + cpu.get(ident, 0.0) / len(cids)
    return shares


def claims_at_configuration_ids(cfg, ids: list[str]) -> list[str]:
    from reports.plan import claims_at_configuration
    return [cid for cid in claims_at_configuration(cfg)["configuration"] if cid in ids]


def run_all(cfg, stream: Optional[TextIO] = None,
            cpu_seconds: Optional[dict] = None) -> list[ClaimResult]:
    """Every selected claim, in registry order, with progress "[k/n] id ..." on ``stream``;
    ``cpu_seconds``, if given, receives each claim's CPU time.  With ``cfg.jobs`` > 1 (CPU
    only) the claims run in that many worker processes (:func:`run_parallel`)."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    everything = selected(cfg)
    together = planned(everything)
    done = run_planned(cfg, together, stream, cpu_seconds) if together else {}
    ids = [cid for cid in everything if cid not in done]
    if not ids:
        return [done[cid] for cid in everything]
    rest = {r.id: r for r in _run_rest(cfg, ids, stream, cpu_seconds)}
    return [done.get(cid) or rest[cid] for cid in everything]


def _run_rest(cfg, ids: list[str], stream: TextIO, cpu_seconds: Optional[dict]) -> list[ClaimResult]:
    """The claims that are not yet a plan and a comparison, one by one or in worker processes."""
    if cfg.jobs > 1 and len(ids) > 1 and not str(cfg.device).startswith("cuda") and parallel_safe():
        return run_parallel(cfg, ids, stream, cpu_seconds)
    results = []
    for k, claim_id in enumerate(ids, start=1):
        display = ClaimProgress(f"[{k}/{len(ids)}] {claim_id}", stream, cfg.progress)
        one_blas_thread()      # ONE_BLAS_THREAD's policy, also for libraries the last claim loaded
        cpu0 = time.process_time()
        try:
            result = run_one(claim_id, cfg, display)
        except BaseException:  # Ctrl-C or SIGTERM: end the bar's line before the message
            if display.bar is not None:
                display.bar.close()
            raise
        if cpu_seconds is not None:
            cpu_seconds[claim_id] = time.process_time() - cpu0
        display.close(result)
        results.append(result)
    return results


def claim_groups(ids: list[str], profile: str = "quick", costs: Optional[dict] = None) -> list[list[str]]:
    """The selected ids cut into groups that run in one process: the claims of a
    ``claims.SHARED_RUNS`` group together (they share trained runs through the run cache, so each
    is trained once), every other claim alone; the most expensive group first (the claims' own
    estimates at ``profile``, or ``costs`` {id: seconds} where given: reports.plan's at a
    configuration), so that the longest runs start first."""
    groups, seen = [], set()
    for shared in getattr(claims, "SHARED_RUNS", ()):
        g = [cid for cid in ids if cid in shared]
        if g:
            groups.append(g)
            seen.update(g)
    groups += [[cid] for cid in ids if cid not in seen]

    def cost(g):
        if costs is not None:
            return sum(costs.get(cid) or 0.0 for cid in g)
        try:
            return sum(claims.estimate_seconds(cid, profile) or 0.0 for cid in g)
        except Exception:  # a claim that cannot estimate runs last
            return 0.0
    return sorted(groups, key=cost, reverse=True)


def _run_group(args) -> list[tuple[str, ClaimResult, float]]:
    """One group of claims in a worker process (the parent's registry, one torch thread:
    parallelism is across processes; on 2 cores two intra-op threads per process stall each
    other)."""
    group, cfg, registry = args
    import torch
    torch.set_num_threads(1)
    one_blas_thread()          # the environment already says so (ONE_BLAS_THREAD); a library that ignores it
    claims.REGISTRY = registry
    out = []
    for claim_id in group:
        cpu0 = time.process_time()
        result = run_one(claim_id, dataclasses.replace(cfg, progress=False), no_progress)
        out.append((claim_id, result, time.process_time() - cpu0))
    return out


def parallel_safe() -> bool:
    """Whether the claims can run in fresh worker processes: the registry is made of importable
    ``module:NAME`` entries and ``claims.claim_runner`` is the package's own (a runner or
    registry patched in this process only -- the report's tests -- runs in this process)."""
    import importlib
    if getattr(claims.claim_runner, "__module__", None) != "claims":
        return False
    try:
        for entry in claims.REGISTRY.values():
            module, _, name = str(entry).partition(":")
            if not name or not hasattr(importlib.import_module(module), name):
                return False
    except Exception:
        return False
    return True


def run_parallel(cfg, ids: list[str], stream: TextIO,
                 cpu_seconds: Optional[dict]) -> list[ClaimResult]:
    """The claims in ``cfg.jobs`` worker processes, started fresh (multiprocessing's ``spawn``:
    a fork of a process whose torch threads have run can deadlock in the child), one line per
    finished claim on ``stream`` (a bar over the claims with progress on); the results in
    registry order.  Ctrl-C or SIGTERM terminates the workers, and a SIGKILL of this process kills
    them too (each watches this process, :func:`numerics.io.processes.die_with_parent`): nothing is
    written before every claim has returned, and nothing goes on computing after the build is gone."""
    import multiprocessing

    try:   # the claims' own estimates at this build's configuration (reports.plan), to start the longest first
        from reports.plan import estimate
        costs = (estimate(cfg) or {}).get("per_claim")
    except Exception:   # a claim that cannot estimate runs last
        costs = None
    groups = claim_groups(ids, cfg.profile, costs=costs)
    done: dict[str, ClaimResult] = {}
    bar = None
    if cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=len(ids), desc=f"{len(ids)} claims in {min(cfg.jobs, len(groups))} processes", file=stream,
                   dynamic_ncols=True, bar_format="{desc} {n_fmt}/{total_fmt}|{bar:20}| {elapsed}{postfix}")
    # each worker dies with this process (numerics.io.processes.die_with_parent: the kernel's parent-death
    # signal, and a watch of this pid): a build killed with SIGKILL leaves nothing computing
    with worker_environment():     # inherited by the workers as they start
        pool = multiprocessing.get_context("spawn").Pool(min(cfg.jobs, len(groups)), initializer=die_with_parent,
                                                         initargs=(os.getpid(),))
    try:
        for finished in pool.imap_unordered(_run_group, [(g, cfg, dict(claims.REGISTRY)) for g in groups]):
            for claim_id, result, cpu in finished:
                done[claim_id] = result
                if cpu_seconds is not None:
                    cpu_seconds[claim_id] = cpu
                line = f"[{len(done)}/{len(ids)}] {claim_id}: {result.verdict} in {result.seconds:.1f} s"
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(line[:70])
                else:
                    print(line, file=stream, flush=True)
                if result.verdict == "error" and "error" in result.details:
                    print(f"    {claim_id}: {result.details['error']}", file=stream, flush=True)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        if bar is not None:
            bar.close()
    return [done[cid] for cid in ids]
