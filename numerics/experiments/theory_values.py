"""The need kind ``theory`` (``numerics.engine``): a value of theory's, computed once per build
and priced by ``numerics.cost.THEORY_SECONDS``.  The other kinds live beside the experiment
they run (``numerics.engine.KIND_MODULES``)."""
from __future__ import annotations

from numerics import cost
from numerics.engine import kind

def _theory_functions() -> dict:
    from theory import exact, limiting_error, reduced_ode
    return {"exact_fixed_point": exact.exact_fixed_point, "finite_L_gain": exact.finite_L_gain,
            "single_head_optimum": exact.single_head_optimum, "limit_multi": limiting_error.limit_multi,
            "gain": limiting_error.gain,
            "exact_flow": exact.exact_flow, "expansion_flow": reduced_ode.integrate_expansion_flow}


def _theory_cost(fn: str, args: tuple) -> float:
    return cost.theory_seconds(fn, tasks=args[0]) if fn in cost.THEORY_SECONDS else 0.1


@kind("theory", cost=_theory_cost, shared=False)
def theory_value(fn: str, args: tuple, seed: int):
    """``theory.<module>.<fn>(*args)`` (no seed: theory is deterministic)."""
    return _theory_functions()[fn](*args)
