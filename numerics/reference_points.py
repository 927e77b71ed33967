"""Theory's reference points at a configuration, each with how it was computed and its cost: the
allocated fixed point and the one-head optimum of the exact loss (theory.exact), the best
decomposable point of the same H, signs free (a Monte-Carlo search,
numerics.experiments.probes.best_decomposable), and centred linear attention
(theory.optimality).  What the audit of handed models (claims.audit) places a model among,
computed once per (configuration, H) -- or once for every H where a point does not depend on it
(:func:`references_for_heads`)."""
from __future__ import annotations

import time


SEARCH = {"random_starts": 2, "fit_elements": 2 ** 19, "eval_prompts": 4096}
"""The best decomposable point's search (numerics.experiments.probes.best_decomposable, its
defaults): at the authors' configuration (16, 17, 17), H = 3, L = 100 it took 7 CPU s with one random
start and 2^17 fit elements (se 1.6%); the default sizes give se ~1%."""

REFERENCES = ("allocated_fixed_point", "one_head_optimum", "best_decomposable", "linear_attention")
"""Theory's reference points (:func:`references`), in the ladder's order; ``skip`` names some to leave
out (each then says "not computed: skipped")."""


def references(tasks, heads: int, L: int, sigma: float, seed: int = 0, device: str = "cpu", search: dict = None,
               progress=lambda message, fraction: None, skip=()) -> dict:
    """Theory's reference points at (tasks, heads, L, sigma), each ``{"loss", ...}`` with how it was
    computed and its cost, or ``{"available": False, "reason": ...}`` (never left out silently):

    - ``allocated_fixed_point``: theory.exact.exact_fixed_point (quadrature; needs H >= m);
    - ``one_head_optimum``: theory.exact.single_head_optimum (at most 3 distinct block sizes);
    - ``best_decomposable``: numerics.experiments.probes.best_decomposable at the same H, signs free
      (a Monte-Carlo search: its loss bounds the optimum over D from above, with a standard error);
    - ``linear_attention``: theory.optimality.linear_attention_loss, centred linear attention with
      the optimal scale, which softmax heads reach only with H >= m + 1 (``reachable``).

    ``skip``: reference names not to compute (recorded as skipped)."""
    from numerics.experiments.probes import best_decomposable
    from theory import exact, optimality

    search = dict(SEARCH if search is None else search)
    tasks, m = tuple(tasks), len(tasks)
    out = {}

    def timed(name, fn):
        t0, c0 = time.perf_counter(), time.process_time()
        if name in skip:
            out[name] = {"available": False, "reason": "skipped (--skip)", "seconds": 0.0, "cpu_seconds": 0.0}
            return
        try:
            value = fn()
            value["available"] = True
        except (ValueError, RuntimeError, NotImplementedError, MemoryError, ArithmeticError) as exc:
            value = {"available": False, "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
        value["seconds"], value["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
        out[name] = value

    progress("theory: the allocated fixed point (quadrature)", 0.0)
    if heads < m and "allocated_fixed_point" not in skip:
        out["allocated_fixed_point"] = {"available": False, "seconds": 0.0, "cpu_seconds": 0.0,
                                        "reason": f"H = {heads} < m = {m}: no allocated point (some head must serve "
                                                  "several tasks)"}
    else:
        timed("allocated_fixed_point", lambda: {
            **(lambda fp: {"loss": fp["loss"], "error_estimate": fp["error_estimate"], "omega_star": fp["omega_star"],
                           "mu_star": fp["mu_star"], "loss_per_task": fp["loss_per_task"], "se": 0.0})(
                exact.exact_fixed_point(tasks, L, sigma)),
            "how": "theory.exact.exact_fixed_point: per task the one-head optimum of the exact loss (quadrature)"})
    progress("theory: the one-head optimum (quadrature)", 0.2)

    def one_head():
        r = exact.single_head_optimum(tasks, L, sigma)
        if not r["converged"]:
            raise RuntimeError(f"the one-head search did not converge (gradient norm {r['grad_norm']:.3g})")
        return {"loss": r["loss"], "error_estimate": r["error_estimate"], "omega": r["omega"], "mu": r["mu"],
                "se": 0.0, "how": "theory.exact.single_head_optimum: the best single head (quadrature, L-BFGS-B)"}
    timed("one_head_optimum", one_head)
    progress(f"theory: the best decomposable point with H = {heads} (Monte-Carlo search)", 0.6)

    def best():
        b = best_decomposable(tasks, heads, L, sigma, seed, device, random_starts=int(search["random_starts"]),
                              fit_elements=int(search["fit_elements"]), eval_prompts=int(search["eval_prompts"]))
        return {"loss": b.loss, "se": b.se, "n_eval": b.n_eval, "omega": [list(r) for r in b.omega],
                "mu": [list(r) for r in b.mu], "family": b.family, "error_estimate": 0.0,
                "how": f"numerics.experiments.probes.best_decomposable: signed search over (omega, mu) with H = {heads} "
                       f"(a search: an upper bound on the optimum over D), {search}"}
    timed("best_decomposable", best)

    def linear():
        return {"loss": optimality.linear_attention_loss(tasks, L, sigma), "se": 0.0, "error_estimate": 0.0,
                "reachable": bool(optimality.reaches_linear_attention(tasks, heads)),
                "scale": optimality.linear_attention_scale(tasks, L, sigma).tolist(),
                "how": "theory.optimality.linear_attention_loss: optimally scaled centred linear attention (exact), "
                       f"reached by softmax heads only with H >= m + 1 = {m + 1}"}
    timed("linear_attention", linear)
    progress("theory: done", 1.0)
    return out


H_INDEPENDENT = ("allocated_fixed_point", "one_head_optimum", "linear_attention")
"""Reference points that do not depend on H (given H >= m for the fixed point): per task the one-head
optimum of the exact loss, the best single head, and linear attention (its reachability does)."""


def references_for_heads(tasks, heads, L: int, sigma: float, seed: int = 0, device: str = "cpu",
                         search: dict = None, progress=lambda message, fraction: None, skip=()) -> dict:
    """{H: :func:`references`} for several head counts of one problem, each H-independent point
    (:data:`H_INDEPENDENT`) computed once and shared (its ``how`` says so); with one task the
    one-head optimum is the allocated fixed point (one task, one serving head: the same
    minimisation), taken from it rather than searched again."""
    from theory import optimality

    tasks, heads = tuple(tasks), sorted({int(h) for h in heads})
    out, shared = {}, None
    for k, H in enumerate(heads):
        report = (lambda msg, f, k=k: progress(f"H = {H}: {msg}", (k + f) / len(heads)))
        if shared is None:
            extra = ("one_head_optimum",) if len(tasks) == 1 else ()
            refs = references(tasks, H, L, sigma, seed, device, search, report, skip=tuple(skip) + extra)
            fixed = refs.get("allocated_fixed_point", {})
            if extra and "one_head_optimum" not in skip and fixed.get("available"):
                refs["one_head_optimum"] = {**{k_: fixed[k_] for k_ in ("loss", "error_estimate", "se")},
                                            "omega": list(fixed["omega_star"]), "mu": list(fixed["mu_star"]),
                                            "available": True, "seconds": 0.0, "cpu_seconds": 0.0,
                                            "how": "one task: the one-head optimum is the allocated fixed point "
                                                   "(theory.exact.exact_fixed_point, the same minimisation)"}
            if H >= len(tasks):
                shared = (H, refs)
        else:
            H0, first = shared
            refs = references(tasks, H, L, sigma, seed, device, search, report,
                              skip=tuple(set(skip) | set(H_INDEPENDENT)))
            for name in H_INDEPENDENT:
                if name in skip or not first[name].get("available"):
                    refs[name] = first[name] if name in skip else {**first[name]}
                    continue
                refs[name] = {**first[name], "seconds": 0.0, "cpu_seconds": 0.0,
                              "how": first[name]["how"] + f" (computed once, at H = {H0}: it does not depend on H)"}
            if refs["linear_attention"].get("available"):
                refs["linear_attention"]["reachable"] = bool(optimality.reaches_linear_attention(tasks, H))
        out[H] = refs
    return out

