"""What the four atlas ids share (claims.atlas_initialisation, claims.atlas_heads,
claims.atlas_noise, claims.atlas_batch): each is a panel of a sweep of ``model = "atlas"`` points
(numerics.experiments.atlas; grids ``examples/atlas_tiny.toml``, ``examples/atlas.toml``; what
each panel compares with theory: ``docs/atlas.md``).  They train nothing (no ``--from-sweep``:
they refuse).  The plan is the points of the sweep's last grid with the id's ``panel`` label
(numerics.experiments.atlas.panel_needs: "atlas" needs the engine reads from the sweep store,
never trains; a grid point the sweep does not hold is reported in ``details["unheld_points"]``
with why); the comparison classifies each seed by the one classifier (numerics.readout.
end_class, through numerics.experiments.atlas.point_class) and counts each cell's seeds by class
(its mix, drawn where they disagree).  Not in the default report: the ids are
``claims.OPT_IN``, run only when named in ``--only``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from claims.core.base import Figure
from claims.core.common import lines_figure
from claims.core.phase_checks import mix_figure, mix_phrase
from claims.core.spec import ClaimSpec, finding
from numerics.readout import OUTCOME_CLASSES

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
    from numerics.experiments.atlas import panel_matrices
    m = panel_matrices(cells, rows, cols, row_label, col_label)
    axes = {"row_labels": m["row_labels"], "col_labels": m["col_labels"], "xlabel": xlabel, "ylabel": ylabel}
    seeds = seeds_text(cells)
    figs = [Figure(name=f"{name}-outcome", title=f"{title}: outcome", kind="heatmap", matrix=m["outcome"],
                   caption=f"{caption} {seeds} (the grid's seeds). {ATLAS_LEGEND}", **axes)]
    if m["mixes"]:
        figs.append(mix_figure(f"{name}-mix", f"{title}: cells whose seeds end in different classes", m["mixes"],
                               caption=f"one bar per cell ({seeds}): its seeds counted by end class "
                                       "(numerics.readout.end_class)"))
    figs += [Figure(name=f"{name}-{suffix}", title=f"{title}: held-out loss / {what}", kind="heatmap", matrix=m[key],
                    caption=f"mean over seeds of the held-out loss over {why}", **axes)
             for key, suffix, what, why in RATIO_MAPS
             if key == "over_allocated" or any(v is not None for row in m[key] for v in row)]
    return figs, m["info"]


def classes_finding(result, panel: str) -> list:
    """The panel's cells by class where their seeds agree, and every cell whose seeds disagree as
    its counted mix (k of n seeds per class: claims.core.phase_checks.mix_phrase)."""
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
    from numerics.experiments.atlas import class_counts
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
    from numerics.experiments.atlas import panel_needs
    panel = cid.split("-", 1)[1]
    return ClaimSpec(id=cid, title=title, statement=statement, profiles=ATLAS_PROFILES, kind="boundary",
                     findings=findings, reads_sweep=True, plan=lambda ctx, results=None: panel_needs(panel),
                     compare=compare)
