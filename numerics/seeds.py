"""Seeds by identity (issue 32): the seed of a run is derived from the report's seed and the
stable name of the run's case, never by arithmetic on positions (``seed + 100 * k + j``, a
hard-coded 100 that must equal another claim's k = 1, j = 0).

:func:`case_seed` hashes (seed, *name parts) with SHA-256, so a seed

- is the same in every process and on every machine (Python's ``hash()`` is salted per process
  and never used);
- differs between distinct case names (up to a collision of the 31-bit value: about 1 in 2^31
  per pair);
- moves with the report's ``--seed``: every case's seed changes when the report's does;
- does not depend on where the case stands in a profile's list, so two claims that train the
  same configuration under the same case name share the run (the run cache's key is the
  configuration, the schedule and this seed: numerics.experiments.converged.converged_run).

:func:`trained_run_seed` is the case name of a trained run of a problem, the one that claims
sharing trained runs (limiting-error, multi-head-gain, boundary-left-allocation) all call.
"""
from __future__ import annotations

import hashlib
import json
import numbers

SEED_BITS = 31
"""A derived seed lies in [0, 2^31): a valid seed for torch, numpy (legacy seeds < 2^32) and a
sweep point, exact in JSON, and still valid after the small offsets a case adds to its own
streams (``s + 1``, ``s + 2`` for a case's fit and evaluation samples)."""


def _canonical(part):
    """One name part as JSON-ready data: a number is its value (0, 0.0 and numpy's 0.0 name the
    same case, as float), a string itself, a tuple or list the list of its parts."""
    if isinstance(part, str):
        return part
    if isinstance(part, bool) or part is None:
        raise TypeError(f"a case name part must be a string, a number or a tuple of them, got {part!r}")
    if isinstance(part, numbers.Real):
        value = float(part)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"a case name part must be a finite number, got {part!r}")
        return value
    if isinstance(part, (tuple, list)):
        return [_canonical(p) for p in part]
    raise TypeError(f"a case name part must be a string, a number or a tuple of them, got {part!r}")


def case_seed(seed: int, *name_parts) -> int:
    """The seed of the case named ``name_parts`` at the report's seed ``seed``: the first 8 bytes
    of SHA-256 of the JSON text of [seed, *name_parts] (numbers as floats, tuples as lists),
    shifted to :data:`SEED_BITS` bits.  ``name_parts``: at least one; strings, finite numbers,
    tuples or lists of them (anything else is a TypeError, before any run)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if not name_parts:
        raise ValueError("a case needs a name: case_seed(seed, 'what', ...)")
    text = json.dumps([int(seed), *(_canonical(p) for p in name_parts)], separators=(",", ":"))
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def trained_run_seed(seed: int, tasks, sigma: float, L: int) -> int:
    """The seed of the trained run of the problem (tasks, sigma, L) at the report's seed: the
    case ("trained run", tasks, sigma, L).  The head count is not part of the name, so claim 6's
    H-head and one-head runs of a problem see the same prompt stream; and every claim that
    trains the problem at the same schedule asks for the same run (one cache key)."""
    return case_seed(seed, "trained run", tuple(tasks), sigma, L)
