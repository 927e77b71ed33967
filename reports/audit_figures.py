"""The audit page's figures, drawn from the numbers of its claims.json (nothing computed here).

- :func:`bars_png`: per head, the bars of omega[h, i] and mu[h, i] by task (one panel each);
- :func:`ladder_png`: the loss ladder, the model's held-out loss with its error bar among theory's
  reference points (allocated fixed point, one-head optimum, best decomposable of the same H with
  its error bar, linear attention), in this project's units;
- :func:`trajectory_png`: a run's loss against time (the measured phases shaded; theory's curve from
  the first checkpoint, labelled with its offset from the exact fixed point where it exceeds the
  tolerance, that fixed point's level and the judged phase ends, where they apply) and the OV
  values mu[h, i] against time.

matplotlib's Agg backend, PNG bytes; a figure that cannot be drawn raises, and the caller lists it
on the page instead of stopping the report.
"""
from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REFERENCE_LABELS = {"allocated_fixed_point": "allocated fixed point", "one_head_optimum": "one-head optimum",
                    "best_decomposable": "best decomposable (same H)", "linear_attention": "linear attention"}
REFERENCE_COLOURS = {"allocated_fixed_point": "tab:blue", "one_head_optimum": "tab:orange",
                     "best_decomposable": "tab:green", "linear_attention": "tab:purple"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _number(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def bars_png(entry: dict) -> bytes:
    """omega and mu of one model entry, grouped by head, one bar per task."""
    om, mu = entry["readout"]["omega"], entry["readout"]["mu"]
    H, m = len(om), len(om[0])
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.2))
    width = 0.8 / m
    for ax, values, what in ((axes[0], om, "omega[h, i] (QK)"), (axes[1], mu, "mu[h, i] (OV)")):
        for i in range(m):
            ax.bar([h + (i - (m - 1) / 2) * width for h in range(H)], [values[h][i] for h in range(H)], width,
                   label=f"task {i}")
        ax.axhline(0.0, color="black", lw=0.6)
        ax.set_xticks(range(H), [f"head {h}" for h in range(H)])
        ax.set_title(what)
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(entry["checkpoint"]["name"], fontsize=10)
    return _png(fig)


def ladder_png(entry: dict) -> bytes:
    """The model's loss with its error bar (Z = 4 standard errors drawn as the bar, 1 as the box)
    among theory's reference points; a reference that could not be computed is named below."""
    loss = entry["held_out_loss"] or entry["projected_loss"]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    missing = []
    for k, label in REFERENCE_LABELS.items():
        r = entry["theory"].get(k, {})
        if not r.get("available"):
            missing.append(label)
            continue
        y, se = r["loss"], r.get("se") or 0.0
        ax.axhline(y, color=REFERENCE_COLOURS[k], lw=1.4, label=f"{label}: {y:.4g}")
        if se:
            ax.axhspan(y - 4 * se, y + 4 * se, color=REFERENCE_COLOURS[k], alpha=0.15)
    ax.errorbar([0.0], [loss["mean"]], yerr=[[4 * loss["se"]], [4 * loss["se"]]], fmt="o", color="black",
                capsize=6, label=f"this model: {loss['mean']:.4g} ± {loss['se']:.2g} (bar: 4 se)")
    ax.set_xlim(-1.0, 1.0)
    ax.set_xticks([])
    ax.set_ylabel("loss (sum over the m tasks)")
    title = f"loss ladder: {entry['checkpoint']['name']}"
    if missing:
        title += f"\n(not computed: {', '.join(missing)})"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


def trajectory_png(t, loss, se, mu, theory=None, phases=None, title="") -> bytes:
    """Loss against time (points with 1 se bars, the measured phases shaded; ``theory``: its curve with
    its label, the exact fixed point's level and the judged phase ends, dashed with their tolerances
    shaded) and the OV values mu[h, i] against time."""
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.6))
    ax = axes[0]
    if se is not None:
        ax.errorbar(t, loss, yerr=se, fmt="o", ms=3, label="held-out loss")
    else:
        ax.plot(t, loss, "o", ms=3, label="recorded loss")
    if phases and _number(phases.get("warmup_end")) is not None and _number(phases.get("emergence_end")) is not None:
        ax.axvspan(t[0], phases["warmup_end"], color="tab:gray", alpha=0.12, label="warm-up (measured)")
        ax.axvspan(phases["warmup_end"], phases["emergence_end"], color="tab:red", alpha=0.10, label="emergence")
    if theory:
        ax.plot(theory["t"], theory["loss"], "-", lw=1.2, color="tab:orange", label=theory["label"])
        if _number(theory.get("fixed_point")) is not None:
            ax.axhline(theory["fixed_point"], color="tab:blue", lw=1.0,
                       label=f"theory: exact allocated fixed point {theory['fixed_point']:.4g}")
        for k, (name, (tp, tol)) in enumerate(sorted(theory.get("phase_ends", {}).items())):
            ax.axvline(tp, color="black", ls="--", lw=0.9, label="theory's phase ends (judged)" if k == 0 else None)
            ax.axvspan(tp - tol, tp + tol, color="black", alpha=0.06)
    ax.set_xlabel("t (lr x steps, this project's units)")
    ax.set_ylabel("loss")
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    ax = axes[1]
    H, m = len(mu[0]), len(mu[0][0])
    for h in range(H):
        for i in range(m):
            ax.plot(t, [x[h][i] for x in mu], "-o", ms=2, lw=1, label=f"mu[{h},{i}]")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xlabel("t")
    ax.set_ylabel("mu (OV)")
    ax.legend(fontsize=6, ncol=max(1, m))
    fig.suptitle(title, fontsize=10)
    return _png(fig)
