"""Claim 5: the limiting error vanishes as d/L -> 0, like 1/L at fixed d.

What is compared
----------------
The gradient-flow limit at context length L is the allocated point of the decomposable set
(claim 4: head h(i) serves task i alone).  Its loss

    L*_L = min over allocated (omega, mu) of L_L(omega, mu),

L_L the *exact* finite-L reduced loss (SPEC.md), is what a converged run measures.  Theory
(``theory.limiting_error``) predicts

    L * L*_L  ->  Lambda = sum_i min_w F(w; r_i, r_i, sigma)      (L -> inf),

so L*_L ~ Lambda / L: the error vanishes with d/L (Lambda ~ e sum_i r_i (r_i + sigma^2)).
Three comparisons:

1. ``check_converged_loss``: a training run (the full model at small sizes, or the exact
   reduced flow) converges to L*_L at its own finite L.  This is the bridge between the
   trained model and the exact reduced minimum used beyond (claim 2a bridges the gradients).
2. ``check_limit_trend``: L * L*_L over several L, extrapolated to L -> inf
   (:func:`fit_limit`: finite-L corrections c L^-1 and c L^-1/2 bracket it), agrees with
   theory's Lambda.
3. ``check_slope``: the log-log slope of L*_L against L over the two largest L is -1, up to
   the finite-L correction implied by the same fits.

How L*_L is measured: ``numerics.exact_reduced`` (a Rao-Blackwellised estimator of the
exact finite-L reduced loss, mu in closed form, omega by L-BFGS-B / Brent on a fit sample,
the value on an independent evaluation sample).  Tolerances: :data:`claims.common.Z_SE`
standard errors plus the stated systematic errors.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from claims.base import ClaimResult, Figure, Series, no_progress, run_claim
from claims.common import (CORRECTION_POWERS, Z_SE, Comparison, check_profile, comparisons_result, fit_limit,
                           loss_standard_error, perturbation, points_from_sweep, sweep_points, window_drift)
from numerics.config import ProblemConfig
from numerics.exact_reduced import FIT_ELEMENTS, allocated_minimum, exact_minima, measure
from tools.sweep import load_results, run_grid
from numerics.train import TrainConfig, train, train_reduced
from theory.limiting_error import limit_multi

CLAIM_ID = "limiting-error"
TITLE = "Limiting error vanishes as d/L -> 0"
STATEMENT = ("The ICL prediction error of the gradient-flow limit vanishes as d/L -> 0: "
             "L * loss tends to theory's constant Lambda = sum_i min_w F(w; r_i, r_i, sigma), "
             "so at fixed d the converged loss falls like 1/L.")

# ---------------------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------------------

def _theory_limit(tasks, sigma) -> float:
    return float(limit_multi(tasks, sigma))


def check_limit_trend(tasks, sigma: float, points: Sequence[dict], source: str = "exact reduced minima") -> Comparison:
    """L * L*_L over several L against theory's limit Lambda.

    ``points``: dicts with "L", "loss", "se" (measured converged losses and their standard
    errors).  Extrapolate L*loss to L -> inf (:func:`fit_limit`); compare with Lambda at
    tolerance Z_SE * se + the extrapolation's systematic error.  Perturbations: Lambda x 1.5
    and x 2/3 (a wrong constant) must be rejected at the same tolerance."""
    Lambda = _theory_limit(tasks, sigma)
    L = np.array([p["L"] for p in points], float)
    y = L * np.array([p["loss"] for p in points], float)
    se = L * np.array([p["se"] for p in points], float)
    fit = fit_limit(L, y, se)
    tol = Z_SE * fit["a_se"] + fit["systematic"]
    err = abs(fit["a"] - Lambda)
    why = (f"{Z_SE:g} standard errors of the extrapolated limit (weighted fits of L*loss = a + c L^-p, p = 1 and "
           f"1/2, on the Monte-Carlo errors of each L) plus the extrapolation's systematic error, half the "
           f"difference of the two fits ({fit['systematic']:.3g})")
    perts = [perturbation("limit constant x1.5", abs(fit["a"] - 1.5 * Lambda), tol, predicted=1.5 * Lambda),
             perturbation("limit constant x2/3", abs(fit["a"] - Lambda / 1.5), tol, predicted=Lambda / 1.5)]
    return Comparison(
        name=f"L*loss -> Lambda, tasks={list(tasks)}, sigma={sigma:g}",
        measured=fit["a"], predicted=Lambda, error=err, tolerance=tol, why=why,
        perturbations=perts,
        details={"tasks": list(tasks), "sigma": sigma, "source": source, "fit": fit,
                 "L": L.tolist(), "L_times_loss": y.tolist(), "L_times_se": se.tolist(),
                 "relative_error_of_limit": float(err / Lambda)})


def check_slope(tasks, sigma: float, points: Sequence[dict], source: str = "exact reduced minima") -> Comparison:
    """The log-log slope of loss against L between the two largest context lengths is -1.

    Measured: log(loss2/loss1)/log(L2/L1), standard error from the two losses' Monte-Carlo
    errors.  The finite-L correction makes the local slope differ from -1 by
    d log(L*loss)/d log L; its size at (L1, L2) is taken from the two extrapolation fits of
    :func:`fit_limit` (the larger) and added to Z_SE standard errors.  Perturbations: slope -1/2
    (error ~ 1/sqrt(L)) and -2."""
    L = np.array([p["L"] for p in points], float)
    loss = np.array([p["loss"] for p in points], float)
    se = np.array([p["se"] for p in points], float)
    order = np.argsort(L)
    i1, i2 = order[-2], order[-1]
    span = math.log(L[i2] / L[i1])
    slope = math.log(loss[i2] / loss[i1]) / span
    slope_se = math.sqrt((se[i1] / loss[i1]) ** 2 + (se[i2] / loss[i2]) ** 2) / span
    fit = fit_limit(L, L * loss, L * se)
    curvature = 0.0
    for p, f in zip(CORRECTION_POWERS, fit["fits"].values()):
        y1, y2 = f["a"] + f["c"] * L[i1] ** -p, f["a"] + f["c"] * L[i2] ** -p
        curvature = max(curvature, abs(math.log(y2 / y1)) / span if y1 > 0 and y2 > 0 else float("inf"))
    tol = Z_SE * slope_se + curvature
    err = abs(slope + 1.0)
    why = (f"{Z_SE:g} standard errors of the measured slope ({slope_se:.3g}, from the Monte-Carlo errors of the two "
           f"losses) plus the deviation of the local slope from -1 implied by the finite-L fits ({curvature:.3g})")
    return Comparison(
        name=f"loss ~ L^-1, tasks={list(tasks)}, sigma={sigma:g}, L={int(L[i1])}..{int(L[i2])}",
        measured=slope, predicted=-1.0, error=err, tolerance=tol, why=why,
        perturbations=[perturbation("exponent -1/2", abs(slope + 0.5), tol, predicted=-0.5),
                       perturbation("exponent -2", abs(slope + 2.0), tol, predicted=-2.0)],
        details={"tasks": list(tasks), "sigma": sigma, "source": source, "L1": L[i1], "L2": L[i2],
                 "slope_se": slope_se, "curvature": curvature})


def check_converged_loss(cfg, tcfg, model: str = "full", n_eval: int = 20000, seed: int = 0) -> Comparison:
    """A training run's converged loss against the exact finite-L gradient-flow limit L*_L.

    ``model``: "full" (numerics.train.train) or "reduced" (train_reduced).  Measured: the
    mean batch loss over the last 10% of steps (TrainResult.loss) with its batch-means
    standard error.  Predicted: the allocated minimum of the exact loss at cfg.L (cfg.heads
    must equal m).  Tolerance: Z_SE combined standard errors plus :func:`window_drift` (the
    descent still visible in the final window beyond noise, an estimate of the optimisation
    error).  Perturbations: the prediction x1.5 and x2/3."""
    if cfg.heads != cfg.m:
        raise ValueError(f"check_converged_loss compares with the allocated limit: heads must equal the number "
                         f"of tasks m = {cfg.m}, got heads = {cfg.heads}")
    if model not in ("full", "reduced"):
        raise ValueError(f"model must be 'full' or 'reduced', got {model!r}")
    res = (train if model == "full" else train_reduced)(cfg, tcfg)
    tail = res.losses[-max(2, int(math.ceil(0.1 * res.steps))):]
    se_train = loss_standard_error(tail)
    drift = window_drift(tail)
    (fm,) = measure([allocated_minimum(cfg.tasks, cfg.L, cfg.sigma, seed, cfg.device)], n_eval, seed + 1, cfg.device)
    tol = Z_SE * math.hypot(se_train, fm.se) + drift
    err = abs(res.loss - fm.loss)
    why = (f"{Z_SE:g} combined standard errors (training window by batch means {se_train:.3g}; exact minimum on "
           f"{fm.n_eval} independent prompts {fm.se:.3g}) plus the drift of the loss across the final window beyond "
           f"its noise ({drift:.3g}, the optimisation error still left)")
    return Comparison(
        name=f"converged loss = exact L*_L, {model} model, tasks={list(cfg.tasks)}, L={cfg.L}, sigma={cfg.sigma:g}",
        measured=res.loss, predicted=fm.loss, error=err, tolerance=tol, why=why,
        perturbations=[perturbation("prediction x1.5", abs(res.loss - 1.5 * fm.loss), tol),
                       perturbation("prediction x2/3", abs(res.loss - fm.loss / 1.5), tol)],
        details={"config": cfg.to_dict(), "train": tcfg.to_dict(), "model": model, "steps": res.steps,
                 "wall_seconds": res.wall_seconds, "final_omega": np.round(res.omega, 4).tolist(),
                 "final_mu": np.round(res.mu, 4).tolist(), "exact_minimum": fm.summary(),
                 "se_train": se_train, "drift": drift})


# ---------------------------------------------------------------------------------------
# the claim run
# ---------------------------------------------------------------------------------------

PROFILE_GRIDS = {
    # (tasks, sigma) cases; context lengths; evaluation sample in prompt x L elements
    "tiny": {"cases": [((2,), 0.0)], "Ls": (64, 128, 256), "eval_elements": 2 ** 19, "fit_elements": 2 ** 16,
             "train": None},
    "quick": {"cases": [((4, 4, 4), 0.0), ((2, 3), 0.5)], "Ls": (256, 1024, 4096, 8192),
              "eval_elements": 2 ** 23, "fit_elements": 2 ** 20,
              # one full-model run at the smallest size where it converges within seconds
              "train": {"tasks": (2, 2), "L": 32, "time": 20.0, "lr": 0.1, "batch": 512}},
    # paper: the SPEC reference sizes r = 4 and 10 (m = 3) and a noisy case, L up to 16384
    # (d/L down to 2e-3); the full model trained on the GPU at L = 64..1024, batch 4096.
    "paper": {"cases": [((4, 4, 4), 0.0), ((10, 10, 10), 0.0), ((3, 3), 0.5)],
              "Ls": (256, 512, 1024, 2048, 4096, 8192, 16384, 32768), "eval_elements": 2 ** 26,
              "fit_elements": 2 ** 22,
              "train": {"tasks": (4, 4, 4), "Ls": (64, 128, 256, 512, 1024), "time": 100.0, "lr": 0.05,
                        "batch": 4096}},
}


def check_trained_point(tasks, sigma: float, point: dict, n_eval: int, seed: int, device="cpu") -> Comparison:
    """One trained run of a sweep (``point``: "L", "loss", "se" from :func:`points_from_sweep`)
    against the exact finite-L gradient-flow limit at its L: tolerance Z_SE combined standard
    errors; perturbations x1.5 and x2/3."""
    (fm,) = measure([allocated_minimum(tasks, point["L"], sigma, seed, device)], n_eval, seed + 1, device)
    tol = Z_SE * math.hypot(point["se"], fm.se)
    err = abs(point["loss"] - fm.loss)
    return Comparison(
        name=f"trained loss = exact L*_L, tasks={list(tasks)}, L={point['L']}, sigma={sigma:g}",
        measured=point["loss"], predicted=fm.loss, error=err, tolerance=tol,
        why=f"{Z_SE:g} combined standard errors (trained run from its trajectory's final records; exact minimum on "
            f"{fm.n_eval} independent prompts)",
        perturbations=[perturbation("prediction x1.5", abs(point["loss"] - 1.5 * fm.loss), tol),
                       perturbation("prediction x2/3", abs(point["loss"] - fm.loss / 1.5), tol)],
        details={"tasks": list(tasks), "sigma": sigma, "point": point, "exact_minimum": fm.summary()})


PAPER_SWEEP_DIR = "sweeps/limiting-error-paper"
"""Where profile "paper" keeps its training grid (relative to the working directory):
tools.sweep.run_grid skips the points already stored, so an interrupted run resumes."""


def _trend_figure(cases: dict) -> Figure:
    series = []
    for (tasks, sigma), pts in cases.items():
        d = sum(tasks)
        x = [d / p["L"] for p in pts]
        series.append(Series(f"measured tasks={list(tasks)} sigma={sigma:g}", x, [p["loss"] for p in pts], "points"))
        Lam = _theory_limit(tasks, sigma)
        xs = np.geomspace(min(x) / 1.5, max(x) * 1.5, 20)
        series.append(Series(f"theory Lambda/L, tasks={list(tasks)} sigma={sigma:g}", xs.tolist(),
                             (Lam * xs / d).tolist(), "line"))
    return Figure(name="limiting-error-vs-d-over-L", title="Converged loss against d/L (theory: Lambda / L)",
                  xlabel="d / L", ylabel="loss", xscale="log", yscale="log", series=series)


def run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None) -> ClaimResult:
    """Claim 5 on a profile: the 1/L trend of the exact gradient-flow limit (or of a sweep's
    trained runs when ``sweep`` is a sweep directory), plus a full-model training bridge."""
    check_profile(profile)

    def body() -> ClaimResult:
        grid = PROFILE_GRIDS[profile]
        comparisons, cases = [], {}
        if sweep is not None:
            cases = {k: v for k, v in points_from_sweep(load_results(sweep)).items() if len(v) >= 3}
            if not cases:
                raise ValueError(f"sweep {sweep!r} has no case (tasks, sigma) with >= 3 context lengths of "
                                 "finished factored runs with heads = m; run the limiting-error grid first")
            source = f"trained runs of sweep {sweep}"
        else:
            source = "exact reduced minima (allocated family)"
            for k, (tasks, sigma) in enumerate(grid["cases"]):
                progress(f"limiting error: tasks={list(tasks)} sigma={sigma:g}", k / (len(grid["cases"]) + 1))
                rows = exact_minima(tasks, sigma, grid["Ls"], None, seed + 10_000 * k, device,
                                    eval_elements=grid["eval_elements"],
                                    fit_elements=grid.get("fit_elements", FIT_ELEMENTS))
                cases[(tuple(tasks), sigma)] = [{"L": r["L"], "loss": r["allocated"].loss, "se": r["allocated"].se,
                                                 "minimum": r["allocated"].summary()} for r in rows]
        for (tasks, sigma), pts in cases.items():
            comparisons.append(check_limit_trend(tasks, sigma, pts, source))
            comparisons.append(check_slope(tasks, sigma, pts, source))
        tr = grid["train"]
        trained = {}
        if sweep is not None:
            trained = cases
        elif profile == "paper":
            # the full model on the paper's grid, through the sweep machinery (resumable)
            progress(f"limiting error: training grid in {PAPER_SWEEP_DIR}", 0.5)
            run_grid(sweep_points(tr["tasks"], 0.0, tr["Ls"], tr["time"], tr["lr"], tr["batch"], seed=seed,
                                  device=device), PAPER_SWEEP_DIR, scheduler="serial", progress=False)
            trained = points_from_sweep(load_results(PAPER_SWEEP_DIR))
            for key, pts in trained.items():
                if len(pts) >= 3:
                    c = check_limit_trend(key[0], key[1], pts, f"trained runs of {PAPER_SWEEP_DIR}")
                    c.name += " [trained runs]"
                    comparisons.append(c)
        elif tr is not None:
            progress("limiting error: full-model training bridge", len(grid["cases"]) / (len(grid["cases"]) + 1))
            cfg = ProblemConfig(tasks=tuple(tr["tasks"]), heads=len(tr["tasks"]), L=int(tr["L"]), device=device)
            tcfg = TrainConfig(lr=tr["lr"], time=tr["time"], batch=tr["batch"], seed=seed, records=21)
            comparisons.append(check_converged_loss(cfg, tcfg, "full", n_eval=2 ** 22 // int(tr["L"]), seed=seed))
        for (tasks, sigma), pts in trained.items():
            for k, pt in enumerate(pts):
                comparisons.append(check_trained_point(tasks, sigma, pt, max(2000, 2 ** 22 // pt["L"]),
                                                       seed + 500 + k, device))
        progress("limiting error: done", 1.0)
        return comparisons_result(
            CLAIM_ID, TITLE, STATEMENT, comparisons, [_trend_figure(cases)],
            {"profile": profile, "seed": seed, "source": source},
            theory={f"Lambda tasks={list(t)} sigma={s:g}": _theory_limit(t, s) for (t, s) in cases}, short_why=True)

    return run_claim(CLAIM_ID, TITLE, STATEMENT, body)
