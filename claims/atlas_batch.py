"""atlas-batch: the allocated point's escape time over the batch size and the step, a phase
diagram over a sweep (the atlas panels: claims.core.common, section "the atlas panels").

The panel is lr x B of a sweep of ``model = "atlas"`` points from the allocated point:
theory.saddle's log law dT/dlog(B/lr) = 2/rate.
"""
from __future__ import annotations

import math

import numpy as np

from claims.core.common import Comparison, Tolerance, headline_row, noise_term, perturbation
from claims.core.atlas import atlas_config_text, atlas_details, atlas_spec, classes_finding, escape_figure, outcome_maps, t_end_of
from claims.core.spec import Outcome, finding
from numerics.experiments.atlas import escape_means, escaped_runs, grid_of, ols_slope, panel_points


def compare_batch(ctx, results) -> Outcome:
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


SPEC = atlas_spec("atlas-batch", "Atlas: batch size and step",
                  "The saddle's escape time against the batch size and step: theory's log law dT/dlog(B/lr) = 1/a.",
                  compare_batch, findings_batch)
