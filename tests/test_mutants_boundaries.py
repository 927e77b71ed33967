"""Mutation suite of the boundaries: each test breaks theory/ or numerics/ on purpose (pytest's
monkeypatch) and asserts that the boundary owning that piece returns a non-pass verdict at a
small dedicated profile.  Run: ``python -m pytest -q -s --mutants -m mutants tests/test_mutants_boundaries.py``
(each test prints the mutant's name and the verdict it got)."""
from __future__ import annotations

import numpy as np
import pytest

import numerics.exact_reduced as exact_reduced
import theory.reduced_ode as reduced_ode
import theory.task_allocation as task_allocation
from claims import boundaries, expansion_limits

pytestmark = pytest.mark.mutants

# dedicated small profiles (the quick ones with fewer blocks / shorter runs)
SMALL_L = expansion_limits.SmallLProfile(blocks=(4,), L_exact=(4096, 16384, 65536), L_mc=(64,), mc_elements=2 ** 20)
SATURATION = expansion_limits.SaturationProfile(omegas=(0.1, 0.3, 0.5, 0.6, 0.75, 0.9), n_eval=6000)
FEWER = boundaries.FewerHeadsProfile(tasks=(1, 1, 1), L=32, init_seed=6, lr=0.2, time=40.0, batch=256, n_eval=8000)


def _run(monkeypatch, table: dict, runner, profile):
    monkeypatch.setitem(table, "tiny", profile)
    return runner(profile="tiny")


def _report(name: str, result) -> None:
    print(f"[mutant] {name}: {result.id} -> {result.verdict}")
    for row in result.headline:
        print(f"    {row}")


def _scaled_pair_kernel(factor: float):
    original = reduced_ode._kernels()
    kernels = dict(original)
    kernels["pair_kernel"] = lambda c, r, s2: factor * original["pair_kernel"](c, r, s2)
    kernels["d_pair_kernel"] = lambda c, r, s2: factor * original["d_pair_kernel"](c, r, s2)
    return lambda: kernels


def test_pair_kernel_scaled(monkeypatch):
    """The expansion's pair kernel (its O(1/L) coefficient) x 1.25 -> boundary-small-L."""
    monkeypatch.setattr(reduced_ode, "_kernels", _scaled_pair_kernel(1.25))
    res = _run(monkeypatch, expansion_limits.SMALL_L, expansion_limits.run_small_L, SMALL_L)
    _report("pair kernel x 1.25", res)
    assert res.verdict != "located", res.details


def test_winners_permuted(monkeypatch):
    """Theory's predicted winners permuted (head h -> h + 1 mod H) -> boundary-fewer-heads."""
    original = task_allocation.predicted_winners

    def permuted(omega0, mu0, *args, **kwargs):
        H = np.shape(omega0)[0]
        return [(h + 1) % H for h in original(omega0, mu0, *args, **kwargs)]

    monkeypatch.setattr(task_allocation, "predicted_winners", permuted)
    res = _run(monkeypatch, boundaries.FEWER, boundaries.run_fewer_heads, FEWER)
    _report("winners permuted", res)
    assert res.verdict != "located", res.details


def test_validity_edge_moved_out(monkeypatch):
    """Theory's validity threshold of the expansion wrong: omega^2 < 1 instead of 2 omega^2 < 1
    (the edge's size doubled) -> boundary-saturation."""
    monkeypatch.setattr(reduced_ode, "expansion_valid",
                        lambda omega, margin=0.0: bool(np.all(np.asarray(omega, float) ** 2 < 1.0 - margin)))
    res = _run(monkeypatch, expansion_limits.SATURATION, expansion_limits.run_saturation, SATURATION)
    _report("validity edge at omega^2 = 1", res)
    assert res.verdict != "located", res.details


def test_validity_edge_moved_in(monkeypatch):
    """Theory's validity threshold halved in omega^2 (4 omega^2 < 1, edge 0.5) -> boundary-saturation.
    Caught only as verdict 'error': no measurement contradicts an edge moved inward (the exact
    loss is smooth across the true edge), but on this grid (no omega in [1/sqrt 6, 0.5)) the
    comparison can no longer tell the mutant's edge from the wrong-edge perturbation 1/sqrt 6,
    so the check declares itself unable to discriminate.  A grid with a point in that interval
    would let it pass: a known blind spot (docs/claims_5_7.md)."""
    monkeypatch.setattr(reduced_ode, "expansion_valid",
                        lambda omega, margin=0.0: bool(np.all(4.0 * np.asarray(omega, float) ** 2 < 1.0 - margin)))
    res = _run(monkeypatch, expansion_limits.SATURATION, expansion_limits.run_saturation, SATURATION)
    _report("validity edge at 4 omega^2 = 1", res)
    assert res.verdict != "located", res.details


def test_numerics_logits_doubled(monkeypatch):
    """numerics' Rao-Blackwellised estimator with its logits doubled (per-block scores x 2)
    -> boundary-small-L (its Monte Carlo no longer measures the loss theory.exact computes)."""
    original = exact_reduced.marginal_scores
    monkeypatch.setattr(exact_reduced, "marginal_scores", lambda prompts: 2.0 * original(prompts))
    res = _run(monkeypatch, expansion_limits.SMALL_L, expansion_limits.run_small_L, SMALL_L)
    _report("numerics logits doubled", res)
    assert res.verdict != "located", res.details
