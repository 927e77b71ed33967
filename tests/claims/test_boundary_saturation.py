"""boundary-saturation (claims/boundary_saturation.py), on drawn configurations (r in 1..4,
L in 16..512, sigma in {0, 0.5}): the expansion is finite exactly below theory's edge and the
exact loss everywhere; the edge at 1/sqrt 6 is rejected."""
from __future__ import annotations

import math

from hypothesis import given, note, strategies as st

from claims import boundary_saturation as limits
from numerics.engine import Engine
from training_draws import sigma_st


@given(r=st.integers(1, 4), L=st.integers(16, 512), sigma=sigma_st, seed=st.integers(0, 2 ** 16))
def test_saturation(r, L, sigma, seed):
    """The expansion is finite exactly below theory's edge (omega = 1/sqrt 2) and +inf beyond,
    the exact loss finite everywhere, and the expansion's error grows toward the edge; the edge
    at 1/sqrt 6 is rejected."""
    scan = limits.saturation_need(r, L, (0.05, 0.45, 0.65, 0.8), sigma, 4000)
    c = limits.check_saturation(r, L, sigma, Engine(seed=seed).run([scan])[scan])
    note(c.explain())
    assert abs(c.details["edge"] - 1 / math.sqrt(2)) < 1e-12, c.explain()
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()
