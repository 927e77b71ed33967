"""boundary-fewer-heads (claims/boundary_fewer_heads.py), on drawn configurations (m in 2..3, r in 1..2,
H < m, L in 32..64, sigma in {0, 0.5}): the trained loss against the partition minimum and
theory's winners, or, where the race is slow, the winners recorded and the cost of fewer heads."""
from __future__ import annotations

from hypothesis import example, given, note, strategies as st

from claims import boundary_fewer_heads as claim
from numerics.config import ProblemConfig
from numerics.engine import Engine
from numerics.train import TrainConfig
from training_draws import HEAVY, sigma_st


@HEAVY
@given(tasks=st.lists(st.integers(1, 2), min_size=2, max_size=3).map(tuple), fewer=st.integers(1, 2),
       sigma=sigma_st, L=st.integers(32, 64), seed=st.integers(0, 2 ** 10), init_seed=st.integers(0, 20))
@example(tasks=(1, 2, 1), fewer=1, sigma=0.5, L=48, seed=1, init_seed=6)    # H = 2 < m = 3 always runs
def test_fewer_heads(tasks, fewer, sigma, L, seed, init_seed):
    """H < m.  In the domain (theory's flow decides every task by the run's end) the trained
    loss equals the partition minimum within tolerance (two-sided) and the winners are
    theory's; permuted winners and 'one head per task' are rejected.  Outside (a slow race):
    the winners are recorded, and the trained loss stays above the m-head allocated limit
    beyond the tolerance (fewer heads cost loss).  Drawn r <= 2, L >= 32: the short runs here
    (t = 40, lr 0.2) have not converged at r = 4 (measured: trained 1.75 vs partition minimum
    1.18 at tasks (4, 2, 1), L = 63), and at L = 16 the expansion flow that predicts the
    winners is 10-16% off the exact loss (measured: tasks (1, 4, 1) ended on other heads);
    both recorded in docs/claims_5_7.md."""
    heads = max(1, len(tasks) - fewer)
    cfg = ProblemConfig(tasks=tasks, heads=heads, L=L, sigma=sigma, init="random_decomposable", init_seed=init_seed)
    tcfg = TrainConfig(lr=0.2, time=40.0, batch=256, records=9)
    needs = claim.fewer_needs(cfg, tcfg, 6000)
    results = Engine(seed=seed).run(needs)
    c = claim.check_fewer_heads(cfg, 6000, *(results[n] for n in needs))
    note(c.explain())
    print(f"[boundary H<m] {c.name}: {c.measured} vs {c.predicted}; judged winners: {c.details['winners_judged']}")
    alloc = c.perturbations[0].details["predicted"]
    assert c.measured["loss_trained"] - alloc > c.tolerance, c.explain()
    if c.details["winners_judged"]:
        assert c.agrees, c.explain()
        assert c.discriminates, c.explain()
    else:
        assert c.perturbations[0].rejected, c.explain()
