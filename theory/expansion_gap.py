"""Where the large-L expansion of theory.reduced_ode stops, computed from theory alone: the
edge of its validity flag and the gap between it and theory.exact's loss at theory's
allocated point, with the local exponent of that gap in L (boundary-saturation and
boundary-small-L compare these with measurements)."""
from __future__ import annotations

import math

import numpy as np

from theory import exact as exact_theory
from theory import reduced_ode
from theory import task_allocation as allocation_theory


def validity_edge(omega_max: float = 10.0) -> float:
    """The edge of theory's validity flag on one head and one task: sup{omega :
    expansion_valid(omega)} (bisection on the flag, 60 halvings)."""
    lo, hi = 0.0, omega_max
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if reduced_ode.expansion_valid(np.array([[mid]])) else (lo, mid)
    return lo


def gap_ladder(r: int, Ls, sigma: float = 0.0) -> list[dict]:
    """At each L: theory's allocated point (omega*, mu*)(L) of one task of block size r
    (theory.task_allocation.allocated_task_point), the expansion there
    (theory.reduced_ode.expansion_loss), the exact loss there (theory.exact quadrature, with
    its error bound), the gap = expansion - exact and whether the point is in the expansion's
    domain (valid: 2 omega^2 < 1) and its O(L^-2) domain (reliable: 6 omega^2 < 1)."""
    rows = []
    for L in Ls:
        pt = allocation_theory.allocated_task_point(r, L, sigma)
        om, mu = np.array([[pt["omega_star"]]]), np.array([[pt["mu_star"]]])
        with np.errstate(all="ignore"):
            exp_val = float(reduced_ode.expansion_loss(om, mu, (r,), L, sigma))
        ex = exact_theory.exact_loss(om, mu, (r,), int(L), sigma)
        rows.append({"L": int(L), "omega": pt["omega_star"], "mu": pt["mu_star"], "expansion": exp_val,
                     "exact": ex.loss, "exact_error": ex.error_estimate, "gap": exp_val - ex.loss,
                     "valid": bool(reduced_ode.expansion_valid(om)),
                     "reliable": bool(reduced_ode.expansion_reliable(om))})
    return rows


def local_exponent(rows: list[dict]) -> tuple[float, float]:
    """d log|gap| / d log L over the last two rows and its error (the quadrature error
    bounds propagated: se(log|gap|) = error / |gap|)."""
    a, b = rows[-2], rows[-1]
    ratio = math.log(b["L"] / a["L"])
    p = math.log(abs(b["gap"]) / abs(a["gap"])) / ratio
    se = math.hypot(a["exact_error"] / abs(a["gap"]), b["exact_error"] / abs(b["gap"])) / ratio
    return p, se


