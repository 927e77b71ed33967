"""Mutation suite of boundary-small-L: each test breaks theory/ or numerics/ on purpose (pytest's
monkeypatch) and asserts that the boundary returns a non-pass verdict at a small dedicated
profile.  Run: ``python -m pytest -q -s --mutants -m mutants tests/claims/test_boundary_small_L_mutants.py``
(each test prints the mutant's name and the verdict it got).  The other boundaries' mutants:
tests/claims/test_boundary_saturation_mutants.py, test_boundary_fewer_heads_mutants.py."""
from __future__ import annotations

import numpy as np
import pytest

import numerics.exact_reduced as exact_reduced
import theory.reduced_ode as reduced_ode
from claims import boundary_small_L
from mutation import report_verdict, run_at_profile

pytestmark = pytest.mark.mutants

# the dedicated small profile (the quick one with fewer blocks)
SMALL_L = boundary_small_L.SmallLProfile(blocks=(4,), L_exact=(4096, 16384, 65536), L_mc=(64,), mc_elements=2 ** 20)


def _scaled_pair_kernel(factor: float):
    """The pair kernel, its derivative and its log ratio to pair_kernel(0) (the form the
    expansion sums its excess over the constant part from) all scaled by ``factor``."""
    original = reduced_ode._kernels()
    kernels = dict(original)
    kernels["pair_kernel"] = lambda c, r, s2: factor * original["pair_kernel"](c, r, s2)
    kernels["d_pair_kernel"] = lambda c, r, s2: factor * original["d_pair_kernel"](c, r, s2)
    # the expansion sums the pair term through log(pair_kernel / (r + s2)), stable near c = 0
    kernels["log_pair_ratio"] = lambda c, r, s2: np.log(factor) + original["log_pair_ratio"](c, r, s2)
    return lambda: kernels


def test_pair_kernel_scaled(monkeypatch):
    """The expansion's pair kernel (its O(1/L) coefficient) x 1.25 -> boundary-small-L."""
    monkeypatch.setattr(reduced_ode, "_kernels", _scaled_pair_kernel(1.25))
    res = run_at_profile(monkeypatch, boundary_small_L.SMALL_L, boundary_small_L.SPEC.run, SMALL_L)
    report_verdict("pair kernel x 1.25", res)
    assert res.verdict != "located", res.details


def test_numerics_logits_doubled(monkeypatch):
    """numerics' Rao-Blackwellised estimator with its logits doubled (per-block scores x 2)
    -> boundary-small-L (its Monte Carlo no longer measures the loss theory.exact computes)."""
    original = exact_reduced.marginal_scores
    monkeypatch.setattr(exact_reduced, "marginal_scores", lambda prompts: 2.0 * original(prompts))
    res = run_at_profile(monkeypatch, boundary_small_L.SMALL_L, boundary_small_L.SPEC.run, SMALL_L)
    report_verdict("numerics logits doubled", res)
    assert res.verdict != "located", res.details
