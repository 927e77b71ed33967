"""theory: the paper's claims as code a reader can check (sympy, mpmath, numpy, scipy).

Nothing here imports torch or anything from ``numerics``; the numerics are held against
what this package predicts.  Modules, one per claim:

- ``block_structure``  claim 1: symmetry group, commutant (= decomposable set D), P_D
- ``reduced_ode``      claim 2: metric factors, large-L expansion of the reduced loss, flow
- ``three_phases``     claim 3: phase definition on any loss curve, predicted phase times
- ``task_allocation``  claim 4: predicted winners, allocated fixed point (mpmath)
- ``limiting_error``   claims 5-6: F, L*loss limits for multi/single head, gain
- ``optimality``       claim 7: best decomposable attention over signed (omega, mu)
- ``linear_attention`` the linear-attention bound every family minimum is held against
- ``formulas``         the derived formulas as printed by ``python -m reports.theory formulas``
- ``exact``            the exact finite-L loss of the decomposable model by quadrature (one
                       head, allocated heads), its gradient, flow and fixed point
- ``exact_pairs``      the cross moments of two heads sharing a task (general H = 2)

Submodules are imported lazily so that ``import theory`` stays cheap (the sympy
derivations are cached and only run on first use).
"""
from __future__ import annotations

import importlib

__all__ = [
    "block_structure",
    "reduced_ode",
    "three_phases",
    "task_allocation",
    "limiting_error",
    "optimality",
    "formulas",
    "exact",
    "exact_pairs",
]


def __getattr__(name):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'theory' has no attribute {name!r}")
