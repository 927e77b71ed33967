"""Timing utilities: device synchronisation and interleaved timings."""
from __future__ import annotations

import time

import numpy as np
import torch


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def summary(samples: list[float]) -> dict:
    """Median, min and max of the samples (and the samples themselves)."""
    return {"median": float(np.median(samples)), "min": float(np.min(samples)),
            "max": float(np.max(samples)), "n": len(samples), "samples": [float(s) for s in samples]}


def time_interleaved(fns: dict, rounds: int, warmup: int, device: str) -> dict:
    """Seconds per call of each function in ``fns``, measured in interleaved rounds: every
    round times one call of each, in an order rotated from round to round.  On a shared
    machine the load drifts over seconds; interleaving exposes every contender to the same
    drift, so their ratios stay meaningful even when the absolute times are inflated.
    A function may return a list of (wall, cpu) second pairs instead of None
    (``TrainerSteps``): those are its samples for the round.  The first ``warmup`` rounds
    are untimed.

    Each summary also holds ``cpu``: the process CPU time (all threads) per call.  Waiting
    for a core does not count in it, so on a contended machine it is the steadier figure
    (spinning threads still add some); on a GPU it is host time only."""
    names = list(fns)
    wall: dict = {k: [] for k in names}
    cpu: dict = {k: [] for k in names}
    for r in range(warmup + rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            got = fns[k]()
            sync(device)
            if r < warmup:
                continue
            pairs = got if isinstance(got, list) else [(time.perf_counter() - t0, time.process_time() - c0)]
            wall[k].extend(p[0] for p in pairs)
            cpu[k].extend(p[1] for p in pairs)
    return {k: {**summary(wall[k]), "cpu": summary(cpu[k])} for k in names}


def ratio_summary(slow: dict, fast: dict) -> dict:
    """slow/fast from medians, with the worst and best case from the extremes."""
    return {"median": slow["median"] / fast["median"], "min": slow["min"] / fast["max"],
            "max": slow["max"] / fast["min"]}
