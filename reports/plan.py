"""What the claims say about a build before any of them runs (``reports.build`` asks, never guesses).

The configuration is parsed by ``claims.check_problem`` (the one parser); which claims cannot
build their experiment at it, by ``claims.cannot_run``; which read a sweep, by
``claims.reads_sweep``; the cost, by the engine's cost model over the union of the plans.  A
claim that cannot answer (a fake registry in the tests, a claim that does not import) is
treated as giving no answer; it shows up as an error when it is run.  ``cfg`` is a
``reports.build.BuildConfig``.
"""
from __future__ import annotations

import inspect
import math
from typing import Optional

import claims
from reports.schema import BadArguments

DEFAULT_MAX_MINUTES = 60.0
"""A per-configuration audit estimated longer than this is refused (--max-minutes raises it)."""

# The ProblemConfig fields a researcher may set, with their command-line flag (the TOML file
# of --config uses the field names).
PROBLEM_FLAGS = {"tasks": "--tasks", "heads": "--heads", "L": "--L", "sigma": "--sigma",
                 "param": "--param", "init_scale": "--init", "logit_scale": "--logit-scale",
                 "basis": "--basis", "dtype": "--dtype"}


def _ask(name: str, *args, default=None):
    """``claims.<name>(*args)``, or ``default`` where claims has no such function (yet) or it
    cannot answer for this id (a claim that does not import shows up as an error when run)."""
    fn = getattr(claims, name, None)
    if fn is None:
        return default
    try:
        return fn(*args)
    except Exception:
        return default


def check_problem(fields: dict, device: str = "cpu") -> dict:
    """The configuration, parsed and validated by ``claims.check_problem`` (the one parser:
    each field checked by ProblemConfig, unknown fields refused); its ValueError becomes
    :class:`BadArguments`.  Returns the normalised fields (tasks a list)."""
    try:
        problem = dict(claims.check_problem(dict(fields), device))
    except (ValueError, TypeError) as exc:
        raise BadArguments(str(exc)) from None
    if "tasks" in problem:
        problem["tasks"] = [int(r) for r in problem["tasks"]]
    return problem


def accepts_problem(claim_id: str) -> bool:
    """Whether the runner of ``claim_id`` takes ``problem=``."""
    try:
        return "problem" in inspect.signature(claims.claim_runner(claim_id)).parameters
    except Exception:  # a claim that cannot be imported shows up as an error when it is run
        return False


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
    """``{"configuration": ids run at cfg.problem, "profile": ids run at their profile}``."""
    ids = selected(cfg)
    if cfg.problem is None:
        return {"configuration": [], "profile": ids}
    at = [cid for cid in ids if accepts_problem(cid)]
    return {"configuration": at, "profile": [cid for cid in ids if cid not in at]}


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
    "wall_seconds"}``: a claim that is not a plan is priced by ``claims.estimate_seconds``
    (None: unknown); the wall time is that of the needs on ``cfg.jobs`` processes, the costliest
    first (:func:`wall_seconds`)."""
    if not hasattr(claims, "plan_of"):
        return None
    at = set(claims_at_configuration(cfg)["configuration"])
    ids = selected(cfg)
    problem = {cid: cfg.problem if cid in at else None for cid in ids}
    plans = [cid for cid in ids if _ask("plan_of", cid, cfg.profile, problem[cid]) is not None]
    per, need_seconds = planned_costs(cfg, plans, problem) if plans else ({}, [])
    for cid in ids:     # a claim that is not a plan: what claims.estimate_seconds says of it (None: unknown)
        if cid not in per:
            per[cid] = _ask("estimate_seconds", cid, cfg.profile, problem[cid])
            need_seconds.append(per[cid] or 0.0)
    per = {cid: float(s) if isinstance(s, (int, float)) and math.isfinite(s) else None for cid, s in per.items()}
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
    if cfg.sweep is not None and hasattr(claims, "reads_sweep"):
        readers = [cid for cid in ids if _ask("reads_sweep", cid, default=True)]
        if not readers:
            everyone = [cid for cid in claims.REGISTRY if _ask("reads_sweep", cid, default=False)]
            raise BadArguments(f"--from-sweep {cfg.sweep}: none of the selected claims ({', '.join(ids)}) reads "
                               f"a sweep; the claims that do: {', '.join(everyone) or 'none'}")
    if cfg.problem is not None:
        ran_at = claims_at_configuration(cfg)
        if not ran_at["configuration"]:
            raise BadArguments(f"none of the selected claims ({', '.join(ran_at['profile'])}) can run at a given "
                               "configuration (their runners take no problem= argument); drop the "
                               "configuration flags to run them at a --profile, or select claims that take one")
        reasons = {cid: _ask("cannot_run", cid, cfg.problem) for cid in ran_at["configuration"]}
        cannot = {cid: why for cid, why in reasons.items() if why}
        if cannot:
            can = [cid for cid in ran_at["configuration"] if cid not in cannot]
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


