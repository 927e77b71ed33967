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

How L*_L is measured (cheap and exact)
--------------------------------------
Conditionally on q and on the components u_{l,i} = <Phi_i^T x_l, q_i/|q_i|> of the context,
the task vectors g, the noise and the components of x orthogonal to q enter the loss only
through Gaussian moments, which are integrated analytically:

    E[ ||y_q - y_hat||^2 | q, u ] = sum_i (|q_i| - sum_l a_il u_li)^2 + (r_i - 1 + sigma^2) sum_l a_il^2,
    a_il = sum_h mu[h,i] p_hl,   p_h = softmax_l( sum_j omega[h,j] |q_j| u_lj ),

(|q_i| is chi-distributed with r_i degrees of freedom, u_li ~ N(0, 1) i.i.d.).  This is the
exact L_L, estimated by Monte Carlo over (q, u) only (Rao-Blackwellised: lower variance than
``numerics.reduced.reduced_loss`` and m instead of d numbers per token).  The test file checks
it against ``numerics.reduced.reduced_loss`` within Monte-Carlo error.  The loss is quadratic
in mu, so mu is solved in closed form and only omega is searched; the minimum is located on a
*fit* sample and its value measured on an independent *evaluation* sample (no in-sample bias,
standard error = std / sqrt(n) over independent prompts).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch
from scipy.optimize import minimize

from claims.base import ClaimResult, Figure, Series, no_progress, run_claim
from claims.common import Comparison, comparisons_result, check_profile, perturbation

CLAIM_ID = "limiting-error"
TITLE = "Limiting error vanishes as d/L -> 0"
STATEMENT = ("The ICL prediction error of the gradient-flow limit vanishes as d/L -> 0: "
             "L * loss tends to theory's constant Lambda = sum_i min_w F(w; r_i, r_i, sigma), "
             "so at fixed d the converged loss falls like 1/L.")

Z = 4.0
"""Standard errors allowed in every Monte-Carlo comparison.  A Gaussian deviation beyond 4
standard errors has probability 6e-5, so a test drawing a few dozen cases fails by chance
with probability ~1e-3, while a real discrepancy of a few standard errors is still caught."""

def one_thread(fn):
    """Run ``fn`` with one torch intra-op thread (restored afterwards).  The tensors here are
    many small batched matmuls, where thread hand-offs cost more than they gain: measured 20x
    slower with 2 threads than with 1 on a loaded 2-core machine (0.2 s against 3.3 s for
    one single-head minimisation)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


CHUNK_ELEMENTS = 2 ** 21
"""Elements of the (prompts x heads x L) softmax tensor per chunk: 16 MB in float64."""

FIT_ELEMENTS = 2 ** 19
"""Size (prompts x heads x L) of the fit sample, kept whole for autograd (4 MB per tensor).
It only *locates* the minimum; the loss is flat there, so an omega off by delta costs a
relative O(delta^2) in loss, and the value is measured on the independent evaluation sample."""


# ---------------------------------------------------------------------------------------
# the exact finite-L reduced loss, with g, eps and the x-components orthogonal to q
# integrated out
# ---------------------------------------------------------------------------------------

@dataclass
class MarginalPrompts:
    """The part of n prompts the reduced loss still needs after the Gaussian integrals.

    ``qnorm`` (n, m): |Phi_i^T q|; ``u`` (n, L, m): <Phi_i^T x_l, Phi_i^T q / |Phi_i^T q|>,
    i.i.d. N(0, 1); ``weight`` (n,): importance weights (see :func:`sample_marginal_prompts`),
    so that mean(weight * f) estimates E f for any f of the prompt."""

    qnorm: torch.Tensor
    u: torch.Tensor
    weight: torch.Tensor

    @property
    def n(self) -> int:
        return self.qnorm.shape[0]


def _check_problem(tasks, L, sigma) -> tuple[tuple[int, ...], int, float]:
    tasks = tuple(tasks) if not isinstance(tasks, int) else (tasks,)
    if not tasks or not all(isinstance(r, (int, np.integer)) and not isinstance(r, bool) and r >= 1 for r in tasks):
        raise ValueError(f"tasks must be a non-empty sequence of block sizes r_i >= 1, got {tasks!r}")
    if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1:
        raise ValueError(f"L (context length) must be a positive integer, got {L!r}")
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"sigma (label noise std) must be a finite number >= 0, got {sigma!r}")
    return tuple(int(r) for r in tasks), int(L), float(sigma)


def query_scale2(r: int) -> float:
    """Importance-sampling variance s_i^2 = 1 + 4/(r_i + 3) of the query block i.

    Why: at the optimum the per-prompt loss grows like e^{omega^2 |q_i|^2} (the softmax's
    effective sample size is L e^{-omega^2 |q|^2}), so under q ~ N(0, I) its variance is finite
    only if 4 omega^2 < 1 and the variance of its sample variance (what makes a standard error
    trustworthy) only if 8 omega^2 < 1 -- false at the limit's omega ~ 0.55 (r = 1) to 0.39 (r = 4).
    Drawing q_i ~ N(0, s_i^2 I) with weight dN(0,I)/dN(0,s_i^2 I) makes the k-th moment of
    weight * loss finite iff (k-1)(1 - 1/s^2)/2 + 1/2 > k omega^2; with this s_i^2 the fourth
    moment is finite for the limit's omega at every r (r = 1: omega^2 < 0.31 against 0.30;
    r = 4: < 0.26 against 0.15), while the weights' own second moment
    s^r (2 - 1/s^2)^{-r/2} stays below 1.35 for all r (little efficiency is lost)."""
    return 1.0 + 4.0 / (r + 3.0)


def sample_marginal_prompts(tasks, L: int, n: int, generator: torch.Generator,
                            dtype=torch.float64, device="cpu") -> MarginalPrompts:
    """Draw n prompts' (|q_i|, u_li) with ``generator``: q_i ~ N(0, s_i^2 I_{r_i}) with
    importance weight prod_i s_i^{r_i} exp(-|q_i|^2 (1 - 1/s_i^2) / 2) (:func:`query_scale2`),
    |q_i| as the norm of the Gaussian vector so every device draws the same law."""
    tasks, L, _ = _check_problem(tasks, L, 0.0)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n (number of prompts) must be a positive integer, got {n!r}")
    opts = dict(generator=generator, dtype=dtype, device=device)
    scale2 = torch.tensor([query_scale2(r) for r in tasks], dtype=dtype, device=device)
    qnorm = torch.stack([torch.randn(n, r, **opts).norm(dim=1) for r in tasks], dim=1) * scale2.sqrt()
    r = torch.tensor(tasks, dtype=dtype, device=device)
    log_w = (0.5 * r * scale2.log() - 0.5 * qnorm ** 2 * (1.0 - 1.0 / scale2)).sum(dim=1)
    u = torch.randn(n, L, len(tasks), **opts)
    return MarginalPrompts(qnorm=qnorm, u=u, weight=log_w.exp())


def marginal_chunks(tasks, L: int, n: int, seed: int, heads: int = 1, dtype=torch.float64, device="cpu"):
    """The same n prompts as one stream of chunks (deterministic in ``seed``), sized so that
    the (chunk x heads x L) softmax tensor stays within CHUNK_ELEMENTS."""
    from numerics.data import make_generator

    gen = make_generator(seed, device)
    size = max(1, CHUNK_ELEMENTS // (max(1, heads) * L))
    done = 0
    while done < n:
        k = min(size, n - done)
        yield sample_marginal_prompts(tasks, L, k, gen, dtype, device)
        done += k


def _softmax_stats(omega: torch.Tensor, prompts: MarginalPrompts):
    """S[n,h,i] = sum_l p_hl u_li and PP[n,h,k] = sum_l p_hl p_kl."""
    a = omega[None, :, :] * prompts.qnorm[:, None, :]                  # (n, H, m)
    p = torch.softmax(torch.bmm(a, prompts.u.transpose(1, 2)), dim=-1)  # (n, H, L)
    return torch.bmm(p, prompts.u), torch.bmm(p, p.transpose(1, 2))


def marginal_losses(omega: torch.Tensor, mu: torch.Tensor, prompts: MarginalPrompts, tasks,
                    sigma: float) -> torch.Tensor:
    """Per-prompt weight * E[||y_q - y_hat||^2 | q, u] (n,) of the reduced model at (omega, mu):
    weight * sum_i (|q_i| - sum_h mu_hi S_hi)^2 + (r_i - 1 + sigma^2) mu_.i^T PP mu_.i; the mean
    over prompts is an unbiased estimate of L_L(omega, mu)."""
    r = torch.tensor(tasks, dtype=omega.dtype, device=omega.device)
    S, PP = _softmax_stats(omega, prompts)
    along = torch.einsum("hi,nhi->ni", mu, S)
    spread = torch.einsum("hi,nhk,ki->ni", mu, PP, mu)
    return prompts.weight * ((prompts.qnorm - along) ** 2 + (r - 1.0 + sigma ** 2) * spread).sum(dim=1)


@one_thread
def evaluate(points: Sequence[tuple], tasks, L: int, sigma: float, n: int, seed: int,
             device="cpu") -> np.ndarray:
    """Per-prompt exact losses (len(points), n) of several (omega, mu) on the SAME n
    independent prompts (common random numbers: paired differences and ratios have small
    Monte-Carlo error).  omega, mu: (H, m) arrays, H may differ between points."""
    tasks, L, sigma = _check_problem(tasks, L, sigma)
    pts = [(torch.as_tensor(np.asarray(o, float), device=device), torch.as_tensor(np.asarray(u, float), device=device))
           for o, u in points]
    for o, u in pts:
        if o.shape != u.shape or o.dim() != 2 or o.shape[1] != len(tasks):
            raise ValueError(f"omega and mu must both have shape (heads, m = {len(tasks)}), got "
                             f"{tuple(o.shape)} and {tuple(u.shape)}")
        if not (torch.isfinite(o).all() and torch.isfinite(u).all()):
            raise ValueError(f"omega and mu must be finite, got omega={o.tolist()}, mu={u.tolist()}")
    heads = max(o.shape[0] for o, _ in pts)
    out = [[] for _ in pts]
    with torch.no_grad():
        for chunk in marginal_chunks(tasks, L, n, seed, heads, device=device):
            for k, (o, u) in enumerate(pts):
                out[k].append(marginal_losses(o, u, chunk, tasks, sigma).cpu().numpy())
    return np.array([np.concatenate(v) for v in out])


def optimal_mu(omega: torch.Tensor, prompts: MarginalPrompts, tasks, sigma: float,
               serves: Optional[np.ndarray] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """mu minimising the sample loss at fixed omega, and that minimum (differentiable in omega).

    Per task i the loss is mean(|q_i|^2) - 2 b_i^T mu_i + mu_i^T A_i mu_i with
    b_i = mean(|q_i| S_.i), A_i = mean(S_.i S_.i^T) + (r_i - 1 + sigma^2) mean(PP) (means
    weighted by the importance weights): mu_i =
    A_i^{-1} b_i over the heads allowed to serve task i (``serves`` (H, m) bool, default all);
    the minimum mean(|q_i|^2) - b_i^T mu_i is a least-squares residual (>= 0).  A relative
    ridge of 1e-12 keeps A_i invertible when two heads coincide."""
    H, m = omega.shape
    serves = np.ones((H, m), bool) if serves is None else np.asarray(serves, bool)
    S, PP = _softmax_stats(omega, prompts)
    w = prompts.weight
    mu = torch.zeros(H, m, dtype=omega.dtype, device=omega.device)
    total = torch.zeros((), dtype=omega.dtype, device=omega.device)
    for i, r in enumerate(tasks):
        heads = np.flatnonzero(serves[:, i])
        q2 = (w * prompts.qnorm[:, i] ** 2).mean()
        if heads.size == 0:
            total = total + q2
            continue
        Si = S[:, heads, i]
        b = (w[:, None] * prompts.qnorm[:, i:i + 1] * Si).mean(0)
        A = (Si.T * w) @ Si / prompts.n + (r - 1.0 + sigma ** 2) * (w[:, None, None] * PP[:, heads][:, :, heads]).mean(0)
        A = A + 1e-12 * torch.trace(A) / heads.size * torch.eye(heads.size, dtype=A.dtype, device=A.device)
        sol = torch.linalg.solve(A, b)
        mu = mu.index_put((torch.as_tensor(heads, device=mu.device), torch.full((heads.size,), i, device=mu.device)), sol)
        total = total + q2 - b @ sol
    return mu, total


@dataclass
class FamilyMinimum:
    """The minimum of the exact loss over a family of decomposable weights at one L.

    ``omega``/``mu`` (H, m) the minimiser found on the fit sample; ``loss``/``se`` its exact
    loss and standard error on an independent evaluation sample (``per_prompt`` there, for
    paired comparisons); ``fit_loss`` the in-sample value."""

    family: str
    tasks: tuple
    L: int
    sigma: float
    omega: np.ndarray
    mu: np.ndarray
    fit_loss: float
    loss: float = float("nan")
    se: float = float("nan")
    n_eval: int = 0
    per_prompt: Optional[np.ndarray] = field(default=None, repr=False)

    def summary(self) -> dict:
        return {"family": self.family, "tasks": list(self.tasks), "L": self.L, "sigma": self.sigma,
                "omega": np.round(self.omega, 5).tolist(), "mu": np.round(self.mu, 5).tolist(),
                "loss": self.loss, "se": self.se, "L_times_loss": self.L * self.loss,
                "L_times_se": self.L * self.se, "fit_loss": self.fit_loss, "n_eval": self.n_eval}


def fit_sample_size(heads: int, L: int, fit_elements: int = FIT_ELEMENTS, n_max: int = 200_000) -> int:
    """Prompts of the fit sample: as many as fit ``fit_elements`` (at least 128)."""
    return int(min(n_max, max(128, fit_elements // (heads * L))))


@one_thread
def minimise_family(tasks, L: int, sigma: float, free: np.ndarray, serves: np.ndarray,
                    starts: Sequence[np.ndarray], seed: int, n_fit: Optional[int] = None,
                    family: str = "", device="cpu") -> FamilyMinimum:
    """Minimise the exact loss over omega entries marked ``free`` (H, m) (others 0), with mu
    solved in closed form over ``serves`` (H, m), from each of ``starts`` (H, m arrays), on
    one fit sample of prompts (seed ``seed``); the best local minimum is returned (its loss
    on an independent sample is filled by :func:`measure`).

    L-BFGS-B on the free omega entries with the autograd gradient of the closed-form
    minimum over mu; a smooth deterministic objective because the sample is fixed."""
    from numerics.data import make_generator

    tasks, L, sigma = _check_problem(tasks, L, sigma)
    free = np.asarray(free, bool)
    H = free.shape[0]
    n_fit = fit_sample_size(H, L) if n_fit is None else int(n_fit)
    prompts = sample_marginal_prompts(tasks, L, n_fit, make_generator(seed, device), device=device)
    idx = np.flatnonzero(free.ravel())

    def objective(x: np.ndarray):
        flat = torch.zeros(free.size, dtype=torch.float64, device=device)
        xt = torch.tensor(x, dtype=torch.float64, device=device, requires_grad=True)
        flat = flat.index_put((torch.as_tensor(idx, device=device),), xt)
        _, val = optimal_mu(flat.reshape(free.shape), prompts, tasks, sigma, serves)
        (grad,) = torch.autograd.grad(val, xt)
        return float(val.detach()), grad.cpu().numpy()

    best = None
    for start in starts:
        x0 = np.asarray(start, float).ravel()[idx]
        res = minimize(objective, x0, jac=True, method="L-BFGS-B", options={"maxiter": 100, "gtol": 1e-7})
        if best is None or res.fun < best.fun:
            best = res
    omega = np.zeros(free.size)
    omega[idx] = best.x
    omega = omega.reshape(free.shape)
    with torch.no_grad():
        mu, val = optimal_mu(torch.tensor(omega, device=device), prompts, tasks, sigma, serves)
    return FamilyMinimum(family=family, tasks=tasks, L=L, sigma=sigma, omega=omega,
                         mu=mu.cpu().numpy(), fit_loss=float(val))


def measure(minima: Sequence[FamilyMinimum], n_eval: int, seed: int, device="cpu") -> list[FamilyMinimum]:
    """Fill loss, se and per_prompt of each minimum on one independent evaluation sample
    (the same prompts for all: common random numbers).  All must share tasks, L, sigma."""
    first = minima[0]
    for fm in minima[1:]:
        if (fm.tasks, fm.L, fm.sigma) != (first.tasks, first.L, first.sigma):
            raise ValueError("measure() compares minima of one problem: tasks, L and sigma must agree")
    losses = evaluate([(fm.omega, fm.mu) for fm in minima], first.tasks, first.L, first.sigma, n_eval, seed, device)
    for fm, pp in zip(minima, losses):
        fm.per_prompt = pp
        fm.loss = float(pp.mean())
        fm.se = float(pp.std(ddof=1) / math.sqrt(pp.size))
        fm.n_eval = int(pp.size)
    return list(minima)


def _grid_start(tasks, L, sigma, heads_of_task, seed, device, grid=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8),
                fit_elements: int = FIT_ELEMENTS) -> float:
    """The best common omega on a coarse grid (losses on a small sample): a start in the
    right basin (at small L the exact loss may also have a saturated local minimum at large
    omega, where softmax is almost argmax)."""
    from numerics.data import make_generator

    H = heads_of_task.shape[0]
    prompts = sample_marginal_prompts(tasks, L, max(64, fit_elements // (4 * H * L)),
                                      make_generator(seed + 7919, device), device=device)
    vals = []
    with torch.no_grad():
        for w in grid:
            om = torch.tensor(heads_of_task * w, dtype=torch.float64, device=device)
            vals.append(float(optimal_mu(om, prompts, tasks, sigma, heads_of_task != 0)[1]))
    return float(grid[int(np.argmin(vals))])


@one_thread
def one_task_minimum(r: int, L: int, sigma: float, seed: int, device="cpu",
                     fit_elements: int = FIT_ELEMENTS) -> tuple[float, float, float]:
    """(omega*, mu*, fit loss) of one head serving one block of size r alone: the exact loss
    is a function of omega only once mu is solved, minimised by bounded Brent on a fit
    sample, inside the grid cell around the best point of a coarse omega grid."""
    from scipy.optimize import minimize_scalar

    from numerics.data import make_generator

    grid = np.array([0.05, 0.15, 0.3, 0.45, 0.6, 0.8, 1.1])
    prompts = sample_marginal_prompts((r,), L, fit_sample_size(1, L, fit_elements), make_generator(seed, device),
                                      device=device)

    def loss_at(w: float) -> float:
        with torch.no_grad():
            return float(optimal_mu(torch.tensor([[w]], dtype=torch.float64, device=device), prompts, (r,), sigma)[1])

    vals = [loss_at(w) for w in grid]
    k = int(np.argmin(vals))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, grid.size - 1)]
    res = minimize_scalar(loss_at, bounds=(lo, hi), method="bounded", options={"xatol": 2e-3})
    w = float(res.x)
    with torch.no_grad():
        mu, val = optimal_mu(torch.tensor([[w]], dtype=torch.float64, device=device), prompts, (r,), sigma)
    return w, float(mu[0, 0]), float(val)


@one_thread
def allocated_minimum(tasks, L: int, sigma: float = 0.0, seed: int = 0, device="cpu",
                      fit_elements: int = FIT_ELEMENTS) -> FamilyMinimum:
    """The gradient-flow limit at finite L: head i serves task i alone (omega[i, j] = mu[i, j]
    = 0 for j != i), minimised over (omega[i, i], mu[i, i]).

    Head i's softmax then sees block i only and task i is predicted by head i only, so the
    loss is a sum of independent one-head, one-block problems; blocks of equal size share
    one minimiser (:func:`one_task_minimum`, one fit sample per distinct r_i)."""
    tasks, L, sigma = _check_problem(tasks, L, sigma)
    m = len(tasks)
    per_size = {r: one_task_minimum(r, L, sigma, seed + 101 * r, device, fit_elements) for r in sorted(set(tasks))}
    omega, mu = np.zeros((m, m)), np.zeros((m, m))
    for i, r in enumerate(tasks):
        omega[i, i], mu[i, i] = per_size[r][0], per_size[r][1]
    fit = float(sum(per_size[r][2] for r in tasks))
    return FamilyMinimum(family="allocated", tasks=tasks, L=L, sigma=sigma, omega=omega, mu=mu, fit_loss=fit)


@one_thread
def single_head_minimum(tasks, L: int, sigma: float = 0.0, seed: int = 0, device="cpu",
                        fit_elements: int = FIT_ELEMENTS) -> FamilyMinimum:
    """The best single head at finite L: one head serving every task, omega in R^m, from the
    best common omega of a coarse grid."""
    tasks, L, sigma = _check_problem(tasks, L, sigma)
    m = len(tasks)
    one = np.ones((1, m), bool)
    d = sum(tasks)
    grid = tuple(g / math.sqrt(d) for g in (0.3, 0.5, 0.7, 0.9, 1.1, 1.4))   # large-d optimum omega^2 ~ 1/d
    w0 = _grid_start(tasks, L, sigma, np.ones((1, m)), seed, device, grid, fit_elements)
    return minimise_family(tasks, L, sigma, one, one, [np.full((1, m), w0)], seed, family="single head",
                           device=device, n_fit=fit_sample_size(1, L, fit_elements))


# ---------------------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------------------

def _theory_limit(tasks, sigma) -> float:
    from theory.limiting_error import limit_multi

    return float(limit_multi(tasks, sigma))


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


@one_thread
def exact_minima(tasks, sigma: float, Ls: Sequence[int], n_eval: Optional[int], seed: int, device="cpu",
                 single: bool = False, progress=no_progress, eval_elements: int = 2 ** 22,
                 fit_elements: int = FIT_ELEMENTS) -> list[dict]:
    """Allocated (and, with ``single``, single-head) minima of the exact loss at each L, each
    measured on its own independent evaluation sample, paired between the families at one L.
    ``n_eval`` prompts per L, or (None) eval_elements / L: the Monte-Carlo error of L*loss
    then grows like sqrt(L), which the weighted fits account for."""
    out = []
    for k, L in enumerate(Ls):
        progress(f"exact reduced minima at L={L}", k / len(Ls))
        s = seed + 1000 * k
        mins = [allocated_minimum(tasks, L, sigma, s, device, fit_elements)]
        if single:
            mins.append(single_head_minimum(tasks, L, sigma, s + 1, device, fit_elements))
        n = int(n_eval) if n_eval is not None else max(256, eval_elements // (len(tasks) * int(L)))
        measure(mins, n, s + 2, device)
        out.append({"L": int(L), "allocated": mins[0], "single": mins[1] if single else None})
    return out


def check_limit_trend(tasks, sigma: float, points: Sequence[dict], source: str = "exact reduced minima") -> Comparison:
    """L * L*_L over several L against theory's limit Lambda.

    ``points``: dicts with "L", "loss", "se" (measured converged losses and their standard
    errors).  Extrapolate L*loss to L -> inf (:func:`fit_limit`); compare with Lambda at
    tolerance Z * se + the extrapolation's systematic error.  Perturbations: Lambda x 1.5
    and x 2/3 (a wrong constant) must be rejected at the same tolerance."""
    Lambda = _theory_limit(tasks, sigma)
    L = np.array([p["L"] for p in points], float)
    y = L * np.array([p["loss"] for p in points], float)
    se = L * np.array([p["se"] for p in points], float)
    fit = fit_limit(L, y, se)
    tol = Z * fit["a_se"] + fit["systematic"]
    err = abs(fit["a"] - Lambda)
    why = (f"{Z:g} standard errors of the extrapolated limit (weighted fits of L*loss = a + c L^-p, p = 1 and "
           f"1/2, on the Monte-Carlo errors of each L) plus the extrapolation's systematic error, half the "
           f"difference of the two fits ({fit['systematic']:.3g})")
    perts = [perturbation("limit constant x1.5", abs(fit["a"] - 1.5 * Lambda), tol, predicted=1.5 * Lambda),
             perturbation("limit constant x2/3", abs(fit["a"] - Lambda / 1.5), tol, predicted=Lambda / 1.5)]
    return Comparison(
        name=f"L*loss -> Lambda, tasks={list(tasks)}, sigma={sigma:g}",
        measured=fit["a"], predicted=Lambda, error=err, tolerance=tol, why=why, agrees=bool(err <= tol),
        perturbations=perts,
        details={"tasks": list(tasks), "sigma": sigma, "source": source, "fit": fit,
                 "L": L.tolist(), "L_times_loss": y.tolist(), "L_times_se": se.tolist(),
                 "relative_error_of_limit": float(err / Lambda)})


def check_slope(tasks, sigma: float, points: Sequence[dict], source: str = "exact reduced minima") -> Comparison:
    """The log-log slope of loss against L between the two largest context lengths is -1.

    Measured: log(loss2/loss1)/log(L2/L1), standard error from the two losses' Monte-Carlo
    errors.  The finite-L correction makes the local slope differ from -1 by
    d log(L*loss)/d log L; its size at (L1, L2) is taken from the two extrapolation fits of
    :func:`fit_limit` (the larger) and added to Z standard errors.  Perturbations: slope -1/2
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
    tol = Z * slope_se + curvature
    err = abs(slope + 1.0)
    why = (f"{Z:g} standard errors of the measured slope ({slope_se:.3g}, from the Monte-Carlo errors of the two "
           f"losses) plus the deviation of the local slope from -1 implied by the finite-L fits ({curvature:.3g})")
    return Comparison(
        name=f"loss ~ L^-1, tasks={list(tasks)}, sigma={sigma:g}, L={int(L[i1])}..{int(L[i2])}",
        measured=slope, predicted=-1.0, error=err, tolerance=tol, why=why, agrees=bool(err <= tol),
        perturbations=[perturbation("exponent -1/2", abs(slope + 0.5), tol, predicted=-0.5),
                       perturbation("exponent -2", abs(slope + 2.0), tol, predicted=-2.0)],
        details={"tasks": list(tasks), "sigma": sigma, "source": source, "L1": L[i1], "L2": L[i2],
                 "slope_se": slope_se, "curvature": curvature})


def loss_standard_error(losses: np.ndarray, blocks: int = 10) -> float:
    """Standard error of the mean of per-step batch losses by batch means: the window is cut
    into ``blocks`` contiguous blocks and the block means treated as independent, which
    accounts for the autocorrelation the parameter noise of SGD puts between steps."""
    losses = np.asarray(losses, float)
    k = max(2, min(blocks, losses.size // 2))
    means = np.array([b.mean() for b in np.array_split(losses, k)])
    return float(means.std(ddof=1) / math.sqrt(k))


@one_thread
def window_drift(tail: np.ndarray) -> float:
    """The part of the change of the loss between the two halves of the final window that
    Monte-Carlo noise does not explain: max(0, |mean_1 - mean_2| - Z se(mean_1 - mean_2)),
    the se by batch means within each half.  An estimate of the optimisation error left (a
    run still descending), zero for a run that has converged to within its noise."""
    halves = np.array_split(np.asarray(tail, float), 2)
    se = math.hypot(*(loss_standard_error(h, 5) for h in halves))
    return max(0.0, abs(float(halves[0].mean() - halves[1].mean())) - Z * se)


def check_converged_loss(cfg, tcfg, model: str = "full", n_eval: int = 20000, seed: int = 0) -> Comparison:
    """A training run's converged loss against the exact finite-L gradient-flow limit L*_L.

    ``model``: "full" (numerics.train.train) or "reduced" (train_reduced).  Measured: the
    mean batch loss over the last 10% of steps (TrainResult.loss) with its batch-means
    standard error.  Predicted: the allocated minimum of the exact loss at cfg.L (cfg.heads
    must equal m).  Tolerance: Z combined standard errors plus :func:`window_drift` (the
    descent still visible in the final window beyond noise, an estimate of the optimisation
    error).  Perturbations: the prediction x1.5 and x2/3."""
    from numerics.train import train, train_reduced

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
    tol = Z * math.hypot(se_train, fm.se) + drift
    err = abs(res.loss - fm.loss)
    why = (f"{Z:g} combined standard errors (training window by batch means {se_train:.3g}; exact minimum on "
           f"{fm.n_eval} independent prompts {fm.se:.3g}) plus the drift of the loss across the final window beyond "
           f"its noise ({drift:.3g}, the optimisation error still left)")
    return Comparison(
        name=f"converged loss = exact L*_L, {model} model, tasks={list(cfg.tasks)}, L={cfg.L}, sigma={cfg.sigma:g}",
        measured=res.loss, predicted=fm.loss, error=err, tolerance=tol, why=why, agrees=bool(err <= tol),
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


def sweep_points(tasks, sigma, Ls, time_, lr, batch, model="full", seed=0, device="cpu") -> list[dict]:
    """numerics.sweep points of the multi-head (H = m, factored) runs of one case."""
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


def check_trained_point(tasks, sigma: float, point: dict, n_eval: int, seed: int, device="cpu") -> Comparison:
    """One trained run of a sweep (``point``: "L", "loss", "se" from :func:`points_from_sweep`)
    against the exact finite-L gradient-flow limit at its L: tolerance Z combined standard
    errors; perturbations x1.5 and x2/3."""
    (fm,) = measure([allocated_minimum(tasks, point["L"], sigma, seed, device)], n_eval, seed + 1, device)
    tol = Z * math.hypot(point["se"], fm.se)
    err = abs(point["loss"] - fm.loss)
    return Comparison(
        name=f"trained loss = exact L*_L, tasks={list(tasks)}, L={point['L']}, sigma={sigma:g}",
        measured=point["loss"], predicted=fm.loss, error=err, tolerance=tol,
        why=f"{Z:g} combined standard errors (trained run from its trajectory's final records; exact minimum on "
            f"{fm.n_eval} independent prompts)", agrees=bool(err <= tol),
        perturbations=[perturbation("prediction x1.5", abs(point["loss"] - 1.5 * fm.loss), tol),
                       perturbation("prediction x2/3", abs(point["loss"] - fm.loss / 1.5), tol)],
        details={"tasks": list(tasks), "sigma": sigma, "point": point, "exact_minimum": fm.summary()})


PAPER_SWEEP_DIR = "sweeps/limiting-error-paper"
"""Where profile "paper" keeps its training grid (relative to the working directory):
numerics.sweep.run_grid skips the points already stored, so an interrupted run resumes."""


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
            from numerics.sweep import load_results

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
            from numerics.sweep import load_results, run_grid

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
            from numerics.config import ProblemConfig
            from numerics.train import TrainConfig

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
