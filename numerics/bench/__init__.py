"""Performance benchmark of the training step: ours against the standard way.

``python -m numerics.bench`` measures, in one run, on one device:

1. seconds per gradient step (sample prompts + forward + backward + update) of our trainer
   (``numerics.train.train``, timed inside a real run: :class:`TrainerSteps`) against
   :class:`numerics.bench.reference.ReferenceAttention`, the same model written the standard way
   (per-head q/k/v linear layers over every token), at the quick configuration (tasks
   4,4,4, H = 3, L = 256, batch 4096), in each dtype, and the ratio; also the step without
   sampling on a fixed batch (where the two differ) and the sampling alone (what they share);
2. wall time of the reduced ODE (``train_reduced``) against full gradient flow (``train``)
   to the same time t on the quick configuration;
3. peak memory of one step at the quick and the paper configuration (tasks 8,8,8,8, H = 4,
   L = 1024, batch 4096): resident-set peak in a fresh process on CPU,
   ``torch.cuda.max_memory_allocated`` on CUDA (:func:`peak_memory`);
4. runs per second of 8 runs trained one after another (``numerics.train.train``) and as
   ``numerics.train.train_many``'s batched programs, for three run sets (shared and own
   prompt streams), at the quick size and at the authors' configuration (tasks 16,17,17,
   H = 3, L = 100, batch 10000).

Profiles: ``--quick`` runs sections 1, 2 and 4 only at the quick size (the benchmark's
contract: the top-level JSON keys of :func:`~numerics.bench.run.contract`); the default runs all four;
``--smoke`` runs either at tiny sizes (a test of the code paths, numbers meaningless).

Timings are medians over rounds, with min and max; the contenders of a comparison are run
interleaved, round by round (:func:`time_interleaved`), so a shared machine's drifting load
hits all of them alike, and process CPU time is recorded next to wall time.  Everything is
also written as JSON (``--out``); the load average at start and end is in ``meta``.

Precision policy: TF32 is switched off (``fp32_precision = "ieee"``) before anything runs,
so a float32 matmul is a float32 matmul on every device (docs/performance.md).

By concern: :mod:`~numerics.bench.timing` (timers, precision policy),
:mod:`~numerics.bench.steps` (the contenders), :mod:`~numerics.bench.memory` (peak memory),
:mod:`~numerics.bench.run` (the four sections), :mod:`~numerics.bench.cli` (flags, table, JSON).
"""
from numerics.bench.cli import main, parse_args
from numerics.bench.config import QUICK
from numerics.bench.memory import peak_memory
from numerics.config import use_precise_float32 as precise_float32

__all__ = ["QUICK", "main", "parse_args", "peak_memory", "precise_float32"]
