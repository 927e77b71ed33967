"""atlas-initialisation: where the paper's picture holds over the initialisation, a phase
diagram over a sweep (the atlas panels: claims.core.common, section "the atlas panels").

The panel is pattern x s0 of a sweep of ``model = "atlas"`` points, against
theory.initialisation's small scale: below it a run may not have left its warm-up by t_end.
"""
from __future__ import annotations

import numpy as np

from claims.core.common import Comparison, headline_row, lines_figure, reported_row
from claims.core.atlas import atlas_config_text, atlas_details, atlas_spec, classes_finding, outcome_maps, point_problem, t_end_of
from claims.core.phase_checks import mix_phrase
from claims.core.spec import Outcome, finding
from numerics.experiments.atlas import PATTERNS, cell_class, grid_of, panel_points, warmup_border, warmup_row


def compare_initialisation(ctx, results) -> Outcome:
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


SPEC = atlas_spec("atlas-initialisation", "Atlas: initialisation pattern x scale",
                  "Over init patterns and scales from well below theory's small scale to PyTorch's default, where "
                  "does training end allocated, in a superposition, off D or not converged, and does theory's small "
                  "scale bound the warm-up?", compare_initialisation, findings_initialisation)
