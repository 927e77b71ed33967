"""boundary-merged-superposition (claims/boundaries.py), on drawn configurations (m in 2..3,
r in 1..4 mixed, L in 16..32, sigma in {0, 0.5}): inside the domain (H = m) the merged run
superposes and both perturbed patterns are rejected; outside, the check refuses clearly."""
from __future__ import annotations

import pytest
from hypothesis import given, note, strategies as st

from claims import boundaries as claim
from numerics.config import ProblemConfig
from numerics.engine import Engine
from numerics.train import TrainConfig
from training_draws import HEAVY, sigma_st


@HEAVY
@given(tasks=st.lists(st.integers(1, 4), min_size=2, max_size=3).map(tuple), sigma=sigma_st, L=st.integers(16, 32),
       seed=st.integers(0, 2 ** 10))
def test_merged_superposition(tasks, sigma, L, seed):
    """Inside the domain (H = m >= 2): merged superposed, factored allocated, merged lower;
    both perturbed patterns rejected.  Outside (H = m + 1, m = 1): the check refuses clearly."""
    # the superposition forms on a time scale ~ L (claims.boundaries.SUPERPOSITION_SHARE): L <= 32, t = 40
    tcfg = TrainConfig(lr=0.1, time=40.0, batch=256, seed=seed, records=5)
    for outside in (ProblemConfig(tasks=tasks, heads=len(tasks) + 1, L=L), ProblemConfig(tasks=tasks[:1], heads=1, L=L)):
        with pytest.raises(ValueError, match="heads == m >= 2"):
            claim.merged_needs(outside, tcfg, 4000, seed)
    cfg = ProblemConfig(tasks=tasks, heads=len(tasks), L=L, sigma=sigma)
    needs = claim.merged_needs(cfg, tcfg, 8000, seed)
    results = Engine(seed=seed).run(needs)
    c = claim.check_merged_superposition(cfg, tcfg, 8000, *(results[n] for n in needs))
    note(c.explain())
    print(f"[boundary merged] {c.name}: {c.measured}")
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()
