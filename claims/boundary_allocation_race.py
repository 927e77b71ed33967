"""``boundary-allocation-race``, on the full model: a grid over the
runner-up head's (omega0, mu0) relative to the favoured head's (one task, two heads), the
measured winner against theory's ODE rule and the "largest mu0" rule; and the default
decomposable start at growing scale s0 against the reduced flow from the same start.

Judged: the ODE rule where the race is decided; the reduced flow's phase times (both runs start
on D, where the reduced flow is exact), compared where the readout finds the three phases in both
runs -- above the scale where the warm-up vanishes it finds none, and those runs are listed with
the reason, never compared -- and judged over the prompt streams by a rule fixed in advance
(claims.core.phase_comparisons); and the paper's suitable initialisation: from the
smallest default decomposable start every converged seed allocates (the share of converged seeds
through its binomial interval).  Every start's seeds
are counted by end class (numerics.evaluate.end_class), reported per scale.  Where the warm-up vanishes and
where allocation stops being predictable are findings (the paper assumes small starts); so is
which side the measurement takes where "largest mu0" and the ODE rule differ.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from claims.core import (ALLOCATION, FIELDS, PHASES, Z_SE, ClaimSpec, Comparison, Figure, Outcome, comparisons_where,
                         config_label, decided, fields_config, finding, guarded_plan, headline_row, independent,
                         lines_figure, mix_figure, mix_phrase, mix_rows, not_run, nothing_compared, outcome_comparison,
                         phase_comparisons, phase_finding, phase_rows, replace_fields, reported_row, share_comparison,
                         theory_need)
from numerics.config import ProblemConfig
from numerics.experiments.starts import (large_init_needs, outcome_mix, race_cell_needs, reference_needs,
                                         references)
from theory.initialisation import race_starts
from theory.task_allocation import predicted_winners


@dataclass(frozen=True)
class RaceProfile:
    tasks: tuple = (2,)            # one task: the race between two heads for it
    heads: int = 2
    L: int = 32
    sigma: float = 0.0
    s0: float = 0.1                # the favoured head 0 starts at omega0 = mu0 = s0
    ratios: tuple = (0.5, 0.8, 1.25, 2.0)   # runner-up's omega0/s0 (columns) and mu0/s0 (rows)
    data_seeds: tuple = tuple(range(8))   # prompt streams per cell (shared by all cells; 8 at quick)
    lr: float = 0.1
    time: float = 60.0
    batch: int = 256
    records: int = 41
    large_tasks: tuple = (2, 2)    # item 4: default decomposable start at growing scale
    large_scales: tuple = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
    large_time: float = 40.0
    large_records: int = 201       # fine records: the warm-up at large s0 lasts a few time units
    large_seeds: tuple = tuple(range(8))   # prompt streams per scale (the start is deterministic), shared by the scales
    n_eval: int = 4096             # held-out prompts per end state


RACE_PROFILES = {
    "tiny": RaceProfile(L=16, ratios=(0.5, 2.0), data_seeds=(0, 1), batch=128, time=30.0, records=31, large_tasks=(2,),
                        large_scales=(0.1, 0.8), large_time=30.0, large_records=61, large_seeds=(0, 1), n_eval=1024),
    "quick": RaceProfile(),
    "paper": RaceProfile(tasks=(4,), L=256, ratios=(0.4, 0.6, 0.8, 0.9, 1.1, 1.25, 1.6, 2.5), data_seeds=tuple(range(16)),
                         lr=0.05, time=100.0, batch=1024, records=61, large_tasks=(4, 4, 4),
                         large_scales=(0.02, 0.05, 0.1, 0.2, 0.4, 0.8), large_time=100.0, large_records=401,
                         large_seeds=tuple(range(16)), n_eval=16384),
}


# --- item 3: the race grid; item 4: large initialisation

def _large_base(ctx) -> ProblemConfig:
    p = ctx.p
    return ProblemConfig(tasks=p.large_tasks, heads=len(p.large_tasks), L=p.L, sigma=p.sigma, device=ctx.device)


def cells_part(ctx) -> tuple:
    """(label, cfg) of the race cells, for claims.core's stability guard."""
    return (("race cells", fields_config(ctx)),)


def race_grid(ctx, results) -> dict:
    """Every cell of numerics.experiments.starts.race_cell_needs on each prompt stream: measured winners per data
    seed (decided when the seeds agree and the race has ended: numerics.evaluate's race_decided), each seed's end class
    counted (``mix``), theory's ODE and largest-mu0 predictions; the streams of each cell checked to be independent
    (their fingerprints).  No cell where the step lies past the stability bound (``not_run``)."""
    p = ctx.p
    if why := not_run(p.lr, cells_part(ctx), results):   # beyond d = 9 only: a cell past the bound decides nothing
        return {"cells": [], "not_run": why}
    starts = race_starts(p.s0, p.ratios, p.heads, fields_config(ctx).m)
    runs, odes = race_cell_needs(p, ctx.device)
    every = [results[n] for n in runs]
    cells = []
    for j, (st, ode) in enumerate(zip(starts, odes)):
        rw, rm = st["rho_omega"], st["rho_mu"]
        meas = [states[j] for states in every]
        independent({f"cell (omega x{rw:g}, mu x{rm:g}) stream {k}": m_ for k, m_ in zip(p.data_seeds, meas)},
                    f"race cell (omega x{rw:g}, mu x{rm:g}): its prompt streams")
        wins = [m_["winners"] for m_ in meas]
        seeds_agree = all(w == wins[0] for w in wins)
        finished = all(m_["race_decided"] for m_ in meas)
        cells.append({"rho_omega": rw, "rho_mu": rm, "measured": wins, "decided": seeds_agree and finished,
                      "seeds_agree": seeds_agree, "allocated": finished, "share": [m_["share"] for m_ in meas],
                      "classes": [m_["class"]["label"] for m_ in meas], "mix": outcome_mix(meas, Z_SE),
                      "ode": results[ode], "largest_mu": predicted_winners(st["omega0"], st["mu0"], p.tasks,
                                                                            rule="largest_mu")})
    return {"cells": cells}


def large_runs(ctx, results) -> dict:
    """{s0: [{"stream": k, "full": end state, "reduced": readout}, ...]} of numerics.experiments.starts.
    large_init_needs; the streams of each scale checked to be independent (their fingerprints)."""
    p = ctx.p
    per_stream = [(results[f], results[r]) for f, r in large_init_needs(p, ctx.device)]
    out = {s0: [{"stream": k, "full": full[j], "reduced": red[j]} for k, (full, red) in zip(p.large_seeds, per_stream)]
           for j, s0 in enumerate(p.large_scales)}
    for s0, rs in out.items():
        independent({f"s0={s0:g} stream {r['stream']}": r["full"] for r in rs}, f"large init s0={s0:g}: its prompt "
                    "streams")
    return out


def check_large_phases(large: dict, spacing: float, config=None) -> list[Comparison]:
    """The full model from the default decomposable start against the reduced flow from the same
    start on the same prompts (on D the reduced flow is exact), warm-up and emergence ends at every
    scale, judged by :func:`claims.core.phase_comparisons`' rule with the prompt stream as
    the unit (the scales share it).  Above the scale where the warm-up vanishes the readout finds no
    three phases (a warm-up end inside the first record spacing: the loss falls from the first step),
    and its 90% crossing lies on the slow approach to the end level, where a level difference of a
    few hundredths between the two runs moves it by several spacings: those runs are listed, never
    compared."""
    pairs = [{"where": f"s0={s0:g} stream {r['stream']}", "group": f"large init s0={s0:g}", "unit": r["stream"],
              "measured": r["full"]["phases"], "reference": r["reduced"]["phases"], "t": r["reduced"]["t"]}
             for s0, rs in large.items() for r in rs]
    return phase_comparisons("phase times against init scale", pairs, spacing, "reduced flow", config)


def check_small_start_allocates(runs: list[dict], s0: float, config=None) -> Comparison:
    """The paper's "suitable initialisation" (the default decomposable start at a small scale)
    predicts its picture: every seed that has converged ends allocated (or with heads still
    sharing a task with one sign, the race not ended: claims.core.ALLOCATION).  Compared
    as the share of converged seeds in those classes against 1 through their binomial interval
    (claims.core.share_comparison); the wrong prediction "no seed allocates" (share 0)
    goes through the same comparison.  No seed converged: undecided."""
    states = [r["full"] for r in runs]
    ok = decided(states)
    k = sum(s["class"]["name"] in ALLOCATION for s in ok)
    return share_comparison(f"small decomposable start (s0={s0:g}): share of converged seeds allocated", k, len(ok),
                            1.0, "the paper's suitable initialisation: from a small balanced start the heads allocate "
                            "the tasks", (("no seed allocates (share 0)", 0.0),), config=config,
                            details={"seeds": len(states), "not_converged": len(states) - len(ok)})


def check_race(cells: list[dict], config=None) -> Comparison:
    """In every cell where the data seeds agree (and the race has ended in both: the winner
    carries >= RACE_DECIDED_SHARE of sum_h |mu omega| at t_end), the measured winners equal
    theory's ODE rule (:func:`outcome_comparison`).  Perturbation through the same comparison:
    every winner swapped to another head."""
    decided = [c for c in cells if c["decided"]]
    heads = 1 + max(max(c["ode"]) for c in cells) if cells else 2
    return outcome_comparison(
        "race winner = theory's ODE rule where the data seeds agree", [(c["measured"][0], c["ode"]) for c in decided],
        "exact: a discrete outcome, compared only where the data seeds agree and the race has ended",
        ("every winner swapped to another head", lambda ode: [(w + 1) % max(2, heads) for w in ode]),
        {"role": "race winner", "decided": len(decided), "undecided": len(cells) - len(decided),
         "seeds_disagree": sum(not c["seeds_agree"] for c in cells),
         "not_allocated": sum(c["seeds_agree"] and not c["allocated"] for c in cells),
         "largest_mu_disagrees_with_measured": sum(c["measured"][0] != c["largest_mu"] for c in decided)}, config)


def bracket(scales: list, hits: list):
    """[largest scale below the first hit, first hit] (None: no hit; [None, s]: already at the smallest)."""
    if not hits:
        return None
    below = [s for s in scales if s < min(hits)]
    return [max(below) if below else None, min(hits)]


def plan(ctx, results=None) -> list:
    """The race cells' stability guard, then (where it lets them be trained) the cells and theory's ODE rule per
    cell; the large-init runs and flows, theory's winners per scale and the allocated fixed point."""
    p = ctx.p
    runs, odes = race_cell_needs(p, ctx.device)
    large = [n for pair in large_init_needs(p, ctx.device) for n in pair]
    return (guarded_plan(p.lr, cells_part(ctx), results, runs + odes) + large + _winner_needs(ctx)
            + reference_needs(p.large_tasks, len(p.large_tasks), p.L, p.sigma, ctx.device, best=False))


def _winner_needs(ctx) -> list:
    p = ctx.p
    return [theory_need("default_start_winners", tuple(p.large_tasks), s0, p.L, p.sigma) for s0 in p.large_scales]


def large_scales(ctx, results, large: dict, spacing: float) -> dict:
    """Per scale what the large-init runs show: ``no_warmup`` (in every seed the loss has fallen by 10% of its drop
    within 2 record spacings), ``unpredictable`` (a seed's winners differ from the reduced flow's from the same
    start, or from theory's ODE rule where the start is inside the expansion's domain, or a task is not allocated
    -- its winner carries < WINNER_MASS_SHARE of sum_h |mu omega| --, or the seeds disagree, or a seed diverged),
    ``undefined`` (a seed's warm-up end undefined), theory's ``predicted`` winners."""
    predicted = {s0: results[n] for s0, n in zip(ctx.p.large_scales, _winner_needs(ctx))}
    warmup = lambda r: (r["full"]["phases"] or {}).get("warmup_end", math.nan)  # noqa: E731
    no_warmup = [s0 for s0, rs in large.items() if all(math.isfinite(warmup(r)) and warmup(r) <= 2 * spacing
                                                       for r in rs)]
    unpredictable = [s0 for s0, rs in large.items()
                     if any(r["full"]["winners"] is None or r["full"]["winners"] != r["reduced"]["winners"]
                            or (predicted[s0] is not None and r["full"]["winners"] != predicted[s0])
                            or not r["full"]["mass_allocated"] or r["full"]["winners"] != rs[0]["full"]["winners"]
                            for r in rs)]
    undefined = [s0 for s0, rs in large.items() if any(not math.isfinite(warmup(r)) for r in rs)]
    return {"predicted": predicted, "no_warmup": no_warmup, "unpredictable": unpredictable, "undefined": undefined}


def compare(ctx, results) -> Outcome:
    """boundary-allocation-race (module docstring)."""
    p, grid, large = ctx.p, race_grid(ctx, results), large_runs(ctx, results)
    cells, spacing = grid["cells"], p.large_time / (p.large_records - 1)
    label = config_label(_large_base(ctx)) + " init=decomposable at growing s0"
    cfg0 = config_label(ProblemConfig(tasks=p.tasks, heads=p.heads, L=p.L, sigma=p.sigma)) + f" s0={p.s0:g}"
    race, phases = check_race(cells, cfg0), check_large_phases(large, spacing, label)
    small = check_small_start_allocates(large[min(p.large_scales)], min(p.large_scales), label)
    by_scale = large_scales(ctx, results, large, spacing)
    no_warmup, unpredictable, predicted, undefined = (by_scale[k] for k in ("no_warmup", "unpredictable",
                                                                              "predicted", "undefined"))
    refs = references(results, p.large_tasks, len(p.large_tasks), p.L, p.sigma, ctx.device, best=False)
    mixes = {f"s0={s0:g}": outcome_mix([r["full"] for r in rs], Z_SE, refs) for s0, rs in large.items()}
    dis = [c for c in cells if c["ode"] != c["largest_mu"]]
    sides_with = lambda rule: sum(c["decided"] and c["measured"][0] == c[rule] for c in dis)  # noqa: E731
    contra = sides_with("ode")
    headline = [headline_row(race, measured=race.measured, theory=race.predicted) if race.details["decided"]
                else reported_row(race.name + (f" (not run: {grid['not_run']})" if grid.get("not_run") else ""), None,
                                  config=cfg0),
                headline_row(small) if small.details["decided"] else reported_row(small.name, None, config=label),
                *(reported_row(name, value, config=cfg0) for name, value in (
                    ("race: undecided cells: data seeds disagree", race.details["seeds_disagree"]),
                    ("race: undecided cells: seeds agree, race not ended by t_end", race.details["not_allocated"]),
                    ("race: cells where 'largest mu0' and the ODE rule disagree", len(dis)),
                    ("race: decided cells where the measurement sides with 'largest mu0' against the ODE rule",
                     sides_with("largest_mu")),
                    ("race: decided cells where the measurement contradicts 'largest mu0' (sides with the ODE rule)",
                     contra))),
                *phase_rows(phases),
                *(reported_row(f"{what} from init scale (bracket [below, at])", bracket(list(p.large_scales), hits),
                               config=label)
                  for what, hits in (("no warm-up", no_warmup), ("allocation unpredictable", unpredictable))),
                *(row for s0, mix in mixes.items() for row in mix_rows(f"large init {s0}", mix, config=label))]
    details = {"domain": "theory's ODE rule decides the race in cells where the data seeds agree (both runs start on "
                         "D, where the reduced flow is exact); on D the reduced flow gives the phase times at every "
                         "scale. Where the warm-up vanishes and where allocation stops being predictable are findings "
                         "(the paper assumes small starts).",
               "ran": {"profile": asdict(p), "design": "the cells share their prompt streams, and so do the large-init "
                       "scales (common random numbers); each start's seeds are its prompt streams (the start itself "
                       "is deterministic), trained together; a start's streams are checked to be independent by "
                       "their fingerprints"},
               "cells": cells, "cells_not_run": grid.get("not_run"), "large_mix": mixes,
               "large": {f"{s:g}": [{"full": {k: v for k, v in r["full"].items() if k not in ("t", "loss_curve")},
                                     "reduced": r["reduced"] and {k: v for k, v in r["reduced"].items()
                                                                  if k not in ("t", "loss_curve")}} for r in rs]
                         for s, rs in large.items()},
               "predicted_winners_large": {f"{s:g}": w for s, w in predicted.items()},
               "no_warmup_scales": no_warmup, "unpredictable_scales": unpredictable,
               "warmup_undefined_scales": undefined, "largest_mu_contradicted": contra,
               "largest_mu_decided": sum(c["decided"] for c in dis), "rules_disagree": len(dis)}
    figures = [*([_race_heatmap(p, cells), _race_border_figure(p, cells)] if cells else []), _large_phase_figure(large, spacing),
               mix_figure("race-large-outcomes", "Where the default decomposable start ends, per scale (counted "
                          "classes)", mixes, caption="one bar per init scale: its prompt streams (seeds) by end class "
                          "(numerics.evaluate.end_class)")]
    if any(len(c["mix"]["labels"]) > 1 for c in cells):     # seeds disagree somewhere: the cells' counted mix
        figures.append(mix_figure("race-cell-outcomes", "Race cells whose seeds end in different classes",
                                  {f"omega x{c['rho_omega']:g}, mu x{c['rho_mu']:g}": c["mix"] for c in cells
                                   if len(c["mix"]["labels"]) > 1}))
    comps = [race, *phases, small]
    return Outcome(comps, headline, figures, details, undecided=nothing_compared(comps))


def findings(result) -> list:
    """The race's winners against both rules (beyond) and the scale where the warm-up vanishes (stops)."""
    d = result.details
    race = comparisons_where(result, role="race winner")[0]
    p = d["ran"]["profile"]
    if d.get("cells_not_run"):      # claims.core.not_run
        out = [finding(result, "beyond", "The (omega0, mu0) race cells were not trained: "
                       + d["cells_not_run"].replace("{", "{{").replace("}", "}}") + ".")]
    else:
        out = [finding(result, "beyond", "In the (omega0, mu0) race ({cells} cells, one task, two heads) the measured "
                       "winner is theory's ODE rule's in {agree} of {decided} decided cells; 'largest mu0' and the ODE "
                       "rule disagree in {dis} cells, and the measurement contradicts 'largest mu0' in {contra} of the "
                       "{dis_dec} of them that are decided ({undecided} cells undecided by t_end = {t}).",
                       cells=len(d["cells"]), agree=race["measured"], decided=race["details"]["decided"],
                       dis=d["rules_disagree"], contra=d["largest_mu_contradicted"], dis_dec=d["largest_mu_decided"],
                       undecided=race["details"]["undecided"], t=p["time"])]
    for s0, mix in (d.get("large_mix") or {}).items():     # every large-init scale: where its seeds end, counted
        phrase, nums = mix_phrase(mix)
        out.append(finding(result, "beyond", "From the default decomposable start at " + s0.replace("s0=", "s0 = ")
                           + " (its seeds: prompt streams) " + phrase + " by t_end = {t}.", t=p["large_time"], **nums))
    scales = p["large_scales"]
    where, unpred = bracket(scales, d["no_warmup_scales"]), bracket(scales, d["unpredictable_scales"])
    tail = (" allocation is unpredictable from s0 in [{u_lo}, {u_hi}]." if unpred else
            " allocation stays predictable up to s0 = {top}.")
    nums = dict(zip(("u_lo", "u_hi"), unpred or (None, None)), top=max(scales), t=p["large_time"])
    if where:
        out.append(finding(result, "stops", "From the default decomposable start the warm-up disappears (10% of the "
                           "loss drop within 2 record spacings in every seed) at an init scale s0 in ({lo}, {hi}];"
                           + tail, lo=where[0], hi=where[1], **nums))
    elif d["warmup_undefined_scales"]:
        out.append(finding(result, "stops", "From the default decomposable start up to s0 = {top} the scale where the "
                           "warm-up disappears is not located: at s0 = {und} the full model's warm-up is undefined or "
                           "not ended by t_end = {t} in some seed;" + tail, und=d["warmup_undefined_scales"], **nums))
    else:
        out.append(finding(result, "stops", "From the default decomposable start the warm-up does not disappear up "
                           "to s0 = {top} (t_end = {t});" + tail, **nums))
    phases = phase_finding(result, "From the default decomposable start at every scale")
    return out + ([phases] if phases else []) + ([_cells_finding(result, d["cells"], p)] if d["cells"] else [])


def _cells_finding(result, cells, p):
    """The race cells counted: in how many the prompt streams end in one class, and per stream
    (each shared by every cell: common random numbers, so one stream's noise shows in every cell)
    how many cells end in each class (each disagreeing cell's mix: details and race-cell-outcomes)."""
    split = sum(len(c["mix"]["labels"]) > 1 for c in cells)
    nums, parts = {"cells": len(cells), "n": len(p["data_seeds"]), "k": len(cells) - split, "split": split}, []
    for j, stream in enumerate(p["data_seeds"]):
        counts: dict = {}
        for c in cells:
            counts[c["classes"][j]] = counts.get(c["classes"][j], 0) + 1
        parts.append(f"stream {stream}: " + ", ".join(f"{label} in {{s{j}_{q}}}" for q, label in enumerate(counts)))
        nums.update({f"s{j}_{q}": v for q, v in enumerate(counts.values())})
    return finding(result, "beyond", "Of the {cells} race cells the {n} prompt streams (each shared by every cell) end "
                   "in one class in {k} cells and in different classes in {split}" + (" (race-cell-outcomes)" if split
                                                                                     else "")
                   + "; cells per class on each stream: " + "; ".join(parts) + ".", **nums)


RACE_SPEC = ClaimSpec(
    id="boundary-allocation-race", title="Boundary: the (omega0, mu0) race and large initialisation",
    statement="Which head wins a task from a given (omega0, mu0), against theory's ODE rule and the "
              "'largest mu0' rule; above which init scale the warm-up vanishes and allocation is unpredictable.",
    profiles=RACE_PROFILES, plan=plan, compare=compare, kind="boundary", fields=FIELDS, findings=findings,
    resolve=lambda p, problem: replace_fields(p, problem, FIELDS),
    cannot_run=lambda problem: ("the race needs at least two heads" if int(problem.get("heads", 2)) < 2 else None))


def _race_heatmap(p: RaceProfile, cells) -> Figure:
    rows, look = list(reversed(p.ratios)), {(c["rho_omega"], c["rho_mu"]): c for c in cells}
    matrix = [[float(look[(rw, rm)]["measured"][0][0]) if look[(rw, rm)]["decided"] else 0.5 for rw in p.ratios]
              for rm in rows]
    ode = [[look[(rw, rm)]["ode"][0] for rw in p.ratios] for rm in rows]
    return Figure(name="race-heatmap", title="Winning head of task 0 (0.5: undecided -- seeds disagree or race not "
                  "ended)", kind="heatmap", xlabel="runner-up omega0 / favoured omega0",
                  ylabel="runner-up mu0 / favoured mu0", matrix=matrix, row_labels=[f"{r:g}" for r in rows],
                  col_labels=[f"{r:g}" for r in p.ratios],
                  caption=f"theory's ODE rule per cell (same layout): {ode}; its border is drawn in race-border")


def _race_border_figure(p: RaceProfile, cells) -> Figure:
    """The measured winners as points over the ratio grid, with the ODE rule's border (between
    grid cells where its winner switches, per omega ratio; outside the grid: just beyond its
    edge) and the 'largest mu0' border (mu ratio 1)."""
    picks = (("measured: head 0", lambda c: c["decided"] and c["measured"][0][0] == 0),
             ("measured: head 1", lambda c: c["decided"] and c["measured"][0][0] == 1),
             ("measured: undecided", lambda c: not c["decided"]))
    curves = [(label, [c["rho_omega"] for c in cells if pick(c)], [c["rho_mu"] for c in cells if pick(c)], "points")
              for label, pick in picks]
    ratios, by = list(p.ratios), []
    for rw in ratios:
        col = sorted((c for c in cells if c["rho_omega"] == rw), key=lambda c: c["rho_mu"])
        switch = [math.sqrt(a["rho_mu"] * b["rho_mu"]) for a, b in zip(col, col[1:]) if a["ode"][0] != b["ode"][0]]
        by.append(switch[0] if switch else ratios[0] / 1.5 if col and col[0]["ode"][0] == 1 else ratios[-1] * 1.5)
    curves += [("ODE rule border", ratios, by, "line"),
               ("'largest mu0' border", [ratios[0], ratios[-1]], [1.0, 1.0], "dashed")]
    return lines_figure("race-border", "Race winners over the (omega0, mu0) ratio grid with theory's border", curves,
                        xlabel="runner-up omega0 / favoured omega0", ylabel="runner-up mu0 / favoured mu0",
                        xscale="log", yscale="log",
                        caption="above the solid line the ODE rule gives the task to the runner-up head; a border "
                                "outside the grid is drawn just beyond its edge")


def _large_phase_figure(large, spacing) -> Figure:
    curves = []
    for key, style in (("full", "points"), ("reduced", "line")):
        for which in PHASES:
            pts = [(s0, np.mean(v)) for s0, rs in large.items()
                   if (v := [r[key]["phases"][which] for r in rs if r[key] is not None and r[key]["phases"] is not None
                             and math.isfinite(r[key]["phases"][which])])]
            curves.append((f"{key} {which.replace('_', ' ')}", [x for x, _ in pts], [y for _, y in pts], style))
    drawn = any(len(c[1]) for c in curves)     # no phase ended anywhere: nothing to put on a log axis
    return lines_figure("race-phases", "Phase times against the init scale (default decomposable start)", curves,
                        xlabel="s0", ylabel="t", xscale="log" if drawn else "linear", yscale="log" if drawn else "linear",
                        hlines=[{"y": 2 * spacing, "label": "two record spacings"}],
                        caption="a warm-up end below two record spacings: no warm-up at that scale")
