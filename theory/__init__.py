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
- ``_validate``        argument checks, the range of what theory returns, and the
                       linear-attention bound every family minimum is held against

:func:`all_formulas` prints the derived formulas (``python -m reports.theory formulas``).
"""
from __future__ import annotations


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
