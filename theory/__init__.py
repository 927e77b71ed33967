"""theory: the paper's claims as code a reader can check (sympy, mpmath, numpy, scipy).

Nothing here imports torch or anything from ``numerics``; the numerics are held against
what this package predicts.  Modules, one per claim:

- ``block_structure``  claim 1: the finite symmetry group whose fixed set is D, the off-D parts
- ``reduced_ode``      claim 2: the coordinates (omega, mu) of D and the projection P_D, metric
                       factors, large-L expansion of the reduced loss and where it holds, flows
- ``three_phases``     claim 3: phase definition on any loss curve, predicted phase times
- ``task_allocation``  claim 4: predicted winners, allocated fixed point (mpmath); where the
                       expansion stops at the allocated point (gap ladder)
- ``limiting_error``   claims 5-6: F, L*loss limits for multi/single head, gain
- ``optimality``       claim 7: best decomposable attention over signed (omega, mu)
- ``initialisation``   the initialisation boundary: off-D residual split, unbalanced metric,
                       warm-up norm bound, start sets and their ODE winners
- ``saddle``           the saddle: off-task slope, growth rate, escape time
- ``exact``            the exact finite-L loss of the decomposable model by quadrature (one
                       head, allocated heads, two heads sharing a task), its gradient, flow,
                       fixed point and one-head optima

The package module itself holds what every module shares: the argument checks (clear errors
that say what is wrong and how to fix it) and the one range check of what theory returns
(:func:`in_range`, :func:`check_loss`, :func:`check_minimum`: a loss, minimum, rate or time that
cannot be is refused, never returned).  A family minimum is held against the linear-attention
bound theory states: the loss of optimally scaled centred linear attention (one step of gradient
descent) at finite L and its limit L * loss (:func:`linear_attention_loss`,
:func:`linear_attention_limit`), and where that bound holds (:func:`large_L`).  It imports numpy
only, so that callers that never import sympy can check, and no submodule at its top (each
module imports these with ``from . import ...``).  (The command lines' options, files and
outputs are numerics.io's.)

:func:`all_formulas` prints the derived formulas (``python -m reports.theory formulas``).
"""
from __future__ import annotations

import math
import numbers

import numpy as np


def check_tasks(tasks) -> tuple[int, ...]:
    """Return ``tasks`` as a tuple of positive ints, or raise ValueError/TypeError."""
    if isinstance(tasks, (str, bytes)) or not hasattr(tasks, "__iter__"):
        raise TypeError(f"tasks must be a sequence of positive integers (block sizes r_i), got {tasks!r}")
    out = []
    for r in tasks:
        if isinstance(r, bool) or not isinstance(r, numbers.Integral):
            if not isinstance(r, bool) and isinstance(r, numbers.Real) and float(r).is_integer():
                r = int(r)
            else:
                raise TypeError(f"tasks must contain positive integers (block sizes r_i), got {r!r} in {tuple(tasks)!r}")
        if r < 1:
            raise ValueError(f"every block size r_i must be >= 1, got {tuple(tasks)!r}")
        out.append(int(r))
    if not out:
        raise ValueError("tasks must contain at least one block size (m >= 1), got an empty sequence")
    return tuple(out)


def check_positive_int(name: str, value) -> int:
    """``value`` as a positive int (an integral float such as 3.0 is accepted; a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(float(value))
                and float(value).is_integer()):
            value = int(value)
        else:
            raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def check_L(L) -> float:
    """Context length: a positive finite number (the expansion accepts non-integer L)."""
    if isinstance(L, bool) or not isinstance(L, numbers.Real):
        raise TypeError(f"L (context length) must be a positive number, got {L!r}")
    if not math.isfinite(float(L)) or L <= 0:
        raise ValueError(f"L (context length) must be positive and finite, got {L}")
    return float(L)


def check_positive(name: str, value) -> float:
    """``value`` as a positive finite float."""
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return v


def check_sigma(sigma) -> float:
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real):
        raise TypeError(f"sigma (label noise std) must be a number >= 0, got {sigma!r}")
    if not math.isfinite(float(sigma)) or sigma < 0:
        raise ValueError(f"sigma (label noise std) must be finite and >= 0, got {sigma}")
    return float(sigma)


def check_finite_array(name: str, a, shape=None, ndim=None) -> np.ndarray:
    try:
        arr = np.asarray(a, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a numeric array, got {type(a).__name__}: {exc}") from None
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    if shape is not None and arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite entries; pass finite values")
    return arr


def check_omega_mu(omega, mu, tasks) -> tuple[np.ndarray, np.ndarray]:
    """omega, mu as (H, m) float arrays matching tasks (a 1-D array is one head)."""
    m = len(tasks)
    om = check_finite_array("omega", omega)
    mu_ = check_finite_array("mu", mu)
    if om.ndim == 1:
        om = om[None, :]
    if mu_.ndim == 1:
        mu_ = mu_[None, :]
    if om.ndim != 2 or om.shape[1] != m:
        raise ValueError(f"omega must have shape (H, m) with m = {m} tasks, got {om.shape}")
    if mu_.shape != om.shape:
        raise ValueError(f"mu must have the same shape as omega {om.shape}, got {mu_.shape}")
    if om.shape[0] < 1:
        raise ValueError("omega must have at least one head (H >= 1)")
    return om, mu_


# ---------------------------------------------------------------------------------------
# the range of what theory returns: every loss, minimum, rate and time passes here
# ---------------------------------------------------------------------------------------

def in_range(where: str, what: str, value, low=-math.inf, high=math.inf, why: str = "", *,
             infinite_ok: bool = False, nan_ok: bool = False):
    """``value`` (a number or an array) unchanged when every entry lies in [low, high], else
    ValueError naming the function (``where``), the quantity, the offending values and ``why``
    the range is what it is.  NaN is refused unless ``nan_ok`` (a documented "not defined
    here" entry); an infinite entry unless ``infinite_ok`` (a documented +inf: "outside the
    domain", "never"), and then only at an end of the range it lies in."""
    arr = np.asarray(value, dtype=float)
    nan = np.isnan(arr)
    bad = (nan & (not nan_ok)) | (~nan & ((arr < low) | (arr > high)))
    if not infinite_ok:
        bad |= np.isinf(arr)
    if np.any(bad):
        shown = arr[bad].ravel()[:4].tolist() if arr.ndim else float(arr)
        span = f"[{low:.6g}, {high:.6g}]" + ("" if infinite_ok else ", finite")
        raise ValueError(f"{where}: {what} = {shown} cannot be: it must lie in {span}"
                         + (f" ({why})" if why else ""))
    return value


LOSS_RANGE = "a mean squared error is >= 0, less the stated error of its computation"


def check_loss(where: str, value, error=0.0, **kw):
    """A loss (mean squared error, summed over tasks): >= -``error`` (its stated computation
    error); +inf only where the caller passes ``infinite_ok`` (outside a domain)."""
    return in_range(where, "loss", value, -float(error), math.inf, LOSS_RANGE, **kw)


# ---------------------------------------------------------------------------------------
# the linear-attention bound every family minimum is held against (numpy only)
# ---------------------------------------------------------------------------------------

def linear_attention_limit(tasks, sigma=0.0) -> float:
    """lim L * loss of optimally scaled linear attention (one GD step), summed over tasks:
    sum_i r_i (r_i + 1 + sigma^2).  Per task, y_hat = (1/L) sum_l y_l x_l^T q has
    E|x x^T g + x eps - g|^2 = r(r+1) + r sigma^2 per token (Gaussian fourth moments:
    E|x x^T g|^2 = (r + 2)|g|^2, minus |g|^2 from the mean), divided by L."""
    tasks, sigma = check_tasks(tasks), check_sigma(sigma)
    return check_loss("theory.linear_attention_limit",
                      float(sum(r * (r + 1 + sigma ** 2) for r in tasks)))


def linear_attention_loss(tasks, L, sigma=0.0) -> float:
    """Exact finite-L loss of optimally scaled *centred* linear attention, summed over tasks:

        sum_i r_i (r_i + 1 + sigma^2) / (L + r_i + sigma^2).

    Centred (y_hat_i = c sum_l y_li (x_li - xbar_i)^T q_i) because that is what softmax heads
    reach: with omega -> 0, softmax_l(omega s_l) = (1 + omega (s_l - sbar))/L + O(omega^2), and
    heads whose mu sum to zero keep only the centred part.  Per task, with S = sum_l (x_l - xbar)
    (x_l - xbar)^T ~ Wishart(n = L - 1, I_r): E S^2 = n (n + r + 1) I, E tr S = n r, so
    y_hat = a S g + a sum_l eps_l (x_l - xbar) has loss r [a^2 n (n + r + 1 + sigma^2) - 2 a n + 1],
    minimal at a = 1/(n + r + 1 + sigma^2) with value r (r + 1 + sigma^2)/(n + r + 1 + sigma^2).
    L * loss -> :func:`linear_attention_limit`."""
    tasks, L, sigma = check_tasks(tasks), check_L(L), check_sigma(sigma)
    if L < 2:
        raise ValueError(f"centred linear attention needs L >= 2 context tokens, got L={L}")
    return check_loss("theory.linear_attention_loss",
                      float(sum(r * (r + 1 + sigma ** 2) / (L + r + sigma ** 2) for r in tasks)))


def large_L(tasks, L, sigma=0.0) -> bool:
    """Where docs/model.md's large-L account holds (``optimality.constant_domain``, and the linear-
    attention bound of :func:`check_minimum`): linear attention's own relative
    correction (max r_i + 1 + sigma^2)/L <= 1/8."""
    return bool(L >= 8 * (max(tasks) + 1 + sigma ** 2))


def check_minimum(where: str, value, tasks, L=None, sigma=0.0, error=0.0) -> float:
    """A minimum of the loss over a family of softmax attention models, or its limit L * loss
    (``L`` None): a loss, and not below the linear-attention bound of the same problem.

    - L -> inf: L * loss >= sum_i r_i (r_i + 1 + sigma^2) (``linear_attention_limit``),
      a theorem of the expansion: for each task, L * loss -> mu^T X_i mu with B_i = 1, and X_i
      is a power series in the tilts c_hkj = omega_hj omega_kj with nonnegative coefficients,
      (r_i + sigma^2) at order 0 and r_i (r_i + 1 + sigma^2) on c_hki, so
      mu^T X_i mu >= r_i (r_i + 1 + sigma^2) B_i^2 (a sum of squares, each term dropped but one).
    - finite L inside the large-L domain L >= 8 (max r_i + 1 + sigma^2)
      (``large_L``): >= linear_attention_loss (1 - (max r_i + 1 + sigma^2)/L)
      - error: docs/model.md's large-L account (``optimality.constant_bracket``) that centred
      linear attention is the best softmax attention, less the O(1/L^2) remainder of the
      expansion, a relative (r + 1 + sigma^2)/L of linear attention's loss.
    - smaller L: the loss range only (theory states no bound there)."""
    check_loss(where, value, error)
    if L is None:
        return in_range(where, "L * loss (L -> inf)", value, linear_attention_limit(tasks, sigma) * (1 - 1e-12),
                        math.inf, "the limit of every family is >= the linear-attention limit sum r(r+1+sigma^2)")
    if not large_L(tasks, L, sigma):
        return value
    slack = (max(tasks) + 1 + sigma ** 2) / L
    return in_range(where, "minimum", value, linear_attention_loss(tasks, L, sigma) * (1 - slack) - float(error),
                    math.inf, f"centred linear attention is the best softmax attention at large L, up to the "
                              f"expansion's relative {slack:.3g}")


def all_formulas() -> dict[str, str]:
    """The derived formulas, printed from the sympy expressions the code evaluates
    (``python -m reports.theory formulas``)."""
    # here, not at the top: every claim module (sympy derivations included) is needed only to
    # print them all, and ``import theory.X`` must not load the others
    import sympy as sp

    from .limiting_error import gain_limit_symbolic, limit_expressions
    from .reduced_ode import derive_expansion, derive_metric_factors, expansion_formula
    from .task_allocation import one_head_expressions

    D = derive_expansion()
    st = D.steps
    M = derive_metric_factors()
    F = limit_expressions()
    g = gain_limit_symbolic()
    one = one_head_expressions()
    return {
        "token MGF given (q, g)": f"E exp(theta^T X) = {sp.sstr(st['mgf_token'])},  "
                                  "X = (u_i, u_j, z, eps), u_b = <x_b, q_b>, z = g^T x_i",
        "E_g exp(alpha t + beta |g|^2) given q": sp.sstr(st["mgf_g"]) + "   (t = g^T q_i, a_i = |q_i|^2)",
        "one coordinate": f"E exp(c z^2) = {sp.sstr(st['one_coordinate'])}",
        "delta method, given (q, g)": (
            f"E R_h = {sp.sstr(st['conditional_mean'])} + (1/L) * ({sp.sstr(st['conditional_bias'])})\n"
            f"Cov(R_h, R_k) = (1/L) * ({sp.sstr(st['conditional_cov'])})"),
        "expansion": expansion_formula(),
        "metric factors (derived, per block size r)": "\n".join(
            [f"r={r}: merged f_omega = {sp.sstr(v['merged'])}, factored f_omega = {sp.sstr(v['factored'])}"
             for r, v in M["omega"].items()]
            + [f"merged f_mu = {sp.sstr(M['mu']['merged'])}, factored f_mu = {sp.sstr(M['mu']['factored'])} "
               "(= 2|mu|), off-diagonal U_Y velocity at a balanced point = "
               f"{sp.sstr(M['mu']['factored_offdiag_velocity'])}",
               "general: merged (f_omega, f_mu) = (1/r_i, 1); factored = (2|omega|/(s r_i), 2|mu|) -- as docs/model.md"]),
        "one allocated head, finite L": f"l(omega, mu) = {sp.sstr(one['loss'])}",
        "limit F": f"F(w; r, D, s2) = {sp.sstr(F['F'])}   (L * loss -> sum_i min_w F(w; r_i, D_i, s2))",
        "single head limit": "G(w) = prod_j (1-2 w_j)^(-r_j/2) * sum_i (r_i + s2 + w_i r_i/(1-2 w_i))/w_i",
        "gain limit (r -> oo, m equal blocks)": (
            f"F(x/r)/(r(r+s2)) -> {sp.sstr(g['multi_profile'])}, min at x = {g['x_multi']}: {g['multi_min']};  "
            f"one head -> {sp.sstr(g['single_profile'])}, min at x = {g['x_single']}: {g['single_min']};  "
            f"gain -> {g['gain_limit']}"),
        "linear attention limit": "L * loss -> sum_i r_i (r_i + 1 + sigma^2)",
        "domain": "expansion finite iff 2 omega^2 < 1 (valid); O(L^-2) remainder finite iff 6 omega^2 < 1 (reliable)",
    }
