"""numerics.engine: a run's seed from (the report's seed, a stable case name), by SHA-256.

Stable across processes (another interpreter, another hash salt, gives the same seeds, where
Python's own ``hash()`` of the same name differs), distinct for distinct names, moved by every
change of the report's seed, and independent of where a case stands in a list."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numerics.engine import SEED_BITS, case_seed, trained_run_seed

REPO = Path(__file__).resolve().parents[1]
NAMES = [("trained run", (2, 2), 0.0, L) for L in (16, 32, 64, 128)] + [
    ("trained run", (3, 3), 0.5, 32), ("trained run", (3, 3, 3), 0.5, 32), ("random full start", 0, "init"),
    ("random full start", 0, "prompts"), ("random full start", 1, "init"), ("constant row", 64), ("exact minima", 64),
    ("left allocation: best decomposable", (3, 3), 2, 32, 0.5), ("left allocation: flow on D", (3, 3), 2, 32, 0.5)]


def _in_another_process(hash_seed: str) -> dict:
    code = ("import json, sys; from numerics.engine import case_seed; names = json.loads(sys.argv[1]); "
            "print(json.dumps({'seeds': [case_seed(s, *n) for s in (0, 7) for n in names], "
            "'hash': hash('trained run')}))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(NAMES)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": hash_seed}, timeout=60, check=True)
    return json.loads(out.stdout)


def test_stable_across_processes_where_hash_is_not():
    """Two interpreters with different hash salts: the same seeds (here too); the salted
    ``hash()`` of one name differs between them (what a seed from ``hash()`` would suffer)."""
    a, b = _in_another_process("1"), _in_another_process("2")
    here = [case_seed(s, *n) for s in (0, 7) for n in NAMES]      # tuples here, JSON lists there
    assert a["seeds"] == b["seeds"] == here
    assert a["hash"] != b["hash"]


def test_a_pinned_value():
    """The encoding is part of every report's identity (a changed encoding re-seeds every run):
    sha256('[0,"trained run",[2.0,2.0],0.0,32.0]')[:8] >> 33."""
    assert trained_run_seed(0, (2, 2), 0.0, 32) == case_seed(0, "trained run", (2, 2), 0.0, 32) == 2133888888


def test_distinct_names_distinct_seeds_and_the_report_seed_moves_every_one():
    by_seed = {s: [case_seed(s, *n) for n in NAMES] for s in (0, 1, 2)}
    for seeds in by_seed.values():
        assert len(set(seeds)) == len(NAMES)
        assert all(0 <= x < 2 ** SEED_BITS for x in seeds)
    for n, (a, b, c) in enumerate(zip(by_seed[0], by_seed[1], by_seed[2])):
        assert len({a, b, c}) == 3, NAMES[n]
    assert case_seed(0, "a", "b") != case_seed(0, "b", "a") != case_seed(0, "ab")


def test_a_number_is_its_value_and_a_sequence_its_parts():
    """0, 0.0 and numpy's 0.0 name one case; a tuple and a list of the same parts too; so a
    caller's int/float or tuple/list choice never splits one run into two."""
    assert case_seed(3, "trained run", (3, 3), 0, 32) == case_seed(3, "trained run", [3.0, 3.0], np.float64(0.0),
                                                                      np.int64(32))
    assert trained_run_seed(3, (3, 3), 0.5, 32) == trained_run_seed(3, [3, 3], 0.5, 32)
    assert trained_run_seed(3, (3, 3), 0.5, 32) != trained_run_seed(3, (3, 3), 0.5, 64)


@pytest.mark.parametrize("seed, parts, error, message", [
    (-1, ("a",), ValueError, "seed must be an integer >= 0"),
    (True, ("a",), ValueError, "seed must be an integer >= 0"),
    (1.5, ("a",), ValueError, "seed must be an integer >= 0"),
    (0, (), ValueError, "needs a name"),
    (0, ("a", None), TypeError, "a case name part"),
    (0, ("a", True), TypeError, "a case name part"),
    (0, ("a", {"L": 3}), TypeError, "a case name part"),
    (0, ("a", float("nan")), ValueError, "finite number"),
])
def test_bad_names_are_refused(seed, parts, error, message):
    with pytest.raises(error, match=message):
        case_seed(seed, *parts)


# --- run fingerprints and the independence check ----------------------------------------------

def test_digest_is_of_the_numbers_and_their_shape():
    from numerics.engine import DIGEST_CHARS, digest
    a = np.arange(6.0).reshape(2, 3)
    assert digest(a) == digest(a.astype(np.float32)) == digest(a.T.copy().T) and len(digest(a)) == DIGEST_CHARS
    assert digest(a) != digest(a.reshape(3, 2)) and digest(a) != digest(a + 1e-15 * (a == 5))
    assert digest(a, a) != digest(a)


def test_check_independent_names_the_runs_that_share_their_randomness():
    from numerics.engine import check_independent
    fps = {"seed 0": {"prompts": "aa", "weights": "w0"}, "seed 1": {"prompts": "bb", "weights": "w0"},
           "seed 2": {"prompts": "cc", "weights": "w0"}}
    check_independent(fps, "claim x's replicates")          # a deterministic start, streams of their own
    fps["seed 2"] = {"prompts": "aa", "weights": "w1"}
    with pytest.raises(ValueError, match=r"claim x's replicates: .*first batch of prompts \('seed 0', 'seed 2'\)"):
        check_independent(fps, "claim x's replicates")
    crn = {"start a": {"prompts": "aa", "weights": "w0"}, "start b": {"prompts": "aa", "weights": "w1"}}
    check_independent(crn, "starts on one stream", shared_stream=True)
    with pytest.raises(ValueError, match="first batch"):
        check_independent(crn, "starts on one stream")
    crn["start b"]["weights"] = "w0"
    with pytest.raises(ValueError, match=r"initial weights \('start a', 'start b'\).*init_seed"):
        check_independent(crn, "starts on one stream", shared_stream=True)
    with pytest.raises(ValueError, match="run 'r' has no prompts fingerprint"):
        check_independent({"r": None}, "runs")
