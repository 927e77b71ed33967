"""What the audit does that is not mathematics: its command lines, input files and outputs,
its processes, and the plain data (JSON, TOML) it reads and writes.

The ground floor of the project, below the rest of ``numerics``, ``claims`` and ``reports``: it
imports none of them and no torch (tests/test_theory_isolation.py checks it), and theory imports
nothing from it (theory is pure mathematics and checks only its own arguments; its command line
is ``reports.theory``).  A module of ``numerics``, not a top-level ``io``, so that it cannot shadow
the standard library's ``io`` (imports are absolute: ``import io`` anywhere is the standard
library's).

- command lines: their options (one policy, checked before any computation, so that a bad option
  costs nothing and leaves nothing behind; every message names the flag, says what is wrong and
  how to fix it), the one wrapper of every ``main(argv)``, the one check of a ``--device``;
- processes a command starts: workers that die with it, one BLAS thread each;
- files: a bad path is refused before any computation, with one line that says what is wrong and
  how to fix it; a file is written whole or not at all (a temporary in the same directory,
  fsynced, renamed over the target), and a folder the command was handed is never left through a
  symbolic link; a full disk is one line and its own exit status;
- handed data: strict JSON (the memory it would take checked first), the one JSON normaliser,
  TOML.  (A handed weights file -- zip, pickle, npy, safetensors -- is read by
  :mod:`numerics.checkpoint`.)
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any, Optional

try:
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10
    import tomli as _toml

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


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_THRESHOLD_BYTES = 32 << 20   # glibc's largest: half its heap size
TRIM_THRESHOLD_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for the next allocation (Linux: ``mallopt``; elsewhere
    nothing is done): blocks up to MMAP_THRESHOLD_BYTES come from the heap instead of fresh
    mappings, and the heap is returned to the system only past TRIM_THRESHOLD_BYTES free at its
    top.  By default a tensor of MiBs freed and allocated again each step is unmapped and
    mapped afresh, and its page faults cost more than its arithmetic (the exact reduced loss at
    L = 4096, 256 prompts: 37 -> 14 ms a point).  Where memory comes from changes no number.
    Returns whether both settings were taken."""
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) & bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


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


# --- files ----------------------------------------------------------------------------------------

_NOFOLLOW, _DIRECTORY, _NONBLOCK, _CLOEXEC = (getattr(os, f"O_{name}", 0) for name in
                                              ("NOFOLLOW", "DIRECTORY", "NONBLOCK", "CLOEXEC"))


def _bytes(data) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _unlink_quietly(name, dir_fd: Optional[int] = None) -> None:
    """Remove a file this call created; one already gone (or not removable) is left as it is."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _write_all(fd: int, payload) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


# --- input files --------------------------------------------------------------------------------

MAX_INPUT_BYTES = 16 * 2 ** 20
"""Default size limit of a configuration or grid file read by a command (16 MiB): such files
are a few kB; a larger one is a mistake, and parsing 100 MB of TOML takes minutes."""


def check_input_file(path, flag: str, *, max_bytes: Optional[int] = MAX_INPUT_BYTES) -> Path:
    """An input file that exists, is a regular file (a FIFO, socket or device is refused
    without being opened: reading one would block or never end) and holds at most
    ``max_bytes``.  Returns it as a Path."""
    text = _path_text(path, flag)
    try:
        st = _follow(text, flag, "fix the link or give the file itself")
    except OSError as exc:
        raise ValueError(f"{flag} {text}: no such file ({_strerror(exc)}); check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{flag} {text} is a directory, not a file; give the file itself")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{flag} {text} is not a regular file ({_kind(st.st_mode)}): reading it could block for "
                         "ever; give a regular file")
    _too_big(flag, text, st.st_size, max_bytes, " (they are a few kB); give the right file")
    if not os.access(text, os.R_OK):
        raise ValueError(f"{flag} {text} cannot be read (permission denied); check its permissions")
    return Path(text)


def check_input_files(paths, flag: str, *, max_bytes: Optional[int] = MAX_INPUT_BYTES) -> list[Path]:
    """Every file of ``paths`` checked by :func:`check_input_file` before any is read (a loop, a
    FIFO or a device last in the list is refused before the first file's bytes are taken), each
    name also valid UTF-8: a name that is not (bytes of another encoding) cannot be written into a
    report, a page or a terminal, so it is refused up front with its bytes shown."""
    texts = [_utf8_name(_path_text(path, flag), flag, "rename the file, e.g. with convmv or by hand") for path in paths]
    return [check_input_file(text, flag, max_bytes=max_bytes) for text in texts]


def _utf8_name(text: str, flag: str, fix: str) -> str:
    """``text`` if it is valid UTF-8 (a name that is not cannot be written into a report, a page or
    a terminal), else ValueError showing its bytes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(text).decode("utf-8", "backslashreplace")
        raise ValueError(f"{flag} {shown}: its name is not valid UTF-8 (bytes of another encoding); {fix}") from None
    return text


def _too_big(flag: str, shown, size: int, max_bytes: Optional[int], fix: str) -> None:
    if max_bytes is not None and size > max_bytes:
        raise ValueError(f"{flag} {shown} is {size / 2 ** 20:.1f} MiB, more than the limit of {max_bytes / 2 ** 20:.0f} "
                         f"MiB for this kind of file{fix}")


def _read_bounded(fd: int, max_bytes: Optional[int], grew) -> bytes:
    """Everything an open descriptor holds, read in 1 MiB pieces; past ``max_bytes`` (a file that grew
    after its size was checked) ``ValueError(grew("N MiB"))``."""
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise ValueError(grew(f"{max_bytes / 2 ** 20:.0f} MiB"))


def read_input_bytes(path, flag: str, *, max_bytes: Optional[int] = MAX_INPUT_BYTES) -> bytes:
    """The content of an input file checked by :func:`check_input_file`, opened without
    blocking (``O_NONBLOCK``: a FIFO swapped in after the check cannot hang the read) and
    read to at most ``max_bytes``."""
    checked = check_input_file(path, flag, max_bytes=max_bytes)
    try:
        fd = os.open(checked, os.O_RDONLY | _NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{flag} {checked}: cannot be read ({_strerror(exc)})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{flag} {checked} is not a regular file; give a regular file")
        return _read_bounded(fd, max_bytes, lambda limit: f"{flag} {checked} grew past the limit of {limit} while "
                                                           "being read; give the right file")
    finally:
        os.close(fd)


# --- output paths -------------------------------------------------------------------------------

TEMP_PREFIX = ".icl-tmp-"
"""Name prefix of the temporaries of :func:`write_output` and :func:`write_inside`: a writer killed
between writing and renaming (SIGKILL) leaves at most one such file, which
the cleaners remove -- only if its name carries the project's mark
(:func:`temporary_name`); a file that merely looks like a temporary is never deleted."""

_TEMP_NAME = re.compile(r"\.icl-tmp-(?P<name>.+)\.(?P<pid>[0-9]+)\.(?P<rand>[0-9a-f]{8})\.(?P<mark>[0-9a-f]{8})\Z", re.S)


def _mark(*parts: str) -> str:
    import hashlib

    return hashlib.sha256("\0".join(("icl-attention-audit temporary",) + parts).encode("utf-8", "surrogateescape")
                          ).hexdigest()[:8]


def temporary_name(name: str) -> str:
    """The name of a temporary of the file ``name``: ``.icl-tmp-NAME.PID.RAND.MARK``, where MARK
    is a hash of the rest.  The mark is what makes it the project's own: a cleaner deletes a
    file only if its name carries a valid mark (:func:`is_own_temporary`), so a user's
    ``.notes.tmp``, or a name copied from the pattern by hand, is never taken for one."""
    rand = uuid.uuid4().hex[:8]
    pid = str(os.getpid())
    return f"{TEMP_PREFIX}{name}.{pid}.{rand}.{_mark(name, pid, rand)}"


def is_own_temporary(entry: str, name: Optional[str] = None) -> bool:
    """Whether the directory entry ``entry`` is a temporary this project named
    (:func:`temporary_name`), of the file ``name`` if given."""
    match = _TEMP_NAME.match(entry)
    if match is None or (name is not None and match["name"] != name):
        return False
    return match["mark"] == _mark(match["name"], match["pid"], match["rand"])


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def _path_text(path, flag: str) -> str:
    if isinstance(path, (bytes, bytearray)):
        path = os.fsdecode(bytes(path))
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"{flag} must be a path, got {type(path).__name__}")
    text = os.fspath(path)
    if text.strip() == "":
        raise ValueError(f"{flag} is empty; give a path")
    if "\x00" in text:
        raise ValueError(f"{flag} {text!r} contains a NUL character; give a valid path")
    return text


def _follow(text: str, flag: str, fix: str) -> os.stat_result:
    """``os.stat`` of a path that may be a symbolic link, followed to the end; a loop or a link
    leading nowhere is refused (nothing could be read or written through it); any other OSError
    (nothing there) is raised."""
    try:
        return os.stat(text)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{flag} {text} is a symbolic link loop (it never reaches a file); {fix}") from None
        if os.path.islink(text):
            raise ValueError(f"{flag} {text} is a symbolic link to {os.readlink(text)!r}, which does not exist "
                             f"(a dangling link); {fix}") from None
        raise


def _resolve_link(text: str, flag: str) -> str:
    """The target of a path that may be a symbolic link (:func:`_follow`), or of a new one."""
    try:
        _follow(text, flag, f"fix or remove the link, or choose another {flag}")
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise ValueError(f"{flag} {text}: {_nearest_existing(text)} is a file, not a directory; choose another "
                             "path") from None
        if exc.errno not in (errno.ENOENT,):
            raise ValueError(f"{flag} {text}: cannot be used ({_strerror(exc)}); choose another {flag}") from None
    return os.path.realpath(text)


def _nearest_existing(path) -> str:
    """The nearest ancestor of ``path`` (or itself) that exists; '.' for a relative path with none."""
    p = os.path.dirname(os.path.abspath(os.fspath(path)))
    while not os.path.lexists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


PROBE_BYTES = 64 * 1024
"""What the write probe of an output location writes (then removes): a real block, not an empty
file -- an empty file needs no space, so it would pass on a full disk."""


def _probe_dir(flag: str, text: str, directory: str) -> None:
    """Create a file of :data:`PROBE_BYTES` bytes in ``directory``, fsync it and remove it: the
    only sure test that it is writable (permission bits say nothing for root, a read-only mount
    or /proc) and that its file system has room (a full disk: :class:`DiskFull`)."""
    probe = None
    try:
        name = os.path.join(directory, temporary_name("probe"))
        fd = _open_new(name, 0o600)
        probe = name            # ours from here on: only a file this call created is ever removed
        try:
            _write_all(fd, bytes(PROBE_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in _FULL:
            raise DiskFull(directory, PROBE_BYTES) from None
        raise ValueError(f"{flag} {text}: cannot write in {directory} ({_strerror(exc)}); choose a writable "
                         "location") from None
    finally:
        if probe is not None:
            _unlink_quietly(probe)


def _open_new(path: str, mode: int = 0o666, dir_fd: Optional[int] = None) -> int:
    """A new file opened for writing: never an existing one, never through a symbolic link
    (O_EXCL); mode 0666 lets the kernel apply the umask, as for any new file."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode,
                   dir_fd=dir_fd)


def _same(a: str, b: str) -> bool:
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _check_not_input(flag: str, text: str, target: str, inputs) -> None:
    for inp in inputs or ():
        if inp is None:
            continue
        if _same(target, os.fspath(inp)):
            raise ValueError(f"{flag} {text} is the same file as the input {os.fspath(inp)}: inputs are never "
                             f"overwritten by outputs; choose another {flag}")


def check_output_path(path, flag: str, *, inputs=()) -> Path:
    """Check, before any computation, that the output *file* ``path`` of option ``flag`` can
    be written, and return the path to write (symbolic links followed).

    Accepted: a new file in an existing writable directory; an existing regular file (a
    symbolic link to one is followed: its target is written, the link kept); an existing
    character device such as /dev/null, which :func:`write_output` writes *through*, never
    replaces.

    Refused with a ValueError naming ``flag`` and saying how to fix it: a directory; a FIFO,
    socket or block device; a dangling symbolic link or a link loop; a missing or unwritable
    parent directory; a file that cannot be written; a path that is (after following links)
    any of ``inputs`` -- inputs are never overwritten by outputs; a path ending in ``/`` (it
    names a directory: writing would make a *file* of that name).  Creates nothing."""
    text = _path_text(path, flag)
    if text.endswith(("/", os.sep)) or (os.altsep and text.endswith(os.altsep)):
        raise ValueError(f"{flag} {text} ends with '/', so it names a directory, not a file; give a file name "
                         f"such as {os.path.join(text, 'out.json')}")
    target = _resolve_link(text, flag)
    _check_not_input(flag, text, target, inputs)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ValueError(f"{flag} {text}: cannot be used ({_strerror(exc)}); choose another {flag}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{flag} {text} is a directory; give a file name such as "
                             f"{os.path.join(text, 'out.json')}")
        if stat.S_ISCHR(st.st_mode):
            if not os.access(target, os.W_OK):
                raise ValueError(f"{flag} {text} is a character device that cannot be written (permission denied)")
            return Path(target)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{flag} {text} is {_kind(st.st_mode)}, not a regular file: it is never replaced or "
                             f"written to; choose another {flag}")
        if not os.access(target, os.W_OK):
            raise ValueError(f"{flag} {text} exists and is read-only; make it writable or choose another {flag}")
    parent = os.path.dirname(target) or "."
    if not os.path.isdir(parent):   # the nearest existing ancestor says whether it is a typo or a file
        existing = _nearest_existing(target)
        if os.path.exists(existing) and not os.path.isdir(existing):
            raise ValueError(f"{flag} {text}: {existing} is a file, not a directory; choose another path")
        raise ValueError(f"{flag} {text}: the directory {parent} does not exist; create it first or choose an "
                         "existing directory")
    _probe_dir(flag, text, parent)
    return Path(target)


def check_output_dir(path, flag: str, *, marker: str, inputs=(), replaced: bool = False) -> Path:
    """Check, before any computation, that ``path`` can be the output *directory* of option
    ``flag``; returns it (symbolic links followed).

    Accepted: a new directory (missing parents are created by the writer; the nearest existing
    one must be writable), an empty existing directory, or the command's own previous output,
    recognised by the file ``marker`` inside it.  Refused with a ValueError naming ``flag``:
    a name that is not valid UTF-8 (it could be written into no report, page or terminal), a
    file, a symbolic link loop or dangling link, an unwritable location, a directory that holds a
    sweep (``points/``) or anything else that is not this command's output (it could be deleted or
    mixed with), and a directory that is one of ``inputs``.  With ``replaced`` (a directory
    written beside and swapped in, as a report is) the folder that holds it must be writable too,
    even when it exists.  A command never deletes a directory it did not create: only its own
    previous output may be replaced."""
    text = _utf8_name(_path_text(path, flag), flag, "choose a name in UTF-8")
    target = _resolve_link(text, flag)
    _check_not_input(flag, text, target, inputs)
    if os.path.lexists(target) and not os.path.isdir(target):
        raise ValueError(f"{flag} {text} exists and is not a directory; choose another {flag}")
    if os.path.isdir(target):
        try:
            entries = os.listdir(target)
        except OSError as exc:
            raise ValueError(f"{flag} {text}: cannot be listed ({_strerror(exc)}); choose another {flag}") from None
        if entries and marker not in entries:
            if "points" in entries and os.path.isdir(os.path.join(target, "points")):
                what = "holds a sweep (points/)"
            else:
                shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
                what = f"is a non-empty directory ({shown}) that is not an output of this command (no {marker})"
            raise ValueError(f"{flag} {text} {what}: it is neither replaced nor mixed with; give a new or empty "
                             f"directory as {flag}")
        _probe_dir(flag, text, target)
        if replaced:
            _probe_dir(flag, text, os.path.dirname(target) or ".")
        return Path(target)
    existing = _nearest_existing(target)
    if not os.path.isdir(existing):
        raise ValueError(f"{flag} {text}: {existing} is a file, not a directory; choose another {flag}")
    _probe_dir(flag, text, existing)
    return Path(target)


def make_directories(path) -> None:
    """``path`` and every missing folder above it, made one at a time from the nearest existing
    one down, without recursion (``Path.mkdir(parents=True)`` recurses once per missing level:
    a path 2,000 levels deep raised RecursionError after all the work)."""
    path = os.path.abspath(os.fspath(path))
    missing = []
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise


LOCK_WAIT_SECONDS = 600.0
"""How long a command waits for another one writing in the same folder (:func:`folder_lock`): the
sections it locks take seconds (a report checked and swapped in); past this, the other one is
stopped or hung, and waiting longer would only hide it."""


class FolderBusy(ValueError):
    """Another command has held a folder's lock for :data:`LOCK_WAIT_SECONDS`."""


@contextlib.contextmanager
def folder_lock(directory, flag: str, shown, stream=None):
    """Hold an exclusive ``flock`` on ``directory`` (the folder that holds an output and its
    temporaries) for the duration: two commands writing the same output take turns (one
    checks, writes or swaps while the other waits), so neither sees the other's half-made
    state (a write probe, a report moved aside).  The lock is the folder's own descriptor:
    no lock file is left, and it is released when its holder exits, however it ends.  Where
    the file system has no locks, or the folder does not exist yet, nothing is locked.  Past
    :data:`LOCK_WAIT_SECONDS` of waiting: :class:`FolderBusy`, one line."""
    import fcntl
    import sys

    try:
        fd = os.open(os.fspath(directory), os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except (OSError, TypeError, ValueError):
        fd = None
    try:
        if fd is not None:
            _take_lock(fd, flag, shown, sys.stderr if stream is None else stream, fcntl)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _take_lock(fd: int, flag: str, shown, stream, fcntl) -> None:
    """``flock`` of ``fd``, waited for: said once on ``stream`` after a second of waiting."""
    start = time.monotonic()
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError:
            return          # a file system without locks: nothing to wait for
        if not said and time.monotonic() > start + 1.0:
            print(f"waiting: another command is writing {flag} {shown}; this one goes next", file=stream, flush=True)
            said = True
        if time.monotonic() > start + LOCK_WAIT_SECONDS:
            raise FolderBusy(f"{flag} {shown}: another command has been writing there for {LOCK_WAIT_SECONDS:.0f} s "
                             "(stopped or hung?); let it finish, end it, or choose another " + flag)
        time.sleep(0.05)


def write_output(path, data) -> None:
    """Write ``data`` (str: UTF-8, or bytes) to the output ``path`` that
    :func:`check_output_path` accepted (a file named on the command line: a symbolic link there
    is followed, as the user asked for it).

    A character device (/dev/null) is opened and written through, never replaced.  Anything
    else is written atomically: a temporary (:func:`temporary_name`) in the target's directory
    (links followed), flushed and fsynced, then ``os.replace``-d onto the target, so a reader or
    a process killed at any instant sees the old content or the whole new one.  The file keeps
    an existing file's permission bits, or gets the umask's default (0666 & ~umask) when new.
    On any exception the temporary is removed; a full disk raises :class:`DiskFull` (the old
    content intact); a SIGKILL leaves at most one temporary, which
    :func:`clean_stale_temporaries` removes later."""
    payload = _bytes(data)
    text = os.fspath(path)
    target = os.path.realpath(text)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISCHR(st.st_mode):
        try:
            with open(target, "wb", buffering=0) as fh:
                fh.write(payload)
        except OSError as exc:
            raise disk_full(exc, target, len(payload)) from None
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{text} is {_kind(st.st_mode)}, not a regular file: not written")
    directory = os.path.dirname(target) or "."
    fd = os.open(directory, os.O_RDONLY | _DIRECTORY)
    try:
        _clean_in(fd, os.path.basename(target))
        _replace_in(fd, os.path.basename(target), payload, None if st is None else stat.S_IMODE(st.st_mode),
                    shown=target)
    finally:
        os.close(fd)


def _replace_in(dir_fd: int, name: str, payload: bytes, mode: Optional[int], shown: str) -> None:
    """Replace the entry ``name`` of the directory ``dir_fd`` by a regular file holding
    ``payload``, atomically (a temporary, fsynced, renamed over it; the directory fsynced after):
    the one atomic write of the project, by :func:`write_output` and :func:`write_inside`."""
    tmp = temporary_name(name)
    created = False
    try:
        fd = _open_new(tmp, 0o666, dir_fd=dir_fd)
        created = True          # only a temporary this call created is ever removed
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        if created:
            _unlink_quietly(tmp, dir_fd)
        if isinstance(exc, OSError):
            raise disk_full(exc, shown, len(payload)) from None
        raise
    try:                        # the rename itself durable (best effort: not every system allows it)
        os.fsync(dir_fd)
    except OSError:
        pass


def _clean_in(dir_fd: int, name: Optional[str] = None, older_than_s: float = 3600.0) -> list:
    """Remove, from the directory ``dir_fd``, the temporaries a writer killed between writing and
    renaming left (of the file ``name`` only, if given): only the project's own (a name with a
    valid mark, :func:`is_own_temporary`), a plain file of this user with one link (never a link,
    a directory, a device, another user's file or a second name of some other file), older than
    ``older_than_s`` (a live writer's are younger).  Returns the entries removed."""
    removed = []
    try:
        entries = [e for e in os.listdir(dir_fd) if e.startswith(TEMP_PREFIX) and is_own_temporary(e, name)]
    except OSError:
        return removed
    for entry in entries:
        try:
            st = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
            if (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()
                    and time.time() - st.st_mtime > older_than_s):
                os.unlink(entry, dir_fd=dir_fd)
                removed.append(entry)
        except OSError:
            pass
    return removed


def clean_stale_temporaries(directory, older_than_s: float = 3600.0) -> list:
    """:func:`_clean_in` of ``directory``, opened without following a link at its last component
    (a symbolic link there is cleaned of nothing).  Returns the paths actually removed."""
    try:
        fd = os.open(directory, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
    except OSError:
        return []
    try:
        return [Path(directory) / entry for entry in _clean_in(fd, None, older_than_s)]
    finally:
        os.close(fd)


# --- a folder the command was handed -----------------------------------------------------------
#
# The one link policy: a path named on the command line may be a symbolic link (the user chose
# it; it is followed), but nothing *inside* a folder the command writes (a sweep's --out, a
# report's temporary) is ever reached through a link: each component below the folder is
# opened with O_NOFOLLOW through directory descriptors, so a link there -- made by whoever
# handed the folder over -- is refused, never followed, whatever it points at.

class LinkInside(ValueError):
    """A symbolic link (or another file of the wrong kind) where the command writes or reads its
    own file inside a folder: refused, never followed."""


def _link_message(flag: str, root, relative: str, what: str = "a symbolic link") -> str:
    return (f"{flag} {root}: {relative} is {what}; the command writes its own files there and never follows a "
            f"link (or writes through a special file) inside the folder it was given: remove it, or choose "
            f"another {flag}")


@contextlib.contextmanager
def _parent(root, relative: str, flag: str, create: bool):
    """(descriptor of the directory holding ``relative`` below ``root``, its last name), closed on
    leaving: every component below ``root`` opened with O_NOFOLLOW (a link: :class:`LinkInside`);
    with ``create`` the missing ones are made."""
    parts = [part for part in Path(relative).parts if part not in ("", ".")]
    if not parts or any(part == ".." or "/" in part for part in parts) or Path(relative).is_absolute():
        raise ValueError(f"{relative!r} is not a path inside a folder")
    fd = os.open(os.fspath(root), os.O_RDONLY | _DIRECTORY)
    try:
        for k, part in enumerate(parts[:-1]):
            try:
                child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o777, dir_fd=fd)
                child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    shown = "/".join(parts[:k + 1])
                    kind = "a symbolic link" if os.path.islink(os.path.join(os.fspath(root), shown)) else "not a directory"
                    raise LinkInside(_link_message(flag, root, shown, kind)) from None
                raise
            os.close(fd)
            fd = child
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _check_entry(fd: int, name: str, root, relative: str, flag: str, directory: bool = False) -> Optional[os.stat_result]:
    """The lstat of ``name`` in ``fd`` (None when absent); a symbolic link, or anything but a
    regular file (a directory with ``directory``), is refused."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise LinkInside(_link_message(flag, root, relative))
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        raise LinkInside(_link_message(flag, root, relative, _kind(st.st_mode)))
    return st


def _check_opened(fd: int, root, relative: str, flag: str) -> os.stat_result:
    """The fstat of a file opened inside a folder; anything but a regular file is refused."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise LinkInside(_link_message(flag, root, relative, _kind(st.st_mode)))
    return st


def check_inside(root, relatives, flag: str = "--out", directories=()) -> None:
    """Refuse, before anything is written, a folder whose own entries (``relatives``; those in
    ``directories`` are directories) are symbolic links or files of the wrong kind; absent
    entries are fine (the command makes them)."""
    for relative in list(relatives) + list(directories):
        try:
            with _parent(root, relative, flag, create=False) as (fd, name):
                _check_entry(fd, name, root, relative, flag, directory=relative in directories)
        except FileNotFoundError:
            continue


def make_dirs_inside(root, relative: str, flag: str = "--out") -> None:
    """``root/relative`` as a directory (made where missing), no link followed below ``root``."""
    with _parent(root, os.path.join(relative, "x"), flag, create=True):
        pass


def write_inside(root, relative: str, data, flag: str = "--out") -> None:
    """Write ``data`` atomically to ``root/relative`` (:func:`_replace_in`), reaching it without
    following any link below ``root``; a link or a special file at ``relative`` itself is refused
    (:class:`LinkInside`), never replaced or written through.  A new file gets the umask's
    permissions, a replaced one keeps its own; a full disk raises :class:`DiskFull`.  Stale
    temporaries are not looked for at each write (a folder of 10^5 point files would be listed
    10^5 times): the command cleans the folder once (:func:`clean_stale_temporaries`)."""
    with _parent(root, relative, flag, create=True) as (fd, name):
        st = _check_entry(fd, name, root, relative, flag)
        _replace_in(fd, name, _bytes(data), None if st is None else stat.S_IMODE(st.st_mode),
                    shown=os.path.join(os.fspath(root), relative))


def create_inside(root, relative: str, data, flag: str = "--out") -> None:
    """Create the *new* file ``root/relative`` holding ``data``, no link followed below ``root``
    and none at ``relative`` (O_EXCL: an existing entry of any kind is refused, never replaced):
    the files of a temporary folder this command has just made, whose atomicity is the folder's
    rename -- no per-file temporary and fsync (27 fsyncs cost a report 0.2 s of wall time).  A
    full disk raises :class:`DiskFull` (the partial file removed)."""
    payload = _bytes(data)
    with _parent(root, relative, flag, create=True) as (fd, name):
        try:
            out = _open_new(name, 0o666, dir_fd=fd)
        except FileExistsError:
            raise LinkInside(_link_message(flag, root, relative, "an entry that already exists")) from None
        try:
            with os.fdopen(out, "wb") as fh:
                fh.write(payload)
        except OSError as exc:
            _unlink_quietly(name, fd)
            raise disk_full(exc, os.path.join(os.fspath(root), relative), len(payload)) from None


def append_inside(root, relative: str, text: str, flag: str = "--out") -> None:
    """Append ``text`` (UTF-8) to ``root/relative`` (created if absent), reached without following
    any link (O_NOFOLLOW) and opened without blocking (O_NONBLOCK: a FIFO put in its place fails
    at once); a regular file only.  On a failed or short write the file is cut back to its former
    length: nothing half-written (a log line is whole or absent); a full disk raises
    :class:`DiskFull`."""
    payload, shown = text.encode("utf-8"), os.path.join(os.fspath(root), relative)
    with _parent(root, relative, flag, create=True) as (fd, name):
        try:
            out = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o666,
                          dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR) or os.path.islink(shown):
                raise LinkInside(_link_message(flag, root, relative, "a symbolic link or a special file")) from None
            raise disk_full(exc, shown, len(payload)) from None
    try:
        size = _check_opened(out, root, relative, flag).st_size
        try:
            _write_all(out, payload)
        except OSError as exc:
            try:
                os.ftruncate(out, size)
            except OSError:
                pass
            raise disk_full(exc, shown, len(payload)) from None
    finally:
        os.close(out)


def read_inside(root, relative: str, flag: str, *, max_bytes: Optional[int] = MAX_INPUT_BYTES) -> bytes:
    """The content of the regular file ``root/relative``, reached without following any link
    below ``root`` (a link, FIFO or device: :class:`LinkInside`, unopened or opened without
    blocking), its size checked before reading (more than ``max_bytes``: ValueError, nothing
    read).  FileNotFoundError when absent."""
    shown = os.path.join(os.fspath(root), relative)
    with _parent(root, relative, flag, create=False) as (fd, name):
        try:
            src = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LinkInside(_link_message(flag, root, relative)) from None
            raise
    try:
        _too_big(flag, shown, _check_opened(src, root, relative, flag).st_size, max_bytes, "; it is not read")
        return _read_bounded(src, max_bytes, lambda limit: f"{flag} {shown} grew past the limit of {limit} while being "
                                                           "read; it is not read")
    finally:
        os.close(src)


# --- a full disk -------------------------------------------------------------------------------

EXIT_DISK_FULL = 75
"""The exit status of every command line whose write found the disk full (sysexits' EX_TEMPFAIL:
free some space and run the same command again).  Distinct from 1 (claims failed, reports
differ) and 2 (bad arguments), so that a full disk is never read as a verdict."""

_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class DiskFull(OSError):
    """A write that found no room (ENOSPC, or EDQUOT: over quota).  Its message says how many
    bytes were needed at which path and how many are free; every command line turns it into
    that one line and :data:`EXIT_DISK_FULL` (:func:`command_line`).  What was written before
    is whole: every write of the project is atomic, so the failed one left nothing behind."""

    def __init__(self, path, needed: Optional[int] = None):
        path = os.fspath(path)
        try:                    # bytes free to this user on the file system of the nearest existing folder
            st = os.statvfs(path if os.path.exists(path) else _nearest_existing(path))
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        need = f"{needed:,} bytes needed" if needed is not None else "more space needed"
        room = f" ({free:,} bytes free on its file system)" if free is not None else ""
        super().__init__(errno.ENOSPC, f"disk full: {need} at {path}{room}; free some space and run the same "
                                       "command again (what was written before is kept whole)")
        self.path, self.needed, self.free = path, needed, free

    def __str__(self) -> str:
        return self.strerror


def disk_full(exc: OSError, path, needed: Optional[int] = None) -> OSError:
    """``exc`` as :class:`DiskFull` if it says the disk is full (ENOSPC, EDQUOT), else ``exc``."""
    if isinstance(exc, DiskFull) or getattr(exc, "errno", None) not in _FULL:
        return exc
    return DiskFull(path, needed)



# --- handed data: memory, strict JSON, TOML ------------------------------------------------------

MEMORY_FRACTION = 0.5
"""A reader may build at most half the memory this process can still take (the rest is the
computation's, and the machine's)."""

MAX_DEPTH = 32
"""Nesting of a handed object (a state_dict with its metadata is 6 deep, a checkpoint's trajectory
records 5); every later walk of a deeper one would recurse."""

def memory_available() -> Optional[int]:
    """Bytes this process can still allocate: the least of the machine's available memory
    (``MemAvailable``) and the address space left under ``RLIMIT_AS``; None where neither can be
    read."""
    limits = []
    try:
        with open("/proc/meminfo") as fh:
            limits += [int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        try:
            limits.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as fh:
                used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limits.append(max(soft - used, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else None


def memory_budget() -> Optional[int]:
    """Bytes a reader may build: :data:`MEMORY_FRACTION` of :func:`memory_available` (None where the
    machine does not say)."""
    free = memory_available()
    return None if free is None else int(MEMORY_FRACTION * free)


def check_memory(need: int, what: str) -> None:
    """Refuse, before it is built, ``what`` that would take ``need`` bytes, more than
    :data:`MEMORY_FRACTION` of :func:`memory_available`."""
    free = memory_available()
    if free is not None and need > MEMORY_FRACTION * free:
        raise ValueError(f"{what} would take {need / 2 ** 30:.3g} GiB, more than half the {free / 2 ** 30:.3g} GiB "
                         "this process can still take; it is not built (use a machine with more memory)")


def _refuse_constant(name: str):
    raise ValueError(f"non-strict JSON constant {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond the range of a float (it would be read as infinity)")
    return value


PARSE_FACTOR = 30
"""Memory per byte of a parsed JSON document at worst (``[{}, {}, ...]``: a 64-byte dict and an
8-byte pointer for every 3 bytes; a 190 MB claims.json took 5.2 GB): a reader checks
PARSE_FACTOR x its size against :func:`check_memory` before parsing."""


def parse_json(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, no number that overflows a float (``1e400`` is not read as
    infinity), and a document nested too deep for the parser a ValueError, not a RecursionError."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deep for the parser") from None


def jsonable(obj: Any) -> Any:
    """Convert numpy/torch scalars and arrays, tuples, dataclasses and non-finite floats to plain
    JSON.

    Non-finite floats become the strings ``"nan"``, ``"inf"``, ``"-inf"`` so that the file is
    strict JSON; anything else that is not a number, a string, a sequence or a mapping becomes
    its ``str``."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return jsonable(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float) or hasattr(obj, "__float__"):
        v = float(obj)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    return str(obj)


toml_loads, TOMLDecodeError = _toml.loads, _toml.TOMLDecodeError
"""TOML reading: the standard library's ``tomllib`` (Python >= 3.11), else the ``tomli``
distribution it was taken from (declared for Python < 3.11 in pyproject.toml)."""
