"""Claim 2: spectral reduction -- the flow of the semi-singular values (omega, mu).

The decomposable set D (claim 1, ``block_structure``) has coordinates (omega, mu): a point of D is
:func:`decomposable_weights`, and any weights read out as :func:`semi_singular_values`, the
coordinates of their Frobenius-orthogonal projection :func:`project_decomposable` onto D.
On D the model reduces to

    y_hat_i = sum_h mu[h,i] sum_l softmax_l( sum_j omega[h,j] <Phi_j^T x_l, Phi_j^T q> ) y_{l,i}

and gradient flow on the model's own parameters becomes

    d omega/dt = -f_omega * dL/d omega,    d mu/dt = -f_mu * dL/d mu

with the metric factors of :func:`metric_factors` (derived from the parametrisation in
:func:`derive_metric_factors`: merged 1/r_i and 1; factored 2|omega|/(s r_i) and 2|mu|).
The right-hand side comes in two forms:

- exact at finite L: dL_L/d(omega, mu) by deterministic quadrature (theory.exact.exact_gradient;
  the numerics estimate the same expectation over prompts by Monte Carlo in PyTorch,
  numerics.exact_reduced);
- the large-L expansion (closed form, :func:`expansion_loss`, :func:`expansion_gradient`),
  derived symbolically in :func:`derive_expansion` from the delta method for the ratio
  sum e^{s_l} y_l / sum e^{s_l} and the Gaussian moment identities; the numpy functions
  are lambdified from those sympy expressions (:func:`expansion_formula` prints them).

Domain of the expansion: it is finite iff 2 omega[h,j]^2 < 1 for all h, j
(:func:`expansion_valid`; outside, the Gaussian integrals diverge -- softmax saturates
towards argmax -- and the function returns +inf); its O(L^-2) remainder has a finite
coefficient only if 6 omega^2 < 1 (:func:`expansion_reliable`).
:func:`integrate_expansion_flow` integrates the expansion flow (scipy solve_ivp).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import sympy as sp
from scipy.integrate import solve_ivp

from . import (check_finite_array, check_L, check_loss, check_minimum, check_omega_mu, check_positive,
               check_positive_int, check_sigma, check_tasks)


# ---------------------------------------------------------------------------------------
# the coordinates (omega, mu) of D and the projection P_D onto it (numpy; what the numerics use)
# ---------------------------------------------------------------------------------------

def _check_basis(basis, d: int) -> np.ndarray:
    Phi = check_finite_array("basis", basis)
    if Phi.shape != (d, d):
        raise ValueError(f"basis must be the d x d orthonormal matrix Phi with d = sum(tasks) = {d}, "
                         f"got shape {Phi.shape}")
    err = np.max(np.abs(Phi.T @ Phi - np.eye(d))) if d else 0.0
    if err > 1e-8:
        raise ValueError(f"basis must be orthonormal (Phi^T Phi = I); max |Phi^T Phi - I| = {err:.3g}. "
                         "Orthonormalise it first (e.g. numpy.linalg.qr)")
    return Phi


def _block_columns(tasks: tuple[int, ...]) -> list[slice]:
    edges = np.concatenate([[0], np.cumsum(tasks)])
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def _check_weights(W, U, tasks):
    d, m = sum(tasks), len(tasks)
    W = check_finite_array("W", W)
    U = check_finite_array("U", U)
    if W.ndim == 2:  # one head given without the head axis
        W = W[None]
    if U.ndim == 2:
        U = U[None]
    if W.ndim != 3 or W.shape[1:] != (d + m, d + m):
        raise ValueError(f"W must have shape (H, d+m, d+m) = (H, {d + m}, {d + m}) for tasks {tasks}, "
                         f"got {W.shape}")
    if U.ndim != 3 or U.shape[1:] != (m, d + m):
        raise ValueError(f"U must have shape (H, m, d+m) = (H, {m}, {d + m}) for tasks {tasks}, got {U.shape}")
    if W.shape[0] != U.shape[0]:
        raise ValueError(f"W and U must have the same number of heads, got {W.shape[0]} and {U.shape[0]}")
    if W.shape[0] < 1:
        raise ValueError("W, U must have at least one head (H >= 1)")
    return W, U


def semi_singular_values(W, U, tasks, basis) -> tuple[np.ndarray, np.ndarray]:
    """Readout of any weights: omega[h,i] = tr(Phi_i^T W_XX Phi_i) / r_i, mu[h,i] = (U_Y)_ii.

    These are the coordinates of P_D(W, U) in D.  Arrays of shape (H, m)."""
    tasks = check_tasks(tasks)
    W, U = _check_weights(W, U, tasks)
    d = sum(tasks)
    Phi = _check_basis(basis, d)
    H, m = W.shape[0], len(tasks)
    omega = np.empty((H, m))
    for i, cols in enumerate(_block_columns(tasks)):
        P = Phi[:, cols]
        # tr(P^T W_XX P) for every head at once
        omega[:, i] = np.einsum("ai,hab,bi->h", P, W[:, :d, :d], P) / tasks[i]
    mu = np.stack([np.diag(U[h, :, d:]) for h in range(H)])
    return omega, mu


def decomposable_weights(omega, mu, tasks, basis) -> tuple[np.ndarray, np.ndarray]:
    """The point of D with semi-singular values (omega, mu): W (H, d+m, d+m), U (H, m, d+m)."""
    tasks = check_tasks(tasks)
    d, m = sum(tasks), len(tasks)
    Phi = _check_basis(basis, d)
    omega, mu = check_omega_mu(omega, mu, tasks)
    H = omega.shape[0]
    W = np.zeros((H, d + m, d + m))
    U = np.zeros((H, m, d + m))
    for i, cols in enumerate(_block_columns(tasks)):
        P = Phi[:, cols]
        W[:, :d, :d] += omega[:, i, None, None] * (P @ P.T)[None]
    U[:, np.arange(m), d + np.arange(m)] = mu
    return W, U


def project_decomposable(W, U, tasks, basis) -> tuple[np.ndarray, np.ndarray]:
    """Frobenius-orthogonal projection P_D onto the decomposable set D, head by head.

    W (H, d+m, d+m), U (H, m, d+m), tasks = (r_1..r_m), basis = Phi (d x d, orthonormal,
    columns grouped by task).  D is the linear span of {Phi_i Phi_i^T in the X-X block of W}
    and {E_ii in the Y block of U}.  The matrices Phi_i Phi_i^T are mutually orthogonal with
    squared Frobenius norm r_i, so the projection coefficient is
        omega_i = <W_XX, Phi_i Phi_i^T>_F / r_i = tr(Phi_i^T W_XX Phi_i) / r_i,
    W_XX <- sum_i omega_i Phi_i Phi_i^T, every other block of W <- 0; U_X <- 0,
    U_Y <- diag(U_Y).  Returns new arrays (the inputs are not modified).

    A single head may be passed without the head axis (W (d+m, d+m), U (m, d+m)); the
    result then has the head axis.
    """
    tasks = check_tasks(tasks)
    omega, mu = semi_singular_values(W, U, tasks, basis)
    return decomposable_weights(omega, mu, tasks, basis)


def decomposable_residual(W, U, tasks, basis) -> float:
    """||(W, U) - P_D(W, U)||_F / ||(W, U)||_F (0 for the zero point)."""
    W_D, U_D = project_decomposable(W, U, tasks, basis)
    W = np.asarray(W, float).reshape(W_D.shape)
    U = np.asarray(U, float).reshape(U_D.shape)
    total = np.sqrt(np.sum(W ** 2) + np.sum(U ** 2))
    if total == 0.0:
        return 0.0
    return float(np.sqrt(np.sum((W - W_D) ** 2) + np.sum((U - U_D) ** 2)) / total)


# ---------------------------------------------------------------------------------------
# symbolic derivation of the large-L expansion
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpansionDerivation:
    """Sympy expressions of the large-L expansion, derived in :func:`derive_expansion`.

    Kernels (c a tilt omega[h,j] omega[k,j], w = omega^2, r a block size, s2 = sigma^2):

    - ``block_factor(c, r)``    = E_q e^{c |q|^2},                     q ~ N(0, I_r)
    - ``bias_kernel(w, r)``     = E_q |q|^2 e^{w |q|^2}
    - ``pair_kernel(c, r, s2)`` = E_{q,g} e^{c|q|^2} (c (g^T q)^2 + |g|^2 + s2)

    and the loss (:func:`expansion_formula`)

      L_L = sum_i r_i (1 - B_i)^2
            + (2/L) sum_i (1 - B_i) sum_h mu[h,i] omega[h,i] bias_kernel(omega[h,i]^2, r_i)
                                      prod_{j != i} block_factor(omega[h,j]^2, r_j)
            + (1/L) sum_i sum_{h,k} mu[h,i] mu[k,i] pair_kernel(c_hki, r_i, s2)
                                      prod_{j != i} block_factor(c_hkj, r_j)  + O(L^-2),
      B_i = sum_h mu[h,i] omega[h,i].

    ``steps`` holds the intermediate results of the derivation (conditional mean, bias
    and covariance of the softmax ratio given (q, g), the moment generating functions)."""

    c: sp.Symbol
    w: sp.Symbol
    r: sp.Symbol
    s2: sp.Symbol
    block_factor: sp.Expr
    bias_kernel: sp.Expr
    pair_kernel: sp.Expr
    steps: dict = field(default_factory=dict, compare=False, hash=False)


@lru_cache(maxsize=None)
def _token_model():
    """Symbols and the Gaussian law of one context token given (q, g), two heads h, k and
    two blocks: the task's block i and one other block j.

    Given q and g, the token's relevant coordinates X = (u_i, u_j, z, eps) with
    u_b = <Phi_b^T x, Phi_b^T q> (variance a_b = |q_b|^2), z = g^T Phi_i^T x (variance
    G = |g|^2, covariance t = g^T q_i with u_i) and the noise eps (variance s2) are jointly
    Gaussian; the logit of head h is s_h = omega_hi u_i + omega_hj u_j and y = z + eps."""
    a_i, a_j, G = sp.symbols("a_i a_j G", positive=True)
    t = sp.Symbol("t", real=True)
    s2 = sp.Symbol("s2", nonnegative=True)
    Sigma = sp.Matrix([[a_i, 0, t, 0], [0, a_j, 0, 0], [t, 0, G, 0], [0, 0, 0, s2]])
    theta = sp.Matrix(sp.symbols("theta0:4", real=True))
    mgf = sp.exp((theta.T * Sigma * theta)[0, 0] / 2)   # E e^{theta^T X}, the Gaussian MGF
    heads = ("h", "k")
    omega = {(h, b): sp.Symbol(f"omega_{h}{b}", real=True) for h in heads for b in "ij"}
    return dict(a_i=a_i, a_j=a_j, G=G, t=t, s2=s2, Sigma=Sigma, theta=theta, mgf=mgf, heads=heads,
                omega=omega)


@lru_cache(maxsize=None)
def _conditional_moments():
    """Delta method for the softmax ratio R_h = N_h / D_h, N_h = (1/L) sum_l e^{s_hl} y_l,
    D_h = (1/L) sum_l e^{s_hl}, given (q, g): to O(1/L),
        E R_h = a_h + bias_h / L,   Cov(R_h, R_k) = cov_hk / L,
    with a_h = A_h / Z_h (A = E e^s y, Z = E e^s), bias_h = f_ND C(N,D) + f_DD C(D,D)/2 and
    cov_hk = grad f_h^T C grad f_k (f(N, D) = N/D at (A, Z), C the one-token covariances).
    Every one-token moment E[e^{lambda.s} y^n] is an n-th derivative of the Gaussian MGF."""
    T = _token_model()
    th, mgf, om, heads = T["theta"], T["mgf"], T["omega"], T["heads"]
    tau = sp.Symbol("tau", real=True)

    def moment(lams, n_y):
        sub = {th[0]: sum(l * om[(h, "i")] for h, l in lams.items()),
               th[1]: sum(l * om[(h, "j")] for h, l in lams.items()), th[2]: tau, th[3]: tau}
        e = mgf.subs(sub)
        return (sp.diff(e, tau, n_y) if n_y else e).subs(tau, 0)

    def pair(h, k):
        return {h: 1, k: 1} if h != k else {h: 2}

    A = {h: moment({h: 1}, 1) for h in heads}
    Z = {h: moment({h: 1}, 0) for h in heads}
    mean = {h: sp.simplify(A[h] / Z[h]) for h in heads}
    C_NN = {(h, k): moment(pair(h, k), 2) - A[h] * A[k] for h in heads for k in heads}
    C_ND = {(h, k): moment(pair(h, k), 1) - A[h] * Z[k] for h in heads for k in heads}
    C_DD = {(h, k): moment(pair(h, k), 0) - Z[h] * Z[k] for h in heads for k in heads}
    N, D = sp.symbols("N D", positive=True)
    f = N / D

    def at(expr, h):
        return expr.subs({N: A[h], D: Z[h]})

    fN, fD, fND, fDD = sp.diff(f, N), sp.diff(f, D), sp.diff(f, N, D), sp.diff(f, D, 2)
    bias = {h: sp.simplify(at(fND, h) * C_ND[(h, h)] + at(fDD, h) * C_DD[(h, h)] / 2) for h in heads}
    cov = {(h, k): sp.simplify(at(fN, h) * at(fN, k) * C_NN[(h, k)] + at(fN, h) * at(fD, k) * C_ND[(h, k)]
                               + at(fD, h) * at(fN, k) * C_ND[(k, h)] + at(fD, h) * at(fD, k) * C_DD[(h, k)])
           for h in heads for k in heads}
    return mean, bias, cov


def _one_coordinate_mgf():
    """E e^{c z^2}, z ~ N(0,1): the Gaussian integral with a = 1/2 - c > 0 (c < 1/2)."""
    c = sp.Symbol("c", real=True)
    z = sp.Symbol("z", real=True)
    a = sp.Symbol("a", positive=True)
    val = sp.integrate(sp.exp(-a * z ** 2) / sp.sqrt(2 * sp.pi), (z, -sp.oo, sp.oo))
    return c, sp.simplify(val.subs(a, sp.Rational(1, 2) - c))


def _g_average(a_i, G, t, block_factor, c, r, r_i):
    """(E_g e^{alpha t + beta G} given q, E_g of a polynomial in (t, G)): q_i rotated onto e_1,
    t = sqrt(a_i) g_1, G = g_1^2 + |rest|^2, the moments the derivatives of the MGF at 0."""
    alpha, beta = sp.symbols("alpha beta", real=True)
    g1 = sp.Symbol("g1", real=True)
    b_ = sp.Symbol("b_", positive=True)
    first = sp.integrate(sp.exp(alpha * sp.sqrt(a_i) * g1 - b_ * g1 ** 2) / sp.sqrt(2 * sp.pi), (g1, -sp.oo, sp.oo))
    mgf_g = sp.simplify(first.subs(b_, sp.Rational(1, 2) - beta)) * block_factor.subs({c: beta, r: r_i - 1})

    def E_g(expr):
        poly = sp.Poly(sp.expand(expr), t, G)
        out = sp.Integer(0)
        for (p, n), coef in poly.terms():
            mom = mgf_g
            if p:
                mom = sp.diff(mom, alpha, p)
            if n:
                mom = sp.diff(mom, beta, n)
            out += coef * sp.simplify(mom.subs({alpha: 0, beta: 0}))
        return sp.expand(out)

    return mgf_g, E_g


def _q_average(a_i, a_j, block_factor, c, r, r_i, r_j):
    """E_q of a sum of terms |q_i|^{2p} e^{k_i |q_i|^2 + k_j |q_j|^2}: |q_b|^2 ~ chi^2_{r_b},
    E a^p e^{k a} = d^p/dk^p (1 - 2k)^{-r/2}."""
    kappa = sp.Symbol("kappa", real=True)

    def E_q(expr):
        out = sp.Integer(0)
        for term in sp.Add.make_args(sp.expand(sp.powsimp(sp.expand(expr), combine="exp"))):
            term = sp.powsimp(term, combine="exp")
            factors = sp.Mul.make_args(term)
            expo = sp.expand(sum((f.args[0] for f in factors if isinstance(f, sp.exp)), sp.Integer(0)))
            rest = sp.Mul(*[f for f in factors if not isinstance(f, sp.exp)])
            k_i, k_j = expo.coeff(a_i), expo.coeff(a_j)
            if sp.simplify(expo - k_i * a_i - k_j * a_j) != 0:
                raise AssertionError(f"exponent not linear in |q_b|^2: {expo}")
            p = sp.degree(rest, a_i) if rest.has(a_i) else 0
            coef = sp.simplify(rest / a_i ** p)
            if coef.has(a_i) or coef.has(a_j):
                raise AssertionError(f"unexpected dependence on |q|^2: {rest}")
            Mi = block_factor.subs({c: kappa, r: r_i})
            Mi = sp.diff(Mi, kappa, p) if p else Mi
            out += coef * Mi.subs(kappa, k_i) * block_factor.subs({c: k_j, r: r_j})
        return out

    return E_q


@lru_cache(maxsize=None)
def derive_expansion() -> ExpansionDerivation:
    """Derive the large-L expansion from the model (sympy; about a second or two, cached).

    1. Given (q, g), the delta method for the ratio (:func:`_conditional_moments`) gives the
       conditional mean a_h = omega_hi t, bias and covariance of each head's softmax
       average, all from derivatives of the Gaussian MGF of one token.
    2. Mean squared error of y_hat_i = sum_h mu_h R_h against t = g^T q_i, to O(1/L):
       (B t - t)^2 + (2/L)(B t - t) sum_h mu_h bias_h + (1/L) sum_{h,k} mu_h mu_k cov_hk.
    3. Average over g given q (E_g from the MGF of (t, G), q_i rotated onto an axis) and
       over q (a_b = |q_b|^2 ~ chi^2_{r_b}: E a^p e^{k a} = d^p/dk^p (1 - 2k)^{-r/2}, the
       r-th power of the one-coordinate Gaussian integral).
    The kernels are read off the averaged terms with the other block switched off; that the
    kernel formula equals the step-by-step derivation for two heads and two blocks exactly
    (sympy simplify to 0) is checked in tests/test_theory_reduced_ode.py."""
    T = _token_model()
    a_i, a_j, G, t, s2, om = T["a_i"], T["a_j"], T["G"], T["t"], T["s2"], T["omega"]
    mean, bias, cov = _conditional_moments()
    c, one = _one_coordinate_mgf()
    r = sp.Symbol("r", positive=True)
    w = sp.Symbol("w", real=True)
    block_factor = sp.powsimp(sp.simplify(one ** r), force=True)          # E e^{c|q|^2}, q in R^r
    r_i, r_j = sp.symbols("r_i r_j", positive=True)

    mgf_g, E_g = _g_average(a_i, G, t, block_factor, c, r, r_i)
    E_q = _q_average(a_i, a_j, block_factor, c, r, r_i, r_j)

    h, k = T["heads"]
    # bias enters the MSE as 2 (1 - B) mu_h * (-t bias_h / omega_hi): average that factor
    bias_full = sp.simplify(E_q(E_g(-t * bias[h] / om[(h, "i")])))
    pair_full = sp.simplify(E_q(E_g(cov[(h, k)])))
    off = {om[(h, "j")]: 0, om[(k, "j")]: 0}
    bias_kernel = sp.simplify(bias_full.subs(off).subs(om[(h, "i")], sp.sqrt(w)).subs(r_i, r))
    pair_kernel = sp.simplify(pair_full.subs(off).subs(om[(k, "i")], c / om[(h, "i")]).subs(r_i, r))
    # the other block enters only through block_factor(c_hkj, r_j) (independent blocks)
    other_bias = sp.simplify(bias_full / bias_full.subs(off))
    other_pair = sp.simplify(pair_full / pair_full.subs(off))
    if sp.simplify(other_bias - block_factor.subs({c: om[(h, "j")] ** 2, r: r_j})) != 0 or \
            sp.simplify(other_pair - block_factor.subs({c: om[(h, "j")] * om[(k, "j")], r: r_j})) != 0:
        raise AssertionError("the other block does not factor as block_factor: derivation inconsistent")
    steps = {"conditional_mean": mean[h], "conditional_bias": bias[h], "conditional_cov": cov[(h, k)],
             "conditional_var": cov[(h, h)], "mgf_token": T["mgf"], "mgf_g": sp.simplify(mgf_g),
             "one_coordinate": one, "bias_full": bias_full, "pair_full": pair_full,
             "E_g": E_g, "E_q": E_q}
    return ExpansionDerivation(c=c, w=w, r=r, s2=s2, block_factor=block_factor,
                               bias_kernel=bias_kernel, pair_kernel=pair_kernel, steps=steps)


def _log_ratio(expr, c):
    """log(expr(c) / expr(0)) as a sum of e * log1p(b(c)/b(0) - 1) over the factors b^e of expr
    that depend on c: accurate to rounding relative to its own size as c -> 0, where
    log(expr(c)) - log(expr(0)) would lose every digit below the rounding of log(expr(0)).
    Each factor of the kernels (1 - 2c, r + s2 - c (r + 2 s2)) is positive for c < 1/2, so
    the log of each ratio is real; the c-free factors multiply to 1 and drop out."""
    from sympy.codegen.cfunctions import log1p

    ratio = sp.factor(expr / expr.subs(c, 0))
    return sp.Add(*[e * log1p(sp.simplify(b / b.subs(c, 0) - 1))
                    for b, e in (f.as_base_exp() for f in sp.Mul.make_args(ratio)) if b.has(c)])


@lru_cache(maxsize=None)
def _kernels():
    """numpy functions lambdified from :func:`derive_expansion` (values and derivatives), the
    logs in log1p form (:func:`_log_ratio`; tests/test_theory_reduced_ode.py holds them against
    the kernels themselves)."""
    D = derive_expansion()
    c, w, r, s2 = D.c, D.w, D.r, D.s2
    log_bf = _log_ratio(D.block_factor, c)
    log_pair = _log_ratio(D.pair_kernel, c)           # pair_kernel(0) = r + s2
    f = {
        "log_block_factor": sp.lambdify((c, r), log_bf, "numpy"),
        "d_log_block_factor": sp.lambdify((c, r), sp.simplify(sp.diff(D.block_factor, c) / D.block_factor), "numpy"),
        "log_pair_ratio": sp.lambdify((c, r, s2), log_pair, "numpy"),
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
    """The kernels at (omega, mu).  Besides the pair weights X[h, k, i] their excess over the
    constant part, X_excess = X - (r_i + s2) = (r_i + s2) expm1(log(X / (r_i + s2))), the log
    summed from the log1p forms of :func:`_kernels`: accurate relative to its own size
    O(omega^2), so that  sum_hk mu_h mu_k X_hk = (r_i + s2) (sum_h mu_h)^2 + mu^T X_excess mu
    forms no difference of terms of size |mu|^2 when zero-sum mu ~ 1/omega grow large."""
    k = _kernels()
    r = np.asarray(tasks, dtype=float)                      # (m,)
    c = omega[:, None, :] * omega[None, :, :]               # (H, H, m)
    log_bf = k["log_block_factor"](c, r)                    # (H, H, m)
    log_others = log_bf.sum(axis=2)[:, :, None] - log_bf    # log prod_{j != i} block_factor(c_hkj)
    others = np.exp(log_others)
    X = k["pair_kernel"](c, r, sigma ** 2) * others         # (H, H, m)
    X_excess = (r + sigma ** 2) * np.expm1(k["log_pair_ratio"](c, r, sigma ** 2) + log_others)
    w = omega ** 2
    H = omega.shape[0]
    idx = np.arange(H)
    others_diag = others[idx, idx, :]                       # (H, m)
    Z = k["bias_kernel"](w, r) * others_diag                # (H, m)
    B = np.sum(mu * omega, axis=0)                          # (m,)
    return dict(r=r, c=c, log_bf=log_bf, others=others, X=X, X_excess=X_excess, w=w, Z=Z, B=B,
                others_diag=others_diag)


def _profile(omega, tasks, L, sigma, ridge=0.0):
    """:func:`profile_mu` without its checks, for the searches' inner loops, with an optional
    Tikhonov term: it minimises the expansion plus ridge (r_i + sigma^2)/L |mu_i|^2 and returns
    that penalised value (A_i gains ridge (r_i + sigma^2)/L on its diagonal)."""
    H, m = omega.shape
    if not expansion_valid(omega):
        return np.zeros((H, m)), float("inf"), False
    p = _pieces(omega, np.zeros_like(omega), tasks, sigma)
    mu = np.zeros((H, m))
    total = 0.0
    for i, r in enumerate(tasks):
        w = omega[:, i]
        b = w * p["Z"][:, i]
        constant = (r + sigma ** 2) / L
        A = (constant + r * np.outer(w, w) - (np.outer(w, b) + np.outer(b, w)) / L + p["X_excess"][:, :, i] / L
             + ridge * constant * np.eye(H))
        beta = r * w - b / L
        try:
            C = np.linalg.cholesky(A)
        except np.linalg.LinAlgError:
            return mu, float("inf"), False
        mu[:, i] = np.linalg.solve(C.T, np.linalg.solve(C, beta))
        total += r - beta @ mu[:, i]
    return mu, float(total), True


def profile_mu(omega, tasks, L, sigma=0.0):
    """(mu*(omega), loss, positive_definite): the exact minimiser over mu of the expansion
    at fixed omega (H, m), task by task.  For fixed omega the expansion is, per task, the
    quadratic  mu_i^T A_i mu_i - 2 beta_i^T mu_i + r_i  in mu_i = mu[:, i] with
      A_i = r_i w w^T - (w b^T + b w^T)/L + X[:, :, i]/L,  beta_i = r_i w - b/L,
      w = omega[:, i],  b = w * Z[:, i]  (bias weights),  X the pair weights;
    the minimum r_i - beta_i^T A_i^{-1} beta_i exists iff A_i is positive definite
    (otherwise the truncated expansion is unbounded below and ok=False, loss=inf).
    The minimum is a minimum over a family of softmax attention (every mu at this omega):
    ``linear_attention.check_minimum`` refuses one that cannot be (negative, or below linear
    attention at large L: near omega = 0, where A_i's condition grows like |omega|^-4 with
    more than m + 1 heads, rounding can send it there)."""
    tasks = check_tasks(tasks)
    omega = np.atleast_2d(np.asarray(omega, dtype=float))
    L, sigma = check_L(L), check_sigma(sigma)
    mu, val, ok = _profile(omega, tasks, L, sigma)
    if ok:
        check_minimum("theory.reduced_ode.profile_mu", val, tasks, L, sigma)
    return mu, val, ok


OMEGA_RELIABLE = float(1.0 / np.sqrt(6.0))


def expansion_reliable(omega, margin: float = 0.0) -> bool:
    """True iff the O(L^-2) remainder of the expansion has a finite coefficient:
    6 omega[h,j]^2 < 1 - margin for all h, j.  The L^-2 term of the delta method contains
    the third cumulant of e^{s} (E[(dN)(dD)^2] / Z^3 ~ E e^{3s} / (E e^{s})^3 =
    e^{3 omega^2 |q|^2} given q), whose Gaussian average is finite only for 6 omega^2 < 1.
    Between 1/sqrt(6) and 1/sqrt(2) the expansion is finite but its error is not O(L^-2):
    compare with the exact finite-L loss there (docs/model.md: (0.51, 1.84) at L=128)."""
    om = np.asarray(omega, dtype=float)
    return bool(np.all(np.isfinite(om)) and np.all(6.0 * om ** 2 < 1.0 - margin))


def validity_edge(omega_max: float = 10.0) -> float:
    """The edge of the validity flag on one head and one task: sup{omega : expansion_valid(omega)}
    (bisection on the flag, 60 halvings; boundary-saturation compares it with measurements)."""
    lo, hi = 0.0, omega_max
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if expansion_valid(np.array([[mid]])) else (lo, mid)
    return lo


def expansion_loss(omega, mu, tasks, L, sigma=0.0) -> float:
    """Large-L expansion of the exact reduced loss L_L(omega, mu) (sum over tasks),
    ``expansion_formula()``; +inf outside the domain (some 2 omega^2 >= 1).  The pair term
    is summed as (r_i + s2)(sum_h mu_hi)^2 + mu_i^T X_excess mu_i (:func:`_pieces`), stable
    for zero-sum mu of any size; a negative value (the truncation far outside its range,
    small L or saturating omega) is refused (``theory.check_loss``).

    omega, mu: (H, m) arrays; tasks: (r_1..r_m); L > 0; sigma >= 0."""
    tasks = check_tasks(tasks)
    (omega, mu), L, sigma = check_omega_mu(omega, mu, tasks), check_L(L), check_sigma(sigma)
    if not expansion_valid(omega):
        return float("inf")
    p = _pieces(omega, mu, tasks, sigma)
    r, B, Z = p["r"], p["B"], p["Z"]
    leading = np.sum(r * (1.0 - B) ** 2)
    S = np.sum(mu * omega * Z, axis=0)                      # (m,)
    bias = 2.0 / L * np.sum((1.0 - B) * S)
    pair = 1.0 / L * (np.sum((r + sigma ** 2) * np.sum(mu, axis=0) ** 2)
                      + np.einsum("hi,ki,hki->", mu, mu, p["X_excess"]))
    return float(check_loss("theory.reduced_ode.expansion_loss", leading + bias + pair))


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
    (omega, mu), L, sigma = check_omega_mu(omega, mu, tasks), check_L(L), check_sigma(sigma)
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
    g_mu = g_mu + 2.0 / L * ((r + sigma ** 2) * np.sum(mu, axis=0) + np.einsum("kj,gkj->gj", mu, p["X_excess"]))
    Xd = k["d_pair_kernel"](c, r, sigma ** 2) * p["others"]
    A = np.einsum("hi,ki,hki->hk", mu, mu, X)
    mm = mu[:, None, :] * mu[None, :, :]                    # (H, H, m)
    Y = k["d_log_block_factor"](c, r) * (A[:, :, None] - mm * X) + mm * Xd
    g_om = g_om + 2.0 / L * np.einsum("kj,gkj->gj", omega, Y)
    return g_om, g_mu


# ---------------------------------------------------------------------------------------
# metric factors of the flow
# ---------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def derive_metric_factors(block_sizes=(1, 2, 3), m_out=2) -> dict:
    """Derive the metric factors from the model's own parametrisation (sympy).

    At a point of D the gradient of the loss w.r.t. W lies in D (equivariance, claim 1),
    with X-X block sum_i g_i Phi_i Phi_i^T, g_i = (1/r_i) dL/d omega_i (because
    omega_i = <W_XX, Phi_i Phi_i^T>/r_i and |Phi_i Phi_i^T|^2 = r_i).  So on one block of
    size r the loss may be represented by f(omega) with omega = tr(W_XX)/r, and on the
    outputs by f(mu) with mu_i = (U_Y)_ii.  With generic symbolic matrices:

    - merged: dW = -dL/dW; d omega = tr(dW)/r.
    - factored: W = K^T Q / s with K, Q generic r x r matrices, dK = -dL/dK, dQ = -dL/dQ,
      evaluated at the balanced point K = Q = kappa I (omega = kappa^2/s);
      U_Y = O_Y V_Y with generic m x m matrices, at O_Y = V_Y = diag(nu) (mu = nu^2).
    Returns, per block size r, the factor F with d omega/dt = -F f'(omega), and the mu factor,
    as sympy expressions in omega, mu, s (and the general formula they match)."""
    omega, mu, s = sp.symbols("omega mu s", positive=True)
    kappa, nu = sp.symbols("kappa nu", positive=True)
    fprime = sp.Symbol("fprime", real=True)   # f'(omega) at the current point
    out = {"omega": {}, "mu": {}}
    for r in block_sizes:
        # merged: L(W) = f(tr W / r) locally; dL/dW = f'/r * I
        Wm = sp.Matrix(r, r, lambda a, b: sp.Symbol(f"w{a}{b}"))
        f_lin = fprime * Wm.trace() / r                 # first-order model of f(tr W / r)
        dW = -sp.Matrix(r, r, lambda a, b: sp.diff(f_lin, Wm[a, b]))
        merged = sp.simplify(-dW.trace() / r / fprime)
        # factored: W = K^T Q / s
        K = sp.Matrix(r, r, lambda a, b: sp.Symbol(f"k{a}{b}"))
        Q = sp.Matrix(r, r, lambda a, b: sp.Symbol(f"q{a}{b}"))
        Wf = K.T * Q / s
        f_fac = fprime * Wf.trace() / r
        dK = -sp.Matrix(r, r, lambda a, b: sp.diff(f_fac, K[a, b]))
        dQ = -sp.Matrix(r, r, lambda a, b: sp.diff(f_fac, Q[a, b]))
        dWf = (dK.T * Q + K.T * dQ) / s
        balanced = {K[a, b]: (kappa if a == b else 0) for a in range(r) for b in range(r)}
        balanced.update({Q[a, b]: (kappa if a == b else 0) for a in range(r) for b in range(r)})
        d_omega = (dWf.trace() / r).subs(balanced)
        factored = sp.simplify((-d_omega / fprime).subs(kappa, sp.sqrt(s * omega)))
        out["omega"][r] = {"merged": merged, "factored": factored}
    # outputs: U_Y = O_Y V_Y, f(mu) with mu_i = (U_Y)_ii; factor of output 0
    O = sp.Matrix(m_out, m_out, lambda a, b: sp.Symbol(f"o{a}{b}"))
    V = sp.Matrix(m_out, m_out, lambda a, b: sp.Symbol(f"v{a}{b}"))
    gs = sp.symbols(f"g0:{m_out}", real=True)          # dL/d mu_i
    Um = sp.Matrix(m_out, m_out, lambda a, b: sp.Symbol(f"u{a}{b}"))
    f_U = sum(gs[i] * Um[i, i] for i in range(m_out))
    dU = -sp.Matrix(m_out, m_out, lambda a, b: sp.diff(f_U, Um[a, b]))
    out["mu"]["merged"] = sp.simplify(-dU[0, 0] / gs[0])
    UF = O * V
    f_F = sum(gs[i] * UF[i, i] for i in range(m_out))
    dO = -sp.Matrix(m_out, m_out, lambda a, b: sp.diff(f_F, O[a, b]))
    dV = -sp.Matrix(m_out, m_out, lambda a, b: sp.diff(f_F, V[a, b]))
    dUF = dO * V + O * dV
    bal = {O[a, b]: (nu if a == b else 0) for a in range(m_out) for b in range(m_out)}
    bal.update({V[a, b]: (nu if a == b else 0) for a in range(m_out) for b in range(m_out)})
    out["mu"]["factored"] = sp.simplify((-dUF[0, 0] / gs[0]).subs(bal).subs(nu, sp.sqrt(mu)))
    # off-diagonal entries of U_Y must not move at a balanced diagonal point
    out["mu"]["factored_offdiag_velocity"] = sp.simplify(dUF[0, 1].subs(bal)) if m_out > 1 else 0
    r_sym = sp.Symbol("r", positive=True)
    out["general"] = {"merged": (1 / r_sym, sp.Integer(1)), "factored": (2 * omega / (s * r_sym), 2 * mu)}
    out["symbols"] = {"omega": omega, "mu": mu, "s": s, "r": r_sym}
    return out


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
    s = check_positive("logit_scale s", logit_scale)
    r = np.asarray(tasks, dtype=float)
    if param == "merged":
        return np.broadcast_to(1.0 / r, omega.shape).copy(), np.ones_like(mu)
    return 2.0 * np.abs(omega) / (s * r), 2.0 * np.abs(mu)


# ---------------------------------------------------------------------------------------
# the flows: one trajectory type and one integrator (the expansion flow here, the exact-loss
# flow theory.exact.exact_flow), and the expansion flow
# ---------------------------------------------------------------------------------------

@dataclass
class FlowTrajectory:
    """A trajectory of a gradient flow on (omega, mu): t (T,), omega/mu (T, H, m), loss (T,).

    ``status``: "t_end" (reached t_end), "stationary" (velocity below the flow's
    ``stationary_tol``: a fixed point), "left_domain" (expansion flow only: some 2 omega^2
    reached 1 - margin, where the expansion stops being valid), "diverged" (loss or state
    non-finite / too large) or "failed" (solver error, ``message``); ``param`` the
    parametrisation whose metric the flow used."""

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


PARAMS = ("merged", "factored")


def factor_velocity(sign, a, v):
    """Velocity of a balanced factor a >= 0 of x = sign a^2 moving at dx/dt = v:
    da = sign v / (2a), and 0 where a = 0 (there the metric, and so v, vanishes like a^2)."""
    safe = np.where(a > 0, a, 1.0)
    return np.where(a > 0, sign * v / (2.0 * safe), 0.0)


def solve_flow(velocity, loss, omega0, mu0, param, t_end, t_eval, stops, rtol, atol, method) -> FlowTrajectory:
    """Integrate d(omega, mu)/dt = velocity(omega, mu) from (omega0, mu0) over [0, t_end] with
    scipy ``solve_ivp``, recording at ``t_eval`` (default 61 evenly spaced, as the numerics record).

    Coordinates: merged, (omega, mu) themselves; factored, the balanced factors
    omega = sign0 kappa^2, mu = sign0 nu^2 (as in the model: omega = kappa^2/s with K = Q = kappa,
    mu = nu^2 with O = V^T = nu).  The factored metric 2|omega| vanishes at 0, so the exact flow
    never changes the sign of an entry; in the factor coordinates a numerical step cannot make it
    do so either (d kappa = -sign0 kappa G/(s r) is linear in kappa).
    ``velocity`` returns None where the state is outside its domain (the state then stands
    still: a stop ends the run there).  ``stops``: (status, g(t, y, omega, mu, rhs)) terminal
    events, g crossing zero stops the flow with that status (the first in the list that fired);
    the state where it stopped is the last record.  ``loss(omega, mu)`` fills the records' losses."""
    if param not in PARAMS:
        raise ValueError(f"param must be one of {PARAMS}, got {param!r}")
    t_end = check_positive("t_end", t_end)
    t_eval = np.linspace(0.0, t_end, 61) if t_eval is None else np.asarray(t_eval, dtype=float)
    if t_eval.ndim != 1 or np.any(np.diff(t_eval) <= 0) or t_eval[0] < 0 or t_eval[-1] > t_end:
        raise ValueError("t_eval must be increasing times within [0, t_end]")
    shape, n, merged = omega0.shape, omega0.size, param == "merged"
    sign_om, sign_mu = np.where(omega0 < 0, -1.0, 1.0), np.where(mu0 < 0, -1.0, 1.0)

    def point(y):
        a, c = y[:n].reshape(shape), y[n:].reshape(shape)
        return (a, c) if merged else (sign_om * a ** 2, sign_mu * c ** 2)

    def rhs(_t, y):
        v = velocity(*point(y))
        if v is None:
            return np.zeros_like(y)
        if merged:
            return np.concatenate([v[0].ravel(), v[1].ravel()])
        a, c = y[:n].reshape(shape), y[n:].reshape(shape)
        return np.concatenate([factor_velocity(sign_om, a, v[0]).ravel(), factor_velocity(sign_mu, c, v[1]).ravel()])

    def event(g):
        def crossed(t, y):
            return g(t, y, *point(y), rhs)
        crossed.terminal = True
        return crossed

    x0 = (omega0, mu0) if merged else (np.sqrt(np.abs(omega0)), np.sqrt(np.abs(mu0)))
    sol = solve_ivp(rhs, (0.0, float(t_end)), np.concatenate([x.ravel() for x in x0]), method=method,
                    t_eval=t_eval, events=[event(g) for _, g in stops], rtol=rtol, atol=atol)
    status = {-1: "failed", 0: "t_end"}.get(sol.status)
    ts, ys = list(sol.t), [sol.y[:, j] for j in range(sol.y.shape[1])]
    if sol.status == 1:
        status = next(name for (name, _), ev_t in zip(stops, sol.t_events) if len(ev_t))
        for ev_t, ev_y in zip(sol.t_events, sol.y_events):
            if len(ev_t) and (not ts or ev_t[0] > ts[-1]):
                ts.append(float(ev_t[0]))
                ys.append(ev_y[0])
    points = [point(y) for y in ys]
    om = np.stack([p[0] for p in points]) if points else np.empty((0,) + shape)
    mu = np.stack([p[1] for p in points]) if points else np.empty((0,) + shape)
    return FlowTrajectory(t=np.asarray(ts), omega=om, mu=mu, loss=np.array([loss(o, u) for o, u in zip(om, mu)]),
                          status=status, message=sol.message, param=param)


def integrate_expansion_flow(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0,
                             t_end=60.0, t_eval=None, domain_margin=1e-3, stationary_tol=None,
                             rtol=1e-9, atol=1e-12, method="LSODA",
                             max_loss=1e6) -> FlowTrajectory:
    """Integrate d omega = -f_omega dL/d omega, d mu = -f_mu dL/d mu on the expansion
    ``expansion_loss`` from (omega0, mu0) over [0, t_end] (:func:`solve_flow`: the
    factored flow in its balanced factors, so that no step flips a sign).

    t_eval: the record times (default 61 evenly spaced, as the numerics record); the
    trajectory stops early (and says why in ``status``) if it leaves the domain of
    validity (2 omega^2 >= 1 - domain_margin), diverges (loss > max_loss), or, when
    ``stationary_tol`` is given, when the velocity norm falls below it (a fixed point).
    Records after an early stop are absent (the arrays are shorter)."""
    tasks = check_tasks(tasks)
    (omega0, mu0), L, sigma = check_omega_mu(omega0, mu0, tasks), check_L(L), check_sigma(sigma)
    if not expansion_valid(omega0, domain_margin):
        raise ValueError(f"the initial omega lies outside the expansion's domain (need 2*omega^2 < "
                         f"1 - {domain_margin}); max |omega| = {np.abs(omega0).max():.4g}")

    def velocity(om, m_):
        if not expansion_valid(om):
            return None     # the domain event stops the solver at the boundary
        g_om, g_mu = _gradient(om, m_, tasks, L, sigma)
        f_om, f_mu = metric_factors(param, om, m_, tasks, logit_scale)
        return -f_om * g_om, -f_mu * g_mu

    def diverge(_t, y, om, m_, _rhs):
        if not np.all(np.isfinite(y)):
            return -1.0
        return max_loss - expansion_loss(om, m_, tasks, L, sigma) if expansion_valid(om) else 1.0

    def stationary(t, _y, om, m_, _rhs):
        if t <= 0 or not expansion_valid(om):
            return 1.0
        d_om, d_mu = velocity(om, m_)
        return np.sqrt(np.sum(d_om ** 2) + np.sum(d_mu ** 2)) - stationary_tol

    stops = [("left_domain", lambda _t, _y, om, _m, _rhs: (1.0 - domain_margin) - 2.0 * np.max(om ** 2)),
             ("diverged", diverge)] + ([("stationary", stationary)] if stationary_tol is not None else [])
    return solve_flow(velocity, lambda o, u: expansion_loss(o, u, tasks, L, sigma) if np.all(np.isfinite(o))
                      else np.nan, omega0, mu0, param, t_end, t_eval, stops, rtol, atol, method)


def default_init(tasks, heads, init_scale=0.15) -> tuple[np.ndarray, np.ndarray]:
    """The numerics' default decomposable initialisation (docs/ARCHITECTURE.md):
    omega = s0 everywhere; mu = s0 except 2 s0 on each head's favoured task h mod m."""
    tasks, heads = check_tasks(tasks), check_positive_int("heads", heads)
    s0 = check_positive("init_scale", init_scale)
    m = len(tasks)
    omega = np.full((heads, m), s0)
    mu = np.full((heads, m), s0)
    mu[np.arange(heads), np.arange(heads) % m] = 2.0 * s0
    return omega, mu


def expansion_gd_map(omega0, mu0, tasks, L, sigma=0.0, param="factored", logit_scale=1.0, lr=0.05,
                     t=(), on_exit: str = "raise") -> tuple[np.ndarray, np.ndarray]:
    """(omega, mu) at the times ``t`` (multiples of lr) of the expansion flow discretised by
    the *same* gradient-descent step as the full model, from (omega0, mu0).

    merged: the Euler step x <- x - lr f g (metric factors f of :func:`metric_factors`);
    factored: one GD step on the balanced factors a = sqrt|x| (x = sign a^2), a <- a + lr
    sign v/(2a) with v = -f g, i.e. omega <- omega (1 - lr g_omega/(s r))^2,
    mu <- mu (1 - lr g_mu)^2.  Comparing a GD run with this map removes the O(lr)
    discretisation gap, which does not shrink with L.  If the map leaves the expansion's
    domain 2 omega^2 < 1: ``on_exit="raise"`` raises, ``"stop"`` returns the iterates
    reached so far (fewer than len(t))."""
    tasks = check_tasks(tasks)
    om, mu = (a.copy() for a in check_omega_mu(omega0, mu0, tasks))
    L, sigma = check_L(L), check_sigma(sigma)
    if param not in PARAMS:
        raise ValueError(f"param must be one of {PARAMS}, got {param!r}")
    if on_exit not in ("raise", "stop"):
        raise ValueError(f"on_exit must be 'raise' or 'stop', got {on_exit!r}")
    lr = check_positive("lr", lr)
    oms, mus, k = [], [], 0
    for target in np.rint(np.asarray(t, float) / lr).astype(int):
        while k < target:
            if not expansion_valid(om):
                if on_exit == "stop":
                    return np.array(oms), np.array(mus)
                raise RuntimeError(f"the expansion GD map left the domain 2 omega^2 < 1 at step {k} (L={L})")
            g_om, g_mu = expansion_gradient(om, mu, tasks, L, sigma)
            f_om, f_mu = metric_factors(param, om, mu, tasks, logit_scale)
            v_om, v_mu = -f_om * g_om, -f_mu * g_mu
            if param == "factored":
                new = []
                for x, v in ((om, v_om), (mu, v_mu)):
                    sign, a = np.where(x < 0, -1.0, 1.0), np.sqrt(np.abs(x))
                    new.append(sign * (a + lr * factor_velocity(sign, a, v)) ** 2)
                om, mu = new
            else:
                om, mu = om + lr * v_om, mu + lr * v_mu
            k += 1
        oms.append(om.copy())
        mus.append(mu.copy())
    return np.array(oms), np.array(mus)
