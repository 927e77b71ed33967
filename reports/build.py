"""Build the audit report: run every claim check, then write claims.json, index.html and PNGs.

    python -m reports.build [--profile tiny|quick|paper] [--out DIR] [--device cpu|cuda]
                            [--seed N] [--only ID[,ID]] [--from-sweep DIR]
                            [--tasks R,R,.. --heads H --L L [--sigma S] [--param P] [--init S0]
                             [--logit-scale s] [--basis B] [--dtype D] | --config FILE.toml]
                            [--max-minutes M]
    python -m reports.build --from-json OLD/claims.json --out NEW     (re-render, no compute)

The report computes nothing of its own: each claim id of ``claims.REGISTRY`` names a
``claims.core.ClaimSpec``, a plan and a comparison; the union of the selected plans is run
by one engine and each comparison makes a ``claims.core.ClaimResult`` (verdict, findings,
headline rows, figure data).  This module checks the arguments, runs the claims (the union of
their plans executed once by one engine, ``numerics.engine``, ``--jobs`` worker processes for the
needs; each result checked against the claims.json schema as soon as it is made), records
provenance, renders (``reports.render``) and writes the output directory.  What the claims own, it asks them: the configuration is parsed by
``claims.core.check_problem``, which claims cannot build their experiment at it by
``claims.cannot_run``, which read a sweep by ``claims.reads_sweep``, and the cost by the
engine's cost model over their plans.  Everything is checked before any claim
runs, the output directory included (:func:`check_out_dir`).

The schema of claims.json is derived from the dataclasses of ``claims.core``
(``reports.render``); the findings of every claim are gathered into its top-level
``findings`` list, which the page shows first.

Exit status: 0 when no claim fails or errors and no boundary is contradicted or errors
(``claims.core.FAILING``; an ``undecided`` claim or boundary does not fail) and every figure
rendered; 1 otherwise; 2 on bad arguments; 75 (``numerics.io.EXIT_DISK_FULL``) when the disk
is full ("disk full: N bytes needed at PATH"; the previous report is intact); 130 when interrupted.

The output directory, where a report goes: ``--out DIR`` checked before any claim runs, then written whole or not at all.

The policy (the project's one output-path policy, ``numerics.io.check_output_dir``, plus
what replacing a *directory* needs): DIR may be new, an empty directory, or a previous report
of this command (it carries :data:`REPORT_MARKER` and nothing but what a report holds).  A
symlinked DIR is followed; a symlink loop or a dangling symlink is refused.  A directory that
holds anything else (a sweep's ``points/``, a thesis) or an input of the command is refused,
never deleted.  Whether DIR can be written at all (an immutable or read-only directory, an
unwritable parent) is probed by creating and removing a file, before any compute.

Writing: the report is written into a temporary directory beside DIR (same filesystem), checked,
then swapped in: a previous report is renamed away, the new one renamed to DIR, the old one
deleted; an empty directory the user made is filled in place (it is never deleted).  The new
directory gets the permissions the umask gives (``mkdtemp`` makes 0700).  Every file inside the
temporary is written without following a link (``numerics.io.write_inside``).  A build
killed between the two renames leaves ``.DIR.old-<token>``; a killed write leaves
``.DIR.tmp-<pid>-<token>``: the next build repairs both (:func:`recover_leftovers`) and says
what it did only when it did it -- and only to directories whose marker, written by the build,
holds the token of their name (:data:`REPORT_MARKER`): a directory that merely looks like a
leftover, with a user's files in it, is never deleted.

What a report may hold is what its marker lists: the build writes, after the report's files, each
file's name and size into the marker (:func:`marker_files`); a previous report is replaced only if
it holds exactly those files, as regular files, and every one of them and its folders can be
written (read-only ones stay, so the replaced report could not be deleted whole).  A user's
folder or file under a report's name (``claims.json/``, ``figures/mine.png``) is refused, never
deleted.  Commands writing the same DIR take turns (``numerics.io.folder_lock`` on the folder
that holds it, for each check, repair and swap): the last to finish leaves its report, whole, and
none writes beside DIR; should DIR hold something foreign by the time a report is ready, the
report is not written (one line, exit 2) and nothing is deleted.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path
from typing import Callable, Iterable, Optional, TextIO

import claims
from claims.core import FAILING, PROFILES, ClaimResult, kind_from_id, no_progress, run_claim
from numerics.io import (SEED_MAX, FolderBusy, TOMLDecodeError, check_device_option, check_inside, command_line,
                         create_inside, float_option, folder_lock, int_option, keep_freed_memory, make_directories,
                         one_blas_thread, parse_tasks as strict_tasks, read_input_bytes, read_inside, seed_option,
                         toml_loads, write_inside)
from reports.render import (VERSIONED_PACKAGES, BadArguments, check_report, entry_problems, load_report,
                            provenance_problems, with_defaults)

DEFAULT_OUT = "reports/out"
EXIT_OK, EXIT_CLAIMS_FAILED, EXIT_BAD_ARGUMENTS, EXIT_INTERRUPTED = 0, 1, 2, 130   # and EXIT_DISK_FULL (75)

REPRODUCIBILITY_HELP = """\
reproducibility: on one machine the same seed gives the same claims.json to the last digit (the
  thread count, --jobs and the order of the claims change none). On another CPU the BLAS
  libraries (MKL in torch, OpenBLAS in numpy/scipy) run kernels that round differently, so
  digits at rounding level move: an exact check's residual (a rounding-level residual, 1e-16
  relative) and quantities an optimiser leaves in a flat valley (the best decomposable point's
  cancellation, at 1e-3 relative); trained numbers move at about 1e-13 relative. The scorecard
  (the page's first screen, README's block) prints no such digit: a measured number to the second
  digit of its standard error, one without a standard error to a tenth of its tolerance.
"""

PROFILE_HELP = """\
profiles (every claim runs at the chosen scale; see docs/report.md for what each claim does):
  tiny   seconds per claim (the whole report in well under a minute). For the report's own
         end-to-end test: it exercises the whole pipeline but its numbers are too small to be
         evidence.
  quick  the default: small configurations (a few heads and tasks, L up to a few hundred)
         and Monte-Carlo sizes whose errors the tolerances account for; a few minutes on 2
         CPU cores for the whole report.
  paper  the scale of the paper's own experiments (larger d, L, batches and training times);
         meant for a GPU (--device cuda), hours on a CPU.
"""


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
    problem: Optional[dict] = None           # ProblemConfig fields of a per-configuration audit
    max_minutes: Optional[float] = None      # refuse an audit estimated longer (None: 60 min at a
                                             # configuration, no limit at a profile)
    config_file: Optional[str] = None        # --config, an input the report must not replace
    jobs: int = 1                            # claims run side by side in this many processes (CPU)


REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- what the claims say before any runs


#: A per-configuration audit estimated longer than this is refused (--max-minutes raises it).
DEFAULT_MAX_MINUTES = 60.0

# The ProblemConfig fields a researcher may set, with their command-line flag (the TOML file
# of --config uses the field names).
PROBLEM_FLAGS = {"tasks": "--tasks", "heads": "--heads", "L": "--L", "sigma": "--sigma",
                 "param": "--param", "init_scale": "--init", "logit_scale": "--logit-scale",
                 "basis": "--basis", "dtype": "--dtype"}


def _ask(name: str, *args, default=None):
    """``claims.<name>(*args)``, or ``default`` where it cannot answer for this id (a claim that
    does not import shows up as an error when run)."""
    try:
        return getattr(claims, name)(*args)
    except Exception:
        return default


def check_problem(fields: dict, device: str = "cpu") -> dict:
    """The configuration, parsed and validated by ``claims.core.check_problem`` (the one parser:
    each field checked by ProblemConfig, unknown fields refused); its ValueError becomes
    :class:`BadArguments`.  Returns the normalised fields (tasks a list)."""
    try:
        problem = dict(claims.core.check_problem(dict(fields), device))
    except (ValueError, TypeError) as exc:
        raise BadArguments(str(exc)) from None
    if "tasks" in problem:
        problem["tasks"] = [int(r) for r in problem["tasks"]]
    return problem


def selected(cfg) -> list[str]:
    """``--only``'s ids, or every registered id except the opt-in ones (``claims.OPT_IN``: the
    atlas, which runs only when named and only from a sweep)."""
    if cfg.only is not None:
        return list(cfg.only)
    opt_in = set(getattr(claims, "OPT_IN", ()))
    if cfg.profile not in ("tiny", "quick", "paper"):
        # a profile only some specs have (``authors``: claims.authors_replica): the ids that have it,
        # opt-in or not (every other id would only error on the profile's name)
        return [cid for cid in claims.REGISTRY if cfg.profile in _profiles_of(cid)]
    return [cid for cid in claims.REGISTRY if cid not in opt_in]


def _profiles_of(claim_id: str) -> tuple:
    try:
        return tuple(claims.spec_of(claim_id).profiles)
    except Exception:  # a spec that cannot be imported shows up as an error when it is run
        return ()


def claims_at_configuration(cfg) -> dict:
    """``{"configuration": ids run at cfg.problem, "profile": ids run at their profile}``: every
    selected id at the configuration where one is given (``claims.cannot_run`` refuses those
    that cannot build their experiment there, before any run), else at its profile."""
    ids = selected(cfg)
    return {"configuration": ids, "profile": []} if cfg.problem is not None else {"configuration": [], "profile": ids}


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.3g} days"


def estimate(cfg) -> Optional[dict]:
    """The cost of the selected claims: the union of their plans priced once by the engine's cost
    model (:func:`planned_costs`), less what a sweep store holds.
    ``{"seconds", "per_claim": {id: seconds or None}, "unknown": [ids], "jobs",
    "wall_seconds"}``: a claim whose plan cannot be asked (it does not import) is unknown (None);
    the wall time is that of the needs on ``cfg.jobs`` processes, the costliest first
    (:func:`wall_seconds`)."""
    ids = selected(cfg)
    plans = [cid for cid in ids if _ask("plan_of", cid, cfg.profile, cfg.problem) is not None]
    per, need_seconds = planned_costs(cfg, plans) if plans else ({}, [])
    per = {cid: float(per[cid]) if cid in per and math.isfinite(per[cid]) else None for cid in ids}
    return {"seconds": sum(s for s in per.values() if s is not None), "per_claim": per,
            "unknown": [cid for cid, s in per.items() if s is None], "jobs": cfg.jobs,
            "wall_seconds": wall_seconds(need_seconds, cfg.jobs)}


def planned_costs(cfg, ids: list[str]) -> tuple[dict, list]:
    """({id: CPU seconds}, [seconds of each need]) of the claims that are a plan: the union of
    their plans priced once by the one cost model (a need k claims share counts 1/k to each),
    less what a sweep store holds."""
    from numerics.engine import Engine, cost_of
    from numerics.experiments import Store
    store = None
    if cfg.sweep is not None:
        try:
            store = Store(cfg.sweep)
        except (OSError, ValueError):
            pass
    engine = Engine(seed=cfg.seed, store=store)
    readers: dict = {}
    for cid in ids:
        for n in engine.price(claims.plan_of(cid, cfg.profile, cfg.problem, cfg.device, engine.seed)):
            readers.setdefault(n, []).append(cid)
    return {cid: 0.0 for cid in ids} | split_costs(readers, cost_of), [cost_of(n) for n in readers]


def split_costs(readers: dict, cost) -> dict:
    """Each claim's share of the needs it reads (``readers``: {need: [claim ids]}), ``cost(need)``
    each: a need read by k claims counts 1/k to each."""
    shares: dict = {}
    for n, cids in readers.items():
        for cid in cids:
            shares[cid] = shares.get(cid, 0.0) + cost(n) / len(cids)
    return shares


def wall_seconds(need_seconds: list, jobs: int) -> float:
    """The wall time of needs costing ``need_seconds`` CPU seconds on ``jobs`` processes as the
    engine runs them: the costliest first, each to the process that frees up first; the
    largest process sum (one process: the sum)."""
    if jobs <= 1 or len(need_seconds) <= 1:
        return float(sum(need_seconds))
    loads = [0.0] * jobs
    for s in sorted(need_seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def describe_estimate(cost: dict) -> str:
    worst = sorted(((s, cid) for cid, s in cost["per_claim"].items() if s), reverse=True)[:3]
    text = f"about {_duration(cost['seconds'])}" + (
        " (" + ", ".join(f"{cid} {_duration(s)}" for s, cid in worst) + ")" if worst else "")
    if cost.get("jobs", 1) > 1 and cost.get("wall_seconds", cost["seconds"]) < cost["seconds"]:
        text += f"; about {_duration(cost['wall_seconds'])} on {cost['jobs']} processes"
    return text + (f"; no estimate for {', '.join(cost['unknown'])}" if cost["unknown"] else "")


def check_claims(cfg) -> Optional[dict]:
    """What the selected claims say about this build, before any of them runs: the configuration
    is one they can take and build their experiment at, the sweep is read by one of them, the
    cost is within --max-minutes.  Returns the cost estimate; :class:`BadArguments` otherwise."""
    ids = selected(cfg)
    if cfg.sweep is not None:
        readers = [cid for cid in ids if _ask("reads_sweep", cid, default=True)]
        if not readers:
            everyone = [cid for cid in claims.REGISTRY if _ask("reads_sweep", cid, default=False)]
            raise BadArguments(f"--from-sweep {cfg.sweep}: none of the selected claims ({', '.join(ids)}) reads "
                               f"a sweep; the claims that do: {', '.join(everyone) or 'none'}")
    if cfg.problem is not None:
        cannot = {cid: why for cid in ids if (why := _ask("cannot_run", cid, cfg.problem))}
        if cannot:
            can = [cid for cid in ids if cid not in cannot]
            raise BadArguments("at this configuration " + "; ".join(f"{cid} cannot run: {why}" for cid, why
                                                                      in cannot.items())
                               + (f". These can: --only {','.join(can)}" if can else ". No selected claim can"))
    cost = estimate(cfg)
    limit = cfg.max_minutes if cfg.max_minutes is not None else (
        DEFAULT_MAX_MINUTES if cfg.problem is not None else None)
    # the limit is of the audit's duration: the wall time of its processes (CPU seconds of an idle machine)
    if cost is not None and limit is not None and cost["wall_seconds"] > 60 * limit:
        raise BadArguments(f"estimated cost: {describe_estimate(cost)}, over --max-minutes {limit:g}. Raise the "
                           f"limit (--max-minutes {math.ceil(cost['wall_seconds'] / 60)}), choose smaller sizes, or "
                           "run fewer claims (--only)")
    return cost

# --------------------------------------------------------------------------- running the claims


def checked(claim_id: str, result) -> ClaimResult:
    """``result`` if it keeps the contract of a claim's result (its id the registry's, the
    claims.json schema), checked as soon as it is made; ValueError else."""
    if result.id != claim_id:
        raise ValueError(f"{claims.REGISTRY[claim_id]} returned id {result.id!r} for registry id "
                         f"{claim_id!r}; the ids of claims.json are the registry's")
    entry = result.to_dict()  # the schema's checks now, not after every claim has run
    entry.update(figure_data=entry.pop("figures"), figures=[], figure_errors=[])
    problems = entry_problems(with_defaults({"claims": [entry]})["claims"][0], 0)
    if problems:
        raise ValueError(f"{claims.REGISTRY[claim_id]} returned a result that breaks the schema of "
                         f"claims.json: {'; '.join(problems[:5])}")
    return result


def run_all(cfg, stream: TextIO, cpu_seconds: dict) -> list[ClaimResult]:
    """Every selected claim (each a plan and a comparison), in registry order, as one build: the union of their plans
    executed once by one engine (a need two claims share is computed once; with ``cfg.jobs`` > 1
    the needs run in worker processes, the costliest first), then each claim's comparison.  A
    claim that does not import, or whose plan or comparison raises, or reads a need that failed,
    reads ``error`` with the reason.  Progress goes to ``stream``; ``cpu_seconds`` receives each
    claim's CPU time."""
    from claims.core import context, finished
    from numerics import experiments
    from numerics.engine import Engine, Results, closure

    one_blas_thread()      # the needs this process computes itself (the workers start with one)
    keep_freed_memory()
    ids, specs, ctxs, errors = selected(cfg), {}, {}, {}
    for cid in ids:
        try:
            specs[cid] = claims.spec_of(cid)
            ctxs[cid] = context(specs[cid], cfg.profile, cfg.device, cfg.seed, no_progress,
                                dict(cfg.problem) if cfg.problem is not None else None)
        except Exception as exc:  # noqa: BLE001
            errors[cid] = exc
    bar = ClaimProgress(f"{len(ctxs)} claims' needs", stream, cfg.progress)
    results = {cid: Results() for cid in ctxs}
    jobs = max(1, cfg.jobs if not str(cfg.device).startswith("cuda") else 1)
    with experiments.store(cfg.sweep) as store, contextlib.closing(Engine(seed=cfg.seed, store=store, jobs=jobs,
                                                                          progress=bar)) as engine:
        while True:
            wanted = {}
            for cid in list(ctxs):
                try:
                    wanted[cid] = [n for n in specs[cid].plan(ctxs[cid], results[cid]) if n not in results[cid]]
                except Exception as exc:  # noqa: BLE001
                    errors[cid] = exc
                    del ctxs[cid]
            if not any(wanted.values()):
                break
            computed = engine.run([n for ns in wanted.values() for n in ns])
            for cid, ns in wanted.items():
                results[cid].update({n: dict.__getitem__(computed, n) for n in closure(ns)})
    bar.close()
    shares = need_shares(results, engine)
    out = []
    for cid in ids:
        def body(cid=cid):
            if cid in errors:
                raise errors[cid]
            reads = store is not None and _ask("reads_sweep", cid, default=True)   # else: as without --from-sweep
            used = sum(engine.key(n) in engine.stored_ids for n in results[cid]) if reads else None
            return checked(cid, finished(specs[cid], ctxs[cid], specs[cid].compare(ctxs[cid], results[cid]), used))
        out.append(_judged(cid, specs.get(cid), body, shares.get(cid, 0.0), stream, cpu_seconds))
    return out


def _judged(cid: str, spec, body, share: float, stream: TextIO, cpu_seconds: dict) -> ClaimResult:
    """``body()`` run as claim ``cid`` (any exception its ``error``, with the reason), its share of
    the needs' CPU seconds added, its verdict said on ``stream``."""
    t0 = time.process_time()
    if spec is None:      # the claim does not import: the same failure shows as its error
        result = run_claim(cid, cid, "(not available: the claim check raised before returning its result; "
                           "see the error below)", body, kind=kind_from_id(cid))
    else:
        result = run_claim(cid, spec.title, spec.statement, body, kind=spec.kind)
        result.paper = spec.paper
    result.seconds += share
    cpu_seconds[cid] = time.process_time() - t0 + share
    print(f"{cid}: {result.verdict}", file=stream, flush=True)
    if result.verdict == "error" and "error" in result.details:
        print(f"    {cid}: {result.details['error']}", file=stream, flush=True)
    return result


def need_shares(results: dict, engine) -> dict:
    """Each claim's share of the CPU seconds of the needs it read (a need read by k claims counts
    1/k to each)."""
    readers: dict = {}
    for cid, res in results.items():
        for n in res:
            readers.setdefault(engine.key(n), []).append(cid)
    return split_costs(readers, lambda ident: engine.cpu_seconds.get(ident, 0.0))


# --------------------------------------------------------------------------- progress


class ClaimProgress:
    """The progress callback of one claim (or of an audit): a tqdm bar on ``stream`` with the
    caller's own message; throttled, and never allowed to raise into the caller.  Without a bar
    the start is announced as ``label ...`` (unless ``announce`` is false)."""

    def __init__(self, label: str, stream: TextIO, enabled: bool, announce: bool = True):
        self.stream, self.last, self.bar = stream, 0.0, None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=100, desc=label, file=stream, leave=True, dynamic_ncols=True,
                            bar_format="{desc} {percentage:3.0f}%|{bar:20}| {elapsed}{postfix}")
        elif announce:
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

    def close(self) -> None:
        """The bar at 100 % and closed."""
        if self.bar is not None:
            self.bar.n = 100.0
            self.bar.close()


# --------------------------------------------------------------------------- provenance


def _version(package: str) -> str:
    try:
        return str(getattr(__import__(package), "__version__", "unknown"))
    except Exception:
        return "not installed"


def git_state() -> dict:
    """``{"commit": sha or "unknown", "dirty": bool or "unknown"}`` of the source tree."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return {"commit": "unknown", "dirty": "unknown"}
        status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else "unknown"
        return {"commit": sha.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": "unknown"}


def unreadable_sweep_points(sweep: str) -> list[dict]:
    """The files of ``sweep/points/`` that the claims will not use, with why: ``[{"file",
    "reason"}]`` -- the one reader's verdict (:func:`numerics.stored.read_point` against this
    training code: a link, a file too large, not JSON, an id that is not its file name or not
    its own hash, another code version).  The build prints each as a warning and the report
    records them; the claims train those runs themselves."""
    from numerics.stored import code_version, read_point   # the store's own reading rule, not a copy

    points = Path(sweep) / "points"
    if not points.is_dir():
        return []
    code = code_version()
    skipped = []
    for name in sorted(n for n in os.listdir(points) if n.endswith(".json") and not n.startswith(".")):
        record, reason = read_point(sweep, name, code=code)
        if record is None:
            skipped.append({"file": str(points / name), "reason": reason})
    return skipped


def provenance(cfg, results: list[ClaimResult], started_utc: str, total_seconds: float,
               command: list[str], cpu_seconds: Optional[dict] = None,
               render_seconds: Optional[float] = None, sweep_skipped: Optional[list] = None,
               cost: Optional[dict] = None) -> dict:
    device = {"name": cfg.device}
    if cfg.device.startswith("cuda"):
        import torch

        device["gpu"] = torch.cuda.get_device_name(torch.device(cfg.device))
    return {
        "versions": {"python": platform.python_version(), **{p: _version(p) for p in VERSIONED_PACKAGES}},
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
        "cost_estimate": cost,
        "wall_seconds": {"per_claim": {r.id: r.seconds for r in results}, "total": total_seconds,
                         "rendering": render_seconds},
        "cpu_seconds": {"per_claim": dict(cpu_seconds or {}), "total": sum((cpu_seconds or {}).values())},
        "git": git_state(),
        "command": command,
        "started_utc": started_utc,
    }



# --------------------------------------------------------------------------- arguments


def read_config_file(path: str) -> dict:
    """The fields of a TOML file (top level, or a ``[problem]`` table), read by the project's input
    policy (a regular file of bounded size; a FIFO is refused unopened); claims.core.check_problem
    judges the fields."""
    try:
        raw = read_input_bytes(path, "--config", max_bytes=2**20)
        data = toml_loads(raw.decode("utf-8"))
    except TOMLDecodeError as exc:
        raise BadArguments(f"--config {path}: not valid TOML ({exc})") from None
    except (UnicodeDecodeError, RecursionError) as exc:
        raise BadArguments(f"--config {path}: cannot be read as a TOML text file ({exc})") from None
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    if set(data) == {"problem"} and isinstance(data["problem"], dict):
        data = data["problem"]
    return dict(data)


def parse_only(text: str) -> tuple[str, ...]:
    """``"a,b"`` -> the known ids among them, in registry order; unknown ids are an error."""
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if not wanted:
        raise BadArguments("--only needs at least one claim id, e.g. --only three-phases,optimality; "
                           f"known ids: {', '.join(claims.REGISTRY)}")
    unknown = [cid for cid in wanted if cid not in claims.REGISTRY]
    if unknown:
        raise BadArguments(f"--only: unknown claim id(s) {', '.join(u[:80] for u in unknown[:5])}; "
                           f"known ids: {', '.join(claims.REGISTRY)}")
    return tuple(cid for cid in claims.REGISTRY if cid in wanted)


def validate(cfg: BuildConfig) -> BuildConfig:
    """Check every argument before any claim runs; raise :class:`BadArguments` saying what is
    wrong and how to fix it.  Returns the config with the paths made absolute."""
    if cfg.profile not in PROFILES:
        raise BadArguments(f"--profile must be one of {', '.join(PROFILES)}, got {cfg.profile!r}")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed <= SEED_MAX:
        raise BadArguments(f"--seed must be an integer in 0 .. 2^64 - 1, got {cfg.seed!r}")
    try:
        check_device_option(cfg.device)   # torch imported only for a CUDA name: --help stays fast
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    if cfg.only is not None:
        parse_only(",".join(cfg.only))
        lacking = [cid for cid in cfg.only if _profiles_of(cid) and cfg.profile not in _profiles_of(cid)]
        if lacking:
            raise BadArguments(f"--profile {cfg.profile}: {', '.join(lacking[:5])} has no such profile (its profiles: "
                               f"{', '.join(_profiles_of(lacking[0]))}); choose one of them, or --only ids with it")
    if cfg.sweep is not None:
        sweep = Path(cfg.sweep)
        if not sweep.is_dir():
            raise BadArguments(f"--from-sweep {cfg.sweep}: no such directory; give the output "
                               "directory of a numerics.sweep run")
        if not (sweep / "points").is_dir() and not (sweep / "summary.json").is_file():
            raise BadArguments(f"--from-sweep {cfg.sweep}: not a numerics.sweep output directory "
                               "(it has neither points/ nor summary.json); give the DIR of "
                               "'python -m numerics.sweep ... --out DIR'")
        try:   # its points/ is read without following a link (a link there points anywhere)
            check_inside(sweep, (), "--from-sweep", directories=("points",) if (sweep / "points").exists()
                         or (sweep / "points").is_symlink() else ())
        except ValueError as exc:
            raise BadArguments(str(exc)) from None
        cfg = dataclasses.replace(cfg, sweep=str(sweep.resolve()))
    if cfg.max_minutes is not None and (isinstance(cfg.max_minutes, bool) or not isinstance(cfg.max_minutes, (int, float))
                                        or not math.isfinite(cfg.max_minutes) or cfg.max_minutes <= 0):
        raise BadArguments(f"--max-minutes must be a number > 0, got {cfg.max_minutes!r}")
    if cfg.problem is not None:
        cfg = dataclasses.replace(cfg, problem=check_problem(dict(cfg.problem), cfg.device))
        check_size(cfg.problem, cfg.device)
    inputs = [p for p in (cfg.sweep, cfg.config_file) if p is not None]
    out = check_out_dir(cfg.out, "--out", inputs)
    return dataclasses.replace(cfg, out=str(out))


def check_size(problem: dict, device: str = "cpu") -> None:
    """Refuse, before any estimate or run, a configuration whose smallest training step (one
    prompt: ``numerics.train.step_memory_bytes`` at batch 1, the weights and their gradients
    alone for a large H or d) needs more memory than this machine has: ``heads = 2**63`` is a
    size error here, not an estimate of "about 1 s" and a crash in the first allocation."""

    from numerics.config import ProblemConfig
    from numerics.train import step_memory_bytes

    fields = {"tasks": [1], "heads": 1, "L": 2, **problem, "device": "cpu" if device == "cpu" else device}
    try:
        need = step_memory_bytes(ProblemConfig.from_dict(fields), 1)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadArguments(f"the configuration cannot be built: {exc}") from None
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if need > total:
        raise BadArguments(f"tasks {list(problem.get('tasks', []))[:8]}{'...' if len(problem.get('tasks', [])) > 8 else ''}"
                           f", heads {problem.get('heads')}, L {problem.get('L')}: one training step on a single "
                           f"prompt needs about {need / 2 ** 30:.3g} GiB (numerics.train.step_memory_bytes), more than "
                           f"this machine's {total / 2 ** 30:.3g} GiB of memory; choose smaller sizes")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reports.build",
        description=textwrap.fill("Run every claim check of the audit of 'Training Dynamics of Multi-Head Softmax "
                    "Attention for In-Context Learning' (Chen, Sheen, Wang, Yang; COLT 2024) and write "
                    "the report: DIR/claims.json (findings, verdicts, theory vs numerics, tolerances, "
                    "provenance), DIR/index.html (one self-contained page: a scorecard of every claim "
                    "and a forest plot of every comparison first, then the findings) and "
                    "DIR/figures/*.png (forest.png among them). Exit status: 0 no claim fails or errors and no boundary is "
                    "contradicted or errors (undecided does not fail), 1 otherwise, 2 bad arguments, 75 the disk is full "
                    "(the message says how many bytes were needed where), 130 interrupted (after a "
                    "full disk or an interruption the previous report is left intact).", width=92),
        epilog=PROFILE_HELP + "\n" + REPRODUCIBILITY_HELP + "\nclaim ids: " + ", ".join(claims.REGISTRY),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profile", choices=PROFILES, default=None,
                        help="scale of every claim's experiment: tiny (seconds, pipeline test), quick "
                             "(default, minutes on 2 CPU cores), paper (paper scale, for a GPU); "
                             "details below")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"report directory (default {DEFAULT_OUT}/, relative to the current "
                             "directory); replaced atomically, and only if it is new, empty or a previous "
                             "report holding nothing else")
    parser.add_argument("--device", default=None, metavar="cpu|cuda|cuda:N",
                        help="torch device the claims train on (default cpu); cuda needs a CUDA build "
                             "of torch and a visible GPU")
    parser.add_argument("--seed", type=seed_option("--seed"), default=None, metavar="N",
                        help="seed passed to every claim (data, init); the same seed, profile and "
                             "device reproduce the report's numbers exactly on the same machine and "
                             "library versions, whatever --jobs (default 0); on another CPU, digits "
                             "at rounding level differ (reproducibility, below)")
    parser.add_argument("--only", default=None, metavar="ID[,ID]",
                        help="run only these claim ids (comma-separated; see the list below); "
                             "default: all")
    parser.add_argument("--from-sweep", default=None, metavar="DIR", dest="sweep",
                        help="directory of numerics.sweep results: the claims that read a sweep "
                             "(limiting-error, multi-head-gain) take their trained runs from it "
                             "instead of training them (refused when no selected claim reads one)")
    parser.add_argument("--jobs", type=int_option("--jobs", low=1, high=64, why_high="more processes than claims gain nothing"), default=None, metavar="N",
                        help="run the claims side by side in N worker processes, one torch thread each (default: "
                             "the number of CPU cores, at most 4; 1 runs them one after another; CUDA runs use 1). "
                             "Claims that share trained runs stay in one process, so each run is trained once")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (the start and end of each claim is still "
                             "printed)")
    audit = parser.add_argument_group("per-configuration audit", textwrap.fill(
        "run every claim that can at this configuration (parsed by claims.core.check_problem, the one "
        "parser of a configuration); the report says which ran where. The flags override the "
        "fields of --config", width=88))
    audit.add_argument("--tasks", default=None, metavar="R,R,..",
                       help="block sizes r_i of the m tasks, e.g. 3,3,3 (d = sum r_i)")
    audit.add_argument("--heads", type=int_option("--heads"), default=None, metavar="H", help="number of heads H")
    audit.add_argument("--L", type=int_option("--L"), default=None, metavar="L", help="context length L")
    audit.add_argument("--sigma", type=float_option("--sigma", finite=False), default=None, metavar="S", help="label noise std (default 0)")
    audit.add_argument("--param", default=None, choices=("factored", "merged"),
                       help="parametrisation (default factored)")
    audit.add_argument("--init", type=float_option("--init", finite=False), default=None, metavar="S0", dest="init_scale",
                       help="scale s0 of the decomposable initialisation (default 0.15)")
    audit.add_argument("--logit-scale", type=float_option("--logit-scale", finite=False), default=None, metavar="s", dest="logit_scale",
                       help="s in W_h = K_h^T Q_h / s (factored only; default 1)")
    audit.add_argument("--basis", default=None, choices=("identity", "random"),
                       help="task basis Phi (default identity)")
    audit.add_argument("--dtype", default=None, choices=("float64", "float32"), help="default float64")
    audit.add_argument("--config", default=None, metavar="FILE.toml",
                       help="a TOML file of these fields by their ProblemConfig names (tasks = [3, 3, 3], "
                            "heads = 3, L = 256, sigma, param, init_scale, logit_scale, basis, dtype), "
                            "at the top level or in a [problem] table")
    audit.add_argument("--max-minutes", type=float_option("--max-minutes", finite=False), default=None, metavar="M", dest="max_minutes",
                       help="refuse an audit whose estimated cost (each claim's own estimate, printed "
                            "before it starts) exceeds M minutes (default 60 at a configuration)")
    parser.add_argument("--plan", action="store_true",
                        help="print what the selected claims need (every trained run, flow, Monte-Carlo "
                             "minimum and theory value, each once, with its cost in CPU seconds and the claims "
                             "that read it) and exit without computing any of it")
    parser.add_argument("--from-json", default=None, metavar="FILE", dest="from_json",
                        help="re-render the report of this claims.json into --out without running any "
                             "claim (figures redrawn from their stored data); only --out goes with it")
    return parser


COMPUTE_OPTIONS = ("profile", "device", "seed", "only", "sweep", "config", "max_minutes", "jobs", *PROBLEM_FLAGS)


def config_from_args(args: argparse.Namespace) -> BuildConfig:
    """The BuildConfig of parsed arguments: the problem fields of --config, overridden by the
    flags given, validated with the rest in :func:`validate`."""
    problem: Optional[dict] = read_config_file(args.config) if args.config is not None else None
    given = {name: getattr(args, name) for name in PROBLEM_FLAGS if getattr(args, name) is not None}
    if "tasks" in given:    # the one strict parser of every command: digits only, no empty entries, signs or spaces
        try:
            given["tasks"] = strict_tasks(given["tasks"])
        except ValueError as exc:
            raise BadArguments(str(exc)) from None
    if given:
        problem = {**(problem or {}), **given}
    return BuildConfig(profile=args.profile or "quick", out=args.out, device=args.device or "cpu",
                       seed=0 if args.seed is None else args.seed,
                       only=parse_only(args.only) if args.only is not None else None,
                       sweep=args.sweep, progress=not args.no_progress, problem=problem,
                       max_minutes=args.max_minutes, config_file=args.config,
                       jobs=default_jobs() if args.jobs is None else args.jobs)


def default_jobs() -> int:
    """The number of CPU cores this process may use, at most 4 (claims beyond the longest group
    gain nothing from more)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(4, n))


# --------------------------------------------------------------------------- the output directory


#: The file that makes a directory this command's report.  It is written first, into the build's temporary,
#: and holds the build's pid and a random token that is also in the temporary's name
#: (``.DIR.tmp-<pid>-<token>``) and, once the report is replaced, in the name it is moved to
#: (``.DIR.old-<token>``): only a directory whose marker holds the token of its own name is ever deleted or
#: restored by :func:`recover_leftovers` -- a user's directory that merely has such a name, or a copy of a
#: report under another name, is left alone.
REPORT_MARKER = ".icl-audit-report"
MARKER_TEXT = "written by python -m reports.build\n"
FIGURE_DIR = "figures"


@contextlib.contextmanager
def _locked(folder: Path, shown, stream: Optional[TextIO] = None, flag: str = "--out"):
    """``numerics.io.folder_lock`` of the folder that holds a report; waiting too long is
    :class:`BadArguments` (one line, exit 2)."""
    try:
        with folder_lock(folder, flag, shown, stream):
            yield
    except FolderBusy as exc:
        raise BadArguments(str(exc)) from None


def _report_files(out: Path) -> tuple[list, list]:
    """(files, others) of a report folder, by ``lstat`` (no link followed): each regular file as
    (relative name, size), from its top level and its ``figures/`` folder; every other entry (a
    link, a folder, a device; ``figures`` itself when it is not a real folder) by name."""
    files, others = [], []
    for name in sorted(os.listdir(out)):
        st = os.lstat(out / name)
        if name == FIGURE_DIR and stat.S_ISDIR(st.st_mode):
            for inner in sorted(os.listdir(out / name)):
                ist = os.lstat(out / name / inner)
                (files.append((f"{name}/{inner}", ist.st_size)) if stat.S_ISREG(ist.st_mode)
                 else others.append(f"{name}/{inner}"))
        elif stat.S_ISREG(st.st_mode):
            files.append((name, st.st_size))
        else:
            others.append(name)
    return files, others


def foreign_entries(out: Path) -> list[str]:
    """What in a previous report folder this command did not write (empty: safe to replace):
    every entry but the regular files its marker lists with their sizes (:func:`marker_files`;
    a report whose marker lists none: ``claims.json``, ``index.html`` and ``figures/*.png``) and
    the marker itself -- a link, a folder or a file under a report's name included."""
    listed = marker_files(out)
    files, foreign = _report_files(out)
    for name, size in files:
        if name == REPORT_MARKER:
            continue
        ours = (listed.get(name) == size if listed is not None else
                name in ("claims.json", "index.html") or (name.startswith(FIGURE_DIR + "/") and name.endswith(".png")))
        if not ours:
            foreign.append(name if listed is None or name not in listed else f"{name} (changed since it was written)")
    return foreign


def read_only_entries(out: Path) -> list[str]:
    """What in a previous report folder cannot be written (a read-only or immutable file or
    folder): replacing the report would leave it behind, so it is refused instead."""
    files, _ = _report_files(out)
    folders = [FIGURE_DIR] if (out / FIGURE_DIR).is_dir() and not (out / FIGURE_DIR).is_symlink() else []
    return [name for name in folders + [f for f, _ in files] if not os.access(out / name, os.W_OK)]


def _replace_problem(out: Path, flag: str, shown) -> Optional[str]:
    """Why the previous report ``out`` cannot be replaced (None: it can)."""
    try:
        foreign = foreign_entries(out)
    except OSError as exc:
        return (f"{flag} {shown}: a previous report whose folders cannot be listed ({exc.strerror or exc}); "
                f"choose another {flag}")
    if foreign:
        return (f"{flag} {shown} is a previous report that also holds {foreign[:5]}, which this command did not "
                f"write; replacing it would delete them. Move them or choose another {flag}")
    locked = read_only_entries(out)
    if locked:
        return (f"{flag} {shown} is a previous report whose {locked[:5]} cannot be written (read-only); replacing it "
                f"would leave them behind. Make it writable (chmod -R u+w) or choose another {flag}")
    return None


def check_out_dir(path: str, flag: str = "--out", inputs: Iterable[str] = ()) -> Path:
    """The absolute report directory of ``path`` (a symlink followed), or :class:`BadArguments`
    saying why it cannot be written or replaced: the project's policy
    (``numerics.io.check_output_dir``: a file, a link loop or dangling link, an unwritable
    place, a non-empty directory without the marker, an input) and what replacing a report
    directory adds: a previous report that also holds files this command did not write (a sweep
    stored in it) and a directory that holds an input are refused, never deleted."""
    from numerics.io import check_output_dir

    inputs = [Path(p).resolve() for p in inputs]
    try:
        parent = Path(os.path.realpath(os.fspath(path))).parent
    except (TypeError, ValueError):             # not a path, or a NUL in it: check_output_dir says so
        parent = None
    try:
        with _locked(parent, path, flag=flag):   # another command's probe or swap is never seen half-done
            out = Path(check_output_dir(path, flag, marker=REPORT_MARKER, inputs=tuple(inputs),
                                        replaced=True)).absolute()
            problem = _replace_problem(out, flag, path) if out.is_dir() and os.listdir(out) else None
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    for source in inputs:
        if out in source.parents:
            raise BadArguments(f"{flag} {path} holds {source}, an input of this command; replacing it would "
                               f"delete that input. Choose another {flag}")
    if problem:
        raise BadArguments(problem)
    return out


def write_tree(out: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` ({relative path: bytes}) into the temporary directory ``out`` (its marker is
    already there, :func:`new_temporary`), each a new file through the project's link policy
    (``numerics.io.create_inside``: nothing below ``out`` reached through a link, nothing
    existing replaced; a full disk is ``DiskFull``); the caller checks the tree, then puts it in
    place with :func:`replace_with` (the rename of the whole directory is what makes it atomic)."""
    for name, data in files.items():
        create_inside(out, name, data, "--out")
    write_inside(out, REPORT_MARKER, marker_text(marker_token(out), files={n: len(d) for n, d in files.items()}),
                 "--out")


def marker_text(token: str, pid: Optional[int] = None, files: Optional[dict] = None) -> str:
    """The content of a report's marker: who wrote it, the build's pid, the report's token and,
    once written, its files (``file SIZE NAME``, one a line)."""
    listed = "".join(f"file {size} {name}\n" for name, size in sorted((files or {}).items()))
    return f"{MARKER_TEXT}pid {os.getpid() if pid is None else pid}\ntoken {token}\n{listed}"


def _marker_lines(directory: Path) -> Optional[list]:
    try:
        text = read_inside(directory, REPORT_MARKER, "--out", max_bytes=1 << 20).decode("utf-8")
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return text.splitlines() if text.startswith(MARKER_TEXT) else None


def marker_files(directory: Path) -> Optional[dict]:
    """{relative name: size} of the files the marker of ``directory`` lists (None: no marker, or
    one that lists none -- a report written before markers listed their files)."""
    lines = _marker_lines(directory) or []
    listed = {}
    for line in lines:
        parts = line.split(" ", 2)
        if parts[0] == "file" and len(parts) == 3 and parts[1].isdigit():
            listed[parts[2]] = int(parts[1])
    return listed or None


def marker_token(directory: Path) -> Optional[str]:
    """The token in the marker of ``directory`` (None: no marker, a link, not this command's, or an
    older report's marker without one); read without following a link, at most 1 MiB."""
    tokens = [line[len("token "):] for line in _marker_lines(directory) or () if line.startswith("token ")]
    return tokens[0] if len(tokens) == 1 and re.fullmatch(r"[A-Za-z0-9_]{6,64}", tokens[0]) else None


def new_temporary(out: Path) -> Path:
    """A new temporary directory beside ``out``, ``.OUT.tmp-<pid>-<token>``, with the report's
    marker (holding the same pid and token) written into it first."""
    make_directories(out.parent)
    prefix = f".{out.name}.tmp-{os.getpid()}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp's 0700 would become the report's permissions
        write_inside(tmp, REPORT_MARKER, marker_text(tmp.name[len(prefix):]), "--out")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def replace_with(tmp: Path, out: Path, stream: Optional[TextIO] = None) -> Path:
    """Put the finished report ``tmp`` at ``out``; returns ``out``.  ``out`` absent: renamed there;
    an empty directory: filled in place (marker first); a previous report: swapped (the old one
    deleted after).  Done holding the lock of the folder that holds ``out``
    (``numerics.io.folder_lock``): another command writing ``out`` waits.  Should ``out`` hold
    something this command did not write, or cannot write, by now (it changed while the claims
    ran), nothing is deleted and nothing written beside it: :class:`BadArguments`, one line (the
    caller removes ``tmp``)."""
    stream = sys.stderr if stream is None else stream
    with _locked(out.parent, out, stream):
        if not out.exists():
            os.rename(tmp, out)
            return out
        names = os.listdir(out)
        problem = (None if not names else _replace_problem(out, "--out", out) if REPORT_MARKER in names else
                   f"--out {out} now holds {sorted(names)[:5]}, which this command did not write")
        if problem:
            raise BadArguments(f"{problem} (it changed while the command ran); the report was not written")
        if not names:
            for name in [REPORT_MARKER] + sorted(set(os.listdir(tmp)) - {REPORT_MARKER}):
                os.rename(tmp / name, out / name)
            os.rmdir(tmp)
            return out
        # a fresh token in the previous report's marker, then the same token in the name it is moved to:
        # what recover_leftovers needs to know it for this command's own, should this command be killed
        token = uuid.uuid4().hex[:12]
        write_inside(out, REPORT_MARKER, marker_text(token, files=marker_files(out)), "--out")
        old = out.parent / f".{out.name}.old-{token}"
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)  # put the previous report back before reporting the failure
            raise
        _remove(old, "the replaced report", stream)
    return out


def _remove(path: Path, what: str, stream: TextIO) -> Optional[str]:
    """Delete ``path``: "cleaned: ..." once it is gone (removed by another command meanwhile
    included); where it stays, a warning on ``stream`` and None."""
    try:
        shutil.rmtree(path)
    except OSError as exc:
        if os.path.lexists(path):
            print(f"warning: could not remove {path.name}, {what} ({exc.strerror or exc}); remove it by hand",
                  file=stream, flush=True)
            return None
    return f"cleaned: removed {path.name}, {what}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def own_leftover(path: Path, kind: str) -> bool:
    """Whether ``path`` (beside the report) is a leftover of this command: a real directory (not a
    link), whose marker holds the token of its own name (``.OUT.tmp-<pid>-<token>``,
    ``.OUT.old-<token>``); an ``old`` one must also hold nothing but what a report holds.  A
    user's directory that only looks like one is never touched."""
    if path.is_symlink() or not path.is_dir():
        return False
    token = marker_token(path)
    if token is None:
        return False
    suffix = path.name.rsplit(f".{kind}-", 1)[-1]
    name_token = suffix.split("-", 1)[1] if kind == "tmp" and "-" in suffix else suffix
    if name_token != token:
        return False
    if kind == "old":
        try:
            return not foreign_entries(path)
        except OSError:
            return False
    return True


def recover_leftovers(out: Path, stream: Optional[TextIO] = None) -> list[str]:
    """Repair what a killed build left beside ``out`` (returns the messages, also printed on
    ``stream``): no ``out`` but a stranded ``.out.old-*`` report -> the newest is renamed back;
    ``.out.old-*`` reports beside an existing ``out`` -> removed; ``.out.tmp-*`` directories of
    builds no longer running -> removed.  Only this command's own leftovers are touched
    (:func:`own_leftover`: the marker written by the build holds the token of the directory's
    name); "cleaned" is said only of what is gone."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    out = Path(out).absolute()
    if not out.parent.is_dir():
        return []
    with _locked(out.parent, out, stream):     # never while another command swaps its report
        messages = _recover(out, stream)
    for message in messages:
        print(message, file=stream, flush=True)
    return messages


def _recover(out: Path, stream: TextIO) -> list[str]:
    parent, messages = out.parent, []
    olds = sorted((p for p in parent.glob(f"{glob_escape('.' + out.name)}.old-*") if own_leftover(p, "old")),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    if olds and not out.exists() and not out.is_symlink():
        os.rename(olds[0], out)
        messages.append(f"recovered: {out} was missing (a build was killed while swapping reports); "
                        f"restored the previous report from {olds[0].name}")
        olds = olds[1:]
    messages += [_remove(old, "a replaced report a killed build left behind", stream) for old in olds]
    for tmp in parent.glob(f"{glob_escape('.' + out.name)}.tmp-*"):
        pid_text = tmp.name[len(f".{out.name}.tmp-"):].split("-", 1)[0]
        if (own_leftover(tmp, "tmp") and pid_text.isdigit() and int(pid_text) != os.getpid()
                and not _pid_alive(int(pid_text))):
            messages.append(_remove(tmp, "the unfinished output of a killed build", stream))
    return [m for m in messages if m]


# --------------------------------------------------------------------------- writing


def _figure_file(claim_id: str, name: str, taken: set[str]) -> str:
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in f"{claim_id}__{name}")[:120] or "figure"
    candidate, k = f"{FIGURE_DIR}/{stem}.png", 2
    while candidate in taken:
        candidate, k = f"{FIGURE_DIR}/{stem}-{k}.png", k + 1
    taken.add(candidate)
    return candidate


def render_results(results: list[ClaimResult]) -> tuple[list[dict], dict[str, bytes]]:
    """The ``claims`` entries of ``claims.json`` (``ClaimResult.to_dict()`` with its figure data
    as ``figure_data``) and the PNG bytes of every figure."""
    entries = []
    for result in results:
        entry = result.to_dict()
        entry["figure_data"] = entry.pop("figures")
        entries.append(entry)
    return draw_figures(with_defaults({"claims": entries})["claims"])  # rows given as dicts: HeadlineRow's defaults


def document(entries: list[dict], prov: dict) -> dict:
    """The claims.json document: the entries, their findings gathered in report order, the provenance."""
    return {"claims": entries, "findings": [f for e in entries for f in e.get("findings") or []],
            "provenance": prov}


def draw_figures(entries: list[dict]) -> tuple[list[dict], dict[str, bytes]]:
    """Draw every entry's ``figure_data``: the entries with ``figures`` (name, title, kind,
    caption, file) and ``figure_errors`` filled in, and the PNG bytes by file name.  Used by a
    build and by a re-render alike.  A figure that cannot be drawn is listed in
    ``figure_errors`` (and on the page) instead of stopping the report."""
    from reports.render import as_figure, figure_png, size_note

    out, pngs, taken = [], {}, set()
    for entry in entries:
        entry = dict(entry)
        figures, errors = [], []
        for raw in entry.get("figure_data") or []:
            try:      # everything a figure's data decides, inside: a handed file's odd value is one figure error
                fig = as_figure(raw)
                data = figure_png(fig)
                caption = " ".join(str(part) for part in (fig.caption, size_note(fig)) if part)
                shown = {"name": str(fig.name), "title": str(fig.title), "kind": str(fig.kind), "caption": caption}
            except Exception as exc:
                name = getattr(raw, "name", None) or (raw.get("name") if isinstance(raw, dict) else None)
                errors.append(f"{str(name or '?')[:80]}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            file = _figure_file(entry["id"], shown["name"], taken)
            pngs[file] = data
            figures.append({**shown, "file": file})
        entry.update(figures=figures, figure_errors=errors)
        out.append(entry)
    return out, pngs


def write_report(out: Path, report: dict, pngs: dict[str, bytes], stream: Optional[TextIO] = None) -> Path:
    """Write ``report`` (claims.json, index.html, the claims' figures ``pngs`` and the report's own,
    ``reports.render.report_figures``: the forest plot, drawn from ``report`` alone, which the README
    links) through :func:`write_files`."""
    from reports.render import render_html, report_figures

    def files() -> dict[str, bytes]:
        text = json.dumps(report, indent=2, allow_nan=False)  # strict JSON or an error here
        return {**pngs, **report_figures(report), "claims.json": (text + "\n").encode("utf-8"),
                "index.html": render_html(report, pngs).encode("utf-8")}
    return write_files(out, files, stream)


def write_files(out: Path, files: Callable[[], dict[str, bytes]], stream: Optional[TextIO] = None) -> Path:
    """Write what ``files()`` makes into a new temporary directory beside ``out``, check it as a
    report (``reports.render.check_report``), then put it in place (:func:`replace_with`).  On any
    exception (KeyboardInterrupt included) the temporary directory is removed and a previous
    report in ``out`` is left as it was; a build killed meanwhile leaves only the temporary, which
    the next one removes (:func:`recover_leftovers`)."""
    out = Path(out).absolute()
    tmp = new_temporary(out)
    try:
        (tmp / FIGURE_DIR).mkdir()
        write_tree(tmp, files())
        problems = check_report(tmp)
        if problems:
            raise ReportInvalid("the report does not satisfy its schema:\n  " + "\n  ".join(problems))
        return replace_with(tmp, out, stream)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- command


def build(cfg: BuildConfig, command: Optional[list[str]] = None, stream: Optional[TextIO] = None) -> dict:
    """Validate, run the claims, write the report into ``cfg.out``; returns the claims.json
    document.  Raises :class:`BadArguments` before running anything if an argument is wrong."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    cfg = validate(cfg)
    cost = check_claims(cfg)
    recover_leftovers(Path(cfg.out), stream)
    sweep_skipped = unreadable_sweep_points(cfg.sweep) if cfg.sweep is not None else []
    for point in sweep_skipped:
        print(f"warning: --from-sweep: not using {point['file']}: {point['reason']}; the claims reading this "
              "sweep train that run themselves if they need it", file=stream, flush=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    print(f"audit report: profile {cfg.profile}, device {cfg.device}, seed {cfg.seed}, {len(selected(cfg))} "
          f"claim(s) -> {cfg.out}" + (f"; estimated {describe_estimate(cost)}"
                                      if cost and len(cost["unknown"]) < len(cost["per_claim"]) else ""),
          file=stream, flush=True)
    if cfg.sweep is not None:
        ignore = [cid for cid in selected(cfg) if not _ask("reads_sweep", cid, default=True)]
        if ignore:
            print(f"note: {', '.join(ignore)} read no sweep and run as without --from-sweep", file=stream, flush=True)
    if cfg.problem is not None:
        from reports.render import describe_problem

        print(f"configuration: {describe_problem(cfg.problem)}", file=stream, flush=True)
    t0 = time.perf_counter()
    cpu_seconds: dict[str, float] = {}
    results = run_all(cfg, stream, cpu_seconds)
    t_render = time.perf_counter()
    entries, pngs = render_results(results)
    now = time.perf_counter()
    report = document(entries, provenance(cfg, results, started, now - t0,
                                          command or ["python", "-m", "reports.build"],
                                          cpu_seconds, now - t_render, sweep_skipped, cost))
    where = write_report(Path(cfg.out), report, pngs, stream)
    report["provenance"]["written_to"] = str(where)  # in memory only: where main says the page is
    return report


def rerender(source: str, out: str, stream: Optional[TextIO] = None) -> dict:
    """Write a report into ``out`` from an existing claims.json without running any claim: the
    figures are redrawn from each entry's ``figure_data`` with this version of
    ``reports.render``; the provenance is the original run's, with ``rerendered`` added."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    report = load_report(source, "--from-json")
    # the re-render writes the original provenance again, and a report's provenance is complete: a
    # file that lacks part of it is refused here, not by the check of what was written
    missing = provenance_problems(report["provenance"], strict=True)
    if missing:
        raise BadArguments(f"--from-json {source}: its provenance is not a report's ({'; '.join(missing[:3])}"
                           f"{'; ...' if len(missing) > 3 else ''}), so it cannot be re-rendered as one (reports.compare "
                           "can still read it)")
    source_file = Path(source).resolve()
    source_dir = source_file if source_file.is_dir() else source_file.parent
    if Path(out).resolve() == source_dir:
        raise BadArguments(f"--out {out} is the directory of --from-json; choose another directory")
    target = check_out_dir(out, "--out", [source_dir / "claims.json" if source_file.is_dir() else source_file])
    recover_leftovers(target, stream)
    t0 = time.perf_counter()
    entries, pngs = draw_figures([{k: v for k, v in c.items() if k not in ("figures", "figure_errors")}
                                  for c in report["claims"]])
    prov = dict(report["provenance"])
    prov["rerendered"] = {"from": str(Path(source).absolute()), "git": git_state(),
                          "at_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                          "seconds": time.perf_counter() - t0}
    new = document(entries, prov)
    print(f"re-rendering {len(entries)} claim(s) from {source} -> {out} (no claim is run)", file=stream, flush=True)
    where = write_report(target, new, pngs, stream)
    return {**new, "provenance": {**prov, "written_to": str(where)}}


def summary_table(report: dict) -> str:
    from reports.render import verdict_counts

    entries = report["claims"]
    width = max([len(e["id"]) for e in entries] + [5])
    cpu = report["provenance"].get("cpu_seconds", {}).get("per_claim", {})
    lines = [f"{'claim':<{width}}  verdict       seconds  cpu s", f"{'-' * width}  ------------  -------  -----"]
    for e in entries:
        note = f"  ({len(e['figure_errors'])} figure(s) not rendered)" if e["figure_errors"] else ""
        cpu_text = f"{cpu[e['id']]:5.1f}" if e["id"] in cpu else "    -"
        lines.append(f"{e['id']:<{width}}  {e['verdict']:<12}  {e['seconds']:7.1f}  {cpu_text}{note}")
    wall = report["provenance"]["wall_seconds"]
    lines.append(f"{verdict_counts(entries)}; total {wall['total']:.1f} s wall "
                 f"(rendering {wall.get('rendering') or 0:.1f} s)")
    return "\n".join(lines)


def exit_status(report: dict) -> int:
    """1 if a claim fails or errors, a boundary is contradicted or errors (claims.core.FAILING),
    or a figure could not be drawn; else 0."""
    bad = any(e["verdict"] in FAILING.get(e.get("kind", "claim"), ()) or e["figure_errors"]
              for e in report["claims"])
    return EXIT_CLAIMS_FAILED if bad else EXIT_OK


def refuse_arguments(parser: argparse.ArgumentParser, stream: TextIO, exc: Exception) -> int:
    """argparse's usage and ``exc`` as its error line on ``stream``: exit status 2."""
    parser.print_usage(stream)
    print(f"{parser.prog}: error: {exc}", file=stream)
    return EXIT_BAD_ARGUMENTS


def _raise_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")


@command_line
def main(argv: Optional[list[str]] = None) -> int:
    parser = make_parser()
    try:
        args = parser.parse_args(argv)  # argparse's own errors: its message, exit status 2
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_ARGUMENTS
    command = [sys.executable, "-m", "reports.build"] + list(sys.argv[1:] if argv is None else argv)

    def refuse(exc: Exception) -> int:
        return refuse_arguments(parser, sys.stderr, exc)

    if args.from_json is not None:
        clash = [f"--{name.replace('_', '-')}" for name in COMPUTE_OPTIONS if getattr(args, name) is not None]
        if clash:
            return refuse(BadArguments(f"--from-json re-renders a finished report and runs nothing; "
                                       f"{', '.join(clash)} cannot go with it (only --out)"))
        try:
            report = rerender(args.from_json, args.out)
        except BadArguments as exc:
            return refuse(exc)
    else:
        try:
            cfg = validate(config_from_args(args))
            if args.plan:      # what the claims say of this build first (a configuration one cannot run: exit 2)
                check_claims(dataclasses.replace(cfg, max_minutes=math.inf))
                print(plan_table(cfg))
                return 0
            check_claims(cfg)
        except BadArguments as exc:
            return refuse(exc)
        # SIGTERM (a scheduler's kill) takes the same path as Ctrl-C: temporary files removed,
        # the previous report intact.
        previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _main_thread() else None
        try:
            report = build(cfg, command)
        except BadArguments as exc:  # an --out that changed while validating: still before compute
            return refuse(exc)
        except KeyboardInterrupt:
            print(f"\ninterrupted: no report written; the previous report in {cfg.out} (if any) is intact",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    print(summary_table(report))
    print(f"report: {Path(report['provenance']['written_to']) / 'index.html'}")
    return exit_status(report)


def plan_table(cfg) -> str:
    """The needs of the selected claims, one line each (kind and parameters, its identity's hash,
    CPU seconds, the claims that read it), the costliest first, then the totals."""
    import hashlib

    from numerics.engine import closure, cost_of

    readers = {}
    for cid in selected(cfg):
        needs = claims.plan_of(cid, cfg.profile, cfg.problem, cfg.device, cfg.seed)
        for n in closure(needs):
            readers.setdefault(n, []).append(cid)
    rows = sorted(((cost_of(n), n) for n in readers), key=lambda r: -r[0])
    lines = [f"{'CPU s':>8}  {'id':16}  need  (read by)"]
    for seconds, n in rows:
        ident = hashlib.sha256(n.identity.encode()).hexdigest()[:16]
        lines.append(f"{seconds:8.1f}  {ident}  {n.label()}  ({', '.join(readers[n])})")
    total = sum(s for s, _ in rows)
    lines.append(f"{len(rows)} needs, {total:.0f} CPU s in all (each once; {sum(len(r) for r in readers.values())} "
                 f"reads by the claims); about {wall_seconds([s for s, _ in rows], cfg.jobs):.0f} s wall on "
                 f"{cfg.jobs} process{'es' if cfg.jobs > 1 else ''}")
    return "\n".join(lines)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
