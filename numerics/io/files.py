"""Input files, output paths and the one atomic writer: a bad path is refused before any
computation, with one line that says what is wrong and how to fix it; a file is written whole
or not at all (a temporary in the same directory, fsynced, renamed over the target), and a
folder the command was handed is never left through a symbolic link."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any, Optional

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


def free_bytes(path) -> Optional[int]:
    """Bytes available to this user on the file system of ``path`` (its nearest existing
    ancestor); None where it cannot be known."""
    try:
        st = os.statvfs(path if os.path.exists(path) else _nearest_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class DiskFull(OSError):
    """A write that found no room (ENOSPC, or EDQUOT: over quota).  Its message says how many
    bytes were needed at which path and how many are free; every command line turns it into
    that one line and :data:`EXIT_DISK_FULL` (:func:`command_line`).  What was written before
    is whole: every write of the project is atomic, so the failed one left nothing behind."""

    def __init__(self, path, needed: Optional[int] = None, free: Optional[int] = None):
        path = os.fspath(path)
        free = free_bytes(path) if free is None else free
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



def write_json_atomic(path, obj: Any, allow_nan: bool = False) -> None:
    """``obj`` as indented JSON, written by :func:`write_output`. ``allow_nan=False`` (strict
    JSON) raises on a non-finite float instead of writing the non-standard ``NaN``."""
    write_output(path, json.dumps(obj, indent=1, allow_nan=allow_nan) + "\n")
