"""Rendering of claim results: ``Figure`` data to PNG, ``claims.json`` entries to one HTML page.

Nothing here computes a result.  Every number drawn or printed comes from a
``claims.base.ClaimResult``; this module only chooses how it looks:

- :func:`figure_png` draws a ``claims.base.Figure`` (kinds ``"lines"``, ``"heatmap"``,
  ``"panels"``) with Matplotlib's Agg backend and returns the PNG bytes.
- :func:`render_html` turns the ``claims.json`` document plus the PNG bytes into one
  self-contained page: inline CSS, figures as base64 data URIs, no script, no network.

Colour convention of ``"lines"`` figures (:func:`series_colours`): lines take successive
colours, and each measured ``points`` series takes the colour of the line whose label it
shares most words with (``"full task 1"`` with ``"reduced task 1"``), so a measurement and
its prediction are drawn in the same colour; on a tie, points and lines are paired in order.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import io
import math
import re
from typing import Any, Iterable

import matplotlib

matplotlib.use("Agg")  # files only, never a display: the report runs on headless machines
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
from PIL import Image  # noqa: E402 - Matplotlib's own dependency

from claims.base import Figure, Series  # noqa: E402

FIGURE_KINDS = ("lines", "heatmap", "panels")
SERIES_STYLES = ("line", "points", "dashed")
SCALES = ("linear", "log")

# Shading of successive spans (warm-up, emergence, convergence): light, distinct, and
# legible under the lines drawn on top.
SPAN_COLOURS = ("#fde0c5", "#c9e4f6", "#d5efd0", "#eadcf2", "#f6f2c4")
HLINE_COLOURS = ("#444444", "#b2182b", "#2166ac", "#1b7837")
# More than this many legend entries would cover the axes; the legend moves outside.
LEGEND_INSIDE_MAX = 8
# Lists longer than this are shown on the page by their first and last LIST_SHOWN_EDGE values.
LIST_SHOWN_MAX = 40
LIST_SHOWN_EDGE = 8
# Size caps of a figure (issue 22: a figure of 400 panels became a 92-megapixel PNG): at most
# MAX_PANELS panels and LEGEND_MAX legend entries are drawn (the caption says so, the data stay
# in claims.json), heatmap labels only up to HEATMAP_LABELS_MAX per axis, and a PNG larger than
# MAX_PIXELS (a huge legend or title) is scaled down to it.
MAX_PANELS = 16
LEGEND_MAX = 40
HEATMAP_LABELS_MAX = 40
MAX_PIXELS = 4_000_000


class RenderError(ValueError):
    """A ``Figure`` that cannot be drawn, with what is wrong in it."""


# --------------------------------------------------------------------------- figures


def as_figure(obj: Any) -> Figure:
    """A ``Figure`` from a ``Figure`` or from its ``dataclasses.asdict`` form (as stored in
    ``claims.json``), so a figure can be redrawn from the JSON file alone."""
    if isinstance(obj, Figure):
        return obj
    if not isinstance(obj, dict):
        raise RenderError(f"a figure must be a claims.base.Figure or a dict, got {type(obj).__name__}")
    known = {f.name for f in dataclasses.fields(Figure)}
    unknown = set(obj) - known
    if unknown:
        raise RenderError(f"figure {obj.get('name', '?')!r} has unknown keys {sorted(unknown)}; "
                          f"known: {sorted(known)}")
    data = dict(obj)
    data["series"] = [s if isinstance(s, Series) else Series(**s) for s in data.get("series", [])]
    data["panels"] = [as_figure(p) for p in data.get("panels", [])]
    return Figure(**data)


def _number(v: Any) -> float:
    """A float from a figure coordinate; ``"nan"``/``"inf"`` strings are what ``jsonable``
    makes of non-finite floats, and ``None`` is a missing point."""
    if v is None:
        return math.nan
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise RenderError(f"figure coordinate {v!r} is not a number") from None
    return float(v)


def _check_lines(fig: Figure) -> None:
    if fig.xscale not in SCALES or fig.yscale not in SCALES:
        raise RenderError(f"figure {fig.name!r}: xscale/yscale must be one of {SCALES}, "
                          f"got {fig.xscale!r}/{fig.yscale!r}")
    for s in fig.series:
        if s.style not in SERIES_STYLES:
            raise RenderError(f"figure {fig.name!r}, series {s.label!r}: style must be one of "
                              f"{SERIES_STYLES}, got {s.style!r}")
        if len(s.x) != len(s.y):
            raise RenderError(f"figure {fig.name!r}, series {s.label!r}: x has {len(s.x)} points "
                              f"but y has {len(s.y)}; give one y per x")


def _label_tokens(label: str) -> set[str]:
    return set(re.split(r"[\s,;:()]+", label.lower())) - {""}


def series_colours(series: list[Series]) -> list[int]:
    """Palette index of each series, pairing measured points with their prediction.

    Lines (``line`` and ``dashed``) take successive colours.  A ``points`` series takes the
    colour of the line whose label shares the most words with its own ("measured m=3,
    sigma=0" with "theory m=3"; "full task 1" with "reduced task 1"), when that line is
    unique; otherwise the k-th points series takes the colour of the k-th line, or a colour
    no line uses."""
    line_indices = [j for j, s in enumerate(series) if s.style != "points"]
    line_colour = {j: c for c, j in enumerate(line_indices)}
    colours, unmatched = [], 0
    for j, s in enumerate(series):
        if s.style != "points":
            colours.append(line_colour[j])
            continue
        tokens = _label_tokens(s.label)
        overlaps = [(len(tokens & _label_tokens(series[i].label)), i) for i in line_indices]
        best = max((o for o, _ in overlaps), default=0)
        winners = [i for o, i in overlaps if o == best]
        if best > 0 and len(winners) == 1:
            colours.append(line_colour[winners[0]])
        else:
            colours.append(unmatched if unmatched < len(line_indices) else len(line_indices) + unmatched)
            unmatched += 1
    return colours


def _draw_lines(ax, fig: Figure) -> None:
    _check_lines(fig)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for span_index, span in enumerate(fig.spans):
        try:
            x0, x1 = _number(span["x0"]), _number(span["x1"])
        except KeyError as exc:
            raise RenderError(f"figure {fig.name!r}: a span needs keys 'x0', 'x1' (and 'label'); "
                              f"missing {exc}") from None
        if math.isfinite(x0) and math.isfinite(x1):
            ax.axvspan(x0, x1, color=SPAN_COLOURS[span_index % len(SPAN_COLOURS)], alpha=0.8,
                       zorder=0, lw=0, label=span.get("label") or None)
    colours = series_colours(fig.series)
    for s, colour_index in zip(fig.series, colours):
        colour = palette[colour_index % len(palette)]
        x = [_number(v) for v in s.x]
        y = [_number(v) for v in s.y]
        # Hollow markers under the lines: a prediction drawn through its measurements stays
        # visible even where the points are dense.
        if s.style == "points":
            ax.plot(x, y, linestyle="none", marker="o", markersize=4.5, markerfacecolor="none",
                    markeredgewidth=1.0, color=colour, label=s.label, zorder=2)
        elif s.style == "dashed":
            ax.plot(x, y, linestyle="--", lw=1.4, color=colour, label=s.label, zorder=3)
        else:
            ax.plot(x, y, linestyle="-", lw=1.4, color=colour, label=s.label, zorder=3)
    for line_index, hline in enumerate(fig.hlines):
        if "y" not in hline:
            raise RenderError(f"figure {fig.name!r}: an hline needs key 'y' (and 'label')")
        y = _number(hline["y"])
        if math.isfinite(y):
            ax.axhline(y, color=HLINE_COLOURS[line_index % len(HLINE_COLOURS)], lw=1.2,
                       linestyle=":", label=hline.get("label") or None, zorder=1)
    ax.set_xscale(fig.xscale)
    ax.set_yscale(fig.yscale)
    for axis, scale in ((ax.xaxis, fig.xscale), (ax.yaxis, fig.yscale)):
        if scale == "log":
            _log_ticks(axis)
    ax.set_xlabel(fig.xlabel)
    ax.set_ylabel(fig.ylabel)
    ax.set_title(fig.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles, labels = handles[:LEGEND_MAX], labels[:LEGEND_MAX]
    if labels:
        if len(labels) <= LEGEND_INSIDE_MAX:
            ax.legend(handles, labels, fontsize=7, loc="best", framealpha=0.85)
        else:
            ax.legend(handles, labels, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      borderaxespad=0, ncol=1 + len(labels) // 24)


def _log_ticks(axis) -> None:
    """Plain-number tick labels at 1, 2, 5 x 10^k on a log axis spanning at most two decades
    (1, 2, 3, 5 x 10^k within one), decades only on wider axes: Matplotlib's default labels
    of minor ticks on short log axes (3x10^-2 next to 4x10^-2) overlap."""
    lo, hi = axis.get_view_interval()
    if not (lo > 0 and hi > lo and math.isfinite(hi)):
        return
    plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    decades = math.log10(hi / lo)
    if decades <= 2:
        subs = (2.0, 3.0, 5.0) if decades <= 1 else (2.0, 5.0)
        axis.set_minor_locator(ticker.LogLocator(base=10, subs=subs))
        axis.set_minor_formatter(plain)
    else:
        axis.set_minor_formatter(ticker.NullFormatter())


def _draw_heatmap(fig_mpl, ax, fig: Figure) -> None:
    if not fig.matrix or not all(isinstance(row, (list, tuple)) and row for row in fig.matrix):
        raise RenderError(f"figure {fig.name!r}: a heatmap needs a non-empty matrix (list of rows)")
    widths = {len(row) for row in fig.matrix}
    if len(widths) != 1:
        raise RenderError(f"figure {fig.name!r}: heatmap rows have different lengths {sorted(widths)}")
    rows, cols = len(fig.matrix), widths.pop()
    if fig.row_labels and len(fig.row_labels) != rows:
        raise RenderError(f"figure {fig.name!r}: {len(fig.row_labels)} row labels for {rows} rows")
    if fig.col_labels and len(fig.col_labels) != cols:
        raise RenderError(f"figure {fig.name!r}: {len(fig.col_labels)} column labels for {cols} columns")
    values = [[_number(v) for v in row] for row in fig.matrix]
    finite = [v for row in values for v in row if math.isfinite(v)]
    if finite and min(finite) < 0 < max(finite):
        # signed values (e.g. the merged parametrisation's superposition): a diverging map
        # centred on zero, so that sign is read off the colour
        bound = max(abs(v) for v in finite)
        image = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        mid = None
    else:
        image = ax.imshow(values, cmap="viridis", aspect="auto")
        mid = (min(finite) + max(finite)) / 2 if finite else 0.0
    fig_mpl.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if cols <= HEATMAP_LABELS_MAX:  # beyond that the labels overlap: Matplotlib's own ticks
        ax.set_xticks(range(cols), fig.col_labels or [str(j) for j in range(cols)], fontsize=8)
    if rows <= HEATMAP_LABELS_MAX:
        ax.set_yticks(range(rows), fig.row_labels or [str(i) for i in range(rows)], fontsize=8)
    if rows * cols <= 144:  # beyond that the numbers would not fit in their cells
        bound = max((abs(v) for v in finite), default=1.0)
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if not math.isfinite(v):
                    dark_cell = False  # imshow leaves non-finite cells blank (white)
                elif mid is None:
                    dark_cell = abs(v) > 0.6 * bound
                else:
                    dark_cell = v < mid
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8,
                        color="white" if dark_cell else "black")
    ax.set_xlabel(fig.xlabel)
    ax.set_ylabel(fig.ylabel)
    ax.set_title(fig.title, fontsize=10)


def figure_png(figure: Any, dpi: int = 110) -> bytes:
    """PNG bytes of one figure. Raises :class:`RenderError` saying what is wrong with it."""
    fig = as_figure(figure)
    if fig.kind not in FIGURE_KINDS:
        raise RenderError(f"figure {fig.name!r}: kind must be one of {FIGURE_KINDS}, got {fig.kind!r}")
    if fig.kind == "panels":
        if not fig.panels:
            raise RenderError(f"figure {fig.name!r}: kind 'panels' needs a non-empty 'panels' list")
        for p in fig.panels:
            if p.kind != "lines":
                raise RenderError(f"figure {fig.name!r}: every panel must be of kind 'lines', got {p.kind!r}")
        # Side by side up to 4 panels; more wrap into rows of at most 4 (2H panels of
        # omega and mu per head give one row of omega and one of mu); beyond MAX_PANELS only
        # the first are drawn (size_note says so in the caption).
        n = min(len(fig.panels), MAX_PANELS)
        rows = math.ceil(n / 4)
        cols = math.ceil(n / rows)
        mpl_fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols + 1.0, 3.6 * rows + 0.4),
                                     squeeze=False, layout="constrained")
        try:
            for ax, panel in zip(axes.flat, fig.panels[:n]):
                _draw_lines(ax, panel)
            for ax in list(axes.flat)[n:]:
                ax.set_visible(False)
            mpl_fig.suptitle(fig.title, fontsize=11)
            return _png(mpl_fig, dpi)
        finally:
            plt.close(mpl_fig)
    mpl_fig, ax = plt.subplots(figsize=(6.4, 4.2))
    try:
        if fig.kind == "lines":
            _draw_lines(ax, fig)
        else:
            _draw_heatmap(mpl_fig, ax, fig)
        return _png(mpl_fig, dpi)
    finally:
        plt.close(mpl_fig)


def size_note(figure: Any) -> str:
    """What the size caps left out of a figure, for its caption ("" when nothing was)."""
    fig = as_figure(figure)
    notes = []
    if fig.kind == "panels" and len(fig.panels) > MAX_PANELS:
        notes.append(f"the first {MAX_PANELS} of its {len(fig.panels)} panels are drawn")
    for panel in ([fig] if fig.kind == "lines" else fig.panels[:MAX_PANELS] if fig.kind == "panels" else []):
        labelled = len([s for s in panel.series if s.label]) + len(panel.spans) + len(panel.hlines)
        if labelled > LEGEND_MAX:
            notes.append(f"the legend of {panel.name!r} lists the first {LEGEND_MAX} of {labelled} entries")
    return f"(Size cap: {'; '.join(notes)}; every value is in claims.json.)" if notes else ""


# Colours kept in a figure's PNG: Matplotlib's antialiased RGBA PNGs reduced to a 256-colour
# palette (no dithering) are about 2.7 times smaller and look the same; the tiny report's 16
# figures went from 511 kB to 189 kB, which keeps the quick report's page (figures inline as
# base64) well under 1 MB.
PNG_COLOURS = 256


def _png(mpl_fig, dpi: int) -> bytes:
    buffer = io.BytesIO()
    mpl_fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    buffer.seek(0)
    with Image.open(buffer) as image:
        image = image.convert("RGB")
        if image.width * image.height > MAX_PIXELS:
            scale = math.sqrt(MAX_PIXELS / (image.width * image.height))
            image = image.resize((max(1, int(image.width * scale)), max(1, int(image.height * scale))))
        palette = image.quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT,
                                               dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


# --------------------------------------------------------------------------- HTML


def format_value(v: Any) -> str:
    """A short readable form of a JSON value: 4 significant digits, lists inline."""
    if isinstance(v, bool) or v is None:
        return str(v).lower() if v is not None else "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        if len(v) > LIST_SHOWN_MAX:  # the full list is in claims.json; the page shows its ends
            head = ", ".join(format_value(x) for x in v[:LIST_SHOWN_EDGE])
            tail = ", ".join(format_value(x) for x in v[-LIST_SHOWN_EDGE:])
            return f"[{head}, … ({len(v)} values in claims.json) …, {tail}]"
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {format_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts to ``{"a.b.c": leaf}``; a list of dicts (e.g. one record per case) to
    ``a[0].b``, ``a[1].b``; other lists stay leaves (shown inline)."""
    if isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        flat: dict[str, Any] = {}
        for k, x in enumerate(d):
            flat.update(flatten(x, f"{prefix}[{k}]"))
        return flat
    if not isinstance(d, dict):
        return {prefix or "value": d}
    flat = {}
    for key, value in d.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if (isinstance(value, dict) and value) or (
                isinstance(value, list) and value and all(isinstance(x, dict) for x in value)):
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1.2em auto;
       max-width: 1150px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.5em; margin: 0 0 .2em; } h2 { margin-top: 2.2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin-bottom: .3em; }
table { border-collapse: collapse; margin: .6em 0; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.num { font-family: Menlo, Consolas, monospace; font-size: .9em; max-width: 32em; word-break: break-word; }
.badge { display: inline-block; padding: .1em .6em; border-radius: .8em; color: white;
         font-weight: bold; font-size: .85em; text-transform: uppercase; }
.pass { background: #1a7f37; } .fail { background: #cf222e; } .error { background: #8250df; }
.located { background: #0969da; } .contradicted { background: #bc4c00; } .undecided { background: #6e7781; }
.rejected { color: #1a7f37; font-weight: bold; } .accepted { color: #cf222e; font-weight: bold; }
.statement { background: #f6f8fa; border-left: 4px solid #888; padding: .5em 1em; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .85em; }
pre.traceback { background: #fff0f0; border: 1px solid #f3b5b5; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #333; } figcaption code { color: #777; font-size: .85em; }
.muted { color: #666; font-size: .9em; }
.banner { background: #fff4ce; border: 2px solid #d4a72c; padding: .4em 1em; font-weight: bold; margin: .4em 0; }
.warning { background: #fff0f0; border: 1px solid #f3b5b5; padding: .5em 1em; }
table.headline td.agree { color: #1a7f37; font-weight: bold; }
table.headline td.bound { color: #0969da; font-weight: bold; }
table.headline td.disagree { color: #cf222e; font-weight: bold; }
table.headline td.reported { color: #666; }
table.headline tr.config td { background: #f6f8fa; font-weight: bold; font-size: .9em; }
#findings h2 { margin-top: .6em; }
#findings .lists { display: grid; grid-template-columns: repeat(3, 1fr); gap: 0 1.4em; }
#findings h3 { margin: .2em 0; } #findings ul { margin: 0; padding-left: 1.1em; font-size: .92em; }
#findings li { margin-bottom: .35em; } #findings li a { font-size: .85em; color: #555; }
details > summary { cursor: pointer; color: #444; }
"""

BADGE_CLASSES = ("pass", "fail", "error", "located", "contradicted", "undecided")
# The headings of the summary and of the findings lists.
GROUPS = (("claims", "The paper's claims"), ("stops", "Where they stop"), ("beyond", "Beyond the paper"))
FINDING_HEADINGS = {"holds": "What holds", "stops": "Where it stops", "beyond": "Beyond the paper"}


def _badge(verdict: str) -> str:
    cls = verdict if verdict in BADGE_CLASSES else "error"
    return f'<span class="badge {cls}">{html.escape(str(verdict))}</span>'


def _esc(v: Any) -> str:
    return html.escape(format_value(v))


def _seconds(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else html.escape(str(v))


def kind_of(entry: dict) -> str:
    """``claim`` or ``boundary`` (an entry written before kinds existed: from its id)."""
    return entry.get("kind") or ("boundary" if str(entry.get("id", "")).startswith("boundary-") else "claim")


def group_of(entry: dict) -> str:
    """The summary group: ``claims`` (the paper's), ``beyond`` (a boundary all of whose findings
    are of kind "beyond": what the paper does not say), ``stops`` (the other boundaries)."""
    if kind_of(entry) == "claim":
        return "claims"
    kinds = {f.get("kind") for f in entry.get("findings") or [] if isinstance(f, dict)}
    return "beyond" if kinds == {"beyond"} else "stops"


def _verdict_reason(entry: dict) -> str:
    """Which rule of ``claims.base.judge`` (or of ``run_claim``) gave the verdict."""
    verdict = entry.get("verdict")
    details = entry.get("details") or {}
    reasons = {
        "pass": "theory and numerics agree within the tolerance, and every perturbed prediction was rejected.",
        "fail": "theory and numerics disagree beyond the tolerance (the numbers are below).",
        "located": "the regime was measured conclusively and theory's account of it agrees (the findings say "
                   "where and what happens).",
        "contradicted": "the regime was measured conclusively and theory's account of it disagrees (the numbers "
                        "below say by how much).",
    }
    if verdict in reasons:
        return reasons[verdict]
    if details.get("traceback"):
        return f"the check raised {details.get('error', 'an exception')} before reaching a verdict (traceback below)."
    if details.get("undecided"):
        return f"the measurement could not decide: {details['undecided']}"
    if any(not p.get("rejected") for p in entry.get("perturbations") or [] if isinstance(p, dict)):
        return ("a deliberately wrong prediction was accepted at the same tolerance: the check cannot "
                "discriminate, so its agreement is no evidence.")
    return "the check reported an error (see the details)." if verdict == "error" else "see the details."


def anchor(claim_id: str) -> str:
    return "claim-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in str(claim_id))


_anchor = anchor


def _number_text(v: Any) -> str:
    """A headline number: 4 significant digits; a bracket [low, high] as "between low and high"."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return f"between {format_value(v[0])} and {format_value(v[1])}"
    if v is None:
        return "—"
    return format_value(v)


SIDE_WORDS = {"not above": ("≤", "not above"), "not below": ("≥", "not below")}


def _bound(v: Any, side: str) -> Any:
    """The end of a bracket that a one-sided comparison uses."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return v[1] if side == "not above" else v[0]
    return v


def headline_cells(r: dict) -> tuple[str, str, str, str]:
    """The theory, measured, allowed-difference and agreement cells of a headline row, by its
    side: two-sided rows read "|Δ| ≤ tol" with a tick; one-sided rows "≤ theory (not above)" with
    a bound mark (never the two-sided tick); reported rows have no comparison and no tick."""
    side = r.get("side") or "two-sided"
    measured = _number_text(r.get("measured"))
    if r.get("se") is not None and r.get("measured") is not None:
        measured += f" ± {format_value(r.get('se'))}"
    tol = r.get("tolerance")
    agrees = r.get("agrees")
    if side == "reported":
        theory = "—" if r.get("theory") is None else f"{_number_text(r.get('theory'))} (for reference)"
        return (theory, measured, "—", "<td class='reported'>reported, no comparison</td>")
    if side in SIDE_WORDS:
        sign, words = SIDE_WORDS[side]
        theory = f"{sign} {_number_text(_bound(r.get('theory'), side))} ({words})"
        allowed = "—" if tol is None else (f"Δ ≤ +{format_value(tol)}" if side == "not above"
                                           else f"Δ ≥ −{format_value(tol)}")
        cell = (f"<td class='bound'>{words} ✓</td>" if agrees is True else
                f"<td class='disagree'>{'above' if side == 'not above' else 'below'} ✗</td>" if agrees is False
                else "<td>—</td>")
        return theory, measured, allowed, cell
    allowed = "—" if tol is None else f"|Δ| ≤ {format_value(tol)}"
    cell = ("<td class='agree'>yes ✓</td>" if agrees is True else
            "<td class='disagree'>no ✗</td>" if agrees is False else "<td>—</td>")
    return _number_text(r.get("theory")), measured, allowed, cell


def group_by_config(rows: list[dict]) -> list[tuple[Any, list[dict]]]:
    """Rows grouped by their ``config``, in order of first appearance (None first)."""
    groups: dict[Any, list[dict]] = {}
    for r in sorted(rows, key=lambda r: r.get("config") is not None):
        groups.setdefault(r.get("config"), []).append(r)
    return list(groups.items())


def headline_table(entry: dict) -> str:
    """The claim's headline rows (claims.base.HeadlineRow as dicts) as one small table: what
    theory predicts (by the row's side), what was measured (± its standard error), the allowed
    difference fixed before the comparison, and the outcome; rows grouped under a sub-heading
    per configuration.  Without headline rows: a short summary of the values theory and
    numerics share and of the tolerance."""
    rows = [r for r in entry.get("headline") or [] if isinstance(r, dict)]
    if not rows:
        return _short_summary(entry)
    body = []
    for config, group in group_by_config(rows):
        if config is not None:
            body.append(f"<tr class='config'><td colspan='5'>{html.escape(str(config))}</td></tr>")
        for r in group:
            theory, measured, allowed, cell = headline_cells(r)
            body.append(f"<tr data-side='{html.escape(str(r.get('side') or 'two-sided'))}'>"
                        f"<td>{html.escape(str(r.get('name', '')))}</td>"
                        f"<td class='num'>{html.escape(theory)}</td><td class='num'>{html.escape(measured)}</td>"
                        f"<td class='num'>{html.escape(allowed)}</td>{cell}</tr>")
    return ("<table class='headline'><tr><th>quantity</th><th>theory predicts</th>"
            "<th>measured (± s.e.)</th><th>allowed difference</th><th>agree?</th></tr>"
            + "".join(body) + "</table>")


SUMMARY_ROWS_MAX = 6
SUMMARY_WHY_MAX = 300  # characters of the tolerance's argument in the short summary
# More perturbation checks than this are folded under a one-line count.
PERTURBATIONS_SHOWN_MAX = 4


def _headline_count(entry: dict) -> str:
    """"2 of 3 agree" for the summary table; "—" without headline rows with a verdict."""
    judged = [r for r in entry.get("headline") or [] if isinstance(r, dict) and isinstance(r.get("agrees"), bool)
              and r.get("side") != "reported"]
    return f"{sum(r['agrees'] for r in judged)} of {len(judged)} agree" if judged else "—"


def _short_summary(entry: dict) -> str:
    theory = flatten(entry.get("theory") or {})
    numerics = flatten(entry.get("numerics") or {})
    shared = [k for k in theory if k in numerics][:SUMMARY_ROWS_MAX]
    tolerance = entry.get("tolerance") or {}
    parts = ["<p class='muted'>This claim gives no headline rows yet; in short:</p>"]
    if shared:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td class='num'>{_esc(theory[k])}</td>"
                       f"<td class='num'>{_esc(numerics[k])}</td></tr>" for k in shared)
        more = len(set(theory) | set(numerics)) - len(shared)
        parts.append("<table class='headline'><tr><th>quantity</th><th>theory predicts</th><th>measured</th></tr>"
                     f"{rows}</table>" + (f"<p class='muted'>({more} more values below.)</p>" if more > 0 else ""))
    if "value" in tolerance or "why" in tolerance:
        value = tolerance.get("value", "—")
        value_text = (_esc(value) if not isinstance(value, (dict, list)) or len(format_value(value)) <= 60
                      else "per case (the tolerance table below)")
        why = str(tolerance.get("why") or "")
        if len(why) > SUMMARY_WHY_MAX:
            why = why[:SUMMARY_WHY_MAX].rsplit(" ", 1)[0] + " … (in full below)"
        parts.append(f"<p>Allowed difference: <b>{value_text}</b>"
                     + (f" — {html.escape(why)}" if why else "") + "</p>")
    return "".join(parts) if len(parts) > 1 else ""


def _comparison_table(entry: dict) -> str:
    theory = flatten(entry.get("theory") or {})
    numerics = flatten(entry.get("numerics") or {})
    keys = list(theory) + [k for k in numerics if k not in theory]
    if not keys:
        return '<p class="muted">No theory or numerics values were returned.</p>'
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td class='num'>{_esc(theory[k]) if k in theory else '—'}</td>"
        f"<td class='num'>{_esc(numerics[k]) if k in numerics else '—'}</td></tr>"
        for k in keys
    )
    return f"<table><tr><th>quantity</th><th>theory</th><th>numerics</th></tr>{rows}</table>"


def _tolerance_table(entry: dict) -> str:
    tol = flatten(entry.get("tolerance") or {})
    if not tol:
        return '<p class="muted">No tolerance was given.</p>'
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td class='num'>{_esc(v)}</td></tr>" for k, v in tol.items())
    return f"<table><tr><th>tolerance</th><th>value / argument</th></tr>{rows}</table>"


def _perturbation_table(entry: dict) -> str:
    checks = entry.get("perturbations") or []
    if not checks:
        return '<p class="muted">No perturbation checks were run.</p>'
    rows = []
    for p in checks:
        rejected = bool(p.get("rejected"))
        mark = ('<span class="rejected">rejected ✓</span>' if rejected
                else '<span class="accepted">accepted ✗ (check cannot discriminate)</span>')
        detail = "<br>".join(f"{html.escape(k)} = {_esc(v)}" for k, v in flatten(p.get("details") or {}).items())
        rows.append(f"<tr><td>{html.escape(str(p.get('description', '')))}</td><td>{mark}</td>"
                    f"<td class='num'>{detail}</td></tr>")
    table = ("<table><tr><th>perturbed prediction</th><th>outcome</th><th>details</th></tr>"
             + "".join(rows) + "</table>")
    if len(checks) <= PERTURBATIONS_SHOWN_MAX:
        return table
    rejected = sum(bool(p.get("rejected")) for p in checks)
    cls = "rejected" if rejected == len(checks) else "accepted"
    return (f"<details><summary><span class='{cls}'>{rejected} of {len(checks)} perturbed predictions "
            f"rejected</span> (the table)</summary>{table}</details>")


def _details_block(entry: dict) -> str:
    details = dict(entry.get("details") or {})
    traceback_text = details.pop("traceback", None)
    parts = []
    if traceback_text:
        parts.append("<h3>Error</h3><pre class='traceback'>" + html.escape(str(traceback_text)) + "</pre>")
    flat = flatten(details)
    if flat:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td class='num'>{_esc(v)}</td></tr>" for k, v in flat.items())
        parts.append(f"<details><summary>Details ({len(flat)} entries)</summary><table>{rows}</table></details>")
    return "".join(parts)


def _figures_block(entry: dict, pngs: dict[str, bytes], figure_errors: Iterable[str]) -> str:
    parts = []
    for fig in entry.get("figures") or []:
        data = pngs.get(fig["file"])
        if data is None:
            continue
        uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        caption = fig.get("caption") or ""
        parts.append(f'<figure><img alt="{html.escape(fig["title"])}" src="{uri}">'
                     f"<figcaption><b>{html.escape(fig['title'])}.</b> {html.escape(caption)} "
                     f"<code>{html.escape(fig['file'])}</code></figcaption></figure>")
    for err in figure_errors:
        parts.append(f"<pre class='traceback'>figure not rendered: {html.escape(err)}</pre>")
    return "<h3>Figures</h3>" + "".join(parts) if parts else ""


PROBLEM_NAMES = {"sigma": "σ", "param": "parametrisation", "init_scale": "init scale s0",
                 "logit_scale": "logit scale s", "basis": "basis", "dtype": "dtype"}


def describe_problem(problem: dict) -> str:
    """A configuration in the paper's notation: ``r = (3, 3, 3), H = 3, L = 256, σ = 0.5``."""
    parts = []
    if "tasks" in problem:
        parts.append(f"r = ({', '.join(str(r) for r in problem['tasks'])})")
    if "heads" in problem:
        parts.append(f"H = {problem['heads']}")
    if "L" in problem:
        parts.append(f"L = {problem['L']}")
    parts += [f"{name} = {format_value(problem[key])}" for key, name in PROBLEM_NAMES.items() if key in problem]
    return ", ".join(parts)


def verdict_counts(claims: list[dict]) -> str:
    """"7 pass, 0 fail, 0 error; boundaries: 3 located, 1 contradicted, 1 undecided, 0 error"."""
    parts = []
    for kind, outcomes, label in (("claim", ("pass", "fail", "error"), ""),
                                  ("boundary", ("located", "contradicted", "undecided", "error"), "boundaries: ")):
        of_kind = [c for c in claims if kind_of(c) == kind]
        if of_kind or kind == "claim":
            parts.append(label + ", ".join(f"{sum(c['verdict'] == v for c in of_kind)} {v}" for v in outcomes))
    return "; ".join(parts)


def _run_summary(report: dict) -> str:
    """Profile, configuration, which claims ran where, skipped sweep points, a re-render: what a
    reader must know before reading any verdict."""
    prov = report["provenance"]
    claims = report["claims"]
    parts = []
    problem = prov.get("problem")
    ran_at = prov.get("ran_at") or {}
    if problem:
        at = ran_at.get("configuration") or []
        rest = ran_at.get("profile") or []
        parts.append(f"<p>Configuration audited: <b>{html.escape(describe_problem(problem))}</b>. "
                     f"Run at this configuration: {html.escape(', '.join(at)) if at else 'no claim'}"
                     + (f"; at profile {html.escape(str(prov.get('profile')))} (they cannot take a "
                        f"configuration): {html.escape(', '.join(rest))}" if rest else "") + ".</p>")
    else:
        parts.append(f"<p>Every claim ran at its own configurations of profile "
                     f"<b>{html.escape(str(prov.get('profile')))}</b>.</p>")
    parts.append(f"<p>Profile <b>{html.escape(str(prov.get('profile')))}</b>, device "
                 f"<b>{html.escape(str(prov.get('device')))}</b>, seed {html.escape(str(prov.get('seed')))}: "
                 f"{html.escape(verdict_counts(claims))}.</p>")
    skipped = prov.get("sweep_skipped") or []
    if skipped:
        items = "".join(f"<li><code>{html.escape(str(p.get('file')))}</code>: {html.escape(str(p.get('reason')))}</li>"
                        for p in skipped)
        parts.append(f"<div class='warning'><b>{len(skipped)} point file(s) of the sweep "
                     f"{html.escape(str(prov.get('sweep')))} could not be read and were left out</b> "
                     f"(the claims reading the sweep did not see them):<ul>{items}</ul></div>")
    rerendered = prov.get("rerendered")
    if rerendered:
        parts.append(f"<p class='muted'>Re-rendered from {html.escape(str(rerendered.get('from')))} at "
                     f"{html.escape(str(rerendered.get('at_utc')))}; the numbers are those of the original "
                     f"run of {html.escape(str(prov.get('started_utc')))}.</p>")
    return "".join(parts)


def findings_section(report: dict) -> str:
    """The first screen: the findings of every claim (claims.json's top-level ``findings``) in
    three short lists, what holds / where it stops / beyond the paper, each sentence linked to
    its claim's section."""
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    lists = []
    for kind, heading in FINDING_HEADINGS.items():
        items = "".join(f"<li>{html.escape(str(f.get('text', '')))} <a href='#{anchor(f.get('claim', ''))}'>"
                        f"{html.escape(str(f.get('claim', '')))}</a></li>"
                        for f in findings if f.get("kind") == kind)
        lists.append(f"<div><h3>{heading}</h3>" + (f"<ul>{items}</ul>" if items else
                                                    "<p class='muted'>none</p>") + "</div>")
    if not findings:
        note = ("<p class='muted'>No findings recorded: this claims.json was written before claims "
                "stated their findings; the verdicts are below.</p>")
        return f"<section id='findings'><h2>Findings</h2>{note}</section>"
    return f"<section id='findings'><h2>Findings</h2><div class='lists'>{''.join(lists)}</div></section>"


def summary_tables(claims: list[dict]) -> str:
    """The summary, grouped: the paper's claims, where they stop, beyond the paper."""
    parts = []
    for group, heading in GROUPS:
        rows = "".join(
            f"<tr><td><a href='#{anchor(c['id'])}'>{html.escape(c['id'])}</a></td>"
            f"<td>{html.escape(c['title'])}</td><td>{_badge(c['verdict'])}</td>"
            f"<td>{html.escape(_headline_count(c))}</td>"
            f"<td class='num'>{_seconds(c.get('seconds', ''))}</td></tr>"
            for c in claims if group_of(c) == group)
        if rows:
            parts.append(f"<h3>{html.escape(heading)}</h3><table><tr><th>id</th><th>title</th><th>outcome</th>"
                         f"<th>headline</th><th>seconds</th></tr>{rows}</table>")
    return "<h2>Summary</h2>" + "".join(parts)


def render_html(report: dict, pngs: dict[str, bytes]) -> str:
    """The page of a ``claims.json`` document; ``pngs`` maps each figure's file name (as in
    ``claims[*].figures[*].file``) to its PNG bytes, embedded as data URIs.  The findings come
    first, then the grouped summary, then one section per claim."""
    claims = report["claims"]
    prov = report["provenance"]
    prov_rows = "".join(f"<tr><td>{html.escape(k)}</td><td class='num'>{_esc(v)}</td></tr>"
                        for k, v in flatten(prov).items())
    at_configuration = set((prov.get("ran_at") or {}).get("configuration") or []) if prov.get("problem") else set()
    sections = []
    for c in claims:
        where = ("ran at the audited configuration" if c["id"] in at_configuration
                 else f"ran at profile {prov.get('profile')}")
        own = "".join(f"<li>{html.escape(str(f.get('text', '')))}</li>" for f in c.get("findings") or []
                      if isinstance(f, dict))
        sections.append(
            f"<section id='{anchor(c['id'])}'>"
            f"<h2>{html.escape(c['title'])} {_badge(c['verdict'])}</h2>"
            f"<p class='muted'>id <code>{html.escape(c['id'])}</code> · {html.escape(kind_of(c))} · "
            f"{html.escape(where)} · {_seconds(c.get('seconds', ''))} s</p>"
            f"<div class='statement'>{html.escape(c['statement'])}</div>"
            + (f"<ul class='own-findings'>{own}</ul>" if own else "") +
            f"<p><b>Outcome {html.escape(str(c['verdict']))}:</b> {html.escape(_verdict_reason(c))}</p>"
            f"{headline_table(c)}"
            f"<h3>Perturbation checks</h3>{_perturbation_table(c)}"
            f"{_figures_block(c, pngs, c.get('figure_errors') or [])}"
            f"<details><summary>All theory and numerics values, the tolerance</summary>"
            f"{_comparison_table(c)}{_tolerance_table(c)}</details>"
            f"{_details_block(c)}"
            "</section>"
        )
    title = "Audit: Training Dynamics of Multi-Head Softmax Attention for In-Context Learning"
    banner = ("<p class='banner'>Profile tiny: these verdicts are smoke tests of the pipeline, not evidence. "
              "The configurations are too small and the runs too short for the comparisons to mean "
              "anything; use the quick or paper profile.</p>" if prov.get("profile") == "tiny" else "")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{banner}"
        + findings_section(report) +
        "<p class='muted'>Chen, Sheen, Wang, Yang (COLT 2024). Each claim of the paper is checked by "
        "running the model (numerics) against the derived prediction (theory) at a tolerance whose "
        "argument is stated; each check is also run against a deliberately wrong prediction, which "
        "must be rejected. A boundary is where a claim stops, or what the paper does not say: it is "
        "located (measured, theory's account agrees), contradicted, or undecided.</p>"
        + _run_summary(report) + summary_tables(claims)
        + f"<details><summary>Provenance</summary><table>{prov_rows}</table></details>"
        + "".join(sections)
        + "</body></html>\n"
    )
