"""What the two initialisation boundaries share (boundary-initialisation, boundary-allocation-
race): their problem fields, their run configurations, the comparison of the phase times
of paired loss curves (compared only where the readout finds the phases in both runs, and
judged as a family by a rule fixed in advance), the exact comparison of discrete outcomes
(winners), the comparison of a share of seeds (against a point, or one-sided against
"typical"), the stability guard of their runs, the check that the runs they count as independent
are (their fingerprints) and the figures of boundary-initialisation's starts."""
from __future__ import annotations

import math

import numpy as np

from claims.core.common import (Z_SE, Comparison, Tolerance, compare, headline_row, lines_figure, noise_term,
                                perturbation, reported_row, term)
from claims.core.spec import fmt
from numerics.experiments.phases import unstable_need
from numerics.experiments.starts import outcome_mix
from numerics.engine import check_independent
from numerics.statistics import binomial_interval, mean_se
from theory.three_phases import PhaseTimes, phases_resolved

FIELDS = ("tasks", "heads", "L", "sigma")
"""The problem fields both initialisation boundaries read (their profiles' own names)."""
PHASES = {"warmup_end": "warm-up", "emergence_end": "emergence"}


def guard_needs(lr: float, parts) -> list:
    """The stability guard of each of ``parts`` ((label, cfg) pairs) at the step ``lr``
    (numerics.experiments.phases.unstable_need: the full model's Hessian, asked beyond d = 9 only)."""
    return [unstable_need(cfg, lr) for _, cfg in parts]


def not_run(lr: float, parts, results) -> str | None:
    """Why none of the runs of ``parts`` ((label, cfg) pairs) is trained (None: they are): the step ``lr`` at
    or past the full model's stability bound at every part's cfg (:func:`guard_needs`' values in ``results``),
    where no run is evidence either way.  Where only some parts are past it, all are
    trained and each run reported as it ends (diverged included): the paper profile's unbalanced starts, (4,4,4)
    at lr 0.05 against 2/lambda = 0.020, beside random starts that are not.  At the authors' blocks (16,17,17),
    H = 3, L = 100 the two boundaries' lr 0.1 lies past 2/lambda = 0.0017 (logit scale 1) and 0.0123 (the
    authors' 7.28): trained anyway every unbalanced start, every random start at s0 = 0.3
    and every race cell diverged, and no outcome was decided (boundary-initialisation: 14 CPU-min)."""
    why = [f"{label}: {w}" for (label, _), g in zip(parts, guard_needs(lr, parts)) if (w := results[g])]
    return "; ".join(why) if why and len(why) == len(parts) else None


def guarded_plan(lr: float, parts, results, needs: list) -> list:
    """A plan behind its stability guards: the guards, then (asked with no results, or once the
    guards let the runs be trained: :func:`not_run`) ``needs``."""
    guards = guard_needs(lr, parts)
    if results is not None and (any(g not in results for g in guards) or not_run(lr, parts, results)):
        return guards
    return guards + list(needs)


def independent(states: dict, what: str, shared_stream: bool = False) -> None:
    """numerics.engine.check_independent on the fingerprints of the runs ``states`` (id -> end state)
    a comparison counts as independent (ValueError naming the runs that share their randomness;
    ``shared_stream``: runs on one prompt stream on purpose, their starts checked).  A diverged run
    has no fingerprint and is left out: its class is 'diverged' whatever its seed."""
    check_independent({k: s["fingerprint"] for k, s in states.items() if s["fingerprint"] is not None}, what,
                      shared_stream)


# --- phase times of paired curves, judged as a family; comparisons that have nothing to compare

MIN_UNITS = 3
"""The fewest independent units (prompt streams) a pooled phase comparison judges from: the
standard error of their mean needs two degrees of freedom at least to be an estimate, not a guess."""


def phases_found(ph: dict | None, t) -> tuple[bool, str]:
    """Whether the readout finds the three phases in one run's loss curve (its phase times ``ph``,
    theory.three_phases.PhaseTimes as a dict, on record times ``t``): the three-phases claim's own
    criterion, theory.three_phases.phases_resolved (a drop clear of the noise, a warm-up and an
    emergence each at least one record spacing long, a convergence phase after them, the emergence
    the fastest).  Without a warm-up (a large start) the fit's 10% and 90% crossings are two levels
    of a curve already falling, not the phase ends of the paper's picture, so they are not compared.
    (found, why not)."""
    if ph is None:
        return False, "no loss curve (the run diverged or recorded too few points)"
    found, why = phases_resolved(PhaseTimes(**ph), np.asarray(t, float))
    return found, why.split(" (rates ")[0]      # the phases' mean rates: in the run's phase times


def phase_comparisons(name: str, pairs: list[dict], spacing: float, reference: str, config=None,
                      measured: str = "full model") -> list:
    """The warm-up and emergence ends of measured curves against reference curves on the same
    prompts, one comparison per phase, each judged as a family by a rule fixed before the runs.
    ``pairs``: {"where", "group", "unit", "measured", "reference", "t"} (phase-time dicts, the
    record times; ``unit``: the prompt stream, the independent unit).

    A pair is compared only where the readout finds the three phases in both curves
    (:func:`phases_found`); every other pair is listed with the reason, never counted as agreement.
    The rule: per unit the mean of (measured - reference) over its compared pairs (pairs sharing a
    stream are correlated: common random numbers), then the mean d over units and its standard
    error se; agreement when |d| <= 2 record spacings + Z_SE se (2 spacings: each crossing time is
    interpolated between records, so each is resolved to one spacing; Z_SE se: the seeds' spread).
    One seed far off moves d by its miss / n and widens se: no verdict turns on one seed.  Wrong
    prediction through the same comparison: the reference's phase times 50% longer (d predicted
    at half their mean).  Fewer than :data:`MIN_UNITS` units compared: not compared (undecided)."""
    found, skipped = [], []
    for p in pairs:
        (ok_m, why_m), (ok_r, why_r) = phases_found(p["measured"], p["t"]), phases_found(p["reference"], p["t"])
        if ok_m and ok_r:
            found.append(p)
        else:
            why = "; ".join(f"{what}: {w}" for what, ok, w in ((measured, ok_m, why_m), (reference, ok_r, why_r))
                            if not ok)
            skipped.append({"where": p["where"], "group": p["group"], "why": why})
    return [_pooled_phase(f"{name}: {PHASES[key]} end, mean over seeds of ({measured} - {reference})", key, found,
                          skipped, spacing, reference, config) for key in PHASES]


def _pooled_phase(label: str, key: str, found: list, skipped: list, spacing: float, reference: str, config):
    """One phase's family comparison (:func:`phase_comparisons`)."""
    units: dict = {}
    for p in found:
        units.setdefault(p["unit"], []).append((p["measured"][key], p["reference"][key]))
    diffs = [float(np.mean([a - b for a, b in v])) for v in units.values()]
    refs = [float(np.mean([b for _, b in v])) for v in units.values()]
    details = {"role": "phase times", "phase": key, "compared": len(found), "units": len(units),
               "pairs": [{"where": p["where"], "unit": p["unit"], "measured": p["measured"][key],
                          "reference": p["reference"][key]} for p in found], "not_compared": skipped}
    rule = ("the rule fixed in advance: per prompt stream the mean difference, then their mean d; compared where the "
            "readout finds the three phases in both runs")
    spacings = term("2 record spacings (each crossing is resolved to one spacing)", 2.0 * spacing)
    if len(units) < MIN_UNITS:
        why = (f"the three phases found in both runs on {len(units)} prompt stream(s), fewer than {MIN_UNITS}"
               + (f" (e.g. {skipped[0]['where']}: {skipped[0]['why']})" if skipped else ""))
        rule += f"; agree when |d| <= {spacings[0]} {spacings[1]:.3g} + {Z_SE:g} standard errors of d"
        return Comparison(name=label, measured=None, predicted=0.0, error=0.0, tolerance=0.0, why=rule, config=config,
                          perturbations=[perturbation(f"the {reference}'s phase times 50% longer", 0.0, 0.0)],
                          details={**details, "compared": 0, "cannot_decide": "not compared: " + why})
    d, se = mean_se(diffs)
    tol = Tolerance((spacings, noise_term(se, f"d over {len(units)} prompt streams")), rule)
    return compare(label, d, 0.0, tol, se=se, units="absolute", config=config,
                   wrong=[(f"the {reference}'s phase times 50% longer", 0.5 * float(np.mean(refs)))], details=details)


def phase_rows(comps: list) -> list:
    """The headline rows of a family of phase comparisons (:func:`phase_comparisons`): each
    phase's pooled difference (a reported row saying why where nothing was compared), then per
    group (an init scale, a start) the runs not compared and why."""
    rows = [headline_row(c) if c.details["compared"] else reported_row(f"{c.name}: {c.details['cannot_decide']}",
                                                                      config=c.config) for c in comps]
    by_group: dict = {}
    for s in comps[0].details["not_compared"]:
        by_group.setdefault(s["group"], []).append(s)
    for group, skipped in by_group.items():
        rows.append(reported_row(f"{group}: phase times not compared in {len(skipped)} run(s) (not counted as "
                                 f"agreement): {skipped[0]['why']}", len(skipped), config=comps[0].config))
    return rows


def phase_finding(result, what: str):
    """The sentence of a family of phase comparisons (:func:`phase_comparisons`, found in the
    result by ``role="phase times"``): on how many runs and streams the readout found the three
    phases in both, the pooled differences against the rule's tolerances, and the runs not
    compared with one reason.  None where the result holds no such family."""
    from claims.core.spec import comparisons_where, finding
    comps = {c["details"]["phase"]: c for c in comparisons_where(result, role="phase times")}
    if not comps:
        return None
    w, e = comps["warmup_end"], comps["emergence_end"]
    skipped = w["details"]["not_compared"]
    rest = (" The other {k} runs are not compared, never counted as agreement (e.g. " + skipped[0]["where"] + ": "
            + skipped[0]["why"].replace("{", "{{").replace("}", "}}") + ")." if skipped else "")
    if not w["details"]["compared"]:
        return finding(result, "beyond", what + ": the phase times are "
                       + w["details"]["cannot_decide"].replace("{", "{{").replace("}", "}}") + "." + rest, k=len(skipped))
    return finding(result, "beyond", what + ": where the readout finds the three phases in both runs ({n} runs on {u} "
                   "prompt streams), the full model's phase ends minus the reduced flow's average {dw} (warm-up) and "
                   "{de} (emergence) over the streams, against the rule's tolerances {tw} and {te} (2 record spacings + "
                   "4 standard errors): " + ("they agree." if w["agrees"] and e["agrees"] else "they differ.") + rest,
                   n=w["details"]["compared"], u=w["details"]["units"], dw=(w["measured"], w["se"]),
                   de=(e["measured"], e["se"]), tw=w["tolerance"], te=e["tolerance"], k=len(skipped))


def nothing_compared(comps: list) -> str | None:
    """Why the comparisons cannot decide (None when each decides): a comparison's own
    ``details["cannot_decide"]``, or an outcome comparison with no outcome decided."""
    why = []
    for c in comps:
        d = c.details
        if d.get("cannot_decide"):
            why.append(f"{c.name}: {d['cannot_decide']}")
        elif d.get("decided", 1) == 0:
            why.append(f"{c.name}: no outcome decided (data seeds disagree, a tied start, or a race not ended)")
    return "; ".join(why) or None


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


# --- where the seeds of a start end: counted classes, and the share a theory predicts

ALLOCATION = ("allocated", "mixed")
"""The classes of the paper's picture from a balanced small start: allocated, or heads still
sharing a task with one sign (``mixed``: the race not ended by t_end; under the factored metric
the loser's mu decays like 1/t, so the limit is allocated).  A superposition, an end off D or a
divergence is outside it."""


def decided(states: list) -> list:
    """The seeds whose end state has a class to compare: converged (or diverged, an end state
    too); a seed still converging says nothing about where it ends."""
    return [s for s in states if s["class"]["name"] != "not converged"]


def share_comparison(name: str, k: int, n: int, predicted: float, why: str, wrong: tuple, config=None,
                     details=None) -> Comparison:
    """The share k / n of seeds in a class against a predicted share, through the seeds' own
    binomial interval: [lo, hi] = numerics.statistics.binomial_interval(k, n, Z_SE) (Clopper-
    Pearson: a true share lies outside it with probability at most 6e-5, the report's Z_SE
    policy).  Error |k/n - p|, tolerance the interval's reach on the side of the prediction
    (k/n - lo below the share, hi - k/n above it), so the prediction agrees exactly when it lies
    in the interval; the interval is the measurement's alone (a prediction picks a side, it cannot
    widen it).  ``wrong``: (description, share) pairs sent through the same comparison (the other
    class: share 0 for a predicted 1).  Resolving power in absolute share units.  No seed decided
    (n = 0): error 0, every wrong prediction unrejected -- undecided, never located."""
    if n == 0:
        return Comparison(name=name, measured=None, predicted=predicted, error=0.0, tolerance=0.0, why=why,
                          perturbations=[perturbation(d, 0.0, 0.0) for d, _ in wrong], config=config,
                          details={"decided": 0, "count": 0, "n": 0, **(details or {})})
    lo, hi = binomial_interval(k, n, Z_SE)
    share = k / n

    def reach(p):
        return share - lo if p <= share else hi - share

    return compare(name, share, float(predicted), reach,
                   f"{why}; the prediction must lie in the Clopper-Pearson interval [{lo:.3g}, {hi:.3g}] of {k} of "
                   f"{n} seeds ({Z_SE:g}-sigma level)", wrong=wrong, units="absolute",
                   se=math.sqrt(share * (1 - share) / n), config=config,
                   details={"decided": n, "count": k, "n": n, "interval": [lo, hi], **(details or {})})


def share_at_least(name: str, k: int, n: int, least: float, why: str, config=None, details=None,
                   unit: str = "seeds") -> Comparison:
    """A claim that a class is typical -- the true share of seeds in it is at least ``least`` --
    against k of n seeds, one-sided, through their Clopper-Pearson interval [lo, hi] =
    numerics.statistics.binomial_interval(k, n, Z_SE) (each end a one-sided bound at the report's
    Z_SE level: a true share lies above hi with probability at most 3e-5).  Contradicted when
    hi < ``least``: the seeds exclude a share that large.  Error max(0, least - k/n), tolerance
    hi - k/n: agreement exactly when ``least`` <= hi.  Wrong prediction through the same interval:
    its negation, 'the class is atypical' (share below ``least``), rejected when lo > ``least``;
    where neither is rejected the n seeds cannot tell the two apart, and the comparison says so
    (``details["cannot_decide"]``: 7 of 8 gives [0.17, 1], and even 0 of 8 leaves hi = 0.73, so 8
    seeds can neither contradict a share of 1/2 nor confirm it; 0 of 16 contradicts it, 38 of 48
    confirms it).  No verdict turns on one seed: a share of 1 against 7 of 8 did (error = 1.00003
    x tolerance)."""
    lo, hi = binomial_interval(k, n, Z_SE) if n else (0.0, 1.0)
    share = k / n if n else math.nan
    negation = perturbation(f"its negation: atypical (share below {least:g})", max(0.0, share - least) if n else 0.0,
                            share - lo if n else 0.0)
    out = {"count": k, "n": n, "decided": n, "interval": [lo, hi], "least": least, **(details or {})}
    if n == 0 or (hi >= least and not negation.rejected):
        out["cannot_decide"] = (f"{k} of {n} {unit} (interval [{lo:.3g}, {hi:.3g}] at {Z_SE:g} sigma) can neither exclude "
                            f"a share of at least {least:g} nor its negation")
    if n == 0:
        return Comparison(name=name, measured=None, predicted=least, error=0.0, tolerance=0.0, why=why, config=config,
                          perturbations=[negation], details=out, side="not below")
    c = compare(name, share, float(least), lambda p: hi - share if p > share else 0.0,
                f"{why}; one-sided: contradicted only when the Clopper-Pearson upper bound {hi:.3g} of {k} of {n} "
                f"seeds lies below {least:g} ({Z_SE:g}-sigma level)", side="not below", units="absolute",
                se=math.sqrt(share * (1 - share) / n), config=config, details=out)
    c.perturbations.insert(0, negation)
    return c


def share_phrase(c: dict) -> str:
    """What a :func:`share_at_least` comparison (its summary) decided, in words."""
    least = c["details"]["least"]
    if not c["agrees"]:
        return f"excludes a typical share (at least {least:g}, one-sided)"
    if c["details"].get("cannot_decide"):
        return f"cannot tell a typical share (at least {least:g}, one-sided) from an atypical one"
    return f"makes it typical (a share of at least {least:g}, one-sided; an atypical share is excluded)"


def mix_phrase(mix: dict, key: str = "m") -> tuple[str, dict]:
    """The sentence part naming every class a start's seeds ended in (numerics.experiments.starts.
    outcome_mix), and its numbers: "all 8 seeds end off D (...)" when they share one class, else
    "the 8 seeds end in 2 classes: off D in 5 of 8 (share interval [...]) ...; ..."; each class
    with its loss ratios to the allocated fixed point and the best decomposable point."""
    labels, n = mix["labels"], mix["n"]
    nums, parts = {f"{key}_n": n}, []
    for j, (label, e) in enumerate(labels.items()):
        p = f"{key}{j}"
        nums.update({f"{p}_k": e["count"], f"{p}_lo": e["interval"][0], f"{p}_hi": e["interval"][1],
                     f"{p}_a": (e["over_allocated"], e["over_allocated_se"]), f"{p}_b": (e["over_best"],
                                                                                           e["over_best_se"])})
        refs = [f"{{{p}_{x}}} x the {what}" for x, what, v in (("a", "allocated fixed point", e["over_allocated"]),
                                                                   ("b", "best decomposable point", e["over_best"]))
                if v is not None]
        ratio = ("the loss diverged" if label == "diverged" else
                 "held-out loss " + " and ".join(refs) if refs else "")
        count = "" if len(labels) == 1 else f" in {{{p}_k}} of {{{key}_n}} (share interval [{{{p}_lo}}, {{{p}_hi}}])"
        parts.append(label + count + (", " + ratio if ratio else ""))
    if len(labels) == 1:
        return (f"all {{{key}_n}} seeds end " if n > 1 else f"its {{{key}_n}} seed ends ") + parts[0], nums
    return f"the {{{key}_n}} seeds end in {len(labels)} classes: " + "; ".join(parts), nums


def mix_rows(prefix: str, mix: dict, config=None) -> list:
    """Reported headline rows of a start's class mix: one per class, "k of n" with its interval."""
    return [reported_row(f"{prefix}: {label} (seeds of {mix['n']}; share interval {fmt(e['interval'])})",
                         e["count"], config=config) for label, e in mix["labels"].items()]


def mix_figure(name: str, title: str, mixes: dict, caption: str = ""):
    """A 'mix' figure (reports.render): one stacked bar per start (``mixes``: bar label ->
    outcome_mix), one segment per class label, its count of seeds."""
    from claims.core.base import Figure
    labels = []
    for m in mixes.values():
        labels += [k for k in m["labels"] if k not in labels]
    return Figure(name=name, title=title, kind="mix", row_labels=list(mixes), col_labels=labels,
                  matrix=[[float(m["labels"].get(k, {}).get("count", 0)) for k in labels] for m in mixes.values()],
                  xlabel="seeds", caption=caption)


# --- boundary-initialisation: its random starts reported, and the figures of its starts

def random_part(runs: dict, refs: dict, config: str) -> tuple[list, list, dict]:
    """boundary-initialisation: where the seeds of each random start end (reported, never judged): per scale its
    class mix (numerics.experiments.starts.outcome_mix), the movable off-D residual and the loss over the allocated
    fixed point, mean over seeds.  (headline rows, findings, mixes)."""
    rows, found, mixes, alloc = [], [], {}, refs["allocated_loss"]
    for s0, rs in runs.items():
        mix = mixes[f"s0={s0:.3g}"] = outcome_mix(rs, Z_SE, refs)
        ended = [r["residual_end"] for r in rs if r["residual_end"] is not None]   # a diverged run has no end weights
        mov, se_mov = mean_se([e["movable_relative"] for e in ended])
        free, _ = mean_se([e["gradient_free_relative"] for e in ended])
        ratio, se_ratio = mean_se([r["loss"] / alloc for r in rs]) if alloc else (None, None)
        rows += [reported_row(f"s0={s0:.3g}: movable off-D residual at t_end", mov, se=se_mov, config=config),
                 *mix_rows(f"s0={s0:.3g}", mix, config=config)]
        found.append({"init_scale": s0, "movable_relative_end": mov, "movable_se": se_mov,
                      "gradient_free_relative_end": free, "mix": mix, "classes": list(mix["labels"]),
                      "loss_over_allocated": ratio, "loss_over_allocated_se": se_ratio,
                      **{k: [r.get(k) for r in rs] for k in ("ov_above_5pct", "winners", "init_seed")},
                      "warmup_end": [(r["phases"] or {}).get("warmup_end") for r in rs]})
    return rows, found, mixes


def residual_figure(runs):
    """boundary-initialisation: the off-D residual of the random starts (two seeds a scale) against t."""
    curves = [(f"s0={s0:.3g} seed {r['init_seed']} {label}", [x["t"] for x in r["trajectory"]],
               [max(x[key], 1e-12) for x in r["trajectory"]], style)
              for s0, rs in runs.items() for r in rs[:2] if r.get("trajectory")
              for label, key, style in (("movable", "movable_relative", "line"),
                                        ("gradient-free", "gradient_free_relative", "dashed"))]
    return lines_figure("init-residual", "Off-D residual from random full starts (relative to ||(W,U)||)", curves,
                        xlabel="t", ylabel="residual / ||(W, U)||", yscale="log",
                        caption="solid: the part the loss can move; dashed: W's y columns, which no gradient reaches "
                                "(a floor set by the init, not 'staying off D')")


def random_phase_figure(runs):
    """boundary-initialisation: each seed's phase ends against the random start's scale."""
    curves = [(f"{label} end (per seed)", [s for s, rs in runs.items() for _ in rs],
               [(r["phases"] or {}).get(key, math.nan) for rs in runs.values() for r in rs], "points") for key, label in PHASES.items()]
    return lines_figure("init-phases-random", "Phase times against the random start's scale", curves, xlabel="s0",
                        ylabel="t", xscale="log",
                        caption="missing points: no drop clear of the noise (phases undefined) by t_end")


def unbalanced_figure(unb):
    """boundary-initialisation: the unbalanced starts' loss curves, full model and both reduced flows."""
    curves = [(f"start {r['seed']} stream {r['stream']} {key}", r[key]["t"], r[key]["loss_curve"], style) for r in unb
              for key, style in (("full", "points"), ("reduced_unbalanced", "line"), ("reduced_balanced", "dashed"))]
    return lines_figure("init-unbalanced", "Unbalanced starts: full model, reduced flow with and without the balance",
                        curves, xlabel="t", ylabel="loss",
                        caption="points: full model; line: reduced flow with the conserved balances; dashed: balanced "
                                "metric (the paper's)")
