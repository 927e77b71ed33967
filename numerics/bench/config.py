"""The sizes and settings of a benchmark run."""
from __future__ import annotations

from dataclasses import dataclass

QUICK = dict(tasks=(4, 4, 4), heads=3, L=256, batch=4096)
PAPER = dict(tasks=(8, 8, 8, 8), heads=4, L=1024, batch=4096)
# the authors' released script: dx = 50 split 16, 17, 17 by their DataGenerator, H = 3, L = 100,
# 10,000 fresh samples a step (docs/model.md)
AUTHORS = dict(tasks=(16, 17, 17), heads=3, L=100, batch=10000)
# section 4: R runs of one configuration trained one after another and as one program
BATCHED_RUNS = 8
BATCHED_STEPS = 3         # gradient steps per run (steps + 1 batches: a few are enough to time)
BATCHED_KINDS = ("mixed", "one_stream", "own_streams")
# --smoke: a smoke test of every code path in seconds (the numbers mean nothing)
SMOKE = dict(tasks=(2, 2), heads=2, L=32, batch=128)
LR = 0.05                 # the trainer's default eta; the step's cost does not depend on it
DTYPES = ("float32", "float64")
# the benchmark's targets (2 cores): ours over the standard implementation, and full over reduced flow
TARGETS = {"ratio_full_step": {"float32": 10.0, "float64": 15.0},
           "ratio_model_step": {"float32": 25.0, "float64": 25.0},
           "ratio_reduced_flow": {"float32": 3.0, "float64": 3.0},
           "ratio_expansion_flow": {"float32": 1000.0, "float64": 1000.0}}
EXPANSION_TIME = 60.0     # t of the expansion-flow comparison: TrainConfig's default horizon


@dataclass
class BenchConfig:
    device: str = "cpu"
    dtypes: tuple = DTYPES
    repeats: int = 5          # timed rounds of the step comparison
    warmup: int = 2           # > 0: one untimed round of each comparison
    # "quick": the contract (ratios, sampling, model and reduced flow) and the batched runs at
    # the QUICK size; "full" adds peak memory (QUICK and PAPER) and the batched runs at the
    # AUTHORS size; smoke=True runs either at the SMOKE size
    profile: str = "full"
    smoke: bool = False       # SMOKE sizes: the code paths in seconds, meaningless numbers
    seed: int = 0
    reduced_time: float = 0.5  # gradient-flow time t of section 2 (t / lr steps)
    expansion_time: float = EXPANSION_TIME  # t of the expansion flow against the full flow
    progress: bool = True
    out: str | None = None    # JSON path
    threads: int | None = None  # torch intra-op threads (None: torch's default)
