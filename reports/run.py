"""What a build runs, and running it: the selected claims, what they say before any runs, their
execution by one engine, the progress display and the provenance of the run.

Before any claim runs, every question is asked of the claims (``reports.build`` asks, never
guesses): the configuration is parsed by ``claims.core.check_problem`` (the one parser); which claims
cannot build their experiment at it, by ``claims.cannot_run``; which read a sweep, by
``claims.reads_sweep``; the cost, by the engine's cost model over the union of the plans.  A
claim that cannot answer (a claim that does not import) is treated as giving no answer; it
shows up as an error when it is run.

Running: the union of the selected claims' plans executed by one engine (numerics.engine;
``--jobs`` worker processes for the needs), then each claim's comparison, its result checked
against the claims.json schema as soon as it is made.  ``cfg`` is a
``reports.build.BuildConfig``.
"""
from __future__ import annotations

import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, TextIO

import claims
from claims.core import ClaimResult, kind_from_id, no_progress, run_claim
from numerics.io.command import one_blas_thread
from reports.schema import VERSIONED_PACKAGES, BadArguments, entry_problems, with_defaults

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- what the claims say before any runs


DEFAULT_MAX_MINUTES = 60.0
"""A per-configuration audit estimated longer than this is refused (--max-minutes raises it)."""

# The ProblemConfig fields a researcher may set, with their command-line flag (the TOML file
# of --config uses the field names).
PROBLEM_FLAGS = {"tasks": "--tasks", "heads": "--heads", "L": "--L", "sigma": "--sigma",
                 "param": "--param", "init_scale": "--init", "logit_scale": "--logit-scale",
                 "basis": "--basis", "dtype": "--dtype"}


def _ask(name: str, *args, default=None):
    """``claims.<name>(*args)``, or ``default`` where it cannot answer for this id (a claim that
    does not import shows up as an error when run)."""
    try:
        return getattr(claims, name)(*args)
    except Exception:
        return default


def check_problem(fields: dict, device: str = "cpu") -> dict:
    """The configuration, parsed and validated by ``claims.core.check_problem`` (the one parser:
    each field checked by ProblemConfig, unknown fields refused); its ValueError becomes
    :class:`BadArguments`.  Returns the normalised fields (tasks a list)."""
    try:
        problem = dict(claims.core.check_problem(dict(fields), device))
    except (ValueError, TypeError) as exc:
        raise BadArguments(str(exc)) from None
    if "tasks" in problem:
        problem["tasks"] = [int(r) for r in problem["tasks"]]
    return problem


def selected(cfg) -> list[str]:
    """``--only``'s ids, or every registered id except the opt-in ones (``claims.OPT_IN``: the
    atlas, which runs only when named and only from a sweep)."""
    if cfg.only is not None:
        return list(cfg.only)
    opt_in = set(getattr(claims, "OPT_IN", ()))
    if cfg.profile not in ("tiny", "quick", "paper"):
        # a profile only some specs have (``authors``: claims.authors_replica): the ids that have it,
        # opt-in or not (every other id would only error on the profile's name)
        return [cid for cid in claims.REGISTRY if cfg.profile in _profiles_of(cid)]
    return [cid for cid in claims.REGISTRY if cid not in opt_in]


def _profiles_of(claim_id: str) -> tuple:
    try:
        return tuple(claims.spec_of(claim_id).profiles)
    except Exception:  # a spec that cannot be imported shows up as an error when it is run
        return ()


def claims_at_configuration(cfg) -> dict:
    """``{"configuration": ids run at cfg.problem, "profile": ids run at their profile}``: every
    selected id at the configuration where one is given (``claims.cannot_run`` refuses those
    that cannot build their experiment there, before any run), else at its profile."""
    ids = selected(cfg)
    return {"configuration": ids, "profile": []} if cfg.problem is not None else {"configuration": [], "profile": ids}


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.3g} days"


def estimate(cfg) -> Optional[dict]:
    """The cost of the selected claims: the union of their plans priced once by the engine's cost
    model (:func:`planned_costs`), less what a sweep store holds.
    ``{"seconds", "per_claim": {id: seconds or None}, "unknown": [ids], "jobs",
    "wall_seconds"}``: a claim whose plan cannot be asked (it does not import) is unknown (None); the wall time is that of the needs on ``cfg.jobs`` processes, the costliest
    first (:func:`wall_seconds`)."""
    at = set(claims_at_configuration(cfg)["configuration"])
    ids = selected(cfg)
    problem = {cid: cfg.problem if cid in at else None for cid in ids}
    plans = [cid for cid in ids if _ask("plan_of", cid, cfg.profile, problem[cid]) is not None]
    per, need_seconds = planned_costs(cfg, plans, problem) if plans else ({}, [])
    per = {cid: float(per[cid]) if cid in per and math.isfinite(per[cid]) else None for cid in ids}
    jobs = max(1, int(getattr(cfg, "jobs", 1) or 1))
    return {"seconds": sum(s for s in per.values() if s is not None), "per_claim": per,
            "unknown": [cid for cid, s in per.items() if s is None], "jobs": jobs,
            "wall_seconds": wall_seconds(need_seconds, jobs)}


def planned_costs(cfg, ids: list[str], problem: dict) -> tuple[dict, list]:
    """({id: CPU seconds}, [seconds of each need]) of the claims that are a plan: the union of
    their plans priced once by the one cost model (a need k claims share counts 1/k to each),
    less what a sweep store holds."""
    from numerics.engine import Engine, cost_of
    store = None
    if getattr(cfg, "sweep", None) is not None:
        from numerics.experiments import Store
        try:
            store = Store(cfg.sweep)
        except (OSError, ValueError):
            store = None
    engine = Engine(seed=int(getattr(cfg, "seed", 0) or 0), store=store)
    readers: dict = {}
    for cid in ids:
        for n in engine.price(claims.plan_of(cid, cfg.profile, problem[cid], cfg.device, engine.seed)):
            readers.setdefault(n, []).append(cid)
    per = {cid: 0.0 for cid in ids}
    for n, cids in readers.items():
        for cid in cids:
            per[cid] += cost_of(n) / len(cids)
    return per, [cost_of(n) for n in readers]


def wall_seconds(need_seconds: list, jobs: int) -> float:
    """The wall time of needs costing ``need_seconds`` CPU seconds on ``jobs`` processes as the
    engine runs them: the costliest first, each to the process that frees up first; the
    largest process sum (one process: the sum)."""
    if jobs <= 1 or len(need_seconds) <= 1:
        return float(sum(need_seconds))
    loads = [0.0] * jobs
    for s in sorted(need_seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def describe_estimate(cost: dict) -> str:
    worst = sorted(((s, cid) for cid, s in cost["per_claim"].items() if s), reverse=True)[:3]
    text = f"about {_duration(cost['seconds'])}" + (
        " (" + ", ".join(f"{cid} {_duration(s)}" for s, cid in worst) + ")" if worst else "")
    if cost.get("jobs", 1) > 1 and cost.get("wall_seconds", cost["seconds"]) < cost["seconds"]:
        text += f"; about {_duration(cost['wall_seconds'])} on {cost['jobs']} processes"
    return text + (f"; no estimate for {', '.join(cost['unknown'])}" if cost["unknown"] else "")


def check_claims(cfg) -> Optional[dict]:
    """What the selected claims say about this build, before any of them runs: the configuration
    is one they can take and build their experiment at, the sweep is read by one of them, the
    cost is within --max-minutes.  Returns the cost estimate; :class:`BadArguments` otherwise."""
    ids = selected(cfg)
    if cfg.sweep is not None:
        readers = [cid for cid in ids if _ask("reads_sweep", cid, default=True)]
        if not readers:
            everyone = [cid for cid in claims.REGISTRY if _ask("reads_sweep", cid, default=False)]
            raise BadArguments(f"--from-sweep {cfg.sweep}: none of the selected claims ({', '.join(ids)}) reads "
                               f"a sweep; the claims that do: {', '.join(everyone) or 'none'}")
    if cfg.problem is not None:
        reasons = {cid: _ask("cannot_run", cid, cfg.problem) for cid in ids}
        cannot = {cid: why for cid, why in reasons.items() if why}
        if cannot:
            can = [cid for cid in ids if cid not in cannot]
            raise BadArguments("at this configuration " + "; ".join(f"{cid} cannot run: {why}" for cid, why
                                                                      in cannot.items())
                               + (f". These can: --only {','.join(can)}" if can else ". No selected claim can"))
    cost = estimate(cfg)
    limit = cfg.max_minutes if cfg.max_minutes is not None else (
        DEFAULT_MAX_MINUTES if cfg.problem is not None else None)
    # the limit is of the audit's duration: the wall time of its processes (CPU seconds of an idle machine)
    if cost is not None and limit is not None and cost["wall_seconds"] > 60 * limit:
        raise BadArguments(f"estimated cost: {describe_estimate(cost)}, over --max-minutes {limit:g}. Raise the "
                           f"limit (--max-minutes {math.ceil(cost['wall_seconds'] / 60)}), choose smaller sizes, or "
                           "run fewer claims (--only)")
    return cost

# --------------------------------------------------------------------------- running the claims


def checked(claim_id: str, result) -> ClaimResult:
    """``result`` if it keeps the contract of a claim's result (its id the registry's, the
    claims.json schema), checked as soon as it is made; ValueError else."""
    if result.id != claim_id:
        raise ValueError(f"{claims.REGISTRY[claim_id]} returned id {result.id!r} for registry id "
                         f"{claim_id!r}; the ids of claims.json are the registry's")
    entry = result.to_dict()  # the schema's checks now, not after every claim has run
    entry.update(figure_data=entry.pop("figures"), figures=[], figure_errors=[])
    problems = entry_problems(with_defaults({"claims": [entry]})["claims"][0], 0)
    if problems:
        raise ValueError(f"{claims.REGISTRY[claim_id]} returned a result that breaks the schema of "
                         f"claims.json: {'; '.join(problems[:5])}")
    return result


def run_planned(cfg, ids: list[str], stream: TextIO, cpu_seconds: Optional[dict]) -> dict:
    """The claims ``ids`` (each a plan and a comparison) as one build: the union of their plans
    executed once by one engine (a need two claims share is computed once; with ``cfg.jobs`` > 1
    the needs run in worker processes, the costliest first), then each claim's comparison.  A
    claim that does not import, or whose plan or comparison raises, or reads a need that failed,
    reads ``error`` with the reason."""
    from claims.core import context, finished
    from numerics import experiments
    from numerics.engine import Engine, Results, closure

    one_blas_thread()      # the needs this process computes itself (the workers start with one)
    at = set(claims_at_configuration(cfg)["configuration"])
    specs, ctxs, errors = {}, {}, {}
    for cid in ids:
        try:
            specs[cid] = claims.spec_of(cid)
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
    bar.close()
    shares = need_shares(results, engine)
    out = {}
    for cid in ids:
        def body(cid=cid):
            if cid in errors:
                raise errors[cid]
            reads = store is not None and _ask("reads_sweep", cid, default=True)   # else: as without --from-sweep
            used = sum(engine.key(n) in engine.stored_ids for n in results[cid]) if reads else None
            return checked(cid, finished(specs[cid], ctxs[cid], specs[cid].compare(ctxs[cid], results[cid]), used))
        out[cid] = _judged(cid, specs.get(cid), body, shares.get(cid, 0.0), stream, cpu_seconds)
    return out


def _judged(cid: str, spec, body, share: float, stream: TextIO, cpu_seconds: Optional[dict]) -> ClaimResult:
    """``body()`` run as claim ``cid`` (any exception its ``error``, with the reason), its share of
    the needs' CPU seconds added, its verdict said on ``stream``."""
    t0 = time.process_time()
    if spec is None:      # the claim does not import: the same failure shows as its error
        result = run_claim(cid, cid, "(not available: the claim check raised before returning its result; "
                           "see the error below)", body, kind=kind_from_id(cid))
    else:
        result = run_claim(cid, spec.title, spec.statement, body, kind=spec.kind)
        result.paper = spec.paper
    result.seconds += share
    if cpu_seconds is not None:
        cpu_seconds[cid] = time.process_time() - t0 + share
    print(f"{cid}: {result.verdict}", file=stream, flush=True)
    if result.verdict == "error" and "error" in result.details:
        print(f"    {cid}: {result.details['error']}", file=stream, flush=True)
    return result


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


def run_all(cfg, stream: Optional[TextIO] = None,
            cpu_seconds: Optional[dict] = None) -> list[ClaimResult]:
    """Every selected claim, in registry order, as one build (:func:`run_planned`: with
    ``cfg.jobs`` > 1, on CPU, the needs in that many worker processes), with progress on
    ``stream``; ``cpu_seconds``, if given, receives each claim's CPU time."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    ids = selected(cfg)
    done = run_planned(cfg, ids, stream, cpu_seconds)
    return [done[cid] for cid in ids]

# --------------------------------------------------------------------------- progress


class ClaimProgress:
    """The progress callback of one claim (or of an audit): a tqdm bar on ``stream`` with the
    caller's own message; throttled, and never allowed to raise into the caller.  Without a bar
    the start is announced as ``label ...`` (unless ``announce`` is false)."""

    def __init__(self, label: str, stream: TextIO, enabled: bool, announce: bool = True):
        self.stream, self.last, self.bar = stream, 0.0, None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=100, desc=label, file=stream, leave=True, dynamic_ncols=True,
                            bar_format="{desc} {percentage:3.0f}%|{bar:20}| {elapsed}{postfix}")
        elif announce:
            print(f"{label} ...", file=stream, flush=True)

    def __call__(self, message: str, fraction: float) -> None:
        if self.bar is None:
            return
        try:
            now = time.monotonic()
            if now - self.last < 0.2 and fraction < 1.0:
                return
            self.last = now
            f = float(fraction)
            self.bar.n = 0.0 if not math.isfinite(f) else 100.0 * min(1.0, max(0.0, f))
            self.bar.set_postfix_str(str(message)[:70], refresh=False)
            self.bar.refresh()
        except Exception:  # a progress display must never break a claim
            pass

    def close(self) -> None:
        """The bar at 100 % and closed."""
        if self.bar is not None:
            self.bar.n = 100.0
            self.bar.close()


# --------------------------------------------------------------------------- provenance


def _version(package: str) -> str:
    try:
        return str(getattr(__import__(package), "__version__", "unknown"))
    except Exception:
        return "not installed"


def git_state() -> dict:
    """``{"commit": sha or "unknown", "dirty": bool or "unknown"}`` of the source tree."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return {"commit": "unknown", "dirty": "unknown"}
        status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else "unknown"
        return {"commit": sha.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": "unknown"}


def unreadable_sweep_points(sweep: str) -> list[dict]:
    """The files of ``sweep/points/`` that the claims will not use, with why: ``[{"file",
    "reason"}]`` -- the one reader's verdict (:func:`numerics.stored.read_point` against this
    training code: a link, a file too large, not JSON, an id that is not its file name or not
    its own hash, another code version).  The build prints each as a warning and the report
    records them; the claims train those runs themselves."""
    import os

    from numerics.stored import code_version, read_point   # the store's own reading rule, not a copy

    points = Path(sweep) / "points"
    if not points.is_dir():
        return []
    code = code_version()
    skipped = []
    for name in sorted(n for n in os.listdir(points) if n.endswith(".json") and not n.startswith(".")):
        record, reason = read_point(sweep, name, code=code)
        if record is None:
            skipped.append({"file": str(points / name), "reason": reason})
    return skipped


def provenance(cfg, results: list[ClaimResult], started_utc: str, total_seconds: float,
               command: list[str], cpu_seconds: Optional[dict] = None,
               render_seconds: Optional[float] = None, sweep_skipped: Optional[list] = None,
               cost: Optional[dict] = None) -> dict:
    device = {"name": cfg.device}
    if cfg.device.startswith("cuda"):
        import torch

        device["gpu"] = torch.cuda.get_device_name(torch.device(cfg.device))
    return {
        "versions": {"python": platform.python_version(), **{p: _version(p) for p in VERSIONED_PACKAGES}},
        "platform": platform.platform(),
        "device": cfg.device,
        "device_info": device,
        "seed": cfg.seed,
        "seeds": {"base_seed": cfg.seed, "note": "passed unchanged to every claim run(seed=...)"},
        "profile": cfg.profile,
        "only": list(cfg.only) if cfg.only is not None else None,
        "sweep": cfg.sweep,
        "sweep_skipped": list(sweep_skipped or []),
        "problem": dict(cfg.problem) if cfg.problem is not None else None,
        "ran_at": claims_at_configuration(cfg),
        "cost_estimate": cost,
        "wall_seconds": {"per_claim": {r.id: r.seconds for r in results}, "total": total_seconds,
                         "rendering": render_seconds},
        "cpu_seconds": {"per_claim": dict(cpu_seconds or {}), "total": sum((cpu_seconds or {}).values())},
        "git": git_state(),
        "command": command,
        "started_utc": started_utc,
    }
