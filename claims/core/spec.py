"""A claim as a spec, and the one runner that does everything a claim shares.

A claim module declares a :class:`ClaimSpec`: its id, statement and kind, its profiles (a frozen
dataclass per profile name), how a researcher's ``problem`` is laid over a profile, its domain
check, its plan (the needs numerics.engine runs) and its pure comparison, returned as an
:class:`Outcome`.  :func:`run_spec` does the rest for every claim: the profile and ``problem``
parsing (one parser; unknown or ignored fields refused), progress, judging
(``claims.core.base.judge``, once, with the outcome's ``undecided`` reason), the findings from the
claim's own template, and the one :class:`~claims.core.base.ClaimResult` constructor.  No verdict
is changed after the judge.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from numerics.io import jsonable
from claims.core.base import PROFILES, ClaimResult, Finding, FINDING_KINDS, Progress, judge, no_progress, run_claim

PROBLEM_FIELDS = ("tasks", "heads", "L", "sigma", "param", "init_scale", "logit_scale", "basis", "dtype")
"""The ProblemConfig fields a researcher may set for an audit (``reports.build --tasks ...``)."""


def check_problem(problem: Optional[dict], device: str = "cpu", fields: tuple = PROBLEM_FIELDS) -> Optional[dict]:
    """The one parser of a researcher's configuration: a dict of ProblemConfig fields, each
    validated by ProblemConfig itself (missing tasks/heads/L are filled with placeholders only
    for the validation).  Unknown fields, and fields the claim would ignore (not in
    ``fields``), are refused with a ValueError naming them.  Returns a normalised copy."""
    if problem is None:
        return None
    if not isinstance(problem, dict):
        raise ValueError(f"problem must be a dict of ProblemConfig fields, got {type(problem).__name__}")
    unknown = sorted(set(problem) - set(PROBLEM_FIELDS))
    if unknown:
        raise ValueError(f"problem has unknown field(s) {unknown}; known: {', '.join(PROBLEM_FIELDS)}")
    ignored = sorted(set(problem) - set(fields))
    if ignored:
        raise ValueError(f"problem field(s) {ignored} would be ignored by this claim (it reads "
                         f"{', '.join(fields)}); drop them or audit another claim")
    out = dict(problem)
    if "tasks" in out:
        # integers only: int() would read 3.5 as 3 and "3" as 3 (a TOML [3.5] is not a block size)
        tasks = out["tasks"]
        if isinstance(tasks, (str, bytes)) or not isinstance(tasks, (list, tuple)) or not all(
                isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in tasks):
            raise ValueError(f"tasks must be a list of positive integers (the block sizes r_i, e.g. [3, 3]), got "
                             f"{tasks!r}")
        out["tasks"] = tuple(int(r) for r in tasks)
    from numerics.config import ProblemConfig  # torch only when a configuration is audited
    probe = {"tasks": (1,), "heads": 1, "L": 2, **out, "device": device}
    ProblemConfig.from_dict({k: (list(v) if k == "tasks" else v) for k, v in probe.items()})
    if out.get("L") == 1:
        raise ValueError("L = 1: with one context token softmax has no choice (its weight is 1 whatever the logits), "
                         "so the QK weights get no gradient and none of the claims' dynamics exist; give L >= 2")
    return out


@dataclass
class Context:
    """What ``evaluate`` gets: the resolved profile dataclass ``p`` (the researcher's problem
    already laid over it when the spec knows how), its name, the raw ``problem`` (None for a
    profile run), device, seed and a progress sink."""

    p: Any
    profile: str
    problem: Optional[dict]
    device: str = "cpu"
    seed: int = 0
    progress: Progress = no_progress


@dataclass
class Outcome:
    """What a claim's ``evaluate`` returns: its comparisons (``claims.core.common.Comparison``), the
    headline rows (dicts of :class:`~claims.core.base.HeadlineRow`; default one per comparison),
    figures, details, ``undecided`` (why the run could not decide the claim, or None) and
    ``headline_comparison``: the name of the comparison that is the claim's headline (the one
    whose resolving power is the claim's, ``details["resolving_power"]["headline"]``; None: the
    claim names none, as boundaries do not)."""

    comparisons: list
    headline: Optional[list] = None
    figures: list = field(default_factory=list)
    details: dict = field(default_factory=dict)
    undecided: Optional[str] = None
    theory: Optional[dict] = None
    numerics: Optional[dict] = None
    short_why: bool = False
    headline_comparison: Optional[str] = None


@dataclass(frozen=True)
class ClaimSpec:
    """One claim (or boundary) as data.  ``profiles``: {name: frozen dataclass};
    ``plan(ctx, results) -> [Need]``: what it needs computed (numerics.engine), asked again with
    the results until it asks for nothing new; ``compare(ctx, results) -> Outcome``: its
    comparisons, a pure function of the results; ``evaluate(ctx) -> Outcome``: the one other
    way, for the audit of handed weights (claims.audit), whose measurements are of the
    handed model itself; ``resolve(p, problem) -> p``: the researcher's problem laid over a
    profile (None: problems are refused); ``fields``: the problem fields it reads;
    ``cannot_run(problem) -> reason or None``: a configuration the claim cannot build its
    experiment for, decided before any run; ``findings(result) -> [Finding]``: the template of its sentences, from the result's own
    numbers; ``reads_sweep``: whether its trained runs may come from a sweep store
    (``--from-sweep``); ``paper``: what the paper states, one line in its own terms (a paper
    claim's; None for a boundary), printed beside the number the claim tests."""

    id: str
    title: str
    statement: str
    profiles: dict
    evaluate: Optional[Callable[[Context], Outcome]] = None
    kind: str = "claim"
    resolve: Optional[Callable[[Any, dict], Any]] = None
    fields: tuple = PROBLEM_FIELDS
    cannot_run: Optional[Callable[[dict], Optional[str]]] = None
    findings: Optional[Callable[[ClaimResult], list]] = None
    reads_sweep: bool = False
    plan: Optional[Callable[[Context, Optional[dict]], list]] = None
    compare: Optional[Callable[[Context, dict], Outcome]] = None
    paper: Optional[str] = None

    def profile(self, profile, problem: Optional[dict] = None):
        """The profile dataclass for a name (or a dataclass given directly), problem laid over it."""
        if isinstance(profile, str):
            if profile not in PROFILES or profile not in self.profiles:
                raise ValueError(f"profile must be one of {tuple(self.profiles)}, got {profile!r}")
            p = self.profiles[profile]
        else:
            p = profile
        if problem:
            if self.resolve is None:
                raise ValueError(f"{self.id} runs at its profiles' configurations only; drop the problem fields")
            p = self.resolve(p, problem)
        return p

    def run(self, profile="quick", device="cpu", seed=0, progress: Progress = no_progress, sweep=None,
            problem=None) -> ClaimResult:
        return run_spec(self, profile, device, seed, progress, sweep, problem)


def context(spec: ClaimSpec, profile="quick", device="cpu", seed=0, progress: Progress = no_progress,
            problem=None) -> Context:
    """The claim's Context: the researcher's problem parsed and laid over the profile."""
    parsed = check_problem(problem, device, spec.fields)
    if parsed and spec.cannot_run is not None:
        reason = spec.cannot_run(parsed)
        if reason:
            raise ValueError(f"{spec.id} cannot run at this configuration: {reason}")
    p = spec.profile(profile, parsed)
    return Context(p=p, profile=profile if isinstance(profile, str) else "custom", problem=parsed,
                   device=device, seed=int(seed), progress=progress)


def run_plan(spec: ClaimSpec, ctx: Context, engine) -> dict:
    """The results of the claim's plan: ``spec.plan(ctx, results)`` asked again with what has been
    computed until it asks for nothing new (a plan whose later needs depend on earlier results,
    e.g. a continuation of a run that left the allocated set)."""
    from numerics.engine import Results
    results = Results()
    while True:
        wanted = [n for n in spec.plan(ctx, results) if n not in results]
        if not wanted:
            return results
        results.update(engine.run(wanted))


def run_spec(spec: ClaimSpec, profile="quick", device="cpu", seed=0, progress: Progress = no_progress,
             sweep=None, problem=None) -> ClaimResult:
    """The one runner (module docstring)."""
    from numerics import experiments  # torch only when a claim runs
    if isinstance(profile, str):
        spec.profile(profile)    # an unknown profile name is a bad argument, raised at once

    def body() -> ClaimResult:
        if sweep is not None and not spec.reads_sweep:
            raise ValueError(f"{spec.id} reads no sweep (its runs are not trained models); run it without --from-sweep")
        ctx = context(spec, profile, device, seed, progress, problem)
        with experiments.store(sweep) as store:
            if spec.plan is not None:
                from numerics.engine import Engine
                engine = Engine(seed=ctx.seed, store=store, progress=progress)
                results = run_plan(spec, ctx, engine)
                out = spec.compare(ctx, results)
                used = None if store is None else sum(engine.key(n) in engine.stored_ids for n in results)
            else:
                out = spec.evaluate(ctx)
                used = store.used if store is not None else None
        progress(f"{spec.id}: done", 1.0)
        return finished(spec, ctx, out, used)

    result = run_claim(spec.id, spec.title, spec.statement, body, kind=spec.kind)
    result.paper = spec.paper
    return result


def finished(spec: ClaimSpec, ctx: Context, out: Outcome, used: Optional[int] = None) -> ClaimResult:
    """The ClaimResult of an Outcome: judged once (:func:`build_result`), with its findings."""
    details = {"profile": ctx.profile, "seed": ctx.seed, **out.details}
    if used is not None:
        details["sweep_runs"] = int(used)
    if out.undecided:
        details["undecided"] = out.undecided
    result = build_result(spec, out, details)
    if spec.findings is not None:
        result.findings = [f for f in spec.findings(result) if f is not None]
        for f in result.findings:
            if f.kind not in FINDING_KINDS:
                raise ValueError(f"{spec.id}: finding kind {f.kind!r} is not one of {FINDING_KINDS}")
    return result


def build_result(spec: ClaimSpec, out: Outcome, details: dict) -> ClaimResult:
    """The one constructor of a ClaimResult from an Outcome: the verdict from
    :func:`claims.core.base.judge` (all comparisons agree, every perturbation rejected, nothing
    undecided), theory/numerics/tolerance keyed by comparison name, the worst case, every
    comparison's summary in ``details`` and the summary of their resolving powers
    (``details["resolving_power"]``: headline, best, worst, by units, blind;
    :func:`resolving_summary`) read off those summaries.  Each printed resolving power is
    confirmed against its comparison's own error function (:func:`unconfirmed_power`); one
    that is not is said in the comparison's ``power_unconfirmed`` and, where every comparison agrees
    (a disagreement decides without it), makes the run an ``error`` of the check (a number it
    printed is wrong), the reason in ``details["fault"]``."""
    from claims.core.common import headline_row, worst
    comps = out.comparisons
    perts = [p for c in comps for p in c.perturbations]
    whys = {c.why.split(" (")[0] if out.short_why else c.why for c in comps}
    summaries = [c.summary() for c in comps]
    undecided = out.undecided or (None if comps else "no comparison was made")
    faults = []
    for c, s in zip(comps, summaries):
        s["power_unconfirmed"] = unconfirmed_power(c, s["resolving_power"])
        if s["power_unconfirmed"] and all(c.agrees for c in comps):   # a disagreement decides without it
            faults.append(f"the resolving power printed for {c.name!r} is not confirmed: {s['power_unconfirmed']}")
    fault = "; ".join(faults) or None
    verdict = judge(all(c.agrees for c in comps), perts, spec.kind, undecided, fault)
    if fault:
        details = {**details, "fault": fault}
    return ClaimResult(
        id=spec.id, title=spec.title, statement=spec.statement, verdict=verdict, kind=spec.kind,
        theory=out.theory if out.theory is not None else {c.name: c.predicted for c in comps},
        numerics=out.numerics if out.numerics is not None else {c.name: c.measured for c in comps},
        tolerance={"value": {c.name: c.tolerance for c in comps}, "why": "; ".join(sorted(whys))},
        details={**details, "worst": worst(comps),
                 "resolving_power": resolving_summary(summaries, out.headline_comparison if comps else None),
                 "comparisons": summaries},
        figures=out.figures, perturbations=perts,
        headline=out.headline if out.headline is not None else [headline_row(c) for c in comps])


CONFIRM_BELOW = 0.5
"""The probe from below of a printed resolving power (:func:`unconfirmed_power`): the prediction moved by
CONFIRM_BELOW x the power must still be accepted, so that the printed number never overstates the
smallest error the comparison rejects by more than a factor 1 / CONFIRM_BELOW (nor understates it by more
than claims.core.common.EDGE_MARGIN: the edge probe)."""


def unconfirmed_power(c, printed: Optional[dict] = None) -> Optional[str]:
    """Why the resolving power printed for the comparison ``c`` (``printed``: what claims.json holds,
    default its summary's) is not confirmed by the comparison's own error function and tolerance; None
    when it is.  Confirmed: in each direction ``c`` sees, a power of 0 is the prediction itself rejected
    (``c`` disagrees); a power eps > 0 moved by EDGE_MARGIN x eps is rejected, and moved by CONFIRM_BELOW
    x eps is not (unless eps is printed as a bound: ``bound``); a count k: moved by k rejected, by k - 1
    not.  :func:`build_result` calls this on every comparison, so a resolving power computed wrong, or
    changed after its edge probes were built, turns the claim's verdict into ``error`` with this reason (``details["fault"]``)."""
    from claims.core import common
    power = c.summary()["resolving_power"] if printed is None else printed
    if not power:
        return None
    if c.error_function is None:
        return "it was set without the error function that could confirm it"
    if c.agrees and any(power.get(k) == 0.0 for k in common.SEES.get(c.side, ())):
        return "it is 0 (the prediction itself rejected), yet the comparison agrees"
    args = (c.error_function, c.measured, c.predicted, c.tolerance_function, power, c.side)
    try:
        above = [p.description for p in common.edge_probes(*args) if not p.rejected and p.details.get("eps") is not None]
        below = [p.description for p in common.edge_probes(*args, margin=CONFIRM_BELOW) if p.rejected]
    except (TypeError, ValueError, IndexError, KeyError, ArithmeticError) as exc:
        return f"its probes could not be computed ({type(exc).__name__}: {exc})"
    if above:
        return f"it is too small: a wrong prediction beyond it is accepted ({above[0]})"
    if below:
        return f"it is too large: a wrong prediction well inside it is already rejected ({below[0]})"
    return None


def resolving_summary(comparisons: list, headline: Optional[str] = None) -> dict:
    """The per-claim summary of the comparisons' resolving powers (``details["resolving_power"]``):
    ``headline`` (the claim's headline comparison, named by its evaluate: name, low, high, units,
    eps = ``claims.core.common.seen_eps``, ``meets_floor`` against ``claims.core.common.RESOLVING_FLOOR`` for relative units,
    None otherwise); ``best`` and ``worst`` (smallest and largest eps, each {name, eps, units}) over
    the relative-unit comparisons, or over those of the commonest unit where none is relative;
    ``by_units`` the same per unit; ``blind`` the comparisons with a numeric prediction that cannot
    see a direction they claim to (no resolving power there)."""
    from claims.core import common
    comparisons = [c if isinstance(c, dict) else {"name": c.name, "side": c.side, "resolving_power": c.resolving_power}
                   for c in comparisons]
    rows, blind = [], []
    for d in comparisons:
        rp = d["resolving_power"]
        if not rp:
            continue
        eps = common.seen_eps(d)
        if eps is None:
            blind.append(d["name"])
        else:
            rows.append({"name": d["name"], "eps": eps, "units": rp["units"]})
    by_units = {}
    for u in common.RESOLVING_UNITS:
        rs = [r for r in rows if r["units"] == u]
        if rs:
            by_units[u] = {"best": min(rs, key=lambda r: r["eps"]), "worst": max(rs, key=lambda r: r["eps"]),
                           "n": len(rs)}
    main = by_units.get("relative") or (max(by_units.values(), key=lambda v: v["n"]) if by_units else None)
    head = None
    if headline is not None:
        hit = [c for c in comparisons if c["name"] == headline]
        if not hit:
            raise ValueError(f"headline comparison {headline!r} is not among the comparisons")
        d = hit[0]
        rp, eps = d["resolving_power"] or {}, common.seen_eps(d)
        head = {"name": d["name"], "low": rp.get("low"), "high": rp.get("high"), "units": rp.get("units"),
                "eps": eps, "side": d["side"],
                "meets_floor": (None if rp.get("units") != "relative" else bool(eps is not None
                                                                                  and eps <= common.RESOLVING_FLOOR))}
    return {"headline": head, "best": main["best"] if main else None, "worst": main["worst"] if main else None,
            "floor": common.RESOLVING_FLOOR, "by_units": by_units, "blind": blind}


# ---------------------------------------------------------------------------------------
# findings: sentences from a result's own numbers
# ---------------------------------------------------------------------------------------

def fmt(x, se=None) -> str:
    """A number for a sentence: 4 significant digits, '± se' (2 digits) when given."""
    if x is None:
        return "n/a"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    if isinstance(x, str):
        return x
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x.is_integer() and abs(x) < 1e9 and se is None:
        return str(int(x))
    s = f"{x:.4g}"
    return s if se is None or not math.isfinite(float(se)) else f"{s} ± {float(se):.2g}"


def finding(result: ClaimResult, kind: str, template: str, **numbers) -> Finding:
    """A Finding whose text is ``template.format(**formatted numbers)``: each number is a value
    or a (value, se) pair; the sentence and ``numbers`` come from the same values."""
    vals, text_vals = {}, {}
    for k, v in numbers.items():
        value, se = (v if isinstance(v, tuple) else (v, None))
        vals[k] = {"value": jsonable(value), "se": jsonable(se)}
        text_vals[k] = fmt(value, se)
    return Finding(claim=result.id, kind=kind, text=template.format(**text_vals), numbers=vals)


_ANY = object()


def comparisons_where(result: ClaimResult, config=_ANY, **fields) -> list[dict]:
    """The comparison summaries (``details["comparisons"]``, in their order) whose structured
    fields are the given values: ``config`` the summary's own config label, every other keyword
    a key of its ``details`` (set where the comparison is built, e.g. ``role="step rate"``,
    ``L=64``), compared by equality; a summary without the key does not match.  Findings find
    their comparisons so, never by parsing names."""
    if not fields and config is _ANY:
        raise ValueError("comparisons_where needs at least one field to match")
    missing = object()
    return [c for c in result.details.get("comparisons", [])
            if (config is _ANY or c.get("config") == config)
            and all(c.get("details", {}).get(k, missing) == v for k, v in fields.items())]


def agreement(comparison: dict) -> str:
    """The finding kind of one comparison summary: "holds" if it agrees, else "stops"."""
    return "holds" if comparison["agrees"] else "stops"


def replace_fields(p, problem: dict, keys: tuple):
    """``p`` with the problem's values for ``keys`` (the profile fields named like ProblemConfig's)."""
    return dataclasses.replace(p, **{k: (tuple(problem[k]) if k == "tasks" else problem[k])
                                     for k in keys if k in problem})


def with_problem(p, problem: dict):
    """The profile ``p`` with the researcher's problem laid over it whole (its sorted items: ``p.problem``)."""
    return dataclasses.replace(p, problem=tuple(sorted(problem.items())))


def theory_need(fn: str, *args):
    """A theory value ``fn(*args)`` (``numerics.experiments.kinds.theory_value``), as a need of a claim's plan."""
    from numerics.engine import need
    return need("theory", fn=fn, args=tuple(tuple(a) if isinstance(a, list) else a for a in args))
