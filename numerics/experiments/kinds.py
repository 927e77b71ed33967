"""The kinds of need the claims plan with (``numerics.engine``): how each is computed, priced
and stored.  Each run function takes the need's parameters and its ``seed`` (derived by the
engine from the need's identity) and returns a frozen result; each cost function prices the
same parameters in CPU seconds through ``numerics.cost``."""
from __future__ import annotations

from numerics import cost, exact_reduced
from numerics.engine import kind
from numerics.experiments import converged as conv
from numerics.experiments import probes

# ---------------------------------------------------------------------------------------
# theory values: pure functions of their arguments, priced by numerics.cost.THEORY_SECONDS
# ---------------------------------------------------------------------------------------


def _theory_functions() -> dict:
    from theory import exact, limiting_error
    return {"exact_fixed_point": exact.exact_fixed_point, "finite_L_gain": exact.finite_L_gain,
            "single_head_optimum": exact.single_head_optimum, "limit_multi": limiting_error.limit_multi,
            "gain": limiting_error.gain}


def _theory_cost(fn: str, args: tuple) -> float:
    return cost.theory_seconds(fn, tasks=args[0]) if fn in cost.THEORY_SECONDS else 0.1


@kind("theory", cost=_theory_cost)
def theory_value(fn: str, args: tuple, seed: int):
    """``theory.<module>.<fn>(*args)`` (no seed: theory is deterministic)."""
    return _theory_functions()[fn](*args)


# ---------------------------------------------------------------------------------------
# a full model trained to its converged loss (claims 5, 6, boundary-left-allocation; sweep model "converged")
# ---------------------------------------------------------------------------------------


@kind("converged", cost=lambda cfg, schedule: conv.converged_seconds(cfg, schedule),
      point=lambda cfg, schedule, seed: conv.converged_point(cfg, schedule, seed),
      normalise=conv._normalise_point, load=conv.from_dict)
def converged(cfg, schedule, seed: int):
    return conv.train_converged(cfg, schedule, seed)


def _continuation_cost(cfg, run, schedule, best) -> float:
    c = schedule
    return (round(c.time / c.lr) * cost.reduced_step_seconds(cfg.tasks, cfg.heads, cfg.L, c.batch(cfg.L),
                                                            estimator="marginal")
            + cost.marginal_seconds(cfg.tasks, cfg.heads, cfg.L, c.eval_prompts, points=c.records))


@kind("continue_on_D", cost=_continuation_cost)
def continue_on_D(cfg, run, schedule, best, seed: int):
    """A trained run that left the allocated set followed on D (``converged.continue_on_D``),
    converged for a comparison with the best decomposable point ``best`` (its standard error)."""
    return conv._continue_on_D(cfg, run, int(seed), schedule, float(best.se))


# ---------------------------------------------------------------------------------------
# Monte-Carlo minima of the exact reduced loss
# ---------------------------------------------------------------------------------------


def _minima_cost(tasks, sigma, L, elements, fit_elements, single, device) -> float:
    return exact_reduced.minima_seconds(tasks, L, max(2000, elements // L), fit_elements, single=single)


@kind("reduced_minima", cost=_minima_cost)
def reduced_minima(tasks, sigma: float, L: int, elements: int, fit_elements: int, single: bool, device: str,
                   seed: int) -> tuple:
    """The Monte-Carlo minima of the exact reduced loss at L over the allocated family (fitted at
    ``seed``) and, with ``single``, the one-head family (``seed`` + 1), measured on one sample of
    max(2000, elements // L) fresh prompts (the next seed)."""
    minima = [exact_reduced.allocated_minimum(tasks, L, sigma, seed, device, fit_elements)]
    if single:
        minima.append(exact_reduced.single_head_minimum(tasks, L, sigma, seed + 1, device, fit_elements))
    return tuple(exact_reduced.measure(minima, max(2000, elements // L), seed + len(minima), device))


def _best_cost(tasks, heads, L, sigma, device, random_starts, fit_elements, eval_prompts) -> float:
    n_fit = exact_reduced.fit_sample_size(heads, L, fit_elements)
    return (cost.fit_seconds(tasks, heads, L, n_fit, starts=2 + random_starts)
            + cost.marginal_seconds(tasks, heads, L, eval_prompts, points=3 + random_starts))


@kind("best_decomposable", cost=_best_cost)
def best_decomposable(tasks, heads: int, L: int, sigma: float, device: str, random_starts: int, fit_elements: int,
                      eval_prompts: int, seed: int):
    return probes.best_decomposable(tasks, heads, L, sigma, seed, device, random_starts=random_starts,
                                    fit_elements=fit_elements, eval_prompts=eval_prompts)
