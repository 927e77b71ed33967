"""atlas-heads: where the paper's picture holds over the number of heads, a phase diagram over a
sweep (the atlas panels: claims.core.common, section "the atlas panels").

The panel is H x tasks and start of a sweep of ``model = "atlas"`` points: allocation needs
H >= m (theory's border H = m, from balanced starts).
"""
from __future__ import annotations

from claims.core.base import Figure, Series
from claims.core.common import compare, headline_row, reported_row
from claims.core.atlas import atlas_config_text, atlas_details, atlas_spec, classes_finding, outcome_maps, point_problem
from claims.core.spec import Outcome, finding
from numerics.experiments.atlas import PATTERNS, grid_of, heads_row, panel_points, ratios


def compare_heads(ctx, results) -> Outcome:
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


SPEC = atlas_spec("atlas-heads", "Atlas: heads against tasks",
                  "As H runs from below m to 2m + 1, from balanced and PyTorch-default starts: where does allocation "
                  "(surplus heads vanish) give way to superposition?", compare_heads, findings_heads)
