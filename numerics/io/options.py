"""The command lines' options (numerics.train, theory, numerics.bench, numerics.sweep, reports): one
policy, checked before any computation, so that a bad option costs nothing and leaves nothing
behind.  Every message names the flag, says what is wrong and how to fix it."""
from __future__ import annotations

import argparse
import math
import os
import re
from typing import Optional

SEED_MAX = 2 ** 64 - 1
"""Seeds are integers in 0 .. 2^64 - 1 (what torch.Generator.manual_seed and numpy accept alike)."""

_INT_TEXT = re.compile(r"[+-]?[0-9]+\Z")


def parse_int(text, flag: str, *, low: Optional[int] = None, high: Optional[int] = None,
              why_high: str = "") -> int:
    """The one strict integer parser of the command lines: optional sign and decimal digits
    only (``int()`` would also take ``3_3`` as 33 and `` 3 ``; ``1e9`` and ``2.5`` are refused
    too), within ``low .. high``.  Raises ValueError naming ``flag``."""
    s = str(text)
    what = "a positive integer" if low == 1 else ("an integer" if low is None else f"an integer >= {low}")
    if not _INT_TEXT.match(s):
        raise ValueError(f"{flag} must be {what} written in digits (e.g. 3; no underscores, spaces, exponent or "
                         f"decimal point), got {s!r}")
    v = int(s)
    if low is not None and v < low:
        raise ValueError(f"{flag} must be {what}, got {v}")
    if high is not None and v > high:
        raise ValueError(f"{flag} must be at most {high}{' (' + why_high + ')' if why_high else ''}, got {v}")
    return v


def int_option(flag: str, low: Optional[int] = None, high: Optional[int] = None, why_high: str = ""):
    """argparse ``type=`` of :func:`parse_int` (argparse prints the message, exit status 2)."""
    def parse(text):
        try:
            return parse_int(text, flag, low=low, high=high, why_high=why_high)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = "integer"
    return parse


OFFSET_SEED_MAX = 2 ** 63 - 1
"""The largest seed of the audit's command: a seed torch's signed 64-bit generator takes as given
(2^64 - 1 fails there: "Overflow when unpacking long long"); its derived streams' seeds come from
names (numerics.seeds.case_seed), never from arithmetic on it."""


def seed_option(flag: str = "--seed", high: int = SEED_MAX):
    """argparse ``type=`` of a seed: an integer in 0 .. ``high`` (2^64 - 1 by default)."""
    return int_option(flag, 0, high, "seeds are 64-bit unsigned integers" if high == SEED_MAX else
                      "seeds with their derived streams' offsets stay 64-bit unsigned integers")


def thread_limit() -> int:
    """The most CPU threads (or local worker processes) a command accepts: 4 x the CPUs of
    this machine (at least 4).  More only makes threads wait on each other for a core, and
    a mistyped 100000 would start that many threads or processes."""
    return 4 * max(1, os.cpu_count() or 1)


def threads_option(flag: str = "--threads"):
    """argparse ``type=`` of a thread or worker count: 1 .. :func:`thread_limit`."""
    return int_option(flag, 1, thread_limit(),
                      f"4 x the {os.cpu_count() or 1} CPUs of this machine: more only wait on each other for a core")


def float_option(flag: str, *, low: Optional[float] = None, high: Optional[float] = None,
                 allow_low: bool = False, finite: bool = True):
    """argparse ``type=`` of a number written without underscores (``float()`` takes ``1_0`` as
    10): finite unless ``finite=False`` (then the value's own validation says more), above
    ``low`` (or equal with ``allow_low``) and at most ``high``."""
    def parse(text):
        try:
            if "_" in str(text):
                raise ValueError
            v = float(str(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number written without underscores (e.g. 0.05 "
                                             f"or 1e-3), got {text!r}") from None
        if not math.isfinite(v):
            if not finite:
                return v
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number, got {text!r}")
        if low is not None and (v < low or (v == low and not allow_low)):
            raise argparse.ArgumentTypeError(f"{flag} must be {'>=' if allow_low else '>'} {low:g}, got {text!r}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"{flag} must be at most {high:g}, got {text!r}")
        return v
    parse.__name__ = "number"
    return parse



_TASK_ENTRY = re.compile(r"[0-9]+\Z")

_TASKS_RULE = ("must be comma-separated positive integers such as 3,3 (digits only: no empty entries, no signs, "
               "no spaces or underscores)")


def parse_tasks(text, flag: str = "--tasks") -> tuple[int, ...]:
    """The one ``--tasks`` parser of every command: ``"3,3,3"`` -> (3, 3, 3).

    Strict: every comma-separated entry is a positive integer written in decimal digits --
    an empty entry (``"2,,2"``, ``"2,"``), a sign (``"+3"``), a space (``"3, 3"``), an
    underscore (``"3_3"``), a decimal point or an exponent is refused.  Raises ValueError
    naming ``flag``."""
    s = str(text)
    for part in s.split(","):
        if part == "":
            raise ValueError(f"{flag} {_TASKS_RULE}; got {s!r}: an empty block size (two commas, or a comma at an "
                             "end)")
        if not _TASK_ENTRY.match(part):
            raise ValueError(f"{flag} {_TASKS_RULE}; got {s!r}: {part!r} is not an integer written in digits")
        if int(part) < 1:
            raise ValueError(f"{flag} {_TASKS_RULE}; got {s!r}: every block size r_i must be >= 1")
    return tuple(int(part) for part in s.split(","))


def tasks_option(flag: str = "--tasks"):
    """argparse ``type=`` of :func:`parse_tasks` (argparse prints the message, exit status 2)."""
    def parse(text):
        try:
            return parse_tasks(text, flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = "tasks"
    return parse
