"""Claim 2: spectral reduction -- the flow of the semi-singular values (omega, mu).

On the decomposable set D (see ``block_structure``) the model reduces to

    y_hat_i = sum_h mu[h,i] sum_l softmax_l( sum_j omega[h,j] <Phi_j^T x_l, Phi_j^T q> ) y_{l,i}

with exact finite-L loss L_L(omega, mu) (an expectation; the numerics estimate it by Monte
Carlo, ``mc_reduced_loss`` here is a numpy reference).  Gradient flow on the model's own
parameters becomes  d omega = -f_omega * dL/d omega,  d mu = -f_mu * dL/d mu  with the
metric factors of :func:`metric_factors` (derived in :func:`derive_metric_factors`).

The large-L expansion (closed form, :func:`expansion_loss`) is derived symbolically in
:func:`derive_expansion` from the delta method for the ratio sum e^{s_l} y_l / sum e^{s_l}
and the Gaussian moment identities; the numpy functions here are lambdified from those
sympy expressions.  It is finite iff every 2 omega[h,k]*omega[k,j] < 1, i.e. iff
2 omega[h,j]^2 < 1 for all h, j (:func:`expansion_valid`); outside, the Gaussian integrals
diverge (softmax saturates towards argmax) and the function returns +inf.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import sympy as sp

from ._validate import check_L, check_omega_mu, check_sigma, check_tasks

PARAMS = ("merged", "factored")


# ---------------------------------------------------------------------------------------
# symbolic derivation of the large-L expansion
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpansionDerivation:
    """Sympy expressions of the large-L expansion, in terms of scalar kernels.

    With c a tilt (c = omega[h,j] omega[k,j]), r a block size, s2 = sigma^2:

    - ``block_factor(c, r)``   = E_q e^{c |q|^2}, q ~ N(0, I_r)
    - ``bias_kernel(w, r)``    = E_q |q|^2 e^{w |q|^2}
    - ``pair_kernel(c, r, s2)``= E_{q,g} e^{c|q|^2} (c (g^T q)^2 + |g|^2 + s2)

    and the loss (:func:`expansion_formula`)

      L_L = sum_i r_i (1 - B_i)^2
            + (2/L) sum_i (1 - B_i) sum_h mu[h,i] omega[h,i] bias_kernel(omega[h,i]^2, r_i)
                                      prod_{j != i} block_factor(omega[h,j]^2, r_j)
            + (1/L) sum_i sum_{h,k} mu[h,i] mu[k,i] pair_kernel(c_hki, r_i, s2)
                                      prod_{j != i} block_factor(c_hkj, r_j)  + O(L^-2),
      B_i = sum_h mu[h,i] omega[h,i].
    """

    c: sp.Symbol
    w: sp.Symbol
    r: sp.Symbol
    s2: sp.Symbol
    block_factor: sp.Expr
    bias_kernel: sp.Expr
    pair_kernel: sp.Expr
    conditional_bias: sp.Expr = None      # E[R_h - a_h | q, g] * L  (delta method)
    conditional_cov: sp.Expr = None       # Cov(R_h, R_k | q, g) * L
    steps: dict = field(default_factory=dict)


@lru_cache(maxsize=None)
def derive_expansion() -> ExpansionDerivation:
    """Derive the kernels of the large-L expansion from the Gaussian moment identities.

    1. One coordinate: E e^{c z^2} for z ~ N(0,1) is the Gaussian integral
       int exp(-(1/2 - c) z^2) dz / sqrt(2 pi) = (1 - 2c)^{-1/2}  (c < 1/2), so for
       q ~ N(0, I_r), by independence, E e^{c|q|^2} = (1 - 2c)^{-r/2}   (block_factor);
       E |q|^2 e^{c|q|^2} is its c-derivative                            (bias_kernel).
    2. g ~ N(0, I_r) independent of q: E_g (g^T q)^2 = |q|^2, E_g |g|^2 = r, so
       E e^{c|q|^2}(c (g^T q)^2 + |g|^2 + s2) = c E|q|^2 e^{c|q|^2} + (r + s2) E e^{c|q|^2}.
    """
    c = sp.Symbol("c", real=True)
    w = sp.Symbol("w", real=True)
    r = sp.Symbol("r", positive=True)
    s2 = sp.Symbol("s2", nonnegative=True)
    z = sp.Symbol("z", real=True)
    a = sp.Symbol("a", positive=True)  # a = 1/2 - c > 0: the domain of validity
    one_coord = sp.integrate(sp.exp(-a * z ** 2) / sp.sqrt(2 * sp.pi), (z, -sp.oo, sp.oo))
    one_coord = sp.simplify(one_coord.subs(a, sp.Rational(1, 2) - c))
    block_factor = sp.powsimp(sp.simplify(one_coord ** r), force=True)
    first_moment = sp.simplify(sp.diff(block_factor, c))            # E |q|^2 e^{c|q|^2}
    bias_kernel = first_moment.subs(c, w)
    pair_kernel = sp.simplify(c * first_moment + (r + s2) * block_factor)
    return ExpansionDerivation(c=c, w=w, r=r, s2=s2, block_factor=block_factor,
                               bias_kernel=bias_kernel, pair_kernel=pair_kernel)


@lru_cache(maxsize=None)
def _kernels():
    """numpy functions lambdified from :func:`derive_expansion` (values and derivatives)."""
    D = derive_expansion()
    c, w, r, s2 = D.c, D.w, D.r, D.s2
    log_bf = sp.expand_log(sp.log(D.block_factor), force=True)
    f = {
        "log_block_factor": sp.lambdify((c, r), log_bf, "numpy"),
        "d_log_block_factor": sp.lambdify((c, r), sp.simplify(sp.diff(log_bf, c)), "numpy"),
        "bias_kernel": sp.lambdify((w, r), D.bias_kernel, "numpy"),
        "d_bias_kernel": sp.lambdify((w, r), sp.simplify(sp.diff(D.bias_kernel, w)), "numpy"),
        "pair_kernel": sp.lambdify((c, r, s2), D.pair_kernel, "numpy"),
        "d_pair_kernel": sp.lambdify((c, r, s2), sp.simplify(sp.diff(D.pair_kernel, c)), "numpy"),
    }
    return f


def expansion_formula() -> str:
    """The expansion as the code uses it, printed from the sympy expressions."""
    D = derive_expansion()
    return (
        "L_L(omega, mu) = sum_i r_i (1 - B_i)^2\n"
        "  + (2/L) sum_i (1 - B_i) sum_h mu[h,i] omega[h,i] bias_kernel(omega[h,i]^2, r_i) "
        "prod_{j!=i} block_factor(omega[h,j]^2, r_j)\n"
        "  + (1/L) sum_i sum_{h,k} mu[h,i] mu[k,i] pair_kernel(c_hki, r_i, sigma^2) "
        "prod_{j!=i} block_factor(c_hkj, r_j)   + O(L^-2)\n"
        "  B_i = sum_h mu[h,i] omega[h,i],  c_hkj = omega[h,j] omega[k,j]\n"
        f"  block_factor(c, r) = {sp.sstr(D.block_factor)}\n"
        f"  bias_kernel(w, r)  = {sp.sstr(D.bias_kernel)}\n"
        f"  pair_kernel(c, r, s2) = {sp.sstr(D.pair_kernel)}\n"
        "  valid iff 2 omega[h,j]^2 < 1 for all h, j"
    )


# ---------------------------------------------------------------------------------------
# the expansion, its gradient and its domain (numpy)
# ---------------------------------------------------------------------------------------

def expansion_valid(omega, margin: float = 0.0) -> bool:
    """True iff every Gaussian integral of the expansion converges: 2 c_hkj < 1 for all
    pairs of heads; since |omega_h omega_k| <= max(omega_h^2, omega_k^2) this is
    2 omega[h,j]^2 < 1 - margin for all h, j."""
    om = np.asarray(omega, dtype=float)
    if not np.all(np.isfinite(om)):
        return False
    return bool(np.all(2.0 * om ** 2 < 1.0 - margin))


def _pieces(omega, mu, tasks, sigma):
    k = _kernels()
    r = np.asarray(tasks, dtype=float)                      # (m,)
    c = omega[:, None, :] * omega[None, :, :]               # (H, H, m)
    log_bf = k["log_block_factor"](c, r)                    # (H, H, m)
    log_Q = log_bf.sum(axis=2)                              # (H, H)
    others = np.exp(log_Q[:, :, None] - log_bf)             # prod_{j != i} block_factor(c_hkj)
    X = k["pair_kernel"](c, r, sigma ** 2) * others         # (H, H, m)
    w = omega ** 2
    H = omega.shape[0]
    idx = np.arange(H)
    others_diag = others[idx, idx, :]                       # (H, m)
    Z = k["bias_kernel"](w, r) * others_diag                # (H, m)
    B = np.sum(mu * omega, axis=0)                          # (m,)
    return dict(r=r, c=c, log_bf=log_bf, others=others, X=X, w=w, Z=Z, B=B,
                others_diag=others_diag)


def expansion_loss(omega, mu, tasks, L, sigma=0.0) -> float:
    """Large-L expansion of the exact reduced loss L_L(omega, mu) (sum over tasks),
    ``expansion_formula()``; +inf outside the domain (some 2 omega^2 >= 1).

    omega, mu: (H, m) arrays; tasks: (r_1..r_m); L > 0; sigma >= 0."""
    tasks = check_tasks(tasks)
    omega, mu = check_omega_mu(omega, mu, tasks)
    L, sigma = check_L(L), check_sigma(sigma)
    if not expansion_valid(omega):
        return float("inf")
    p = _pieces(omega, mu, tasks, sigma)
    r, B, Z, X = p["r"], p["B"], p["Z"], p["X"]
    leading = np.sum(r * (1.0 - B) ** 2)
    S = np.sum(mu * omega * Z, axis=0)                      # (m,)
    bias = 2.0 / L * np.sum((1.0 - B) * S)
    pair = 1.0 / L * np.einsum("hi,ki,hki->", mu, mu, X)
    return float(leading + bias + pair)


def expansion_gradient(omega, mu, tasks, L, sigma=0.0) -> tuple[np.ndarray, np.ndarray]:
    """(dL/d omega, dL/d mu) of :func:`expansion_loss`, each (H, m), by the chain rule
    through the sympy-derived kernels and their sympy derivatives:

      d/d mu[g,j]:  -2 r_j (1-B_j) omega[g,j] + (2/L)[-omega[g,j] S_j + (1-B_j) omega[g,j] Z[g,j]]
                    + (2/L) sum_k mu[k,j] X[g,k,j]
      d/d omega[g,j]: -2 r_j (1-B_j) mu[g,j] + (2/L)[-mu[g,j] S_j + (1-B_j) mu[g,j] Z[g,j]
                    + 2 omega[g,j] (dlogbf(w_gj) (R_g - (1-B_j) mu_gj omega_gj Z_gj)
                                     + (1-B_j) mu_gj omega_gj Z'_gj)]
                    + (2/L) sum_k omega[k,j] Y[g,k,j]
    with X, Z the pair and bias weights, S_j = sum_h mu omega Z, R_g = sum_i (1-B_i) mu omega Z,
    Y_hkj = dlogbf(c_hkj)(A_hk - mu_hj mu_kj X_hkj) + mu_hj mu_kj X'_hkj, A_hk = sum_i mu mu X.
    Raises ValueError outside the domain of validity."""
    tasks = check_tasks(tasks)
    omega, mu = check_omega_mu(omega, mu, tasks)
    L, sigma = check_L(L), check_sigma(sigma)
    if not expansion_valid(omega):
        raise ValueError("the expansion is infinite here (some 2*omega^2 >= 1); its gradient is undefined. "
                         "Use the exact finite-L reduced loss in the saturation regime")
    return _gradient(omega, mu, tasks, L, sigma)


def _gradient(omega, mu, tasks, L, sigma):
    """:func:`expansion_gradient` without the input checks (inner loop of the flow)."""
    k = _kernels()
    p = _pieces(omega, mu, tasks, sigma)
    r, B, Z, X, c, w = p["r"], p["B"], p["Z"], p["X"], p["c"], p["w"]
    E = 1.0 - B                                             # (m,)
    # leading term
    g_mu = -2.0 * r * E * omega
    g_om = -2.0 * r * E * mu
    # bias term
    S = np.sum(mu * omega * Z, axis=0)                      # (m,)
    g_mu = g_mu + 2.0 / L * (-omega * S + E * omega * Z)
    Zd = k["d_bias_kernel"](w, r) * p["others_diag"]        # d/dw of Z's own-block kernel
    dlog_w = k["d_log_block_factor"](w, r)                  # (H, m)
    R = np.sum(E * mu * omega * Z, axis=1)                  # (H,)
    own = E * mu * omega                                    # (H, m)
    dZ_sum = 2.0 * omega * (dlog_w * (R[:, None] - own * Z) + own * Zd)
    g_om = g_om + 2.0 / L * (-mu * S + E * mu * Z + dZ_sum)
    # pair term
    g_mu = g_mu + 2.0 / L * np.einsum("kj,gkj->gj", mu, X)
    Xd = k["d_pair_kernel"](c, r, sigma ** 2) * p["others"]
    A = np.einsum("hi,ki,hki->hk", mu, mu, X)
    mm = mu[:, None, :] * mu[None, :, :]                    # (H, H, m)
    Y = k["d_log_block_factor"](c, r) * (A[:, :, None] - mm * X) + mm * Xd
    g_om = g_om + 2.0 / L * np.einsum("kj,gkj->gj", omega, Y)
    return g_om, g_mu


# ---------------------------------------------------------------------------------------
# metric factors of the flow
# ---------------------------------------------------------------------------------------

def metric_factors(param, omega, mu, tasks, logit_scale=1.0) -> tuple[np.ndarray, np.ndarray]:
    """(f_omega, f_mu), each (H, m): d omega = -f_omega dL/d omega, d mu = -f_mu dL/d mu.

    merged   (W, U trained directly):           f_omega = 1/r_i,              f_mu = 1
    factored (W = K^T Q / s, U = O V, balanced): f_omega = 2|omega|/(s r_i),  f_mu = 2|mu|
    (derived in :func:`derive_metric_factors`; the 1/r_i is the squared norm r_i of
    Phi_i Phi_i^T, the 2|.| the balanced product of two trained factors, 1/s the logit
    scale entering once through W = K^T Q / s while omega = kappa^2 / s)."""
    if param not in PARAMS:
        raise ValueError(f"param must be one of {PARAMS}, got {param!r}")
    tasks = check_tasks(tasks)
    omega, mu = check_omega_mu(omega, mu, tasks)
    s = float(logit_scale)
    if not np.isfinite(s) or s <= 0:
        raise ValueError(f"logit_scale s must be positive and finite, got {logit_scale}")
    r = np.asarray(tasks, dtype=float)
    if param == "merged":
        return np.broadcast_to(1.0 / r, omega.shape).copy(), np.ones_like(mu)
    return 2.0 * np.abs(omega) / (s * r), 2.0 * np.abs(mu)


# ---------------------------------------------------------------------------------------
# the expansion flow (scipy solve_ivp)
# ---------------------------------------------------------------------------------------

@dataclass
class ExpansionTrajectory:
    """A trajectory of the expansion flow.  t (T,), omega/mu (T, H, m), loss (T,).

    ``status``: "t_end" (reached t_end), "stationary" (velocity below ``stationary_tol``:
    a fixed point), "left_domain" (some 2 omega^2 reached 1 - margin: the expansion is no
    longer valid, the flow stops there), "diverged" (loss or state non-finite / too large)
    or "failed" (solver error, ``message``)."""

    t: np.ndarray
    omega: np.ndarray
    mu: np.ndarray
    loss: np.ndarray
    status: str
    message: str = ""
    param: str = "factored"

    @property
    def final_omega(self) -> np.ndarray:
        return self.omega[-1]

    @property
    def final_mu(self) -> np.ndarray:
        return self.mu[-1]

    def to_dict(self) -> dict:
        return {"t": self.t.tolist(), "omega": self.omega.tolist(), "mu": self.mu.tolist(),
                "loss": self.loss.tolist(), "status": self.status, "message": self.message,
                "param": self.param}


def flow_velocity(omega, mu, tasks, L, sigma, param, logit_scale=1.0):
    """(d omega/dt, d mu/dt) of the expansion flow with the metric of ``param``."""
    g_om, g_mu = expansion_gradient(omega, mu, tasks, L, sigma)
    f_om, f_mu = metric_factors(param, omega, mu, tasks, logit_scale)
    return -f_om * g_om, -f_mu * g_mu


def integrate_expansion_flow(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0,
                             t_end=60.0, t_eval=None, domain_margin=1e-3, stationary_tol=None,
                             rtol=1e-9, atol=1e-12, method="LSODA",
                             max_loss=1e6) -> ExpansionTrajectory:
    """Integrate d omega = -f_omega dL/d omega, d mu = -f_mu dL/d mu on the expansion
    ``expansion_loss`` from (omega0, mu0) over [0, t_end] with scipy ``solve_ivp``.

    t_eval: the record times (default 61 evenly spaced, as the numerics record); the
    trajectory stops early (and says why in ``status``) if it leaves the domain of
    validity (2 omega^2 >= 1 - domain_margin), diverges (loss > max_loss), or, when
    ``stationary_tol`` is given, when the velocity norm falls below it (a fixed point).
    Records after an early stop are absent (the arrays are shorter)."""
    from scipy.integrate import solve_ivp

    tasks = check_tasks(tasks)
    omega0, mu0 = check_omega_mu(omega0, mu0, tasks)
    L, sigma = check_L(L), check_sigma(sigma)
    if param not in PARAMS:
        raise ValueError(f"param must be one of {PARAMS}, got {param!r}")
    if not np.isfinite(t_end) or t_end <= 0:
        raise ValueError(f"t_end must be positive and finite, got {t_end}")
    if not expansion_valid(omega0, domain_margin):
        raise ValueError(f"the initial omega lies outside the expansion's domain (need 2*omega^2 < "
                         f"1 - {domain_margin}); max |omega| = {np.abs(omega0).max():.4g}")
    shape = omega0.shape
    n = omega0.size
    if t_eval is None:
        t_eval = np.linspace(0.0, t_end, 61)
    t_eval = np.asarray(t_eval, dtype=float)
    if t_eval.ndim != 1 or np.any(np.diff(t_eval) <= 0) or t_eval[0] < 0 or t_eval[-1] > t_end:
        raise ValueError("t_eval must be increasing times within [0, t_end]")

    # Coordinates.  merged: (omega, mu) themselves.  factored: the balanced factors,
    # omega = sign0 * kappa^2, mu = sign0 * nu^2, as in the model (omega = kappa^2/s with
    # K = Q = kappa; mu = nu^2 with O = V^T = nu).  The factored metric 2|omega| vanishes at
    # 0, so the exact flow never changes the sign of an entry; in the factor coordinates a
    # numerical step cannot make it do so either (d kappa = -sign0 kappa G/(s r) is linear).
    if param == "factored":
        sign_om = np.where(omega0 < 0, -1.0, 1.0)
        sign_mu = np.where(mu0 < 0, -1.0, 1.0)

    def to_state(om, m_):
        if param == "merged":
            return np.concatenate([om.ravel(), m_.ravel()])
        return np.concatenate([np.sqrt(np.abs(om)).ravel(), np.sqrt(np.abs(m_)).ravel()])

    def from_state(y):
        a, b = y[:n].reshape(shape), y[n:].reshape(shape)
        if param == "merged":
            return a, b
        return sign_om * a ** 2, sign_mu * b ** 2

    def rhs(_t, y):
        om, m_ = from_state(y)
        if not expansion_valid(om):
            return np.zeros_like(y)  # the domain event stops the solver at the boundary
        g_om, g_mu = _gradient(om, m_, tasks, L, sigma)
        if param == "merged":
            return np.concatenate([-g_om.ravel() / r_cols.ravel(), -g_mu.ravel()])
        a, b = y[:n].reshape(shape), y[n:].reshape(shape)
        # d(sign a^2) = 2 sign a da  =>  da = sign d_om / (2a) = -sign a G / (s r)
        da = -sign_om * a * g_om / (float(logit_scale) * r_cols)
        db = -sign_mu * b * g_mu
        return np.concatenate([da.ravel(), db.ravel()])

    def leave_domain(_t, y):
        om, _ = from_state(y)
        return (1.0 - domain_margin) - 2.0 * np.max(om ** 2)
    leave_domain.terminal = True

    def diverge(_t, y):
        if not np.all(np.isfinite(y)):
            return -1.0
        om, m_ = from_state(y)
        return max_loss - expansion_loss(om, m_, tasks, L, sigma) if expansion_valid(om) else 1.0
    diverge.terminal = True

    events = [leave_domain, diverge]
    if stationary_tol is not None:
        def stationary(t, y):
            om, m_ = from_state(y)
            if t <= 0 or not expansion_valid(om):
                return 1.0
            d_om, d_mu = flow_velocity(om, m_, tasks, L, sigma, param, logit_scale)
            return np.sqrt(np.sum(d_om ** 2) + np.sum(d_mu ** 2)) - stationary_tol
        stationary.terminal = True
        events.append(stationary)

    r_cols = np.broadcast_to(np.asarray(tasks, dtype=float), shape)
    y0 = to_state(omega0, mu0)
    sol = solve_ivp(rhs, (0.0, float(t_end)), y0, method=method, t_eval=t_eval, events=events,
                    rtol=rtol, atol=atol)
    status, message = "t_end", sol.message
    if sol.status == -1:
        status = "failed"
    elif sol.status == 1:
        if len(sol.t_events[0]):
            status = "left_domain"
        elif len(sol.t_events[1]):
            status = "diverged"
        else:
            status = "stationary"
    ts = list(sol.t)
    ys = [sol.y[:, j] for j in range(sol.y.shape[1])]
    if status in ("left_domain", "stationary", "diverged"):
        # keep the state where the flow stopped as the last record
        for ev_t, ev_y in zip(sol.t_events, sol.y_events):
            if len(ev_t) and (not ts or ev_t[0] > ts[-1]):
                ts.append(float(ev_t[0]))
                ys.append(ev_y[0])
    t = np.asarray(ts)
    pairs = [from_state(y) for y in ys]
    om = np.stack([p[0] for p in pairs]) if pairs else np.empty((0,) + shape)
    m_ = np.stack([p[1] for p in pairs]) if pairs else np.empty((0,) + shape)
    loss = np.array([expansion_loss(o, u, tasks, L, sigma) if np.all(np.isfinite(o)) else np.nan
                     for o, u in zip(om, m_)])
    return ExpansionTrajectory(t=t, omega=om, mu=m_, loss=loss, status=status, message=message, param=param)


def expansion_fixed_point(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0,
                          t_end=1e5, tol=1e-10, domain_margin=1e-3):
    """Run the expansion flow from (omega0, mu0) until the velocity norm is below ``tol``
    (or t_end), and return (omega, mu, trajectory).  The fixed point reached depends on
    the metric: with the factored metric zero entries stay zero (an allocated point can be
    a fixed point), with the merged metric they do not (see SPEC: superposition)."""
    traj = integrate_expansion_flow(omega0, mu0, tasks, L, sigma, param, logit_scale, t_end=t_end,
                                    t_eval=np.geomspace(1e-3, t_end, 200), domain_margin=domain_margin,
                                    stationary_tol=tol)
    return traj.final_omega, traj.final_mu, traj


def default_init(tasks, heads, init_scale=0.15) -> tuple[np.ndarray, np.ndarray]:
    """The numerics' default decomposable initialisation (docs/ARCHITECTURE.md):
    omega = s0 everywhere; mu = s0 except 2 s0 on each head's favoured task h mod m."""
    from ._validate import check_positive_int

    tasks = check_tasks(tasks)
    heads = check_positive_int("heads", heads)
    s0 = float(init_scale)
    if not np.isfinite(s0) or s0 <= 0:
        raise ValueError(f"init_scale must be positive and finite, got {init_scale}")
    m = len(tasks)
    omega = np.full((heads, m), s0)
    mu = np.full((heads, m), s0)
    mu[np.arange(heads), np.arange(heads) % m] = 2.0 * s0
    return omega, mu
