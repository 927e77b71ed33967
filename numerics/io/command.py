"""The command lines: their options (one policy, checked before any computation, so that a bad
option costs nothing and leaves nothing behind; every message names the flag, says what is wrong
and how to fix it), the one wrapper of every ``main(argv)``, the one check of a ``--device``, and
the processes a command starts (workers that die with it, one BLAS thread each, a process group
under a timeout)."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import time
from typing import Optional

from numerics.io.files import _FULL, EXIT_DISK_FULL, DiskFull

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
    return _option(lambda text: parse_int(text, flag, low=low, high=high, why_high=why_high), "integer")


def _option(parse, name: str):
    """argparse ``type=`` of ``parse``: its ValueError's message is what argparse prints (exit 2)."""
    def option(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    option.__name__ = name
    return option


OFFSET_SEED_MAX = 2 ** 63 - 1
"""The largest seed of the audit's command: a seed torch's signed 64-bit generator takes as given
(2^64 - 1 fails there: "Overflow when unpacking long long"); its derived streams' seeds come from
names (numerics.engine.case_seed), never from arithmetic on it."""


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
            v = float(str(text)) if "_" not in str(text) else None
        except ValueError:
            v = None
        if v is None:
            raise ValueError(f"{flag} must be a number written without underscores (e.g. 0.05 or 1e-3), got {text!r}")
        if not math.isfinite(v):
            if not finite:
                return v
            raise ValueError(f"{flag} must be a finite number, got {text!r}")
        if low is not None and (v < low or (v == low and not allow_low)):
            raise ValueError(f"{flag} must be {'>=' if allow_low else '>'} {low:g}, got {text!r}")
        if high is not None and v > high:
            raise ValueError(f"{flag} must be at most {high:g}, got {text!r}")
        return v
    return _option(parse, "number")



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
    return _option(lambda text: parse_tasks(text, flag), "tasks")


DELETED_CWD = ("error: the current directory no longer exists (it was deleted or moved away); cd to an existing "
               "directory and run the command again")


def refuse_a_deleted_cwd_at_startup(always: bool = False) -> None:
    """Say :data:`DELETED_CWD` and exit 2 if the working directory no longer exists.  Called first
    by the packages whose command lines import torch (``numerics``): while ``python -m`` imports the
    package (``sys.argv[0] == "-m"``), such a directory would make torch's import abort ("Intel
    oneMKL FATAL ERROR: Cannot load libtorch_cpu.so") before any command line could say what is
    wrong.  A library import (any other ``sys.argv``) is left alone unless ``always``."""
    import sys

    if not always and sys.argv[:1] != ["-m"]:
        return
    try:
        os.getcwd()
    except FileNotFoundError:
        print(DELETED_CWD, file=sys.stderr)
        raise SystemExit(2) from None


class ClosedPipeSafe:
    """An output stream whose reader may leave (``... | head -1``): a write or flush that finds the
    pipe closed points the stream's descriptor at /dev/null and carries on, so the command does
    its work (its report is written) and exits with its own status; what it would have printed
    after is dropped, as the reader asked.  Everything else is the wrapped stream's."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _to_null(self) -> None:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, AttributeError, ValueError):
            pass                        # no descriptor (a StringIO): each write says so again, and is dropped

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_null()
            return len(text)

    def flush(self) -> None:
        for _ in range(2):              # the second flush writes what the first could not, to /dev/null
            try:
                return self._stream.flush()
            except BrokenPipeError:
                self._to_null()
            except (OSError, ValueError):
                return None
        return None


def command_line(main):
    """The one wrapper of every ``main(argv)`` of the project's command lines: what no single
    option can cause, handled once, each as one line on stderr and never a traceback.

    - an output stream that cannot encode a character (``PYTHONIOENCODING=ascii``, a C locale)
      writes it escaped (``\\u00b1``) instead of raising;
    - an output stream whose reader left (a closed pipe): the rest of the output is dropped,
      the command finishes, its exit status is its own (:class:`ClosedPipeSafe`);
    - a working directory that no longer exists: "the current directory was deleted", exit 2;
    - a full disk anywhere in the command (:class:`DiskFull`, or any ENOSPC/EDQUOT): its
      message ("disk full: N bytes needed at PATH"), exit :data:`EXIT_DISK_FULL`.

    The wrapped function raises ``SystemExit`` with that status (as argparse does for a bad
    option), so ``sys.exit(main())`` and in-process callers see the same thing."""
    import functools
    import sys

    @functools.wraps(main)
    def run(*args, **kwargs):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (AttributeError, ValueError, OSError):
                pass
        refuse_a_deleted_cwd_at_startup(always=True)
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = ClosedPipeSafe(sys.stdout), ClosedPipeSafe(sys.stderr)
        try:
            return main(*args, **kwargs)
        except OSError as exc:
            if isinstance(exc, DiskFull) or exc.errno in _FULL:
                full = exc if isinstance(exc, DiskFull) else DiskFull(exc.filename or "(unknown path)")
                print(f"error: {full}", file=sys.stderr)
                raise SystemExit(EXIT_DISK_FULL) from None
            raise
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            sys.stdout, sys.stderr = saved

    return run



# --- the --device option --------------------------------------------------------------------------

def check_device_option(device, flag: str = "--device") -> str:
    """``device`` if it is ``cpu``, or ``cuda`` / ``cuda:N`` with that CUDA device present (a
    ``torch.device`` is read by its name); else ValueError saying which devices there are (TypeError
    for what is not a name).  torch is imported only for a CUDA name, so that ``--help`` and
    ``--device cpu`` stay fast."""
    if type(device).__name__ == "device" and hasattr(device, "index"):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"{flag} must be a string such as 'cpu', 'cuda' or 'cuda:0', got {device!r}")
    if device == "cpu":
        return device
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isascii() and device[5:].isdigit()):
        raise ValueError(f"{flag} {device!r} is not supported: {flag} must be cpu, cuda or cuda:N (unknown device "
                         f"{device!r}: allowed are 'cpu', 'cuda' and 'cuda:N')")
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"{flag} {device} requested but no CUDA device is available (torch {torch.__version__}); "
                         f"use {flag}='cpu'")
    count = torch.cuda.device_count()
    if ":" in device and int(device[5:]) >= count:
        raise ValueError(f"{flag} {device} does not exist: only {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return device


# --- processes ------------------------------------------------------------------------------------

ONE_BLAS_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""The environment of a build's worker processes (set before they start, so numpy's and scipy's
OpenBLAS start with one thread).  Why: numpy's convolve and dot call OpenBLAS's ddot, threaded
above a few thousand elements; each call then wakes a second thread for microseconds of work,
and on 2 shared cores the two wait for each other.  theory.exact's moment tables (direct
Gaussian convolutions) took 13x the CPU time (3.8 against 0.30 s for 3 convolutions of 60000
by 20001, load 7) and multi-head-gain 227 CPU-s in a quick run, 54 with one thread.  It also
makes the numbers independent of the BLAS thread count (a threaded ddot sums in another order:
6e-16 relative)."""

_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
                 "openblas_set_num_threads")


@contextlib.contextmanager
def worker_environment():
    """Within the block, this process's environment holds ``ONE_BLAS_THREAD`` (for worker
    processes started in it); restored on exit, values set before included."""
    saved = {k: os.environ.get(k) for k in ONE_BLAS_THREAD}
    os.environ.update(ONE_BLAS_THREAD)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def one_blas_thread() -> int:
    """Set every OpenBLAS loaded in this process to one thread (the ``ONE_BLAS_THREAD`` policy
    for a process whose numpy is already loaded: a build run in-process, ``--jobs 1``), through
    the library's own ``*openblas_set_num_threads*`` (Linux: the loaded libraries are read off
    /proc/self/maps; elsewhere nothing is done).  Returns how many libraries were set."""
    import ctypes
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return 0
    done = 0
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _BLAS_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(1))
                done += 1
                break
    return done


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_SECONDS = 0.5


def die_with_parent(parent_pid: Optional[int] = None) -> None:
    """Make this (worker) process exit when its parent dies: the initializer of every pool of
    worker processes (a build's --jobs, a sweep's pool), so that ``kill -9`` of the command
    leaves nothing computing.  ``parent_pid``: the command's process (default: the parent).

    Two mechanisms, because a forkserver worker's parent is the fork server, not the command:

    - Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills this process when its parent
      dies.  SIGKILL, not SIGTERM: a worker holds nothing to clean up (only the command writes
      files), and a computation deep in a torch kernel would not run a Python handler.
    - everywhere: a daemon thread that polls, every :data:`PARENT_POLL_SECONDS`, whether the
      command still exists and this process was not re-parented, and ends it if not (other
      systems, and a parent that died before the prctl call)."""
    import signal
    import sys
    import threading

    parent = os.getppid()
    command = parent if parent_pid is None else int(parent_pid)
    if sys.platform.startswith("linux"):
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except OSError:
            pass

    def alive() -> bool:
        if os.getppid() != parent:  # re-parented: the parent is gone
            return False
        if os.name != "posix":  # there os.kill(pid, 0) would terminate the process, not probe it
            return True
        try:
            os.kill(command, 0)  # signal 0: the existence check, nothing is sent
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    if not alive():
        os._exit(1)

    def watch() -> None:
        while alive():
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
