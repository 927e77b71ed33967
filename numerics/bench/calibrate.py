"""``python -m numerics.bench --calibrate``: measure the primitives of ``numerics.engine`` on this machine
and fit its coefficients.

Each primitive is timed at a grid of sizes (:data:`GRIDS`: the claims' sizes, from the report's
smallest to the authors' configuration) in process CPU time, one torch thread; the coefficients of
its features (``numerics.engine.*_features``) are fitted by non-negative least squares on the ratios
measured / modelled (each row divided by its measurement, so a point of 5 ms and one of 5 s count
alike).  The result says, per point, the measured seconds, the model's (with the fitted coefficients
and with the ones ``numerics.engine`` holds now) and their ratio; ``numerics.engine`` is updated by hand
from its ``coefficients`` (with the machine and date in ``numerics.engine.CALIBRATION``).
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from numerics import engine

# (tasks, heads, L, batch, runs, streams): the sizes of the claims' full-model runs, from the quick
# report's (2, 2), L = 32 to the authors' (16, 17, 17), L = 100, and programs of several runs
STEP_GRID = (
    ((2, 2), 2, 32, 512, 1, 1), ((2, 2), 2, 64, 1024, 1, 1), ((3, 3), 2, 32, 1024, 1, 1), ((2, 2), 1, 64, 2048, 1, 1),
    ((3, 3, 3), 3, 64, 256, 1, 1), ((2, 2, 2), 2, 64, 1024, 1, 1), ((4, 4, 4), 3, 256, 1024, 1, 1),
    ((3, 3), 6, 32, 1024, 1, 1), ((16, 17, 17), 3, 100, 163, 1, 1), ((16, 17, 17), 3, 100, 1024, 1, 1),
    ((16, 17, 17), 1, 100, 1310, 1, 1), ((16, 17, 17), 3, 12, 1024, 1, 1),
    ((2, 2), 2, 64, 1024, 4, 1), ((2, 2), 2, 32, 512, 8, 2), ((3, 3), 2, 32, 1024, 4, 4),
    ((16, 17, 17), 3, 100, 1024, 3, 1), ((16, 17, 17), 3, 100, 163, 4, 4),
)
FORWARD_GRID = (((2, 2), 2, 64, 16384, 1), ((3, 3, 3), 3, 64, 16384, 1), ((2, 2), 1, 32, 65536, 2),
                ((16, 17, 17), 3, 100, 8192, 1), ((16, 17, 17), 1, 200, 4096, 1), ((4, 4, 4), 3, 256, 4096, 5),
                ((16, 17, 17), 3, 100, 4096, 6))
REDUCED_GRID = (((2, 2), 2, 32, 512, "prompts"), ((2, 2), 2, 64, 1024, "prompts"), ((4, 4, 4), 3, 64, 512, "prompts"),
                ((16, 17, 17), 3, 100, 512, "prompts"), ((2, 2), 2, 64, 1024, "marginal"),
                ((3, 3, 3), 3, 64, 256, "marginal"), ((16, 17, 17), 3, 100, 164, "marginal"),
                ((16, 17, 17), 3, 100, 2048, "marginal"))
MARGINAL_GRID = (((2, 2), 2, 64, 16384, 1), ((2, 2), 4, 64, 16384, 3), ((16,), 1, 64, 40000, 1),
                 ((3, 3, 3), 3, 64, 20000, 2), ((16, 17, 17), 3, 100, 8192, 2), ((16,), 1, 100, 200000, 1))
FIT_GRID = (((2, 2), 2, 64, 4096), ((2, 2), 4, 64, 2048), ((3, 3, 3), 3, 64, 2730), ((16, 17, 17), 1, 100, 5242))
STEPS = 5


def _cpu(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure_step(tasks, heads, L, batch, runs, streams, dtype="float64", steps=STEPS) -> float:
    """CPU seconds per step of ``runs`` runs (``streams`` seeds) trained by train_many (train for one)."""
    from numerics.config import ProblemConfig
    from numerics.train import TrainConfig, train, train_many
    cfgs = [ProblemConfig(tasks=tuple(tasks), heads=heads, L=L, dtype=dtype, init_scale=0.1 + 0.02 * k)
            for k in range(runs)]
    tcfgs = [TrainConfig(lr=0.05, time=0.05 * steps, batch=batch, seed=k % streams, records=2) for k in range(runs)]
    if runs == 1:
        train(cfgs[0], TrainConfig(lr=0.05, time=0.1, batch=batch, records=2))    # warm the allocator
        return _cpu(lambda: train(cfgs[0], tcfgs[0])) / steps
    return _cpu(lambda: train_many(cfgs, tcfgs)) / steps


def measure_forward(tasks, heads, L, n, models) -> float:
    from numerics.config import ProblemConfig
    from numerics.evaluate import held_out_losses
    from numerics.model import MultiHeadAttention
    cfg = ProblemConfig(tasks=tuple(tasks), heads=heads, L=L)
    ms = [MultiHeadAttention(cfg) for _ in range(models)]
    return _cpu(lambda: held_out_losses(ms, n, 0))


def measure_reduced(tasks, heads, L, batch, estimator, steps=STEPS) -> float:
    from numerics.config import ProblemConfig
    from numerics.train import TrainConfig, train_reduced
    cfg = ProblemConfig(tasks=tuple(tasks), heads=heads, L=L)
    tc = TrainConfig(lr=0.05, time=0.05 * steps, batch=batch, records=2)
    return _cpu(lambda: train_reduced(cfg, tc, estimator=estimator)) / steps


def measure_marginal(tasks, heads, L, n, points) -> float:
    from numerics.exact_reduced import evaluate
    m = len(tasks)
    rng = np.random.default_rng(0)
    pts = [(rng.uniform(0.1, 0.4, (heads, m)), rng.uniform(0.5, 2.0, (heads, m))) for _ in range(points)]
    return _cpu(lambda: evaluate(pts, tuple(tasks), L, 0.0, n, 0))


def measure_fit(tasks, heads, L, n_fit) -> tuple[float, int]:
    """(CPU seconds per objective evaluation, evaluations) of one minimise_family search."""
    from numerics import exact_reduced
    m = len(tasks)
    seen = []
    real = exact_reduced.minimize

    def counting(*a, **k):
        res = real(*a, **k)
        seen.append(int(res.nfev))
        return res
    exact_reduced.minimize = counting
    try:
        free = np.ones((heads, m), bool)
        start = np.full((heads, m), 0.2)
        start[np.arange(heads), np.arange(heads) % m] = 0.4
        sec = _cpu(lambda: exact_reduced.minimise_family(tuple(tasks), L, 0.0, free, free, [start], 0, n_fit=n_fit))
    finally:
        exact_reduced.minimize = real
    return sec / max(1, seen[0]), seen[0]


def fit(rows: list[dict], keys: list[str]) -> dict:
    """Non-negative least squares of measured ~ sum c_k x_k on relative residuals."""
    from scipy.optimize import nnls
    A = np.array([[r["features"][k] for k in keys] for r in rows], float)
    y = np.array([r["measured"] for r in rows], float)
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    c, _ = nnls((A / scale) / y[:, None], np.ones(len(y)))
    return {k: float(v / s) for k, v, s in zip(keys, c, scale)}


def _rows(grid, features, measure, current, progress) -> list[dict]:
    out = []
    for point in grid:
        if progress:
            print(f"  calibrating {point}", flush=True)
        f = features(*point)
        m = measure(*point)
        out.append({"point": [list(x) if isinstance(x, tuple) else x for x in point], "features": f, "measured": m,
                    "current_model": engine._priced(current, f)})
    return out


def _finish(rows, coef) -> dict:
    for r in rows:
        r["fitted_model"] = engine._priced(coef, r["features"])
        r["ratio_fitted"] = r["measured"] / r["fitted_model"] if r["fitted_model"] > 0 else float("inf")
        r["ratio_current"] = r["measured"] / r["current_model"] if r["current_model"] > 0 else float("inf")
    return {"coefficients": coef, "points": rows,
            "worst_ratio_fitted": max(max(r["ratio_fitted"], 1 / r["ratio_fitted"]) for r in rows),
            "worst_ratio_current": max(max(r["ratio_current"], 1 / r["ratio_current"]) for r in rows)}


def calibrate(dtypes=("float64",), progress: bool = True) -> dict:
    """Measure every primitive at its grid and fit numerics.engine's coefficients (the result's
    ``coefficients`` per primitive, and each point's measured / modelled ratio)."""
    import torch
    torch.set_num_threads(1)
    out = {"calibration_of": "numerics.engine", "threads": 1}
    for dt in dtypes:
        rows = _rows(STEP_GRID, lambda t, h, L, b, R, S: engine.step_features(t, h, L, b, R, S),
                     lambda t, h, L, b, R, S: measure_step(t, h, L, b, R, S, dt), engine.STEP[dt], progress)
        out[f"step_{dt}"] = _finish(rows, fit(rows, list(engine.STEP[dt])))
    rows = _rows(FORWARD_GRID, engine.forward_features, measure_forward, engine.FORWARD, progress)
    out["forward"] = _finish(rows, fit(rows, list(engine.FORWARD)))
    for est in ("prompts", "marginal"):
        grid = [g for g in REDUCED_GRID if g[4] == est]
        rows = _rows(grid, engine.reduced_step_features, measure_reduced, engine.REDUCED_STEP[est], progress)
        out[f"reduced_{est}"] = _finish(rows, fit(rows, list(engine.REDUCED_STEP[est])))
    rows = _rows(MARGINAL_GRID, engine.marginal_features, measure_marginal, engine.MARGINAL, progress)
    out["marginal"] = _finish(rows, fit(rows, list(engine.MARGINAL)))
    fits = []
    for t, h, L, n in FIT_GRID:
        per, nfev = measure_fit(t, h, L, n)
        m = len(t)
        fits.append({"point": [list(t), h, L, n], "features": {"evaluation": 1.0, "mix": float(n) * L * h * m},
                     "measured": per, "evaluations": nfev,
                     "current_model": engine.FIT["evaluation"] + engine.FIT["mix"] * float(n) * L * h * m})
    out["fit"] = {**_finish(fits, fit(fits, list(engine.FIT))),
                  "evaluations": [r["evaluations"] for r in fits]}
    return out


def render(res: dict) -> str:
    lines = ["numerics.engine calibration (CPU seconds, one thread): measured, fitted model, current model"]
    for key, sec in res.items():
        if not isinstance(sec, dict) or "points" not in sec:
            continue
        lines.append(f"{key}: coefficients {{{', '.join(f'{k!r}: {v:.3g}' for k, v in sec['coefficients'].items())}}}"
                     f"; worst ratio fitted {sec['worst_ratio_fitted']:.2f}, current {sec['worst_ratio_current']:.2f}")
        for r in sec["points"]:
            lines.append(f"    {str(r['point']):42s} {r['measured']:10.4g} {r['fitted_model']:10.4g} "
                         f"{r['current_model']:10.4g}  ratio {r['ratio_fitted']:.2f} / {r['ratio_current']:.2f}")
    return "\n".join(lines)
