"""Claim checks: theory against numerics, one module per claim of the paper.

Each claim module declares a :class:`claims.core.ClaimSpec` (``SPEC``, or ``SPECS`` for a
module holding two ids); :data:`REGISTRY` maps each claim id (the ids of ``claims.json``) to
``"module:NAME"``.  Every claim runs through the one runner, ``claims.core.run_spec``:

    run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None, problem=None) -> ClaimResult

``problem``: a dict of ProblemConfig fields given by the researcher (``python -m reports.build
--tasks 3,3 ...``), parsed once by ``claims.core.check_problem``; the claim then runs its experiment at
that configuration (building any family it needs around it) and says in ``details["ran"]``
what it ran.  ``sweep``: a directory of sweep results (``numerics.sweep``) whose stored trained
runs the claims that read sweeps (:func:`reads_sweep`) take instead of training them.
"""
from __future__ import annotations

import importlib
from typing import Optional

from claims.core import context


REGISTRY: dict[str, str] = {
    "block-structure": "claims.block_structure:SPEC",
    "spectral-reduction": "claims.spectral_reduction:SPEC",
    "three-phases": "claims.three_phases:SPEC",
    "task-allocation": "claims.task_allocation:SPEC",
    "limiting-error": "claims.limiting_error:SPEC",
    "multi-head-gain": "claims.multi_head_gain:SPEC",
    "optimality": "claims.optimality:SPEC",
    "boundary-merged-superposition": "claims.boundary_merged_superposition:SPEC",
    "boundary-saturation": "claims.boundary_saturation:SPEC",
    "boundary-small-L": "claims.boundary_small_L:SPEC",
    "boundary-fewer-heads": "claims.boundary_fewer_heads:SPEC",
    "boundary-left-allocation": "claims.boundary_left_allocation:SPEC",
    "boundary-saddle": "claims.boundary_saddle:SPEC",
    "boundary-initialisation": "claims.boundary_initialisation:INIT_SPEC",
    "boundary-allocation-race": "claims.boundary_allocation_race:RACE_SPEC",
    "atlas-initialisation": "claims.atlas:INITIALISATION_SPEC",
    "atlas-heads": "claims.atlas:HEADS_SPEC",
    "atlas-noise": "claims.atlas:NOISE_SPEC",
    "atlas-batch": "claims.atlas:BATCH_SPEC",
    "authors-replica": "claims.authors_replica:SPEC",
}

OPT_IN: tuple[str, ...] = ("atlas-initialisation", "atlas-heads", "atlas-noise", "atlas-batch", "authors-replica")
"""Ids that run only when named in ``--only`` (never in the default report): the atlas reads a
sweep of its own grid (``examples/atlas*.toml``) and trains nothing; authors-replica
trains the authors' released experiment at their sizes, meant for a GPU (docs/authors.md)."""


def spec_of(claim_id: str):
    """The ClaimSpec of one claim id (KeyError naming the known ids)."""
    if claim_id not in REGISTRY:
        raise KeyError(f"unknown claim id {claim_id!r}; known: {', '.join(REGISTRY)}")
    module, name = REGISTRY[claim_id].split(":")
    return getattr(importlib.import_module(module), name)


def cannot_run(claim_id: str, problem: Optional[dict]) -> Optional[str]:
    """Why ``claim_id`` cannot build its experiment at ``problem`` (None: it can), decided
    before any run: a problem field it would ignore, or the claim's own ``cannot_run``."""
    s = spec_of(claim_id)
    if not problem:
        return None
    ignored = sorted(set(problem) - set(s.fields))
    if ignored:
        return f"it would ignore the field(s) {ignored}"
    if s.resolve is None:
        return "it runs at its profiles' configurations only"
    return s.cannot_run(problem) if s.cannot_run is not None else None


def reads_sweep(claim_id: str) -> bool:
    """Whether the claim takes trained runs from a sweep store (``--from-sweep``)."""
    return bool(spec_of(claim_id).reads_sweep)


def plan_of(claim_id: str, profile: str, problem: Optional[dict] = None, device: str = "cpu", seed: int = 0):
    """Every need the claim's plan may ask for (its plan asked with no results: the conditional
    needs included), or None for a claim that is not a plan."""
    s = spec_of(claim_id)
    if s.plan is None:
        return None
    return list(s.plan(context(s, profile, device, seed, problem=problem), None))


def estimate_seconds(claim_id: str, profile: str, problem: Optional[dict] = None, seed: int = 0) -> Optional[float]:
    """The CPU seconds of the claim's plan alone (numerics.engine.cost_of summed over every
    need it may ask for; None for a claim that is not a plan).  A build prices the union of the
    selected claims' plans instead (reports.build.planned_costs), each shared need once."""
    if spec_of(claim_id).plan is None:
        return None
    from numerics.engine import closure, cost_of
    return sum(cost_of(n) for n in closure(plan_of(claim_id, profile, problem, seed=seed)))