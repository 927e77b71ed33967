"""Peak memory of one step: ``torch.cuda.max_memory_allocated`` on CUDA, the peak resident
set of a fresh process on CPU."""
from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys

import torch

from numerics.bench.steps import our_step, problem
from numerics.bench.timing import sync
from numerics.stored import REPO_ROOT



def peak_memory(sizes: dict, dtype: str, device: str, which: str = "ours", seed: int = 0,
                fresh_process: bool = True) -> dict:
    """Peak memory one step (sampling, forward, backward, update) adds on top of what is
    allocated before it (interpreter, libraries, model).

    CUDA: ``torch.cuda.max_memory_allocated`` over one step minus what was allocated
    before it.  CPU: tracemalloc cannot see torch's allocations, so one step runs in a
    fresh Python process, after the same step at batch 2 (libraries and thread pools
    loaded); the peak resident set is reset just before the step (``5`` written to
    ``/proc/self/clear_refs``, Linux >= 4.0) and the peak (VmHWM) after it, minus the
    resident set before it, is the measurement.  Where /proc cannot be reset the
    ``ru_maxrss`` growth is used instead, which reads 0 if an earlier transient (imports)
    peaked higher; ``method`` says which was used.  ``fresh_process=False`` measures in this
    process instead (memory the allocator kept from earlier work can then be reused
    unseen, so it may read lower; used by ``--smoke``, where only the code path matters)."""
    if not device.startswith("cuda") and not fresh_process:
        return measure_step_memory_cpu(sizes, dtype, which, seed)
    if device.startswith("cuda"):
        cfg = problem(sizes, dtype, device)
        step = our_step(cfg, sizes["batch"], seed, which)
        sync(device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        sync(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        return {"bytes": int(peak), "method": "torch.cuda.max_memory_allocated"}
    payload = json.dumps({"sizes": {**sizes, "tasks": list(sizes["tasks"])}, "dtype": dtype,
                          "which": which, "seed": seed, "threads": torch.get_num_threads()})
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", "import sys; from numerics.bench.memory import "
                           "_peak_memory_child as f; f(sys.argv[1])", payload],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"peak-memory subprocess failed ({which}, {dtype}, {sizes}):\n"
                           f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def measure_step_memory_cpu(sizes: dict, dtype: str, which: str = "ours", seed: int = 0) -> dict:
    """Peak resident-set growth over one step in this process (see :func:`peak_memory`)."""
    cfg = problem(sizes, dtype, "cpu")
    our_step(cfg, 2, seed, which)()                   # load libraries, start thread pools
    step = our_step(cfg, sizes["batch"], seed, which)
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                              # reset the peak resident set (VmHWM)
        before = _proc_status_kib("VmRSS")
        step()
        peak, method = _proc_status_kib("VmHWM"), "VmHWM after a /proc/self/clear_refs reset"
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux
        step()
        peak, method = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss growth"
    # the kernel updates its RSS counters in per-CPU batches, so a step that grows the resident set by less
    # than a batch can read a little below the baseline: no growth, 0 bytes
    return {"bytes": max(0, int(peak - before)) * 1024, "baseline_bytes": int(before) * 1024,
            "method": method}


def _peak_memory_child(payload: str) -> None:
    args = json.loads(payload)
    torch.set_num_threads(args["threads"])
    res = measure_step_memory_cpu(args["sizes"], args["dtype"], args["which"], args["seed"])
    res["method"] += ", fresh process"
    print(json.dumps(res))
