"""The provenance of a report: versions, platform, device, seeds, timings, git state, sweep points skipped."""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Optional

from claims.core.base import ClaimResult
from reports.plan import claims_at_configuration
from reports.schema import VERSIONED_PACKAGES

REPO_ROOT = Path(__file__).resolve().parent.parent



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
    import os

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


