"""The linear-attention bound theory states: the loss of optimally scaled centred linear
attention (one step of gradient descent) at finite L and its limit L * loss, and where that
bound holds.  Numpy only (:func:`check_minimum` holds every family minimum against it,
also for callers that never import sympy); re-exported by ``theory.optimality``."""
from __future__ import annotations

import math

from ._validate import check_L, check_loss, check_sigma, check_tasks, in_range


def linear_attention_limit(tasks, sigma=0.0) -> float:
    """lim L * loss of optimally scaled linear attention (one GD step), summed over tasks:
    sum_i r_i (r_i + 1 + sigma^2).  Per task, y_hat = (1/L) sum_l y_l x_l^T q has
    E|x x^T g + x eps - g|^2 = r(r+1) + r sigma^2 per token (Gaussian fourth moments:
    E|x x^T g|^2 = (r + 2)|g|^2, minus |g|^2 from the mean), divided by L."""
    tasks = check_tasks(tasks)
    sigma = check_sigma(sigma)
    return check_loss("theory.linear_attention.linear_attention_limit",
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
    tasks = check_tasks(tasks)
    L, sigma = check_L(L), check_sigma(sigma)
    if L < 2:
        raise ValueError(f"centred linear attention needs L >= 2 context tokens, got L={L}")
    return check_loss("theory.linear_attention.linear_attention_loss",
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
