"""Fixtures shared by the tests of several claim ids (the tests of one id live in
tests/claims/test_<id>.py; tests/conftest.py holds the suite's options)."""
from __future__ import annotations

import pytest

from atlas_sweep import sweep_four_points


@pytest.fixture(scope="session")
def four_point_sweep(tmp_path_factory):
    """The four-point atlas sweep (tests/claims/atlas_sweep.py), swept once for the four atlas ids."""
    return sweep_four_points(tmp_path_factory.mktemp("atlas") / "D")
