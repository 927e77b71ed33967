"""Input checks shared by the theory modules: clear errors that say what is wrong and how
to fix it."""
from __future__ import annotations

import argparse
import errno
from glob import escape as glob_escape
import math
import numbers
import os
import re
import stat
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import numpy as np


def check_tasks(tasks) -> tuple[int, ...]:
    """Return ``tasks`` as a tuple of positive ints, or raise ValueError/TypeError."""
    if isinstance(tasks, (str, bytes)) or not hasattr(tasks, "__iter__"):
        raise TypeError(f"tasks must be a sequence of positive integers (block sizes r_i), got {tasks!r}")
    out = []
    for r in tasks:
        if isinstance(r, bool) or not isinstance(r, numbers.Integral):
            if not isinstance(r, bool) and isinstance(r, numbers.Real) and float(r).is_integer():
                r = int(r)
            else:
                raise TypeError(f"tasks must contain positive integers (block sizes r_i), got {r!r} in {tuple(tasks)!r}")
        if r < 1:
            raise ValueError(f"every block size r_i must be >= 1, got {tuple(tasks)!r}")
        out.append(int(r))
    if not out:
        raise ValueError("tasks must contain at least one block size (m >= 1), got an empty sequence")
    return tuple(out)


def check_positive_int(name: str, value) -> int:
    """``value`` as a positive int (an integral float such as 3.0 is accepted; a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(float(value))
                and float(value).is_integer()):
            value = int(value)
        else:
            raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def check_L(L) -> float:
    """Context length: a positive finite number (the expansion accepts non-integer L)."""
    if isinstance(L, bool) or not isinstance(L, numbers.Real):
        raise TypeError(f"L (context length) must be a positive number, got {L!r}")
    if not math.isfinite(float(L)) or L <= 0:
        raise ValueError(f"L (context length) must be positive and finite, got {L}")
    return float(L)


def check_sigma(sigma) -> float:
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real):
        raise TypeError(f"sigma (label noise std) must be a number >= 0, got {sigma!r}")
    if not math.isfinite(float(sigma)) or sigma < 0:
        raise ValueError(f"sigma (label noise std) must be finite and >= 0, got {sigma}")
    return float(sigma)


def check_finite_array(name: str, a, shape=None, ndim=None) -> np.ndarray:
    try:
        arr = np.asarray(a, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a numeric array, got {type(a).__name__}: {exc}") from None
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    if shape is not None and arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite entries; pass finite values")
    return arr


def check_omega_mu(omega, mu, tasks) -> tuple[np.ndarray, np.ndarray]:
    """omega, mu as (H, m) float arrays matching tasks (a 1-D array is one head)."""
    m = len(tasks)
    om = check_finite_array("omega", omega)
    mu_ = check_finite_array("mu", mu)
    if om.ndim == 1:
        om = om[None, :]
    if mu_.ndim == 1:
        mu_ = mu_[None, :]
    if om.ndim != 2 or om.shape[1] != m:
        raise ValueError(f"omega must have shape (H, m) with m = {m} tasks, got {om.shape}")
    if mu_.shape != om.shape:
        raise ValueError(f"mu must have the same shape as omega {om.shape}, got {mu_.shape}")
    if om.shape[0] < 1:
        raise ValueError("omega must have at least one head (H >= 1)")
    return om, mu_


# --- the command lines' options and files (numerics.train, theory, tools.bench, tools.sweep,
# reports) -- one policy, checked before any computation, so that a bad option or path costs
# nothing and leaves nothing behind.  Every message names the flag, says what is wrong and
# how to fix it.

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


def seed_option(flag: str = "--seed"):
    """argparse ``type=`` of a seed: an integer in 0 .. 2^64 - 1."""
    return int_option(flag, 0, SEED_MAX, "seeds are 64-bit unsigned integers")


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
        st = os.stat(text)
    except OSError as exc:
        if os.path.islink(text):
            raise ValueError(f"{flag} {text}: a symbolic link that leads nowhere ({_strerror(exc)}); fix the link "
                             "or give the file itself") from None
        raise ValueError(f"{flag} {text}: no such file ({_strerror(exc)}); check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{flag} {text} is a directory, not a file; give the file itself")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{flag} {text} is not a regular file ({_kind(st.st_mode)}): reading it could block for "
                         "ever; give a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise ValueError(f"{flag} {text} is {st.st_size / 2 ** 20:.1f} MiB, more than the limit of "
                         f"{max_bytes / 2 ** 20:.0f} MiB for this kind of file (they are a few kB); give the right "
                         "file")
    if not os.access(text, os.R_OK):
        raise ValueError(f"{flag} {text} cannot be read (permission denied); check its permissions")
    return Path(text)


def read_input_bytes(path, flag: str, *, max_bytes: Optional[int] = MAX_INPUT_BYTES) -> bytes:
    """The content of an input file checked by :func:`check_input_file`, opened without
    blocking (``O_NONBLOCK``: a FIFO swapped in after the check cannot hang the read) and
    read to at most ``max_bytes``."""
    checked = check_input_file(path, flag, max_bytes=max_bytes)
    try:
        fd = os.open(checked, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ValueError(f"{flag} {checked}: cannot be read ({_strerror(exc)})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{flag} {checked} is not a regular file; give a regular file")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise ValueError(f"{flag} {checked} grew past the limit of {max_bytes / 2 ** 20:.0f} MiB while "
                                 "being read; give the right file")
        return b"".join(chunks)
    finally:
        os.close(fd)


# --- output paths -------------------------------------------------------------------------------

TEMP_PREFIX = ".icl-tmp-"
"""Name prefix of the temporaries of :func:`write_output`: a writer killed between writing and
renaming (SIGKILL) leaves at most one such file, which :func:`clean_stale_temporaries` removes."""


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


def _resolve_link(text: str, flag: str) -> str:
    """The target of a path that may be a symbolic link: followed to the end; a loop or a
    link leading nowhere is refused (nothing could be written through it)."""
    try:
        os.stat(text)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{flag} {text} is a symbolic link loop (it never reaches a file); remove the link or "
                             f"choose another {flag}") from None
        if os.path.islink(text):
            raise ValueError(f"{flag} {text} is a symbolic link to {os.readlink(text)!r}, which does not exist "
                             f"(a dangling link); fix or remove the link, or choose another {flag}") from None
        if exc.errno == errno.ENOTDIR:
            existing = os.path.dirname(os.path.abspath(text))
            while existing and existing != os.path.dirname(existing) and not os.path.isfile(existing):
                existing = os.path.dirname(existing)
            raise ValueError(f"{flag} {text}: {existing} is a file, not a directory; choose another path") from None
        if exc.errno not in (errno.ENOENT,):
            raise ValueError(f"{flag} {text}: cannot be used ({_strerror(exc)}); choose another {flag}") from None
    return os.path.realpath(text)


def _probe_dir(flag: str, text: str, directory: str) -> None:
    """Create and remove a file in ``directory``: the only sure test that it is writable
    (permission bits say nothing for root, a read-only mount or /proc)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=TEMP_PREFIX + "probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{flag} {text}: cannot write in {directory} ({_strerror(exc)}); choose a writable "
                         "location") from None


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


def check_output_path(path, flag: str, *, inputs=(), previous_marker=None) -> Path:
    """Check, before any computation, that the output *file* ``path`` of option ``flag`` can
    be written, and return the path to write (symbolic links followed).

    Accepted: a new file in an existing writable directory; an existing regular file (a
    symbolic link to one is followed: its target is written, the link kept); an existing
    character device such as /dev/null, which :func:`write_output` writes *through*, never
    replaces.  With ``previous_marker`` (str or bytes), an existing regular file is accepted
    only if its first 64 KiB contain the marker: the command's own previous output.

    Refused with a ValueError naming ``flag`` and saying how to fix it: a directory; a FIFO,
    socket or block device; a dangling symbolic link or a link loop; a missing or unwritable
    parent directory; a file that cannot be written; a path that is (after following links)
    any of ``inputs`` -- inputs are never overwritten by outputs.  Creates nothing."""
    text = _path_text(path, flag)
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
        if previous_marker is not None:
            marker = previous_marker.encode() if isinstance(previous_marker, str) else bytes(previous_marker)
            try:
                with open(target, "rb") as fh:
                    head = fh.read(65536)
            except OSError as exc:
                raise ValueError(f"{flag} {text}: cannot be read ({_strerror(exc)})") from None
            if marker not in head:
                raise ValueError(f"{flag} {text} exists and is not an output of this command; it is not replaced: "
                                 f"remove it or choose another {flag}")
    parent = os.path.dirname(target) or "."
    try:
        pst = os.stat(parent)
    except OSError:
        # the nearest existing ancestor says whether the missing directory is a typo or a file
        existing = parent
        while existing and not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        if existing and os.path.exists(existing) and not os.path.isdir(existing):
            raise ValueError(f"{flag} {text}: {existing} is a file, not a directory; choose another path") from None
        raise ValueError(f"{flag} {text}: the directory {parent} does not exist; create it first or choose an "
                         "existing directory") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise ValueError(f"{flag} {text}: {parent} is a file, not a directory; choose another path")
    _probe_dir(flag, text, parent)
    return Path(target)


def check_output_dir(path, flag: str, *, marker: str, inputs=()) -> Path:
    """Check, before any computation, that ``path`` can be the output *directory* of option
    ``flag``; returns it (symbolic links followed).

    Accepted: a new directory (missing parents are created by the writer; the nearest existing
    one must be writable), an empty existing directory, or the command's own previous output,
    recognised by the file ``marker`` inside it.  Refused with a ValueError naming ``flag``:
    a file, a symbolic link loop or dangling link, an unwritable location, a directory that
    holds a sweep (``points/``) or anything else that is not this command's output (it could
    be deleted or mixed with), and a directory that is one of ``inputs``.  A command never
    deletes a directory it did not create: only its own previous output may be replaced."""
    text = _path_text(path, flag)
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
        return Path(target)
    existing = os.path.dirname(target)
    while existing and not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    existing = existing or "."
    if not os.path.isdir(existing):
        raise ValueError(f"{flag} {text}: {existing} is a file where a directory is expected; choose another {flag}")
    _probe_dir(flag, text, existing)
    return Path(target)


def write_output(path, data) -> None:
    """Write ``data`` (str: UTF-8, or bytes) to the output ``path`` that
    :func:`check_output_path` accepted.

    A character device (/dev/null) is opened and written through, never replaced.  Anything
    else is written atomically: a temporary ``.icl-tmp-*`` in the target's directory (links
    followed), flushed and fsynced, then ``os.replace``-d onto the target, so a reader or a
    process killed at any instant sees the old content or the whole new one.  The file keeps
    an existing file's permission bits, or gets the umask's default (0666 & ~umask) when new.
    On any exception the temporary is removed; a SIGKILL leaves at most one temporary, which
    :func:`clean_stale_temporaries` removes later."""
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    text = os.fspath(path)
    target = os.path.realpath(text)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISCHR(st.st_mode):
        with open(target, "wb", buffering=0) as fh:
            fh.write(payload)
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{text} is {_kind(st.st_mode)}, not a regular file: not written")
    directory = os.path.dirname(target) or "."
    _clean_own(directory, os.path.basename(target))
    tmp = os.path.join(directory, f"{TEMP_PREFIX}{os.path.basename(target)}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        # mode 0666 through open(): the kernel applies the umask, as for any new file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        with os.fdopen(fd, "wb") as fh:
            if st is not None:
                os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:                        # the rename itself durable (best effort: not every system allows it)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _clean_own(directory: str, name: str, older_than_s: float = 3600.0) -> None:
    """Remove the stale temporaries of earlier writes of this very file (a writer killed by
    SIGKILL between writing and renaming): ``.icl-tmp-NAME.*`` older than an hour."""
    now = time.time()
    for tmp in Path(directory).glob(f"{glob_escape(TEMP_PREFIX + name)}.*"):
        try:
            st = tmp.lstat()
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > older_than_s:
                tmp.unlink()
        except OSError:
            pass


def clean_stale_temporaries(directory, older_than_s: float = 3600.0) -> list:
    """Remove the temporaries (``.icl-tmp-*``, and the older ``.*.tmp``) that a writer killed
    between writing and renaming left in ``directory``, if older than ``older_than_s`` (a
    live writer's are younger).  Returns the paths actually removed."""
    removed = []
    now = time.time()
    d = Path(directory)
    if not d.is_dir():
        return removed
    for tmp in list(d.glob(TEMP_PREFIX + "*")) + list(d.glob(".*.tmp")):
        try:
            st = tmp.lstat()
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > older_than_s:
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            pass
    return removed
