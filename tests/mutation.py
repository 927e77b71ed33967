"""Shared helper of the mutation suite (tests/test_mutants_*.py)."""
from __future__ import annotations

import sys


def patch_everywhere(monkeypatch, original, replacement) -> int:
    """Replace ``original`` by ``replacement`` in every loaded theory/numerics/claims module
    that binds it; returns how many bindings were patched."""
    n = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.split(".")[0] in ("theory", "numerics", "claims"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                monkeypatch.setattr(mod, attr, replacement)
                n += 1
    assert n, f"{original!r} is bound nowhere: the mutant would change nothing"
    return n
