"""Build the audit report: run every claim check, then write claims.json, index.html and PNGs.

    python -m reports.build [--profile tiny|quick|paper] [--out DIR] [--device cpu|cuda]
                            [--seed N] [--only ID[,ID]] [--from-sweep DIR]

The report computes nothing of its own: each claim id of ``claims.REGISTRY`` is run through
its ``run(profile, device, seed, progress, sweep)`` function, which returns a
``claims.base.ClaimResult`` (verdict, theory, numerics, tolerance, perturbation checks,
figure data); this module records provenance, renders (``reports.render``) and writes.

Nothing half-written: the whole report is written into a temporary directory beside DIR
(same filesystem), checked against the schema (:func:`check_report`), and only then swapped
into place (DIR renamed away, the new one renamed to DIR, the old one deleted).  An
interrupted or failing build removes its temporary directory and leaves the previous report
untouched.

Exit status: 0 when every claim passes (and every figure rendered), 1 when any claim fails
or errors, 2 on bad arguments, 130 when interrupted.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TextIO

import claims
from claims.base import PROFILES, VERDICTS, ClaimResult, run_claim

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = "reports/out"
# A report directory carries this file, so that the swap only ever replaces a directory this
# command wrote (``--out ~`` must never delete a home directory).
REPORT_MARKER = ".icl-audit-report"
FIGURE_DIR = "figures"
VERSIONED_PACKAGES = ("torch", "numpy", "scipy", "sympy", "mpmath", "matplotlib")
EXIT_OK, EXIT_CLAIMS_FAILED, EXIT_BAD_ARGUMENTS, EXIT_INTERRUPTED = 0, 1, 2, 130

PROFILE_HELP = """\
profiles (every claim runs at the chosen scale; see docs/report.md for what each claim does):
  tiny   seconds per claim (the whole report in well under a minute). For the report's own
         end-to-end test: it exercises the whole pipeline but its numbers are too small to be
         evidence.
  quick  the default: small configurations (a few heads and tasks, L up to a few hundred)
         and Monte-Carlo sizes whose errors the tolerances account for; a few minutes on 2
         CPU cores for the whole report (at most about 10).
  paper  the scale of the paper's own experiments (larger d, L, batches and training times);
         meant for a GPU (--device cuda), hours on a CPU.
"""


class BadArguments(ValueError):
    """Command-line arguments that cannot work, with what to do instead (exit status 2)."""


class ReportInvalid(RuntimeError):
    """The written report does not satisfy the schema (a bug; the previous report is kept)."""


@dataclass(frozen=True)
class BuildConfig:
    profile: str = "quick"
    out: str = DEFAULT_OUT
    device: str = "cpu"
    seed: int = 0
    only: Optional[tuple[str, ...]] = None   # claim ids, in registry order; None = all
    sweep: Optional[str] = None              # directory of numerics.sweep results
    progress: bool = True                    # per-claim progress bars on stderr


# --------------------------------------------------------------------------- arguments


def parse_only(text: str) -> tuple[str, ...]:
    """``"a,b"`` -> the known ids among them, in registry order; unknown ids are an error."""
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if not wanted:
        raise BadArguments("--only needs at least one claim id, e.g. --only three-phases,optimality; "
                           f"known ids: {', '.join(claims.REGISTRY)}")
    unknown = [cid for cid in wanted if cid not in claims.REGISTRY]
    if unknown:
        raise BadArguments(f"--only: unknown claim id(s) {', '.join(unknown)}; "
                           f"known ids: {', '.join(claims.REGISTRY)}")
    return tuple(cid for cid in claims.REGISTRY if cid in wanted)


def validate(cfg: BuildConfig) -> BuildConfig:
    """Check every argument before any claim runs; raise :class:`BadArguments` saying what is
    wrong and how to fix it."""
    if cfg.profile not in PROFILES:
        raise BadArguments(f"--profile must be one of {', '.join(PROFILES)}, got {cfg.profile!r}")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed < 2**63:
        raise BadArguments(f"--seed must be an integer in [0, 2^63), got {cfg.seed!r}")
    _validate_device(cfg.device)
    if cfg.only is not None:
        parse_only(",".join(cfg.only))
    if cfg.sweep is not None:
        sweep = Path(cfg.sweep)
        if not sweep.is_dir():
            raise BadArguments(f"--from-sweep {cfg.sweep}: no such directory; give the output "
                               "directory of a numerics.sweep run")
        if not (sweep / "points").is_dir() and not (sweep / "summary.json").is_file():
            raise BadArguments(f"--from-sweep {cfg.sweep}: not a numerics.sweep output directory "
                               "(it has neither points/ nor summary.json); give the DIR of "
                               "'python -m numerics.sweep ... --out DIR'")
        cfg = dataclasses.replace(cfg, sweep=str(sweep.resolve()))
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise BadArguments(f"--out {cfg.out} exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not (out / REPORT_MARKER).exists():
        raise BadArguments(f"--out {cfg.out} is a non-empty directory that is not a previous report "
                           f"(no {REPORT_MARKER} file in it); building would replace it. "
                           "Choose a new or empty directory.")
    parent = out.absolute().parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not os.access(existing, os.W_OK):
        raise BadArguments(f"--out {cfg.out}: cannot write in {existing}; choose a writable directory")
    return cfg


def _validate_device(device: str) -> None:
    if device == "cpu":
        return
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise BadArguments(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    import torch  # only here: --help and argument errors stay fast

    if not torch.cuda.is_available():
        raise BadArguments(f"--device {device} requested but no CUDA device is available "
                           f"(torch {torch.__version__}); use --device cpu")
    if ":" in device and int(device[5:]) >= torch.cuda.device_count():
        raise BadArguments(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) "
                           f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reports.build",
        description=textwrap.fill("Run every claim check of the audit of 'Training Dynamics of Multi-Head Softmax "
                    "Attention for In-Context Learning' (Chen, Sheen, Wang, Yang; COLT 2024) and write "
                    "the report: DIR/claims.json (verdicts, theory vs numerics, tolerances, "
                    "provenance), DIR/index.html (one self-contained page) and DIR/figures/*.png. "
                    "Exit status: 0 every claim passes, 1 any claim fails or errors, 2 bad "
                    "arguments, 130 interrupted (the previous report is then left intact).", width=92),
        epilog=PROFILE_HELP + "\nclaim ids: " + ", ".join(claims.REGISTRY),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profile", choices=PROFILES, default="quick",
                        help="scale of every claim's experiment: tiny (seconds, pipeline test), quick "
                             "(default, minutes on 2 CPU cores), paper (paper scale, for a GPU); "
                             "details below")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"report directory (default {DEFAULT_OUT}/, relative to the current "
                             "directory); replaced atomically, and only if it is empty or a previous "
                             "report")
    parser.add_argument("--device", default="cpu", metavar="cpu|cuda|cuda:N",
                        help="torch device the claims train on (default cpu); cuda needs a CUDA build "
                             "of torch and a visible GPU")
    parser.add_argument("--seed", type=int, default=0, metavar="N",
                        help="seed passed to every claim (data, init); the same seed, profile and "
                             "device reproduce the report's numbers exactly (default 0)")
    parser.add_argument("--only", default=None, metavar="ID[,ID]",
                        help="run only these claim ids (comma-separated; see the list below); "
                             "default: all")
    parser.add_argument("--from-sweep", default=None, metavar="DIR", dest="sweep",
                        help="directory of numerics.sweep results passed to each claim as sweep=DIR: "
                             "the limiting-error and multi-head-gain claims take their grid of "
                             "configurations from it instead of running their own (so a sweep run on "
                             "a cluster becomes a report on a laptop)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (the start and end of each claim is still "
                             "printed)")
    return parser


# --------------------------------------------------------------------------- running


class _ClaimProgress:
    """The progress callback of one claim: a tqdm bar on ``stream`` with the claim's own
    message; throttled, and never allowed to raise into the claim."""

    def __init__(self, label: str, stream: TextIO, enabled: bool):
        self.enabled = enabled
        self.stream = stream
        self.last = 0.0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=100, desc=label, file=stream, leave=True, dynamic_ncols=True,
                            bar_format="{desc} {percentage:3.0f}%|{bar:20}| {elapsed}{postfix}")
        else:
            print(f"{label} ...", file=stream, flush=True)

    def __call__(self, message: str, fraction: float) -> None:
        if self.bar is None:
            return
        try:
            now = time.monotonic()
            if now - self.last < 0.2 and fraction < 1.0:
                return
            self.last = now
            f = float(fraction)
            self.bar.n = 0.0 if not math.isfinite(f) else 100.0 * min(1.0, max(0.0, f))
            self.bar.set_postfix_str(str(message)[:70], refresh=False)
            self.bar.refresh()
        except Exception:  # a progress display must never break a claim
            pass

    def close(self, result: ClaimResult) -> None:
        text = f"{result.verdict} in {result.seconds:.1f} s"
        if self.bar is not None:
            self.bar.n = 100.0
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.close()
        else:
            print(f"    {result.id}: {text}", file=self.stream, flush=True)
        if result.verdict == "error" and "error" in result.details:
            print(f"    {result.id}: {result.details['error']}", file=self.stream, flush=True)


def run_one(claim_id: str, cfg: BuildConfig, progress=None) -> ClaimResult:
    """Run one claim through ``claims.claim_runner``; any exception (an import error, a claim
    that breaks its contract) becomes a ``ClaimResult`` with verdict ``error`` and the
    traceback, so one broken claim never hides the rest.  KeyboardInterrupt propagates."""

    def body() -> ClaimResult:
        run = claims.claim_runner(claim_id)
        kwargs = dict(profile=cfg.profile, device=cfg.device, seed=cfg.seed, sweep=cfg.sweep)
        if progress is not None:
            kwargs["progress"] = progress
        result = run(**kwargs)
        if not isinstance(result, ClaimResult):
            raise TypeError(f"{claims.REGISTRY[claim_id]} returned {type(result).__name__}, "
                            "not a claims.base.ClaimResult")
        if result.verdict not in VERDICTS:
            raise ValueError(f"{claims.REGISTRY[claim_id]} returned verdict {result.verdict!r}, "
                             f"not one of {VERDICTS}")
        if result.id != claim_id:
            raise ValueError(f"{claims.REGISTRY[claim_id]} returned id {result.id!r} for registry id "
                             f"{claim_id!r}; the ids of claims.json are the registry's")
        return result

    return run_claim(claim_id, claim_id, "(not available: the claim check raised before returning "
                     "its result; see the error below)", body)


def run_all(cfg: BuildConfig, stream: TextIO = sys.stderr,
            cpu_seconds: Optional[dict] = None) -> list[ClaimResult]:
    """Every claim of ``cfg.only`` (default: the registry), in registry order, with progress
    "[k/n] id ..." on ``stream``.  ``cpu_seconds``, if given, receives each claim's CPU time
    (all threads of this process): unlike wall time it is not inflated by other processes
    competing for the cores."""
    ids = list(cfg.only) if cfg.only is not None else list(claims.REGISTRY)
    results = []
    for k, claim_id in enumerate(ids, start=1):
        display = _ClaimProgress(f"[{k}/{len(ids)}] {claim_id}", stream, cfg.progress)
        cpu0 = time.process_time()
        try:
            result = run_one(claim_id, cfg, display)
        except BaseException:  # Ctrl-C or SIGTERM: end the bar's line before the message
            if display.bar is not None:
                display.bar.close()
            raise
        if cpu_seconds is not None:
            cpu_seconds[claim_id] = time.process_time() - cpu0
        display.close(result)
        results.append(result)
    return results


# --------------------------------------------------------------------------- provenance


def _version(package: str) -> str:
    try:
        module = __import__(package)
        return str(getattr(module, "__version__", "unknown"))
    except Exception:
        return "not installed"


def git_state() -> dict:
    """``{"commit": sha or "unknown", "dirty": bool or "unknown"}`` of the source tree."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10)
        if sha.returncode != 0:
            return {"commit": "unknown", "dirty": "unknown"}
        status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else "unknown"
        return {"commit": sha.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": "unknown"}


def provenance(cfg: BuildConfig, results: list[ClaimResult], started_utc: str, total_seconds: float,
               command: list[str], cpu_seconds: Optional[dict] = None,
               render_seconds: Optional[float] = None) -> dict:
    device = {"name": cfg.device}
    if cfg.device.startswith("cuda"):
        import torch

        device["gpu"] = torch.cuda.get_device_name(torch.device(cfg.device))
    return {
        "versions": {"python": platform.python_version(),
                     **{p: _version(p) for p in VERSIONED_PACKAGES}},
        "platform": platform.platform(),
        "device": cfg.device,
        "device_info": device,
        "seed": cfg.seed,
        "seeds": {"base_seed": cfg.seed, "note": "passed unchanged to every claim run(seed=...)"},
        "profile": cfg.profile,
        "only": list(cfg.only) if cfg.only is not None else None,
        "sweep": cfg.sweep,
        "wall_seconds": {"per_claim": {r.id: r.seconds for r in results}, "total": total_seconds,
                         "rendering": render_seconds},
        "cpu_seconds": {"per_claim": dict(cpu_seconds or {}),
                        "total": sum((cpu_seconds or {}).values())},
        "git": git_state(),
        "command": command,
        "started_utc": started_utc,
    }


# --------------------------------------------------------------------------- writing


def _figure_file(claim_id: str, name: str, taken: set[str]) -> str:
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in f"{claim_id}__{name}") or "figure"
    candidate, k = f"{FIGURE_DIR}/{stem}.png", 2
    while candidate in taken:
        candidate, k = f"{FIGURE_DIR}/{stem}-{k}.png", k + 1
    taken.add(candidate)
    return candidate


def render_results(results: list[ClaimResult]) -> tuple[list[dict], dict[str, bytes]]:
    """The ``claims`` entries of ``claims.json`` and the PNG bytes of every figure.

    A figure that cannot be drawn is listed in the claim's ``figure_errors`` (and on the
    page) instead of stopping the report."""
    from reports.render import as_figure, figure_png

    entries, pngs, taken = [], {}, set()
    for result in results:
        entry = result.to_dict()
        figure_data = entry.pop("figures")
        perturbations = entry.pop("perturbations")
        seconds = entry.pop("seconds")
        figures, errors = [], []
        for raw in result.figures:
            try:
                fig = as_figure(raw)
                data = figure_png(fig)
            except Exception as exc:
                name = getattr(raw, "name", None) or (raw.get("name") if isinstance(raw, dict) else None)
                errors.append(f"{name or '?'}: {type(exc).__name__}: {exc}")
                continue
            file = _figure_file(result.id, fig.name, taken)
            pngs[file] = data
            figures.append({"name": fig.name, "title": fig.title, "kind": fig.kind, "file": file})
        entry.update(perturbations=perturbations, seconds=seconds, figures=figures,
                     figure_errors=errors, figure_data=figure_data)
        entries.append(entry)
    return entries, pngs


def write_report(out: Path, report: dict, pngs: dict[str, bytes]) -> Path:
    """Write ``report`` into a temporary directory beside ``out``, check it, then swap it into
    ``out``.  On any exception (KeyboardInterrupt included) the temporary directory is
    removed and a previous report in ``out`` is left as it was."""
    from reports.render import render_html

    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / FIGURE_DIR).mkdir()
        for file, data in pngs.items():
            (tmp / file).write_bytes(data)
        text = json.dumps(report, indent=2, allow_nan=False)  # strict JSON or an error here
        (tmp / "claims.json").write_text(text + "\n", encoding="utf-8")
        (tmp / "index.html").write_text(render_html(report, pngs), encoding="utf-8")
        (tmp / REPORT_MARKER).write_text("written by python -m reports.build\n", encoding="utf-8")
        problems = check_report(tmp)
        if problems:
            raise ReportInvalid("the report does not satisfy its schema:\n  " + "\n  ".join(problems))
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap_into_place(new: Path, out: Path) -> None:
    if not out.exists():
        os.rename(new, out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)  # put the previous report back before reporting the failure
        raise
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- schema


CLAIM_KEYS = {"id": str, "title": str, "statement": str, "verdict": str, "theory": dict,
              "numerics": dict, "tolerance": dict, "details": dict, "perturbations": list,
              "seconds": (int, float), "figures": list, "figure_errors": list, "figure_data": list}
PROVENANCE_KEYS = {"versions": dict, "device": str, "seed": int, "profile": str, "wall_seconds": dict,
                   "cpu_seconds": dict, "git": dict, "command": list, "started_utc": str, "seeds": dict}


def _strict_constant(name: str):
    raise ValueError(f"non-strict JSON constant {name}")


def check_report(out_dir: Path) -> list[str]:
    """Problems with the report in ``out_dir`` (an empty list when it is valid): strict JSON,
    the keys and types of every claim entry and of the provenance, verdicts, unique ids, the
    PNG files, and an index.html holding every claim's section and every figure inline."""
    out_dir = Path(out_dir)
    problems: list[str] = []
    try:
        report = json.loads((out_dir / "claims.json").read_text(encoding="utf-8"),
                            parse_constant=_strict_constant)
    except (OSError, ValueError) as exc:
        return [f"claims.json: {exc}"]
    if not isinstance(report, dict) or set(report) != {"claims", "provenance"}:
        return ["claims.json: top level must be an object with exactly the keys 'claims' and 'provenance'"]
    entries, prov = report["claims"], report["provenance"]
    if not isinstance(entries, list) or not isinstance(prov, dict):
        return ["claims.json: 'claims' must be a list and 'provenance' an object"]
    ids = []
    for k, entry in enumerate(entries):
        where = f"claims[{k}] ({entry.get('id', '?') if isinstance(entry, dict) else '?'})"
        if not isinstance(entry, dict):
            problems.append(f"{where}: not an object")
            continue
        for key, kind in CLAIM_KEYS.items():
            if key not in entry:
                problems.append(f"{where}: missing key {key!r}")
            elif not isinstance(entry[key], kind) or isinstance(entry[key], bool):
                problems.append(f"{where}: {key!r} has type {type(entry[key]).__name__}")
        if entry.get("verdict") not in VERDICTS:
            problems.append(f"{where}: verdict {entry.get('verdict')!r} not one of {VERDICTS}")
        ids.append(entry.get("id"))
        for p in entry.get("perturbations") or []:
            if not (isinstance(p, dict) and isinstance(p.get("description"), str)
                    and isinstance(p.get("rejected"), bool) and isinstance(p.get("details"), dict)):
                problems.append(f"{where}: perturbation {p!r} needs description (str), rejected (bool), "
                                "details (object)")
        for fig in entry.get("figures") or []:
            file = fig.get("file") if isinstance(fig, dict) else None
            if not isinstance(file, str) or not (out_dir / file).is_file():
                problems.append(f"{where}: figure {fig!r} has no PNG file in the report")
            elif (out_dir / file).read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
                problems.append(f"{where}: {file} is not a PNG")
    if len(set(ids)) != len(ids):
        problems.append(f"claims.json: duplicate claim ids in {ids}")
    for key, kind in PROVENANCE_KEYS.items():
        if key not in prov:
            problems.append(f"provenance: missing key {key!r}")
        elif not isinstance(prov[key], kind):
            problems.append(f"provenance: {key!r} has type {type(prov[key]).__name__}")
    for package in ("python",) + VERSIONED_PACKAGES:
        if package not in (prov.get("versions") or {}):
            problems.append(f"provenance.versions: missing {package}")
    if not {"commit", "dirty"} <= set(prov.get("git") or {}):
        problems.append("provenance.git: needs 'commit' and 'dirty'")
    if not {"per_claim", "total"} <= set(prov.get("wall_seconds") or {}):
        problems.append("provenance.wall_seconds: needs 'per_claim' and 'total'")
    try:
        page = (out_dir / "index.html").read_text(encoding="utf-8")
    except OSError as exc:
        return problems + [f"index.html: {exc}"]
    from reports.render import _anchor

    for entry in entries:
        if isinstance(entry, dict) and f"id='{_anchor(str(entry.get('id')))}'" not in page:
            problems.append(f"index.html: no section for claim {entry.get('id')!r}")
    n_figures = sum(len(e.get("figures") or []) for e in entries if isinstance(e, dict))
    n_inline = page.count('src="data:image/png;base64,')
    if n_inline != n_figures:
        problems.append(f"index.html: {n_inline} inline figures, claims.json lists {n_figures}")
    if "<script" in page.lower() or 'src="http' in page or "src='http" in page:
        problems.append("index.html: not self-contained (script or remote source)")
    return problems


# --------------------------------------------------------------------------- command


def build(cfg: BuildConfig, command: Optional[list[str]] = None, stream: TextIO = sys.stderr) -> dict:
    """Validate, run the claims, write the report into ``cfg.out``; returns the claims.json
    document.  Raises :class:`BadArguments` before running anything if an argument is wrong."""
    cfg = validate(cfg)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    n = len(cfg.only) if cfg.only is not None else len(claims.REGISTRY)
    print(f"audit report: profile {cfg.profile}, device {cfg.device}, seed {cfg.seed}, {n} claim(s) "
          f"-> {cfg.out}", file=stream, flush=True)
    t0 = time.perf_counter()
    cpu_seconds: dict[str, float] = {}
    results = run_all(cfg, stream, cpu_seconds)
    t_render = time.perf_counter()
    entries, pngs = render_results(results)
    now = time.perf_counter()
    report = {"claims": entries,
              "provenance": provenance(cfg, results, started, now - t0,
                                       command or ["python", "-m", "reports.build"],
                                       cpu_seconds, now - t_render)}
    write_report(Path(cfg.out), report, pngs)
    return report


def summary_table(report: dict) -> str:
    entries = report["claims"]
    width = max([len(e["id"]) for e in entries] + [5])
    cpu = report["provenance"].get("cpu_seconds", {}).get("per_claim", {})
    lines = [f"{'claim':<{width}}  verdict  seconds  cpu s", f"{'-' * width}  -------  -------  -----"]
    for e in entries:
        note = f"  ({len(e['figure_errors'])} figure(s) not rendered)" if e["figure_errors"] else ""
        cpu_text = f"{cpu[e['id']]:5.1f}" if e["id"] in cpu else "    -"
        lines.append(f"{e['id']:<{width}}  {e['verdict']:<7}  {e['seconds']:7.1f}  {cpu_text}{note}")
    counts = {v: sum(e["verdict"] == v for e in entries) for v in VERDICTS}
    wall = report["provenance"]["wall_seconds"]
    lines.append(f"{counts['pass']} pass, {counts['fail']} fail, {counts['error']} error; total "
                 f"{wall['total']:.1f} s wall (rendering {wall.get('rendering') or 0:.1f} s)")
    return "\n".join(lines)


def exit_status(report: dict) -> int:
    entries = report["claims"]
    ok = all(e["verdict"] == "pass" and not e["figure_errors"] for e in entries)
    return EXIT_OK if ok else EXIT_CLAIMS_FAILED


def _raise_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)  # argparse's own errors exit 2
    command = [sys.executable, "-m", "reports.build"] + list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = BuildConfig(profile=args.profile, out=args.out, device=args.device, seed=args.seed,
                          only=parse_only(args.only) if args.only is not None else None,
                          sweep=args.sweep, progress=not args.no_progress)
        cfg = validate(cfg)
    except BadArguments as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    # SIGTERM (a scheduler's kill) takes the same path as Ctrl-C: temporary files removed,
    # the previous report intact.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _main_thread() else None
    try:
        report = build(cfg, command)
    except KeyboardInterrupt:
        print(f"\ninterrupted: no report written; the previous report in {cfg.out} (if any) is intact",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(summary_table(report))
    print(f"report: {Path(cfg.out) / 'index.html'}")
    return exit_status(report)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
