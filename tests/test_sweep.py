"""Tests of the sweep runner, numerics/sweep/ (issue 7):
grid expansion, content-hash ids, atomic storage, resume after a SIGKILL, retry after a
worker death, per-point errors, bit-identical training results serially, in a process pool
and on a 2-worker Dask LocalCluster, pool workers that exit when the sweep is killed
(issue 13); the library beside it never imports it.

The point functions below are module-level so that pool and Dask workers can import them
(pickled by reference as ``test_sweep.<name>``; the workers inherit ``sys.path``).
"""
from __future__ import annotations

import functools
import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numerics import sweep
from numerics.sweep import grid as sweep_grid
from numerics.sweep import code_sources, code_version, expand_grid, load_results, point_id, run_grid
from numerics.stored import DEFAULT_POINT_FN_NAMES, package_version

REPO = Path(__file__).resolve().parent.parent

# Tiny training points (10 GD steps on batch 64): the tests are about bookkeeping, and the
# numbers only have to be reproducible, not converged.
TINY = {"problem": {"tasks": [2, 2], "heads": 2, "L": 16},
        "train": {"batch": 64, "time": 0.5, "lr": 0.05, "records": 3}}


def tiny_spec(**cross) -> dict:
    """The TINY point with the given ranges crossed (a crossed field is no longer fixed)."""
    return {"problem": {k: v for k, v in TINY["problem"].items() if k not in cross},
            "train": {k: v for k, v in TINY["train"].items() if k not in cross}, "cross": cross}


def without_timing(result: dict) -> dict:
    """A TrainResult dict less its timing fields (wall_seconds, cpu_seconds,
    seconds_per_step: any key naming seconds), the only ones allowed to differ."""
    return {k: v for k, v in result.items() if "seconds" not in k}


def errors(out_dir) -> list:
    """The stored errors of a sweep, for the message of a failing assertion."""
    return [(r["point"]["model"], r["point"]["train"]["seed"], r["error"]) for r in load_results(out_dir) if r["error"]]


def by_point(records: list[dict]) -> dict[str, dict]:
    return {json.dumps(r["point"], sort_keys=True): r for r in records}


# --- point functions run by the workers --------------------------------------------------------

def die_once_then_train(marker_dir: str, point: dict) -> dict:
    """Kill this worker process the first time the (full, seed 1) point runs, then train."""
    marker = Path(marker_dir) / "died"
    if point["model"] == "full" and point["train"]["seed"] == 1 and not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(3)
    return sweep.train_point(point)


def always_die_on_seed_1(point: dict) -> dict:
    """Cheap synthetic point (no training); seed 1 kills its worker every time."""
    if point["train"]["seed"] == 1:
        os._exit(3)
    return {"seed": point["train"]["seed"], "square": point["train"]["seed"] ** 2}


def gated_point(point: dict) -> dict:
    """Seeds 0 and 1 return at once; the others wait until the file $SWEEP_GATE/open exists,
    so a test can kill a sweep at a known state (two points stored, two in flight)."""
    seed = point["train"]["seed"]
    if seed >= 2:
        gate = Path(os.environ["SWEEP_GATE"]) / "open"
        deadline = time.monotonic() + 120
        while not gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("gate never opened")
            time.sleep(0.05)
    return {"seed": seed, "square": seed ** 2}


# --- grid expansion -------------------------------------------------------------------------------

def test_expand_grid_crosses_in_order_zips_and_fills_defaults():
    spec = {"model": "reduced",
            "problem": {"tasks": [2, 2], "heads": 2, "sigma": 0},
            "train": {"time": 1},
            "cross": {"L": [16, 32], "train": {"seed": [0, 1, 2]}},
            "zip": [{"tasks": [[2, 2], [2, 2, 2]], "heads": [2, 3]}]}
    spec["problem"].pop("tasks")
    spec["problem"].pop("heads")
    points = expand_grid(spec)
    assert len(points) == 2 * 3 * 2
    # the last factor varies fastest: (L, seed, (tasks, heads))
    assert [(p["problem"]["L"], p["train"]["seed"], p["problem"]["heads"]) for p in points[:4]] == \
        [(16, 0, 2), (16, 0, 3), (16, 1, 2), (16, 1, 3)]
    assert all(len(p["problem"]["tasks"]) == p["problem"]["heads"] for p in points)  # zipped, not crossed
    first = points[0]
    assert first["model"] == "reduced"
    assert first["problem"]["sigma"] == 0.0 and isinstance(first["problem"]["sigma"], float)  # 0 -> 0.0
    assert first["train"]["time"] == 1.0 and isinstance(first["train"]["time"], float)
    assert first["problem"]["param"] == "factored" and first["problem"]["init_scale"] == 0.15  # defaults filled
    assert first["train"]["batch"] == 2048
    assert "progress" not in first["train"] and "checkpoint" not in first["train"]  # the sweep's own


@pytest.mark.parametrize("spec, message", [
    ({"problem": {"tasks": [2], "heads": 1}, "cross": {"Lx": [8]}}, "unknown field 'Lx'"),
    ({"problem": {"tasks": [2], "heads": 1, "L": 8}, "cross": {"L": [8, 16]}}, "both fixed and swept"),
    ({"problem": {"tasks": [2], "heads": 1}, "cross": {"L": []}}, "non-empty list"),
    ({"problem": {"tasks": [2], "heads": 1}, "cross": {"L": 8}}, "non-empty list"),
    ({"problem": {"tasks": [2], "heads": 1}, "cross": {"L": [8, 8]}}, "repeats a value"),
    ({"problem": {"heads": 1, "L": 8}, "cross": {"tasks": [3, 3]}}, "list of lists"),
    ({"problem": {"tasks": [2], "heads": 1, "L": 8}, "model": "fulll"}, "model must be one of"),
    ({"problem": {"tasks": [2], "heads": 1}}, "every point needs problem.L"),
    ({"problem": {"tasks": [2], "heads": 1, "L": 8}, "train": {"progress": True}}, "set by the sweep"),
    ({"problem": {"tasks": [2], "heads": 1, "L": 8}, "sweep": {}}, "unknown top-level key"),
    ({"problem": {"tasks": [2], "L": 8}, "zip": {"heads": [1, 2], "seed": [0]}}, "equal lengths"),
    ({"problem": {"tasks": [2], "heads": 1}, "cross": {"L": [8]}, "zip": {"L": [16]}}, "swept twice"),
    ({"problem": {"tasks": [2]}, "zip": {"heads": [1, 1], "L": [8, 8]}}, "repeats a row"),
])
def test_expand_grid_rejects_structural_mistakes(spec, message):
    with pytest.raises(ValueError, match=message):
        expand_grid(spec)


def test_example_grids_expand():
    spec, _ = sweep_grid.load_grid(REPO / "examples" / "grid.toml")
    points = expand_grid(spec)
    assert len(points) == 12  # the benchmark grid of docs/sweep.md
    assert len({point_id(p) for p in points}) == 12
    gain = expand_grid(sweep_grid.load_grid(REPO / "examples" / "multi_head_gain.toml")[0])
    # claim 6's paper case (4, 4, 4) with H = 3 and H = 1 (examples/multi_head_gain.toml)
    assert {(len(p["problem"]["tasks"]), p["problem"]["heads"]) for p in gain} == {(3, 1), (3, 3)}
    for path in sorted((REPO / "examples").glob("*.toml")):
        assert expand_grid(sweep_grid.load_grid(path)[0]), path


def test_complete_point_matches_the_grid_form():
    (from_grid,) = expand_grid(tiny_spec(seed=[3]))
    by_hand = {"problem": {"tasks": (2, 2), "heads": 2, "L": 16, "sigma": 0},
               "train": {"batch": 64, "time": 0.5, "lr": 0.05, "records": 3, "seed": 3}}
    assert sweep_grid.complete_point(by_hand) == from_grid
    assert point_id(sweep_grid.complete_point(by_hand)) == point_id(from_grid)
    assert point_id(by_hand) != point_id(from_grid)  # why completing matters
    with pytest.raises(ValueError, match="unknown field 'hedas'"):
        sweep_grid.complete_point({"problem": {"tasks": [2], "hedas": 1, "L": 8}})


def test_bad_grid_file_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sweep_grid.load_grid(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[problem\ntasks = 3")
    with pytest.raises(ValueError, match="not valid TOML"):
        sweep_grid.load_grid(bad)


# --- identity -----------------------------------------------------------------------------------

_values = st.one_of(st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4))


@given(st.dictionaries(st.text(min_size=1, max_size=6), _values, min_size=1, max_size=6), st.randoms())
def test_point_id_is_a_content_hash(fields, rnd):
    point = {"model": "full", "problem": fields, "train": {"seed": 0}}
    keys = list(fields)
    rnd.shuffle(keys)
    reordered = {"train": {"seed": 0}, "problem": {k: fields[k] for k in keys}, "model": "full"}
    assert point_id(point) == point_id(reordered)  # canonical JSON: key order is irrelevant
    changed = {**point, "train": {"seed": 1}}
    assert point_id(changed) != point_id(point)  # any field enters the hash
    assert point_id(point, code="another-version") != point_id(point)  # so does the code version
    assert point_id(point, point_fn="mod:fn") != point_id(point)  # and a non-default point function


def test_code_version_hashes_the_training_code_only():
    names = {p.relative_to(REPO).as_posix() for p in code_sources()}
    assert {"numerics/train.py", "numerics/config.py", "numerics/model.py", "numerics/engine.py"} <= names
    assert not any(name.startswith(("numerics/sweep/", "numerics/bench/", "numerics/io.py")) for name in names), \
        names  # editing the sweep, the bench or the command lines' I/O keeps stored results
    assert code_version().startswith(package_version() + "+src.")


def test_default_point_fn_ids_survive_a_rename_of_the_sweep():
    """Points stored under any name of the default point function (not hashed) keep their ids."""
    (point,) = expand_grid(tiny_spec(seed=[0]))
    assert {point_id(point, point_fn=name) for name in DEFAULT_POINT_FN_NAMES} == {point_id(point)}
    assert sweep.DEFAULT_POINT_FN == "numerics.sweep:train_point" and sweep.resolve_point_fn(sweep.DEFAULT_POINT_FN) \
        is sweep.train_point


# --- running: serial, pool, Dask ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def serial_reference(tmp_path_factory):
    """The tiny 4-point grid (seed x model) trained serially in this process."""
    points = expand_grid(tiny_spec(seed=[0, 1], model=["full", "reduced"]))
    out = tmp_path_factory.mktemp("serial")
    summary = run_grid(points, out, scheduler="serial", progress=False)
    assert (summary.done, summary.skipped, summary.failed) == (4, 0, 0)
    return points, by_point(load_results(out))


def test_serial_results_are_real_and_distinct(serial_reference):
    """Guard of the equality tests below: the 4 results are complete training runs and differ
    from each other, so equal results elsewhere cannot come from comparing nothing."""
    points, results = serial_reference
    losses = [r["result"]["loss"] for r in results.values()]
    assert all(r["error"] is None and r["result"]["steps"] == 10 for r in results.values())
    assert len(set(losses)) == 4


def test_pool_gives_identical_results_despite_a_worker_death(serial_reference, tmp_path):
    points, reference = serial_reference
    marker_dir = tmp_path / "marker"
    marker_dir.mkdir()
    fn = functools.partial(die_once_then_train, str(marker_dir))
    summary = run_grid(points, tmp_path / "pool", workers=2, retries=1, progress=False, point_fn=fn)
    assert (marker_dir / "died").exists(), "the worker was never killed: the test would prove nothing"
    assert summary.worker_deaths >= 1
    assert (summary.done, summary.failed) == (4, 0), errors(tmp_path / "pool")
    results = by_point(load_results(tmp_path / "pool"))
    assert results.keys() == reference.keys()
    for key, record in results.items():
        assert without_timing(record["result"]) == without_timing(reference[key]["result"])


@pytest.mark.dask
def test_dask_local_cluster_gives_identical_results_despite_a_worker_death(serial_reference, tmp_path):
    pytest.importorskip("distributed", reason="dask.distributed not installed: pip install -e .[dask]")
    points, reference = serial_reference
    marker_dir = tmp_path / "marker"
    marker_dir.mkdir()
    fn = functools.partial(die_once_then_train, str(marker_dir))
    summary = run_grid(points, tmp_path / "dask", scheduler="local", workers=2, retries=1, progress=False,
                       point_fn=fn)
    assert (marker_dir / "died").exists(), "the worker was never killed: the test would prove nothing"
    assert (summary.done, summary.failed) == (4, 0), errors(tmp_path / "dask")
    results = by_point(load_results(tmp_path / "dask"))
    assert results.keys() == reference.keys()
    for key, record in results.items():
        assert without_timing(record["result"]) == without_timing(reference[key]["result"])


def test_point_that_always_kills_its_worker_fails_after_retries(tmp_path):
    points = expand_grid(tiny_spec(seed=[0, 1, 2]))
    summary = run_grid(points, tmp_path, workers=2, retries=1, progress=False, point_fn=always_die_on_seed_1)
    assert (summary.done, summary.failed) == (2, 1), errors(tmp_path)
    records = {r["point"]["train"]["seed"]: r for r in load_results(tmp_path)}
    assert records[1]["error"].startswith("WorkerDied") and records[1]["result"] is None
    assert records[1]["worker_deaths"] == 2  # charged only when it died alone: first try + 1 retry
    assert records[0]["result"] == {"seed": 0, "square": 0} and records[2]["result"] == {"seed": 2, "square": 4}
    assert records[0]["worker_deaths"] == 0  # the bystander was not charged


def test_bad_point_reports_its_error_and_the_rest_finish(tmp_path):
    points = expand_grid(tiny_spec(heads=[0, 2]))  # heads = 0 is a value error, not a grid error
    summary = run_grid(points, tmp_path, scheduler="serial", progress=False)
    assert (summary.done, summary.failed) == (1, 1) and not summary.complete
    records = {r["point"]["problem"]["heads"]: r for r in load_results(tmp_path)}
    assert "heads must be a positive integer" in records[0]["error"] and records[0]["status"] == "failed"
    assert records[0]["result"] is None and "Traceback" in records[0]["traceback"]
    assert records[2]["error"] is None and records[2]["result"]["steps"] == 10
    # run again: nothing reruns by default, the failure is counted as skipped-failed ...
    again = run_grid(points, tmp_path, scheduler="serial", progress=False)
    assert (again.done, again.skipped, again.skipped_failed, again.failed) == (0, 2, 1, 0)
    assert "rerun with --retry-failed" in again.line()
    # ... and --retry-failed reruns it (and it fails again, deterministically)
    retry = run_grid(points, tmp_path, scheduler="serial", progress=False, retry_failed=True)
    assert (retry.done, retry.skipped, retry.failed) == (0, 1, 1)


def test_kill_midway_then_resume_loses_nothing_and_runs_nothing_twice(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('[problem]\ntasks = [2, 2]\nheads = 2\nL = 16\n[cross]\nseed = [0, 1, 2, 3, 4, 5]\n')
    out = tmp_path / "out"
    env = {**os.environ, "SWEEP_GATE": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "numerics.sweep", str(grid), "--out", str(out), "--workers", "2",
           "--point-fn", "test_sweep:gated_point", "--no-progress"]
    # its own session, so that SIGKILL reaches the sweep and its pool workers, and only them
    first = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while len(list((out / "points").glob("*.json"))) < 2:
            assert first.poll() is None, f"sweep exited early: {first.stderr.read().decode()}"
            assert time.monotonic() < deadline, "no point finished within 90 s"
            time.sleep(0.1)
        time.sleep(0.5)  # seeds 2 and 3 are now waiting at the gate, in flight
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "points").glob("*.json")}
    assert len(before) == 2, "the sweep must be killed midway for this test to mean anything"

    (tmp_path / "open").write_text("")
    second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, (second.stderr, errors(out))
    assert json.loads(second.stdout)["skipped"] == 2 and json.loads(second.stdout)["done"] == 4

    records = load_results(out)
    assert sorted(r["point"]["train"]["seed"] for r in records) == [0, 1, 2, 3, 4, 5]  # nothing lost
    assert all(r["result"] == {"seed": s, "square": s * s} for r in records for s in [r["point"]["train"]["seed"]])
    for name, (mtime, content) in before.items():  # the finished ones were not rewritten
        path = out / "points" / name
        assert (path.stat().st_mtime_ns, path.read_bytes()) == (mtime, content)
    finished = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    finished = [e["id"] for e in finished if e["event"] in ("done", "failed")]
    assert len(finished) == 6 and len(set(finished)) == 6  # each point ran to completion once
    assert not list((out / "points").glob(".*.tmp"))


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (children, grandchildren, ...), from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it exited while we looked
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an orphan zombie waits for a reaper that a
    container's init may never be; it holds no memory and runs nothing)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the workers")
def test_pool_workers_exit_when_the_sweep_is_killed(tmp_path):
    """Issue 13: a SIGKILL of the sweep's own process (not its process group) used to leave
    its pool workers running for good. Two points are stored and two are in flight, waiting
    at a gate that never opens (for 120 s); the workers must be gone within a few seconds."""
    grid = tmp_path / "grid.toml"
    grid.write_text('[problem]\ntasks = [2, 2]\nheads = 2\nL = 16\n[cross]\nseed = [0, 1, 2, 3]\n')
    out = tmp_path / "out"
    env = {**os.environ, "SWEEP_GATE": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "numerics.sweep", str(grid), "--out", str(out), "--workers", "2",
           "--point-fn", "test_sweep:gated_point", "--no-progress"]
    client = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while len(list((out / "points").glob("*.json"))) < 2:
            assert client.poll() is None, f"sweep exited early: {client.stderr.read().decode()}"
            assert time.monotonic() < deadline, "no point finished within 90 s"
            time.sleep(0.1)
        time.sleep(0.5)  # seeds 2 and 3 are now waiting at the gate, in flight
        below = descendants(client.pid)
        assert len(below) >= 2, f"expected the pool workers (and the fork server) below the sweep, got {below}"
        client.kill()  # SIGKILL to the sweep's process alone: nothing of it runs to clean up
        client.wait()
        deadline = time.monotonic() + 5
        while any(running(pid) for pid in below) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in below if running(pid)]
        assert not left, f"processes of the killed sweep still running 5 s later: {left}"
    finally:
        os.killpg(client.pid, signal.SIGKILL)  # whatever survived a failing test
        client.wait()


def test_the_library_imports_neither_sweep_nor_bench():
    """Nothing of numerics/ outside numerics/sweep and numerics/bench imports them (the library
    never depends on the command lines beside it); stored points named with an earlier name of
    the default point function still resolve to it."""
    for path in (REPO / "numerics").rglob("*.py"):
        if path.parent.name in ("sweep", "bench"):
            continue
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+numerics\.(sweep|bench)\b", text, re.M), path
    assert sweep.resolve_point_fn("tools.sweep:train_point") is sweep.train_point


# --- storage and bad input ---------------------------------------------------------------------------

def test_storage_is_atomic_and_ignores_strays(tmp_path):
    points = expand_grid(tiny_spec(seed=[0, 1]))
    run_grid(points, tmp_path, scheduler="serial", progress=False, point_fn=f"{__name__}:gated_point",
             grid_text="# the grid\n")
    assert (tmp_path / "grid.toml").read_text() == "# the grid\n"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["done"] == 2 and len(summary["ids"]) == 2
    files = sorted((tmp_path / "points").glob("*.json"))
    # a torn write (impossible through os.replace, but a hand-edited file) and a temporary
    files[0].write_text('{"id": "trunc')
    (tmp_path / "points" / ".x.json.123.tmp").write_text("{")
    assert len(load_results(tmp_path)) == 1
    again = run_grid(points, tmp_path, scheduler="serial", progress=False,
                     point_fn=f"{__name__}:gated_point")
    assert (again.done, again.skipped) == (1, 1)  # the unreadable one was run again and replaced
    assert len(load_results(tmp_path)) == 2


def test_bad_arguments_get_clear_errors(tmp_path, capsys, monkeypatch):
    points = expand_grid(tiny_spec(seed=[0]))
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        run_grid(points, tmp_path, workers=0)
    with pytest.raises(ValueError, match="retries must be a non-negative integer"):
        run_grid(points, tmp_path, retries=-1)
    with pytest.raises(ValueError, match="unknown scheduler 'nonsense'"):
        run_grid(points, tmp_path, scheduler="nonsense")
    with pytest.raises(ValueError, match="cannot import module"):
        run_grid(points, tmp_path, point_fn="no_such_module:fn")
    with pytest.raises(ValueError, match="'module:function'"):
        run_grid(points, tmp_path, point_fn="just_a_name")
    assert not (tmp_path / "points").exists()  # nothing written before the arguments are checked
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the [dask] extra were not installed
    with pytest.raises(RuntimeError, match=r"pip install -e \.\[dask\]"):
        run_grid(points, tmp_path / "d", scheduler="local", progress=False)
    assert sweep.main([str(tmp_path / "missing.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        sweep.main(["--help"])
    assert exit_.value.code == 0
    assert "--retry-failed" in capsys.readouterr().out


def test_select_results_filters_and_keeps_the_latest_code_version():
    def record(model, heads, L, seed, finished, error=None):
        point = {"model": model, "problem": {"tasks": [2, 2], "heads": heads, "L": L, "sigma": 0.0},
                 "train": {"seed": seed}}
        return {"id": f"{model}{heads}{L}{seed}{finished}", "point": point, "result": {"finished": finished},
                "error": error, "finished_at": finished}
    records = [record("full", 2, 16, 0, "2026-01-01"), record("full", 2, 16, 0, "2026-02-01"),  # two code versions
               record("full", 2, 32, 0, "2026-01-01"), record("reduced", 2, 16, 0, "2026-01-01"),
               record("full", 1, 16, 0, "2026-01-01", error="ValueError: x")]
    chosen = sweep.select_results(records, model="full", L=16, tasks=(2, 2), sigma=0)
    assert [r["result"]["finished"] for r in chosen] == ["2026-02-01"]
    assert len(sweep.select_results(records, model="full")) == 2  # the failed one left out
    assert len(sweep.select_results(records, model="full", include_failed=True)) == 3
    assert sweep.select_results(records, heads=3) == []


@pytest.mark.thorough
def test_sigterm_stops_cleanly_and_keeps_what_finished(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('[problem]\ntasks = [2, 2]\nheads = 2\nL = 16\n[cross]\nseed = [0, 1, 2, 3]\n')
    out = tmp_path / "out"
    env = {**os.environ, "SWEEP_GATE": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "numerics.sweep", str(grid), "--out", str(out), "--workers", "2",
           "--point-fn", "test_sweep:gated_point", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while len(list((out / "points").glob("*.json"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130  # it does not wait for the points stuck at the gate
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "run the same command again to resume" in proc.stderr.read()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["done"] == 2
    assert len(load_results(out)) == 2


@pytest.mark.dask
@pytest.mark.thorough
def test_dask_scheduler_address(serial_reference, tmp_path):
    """Connecting to a running scheduler (here a LocalCluster started by the test)."""
    distributed = pytest.importorskip("distributed")
    points, reference = serial_reference
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        summary = run_grid(points, tmp_path, scheduler=cluster.scheduler_address, progress=False)
    assert (summary.done, summary.failed) == (4, 0)
    for key, record in by_point(load_results(tmp_path)).items():
        assert without_timing(record["result"]) == without_timing(reference[key]["result"])


def test_authors_grid_is_the_runs_claims_5_and_6_ask_for():
    """examples/authors_converged.toml's points are the converged runs limiting-error and multi-head-gain train at
    the authors' configuration (quick profile, report seed 0), identity for identity, so a sweep of it leaves the
    build nothing to train (the store matches points by their normalised identity)."""
    from dataclasses import replace

    import claims
    from claims.core import configurations
    from numerics.experiments.converged import _normalise_point, converged_point
    from numerics.engine import trained_run_seed

    grid = expand_grid(sweep_grid.load_grid(REPO / "examples" / "authors_converged.toml")[0])
    wanted = []
    for cid in ("limiting-error", "multi-head-gain"):
        p = claims.spec_of(cid).profile("quick", {"tasks": (16, 17, 17), "heads": 3, "L": 100})
        for base, Ls in configurations(p):
            for L in Ls:
                for heads in ((base.heads, 1) if cid == "multi-head-gain" else (base.heads,)):
                    wanted.append(converged_point(replace(base, heads=heads, L=int(L)), p.schedule,
                                                  trained_run_seed(0, base.tasks, base.sigma, L)))
    key = lambda point: repr(_normalise_point(point))  # noqa: E731 - the store's own comparison
    assert sorted(map(key, grid)) == sorted(set(map(key, wanted))) and len(grid) == 4
