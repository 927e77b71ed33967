"""Running the selected claims of a build: the union of their plans executed by one engine
(numerics.engine; ``--jobs`` worker processes for the needs), then each claim's comparison,
its result checked against the claims.json schema as soon as it is made."""
from __future__ import annotations

import inspect
import sys
import time
from typing import Optional, TextIO

import claims
from claims.core.base import ClaimResult, kind_from_id, no_progress, run_claim
from reports.plan import _ask, selected
from reports.progress import ClaimProgress
from reports.schema import OUTCOMES, entry_problems, upgrade
from numerics.io.command import one_blas_thread

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
                        "not a claims.core.base.ClaimResult")
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
    """The ids whose claims are a plan and a comparison (run together by :func:`run_planned`);
    none where ``claims.claim_runner`` is not the package's own (a runner patched in this
    process, as the report's tests do, answers for every id)."""
    if getattr(claims.claim_runner, "__module__", None) != "claims":
        return []
    out = []
    for cid in ids:
        try:
            if claims.spec_of(cid).plan is not None:
                out.append(cid)
        except Exception:  # noqa: BLE001 -- a claim that does not import shows its error when run alone
            continue
    return out


def run_planned(cfg, ids: list[str], stream: TextIO, cpu_seconds: Optional[dict]) -> dict:
    """The claims ``ids`` (each a plan and a comparison) as one build: the union of their plans
    executed once by one engine (a need two claims share is computed once; with ``cfg.jobs`` > 1
    the needs run in worker processes, the costliest first), then each claim's comparison.  A
    claim whose plan or comparison raises, or reads a need that failed, reads ``error``."""
    from claims.core.spec import context, finished
    from numerics import experiments
    from numerics.engine import Engine, Results, closure

    one_blas_thread()      # the needs this process computes itself (the workers start with one)
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
    """Every selected claim, in registry order, with progress on ``stream``; ``cpu_seconds``, if
    given, receives each claim's CPU time.  The claims that are plans run as one build
    (:func:`run_planned`: with ``cfg.jobs`` > 1, on CPU, the needs in that many worker
    processes); any other claim after them, one by one."""
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
    """The claims that are not a plan and a comparison (a registry or runner of the report's
    tests), one by one through ``claims.claim_runner``."""
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
