"""The benchmark itself: :func:`run_bench` runs the four sections of a :class:`BenchConfig`
and returns one result dict (what ``--out`` writes as JSON)."""
from __future__ import annotations

import os
import platform
import sys
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from numerics.model import initial_semi_singular_values
from numerics.train import TrainConfig, train, train_reduced
from theory.reduced_ode import integrate_expansion_flow
from numerics.bench.config import (AUTHORS, BATCHED_KINDS, BATCHED_RUNS, BATCHED_STEPS, LR, PAPER, QUICK, SMOKE,
                                   TARGETS, BenchConfig)
from numerics.bench.memory import peak_memory
from numerics.bench.steps import (AsPrograms, TrainerSteps, model_only_step, one_after_another, our_step, problem,
                                  run_set, sampling_only)
from numerics.bench.timing import ratio_summary, time_interleaved
from numerics.config import use_precise_float32


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
    meta, configs and the sections. The quick profile runs sections 1, 2 and 4 at the quick
    size only; the full one adds peak memory (3) and the batched runs at the authors' size."""
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
    out["step"] = {}
    for dt in bc.dtypes:
        progress.phase(f"step {dt}")
        out["step"][dt] = _step_comparison(bc, problem(main, dt, bc.device), main["batch"], dt)
        progress.update()
    out["reduced_vs_full"] = _reduced_vs_full(bc, main, out["step"], slow_reps, progress)
    progress.phase("batched runs")
    out["batched"] = {"runs": BATCHED_RUNS, "steps": BATCHED_STEPS, "dtype": bc.dtypes[0],
                      "quick": batched_runs(main, bc.dtypes[0], bc.device, bc.seed, slow_reps, min(bc.warmup, 1))}
    progress.update()
    if bc.profile == "quick":
        return _finish(out, progress, t_start)
    progress.phase("peak memory")
    out["peak_memory"] = _peak_memory(bc, main, paper)
    progress.update()
    # section 4 at the authors' configuration: one round (seconds a step)
    progress.phase("batched runs, authors' configuration")
    authors = SMOKE if bc.smoke else AUTHORS
    out["configs"]["authors"] = {**authors, "param": "factored"}
    out["batched"]["authors"] = batched_runs(authors, bc.dtypes[0], bc.device, bc.seed, 1, 0)
    progress.update()
    return _finish(out, progress, t_start)


def _step_comparison(bc: BenchConfig, cfg, B: int, dt: str) -> dict:
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


def _reduced_vs_full(bc: BenchConfig, sizes: dict, step: dict, slow_reps: int, progress: _Progress) -> dict:
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
        progress.update()
    progress.phase("expansion flow")
    red["expansion"] = expansion_timing(problem(sizes, "float64", "cpu"), bc.reduced_time,
                                        LR * exp_steps, slow_reps)
    for dt in bc.dtypes:
        red[dt].update(expansion_ratios(red["expansion"], red[dt]["full_seconds"]["median"],
                                        step[dt]["trainer_seconds"]["median"], steps, exp_steps))
    progress.update()
    return red


def _peak_memory(bc: BenchConfig, main: dict, paper: dict) -> dict:
    """Section 3: the peak memory one step adds, ours and the reference's, each measured in a
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


def batched_runs(sizes: dict, dtype: str, device: str, seed: int, rounds: int, warmup: int) -> dict:
    """Section 4: BATCHED_RUNS runs of BATCHED_STEPS steps at ``sizes``, trained one after
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
    as the claims call it) from cfg's initial values to ``time_t`` (section 2's t) and to
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


def _finish(out: dict, progress: _Progress, t_start: float) -> dict:
    """The wall time of each part, and the contract's keys in front of the sections."""
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
    total = 2 + 2 * len(bc.dtypes) + (2 if bc.profile != "quick" else 0)
    return tqdm(total=total, disable=not bc.progress, file=sys.stderr, leave=False)
