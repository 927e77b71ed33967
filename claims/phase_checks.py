"""What the two initialisation boundaries share (boundary-initialisation, boundary-allocation-
race): their problem fields, their run configurations, the comparison of the phase times
of two loss curves (phases that do not end within a run reported as such) and the exact
comparison of discrete outcomes (winners), the stability guard of their runs and the figures
of boundary-initialisation's starts."""
from __future__ import annotations

import math

from claims.common import Z_SE, Comparison, compare, headline_row, lines_figure, perturbation, reported_row, resolved
from claims.spec import fmt
from numerics.experiments.converged import unstable_step
from numerics.train import TrainConfig

FIELDS = ("tasks", "heads", "L", "sigma")
"""The problem fields both initialisation boundaries read (their profiles' own names)."""
PHASES = {"warmup_end": "warm-up", "emergence_end": "emergence"}


def tcfg(p, seed: int, time_=None, records=None) -> TrainConfig:
    return TrainConfig(lr=p.lr, time=time_ or p.time, batch=p.batch, seed=seed, records=records or p.records)


def not_run(lr: float, parts) -> str | None:
    """Why none of the runs of ``parts`` ((label, cfg) pairs) is trained (None: they are): the step ``lr`` at
    or past the full model's stability bound at every part's cfg (numerics.experiments.converged.unstable_step,
    asked beyond d = 9 only), where no run is evidence either way.  Where only some parts are past it, all are
    trained and each run reported as it ends (diverged included): the paper profile's unbalanced starts, (4,4,4)
    at lr 0.05 against 2/lambda = 0.020, beside random starts that are not.  At the authors' blocks (16,17,17),
    H = 3, L = 100 the two boundaries' lr 0.1 lies past 2/lambda = 0.0017 (logit scale 1) and 0.0123 (the
    authors' 7.28): trained anyway (until 2026-12-03) every unbalanced start, every random start at s0 = 0.3
    and every race cell diverged, and no outcome was decided (boundary-initialisation: 14 CPU-min)."""
    why = [f"{label}: {w}" for label, cfg in parts if (w := unstable_step(cfg, lr))]
    return "; ".join(why) if why and len(why) == len(parts) else None


# --- phase times of two curves, and comparisons that have nothing to compare

def phase_state(ph: dict, key: str, t_end: float):
    """A phase's end time, or what happened instead, with the run length: "warm-up undefined by
    t_end = 30 (loss drop ... not clear of the noise)" (theory.three_phases defines the phases
    only for a drop clear of 10x the noise) or "emergence did not end by t_end = 30"."""
    if ph is None:   # a run with no loss curve to read (it diverged, or recorded too few points)
        return f"{PHASES[key]} not measured (no loss curve by t_end = {t_end:g}: the run diverged or recorded too few points)"
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
            if not e and isinstance(c.measured, dict):     # say what happened instead, with the run length
                first = next(((k, x) for k, v in c.measured.items() for x in v if isinstance(x, str)), None)
                eg = f"; e.g. {first[0]}: {first[1]}" if first else ""
            why.append(f"{c.name}: no phase ends in both curves ({d['ended_in_neither']} in neither, "
                       f"{d['ended_in_one_only']} in one curve only{eg})")
        elif d.get("decided", 1) == 0:
            why.append(f"{c.name}: no outcome decided (data seeds disagree, a tied start, or a race not ended)")
    return "; ".join(why) or None


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
    from numerics.statistics import binomial_interval
    lo, hi = binomial_interval(k, n, Z_SE)
    share = k / n

    def reach(p):
        return share - lo if p <= share else hi - share

    return compare(name, share, float(predicted), reach,
                   f"{why}; the prediction must lie in the Clopper-Pearson interval [{lo:.3g}, {hi:.3g}] of {k} of "
                   f"{n} seeds ({Z_SE:g}-sigma level)", wrong=wrong, units="absolute",
                   se=math.sqrt(share * (1 - share) / n), config=config,
                   details={"decided": n, "count": k, "n": n, "interval": [lo, hi], **(details or {})})


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
    """A 'mix' figure (reports.figures): one stacked bar per start (``mixes``: bar label ->
    outcome_mix), one segment per class label, its count of seeds."""
    from claims.base import Figure
    labels = []
    for m in mixes.values():
        labels += [k for k in m["labels"] if k not in labels]
    return Figure(name=name, title=title, kind="mix", row_labels=list(mixes), col_labels=labels,
                  matrix=[[float(m["labels"].get(k, {}).get("count", 0)) for k in labels] for m in mixes.values()],
                  xlabel="seeds", caption=caption)


# --- boundary-initialisation's figures of its starts

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
    curves = [(f"start {r['seed']} data {r['data_seed']} {key}", r[key]["t"], r[key]["loss_curve"], style) for r in unb
              for key, style in (("full", "points"), ("reduced_unbalanced", "line"), ("reduced_balanced", "dashed"))]
    return lines_figure("init-unbalanced", "Unbalanced starts: full model, reduced flow with and without the balance",
                        curves, xlabel="t", ylabel="loss",
                        caption="points: full model; line: reduced flow with the conserved balances; dashed: balanced "
                                "metric (the paper's)")
