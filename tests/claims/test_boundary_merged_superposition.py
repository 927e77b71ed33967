"""boundary-merged-superposition (claims/boundary_merged_superposition.py), on drawn configurations (m in 2..3,
r in 1..4 mixed, L in 16..32, sigma in {0, 0.5}): inside the domain (H = m) the merged run
superposes and both perturbed patterns are rejected; outside, the check refuses clearly."""
from __future__ import annotations

import pytest
from hypothesis import given, note, strategies as st

from claims import boundary_merged_superposition as claim
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
    # the superposition forms on a time scale ~ L (claims.boundary_merged_superposition's docstring): L <= 32, t = 40
    tcfg = TrainConfig(lr=0.1, time=40.0, batch=256, records=5)
    for outside in (ProblemConfig(tasks=tasks, heads=len(tasks) + 1, L=L), ProblemConfig(tasks=tasks[:1], heads=1, L=L)):
        with pytest.raises(ValueError, match="heads == m >= 2"):
            claim.merged_needs(outside, tcfg, 4000)
    cfg = ProblemConfig(tasks=tasks, heads=len(tasks), L=L, sigma=sigma)
    needs = claim.merged_needs(cfg, tcfg, 8000)
    results = Engine(seed=seed).run(needs)
    c = claim.check_merged_superposition(cfg, 8000, *(results[n] for n in needs))
    note(c.explain())
    print(f"[boundary merged] {c.name}: {c.measured}")
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


def test_reduced_flows_of_one_shape_are_one_program():
    """Reduced flows of one shape and batch asked together (by any claims) are computed as one
    program (numerics.train.train_reduced_many), each the flow computed alone to rounding, on
    its own need's prompt stream."""
    from numerics.engine import clear_memo, jobs_of, need
    tcfg = TrainConfig(lr=0.1, time=2.0, batch=64, records=3)
    needs = [need("reduced_flow", cfg=ProblemConfig(tasks=(1, 2), heads=2, L=16, sigma=s), tcfg=tcfg)
             for s in (0.0, 0.5)]
    assert [len(job) for job in jobs_of(needs)] == [2]
    together = Engine(seed=3).run(needs)
    clear_memo()
    for n in needs:
        alone = Engine(seed=3).run([n])[n]
        assert together[n].batched_runs == 2 and alone.train.seed == together[n].train.seed == n.seed(3)
        assert abs(alone.omega - together[n].omega).max() < 1e-12 and abs(alone.mu - together[n].mu).max() < 1e-12
