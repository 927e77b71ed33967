"""Figures: ``claims.core.base.Figure`` data to PNG, and the report's forest plot of every comparison.

Nothing here computes a result: every number drawn comes from a ``claims.core.base.ClaimResult`` (a
claim's ``Figure`` data) or from ``claims.json`` (the forest plot); this module only chooses how
it looks.

- :func:`figure_png` draws a ``claims.core.base.Figure`` (kinds ``"lines"``, ``"heatmap"``,
  ``"panels"``, ``"mix"``) with Matplotlib's Agg backend and returns the PNG bytes.
- :func:`forest_rows` reads every comparison of a ``claims.json`` document
  (``details["comparisons"]`` of each claim; its judged headline rows where a claim recorded
  none) as one row of the forest plot; :func:`forest_svg` / :func:`forest_png` draw them: the
  normalised error (measured - predicted) / tolerance with se / tolerance as a bar, the band
  [-1, 1] shaded, one-sided checks as arrows against their bound.

Colour convention of ``"lines"`` figures (:func:`series_colours`): lines take successive
colours, and each measured ``points`` series takes the colour of the line whose label it
shares most words with (``"full task 1"`` with ``"reduced task 1"``), so a measurement and
its prediction are drawn in the same colour; on a tie, points and lines are paired in order.
"""
from __future__ import annotations

import dataclasses
import io
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

# files only, never a display (the report runs on headless machines): Agg, whatever MPLBACKEND says --
# a bad value there would otherwise stop `import matplotlib` itself with a traceback
os.environ["MPLBACKEND"] = "Agg"
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
from PIL import Image  # noqa: E402 - Matplotlib's own dependency

from claims.core.base import Figure, Series  # noqa: E402

FIGURE_KINDS = ("lines", "heatmap", "panels", "mix")
SERIES_STYLES = ("line", "points", "dashed")
SCALES = ("linear", "log")

# Shading of successive spans (warm-up, emergence, convergence): light, distinct, and
# legible under the lines drawn on top.
SPAN_COLOURS = ("#fde0c5", "#c9e4f6", "#d5efd0", "#eadcf2", "#f6f2c4")
HLINE_COLOURS = ("#444444", "#b2182b", "#2166ac", "#1b7837")
# More than this many legend entries would cover the axes; the legend moves outside.
LEGEND_INSIDE_MAX = 8
# Size caps of a figure (a figure of 400 panels would be a 92-megapixel PNG): at most
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
        raise RenderError(f"a figure must be a claims.core.base.Figure or a dict, got {type(obj).__name__}")
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


MIX_COLOURS = ("#1b7837", "#762a83", "#e08214", "#2166ac", "#bdbdbd", "#b2182b", "#35978f", "#8c510a")


def _draw_mix(ax, fig: Figure) -> None:
    """A class mix: one horizontal stacked bar per row (``row_labels``: a start), one segment
    per column (``col_labels``: a class) of length ``matrix[row][col]`` (a count), its count
    written inside; classes coloured in column order."""
    if not fig.matrix or not all(isinstance(row, (list, tuple)) for row in fig.matrix):
        raise RenderError(f"figure {fig.name!r}: a mix needs a non-empty matrix (a list of rows of counts)")
    cols = len(fig.col_labels)
    if cols == 0 or any(len(row) != cols for row in fig.matrix):
        raise RenderError(f"figure {fig.name!r}: a mix needs one column label per count of every row "
                          f"({cols} labels)")
    if len(fig.row_labels) != len(fig.matrix):
        raise RenderError(f"figure {fig.name!r}: {len(fig.row_labels)} row labels for {len(fig.matrix)} rows")
    values = [[_number(v) for v in row] for row in fig.matrix]
    if any(not math.isfinite(v) or v < 0 for row in values for v in row):
        raise RenderError(f"figure {fig.name!r}: a mix's counts must be finite and >= 0")
    rows = len(values)
    left = [0.0] * rows
    for j, label in enumerate(fig.col_labels):
        width = [row[j] for row in values]
        bars = ax.barh(range(rows), width, left=left, color=MIX_COLOURS[j % len(MIX_COLOURS)], label=str(label),
                       edgecolor="white")
        for bar, w in zip(bars, width):
            if w > 0:
                ax.text(bar.get_x() + w / 2, bar.get_y() + bar.get_height() / 2, f"{w:g}", ha="center",
                        va="center", fontsize=8, color="white")
        left = [a + w for a, w in zip(left, width)]
    ax.set_yticks(range(rows), [str(r) for r in fig.row_labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(fig.xlabel)
    ax.set_ylabel(fig.ylabel)
    ax.set_title(fig.title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


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
        elif fig.kind == "mix":
            _draw_mix(ax, fig)
            mpl_fig.tight_layout()
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


# --------------------------------------------------------------------------- the forest plot


@dataclass(frozen=True)
class ForestRow:
    """One comparison of a report as the forest plot draws it.

    ``value`` is the normalised error (measured - predicted) / tolerance where the comparison
    compares two numbers in the units of its tolerance (``signed``), else its error /
    tolerance (the |normalised error|: the comparison of lists, brackets or dicts, or an error
    in other units); ``bar`` is se / tolerance (None: no standard error, or not in the
    tolerance's units); ``side`` one of two-sided / not above / not below."""

    claim: str
    name: str
    config: Optional[str]
    side: str
    value: float
    bar: Optional[float]
    signed: bool
    agrees: Optional[bool]


ONE_SIDED = ("not above", "not below")
# Agreement is |value| <= 1; values beyond FOREST_CLIP are drawn at the edge with their number.
FOREST_CLIP = 3.0
# Within this relative difference an error is the side's error function of (measured, predicted):
# the comparison is in the measured value's units and (measured - predicted) / tolerance means what
# it says; otherwise only error / tolerance is drawn.
SAME_ERROR = 1e-9
FOREST_FILE = "figures/forest.png"   # written beside the claims' figures (README links it)
AGREE_COLOUR, DISAGREE_COLOUR, BAND_COLOUR = "#0969da", "#cf222e", "#dcefdc"


def scalar(v: Any) -> Optional[float]:
    """A float from a JSON number (or ``jsonable``'s "nan"/"inf" strings); None for anything else."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return None


def comparison_records(entry: dict) -> list[dict]:
    """The comparisons of one claims.json entry: ``details["comparisons"]`` (each a
    ``claims.core.common.Comparison.summary()``), or, for a claim that recorded none (older
    reports), its judged headline rows read as comparisons (theory as the prediction, no
    stored error).  Reported rows are no comparison and never appear."""
    details = entry.get("details") if isinstance(entry.get("details"), dict) else {}
    stored = [c for c in details.get("comparisons") or [] if isinstance(c, dict)]
    if stored:
        return stored
    return [{"name": r.get("name", ""), "measured": r.get("measured"), "predicted": r.get("theory"),
             "error": None, "tolerance": r.get("tolerance"), "agrees": r.get("agrees"),
             "side": r.get("side") or "two-sided", "config": r.get("config"), "se": r.get("se"),
             "resolving_power": r.get("resolving_power")}
            for r in entry.get("headline") or []
            if isinstance(r, dict) and r.get("side") != "reported" and isinstance(r.get("agrees"), bool)]


def forest_row(claim_id: str, c: dict) -> Optional[ForestRow]:
    """The forest row of one comparison record (None where it has no tolerance to normalise by)."""
    measured, predicted = scalar(c.get("measured")), scalar(c.get("predicted"))
    error, tolerance, se = scalar(c.get("error")), scalar(c.get("tolerance")), scalar(c.get("se"))
    side = c.get("side") or "two-sided"
    if tolerance is None or math.isnan(tolerance) or tolerance < 0:
        return None
    agrees = c.get("agrees") if isinstance(c.get("agrees"), bool) else None
    common = dict(claim=claim_id, name=str(c.get("name", "")), config=c.get("config"), side=side, agrees=agrees)
    if measured is not None and predicted is not None and math.isfinite(measured) and math.isfinite(predicted):
        d = measured - predicted
        own = abs(d) if side == "two-sided" else max(0.0, d) if side == "not above" else max(0.0, -d)
        if error is None or abs(own - error) <= SAME_ERROR * max(abs(own), abs(error), 1e-300):
            if tolerance > 0:
                bar = se / tolerance if se is not None and math.isfinite(se) and se > 0 else None
                return ForestRow(value=d / tolerance, bar=bar, signed=True, **common)
            return ForestRow(value=0.0 if d == 0 else math.copysign(math.inf, d), bar=None, signed=True, **common)
    if error is None or math.isnan(error):
        return None
    if tolerance > 0:
        value = error / tolerance
    else:
        value = 0.0 if error <= 0 else math.inf
    return ForestRow(value=value, bar=None, signed=False, **common)


def forest_rows(report: dict, order: Optional[list[str]] = None) -> tuple[list[ForestRow], int]:
    """The forest rows of a claims.json document, claims in ``order`` (ids; default report
    order), and how many comparisons could not be drawn (no tolerance or error to normalise)."""
    entries = {e.get("id"): e for e in report.get("claims") or [] if isinstance(e, dict)}
    ids = [cid for cid in (order or list(entries)) if cid in entries]
    rows, left_out = [], 0
    for cid in ids:
        for c in comparison_records(entries[cid]):
            row = forest_row(cid, c)
            if row is None:
                left_out += 1
            else:
                rows.append(row)
    return rows, left_out


def _forest_layout(rows: list[ForestRow]) -> tuple[list[float], list[tuple[str, float, float]]]:
    """The y of every row (top to bottom) and each claim's (id, y top, y bottom): rows one unit
    apart, a gap between claims, at least 1.8 units per claim (so that the labels of claims with
    a single comparison do not overlap)."""
    ys, groups, y = [], [], 0.0
    k = 0
    while k < len(rows):
        cid = rows[k].claim
        n = 1
        while k + n < len(rows) and rows[k + n].claim == cid:
            n += 1
        height = max(float(n), 1.8)
        pad = (height - n) / 2
        ys += [y + pad + j + 0.5 for j in range(n)]
        groups.append((cid, y, y + height))
        y += height + 0.8
        k += n
    return ys, groups


def _forest_label(claim_id: str) -> str:
    return claim_id[len("boundary-"):] if claim_id.startswith("boundary-") else claim_id


FOREST_MAX_ROWS = 400
"""The most rows the forest plot draws (the quick report has about 100): a hand-made report of
20,000 comparisons would make a figure of 3,000 inches (hundreds of megapixels, minutes to draw);
beyond, the first rows in the scorecard's order (failing claims first) are drawn and the caption
says how many were left out (``reports.render.forest_caption``)."""


def forest_figure(rows: list[ForestRow], width: float = 5.4):
    """The Matplotlib figure of the forest plot (the caller saves and closes it): at most
    :data:`FOREST_MAX_ROWS` rows."""
    rows = rows[:FOREST_MAX_ROWS]
    ys, groups = _forest_layout(rows)
    total = (groups[-1][2] if groups else 1.0)
    height = 1.05 + 0.066 * total
    fig, ax = plt.subplots(figsize=(width, height))
    fig.subplots_adjust(left=0.33, right=0.97, top=1 - 0.55 / height, bottom=0.42 / height)
    for j, (cid, top, bottom) in enumerate(groups):
        if j % 2:  # every other claim on a grey ground, under the band
            ax.axhspan(top - 0.4, bottom + 0.4, color="#f0f0f0", zorder=0, lw=0)
    ax.axvspan(-1, 1, color=BAND_COLOUR, alpha=0.75, zorder=0.5, lw=0)
    ax.axvline(0, color="#888888", lw=0.6, zorder=1)
    clip = FOREST_CLIP
    styles: dict[tuple, list[tuple[float, float]]] = {}
    for row, y in zip(rows, ys):
        colour = DISAGREE_COLOUR if row.agrees is False else AGREE_COLOUR
        x = max(-clip, min(clip, row.value)) if math.isfinite(row.value) or math.isinf(row.value) else 0.0
        if abs(row.value) > clip:
            ax.annotate(f"{row.value:.3g}".replace("-", "−") if math.isfinite(row.value)
                        else ("∞" if row.value > 0 else "−∞"), (x, y),
                        xytext=(-3 if row.value > 0 else 3, 0), textcoords="offset points",
                        ha="right" if row.value > 0 else "left", va="center", fontsize=5.5, color=colour)
        if row.bar is not None and abs(row.value) <= clip:
            ax.plot([max(-clip, x - row.bar), min(clip, x + row.bar)], [y, y], color=colour, lw=0.9, zorder=2,
                    solid_capstyle="butt")
        if row.side in ONE_SIDED:
            bound = 1.0 if (row.side == "not above" or not row.signed) else -1.0
            ax.plot([x, bound], [y, y], color=colour, lw=0.5, linestyle=":", zorder=2)
            ax.plot([bound], [y], marker="|", markersize=5, color=colour, zorder=3)
            marker = "<" if bound > 0 else ">"
        elif abs(row.value) > clip:
            marker = ">" if row.value > 0 else "<"
        else:
            marker = "o"
        filled = row.signed
        styles.setdefault((marker, colour, filled), []).append((x, y))
    for (marker, colour, filled), points in styles.items():
        xs, yy = zip(*points)
        ax.plot(xs, yy, linestyle="none", marker=marker, markersize=3.6, color=colour, zorder=4,
                markerfacecolor=colour if filled else "white", markeredgewidth=0.8)
    ax.set_xlim(-clip - 0.25, clip + 0.25)
    ax.set_ylim(total + 0.3, -0.3)
    ax.set_yticks([(top + bottom) / 2 for _, top, bottom in groups], [_forest_label(g[0]) for g in groups],
                  fontsize=7)
    ax.tick_params(axis="y", length=0)
    ax.set_xticks([-3, -2, -1, 0, 1, 2, 3])
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("(measured − predicted) / tolerance", fontsize=7.5)
    ax.grid(False)
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    handles = [
        plt.Line2D([], [], linestyle="none", marker="o", color=AGREE_COLOUR, markersize=4, label="agrees"),
        plt.Line2D([], [], linestyle="none", marker="o", color=DISAGREE_COLOUR, markersize=4, label="disagrees"),
        plt.Line2D([], [], linestyle="none", marker="o", color="#555555", markerfacecolor="white", markersize=4,
                   label="|error| / tol (not scalars)"),
        plt.Line2D([], [], linestyle="none", marker="<", color="#555555", markersize=4, label="one-sided, bound |"),
    ]
    fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=6.5, frameon=False,
               bbox_to_anchor=(0.62, 1.0), handletextpad=0.3, columnspacing=1.0)
    return fig


def forest_svg(rows: list[ForestRow]) -> str:
    """The forest plot as an inline ``<svg>`` element (text kept as text, no script): the page
    embeds it, so it is drawn crisp at any size and counts as no claim figure."""
    fig = forest_figure(rows)
    try:
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "forest"}):
            buffer = io.StringIO()
            fig.savefig(buffer, format="svg", facecolor="white", metadata={"Date": None})
    finally:
        plt.close(fig)
    text = buffer.getvalue()
    start = text.index("<svg")
    svg = text[start:]
    # the page sizes it by CSS (its viewBox is kept): drop the fixed width and height in pt
    svg = re.sub(r'^<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1', svg, count=1)
    return svg.replace("<svg", '<svg id="forest-plot" role="img" aria-label="forest plot of every comparison"', 1)


def forest_png(rows: list[ForestRow], dpi: int = 150) -> bytes:
    """The forest plot as PNG bytes (the file the README links)."""
    fig = forest_figure(rows)
    try:
        return _png(fig, dpi)
    finally:
        plt.close(fig)
