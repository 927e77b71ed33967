"""Build the audit report: run every claim check, then write claims.json, index.html and PNGs.

    python -m reports.build [--profile tiny|quick|paper] [--out DIR] [--device cpu|cuda]
                            [--seed N] [--only ID[,ID]] [--from-sweep DIR]
                            [--tasks R,R,.. --heads H --L L [--sigma S] [--param P] [--init S0]
                             [--logit-scale s] [--basis B] [--dtype D] | --config FILE.toml]
                            [--max-minutes M]
    python -m reports.build --from-json OLD/claims.json --out NEW     (re-render, no compute)

The report computes nothing of its own: each claim id of ``claims.REGISTRY`` is run through
its ``run(profile, device, seed, progress, sweep)`` function, which returns a
``claims.base.ClaimResult`` (verdict, theory, numerics, tolerance, perturbation checks,
figure data); this module records provenance, renders (``reports.render``) and writes.

Per-configuration audit: ``--tasks/--heads/--L`` (and the optional ProblemConfig fields), or a
TOML file of the same fields, are validated by ``numerics.config.ProblemConfig`` before any
claim runs and handed as ``problem=`` (a dict of those fields) to every runner whose
signature accepts it; the others run at their profile, and claims.json's provenance says
which ran where (``provenance.problem``, ``provenance.ran_at``).  Before anything runs, the
cost of the runs at that configuration is estimated (:func:`estimate_cost`) and refused
above ``--max-minutes``.

Nothing half-written: the whole report is written into a temporary directory beside DIR
(same filesystem), checked against the schema (:func:`check_report`), and only then swapped
into place (DIR renamed away, the new one renamed to DIR, the old one deleted).  An
interrupted or failing build removes its temporary directory and leaves the previous report
untouched.  A build killed by SIGKILL between the two renames of the swap leaves no DIR and
the previous report stranded as ``.DIR.old-*``; a killed write leaves ``.DIR.tmp-*``: the next
build restores the stranded report / removes those leftovers first, and says so on stderr
(:func:`recover_leftovers`).

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
import inspect
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
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
# A per-configuration audit estimated longer than this is refused (--max-minutes raises it).
DEFAULT_MAX_MINUTES = 60.0

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


class CostTooHigh(BadArguments):
    """The estimated cost of a per-configuration audit exceeds ``--max-minutes``."""


class ReportInvalid(RuntimeError):
    """The written report does not satisfy the schema (a bug; the previous report is kept)."""


@dataclass(frozen=True)
class BuildConfig:
    profile: str = "quick"
    out: str = DEFAULT_OUT
    device: str = "cpu"
    seed: int = 0
    only: Optional[tuple[str, ...]] = None   # claim ids, in registry order; None = all
    sweep: Optional[str] = None              # directory of tools.sweep results
    progress: bool = True                    # per-claim progress bars on stderr
    problem: Optional[dict] = None           # ProblemConfig fields of a per-configuration audit
    max_minutes: float = DEFAULT_MAX_MINUTES  # refuse a per-configuration audit estimated longer


# --------------------------------------------------------------------------- arguments

# The ProblemConfig fields a researcher may set, with their command-line flag (the TOML file
# of --config uses the field names).  The rest of ProblemConfig (seeds, init kind, device) is
# the claims' business or comes from --seed/--device.
PROBLEM_FLAGS = {"tasks": "--tasks", "heads": "--heads", "L": "--L", "sigma": "--sigma",
                 "param": "--param", "init_scale": "--init", "logit_scale": "--logit-scale",
                 "basis": "--basis", "dtype": "--dtype"}
REQUIRED_PROBLEM_FIELDS = ("tasks", "heads", "L")

# Cost model of one training run at a configuration: one GD step on a batch of B prompts of
# L tokens costs about B * L * H * (d + m) * SECONDS_PER_ELEMENT seconds (attention scores and
# outputs of H heads over tokens of dimension d + m).  Measured on this project's 2-core
# machine, one torch thread, float64, numerics.train.train: 2.6e-9 .. 7e-9 s over
# (r, H, L, B) = (3,3,3),3,{64,256},256 / (2,2),2,64,512 / (4,4,4,4),4,128,256; the upper
# end is taken so the estimate errs long.  RUNS_PER_CLAIM: a claim at a configuration trains
# at least the model itself with numerics.train's default TrainConfig; claims that build a
# family around it (several L, one head against H) run more, so this is a lower estimate.
SECONDS_PER_ELEMENT = 7e-9
RUNS_PER_CLAIM = 1


def parse_tasks(text: str) -> tuple[int, ...]:
    """``"3,3,3"`` -> (3, 3, 3); an empty entry (``"2,,2"``) or a non-integer is an error."""
    parts = [part.strip() for part in str(text).split(",")]
    if any(part == "" for part in parts):
        raise BadArguments(f"--tasks {text!r}: an empty block size (two commas, or a comma at an end); "
                           "give the block sizes r_i as integers separated by commas, e.g. --tasks 3,3,3")
    sizes = []
    for part in parts:
        try:
            sizes.append(int(part))
        except ValueError:
            raise BadArguments(f"--tasks {text!r}: {part!r} is not an integer; give the block sizes r_i "
                               "as integers separated by commas, e.g. --tasks 3,3,3") from None
    return tuple(sizes)


def read_config_file(path: str) -> dict:
    """The ProblemConfig fields of a TOML file (top level, or a ``[problem]`` table)."""
    file = Path(path)
    if not file.is_file():
        raise BadArguments(f"--config {path}: no such file" if not file.exists() else
                           f"--config {path}: not a file; give a TOML file of ProblemConfig fields")
    try:
        with file.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise BadArguments(f"--config {path}: not valid TOML ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadArguments(f"--config {path}: cannot be read as a TOML text file ({exc})") from None
    if set(data) == {"problem"} and isinstance(data["problem"], dict):
        data = data["problem"]
    unknown = sorted(set(data) - set(PROBLEM_FLAGS))
    if unknown:
        raise BadArguments(f"--config {path}: unknown field(s) {unknown}; known fields: "
                           f"{', '.join(PROBLEM_FLAGS)} (e.g. tasks = [3, 3, 3], heads = 3, L = 256)")
    return dict(data)


def check_problem(fields: dict, device: str = "cpu") -> dict:
    """Validate the fields of a per-configuration audit with ``numerics.config.ProblemConfig``
    (its own messages, so they read as ``numerics.train``'s); returns the fields normalised
    (tasks a list of ints, numbers as ProblemConfig stores them)."""
    missing = [name for name in REQUIRED_PROBLEM_FIELDS if name not in fields]
    if missing:
        flags = ", ".join(PROBLEM_FLAGS[name] for name in missing)
        raise BadArguments(f"a per-configuration audit needs {flags} as well (given: "
                           f"{', '.join(PROBLEM_FLAGS[k] for k in fields) or 'none'}); e.g. "
                           "--tasks 3,3,3 --heads 3 --L 256")
    from numerics.config import ProblemConfig  # torch: only when a configuration is audited

    try:
        cfg = ProblemConfig(**fields, device=device)
    except (ValueError, TypeError) as exc:
        raise BadArguments(str(exc)) from None
    normal = {name: getattr(cfg, name) for name in fields}
    normal["tasks"] = list(cfg.tasks)
    return normal


def accepts_problem(claim_id: str) -> bool:
    """Whether the runner of ``claim_id`` takes ``problem=`` (claims/__init__.py)."""
    return "problem" in inspect.signature(claims.claim_runner(claim_id)).parameters


@dataclass(frozen=True)
class CostEstimate:
    runs: int                 # training runs at the configuration
    steps: int                # GD steps per run (numerics.train's default TrainConfig)
    batch: int                # prompts per step
    elements: int             # runs * steps * batch * L
    seconds: float            # rough wall seconds on one CPU thread
    memory_bytes: int         # rough peak memory of one run

    def describe(self, problem: dict) -> str:
        return (f"{self.runs} training run(s) x {self.steps} steps x batch {self.batch} x L {problem['L']} "
                f"= {self.elements:.3g} prompt-tokens, with H = {problem['heads']} heads of token "
                f"dimension d + m = {sum(problem['tasks']) + len(problem['tasks'])}: about "
                f"{_duration(self.seconds)} on one CPU thread, about {self.memory_bytes / 2**30:.2g} GiB "
                "of memory per run")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.3g} days"


def estimate_cost(problem: dict, n_claims: int) -> CostEstimate:
    """A rough cost of ``n_claims`` claims run at ``problem`` (see SECONDS_PER_ELEMENT)."""
    from numerics.train import TrainConfig  # torch: only when a configuration is audited

    train = TrainConfig()
    d, m, H, L = sum(problem["tasks"]), len(problem["tasks"]), problem["heads"], problem["L"]
    runs = RUNS_PER_CLAIM * n_claims
    elements = runs * train.steps * train.batch * L
    itemsize = 4 if problem.get("dtype") == "float32" else 8
    # parameters K, Q, V, O per head; the prompts and per-head scores/outputs of one batch,
    # about 3 copies with the autograd graph
    memory = itemsize * (4 * H * (d + m) ** 2 + 3 * train.batch * L * (d + m) * (1 + H))
    return CostEstimate(runs=runs, steps=train.steps, batch=train.batch, elements=elements,
                        seconds=elements * H * (d + m) * SECONDS_PER_ELEMENT, memory_bytes=memory)


def _physical_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_cost(cfg: "BuildConfig") -> Optional[CostEstimate]:
    """The cost estimate of the claims that run at ``cfg.problem``; raises :class:`CostTooHigh`
    with the estimate when it exceeds ``cfg.max_minutes`` or the machine's memory, and
    :class:`BadArguments` when none of the selected claims can take a configuration."""
    if cfg.problem is None:
        return None
    ran_at = claims_at_configuration(cfg)
    if not ran_at["configuration"]:
        # running them all at their profile would answer a question the researcher did not ask
        raise BadArguments(f"none of the selected claims ({', '.join(ran_at['profile'])}) can run at a given "
                           "configuration yet (their runners take no problem= argument); drop the "
                           "configuration flags to run them at a --profile, or select claims that take one")
    estimate = estimate_cost(cfg.problem, len(ran_at["configuration"]))
    if estimate.seconds > 60 * cfg.max_minutes:
        raise CostTooHigh(f"estimated cost at this configuration: {estimate.describe(cfg.problem)}, over "
                          f"--max-minutes {cfg.max_minutes:g}. Raise the limit (--max-minutes "
                          f"{math.ceil(estimate.seconds / 60)}), choose smaller sizes, or run "
                          "fewer claims (--only)")
    memory = _physical_memory()
    if memory is not None and estimate.memory_bytes > memory:
        raise CostTooHigh(f"estimated memory at this configuration: {estimate.describe(cfg.problem)}; "
                          f"this machine has {memory / 2**30:.3g} GiB. Choose smaller sizes "
                          "(L, heads, tasks)")
    return estimate


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
                               "directory of a tools.sweep run")
        if not (sweep / "points").is_dir() and not (sweep / "summary.json").is_file():
            raise BadArguments(f"--from-sweep {cfg.sweep}: not a tools.sweep output directory "
                               "(it has neither points/ nor summary.json); give the DIR of "
                               "'python -m tools.sweep ... --out DIR'")
        cfg = dataclasses.replace(cfg, sweep=str(sweep.resolve()))
    if isinstance(cfg.max_minutes, bool) or not isinstance(cfg.max_minutes, (int, float)) \
            or not math.isfinite(cfg.max_minutes) or cfg.max_minutes <= 0:
        raise BadArguments(f"--max-minutes must be a number > 0, got {cfg.max_minutes!r}")
    if cfg.problem is not None:
        cfg = dataclasses.replace(cfg, problem=check_problem(dict(cfg.problem), cfg.device))
    check_output_dir(cfg.out, "--out")
    return cfg


def check_output_dir(path: str, flag: str) -> None:
    """Refuse, before any compute, an output directory that cannot be written: a file where the
    directory (or one of its parents) should be, a directory that is not a previous report, a
    parent where nothing can be created (probed by creating and removing a directory there)."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise BadArguments(f"{flag} {path} exists and is not a directory; choose another {flag}")
    if out.is_dir() and any(out.iterdir()) and not (out / REPORT_MARKER).exists():
        raise BadArguments(f"{flag} {path} is a non-empty directory that is not a previous report "
                           f"(no {REPORT_MARKER} file in it); building would replace it. "
                           "Choose a new or empty directory.")
    existing = out.absolute().parent
    while not existing.exists() and not existing.is_symlink():
        existing = existing.parent
    if not existing.is_dir():
        raise BadArguments(f"{flag} {path}: {existing} is a file where a directory is expected; "
                           f"choose another {flag}")
    try:
        probe = tempfile.mkdtemp(prefix=".write-probe-", dir=existing)
        os.rmdir(probe)
    except OSError as exc:
        raise BadArguments(f"{flag} {path}: cannot write in {existing} ({exc.strerror or exc}); "
                           "choose a writable directory") from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


# A temporary directory of a build that is no longer running: its pid is in its name
# (``.DIR.tmp-<pid>-<random>``); one without a pid (older builds) counts as stale after this.
STALE_TMP_SECONDS = 3600.0


def recover_leftovers(out: Path, stream: Optional[TextIO] = None) -> list[str]:
    """Repair what a killed build left beside ``out`` (returns the messages, also printed on
    ``stream``):

    - no ``out`` but a stranded ``.out.old-*`` report (killed between the two renames of the
      swap): the newest such report is renamed back to ``out``;
    - ``.out.old-*`` reports beside an existing ``out`` (killed after the swap, before the
      old one was deleted): removed;
    - ``.out.tmp-*`` directories of builds no longer running (killed while writing): removed.

    Only directories carrying this command's names are touched, and an ``.old-*`` one only
    if it holds the report marker."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    out = Path(out).absolute()
    parent = out.parent
    if not parent.is_dir():
        return []
    messages = []
    olds = sorted((p for p in parent.glob(f".{out.name}.old-*")
                   if p.is_dir() and (p / REPORT_MARKER).is_file()),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    if olds and not out.exists():
        os.rename(olds[0], out)
        messages.append(f"recovered: {out} was missing (a build was killed while swapping reports); "
                        f"restored the previous report from {olds[0].name}")
        olds = olds[1:]
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)
        messages.append(f"cleaned: removed {old.name}, a replaced report a killed build left behind")
    now = time.time()
    for tmp in parent.glob(f".{out.name}.tmp-*"):
        if not tmp.is_dir():
            continue
        pid_text = tmp.name[len(f".{out.name}.tmp-"):].split("-", 1)[0]
        if pid_text.isdigit():
            stale = int(pid_text) != os.getpid() and not _pid_alive(int(pid_text))
        else:
            stale = now - tmp.stat().st_mtime > STALE_TMP_SECONDS
        if stale:
            shutil.rmtree(tmp, ignore_errors=True)
            messages.append(f"cleaned: removed {tmp.name}, the unfinished output of a killed build")
    for message in messages:
        print(message, file=stream, flush=True)
    return messages


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
    parser.add_argument("--profile", choices=PROFILES, default=None,
                        help="scale of every claim's experiment: tiny (seconds, pipeline test), quick "
                             "(default, minutes on 2 CPU cores), paper (paper scale, for a GPU); "
                             "details below")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"report directory (default {DEFAULT_OUT}/, relative to the current "
                             "directory); replaced atomically, and only if it is empty or a previous "
                             "report")
    parser.add_argument("--device", default=None, metavar="cpu|cuda|cuda:N",
                        help="torch device the claims train on (default cpu); cuda needs a CUDA build "
                             "of torch and a visible GPU")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="seed passed to every claim (data, init); the same seed, profile and "
                             "device reproduce the report's numbers exactly (default 0)")
    parser.add_argument("--only", default=None, metavar="ID[,ID]",
                        help="run only these claim ids (comma-separated; see the list below); "
                             "default: all")
    parser.add_argument("--from-sweep", default=None, metavar="DIR", dest="sweep",
                        help="directory of tools.sweep results passed to each claim as sweep=DIR: "
                             "the limiting-error and multi-head-gain claims take their grid of "
                             "configurations from it instead of running their own (so a sweep run on "
                             "a cluster becomes a report on a laptop)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (the start and end of each claim is still "
                             "printed)")
    audit = parser.add_argument_group("per-configuration audit", textwrap.fill(
        "run every claim that can at this configuration (validated as numerics.train validates "
        "it); the others run at --profile, and the report says which ran where. --tasks, --heads "
        "and --L are required; the flags override the fields of --config", width=88))
    audit.add_argument("--tasks", default=None, metavar="R,R,..",
                       help="block sizes r_i of the m tasks, e.g. 3,3,3 (d = sum r_i)")
    audit.add_argument("--heads", type=int, default=None, metavar="H", help="number of heads H")
    audit.add_argument("--L", type=int, default=None, metavar="L", help="context length L")
    audit.add_argument("--sigma", type=float, default=None, metavar="S", help="label noise std (default 0)")
    audit.add_argument("--param", default=None, choices=("factored", "merged"),
                       help="parametrisation (default factored)")
    audit.add_argument("--init", type=float, default=None, metavar="S0", dest="init_scale",
                       help="scale s0 of the decomposable initialisation (default 0.15)")
    audit.add_argument("--logit-scale", type=float, default=None, metavar="s", dest="logit_scale",
                       help="s in W_h = K_h^T Q_h / s (factored only; default 1)")
    audit.add_argument("--basis", default=None, choices=("identity", "random"),
                       help="task basis Phi (default identity)")
    audit.add_argument("--dtype", default=None, choices=("float64", "float32"), help="default float64")
    audit.add_argument("--config", default=None, metavar="FILE.toml",
                       help="a TOML file of these fields by their ProblemConfig names (tasks = [3, 3, 3], "
                            "heads = 3, L = 256, sigma, param, init_scale, logit_scale, basis, dtype), "
                            "at the top level or in a [problem] table")
    audit.add_argument("--max-minutes", type=float, default=None, metavar="M", dest="max_minutes",
                       help="refuse a per-configuration audit whose estimated cost (printed before it "
                            "starts) exceeds M minutes (default 60)")
    parser.add_argument("--from-json", default=None, metavar="FILE", dest="from_json",
                        help="re-render the report of this claims.json into --out without running any "
                             "claim (figures redrawn from their stored data); only --out goes with it")
    return parser


COMPUTE_OPTIONS = ("profile", "device", "seed", "only", "sweep", "config", "max_minutes", *PROBLEM_FLAGS)


def config_from_args(args: argparse.Namespace) -> BuildConfig:
    """The BuildConfig of parsed arguments: the problem fields of --config, overridden by the
    flags given, validated with the rest in :func:`validate`."""
    problem: Optional[dict] = read_config_file(args.config) if args.config is not None else None
    given = {name: getattr(args, name) for name in PROBLEM_FLAGS if getattr(args, name) is not None}
    if "tasks" in given:
        given["tasks"] = parse_tasks(given["tasks"])
    if given:
        problem = {**(problem or {}), **given}
    return BuildConfig(profile=args.profile or "quick", out=args.out, device=args.device or "cpu",
                       seed=0 if args.seed is None else args.seed,
                       only=parse_only(args.only) if args.only is not None else None,
                       sweep=args.sweep, progress=not args.no_progress, problem=problem,
                       max_minutes=DEFAULT_MAX_MINUTES if args.max_minutes is None else args.max_minutes)


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
        if cfg.problem is not None and "problem" in inspect.signature(run).parameters:
            kwargs["problem"] = dict(cfg.problem)
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


def run_all(cfg: BuildConfig, stream: Optional[TextIO] = None,
            cpu_seconds: Optional[dict] = None) -> list[ClaimResult]:
    """Every claim of ``cfg.only`` (default: the registry), in registry order, with progress
    "[k/n] id ..." on ``stream``.  ``cpu_seconds``, if given, receives each claim's CPU time
    (all threads of this process): unlike wall time it is not inflated by other processes
    competing for the cores."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
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


def unreadable_sweep_points(sweep: str) -> list[dict]:
    """The files of ``sweep/points/`` that ``tools.sweep.load_results`` skips (not JSON,
    or not a point record): ``[{"file", "reason"}]``.  The claims read the sweep through
    load_results, which drops them silently; the report says which."""
    from tools.sweep.store import read_point_file  # the sweep's own reading rule, not a copy

    skipped = []
    points = Path(sweep) / "points"
    if not points.is_dir():
        return skipped
    for path in sorted(points.glob("*.json")):
        if path.name.startswith(".") or read_point_file(path) is not None:
            continue
        try:
            json.loads(path.read_text())
            reason = "not a point record of this sweep (no 'point', or its 'id' is not the file name)"
        except (OSError, UnicodeDecodeError) as exc:
            reason = f"unreadable: {exc}"
        except ValueError as exc:
            reason = f"not valid JSON: {exc}"
        skipped.append({"file": str(path), "reason": reason})
    return skipped


def claims_at_configuration(cfg: BuildConfig) -> dict:
    """``{"configuration": ids run at cfg.problem, "profile": ids run at their profile}``."""
    ids = list(cfg.only) if cfg.only is not None else list(claims.REGISTRY)
    if cfg.problem is None:
        return {"configuration": [], "profile": ids}
    at = [cid for cid in ids if _safe_accepts_problem(cid)]
    return {"configuration": at, "profile": [cid for cid in ids if cid not in at]}


def _safe_accepts_problem(claim_id: str) -> bool:
    try:
        return accepts_problem(claim_id)
    except Exception:  # a claim that cannot be imported shows up as an error when it is run
        return False


def provenance(cfg: BuildConfig, results: list[ClaimResult], started_utc: str, total_seconds: float,
               command: list[str], cpu_seconds: Optional[dict] = None,
               render_seconds: Optional[float] = None, sweep_skipped: Optional[list] = None,
               cost: Optional["CostEstimate"] = None) -> dict:
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
        "sweep_skipped": list(sweep_skipped or []),
        "problem": dict(cfg.problem) if cfg.problem is not None else None,
        "ran_at": claims_at_configuration(cfg),
        "cost_estimate": dataclasses.asdict(cost) if cost is not None else None,
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
    entries = []
    for result in results:
        entry = result.to_dict()
        figure_data = entry.pop("figures")
        perturbations = entry.pop("perturbations")
        seconds = entry.pop("seconds")
        entry.update(perturbations=perturbations, seconds=seconds, figure_data=figure_data)
        entries.append(entry)
    return draw_figures(entries)


def draw_figures(entries: list[dict]) -> tuple[list[dict], dict[str, bytes]]:
    """Draw every entry's ``figure_data`` (the ``claims.base.Figure`` data as stored in
    claims.json): the entries with their ``figures`` (name, title, kind, caption, file) and
    ``figure_errors`` filled in, and the PNG bytes by file name.  Used by a build and by a
    re-render from claims.json alike, so both draw the same pictures."""
    from reports.render import as_figure, figure_png

    out, pngs, taken = [], {}, set()
    for entry in entries:
        entry = dict(entry)
        entry.setdefault("headline", [])
        figures, errors = [], []
        for raw in entry.get("figure_data") or []:
            try:
                fig = as_figure(raw)
                data = figure_png(fig)
            except Exception as exc:
                name = getattr(raw, "name", None) or (raw.get("name") if isinstance(raw, dict) else None)
                errors.append(f"{name or '?'}: {type(exc).__name__}: {exc}")
                continue
            file = _figure_file(entry["id"], fig.name, taken)
            pngs[file] = data
            figures.append({"name": fig.name, "title": fig.title, "kind": fig.kind,
                            "caption": fig.caption, "file": file})
        entry.update(figures=figures, figure_errors=errors)
        out.append(entry)
    return out, pngs


def write_report(out: Path, report: dict, pngs: dict[str, bytes]) -> Path:
    """Write ``report`` into a temporary directory beside ``out``, check it, then swap it into
    ``out``.  On any exception (KeyboardInterrupt included) the temporary directory is
    removed and a previous report in ``out`` is left as it was."""
    from reports.render import render_html

    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
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
              "seconds": (int, float), "figures": list, "figure_errors": list, "figure_data": list,
              "headline": list}
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


def build(cfg: BuildConfig, command: Optional[list[str]] = None, stream: Optional[TextIO] = None) -> dict:
    """Validate, run the claims, write the report into ``cfg.out``; returns the claims.json
    document.  Raises :class:`BadArguments` before running anything if an argument is wrong
    (a per-configuration audit estimated over ``cfg.max_minutes`` included)."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    cfg = validate(cfg)
    cost = check_cost(cfg)
    recover_leftovers(Path(cfg.out), stream)
    sweep_skipped = unreadable_sweep_points(cfg.sweep) if cfg.sweep is not None else []
    for point in sweep_skipped:
        print(f"warning: --from-sweep: skipping {point['file']}: {point['reason']}; the claims "
              "reading this sweep will not see that point", file=stream, flush=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    n = len(cfg.only) if cfg.only is not None else len(claims.REGISTRY)
    print(f"audit report: profile {cfg.profile}, device {cfg.device}, seed {cfg.seed}, {n} claim(s) "
          f"-> {cfg.out}", file=stream, flush=True)
    if cfg.problem is not None:
        ran_at = claims_at_configuration(cfg)
        from reports.render import describe_problem

        print(f"configuration: {describe_problem(cfg.problem)}; estimated {cost.describe(cfg.problem)}",
              file=stream, flush=True)
        if ran_at["profile"]:
            print(f"note: {', '.join(ran_at['profile'])} cannot run at a given configuration yet and "
                  f"run at profile {cfg.profile}", file=stream, flush=True)
    t0 = time.perf_counter()
    cpu_seconds: dict[str, float] = {}
    results = run_all(cfg, stream, cpu_seconds)
    t_render = time.perf_counter()
    entries, pngs = render_results(results)
    now = time.perf_counter()
    report = {"claims": entries,
              "provenance": provenance(cfg, results, started, now - t0,
                                       command or ["python", "-m", "reports.build"],
                                       cpu_seconds, now - t_render, sweep_skipped, cost)}
    write_report(Path(cfg.out), report, pngs)
    return report


def load_report(path: str, flag: str) -> dict:
    """A claims.json document, checked enough to render or compare it; :class:`BadArguments`
    saying what is wrong otherwise."""
    file = Path(path)
    if file.is_dir() and (file / "claims.json").is_file():
        file = file / "claims.json"
    if not file.is_file():
        raise BadArguments(f"{flag} {path}: no such file; give the claims.json of a report "
                           "(or its directory)")
    try:
        report = json.loads(file.read_text(encoding="utf-8"), parse_constant=_strict_constant)
    except (OSError, UnicodeDecodeError) as exc:
        raise BadArguments(f"{flag} {path}: cannot be read ({exc})") from None
    except ValueError as exc:
        raise BadArguments(f"{flag} {path}: not a claims.json of a report (not strict JSON: {exc})") from None
    if not (isinstance(report, dict) and isinstance(report.get("claims"), list)
            and isinstance(report.get("provenance"), dict)
            and all(isinstance(c, dict) and isinstance(c.get("id"), str) and c.get("verdict") in VERDICTS
                    for c in report["claims"])):
        raise BadArguments(f"{flag} {path}: not a claims.json of a report (it needs 'claims', a list of "
                           "objects with an id and a verdict, and 'provenance')")
    return report


def rerender(source: str, out: str, stream: Optional[TextIO] = None) -> dict:
    """Write a report into ``out`` from an existing claims.json without running any claim:
    the figures are redrawn from each entry's ``figure_data`` with this version of
    ``reports.render`` (after a template fix, or on another machine).  The provenance is the
    original run's, with ``rerendered`` saying from where and when."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    report = load_report(source, "--from-json")
    check_output_dir(out, "--out")
    source_dir = Path(source).absolute() if Path(source).is_dir() else Path(source).absolute().parent
    if Path(out).absolute() == source_dir:
        raise BadArguments(f"--out {out} is the directory of --from-json; choose another directory")
    recover_leftovers(Path(out), stream)
    missing = [CLAIM_KEYS_NEEDED_TO_RENDER - set(c) for c in report["claims"]]
    if any(missing):
        raise BadArguments(f"--from-json {source}: claim entries lack {sorted(set().union(*missing))}; "
                           "it was not written by reports.build")
    t0 = time.perf_counter()
    entries, pngs = draw_figures([{k: v for k, v in c.items() if k not in ("figures", "figure_errors")}
                                  for c in report["claims"]])
    prov = dict(report["provenance"])
    prov["rerendered"] = {"from": str(Path(source).absolute()), "git": git_state(),
                          "at_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                          "seconds": time.perf_counter() - t0}
    new = {"claims": entries, "provenance": prov}
    print(f"re-rendering {len(entries)} claim(s) from {source} -> {out} (no claim is run)",
          file=stream, flush=True)
    write_report(Path(out), new, pngs)
    return new


CLAIM_KEYS_NEEDED_TO_RENDER = {"id", "title", "statement", "verdict", "theory", "numerics", "tolerance",
                               "details", "perturbations", "seconds", "figure_data"}


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

    def refuse(exc: Exception) -> int:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS

    if args.from_json is not None:
        clash = [f"--{name.replace('_', '-')}" for name in COMPUTE_OPTIONS if getattr(args, name) is not None]
        if clash:
            return refuse(BadArguments(f"--from-json re-renders a finished report and runs nothing; "
                                       f"{', '.join(clash)} cannot go with it (only --out)"))
        try:
            report = rerender(args.from_json, args.out)
        except BadArguments as exc:
            return refuse(exc)
        print(summary_table(report))
        print(f"report: {Path(args.out) / 'index.html'}")
        return exit_status(report)
    try:
        cfg = validate(config_from_args(args))
        check_cost(cfg)
    except BadArguments as exc:
        return refuse(exc)
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
