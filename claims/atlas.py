"""The atlas: four boundary ids, each a panel of a sweep of ``model = "atlas"`` points
(numerics.experiments.atlas; grids ``examples/atlas_tiny.toml``, ``examples/atlas.toml``; what each panel compares
with theory: ``docs/atlas.md``) -- atlas-initialisation (pattern x s0), atlas-heads (H x tasks and start),
atlas-noise (sigma x L), atlas-batch (lr x B).  They train nothing (no ``--from-sweep``: they refuse).  The plan
is the points of the sweep's last grid with the id's ``panel`` label (numerics.experiments.atlas.panel_needs:
"atlas" needs the engine reads from the sweep store, never trains; a grid point the sweep does not hold is reported
in ``details["unheld_points"]`` with why); the comparison classifies each seed by the one classifier
(numerics.evaluate.end_class, through numerics.experiments.atlas.point_class) and counts each cell's seeds by class
(its mix, drawn where they disagree).  Not in the default report: the ids are ``claims.OPT_IN``, run only when
named in ``--only``."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from claims.core import (Z_SE, ClaimSpec, Comparison, Figure, Outcome, Series, Tolerance, compare, finding,
                         headline_row, lines_figure, mix_figure, mix_phrase, noise_term, perturbation, reported_row)
from numerics.experiments.atlas import (PATTERNS, cell_class, class_counts, escape_cells, escape_means, escape_row,
                                        escaped_runs, grid_of, heads_row, mean_se, ols_slope, panel_matrices,
                                        panel_needs, panel_points, ratios, warmup_border, warmup_row)
from numerics.evaluate import OUTCOME_CLASSES


ATLAS_IDS = ("atlas-initialisation", "atlas-heads", "atlas-noise", "atlas-batch")
ATLAS_LEGEND = "cell value = the class every seed of the cell ends in: " + ", ".join(
    f"{k} {c}" for k, c in enumerate(OUTCOME_CLASSES)) + " (blank: the seeds disagree; their counted mix is the -mix figure)"


@dataclass(frozen=True)
class AtlasProfile:
    name: str   # the atlas has no sizes of its own: its points are the sweep's


ATLAS_PROFILES = {k: AtlasProfile(k) for k in ("tiny", "quick", "paper")}


def seeds_text(cells) -> str:
    """How many seeds a cell of the panel has ("2 seeds per cell", "1-2 seeds per cell")."""
    n = sorted({len(res) for res in cells.values()})
    return (f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}") + (" seed" if n == [1] else " seeds") + " per cell"


RATIO_MAPS = (("over_allocated", "loss-ratio", "theory.exact's allocated loss", "theory.exact's allocated fixed-point "
               "loss (blank: H < m, no allocated point); below 1: a lower-loss model than the limit"),
              ("over_best", "loss-over-best", "best decomposable point", "the best decomposable point of the same H "
               "(numerics.experiments.probes.best_decomposable, signs free; below 1: the trained model beats every "
               "decomposable point found)"))


def outcome_maps(name, title, cells, rows, cols, row_label, col_label, xlabel, ylabel, caption):
    """The outcome heatmap (the class every seed of a cell shares; blank where they disagree),
    the cells' counted mixes where the seeds disagree (a 'mix' figure: one stacked bar per cell)
    and the loss-ratio heatmaps (numerics.experiments.atlas.panel_matrices; the one over the best
    decomposable point where stored), and the per-cell numbers for details."""
    m = panel_matrices(cells, rows, cols, row_label, col_label)
    axes = {"row_labels": m["row_labels"], "col_labels": m["col_labels"], "xlabel": xlabel, "ylabel": ylabel}
    seeds = seeds_text(cells)
    figs = [Figure(name=f"{name}-outcome", title=f"{title}: outcome", kind="heatmap", matrix=m["outcome"],
                   caption=f"{caption} {seeds} (the grid's seeds). {ATLAS_LEGEND}", **axes)]
    if m["mixes"]:
        figs.append(mix_figure(f"{name}-mix", f"{title}: cells whose seeds end in different classes", m["mixes"],
                               caption=f"one bar per cell ({seeds}): its seeds counted by end class "
                                       "(numerics.evaluate.end_class)"))
    figs += [Figure(name=f"{name}-{suffix}", title=f"{title}: held-out loss / {what}", kind="heatmap", matrix=m[key],
                    caption=f"mean over seeds of the held-out loss over {why}", **axes)
             for key, suffix, what, why in RATIO_MAPS
             if key == "over_allocated" or any(v is not None for row in m[key] for v in row)]
    return figs, m["info"]


def classes_finding(result, panel: str) -> list:
    """The panel's cells by class where their seeds agree, and every cell whose seeds disagree as
    its counted mix (k of n seeds per class: claims.core.mix_phrase)."""
    cc, cells = result.details["classes"], result.details["cells"]
    per = cc["seeds_per_cell"]
    out = [finding(result, "beyond", "Over {cells} cells of the " + panel + " panel ({lo}" + ("-{hi}" if len(per) > 1
                   else "") + (" seed" if per == [1] else " seeds") + " per cell, the grid's): the seeds of {a} cells all end allocated, {s} in a "
                   "superposition, {o} off D, {mx} mixed, {nc} not converged, {dv} diverged; in {dis} cells they end "
                   "in different classes.", cells=cc["cells"], lo=per[0], hi=per[-1], a=cc["allocated"],
                   s=cc["superposition"], o=cc["off D"], mx=cc["mixed"], nc=cc["not converged"], dv=cc["diverged"],
                   dis=cc["seeds_disagree"])]
    mixes = [(key, mix_phrase(v["mix"])) for key, v in cells.items() if not v["seeds_agree"]]
    return out + [finding(result, "beyond", "Cell " + key + " of the " + panel + " panel: " + phrase + ".", **nums)
                  for key, (phrase, nums) in mixes]


def atlas_details(points, unheld, cells) -> dict:
    """The details every panel reports: its points, the grid points the sweep does not hold, the
    cells counted by class (numerics.experiments.atlas.class_counts), the points' CPU seconds."""
    secs = [x["result"].get("cpu_seconds") for x in points]
    return {"points": len(points), "missing_points": len(unheld), "unheld_points": unheld,
            "classes": class_counts(cells), "point_cpu_seconds": float(np.nansum([s for s in secs if s is not None]))}


def point_problem(x) -> dict:
    """The problem (ProblemConfig fields) of one stored atlas point."""
    return x["point"]["problem"]


def t_end_of(points) -> float:
    """The longest flow time t_end of the points' training."""
    return float(max(x["point"]["train"]["time"] for x in points))


def atlas_config_text(points, keys) -> str:
    """The configuration label of a panel: the ``keys`` of its first point's problem."""
    p = point_problem(points[0])
    return " ".join(f"{k}={tuple(p[k]) if isinstance(p[k], list) else p[k]}" for k in keys)


def escape_figure(name: str, title: str, curves, xlabel: str, t_end: float, caption: str):
    """Escape times from the allocated point (measured points, theory.saddle's T(B) lines) against
    a log axis, with the run's length t_end marked; ``caption`` follows "points: first crossing of
    the opposite-sign share "."""
    return lines_figure(name, title, curves, xlabel=xlabel, ylabel="escape time", xscale="log",
                        hlines=[{"y": t_end, "label": "t_end (the run)"}],
                        caption="points: first crossing of the opposite-sign share " + caption)


def atlas_spec(cid, title, statement, compare, findings):
    """An atlas id: its plan its panel's points (the id's last word), its comparison ``compare``."""
    panel = cid.split("-", 1)[1]
    return ClaimSpec(id=cid, title=title, statement=statement, profiles=ATLAS_PROFILES, kind="boundary",
                     findings=findings, reads_sweep=True, plan=lambda ctx, results=None: panel_needs(panel),
                     compare=compare)


# ---------------------------------------------------------------------------------------
# atlas-initialisation
# ---------------------------------------------------------------------------------------

def compare_initialisation(ctx, results) -> Outcome:
    """atlas-initialisation: where the paper's picture holds over the initialisation, a phase diagram
    over a sweep.

    The panel is pattern x s0 of a sweep of ``model = "atlas"`` points, against
    theory.initialisation's small scale: below it a run may not have left its warm-up by t_end."""
    points, unheld = panel_points(results, "initialisation")
    cells, rows, cols = grid_of(points, lambda x: point_problem(x)["init"], lambda x: point_problem(x)["init_scale"])
    t_end = t_end_of(points)
    figs, info = outcome_maps("atlas-init", "Initialisation", cells, rows, cols, lambda r: PATTERNS.get(r, r),
                              lambda c: f"{c:g}", "init scale s0", "pattern",
                              "Rows: start pattern; columns: init scale s0.")
    borders, below, left_below, measured, curves = {}, [], [], {}, []
    for r in rows:
        by_s = {c: cells[(r, c)] for c in cols if (r, c) in cells}
        b = borders[r] = warmup_border(by_s)
        measured[r] = {**warmup_row(by_s), "theory": b}
        below += [x for s, rs in by_s.items() for x in rs if b is not None and s < b]
        left_below += [{"pattern": r, "s0": s, "seed": x["seed"]} for s, rs in by_s.items() for x in rs
                       if b is not None and s < b and not x["in_warmup"]]
        xs = sorted(by_s)
        curves.append((f"{PATTERNS.get(r, r)} movable off-D / ||(W,U)||", xs,
                       [np.mean([x["residual_end"]["movable_relative"] for x in by_s[s]]) for s in xs], "points"))
        if b is not None:
            curves.append((f"{PATTERNS.get(r, r)} theory small scale", [b, b], [0.0, 1.0], "dashed"))
    figs.append(lines_figure("atlas-init-residual", "Movable off-D residual at t_end against s0", curves,
                             xlabel="init scale s0", ylabel="movable off-D part / ||(W, U)||", xscale="log",
                             caption="points: mean over seeds; dashed: theory.initialisation's small scale of the "
                                     "pattern (warm-up bound exponent 1/2 at t_end), below which a run is still in "
                                     "warm-up"))
    n_left = len(left_below)
    comp = Comparison(
        name="runs below theory's small scale still in warm-up at t_end", measured=n_left, predicted=0,
        error=float(n_left), tolerance=0.0, side="not above",
        why="one-sided and exact: below the small scale the quartic warm-up bound keeps |theta|^2 <= 2 |theta0|^2 "
            "to t_end (theory.initialisation), so no such run may have left its warm-up; theory's scale is a "
            "sufficient bound, so runs above it may stay in warm-up too",
        details={"below": len(below), "left_below": left_below, "borders": borders, "measured": measured},
        config=atlas_config_text(points, ("tasks", "heads", "L", "sigma", "logit_scale")))
    undecided = None if below else ("no point of the grid lies below theory's small scale: nothing tested it")
    head = [headline_row(comp)] + [reported_row(f"{PATTERNS.get(r, r)}: warm-up border s0 (measured / theory's small "
                                                "scale)", m["border"], theory=m["theory"], config=comp.config)
                                   for r, m in measured.items()]
    off = sorted((PATTERNS.get(r, r), c) for (r, c), res in cells.items() if cell_class(res) == ("off D", True))
    details = {**atlas_details(points, unheld, cells), "t_end": t_end, "cells": info, "borders": borders,
               "measured_borders": measured, "off_D_cells": off,
               "authors": {k: v for k, v in info.items() if k == "PyTorch-default uniform | 1"}}
    return Outcome([comp], head, figs, details, undecided=undecided)


def findings_initialisation(result) -> list:
    d, out, c = result.details, [], result.details["comparisons"][0]
    out.append(finding(result, "holds" if c["agrees"] else "stops",
                       "Of {n_below} run(s) started below theory.initialisation's small scale, {left} had left their "
                       "warm-up by t_end = {t} (theory: none may).", n_below=c["details"]["below"],
                       left=c["measured"], t=d["t_end"]))
    for pat, m in d["measured_borders"].items():
        if m["border"] and m["theory"]:
            out.append(finding(result, "stops", "Pattern " + PATTERNS.get(pat, pat) + ": runs leave their warm-up "
                               "by t_end between s0 = {lo} and {hi}, {ratio} x theory's small scale {th}.",
                               lo=m["last_in_warmup"], hi=m["first_out"], ratio=m["border"] / m["theory"],
                               th=m["theory"]))
    for v in d["authors"].values():
        phrase, nums = mix_phrase(v["mix"])
        out.append(finding(result, "beyond", "From PyTorch's default start (uniform, s0 = 1) " + phrase + ".", **nums))
    return out + classes_finding(result, "initialisation")


INITIALISATION_SPEC = atlas_spec("atlas-initialisation", "Atlas: initialisation pattern x scale",
                  "Over init patterns and scales from well below theory's small scale to PyTorch's default, where "
                  "does training end allocated, in a superposition, off D or not converged, and does theory's small "
                  "scale bound the warm-up?", compare_initialisation, findings_initialisation)


# ---------------------------------------------------------------------------------------
# atlas-heads
# ---------------------------------------------------------------------------------------

def compare_heads(ctx, results) -> Outcome:
    """atlas-heads: where the paper's picture holds over the number of heads, a phase diagram over a
    sweep (the atlas panels: claims.core, section "the atlas panels").

    The panel is H x tasks and start of a sweep of ``model = "atlas"`` points: allocation needs
    H >= m (theory's border H = m, from balanced starts)."""
    points, unheld = panel_points(results, "heads")
    cells, rows, cols = grid_of(points, lambda x: (len(point_problem(x)["tasks"]), point_problem(x)["init"],
                                                   point_problem(x)["init_scale"], tuple(point_problem(x)["tasks"])),
                                lambda x: point_problem(x)["heads"])
    label = lambda r: f"tasks={r[3]} {PATTERNS.get(r[1], r[1])} s0={r[2]:g}"  # noqa: E731
    figs, info = outcome_maps("atlas-heads", "Heads against tasks", cells, rows, cols, label, lambda c: f"H={c}",
                              "heads H", "tasks and start", "Rows: task blocks and start; columns: heads H.")
    rows_out, errors, decided, series = [], [], 0, []
    for r in rows:
        m = r[0]
        hs = [h for h in cols if (r, h) in cells]
        balanced = r[1] in ("decomposable", "random_decomposable")
        ro = {"row": label(r), "m": m, "balanced": balanced, **heads_row({h: cells[(r, h)] for h in hs}, m)}
        rows_out.append(ro)
        if balanced and ro["measured_border"] is not None:
            decided += 1
            errors.append((ro["measured_border"], m))
        series.append(Series(f"{label(r)} loss / best decomposable", hs,
                             [ratios(cells[(r, h)])["over_best"] for h in hs], "points"))
    for m in sorted({r[0] for r in rows}):
        series.append(Series(f"theory border H = m = {m}", [m, m], [0.5, 2.0], "dashed"))
    figs.append(Figure(name="atlas-heads-best", title="Held-out loss / best decomposable point of the same H",
                       xlabel="heads H", ylabel="loss / best decomposable", series=series,
                       caption="points: mean over seeds; dashed: theory's border H = m (allocation needs a head per "
                               "task)"))
    largest_miss = lambda got, want: max((abs(b - m) for b, m in zip(got, want)), default=0.0)  # noqa: E731
    ms = [m for _, m in errors]
    comp = compare("balanced starts: smallest allocated H against theory's border H = m", [b for b, _ in errors], ms,
                   0.0, "exact: H is an integer and the grid contains H = m; a row's border is its smallest H whose "
                   "seeds all end allocated (inf: a converged row with no allocated H >= m)", error=largest_miss,
                   wrong=(("border at H = m - 1", [m - 1 for m in ms]), ("border at H = m + 1", [m + 1 for m in ms])),
                   details={"rows": rows_out}, config=atlas_config_text(points, ("L", "sigma")))
    undecided = None if decided else "no balanced-start row has a decided cell at H >= m"
    head = [headline_row(comp, measured=comp.error)] + [reported_row(
        f"{ro['row']}: smallest allocated H", ro["measured_border"], theory=ro["m"], config=comp.config) for ro in rows_out]
    details = {**atlas_details(points, unheld, cells), "cells": info, "rows": rows_out}
    return Outcome([comp], head, figs, details, undecided=undecided)


def findings_heads(result) -> list:
    d, out = result.details, []
    for ro in d["rows"]:
        b, n, nc = ro["measured_border"], ro["seeds_above_m"], ro["not_converged_above_m"]
        if ro["balanced"]:
            out.append(finding(result, "holds" if b == ro["m"] else ("stops" if b else "beyond"), "From " + ro["row"]
                               + (" the smallest H whose seeds all end allocated is {b}" if b else " no H had all its "
                                  "seeds allocated and converged by t_end (undecided)") + " (theory's border: H = m = "
                               "{m}).", b=b, m=ro["m"]))
            continue
        shared = ro["superposition_above_m"] + ro["off_D_above_m"]
        word = ("as He, Pan, Chen, Yang (ICML 2025) report from random starts when heads outnumber tasks" if
                2 * shared >= max(n, 1) else "still descending at t_end, so not yet comparable with the superposition "
                "He, Pan, Chen, Yang (ICML 2025) report" if 2 * nc >= max(n, 1) else "unlike the superposition He, "
                "Pan, Chen, Yang (ICML 2025) report from random starts when heads outnumber tasks")
        out.append(finding(result, "beyond", "From " + ro["row"] + ", of the {n} seeds of its {c} cells with H > m "
                           "{sp} end in a superposition, {od} off D and {nc} not converged, at {r} x theory.exact's "
                           "allocated loss (cell means): " + word + ".", n=n, c=ro["cells_above_m"],
                           sp=ro["superposition_above_m"], od=ro["off_D_above_m"], nc=nc, r=tuple(ro["ratio_above_m"])))
    return out + classes_finding(result, "heads")


HEADS_SPEC = atlas_spec("atlas-heads", "Atlas: heads against tasks",
                  "As H runs from below m to 2m + 1, from balanced and PyTorch-default starts: where does allocation "
                  "(surplus heads vanish) give way to superposition?", compare_heads, findings_heads)


# ---------------------------------------------------------------------------------------
# atlas-noise
# ---------------------------------------------------------------------------------------

def leave_comparison(name, cells, keyfmt, t_end, config) -> Comparison:
    """Per decided cell (every seed's run escaped by t_end, or none did), theory's prediction
    T_pred < t_end against the measurement; cells within theory's own uncertainty of t_end
    (|T_pred - t_end| <= Z_SE se(T_pred) + the record spacing) are border cells, not counted,
    nor are cells whose seeds disagree or diverged.
    error = cells that disagree; tolerance 0.  Perturbations through the same comparison: rate a
    instead of 2a, rate 0 (the allocated point a true minimum: never left)."""
    rows = escape_cells(cells, keyfmt, t_end)
    for r in rows:
        if r.get("diverged"):
            r["decided"] = False
            continue
        r["margin"] = Z_SE * r["T_pred_se"] + r["spacing"]
        r["decided"] = len(set(r["left"])) == 1 and abs(r["T_pred"] - t_end) > r["margin"]
    decided = [r for r in rows if r["decided"]]

    def wrong(pred):
        return float(sum((pred(r) < t_end) != r["left"][0] for r in decided))

    return Comparison(
        name=name, measured=sum(r["left"][0] for r in decided), predicted=sum(r["T_pred"] < t_end for r in decided),
        error=wrong(lambda r: r["T_pred"]), tolerance=0.0,
        why="exact count over the decided cells (seeds agree; theory's T_pred farther from t_end than Z_SE se of "
            "T_pred plus the record spacing): escape time from theory.saddle (rate 2 log(1 + lr a)/lr, seed from "
            "the measured per-prompt gradient variance) against the first crossing of the opposite-sign share",
        perturbations=[perturbation("rate a instead of 2a", wrong(lambda r: r["T_pred_rate_a"]), 0.0),
                       perturbation("rate 0: a true minimum, never left", wrong(lambda r: math.inf), 0.0)],
        details={"cells": rows, "decided": len(decided), "t_end": t_end}, config=config)


def compare_noise(ctx, results) -> Outcome:
    """atlas-noise: where the paper's picture holds over the label noise and the context length, a
    phase diagram over a sweep (the atlas panels: claims.core, section "the atlas panels").

    The panel is sigma x L of a sweep of ``model = "atlas"`` points from the allocated point:
    theory.saddle's escape time T(B) against the run's length."""
    points, unheld = panel_points(results, "noise")
    cells, rows, cols = grid_of(points, lambda x: point_problem(x)["sigma"], lambda x: point_problem(x)["L"])
    t_end = t_end_of(points)
    figs, info = outcome_maps("atlas-noise", "Noise and length", cells, rows, cols, lambda r: f"sigma={r:g}",
                              lambda c: f"L={c}", "context length L", "label noise sigma",
                              "From theory's allocated point (off-task values mu0). Rows: sigma; columns: L.")
    config = atlas_config_text(points, ("tasks", "heads")) + f" lr={points[0]['point']['train']['lr']:g} " \
        f"B={points[0]['point']['train']['batch']} t_end={t_end:g}"
    comp = leave_comparison("left allocation by t_end: measured against theory's T(B) < t_end", cells,
                            lambda k: f"sigma={k[0]:g} L={k[1]}", t_end, config)
    curves, borders = [], []
    for r in rows:
        e = escape_row({c: cells[(r, c)] for c in cols if (r, c) in cells}, t_end)
        curves += [(f"sigma={r:g} measured", e["L"], e["measured"], "points"),
                   (f"sigma={r:g} theory", e["L"], e["theory"], "line")]
        borders.append({"sigma": r, **{k: e[k] for k in ("theory_L", "measured_last_left", "measured_first_stay",
                                                         "measured_L")}})
    figs.append(escape_figure("atlas-noise-escape", "Escape time from the allocated point against L", curves, "L",
                              t_end, "(mean over seeds; missing: none by t_end); lines: theory.saddle's T(B); "
                                     "theory's border is where a line crosses t_end"))
    undecided = None if comp.details["decided"] else "no cell decided (seeds disagree, or T(B) too close to t_end)"
    head = [headline_row(comp)]
    for b in borders:
        head.append(reported_row(f"sigma={b['sigma']:g}: border L (measured between last left and first stayed)",
                                 b["measured_L"], theory=b["theory_L"], config=config))
    esc = [x for res in cells.values() for x in res if math.isfinite(x["escape_time"])]
    details = {**atlas_details(points, unheld, cells), "t_end": t_end, "cells": info, "borders": borders,
               "escaped_over_allocated": mean_se([x["loss"] / x["allocated_loss"] for x in esc]),
               "escaped_over_best": mean_se([x["loss"] / x["best_decomposable"]["loss"] for x in esc])}
    return Outcome([comp], head, figs, details, undecided=undecided)


def findings_noise(result) -> list:
    d, out = result.details, []
    c = d["comparisons"][0]
    out.append(finding(result, "holds" if c["agrees"] else "stops",
                       "From the allocated point, {n} decided (sigma, L) cells: theory's saddle law (T(B) < t_end = "
                       "{t}) predicts {p} to leave allocation, {m} left; {e} disagree.", n=c["details"]["decided"],
                       t=d["t_end"], p=c["predicted"], m=c["measured"], e=c["error"]))
    for b in d["borders"]:
        out.append(finding(result, "stops", "At sigma = {s} theory's border (T(B) = t_end) lies at L = {th}; the "
                           "runs left allocation up to L = {lo} and stayed from L = {hi}.", s=b["sigma"],
                           th=b["theory_L"], lo=b["measured_last_left"], hi=b["measured_first_stay"]))
    ea, eb = d["escaped_over_allocated"], d["escaped_over_best"]
    if ea[0] is not None:
        out.append(finding(result, "beyond", "Runs that left allocation end at {a} x theory.exact's allocated loss "
                           "and {b} x the best decomposable point of the same H.", a=tuple(ea), b=tuple(eb)))
    return out + classes_finding(result, "noise")


NOISE_SPEC = atlas_spec("atlas-noise", "Atlas: noise and context length",
                  "Over sigma x L, where do trained models leave the allocated saddle for a superposition, against "
                  "theory's escape time T(B) compared with the run?", compare_noise, findings_noise)


# ---------------------------------------------------------------------------------------
# atlas-batch
# ---------------------------------------------------------------------------------------

def compare_batch(ctx, results) -> Outcome:
    """atlas-batch: the allocated point's escape time over the batch size and the step, a phase diagram
    over a sweep.

    The panel is lr x B of a sweep of ``model = "atlas"`` points from the allocated point:
    theory.saddle's log law dT/dlog(B/lr) = 2/rate."""
    points, unheld = panel_points(results, "batch")
    cells, rows, cols = grid_of(points, lambda x: x["point"]["train"]["lr"], lambda x: x["point"]["train"]["batch"])
    t_end = t_end_of(points)
    figs, info = outcome_maps("atlas-batch", "Batch size and step", cells, rows, cols, lambda r: f"lr={r:g}",
                              lambda c: f"B={c}", "batch B", "step lr",
                              "From theory's allocated point. Rows: step lr; columns: batch B.")
    config = atlas_config_text(points, ("tasks", "heads", "L", "sigma")) + f" t_end={t_end:g}"
    xs, ys, preds = escaped_runs(cells, rows, cols)
    curves = []
    for r in rows:
        Bs, measured, theory = escape_means({c: cells[(r, c)] for c in cols if (r, c) in cells})
        curves += [(f"lr={r:g} measured", Bs, measured, "points"), (f"lr={r:g} theory", Bs, theory, "line")]
    figs.append(escape_figure("atlas-batch-escape", "Escape time against the batch size, per step", curves,
                              "batch B", t_end, "(mean over seeds); lines: theory.saddle's T(B) (slope 2/rate in "
                                                "log B, seed from the measured gradient noise)"))
    slope, se = ols_slope(xs, ys)
    undecided = None if math.isfinite(slope) else "fewer than 4 escaped runs at distinct B / lr: no slope with an se"
    pred = float(np.mean(preds)) if preds else math.nan
    tol = Tolerance((noise_term(se, "the OLS slope over the escaped runs"),),
                    "seed ~ (lr/B)^2, theory.saddle section 3")
    comp = Comparison(
        name="escape time slope dT / d log(B / lr) against theory's 2 / rate", measured=slope, predicted=pred,
        error=abs(slope - pred) if math.isfinite(slope) else math.inf, tolerance=tol.value, why=tol.why(),
        perturbations=[perturbation("additive noise: seed ~ lr/B, half the slope", abs(slope - pred / 2), tol.value),
                       perturbation("rate a instead of 2a: twice the slope", abs(slope - 2 * pred), tol.value)],
        details={"escaped": len(xs), "runs": sum(len(v) for v in cells.values()), "slope_se": se},
        config=config)
    head = [headline_row(comp, se=se if math.isfinite(se) else None)]
    details = {**atlas_details(points, unheld, cells), "t_end": t_end, "cells": info,
               "a": points[0]["result"]["saddle"]["a"]}
    return Outcome([comp], head, figs, details, undecided=undecided)


def findings_batch(result) -> list:
    d = result.details
    c = d["comparisons"][0]
    return [finding(result, "beyond", "Escape from the allocated point: dT/dlog(B/lr) = {s} over {n} escaped runs "
                    "against theory's 2/rate = {p} (1/a, a = {a}; additive noise would give {half}).",
                    s=(c["measured"], c["details"]["slope_se"]), n=c["details"]["escaped"], p=c["predicted"],
                    a=d["a"], half=c["predicted"] / 2 if isinstance(c["predicted"], float) else None),
            *classes_finding(result, "batch")]


BATCH_SPEC = atlas_spec("atlas-batch", "Atlas: batch size and step",
                  "The saddle's escape time against the batch size and step: theory's log law dT/dlog(B/lr) = 1/a.",
                  compare_batch, findings_batch)
