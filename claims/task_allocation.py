"""Claim 4: task allocation -- at the limit each head's OV matrix has exactly one nonzero singular value, and task i
goes to the head the dynamics favour.

The full factored model is trained on fresh batches from a start favouring one head per task
(``numerics.experiments.phases.allocation_run``, ``theory.task_allocation.favoured_init``); its tail records are
compared with ``theory.task_allocation`` (:func:`check_allocation`: OV counts, winners, the served fixed point, the
surplus heads, the held-out loss) inside the domain decided before the run (:func:`domain`), and recorded as a
boundary finding outside it (:func:`check_boundary`).

The plan (:func:`plan`, staged: the domain's inputs, then what the domain asks), its needs (:func:`case_needs`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from numerics.io import jsonable
from claims.core import (Z_SE, ClaimSpec, Comparison, Figure, HeadlineRow, Outcome, Tolerance, compare, finding,
                         noise_term, reported_row, term, theory_need, with_problem)
from numerics.config import ProblemConfig
from numerics.engine import need
from numerics.experiments import phases as experiments
from numerics.experiments.phases import run_time, start_args, unstable_need
from numerics.evaluate import allocation
from theory import task_allocation as allocation_theory

THRESHOLD_SIGMAS = 5.0
"""Detection threshold (which singular values are nonzero), in units of the Frobenius norm of the standard errors of
the tail-mean OV matrix (:func:`check_allocation`): a zero value is misread with probability <= 6e-7.  Not a comparison
tolerance (that is claims.core.Z_SE)."""
L_MIN = 32
"""Smallest L inside the domain: a measured boundary, not a theoretical one.  The allocated point is only semi-stable:
an off-task mu that the batch noise pushes through 0 then grows, towards the superposition of docs/model.md, at a rate
~ 1/L (measurements: docs/claims_1_4.md, "The domain's two measured constants")."""
PERTURB_FACTOR = 1.1
ESCAPE_EFOLDS = 10.0
"""A run of length t_end stays allocated if escape_rate x t_end <= 10 (escape_rate = 2a, theory.saddle): the seed
that SGD noise puts in the unstable direction is ~1e-5 of mu*, so ~10 e-folds bring it to the size of a counted
singular value (measured, and a known miss: docs/claims_1_4.md, "The domain's two measured constants")."""


@dataclass(frozen=True)
class TaskAllocationProfile:
    """One profile of claim 4 (the experiment plan)."""
    tasks: tuple = (2, 2)              # block sizes r_i of the main case, run with H = m heads
    L: int = 32                        # context length
    sigma: float = 0.0                 # label noise std
    surplus_heads: int = 1             # also run H = m + surplus_heads (0: no surplus case)
    surplus_mu: float = 0.2            # surplus heads' mu / s0 (at 1, as unfavoured heads: decay by t ~ 150-330)
    fewer_heads_tasks: tuple | None = None  # block sizes of an H = m - 1 boundary case (None: none)
    param: str = "factored"            # parametrisation ("merged" runs as a boundary)
    init_scale: float = 0.15           # s0 of favoured_init
    lr: float = 0.05                   # GD step (time t = lr x steps)
    time: float | None = None          # t_end (None: each case's domain horizon)
    batch: int = 512                   # fresh prompts per step
    tail_batch: int | None = None      # per step from phases.TAIL_BATCH_FROM of a run inside the domain (None: batch)
    records: int = 61                  # trajectory records (the tail = last 25% of them)
    held_out: int = 65536              # fresh prompts of the held-out loss
    slope_prompts: int = 16384         # Monte-Carlo prompts of the measured off-task slope a (check_off_task_slope)
    problem: tuple = ()                # a researcher's ProblemConfig fields (sorted items): one case, run as given


PROFILES = {
    "tiny": TaskAllocationProfile(tasks=(1,), L=32, surplus_heads=0, batch=128, tail_batch=512, records=41),
    # H = m inside the domain; the surplus case (its heads decay slowly: theory's flow needs t ~ 200) and H < m run as
    # recorded boundaries.  t = 55: the domain's horizon (29) is too short for the served point of H = 2 heads
    # (t = 29: omega 0.698 vs 0.6825, 2.2% off, unchanged from B = 512 to 1024; t = 55: 0.689 vs 0.680, inside the
    # tolerance), and 55 stays under the saddle's escape limit 10 / 0.175 = 57.  B = 3072 from t = 33: the served
    # point's SGD noise and O(lr/B) offset / 3 (at 1024 throughout, 8 runs: 1.0-1.2 % off, resolving 3.5-7.6 %)
    "quick": TaskAllocationProfile(tasks=(2, 2), L=64, surplus_heads=1, fewer_heads_tasks=(2, 2, 2),
                                   lr=0.05, time=55.0, batch=1024, tail_batch=3072, records=61, held_out=65536),
    # docs/model.md problem (r = 3, m = 2, L = 128, B = 2048, lr 0.05), long enough for the surplus heads to decay on
    # theory's flow; meant for a GPU
    "paper": TaskAllocationProfile(tasks=(3, 3), L=128, surplus_heads=2, fewer_heads_tasks=(3, 3, 3),
                                   lr=0.05, time=600.0, batch=2048, records=121, held_out=262144,
                                   slope_prompts=65536),
}


def domain(cfg: ProblemConfig, t_end: float, need: float, rate: float | None, unstable: str | None = None) -> dict:
    """Whether theory predicts allocation for cfg at a run of length t_end (decided before any run), and why not, from
    theory's values: ``need`` the horizon (task_allocation.horizon: the shortest run inside the domain, inf where
    theory's own flow keeps the surplus heads), ``rate`` the saddle's escape rate 2a (saddle.max_growth_rate; None:
    no saddle to escape), ``unstable`` why the step is past the stability bound (such a run is no evidence)."""
    reasons = [unstable] if unstable else []
    if math.isinf(need):
        reasons.append(f"surplus heads: theory's expansion flow from this start keeps them above "
                       f"{allocation_theory.SURPLUS_FRACTION:g} mu* up to t = {allocation_theory.SURPLUS_T_MAX:g} "
                       "(theory predicts no allocation within any run; start them smaller, e.g. surplus_mu = 0.2)")
    elif t_end < need * (1 - 1e-9):
        reasons.append(f"horizon t_end = {t_end:g} < {need:.4g}, the time theory needs to allocate "
                       f"({allocation_theory.HORIZON_FACTOR:g} warm-up race times; with surplus heads, their decay "
                       f"below {allocation_theory.SURPLUS_FRACTION:g} mu* on theory's expansion flow)")
    if cfg.param != "factored":
        reasons.append("merged weights: allocation is not a fixed point of the merged flow (superposition)")
    if cfg.heads < cfg.m:
        reasons.append(f"H = {cfg.heads} < m = {cfg.m}: the paper says nothing about fewer heads than tasks")
    if any(np.any(np.asarray(a) <= 0) for a in start_args(cfg)[:2]):
        reasons.append("the start is not sign-aligned (some omega0 or mu0 <= 0)")
    if rate is not None and not reasons and rate * t_end > ESCAPE_EFOLDS:
        reasons.append(f"the allocated point is a saddle: theory's off-task slope makes its unstable direction "
                       f"grow at rate {rate:.3g}, {rate * t_end:.3g} e-folds over t_end = {t_end:.4g} > "
                       f"{ESCAPE_EFOLDS:g}: a trained (noisy) run is predicted to leave it for a superposition")
    if cfg.L < L_MIN:
        reasons.append(f"L = {cfg.L} < L_MIN = {L_MIN}: the allocation plateau is escaped through the noise")
    return {"inside": not reasons, "reasons": reasons, "escape_rate": rate, "t_end": float(t_end),
            "unstable": bool(unstable), "efolds": None if rate is None else rate * t_end,
            "conditions": f"factored, H >= m, positive favoured start, L >= {L_MIN}, escape_rate x t_end <= "
                          f"{ESCAPE_EFOLDS:g}, t_end >= {allocation_theory.HORIZON_FACTOR:g} warm-up race times, "
                          "exact fixed point exists"}


def _compare(measured, predicted, tolerance) -> tuple[float, float]:
    """THE comparison of every check: (error, tolerance) with error = max |measured - predicted| / tolerance
    entrywise (tolerance 0: the count of differing entries, against 0)."""
    meas, pred = np.asarray(measured, float), np.asarray(predicted, float)
    tol = np.broadcast_to(np.asarray(tolerance, float), meas.shape)
    diff = np.abs(meas - pred)
    if np.all(tol == 0):
        return float(np.sum(diff > 0)), 0.0
    return float(np.max(diff / tol)), 1.0


def _comparison(row: str, tag: str, measured, predicted, tolerance, why, wrong: list, details=None,
                se=None, units=None, entrywise: bool = False) -> Comparison:
    """A Comparison from :func:`_compare` named ``row tag`` (config ``tag``); ``wrong`` = [(description, different
    prediction)], each through the same function.  ``details["row"]``: the headline row's fields (name ``row``, theory,
    measured, se, tolerance in the measurement's units).  ``units``, ``entrywise``: how its resolving power counts."""
    row_fields = {"name": row, "theory": predicted, "measured": measured, "se": se, "tolerance": tolerance}
    return compare(f"{row} {tag}", measured, predicted, _compare(measured, predicted, tolerance)[1], why, wrong=wrong,
                   error=lambda m, p: _compare(m, p, tolerance)[0], config=tag, units=units, entrywise=entrywise,
                   details={"row": jsonable(row_fields), **(details or {})})


def headline_of(c: Comparison, suffix: str = "") -> dict:
    """The headline row of a comparison made by :func:`_comparison`: its numbers as compared (lists where the
    comparison is entrywise), its agreement from the comparison itself."""
    r = c.details["row"]
    return asdict(HeadlineRow(name=r["name"] + suffix, theory=r["theory"], measured=r["measured"], se=r["se"],
                              tolerance=r["tolerance"], agrees=c.agrees, side=c.side, config=c.config,
                              resolving_power=c.resolving_power))


def check_allocation(cfg: ProblemConfig, meas: dict, pred: dict, dom: dict) -> list[Comparison]:
    """The run ``meas`` (``phases.allocation_run``) against theory's prediction ``pred`` (theory.task_allocation.
    allocation_prediction), H >= m, inside the domain ``dom``; each through :func:`_compare`, with wrong predictions:

    - **OV singular values above threshold per head** of each head's tail-mean U_h = O_h V_h (m x (d + m), every entry
      trained), counted, against theory's allocated point (1 for a head serving a task, 0 for a surplus head); wrong:
      task 0 given to another head.  Threshold: THRESHOLD_SIGMAS x ||S_h||_F, S_h the standard errors of the tail
      mean's entries (``phases.tail_standard_errors``): a singular value 0 in truth reads at most ||E||_2 <= ||E||_F
      (Weyl), E the tail mean's error; for a Gaussian E, ||E||_F^2 is a weighted chi-square of mean ||S_h||_F^2 whatever
      the correlations, and P(||E||_F > 5 ||S_h||_F) <= P(chi2_1 > 25) = 6e-7.  W_h's spectrum is reported: the
      off-task omega decay only algebraically (~1/t: the loss is even in them), small but not zero at t_end.
    - **winners** (``numerics.evaluate``: argmax_h mu[h,i] omega[h,i] of the tail mean) against
      ``theory.task_allocation.predicted_winners`` (rule "ode"); wrong: task 0 given to another head.
    - **allocated fixed point**: the serving (omega[h(i),i], mu[h(i),i]) (tail mean) against theory.exact.
      exact_fixed_point (quadrature error ~1e-12) moved by theory's shift of the served optimum by the off-task omega
      the run still holds (``served_shift``); wrong: omega* or mu* x 1.1.  Tolerance per entry: Z_SE x its standard
      error + its per-record spread: SGD iterates fluctuate about the flow's fixed point with that spread, and the
      finite step and batch may displace the cloud's centre (a bias O(lr/B) in the flat valley, measured 1-3% at
      B = 512-2048) by no more than its width.  Both from the run's own records (``phases.allocation_run``).
    - **surplus heads** (H > m): their largest tail-mean |mu| against 0, tolerance the OV threshold of that head, at
      least the SURPLUS_FRACTION mu* that theory's expansion flow may still leave in them at the horizon; wrong: a
      surplus head serving task 0 with mu*_0.
    - **trained loss**: the held-out loss of the tail-averaged merged weights (W_h, U_h) on fresh prompts (the final
      weights', inflated by the last step's jitter, in the details) against theory.exact.exact_loss at the allocated
      point; wrong: x 1.1.  Tolerance Z_SE x its standard error + max(0, held-out loss of the averaged full model -
      reduced loss at the tail-mean readout, same prompts): what the off-D parts and the last step's jitter add, both
      Monte-Carlo noise of the run (theory's population flow stays on D) + the quadrature error."""
    if not dom["inside"]:
        raise ValueError(f"check_allocation needs a case inside the domain ({dom['conditions']}); "
                         f"this one is not: {'; '.join(dom['reasons'])}. Use check_boundary")
    H, tcfg = cfg.heads, meas["train"]
    tail = f" (tail {meas['tail_batch']})" if meas["tail_batch"] != tcfg.batch else ""
    tag = f"tasks={cfg.tasks} H={H} L={cfg.L} sigma={cfg.sigma:g} B={tcfg.batch}{tail} t={tcfg.time:g}"
    surplus = [h for h in range(H) if h not in pred["winners"]]
    common = {"config": cfg.to_dict(), "train": tcfg.to_dict(), "domain": dom}
    # a surplus head's threshold also allows the SURPLUS_FRACTION mu* that theory's own flow may still leave in it at
    # the horizon (the domain's surplus condition), as its |mu| row does
    thresholds = meas["threshold"].copy()
    thresholds[surplus] = np.maximum(thresholds[surplus],
                                     allocation_theory.SURPLUS_FRACTION * float(np.min(pred["mu_star"])))
    comps = _allocation_comparisons(cfg, meas, pred, tag, surplus, thresholds, common)
    comps.append(_served_comparison(cfg, meas, pred, tag, common))
    if surplus:
        alt = np.where(np.arange(len(surplus)) == 0, pred["mu_star"][0], 0.0)
        comps.append(_comparison(
            "surplus heads' largest |mu|", tag, np.abs(meas["mu_end"][surplus]).max(axis=1),
            np.abs(pred["mu_alloc"][surplus]).max(axis=1), thresholds[surplus],
            f"the OV threshold of each surplus head (as above), at least the {allocation_theory.SURPLUS_FRACTION:g} "
            "mu* that theory's expansion flow may still leave in them at the horizon (the domain's surplus condition)",
            [(f"surplus head {surplus[0]} serves task 0 with mu*_0", alt)],
            {**common, "surplus_heads": surplus, "mu_end": meas["mu_end"]}, units="absolute"))
    comps.append(_loss_comparison(meas, pred, tag, common))
    off = np.abs(meas["omega_end"])
    off[np.asarray(pred["winners"]), np.arange(cfg.m)] = 0.0
    comps[0].details |= {"largest_off_task_omega": float(off.max()), "prediction": pred,
                         "measurement": {k: meas[k] for k in ("t", "omega", "mu", "omega_end", "mu_end")}}
    return comps


def _allocation_comparisons(cfg, meas, pred, tag, surplus, thresholds, common) -> list[Comparison]:
    """:func:`check_allocation`'s counts of OV singular values above threshold per head and its winners, each against
    the different allocation: task 0 served by another head (a surplus one if there is one; with one head and one
    task, "no value": nothing learnt)."""
    H, winners = cfg.heads, pred["winners"]
    other = surplus[0] if surplus else (winners[0] + 1) % H
    wrong_winners = [other] + winners[1:]
    wrong_counts = ([0] * H if other == winners[0] else allocation_theory.allocation_counts(
        *allocation_theory.allocated_point(wrong_winners, pred["omega_star"], pred["mu_star"], H)))
    wrong_desc = (f"task 0 served by head {other} (counts {wrong_counts})" if other != winners[0]
                  else "the head learns nothing (counts [0])")
    above = [int(np.sum(np.asarray(sv) > th)) for sv, th in zip(meas["U_singular_values"], thresholds)]
    comps = [_comparison(
        "OV singular values above threshold per head", tag, above,
        allocation_theory.allocation_counts(pred["omega_alloc"], pred["mu_alloc"]), 0.0,
        f"exact: singular values of each head's tail-mean U_h above {THRESHOLD_SIGMAS:g} x the Frobenius norm of their "
        f"entries' standard errors, for surplus heads at least {allocation_theory.SURPLUS_FRACTION:g} mu* "
        f"(thresholds {np.round(thresholds, 4).tolist()}), counted", [(wrong_desc, wrong_counts)],
        {**common, "U_singular_values": meas["U_singular_values"], "threshold": meas["threshold"],
         "W_block_singular_values": meas["W_block_singular_values"], "W_singular_values": meas["W_singular_values"],
         "residual_end": meas["residual_end"]}, units="count")]
    if H > 1:
        comps.append(_comparison(
            "winners", tag, list(allocation(meas["omega_end"], meas["mu_end"]).winners), winners, 0.0,
            "exact: the head carrying task i (numerics.evaluate: argmax_h tail-mean mu omega) is "
            "theory.task_allocation.predicted_winners", [(f"winners {wrong_winners}", wrong_winners)], common,
            units="count"))
    return comps


def _served_comparison(cfg, meas, pred, tag, common) -> Comparison:
    """:func:`check_allocation`'s allocated fixed point: the serving (omega, mu) of the tail mean against theory's,
    moved by the served optimum's shift; wrong: omega* or mu* x PERTURB_FACTOR."""
    idx, f = (np.asarray(pred["winners"]), np.arange(cfg.m)), PERTURB_FACTOR
    served = lambda what: np.concatenate([meas[f"omega_{what}"][idx], meas[f"mu_{what}"][idx]])  # noqa: E731
    shift = allocation_theory.served_shift(meas["omega_end"], pred["winners"], cfg.tasks, cfg.L, cfg.sigma)
    fp = lambda om, mu: np.concatenate([om, mu]) + shift.reshape(-1)  # noqa: E731
    omega_star, mu_star = pred["omega_star"], pred["mu_star"]
    # the entry farthest from theory's, relative to it: a one-number summary beside the entrywise max |d| / tolerance
    rel = np.abs(served("end") / fp(omega_star, mu_star) - 1)
    tol = Tolerance((noise_term(served("se"), "the tail mean", f"correlation <= {np.round(meas['tail_rho'], 3)}^lag"),
                     term("the per-record spread of the SGD iterates", served("spread"))),
                    "the finite step and batch may displace the cloud's centre by its width.  Prediction: "
                    "theory.exact.exact_fixed_point (exact to ~1e-12) moved by theory's shift of the served optimum by "
                    "the off-task omega the run still holds at t_end (theory.exact.served_optimum at the measured row minus "
                    "at zeros)")
    return _comparison(
        "allocated fixed point (omega*_i..., mu*_i...)", tag, served("end"), fp(omega_star, mu_star), tol.value,
        "per entry: " + tol.why(),
        [(f"omega* x {f:g}", fp(f * omega_star, mu_star)), (f"mu* x {f:g}", fp(omega_star, f * mu_star))],
        {**common, "omega_end": meas["omega_end"], "mu_end": meas["mu_end"], "off_task_shift": shift,
         "largest_relative_deviation": {"value": float(rel.max()), "entry": int(rel.argmax())}},
        entrywise=True)


def _loss_comparison(meas, pred, tag, common) -> Comparison:
    """:func:`check_allocation`'s trained loss (held out) against the exact loss at the allocated point."""
    full, red = meas["held_out"], meas["held_out_reduced_at_mean"]
    excess = max(0.0, full.mean - red.mean)
    tol = Tolerance((noise_term(full.se, "the held-out loss", f"{full.n} fresh prompts"), term(
        "the loss the off-D parts and the averaging leave (full model at the tail-averaged weights - reduced model at "
        "the tail-mean readout, same prompts)", excess), term("the quadrature error", pred["loss_error"])))
    return _comparison(
        "trained loss (held out) vs exact loss at the allocated point", tag, full.mean, pred["loss"],
        tol.value, tol.why(), [(f"exact loss x {PERTURB_FACTOR:g}", PERTURB_FACTOR * pred["loss"])],
        {**common, "held_out": full, "held_out_final_weights": meas["held_out_final_weights"],
         "held_out_reduced_at_mean": red, "train_tail_loss": meas["train_tail_loss"]}, se=full.se)


SLOPE_LOW = 0.8
"""The wrong prediction 'a 20 % low' of :func:`check_off_task_slope`: an error the domain's escape rule cannot see."""


def check_off_task_slope(cfg: ProblemConfig, point: tuple, a, g: dict, n: int) -> Comparison:
    """The input of the domain's saddle rule, measured: theory's off-task slope ``a``[h, i] = d loss / d mu[h, i] at its
    allocated ``point`` (``theory.saddle.off_task_slope``, by quadrature; escape rate 2 max a) against the Monte-Carlo
    gradient ``g`` of the exact reduced loss there (``phases.off_task_gradient``: n fresh Rao-Blackwellised prompts),
    entrywise over the off-task entries (surplus heads' included).  The rule escape_rate x t_end <= ESCAPE_EFOLDS is
    one-sided and coarse: a slope 20 % low, or of the wrong sign (a minimum, not a saddle), would leave a run inside it;
    here either is a wrong prediction through the same comparison.  Tolerance per entry: Z_SE standard errors of the
    Monte-Carlo gradient (independent groups); the quadrature's error (~1e-10) is far below it."""
    a = np.asarray(a, float)
    off = np.isfinite(a)
    measured, predicted, se = g["grad_mu"][off], a[off], g["grad_mu_se"][off]
    tag = f"tasks={cfg.tasks} H={cfg.heads} L={cfg.L} sigma={cfg.sigma:g}"
    tol = Tolerance((noise_term(se, "the Monte-Carlo gradient", f"{n} prompts, independent groups"),),
                    "of the exact reduced loss at theory's allocated point")
    return _comparison(
        "off-task slope a = dL/dmu at the allocated point (the saddle's rate 2a)", tag, measured.tolist(),
        predicted.tolist(), tol.value.tolist(), "per off-task entry: " + tol.why(), [
            (f"a {round(100 * (1 - SLOPE_LOW)):d} % low (x {SLOPE_LOW:g})", (SLOPE_LOW * predicted).tolist()),
            ("a of the wrong sign (the allocated point a minimum)", (-predicted).tolist())],
        {"omega": point[0], "mu": point[1], "slope": a, "grad_mu": g["grad_mu"], "grad_mu_se": g["grad_mu_se"], "n": n,
         "escape_rate": 2.0 * float(max(0.0, np.max(predicted))) if predicted.size else 0.0,
         "grad_mu_se_off_task": se.tolist()},
        se=float(np.max(se)) if se.size else None, entrywise=True)   # the row's se: the largest entry's


def check_boundary(cfg: ProblemConfig, meas: dict, dom: dict) -> Comparison:
    """A case outside the domain ``dom`` (H < m, merged, L < L_MIN, the saddle's escape), its run ``meas``: its
    allocation recorded (values above threshold per head, who serves what); asserted: every task resolved by a head."""
    tcfg = meas["train"]
    resolved = (np.abs(meas["mu_end"]) > meas["threshold"][:, None]).any(axis=0).astype(float)
    return _comparison(
        "boundary (outside the domain): every task resolved",
        f"tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} B={tcfg.batch} t={tcfg.time:g}", resolved.tolist(),
        [1.0] * cfg.m, 0.0, "exact: each task has some |mu| above its head's OV threshold (the finding is conclusive); "
        "the counts per head are recorded, not predicted", [("no task resolved", [0.0] * cfg.m)],
        {"config": cfg.to_dict(), "train": tcfg.to_dict(), "domain": dom, "boundary": True, "above_per_head":
         meas["above"], **{k: meas[k] for k in ("U_singular_values", "threshold", "mu_end", "omega_end",
                                                 "W_block_singular_values", "held_out")}}, units="count")


def case_configs(p: TaskAllocationProfile, device: str = "cpu") -> list[ProblemConfig]:
    """The cases of a profile (H = m; H = m + surplus; H = m - 1 on fewer_heads_tasks), or the researcher's problem."""
    if p.problem:
        q = dict(p.problem)
        tasks, heads, L = tuple(q.pop("tasks")), int(q.pop("heads")), int(q.pop("L"))
        return [experiments.favoured_problem(tasks, heads, L, device=device, surplus_mu=p.surplus_mu, **q)]
    m, f = len(p.tasks), len(p.fewer_heads_tasks or ())
    cases = ([(p.tasks, m)] + [(p.tasks, m + p.surplus_heads)] * bool(p.surplus_heads)
             + [(p.fewer_heads_tasks, f - 1)] * bool(f))
    return [experiments.favoured_problem(t, H, p.L, device=device, sigma=p.sigma, param=p.param,
                                         init_scale=p.init_scale, surplus_mu=p.surplus_mu) for t, H in cases]


def case_needs(ctx, cfg: ProblemConfig) -> dict:
    """A case's needs: its domain's inputs (theory's ``horizon``, the saddle's escape ``rate`` where an off-task entry
    can escape -- factored, H >= max(m, 2) --, the step's stability guard ``unstable``); its ``run`` for the profile's
    time or else the horizon (a dependency), or ``boundary_run`` held out on <= 16384 prompts (recorded, not compared);
    theory's ``prediction``; the off-task slope's inputs (theory's ``point`` and ``slope``, the MC ``gradient``)."""
    p, args = ctx.p, (tuple(cfg.tasks), cfg.L, cfg.sigma, cfg.heads)
    horizon, point = (theory_need("allocation_horizon", *start_args(cfg), experiments.TAIL_FRACTION),
                      theory_need("saddle_allocated_point", *args))
    run = dict(cfg=cfg, lr=p.lr, time=p.time if p.time is not None else horizon, batch=p.batch, records=p.records,
               z=Z_SE, threshold_sigmas=THRESHOLD_SIGMAS)
    out = {"horizon": horizon, "unstable": unstable_need(cfg, p.lr), "point": point,
           "run": need("allocation_run", held_out=p.held_out, tail_batch=p.tail_batch, **run),
           "boundary_run": need("allocation_run", held_out=min(p.held_out, 16384), **run),
           "prediction": theory_need("allocation_prediction", *start_args(cfg)), "slope": theory_need(
               "off_task_slope", *args), "gradient": need("off_task_gradient", tasks=args[0], heads=cfg.heads, L=cfg.L,
                                                          sigma=cfg.sigma, point=point, n=p.slope_prompts,
                                                          device=ctx.device)}
    if cfg.param == "factored" and cfg.heads >= max(cfg.m, 2):
        out["rate"] = theory_need("max_growth_rate", tuple(cfg.tasks), cfg.L, cfg.sigma)
    return out


def case_domain(p: TaskAllocationProfile, cfg: ProblemConfig, n: dict, results) -> dict:
    """:func:`domain` of a case (its needs ``n``) from the results, for a run of the profile's time or the horizon."""
    need_t = results[n["horizon"]]
    return domain(cfg, run_time(p.time if p.time is not None else need_t), need_t,
                  results[n["rate"]] if "rate" in n else None, results[n["unstable"]])


def plan(ctx, results=None) -> list:
    """Per case its domain's inputs; once known, the run (none past the stability bound) and, inside the domain,
    theory's prediction and, once per (tasks, L, sigma), the off-task slope's.  Asked with no results (the estimate),
    each case as its configuration alone places it, every stability guard passed."""
    p, out, slopes = ctx.p, [], set()
    for cfg in case_configs(p, ctx.device):
        n = case_needs(ctx, cfg)
        first = [n[k] for k in ("horizon", "rate", "unstable") if k in n]
        out += first
        if results is not None and not all(x in results for x in first):
            continue
        dom = domain(cfg, math.inf, 0.0, None) if results is None else case_domain(p, cfg, n, results)
        if dom["unstable"]:
            continue
        out += [n["run"], n["prediction"]] if dom["inside"] else [n["boundary_run"]]
        if dom["inside"] and "rate" in n and (cfg.tasks, cfg.L, cfg.sigma) not in slopes:
            slopes.add((cfg.tasks, cfg.L, cfg.sigma))      # measured once per (tasks, L, sigma), as compared
            out += [n["point"], n["slope"], n["gradient"]]
    return out


def compare_results(ctx, results) -> Outcome:
    """Claim 4: cases inside the domain compared with theory, cases outside it run as boundary findings.  A profile
    without a time runs each case to the domain's horizon (theory's race and settling times); a case whose horizon is
    infinite (theory's flow keeps its surplus heads) runs to BOUNDARY_TIME as a boundary finding."""
    p, comps, headline, ran, domains, slopes, unstable = ctx.p, [], [], [], [], set(), []
    for cfg in case_configs(p, ctx.device):
        n = case_needs(ctx, cfg)
        dom = case_domain(p, cfg, n, results)
        domains.append({"tasks": cfg.tasks, "heads": cfg.heads, "L": cfg.L, **dom})
        meas = None if dom["unstable"] else results[n["run" if dom["inside"] else "boundary_run"]]
        ran.append({"tasks": list(cfg.tasks), "heads": cfg.heads, "L": cfg.L, "sigma": cfg.sigma, "param": cfg.param,
                    "inside_domain": dom["inside"], "train": meas["train"].to_dict() if meas else None})
        suffix = f" (tasks={cfg.tasks}, H={cfg.heads}, L={cfg.L})"
        if dom["unstable"]:     # not run: a run past the stability bound is no evidence either way
            unstable.append(f"tasks={cfg.tasks} H={cfg.heads} L={cfg.L}: {dom['reasons'][0]}")
        elif dom["inside"]:
            cs = check_allocation(cfg, meas, results[n["prediction"]], dom)
            headline += [headline_of(c, suffix) for c in cs]
            headline.append(reported_row("largest off-task |omega| (reported: decays ~1/t)" + suffix, theory=0.0,
                                         measured=cs[0].details["largest_off_task_omega"], config=cs[0].config))
            comps += cs
            if dom["escape_rate"] is not None and (cfg.tasks, cfg.L, cfg.sigma) not in slopes:   # the saddle's slope
                slopes.add((cfg.tasks, cfg.L, cfg.sigma))
                c = check_off_task_slope(cfg, results[n["point"]], results[n["slope"]], results[n["gradient"]],
                                         p.slope_prompts)
                headline.append(headline_of(c, suffix))
                comps.append(c)
        else:
            c = check_boundary(cfg, meas, dom)
            headline.append(headline_of(c, suffix + f" [{'; '.join(dom['reasons'])}]"))
            comps.append(c)
    with_mu = [c for c in comps if c.name.startswith("allocated fixed point") or c.details.get("boundary")]
    figures = [Figure(name=f"task-allocation-heatmap-{k}", title=f"tail-mean mu, head x task ({c.name})",
                      kind="heatmap", matrix=np.asarray(mu).tolist(), row_labels=[f"head {h}" for h in range(len(mu))],
                      col_labels=[f"task {i}" for i in range(len(mu[0]))], xlabel="task", ylabel="head",
                      caption="one value per row (head) and per column (task) when allocated")
               for k, (c, mu) in enumerate((c, c.details["mu_end"]) for c in with_mu[:3])]
    # the headline: the served fixed point of the first case inside the domain (the claim's numbers)
    served = [c.name for c in comps if c.name.startswith("allocated fixed point")]
    return Outcome(comps, headline, figures, short_why=True, headline_comparison=served[0] if served else None,
                   details={"ran": ran, "domain": domains, "profile_fields": asdict(p), "not_run": unstable},
                   undecided=("not run: " + "; ".join(unstable)) if unstable and not comps else None)


def findings(result) -> list:
    """Per case inside the domain: counts, winners and the served point against theory; the saddle's escape limit of
    the domain (the allocated point is a saddle; runs with 2a t_end > ESCAPE_EFOLDS excluded); each boundary case."""
    out, comps, saddle_said = [], result.details.get("comparisons", []), False
    for d in result.details.get("domain", []):
        key = f"tasks={tuple(d['tasks'])} H={d['heads']} L={d['L']} "
        tag = [c for c in comps if (c["config"] or "").startswith(key)]
        rows = {c["details"]["row"]["name"]: c for c in tag}
        if d["inside"] and tag:
            ov = rows["OV singular values above threshold per head"]
            fp = rows["allocated fixed point (omega*_i..., mu*_i...)"]
            w = {"w": rows["winners"]["measured"], "wp": rows["winners"]["predicted"]} if "winners" in rows else {}
            out.append(finding(result, "holds" if all(c["agrees"] for c in tag) else "stops",
                               "At {config} the trained heads carry {counts} OV singular values above threshold "
                               "(theory {pred}), " + ("the winners are {w} (theory {wp}), " if w else "") + "and the "
                               "served (omega*, mu*) agree to {fp} of their tolerance (worst |d|/tol).",
                               config=ov["config"], counts=ov["measured"], pred=ov["predicted"], fp=fp["error"], **w))
        elif tag:
            out.append(finding(result, "stops", "Outside the domain at {config} ({why}): OV values per head {above}.",
                               config=tag[0]["config"], why="; ".join(d["reasons"]),
                               above=tag[0]["details"]["above_per_head"]))
        if d.get("escape_rate") and not saddle_said:
            saddle_said = True
            out.append(finding(result, "stops",
                               "The allocated point is a saddle of the factored flow: at tasks={tasks} H={H} L={L} "
                               "theory's off-task slope makes it unstable at rate 2a = {rate}, so a run stays "
                               "allocated only while 2a t_end <= {limit} (here {efolds} e-folds over t_end = {t}); "
                               "longer runs are outside the domain.", tasks=str(tuple(d["tasks"])), H=d["heads"],
                               L=d["L"], rate=d["escape_rate"], limit=ESCAPE_EFOLDS, efolds=d["efolds"], t=d["t_end"]))
    return out


SPEC = ClaimSpec(
    id="task-allocation", title="Task allocation: one task per head",
    statement=("At the limit each head's OV weight has exactly one nonzero semi-singular value; task i goes to "
               "the head whose OV value for i is largest (the head favoured by the initialisation)."),
    profiles=PROFILES, plan=plan, compare=compare_results, findings=findings,
    resolve=with_problem,
    cannot_run=lambda q: None if {"tasks", "heads", "L"} <= set(q) else (
        "problem must give tasks, heads, L and optionally sigma, param, init_scale, logit_scale, basis, dtype; got "
        f"keys {sorted(q)}"),
    paper="each head ends serving one task, the one its initial OV value favours most")
