"""The derived formulas, printed from the sympy expressions the code evaluates
(``python -m reports.theory formulas``)."""
from __future__ import annotations

import sympy as sp

from .limiting_error import gain_limit_symbolic, limit_expressions
from .reduced_ode import derive_expansion, derive_metric_factors, expansion_formula
from .task_allocation import one_head_expressions


def all_formulas() -> dict[str, str]:
    D = derive_expansion()
    st = D.steps
    M = derive_metric_factors()
    F = limit_expressions()
    g = gain_limit_symbolic()
    one = one_head_expressions()
    out = {
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
    return out
