"""The need kind ``theory`` (``numerics.engine``): a value of theory's, computed once per build
and priced by ``numerics.cost.THEORY_SECONDS``.  The other kinds live beside the experiment
they run (``numerics.engine.KIND_MODULES``)."""
from __future__ import annotations

from numerics import cost
from numerics.engine import kind

def _theory_functions() -> dict:
    from theory import exact, expansion_gap, limiting_error, optimality, reduced_ode, task_allocation
    return {"exact_fixed_point": exact.exact_fixed_point, "finite_L_gain": exact.finite_L_gain,
            "single_head_optimum": exact.single_head_optimum, "limit_multi": limiting_error.limit_multi,
            "gain": limiting_error.gain,
            "exact_flow": exact.exact_flow, "expansion_flow": reduced_ode.integrate_expansion_flow,
            "constant_bracket": optimality.constant_bracket, "gap_ladder": expansion_gap.gap_ladder,
            "predicted_winners": task_allocation.predicted_winners}


CALL_SECONDS = {
    "constant_bracket": lambda tasks, *_: cost.theory_seconds("exact_fixed_point", tasks=tasks),   # its quadrature
    "gap_ladder": lambda r, Ls, *_: 0.3 * len(Ls),      # theory.exact's loss per L (0.02-0.7 s measured)
    "predicted_winners": lambda *_: 0.5,                # an expansion flow to the race's end (0.4 s measured)
}
"""CPU seconds of the theory values not in ``numerics.cost.THEORY_SECONDS``, from their arguments."""


def _theory_cost(fn: str, args: tuple) -> float:
    if fn in CALL_SECONDS:
        return CALL_SECONDS[fn](*args)
    return cost.theory_seconds(fn, tasks=args[0]) if fn in cost.THEORY_SECONDS else 0.1


@kind("theory", cost=_theory_cost, shared=False)
def theory_value(fn: str, args: tuple, seed: int):
    """``theory.<module>.<fn>(*args)`` (no seed: theory is deterministic)."""
    return _theory_functions()[fn](*args)
