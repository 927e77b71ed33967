"""The progress display of a build: one line (or a tqdm bar) per claim, on stderr."""
from __future__ import annotations

import math
import time
from typing import TextIO

from claims.core.base import ClaimResult


class ClaimProgress:
    """The progress callback of one claim: a tqdm bar on ``stream`` with the claim's own
    message; throttled, and never allowed to raise into the claim."""

    def __init__(self, label: str, stream: TextIO, enabled: bool):
        self.stream, self.last, self.bar = stream, 0.0, None
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
