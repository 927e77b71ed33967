"""Starts outside the paper's "suitable initialisation": what theory says about them.

Three pieces of mathematics (numpy only), used by ``claims.boundary_initialisation`` and
``claims.boundary_allocation_race`` (and a fourth: the starts they run):

1. **The residual split** (:func:`residual_split`).  The query z_q = (q, 0) has no y part,
   so the y columns of every W_h (W_h[:, d:]) never enter the output: no gradient reaches
   them (merged: they stay at their initial value; factored: Q_h[:, d:] stays, and
   W_h[:, d:] = K_h^T Q_h[:, d:] / s moves only through K_h).  P_D sets those columns to zero,
   so the off-D residual splits orthogonally,

       ||theta - P_D theta||^2 = movable^2 + gradient_free^2,
       gradient_free = ||W[:, :, d:]||,   movable^2 = the rest of the off-D part
       (W_YX, U_X, off-diagonal U_Y, and W_XX minus its block-scalar part),

   from ``theory.block_structure.off_decomposable_parts``.  A raw residual has a floor set
   by the init's gradient-free part; only ``movable`` says whether the flow leaves D.

2. **The unbalanced metric** (:func:`unbalanced_metric_factors`).  On D with block-scalar
   factors K_h|block i = k Phi_i Phi_i^T, Q_h|block i = q Phi_i Phi_i^T (omega = k q / s)
   and U_Y[i, i] = o v (mu = o v), gradient flow on the r_i diagonal entries gives
   dk/dt = -(q / (s r_i)) dL/domega, dq/dt = -(k / (s r_i)) dL/domega, so
   d(k^2 - q^2)/dt = 0 (the balance c_omega = k^2 - q^2 is conserved) and

       domega/dt = -(k^2 + q^2) / (s^2 r_i) dL/domega
                 = -sqrt(c_omega^2 + 4 s^2 omega^2) / (s^2 r_i) dL/domega,

   using (k^2 + q^2)^2 = (k^2 - q^2)^2 + 4 k^2 q^2.  Likewise do/dt = -v dL/dmu,
   dv/dt = -o dL/dmu, c_mu = o^2 - v^2 conserved, dmu/dt = -sqrt(c_mu^2 + 4 mu^2) dL/dmu.
   At c = 0 these are theory.reduced_ode.metric_factors' balanced 2|omega|/(s r_i), 2|mu|.

3. **The warm-up norm bound** (:func:`warmup_norm_bound`).  At small factored weights the
   loss is L0 + l(W, U) + higher orders, with l of degree one in W and one in U (so of
   degree 4 in the factors theta = (K, Q, V, O)): softmax ~ (1 + a_l - mean a)/L gives
   l = -2 sum_h B(U_h, W_h) + E |sum_h U_h zbar|^2 with the bilinear coupling
   B(U, W) = sum_i [<U_X[i, blk i], W_YX[i, blk i]> + U_Y[i, i] tr W_XX|blk i]
   (|B| <= sqrt(r_max) |U| |W| by Cauchy-Schwarz) and E zbar zbar^T = E Sigma_z / L with
   E Sigma_z <= max(1, r_max + sigma^2).  With |W_h| <= (|K_h|^2 + |Q_h|^2)/(2s) and
   |U_h| <= (|O_h|^2 + |V_h|^2)/2:  |l| <= c4 |theta|^4,

       c4 = sqrt(r_max) / (8 s) + H max(1, r_max + sigma^2) / (4 L).

   Euler's theorem for the degree-4 form: d|theta|^2/dt = -2 <theta, grad l> = -8 l
   <= 8 c4 |theta|^4, so u = |theta|^2 obeys u(t) <= u0 / (1 - 8 c4 u0 t): the weights stay
   within a factor sqrt 2 of their initial norm while 8 c4 u0 t <= 1/2 (the warm-up, leading
   order in the weights).  The merged weights obey |(W, U)| <= max(1, 1/s) |theta|^2 / 2, so
   every off-D part of (W, U) at time t is at most max(1, 1/s) u(t) / 2.

4. **The starts the boundaries run and what theory predicts from them**: the random starts'
   scales around the small scale (:func:`random_start_scales`), the authors' logit scale
   sqrt(d + m) (:func:`authors_logit_scale`), the race grid's starts (:func:`race_starts`),
   which tasks a start leaves to noise (:func:`untied_tasks`) and theory's ODE winners from a
   start (:func:`ode_winners`, at the tolerance its decision needs) and from the default start
   at a given scale (:func:`default_start_winners`).
"""
from __future__ import annotations

import math

import numpy as np

from . import check_L, check_omega_mu, check_positive, check_sigma, check_tasks
from .block_structure import off_decomposable_parts
from .reduced_ode import default_init, expansion_valid
from .task_allocation import predicted_winners, served_products


def residual_split(W, U, tasks, basis) -> dict:
    """Off-D parts of merged weights W (H, d+m, d+m), U (H, m, d+m), absolute and relative to
    ||(W, U)||: ``movable`` (what the loss can move), ``gradient_free`` (W's y columns),
    ``total`` = sqrt(movable^2 + gradient_free^2) (= decomposable_residual x norm) and
    ``norm`` = ||(W, U)||; ``*_relative`` divided by ``norm`` (0 at the zero point)."""
    parts = off_decomposable_parts(W, U, tasks, basis)
    movable = math.hypot(parts["sign_flip_killed"], parts["rotation_killed"])
    free = parts["never_trained"]
    norm = parts["total"]
    rel = (lambda x: x / norm) if norm > 0 else (lambda x: 0.0)
    total = math.hypot(movable, free)
    return {"movable": movable, "gradient_free": free, "total": total, "norm": norm,
            "movable_relative": rel(movable), "gradient_free_relative": rel(free), "total_relative": rel(total)}


def unbalanced_metric_factors(omega, mu, c_omega, c_mu, tasks, logit_scale=1.0) -> tuple[np.ndarray, np.ndarray]:
    """(f_omega, f_mu), each (H, m), of the factored flow on D with conserved balances
    c_omega = k^2 - q^2, c_mu = o^2 - v^2 (module docstring, item 2):
    f_omega = sqrt(c_omega^2 + 4 s^2 omega^2) / (s^2 r_i), f_mu = sqrt(c_mu^2 + 4 mu^2)."""
    tasks = check_tasks(tasks)
    omega, mu = check_omega_mu(omega, mu, tasks)
    c_omega, c_mu = check_omega_mu(c_omega, c_mu, tasks)
    s = check_positive("logit_scale s", logit_scale)
    r = np.asarray(tasks, float)
    return np.sqrt(c_omega ** 2 + 4.0 * s ** 2 * omega ** 2) / (s ** 2 * r), np.sqrt(c_mu ** 2 + 4.0 * mu ** 2)


def warmup_quartic_constant(tasks, heads, L, sigma=0.0, logit_scale=1.0) -> float:
    """c4 of the module docstring (item 3): |l(theta)| <= c4 |theta|^4 at small factored weights."""
    tasks, L, sigma = check_tasks(tasks), check_L(L), check_sigma(sigma)
    s = check_positive("logit_scale s", logit_scale)
    if int(heads) < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    r_max = max(tasks)
    return math.sqrt(r_max) / (8.0 * s) + int(heads) * max(1.0, r_max + sigma ** 2) / (4.0 * L)


def warmup_norm_bound(norm0_sq: float, t: float, tasks, heads, L, sigma=0.0, logit_scale=1.0) -> dict:
    """The bound of item 3 from |theta(0)|^2 = ``norm0_sq`` after time t: ``theta_sq`` (bound on
    |theta(t)|^2, inf once the blow-up time is passed), ``merged`` (bound on ||(W, U)|| and
    so on every off-D part of it), ``exponent`` = 8 c4 |theta0|^2 t (the bound holds to leading
    order while it is small: within warm-up), ``c4``."""
    if not (math.isfinite(norm0_sq) and norm0_sq >= 0):
        raise ValueError(f"norm0_sq must be a finite number >= 0, got {norm0_sq}")
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"t must be a finite number >= 0, got {t}")
    c4 = warmup_quartic_constant(tasks, heads, L, sigma, logit_scale)
    x = 8.0 * c4 * norm0_sq * t
    theta_sq = norm0_sq / (1.0 - x) if x < 1 else math.inf
    return {"c4": c4, "exponent": x, "theta_sq": theta_sq,
            "merged": max(1.0, 1.0 / float(logit_scale)) * theta_sq / 2.0}


def uniform_full_norm_sq(tasks, heads, init_scale) -> float:
    """E |theta0|^2 of init='uniform_full' (factored): H (3 D^2 + m D) entries, each uniform on
    +-s0/sqrt(D) (variance s0^2 / (3 D)), D = d + m."""
    tasks = check_tasks(tasks)
    D, m = sum(tasks) + len(tasks), len(tasks)
    return int(heads) * (3 * D * D + m * D) * float(init_scale) ** 2 / (3.0 * D)


def small_scale(tasks, heads, L, t_end, sigma=0.0, logit_scale=1.0, exponent=0.5) -> float:
    """The init scale s0 of init='uniform_full' below which the warm-up bound's exponent
    8 c4 E|theta0|^2 t_end stays below ``exponent`` (default 1/2: the weights' norm grows by at
    most sqrt 2 by t_end): "well inside the warm-up"."""
    c4 = warmup_quartic_constant(tasks, heads, L, sigma, logit_scale)
    per_unit = uniform_full_norm_sq(tasks, heads, 1.0)
    return math.sqrt(exponent / (8.0 * c4 * per_unit * float(t_end)))


def authors_logit_scale(tasks) -> float:
    """The authors' logit scale sqrt(d + m) (d = sum r_i, m tasks): with init_scale = 1 the
    uniform_full start is PyTorch's nn.Linear default with their logit scaling."""
    tasks = check_tasks(tasks)
    return math.sqrt(sum(tasks) + len(tasks))


def random_start_scales(scales, small_factor, tasks, heads, L, t_end, sigma=0.0) -> tuple[list, float]:
    """The random starts' init scales: each entry of ``scales`` as a number, "small" meaning
    ``small_factor`` x :func:`small_scale` at the authors' logit scale; and that small scale."""
    s_small = small_scale(tasks, heads, L, t_end, sigma, authors_logit_scale(tasks))
    return [small_factor * s_small if s == "small" else float(s) for s in scales], s_small


def untied_tasks(omega0, mu0) -> list[int]:
    """Tasks whose two leading heads (by omega0 mu0) do not start from the same (omega0, mu0):
    on a tie (several heads at the same start, H > m) the winner is chosen by noise, not by
    theory, so only untied tasks have a predicted outcome."""
    om, mu = np.asarray(omega0), np.asarray(mu0)
    out = []
    for i in range(om.shape[1]):
        order = np.argsort(-(om[:, i] * mu[:, i]))
        if om.shape[0] == 1 or not (np.isclose(om[order[0], i], om[order[1], i], rtol=1e-12, atol=0)
                                    and np.isclose(mu[order[0], i], mu[order[1], i], rtol=1e-12, atol=0)):
            out.append(i)
    return out


def race_starts(s0, ratios, heads, m) -> list[dict]:
    """The race grid's starts: head 0 at omega0 = mu0 = s0 on every task, the other heads at
    (rho_omega s0, rho_mu s0); rho_mu over ``ratios`` (outer), rho_omega over ``ratios`` (inner).
    Each: {"rho_omega", "rho_mu", "omega0", "mu0"} ((H, m) arrays)."""
    out = []
    for rm in ratios:
        for rw in ratios:
            om0, mu0 = np.full((heads, m), float(s0)), np.full((heads, m), float(s0))
            om0[1:] *= rw
            mu0[1:] *= rm
            out.append({"rho_omega": rw, "rho_mu": rm, "omega0": om0, "mu0": mu0})
    return out


WINNER_RTOL, WINNER_ATOL = 1e-6, 1e-9
"""The expansion flow's tolerances where only its winners are read (:func:`ode_winners`):
1000x coarser than integrate_expansion_flow's defaults (1e-9, 1e-12), 2x cheaper."""

WINNER_GAP = 1e-3
"""The least relative gap (B_winner - B_runner_up) / B_winner at t_end with which the coarse
flow's winner stands: 1000 x WINNER_RTOL.  On the race grid and the default starts (L = 32) the
coarse and the default flow's gaps differ by < 1e-5 relative, and the smallest gap is 0.07."""


def ode_winners(omega0, mu0, tasks, L, sigma=0.0) -> list[int]:
    """theory.task_allocation.predicted_winners (rule "ode", factored metric, s = 1, its t_end:
    20 x the slowest warm-up race time, at least 60), integrated at WINNER_RTOL / WINNER_ATOL;
    a task whose two leading heads' B = mu omega at t_end lie within WINNER_GAP of each other
    (relative) is decided again at the default tolerances (the whole flow once more), so that
    the answer is predicted_winners' wherever the coarse flow's relative error in B stays below
    WINNER_GAP (error-controlled steps on a smooth flow of a few coordinates: observed 1e-5)."""
    tasks = check_tasks(tasks)
    omega0, mu0 = check_omega_mu(omega0, mu0, tasks)
    products = served_products(omega0, mu0, tasks, L, sigma, rtol=WINNER_RTOL, atol=WINNER_ATOL)
    B = np.sort(products, axis=0)
    if omega0.shape[0] > 1 and np.any(B[-1] - B[-2] <= WINNER_GAP * np.abs(B[-1])):
        return predicted_winners(omega0, mu0, tasks, L, sigma)
    return [int(h) for h in np.argmax(products, axis=0)]


def default_start_winners(tasks, s0, L, sigma=0.0):
    """Theory's ODE winners (:func:`ode_winners`) from the default decomposable start at scale s0
    (H = m), or None where the start lies outside the expansion's domain (2 omega0^2 >= 1: no
    prediction)."""
    omega0, mu0 = default_init(tasks, len(tasks), s0)
    if not expansion_valid(omega0, 1e-3):
        return None
    return ode_winners(omega0, mu0, tasks, L, sigma)
