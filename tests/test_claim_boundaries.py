"""Boundaries of the paper's assumptions, recorded as results (claims/boundaries.py).

Each test runs a boundary check on a drawn or small configuration and asserts that the
recorded behaviour is the one SPEC.md / theory says happens there, and that the perturbed
expectation is rejected at the same tolerance."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, note, settings, strategies as st

from claims import boundaries as claim
from claims.common import Z_SE
from numerics.config import ProblemConfig
from numerics.train import TrainConfig

# training runs and many-L minimisations: half the profile's examples (default 2, thorough 12)
HEAVY = settings(max_examples=max(2, settings.default.max_examples // 2))


@given(r=st.sampled_from([8, 16, 24]), L=st.sampled_from([32, 64, 128]), seed=st.integers(0, 2 ** 16))
def test_saturation(device, r, L, seed):
    """Flag false exactly where 2 omega^2 >= 1 (expansion +inf, exact loss finite); the
    expansion's relative error grows with omega^2 d / log L."""
    c = claim.check_saturation(r, L, (0.05, 0.3, 0.6, 0.8), 0.0, n_eval=6000, seed=seed, device=device)
    note(c.explain())
    print(f"[boundary saturation] r={r} L={L}: {[(row['kappa'], row['relative_error']) for row in c.details['rows']]}")
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


def test_small_L_reproduces_spec_and_records_the_decay(device):
    """r = 3, theory's fixed point: at L = 128 the exact loss is SPEC.md's 0.56 for two tasks
    (0.28 per task) where the expansion says 0.60 (7% off), and the expansion's relative error
    decays with L (smaller at L = 512 than at 32 beyond Z standard errors).  Its rate is recorded, not asserted:
    measured about -0.4 over L = 64..512, slower than the O(1/L) that theory's remainder
    analysis gives for 6 omega*^2 < 1 (boundary-small-L reports that as a failing boundary)."""
    c = claim.check_small_L((3,), (32, 64, 128, 256, 512), 0.0, eval_elements=2 ** 21, seed=3, device=device)
    rows = {r["L"]: r for r in c.details["rows"]}
    print(f"[boundary small L] slope {c.measured:.3f} +- {c.details['slope_se']:.3f} (theory {c.predicted}); "
          f"relative errors {[(L, round(r['relative_error'], 4)) for L, r in rows.items()]}")
    at128 = rows[128]
    # SPEC gives two digits for two tasks: 0.56 +- 0.005 rounding, i.e. 0.28 +- 0.0025 per task
    assert abs(at128["exact"] - 0.28) <= 0.0025 + Z_SE * at128["exact_se"], c.explain()
    assert abs(at128["expansion"] - 0.30) <= 0.0025, c.explain()
    first, last = rows[32], rows[512]
    assert last["relative_error"] < first["relative_error"] - Z_SE * math.hypot(
        first["relative_error_se"], last["relative_error_se"]), c.explain()


@pytest.mark.thorough
@pytest.mark.xfail(reason="boundary result: the expansion's relative error at its fixed point decays more slowly "
                          "than the O(1/L) theory gives for 6 omega*^2 < 1 (r = 10: slope -0.46 over L = 64..512; "
                          "this test failed over L = 64..2048 too); reported by boundary-small-L", strict=False)
@given(r=st.sampled_from([8, 10, 12]), seed=st.integers(0, 2 ** 16))
def test_small_L_one_over_L_where_remainder_is_O_L2(device, r, seed):
    """Theory's O(1/L) (slope -1) where 6 omega*^2 < 1, over L = 64..2048."""
    c = claim.check_small_L((r,), (64, 128, 256, 512, 1024, 2048), 0.0, eval_elements=2 ** 24, seed=seed,
                            device=device)
    note(c.explain())
    assert c.details["remainder_O_L2"]
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


@HEAVY
@given(seed=st.integers(0, 2 ** 16))
def test_merged_finds_superposition(device, seed):
    """SPEC.md: trained merged, every head serves every task with signed weights, at a lower
    loss than the allocation the factored flow reaches from the same start."""
    cfg = ProblemConfig(tasks=(2, 2), heads=2, L=32, device=device)
    tcfg = TrainConfig(lr=0.1, time=20.0, batch=256, seed=seed, records=5)
    c = claim.check_merged_superposition(cfg, tcfg, n_eval=8000, seed=seed)
    note(c.explain())
    print(f"[boundary merged] {c.measured}")
    assert c.agrees, c.explain()
    assert c.discriminates, c.explain()


@HEAVY
@given(seed=st.integers(0, 2 ** 16), init_seed=st.integers(0, 20))
def test_fewer_heads(device, seed, init_seed):
    """H = 2 < m = 3: fewer heads cost loss -- the trained loss stays above the 3-head allocated
    limit (the perturbation "one head per task" is rejected) and does not go below the minimum
    over the task partition theory predicts.  Whether the run already equals that minimum is
    recorded, not asserted: at t = 40 a near-tied task is often still shared by two heads
    (second-largest |mu| up to 0.8 of the largest), a slow race the report shows."""
    cfg = ProblemConfig(tasks=(1, 1, 1), heads=2, L=32, init="random_decomposable", init_seed=init_seed,
                        device=device)
    tcfg = TrainConfig(lr=0.2, time=40.0, batch=256, seed=seed, records=5)
    c = claim.check_fewer_heads(cfg, tcfg, n_eval=8000, seed=seed)
    note(c.explain())
    print(f"[boundary H<m] {c.measured} vs {c.predicted}; clean partition: {c.details['is_partition']}")
    trained, partition = c.measured["loss_trained"], c.predicted["loss_partition_minimum"]
    assert trained >= partition - c.tolerance, c.explain()
    assert c.discriminates and trained > c.perturbations[0].details["predicted"], c.explain()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="fewer heads"):
        claim.check_fewer_heads(ProblemConfig(tasks=(1, 1), heads=2, L=8), TrainConfig(time=0.1, lr=0.1))
    with pytest.raises(ValueError, match="profile"):
        claim.run_saturation(profile="big")
