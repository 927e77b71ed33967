"""``python -m numerics.bench [...]``: the flags, the printed table and the JSON file."""
from __future__ import annotations

import sys

import argparse
import math

from numerics.train import MAX_STEPS
from numerics.io import (check_device_option, command_line, float_option, int_option, seed_option,
                                 threads_option)
from numerics.io import check_output_path, write_json_atomic
from numerics.bench.config import DTYPES, EXPANSION_TIME, LR, BenchConfig
from numerics.bench.run import run_bench


def _fmt_t(s: dict, unit: float = 1e3) -> str:
    return f"{s['median'] * unit:9.2f} [{s['min'] * unit:.2f}, {s['max'] * unit:.2f}]"


def render(res: dict) -> str:
    """The human-readable table of a result dict (what the CLI prints)."""
    lines = _render_header(res) + _render_step(res) + _render_reduced(res) + _render_targets(res)
    if "peak_memory" in res:
        lines += _render_peak_memory(res)
    lines += _render_batched(res)
    quick = " (--quick: sections 1, 2 and 4 at the quick size only)" if res["meta"]["profile"] == "quick" else ""
    lines += ["", f"total {res['meta']['seconds']:.1f} s{quick}"]
    return "\n".join(lines)


def _render_header(res: dict) -> list[str]:
    """The machine and run line."""
    m = res["meta"]
    return [f"numerics.bench  device={m['device']}  torch {m['torch']}  threads={m['torch_threads']}"
            f"  load average {m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end",
            "medians over repeats, [min, max]", ""]


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


def _render_targets(res: dict) -> list[str]:
    """The contract's ratios against their targets."""
    lines = ["", "targets (median ratios of this run):"]
    for key, per in res["targets"].items():
        lines.append(f"  {key:20s} " + "   ".join(
            f"{dt} {res[key][dt]:.1f}x (target {per[dt]:g}x: {'met' if res['targets_met'][key][dt] else 'NOT met'})"
            for dt in res[key]))
    return lines


def _render_peak_memory(res: dict) -> list[str]:
    """Section 3: the peak memory one step adds."""
    lines = ["", "3. peak memory one step adds (MiB)"]
    for dt, mm in res["peak_memory"].items():
        lines.append(f"  {dt}  " + ", ".join(f"{k} {v['bytes'] / 2**20:.0f}" for k, v in mm.items()))
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
        help="measure numerics.cost's primitives on this machine and fit its coefficients (--out: as JSON)")
    return p


def parse_args(argv=None) -> BenchConfig:
    """The flags of ``argv`` as a BenchConfig, every value checked before any timing starts
    (a wrong flag: argparse's usage error, exit 2); defaults filled in, and --smoke's tiny
    settings in place of them."""
    p = _parser()
    a = p.parse_args(argv)
    dtypes = _dtypes(p, a.dtype)
    try:
        check_device_option(a.device)
    except ValueError as exc:
        p.error(str(exc))
    # values first (the message about the value), then options that this run would ignore
    _check_flow_time(p, "--reduced-time", a.reduced_time)
    _check_flow_time(p, "--expansion-time", a.expansion_time)
    if a.smoke:
        given = [f for f, v in (("--repeats", a.repeats), ("--warmup", a.warmup), ("--reduced-time", a.reduced_time),
                                ("--expansion-time", a.expansion_time)) if v is not None]
        if given:
            p.error(f"--smoke sets its own tiny sizes and would ignore {', '.join(given)}; drop "
                    f"{'them' if len(given) > 1 else 'it'} (or --smoke)")
    if a.out is not None:
        try:
            check_output_path(a.out, "--out")       # before minutes of timing, not after
        except ValueError as exc:
            p.error(str(exc))
    repeats = 5 if a.repeats is None else a.repeats
    warmup = 2 if a.warmup is None else a.warmup
    reduced_time = 0.5 if a.reduced_time is None else a.reduced_time
    expansion_time = EXPANSION_TIME if a.expansion_time is None else a.expansion_time
    if a.smoke:
        repeats, warmup, reduced_time, expansion_time = 1, 0, LR, 2 * LR
    return BenchConfig(device=a.device, dtypes=dtypes, repeats=repeats, warmup=warmup,
                       profile="quick" if a.quick else "full", smoke=a.smoke,
                       seed=a.seed, reduced_time=reduced_time, expansion_time=expansion_time,
                       progress=not a.no_progress, out=a.out, threads=a.threads)


def _dtypes(p: argparse.ArgumentParser, given: str) -> tuple[str, ...]:
    """--dtype's comma-separated list: known dtypes, at least one."""
    dtypes = tuple(s.strip() for s in given.split(",") if s.strip())
    for dt in dtypes:
        if dt not in DTYPES:
            p.error(f"--dtype: unknown dtype {dt!r}; use float32 and/or float64, comma-separated")
    if not dtypes:
        p.error("--dtype: give at least one of float32, float64")
    return dtypes


def _check_flow_time(p: argparse.ArgumentParser, flag: str, value: float | None) -> None:
    """A gradient-flow time is at least one step of lr = LR and at most the trainer's
    MAX_STEPS steps (an absurd time would otherwise fail only after the other sections)."""
    if value is not None and not (math.isfinite(value) and value >= LR):
        p.error(f"{flag} must be a finite number >= {LR} (one step), got {value}")
    if value is not None and not value / LR <= MAX_STEPS:
        p.error(f"{flag} {value:g} is {value / LR:.3g} steps of lr = {LR}, more than the "
                f"trainer's limit of {MAX_STEPS:,}; give a shorter time")


@command_line     # a full disk at --out: "disk full: N bytes needed at PATH", exit 75
def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    bc = parse_args(argv)    # every flag checked (--out among them) before anything is timed
    if "--calibrate" in argv:
        from numerics.bench.calibrate import calibrate, render as render_calibration
        res = calibrate(progress=bc.progress)
        print(render_calibration(res))
    else:
        res = run_bench(bc)
        print(render(res))
    if bc.out:
        write_json_atomic(bc.out, res, allow_nan=True)   # a NaN timing is written, not refused
        print(f"wrote {bc.out}")
    return res
