"""The benchmark itself: :func:`run_bench` runs the seven sections of a :class:`BenchConfig`
and returns one result dict (what ``--out`` writes as JSON)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from numerics.model import initial_semi_singular_values
from numerics.train import TrainConfig, train, train_reduced
from numerics.io.command import run_in_own_group
from theory.reduced_ode import integrate_expansion_flow
from numerics.bench.config import (AUTHORS, BATCHED_KINDS, BATCHED_RUNS, BATCHED_STEPS, LR, PAPER, QUICK, SMOKE,
                                TARGETS, BenchConfig)
from numerics.bench.memory import peak_memory
from numerics.bench.roofline import bytes_moved, flops, item_bytes, matmul_throughput, memory_bandwidth, roofline
from numerics.bench.steps import (AsPrograms, TrainerSteps, model_only_step, one_after_another, our_step, problem,
                                  run_set, sampling_only)
from numerics.bench.timing import ratio_summary, time_interleaved
from numerics.config import use_precise_float32
from numerics.stored import REPO_ROOT


def fit_exponent(sizes: list[float], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(size): time ~ size^exponent."""
    slope, _ = np.polyfit(np.log(sizes), np.log(seconds), 1)
    return float(slope)


def scaling_grid(smoke: bool) -> dict:
    """Sizes of section 4, each varied alone around the quick configuration."""
    if smoke:
        base = dict(SMOKE)
        return {"base": base, "L": [8, 16, 32, 64], "r": [1, 2, 3, 4],
                "heads": [1, 2, 3, 4], "batch": [32, 64, 128, 256]}
    base = dict(QUICK)
    return {"base": base, "L": [64, 128, 256, 512], "r": [2, 4, 8, 16],
            "heads": [1, 2, 4, 8], "batch": [512, 1024, 2048, 4096]}


class _Progress:
    """The progress bar, and the start of each part of the run (``meta.section_seconds``)."""

    def __init__(self, bc: BenchConfig):
        self.bar = _bar(bc)
        self.marks: list = []

    def phase(self, name: str) -> None:
        self.marks.append((name, time.perf_counter()))
        self.bar.set_description(name)

    def update(self) -> None:
        self.bar.update(1)


def run_bench(bc: BenchConfig) -> dict:
    """Run the sections of ``bc`` and return the result dict: the contract's keys first, then
    meta, configs and the sections. The quick profile runs sections 1, 3 and 7 at the quick
    size only; the full one adds the probes, the roofline (2), scaling (4), peak memory (5),
    the paper-size step (6) and the batched runs at the authors' size."""
    t_start = time.perf_counter()
    if bc.threads is not None:
        torch.set_num_threads(bc.threads)
    precision = use_precise_float32()   # the project's one TF32 policy
    main = SMOKE if bc.smoke else QUICK
    paper = SMOKE if bc.smoke else PAPER
    slow_reps = 1 if bc.smoke else max(3, bc.repeats // 2)   # rounds of the seconds-long runs
    out: dict = {"meta": _meta(bc, precision), "configs": {
        "quick": {**main, "param": "factored"}, "paper": {**paper, "param": "factored"},
        "lr": LR}}
    progress = _Progress(bc)
    full = bc.profile != "quick"     # quick: the contract only (sections 1 and 3)
    progress.phase("probes")
    probes = _machine_probes(bc) if full else {}
    if full:
        out["probes"] = probes
    progress.update()
    out["step"], roofline_per_dtype = _step_sections(bc, main, probes, full, progress)
    if full:
        out["roofline"] = roofline_per_dtype
    out["reduced_vs_full"] = _reduced_vs_full(bc, main, out["step"], slow_reps, progress)
    progress.phase("batched runs")
    out["batched"] = {"runs": BATCHED_RUNS, "steps": BATCHED_STEPS, "dtype": bc.dtypes[0],
                      "quick": batched_runs(main, bc.dtypes[0], bc.device, bc.seed, slow_reps, min(bc.warmup, 1))}
    progress.update()
    if not full:
        return _finish(out, bc, progress, t_start)
    out["scaling"] = _scaling(bc, progress)
    progress.phase("peak memory")
    out["peak_memory"] = _peak_memory(bc, main, paper)
    progress.update()
    out["paper_step"] = _paper_step(bc, paper, slow_reps, progress)
    # section 7 at the authors' configuration: one round (seconds a step)
    progress.phase("batched runs, authors' configuration")
    authors = SMOKE if bc.smoke else AUTHORS
    out["configs"]["authors"] = {**authors, "param": "factored"}
    out["batched"]["authors"] = batched_runs(authors, bc.dtypes[0], bc.device, bc.seed, 1, 0)
    progress.update()
    return _finish(out, bc, progress, t_start)


def _machine_probes(bc: BenchConfig) -> dict:
    """The machine's limits the roofline divides by: copy bandwidth over an array far beyond
    the caches (256 MiB on a CPU; 2 GiB on a GPU, which copies 256 MiB in ~0.1 ms, too close
    to the launch and synchronisation overhead, and still far beyond its 60 MB L2), and the
    dense matmul rate per dtype."""
    dev, reps, warm = bc.device, bc.repeats, bc.warmup
    mib = 4 if bc.smoke else (2048 if dev.startswith("cuda") else 256)
    probes: dict = {"bandwidth": memory_bandwidth(dev, mib * 2**20, reps, warm)}
    for dt in bc.dtypes:
        n = 128 if bc.smoke else (8192 if dev.startswith("cuda") else 1536)
        probes[dt] = {"matmul": matmul_throughput(dev, getattr(torch, dt), n, min(reps, 5), warm)}
    return probes


def _step_sections(bc: BenchConfig, sizes: dict, probes: dict, full: bool, progress: _Progress) -> tuple[dict, dict]:
    """Sections 1 and 2 per dtype: our step against the reference at ``sizes``, and (full
    profile) where the step stands against the machine's copy and matmul rates."""
    steps: dict = {}
    roofs: dict = {}
    for dt in bc.dtypes:
        progress.phase(f"step {dt}")
        cfg = problem(sizes, dt, bc.device)
        t, steps[dt] = _step_comparison(bc, cfg, sizes["batch"], dt)
        if full:
            roofs[dt] = _roofline(bc, cfg, sizes["batch"], probes, dt, t)
        progress.update()
    return steps, roofs


def _step_comparison(bc: BenchConfig, cfg, B: int, dt: str) -> tuple[dict, dict]:
    """Section 1: the trainer's step, the bare step, its sampling and its model part against
    the reference implementation, interleaved rounds; returns (the timings, the section's
    dict of seconds and ratios)."""
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
    return t, {
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


def _roofline(bc: BenchConfig, cfg, B: int, probes: dict, dt: str, t: dict) -> dict:
    """Section 2 for one dtype: the step's bytes and FLOPs against the probed rates, and
    against the copy rate of an array the size of the step's context (kept in ``probes``)."""
    moved = bytes_moved(cfg, B)
    ws = memory_bandwidth(bc.device, item_bytes(cfg) * moved["context_elements"], bc.repeats, bc.warmup)
    probes[dt]["bandwidth_at_context_size"] = ws
    return roofline(moved, flops(cfg, B), probes["bandwidth"]["copy_bytes_per_s"]["median"],
                    probes[dt]["matmul"]["flop_per_s"]["median"], t["trainer"]["median"],
                    t["model_only"]["median"], ws["copy_bytes_per_s"]["median"])


def _reduced_vs_full(bc: BenchConfig, sizes: dict, step: dict, slow_reps: int, progress: _Progress) -> dict:
    """Section 3: seconds of the full gradient flow and of the reduced flows to time t per
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
        progress.update()
    progress.phase("expansion flow")
    red["expansion"] = expansion_timing(problem(sizes, "float64", "cpu"), bc.reduced_time,
                                        LR * exp_steps, slow_reps)
    for dt in bc.dtypes:
        red[dt].update(expansion_ratios(red["expansion"], red[dt]["full_seconds"]["median"],
                                        step[dt]["trainer_seconds"]["median"], steps, exp_steps))
    progress.update()
    return red


def _scaling(bc: BenchConfig, progress: _Progress) -> dict:
    """Section 4: the bare step's seconds as each of L, d (through r), heads and batch is
    varied alone around the base sizes, and the exponent k of time ~ size^k."""
    grid = scaling_grid(bc.smoke)
    dt = bc.dtypes[0]
    scaling: dict = {"dtype": dt, "base": grid["base"], "step": "bare step (sampling included)"}
    for axis in ("L", "r", "heads", "batch"):
        progress.phase(f"scaling {axis}")
        fns, xs = {}, []
        for v in grid[axis]:
            sizes = dict(grid["base"])
            if axis == "r":
                sizes["tasks"] = tuple(v for _ in grid["base"]["tasks"])
            else:
                sizes[axis] = v
            cfg = problem(sizes, dt, bc.device)
            x = cfg.d if axis == "r" else v
            fns[x] = our_step(cfg, sizes["batch"], bc.seed)
            xs.append(x)
        t = time_interleaved(fns, bc.scaling_steps, min(bc.warmup, 1), bc.device)
        ts = [t[x] for x in xs]
        scaling["d" if axis == "r" else axis] = {
            "sizes": xs, "seconds": ts, "exponent": fit_exponent(xs, [s["median"] for s in ts]),
            "exponent_cpu_time": fit_exponent(xs, [s["cpu"]["median"] for s in ts])}
        progress.update()
    return scaling


def _peak_memory(bc: BenchConfig, main: dict, paper: dict) -> dict:
    """Section 5: the peak memory one step adds, ours and the reference's, each measured in a
    fresh process; the reference at the paper size needs tens of GB, so only on a GPU. A
    smoke run measures once in this process: it exercises the path, the sizes are tiny."""
    dev, mem = bc.device, {}
    for dt in bc.dtypes:
        if bc.smoke:
            if dt == bc.dtypes[0]:
                mem[dt] = {"ours_quick": peak_memory(main, dt, dev, "ours", bc.seed, fresh_process=False)}
            continue
        mem[dt] = {"ours_quick": peak_memory(main, dt, dev, "ours", bc.seed),
                   "reference_quick": peak_memory(main, dt, dev, "reference", bc.seed),
                   "ours_paper": peak_memory(paper, dt, dev, "ours", bc.seed)}
        if dev.startswith("cuda"):
            mem[dt]["reference_paper"] = peak_memory(paper, dt, dev, "reference", bc.seed)
    return mem


def _paper_step(bc: BenchConfig, paper: dict, slow_reps: int, progress: _Progress) -> dict:
    """Section 6: the trainer's step, its sampling and its model part at the paper
    configuration; the reference too on a GPU (it needs ~12x the context: tens of GB)."""
    res_per_dtype = {}
    for dt in bc.dtypes:
        progress.phase(f"paper step {dt}")
        cfg = problem(paper, dt, bc.device)
        B = paper["batch"]
        fns = {"trainer": TrainerSteps(cfg, B, steps=3, seed=bc.seed),
               "sampling": sampling_only(cfg, B, bc.seed),
               "model_only": model_only_step(cfg, B, "ours", bc.seed)}
        if bc.device.startswith("cuda"):
            fns["reference"] = our_step(cfg, B, bc.seed, "reference")
        t = time_interleaved(fns, slow_reps, min(bc.warmup, 1), bc.device)
        fns.clear()
        res = {"trainer_seconds": t["trainer"], "sampling_seconds": t["sampling"],
               "model_only_seconds": t["model_only"],
               "sampling_share_of_trainer_step": t["sampling"]["median"] / t["trainer"]["median"]}
        if "reference" in t:
            res["reference_seconds"] = t["reference"]
            res["ratio_reference_over_trainer"] = ratio_summary(t["reference"], t["trainer"])
        res_per_dtype[dt] = res
        progress.update()
    return res_per_dtype


def batched_runs(sizes: dict, dtype: str, device: str, seed: int, rounds: int, warmup: int) -> dict:
    """Section 7: BATCHED_RUNS runs of BATCHED_STEPS steps at ``sizes``, trained one after
    another (numerics.train.train, on the ``mixed`` set: a run's cost does not depend on its
    seed or init scale) and by numerics.train.train_many for each run set of
    numerics.bench.steps.run_set, interleaved rounds; runs per second (wall and CPU) and the
    ratio batched / one after another, with how train_many split each set into programs."""
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
    as the claims call it) from cfg's initial values to ``time_t`` (section 3's t) and to
    ``expansion_t``, interleaved rounds, and whether it reached them."""
    om0, mu0 = (v.cpu().double().numpy() for v in initial_semi_singular_values(cfg))

    def flow(t_end: float):
        def call():
            traj = integrate_expansion_flow(om0, mu0, cfg.tasks, cfg.L, cfg.sigma, cfg.param, cfg.logit_scale,
                                            t_end=t_end, t_eval=np.array([0.0, t_end]))
            status.append(str(traj.status))
        return call

    status: list = []
    t = time_interleaved({"to_time_t": flow(time_t), "to_expansion_time": flow(expansion_t)}, rounds, 1, "cpu")
    return {"time_t": time_t, "expansion_time_t": expansion_t, "seconds_to_time_t": t["to_time_t"],
            "seconds_to_expansion_time": t["to_expansion_time"], "status": sorted(set(status))}


def expansion_ratios(exp: dict, full_seconds: float, step_seconds: float, steps: int, exp_steps: int) -> dict:
    """Full flow over expansion flow at section 3's t (both measured) and at the expansion
    time T (the full flow extrapolated: its fixed cost full(t) - steps * step, measured,
    plus T / lr steps of section 1's trainer step, whose cost does not depend on t)."""
    fixed = max(0.0, full_seconds - steps * step_seconds)
    full_T = full_seconds if exp_steps == steps else fixed + exp_steps * step_seconds
    return {"expansion_speedup_at_time_t": full_seconds / exp["seconds_to_time_t"]["median"],
            "full_seconds_to_expansion_time": full_T,
            "full_seconds_to_expansion_time_method": "measured" if exp_steps == steps else
            "extrapolated: (full(t) - steps * trainer step) + T/lr * trainer step",
            "expansion_speedup": full_T / exp["seconds_to_expansion_time"]["median"]}


def report_profile_seconds(profile: str, device: str, timeout: float, command: list | None = None) -> dict:
    """Wall time of ``python -m reports.build --profile PROFILE`` in a subprocess writing into
    a temporary directory (removed afterwards), from this checkout (cwd and PYTHONPATH set to
    the repository root); ``command`` replaces the command line (tests)."""
    root = str(REPO_ROOT)
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        cmd = command or [sys.executable, "-m", "reports.build", "--profile", profile, "--device", device,
                          "--out", os.path.join(tmp, "report"), "--no-progress"]
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0, c0 = time.perf_counter(), _children_cpu()
        try:
            # its own process group, killed whole on a timeout: the build's --jobs workers too
            proc = run_in_own_group(cmd, timeout=timeout, cwd=root, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired as exc:
            rc, tail = None, f"timed out after {timeout:g} s: {str(exc.stderr or '')[-1500:]}"
        return {"profile": profile, "device": device, "seconds": time.perf_counter() - t0,
                "cpu_seconds": _children_cpu() - c0, "returncode": rc,
                "status": "ok" if rc == 0 else ("timed out" if rc is None else
                                                "claims failed (exit 1)" if rc == 1 else f"error (exit {rc})"),
                "command": " ".join(cmd), "output_tail": tail if rc != 0 else ""}


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


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
    {runs, batched_per_s, sequential_per_s, ratio} of section 7's ``mixed`` run set at the
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


def _finish(out: dict, bc: BenchConfig, progress: _Progress, t_start: float) -> dict:
    """The opt-in report-profile timings (``--report-profiles``: minutes to hours), the wall
    time of each part, and the contract's keys in front of the sections."""
    if bc.report_profiles:
        out["report_profiles"] = {}
        for p in bc.report_profiles:
            progress.marks.append((f"report {p}", time.perf_counter()))
            progress.bar.set_description(f"report profile {p}")
            out["report_profiles"][p] = report_profile_seconds(p, bc.device, bc.report_timeout)
    progress.bar.close()
    marks = progress.marks + [("end", time.perf_counter())]
    out["meta"]["section_seconds"] = {a[0]: b[1] - a[1] for a, b in zip(marks, marks[1:])}
    out["meta"]["loadavg_end"] = list(os.getloadavg())
    out["meta"]["seconds"] = time.perf_counter() - t_start
    return {**contract(out), **out}


def _meta(bc: BenchConfig, precision: dict) -> dict:
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


def _bar(bc: BenchConfig):
    total = 3 + 2 * len(bc.dtypes) + (6 + len(bc.dtypes) if bc.profile != "quick" else 0)
    return tqdm(total=total, disable=not bc.progress, file=sys.stderr, leave=False)
