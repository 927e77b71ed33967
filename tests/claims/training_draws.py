"""Hypothesis settings and draws shared by the claim tests whose examples train (a helper module,
not a test file: tests/claims is on sys.path while its tests run)."""
from __future__ import annotations

from hypothesis import Phase, settings, strategies as st

HEAVY = settings(max_examples=max(2, settings.default.max_examples // 2),
                 phases=[Phase.explicit, Phase.reuse, Phase.generate])
"""Training runs cost seconds each: fewer examples (default 2, thorough 12) and no shrinking."""

sigma_st = st.sampled_from([0.0, 0.5])
"""The label-noise levels the boundary tests draw."""
