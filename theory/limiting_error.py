"""Claims 5 and 6: the limiting error vanishes with d/L, and multi-head beats one head H-fold.

Minimising the expansion (``reduced_ode.expansion_formula``) over mu at fixed omega, the
(1 - B_i)^2 term forces B_i = 1 + O(1/L) and the cross term is O(L^-2), so

    L * L* -> sum_i min_w F(w; r_i, D_i, sigma),
    F(w; r, D, sigma) = (1 - 2w)^{-D/2} (r + sigma^2 + w r / (1 - 2w)) / w,   w = omega^2,

where D_i is the total size of the blocks the serving head's logits see:
- allocated multi-head (one head per task, off-task omega = 0): D_i = r_i;
- one head for all tasks: a joint minimisation over w in R^m of
      G(w) = prod_j (1 - 2 w_j)^{-r_j/2} sum_i (r_i + sigma^2 + w_i r_i/(1 - 2 w_i)) / w_i.
F and G are lambdified from sympy expressions (:func:`limit_expressions`), which are
obtained from the expansion's kernels by setting B_i = 1 and mu = 1/omega.
"""
from __future__ import annotations

from functools import lru_cache

import mpmath as mp
import numpy as np
import sympy as sp
from scipy.optimize import minimize

from . import check_L, check_loss, check_minimum, check_sigma, check_tasks, in_range
from .reduced_ode import _profile, derive_expansion, expansion_gradient, expansion_reliable, expansion_valid


@lru_cache(maxsize=None)
def limit_expressions():
    """Sympy: F(w; r, D, s2) from the expansion's kernels.

    One head serving one task i (mu_i = 1/omega, B_i = 1): the O(1/L) term is
    mu^2 pair_kernel(w, r, s2) prod_{j != i} block_factor(w, r_j); with the other blocks of
    total size D - r it equals (1 - 2w)^{-D/2}(r + s2 + w r/(1-2w))/w."""
    D_ = derive_expansion()
    w = sp.Symbol("w", positive=True)
    r = sp.Symbol("r", positive=True)
    Dsym = sp.Symbol("D", positive=True)
    s2 = sp.Symbol("s2", nonnegative=True)
    own = D_.pair_kernel.subs({D_.c: w, D_.r: r, D_.s2: s2})
    others = D_.block_factor.subs({D_.c: w, D_.r: Dsym - r})
    F = sp.powsimp(sp.simplify(own * others / w), force=True)
    # one head serving all tasks: the shared factor prod_j block_factor(w_j, r_j) times the
    # per-task term pair_kernel(w_i, r_i)/block_factor(w_i, r_i)/w_i
    single_term = sp.simplify(own / D_.block_factor.subs({D_.c: w, D_.r: r}) / w)
    log_block = sp.expand_log(sp.log(D_.block_factor.subs({D_.c: w, D_.r: r})), force=True)
    return {"w": w, "r": r, "D": Dsym, "s2": s2, "F": F, "single_term": single_term, "log_block": log_block}


@lru_cache(maxsize=None)
def _single_fns(module):
    e = limit_expressions()
    args = (e["w"], e["r"], e["s2"])
    return (sp.lambdify(args, e["single_term"], module), sp.lambdify(args[:2], e["log_block"], module),
            sp.lambdify(args, sp.diff(e["single_term"], e["w"]), module),
            sp.lambdify(args[:2], sp.diff(e["log_block"], e["w"]), module))


@lru_cache(maxsize=None)
def _F_fn(module):
    e = limit_expressions()
    return sp.lambdify((e["w"], e["r"], e["D"], e["s2"]), e["F"], module)


def F(w, r, D, sigma=0.0):
    """F(w; r, D, sigma) = (1 - 2w)^{-D/2} (r + sigma^2 + w r/(1-2w)) / w for 0 < w < 1/2
    (+inf outside), elementwise on arrays."""
    w = np.asarray(w, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        val = _F_fn("numpy")(w, float(r), float(D), float(sigma) ** 2)
    return check_loss("theory.limiting_error.F", np.where((w > 0) & (w < 0.5), val, np.inf), infinite_ok=True)


def minimise_F(r, D, sigma=0.0, dps=30):
    """argmin and min of F(w; r, D, sigma) over 0 < w < 1/2, to ``dps`` digits (mpmath).

    F -> +inf at both ends and log F is convex in w on (0, 1/2) (sum of -log w and
    -(D/2) log(1-2w) plus the log of a positive increasing linear-fractional term), so the
    stationary point is unique; it is found by mpmath findroot on dF/dw from a bracket."""
    e = limit_expressions()
    dlogF = sp.lambdify((e["w"], e["r"], e["D"], e["s2"]), sp.diff(sp.log(e["F"]), e["w"]), "mpmath")
    with mp.workdps(dps):
        f = lambda x: dlogF(x, mp.mpf(r), mp.mpf(D), mp.mpf(sigma) ** 2)
        # dlogF < 0 near 0 and > 0 near 1/2: bisection-type solver on a bracket
        lo, hi = mp.mpf("1e-12"), mp.mpf("0.5") - mp.mpf("1e-12")
        w_star = mp.findroot(f, (lo, hi), solver="anderson")
        val = _F_fn("mpmath")(w_star, mp.mpf(r), mp.mpf(D), mp.mpf(sigma) ** 2)
    low = r + D * (r + sigma ** 2)
    return float(w_star), in_range("theory.limiting_error.minimise_F", "min F", float(val), low * (1 - 1e-12),
                                   why=f"F(w) = nonnegative power series / w > r + D (r + sigma^2) = {low:.6g}")


def limit_multi(tasks, sigma=0.0) -> float:
    """lim_{L->inf} L * L* of the allocated multi-head limit (one head per task), summed
    over tasks: sum_i min_w F(w; r_i, r_i, sigma)."""
    tasks, sigma = check_tasks(tasks), check_sigma(sigma)
    return check_minimum("theory.limiting_error.limit_multi", float(sum(minimise_F(r, r, sigma)[1] for r in tasks)),
                         tasks, None, sigma)


def limit_multi_per_task(tasks, sigma=0.0) -> list[dict]:
    """Per task: {"r", "w_star", "omega_star" = sqrt(w*), "mu_star" = 1/omega*, "limit"}."""
    tasks, sigma = check_tasks(tasks), check_sigma(sigma)
    out = []
    for r in tasks:
        w, val = minimise_F(r, r, sigma)
        out.append({"r": r, "w_star": w, "omega_star": w ** 0.5, "mu_star": w ** -0.5, "limit": val})
    return out


def single_head_objective(w, tasks, sigma=0.0):
    """G(w) = prod_j (1-2w_j)^{-r_j/2} sum_i (r_i + sigma^2 + w_i r_i/(1-2w_i)) / w_i,
    the limit of L * L* for one head with omega_i^2 = w_i, mu_i = 1/omega_i (lambdified
    from :func:`limit_expressions`: ``single_term`` and ``log_block``)."""
    term, log_block, _, _ = _single_fns("numpy")
    w = np.asarray(w, dtype=float)
    r = np.asarray(tasks, dtype=float)
    if np.any(w <= 0) or np.any(w >= 0.5):
        return np.inf
    return check_loss("theory.limiting_error.single_head_objective",
                      float(np.exp(np.sum(log_block(w, r))) * np.sum(term(w, r, sigma ** 2))))


def minimise_single(tasks, sigma=0.0, dps=30):
    """argmin w in R^m and min of the single-head objective G (joint minimisation).

    Solved by mpmath findroot on grad log G = 0,
        d log G / d w_k = d log block_factor(w_k, r_k)/d w_k + term_k'(w_k) / sum_i term_i,
    started from the scipy (BFGS) optimum in the variables u = logit(2w)."""
    tasks, sigma = check_tasks(tasks), check_sigma(sigma)
    r = np.asarray(tasks, dtype=float)
    d = float(r.sum())

    def obj(u):
        w = 0.5 / (1.0 + np.exp(-u))
        return np.log(single_head_objective(w, tasks, sigma))

    w0 = np.full(len(tasks), 1.0 / (2.0 * d + 2.0))  # large-d optimum is w ~ 1/d
    u0 = np.log(2 * w0 / (1 - 2 * w0))
    res = minimize(obj, u0, method="BFGS", options={"gtol": 1e-12})
    w_sc = 0.5 / (1.0 + np.exp(-res.x))
    term, log_block, dterm, dlog_block = _single_fns("mpmath")
    with mp.workdps(dps):
        s2 = mp.mpf(sigma) ** 2
        rr = [mp.mpf(x) for x in tasks]

        def eqs(*ws):
            T = mp.fsum(term(wi, ri, s2) for wi, ri in zip(ws, rr))
            return [dlog_block(wi, ri) + dterm(wi, ri, s2) / T for wi, ri in zip(ws, rr)]

        sol = mp.findroot(eqs, [mp.mpf(x) for x in w_sc])
        ws = [sol[k] for k in range(len(tasks))] if isinstance(sol, mp.matrix) else [sol]
        val = mp.exp(mp.fsum(log_block(wi, ri) for wi, ri in zip(ws, rr))) * \
            mp.fsum(term(wi, ri, s2) for wi, ri in zip(ws, rr))
    return np.array([float(x) for x in ws]), check_minimum("theory.limiting_error.minimise_single", float(val),
                                                           tasks, None, sigma)


def limit_single(tasks, sigma=0.0) -> float:
    """lim_{L->inf} L * L* of the best single head (joint minimisation over w in R^m)."""
    return minimise_single(tasks, sigma)[1]


def gain(tasks, sigma=0.0) -> float:
    """limit_single / limit_multi: how many times the allocated multi-head limit beats one
    head (the paper says H = m)."""
    return in_range("theory.limiting_error.gain", "gain", limit_single(tasks, sigma) / limit_multi(tasks, sigma),
                    1.0 - 1e-12, why="one head's limit objective >= the allocated sum (block factors >= 1)")


@lru_cache(maxsize=None)
def gain_limit_symbolic():
    """Symbolic large-r limit of the gain for m equal blocks of size r (sympy).

    With w = x/r:  F(x/r; r, r, s2) / (r (r + s2)) -> e^x / x   (r -> inf), minimised at
    x = 1 with value e;  one head, by symmetry w_i = x/r for all i:
    G / (r (r + s2)) -> m e^{m x}/x, minimised at x = 1/m with value m^2 e.
    Ratio: m^2 e / (m e) = m.  Returns a dict of the sympy expressions and the limit."""
    x, r, m = sp.symbols("x r m", positive=True)
    s2 = sp.Symbol("s2", nonnegative=True)
    e = limit_expressions()
    Fx = e["F"].subs({e["w"]: x / r, e["r"]: r, e["D"]: r, e["s2"]: s2}) / (r * (r + s2))
    multi_profile = sp.simplify(sp.limit(Fx, r, sp.oo))
    # one head, all w_i = x/r: prod over m blocks (1 - 2x/r)^{-r/2} = (1-2x/r)^{-m r/2}
    Gx = (1 - 2 * x / r) ** (-m * r / 2) * m * (r + s2 + x / (1 - 2 * x / r)) / (x / r) / (r * (r + s2))
    single_profile = sp.simplify(sp.limit(Gx, r, sp.oo))
    x_multi = sp.solve(sp.diff(sp.log(multi_profile), x), x)[0]
    x_single = sp.solve(sp.diff(sp.log(single_profile), x), x)[0]
    multi_min = sp.simplify(multi_profile.subs(x, x_multi))
    single_min = sp.simplify(single_profile.subs(x, x_single))
    # totals over the m tasks: multi is m * multi_min, single_min already sums the m tasks
    ratio = sp.simplify(single_min / (m * multi_min))
    return {"multi_profile": multi_profile, "single_profile": single_profile, "x_multi": x_multi,
            "x_single": x_single, "multi_min": multi_min, "single_min": single_min, "gain_limit": ratio}



def single_head_at_L(tasks, L, sigma=0.0) -> dict:
    """The best one-head model of the expansion at finite L: minimise over omega in R^m
    (mu profiled out exactly, ``reduced_ode.profile_mu``), started from the L -> inf
    optimum omega_i = sqrt(w_i*).  Returns omega, mu (m,), loss, valid, reliable."""
    tasks, L, sigma = check_tasks(tasks), check_L(L), check_sigma(sigma)
    w_inf, _ = minimise_single(tasks, sigma)
    bound = float(np.sqrt(0.5 * (1 - 1e-6)))

    def f(x):
        om = x[None, :]
        mu, val, ok = _profile(om, tasks, L, sigma)
        if not ok or not val >= 0:         # unbounded below, or the truncation out of its range
            return 1e12, np.zeros_like(x)
        g, _ = expansion_gradient(om, mu, tasks, L, sigma)
        return val, g.ravel()

    res = minimize(f, np.sqrt(w_inf), jac=True, method="L-BFGS-B", bounds=[(1e-6, bound)] * len(tasks),
                   options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000})
    mu, val, ok = _profile(res.x[None, :], tasks, L, sigma)
    return {"omega": res.x.tolist(), "mu": mu[0].tolist(),
            "loss": check_minimum("theory.limiting_error.single_head_at_L", val, tasks, L, sigma),
            "valid": expansion_valid(res.x), "reliable": expansion_reliable(res.x)}
