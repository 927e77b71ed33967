"""Helpers shared by the claim checks: the comparison object the checks return, profiles,
trajectory arrays, exact symmetrisation of a batch, and a plain gradient-descent loop on a
given prompt stream.

Everything numerical here is float64 unless a config says otherwise; nothing here decides
a verdict (that is :func:`claims.base.judge`, from the :class:`Comparison` objects).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from claims.base import PROFILES, ClaimResult, judge, Figure, PerturbationCheck, Series, jsonable

EPS64 = float(np.finfo(np.float64).eps)
"""Unit round-off of float64 (2.2e-16): the scale of every 'exact to rounding' tolerance."""


# ---------------------------------------------------------------------------------------
# the comparison object every check function returns
# ---------------------------------------------------------------------------------------

@dataclass
class Comparison:
    """One comparison of a measurement with a prediction.

    ``measured`` and ``predicted`` are the numbers compared (scalars or small lists),
    ``error`` the discrepancy in the units of ``tolerance``, ``why`` the argument the
    tolerance comes from, ``agrees`` whether ``error <= tolerance``.  ``perturbations`` is
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
    agrees: bool
    perturbations: list[PerturbationCheck] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)

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


# ---------------------------------------------------------------------------------------
# exact symmetrisation of a batch (claim 1 and 2)
# ---------------------------------------------------------------------------------------

def symmetry_group(tasks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A finite subgroup G of the data's symmetry group whose fixed set is exactly D.

    Returns ``(T, S)``: T (|G|, d, d) signed permutation matrices acting on the task-basis
    coordinates Phi^T x, S (|G|, m) output sign flips.  G is the product of

    - in each block i, the group generated by the r_i coordinate sign flips and the cyclic
      shift of the block's coordinates ((Z_2)^{r_i} semidirect Z_{r_i}, order r_i 2^{r_i});
      a matrix commuting with all of it is diagonal (sign flips) with equal entries in the
      block (the shift): the X-X block of D, and blocks i != j are not intertwined;
    - the 2^m per-task output sign flips y_i -> -y_i: they kill W_YX, W_XY, U_X and the
      off-diagonal of U_Y (S M S = M for all sign vectors S forces M diagonal; S M = M
      forces M = 0).

    |G| = 2^(d+m) prod r_i.  Every element is a signed permutation (with Phi = I its
    action on a float tensor is exact), and the set is closed under composition, so a
    batch made of whole G-orbits is G-invariant as a multiset."""
    tasks = tuple(int(r) for r in tasks)
    d, m = sum(tasks), len(tasks)
    per_block = []
    for r in tasks:
        elems = []
        for shift in range(r):
            P = np.roll(np.eye(r), shift, axis=0)
            for signs in itertools.product((1.0, -1.0), repeat=r):
                elems.append(np.diag(signs) @ P)
        per_block.append(elems)
    Ts = []
    for combo in itertools.product(*per_block):
        T = np.zeros((d, d))
        a = 0
        for r, M in zip(tasks, combo):
            T[a:a + r, a:a + r] = M
            a += r
        Ts.append(T)
    Ss = np.array(list(itertools.product((1.0, -1.0), repeat=m)))
    T_all = np.array([T for T in Ts for _ in Ss])
    S_all = np.array([S for _ in Ts for S in Ss])
    return T_all, S_all


def group_order(tasks: tuple[int, ...]) -> int:
    return int(2 ** (sum(tasks) + len(tasks)) * np.prod(tasks))


def symmetrize_full(prompts, cfg, drop: int = 0):
    """Every prompt under every element of :func:`symmetry_group` (batch x |G|).

    x and q are mapped by Phi T Phi^T (exact signed permutations when Phi = I, exact to
    rounding otherwise), y_i and the target y_{q,i} by the sign S_i.  With ``drop`` > 0 the
    last ``drop`` group elements are left out: a deliberately symmetry-breaking batch."""
    from numerics.data import Prompts  # the claim layer may use numerics; theory may not

    tasks = cfg.tasks
    d = cfg.d
    T, S = symmetry_group(tasks)
    if drop:
        if drop >= len(T):
            raise ValueError(f"drop must be < |G| = {len(T)}, got {drop}")
        T, S = T[:-drop], S[:-drop]
    Phi = cfg.basis_numpy()
    A = np.einsum("ab,gbc,dc->gad", Phi, T, Phi)            # Phi T Phi^T, (G, d, d)
    A = torch.tensor(A, dtype=prompts.context.dtype, device=prompts.context.device)
    S = torch.tensor(S, dtype=prompts.context.dtype, device=prompts.context.device)
    x, y, q = prompts.context[..., :d], prompts.context[..., d:], prompts.query[:, :d]
    xg = torch.einsum("gad,bld->gbla", A, x)                  # (G, B, L, d)
    qg = torch.einsum("gad,bd->gba", A, q)
    yg = S[:, None, None, :] * y[None]
    tg = S[:, None, :] * prompts.target[None]
    G, B = A.shape[0], x.shape[0]
    context = torch.cat([xg, yg], dim=-1).reshape(G * B, cfg.L, cfg.token_dim)
    query = torch.cat([qg, torch.zeros(G, B, cfg.m, dtype=q.dtype, device=q.device)], dim=-1)
    return Prompts(context=context, query=query.reshape(G * B, cfg.token_dim),
                   target=tg.reshape(G * B, cfg.m))


def off_decomposable_parts(W: np.ndarray, U: np.ndarray, cfg) -> dict:
    """Frobenius norms of the pieces of (W, U) outside D, by the symmetry that kills them.

    ``sign_flip_killed``: W_YX, U_X and the off-diagonal of U_Y (killed by the per-task
    output sign flips alone, i.e. by ``symmetrize=True`` of numerics); ``rotation_killed``:
    the X-X block of W minus its block-scalar part (killed only by the block rotations);
    ``never_trained``: the y columns of W (z_q has no y part, so they get no gradient)."""
    d = cfg.d
    Phi = cfg.basis_numpy()
    W_XX = W[:, :d, :d]
    W_XX_D = np.zeros_like(W_XX)
    for sl, r in zip(cfg.block_slices, cfg.tasks):
        P = Phi[:, sl]
        om = np.einsum("ai,hab,bi->h", P, W_XX, P) / r
        W_XX_D += om[:, None, None] * (P @ P.T)[None]
    U_Y = U[:, :, d:]
    off_UY = U_Y - np.einsum("hii->hi", U_Y)[..., None] * np.eye(cfg.m)[None]
    return {
        "sign_flip_killed": float(np.sqrt(np.sum(W[:, d:, :d] ** 2) + np.sum(U[:, :, :d] ** 2)
                                          + np.sum(off_UY ** 2))),
        "rotation_killed": float(np.sqrt(np.sum((W_XX - W_XX_D) ** 2))),
        "never_trained": float(np.sqrt(np.sum(W[:, :, d:] ** 2))),
        "total": float(np.sqrt(np.sum(W ** 2) + np.sum(U ** 2))),
    }


# ---------------------------------------------------------------------------------------
# plain gradient descent on a given prompt stream (what numerics.train does, but on
# batches we build ourselves: symmetrised, fixed, or deliberately asymmetric)
# ---------------------------------------------------------------------------------------

class Diverged(RuntimeError):
    """A claim run whose loss became non-finite or exploded."""


def gd_full(cfg, lr: float, steps: int, next_batch: Callable[[int], object],
            record_every: int, model=None, diverge_loss: float = 1e6) -> dict:
    """Gradient descent theta <- theta - lr grad L_batch(theta) of the full model on the
    batches ``next_batch(step)``; records t, loss, omega, mu, residual and the norms of
    :func:`off_decomposable_parts` every ``record_every`` steps (and at the end)."""
    from numerics.model import MultiHeadAttention, mse_loss

    model = MultiHeadAttention(cfg) if model is None else model
    params = list(model.parameters())
    rec = {"t": [], "loss": [], "omega": [], "mu": [], "residual": [], "parts": []}

    def record(step: int, loss: float) -> None:
        ro = model.semi_singular_values()
        W, U = (w.detach().cpu().double().numpy() for w in model.merged_weights())
        rec["t"].append(step * lr)
        rec["loss"].append(loss)
        rec["omega"].append(ro.omega)
        rec["mu"].append(ro.mu)
        rec["residual"].append(ro.residual)
        rec["parts"].append(off_decomposable_parts(W, U, cfg))

    for step in range(steps + 1):
        batch = next_batch(step)
        loss = mse_loss(model(batch.context, batch.query), batch.target)
        lval = float(loss.detach())
        if not math.isfinite(lval) or lval > diverge_loss:
            raise Diverged(f"training diverged at step {step} (t = {step * lr:g}): loss {lval:.4g}; "
                           f"lower lr (now {lr}) or the init scale")
        if step % record_every == 0 or step == steps:
            record(step, lval)
        if step == steps:
            break
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= lr * g
    out = {k: np.array(v) if k != "parts" else v for k, v in rec.items()}
    out["model"] = model
    return out


def fit_power_law(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope and intercept of log y against log x."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    slope, intercept = np.polyfit(lx, ly, 1)
    return float(slope), float(intercept)


def log_comparison(c: Comparison, test: str) -> None:
    """Append one line (test, name, error, tolerance, margin, perturbations rejected) to the
    JSON-lines file named by $ICL_CLAIMS_LOG, if set: how the worst agreement over the drawn
    examples is collected for the documentation (``docs/claims_1_4.md``)."""
    import json
    import os

    path = os.environ.get("ICL_CLAIMS_LOG")
    if not path:
        return
    line = jsonable({"test": test, "name": c.name, "error": c.error, "tolerance": c.tolerance, "margin": c.margin,
                     "agrees": c.agrees, "perturbations": [[p.description, p.rejected, p.details.get("error")]
                                                           for p in c.perturbations]})
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def expansion_gd_map(cfg, param: str, lr: float, t: np.ndarray, on_exit: str = "raise"):
    """(omega, mu) at times t (multiples of lr) of the expansion flow discretised by the
    *same* gradient-descent step as the full model: factored, one GD step on the balanced
    factors, omega <- omega (1 - lr g_omega/(s r))^2, mu <- mu (1 - lr g_mu)^2; merged,
    the Euler step.  Comparing with it removes the O(lr) discretisation gap, which does not
    shrink with L.  Starts at cfg's decomposable init.  If the map leaves the expansion's
    domain 2 omega^2 < 1: ``on_exit="raise"`` raises, ``"stop"`` returns the iterates
    reached so far (fewer than len(t))."""
    from numerics.model import initial_semi_singular_values
    from theory.reduced_ode import expansion_gradient, expansion_valid

    om, mu = (a.numpy().copy() for a in initial_semi_singular_values(cfg))
    r = np.asarray(cfg.tasks, float)[None, :]
    oms, mus, k = [], [], 0
    for target in np.rint(np.asarray(t) / lr).astype(int):
        while k < target:
            if not expansion_valid(om):
                if on_exit == "stop":
                    return np.array(oms), np.array(mus)
                raise RuntimeError(f"the expansion GD map left the domain 2 omega^2 < 1 at step {k} (L={cfg.L})")
            g_om, g_mu = expansion_gradient(om, mu, cfg.tasks, cfg.L, cfg.sigma)
            if param == "factored":
                om = om * (1 - lr * g_om / (cfg.logit_scale * r)) ** 2
                mu = mu * (1 - lr * g_mu) ** 2
            else:
                om = om - lr * g_om / r
                mu = mu - lr * g_mu
            k += 1
        oms.append(om.copy())
        mus.append(mu.copy())
    return np.array(oms), np.array(mus)


def comparisons_result(claim_id: str, title: str, statement: str, comps: list, figures: list, details: dict,
                       theory: dict | None = None, short_why: bool = False) -> ClaimResult:
    """The ClaimResult of a claim judged by a list of comparisons: verdict from ``judge`` (all
    agree and every perturbation is rejected), theory/numerics/tolerance keyed by comparison
    name (``theory`` overrides the predicted values), the worst case and every comparison's
    summary in ``details``.  ``short_why`` keeps each tolerance argument up to its first " (",
    where the per-case numbers start."""
    perts = [p for c in comps for p in c.perturbations]
    whys = {c.why.split(" (")[0] if short_why else c.why for c in comps}
    return ClaimResult(
        id=claim_id, title=title, statement=statement, verdict=judge(all(c.agrees for c in comps), perts),
        theory=theory if theory is not None else {c.name: c.predicted for c in comps},
        numerics={c.name: c.measured for c in comps},
        tolerance={"value": {c.name: c.tolerance for c in comps}, "why": "; ".join(sorted(whys))},
        details={**details, "worst": worst(comps), "comparisons": [c.summary() for c in comps]},
        figures=figures, perturbations=perts)
