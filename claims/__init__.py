"""Claim checks: theory against numerics, one module per claim of the paper.

Each entry of :data:`REGISTRY` maps a claim id (the ids of ``claims.json``) to
``"module:function"``; the function has the signature

    run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None) -> ClaimResult

A runner may also accept ``problem=None``: a dict of ProblemConfig fields (tasks, heads, L,
sigma, param, init_scale, logit_scale, basis, dtype) given by the researcher
(``python -m reports.build --tasks 3,3 ...``); the claim then runs its experiment at that
configuration (building any family it needs, several L or one head against H, around it) and
says in ``details["ran"]`` what it ran.  ``reports.build`` passes ``problem`` only to runners
whose signature has it.

``profile`` is one of :data:`claims.base.PROFILES`; ``sweep`` is an optional directory of
sweep results (``tools.sweep``) that the claims over families of configurations
(``limiting-error``, ``multi-head-gain``) use instead of running their own grid.
"""
from __future__ import annotations

import importlib
from typing import Callable

from claims.base import ClaimResult

REGISTRY: dict[str, str] = {
    "block-structure": "claims.block_structure:run",
    "spectral-reduction": "claims.spectral_reduction:run",
    "three-phases": "claims.three_phases:run",
    "task-allocation": "claims.task_allocation:run",
    "limiting-error": "claims.limiting_error:run",
    "multi-head-gain": "claims.multi_head_gain:run",
    "optimality": "claims.optimality:run",
    "boundary-merged-superposition": "claims.boundaries:run_merged_superposition",
    "boundary-saturation": "claims.boundaries:run_saturation",
    "boundary-small-L": "claims.boundaries:run_small_L",
    "boundary-fewer-heads": "claims.boundaries:run_fewer_heads",
    "boundary-initialisation": "claims.initialisation:run",
    "boundary-allocation-race": "claims.initialisation:run_race",
}


def claim_runner(claim_id: str) -> Callable[..., ClaimResult]:
    """The ``run`` function of one claim id."""
    if claim_id not in REGISTRY:
        raise KeyError(f"unknown claim id {claim_id!r}; known: {', '.join(REGISTRY)}")
    module, func = REGISTRY[claim_id].split(":")
    return getattr(importlib.import_module(module), func)
