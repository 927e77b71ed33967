"""Where "suitable initialisation" ends (issue 14): two boundary claims on the full model.

``boundary-initialisation`` (:func:`run`):
  1. random full starts (``init="uniform_full"``, every entry of K, Q, V, O uniform on
     +-s0/sqrt(d+m), logits scaled by 1/sqrt(d+m); s0 = 1 is the authors' PyTorch default)
     at a theory-derived small scale, an intermediate one and the authors' one: the off-D
     residual over time split into its movable part and the gradient-free part (theory.
     initialisation.residual_split), OV singular values per head, the held-out loss against
     the allocated minimum at that L;
  2. unbalanced factored starts inside D (``init="unbalanced_decomposable"``: K_h = a_h Q_h,
     O_h = |b_h| V_h^T, a_h, b_h ~ N(0, 1)) against the reduced flow from the same start
     with the unbalanced metric (theory.initialisation.unbalanced_metric_factors) and with
     the balanced one (the paper's).
``boundary-allocation-race`` (:func:`run_race`):
  3. a grid over the runner-up head's (omega0, mu0) relative to the favoured head's, one
     task, two heads: the measured winner against theory's ODE rule and the "largest mu0"
     rule;
  4. the default decomposable start at growing scale s0: where the warm-up disappears and
     allocation stops being predictable, against the reduced flow from the same start.

Verdicts rest on theory's account of these regimes (the gradient-free part never moves;
the warm-up norm bound below the small scale; the unbalanced reduced flow; theory's ODE
rule where the seeds agree; the reduced flow's phase times); everything the paper is
silent about is reported as a finding (headline rows with no theory), never as a failure.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from claims.base import Figure, HeadlineRow, Series, no_progress, run_claim
from claims.common import Comparison, check_profile, comparisons_result, headline_row, perturbation
from numerics.config import ProblemConfig
from numerics.evaluate import held_out_loss, held_out_reduced_loss
from numerics.exact_reduced import allocated_minimum, one_thread
from numerics.model import MultiHeadAttention, factor_balance
from numerics.train import TrainConfig, train, train_reduced
from theory.initialisation import (residual_split, small_scale, unbalanced_metric_factors, warmup_norm_bound)
from theory.reduced_ode import default_init, expansion_valid
from theory.task_allocation import predicted_winners
from theory.three_phases import phase_times

IDS = ("boundary-initialisation", "boundary-allocation-race")
TITLES = {IDS[0]: "Boundary: random and unbalanced initialisation",
          IDS[1]: "Boundary: the (omega0, mu0) race and large initialisation"}
STATEMENTS = {
    IDS[0]: "From random full starts (up to PyTorch's default) and from unbalanced factored starts, "
            "does the paper's picture (decomposable, allocated, three phases) still come out?",
    IDS[1]: "Which head wins a task from a given (omega0, mu0), against theory's ODE rule and the "
            "'largest mu0' rule; above which init scale the warm-up vanishes and allocation is unpredictable.",
}

OFF_D = 0.5
"""A run 'ends off D' when the movable off-D part is at least half of ||(W, U)|| at t_end, 'on D'
when it is at most ON_D; between, 'partly'.  The measured ends cluster near 0.0-0.1 (allocated)
and 0.8-1.0 (off D), so the classification does not hinge on the thresholds."""
ON_D = 0.1
ALLOCATED_SHARE = 0.9
"""A task is 'allocated' to its winning head when that head carries at least 90% of
sum_h |mu[h,i] omega[h,i]|."""
RACE_DECIDED_SHARE = 2.0 / 3.0
"""A race cell's winner counts as measured when the leading head carries at least 2/3 of
sum_h |mu omega| at t_end in every data seed (the loser's share only falls after the race
is decided, slowly when one task is shared by two heads: at t_end = 40 the measured shares
were either >= 0.92 or between 0.5 and 0.88 with the argmax fixed); below, the race has not
ended and the cell is undecided."""


@dataclass(frozen=True)
class InitProfile:
    tasks: tuple = (2, 2)          # block sizes r_i
    heads: int = 2                 # H
    L: int = 32                    # context length
    sigma: float = 0.0             # label noise
    scales: tuple = ("small", 0.3, 1.0)   # uniform_full s0; "small" = small_factor x theory's small scale
    small_factor: float = 0.8      # how far below theory's small scale the "small" run starts
    init_seeds: tuple = (0, 1)     # random starts per scale (data seed = init seed)
    unbalanced_seeds: tuple = (0, 1, 2)   # draws of (a_h, b_h)
    unbalanced_data_seeds: tuple = (0, 1) # prompt streams per unbalanced start (winners compared where they agree)
    unbalanced_scale: float = 0.03 # s0 of the unbalanced decomposable start (small: phases long against a spacing)
    unbalanced_records: int = 161  # fine records: the phases of an unbalanced start last a few time units
    lr: float = 0.1                # GD step (time step)
    time: float = 80.0             # t_end
    batch: int = 512               # prompts per step
    records: int = 41              # trajectory records
    n_eval: int = 8192             # held-out prompts per loss


INIT_PROFILES = {
    "tiny": InitProfile(tasks=(2,), heads=2, L=16, scales=("small", 1.0), init_seeds=(0,), unbalanced_seeds=(0,),
                        time=30.0, batch=128, records=31, unbalanced_records=121, n_eval=2048),
    "quick": InitProfile(),
    "paper": InitProfile(tasks=(4, 4, 4), heads=3, L=256, scales=("small", 0.1, 0.3, 1.0),
                         init_seeds=(0, 1, 2, 3), unbalanced_seeds=(0, 1, 2, 3, 4, 5), lr=0.05, time=150.0,
                         batch=1024, records=61, unbalanced_records=601, n_eval=65536),
}


@dataclass(frozen=True)
class RaceProfile:
    tasks: tuple = (2,)            # one task: the race between two heads for it
    heads: int = 2
    L: int = 32
    sigma: float = 0.0
    s0: float = 0.1                # the favoured head 0 starts at omega0 = mu0 = s0
    ratios: tuple = (0.5, 0.8, 1.25, 2.0)   # runner-up's omega0/s0 (columns) and mu0/s0 (rows)
    data_seeds: tuple = (0, 1)     # two prompt streams per cell: a cell is decided when they agree
    lr: float = 0.1
    time: float = 60.0
    batch: int = 256
    records: int = 41
    large_tasks: tuple = (2, 2)    # item 4: default decomposable start at growing scale
    large_scales: tuple = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
    large_time: float = 40.0
    large_records: int = 201       # fine records: the warm-up at large s0 lasts a few time units


RACE_PROFILES = {
    "tiny": RaceProfile(L=16, ratios=(0.5, 2.0), batch=128, time=30.0, records=31, large_tasks=(2,),
                        large_scales=(0.1, 0.8), large_time=30.0, large_records=61),
    "quick": RaceProfile(),
    "paper": RaceProfile(tasks=(4,), L=256, ratios=(0.4, 0.6, 0.8, 0.9, 1.1, 1.25, 1.6, 2.5), data_seeds=(0, 1, 2),
                         lr=0.05, time=100.0, batch=1024, records=61, large_tasks=(4, 4, 4),
                         large_scales=(0.02, 0.05, 0.1, 0.2, 0.4, 0.8), large_time=100.0, large_records=401),
}


def _profile(table: dict, profile, problem):
    p = table[check_profile(profile)] if isinstance(profile, str) else profile
    if problem:
        known = {"tasks", "heads", "L", "sigma"}
        extra = set(problem) - known - {"param", "init_scale", "logit_scale", "basis", "dtype"}
        if extra:
            raise ValueError(f"problem has unknown field(s) {sorted(extra)}; known: tasks, heads, L, sigma, ...")
        p = p.__class__(**{**asdict(p), **{k: (tuple(v) if k == "tasks" else v)
                                           for k, v in problem.items() if k in known}})
    return p


def _tcfg(p, seed: int, time_=None, records=None) -> TrainConfig:
    return TrainConfig(lr=p.lr, time=time_ or p.time, batch=p.batch, seed=seed, records=records or p.records)


def _undecided_is_error(result, comps):
    """A comparison with nothing to compare (no phase times defined in both curves, no race
    cell decided) cannot decide: the claim's verdict is then 'error' with the reason, never
    'fail' (the measurement did not contradict theory) and never 'pass'."""
    empty = [c.name for c in comps if c.details.get("compared", 1) == 0 or c.details.get("decided", 1) == 0]
    if empty and result.verdict != "error":
        result.verdict = "error"
        result.details["undecided"] = (f"nothing to compare in: {'; '.join(empty)} (phase times undefined in one of "
                                       "the two curves, or no race cell decided): the run cannot decide")
    return result


def _row(name, theory=None, measured=None, se=None, tolerance=None, agrees=None) -> dict:
    """A finding's headline row (no comparison: the paper is silent there)."""
    return asdict(HeadlineRow(name=name, theory=theory, measured=measured, se=se, tolerance=tolerance, agrees=agrees))


def _mean_se(xs) -> tuple[float, float | None]:
    xs = np.asarray(xs, float)
    return float(xs.mean()), (float(xs.std(ddof=1) / math.sqrt(xs.size)) if xs.size > 1 else None)


def winners_of(omega, mu) -> tuple[list[int], list[float]]:
    """Per task: the head carrying the largest mu[h,i] omega[h,i] (theory's ODE rule reads the
    same) and its share of sum_h |mu omega|."""
    B = np.asarray(mu) * np.asarray(omega)
    win = [int(h) for h in np.argmax(B, axis=0)]
    tot = np.abs(B).sum(axis=0)
    share = [float(B[w, i] / tot[i]) if tot[i] > 0 else 0.0 for i, w in enumerate(win)]
    return win, share


# ---------------------------------------------------------------------------------------
# item 1: random full starts
# ---------------------------------------------------------------------------------------

@one_thread
def random_start_run(cfg: ProblemConfig, tcfg: TrainConfig, n_eval: int) -> dict:
    """Train the full factored model from cfg (init uniform_full): the residual split at every
    record, Q's y columns before and after, OV singular values, the held-out loss."""
    model = MultiHeadAttention(cfg)
    d = cfg.d
    Q_y0 = model.Q.detach()[:, :, d:].clone()
    Q_x0 = model.Q.detach()[:, :, :d].clone()
    norm0_sq = float(sum((p.detach().double() ** 2).sum() for p in model.parameters()))
    rows = []

    def on_record(step, t, m, loss):
        W, U = (x.detach().cpu().double().numpy() for x in m.merged_weights())
        rows.append({"t": t, "loss": loss, **residual_split(W, U, cfg.tasks, cfg.basis_numpy())})

    res = train(cfg, tcfg, start=model, on_record=on_record)
    with torch.no_grad():
        U = model.merged_weights()[1].detach().cpu().double().numpy()
        dQy = float((model.Q[:, :, d:] - Q_y0).norm())
        dQx = float((model.Q[:, :, :d] - Q_x0).norm())
    sv = [np.linalg.svd(U[h], compute_uv=False) for h in range(cfg.heads)]
    top = max(float(s.max()) for s in sv) if sv else 0.0
    est = held_out_loss(model, n=n_eval, seed=tcfg.seed)
    win, share = winners_of(res.omega, res.mu)
    mu = np.asarray(res.mu)
    # a task is served in signed superposition when two heads carry it with opposite signs of mu
    superposed = [bool(np.any(mu[:, i] > 0.2 * np.abs(mu[:, i]).max()) and np.any(mu[:, i] < -0.2 * np.abs(mu[:, i]).max()))
                  for i in range(cfg.m)]
    return {"init_scale": cfg.init_scale, "seed": cfg.init_seed, "norm0_sq": norm0_sq, "trajectory": rows,
            "dQ_y": dQy, "dQ_x": dQx, "ov_singular_values": [np.round(s, 4).tolist() for s in sv],
            "ov_above_5pct": [int(np.sum(s > 0.05 * top)) for s in sv], "loss": est.mean, "loss_se": est.se,
            "omega": np.round(res.omega, 4).tolist(), "mu": np.round(res.mu, 4).tolist(), "winners": win,
            "winner_share": share, "superposed_tasks": superposed,
            "phases": phase_times([r["t"] for r in rows], [r["loss"] for r in rows]).to_dict()}


def check_gradient_free(runs: list[dict], cfg: ProblemConfig) -> Comparison:
    """Theory: no gradient reaches Q's y columns (z_q has no y part), so GD leaves them exactly
    where they started.  Measured: max over runs of ||Q_Y(t_end) - Q_Y(0)||.  The same
    comparison |measured - predicted| <= 0 sent the prediction 'the y columns train like the x
    columns' (the same change per entry: ||dQ_X|| sqrt(m/d), largest over runs) must reject it."""
    measured = max(r["dQ_y"] for r in runs)
    compare = lambda predicted: abs(measured - predicted)  # noqa: E731 - the one comparison
    like_x = max(r["dQ_x"] for r in runs) * math.sqrt(cfg.m / cfg.d)
    return Comparison(
        name="gradient-free part (Q's y columns) never moves", measured=measured, predicted=0.0,
        error=compare(0.0), tolerance=0.0,
        why="exact: the gradient of Q[:, :, d:] is a product with the zero y part of the query, so every GD "
            "step subtracts exactly 0",
        perturbations=[perturbation("the y columns train like the x columns", compare(like_x), 0.0,
                                    predicted=like_x)],
        details={"dQ_y": [r["dQ_y"] for r in runs], "dQ_x": [r["dQ_x"] for r in runs]})


def check_warmup_bound(runs: list[dict], cfg: ProblemConfig, t_end: float) -> Comparison:
    """Below the small scale, theory's warm-up bound (theory.initialisation, item 3) caps every
    off-D part of (W, U) at t_end: measured = max over runs of (movable off-D norm at t_end -
    bound), compared one-sided against 0.  Perturbation through the same comparison: 'the
    movable off-D part halves by t_end' (bound = half its initial value)."""
    excess, halves, rows = [], [], []
    for r in runs:
        b = warmup_norm_bound(r["norm0_sq"], t_end, cfg.tasks, cfg.heads, cfg.L, cfg.sigma, cfg.logit_scale)
        end, start = r["trajectory"][-1]["movable"], r["trajectory"][0]["movable"]
        excess.append(end - b["merged"])
        halves.append(end - 0.5 * start)
        rows.append({"seed": r["seed"], "movable_end": end, "movable_start": start, "bound": b["merged"],
                     "exponent": b["exponent"]})
    compare = lambda diffs: max(0.0, max(diffs))  # noqa: E731
    return Comparison(
        name="movable off-D part below the warm-up bound at the small scale", measured=max(r["movable_end"] for r in rows),
        predicted=min(r["bound"] for r in rows), error=compare(excess), tolerance=0.0,
        why="one-sided: |(W,U)_offD(t)| <= max(1,1/s) |theta0|^2 / (2 (1 - 8 c4 |theta0|^2 t)), the leading-order "
            "quartic warm-up bound (theory.initialisation); the exponent is <= 1/2 here",
        perturbations=[perturbation("the movable off-D part halves by t_end", compare(halves), 0.0)],
        details={"runs": rows})


# ---------------------------------------------------------------------------------------
# item 2: unbalanced factored starts
# ---------------------------------------------------------------------------------------

@one_thread
def unbalanced_run(cfg: ProblemConfig, tcfg: TrainConfig) -> dict:
    """Full model from the unbalanced start; the reduced flow from the same (omega0, mu0) on the
    same prompts with the unbalanced metric (the conserved balances read off the start) and
    with the balanced one."""
    model = MultiHeadAttention(cfg)
    ro = model.semi_singular_values()
    omega0, mu0 = ro.omega.copy(), ro.mu.copy()
    c_om, c_mu = factor_balance(model)
    full = train(cfg, tcfg, start=model)
    s, tasks = cfg.logit_scale, cfg.tasks

    def metric(o, m_):
        f = unbalanced_metric_factors(o.cpu().double().numpy(), m_.cpu().double().numpy(), c_om, c_mu, tasks, s)
        return tuple(torch.as_tensor(x, dtype=o.dtype, device=o.device) for x in f)

    # train_reduced copies ``start`` (the caller's arrays are never updated in place)
    red_u = train_reduced(cfg, tcfg, start=(ro.omega, ro.mu), metric=metric)
    red_b = train_reduced(cfg, tcfg, start=(ro.omega, ro.mu))
    out = {"seed": cfg.init_seed, "data_seed": tcfg.seed, "omega0": omega0.tolist(), "mu0": mu0.tolist(),
           "c_omega": np.round(c_om, 4).tolist(), "c_mu": np.round(c_mu, 4).tolist(),
           "spacing": tcfg.time / (tcfg.records - 1)}
    for key, r in (("full", full), ("reduced_unbalanced", red_u), ("reduced_balanced", red_b)):
        t = [x.t for x in r.trajectory]
        win, share = winners_of(r.omega, r.mu)
        out[key] = {"phases": phase_times(t, [x.loss for x in r.trajectory]).to_dict(),
                    "winners": win, "share": share, "outcome": _outcomes(win, share),
                    "t": t, "loss": [x.loss for x in r.trajectory],
                    "omega": np.round(r.omega, 4).tolist(), "mu": np.round(r.mu, 4).tolist()}
    return out


def _outcomes(winners, shares) -> list[int]:
    """Per task: the winning head where it carries >= RACE_DECIDED_SHARE of sum_h |mu omega|,
    else -1 (the task is shared: a superposition of heads, not an allocation)."""
    return [int(w) if sh >= RACE_DECIDED_SHARE else -1 for w, sh in zip(winners, shares)]


def _untied_tasks(omega0, mu0) -> list[int]:
    """Tasks whose two leading heads do not start from the same (omega0, mu0)."""
    om, mu = np.asarray(omega0), np.asarray(mu0)
    out = []
    for i in range(om.shape[1]):
        order = np.argsort(-(om[:, i] * mu[:, i]))
        if om.shape[0] == 1 or not (np.isclose(om[order[0], i], om[order[1], i], rtol=1e-12, atol=0)
                                    and np.isclose(mu[order[0], i], mu[order[1], i], rtol=1e-12, atol=0)):
            out.append(i)
    return out


def _summary(runs):
    return [{k: v for k, v in r.items() if k not in ("full", "reduced_unbalanced", "reduced_balanced")}
            | {k: {"phases": r[k]["phases"], "winners": r[k]["winners"], "share": r[k]["share"],
                   "outcome": r[k]["outcome"], "omega": r[k]["omega"], "mu": r[k]["mu"]}
               for k in ("full", "reduced_unbalanced", "reduced_balanced")} for r in runs]


def check_unbalanced_phases(runs: list[dict]) -> Comparison:
    """The full model from an unbalanced start against the reduced flow with the unbalanced
    metric from the same start on the same prompts (theory's account: on D the balances are
    conserved, so the reduced flow needs no balance): warm-up and emergence ends within 2
    record spacings (each crossing time is resolved to one spacing), compared where both
    curves define them.  Perturbation: the reduced flow's phase times 50% longer."""
    spacing = runs[0]["spacing"]
    pairs = [(r["full"]["phases"][w], r["reduced_unbalanced"]["phases"][w]) for r in runs
             for w in ("warmup_end", "emergence_end")]
    both = [(a, b) for a, b in pairs if math.isfinite(a) and math.isfinite(b)]

    def compare(factor: float) -> float:
        return max((abs(a - factor * b) for a, b in both), default=math.inf)

    tol = 2.0 * spacing
    return Comparison(
        name="unbalanced start: phase times, full model vs reduced flow with the unbalanced metric",
        measured=[[r["full"]["phases"][w] for w in ("warmup_end", "emergence_end")] for r in runs],
        predicted=[[r["reduced_unbalanced"]["phases"][w] for w in ("warmup_end", "emergence_end")] for r in runs],
        error=compare(1.0), tolerance=tol,
        why=f"phase times within 2 record spacings ({tol:.3g}): each crossing time is interpolated between "
            "records, so each is resolved to one spacing",
        perturbations=[perturbation("phase times 50% longer than the unbalanced reduced flow's", compare(1.5), tol)],
        details={"compared": len(both), "defined_in_one_only": sum(math.isfinite(a) != math.isfinite(b) for a, b in pairs),
                 "runs": _summary(runs)})


def check_unbalanced_winners(runs: list[dict]) -> Comparison:
    """The outcome per task of the full model against the reduced flow with the unbalanced
    metric: the winning head where it carries >= RACE_DECIDED_SHARE of sum_h |mu omega|, or
    'shared' (-1: a superposition of heads).  Compared on the (start, task) pairs whose start
    is not a tie (with H > m several heads start from the same (omega0, mu0); the tie is
    broken by noise, not by theory) and where the data seeds agree for the full run and for
    the reduced flow (as in the race).  error = number of such pairs where they differ,
    tolerance 0.  Perturbation: every reduced outcome replaced by another (head + 1, or head
    0 for a shared task)."""
    by_start: dict = {}
    for r in runs:
        by_start.setdefault(r["seed"], []).append(r)
    decided = []
    for start, group in by_start.items():
        for i in _untied_tasks(group[0]["omega0"], group[0]["mu0"]):
            wf = {r["full"]["outcome"][i] for r in group}
            wr = {r["reduced_unbalanced"]["outcome"][i] for r in group}
            if len(wf) == 1 and len(wr) == 1:
                decided.append({"start": start, "task": i, "full": wf.pop(), "reduced": wr.pop()})
    heads = len(runs[0]["omega0"])
    compare = lambda pick: float(sum(d["full"] != pick(d) for d in decided)) if decided else math.inf  # noqa: E731
    return Comparison(
        name="unbalanced start: outcome per task (winner or shared), full model vs reduced flow (unbalanced metric)",
        measured=sum(d["full"] == d["reduced"] for d in decided), predicted=len(decided),
        error=compare(lambda d: d["reduced"]), tolerance=0.0,
        why="exact: a discrete outcome, compared where the data seeds agree (none decided: inf)",
        perturbations=[perturbation("every reduced outcome replaced by another",
                                    compare(lambda d: (d["reduced"] + 1) % max(2, heads)), 0.0)],
        details={"decided": len(decided), "pairs": decided,
                 "shared_full": sum(d["full"] == -1 for d in decided),
                 "shared_reduced": sum(d["reduced"] == -1 for d in decided)})


# ---------------------------------------------------------------------------------------
# boundary-initialisation
# ---------------------------------------------------------------------------------------

def _classify(run: dict) -> str:
    """'in warm-up' while ||(W, U)|| has not doubled (the relative residual is then still the
    init's); else 'off D' / 'on D' / 'partly' by the movable relative residual at t_end."""
    end, start = run["trajectory"][-1], run["trajectory"][0]
    if end["norm"] < 2.0 * start["norm"]:
        return "in warm-up"
    x = end["movable_relative"]
    return "off D" if x >= OFF_D else ("on D" if x <= ON_D else "partly")


def run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None, problem=None):
    """boundary-initialisation: items 1 and 2 of issue 14 (module docstring)."""
    del sweep  # a family claim's option; this claim runs its own starts
    p = _profile(INIT_PROFILES, profile, problem)

    def body():
        base = ProblemConfig(tasks=p.tasks, heads=p.heads, L=p.L, sigma=p.sigma, device=device)
        s_authors = math.sqrt(base.token_dim)
        s_small = small_scale(p.tasks, p.heads, p.L, p.time, p.sigma, s_authors)
        scales = [p.small_factor * s_small if s == "small" else float(s) for s in p.scales]
        n_jobs = len(scales) * len(p.init_seeds) + len(p.unbalanced_seeds) * len(p.unbalanced_data_seeds)
        done = 0
        runs = {}
        for s0 in scales:
            for k in p.init_seeds:
                progress(f"random start s0={s0:.3g} seed {k}", done / n_jobs)
                cfg = base.replace(init="uniform_full", init_scale=s0, init_seed=seed + k, logit_scale=s_authors)
                runs.setdefault(s0, []).append(random_start_run(cfg, _tcfg(p, seed + k), p.n_eval))
                done += 1
        unb = []
        for k in p.unbalanced_seeds:
            progress(f"unbalanced start seed {k}", done / n_jobs)
            cfg = base.replace(init="unbalanced_decomposable", init_scale=p.unbalanced_scale, init_seed=seed + k)
            for j in p.unbalanced_data_seeds:
                unb.append(unbalanced_run(cfg, _tcfg(p, seed + 100 * j + k, records=p.unbalanced_records)))
                done += 1
        alloc = allocated_minimum(p.tasks, p.L, p.sigma, seed=seed, device=device)
        # the allocated point with any surplus heads at zero (H < m: no allocated point; reported as None)
        alloc_om, alloc_mu = (np.vstack([a, np.zeros((max(0, base.heads - base.m), base.m))])[:base.heads]
                              for a in (alloc.omega, alloc.mu))
        alloc_loss = (held_out_reduced_loss(alloc_om, alloc_mu, base, n=p.n_eval, seed=seed)
                      if base.heads >= base.m else None)
        comps = [check_gradient_free([r for rs in runs.values() for r in rs], base),
                 check_warmup_bound(runs[scales[0]], base.replace(logit_scale=s_authors), p.time),
                 check_unbalanced_phases(unb), check_unbalanced_winners(unb)]
        headline = [headline_row(comps[0]), headline_row(comps[1]),
                    headline_row(comps[2], "unbalanced: max |phase time full - reduced (unbalanced metric)|",
                                 measured=comps[2].error, theory=0.0),
                    headline_row(comps[3], "unbalanced: (start, task) outcomes (winner or shared) full = reduced "
                                           "(unbalanced metric), of those decided"),
                    _row("unbalanced: decided (start, task) pairs shared by heads (superposition), full model",
                         measured=comps[3].details["shared_full"])]
        findings = []
        for s0, rs in runs.items():
            mov, se_mov = _mean_se([r["trajectory"][-1]["movable_relative"] for r in rs])
            free, _ = _mean_se([r["trajectory"][-1]["gradient_free_relative"] for r in rs])
            ratio, se_ratio = (_mean_se([r["loss"] / alloc_loss.mean for r in rs]) if alloc_loss else (None, None))
            classes = sorted({_classify(r) for r in rs})
            headline.append(_row(f"s0={s0:.3g}: movable off-D residual at t_end ({'/'.join(classes)})",
                                 measured=mov, se=se_mov))
            headline.append(_row(f"s0={s0:.3g}: held-out loss / allocated minimum", theory=1.0, measured=ratio,
                                 se=se_ratio))
            findings.append({"init_scale": s0, "movable_relative_end": mov, "movable_se": se_mov,
                             "gradient_free_relative_end": free, "classes": classes, "conclusive": len(classes) == 1,
                             "loss_over_allocated": ratio, "loss_over_allocated_se": se_ratio,
                             "ov_above_5pct": [r["ov_above_5pct"] for r in rs],
                             "superposed_tasks": [r["superposed_tasks"] for r in rs],
                             "winners": [r["winners"] for r in rs], "warmup_end": [r["phases"]["warmup_end"] for r in rs]})
        off = [f["init_scale"] for f in findings if f["conclusive"] and f["classes"] == ["off D"]]
        location = min(off) if off else None
        dT = [r["reduced_balanced"]["phases"]["warmup_end"] - r["reduced_unbalanced"]["phases"]["warmup_end"] for r in unb]
        dT = [x for x in dT if math.isfinite(x)]
        changed = len({r["seed"] for r in unb if r["reduced_balanced"]["outcome"] != r["reduced_unbalanced"]["outcome"]})
        headline.append(_row("unbalanced: warm-up end, balanced metric minus unbalanced (reduced)",
                             measured=_mean_se(dT)[0] if dT else None, se=_mean_se(dT)[1] if dT else None))
        headline.append(_row("unbalanced: starts whose outcomes (winner or shared) the balance changes", measured=changed))
        figures = [_residual_figure(runs), _phase_figure_random(runs), _unbalanced_figure(unb)]
        details = {"domain": "theory's account: (a) no gradient reaches Q[:, :, d:] (exact, any start); (b) below "
                             f"the small scale s_small = {s_small:.4g} (warm-up bound exponent <= 1/2 at t_end = "
                             f"{p.time:g}) every off-D part stays under the quartic warm-up bound; (c) from an "
                             "unbalanced start inside D the reduced flow with the conserved balances is the flow. "
                             "Everything else (random starts above s_small, the authors' start) is a finding.",
                   "ran": {"profile": asdict(p), "scales": scales, "logit_scale": s_authors, "small_scale": s_small},
                   "allocated_loss": ({"mean": alloc_loss.mean, "se": alloc_loss.se, "omega": alloc_om.tolist(),
                                       "mu": alloc_mu.tolist()} if alloc_loss else None),
                   "findings": findings, "off_D_from_scale": location,
                   "random_runs": {f"{s0:.4g}": [{k: v for k, v in r.items() if k != "trajectory"} for r in rs]
                                   for s0, rs in runs.items()}}
        return _undecided_is_error(comparisons_result(IDS[0], TITLES[IDS[0]], STATEMENTS[IDS[0]], comps, figures,
                                                      details, headline=headline), comps)

    return run_claim(IDS[0], TITLES[IDS[0]], STATEMENTS[IDS[0]], body)


def _residual_figure(runs) -> Figure:
    series = []
    for s0, rs in runs.items():
        for r in rs:
            tr = r["trajectory"]
            t = [x["t"] for x in tr]
            series.append(Series(f"s0={s0:.3g} seed {r['seed']} movable", t,
                                 [max(x["movable_relative"], 1e-12) for x in tr], "line"))
            series.append(Series(f"s0={s0:.3g} seed {r['seed']} gradient-free", t,
                                 [max(x["gradient_free_relative"], 1e-12) for x in tr], "dashed"))
    return Figure(name="init-residual", title="Off-D residual from random full starts (relative to ||(W,U)||)",
                  xlabel="t", ylabel="residual / ||(W, U)||", yscale="log", series=series,
                  caption="solid: the part the loss can move; dashed: W's y columns, which no gradient reaches "
                          "(a floor set by the init, not 'staying off D')")


def _phase_figure_random(runs) -> Figure:
    s0s = list(runs)
    series = [Series("warm-up end (per seed)", [s for s in s0s for _ in runs[s]],
                     [r["phases"]["warmup_end"] for s in s0s for r in runs[s]], "points"),
              Series("emergence end (per seed)", [s for s in s0s for _ in runs[s]],
                     [r["phases"]["emergence_end"] for s in s0s for r in runs[s]], "points")]
    return Figure(name="init-phases-random", title="Phase times against the random start's scale", xlabel="s0",
                  ylabel="t", xscale="log", series=series,
                  caption="missing points: no drop clear of the noise (phases undefined) by t_end")


def _unbalanced_figure(unb) -> Figure:
    series = []
    for r in unb:
        for key, style in (("full", "points"), ("reduced_unbalanced", "line"), ("reduced_balanced", "dashed")):
            series.append(Series(f"start {r['seed']} data {r['data_seed']} {key}", r[key]["t"], r[key]["loss"], style))
    return Figure(name="init-unbalanced", title="Unbalanced starts: full model, reduced flow with and without "
                  "the balance", xlabel="t", ylabel="loss", series=series,
                  caption="points: full model; line: reduced flow with the conserved balances; dashed: balanced "
                          "metric (the paper's)")


# ---------------------------------------------------------------------------------------
# boundary-allocation-race: item 3, the race grid
# ---------------------------------------------------------------------------------------

@one_thread
def race_cell(cfg: ProblemConfig, tcfg: TrainConfig) -> dict:
    """Full model from the given (omega0, mu0): final winners, shares and phase times."""
    r = train(cfg, tcfg)
    win, share = winners_of(r.omega, r.mu)
    t, loss = [x.t for x in r.trajectory], [x.loss for x in r.trajectory]
    return {"winners": win, "share": share, "omega": np.round(r.omega, 4).tolist(), "mu": np.round(r.mu, 4).tolist(),
            "phases": phase_times(t, loss).to_dict()}


def race_grid(p: RaceProfile, device="cpu", seed=0, progress=no_progress) -> dict:
    """Every cell (omega ratio rho_w, mu ratio rho_m): head 0 at (s0, s0), head 1 at
    (rho_w s0, rho_m s0) on every task; measured winners per data seed; theory's ODE and
    largest-mu0 predictions."""
    cells = []
    n = len(p.ratios) ** 2
    base = ProblemConfig(tasks=p.tasks, heads=p.heads, L=p.L, sigma=p.sigma, device=device)
    for a, rm in enumerate(p.ratios):
        for b, rw in enumerate(p.ratios):
            progress(f"race cell omega x{rw:g}, mu x{rm:g}", (a * len(p.ratios) + b) / n)
            om0 = np.full((p.heads, base.m), p.s0)
            mu0 = np.full((p.heads, base.m), p.s0)
            om0[1:] *= rw
            mu0[1:] *= rm
            cfg = base.replace(init="given", init_omega=tuple(map(tuple, om0)), init_mu=tuple(map(tuple, mu0)))
            meas = [race_cell(cfg, _tcfg(p, seed + k)) for k in p.data_seeds]
            wins = [m_["winners"] for m_ in meas]
            seeds_agree = all(w == wins[0] for w in wins)
            finished = all(min(m_["share"]) >= RACE_DECIDED_SHARE for m_ in meas)
            cells.append({"rho_omega": rw, "rho_mu": rm, "measured": wins, "decided": seeds_agree and finished,
                          "seeds_agree": seeds_agree, "allocated": finished,
                          "share": [m_["share"] for m_ in meas],
                          "ode": predicted_winners(om0, mu0, p.tasks, p.L, p.sigma, rule="ode"),
                          "largest_mu": predicted_winners(om0, mu0, p.tasks, rule="largest_mu")})
    return {"cells": cells}


def check_race(cells: list[dict]) -> Comparison:
    """In every cell where the data seeds agree (and the race has ended in both: the winner
    carries >= RACE_DECIDED_SHARE of sum_h |mu omega| at t_end),
    the measured winners equal theory's ODE rule: error = number of decided cells where they
    differ, tolerance 0 (a winner is a discrete outcome; undecided cells are counted, not
    compared).  Perturbation through the same
    comparison: every winner swapped to another head."""
    decided = [c for c in cells if c["decided"]]
    compare = lambda rule: sum(c["measured"][0] != rule(c) for c in decided)  # noqa: E731
    heads = 1 + max(max(c["ode"]) for c in cells) if cells else 2
    swap = lambda c: [(w + 1) % max(2, heads) for w in c["ode"]]  # noqa: E731
    err = compare(lambda c: c["ode"])
    return Comparison(
        name="race winner = theory's ODE rule where two data seeds agree", measured=len(decided) - err,
        predicted=len(decided), error=float(err) if decided else math.inf, tolerance=0.0,
        why="exact: a discrete outcome, compared only where the data seeds agree (no decided cell: inf)",
        perturbations=[perturbation("every winner swapped to another head", float(compare(swap)) if decided else 0.0, 0.0)],
        details={"decided": len(decided), "undecided": len(cells) - len(decided),
                 "seeds_disagree": sum(not c["seeds_agree"] for c in cells),
                 "not_allocated": sum(c["seeds_agree"] and not c["allocated"] for c in cells),
                 "largest_mu_disagrees_with_measured": compare(lambda c: c["largest_mu"])})


# ---------------------------------------------------------------------------------------
# item 4: large initialisation
# ---------------------------------------------------------------------------------------

@one_thread
def large_init_run(cfg: ProblemConfig, tcfg: TrainConfig) -> dict:
    """Full model and reduced flow from the default decomposable start at cfg.init_scale."""
    out = {}
    for key, fn in (("full", train), ("reduced", train_reduced)):
        r = fn(cfg, tcfg)
        t, loss = [x.t for x in r.trajectory], [x.loss for x in r.trajectory]
        win, share = winners_of(r.omega, r.mu)
        out[key] = {"phases": phase_times(t, loss).to_dict(), "winners": win, "share": share,
                    "omega": np.round(r.omega, 4).tolist(), "mu": np.round(r.mu, 4).tolist()}
    return out


def check_large_phases(large: dict, spacing: float) -> Comparison:
    """At each scale the full model's warm-up and emergence ends agree with the reduced flow's
    from the same start on the same prompts (theory's account on D) within 2 record spacings,
    compared where both curves define them (theory.three_phases: a drop clear of 10x the
    noise).  Where only one defines them the drop sits at the definedness threshold and the
    comparison cannot decide: counted in details, not compared; none compared at all: inf.
    Perturbation: the reduced flow's phase times 50% longer."""
    pairs = [(r["full"]["phases"][w], r["reduced"]["phases"][w]) for runs in large.values() for r in runs
             for w in ("warmup_end", "emergence_end")]
    both = [(a, b) for a, b in pairs if math.isfinite(a) and math.isfinite(b)]
    one = sum(math.isfinite(a) != math.isfinite(b) for a, b in pairs)

    def compare(factor: float) -> float:
        return max((abs(a - factor * b) for a, b in both), default=math.inf)

    tol = 2.0 * spacing
    return Comparison(
        name="phase times against init scale: full model vs reduced flow",
        measured={f"{s:g}": [r["full"]["phases"]["warmup_end"] for r in rs] for s, rs in large.items()},
        predicted={f"{s:g}": [r["reduced"]["phases"]["warmup_end"] for r in rs] for s, rs in large.items()},
        error=compare(1.0), tolerance=tol,
        why=f"2 record spacings ({tol:.3g}): each crossing time is resolved to one spacing",
        perturbations=[perturbation("phase times 50% longer than the reduced flow's", compare(1.5), tol)],
        details={"compared": len(both), "defined_in_one_only": one})


def run_race(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None, problem=None):
    """boundary-allocation-race: items 3 and 4 of issue 14 (module docstring)."""
    del sweep
    p = _profile(RACE_PROFILES, profile, problem)

    def body():
        grid = race_grid(p, device, seed, lambda msg, f: progress(msg, 0.6 * f))
        cells = grid["cells"]
        large = {}
        base = ProblemConfig(tasks=p.large_tasks, heads=len(p.large_tasks), L=p.L, sigma=p.sigma, device=device)
        for j, s0 in enumerate(p.large_scales):
            progress(f"large init s0={s0:g}", 0.6 + 0.4 * j / len(p.large_scales))
            cfg = base.replace(init_scale=s0)
            large[s0] = [large_init_run(cfg, _tcfg(p, seed + k, p.large_time, p.large_records)) for k in p.data_seeds]
        spacing = p.large_time / (p.large_records - 1)
        comps = [check_race(cells), check_large_phases(large, spacing)]
        predicted = {s0: _ode_winners(p.large_tasks, s0, p.L, p.sigma) for s0 in p.large_scales}
        # no warm-up: in every seed the loss has fallen by 10% of its drop within 2 record spacings
        no_warmup = [s0 for s0, rs in large.items()
                     if all(math.isfinite(r["full"]["phases"]["warmup_end"])
                            and r["full"]["phases"]["warmup_end"] <= 2 * spacing for r in rs)]
        # unpredictable: a seed's winners differ from the reduced flow's from the same start, or
        # from theory's ODE rule where the start is inside the expansion's domain, or a task is not
        # allocated (its winner carries < ALLOCATED_SHARE), or the seeds disagree
        unpredictable = [s0 for s0, rs in large.items()
                         if any(r["full"]["winners"] != r["reduced"]["winners"]
                                or (predicted[s0] is not None and r["full"]["winners"] != predicted[s0])
                                or min(r["full"]["share"]) < ALLOCATED_SHARE
                                or r["full"]["winners"] != rs[0]["full"]["winners"] for r in rs)]
        bracket = lambda xs: _bracket(list(p.large_scales), xs)  # noqa: E731
        disagree_rules = [c for c in cells if c["ode"] != c["largest_mu"]]
        headline = [headline_row(comps[0], measured=comps[0].measured, theory=comps[0].predicted),
                    _row("race: undecided cells: data seeds disagree", measured=comps[0].details["seeds_disagree"]),
                    _row("race: undecided cells: seeds agree, race not ended by t_end",
                         measured=comps[0].details["not_allocated"]),
                    _row("race: cells where 'largest mu0' and the ODE rule disagree", measured=len(disagree_rules)),
                    _row("race: decided cells where the measurement sides with 'largest mu0' against the ODE rule",
                         measured=sum(c["decided"] and c["measured"][0] == c["largest_mu"] for c in disagree_rules)),
                    _row("race: decided cells where the measurement contradicts 'largest mu0' (sides with the ODE rule)",
                         measured=sum(c["decided"] and c["measured"][0] == c["ode"] for c in disagree_rules)),
                    headline_row(comps[1], measured=comps[1].error, theory=0.0),
                    _row("no warm-up from init scale (bracket [below, at])", measured=bracket(no_warmup)),
                    _row("allocation unpredictable from init scale (bracket [below, at])",
                         measured=bracket(unpredictable))]
        figures = [_race_heatmap(p, cells), _race_border_figure(p, cells), _large_phase_figure(large, spacing)]
        details = {"domain": "theory's ODE rule decides the race in cells where the data seeds agree (both runs "
                             "start on D, where the reduced flow is exact); on D the reduced flow gives the phase "
                             "times at every scale. Where the warm-up vanishes and where allocation stops being "
                             "predictable are findings (the paper assumes small starts).",
                   "ran": {"profile": asdict(p)}, "cells": cells,
                   "large": {f"{s:g}": rs for s, rs in large.items()},
                   "predicted_winners_large": {f"{s:g}": w for s, w in predicted.items()},
                   "no_warmup_scales": no_warmup, "unpredictable_scales": unpredictable}
        return _undecided_is_error(comparisons_result(IDS[1], TITLES[IDS[1]], STATEMENTS[IDS[1]], comps, figures,
                                                      details, headline=headline), comps)

    return run_claim(IDS[1], TITLES[IDS[1]], STATEMENTS[IDS[1]], body)


def _ode_winners(tasks, s0, L, sigma):
    """Theory's ODE rule from the default start, or None where the start lies outside the
    expansion's domain (2 omega0^2 >= 1: theory has no prediction there)."""
    omega0, mu0 = default_init(tasks, len(tasks), s0)
    if not expansion_valid(omega0, 1e-3):
        return None
    return predicted_winners(omega0, mu0, tasks, L, sigma)


def _bracket(scales: list, hits: list):
    """[largest scale below the first hit, first hit] (None: no hit; [None, s]: already at the smallest)."""
    if not hits:
        return None
    first = min(hits)
    below = [s for s in scales if s < first]
    return [max(below) if below else None, first]


def _race_heatmap(p: RaceProfile, cells) -> Figure:
    rows = list(reversed(p.ratios))
    look = {(c["rho_omega"], c["rho_mu"]): c for c in cells}
    matrix = [[(float(look[(rw, rm)]["measured"][0][0]) if look[(rw, rm)]["decided"] else 0.5) for rw in p.ratios]
              for rm in rows]
    ode = [[look[(rw, rm)]["ode"][0] for rw in p.ratios] for rm in rows]
    return Figure(name="race-heatmap", title="Winning head of task 0 (0.5: undecided -- seeds disagree or race not ended)", kind="heatmap",
                  xlabel="runner-up omega0 / favoured omega0", ylabel="runner-up mu0 / favoured mu0",
                  matrix=matrix, row_labels=[f"{r:g}" for r in rows], col_labels=[f"{r:g}" for r in p.ratios],
                  caption=f"theory's ODE rule per cell (same layout): {ode}; its border is drawn in race-border")


def _race_border_figure(p: RaceProfile, cells) -> Figure:
    """The measured winners as points over the ratio grid, with the ODE rule's border (between
    grid cells where its winner switches, per omega ratio) and the 'largest mu0' border (mu
    ratio 1)."""
    series = []
    for label, pick in (("measured: head 0", lambda c: c["decided"] and c["measured"][0][0] == 0),
                        ("measured: head 1", lambda c: c["decided"] and c["measured"][0][0] == 1),
                        ("measured: undecided", lambda c: not c["decided"])):
        sel = [c for c in cells if pick(c)]
        series.append(Series(label, [c["rho_omega"] for c in sel], [c["rho_mu"] for c in sel], "points"))
    bx, by = [], []
    ratios = list(p.ratios)
    for rw in ratios:
        col = sorted((c for c in cells if c["rho_omega"] == rw), key=lambda c: c["rho_mu"])
        switch = [math.sqrt(a["rho_mu"] * b["rho_mu"]) for a, b in zip(col, col[1:]) if a["ode"][0] != b["ode"][0]]
        if switch:
            bx.append(rw)
            by.append(switch[0])
        else:  # no switch in this column: the border lies outside the grid
            bx.append(rw)
            by.append(ratios[0] / 1.5 if col and col[0]["ode"][0] == 1 else ratios[-1] * 1.5)
    series.append(Series("ODE rule border", bx, by, "line"))
    series.append(Series("'largest mu0' border", [ratios[0], ratios[-1]], [1.0, 1.0], "dashed"))
    return Figure(name="race-border", title="Race winners over the (omega0, mu0) ratio grid with theory's border",
                  xlabel="runner-up omega0 / favoured omega0", ylabel="runner-up mu0 / favoured mu0",
                  xscale="log", yscale="log", series=series,
                  caption="above the solid line the ODE rule gives the task to the runner-up head; a border "
                          "outside the grid is drawn just beyond its edge")


def _large_phase_figure(large, spacing) -> Figure:
    series = []
    for key, style in (("full", "points"), ("reduced", "line")):
        for which in ("warmup_end", "emergence_end"):
            xs, ys = [], []
            for s0, rs in large.items():
                vals = [r[key]["phases"][which] for r in rs if math.isfinite(r[key]["phases"][which])]
                if vals:
                    xs.append(s0)
                    ys.append(float(np.mean(vals)))
            series.append(Series(f"{key} {which.replace('_', ' ')}", xs, ys, style))
    return Figure(name="race-phases", title="Phase times against the init scale (default decomposable start)",
                  xlabel="s0", ylabel="t", xscale="log", yscale="log", series=series,
                  hlines=[{"y": 2 * spacing, "label": "two record spacings"}],
                  caption="a warm-up end below two record spacings: no warm-up at that scale")
