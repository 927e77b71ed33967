"""Performance benchmark of the training step: ours against the standard way, and against
this machine's limits.

``python -m numerics.bench`` measures, in one run, on one device:

1. seconds per gradient step (sample prompts + forward + backward + update) of our trainer
   (``numerics.train.train``, timed inside a real run: :class:`TrainerSteps`) against
   :class:`numerics.reference.ReferenceAttention`, the same model written the standard way
   (per-head q/k/v linear layers over every token), at the quick configuration (tasks
   4,4,4, H = 3, L = 256, batch 4096), in each dtype, and the ratio; also the step without
   sampling on a fixed batch (where the two differ) and the sampling alone (what they share);
2. the roofline of our step: the bytes it must move (:func:`bytes_moved`) over the
   measured memory bandwidth and its FLOPs (:func:`flops`) over the measured dense-matmul
   throughput, each as the fraction of the step time it accounts for;
3. wall time of the reduced ODE (``train_reduced``) against full gradient flow (``train``)
   to the same time t on the quick configuration;
4. how the step time grows with L, d, H and batch (least-squares exponents of log time
   against log size, over 4 sizes each, one size varied at a time);
5. peak memory of one step at the quick and the paper configuration (tasks 8,8,8,8, H = 4,
   L = 1024, batch 4096): resident-set peak in a fresh process on CPU,
   ``torch.cuda.max_memory_allocated`` on CUDA (:func:`peak_memory`).

Timings are medians over rounds, with min and max; the contenders of a comparison are run
interleaved, round by round (:func:`time_interleaved`), so a shared machine's drifting load
hits all of them alike, and process CPU time is recorded next to wall time.  Everything is
also written as JSON (``--out``); the load average at start and end is in ``meta``.

Precision policy: TF32 is switched off (``fp32_precision = "ieee"``) before anything runs,
so a float32 matmul is a float32 matmul on every device (docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from numerics.config import ProblemConfig
from numerics.data import make_generator, sample_prompts
from numerics.model import MultiHeadAttention, mse_loss
from numerics.reference import ReferenceAttention, gd_step
from numerics.train import TrainConfig, train, train_reduced

QUICK = dict(tasks=(4, 4, 4), heads=3, L=256, batch=4096)
PAPER = dict(tasks=(8, 8, 8, 8), heads=4, L=1024, batch=4096)
# --quick: a smoke test of every code path in seconds (the numbers mean nothing)
SMOKE = dict(tasks=(2, 2), heads=2, L=32, batch=128)
LR = 0.05                 # the trainer's default eta; the step's cost does not depend on it
DTYPES = ("float32", "float64")


@dataclass
class BenchConfig:
    device: str = "cpu"
    dtypes: tuple = DTYPES
    repeats: int = 5          # rounds of the step comparison, repeats of the probes
    warmup: int = 2           # untimed probe calls; > 0: one untimed round of each comparison
    quick: bool = False       # smoke-test sizes
    seed: int = 0
    reduced_time: float = 0.5  # gradient-flow time t of section 3 (t / lr steps)
    scaling_steps: int = 4    # timed rounds of section 4
    progress: bool = True
    out: str | None = None    # JSON path
    threads: int | None = None  # torch intra-op threads (None: torch's default)


# ---------------------------------------------------------------------------------------
# timing helpers


def precise_float32() -> dict:
    """Switch TF32 off so float32 matmuls are IEEE float32 on every device; returns the
    settings in force (recorded in the JSON).  Uses the fp32_precision API where this
    torch has it (new torch refuses to read the legacy allow_tf32 flags when they disagree
    with it; both say "off" here, as numerics.train sets them)."""
    torch.set_float32_matmul_precision("highest")
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
        return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
                "cuda.matmul.fp32_precision": torch.backends.cuda.matmul.fp32_precision,
                "cudnn.fp32_precision": torch.backends.cudnn.fp32_precision}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def summary(samples: list[float]) -> dict:
    """Median, min and max of the samples (and the samples themselves)."""
    return {"median": float(np.median(samples)), "min": float(np.min(samples)),
            "max": float(np.max(samples)), "n": len(samples), "samples": [float(s) for s in samples]}


def time_repeated(fn: Callable[[], object], repeats: int, warmup: int, device: str) -> dict:
    """Seconds per call of ``fn``: ``warmup`` untimed calls, then ``repeats`` timed ones,
    each timed on its own with the device synchronised before and after."""
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return summary(samples)


def time_interleaved(fns: dict, rounds: int, warmup: int, device: str) -> dict:
    """Seconds per call of each function in ``fns``, measured in interleaved rounds: every
    round times one call of each, in an order rotated from round to round.  On a shared
    machine the load drifts over seconds; interleaving exposes every contender to the same
    drift, so their ratios stay meaningful even when the absolute times are inflated.
    A function may return a list of (wall, cpu) second pairs instead of None
    (``TrainerSteps``): those are its samples for the round.  The first ``warmup`` rounds
    are untimed.

    Each summary also holds ``cpu``: the process CPU time (all threads) per call.  Waiting
    for a core does not count in it, so on a contended machine it is the steadier figure
    (spinning threads still add some); on a GPU it is host time only."""
    names = list(fns)
    wall: dict = {k: [] for k in names}
    cpu: dict = {k: [] for k in names}
    for r in range(warmup + rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            got = fns[k]()
            sync(device)
            if r < warmup:
                continue
            pairs = got if isinstance(got, list) else [(time.perf_counter() - t0, time.process_time() - c0)]
            wall[k].extend(p[0] for p in pairs)
            cpu[k].extend(p[1] for p in pairs)
    return {k: {**summary(wall[k]), "cpu": summary(cpu[k])} for k in names}


def _ratio_summary(slow: dict, fast: dict) -> dict:
    """slow/fast from medians, with the worst and best case from the extremes."""
    return {"median": slow["median"] / fast["median"], "min": slow["min"] / fast["max"],
            "max": slow["max"] / fast["min"]}


# ---------------------------------------------------------------------------------------
# machine limits


def memory_bandwidth(device: str, nbytes: int = 256 * 2**20, repeats: int = 7, warmup: int = 2) -> dict:
    """Measured memory bandwidth in bytes/s: ``dst.copy_(src)`` of ``nbytes`` (reads
    nbytes, writes nbytes: 2 * nbytes moved) and ``torch.add(a, b, out=c)`` (3 * nbytes).
    Sized far beyond any cache, so this is DRAM (or HBM) bandwidth."""
    n = nbytes // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    other = torch.rand(n, device=device)
    copy = time_repeated(lambda: dst.copy_(src), repeats, warmup, device)
    add = time_repeated(lambda: torch.add(src, other, out=dst), repeats, warmup, device)
    del src, dst, other
    return {
        "bytes": nbytes,
        "copy_bytes_per_s": _rate(2 * nbytes, copy),
        "add_bytes_per_s": _rate(3 * nbytes, add),
    }


def matmul_throughput(device: str, dtype: torch.dtype, n: int, repeats: int = 5, warmup: int = 2) -> dict:
    """Measured dense matmul throughput in FLOP/s: an n x n by n x n product is 2 n^3 FLOPs."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, dtype=dtype, device=device, generator=g)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=g)
    out = torch.empty_like(a)
    t = time_repeated(lambda: torch.matmul(a, b, out=out), repeats, warmup, device)
    return {"n": n, "flop_per_s": _rate(2 * n**3, t)}


def _rate(amount: float, timing: dict) -> dict:
    """amount / seconds as median, min (slowest run) and max (fastest run)."""
    return {"median": amount / timing["median"], "min": amount / timing["max"],
            "max": amount / timing["min"]}


# ---------------------------------------------------------------------------------------
# the step: ours, the reference, and their cost model


def problem(sizes: dict, dtype: str, device: str, **over) -> ProblemConfig:
    return ProblemConfig(tasks=tuple(sizes["tasks"]), heads=sizes["heads"], L=sizes["L"],
                         dtype=dtype, device=device, **over)


def our_step(cfg: ProblemConfig, batch: int, seed: int = 0) -> Callable[[], torch.Tensor]:
    """One step of our model written out: sample a fresh batch, forward, backward, plain
    GD update.  The trainer's own step is timed inside ``train`` (:class:`TrainerSteps`);
    this bare version isolates the step from the trainer's bookkeeping."""
    model = MultiHeadAttention(cfg)
    gen = make_generator(seed, cfg.device)

    def step():
        prompts = sample_prompts(cfg, batch, gen)
        return gd_step(model, prompts, LR, mse_loss)
    return step


def reference_step(cfg: ProblemConfig, batch: int, seed: int = 0) -> Callable[[], torch.Tensor]:
    """One step of the standard-way reference, on the same prompt stream and weights."""
    ref = ReferenceAttention.from_model(MultiHeadAttention(cfg))
    gen = make_generator(seed, cfg.device)

    def step():
        prompts = sample_prompts(cfg, batch, gen)
        return gd_step(ref, prompts, LR, mse_loss)
    return step


def sampling_only(cfg: ProblemConfig, batch: int, seed: int = 0) -> Callable[[], object]:
    gen = make_generator(seed, cfg.device)
    return lambda: sample_prompts(cfg, batch, gen)


def model_only_step(cfg: ProblemConfig, batch: int, which: str = "ours",
                    seed: int = 0) -> Callable[[], torch.Tensor]:
    """Forward + backward + update on one fixed batch, no sampling: the part of the step
    where the two implementations differ."""
    model = MultiHeadAttention(cfg)
    if which == "reference":
        model = ReferenceAttention.from_model(model)
    prompts = sample_prompts(cfg, batch, make_generator(seed, cfg.device))
    return lambda: gd_step(model, prompts, LR, mse_loss)


class TrainerSteps:
    """Seconds per step of ``numerics.train.train`` itself, from inside a real run.

    Calling the object runs ``train`` (or ``train_reduced``) for ``steps`` steps and returns
    the durations of its steps.  The trainer draws one batch per step with
    ``numerics.train.sample_prompts``; for the duration of the run that name is wrapped to
    record a (device-synchronised) timestamp at each call, so the interval between two
    draws is exactly one step of the trainer: sampling, loss, divergence check, gradient,
    update.  Intervals that contain a record (trajectory readout, at the first and last
    step with ``records=2``) are dropped, so what remains is the step a long run repeats;
    the per-run set-up is left out (``setup_seconds`` of the last call shows its size)."""

    def __init__(self, cfg: ProblemConfig, batch: int, steps: int = 3, seed: int = 0,
                 reduced: bool = False):
        if steps < 3:
            raise ValueError(f"TrainerSteps needs steps >= 3 (two are records), got {steps}")
        self.cfg, self.reduced = cfg, reduced
        self.tcfg = TrainConfig(lr=LR, time=LR * steps, batch=batch, seed=seed, records=2,
                                progress=False)
        self.setup_seconds = float("nan")

    def __call__(self) -> list[float]:
        import numerics.train as trainer
        stamps: list[float] = []
        cpu_stamps: list[float] = []
        original = trainer.sample_prompts

        def stamped(*args, **kwargs):
            sync(self.cfg.device)
            stamps.append(time.perf_counter())
            cpu_stamps.append(time.process_time())
            return original(*args, **kwargs)

        trainer.sample_prompts = stamped
        try:
            t0 = time.perf_counter()
            res = (train_reduced if self.reduced else train)(self.cfg, self.tcfg)
        finally:
            trainer.sample_prompts = original
        if len(stamps) != res.steps + 1:
            raise RuntimeError(f"expected one sample_prompts call per step ({res.steps + 1}), saw "
                               f"{len(stamps)}: numerics.train changed, update numerics.bench.TrainerSteps")
        self.setup_seconds = stamps[0] - t0
        # interval k covers step k; step 0 holds the first record's readout
        return [(b - a, cb - ca) for a, b, ca, cb in
                zip(stamps[1:-1], stamps[2:], cpu_stamps[1:-1], cpu_stamps[2:])]


def item_bytes(cfg: ProblemConfig) -> int:
    return torch.tensor([], dtype=cfg.torch_dtype).element_size()


def bytes_moved(cfg: ProblemConfig, batch: int) -> dict:
    """Bytes one step of our model must move (no fusion across operations assumed).

    With E = B L D elements in the context tensor (D = d + m) and G = B L H in each
    logit-sized tensor, one step touches

        sampling:  write the context once                                   E
        forward:   logits = a Z^T (read Z, write G), softmax (read G, write G),
                   c = p Z (read Z, read G)                                 2E + 4G
        backward:  dp = dc Z^T (read Z, write G), dlogits = p (dp - <p, dp>)
                   (read 2G, write G), da = dlogits Z (read Z, read G)      2E + 5G
        total:     5 E + 9 G elements, times the item size.

    The parameters (O(H D^2) elements) and the intermediate x, y of the sampler before
    they are copied into the context are left out, so this is a lower bound for an
    unfused step (a fully fused kernel could get by with 3 E: one write, one read forward,
    one read backward)."""
    D, H, L = cfg.token_dim, cfg.heads, cfg.L
    E, G = batch * L * D, batch * L * H
    item = item_bytes(cfg)
    return {"formula": "itemsize * (5*B*L*D + 9*B*L*H)", "context_elements": E,
            "sampling_bytes": item * E, "model_bytes": item * (4 * E + 9 * G),
            "bytes": item * (5 * E + 9 * G)}


def flops(cfg: ProblemConfig, batch: int) -> dict:
    """FLOPs of one step of our model: 2 B L D H for each of the four context products
    (logits, c, dp, da: 8 B L D H), about 9 B L H for softmax forward and backward, and
    2 B L d for the labels y = <g_i, x_i> of the sampler; the parameter gradients
    (O(B D^2 H)) are negligible.  The B L (d + m) Gaussian draws are not counted."""
    D, H, L, d = cfg.token_dim, cfg.heads, cfg.L, cfg.d
    model = 8 * batch * L * D * H + 9 * batch * L * H
    return {"formula": "8*B*L*D*H + 9*B*L*H + 2*B*L*d", "sampling_flops": 2 * batch * L * d,
            "model_flops": model, "flops": model + 2 * batch * L * d}


def roofline(moved: dict, fl: dict, bandwidth: float, flop_rate: float,
             step_seconds: float, model_seconds: float, working_set_bandwidth: float) -> dict:
    """Fractions of the machine's limits reached: (bytes / bandwidth) / time and
    (FLOPs / matmul throughput) / time, for the whole step (sampling included) and for
    forward + backward + update alone.  ``bandwidth`` is the large-array (DRAM/HBM) copy
    rate; ``working_set_bandwidth`` the copy rate of an array the size of the context
    tensor, which a large last-level cache may hold (then it, not DRAM, is the ceiling)."""
    return {
        "working_set_bytes_per_s": working_set_bandwidth,
        "fraction_of_working_set_bound": moved["bytes"] / working_set_bandwidth / step_seconds,
        "model_fraction_of_working_set_bound": moved["model_bytes"] / working_set_bandwidth / model_seconds,
        "bytes": moved, "flops": fl, "step_seconds": step_seconds, "model_seconds": model_seconds,
        "memory_time_seconds": moved["bytes"] / bandwidth,
        "fraction_of_memory_bound": moved["bytes"] / bandwidth / step_seconds,
        "compute_time_seconds": fl["flops"] / flop_rate,
        "fraction_of_matmul_peak": fl["flops"] / flop_rate / step_seconds,
        "model_fraction_of_memory_bound": moved["model_bytes"] / bandwidth / model_seconds,
        "model_fraction_of_matmul_peak": fl["model_flops"] / flop_rate / model_seconds,
        "achieved_bytes_per_s": moved["bytes"] / step_seconds,
        "achieved_flop_per_s": fl["flops"] / step_seconds,
    }


# ---------------------------------------------------------------------------------------
# peak memory


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
    unseen, so it may read lower; used by ``--quick``, where only the code path matters)."""
    if not device.startswith("cuda") and not fresh_process:
        return measure_step_memory_cpu(sizes, dtype, which, seed)
    if device.startswith("cuda"):
        cfg = problem(sizes, dtype, device)
        step = (our_step if which == "ours" else reference_step)(cfg, sizes["batch"], seed)
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", "import sys; from numerics.bench import "
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
    import gc
    cfg = problem(sizes, dtype, "cpu")
    make = our_step if which == "ours" else reference_step
    make(cfg, 2, seed)()                              # load libraries, start thread pools
    step = make(cfg, sizes["batch"], seed)
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
    return {"bytes": int(peak - before) * 1024, "baseline_bytes": int(before) * 1024,
            "method": method}


def _peak_memory_child(payload: str) -> None:
    args = json.loads(payload)
    torch.set_num_threads(args["threads"])
    res = measure_step_memory_cpu(args["sizes"], args["dtype"], args["which"], args["seed"])
    res["method"] += ", fresh process"
    print(json.dumps(res))


# ---------------------------------------------------------------------------------------
# the benchmark


def fit_exponent(sizes: list[float], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(size): time ~ size^exponent."""
    slope, _ = np.polyfit(np.log(sizes), np.log(seconds), 1)
    return float(slope)


def scaling_grid(quick: bool) -> dict:
    """Sizes of section 4, each varied alone around the quick configuration."""
    if quick:
        base = dict(SMOKE)
        return {"base": base, "L": [8, 16, 32, 64], "r": [1, 2, 3, 4],
                "heads": [1, 2, 3, 4], "batch": [32, 64, 128, 256]}
    base = dict(QUICK)
    return {"base": base, "L": [64, 128, 256, 512], "r": [2, 4, 8, 16],
            "heads": [1, 2, 4, 8], "batch": [512, 1024, 2048, 4096]}


def run_bench(bc: BenchConfig) -> dict:
    t_start = time.perf_counter()
    if bc.threads is not None:
        torch.set_num_threads(bc.threads)
    precision = precise_float32()
    dev = bc.device
    main = SMOKE if bc.quick else QUICK
    paper = SMOKE if bc.quick else PAPER
    reps, warm = bc.repeats, bc.warmup
    slow_reps = 1 if bc.quick else max(3, reps // 2)   # rounds of the seconds-long runs
    out: dict = {"meta": _meta(bc, precision), "configs": {
        "quick": {**main, "param": "factored"}, "paper": {**paper, "param": "factored"},
        "lr": LR}}
    bar = _bar(bc)
    marks: list = []

    def phase(name: str) -> None:   # progress bar label, and the wall time of each part
        marks.append((name, time.perf_counter()))
        bar.set_description(name)

    # -- machine limits ----------------------------------------------------------------
    phase("probes")
    # 256 MiB is far beyond a CPU's caches; a GPU copies it in ~0.1 ms, too close to the
    # launch and synchronisation overhead, so 2 GiB there (still far beyond its 60 MB L2)
    mib = 4 if bc.quick else (2048 if dev.startswith("cuda") else 256)
    probes = {"bandwidth": memory_bandwidth(dev, mib * 2**20, reps, warm)}
    for dt in bc.dtypes:
        n = 128 if bc.quick else (8192 if dev.startswith("cuda") else 1536)
        probes[dt] = {"matmul": matmul_throughput(dev, getattr(torch, dt), n, min(reps, 5), warm)}
    out["probes"] = probes
    bar.update(1)

    # -- 1. ours against the reference; 2. roofline ------------------------------------
    out["step"], out["roofline"] = {}, {}
    for dt in bc.dtypes:
        phase(f"step {dt}")
        cfg = problem(main, dt, dev)
        B = main["batch"]
        trainer = TrainerSteps(cfg, B, steps=3, seed=bc.seed)   # 2 timed steps per round
        t = time_interleaved({
            "trainer": trainer,
            "reference": reference_step(cfg, B, bc.seed),
            "bare_step": our_step(cfg, B, bc.seed),
            "sampling": sampling_only(cfg, B, bc.seed),
            "model_only": model_only_step(cfg, B, "ours", bc.seed),
            "reference_model_only": model_only_step(cfg, B, "reference", bc.seed),
        }, reps, min(warm, 1), dev)
        ratio = _ratio_summary(t["reference"], t["trainer"])
        out["step"][dt] = {
            "trainer_seconds": t["trainer"], "trainer_setup_seconds": trainer.setup_seconds,
            "bare_step_seconds": t["bare_step"], "sampling_seconds": t["sampling"],
            "model_only_seconds": t["model_only"], "reference_seconds": t["reference"],
            "reference_model_only_seconds": t["reference_model_only"],
            "ratio_reference_over_trainer": ratio,
            "ratio_reference_over_bare_step": _ratio_summary(t["reference"], t["bare_step"]),
            "ratio_model_only": _ratio_summary(t["reference_model_only"], t["model_only"]),
            # the sampling both share caps the full-step ratio at reference / sampling
            "ratio_cap_from_sampling": t["reference"]["median"] / t["sampling"]["median"],
            "sampling_share_of_bare_step": t["sampling"]["median"] / t["bare_step"]["median"],
            # the same ratios in process CPU time (steadier under contention; host time on a GPU)
            "cpu_ratio_reference_over_trainer": t["reference"]["cpu"]["median"] / t["trainer"]["cpu"]["median"],
            "cpu_ratio_model_only": t["reference_model_only"]["cpu"]["median"] / t["model_only"]["cpu"]["median"],
            "target_ratio": 10.0, "meets_target": ratio["median"] >= 10.0,
        }
        moved = bytes_moved(cfg, B)
        ws = memory_bandwidth(dev, item_bytes(cfg) * moved["context_elements"], reps, warm)
        probes[dt]["bandwidth_at_context_size"] = ws
        out["roofline"][dt] = roofline(
            moved, flops(cfg, B), probes["bandwidth"]["copy_bytes_per_s"]["median"],
            probes[dt]["matmul"]["flop_per_s"]["median"], t["trainer"]["median"],
            t["model_only"]["median"], ws["copy_bytes_per_s"]["median"])
        bar.update(1)

    # -- 3. reduced ODE against full gradient flow -----------------------------------------
    steps = max(1, round(bc.reduced_time / LR))
    out["reduced_vs_full"] = {"time_t": bc.reduced_time, "lr": LR, "steps": steps,
                              "batch": main["batch"]}
    for dt in bc.dtypes:
        phase(f"reduced vs full {dt}")
        cfg = problem(main, dt, dev)
        tcfg = TrainConfig(lr=LR, time=bc.reduced_time, batch=main["batch"], seed=bc.seed,
                           records=2, progress=False)
        t = time_interleaved({"full": lambda: train(cfg, tcfg),
                              "reduced": lambda: train_reduced(cfg, tcfg)}, slow_reps, 0, dev)
        # both draw the same steps + 1 batches: section 1's sampling time is their common floor
        floor = (steps + 1) * out["step"][dt]["sampling_seconds"]["median"]
        out["reduced_vs_full"][dt] = {
            "full_seconds": t["full"], "reduced_seconds": t["reduced"],
            "sampling_floor_seconds": floor, "speedup": _ratio_summary(t["full"], t["reduced"])}
        bar.update(1)

    # -- 4. scaling --------------------------------------------------------------------
    grid = scaling_grid(bc.quick)
    dt = bc.dtypes[0]
    scaling: dict = {"dtype": dt, "base": grid["base"], "step": "bare step (sampling included)"}
    for axis in ("L", "r", "heads", "batch"):
        phase(f"scaling {axis}")
        fns, xs = {}, []
        for v in grid[axis]:
            sizes = dict(grid["base"])
            if axis == "r":
                sizes["tasks"] = tuple(v for _ in grid["base"]["tasks"])
            else:
                sizes[axis] = v
            cfg = problem(sizes, dt, dev)
            x = cfg.d if axis == "r" else v
            fns[x] = our_step(cfg, sizes["batch"], bc.seed)
            xs.append(x)
        t = time_interleaved(fns, bc.scaling_steps, min(warm, 1), dev)
        ts = [t[x] for x in xs]
        name = "d" if axis == "r" else axis
        scaling[name] = {"sizes": xs, "seconds": ts,
                         "exponent": fit_exponent(xs, [s["median"] for s in ts]),
                         "exponent_cpu_time": fit_exponent(xs, [s["cpu"]["median"] for s in ts])}
        bar.update(1)
    out["scaling"] = scaling

    # -- 5. peak memory -------------------------------------------------------------------
    phase("peak memory")
    mem: dict = {}
    for dt in bc.dtypes:
        if bc.quick:   # one in-process measurement exercises the path; sizes are tiny
            if dt == bc.dtypes[0]:
                mem[dt] = {"ours_quick": peak_memory(main, dt, dev, "ours", bc.seed, fresh_process=False)}
            continue
        mem[dt] = {"ours_quick": peak_memory(main, dt, dev, "ours", bc.seed),
                   "reference_quick": peak_memory(main, dt, dev, "reference", bc.seed),
                   "ours_paper": peak_memory(paper, dt, dev, "ours", bc.seed)}
        if dev.startswith("cuda"):
            # the reference at the paper size needs tens of GB: only where a GPU holds it
            mem[dt]["reference_paper"] = peak_memory(paper, dt, dev, "reference", bc.seed)
    out["peak_memory"] = mem
    bar.update(1)
    bar.close()

    marks.append(("end", time.perf_counter()))
    out["meta"]["section_seconds"] = {a[0]: b[1] - a[1] for a, b in zip(marks, marks[1:])}
    out["meta"]["loadavg_end"] = list(os.getloadavg())
    out["meta"]["seconds"] = time.perf_counter() - t_start
    return out


def _meta(bc: BenchConfig, precision: dict) -> dict:
    meta = {"device": bc.device, "dtypes": list(bc.dtypes), "repeats": bc.repeats,
            "warmup": bc.warmup, "quick": bc.quick, "seed": bc.seed,
            "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "precision": precision,
            "loadavg_start": list(os.getloadavg()),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if bc.device.startswith("cuda"):
        meta["gpu"] = torch.cuda.get_device_name(bc.device)
    return meta


def _bar(bc: BenchConfig):
    from tqdm.auto import tqdm
    total = 1 + 2 * len(bc.dtypes) + 4 + 1
    return tqdm(total=total, disable=not bc.progress, file=sys.stderr, leave=False)


# ---------------------------------------------------------------------------------------
# printing


def _fmt_t(s: dict, unit: float = 1e3) -> str:
    return f"{s['median'] * unit:9.2f} [{s['min'] * unit:.2f}, {s['max'] * unit:.2f}]"


def render(res: dict) -> str:
    """The human-readable table of a result dict (what the CLI prints)."""
    m = res["meta"]
    lines = [f"numerics.bench  device={m['device']}  torch {m['torch']}  threads={m['torch_threads']}"
             f"  load average {m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end",
             "medians over repeats, [min, max]", ""]
    bw = res["probes"]["bandwidth"]
    lines.append(f"memory bandwidth: copy {bw['copy_bytes_per_s']['median'] / 1e9:.2f} GB/s,"
                 f" add {bw['add_bytes_per_s']['median'] / 1e9:.2f} GB/s ({bw['bytes'] / 2**20:.0f} MiB arrays)")
    for dt in m["dtypes"]:
        mm = res["probes"][dt]["matmul"]
        lines.append(f"dense matmul {dt} (n = {mm['n']}): {mm['flop_per_s']['median'] / 1e9:.1f} GFLOP/s")
    q = res["configs"]["quick"]
    lines += ["", f"1. milliseconds per gradient step, tasks {tuple(q['tasks'])}, H = {q['heads']},"
                  f" L = {q['L']}, batch {q['batch']}"]
    for dt, s in res["step"].items():
        r, rm = s["ratio_reference_over_trainer"], s["ratio_model_only"]
        lines += [
            f"  {dt}  ours (train())  {_fmt_t(s['trainer_seconds'])}   reference {_fmt_t(s['reference_seconds'])}"
            f"   ratio {r['median']:.1f}x [{r['min']:.1f}, {r['max']:.1f}]"
            f"   target 10x {'met' if s['meets_target'] else 'NOT met'}",
            f"  {dt}  ours bare step  {_fmt_t(s['bare_step_seconds'])}   of which sampling"
            f" {_fmt_t(s['sampling_seconds'])} ({100 * s['sampling_share_of_bare_step']:.0f}%)",
            f"  {dt}  without sampling: ours {_fmt_t(s['model_only_seconds'])}   reference"
            f" {_fmt_t(s['reference_model_only_seconds'])}   ratio {rm['median']:.1f}x;"
            f" sampling caps the full-step ratio at {s['ratio_cap_from_sampling']:.1f}x",
            f"  {dt}  in process CPU time: ratio {s['cpu_ratio_reference_over_trainer']:.1f}x,"
            f" without sampling {s['cpu_ratio_model_only']:.1f}x"]
    lines += ["", "2. roofline: share of our step's time that its bytes (at the copy bandwidth) and"
                  " FLOPs (at the matmul rate) account for"]
    for dt, r in res["roofline"].items():
        lines.append(f"  {dt}  step: {r['bytes']['bytes'] / 1e6:.0f} MB -> {100 * r['fraction_of_memory_bound']:.1f}%"
                     f" of memory bound, {r['flops']['flops'] / 1e9:.2f} GFLOP -> "
                     f"{100 * r['fraction_of_matmul_peak']:.1f}% of matmul peak;  without sampling:"
                     f" {100 * r['model_fraction_of_memory_bound']:.1f}% / {100 * r['model_fraction_of_matmul_peak']:.1f}%")
        lines.append(f"  {dt}  against the copy rate of a context-sized array"
                     f" ({r['working_set_bytes_per_s'] / 1e9:.1f} GB/s; a large cache may hold it):"
                     f" step {100 * r['fraction_of_working_set_bound']:.1f}%, without sampling"
                     f" {100 * r['model_fraction_of_working_set_bound']:.1f}%")
    rv = res["reduced_vs_full"]
    lines += ["", f"3. seconds to gradient-flow time t = {rv['time_t']} ({rv['steps']} steps, batch {rv['batch']})"]
    for dt in m["dtypes"]:
        r = rv[dt]
        lines.append(f"  {dt}  full {_fmt_t(r['full_seconds'], 1)}   reduced {_fmt_t(r['reduced_seconds'], 1)}"
                     f"   full / reduced {r['speedup']['median']:.2f}x   (drawing the prompts alone:"
                     f" {r['sampling_floor_seconds']:.2f})")
    sc = res["scaling"]
    lines += ["", f"4. step time ~ size^k ({sc['dtype']}, bare step, one size varied around the base)"]
    for axis in ("L", "d", "heads", "batch"):
        a = sc[axis]
        pts = ", ".join(f"{x}: {t['median'] * 1e3:.1f}" for x, t in zip(a["sizes"], a["seconds"]))
        lines.append(f"  {axis:6s} k = {a['exponent']:5.2f} (CPU time: {a['exponent_cpu_time']:5.2f})   (ms: {pts})")
    lines += ["", "5. peak memory one step adds (MiB)"]
    for dt, mm in res["peak_memory"].items():
        lines.append(f"  {dt}  " + ", ".join(f"{k} {v['bytes'] / 2**20:.0f}" for k, v in mm.items()))
    lines += ["", f"total {m['seconds']:.1f} s"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# CLI


def parse_args(argv=None) -> BenchConfig:
    p = argparse.ArgumentParser(
        prog="python -m numerics.bench",
        description="Benchmark the training step: ours vs the standard-way reference, the "
                    "roofline, reduced vs full flow, scaling in L/d/H/batch and peak memory. "
                    "Prints a table and writes JSON.")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N (default cpu); every measurement runs on it")
    p.add_argument("--dtype", default=",".join(DTYPES),
                   help="comma-separated dtypes to time: float32, float64 (default both); the "
                        "scaling section uses the first")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds of the step comparison (section 1: one call of each contender "
                        "per round, two trainer steps) and timed repeats of the probes; the whole "
                        "training runs of section 3 use max(3, repeats // 2) rounds, the scaling "
                        "section 4 rounds; medians, min and max are reported (default 5)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed warm-up calls of the probes; the interleaved comparisons run one "
                        "untimed round first when this is > 0 (default 2)")
    p.add_argument("--out", default=None, help="write the results as JSON to this path")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: tiny sizes, every code path in seconds; numbers are meaningless")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt stream (default 0)")
    p.add_argument("--reduced-time", type=float, default=0.5,
                   help="gradient-flow time t of the reduced-vs-full comparison (default 0.5, "
                        "i.e. t / lr = 10 steps of lr = 0.05)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op CPU threads (default: torch's choice, the core count). On "
                        "a machine shared with other jobs, 1 avoids threads waiting on each other "
                        "for a core, which can make small steps 10-100x slower")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    dtypes = tuple(s.strip() for s in a.dtype.split(",") if s.strip())
    for dt in dtypes:
        if dt not in DTYPES:
            p.error(f"--dtype: unknown dtype {dt!r}; use float32 and/or float64, comma-separated")
    if not dtypes:
        p.error("--dtype: give at least one of float32, float64")
    dev = a.device
    if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
        p.error(f"--device: unknown device {dev!r}; use cpu, cuda or cuda:N")
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            p.error(f"--device {dev}: no CUDA device is available here; use --device cpu")
        if ":" in dev and int(dev[5:]) >= torch.cuda.device_count():
            p.error(f"--device {dev}: only {torch.cuda.device_count()} CUDA device(s) here")
    if a.repeats < 1:
        p.error(f"--repeats must be a positive integer, got {a.repeats}")
    if a.threads is not None and a.threads < 1:
        p.error(f"--threads must be a positive integer, got {a.threads}")
    if a.warmup < 0:
        p.error(f"--warmup must be >= 0, got {a.warmup}")
    if not (math.isfinite(a.reduced_time) and a.reduced_time >= LR):
        p.error(f"--reduced-time must be a finite number >= {LR} (one step), got {a.reduced_time}")
    if a.quick:
        a.repeats, a.warmup = 1, 0
        a.reduced_time = LR
    bc = BenchConfig(device=dev, dtypes=dtypes, repeats=a.repeats, warmup=a.warmup, quick=a.quick,
                     seed=a.seed, reduced_time=a.reduced_time, progress=not a.no_progress,
                     scaling_steps=1 if a.quick else 4, out=a.out, threads=a.threads)
    return bc


def write_json(path: str, obj: dict) -> None:
    """Write atomically: a crash never leaves a half-written file at ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None) -> dict:
    bc = parse_args(argv)
    res = run_bench(bc)
    print(render(res))
    if bc.out:
        write_json(bc.out, res)
        print(f"wrote {bc.out}")
    return res


if __name__ == "__main__":
    main()
