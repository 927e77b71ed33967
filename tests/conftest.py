"""Test-suite options: Hypothesis profiles, the ``thorough`` marker and the device.

- default: few examples per property, derandomized (the same draws every run), deadlines
  off (training runs take seconds), the reproduction blob printed on failure.
- ``--thorough`` (or ``HYPOTHESIS_PROFILE=thorough``): the ``thorough`` Hypothesis profile
  (more examples) and the tests marked ``@pytest.mark.thorough`` (larger L and d).
- ``--e2e``: the end-to-end pipelines (tests marked ``@pytest.mark.e2e``: a sweep of trained
  runs, then the report built from it; the registry-wide contract, every registered claim at
  the tiny profile, tests/claims/test_contract.py); ``.ci/run`` runs them as their own step.
- ``--atlas``: the atlas's tiny grid end to end (tests marked ``@pytest.mark.atlas``:
  examples/atlas_tiny.toml swept, then the four atlas ids built from it; about 3 minutes on
  2 cores); ``.ci/run`` runs it as its own step.
- ``--device cuda`` (or ``ICL_DEVICE=cuda``): the device the claim tests train on.
- ``--mutants``: the mutation suite (tests marked ``@pytest.mark.mutants``): wrong theories and
  numerics applied by monkeypatching, each of which the claim that owns it must reject. It
  runs as its own step of ``.ci/run`` (``python -m pytest -q --mutants -m mutants``), outside
  the default run's time budget.
"""
from __future__ import annotations

import os

# numpy/scipy's OpenBLAS threads its dot products above a few thousand elements (np.convolve in
# theory.exact's moment tables), which on 2 cores costs more than it gains (reports.build measured
# 3.8 CPU-s against 0.3 for the same convolutions); the suite runs it on one thread, as the report
# build does (numerics.io.ONE_BLAS_THREAD).  Set before numpy loads; where it already has, the
# library's own setter below.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest
from hypothesis import HealthCheck, settings

_common = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# The default profile is derandomized: the same examples on every run, so the default suite
# (and CI) is reproducible; ``thorough`` draws fresh examples each run to explore, and prints
# the seed / reproduction blob of any failure.
settings.register_profile("default", max_examples=4, derandomize=True, **_common)
settings.register_profile("thorough", max_examples=25, **_common)


def pytest_addoption(parser):
    parser.addoption("--thorough", action="store_true", default=False,
                     help="run the heavier claim checks and the 'thorough' Hypothesis profile")
    parser.addoption("--mutants", action="store_true", default=False,
                     help="run the mutation suite (tests marked 'mutants'): each wrong theory must be rejected")
    parser.addoption("--e2e", action="store_true", default=False,
                     help="run the end-to-end pipelines (tests marked 'e2e': sweep -> report); .ci/run's own step")
    parser.addoption("--atlas", action="store_true", default=False,
                     help="run the atlas's tiny grid end to end (tests marked 'atlas': sweep -> report); .ci/run's own step")
    parser.addoption("--device", action="store", default=os.environ.get("ICL_DEVICE", "cpu"),
                     help="device for the claim tests: cpu or cuda (default: $ICL_DEVICE or cpu)")


def pytest_configure(config):
    thorough = config.getoption("--thorough") or os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
    config._icl_thorough = thorough
    settings.load_profile("thorough" if thorough else os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config, items):
    skip_thorough = pytest.mark.skip(reason="heavier check: run with --thorough")
    skip_mutants = pytest.mark.skip(reason="mutation suite: run with --mutants -m mutants")
    for item in items:
        if "thorough" in item.keywords and not config._icl_thorough:
            item.add_marker(skip_thorough)
        if "mutants" in item.keywords and not config.getoption("--mutants"):
            item.add_marker(skip_mutants)
        if "e2e" in item.keywords and not config.getoption("--e2e"):
            item.add_marker(pytest.mark.skip(reason="end-to-end pipeline: run with --e2e -m e2e"))
        if "atlas" in item.keywords and not config.getoption("--atlas"):
            item.add_marker(pytest.mark.skip(reason="the atlas's tiny grid end to end: run with --atlas -m atlas"))


@pytest.fixture(scope="session")
def device(request) -> str:
    dev = request.config.getoption("--device")
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("--device cuda given but no CUDA device is available")
    return dev


@pytest.fixture(autouse=True)
def _fresh_run_cache():
    """Each test starts with an empty run cache (numerics.experiments): a run cached by one test
    would otherwise hide a mutant patched into numerics by the next (the mutation suite)."""
    try:
        from numerics import experiments
    except ImportError:   # torch missing: the tests that need it skip on their own
        yield
        return
    experiments.clear_cache()
    yield
    experiments.clear_cache()


def pytest_sessionstart(session):
    from numerics.io import one_blas_thread
    one_blas_thread()
