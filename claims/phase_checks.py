"""What the two initialisation boundaries share (boundary-initialisation, boundary-allocation-
race): their problem fields, their run configurations, the comparison of the phase times
of two loss curves (phases that do not end within a run reported as such) and the exact
comparison of discrete outcomes (winners)."""
from __future__ import annotations

import math

from claims.common import Comparison, headline_row, perturbation, reported_row, resolved
from claims.spec import fmt
from numerics.train import TrainConfig

FIELDS = ("tasks", "heads", "L", "sigma")
"""The problem fields both initialisation boundaries read (their profiles' own names)."""
PHASES = {"warmup_end": "warm-up", "emergence_end": "emergence"}


def tcfg(p, seed: int, time_=None, records=None) -> TrainConfig:
    return TrainConfig(lr=p.lr, time=time_ or p.time, batch=p.batch, seed=seed, records=records or p.records)


# --- phase times of two curves, and comparisons that have nothing to compare

def phase_state(ph: dict, key: str, t_end: float):
    """A phase's end time, or what happened instead, with the run length: "warm-up undefined by
    t_end = 30 (loss drop ... not clear of the noise)" (theory.three_phases defines the phases
    only for a drop clear of 10x the noise) or "emergence did not end by t_end = 30"."""
    t = ph[key]
    if isinstance(t, (int, float)) and math.isfinite(t):
        return float(t)
    if not ph.get("defined", True):
        return f"{PHASES[key]} undefined by t_end = {t_end:g} ({ph.get('reason', '')})"
    return f"{PHASES[key]} did not end by t_end = {t_end:g}"


def phase_comparison(name: str, pairs: list, spacing: float, reference: str, config=None) -> Comparison:
    """Warm-up and emergence ends of measured curves against reference curves (``pairs``:
    (where, measured phases, reference phases, t_end)) within 2 record spacings (each crossing
    time is interpolated between records, so each is resolved to one spacing).  A phase that
    ends in both curves is compared; one that ends in neither is no disagreement (both curves
    say the same: not ended, or undefined, by t_end); one that ends in one curve only is
    counted and said (its drop sits at theory.three_phases' definedness threshold, 10x the
    noise, so the pair cannot decide), never compared.  Perturbation through the same
    comparison: the reference's phase times 50% longer.  Nothing compared: error 0 and the
    perturbation not rejected, so the judge cannot call it located (``undecided``)."""
    rows = [{"where": w, "phase": PHASES[k], "measured": phase_state(a, k, t), "reference": phase_state(b, k, t)}
            for w, a, b, t in pairs for k in PHASES]
    num = lambda x: isinstance(x, float)  # noqa: E731
    both = [(r["measured"], r["reference"]) for r in rows if num(r["measured"]) and num(r["reference"])]
    one = [r for r in rows if num(r["measured"]) != num(r["reference"])]

    def compare(factor: float) -> float:
        return max((abs(a - factor * b) for a, b in both), default=0.0)

    def error(measured, predicted) -> float:
        # the same comparison for any reference times (the resolving power moves them)
        return max((abs(a - b) for w in measured for a, b in zip(measured[w], predicted[w]) if num(a) and num(b)),
                   default=0.0)

    tol = 2.0 * spacing
    return resolved(Comparison(
        name=name, measured={w: [phase_state(a, k, t) for k in PHASES] for w, a, b, t in pairs},
        predicted={w: [phase_state(b, k, t) for k in PHASES] for w, a, b, t in pairs},
        error=compare(1.0), tolerance=tol,
        why=f"phase times within 2 record spacings ({tol:.3g}): each crossing time is interpolated between records, "
            "so each is resolved to one spacing; compared where a phase ends in both curves",
        perturbations=[perturbation(f"phase times 50% longer than the {reference}'s", compare(1.5), tol)],
        details={"compared": len(both), "ended_in_one_only": len(one), "one_only": one,
                 "ended_in_neither": len(rows) - len(both) - len(one)},
        config=config), error=error)


def outcome_comparison(name: str, outcomes: list, why: str, wrong: tuple, details: dict,
                       config=None) -> Comparison:
    """Discrete outcomes (winners) compared exactly: ``outcomes`` are the decided (measured,
    predicted) pairs, error = the number of pairs where they differ, tolerance 0 (an outcome
    is discrete; the undecided ones are counted by the caller, never compared); measured =
    the number where they agree, predicted = the number decided.  ``wrong``: (description,
    function of a predicted outcome -> another one), sent through the same count.  No pair
    decided: error 0 and the perturbation not rejected (undecided)."""
    differ = lambda swap: float(sum(m != swap(p) for m, p in outcomes))  # noqa: E731 - the one comparison
    description, swap = wrong
    return Comparison(name=name, measured=len(outcomes) - int(differ(lambda p: p)), predicted=len(outcomes),
                      error=differ(lambda p: p), tolerance=0.0, why=why, details=details, config=config,
                      perturbations=[perturbation(description, differ(swap), 0.0)])


def phase_row(c: Comparison, name: str | None = None) -> list:
    """The headline rows of a phase comparison: max |difference| against 0 (with nothing
    compared, a reported row: no tick), and the count of phases ending in one curve only."""
    name = name or c.name
    main = (reported_row(name, None, config=c.config) if c.details["compared"] == 0
            else headline_row(c, name, measured=c.error, theory=0.0))
    return [main, reported_row(f"{name}: phases ending in one curve only (not compared)",
                               c.details["ended_in_one_only"], config=c.config)]


def nothing_compared(comps: list) -> str | None:
    """Why the comparisons cannot decide (None when each compared something)."""
    why = []
    for c in comps:
        d = c.details
        if d.get("compared", 1) == 0:
            e = d["one_only"][0] if d["one_only"] else None
            eg = f"; e.g. {e['where']}, {e['phase']}: {fmt(e['measured'])} against {fmt(e['reference'])}" if e else ""
            why.append(f"{c.name}: no phase ends in both curves ({d['ended_in_neither']} in neither, "
                       f"{d['ended_in_one_only']} in one curve only{eg})")
        elif d.get("decided", 1) == 0:
            why.append(f"{c.name}: no outcome decided (data seeds disagree, a tied start, or a race not ended)")
    return "; ".join(why) or None
