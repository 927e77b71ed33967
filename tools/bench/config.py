"""The sizes and settings of a benchmark run."""
from __future__ import annotations

from dataclasses import dataclass

QUICK = dict(tasks=(4, 4, 4), heads=3, L=256, batch=4096)
PAPER = dict(tasks=(8, 8, 8, 8), heads=4, L=1024, batch=4096)
# --quick: a smoke test of every code path in seconds (the numbers mean nothing)
SMOKE = dict(tasks=(2, 2), heads=2, L=32, batch=128)
LR = 0.05                 # the trainer's default eta; the step's cost does not depend on it
DTYPES = ("float32", "float64")


@dataclass
class BenchConfig:
    device: str = "cpu"
    dtypes: tuple = DTYPES
    repeats: int = 5          # rounds of the step comparison, repeats of the probes
    warmup: int = 2           # untimed probe calls; > 0: one untimed round of each comparison
    quick: bool = False       # smoke-test sizes
    seed: int = 0
    reduced_time: float = 0.5  # gradient-flow time t of section 3 (t / lr steps)
    scaling_steps: int = 4    # timed rounds of section 4
    progress: bool = True
    out: str | None = None    # JSON path
    threads: int | None = None  # torch intra-op threads (None: torch's default)
