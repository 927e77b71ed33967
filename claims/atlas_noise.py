"""atlas-noise: where the paper's picture holds over the label noise and the context length, a
phase diagram over a sweep (the atlas panels: claims.core.common, section "the atlas panels").

The panel is sigma x L of a sweep of ``model = "atlas"`` points from the allocated point:
theory.saddle's escape time T(B) against the run's length.
"""
from __future__ import annotations

import math

from claims.core.common import Z_SE, Comparison, headline_row, perturbation, reported_row
from claims.core.atlas import atlas_config_text, atlas_details, atlas_spec, classes_finding, escape_figure, outcome_maps, point_problem, t_end_of
from claims.core.spec import Outcome, finding
from numerics.experiments.atlas import escape_cells, escape_row, grid_of, mean_se, panel_points


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


SPEC = atlas_spec("atlas-noise", "Atlas: noise and context length",
                  "Over sigma x L, where do trained models leave the allocated saddle for a superposition, against "
                  "theory's escape time T(B) compared with the run?", compare_noise, findings_noise)
