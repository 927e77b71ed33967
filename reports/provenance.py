"""The provenance of a report: versions, platform, device, seeds, timings, git state, sweep points skipped."""
from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Optional

from claims.base import ClaimResult
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
    """The files of ``sweep/points/`` that ``tools.sweep`` skips (not JSON, or not a point
    record): ``[{"file", "reason"}]``; the report says which."""
    from tools.sweep.store import read_point_file  # the sweep's own reading rule, not a copy

    skipped = []
    points = Path(sweep) / "points"
    if not points.is_dir():
        return skipped
    for path in sorted(points.glob("*.json")):
        if path.name.startswith(".") or not path.is_file() or read_point_file(path) is not None:
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


