"""What the claim checks share: the comparison object every check returns, the one
tolerance policy (:data:`Z_SE`), the one constructor of a claim's result
(:func:`comparisons_result`), trajectory arrays and figures, and the statistics of
measured numbers (batch-means standard errors, paired ratios, the L -> inf extrapolation).

A claim module is its experiment plan and its comparisons: every estimator and every loop
is in ``numerics``, every prediction in ``theory``.  Nothing here decides a verdict (that
is :func:`claims.base.judge`, from the :class:`Comparison` objects).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from claims.base import PROFILES, ClaimResult, HeadlineRow, judge, Figure, PerturbationCheck, Series, jsonable
from numerics.model import initial_semi_singular_values

EPS64 = float(np.finfo(np.float64).eps)
"""Unit round-off of float64 (2.2e-16): the scale of every 'exact to rounding' tolerance."""

Z_SE = 4.0
"""The one tolerance policy for Monte-Carlo comparisons: a measured number agrees with its
prediction within Z_SE = 4 standard errors of its Monte-Carlo noise (plus any systematic
error the theory states).  Why 4: a report holds of the order of 100 such comparisons; a
Gaussian deviation beyond 4 standard errors has probability 6e-5, so a correct prediction
fails somewhere in the report by chance with probability ~0.6% (at 3 standard errors,
probability 2.7e-3 each, it would be ~25%), while a real discrepancy of a few standard
errors -- what the perturbation checks send through the same comparison -- is still caught.
The same constant bounds one-sided statistics (a trend "p + Z_SE se(p) < 0") and tail
bounds of accumulated noise (Z_SE x rms)."""


# ---------------------------------------------------------------------------------------
# the comparison object every check function returns
# ---------------------------------------------------------------------------------------

@dataclass
class Comparison:
    """One comparison of a measurement with a prediction.

    ``measured`` and ``predicted`` are the numbers compared (scalars or small lists),
    ``error`` the discrepancy in the units of ``tolerance``, ``why`` the argument the
    tolerance comes from; :attr:`agrees` is computed: ``error <= tolerance`` (a check whose
    agreement has a structural condition besides the number sets error = inf when it fails).
    ``perturbations`` is
    the same comparison run against deliberately wrong predictions; each must be rejected.
    ``details`` carries the configuration, seeds and intermediate numbers; ``figures``
    optional figure data for the report.
    """

    name: str
    measured: object
    predicted: object
    error: float
    tolerance: float
    why: str
    perturbations: list[PerturbationCheck] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """error <= tolerance (false for a NaN error)."""
        return bool(self.error <= self.tolerance)

    @property
    def discriminates(self) -> bool:
        """True if every perturbed prediction was rejected (and there was at least one)."""
        return bool(self.perturbations) and all(p.rejected for p in self.perturbations)

    @property
    def margin(self) -> float:
        """error / tolerance: < 1 agrees; the 'worst agreement' reported is the max of this."""
        if self.tolerance > 0:
            return float(self.error / self.tolerance)
        return 0.0 if self.error == 0 else math.inf

    def summary(self) -> dict:
        """The JSON-able record of this comparison (what ClaimResult.details holds per case)."""
        return jsonable({
            "name": self.name,
            "measured": self.measured,
            "predicted": self.predicted,
            "error": self.error,
            "tolerance": self.tolerance,
            "why": self.why,
            "agrees": self.agrees,
            "margin": self.margin,
            "perturbations": [{"description": p.description, "rejected": p.rejected, **p.details}
                              for p in self.perturbations],
            "details": self.details,
        })

    def explain(self) -> str:
        """A one-paragraph message for a failing test (numbers, tolerance, perturbations)."""
        lines = [f"{self.name}: error {self.error:.4g} vs tolerance {self.tolerance:.4g} "
                 f"(agrees={self.agrees}); measured={_short(self.measured)}, predicted={_short(self.predicted)}",
                 f"  tolerance: {self.why}"]
        for p in self.perturbations:
            lines.append(f"  perturbation '{p.description}': rejected={p.rejected} {_short(p.details)}")
        lines.append(f"  details: {_short(self.details, 1500)}")
        return "\n".join(lines)


def _short(obj, limit: int = 400) -> str:
    s = str(jsonable(obj))
    return s if len(s) <= limit else s[:limit] + " ..."


def perturbation(description: str, error: float, tolerance: float, **details) -> PerturbationCheck:
    """A perturbed prediction is rejected when its error exceeds the same tolerance."""
    return PerturbationCheck(description=description, rejected=bool(error > tolerance),
                             details=jsonable({"error": error, "tolerance": tolerance, **details}))


def worst(comparisons: list[Comparison]) -> dict:
    """The worst agreement over a list of comparisons: the largest error/tolerance."""
    if not comparisons:
        return {"margin": None, "name": None}
    c = max(comparisons, key=lambda c: c.margin)
    return {"margin": c.margin, "name": c.name, "error": c.error, "tolerance": c.tolerance}


def check_profile(profile: str) -> str:
    """The one profile check of the claims layer: one of claims.base.PROFILES, or ValueError."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    return profile


# ---------------------------------------------------------------------------------------
# trajectories
# ---------------------------------------------------------------------------------------

@dataclass
class Trajectory:
    """A recorded run as arrays: t (n,), loss (n,), omega/mu (n, H, m), residual (n,)."""

    t: np.ndarray
    loss: np.ndarray
    omega: np.ndarray
    mu: np.ndarray
    residual: np.ndarray


def trajectory_of(result) -> Trajectory:
    """Arrays from a ``numerics.train.TrainResult`` (its ``trajectory`` of ``Record``)."""
    recs = result.trajectory
    return Trajectory(
        t=np.array([r.t for r in recs], float),
        loss=np.array([r.loss for r in recs], float),
        omega=np.array([r.omega for r in recs], float),
        mu=np.array([r.mu for r in recs], float),
        residual=np.array([r.residual for r in recs], float),
    )


def value_panels(name: str, title: str, t_points: np.ndarray, omega_points: np.ndarray,
                 mu_points: np.ndarray, t_line: np.ndarray, omega_line: np.ndarray,
                 mu_line: np.ndarray, points_label: str, line_label: str) -> Figure:
    """Figure of kind "panels": omega and mu per head (one panel each), points = measured,
    lines = predicted, one series per task."""
    H, m = omega_points.shape[1:]
    panels = []
    for which, P, Lr in (("omega", omega_points, omega_line), ("mu", mu_points, mu_line)):
        for h in range(H):
            series = []
            for i in range(m):
                series.append(Series(f"{line_label} task {i}", list(map(float, t_line)),
                                     list(map(float, Lr[:, h, i])), "line"))
                series.append(Series(f"{points_label} task {i}", list(map(float, t_points)),
                                     list(map(float, P[:, h, i])), "points"))
            panels.append(Figure(name=f"{name}-{which}-h{h}", title=f"{which}[{h}, i]", kind="lines",
                                 xlabel="t", ylabel=which, series=series))
    return Figure(name=name, title=title, kind="panels", panels=panels)


def log_comparison(c: Comparison, test: str) -> None:
    """Append one line (test, name, error, tolerance, margin, perturbations rejected) to the
    JSON-lines file named by $ICL_CLAIMS_LOG, if set: how the worst agreement over the drawn
    examples is collected for the documentation (``docs/claims_1_4.md``)."""
    path = os.environ.get("ICL_CLAIMS_LOG")
    if not path:
        return
    line = jsonable({"test": test, "name": c.name, "error": c.error, "tolerance": c.tolerance, "margin": c.margin,
                     "agrees": c.agrees, "perturbations": [[p.description, p.rejected, p.details.get("error")]
                                                           for p in c.perturbations]})
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def initial_values(cfg) -> tuple[np.ndarray, np.ndarray]:
    """(omega, mu) (H, m) float64 numpy of cfg's decomposable initialisation."""
    return tuple(a.numpy().copy() for a in initial_semi_singular_values(cfg))


def _scalar(x):
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, float, np.integer, np.floating)):
        return float(x)
    return None


def headline_row(c: Comparison, name: str | None = None, *, theory=None, measured=None,
                 se: float | None = None, tolerance: float | None = None) -> dict:
    """The headline row (claims.base.HeadlineRow as a dict) of one comparison: its name,
    prediction, measurement, tolerance and agreement, taken from the comparison itself (so
    the row cannot disagree with the verdict).  ``theory``/``measured``/``tolerance``
    replace the comparison's numbers where those are not the scalar a reader wants (a
    bracket, a ratio); ``se`` is the measurement's standard error."""
    return asdict(HeadlineRow(
        name=name or c.name,
        theory=jsonable(theory if theory is not None else _scalar(c.predicted)),
        measured=jsonable(measured if measured is not None else _scalar(c.measured)),
        se=None if se is None else float(se),
        tolerance=float(tolerance if tolerance is not None else c.tolerance),
        agrees=c.agrees))


def comparisons_result(claim_id: str, title: str, statement: str, comps: list, figures: list, details: dict,
                       theory: dict | None = None, short_why: bool = False, numerics: dict | None = None,
                       tolerance: dict | None = None, headline: list | None = None) -> ClaimResult:
    """The one constructor of a claim's ClaimResult from its list of comparisons: verdict from
    ``judge`` (all agree and every perturbation is rejected), theory/numerics/tolerance keyed
    by comparison name (``theory``, ``numerics``, ``tolerance`` override them with a claim's
    own summary), the worst case and every comparison's summary in ``details``.
    ``short_why`` keeps each tolerance argument up to its first " (", where the per-case
    numbers start.  ``headline``: the claim's headline rows (:func:`headline_row`); by
    default one row per comparison."""
    perts = [p for c in comps for p in c.perturbations]
    whys = {c.why.split(" (")[0] if short_why else c.why for c in comps}
    return ClaimResult(
        id=claim_id, title=title, statement=statement, verdict=judge(all(c.agrees for c in comps), perts),
        theory=theory if theory is not None else {c.name: c.predicted for c in comps},
        numerics=numerics if numerics is not None else {c.name: c.measured for c in comps},
        tolerance=tolerance if tolerance is not None else {"value": {c.name: c.tolerance for c in comps},
                                                           "why": "; ".join(sorted(whys))},
        details={**details, "worst": worst(comps), "comparisons": [c.summary() for c in comps]},
        figures=figures, perturbations=perts,
        headline=headline if headline is not None else [headline_row(c) for c in comps])


# ---------------------------------------------------------------------------------------
# statistics of measured numbers (claims 5-7 and the boundaries)
# ---------------------------------------------------------------------------------------

def loss_standard_error(losses: np.ndarray, blocks: int = 10) -> float:
    """Standard error of the mean of per-step batch losses by batch means: the window is cut
    into ``blocks`` contiguous blocks and the block means treated as independent, which
    accounts for the autocorrelation the parameter noise of SGD puts between steps."""
    losses = np.asarray(losses, float)
    k = max(2, min(blocks, losses.size // 2))
    means = np.array([b.mean() for b in np.array_split(losses, k)])
    return float(means.std(ddof=1) / math.sqrt(k))


def window_drift(tail: np.ndarray) -> float:
    """The part of the change of the loss between the two halves of the final window that
    Monte-Carlo noise does not explain: max(0, |mean_1 - mean_2| - Z_SE se(mean_1 - mean_2)),
    the se by batch means within each half.  An estimate of the optimisation error left (a
    run still descending), zero for a run that has converged to within its noise."""
    halves = np.array_split(np.asarray(tail, float), 2)
    se = math.hypot(*(loss_standard_error(h, 5) for h in halves))
    return max(0.0, abs(float(halves[0].mean() - halves[1].mean())) - Z_SE * se)


def paired_ratio(single: np.ndarray, multi: np.ndarray) -> tuple[float, float]:
    """R = mean(single) / mean(multi) on the same prompts, and its delta-method standard error
    sqrt(var(single - R multi) / n) / mean(multi) (pairing removes the common prompt noise)."""
    single, multi = np.asarray(single, float), np.asarray(multi, float)
    R = single.mean() / multi.mean()
    se = float(np.std(single - R * multi, ddof=1) / math.sqrt(single.size) / multi.mean())
    return float(R), se


def _wls(L: np.ndarray, y: np.ndarray, se: np.ndarray, power: float):
    """Weighted least squares of y = a + c L^-power: (a, c), covariance, chi^2."""
    X = np.stack([np.ones_like(L), L ** -power], axis=1)
    wt = 1.0 / se ** 2
    cov = np.linalg.inv(X.T @ (X * wt[:, None]))
    coef = cov @ (X.T @ (wt * y))
    chi2 = float(np.sum(((y - X @ coef) / se) ** 2))
    return coef, cov, chi2


CORRECTION_POWERS = (1.0, 0.5)
"""The finite-L correction of L * loss (and of ratios of such losses) is fitted as c L^-p with
p = 1 (the expansion's O(1/L) term) and p = 1/2.  Why both: the expansion's remainder is
O(L^-2) only while the third cumulant of the softmax weights has a finite Gaussian average
(6 omega^2 < 1); at the optimum omega ~ 0.39..0.55 for r <= 4 it is not, the remainder is
O(L^{-1-alpha}) with 0 < alpha < 1, and the measured approach of L * loss to its limit is
indeed slower than 1/L (r = 1: 7.08, 7.52, 8.08, 8.36 at L = 256, 1024, 4096, 8192 against
8.44).  The two fits bracket the extrapolation; their midpoint is reported and half their
difference is the systematic error of the extrapolation."""

def fit_limit(L, y, se) -> dict:
    """Extrapolate y(L) to L -> inf from the weighted fits y = a + c L^-p, p in
    CORRECTION_POWERS: a = midpoint of the two intercepts, a_se = the larger of their
    Monte-Carlo standard errors, systematic = half their difference."""
    L, y, se = (np.asarray(v, float) for v in (L, y, se))
    if L.size < 3:
        raise ValueError(f"the L -> inf extrapolation needs at least 3 context lengths, got {L.size}")
    if np.any(~np.isfinite(se)) or np.any(se <= 0):
        raise ValueError(f"standard errors must be positive and finite, got {se.tolist()}")
    fits = {}
    for p in CORRECTION_POWERS:
        coef, cov, chi2 = _wls(L, y, se, p)
        fits[p] = {"a": float(coef[0]), "a_se": float(math.sqrt(cov[0, 0])), "c": float(coef[1]), "chi2": chi2}
    a1, a2 = (fits[p]["a"] for p in CORRECTION_POWERS)
    return {"a": 0.5 * (a1 + a2), "a_se": max(f["a_se"] for f in fits.values()),
            "systematic": 0.5 * abs(a1 - a2), "dof": int(L.size - 2),
            "fits": {f"p={p:g}": f for p, f in fits.items()}}

def sweep_points(tasks, sigma, Ls, time_, lr, batch, model="full", seed=0, device="cpu") -> list[dict]:
    """tools.sweep points of the multi-head (H = m, factored) runs of one case."""
    return [{"model": model,
             "problem": {"tasks": list(tasks), "heads": len(tasks), "L": int(L), "sigma": float(sigma),
                         "device": device},
             "train": {"lr": lr, "time": time_, "batch": batch, "seed": seed}} for L in Ls]


def points_from_sweep(records: list[dict], heads_of=lambda tasks: len(tasks)) -> dict:
    """Group finished sweep records into {(tasks, sigma): [{"L", "loss", "se"}, ...]} for the
    factored runs with ``heads_of(tasks)`` heads.  The standard error of a run's loss is
    taken from the batch losses of its trajectory records in the last 10% of the run
    (std / sqrt(k): each is one independent batch), a conservative stand-in for the per-step
    losses, which a sweep does not store."""
    groups: dict = {}
    for rec in records:
        res = rec.get("result")
        if not res or rec.get("error"):
            continue
        cfg = res["config"]
        tasks = tuple(cfg["tasks"])
        if cfg["heads"] != heads_of(tasks) or cfg.get("param", "factored") != "factored":
            continue
        traj = res["trajectory"]
        t_end = traj[-1]["t"]
        tail = [r["loss"] for r in traj if r["t"] >= 0.9 * t_end] or [traj[-1]["loss"]]
        se = float(np.std(tail, ddof=1) / math.sqrt(len(tail))) if len(tail) > 1 else abs(res["loss"])
        groups.setdefault((tasks, float(cfg["sigma"])), []).append(
            {"L": int(cfg["L"]), "loss": float(res["loss"]), "se": se, "source": res.get("model", "full")})
    return {k: sorted(v, key=lambda p: p["L"]) for k, v in groups.items()}


# ---------------------------------------------------------------------------------------
# claims 5-6 (limiting-error, multi-head-gain): the converged loss of a trained full model
# ---------------------------------------------------------------------------------------
# (imported here, not at the top, because this file is append-only for the claims' authors)
import copy  # noqa: E402
import time  # noqa: E402

from numerics.evaluate import held_out_loss, held_out_loss_difference  # noqa: E402
from numerics.exact_reduced import one_thread  # noqa: E402
from numerics.train import TrainConfig, train  # noqa: E402

@dataclass(frozen=True)
class TrainingSchedule:
    """How claims 5 and 6 train a full model to its converged loss: gradient descent on fresh
    prompts in two phases (``numerics.train.train`` twice, the second from the first's model).

    explore: from cfg's initialisation to t = ``time`` at step ``lr`` with ``tokens`` prompt
    tokens per step (batch = tokens // L: the per-prompt loss falls like 1/L, so a fixed token
    count keeps the gradient noise per step comparable across L).  polish: ``polish_time``
    more at a ``polish_tokens`` batch, so the excess loss SGD's noise leaves at stationarity,
    ~ (lr / 4B) tr(Sigma) (Sigma the per-prompt gradient covariance), is cut by the ratio of
    lr/B of the two phases.  The converged loss is then measured again at the final weights on
    fresh prompts (``numerics.evaluate.held_out_loss``), never read from the training losses."""

    time: float = 40.0            # explore: gradient-flow time t_end
    lr: float = 0.1               # explore: step eta
    tokens: int = 2 ** 14         # explore: prompt tokens per step (batch = tokens // L)
    polish_time: float = 3.0      # polish: extra time at a smaller step and a larger batch
    polish_lr: float = 0.03       # polish: step (at 0.1 the one-head runs at sigma = 0.5, r = 3..4, L = 64
                                  # kept ~2x the excess lr/B predicts: 1.97..2.02 against 1.883)
    polish_tokens: int = 2 ** 17  # polish: prompt tokens per step
    held_out_tokens: int = 2 ** 21  # held-out prompts: held_out_tokens // L, at least held_out_min
    held_out_min: int = 16384
    min_batch: int = 32           # smallest batch at large L

    def batch(self, L: int, tokens: int) -> int:
        return max(self.min_batch, int(tokens) // int(L))

    def held_out(self, L: int) -> int:
        return max(self.held_out_min, int(self.held_out_tokens) // int(L))


# the schedules of claims 5 and 6 (the same trained models serve both): tiny and quick differ
# only in the held-out sample; paper is meant for a GPU
TINY_SCHEDULE = TrainingSchedule(held_out_tokens=2 ** 22, held_out_min=32768)
QUICK_SCHEDULE = TrainingSchedule(held_out_tokens=2 ** 22, held_out_min=65536)
PAPER_SCHEDULE = TrainingSchedule(time=100.0, lr=0.05, tokens=2 ** 18, polish_time=5.0, polish_lr=0.05,
                                  polish_tokens=2 ** 21, held_out_tokens=2 ** 24, held_out_min=65536)


ALLOCATION_SHARE = 0.1
"""A trained H >= m model counts as allocated when, for every task, each head but the one with
the largest |mu| carries at most ALLOCATION_SHARE of that |mu|, and distinct tasks have
distinct serving heads.  Why 0.1: at the allocated fixed point the off-task mu are 0 and a
converged run leaves them at the SGD-noise level (measured <= 0.01 at (2,2), L = 32..64);
the run that left allocation (tasks (2,3), L = 32, sigma 0.5: off-task mu -0.38 against 1.34)
was at ~0.3.  The threshold decides which theory applies, never the agreement itself."""


SATURATED_OMEGA = 1.0
"""A trained run whose largest |omega| readout exceeds SATURATED_OMEGA sits in the softmax's
saturation regime (2 omega^2 = 2, twice the edge 2 omega^2 = 1 beyond which theory's L -> inf
loss diverges), not at a point of theory's account: the allocated and one-head optima lie
inside the edge (omega* <= 0.71 for r <= 4 at L >= 32).  Seen: one head, tasks (3, 4, 4),
L = 128, sigma 0 (thorough draw) ended at omega ~ 3.2, mu ~ 0.58, loss 6.26 against the
one-head optimum 2.30 (omega* 0.30), still descending.  Decides which theory applies (a
boundary finding), never the agreement itself."""


def allocation_readout(mu) -> dict:
    """From the (H, m) mu readout of a trained model: the serving head of each task (largest
    |mu|), the largest off-task share max_{h != h(i)} |mu[h,i]| / |mu[h(i),i]| among off-task
    mu of the serving head's sign (``same_sign_share``: heads not yet pruned -- still
    converging) and of the opposite sign (``opposite_sign_share``: heads cancelling the
    softmax's constant part -- a superposition, SPEC.md); ``allocated`` when both are <=
    :data:`ALLOCATION_SHARE` and distinct tasks have distinct serving heads."""
    mu = np.asarray(mu, float)
    serving = np.abs(mu).argmax(axis=0)
    same, opposite = 0.0, 0.0
    for i, h in enumerate(serving):
        ref = mu[h, i]
        for k in range(mu.shape[0]):
            if k == h or ref == 0:
                continue
            share = abs(mu[k, i] / ref)
            if mu[k, i] * ref >= 0:
                same = max(same, share)
            else:
                opposite = max(opposite, share)
    distinct = len(set(serving.tolist())) == mu.shape[1]
    return {"serving_head": serving.tolist(), "same_sign_share": same, "opposite_sign_share": opposite,
            "distinct_heads": distinct,
            "allocated": bool(max(same, opposite) <= ALLOCATION_SHARE and distinct)}


@one_thread
def converged_loss(cfg, schedule: TrainingSchedule, seed: int = 0) -> dict:
    """Train the full model of ``cfg`` by ``schedule`` and measure its converged loss (with one
    torch CPU thread, ``numerics.exact_reduced.one_thread``: these small batched matmuls ran
    ~12x slower with 2 threads than with 1 on the shared 2-core machine, 20.8 s against 1.7 s
    for (2, 2), L = 64).

    Returns a dict: ``loss``, ``se``, ``n`` (held-out loss at the final weights, fresh prompts
    of the held-out stream of ``seed``, the same prompts for every estimate below);
    ``step_error`` (the excess loss SGD's step leaves after the polish: if the excess is
    proportional to lr/B, the explore-end minus polish-end held-out loss is (1 - k) of the
    explore excess, k the ratio of lr/B of the two phases, so the polish's own excess is
    k/(1-k) times that difference); ``converged``: the held-out loss falls neither over the
    last quarter of the explore phase by more than Z_SE standard errors of the paired
    difference (same prompts) plus the
    explore phase's SGD excess (its weights fluctuate by about that much), nor over the second
    half of the polish by more than Z_SE standard errors of the paired difference plus the
    same excess (the polish relaxes from the explore phase's SGD excess towards its own); the readout omega, mu,
    residual; ``allocation`` (:func:`allocation_readout`); configuration and seconds."""
    t0 = time.perf_counter()
    L = cfg.L
    n_eval = schedule.held_out(L)
    explore = TrainConfig(lr=schedule.lr, time=schedule.time, batch=schedule.batch(L, schedule.tokens), seed=seed,
                          records=5)
    polish = TrainConfig(lr=schedule.polish_lr, time=schedule.polish_time,
                         batch=schedule.batch(L, schedule.polish_tokens), seed=seed + 1, records=3)
    marks = {}

    def at(step_wanted, key):
        def record(step, t, model, loss):
            if step == step_wanted:
                marks[key] = copy.deepcopy(model)     # compared later on the same prompts (paired)
        return record

    first = train(cfg, explore, on_record=at(explore.record_steps()[-2], "explore_3/4"))
    end_explore = held_out_loss(first.final_model, n_eval, seed)
    second = train(cfg, polish, start=copy.deepcopy(first.final_model), on_record=at(polish.record_steps()[1], "polish_1/2"))
    final = held_out_loss(second.final_model, n_eval, seed)
    k = (polish.lr / polish.batch) / (explore.lr / explore.batch)
    excess = max(0.0, end_explore.mean - final.mean)
    step_error = excess * k / (1.0 - k) if k < 1 else math.inf
    # the descents are paired differences on the same held-out prompts: their standard errors
    # are those of the differences, not of the two losses combined (which made the test lax)
    de = held_out_loss_difference(marks["explore_3/4"], first.final_model, n_eval, seed)
    dp = held_out_loss_difference(marks["polish_1/2"], second.final_model, n_eval, seed)
    d_explore, d_polish = de.mean, dp.mean
    tol_explore = Z_SE * de.se + excess
    # the polish still relaxes from the explore phase's SGD excess towards its own: what is left
    # of that in its second half is bounded by the same excess
    tol_polish = Z_SE * dp.se + excess
    readout = second.final_model.semi_singular_values()
    return {"loss": final.mean, "se": final.se, "n": final.n,
            "converged": bool(d_explore <= tol_explore and d_polish <= tol_polish),
            "descent_explore": d_explore, "descent_explore_tolerance": tol_explore,
            "descent_polish": d_polish, "descent_polish_tolerance": tol_polish,
            "loss_explore_3/4": end_explore.mean + d_explore, "loss_explore_end": end_explore.mean,
            "loss_polish_1/2": final.mean + d_polish, "step_error": step_error, "lr_over_batch_ratio": k,
            "omega": readout.omega.tolist(), "mu": readout.mu.tolist(), "residual": readout.residual,
            "allocation": allocation_readout(readout.mu), "config": cfg.to_dict(),
            "schedule": asdict(schedule), "explore_batch": explore.batch, "polish_batch": polish.batch,
            "seconds": time.perf_counter() - t0}
