"""The optimum of one served task when the serving head's other logit coefficients are held.

At the allocated fixed point (theory.exact.exact_fixed_point) a head that serves task i has
omega = 0 on every other task.  Under the factored flow those off-task omega decay only
algebraically (the loss is even in each of them, so d omega/dt ~ -omega^2: omega ~ 1/t), so
at any finite time they are small but not zero, and they add logit noise from the other
blocks.  The optimum of the served entries given those off-task values is

    omega_i(row) = argmin_x  r_i - b_i(x)^2 / C_i(x),    mu_i = b_i / C_i,

with b_i, C_i the exact one-head moments (theory.exact.one_head_terms) of the row whose
entry i is x and whose other entries are the given ones (the head's own mu on other tasks is
0 at allocation, so task i's loss involves only this head).  With the other entries 0 this is
exact_fixed_point's (omega*_i, mu*_i) again.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar

from .exact import one_head_terms
from ._validate import check_sigma, check_tasks


def served_optimum(omega_row, task: int, tasks, L: int, sigma: float = 0.0, start: float = 1.0,
                   xatol: float = 1e-7) -> tuple[float, float]:
    """(omega_i, mu_i): the exact one-head optimum of task ``task`` with the other entries of
    ``omega_row`` held fixed (module docstring); searched in [start/3, 3 start] (bounded
    Brent), where ``start`` is a guess of omega_i (e.g. exact_fixed_point's)."""
    tasks = check_tasks(tasks)
    sigma = check_sigma(sigma)
    row = np.asarray(omega_row, dtype=float).reshape(-1).copy()
    if row.size != len(tasks):
        raise ValueError(f"omega_row must have one entry per task ({len(tasks)}), got {row.size}")
    if not 0 <= task < len(tasks):
        raise ValueError(f"task must be an index in 0..{len(tasks) - 1}, got {task}")
    if not start > 0:
        raise ValueError(f"start (a guess of the served omega) must be positive, got {start}")

    def loss(x):
        row[task] = x
        b, C, _, _ = one_head_terms(row, tasks, L, sigma)
        return tasks[task] - b[task] ** 2 / C[task]

    res = minimize_scalar(loss, bounds=(start / 3.0, 3.0 * start), method="bounded", options={"xatol": xatol})
    row[task] = res.x
    b, C, _, _ = one_head_terms(row, tasks, L, sigma)
    return float(res.x), float(b[task] / C[task])
