"""``python -m numerics.bench [...]``: the flags, the printed table and the JSON file."""
from __future__ import annotations

import sys

import argparse
import math

from numerics.train import MAX_STEPS
from numerics.io.command import (check_device_option, command_line, float_option, int_option, seed_option,
                                 threads_option)
from numerics.io.files import check_output_path, write_json_atomic
from numerics.bench.config import DTYPES, EXPANSION_TIME, LR, REPORT_PROFILES, BenchConfig
from numerics.bench.run import run_bench


def _fmt_t(s: dict, unit: float = 1e3) -> str:
    return f"{s['median'] * unit:9.2f} [{s['min'] * unit:.2f}, {s['max'] * unit:.2f}]"


def render(res: dict) -> str:
    """The human-readable table of a result dict (what the CLI prints)."""
    lines = _render_header(res) + _render_step(res) + _render_reduced(res) + _render_targets(res)
    if "roofline" not in res or not res["roofline"]:
        lines += _render_batched(res)
        lines += ["", f"total {res['meta']['seconds']:.1f} s (--quick: sections 1, 3 and 7 at the quick size only)"]
        return "\n".join(lines)
    lines += _render_roofline(res) + _render_scaling(res) + _render_paper_step(res) + _render_batched(res)
    lines += ["", f"total {res['meta']['seconds']:.1f} s"]
    return "\n".join(lines)


def _render_header(res: dict) -> list[str]:
    """The machine and run line, and the probed copy bandwidth and matmul rates."""
    m = res["meta"]
    lines = [f"numerics.bench  device={m['device']}  torch {m['torch']}  threads={m['torch_threads']}"
             f"  load average {m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end",
             "medians over repeats, [min, max]", ""]
    if "probes" in res:
        bw = res["probes"]["bandwidth"]
        lines.append(f"memory bandwidth: copy {bw['copy_bytes_per_s']['median'] / 1e9:.2f} GB/s,"
                     f" add {bw['add_bytes_per_s']['median'] / 1e9:.2f} GB/s ({bw['bytes'] / 2**20:.0f} MiB arrays)")
        for dt in m["dtypes"]:
            mm = res["probes"][dt]["matmul"]
            lines.append(f"dense matmul {dt} (n = {mm['n']}): {mm['flop_per_s']['median'] / 1e9:.1f} GFLOP/s")
    return lines


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
    """Section 3: the full flow against the reduced flows and theory's expansion flow."""
    dtypes, rv = res["meta"]["dtypes"], res["reduced_vs_full"]
    lines = ["", f"3. seconds to gradient-flow time t = {rv['time_t']} ({rv['steps']} steps, batch {rv['batch']});"
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
    """The contract's ratios against their targets, and the report profiles' wall times."""
    lines = ["", "targets (median ratios of this run):"]
    for key, per in res["targets"].items():
        lines.append(f"  {key:20s} " + "   ".join(
            f"{dt} {res[key][dt]:.1f}x (target {per[dt]:g}x: {'met' if res['targets_met'][key][dt] else 'NOT met'})"
            for dt in res[key]))
    if "report_profiles" in res:
        lines += ["", "report profiles (python -m reports.build, wall time):"]
        for p, r in res["report_profiles"].items():
            lines.append(f"  {p:6s} {r['seconds']:.1f} s (children's CPU {r['cpu_seconds']:.1f} s): {r['status']}")
    return lines


def _render_roofline(res: dict) -> list[str]:
    """Section 2: the share of the step's time its bytes and FLOPs account for."""
    lines = ["", "2. roofline: share of our step's time that its bytes (at the copy bandwidth) and"
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
    return lines


def _render_scaling(res: dict) -> list[str]:
    """Sections 4 and 5: the scaling exponents and the peak memory."""
    sc = res["scaling"]
    lines = ["", f"4. step time ~ size^k ({sc['dtype']}, bare step, one size varied around the base)"]
    for axis in ("L", "d", "heads", "batch"):
        a = sc[axis]
        pts = ", ".join(f"{x}: {t['median'] * 1e3:.1f}" for x, t in zip(a["sizes"], a["seconds"]))
        lines.append(f"  {axis:6s} k = {a['exponent']:5.2f} (CPU time: {a['exponent_cpu_time']:5.2f})   (ms: {pts})")
    lines += ["", "5. peak memory one step adds (MiB)"]
    for dt, mm in res["peak_memory"].items():
        lines.append(f"  {dt}  " + ", ".join(f"{k} {v['bytes'] / 2**20:.0f}" for k, v in mm.items()))
    return lines


def _render_paper_step(res: dict) -> list[str]:
    """Section 6: the step at the paper configuration."""
    pc = res["configs"]["paper"]
    lines = ["", f"6. milliseconds per step at the paper configuration, tasks {tuple(pc['tasks'])}, H = {pc['heads']},"
                 f" L = {pc['L']}, batch {pc['batch']}"]
    for dt, r in res["paper_step"].items():
        ref = (f"   reference {_fmt_t(r['reference_seconds'])} ratio {r['ratio_reference_over_trainer']['median']:.1f}x"
               if "reference_seconds" in r else "")
        lines.append(f"  {dt}  ours (train()) {_fmt_t(r['trainer_seconds'])}   sampling {_fmt_t(r['sampling_seconds'])}"
                     f" ({100 * r['sampling_share_of_trainer_step']:.0f}%)   without sampling"
                     f" {_fmt_t(r['model_only_seconds'])}{ref}")
    return lines


def _render_batched(res: dict) -> list[str]:
    """Section 7: runs per second, one after another and as train_many's programs."""
    b = res["batched"]
    lines = ["", f"7. {b['runs']} runs of {b['steps']} steps ({b['dtype']}): runs per second one after another"
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
        description="Benchmark the training step: ours vs the standard-way reference, the roofline, reduced vs "
                    "full flow, scaling in L/d/H/batch and peak memory. Prints a table and writes JSON "
                    "(docs/performance.md).")
    add = p.add_argument
    add("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu): every measurement runs on it")
    add("--dtype", default=",".join(DTYPES), help="comma-separated dtypes to time (default float32,float64)")
    add("--repeats", type=int_option("--repeats", 1, 1000, "medians settle long before"), default=None,
        help="timed rounds of the step comparison and repeats of the probes (default 5; not with --smoke)")
    add("--warmup", type=int_option("--warmup", 0, 1000), default=None,
        help="untimed probe calls; > 0: one untimed round of each comparison (default 2; not with --smoke)")
    add("--out", default=None, help="write the results as JSON to this path")
    add("--quick", action="store_true", help="the contract only: sections 1, 3 and 7 at the quick size")
    add("--smoke", action="store_true", help="every section at tiny sizes in seconds (meaningless numbers)")
    add("--seed", type=seed_option("--seed"), default=0, help="seed of the prompt stream (default 0)")
    add("--reduced-time", type=float_option("--reduced-time", finite=False), default=None,
        help="gradient-flow time t of section 3 (default 0.5: 10 steps of lr 0.05; not with --smoke)")
    add("--expansion-time", type=float_option("--expansion-time", finite=False), default=None,
        help=f"time of the expansion flow against the full flow (default {EXPANSION_TIME:g}; not with --smoke)")
    add("--report-profiles", default=None, metavar="P[,P]",
        help=f"also time `python -m reports.build --profile P` for each of {', '.join(REPORT_PROFILES)} given")
    add("--report-timeout", type=float_option("--report-timeout", finite=False), default=None,
        help="with --report-profiles: seconds allowed to each profile (default 3600)")
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
    profiles = _report_profiles(p, a.report_profiles)
    if a.report_timeout is not None and not (math.isfinite(a.report_timeout) and a.report_timeout > 0):
        p.error(f"--report-timeout must be a positive number of seconds, got {a.report_timeout}")
    if a.report_timeout is not None and not profiles:
        p.error("--report-timeout is used only with --report-profiles; add --report-profiles or drop "
                "--report-timeout")
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
                       report_profiles=profiles, report_timeout=3600.0 if a.report_timeout is None else a.report_timeout,
                       progress=not a.no_progress, scaling_steps=1 if a.smoke else 4, out=a.out, threads=a.threads)


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


def _report_profiles(p: argparse.ArgumentParser, given: str | None) -> tuple[str, ...]:
    """--report-profiles' comma-separated list of known profiles (empty when not given)."""
    if given is None:
        return ()
    profiles = tuple(x.strip() for x in given.split(",") if x.strip())
    bad = [x for x in profiles if x not in REPORT_PROFILES]
    if bad or not profiles:
        p.error(f"--report-profiles: unknown profile(s) {bad or given!r}; use "
                f"{', '.join(REPORT_PROFILES)}, comma-separated")
    return profiles


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
