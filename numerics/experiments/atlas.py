"""The atlas point: one full model trained from a stated start, measured for the
phase diagrams of the atlas ids (``claims.atlas``).

A sweep point of ``model = "atlas"`` (``numerics.sweep``) is

    {"model": "atlas", "problem": {ProblemConfig fields}, "train": {AtlasSchedule fields, "seed"}}

The start is ProblemConfig's own initialisation (``init``, ``init_scale``, ``init_seed``,
``logit_scale``: the patterns ``decomposable`` (balanced), ``random_full``, ``uniform_full``
(PyTorch's default at s0 = 1 with logit scale sqrt(d+m)), ``unbalanced_decomposable``), or,
with ``start = "allocated"``, theory's allocated point with every off-task value set to the
small balanced ``start_mu0`` (``numerics.saddle.allocated_model``: the value a run passing
the allocation has; the exact allocated point, off-task channels empty, is never left).

:func:`run_point` trains once (``numerics.train.train``, one torch thread) and returns what
classification needs, as plain JSON (:func:`train_atlas` says what each number is); the
class itself is :func:`point_class`: the one classifier, ``numerics.evaluate.end_class``, of the
point's readout, off-D rule and convergence flag (below).  A cell's seeds are counted by class
(:func:`cell_mix`: ``numerics.experiments.starts.outcome_mix``, each class's binomial interval
and loss ratios), never summarised by one class unless every seed shares it.  The claims read these results from the sweep
store (``python -m reports.build --only atlas-... --from-sweep DIR``) and train nothing.

Reference numbers stored with each point, computed on the worker (cached per process, so a
configuration repeated in a grid is paid once per worker): theory.exact's allocated loss at
(tasks, L, sigma) (H >= m), the best decomposable point of the same H with signs free
(``numerics.experiments.probes.best_decomposable``, a reduced search size stated in
:data:`BEST_SEARCH`), and, for the allocated start, theory.saddle's escape prediction with its
measured seed input (``numerics.saddle.gradient_variance_measurement``).
"""
from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from numerics.config import ProblemConfig
from numerics.evaluate import (OUTCOME_CLASSES, SUPERPOSED_SHARE, allocation, crossing_time, end_class, held_out_loss,
                               line_fit)
from numerics.experiments.converged import converged_for, last_quarter, pop_seed, stage_descent, stage_tolerance
from numerics.engine import kind, need
from numerics.experiments import active_store, one_thread
from numerics.evaluate import Z_SE as Z_CONVERGED  # the report's one tolerance multiplier
from numerics import evaluate
from numerics.experiments.starts import factor_norm_sq, merged_residual_split, off_D_test  # the one off-D rule
from numerics.train import TrainConfig, train


BEST_SEARCH = {"random_starts": 1, "fit_elements": 2 ** 17, "eval_prompts": 2048, "seed": 0}
"""The best decomposable point's search (numerics.experiments.probes.best_decomposable) at a
size a sweep worker pays once per configuration: one random start besides theory.optimality's
structured starts, fit on 2^17 prompt tokens x heads, evaluated on 2048 prompts (se ~1%)."""

STARTS = ("config", "allocated")
PATTERNS = {"decomposable": "balanced decomposable", "random_decomposable": "balanced decomposable (random)",
            "random_full": "random full", "uniform_full": "PyTorch-default uniform",
            "unbalanced_decomposable": "unbalanced", "given": "given"}
"""Reader's names of ProblemConfig's init patterns (the atlas's row labels)."""


@dataclass(frozen=True)
class AtlasSchedule:
    """How an atlas point trains: ``time`` at step ``lr`` on fresh batches of ``batch`` prompts
    (``numerics.train.train``), ``records`` evenly spaced readouts (the escape time is read off
    them); ``start``: ``"config"`` (ProblemConfig's init) or ``"allocated"`` (theory's allocated
    point, off-task values ``start_mu0``); ``threshold``: the opposite-sign off-task share whose
    first crossing is the escape time; ``n_eval``: held-out prompts per loss; ``best_search``:
    whether to store the best decomposable point of the same H; ``panel``: which panel of
    the atlas draws the point ("initialisation", "heads", "noise", "batch"; it enters the
    point's id but not the run)."""

    lr: float = 0.1
    time: float = 40.0
    batch: int = 256
    records: int = 41
    start: str = "config"
    start_mu0: float = 0.05
    threshold: float = SUPERPOSED_SHARE
    n_eval: int = 8192
    best_search: bool = True      # store the best decomposable point of the same H (BEST_SEARCH)
    panel: str = ""               # the atlas panel the point is drawn in (a label: the run ignores it)


def check_point(point: dict, problem: bool = True):
    """A point's (ProblemConfig, AtlasSchedule, seed), validated.  The grid calls it with
    ``problem=False`` on every point before anything runs (a bad schedule is structural: it
    stops the sweep before it starts; a value ProblemConfig rejects fails that point only, as
    for every model); returns (None, schedule, seed) then."""
    if point.get("model") != "atlas":
        raise ValueError(f"an atlas point has model 'atlas', got {point.get('model')!r}")
    fields = dict(point.get("train", {}))
    seed = pop_seed(fields)
    sch = AtlasSchedule(**fields)
    if not isinstance(sch.panel, str) or not isinstance(sch.best_search, bool):
        raise ValueError(f"grid: train.panel must be a string and train.best_search a boolean, got "
                         f"{sch.panel!r}, {sch.best_search!r}")
    if sch.start not in STARTS:
        raise ValueError(f"grid: train.start must be one of {STARTS}, got {sch.start!r}")
    for name in ("batch", "records", "n_eval"):
        v = getattr(sch, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise ValueError(f"grid: train.{name} must be an integer >= 2, got {v!r}")
    for name in ("start_mu0", "threshold"):
        v = getattr(sch, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"grid: train.{name} must be a finite number > 0, got {v!r}")
    try:
        TrainConfig(lr=sch.lr, time=sch.time, batch=sch.batch, seed=seed, records=sch.records)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"grid: train: {exc}") from None
    if not problem:
        return None, sch, int(seed)
    cfg = ProblemConfig.from_dict(point["problem"])
    if sch.start == "allocated" and (cfg.param != "factored" or cfg.heads < max(cfg.m, 2)):
        raise ValueError("grid: start = 'allocated' needs param = 'factored' and heads >= max(m, 2) (the saddle "
                         f"needs an off-task entry); got param={cfg.param!r}, heads={cfg.heads}, m={cfg.m}")
    return cfg, sch, int(seed)


def atlas_point(cfg: ProblemConfig, schedule: AtlasSchedule, seed: int) -> dict:
    """The sweep point of (cfg, schedule, seed) (its identity in the store)."""
    return {"model": "atlas", "problem": cfg.to_dict(), "train": {**asdict(schedule), "seed": int(seed)}}


def normalise_point(point: dict):
    """What makes two atlas points the same run (for ``numerics.experiments.Store.lookup``)."""
    cfg, sch, seed = check_point(point)
    return json.dumps(cfg.to_dict(), sort_keys=True), sch, seed


def run_point(point: dict) -> dict:
    """The sweep's point function for ``model = "atlas"``: :func:`train_atlas` as JSON."""
    cfg, sch, seed = check_point(point)
    return train_atlas(cfg, sch, seed)


# ---------------------------------------------------------------------------------------
# reference numbers (cached per process)
# ---------------------------------------------------------------------------------------

@lru_cache(maxsize=128)
def theory_allocated_loss(tasks: tuple, heads: int, L: int, sigma: float):
    """theory.exact's allocated loss at (tasks, L, sigma) (the sum over tasks of the one-head
    fixed points; surplus heads idle), or None for H < m (no allocated point)."""
    if heads < len(tasks):
        return None
    from theory.exact import exact_fixed_point
    return float(exact_fixed_point(tasks, L, sigma)["loss"])


@lru_cache(maxsize=128)
def best_decomposable_summary(tasks: tuple, heads: int, L: int, sigma: float, device: str) -> dict:
    from numerics.experiments.probes import best_decomposable
    b = best_decomposable(tasks, heads, L, sigma, BEST_SEARCH["seed"], device, BEST_SEARCH["random_starts"],
                          BEST_SEARCH["fit_elements"], BEST_SEARCH["eval_prompts"])
    return {"loss": b.loss, "se": b.se, "n_eval": b.n_eval, "family": b.family,
            "omega": [list(r) for r in b.omega], "mu": [list(r) for r in b.mu]}


VARIANCE_SEED = 54321
"""The prompts of the atlas's measured seed input dS: one draw for every point of a configuration,
so that the cells' prediction T(B) is the configuration's, whichever seed a point trains with."""


def _saddle_prediction(cfg: ProblemConfig, sch: AtlasSchedule) -> dict:
    """theory.saddle's escape time T(B) for this run (theory.saddle.escape_prediction: rate
    gradient descent's 2 log(1 + lr a)/lr; seed from the per-prompt gradient variance dS
    measured at the allocated point; threshold ``sch.threshold`` x mu*), with its standard
    error from dS's."""
    from numerics import saddle as ns
    from theory import saddle as th
    var = ns.gradient_variance_measurement(cfg, n=4096, seed=VARIANCE_SEED)
    p = th.escape_prediction(cfg.tasks, cfg.heads, cfg.L, cfg.sigma, sch.lr, (sch.batch,), sch.start_mu0,
                             sch.threshold, var.dS, var.dS_se)
    return {"a": p["a"], "rate_flow": p["rate_flow"], "rate_gd": p["rate_gd"], "slope_pred": p["slope_pred"],
            "slope_additive": p["slope_additive"], "K": p["K"], "mu_star": p["mu_star"], "entries": p["entries"],
            "dS": var.dS.tolist(), "dS_se": var.dS_se.tolist(), "seed_level": p["seed_level"][0],
            "T_pred": p["T_pred"][0], "T_pred_se": p["T_pred_se"][0], "T_pred_rate_a": p["T_pred_rate_a"][0]}


# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------

@one_thread
def train_atlas(cfg: ProblemConfig, sch: AtlasSchedule, seed: int = 0) -> dict:
    """Train the full model of ``cfg`` from its start by ``sch`` and measure it.  Returns:

    - ``omega``, ``mu`` (H x m), ``allocation`` (numerics.evaluate.allocation(...).to_dict());
    - ``residual_start``/``residual_end``: theory.initialisation.residual_split of the merged
      weights (``movable``, ``gradient_free``, ``norm`` and the ``*_relative`` parts);
    - ``norm0_sq``/``norm_end_sq``: |theta|^2 of the trainable factors; ``warmup``: theory's
      warm-up law for this start and run length (``c4``, ``exponent`` = 8 c4 |theta0|^2 t_end,
      ``growth`` = 1 / (1 - min(exponent, 1/2)), ``bound`` = movable(0) x growth: what the start
      can carry off D through the warm-up); ``off_D``: movable part above ``bound`` and >=
      OFF_D_RELATIVE of ||(W, U)|| (numerics.experiments.starts.off_D_test, the report's one rule);
    - ``loss``, ``se``, ``n``: held-out loss at the final weights (numerics.evaluate); the descent fit
      over the last quarter (``descent_fit``: numerics.evaluate.descent_left on every record of
      it as paired snapshots, horizon the quarter's length: a single fixed-step stage has no
      polish, and its class is read at t_end, so the test asks whether the last quarter again
      would move the loss beyond the comparison's tolerance; ``descent``, ``descent_se``: its rate x the
      horizon; ``descent_left``); ``in_warmup`` (config starts: |theta_end|^2 < 2 |theta0|^2, the
      warm-up's sqrt 2 factor); ``converged``: not in warm-up while theory's warm-up law holds at
      t_end (exponent <= 1/2, as numerics.experiments.starts.end_states) and
      numerics.experiments.converged.converged_for at the tolerance of the loss comparison the
      point feeds, ``convergence_tolerance`` = Z_CONVERGED sqrt(se^2 + jitter^2) (the held-out se
      and the final iterate's fluctuation, the window's residual scatter: a fixed-step run has no
      polish to remove it);
    - ``t``, ``loss_curve``, ``opposite_share``, ``same_share``: per record; ``escape_time``:
      first crossing of ``threshold`` by the opposite-sign share (inf: none);
    - ``allocated_loss`` (theory.exact, None for H < m), ``best_decomposable`` (dict), and for
      the allocated start ``saddle`` (theory.saddle's T(B) with the measured seed input);
    - ``class`` (:func:`point_class`: numerics.evaluate.EndClass.to_dict()), ``seconds``,
      ``cpu_seconds``.

    A run that diverges (numerics.train.TrainingDiverged) returns ``diverged`` (the message),
    class "diverged", the start's numbers and the reference numbers, NaN for the rest."""
    from numerics.model import TrainingDiverged
    from theory.initialisation import warmup_quartic_constant
    t0, c0 = time.perf_counter(), time.process_time()
    model = _start_model(cfg, sch)
    norm0_sq = factor_norm_sq(model)
    split0 = merged_residual_split(model)
    tcfg = TrainConfig(lr=sch.lr, time=sch.time, batch=sch.batch, seed=seed, records=sch.records)
    # every record of the last quarter is a snapshot of the descent fit: a fixed-step run's
    # iterates jitter, and the fitted rate's standard error over a window of span s falls like
    # jitter / (s sqrt(k)) in the k snapshots (41 records: 11 in the last quarter)
    window = last_quarter(tcfg.record_steps())
    snaps = []

    def on_record(step, t, m, loss):
        if step in window:
            snaps.append((t, copy.deepcopy(m)))

    refs = _reference_numbers(cfg, sch)
    c4 = warmup_quartic_constant(cfg.tasks, cfg.heads, cfg.L, cfg.sigma, cfg.logit_scale)
    try:
        res = train(cfg, tcfg, start=model, on_record=on_record)
    except TrainingDiverged as exc:
        out = _diverged_result(cfg, sch, seed, str(exc), split0, norm0_sq, c4, refs)
    else:
        out = _trained_result(cfg, sch, seed, res, snaps, split0, norm0_sq, refs)
    out["seconds"] = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - c0
    return out


def _start_model(cfg: ProblemConfig, sch: AtlasSchedule):
    """The model the run starts from: ProblemConfig's initialisation, or theory's allocated
    point with off-task values ``sch.start_mu0``."""
    if sch.start == "allocated":
        from numerics.saddle import allocated_model
        return allocated_model(cfg, sch.start_mu0)
    from numerics.model import MultiHeadAttention
    return MultiHeadAttention(cfg)


def _reference_numbers(cfg: ProblemConfig, sch: AtlasSchedule) -> dict:
    """What the point's loss and escape time are compared with: theory.exact's allocated loss,
    the best decomposable point of the same H (when ``sch.best_search``), and theory.saddle's
    escape prediction (the allocated start only)."""
    tasks = tuple(cfg.tasks)
    return {"allocated_loss": theory_allocated_loss(tasks, cfg.heads, cfg.L, cfg.sigma),
            "best_decomposable": (best_decomposable_summary(tasks, cfg.heads, cfg.L, cfg.sigma, cfg.device)
                                  if sch.best_search else None),
            "saddle": _saddle_prediction(cfg, sch) if sch.start == "allocated" else None}


def _diverged_result(cfg: ProblemConfig, sch: AtlasSchedule, seed: int, message: str, split0: dict,
                     norm0_sq: float, c4: float, refs: dict) -> dict:
    """The result of a run that diverged: class "diverged", the start's numbers and the
    reference numbers, NaN for what the run would have measured."""
    nan = math.nan
    return {"config": cfg.to_dict(), "schedule": asdict(sch), "seed": int(seed), "diverged": message,
            "class": point_class({"diverged": message, "tasks": list(cfg.tasks)}), "converged": False,
            "in_warmup": False, "off_D": False,
            "residual_start": split0, "residual_end": {k: nan for k in split0}, "norm0_sq": norm0_sq,
            "warmup": {"c4": c4, "exponent": 8.0 * c4 * norm0_sq * sch.time}, "loss": nan, "se": nan,
            "escape_time": nan, "t": [], "opposite_share": [], **refs}


def _trained_result(cfg: ProblemConfig, sch: AtlasSchedule, seed: int, res, snaps: list, split0: dict,
                    norm0_sq: float, refs: dict) -> dict:
    """The result of a finished run (the keys :func:`train_atlas` lists), with its class."""
    final = res.final_model
    est = held_out_loss(final, n=sch.n_eval, seed=seed)
    descent = stage_descent(snaps, sch.n_eval, seed)      # None: fewer than 3 records in the last quarter
    split1 = merged_residual_split(final)
    norm1_sq = factor_norm_sq(final)
    warm = off_D_test(cfg, norm0_sq, split0, split1, sch.time)
    in_warmup = bool(sch.start == "config" and norm1_sq < 2.0 * norm0_sq)
    # the tolerance of the loss comparison the point feeds (its loss against theory.exact's and the
    # best decomposable point's), with the final iterate's fluctuation: no polish removes it
    tol = stage_tolerance(est.se, descent.jitter) if descent is not None else 0.0
    # as numerics.experiments.starts.end_states: a run counts as still in its warm-up (not converged)
    # only while theory's warm-up law holds at t_end (exponent <= 1/2); a larger start need not double
    # its norm, and the descent fit decides alone (``in_warmup`` itself is the raw flag the
    # initialisation panel's warm-up border reads)
    held = in_warmup and warm["exponent"] <= 0.5
    converged = bool(not held and descent is not None and converged_for({"descent_left": descent.left}, tol))
    shares = [allocation(r.omega, r.mu) for r in res.trajectory]
    out = {
        "config": cfg.to_dict(), "schedule": asdict(sch), "seed": int(seed),
        "omega": np.asarray(res.omega, float).tolist(), "mu": np.asarray(res.mu, float).tolist(),
        "allocation": allocation(res.omega, res.mu).to_dict(), "residual_start": split0, "residual_end": split1,
        "norm0_sq": norm0_sq, "norm_end_sq": norm1_sq,
        "warmup": {k: v for k, v in warm.items() if k != "off_D"}, "off_D": warm["off_D"],
        "loss": est.mean, "se": est.se, "n": est.n,
        "descent": descent.rate * descent.horizon if descent is not None else math.nan,
        "descent_se": descent.rate_se * descent.horizon if descent is not None else math.nan,
        "descent_left": descent.left if descent is not None else math.inf,
        "descent_fit": descent.to_dict() if descent is not None else None, "convergence_tolerance": tol,
        "in_warmup": in_warmup, "converged": converged,
        "t": [r.t for r in res.trajectory], "loss_curve": [r.loss for r in res.trajectory],
        "opposite_share": [s.opposite_sign_share for s in shares], "same_share": [s.same_sign_share for s in shares],
        "escape_time": crossing_time([r.t for r in res.trajectory], [s.opposite_sign_share for s in shares],
                                   sch.threshold),
        **refs,
        "steps": res.steps,
    }
    out["class"] = point_class(out)
    return out


def point_class(r: dict) -> dict:
    """The class of one point's result (numerics.evaluate.end_class: allocated / superposition on
    k of m tasks / off D / mixed / not converged / diverged, by precedence), as
    EndClass.to_dict(); read from the stored readout and flags, so a sweep stored before the
    classifier changed is classified by the current one."""
    if r.get("diverged"):
        cls = end_class(None, off_D=False, converged=False, diverged=True, reason=str(r["diverged"])).to_dict()
        return {**cls, "tasks": len(r.get("tasks") or (r.get("config") or {}).get("tasks") or ())}
    return end_class(r["allocation"], off_D=bool(r["off_D"]), converged=bool(r["converged"])).to_dict()


def from_stored(d: dict) -> dict:
    """A stored result with its non-finite floats (strings in JSON) turned back into floats."""
    def fix(v):
        if isinstance(v, str) and v in ("inf", "-inf", "nan"):
            return float(v)
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v
    return fix(d)


# ---------------------------------------------------------------------------------------
# reading a sweep of atlas points (the atlas ids, claims.atlas, draw them)
# ---------------------------------------------------------------------------------------

NO_SWEEP = ("the atlas trains nothing: build it from a sweep, e.g. `python -m numerics.sweep examples/atlas_tiny.toml "
            "--out D` then `python -m reports.build --only atlas-initialisation,atlas-heads,atlas-noise,atlas-batch "
            "--from-sweep D` (docs/atlas.md)")
"""What an atlas id says when it is built without a sweep."""


def panel_needs(panel: str) -> list:
    """The needs of ``panel`` read off the active sweep store: one "atlas" need per point of the
    panel (its ``[train] panel`` label) that the sweep's last grid (summary.json's ids) holds
    finished, in the store's order, then the "atlas_grid" need: the sweep and the grid's points it
    holds no finished result for (any panel), each with why.  Without a sweep the "atlas_grid" need
    of none (the claims then say how to build one: the atlas trains nothing); raises when the sweep
    holds no point of the panel."""
    st = active_store()
    if st is None:
        return [need("atlas_grid", sweep="", unheld=())]
    ids = last_grid_ids(st)
    out = []
    for rec in st.records:
        p = rec["point"]
        if p.get("model") != "atlas" or p.get("train", {}).get("panel") != panel:
            continue
        if ids is not None and rec.get("id") not in ids:
            continue
        out.append(atlas_need(*check_point(p)))
    if not out:
        raise ValueError(f"the sweep {str(st.path)!r} holds no finished atlas point of panel {panel!r} (points whose "
                         f"[train] panel = \"{panel}\"); run examples/atlas_tiny.toml or examples/atlas.toml into it")
    held = {rec.get("id") for rec in st.records}
    unheld = tuple(unheld_point(st.path, i) for i in sorted((ids or set()) - held))
    return out + [need("atlas_grid", sweep=str(st.path), unheld=unheld)]


def panel_points(results, panel: str) -> tuple[list[dict], list[dict]]:
    """The points of ``panel`` the plan read off the sweep ({"point", "result"}, in the plan's order:
    its "atlas" needs, :func:`panel_needs`) and the grid's points the sweep holds
    no finished result for, each with why (the "atlas_grid" need's, and any planned point the engine
    found no result of): reported, never compared.  The plan's needs are read off the results, as
    only the plan sees the sweep.  Raises without a sweep (the atlas trains nothing)."""
    grid = [n for n in results if n.kind == "atlas_grid"]
    if not grid or not grid[0].args["sweep"]:
        raise ValueError(NO_SWEEP)
    points, unheld = [], list(results[grid[0]]["unheld"])
    for n in results:
        if n.kind != "atlas" or n.args["schedule"].panel != panel:
            continue
        try:
            points.append({"point": atlas_point(n.args["cfg"], n.args["schedule"], n.args["train_seed"]),
                           "result": results[n]})
        except ValueError as exc:
            unheld.append({"id": None, "panel": panel, "why": str(exc)})
    if not points:
        raise ValueError(f"the sweep {results[grid[0]]['sweep']!r} holds no finished atlas point of panel {panel!r}")
    return points, unheld


def last_grid_ids(st):
    """The ids of the grid the sweep ran last (its summary.json), or None where it has none."""
    summary = Path(st.path) / "summary.json"
    if not summary.is_file():
        return None
    try:
        return set(json.loads(summary.read_text()).get("ids") or []) or None
    except (OSError, ValueError):
        return None


def unheld_point(sweep, point_id: str) -> tuple:
    """(id, panel or "", why) of a point of the grid the sweep holds no finished result for: its
    record's error (the point failed), or why its file is not used (numerics.stored.read_point:
    absent while the sweep runs or after it was interrupted, another code version, ...)."""
    from numerics.stored import code_version, read_point
    rec, reason = read_point(Path(sweep), f"{point_id}.json", code=code_version())
    if rec is None:
        return point_id, "", f"no usable record ({reason})"
    panel = str((rec.get("point", {}).get("train") or {}).get("panel", ""))
    error = str(rec.get("error") or "no result").strip().splitlines()
    return point_id, panel, "failed: " + (error[-1] if error else "no result")


def grid_of(points, row_key, col_key):
    """cells {(row, col): [result, ...]} with sorted row and column keys."""
    cells: dict = {}
    for x in points:
        cells.setdefault((row_key(x), col_key(x)), []).append(x["result"])
    rows = sorted({k[0] for k in cells}, key=_sort_key)
    cols = sorted({k[1] for k in cells}, key=_sort_key)
    return cells, rows, cols


def _sort_key(v):
    return tuple(_sort_key(x) for x in v) if isinstance(v, tuple) else ((0, v, "") if isinstance(v, (int, float))
                                                                       else (1, 0, str(v)))


def cell_mix(results) -> dict:
    """Where a cell's seeds ended: numerics.experiments.starts.outcome_mix of their classes
    (:func:`point_class`) at Z_CONVERGED, with the loss ratios to the cell's theory.exact
    allocated loss and best decomposable point (one configuration: the first result's)."""
    from numerics.experiments.starts import outcome_mix
    states = [{"class": point_class(r), "loss": r.get("loss", math.nan),
               "init_seed": (r.get("config") or {}).get("init_seed"), "data_seed": r.get("seed")} for r in results]
    refs = {"allocated_loss": results[0].get("allocated_loss"), "best_decomposable": results[0].get("best_decomposable")}
    return outcome_mix(states, Z_CONVERGED, refs)


def cell_class(results) -> tuple:
    """(the class name every seed of the cell shares, True), or (None, False) when the seeds end
    in different classes (the cell is then its counted mix, :func:`cell_mix`)."""
    labels = [point_class(r)["label"] for r in results]
    if len(set(labels)) == 1:
        return point_class(results[0])["name"], True
    return None, False


def mean_se(xs):
    """numerics.evaluate.mean_se of the finite values (an unmeasured point is no number of the sample)."""
    return evaluate.mean_se(xs, non_finite="drop")


def ratios(results) -> dict:
    """Mean held-out loss over theory.exact's allocated loss and over the best decomposable point."""
    alloc = mean_se([r["loss"] / r["allocated_loss"] for r in results if r.get("allocated_loss")])
    best = mean_se([r["loss"] / r["best_decomposable"]["loss"] for r in results if r.get("best_decomposable")])
    return {"over_allocated": alloc[0], "over_allocated_se": alloc[1], "over_best": best[0], "over_best_se": best[1]}


def panel_matrices(cells, rows, cols, row_label, col_label) -> dict:
    """The panel's maps: ``outcome`` (the code, index in OUTCOME_CLASSES, of the class every seed
    of a cell shares; None where the seeds disagree: ``mixes`` holds those cells' counted mixes),
    ``over_allocated`` and ``over_best`` (mean loss ratios), None where a cell is empty; labels;
    per-cell ``info`` (the class, its :func:`cell_mix`, the ratios, losses and escape times)."""
    M, R, Bm, info, mixes = [], [], [], {}, {}
    for r in rows:
        mrow, rrow, brow = [], [], []
        for c in cols:
            res = cells.get((r, c))
            if not res:
                mrow.append(None)
                rrow.append(None)
                brow.append(None)
                continue
            cls, agree = cell_class(res)
            rat, mix, key = ratios(res), cell_mix(res), f"{row_label(r)} | {col_label(c)}"
            mrow.append(OUTCOME_CLASSES.index(cls) if agree else None)
            rrow.append(rat["over_allocated"])
            brow.append(rat["over_best"])
            if not agree:
                mixes[key] = mix
            info[key] = {"class": cls, "seeds_agree": agree, "mix": mix,
                         "classes": [point_class(x)["label"] for x in res], **rat,
                         "loss": [x["loss"] for x in res], "escape_time": [x.get("escape_time") for x in res]}
        M.append(mrow)
        R.append(rrow)
        Bm.append(brow)
    return {"outcome": M, "over_allocated": R, "over_best": Bm, "row_labels": [row_label(r) for r in rows],
            "col_labels": [col_label(c) for c in cols], "info": info, "mixes": mixes}


def class_counts(cells) -> dict:
    """Over a panel's cells: per class name the cells whose seeds all share it, ``seeds_disagree``
    (cells whose seeds end in different classes), ``cells``; ``seeds`` per class label over every
    seed of the panel, ``n_seeds`` and the seeds per cell (``seeds_per_cell``, sorted)."""
    out = {c: 0 for c in OUTCOME_CLASSES}
    disagree, seeds = 0, {}
    for res in cells.values():
        cls, agree = cell_class(res)
        if agree:
            out[cls] += 1
        disagree += not agree
        for x in res:
            label = point_class(x)["label"]
            seeds[label] = seeds.get(label, 0) + 1
    return {**out, "seeds_disagree": disagree, "cells": len(cells), "seeds": seeds,
            "n_seeds": sum(len(res) for res in cells.values()),
            "seeds_per_cell": sorted({len(res) for res in cells.values()})}


def warmup_border(results_by_scale: dict) -> float | None:
    """The scale s0 at which the warm-up bound's exponent 8 c4 |theta0|^2 t_end reaches 1/2
    (theory.initialisation's small scale for this pattern), from the row's stored exponents by
    log-log interpolation (|theta0|^2 is a power of s0 for each pattern; extrapolated at the ends)."""
    pts = sorted((s, float(np.mean([r["warmup"]["exponent"] for r in rs]))) for s, rs in results_by_scale.items())
    pts = [(s, e) for s, e in pts if s > 0 and e > 0]
    if len(pts) < 2:
        return None
    ls, le = np.log([s for s, _ in pts]), np.log([e for _, e in pts])
    target = math.log(0.5)
    for k in range(len(pts) - 1):
        if (le[k] - target) * (le[k + 1] - target) <= 0 and le[k + 1] != le[k]:
            f = (target - le[k]) / (le[k + 1] - le[k])
            return float(math.exp(ls[k] + f * (ls[k + 1] - ls[k])))
    slope, icpt = np.polyfit(ls, le, 1)
    return float(math.exp((target - icpt) / slope)) if slope > 0 else None


def record_spacing(x) -> float:
    t = x["t"]
    return float(max(np.diff(t))) if len(t) > 1 else 0.0


def crossing_L(Ls, T, t_end):
    """The L at which theory's T(B) crosses t_end (log-linear interpolation), None if it does not."""
    for k in range(len(Ls) - 1):
        a, b = T[k] - t_end, T[k + 1] - t_end
        if a * b <= 0 and T[k + 1] != T[k]:
            f = a / (a - b)
            return float(math.exp(math.log(Ls[k]) + f * (math.log(Ls[k + 1]) - math.log(Ls[k]))))
    return None


def last_and_first(results_by_x: dict, before) -> tuple:
    """Along one row (x -> the cell's results): the largest x whose every run has property
    ``before`` and lies below the smallest x where no run has it, and that smallest x (None where
    absent): the measured border lies between them."""
    yes = sorted(x for x, rs in results_by_x.items() if all(before(r) for r in rs))
    no = sorted(x for x, rs in results_by_x.items() if not any(before(r) for r in rs))
    lo = max([x for x in yes if not no or x < min(no)], default=None)
    hi = min([x for x in no if lo is None or x > lo], default=None)
    return lo, hi


def ols_slope(x, y) -> tuple[float, float]:
    """Ordinary least-squares slope of y on x and its standard error (residual variance with
    n - 2 degrees of freedom); (nan, inf) with fewer than 4 points or one distinct x."""
    x = np.asarray(x, float)
    if x.size < 4 or np.unique(x).size < 2:
        return math.nan, math.inf
    fit = line_fit(x, y)
    return fit.slope, fit.slope_se


def escape_cells(cells: dict, keyfmt, t_end: float) -> list[dict]:
    """Per cell of an allocated-start panel: whether each seed's run left allocation by t_end
    (first crossing of the opposite-sign share, ``left``), theory.saddle's T_pred, its standard
    error and T_pred at rate a, and the record spacing; diverged cells are marked (claims.atlas_noise
    decides which cells a comparison can use)."""
    rows = []
    for key, res in cells.items():
        if any(x.get("diverged") for x in res):
            rows.append({"cell": keyfmt(key), "diverged": True})
            continue
        sd = res[0]["saddle"]
        rows.append({"cell": keyfmt(key), "left": [math.isfinite(x["escape_time"]) and x["escape_time"] <= t_end
                                                   for x in res],
                     "T_pred": sd["T_pred"], "T_pred_rate_a": sd["T_pred_rate_a"], "T_pred_se": sd["T_pred_se"],
                     "spacing": record_spacing(res[0]), "escape_times": [x["escape_time"] for x in res]})
    return rows


# ---------------------------------------------------------------------------------------
# per-row readouts of a panel (the atlas ids, claims.atlas, compare them with theory)
# ---------------------------------------------------------------------------------------

def warmup_row(by_scale: dict) -> dict:
    """One row of the initialisation panel (s0 -> the cell's results): the largest s0 whose runs
    are all still in warm-up at t_end below the smallest s0 where none is, that smallest s0, and
    the measured border between them (their geometric mean; None where either is absent)."""
    lo, hi = last_and_first(by_scale, lambda x: x["in_warmup"])
    return {"last_in_warmup": lo, "first_out": hi, "border": math.sqrt(lo * hi) if lo and hi else None}


def heads_row(by_heads: dict, m: int) -> dict:
    """One row of the heads panel (H -> the cell's results, in column order; m tasks): the
    measured border (the smallest H whose seeds all end allocated; inf: no such H although an H
    >= m converged with its seeds agreeing; None: undecided), each H's class (None: its seeds
    disagree: its counted mix is the panel's cell info), and over the seeds of the cells with H > m the superposition /
    off-D / not-converged counts and the mean loss over theory.exact's allocated loss."""
    classes = {h: cell_class(res) for h, res in by_heads.items()}
    allocated = [h for h, c in classes.items() if c == ("allocated", True)]
    above = [h for h, c in classes.items() if h >= m and c[1] and c[0] != "not converged"]
    surplus = [h for h in by_heads if h > m]
    names = [point_class(x)["name"] for h in surplus for x in by_heads[h]]
    return {"measured_border": min(allocated) if allocated else (math.inf if above else None),
            "classes": {h: c[0] for h, c in classes.items()},
            "superposition_above_m": names.count("superposition"), "off_D_above_m": names.count("off D"),
            "not_converged_above_m": names.count("not converged"), "seeds_above_m": len(names),
            "cells_above_m": len(surplus),
            "ratio_above_m": mean_se([ratios(by_heads[h])["over_allocated"] for h in surplus])}


def escape_means(by_column: dict) -> tuple[list, list, list]:
    """One row of an allocated-start panel (column value -> the cell's results): the columns, per
    column the mean escape time over seeds (nan: none by t_end) and theory.saddle's T_pred."""
    cols = list(by_column)
    Tm = [mean_se([x["escape_time"] for x in by_column[c]])[0] for c in cols]
    return (cols, [t if t is not None else math.nan for t in Tm],
            [by_column[c][0]["saddle"]["T_pred"] for c in cols])


def escape_row(by_L: dict, t_end: float) -> dict:
    """One row of the noise panel (L -> the cell's results): :func:`escape_means`; the L where
    T_pred crosses t_end (:func:`crossing_L`); the largest L where every run left allocation below
    the smallest L where none did, that smallest L, and their geometric mean."""
    Ls, Tm, Tp = escape_means(by_L)
    lo, hi = last_and_first(by_L, lambda x: math.isfinite(x["escape_time"]))
    return {"L": Ls, "measured": Tm, "theory": Tp,
            "theory_L": crossing_L(Ls, Tp, t_end), "measured_last_left": lo, "measured_first_stay": hi,
            "measured_L": math.sqrt(lo * hi) if lo and hi else None}


def escaped_runs(cells: dict, rows, cols) -> tuple[list, list, list]:
    """Every escaped run of the batch panel (rows: lr, columns: B): log(B/lr), its escape time,
    and theory.saddle's slope 2/rate of its cell."""
    xs, ys, preds = [], [], []
    for r in rows:
        for c in cols:
            for x in cells.get((r, c), []):
                if math.isfinite(x["escape_time"]):
                    xs.append(math.log(c / r))
                    ys.append(x["escape_time"])
                    preds.append(x["saddle"]["slope_pred"])
    return xs, ys, preds


# ---------------------------------------------------------------------------------------
# the need kinds of the atlas (numerics.engine): points read from the sweep, never trained
# ---------------------------------------------------------------------------------------

def atlas_need(cfg: ProblemConfig, schedule: AtlasSchedule, train_seed: int):
    """The "atlas" need of the point (cfg, schedule, train_seed) (:func:`atlas_point`)."""
    return need("atlas", cfg=cfg, schedule=schedule, train_seed=int(train_seed))


@kind("atlas", cost=lambda cfg, schedule, train_seed: 0.0, shared=False,
      point=lambda cfg, schedule, train_seed, seed: atlas_point(cfg, schedule, train_seed),
      normalise=normalise_point, load=from_stored)
def atlas_not_held(cfg, schedule, train_seed, seed):
    """An atlas point is read from the sweep that ran it (the engine's store, by :func:`atlas_point`,
    compared after :func:`normalise_point`), never trained here: asked to compute one, say so.
    Not shared beyond one engine: two sweeps may hold different results of one point."""
    raise ValueError(f"the sweep holds no finished result of the atlas point {atlas_point(cfg, schedule, train_seed)}"
                     ": the atlas trains nothing (run its grid into the sweep with python -m numerics.sweep)")


READ_SECONDS = 5.0
"""What an atlas id's build costs besides its points, which it reads and never trains: reading
the sweep's grid and classifying and drawing the panel (the tiny grid's four ids: 6.7 s CPU in all,
most of it the report's figures)."""


@kind("atlas_grid", cost=lambda sweep, unheld: READ_SECONDS, shared=False)
def atlas_grid(sweep: str, unheld: tuple, seed: int) -> dict:
    """What the plan read of the sweep's last grid besides its points: the sweep ("" where there
    is none) and the points it holds no finished result for ((id, panel, why),
    :func:`unheld_point`), reported, never trained."""
    return {"sweep": sweep, "unheld": [{"id": i, "panel": p or None, "why": w} for i, p, w in unheld]}
