"""What every claim module shares, and nothing a single claim owns.

- ``base``: the result of a claim (:class:`ClaimResult`, headline rows, figures, findings) and
  the one verdict rule (:func:`judge`).
- ``spec``: a claim as data (:class:`ClaimSpec`: a plan of needs and a comparison), its runner
  and the one constructor of a result from its comparisons (:func:`build_result`).
- ``common``: the comparison every check returns (:class:`Comparison`, :func:`compare`), the
  tolerance policy (``Z_SE``), a tolerance built from named terms (:class:`Tolerance`, its why
  generated from them), resolving powers, headline rows and figure panels.
- ``trained``: a trained run's status and comparison (claims 5, 6 and boundary-left-allocation).
- ``phase_checks``: phase times of a (full model, reduced flow) pair; a share of seeds.

``claims.core.NAME`` reads NAME from the module that defines it (loaded on first use)."""
from __future__ import annotations

import importlib

_MODULES = ("base", "spec", "common", "trained", "phase_checks")


def __getattr__(name: str):
    if name in _MODULES:           # ``from claims.core import trained``: the submodule, nothing else loaded
        return importlib.import_module(f"{__name__}.{name}")
    for module in _MODULES:
        found = getattr(importlib.import_module(f"{__name__}.{module}"), name, None)
        if found is not None:
            return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
