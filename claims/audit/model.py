"""One judged model of the checkpoint audit (claims.audit, whose docstring has the account): where
a model stands (:func:`domain`), how many held-out prompts decide it (:func:`sized`), its
comparisons against the exact allocated fixed point or the side theory puts it on, and its
findings; the request and the plan of an audit (:func:`plan_audit`)."""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from claims.core import (Z_SE, ClaimResult, Context, Outcome, Tolerance, compare, config_label, finding, fmt,
                         headline_row, no_progress, noise_term, off_by, reported_row, run_status, term)
from numerics import external
from numerics.reference_points import REFERENCES, SEARCH
from numerics.evaluate import ZERO_SUM_SHARE

ON_D_SHARE = 0.1
# A model is on D when the movable off-D part of its merged weights is at most 10% of their
# function-relevant norm sqrt(||P_D theta||^2 + movable^2) (theory.initialisation.residual_split; the
# y columns of W, which no query reads and no gradient reaches, are left out: an untrained random
# part there changes nothing the model computes).  The same 0.1 as boundary-initialisation's "on D";
# its measured ends cluster at 0.0-0.1 (allocated runs) and 0.8-1.0 (off D), so the class does not
# hinge on the threshold.  Decides which account applies, never an agreement.

OFF_D_SHARE = 0.5
# Off D (the readout's words; the boundary-initialisation threshold): at least half of the
# function-relevant weights off D; between ON_D_SHARE and this, "partly off D".

BALANCED_SHARE = 0.1
# Theory's phase and winner predictions integrate the balanced factored metric.  A factored start
# with conserved balances c = k^2 - q^2 has metric sqrt(c^2 + 4 s^2 omega^2)/(s^2 r) instead of
# 2 |omega|/(s r) (theory.initialisation.unbalanced_metric_factors): with |c| <= 0.1 x 2 s |omega| the
# rates differ by at most sqrt(1 + 0.01) - 1 = 0.5%, below the phase tolerance's checkpoint gap; the
# same bound for o^2 - v^2 against 2 |mu|.

CONVERGED_RELATIVE = 0.01
# A run has converged when its held-out loss fell by at most Z_SE paired standard errors plus 1% of
# the loss over the last quarter of its checkpoints: an SGD run at a fixed step fluctuates about its
# stationary loss by its SGD excess, measured at 0.3-1% of the loss at this project's steps and
# batches.

PERTURB_FACTOR = 1.1
# The wrong predictions of the fixed-point comparisons: omega*, mu* or the loss off by 10% (claim 4's).

PHASE_FACTOR = 2.0
# The wrong phase predictions: both phase ends x2 and /2 (claim 3's factor-2 error of the warm-up).

MIN_PHASE_CHECKPOINTS = 5
# theory.three_phases.phase_times needs at least 5 records.

PILOT_PROMPTS = 4096
# Held-out prompts of the pilot measurement that sizes each judged model's (:func:`prompts_needed`).

SIZING_MARGIN = 1.25
# The sized count is the pilot's estimate x 1.25: the pilot's standard deviations, from 4096 prompts, are
# uncertain by ~1/sqrt(2 x 4096) ~ 1% (a few % for heavy-tailed per-prompt gradients); 1.25 in prompts is 12%
# in tolerance, many times that.

MAX_PROMPTS, MAX_SECONDS = 2 ** 20, 600.0
# The default caps of a sized measurement (per judged model): 2^20 prompts, 10 minutes by the pilot's rate.

SUM_UNITS = "this project's units: E||y_q - y_hat||^2 summed over the m tasks"


@dataclass(frozen=True)
class AuditRequest:
    """What a researcher asks (``python -m reports.audit``'s arguments).  ``tasks``, ``L``, ``sigma``,
    ``basis``, ``basis_seed``: the problem the models were trained on (a project file carries its
    own; given ones must agree); ``times`` (this project's units) or ``steps`` with ``lr`` and
    ``loss_units`` ("mean": torch's MSELoss over the m outputs, t = lr steps / m; "sum": t = lr
    steps), one per checkpoint, else the files' own entries; ``prompts``: held-out prompts per
    model (None: sized, :func:`sized`, within ``max_prompts`` and ``max_seconds``);
    ``assume_converged``: the researcher states that each checkpoint's run had converged."""

    checkpoints: tuple            # paths, or numerics.external.ExternalModel objects (models in memory)
    tasks: Optional[tuple] = None
    L: Optional[int] = None
    sigma: Optional[float] = None
    basis: Optional[str] = None
    basis_seed: Optional[int] = None
    layout: str = "auto"
    logit_scale: Optional[float] = None
    times: Optional[tuple] = None
    steps: Optional[tuple] = None
    lr: Optional[float] = None
    loss_units: str = "mean"
    prompts: Optional[int] = None
    max_prompts: int = MAX_PROMPTS
    max_seconds: float = MAX_SECONDS
    seed: int = 0
    assume_converged: bool = False
    device: str = "cpu"
    search: tuple = tuple(sorted(SEARCH.items()))
    skip: tuple = ()


@dataclass
class Case:
    """One checkpoint of the plan: the file read, the configuration it is audited at, its time."""

    index: int
    ext: external.ExternalModel
    cfg: object
    time: Optional[float]
    time_source: Optional[str]


@dataclass
class AuditPlan:
    """The checked plan: the cases (in time order for a trajectory), the problem, whether the cases
    form one run (``trajectory``; ``why_not`` otherwise), the trainer's step in our units if known."""

    request: AuditRequest
    cases: list
    problem: dict
    trajectory: bool
    why_not: str = ""
    lr: Optional[float] = None
    lr_source: str = ""


@dataclass
class Audit:
    """The audit's results: the judged ``ClaimResult`` objects, the ``model`` entries of claims.json
    (one per checkpoint), and the time it took (wall and CPU seconds, per stage)."""

    results: list
    model: list
    seconds: float
    cpu_seconds: float
    stages: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- the plan

def _agree(name: str, given, from_files: list, flag: str):
    """The value of a problem field: the flag's, checked against every project file's."""
    values = sorted({repr(v) for _, v in from_files})
    if given is not None:
        for path, v in from_files:
            if v != given:
                raise external.CheckpointError(f"{path}: its config says {name} {v}, but {flag} {given}")
        return given
    if len(values) > 1:
        raise external.CheckpointError(f"the project files disagree on {name} ({', '.join(values)}); audit them "
                                       "separately")
    return from_files[0][1] if from_files else None


def plan_audit(request: AuditRequest) -> AuditPlan:
    """Read and check every checkpoint and the request, before any computation; a
    ``numerics.external.CheckpointError`` (or ValueError) with one line on anything wrong."""
    if request.times is not None and request.steps is not None:
        raise ValueError("give --times (this project's units) or --steps with --lr, not both")
    for name, seq in (("--times", request.times), ("--steps", request.steps)):
        if seq is not None and len(seq) != len(request.checkpoints):
            raise ValueError(f"{name} has {len(seq)} entries for {len(request.checkpoints)} checkpoints; give one "
                             "per checkpoint, in the order of the files")
    if request.steps is not None and request.lr is None:
        raise ValueError("--steps needs --lr (the trainer's step size) to become training times")
    unknown = sorted(set(request.skip) - set(REFERENCES))
    if unknown:
        raise ValueError(f"--skip: unknown reference point(s) {unknown}; known: "
                         f"{', '.join(r.replace('_', '-') for r in REFERENCES)}")
    # a checkpoint is a file, or a model already in memory (numerics.external.ExternalModel: a run trained in this
    # process, e.g. numerics.experiments.authors.checkpoint), audited the same way
    external.check_paths([p for p in request.checkpoints if not isinstance(p, external.ExternalModel)])
    known = tuple(request.tasks) if request.tasks else None
    exts = [p if isinstance(p, external.ExternalModel) else
            external.read_checkpoint(p, request.layout, request.logit_scale, tasks=known) for p in request.checkpoints]
    pick = lambda key: [(e.path, e.config[key]) for e in exts if e.config is not None]  # noqa: E731
    tasks = _agree("tasks", None if request.tasks is None else tuple(request.tasks),
                   [(p, tuple(v)) for p, v in pick("tasks")], "--tasks")
    L = _agree("L", request.L, pick("L"), "--L")
    if tasks is None or L is None:
        missing = " and ".join(f for f, v in (("--tasks", tasks), ("--L", L)) if v is None)
        raise ValueError(f"give {missing}: the files do not say the problem they were trained on (tasks = block "
                         "sizes r_i, e.g. --tasks 16,17,17 for the authors' d = 50 over 3 tasks; L = context length)")
    sigma, basis, basis_seed = (_agree(name, getattr(request, name), pick(name), "--" + name.replace("_", "-")) or default
                                for name, default in (("sigma", 0.0), ("basis", "identity"), ("basis_seed", 0)))
    problem = {"tasks": tuple(int(r) for r in tasks), "L": int(L), "sigma": float(sigma), "basis": basis,
               "basis_seed": int(basis_seed)}
    cases = []
    for k, e in enumerate(exts):
        try:
            cfg = external.problem_config(e, device=request.device, **problem)
        except (TypeError, ValueError) as exc:
            raise external.CheckpointError(str(exc) if isinstance(exc, external.CheckpointError)
                                           else f"{e.path}: {exc}") from None
        t, source = _time_of(request, e, k, len(tasks))
        if t is not None and not math.isfinite(t):
            raise ValueError(f"{e.path}: its training time is {t} ({source}): the product overflows; check --lr, "
                             "--steps and the file's step")
        cases.append(Case(k, e, cfg, t, source))
    lr, lr_source = _trainer_step(request, exts, len(tasks))
    trajectory, why = len(cases) > 1, ""
    if trajectory and any(c.time is None for c in cases):
        trajectory, why = False, ("not every checkpoint has a training time (give --times, or --steps with --lr): "
                                  "audited as separate models")
    if trajectory:
        cases.sort(key=lambda c: c.time)
        times = [c.time for c in cases]
        if len(set(times)) < len(times):
            raise ValueError(f"two checkpoints have the same training time ({times}); a trajectory needs distinct times")
        if len({(c.ext.heads, c.ext.param) for c in cases}) > 1:
            raise ValueError("the checkpoints of one run must have the same heads and parametrisation; these differ "
                             f"({sorted({(c.ext.heads, c.ext.param) for c in cases})}): audit them separately")
    elif len(cases) == 1:
        why = "one checkpoint"
    return AuditPlan(request, cases, problem, trajectory, why, lr, lr_source)


def _time_of(request: AuditRequest, e, k: int, m: int) -> tuple[Optional[float], Optional[str]]:
    """The training time of checkpoint k in this project's units, and where it came from."""
    scale = (1.0 / m if request.loss_units == "mean" else 1.0)
    units = ("t = lr x steps / m (the trainer's loss averaged over the m tasks)" if request.loss_units == "mean"
             else "t = lr x steps (the trainer's loss summed over the tasks)")
    if request.times is not None:
        return float(request.times[k]), "--times"
    if request.steps is not None:
        return float(request.lr) * float(request.steps[k]) * scale, f"--steps with --lr: {units}"
    if e.time is not None:
        return float(e.time), e.time_source
    if e.step is not None and request.lr is not None:
        return float(request.lr) * e.step * scale, f"the file's step with --lr: {units}"
    return None, None


def _trainer_step(request: AuditRequest, exts, m: int) -> tuple[Optional[float], str]:
    """The trainer's gradient step in this project's units (the O(lr) shift of the phase times):
    --lr converted by the loss units, or a project checkpoint's own (time / step)."""
    if request.lr is not None:
        return (float(request.lr) / m if request.loss_units == "mean" else float(request.lr)), "--lr"
    for e in exts:
        if e.layout == "project" and e.time is not None and e.step:
            return e.time / e.step, "the project file's train.lr"
    return None, "unknown"


# --------------------------------------------------------------------------- theory's points

REFERENCE_NAMES = {"allocated_fixed_point": "allocated fixed point", "one_head_optimum": "one-head optimum",
                   "best_decomposable": "best decomposable (same H)", "linear_attention": "linear attention"}


# --------------------------------------------------------------------------- where a model stands

def _share(meas) -> tuple[Optional[float], str]:
    """(share, how): the movable off-D part over the function-relevant norm (:data:`ON_D_SHARE`), or
    without weights the file's off-D residual, or unknown (None)."""
    split = meas.split
    if split is not None:
        relevant = math.sqrt(max(split["norm"] ** 2 - split["gradient_free"] ** 2, 0.0))
        return (float(split["movable"] / relevant) if relevant > 0 else 0.0), "movable off-D share"
    if meas.residual is not None:
        return float(meas.residual), "off-D residual from the file (no weights to split it)"
    return None, "unknown"


def words(meas, cfg) -> tuple[str, str]:
    """(label, sentence): what the model is, in the readout's words."""
    share, _ = _share(meas)
    a = meas.allocation
    zs = [i for i, z in enumerate(meas.zero_sum) if math.isfinite(z) and z <= ZERO_SUM_SHARE]
    if share is not None and share >= OFF_D_SHARE:
        place = f"off D ({share:.2f} of its movable weights lie off D)"
        label = "off D"
    elif share is not None and share > ON_D_SHARE:
        place, label = f"partly off D (share {share:.2f})", "partly off D"
    else:
        place, label = "on D" + (f" (off-D share {share:.2g})" if share is not None else ""), None
    if a["allocated"] and cfg.heads >= cfg.m:
        what = "allocated: " + ", ".join(f"task {i} on head {h}" for i, h in enumerate(a["serving_head"]))
        label = label or "allocated"
    elif zs:
        what = (f"zero-sum OV groups on task(s) {zs} (heads cancelling the softmax's constant part: "
                "linear-attention-like)")
        label = label or "zero-sum pairs"
    elif a["superposition"]:
        what = f"a signed superposition (opposite-sign off-task share {a['opposite_sign_share']:.2f})"
        label = label or "superposition"
    else:
        what = (f"mixed (heads sharing tasks with one sign: same-sign off-task share {a['same_sign_share']:.2f})")
        label = label or "mixed"
    return label, f"{place}; its projection onto D is {what}"


def domain(cfg, meas) -> dict:
    """Whether the allocated account (claims 4-5) applies to this model, from its readout: H >= m,
    on D (:data:`ON_D_SHARE`), the readout known.  ``claims.core.run_status`` then adds
    saturation, leaving allocation and convergence."""
    reasons = []
    share, how = _share(meas)
    if cfg.heads < cfg.m:
        reasons.append(f"H={cfg.heads} < m={cfg.m}: some head serves several tasks, not the allocated point")
    if share is None:
        reasons.append("its off-D part is unknown")
    elif share > ON_D_SHARE:
        reasons.append(f"off D: {how} {share:.3g} > {ON_D_SHARE:g} (the allocated account is a statement about D)")
    return {"inside": not reasons, "reasons": reasons, "off_D_share": share, "share_how": how,
            "conditions": f"H >= m, on D ({how} <= {ON_D_SHARE:g}), allocated, not saturated, converged"}


def convergence(plan: AuditPlan, measurements: list) -> tuple[Optional[bool], str, Optional[dict]]:
    """(converged, how, descent) of the last checkpoint of a trajectory (:data:`CONVERGED_RELATIVE`:
    the loss's fall over the last quarter of the run, paired on the same prompts), or the
    researcher's statement, or unknown (None)."""
    req = plan.request
    if plan.trajectory:
        last = plan.cases[-1]
        earlier = [c for c in plan.cases[:-1] if c.time <= last.time - 0.25 * (last.time - plan.cases[0].time)]
        prev = earlier[-1] if earlier else plan.cases[-2]
        d = external.loss_descent(prev.ext, last.ext, last.cfg, n=measurements[-1].projected_loss.n, seed=req.seed,
                                  chunk=measurements[-1].chunk)
        loss = measurements[-1].loss or measurements[-1].projected_loss
        if d is None:
            if req.assume_converged:
                return True, "assumed by the researcher (--assume-converged; no weights to measure the descent)", None
            return None, "unknown: these checkpoints carry no weights to measure the descent", None
        bound = Z_SE * d.se + CONVERGED_RELATIVE * loss.mean
        ok = bool(d.mean <= bound)
        how = (f"held-out loss at t = {prev.time:.4g} minus at t = {last.time:.4g}: {d.mean:.4g} ± {d.se:.2g} "
               f"(paired) {'<=' if ok else '>'} {Z_SE:g} se + {CONVERGED_RELATIVE:g} x loss = {bound:.4g}")
        return ok, how, {"mean": d.mean, "se": d.se, "n": d.n, "from_time": prev.time, "to_time": last.time,
                         "bound": bound}
    if req.assume_converged:
        return True, "assumed by the researcher (--assume-converged): one checkpoint cannot show it", None
    return None, ("not shown: one checkpoint cannot show that its loss had stopped falling (hand several "
                  "checkpoints of the run with their times, or state it with --assume-converged)"), None


# --------------------------------------------------------------------------- the comparisons

def check_fixed_point_loss(name, loss, excess: float, fixed: dict, config: str):
    """The model's held-out loss against the exact allocated fixed point's (two-sided).  Tolerance,
    fixed before comparing: Z_SE held-out standard errors + the loss the model's off-D parts add
    (held-out loss of the model minus that of its projection onto D, same prompts: what the readout
    leaves out) + the quadrature error bound.  Wrong predictions: the fixed point's loss x1.1, /1.1."""
    quad = fixed["error_estimate"]
    tol = Tolerance((noise_term(loss.se, "the held-out loss", loss.n), term("the loss its off-D parts add (the model "
                     "minus its projection onto D, same prompts)", excess), term("the quadrature bound", quad)))
    return compare(name, loss.mean, fixed["loss"], tol, se=loss.se, config=config, details={"role": "fixed point loss",
                   "tolerance_parts": {"noise": [Z_SE * loss.se], "fixed": [excess + quad], "n": loss.n}},
                   wrong=off_by(PERTURB_FACTOR, fixed["loss"], "the fixed point's loss"))


def served_curvature(omega_row, mu_value: float, task: int, tasks, L: int, sigma: float) -> np.ndarray:
    """The 2 x 2 Hessian in (omega_i, mu_i) of the exact loss of task i served by one head with
    logit coefficients ``omega_row`` (its other entries held): l(omega, mu) = r - 2 mu b(omega) +
    mu^2 C(omega) with b, C theory.exact.one_head_terms, so l_ww = mu^2 C'' - 2 mu b'',
    l_wm = 2 mu C' - 2 b', l_mm = 2 C; b', b'', C', C'' by central differences (step 1e-3 omega;
    theory's moments are exact to ~1e-12)."""
    from theory.exact import one_head_terms

    row = np.asarray(omega_row, float).copy()
    w0 = float(row[task])
    h = 1e-3 * max(abs(w0), 1e-2)

    def bc(w):
        row[task] = w
        b, C, _, _ = one_head_terms(row, tasks, L, sigma)
        return float(b[task]), float(C[task])
    (bm, Cm), (b0, C0), (bp, Cp) = bc(w0 - h), bc(w0), bc(w0 + h)
    db, dC = (bp - bm) / (2 * h), (Cp - Cm) / (2 * h)
    d2b, d2C = (bp - 2 * b0 + bm) / h ** 2, (Cp - 2 * C0 + Cm) / h ** 2
    mu = float(mu_value)
    return np.array([[mu * mu * d2C - 2 * mu * d2b, 2 * mu * dC - 2 * db], [2 * mu * dC - 2 * db, 2 * C0]])


def served_resolution(hessian: np.ndarray, cov: np.ndarray, n: int) -> dict:
    """How precisely n held-out prompts place the served optimum relative to the model's served
    point: the gradient of the loss in (omega_i, mu_i) vanishes at the optimum, and to first order
    it is Hs delta at a point delta away, so delta is resolved to the standard error of
    Hs^-1 g_hat, g_hat the held-out mean of the per-prompt gradients (covariance ``cov``):
    sqrt((Hs^-1 cov Hs^-1)_jj / n) -- the sandwich error of an M-estimate of the minimiser from n
    prompts.  Both at the model's own point, never at the prediction under test.  Where Hs is not
    positive definite the served point is not at a minimum of its task's exact loss, so not at the
    fixed point: the width is infinite, and :func:`check_served` fails structurally (error inf)."""
    Hs = np.asarray(hessian, float)
    if not np.all(np.linalg.eigvalsh(Hs) > 0):
        return {"omega": math.inf, "mu": math.inf, "positive_definite": False}
    A = np.linalg.inv(Hs)
    V = A @ np.asarray(cov, float) @ A.T / n
    return {"omega": math.sqrt(max(V[0, 0], 0.0)), "mu": math.sqrt(max(V[1, 1], 0.0)), "positive_definite": True}


def _entrywise(measured, predicted, tolerance) -> float:
    """max_j |measured_j - predicted_j| / tolerance_j; inf when a tolerance is infinite (the
    structural condition of :func:`served_resolution` failed) or an entry is not a number."""
    m, p, t = (np.asarray(x, float) for x in (measured, predicted, tolerance))
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(m)) and np.all(np.isfinite(p))):
        return math.inf
    return float(np.max(np.abs(m - p) / t))


def check_served(cfg, meas, noise: dict, fixed: dict, config: str):
    """The served (omega, mu) of each task (its serving head, numerics.evaluate) against the exact
    allocated fixed point (theory.exact.exact_fixed_point) moved by theory's shift of the served
    optimum by the off-task omega that head holds (theory.task_allocation.served_shift).  Tolerance
    per entry, fixed before comparing: Z_SE x the resolution of the served optimum by the held-out
    prompts (:func:`served_resolution`: the per-prompt gradient noise ``noise`` of
    numerics.external.gradient_noise, through theory's curvature :func:`served_curvature`, both at
    the model's point) + the readout's own spread, the off-D part of the very entries read
    (numerics.external's ``spread``: 0 on D).  Wrong predictions: omega* x1.1, mu* x1.1."""
    from theory.task_allocation import served_shift

    heads = list(meas.allocation["serving_head"])
    m = cfg.m
    idx = (np.asarray(heads), np.arange(m))
    measured = np.concatenate([meas.omega[idx], meas.mu[idx]])
    shift = served_shift(meas.omega, heads, cfg.tasks, cfg.L, cfg.sigma)
    om_s, mu_s = np.asarray(fixed["omega_star"], float), np.asarray(fixed["mu_star"], float)
    pred = lambda om, mu: np.concatenate([om, mu]) + shift.reshape(-1)  # noqa: E731
    curv = [served_curvature(meas.omega[h], meas.mu[h, i], i, cfg.tasks, cfg.L, cfg.sigma) for i, h in enumerate(heads)]
    res = [served_resolution(Hs, noise["cov"][h, i], noise["n"]) for Hs, (i, h) in zip(curv, enumerate(heads))]
    spread = meas.spread or {"omega": np.zeros((cfg.heads, m)).tolist(), "mu": np.zeros((cfg.heads, m)).tolist()}
    so, sm = np.asarray(spread["omega"])[idx], np.asarray(spread["mu"])[idx]
    noise_tol, fixed_tol = Z_SE * np.array([[r[k] for r in res] for k in ("omega", "mu")]).ravel(), np.r_[so, sm]
    tol = noise_tol + fixed_tol
    f = PERTURB_FACTOR
    g = np.asarray(noise["mean"])
    gse = np.asarray(noise["se"])
    return compare(f"served (omega, mu) vs the allocated fixed point, {config}", measured.tolist(),
                   pred(om_s, mu_s).tolist(), 1.0,
                   f"per entry: {Z_SE:g} x the resolution of the served optimum by {noise['n']} held-out prompts (the "
                   "per-prompt gradient noise through the exact one-task loss's curvature, both at the model's point) + "
                   "the off-D part of the entries read; max |d| / tolerance (inf: the model's served point is not "
                   "at a minimum of its task's exact loss, curvature not positive definite)",
                   wrong=[(f"omega* x {f:g}", pred(f * om_s, mu_s).tolist()),
                          (f"mu* x {f:g}", pred(om_s, f * mu_s).tolist())],
                   error=lambda a, b: _entrywise(a, b, tol), config=config,
                   details={"role": "served", "serving_heads": heads,
                            "tolerance_parts": {"noise": noise_tol.tolist(), "fixed": fixed_tol.tolist(), "n": noise["n"]},
                            "off_task_shift": shift.tolist(), "resolution": res, "hessian": [c.tolist() for c in curv],
                            "held_out_gradient": {"omega": g[0][idx].tolist(), "mu": g[1][idx].tolist(),
                                                  "omega_se": gse[0][idx].tolist(), "mu_se": gse[1][idx].tolist()}})


def check_side(name, loss, target: float, target_error: float, sign: int, what: str, config: str):
    """A boundary's one-sided check on theory's side: ``sign`` -1, not above ``target``; +1, not
    below it.  Tolerance Z_SE held-out standard errors + theory's error bound; no wrong prediction
    (a one-sided statement has no alternative value; claims.core's boundary checks)."""
    side = "not above" if sign < 0 else "not below"
    return compare(f"{name}: {side} {what}", loss.mean, target, Tolerance((noise_term(loss.se, "the held-out loss"),
                   term("theory's error bound", target_error)), f"boundary: {side} {what}"), side=side, se=loss.se,
                   config=config, details={"role": "side", "check": f"{side} {what}"})


def check_learned(name, loss, zero_loss: float, config: str):
    """Outside every account theory gives, the one statement left: the model learned something, its
    loss below the zero model's sum r_i (y_hat = 0) by more than Z_SE held-out standard errors (an
    untrained model, whose predictions are near 0, sits at sum r_i and fails).  One-sided, no wrong
    prediction (as :func:`check_side`)."""
    z, check = Z_SE * loss.se, f"below the zero model's loss sum r_i by more than {Z_SE:g} se (it learned something)"
    return compare(f"{name}: {check}",
                   loss.mean, zero_loss, 0.0, f"one-sided: measured + {Z_SE:g} held-out standard errors ({loss.se:.3g}) "
                   "must lie below sum r_i", side="not above", error=lambda m, p: max(0.0, m + z - p),
                   se=loss.se, config=config, details={"role": "learned", "check": check})


def check_best_decomposable(name, loss, best: dict, fixed: Optional[dict], config: str):
    """A model that left allocation for a superposition against the best decomposable point of the
    same H, signs free (boundary-left-allocation's account): two-sided, tolerance Z_SE x
    sqrt(se^2 + se_best^2) (the two Monte-Carlo losses, independent prompts); wrong prediction: the
    allocated fixed point (a superposition that merely equals the allocated loss is not elsewhere)."""
    se = math.hypot(loss.se, best["se"])
    return compare(f"{name}: vs the best decomposable point of the same H", loss.mean, best["loss"],
                   Tolerance((noise_term(se, "the difference of the two held-out losses"),)),
                   wrong=(() if fixed is None else (("the allocated fixed point", fixed["loss"]),)), se=loss.se,
                   config=config, details={"role": "best decomposable",
                                           "check": "vs the best decomposable point of the same H"})


def position(loss, refs: dict) -> dict:
    """The model's loss over each available reference point: ratio and difference with standard
    errors (independent estimates; theory's exact points have se 0) and the relation (below /
    above / indistinguishable at Z_SE standard errors + theory's error bound).  Reported, not
    judged."""
    out = {}
    for key, r in refs.items():
        if not r.get("available"):
            out[key] = {"available": False, "reason": r.get("reason")}
            continue
        diff_se = math.hypot(loss.se, r.get("se") or 0.0)
        ratio = loss.mean / r["loss"]
        ratio_se = abs(ratio) * math.hypot(loss.se / loss.mean if loss.mean else 0.0,
                                           (r.get("se") or 0.0) / r["loss"])
        diff = loss.mean - r["loss"]
        margin = Z_SE * diff_se + (r.get("error_estimate") or 0.0)
        rel = "below" if diff < -margin else "above" if diff > margin else "indistinguishable"
        out[key] = {"available": True, "loss": r["loss"], "ratio": ratio, "ratio_se": ratio_se, "difference": diff,
                    "difference_se": diff_se, "relation": rel}
    return out


# --------------------------------------------------------------------------- how many prompts

def prompts_needed(comparisons) -> tuple[float, str]:
    """The fewest held-out prompts at which agreement implies that every wrong prediction is rejected,
    and the wrong prediction that sets it.  A comparison's tolerance per entry j is
    noise_j sqrt(n0 / n) + fixed_j (``details["tolerance_parts"]`` at n0 prompts: Z_SE standard errors,
    and what no number of prompts shrinks); a model within it of the prediction p lies more than
    d_j - tol_j from a wrong prediction p' (d_j = |p'_j - p_j|), rejected once tol_j < d_j / 2 in one
    entry: n > n0 (noise_j / (d_j / 2 - fixed_j))^2.  From the noise and theory's prediction alone,
    never from the measured discrepancy, so the count cannot steer a verdict; inf where no entry of
    some wrong prediction can get there (its fixed parts alone exceed d_j / 2)."""
    need, what = 0.0, ""
    values = lambda x: np.asarray(list(x.values()) if isinstance(x, dict) else x, float).ravel()  # noqa: E731
    for c in comparisons:
        parts = c.details.get("tolerance_parts")
        for q in (c.perturbations if parts else ()):
            if "edge" in q.details or "predicted" not in q.details:
                continue
            room = np.abs(values(q.details["predicted"]) - values(c.predicted)) / 2 - np.asarray(parts["fixed"], float)
            ratio = np.asarray(parts["noise"], float) / np.where(room > 0, room, 1.0)
            n_j = float(np.min(np.where(room > 0, parts["n"] * ratio ** 2, math.inf)))
            if n_j > need:
                need, what = n_j, q.description
    return need, what


def sized_count(need: float) -> Optional[int]:
    """The prompts to measure for an estimated need: SIZING_MARGIN over it, in whole pilots' worth."""
    return None if not math.isfinite(need) else int(math.ceil(SIZING_MARGIN * need / PILOT_PROMPTS)) * PILOT_PROMPTS


def undecided_reason(comparisons, n: int, seconds_per_prompt: float) -> Optional[str]:
    """Why comparisons that all agree cannot decide -- a wrong prediction or edge probe not rejected --
    and what would: the prompts :func:`prompts_needed` names, or that no count of them would.  None
    where they decide (a disagreement is conclusive; or every wrong prediction is rejected)."""
    missed = [q.description for c in comparisons for q in c.perturbations if not q.rejected]
    if not missed or not all(c.agrees for c in comparisons):
        return None
    need, what = prompts_needed(comparisons)
    count = sized_count(need)
    head = f"agrees, but on {n} held-out prompts does not reject {', '.join(map(repr, missed))}"
    if count is None:
        return (f"{head}; no number of prompts would: the tolerance's parts that do not shrink with them exceed "
                f"half the distance to {what!r}")
    if count > n:
        return f"{head}; needs {count} prompts (about {count * seconds_per_prompt:.0f} s): --prompts {count}"
    return f"{head} at its tolerance"


# --------------------------------------------------------------------------- one model

@dataclass(frozen=True)
class ModelCase:
    """The profile of one judged model's spec (everything measured, compared by :func:`evaluate_model`)."""

    case: object
    meas: object
    refs: dict
    converged: tuple
    learned_check: bool = True
    # False: a model outside every side theory gives and not shown converged is undecided (the learned-
    # something check asks it of a trained model; a run cut short by design, claims.authors_replica's, is not one).
    sizing: Optional[dict] = None
    # How :func:`sized` chose the held-out prompts (None: the request's count).


def sized(mc: ModelCase, req: AuditRequest, progress=no_progress) -> ModelCase:
    """The judged model measured on the held-out prompts its comparisons need (:func:`prompts_needed`
    on the pilot's comparisons, :func:`sized_count`), at most ``max_prompts`` and what the pilot's
    rate fits in ``max_seconds``.  Decided from the pilot's noise and theory's predictions only."""
    try:
        pilot = evaluate_model(Context(p=mc, profile="audit", problem=None))
    except Exception:       # the judged evaluation raises it again: the result's error
        return mc
    n0, rate = mc.meas.projected_loss.n, pilot.details["seconds_per_prompt"]
    cap = max(n0, min(int(req.max_prompts), int(req.max_seconds / max(rate, 1e-12))))
    count = sized_count(prompts_needed(pilot.comparisons)[0])
    n = n0 if count is None else min(max(count, n0), cap)
    if n > n0:
        progress(f"measuring on {n} held-out prompts (sized from a pilot of {n0})", 0.9)
    meas = external.measure(mc.case.ext, mc.case.cfg, n=n, seed=req.seed) if n > n0 else mc.meas
    return dataclasses.replace(mc, meas=meas, sizing={"pilot": n0, "needed": count, "cap": cap, "n": n,
                                                      "seconds_per_prompt": rate})


def evaluate_model(ctx) -> Outcome:
    """The comparisons of one model (module docstring); one not made is a row saying why."""
    mc: ModelCase = ctx.p
    case, meas, refs, cfg = mc.case, mc.meas, mc.refs, mc.case.cfg
    converged, conv_how, descent = mc.converged
    loss = meas.loss if meas.loss is not None else meas.projected_loss
    loss_what = "held-out loss" if meas.loss is not None else "held-out loss of the readout's point on D (no weights)"
    dom = domain(cfg, meas)
    run = {"omega": meas.omega, "allocation": meas.allocation, "converged": bool(converged)}
    status, sign = run_status(cfg, run, dom)
    if converged is None and status.startswith("not converged"):
        status = "not shown converged (" + conv_how + ")" + ("" if meas.allocation["allocated"] else (
            f"; heads not yet pruned: off-task share {meas.allocation['same_sign_share']:.2f}"))
    config = config_label(cfg)
    fixed, best = (refs.get(k, {}) if refs.get(k, {}).get("available") else None
                   for k in ("allocated_fixed_point", "best_decomposable"))
    name = f"{case.ext.summary()['name']}"
    comps, rows, not_made, noise_seconds = [], [], [], 0.0
    excess = max(0.0, meas.loss.mean - meas.projected_loss.mean) if meas.loss is not None else 0.0
    if fixed is None and (status == "inside" or sign != 0):
        not_made.append(("vs the exact allocated fixed point", refs["allocated_fixed_point"].get("reason")))
    if status == "inside" and fixed is not None:
        c = check_fixed_point_loss(f"{name}: {loss_what} vs the exact allocated fixed point, {config}", loss, excess,
                                   fixed, config)
        comps.append(c)
        rows.append(headline_row(c, se=loss.se))
        t0 = time.perf_counter()
        noise = external.gradient_noise(meas.omega, meas.mu, cfg, n=loss.n, seed=meas.seed, chunk=meas.chunk)
        noise_seconds = time.perf_counter() - t0
        s = check_served(cfg, meas, noise, fixed, config)
        comps.append(s)
        rows.append(headline_row(s, theory=None, measured=None, tolerance=1.0,
                                 name="served (omega, mu) vs the allocated fixed point (max |d|/tol)"))
    elif sign != 0 and fixed is not None:
        comps.append(check_side(f"{name}: {loss_what}", loss, fixed["loss"], fixed["error_estimate"], sign,
                                "the exact allocated fixed point", config))
        if sign < 0 and best is None:
            not_made.append(("vs the best decomposable point of the same H", refs["best_decomposable"].get("reason")))
        elif sign < 0:
            comps.append(check_best_decomposable(f"{name}: {loss_what}", loss, best, fixed, config))
    elif mc.learned_check or converged:
        comps.append(check_learned(f"{name}: {loss_what}", loss, float(sum(cfg.tasks)), config))
    else:
        not_made.append(("whether it learned something", "a run cut short is not asked (not shown converged)"))
    rows.extend(headline_row(c, se=loss.se) for c in comps if c.details.get("role") in ("side", "best decomposable",
                                                                                       "learned"))
    rows.extend(reported_row(f"not compared: {what} ({why})", None, config=config) for what, why in not_made)
    pos = position(loss, refs)
    for key, p in pos.items():
        if p.get("available"):
            rows.append(reported_row(f"{loss_what} / {REFERENCE_NAMES[key]} (reported)", p["ratio"], theory=1.0,
                                     se=p["ratio_se"], config=config))
        else:
            rows.append(reported_row(f"{REFERENCE_NAMES[key]}: not computed ({p['reason']})", None, config=config))
    label, sentence = words(meas, cfg)
    rate = (meas.seconds + noise_seconds) / loss.n      # wall seconds per held-out prompt
    details = {"checkpoint": case.ext.summary(), "status": status, "side": sign, "domain": dom,
               "converged": {"value": converged, "how": conv_how, "descent": descent}, "words": label,
               "readout_sentence": sentence, "position": pos, "loss_what": loss_what, "loss": dataclasses.asdict(loss),
               "config": config, "not_compared": [{"what": w, "why": y} for w, y in not_made], "sizing": mc.sizing,
               "seconds_per_prompt": rate}
    undecided = (undecided_reason(comps, loss.n, rate) if comps else f"{status}: no side of theory, and a run cut "
                 "short is not asked whether it learned something (not shown converged)")
    return Outcome(comps, rows, details=details, theory={k: v.get("loss") for k, v in refs.items()},
                   numerics={"loss": loss.mean, "se": loss.se, "omega": meas.omega.tolist(), "mu": meas.mu.tolist()},
                   undecided=undecided)


def model_findings(result: ClaimResult) -> list:
    d = result.details
    if "checkpoint" not in d:
        return []
    name, loss = d["checkpoint"]["name"], d["loss"]
    out = []
    if d["status"] == "inside":
        lc, sc = (next((c for c in d["comparisons"] if c["details"].get("role") == r), None)
                  for r in ("fixed point loss", "served"))
        ok = all(c["agrees"] for c in d["comparisons"])
        resolved = all(p["rejected"] for c in d["comparisons"] for p in c["perturbations"])
        out.append(finding(result, "holds" if ok and resolved else "stops",
                           "{name} ({config}) is allocated and on D: held-out loss {loss} against the exact allocated "
                           "fixed point {fixed} (tolerance {tol}); its served (omega, mu) lie at {served} of their "
                           "tolerance (worst |d|/tol)" + ("" if resolved else "; undecided: {why}") + ".", name=name,
                           config=d["config"], loss=(loss["mean"], loss["se"]), why=d.get("undecided"),
                           fixed=lc["predicted"] if lc else None, tol=lc["tolerance"] if lc else None,
                           served=sc["error"] if sc else None))
    else:
        c = d["comparisons"][0] if d.get("comparisons") else None
        check = (c["details"].get("check", c["name"]) + " ({target}): " + ("holds" if c["agrees"] else "contradicted")) \
            if c else "no check"
        out.append(finding(result, "stops", "{name} ({config}) is outside the paper's allocated account ({status}): "
                           "{what} {loss}; checked " + check + ".", name=name, config=d["config"], status=d["status"],
                           what=d["loss_what"], loss=(loss["mean"], loss["se"]), target=c["predicted"] if c else None))
    ratios = {k: (p["ratio"], p["ratio_se"]) for k, p in d["position"].items() if p.get("available")}
    if ratios:
        parts = ", ".join(f"{fmt(v, s)} x the {REFERENCE_NAMES[k]}" for k, (v, s) in ratios.items())
        out.append(finding(result, "beyond", "{name}: {sentence}; its loss is " + parts.replace("{", "{{").replace("}", "}}")
                           + ".", name=name, sentence=d["readout_sentence"],
                           **{f"ratio_{k}": v for k, v in ratios.items()}))
    return out


def _model_entry(case, meas, refs, result_id, status=None, converged=None) -> dict:
    """The claims.json ``model`` entry of one checkpoint (docs/audit.md lists every field)."""
    cfg, loss, m = case.cfg, meas.loss, case.cfg.m
    (label, sentence), (share, how) = words(meas, cfg), _share(meas)
    return {
        "index": case.index, "checkpoint": case.ext.summary(), "time": case.time, "time_source": case.time_source,
        "configuration": {"tasks": list(cfg.tasks), "heads": cfg.heads, "L": cfg.L, "sigma": cfg.sigma,
                          "basis": cfg.basis, "basis_seed": cfg.basis_seed, "param": cfg.param,
                          "logit_scale": cfg.logit_scale},
        "readout": {"omega": meas.omega.tolist(), "mu": meas.mu.tolist(), "residual": meas.residual,
                    "off_D": {**(meas.split or {}), "share": share, "share_how": how}, "spread": meas.spread,
                    "balance": meas.balance, "allocation": meas.allocation, "zero_sum_ratio": list(meas.zero_sum),
                    "words": label, "sentence": sentence},
        "held_out_loss": None if loss is None else {
            "mean": loss.mean, "se": loss.se, "n": loss.n, "units": SUM_UNITS, "seed": meas.seed, "chunk": meas.chunk,
            "per_task_mean": {"mean": loss.mean / m, "se": loss.se / m,
                              "units": "the authors' MSELoss: averaged over the m tasks (our loss / m)"}},
        "projected_loss": {**dataclasses.asdict(meas.projected_loss), "what": "the reduced model at the readout (omega, mu): the "
                           "loss of the model's projection onto D, same prompts"},
        "theory": refs,
        "position": position(loss if loss is not None else meas.projected_loss, refs),
        "judged": result_id, "status": status, "converged": converged,
        "missing": list(case.ext.missing), "records": case.ext.records,
        "seconds": meas.seconds, "cpu_seconds": meas.cpu_seconds,
    }
