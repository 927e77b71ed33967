"""Seeds by identity: the seed of a run is derived from the report's seed and the
stable name of the run's case, never by arithmetic on positions (``seed + 100 * k + j``, a
hard-coded 100 that must equal another claim's k = 1, j = 0); and the check that runs counted
as independent are (:func:`check_independent`, on the runs' fingerprints).

:func:`case_seed` hashes (seed, *name parts) with SHA-256, so a seed

- is the same in every process and on every machine (Python's ``hash()`` is salted per process
  and never used);
- differs between distinct case names (up to a collision of the 31-bit value: about 1 in 2^31
  per pair);
- moves with the report's ``--seed``: every case's seed changes when the report's does;
- does not depend on where the case stands in a profile's list, so two claims that train the
  same configuration under the same case name share the run (one need of the engine: the
  configuration, the schedule and this seed, numerics.experiments.converged.train_converged).

:func:`trained_run_seed` is the case name of a trained run of a problem, the one that claims
sharing trained runs (limiting-error, multi-head-gain, boundary-left-allocation) all call.
"""
from __future__ import annotations

import hashlib
import json
import numbers

import numpy as np

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


DIGEST_CHARS = 16
"""A fingerprint is the first 64 bits of a SHA-256, in hex: two different inputs share one with
probability about 2^-64 per pair."""


def digest(*arrays) -> str:
    """The first :data:`DIGEST_CHARS` hex digits of SHA-256 over each array's shape and its
    float64 bytes (C order): the same numbers give the same digest in every process and on
    every machine (numerics.batched fingerprints a run's first batch and its initial state)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.float64)
        h.update(repr(a.shape).encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()[:DIGEST_CHARS]


def check_independent(fingerprints: dict, what: str, shared_stream: bool = False) -> None:
    """Refuse runs counted as independent that share their randomness: ValueError naming the
    runs (and ``what`` they are) when two of them have the same fingerprint.

    ``fingerprints``: run id -> the run's ``TrainResult.fingerprint``, {"prompts": digest of
    its first batch, "weights": digest of its initial state}.  By default two runs clash when
    their first batches are the same (one prompt stream: their batch losses are not independent
    samples, whatever their starts).  ``shared_stream=True`` is for runs that share one stream
    on purpose (common random numbers: the same prompts, different starts): two clash when
    their initial states are the same (then nothing but the configuration tells them apart)."""
    part = "weights" if shared_stream else "prompts"
    by_value: dict = {}
    for run_id, fp in fingerprints.items():
        if not isinstance(fp, dict) or not isinstance(fp.get(part), str):
            raise ValueError(f"{what}: run {run_id!r} has no {part} fingerprint (got {fp!r}); pass each "
                             "run's TrainResult.fingerprint")
        by_value.setdefault(fp[part], []).append(run_id)
    clashes = [ids for ids in by_value.values() if len(ids) > 1]
    if clashes:
        shared, own = (("initial weights", "start (init_seed)") if shared_stream else
                       ("first batch of prompts", "data seed"))
        groups = "; ".join(", ".join(map(repr, ids)) for ids in clashes)
        raise ValueError(f"{what}: runs counted as independent share their {shared} ({groups}); give each "
                         f"its own {own} by numerics.seeds.case_seed")
