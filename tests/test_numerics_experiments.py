"""The experiment layer's policies (the sweep store) and the one allocation
readout, as unit tests (no training)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from claims.core import Z_SE
from numerics import experiments
from numerics.experiments.converged import Z_CONVERGED, TrainingSchedule, _normalise_point, converged_point
from numerics.config import ProblemConfig
from numerics.evaluate import ALLOCATED_SHARE, SUPERPOSED_SHARE, allocation


def test_numerics_restates_the_one_tolerance_policy():
    assert Z_CONVERGED == Z_SE


def test_store_finds_a_stored_run_and_counts_it(tmp_path):
    cfg = ProblemConfig(tasks=(2, 2), heads=2, L=32)
    point = converged_point(cfg, TrainingSchedule(), 3)
    (tmp_path / "points").mkdir()
    from numerics.stored import code_version, point_id     # a point as the sweep stores it: its id its own hash
    pid = point_id(point, code=code_version())
    (tmp_path / "points" / f"{pid}.json").write_text(json.dumps(
        {"id": pid, "point": point, "result": {"loss": 1.0}, "error": None, "code_version": code_version(),
         "point_fn": "numerics.sweep:train_point"}))
    with experiments.store(tmp_path) as st:
        assert st.lookup(converged_point(cfg, TrainingSchedule(), 4), _normalise_point) is None
        assert st.lookup(point, _normalise_point) == {"loss": 1.0} and st.used == 1
    assert experiments.active_store() is None
    with pytest.raises(FileNotFoundError, match="not a sweep directory"):
        with experiments.store(tmp_path / "nowhere"):
            pass


def test_readout_allocated_superposition_and_winners():
    alloc = allocation(np.array([[0.5, 0.0], [0.0, 0.5]]), np.array([[1.0, 0.05], [0.02, 1.0]]))
    assert alloc.allocated and not alloc.superposition and alloc.serving_head == (0, 1) and alloc.winners == (0, 1)
    sup = allocation(np.array([[0.5, 0.3], [0.3, 0.5]]), np.array([[1.0, -0.5], [-0.4, 1.0]]))
    assert not sup.allocated and sup.superposition and sup.opposite_sign_share == pytest.approx(0.5)
    assert ALLOCATED_SHARE < SUPERPOSED_SHARE
    shared = allocation(None, np.array([[1.0], [0.95]]))
    assert shared.runner_up_share == (pytest.approx(0.95),) and not shared.allocated
