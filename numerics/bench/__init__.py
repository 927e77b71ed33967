"""Performance benchmark of the training step: ours against the standard way.

``python -m numerics.bench`` measures, in one run, on one device:

1. seconds per gradient step (sample prompts + forward + backward + update) of our trainer
   (``numerics.train.train``, timed inside a real run: :class:`TrainerSteps`) against
   :class:`numerics.bench.reference.ReferenceAttention`, the same model written the standard way
   (per-head q/k/v linear layers over every token), at the quick configuration (tasks
   4,4,4, H = 3, L = 256, batch 4096), in each dtype, and the ratio; also the step without
   sampling on a fixed batch (where the two differ) and the sampling alone (what they share);
2. wall time of the reduced ODE (``train_reduced``) against full gradient flow (``train``)
   to the same time t on the quick configuration;
3. peak memory of one step at the quick and the paper configuration (tasks 8,8,8,8, H = 4,
   L = 1024, batch 4096): resident-set peak in a fresh process on CPU,
   ``torch.cuda.max_memory_allocated`` on CUDA (:func:`peak_memory`);
4. runs per second of 8 runs trained one after another (``numerics.train.train``) and as
   ``numerics.train.train_many``'s batched programs, for three run sets (shared and own
   prompt streams), at the quick size and at the authors' configuration (tasks 16,17,17,
   H = 3, L = 100, batch 10000).

Profiles: ``--quick`` runs sections 1, 2 and 4 only at the quick size (the benchmark's
contract: the top-level JSON keys of :func:`contract`); the default runs all four;
``--smoke`` runs either at tiny sizes (a test of the code paths, numbers meaningless).

Timings are medians over rounds, with min and max; the contenders of a comparison are run
interleaved, round by round (:func:`time_interleaved`), so a shared machine's drifting load
hits all of them alike, and process CPU time is recorded next to wall time.  Everything is
also written as JSON (``--out``); the load average at start and end is in ``meta``.

Precision policy: TF32 is switched off (``fp32_precision = "ieee"``) before anything runs,
so a float32 matmul is a float32 matmul on every device (docs/performance.md).

This package: the sizes, the timers, the contenders, peak memory, the four sections and the
command line (flags, table, JSON); :mod:`numerics.bench.reference` the model written the standard
way; :mod:`numerics.bench.calibrate` the cost model's calibration (``--calibrate``).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from numerics.bench.reference import ReferenceAttention, gd_step
from numerics.config import ProblemConfig, use_precise_float32
from numerics.config import make_generator, sample_prompts
from numerics.io import (check_device_option, check_output_path, command_line, float_option, int_option, seed_option,
                         threads_option, write_output)
from numerics.model import MultiHeadAttention, initial_semi_singular_values, mse_loss
from numerics.train import MAX_STEPS, TrainConfig, train, train_many, train_reduced
from theory.reduced_ode import integrate_expansion_flow

QUICK = dict(tasks=(4, 4, 4), heads=3, L=256, batch=4096)
PAPER = dict(tasks=(8, 8, 8, 8), heads=4, L=1024, batch=4096)
# the authors' released script: dx = 50 split 16, 17, 17 by their DataGenerator, H = 3, L = 100,
# 10,000 fresh samples a step (docs/model.md)
AUTHORS = dict(tasks=(16, 17, 17), heads=3, L=100, batch=10000)
# section 4: R runs of one configuration trained one after another and as one program
BATCHED_RUNS = 8
BATCHED_STEPS = 3         # gradient steps per run (steps + 1 batches: a few are enough to time)
BATCHED_KINDS = ("mixed", "one_stream", "own_streams")
# --smoke: a smoke test of every code path in seconds (the numbers mean nothing)
SMOKE = dict(tasks=(2, 2), heads=2, L=32, batch=128)
LR = 0.05                 # the trainer's default eta; the step's cost does not depend on it
DTYPES = ("float32", "float64")
# the benchmark's targets (2 cores): ours over the standard implementation, and full over reduced flow
TARGETS = {"ratio_full_step": {"float32": 10.0, "float64": 15.0},
           "ratio_model_step": {"float32": 25.0, "float64": 25.0},
           "ratio_reduced_flow": {"float32": 3.0, "float64": 3.0},
           "ratio_expansion_flow": {"float32": 1000.0, "float64": 1000.0}}
EXPANSION_TIME = 60.0     # t of the expansion-flow comparison: TrainConfig's default horizon


# --- timing -----------------------------------------------------------------------------------------

def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def summary(samples: list[float]) -> dict:
    """Median, min and max of the samples (and the samples themselves)."""
    return {"median": float(np.median(samples)), "min": float(np.min(samples)),
            "max": float(np.max(samples)), "n": len(samples), "samples": [float(s) for s in samples]}


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
        for k in names[r % len(names):] + names[:r % len(names)]:
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


def ratio_summary(slow: dict, fast: dict) -> dict:
    """slow/fast from medians, with the worst and best case from the extremes."""
    return {"median": slow["median"] / fast["median"], "min": slow["min"] / fast["max"],
            "max": slow["max"] / fast["min"]}


# --- the contenders ---------------------------------------------------------------------------------

def problem(sizes: dict, dtype: str, device: str, **over) -> ProblemConfig:
    return ProblemConfig(tasks=tuple(sizes["tasks"]), heads=sizes["heads"], L=sizes["L"],
                         dtype=dtype, device=device, **over)


def _model(cfg: ProblemConfig, which: str):
    """Our model, or (``which="reference"``) the standard-way reference holding the same weights."""
    model = MultiHeadAttention(cfg)
    return ReferenceAttention.from_model(model) if which == "reference" else model


def _draw(cfg: ProblemConfig, batch: int, gen, held: list):
    """A fresh batch drawn as the trainer draws it: into the previous batch's tensors
    (``sample_prompts(out=)``), which ``held`` keeps from call to call."""
    held[:] = [sample_prompts(cfg, batch, gen, out=held[0] if held else None)]
    return held[0]


def our_step(cfg: ProblemConfig, batch: int, seed: int = 0, which: str = "ours"):
    """One step written out: sample a fresh batch, forward, backward, plain GD update, of our
    model or of the reference on the same prompt stream and weights.  The trainer's own step is
    timed inside ``train`` (:class:`TrainerSteps`); this bare version isolates the step from the
    trainer's bookkeeping."""
    model, gen, held = _model(cfg, which), make_generator(seed, cfg.device), []
    return lambda: gd_step(model, _draw(cfg, batch, gen, held), LR, mse_loss)


def sampling_only(cfg: ProblemConfig, batch: int, seed: int = 0):
    """Drawing one fresh batch, as the trainer does (into the previous batch's tensors)."""
    gen, held = make_generator(seed, cfg.device), []
    return lambda: _draw(cfg, batch, gen, held)


def model_only_step(cfg: ProblemConfig, batch: int, which: str = "ours", seed: int = 0):
    """Forward + backward + update on one fixed batch, no sampling: the part of the step
    where the two implementations differ."""
    model, prompts = _model(cfg, which), sample_prompts(cfg, batch, make_generator(seed, cfg.device))
    return lambda: gd_step(model, prompts, LR, mse_loss)


class TrainerSteps:
    """Seconds per step of ``numerics.train.train`` itself, from inside a real run.

    Calling the object runs ``train`` for ``steps`` (at least 3: the first and last hold a
    record) steps and returns the durations of its steps.  The trainer draws one batch per step
    with its ``batches`` seam; the source given here samples the trainer's own stream (same
    generator, same seed) and records a (device-synchronised) timestamp at each draw, so the
    interval between two draws is exactly one step of the trainer: sampling, loss, divergence
    check, gradient, update.  Intervals that contain a record (trajectory readout, at the first
    and last step with ``records=2``) are dropped, so what remains is the step a long run
    repeats; the per-run set-up is left out (``setup_seconds`` of the last call shows its size)."""

    def __init__(self, cfg: ProblemConfig, batch: int, steps: int = 3, seed: int = 0):
        self.cfg = cfg
        self.tcfg = TrainConfig(lr=LR, time=LR * steps, batch=batch, seed=seed, records=2, progress=False)
        self.setup_seconds = float("nan")

    def __call__(self) -> list[float]:
        stamps, cpu_stamps, held = [], [], []
        gen = make_generator(self.tcfg.seed, self.cfg.device)

        def stamped(step: int):
            sync(self.cfg.device)
            stamps.append(time.perf_counter())
            cpu_stamps.append(time.process_time())
            return _draw(self.cfg, self.tcfg.batch, gen, held)

        t0 = time.perf_counter()
        res = train(self.cfg, self.tcfg, batches=stamped)
        if len(stamps) != res.steps + 1:
            raise RuntimeError(f"expected one batch per step ({res.steps + 1}), saw {len(stamps)}: "
                               "numerics.train changed, update numerics.bench.TrainerSteps")
        self.setup_seconds = stamps[0] - t0
        # interval k covers step k; step 0 holds the first record's readout
        return [(b - a, cb - ca) for a, b, ca, cb in zip(stamps[1:-1], stamps[2:], cpu_stamps[1:-1], cpu_stamps[2:])]


def run_set(sizes: dict, dtype: str, device: str, kind: str, runs: int, steps: int, seed: int = 0):
    """``runs`` runs of one configuration, ``steps`` steps each (records at the ends), as an
    experiment asks for them: ``one_stream`` -- init scales 0.05 .. 0.4 on one prompt stream
    (an init-scale sweep, three-phases' runs, a race grid's cells at one data seed);
    ``own_streams`` -- one init scale, seeds seed .. seed + runs - 1 (replicates);
    ``mixed`` -- runs / 2 init scales x 2 seeds (boundary-allocation-race: cells x data seeds).
    Returns (cfgs, tcfgs)."""
    half = max(1, runs // 2)
    pairs = {"one_stream": [(0.05 + 0.35 * k / max(1, runs - 1), seed) for k in range(runs)],
             "own_streams": [(0.15, seed + k) for k in range(runs)],
             "mixed": [(0.05 + 0.35 * (k % half) / max(1, half - 1), seed + k // half) for k in range(runs)]}[kind]
    cfgs = [problem(sizes, dtype, device, init_scale=s0) for s0, _ in pairs]
    tcfgs = [TrainConfig(lr=LR, time=LR * steps, batch=sizes["batch"], seed=s, records=2, progress=False)
             for _, s in pairs]
    return cfgs, tcfgs


def one_after_another(cfgs, tcfgs):
    """The runs trained one by one by ``numerics.train.train`` (returns None: time_interleaved
    reads a returned list as timing samples)."""
    def call() -> None:
        for c, t in zip(cfgs, tcfgs):
            train(c, t)
    return call


class AsPrograms:
    """The runs trained by ``numerics.train.train_many`` (as one or a few batched programs);
    ``programs`` after a call: the runs per program, as train_many grouped them."""

    def __init__(self, cfgs, tcfgs):
        self.cfgs, self.tcfgs, self.programs = cfgs, tcfgs, None

    def __call__(self) -> None:
        out = train_many(self.cfgs, self.tcfgs)
        bad = [o for o in out if not hasattr(o, "batched_runs")]
        if bad:
            raise RuntimeError(f"a benchmark run did not finish: {bad[0]!r}")
        count = Counter(o.batched_runs for o in out)      # a program of s runs: s results saying s
        self.programs = sorted((s for s, c in count.items() for _ in range(c // s)), reverse=True)


# --- peak memory ------------------------------------------------------------------------------------

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
    if device.startswith("cuda"):
        step = our_step(problem(sizes, dtype, device), sizes["batch"], seed, which)
        sync(device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        sync(device)
        return {"bytes": int(torch.cuda.max_memory_allocated(device) - before),
                "method": "torch.cuda.max_memory_allocated"}
    if not fresh_process:
        return measure_step_memory_cpu(sizes, dtype, which, seed)
    payload = json.dumps({"sizes": {**sizes, "tasks": list(sizes["tasks"])}, "dtype": dtype,
                          "which": which, "seed": seed, "threads": torch.get_num_threads()})
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", "import sys; from numerics.bench import "
                           "_peak_memory_child as f; f(sys.argv[1])", payload],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"peak-memory subprocess failed ({which}, {dtype}, {sizes}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


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
    return {"bytes": max(0, int(peak - before)) * 1024, "baseline_bytes": int(before) * 1024, "method": method}


def _peak_memory_child(payload: str) -> None:
    args = json.loads(payload)
    torch.set_num_threads(args["threads"])
    res = measure_step_memory_cpu(args["sizes"], args["dtype"], args["which"], args["seed"])
    res["method"] += ", fresh process"
    print(json.dumps(res))


# --- the four sections ------------------------------------------------------------------------------

class _Progress:
    """The progress bar, and the start of each part of the run (``meta.section_seconds``)."""

    def __init__(self, bc):
        total = 2 + 2 * len(bc.dtypes) + (2 if bc.profile != "quick" else 0)
        self.bar = tqdm(total=total, disable=not bc.progress, file=sys.stderr, leave=False)
        self.marks: list = []

    def phase(self, name: str) -> None:
        self.marks.append((name, time.perf_counter()))
        self.bar.set_description(name)


def run_bench(bc) -> dict:
    """Run the sections of ``bc`` (:func:`parse_args`) and return the result dict: the contract's
    keys first, then meta, configs and the sections. The quick profile runs sections 1, 2 and 4
    at the quick size only; the full one adds peak memory (3) and the batched runs at the
    authors' size."""
    t_start = time.perf_counter()
    if bc.threads is not None:
        torch.set_num_threads(bc.threads)
    precision = use_precise_float32()   # the project's one TF32 policy
    main, paper, authors = (SMOKE, SMOKE, SMOKE) if bc.smoke else (QUICK, PAPER, AUTHORS)
    slow_reps = 1 if bc.smoke else max(3, bc.repeats // 2)   # rounds of the seconds-long runs
    out: dict = {"meta": _meta(bc, precision), "configs": {
        "quick": {**main, "param": "factored"}, "paper": {**paper, "param": "factored"}, "lr": LR}}
    progress = _Progress(bc)
    out["step"] = {}
    for dt in bc.dtypes:
        progress.phase(f"step {dt}")
        out["step"][dt] = _step_comparison(bc, problem(main, dt, bc.device), main["batch"], dt)
        progress.bar.update(1)
    out["reduced_vs_full"] = _reduced_vs_full(bc, main, out["step"], slow_reps, progress)
    progress.phase("batched runs")
    out["batched"] = {"runs": BATCHED_RUNS, "steps": BATCHED_STEPS, "dtype": bc.dtypes[0],
                      "quick": batched_runs(main, bc.dtypes[0], bc.device, bc.seed, slow_reps, min(bc.warmup, 1))}
    progress.bar.update(1)
    if bc.profile != "quick":
        progress.phase("peak memory")
        out["peak_memory"] = _peak_memory(bc, main, paper)
        progress.bar.update(1)
        # section 4 at the authors' configuration: one round (seconds a step)
        progress.phase("batched runs, authors' configuration")
        out["configs"]["authors"] = {**authors, "param": "factored"}
        out["batched"]["authors"] = batched_runs(authors, bc.dtypes[0], bc.device, bc.seed, 1, 0)
        progress.bar.update(1)
    progress.bar.close()
    marks = progress.marks + [("end", time.perf_counter())]
    out["meta"]["section_seconds"] = {a[0]: b[1] - a[1] for a, b in zip(marks, marks[1:])}
    out["meta"]["loadavg_end"] = list(os.getloadavg())
    out["meta"]["seconds"] = time.perf_counter() - t_start
    return {**contract(out), **out}


def _step_comparison(bc, cfg, B: int, dt: str) -> dict:
    """Section 1: the trainer's step, the bare step, its sampling and its model part against
    the reference implementation, interleaved rounds: their seconds and ratios."""
    trainer = TrainerSteps(cfg, B, steps=3, seed=bc.seed)   # 2 timed steps per round
    t = time_interleaved({
        "trainer": trainer,
        "reference": our_step(cfg, B, bc.seed, "reference"),
        "bare_step": our_step(cfg, B, bc.seed),
        "sampling": sampling_only(cfg, B, bc.seed),
        "model_only": model_only_step(cfg, B, "ours", bc.seed),
        "reference_model_only": model_only_step(cfg, B, "reference", bc.seed),
    }, bc.repeats, min(bc.warmup, 1), bc.device)
    ratio = ratio_summary(t["reference"], t["trainer"])
    return {
        "trainer_seconds": t["trainer"], "trainer_setup_seconds": trainer.setup_seconds,
        "bare_step_seconds": t["bare_step"], "sampling_seconds": t["sampling"],
        "model_only_seconds": t["model_only"], "reference_seconds": t["reference"],
        "reference_model_only_seconds": t["reference_model_only"],
        "ratio_reference_over_trainer": ratio,
        "ratio_reference_over_bare_step": ratio_summary(t["reference"], t["bare_step"]),
        "ratio_model_only": ratio_summary(t["reference_model_only"], t["model_only"]),
        # the sampling both share caps the full-step ratio at reference / sampling
        "ratio_cap_from_sampling": t["reference"]["median"] / t["sampling"]["median"],
        "sampling_share_of_bare_step": t["sampling"]["median"] / t["bare_step"]["median"],
        # the same ratios in process CPU time (steadier under contention; host time on a GPU)
        "cpu_ratio_reference_over_trainer": t["reference"]["cpu"]["median"] / t["trainer"]["cpu"]["median"],
        "cpu_ratio_model_only": t["reference_model_only"]["cpu"]["median"] / t["model_only"]["cpu"]["median"],
        "target_ratio": TARGETS["ratio_full_step"][dt],
        "meets_target": ratio["median"] >= TARGETS["ratio_full_step"][dt],
    }


def _reduced_vs_full(bc, sizes: dict, step: dict, slow_reps: int, progress: _Progress) -> dict:
    """Section 2: seconds of the full gradient flow and of the reduced flows to time t per
    dtype, then theory's expansion flow (float64 numpy, the same for every dtype) to t and
    to the expansion time, and the full flow's ratios to it."""
    steps = max(1, round(bc.reduced_time / LR))
    exp_steps = max(1, round(bc.expansion_time / LR))
    red = {"time_t": bc.reduced_time, "lr": LR, "steps": steps, "batch": sizes["batch"],
           "estimator": "marginal", "expansion_time_t": LR * exp_steps, "expansion_steps": exp_steps}
    for dt in bc.dtypes:
        progress.phase(f"reduced vs full {dt}")
        cfg = problem(sizes, dt, bc.device)
        tcfg = TrainConfig(lr=LR, time=bc.reduced_time, batch=sizes["batch"], seed=bc.seed,
                           records=2, progress=False)
        t = time_interleaved({"full": lambda: train(cfg, tcfg),
                              "reduced": lambda: train_reduced(cfg, tcfg, estimator="marginal"),
                              "reduced_prompts": lambda: train_reduced(cfg, tcfg)}, slow_reps, 0, bc.device)
        # the full flow (and the whole-prompt reduced flow) draw steps + 1 batches of whole
        # prompts: section 1's sampling time is their floor; the marginal flow draws m per token
        floor = (steps + 1) * step[dt]["sampling_seconds"]["median"]
        red[dt] = {
            "full_seconds": t["full"], "reduced_seconds": t["reduced"],
            "reduced_prompts_seconds": t["reduced_prompts"],
            "sampling_floor_seconds": floor, "speedup": ratio_summary(t["full"], t["reduced"]),
            "speedup_whole_prompt_estimator": ratio_summary(t["full"], t["reduced_prompts"])}
        progress.bar.update(1)
    progress.phase("expansion flow")
    red["expansion"] = expansion_timing(problem(sizes, "float64", "cpu"), bc.reduced_time,
                                        LR * exp_steps, slow_reps)
    for dt in bc.dtypes:
        red[dt].update(expansion_ratios(red["expansion"], red[dt]["full_seconds"]["median"],
                                        step[dt]["trainer_seconds"]["median"], steps, exp_steps))
    progress.bar.update(1)
    return red


def _peak_memory(bc, main: dict, paper: dict) -> dict:
    """Section 3: the peak memory one step adds, ours and the reference's, each measured in a
    fresh process; the reference at the paper size needs tens of GB, so only on a GPU. A
    smoke run measures once in this process: it exercises the path, the sizes are tiny."""
    dev, mem = bc.device, {}
    if bc.smoke:
        return {bc.dtypes[0]: {"ours_quick": peak_memory(main, bc.dtypes[0], dev, "ours", bc.seed,
                                                         fresh_process=False)}}
    for dt in bc.dtypes:
        mem[dt] = {"ours_quick": peak_memory(main, dt, dev, "ours", bc.seed),
                   "reference_quick": peak_memory(main, dt, dev, "reference", bc.seed),
                   "ours_paper": peak_memory(paper, dt, dev, "ours", bc.seed)}
        if dev.startswith("cuda"):
            mem[dt]["reference_paper"] = peak_memory(paper, dt, dev, "reference", bc.seed)
    return mem


def batched_runs(sizes: dict, dtype: str, device: str, seed: int, rounds: int, warmup: int) -> dict:
    """Section 4: BATCHED_RUNS runs of BATCHED_STEPS steps at ``sizes``, trained one after
    another (numerics.train.train, on the ``mixed`` set: a run's cost does not depend on its
    seed or init scale) and by numerics.train.train_many for each run set of :func:`run_set`,
    interleaved rounds; runs per second (wall and CPU) and the ratio batched / one after
    another, with how train_many split each set into programs."""
    sets = {kind: run_set(sizes, dtype, device, kind, BATCHED_RUNS, BATCHED_STEPS, seed) for kind in BATCHED_KINDS}
    programs = {kind: AsPrograms(*sets[kind]) for kind in BATCHED_KINDS}
    t = time_interleaved({"sequential": one_after_another(*sets["mixed"]), **programs}, rounds, warmup, device)
    seq = t["sequential"]
    res = {"sequential_per_s": BATCHED_RUNS / seq["median"],
           "sequential_per_cpu_s": BATCHED_RUNS / seq["cpu"]["median"], "sequential_seconds": seq}
    for kind in BATCHED_KINDS:
        b = t[kind]
        res[kind] = {"batched_per_s": BATCHED_RUNS / b["median"], "batched_per_cpu_s": BATCHED_RUNS / b["cpu"]["median"],
                     "ratio": seq["median"] / b["median"], "cpu_ratio": seq["cpu"]["median"] / b["cpu"]["median"],
                     "programs": programs[kind].programs, "seconds": b}
    return res


def expansion_timing(cfg, time_t: float, expansion_t: float, rounds: int) -> dict:
    """Seconds of ``theory.reduced_ode.integrate_expansion_flow`` (its default tolerances,
    as the claims call it) from cfg's initial values to ``time_t`` (section 2's t) and to
    ``expansion_t``, interleaved rounds, and whether it reached them."""
    om0, mu0 = (v.cpu().double().numpy() for v in initial_semi_singular_values(cfg))
    status: list = []

    def flow(t_end: float):
        def call():
            traj = integrate_expansion_flow(om0, mu0, cfg.tasks, cfg.L, cfg.sigma, cfg.param, cfg.logit_scale,
                                            t_end=t_end, t_eval=np.array([0.0, t_end]))
            status.append(str(traj.status))
        return call

    t = time_interleaved({"to_time_t": flow(time_t), "to_expansion_time": flow(expansion_t)}, rounds, 1, "cpu")
    return {"time_t": time_t, "expansion_time_t": expansion_t, "seconds_to_time_t": t["to_time_t"],
            "seconds_to_expansion_time": t["to_expansion_time"], "status": sorted(set(status))}


def expansion_ratios(exp: dict, full_seconds: float, step_seconds: float, steps: int, exp_steps: int) -> dict:
    """Full flow over expansion flow at section 2's t (both measured) and at the expansion
    time T (the full flow extrapolated: its fixed cost full(t) - steps * step, measured,
    plus T / lr steps of section 1's trainer step, whose cost does not depend on t)."""
    fixed = max(0.0, full_seconds - steps * step_seconds)
    full_T = full_seconds if exp_steps == steps else fixed + exp_steps * step_seconds
    return {"expansion_speedup_at_time_t": full_seconds / exp["seconds_to_time_t"]["median"],
            "full_seconds_to_expansion_time": full_T,
            "full_seconds_to_expansion_time_method": "measured" if exp_steps == steps else
            "extrapolated: (full(t) - steps * trainer step) + T/lr * trainer step",
            "expansion_speedup": full_T / exp["seconds_to_expansion_time"]["median"]}
def contract(out: dict) -> dict:
    """The benchmark's contract, the top-level keys of the JSON, from the sections:
    ``ratio_full_step`` = the standard implementation's step over our trainer's step (both
    sampling a fresh batch; median of the interleaved rounds), ``ratio_model_step`` = the same
    on one fixed batch (forward, backward, update: the model alone), ``sampling_ms`` and
    ``model_ms`` = our sampling and our model step (medians, milliseconds),
    ``ratio_reduced_flow`` = full flow over the reduced flow driven by the Rao-Blackwellised
    marginals to the same t, ``ratio_expansion_flow`` = full flow over theory's expansion
    flow to the expansion time (the full flow extrapolated from its measured step, see
    :func:`expansion_ratios`), each per dtype;
    ``threads``, ``precision``, the ``targets`` and which are met; ``batched_runs``:
    {runs, batched_per_s, sequential_per_s, ratio} of section 4's ``mixed`` run set at the
    quick size (runs per second of wall time; ratio = batched / one after another)."""
    step, red = out["step"], out["reduced_vs_full"]
    c = {"ratio_full_step": {dt: s["ratio_reference_over_trainer"]["median"] for dt, s in step.items()},
         "ratio_model_step": {dt: s["ratio_model_only"]["median"] for dt, s in step.items()},
         "sampling_ms": {dt: 1e3 * s["sampling_seconds"]["median"] for dt, s in step.items()},
         "model_ms": {dt: 1e3 * s["model_only_seconds"]["median"] for dt, s in step.items()},
         "ratio_reduced_flow": {dt: red[dt]["speedup"]["median"] for dt in step},
         "ratio_expansion_flow": {dt: red[dt]["expansion_speedup"] for dt in step},
         "threads": out["meta"]["torch_threads"], "precision": out["meta"]["precision"],
         "profile": out["meta"]["profile"], "configuration": out["configs"]["quick"], "targets": TARGETS}
    bq = out["batched"]["quick"]
    c["batched_runs"] = {"runs": out["batched"]["runs"], "batched_per_s": bq["mixed"]["batched_per_s"],
                         "sequential_per_s": bq["sequential_per_s"], "ratio": bq["mixed"]["ratio"],
                         "run_set": "mixed", "steps": out["batched"]["steps"], "dtype": out["batched"]["dtype"]}
    c["targets_met"] = {k: {dt: bool(c[k][dt] >= TARGETS[k][dt]) for dt in c[k]} for k in TARGETS}
    return c


def _meta(bc, precision: dict) -> dict:
    meta = {"device": bc.device, "dtypes": list(bc.dtypes), "repeats": bc.repeats,
            "warmup": bc.warmup, "profile": bc.profile, "smoke": bc.smoke, "seed": bc.seed,
            "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "precision": precision,
            "loadavg_start": list(os.getloadavg()),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if bc.device.startswith("cuda"):
        meta["gpu"] = torch.cuda.get_device_name(bc.device)
    return meta


# --- the command line: flags, table, JSON -----------------------------------------------------------

def _fmt_t(s: dict, unit: float = 1e3) -> str:
    return f"{s['median'] * unit:9.2f} [{s['min'] * unit:.2f}, {s['max'] * unit:.2f}]"


def render(res: dict) -> str:
    """The human-readable table of a result dict (what the command prints)."""
    m = res["meta"]
    lines = [f"numerics.bench  device={m['device']}  torch {m['torch']}  threads={m['torch_threads']}"
             f"  load average {m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end",
             "medians over repeats, [min, max]", ""]
    lines += _render_step(res) + _render_reduced(res) + ["", "targets (median ratios of this run):"]
    for key, per in res["targets"].items():
        lines.append(f"  {key:20s} " + "   ".join(
            f"{dt} {res[key][dt]:.1f}x (target {per[dt]:g}x: {'met' if res['targets_met'][key][dt] else 'NOT met'})"
            for dt in res[key]))
    if "peak_memory" in res:
        lines += ["", "3. peak memory one step adds (MiB)"]
        for dt, mm in res["peak_memory"].items():
            lines.append(f"  {dt}  " + ", ".join(f"{k} {v['bytes'] / 2**20:.0f}" for k, v in mm.items()))
    lines += _render_batched(res)
    quick = " (--quick: sections 1, 2 and 4 at the quick size only)" if m["profile"] == "quick" else ""
    return "\n".join(lines + ["", f"total {m['seconds']:.1f} s{quick}"])
def _render_step(res: dict) -> list[str]:
    """Section 1: our step against the reference, with and without sampling, per dtype."""
    q = res["configs"]["quick"]
    lines = ["", f"1. milliseconds per gradient step, tasks {tuple(q['tasks'])}, H = {q['heads']},"
                 f" L = {q['L']}, batch {q['batch']}"]
    for dt, s in res["step"].items():
        r, rm = s["ratio_reference_over_trainer"], s["ratio_model_only"]
        lines += [
            f"  {dt}  ours (train())  {_fmt_t(s['trainer_seconds'])}   reference {_fmt_t(s['reference_seconds'])}"
            f"   ratio {r['median']:.1f}x [{r['min']:.1f}, {r['max']:.1f}]"
            f"   target {s['target_ratio']:g}x {'met' if s['meets_target'] else 'NOT met'}",
            f"  {dt}  ours bare step  {_fmt_t(s['bare_step_seconds'])}   of which sampling"
            f" {_fmt_t(s['sampling_seconds'])} ({100 * s['sampling_share_of_bare_step']:.0f}%)",
            f"  {dt}  without sampling: ours {_fmt_t(s['model_only_seconds'])}   reference"
            f" {_fmt_t(s['reference_model_only_seconds'])}   ratio {rm['median']:.1f}x;"
            f" sampling caps the full-step ratio at {s['ratio_cap_from_sampling']:.1f}x",
            f"  {dt}  in process CPU time: ratio {s['cpu_ratio_reference_over_trainer']:.1f}x,"
            f" without sampling {s['cpu_ratio_model_only']:.1f}x"]
    return lines


def _render_reduced(res: dict) -> list[str]:
    """Section 2: the full flow against the reduced flows and theory's expansion flow."""
    dtypes, rv = res["meta"]["dtypes"], res["reduced_vs_full"]
    lines = ["", f"2. seconds to gradient-flow time t = {rv['time_t']} ({rv['steps']} steps, batch {rv['batch']});"
                 " reduced: driven by the Rao-Blackwellised marginals"]
    for dt in dtypes:
        r = rv[dt]
        lines.append(f"  {dt}  full {_fmt_t(r['full_seconds'], 1)}   reduced {_fmt_t(r['reduced_seconds'], 1)}"
                     f"   full / reduced {r['speedup']['median']:.2f}x   (whole-prompt reduced flow"
                     f" {r['reduced_prompts_seconds']['median']:.2f}: {r['speedup_whole_prompt_estimator']['median']:.2f}x;"
                     f" drawing the full flow's prompts alone: {r['sampling_floor_seconds']:.2f})")
    ex = rv["expansion"]
    lines.append(f"  expansion flow (theory, deterministic): to t = {ex['time_t']:g} {_fmt_t(ex['seconds_to_time_t'])} ms,"
                 f" to t = {ex['expansion_time_t']:g} {_fmt_t(ex['seconds_to_expansion_time'])} ms"
                 f" (status {', '.join(ex['status'])})")
    for dt in dtypes:
        r = rv[dt]
        lines.append(f"  {dt}  full / expansion: {r['expansion_speedup_at_time_t']:.3g}x at t = {ex['time_t']:g} (measured),"
                     f" {r['expansion_speedup']:.3g}x at t = {ex['expansion_time_t']:g} (full flow"
                     f" {r['full_seconds_to_expansion_time']:.1f} s, {r['full_seconds_to_expansion_time_method']})")
    return lines


def _render_batched(res: dict) -> list[str]:
    """Section 4: runs per second, one after another and as train_many's programs."""
    b = res["batched"]
    lines = ["", f"4. {b['runs']} runs of {b['steps']} steps ({b['dtype']}): runs per second one after another"
                 " (train) and batched (train_many; programs: runs per program)"]
    for size in ("quick", "authors"):
        if size not in b:
            continue
        c, r = res["configs"][size], b[size]
        lines.append(f"  {size} (tasks {tuple(c['tasks'])}, H = {c['heads']}, L = {c['L']}, batch {c['batch']}):"
                     f" one after another {r['sequential_per_s']:.3g}/s")
        for kind, desc in (("mixed", "4 starts x 2 seeds"), ("one_stream", "8 starts, 1 seed"),
                           ("own_streams", "8 seeds")):
            k = r[kind]
            lines.append(f"    {kind:11s} ({desc}): {k['batched_per_s']:.3g}/s, ratio {k['ratio']:.2f}x"
                         f" (CPU time {k['cpu_ratio']:.2f}x), programs {k['programs']}")
    return lines


def _parser() -> argparse.ArgumentParser:
    """The flags of ``python -m numerics.bench`` (each described in docs/performance.md)."""
    p = argparse.ArgumentParser(
        prog="python -m numerics.bench",
        description="Benchmark the training step: ours vs the standard-way reference, reduced vs full flow, "
                    "peak memory and many runs as one program. Prints a table and writes JSON "
                    "(docs/performance.md).")
    add = p.add_argument
    add("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu): every measurement runs on it")
    add("--dtype", default=",".join(DTYPES), help="comma-separated dtypes to time (default float32,float64)")
    add("--repeats", type=int_option("--repeats", 1, 1000, "medians settle long before"), default=None,
        help="timed rounds of the step comparison (default 5; not with --smoke)")
    add("--warmup", type=int_option("--warmup", 0, 1000), default=None,
        help="> 0: one untimed round of each comparison before the timed ones (default 2; not with --smoke)")
    add("--out", default=None, help="write the results as JSON to this path")
    add("--quick", action="store_true", help="the contract only: sections 1, 2 and 4 at the quick size")
    add("--smoke", action="store_true", help="every section at tiny sizes in seconds (meaningless numbers)")
    add("--seed", type=seed_option("--seed"), default=0, help="seed of the prompt stream (default 0)")
    add("--reduced-time", type=float_option("--reduced-time", finite=False), default=None,
        help="gradient-flow time t of section 2 (default 0.5: 10 steps of lr 0.05; not with --smoke)")
    add("--expansion-time", type=float_option("--expansion-time", finite=False), default=None,
        help=f"time of the expansion flow against the full flow (default {EXPANSION_TIME:g}; not with --smoke)")
    add("--threads", type=threads_option("--threads"), default=None,
        help="torch intra-op CPU threads (default: torch's choice); 1 on a shared machine")
    add("--no-progress", action="store_true", help="no progress bar")
    add("--calibrate", action="store_true",
        help="measure numerics.engine's primitives on this machine and fit its coefficients (--out: as JSON)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The flags of ``argv``, every value checked before any timing starts (a wrong flag:
    argparse's usage error, exit 2); defaults filled in, and --smoke's tiny settings in place of
    them; ``dtypes``, ``profile`` and ``progress`` added."""
    p = _parser()
    a = p.parse_args(argv)
    a.dtypes = tuple(s.strip() for s in a.dtype.split(",") if s.strip())
    unknown = [dt for dt in a.dtypes if dt not in DTYPES]
    if unknown or not a.dtypes:
        p.error(f"--dtype: unknown dtype {unknown[0]!r}; use float32 and/or float64, comma-separated" if unknown
                else "--dtype: give at least one of float32, float64")
    try:
        check_device_option(a.device)
        for flag, value in (("--reduced-time", a.reduced_time), ("--expansion-time", a.expansion_time)):
            _check_flow_time(flag, value)
        given = [f for f, v in (("--repeats", a.repeats), ("--warmup", a.warmup), ("--reduced-time", a.reduced_time),
                                ("--expansion-time", a.expansion_time)) if v is not None]
        if a.smoke and given:
            raise ValueError(f"--smoke sets its own tiny sizes and would ignore {', '.join(given)}; drop "
                             f"{'them' if len(given) > 1 else 'it'} (or --smoke)")
        if a.out is not None:
            check_output_path(a.out, "--out")       # before minutes of timing, not after
    except ValueError as exc:
        p.error(str(exc))
    defaults = (1, 0, LR, 2 * LR) if a.smoke else (5, 2, 0.5, EXPANSION_TIME)
    a.repeats, a.warmup, a.reduced_time, a.expansion_time = (
        d if v is None else v for v, d in zip((a.repeats, a.warmup, a.reduced_time, a.expansion_time), defaults))
    a.profile, a.progress = "quick" if a.quick else "full", not a.no_progress
    return a


def _check_flow_time(flag: str, value: float | None) -> None:
    """A gradient-flow time is at least one step of lr = LR and at most the trainer's
    MAX_STEPS steps (an absurd time would otherwise fail only after the other sections)."""
    if value is not None and not (math.isfinite(value) and value >= LR):
        raise ValueError(f"{flag} must be a finite number >= {LR} (one step), got {value}")
    if value is not None and not value / LR <= MAX_STEPS:
        raise ValueError(f"{flag} {value:g} is {value / LR:.3g} steps of lr = {LR}, more than the "
                         f"trainer's limit of {MAX_STEPS:,}; give a shorter time")


@command_line     # a full disk at --out: "disk full: N bytes needed at PATH", exit 75
def main(argv=None) -> dict:
    bc = parse_args(argv)    # every flag checked (--out among them) before anything is timed
    if bc.calibrate:
        from numerics.bench.calibrate import calibrate, render as render_calibration
        res = calibrate(progress=bc.progress)
        print(render_calibration(res))
    else:
        res = run_bench(bc)
        print(render(res))
    if bc.out:
        write_output(bc.out, json.dumps(res, indent=1) + "\n")   # a NaN timing is written, not refused
        print(f"wrote {bc.out}")
    return res
