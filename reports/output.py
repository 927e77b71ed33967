"""Where a report goes: ``--out DIR`` checked before any claim runs, then written whole or not at all.

The policy (the project's one output-path policy, ``numerics.io.files.check_output_dir``, plus
what replacing a *directory* needs): DIR may be new, an empty directory, or a previous report
of this command (it carries :data:`REPORT_MARKER` and nothing but what a report holds).  A
symlinked DIR is followed; a symlink loop or a dangling symlink is refused.  A directory that
holds anything else (a sweep's ``points/``, a thesis) or an input of the command is refused,
never deleted.  Whether DIR can be written at all (an immutable or read-only directory, an
unwritable parent) is probed by creating and removing a file, before any compute.

Writing: the report is written into a temporary directory beside DIR (same filesystem), checked,
then swapped in: a previous report is renamed away, the new one renamed to DIR, the old one
deleted; an empty directory the user made is filled in place (it is never deleted).  The new
directory gets the permissions the umask gives (``mkdtemp`` makes 0700).  Every file inside the
temporary is written without following a link (``numerics.io.files.write_inside``).  A build
killed between the two renames leaves ``.DIR.old-<token>``; a killed write leaves
``.DIR.tmp-<pid>-<token>``: the next build repairs both (:func:`recover_leftovers`) and says
what it did only when it did it -- and only to directories whose marker, written by the build,
holds the token of their name (:data:`REPORT_MARKER`): a directory that merely looks like a
leftover, with a user's files in it, is never deleted.

What a report may hold is what its marker lists: the build writes, after the report's files, each
file's name and size into the marker (:func:`marker_files`); a previous report is replaced only if
it holds exactly those files, as regular files, and every one of them and its folders can be
written (read-only ones stay, so the replaced report could not be deleted whole).  A user's
folder or file under a report's name (``claims.json/``, ``figures/mine.png``) is refused, never
deleted.  Commands writing the same DIR take turns (``numerics.io.files.folder_lock`` on the folder
that holds it, for each check, repair and swap): the last to finish leaves its report, whole, and
none writes beside DIR; should DIR hold something foreign by the time a report is ready, the
report is not written (one line, exit 2) and nothing is deleted.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import uuid
from glob import escape as glob_escape
from pathlib import Path
from typing import Iterable, Optional, TextIO

from reports.schema import BadArguments
from numerics.io.files import FolderBusy, create_inside, folder_lock, make_directories, read_inside, write_inside

REPORT_MARKER = ".icl-audit-report"
"""The file that makes a directory this command's report.  It is written first, into the build's
temporary, and holds the build's pid and a random token that is also in the temporary's name
(``.DIR.tmp-<pid>-<token>``) and, once the report is replaced, in the name it is moved to
(``.DIR.old-<token>``): only a directory whose marker holds the token of its own name is ever
deleted or restored by :func:`recover_leftovers` -- a user's directory that merely has such a
name, or a copy of a report under another name, is left alone."""
MARKER_TEXT = "written by python -m reports.build\n"
FIGURE_DIR = "figures"
# A temporary directory of a build that is no longer running: its pid is in its name
# (``.DIR.tmp-<pid>-<random>``); one without a pid (older builds) counts as stale after this.
STALE_TMP_SECONDS = 3600.0


@contextlib.contextmanager
def _locked(folder: Path, shown, stream: Optional[TextIO] = None, flag: str = "--out"):
    """``numerics.io.files.folder_lock`` of the folder that holds a report; waiting too long is
    :class:`BadArguments` (one line, exit 2)."""
    try:
        with folder_lock(folder, flag, shown, stream):
            yield
    except FolderBusy as exc:
        raise BadArguments(str(exc)) from None


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _report_files(out: Path) -> tuple[list, list]:
    """(files, others) of a report folder, by ``lstat`` (no link followed): each regular file as
    (relative name, size), from its top level and its ``figures/`` folder; every other entry (a
    link, a folder, a device; ``figures`` itself when it is not a real folder) by name."""
    files, others = [], []
    for name in sorted(os.listdir(out)):
        st = os.lstat(out / name)
        if name == FIGURE_DIR and stat.S_ISDIR(st.st_mode):
            for inner in sorted(os.listdir(out / name)):
                ist = os.lstat(out / name / inner)
                (files.append((f"{name}/{inner}", ist.st_size)) if stat.S_ISREG(ist.st_mode)
                 else others.append(f"{name}/{inner}"))
        elif stat.S_ISREG(st.st_mode):
            files.append((name, st.st_size))
        else:
            others.append(name)
    return files, others


def foreign_entries(out: Path) -> list[str]:
    """What in a previous report folder this command did not write (empty: safe to replace):
    every entry but the regular files its marker lists with their sizes (:func:`marker_files`;
    a report whose marker lists none: ``claims.json``, ``index.html`` and ``figures/*.png``) and
    the marker itself -- a link, a folder or a file under a report's name included."""
    listed = marker_files(out)
    files, foreign = _report_files(out)
    for name, size in files:
        if name == REPORT_MARKER:
            continue
        ours = (listed.get(name) == size if listed is not None else
                name in ("claims.json", "index.html") or (name.startswith(FIGURE_DIR + "/") and name.endswith(".png")))
        if not ours:
            foreign.append(name if listed is None or name not in listed else f"{name} (changed since it was written)")
    return foreign


def read_only_entries(out: Path) -> list[str]:
    """What in a previous report folder cannot be written (a read-only or immutable file or
    folder): replacing the report would leave it behind, so it is refused instead."""
    files, _ = _report_files(out)
    folders = [FIGURE_DIR] if (out / FIGURE_DIR).is_dir() and not (out / FIGURE_DIR).is_symlink() else []
    return [name for name in folders + [f for f, _ in files] if not os.access(out / name, os.W_OK)]


def _replace_problem(out: Path, flag: str, shown) -> Optional[str]:
    """Why the previous report ``out`` cannot be replaced (None: it can)."""
    try:
        foreign = foreign_entries(out)
    except OSError as exc:
        return (f"{flag} {shown}: a previous report whose folders cannot be listed ({exc.strerror or exc}); "
                f"choose another {flag}")
    if foreign:
        return (f"{flag} {shown} is a previous report that also holds {foreign[:5]}, which this command did not "
                f"write; replacing it would delete them. Move them or choose another {flag}")
    locked = read_only_entries(out)
    if locked:
        return (f"{flag} {shown} is a previous report whose {locked[:5]} cannot be written (read-only); replacing it "
                f"would leave them behind. Make it writable (chmod -R u+w) or choose another {flag}")
    return None


def check_out_dir(path: str, flag: str = "--out", inputs: Iterable[str] = ()) -> Path:
    """The absolute report directory of ``path`` (a symlink followed), or :class:`BadArguments`
    saying why it cannot be written or replaced: the project's policy
    (``numerics.io.files.check_output_dir``: a file, a link loop or dangling link, an unwritable
    place, a non-empty directory without the marker, an input) and what replacing a report
    directory adds: a previous report that also holds files this command did not write (a sweep
    stored in it) and a directory that holds an input are refused, never deleted."""
    from numerics.io.files import check_output_dir

    inputs = [Path(p).resolve() for p in inputs]
    try:
        parent = Path(os.path.realpath(os.fspath(path))).parent
    except (TypeError, ValueError):             # not a path, or a NUL in it: check_output_dir says so
        parent = None
    try:
        with _locked(parent, path, flag=flag):   # another command's probe or swap is never seen half-done
            out = Path(check_output_dir(path, flag, marker=REPORT_MARKER, inputs=tuple(inputs),
                                        replaced=True)).absolute()
            problem = _replace_problem(out, flag, path) if out.is_dir() and os.listdir(out) else None
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    for source in inputs:
        if out in source.parents:
            raise BadArguments(f"{flag} {path} holds {source}, an input of this command; replacing it would "
                               f"delete that input. Choose another {flag}")
    if problem:
        raise BadArguments(problem)
    return out


def write_tree(out: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` ({relative path: bytes}) into the temporary directory ``out`` (its marker is
    already there, :func:`new_temporary`), each a new file through the project's link policy
    (``numerics.io.files.create_inside``: nothing below ``out`` reached through a link, nothing
    existing replaced; a full disk is ``DiskFull``); the caller checks the tree, then puts it in
    place with :func:`replace_with` (the rename of the whole directory is what makes it atomic)."""
    for name, data in files.items():
        create_inside(out, name, data, "--out")
    write_inside(out, REPORT_MARKER, marker_text(marker_token(out), files={n: len(d) for n, d in files.items()}),
                 "--out")


def marker_text(token: str, pid: Optional[int] = None, files: Optional[dict] = None) -> str:
    """The content of a report's marker: who wrote it, the build's pid, the report's token and,
    once written, its files (``file SIZE NAME``, one a line)."""
    listed = "".join(f"file {size} {name}\n" for name, size in sorted((files or {}).items()))
    return f"{MARKER_TEXT}pid {os.getpid() if pid is None else pid}\ntoken {token}\n{listed}"


def _marker_lines(directory: Path) -> Optional[list]:
    try:
        text = read_inside(directory, REPORT_MARKER, "--out", max_bytes=1 << 20).decode("utf-8")
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return text.splitlines() if text.startswith(MARKER_TEXT) else None


def marker_files(directory: Path) -> Optional[dict]:
    """{relative name: size} of the files the marker of ``directory`` lists (None: no marker, or
    one that lists none -- a report written before markers listed their files)."""
    lines = _marker_lines(directory) or []
    listed = {}
    for line in lines:
        parts = line.split(" ", 2)
        if parts[0] == "file" and len(parts) == 3 and parts[1].isdigit():
            listed[parts[2]] = int(parts[1])
    return listed or None


def marker_token(directory: Path) -> Optional[str]:
    """The token in the marker of ``directory`` (None: no marker, a link, not this command's, or an
    older report's marker without one); read without following a link, at most 1 MiB."""
    tokens = [line[len("token "):] for line in _marker_lines(directory) or () if line.startswith("token ")]
    return tokens[0] if len(tokens) == 1 and re.fullmatch(r"[A-Za-z0-9_]{6,64}", tokens[0]) else None


def new_temporary(out: Path) -> Path:
    """A new temporary directory beside ``out``, ``.OUT.tmp-<pid>-<token>``, with the report's
    marker (holding the same pid and token) written into it first."""
    make_directories(out.parent)
    prefix = f".{out.name}.tmp-{os.getpid()}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp's 0700 would become the report's permissions
        write_inside(tmp, REPORT_MARKER, marker_text(tmp.name[len(prefix):]), "--out")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def replace_with(tmp: Path, out: Path, stream: Optional[TextIO] = None) -> Path:
    """Put the finished report ``tmp`` at ``out``; returns ``out``.  ``out`` absent: renamed there;
    an empty directory: filled in place (marker first); a previous report: swapped (the old one
    deleted after).  Done holding the lock of the folder that holds ``out``
    (``numerics.io.files.folder_lock``): another command writing ``out`` waits.  Should ``out`` hold
    something this command did not write, or cannot write, by now (it changed while the claims
    ran), nothing is deleted and nothing written beside it: :class:`BadArguments`, one line (the
    caller removes ``tmp``)."""
    stream = sys.stderr if stream is None else stream
    with _locked(out.parent, out, stream):
        if not out.exists():
            os.rename(tmp, out)
            return out
        names = os.listdir(out)
        problem = (None if not names else _replace_problem(out, "--out", out) if REPORT_MARKER in names else
                   f"--out {out} now holds {sorted(names)[:5]}, which this command did not write")
        if problem:
            raise BadArguments(f"{problem} (it changed while the command ran); the report was not written")
        if not names:
            for name in [REPORT_MARKER] + sorted(set(os.listdir(tmp)) - {REPORT_MARKER}):
                os.rename(tmp / name, out / name)
            os.rmdir(tmp)
            return out
        # a fresh token in the previous report's marker, then the same token in the name it is moved to:
        # what recover_leftovers needs to know it for this command's own, should this command be killed
        token = uuid.uuid4().hex[:12]
        write_inside(out, REPORT_MARKER, marker_text(token, files=marker_files(out)), "--out")
        old = out.parent / f".{out.name}.old-{token}"
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)  # put the previous report back before reporting the failure
            raise
        _remove(old, "the replaced report", stream, quiet=True)
    return out


def _remove(path: Path, what: str, stream: TextIO, quiet: bool = False) -> Optional[str]:
    """Delete ``path``; the message says whether it is really gone."""
    try:
        shutil.rmtree(path)
    except OSError as exc:
        if not os.path.lexists(path):   # gone all the same (removed by another command meanwhile)
            return None if quiet else f"cleaned: removed {path.name}, {what}"
        message = f"warning: could not remove {path.name}, {what} ({exc.strerror or exc}); remove it by hand"
        print(message, file=stream, flush=True)
        return message
    return None if quiet else f"cleaned: removed {path.name}, {what}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def own_leftover(path: Path, kind: str) -> bool:
    """Whether ``path`` (beside the report) is a leftover of this command: a real directory (not a
    link), whose marker holds the token of its own name (``.OUT.tmp-<pid>-<token>``,
    ``.OUT.old-<token>``); an ``old`` one must also hold nothing but what a report holds.  A
    user's directory that only looks like one is never touched."""
    if path.is_symlink() or not path.is_dir():
        return False
    token = marker_token(path)
    if token is None:
        return False
    suffix = path.name.rsplit(f".{kind}-", 1)[-1]
    name_token = suffix.split("-", 1)[1] if kind == "tmp" and "-" in suffix else suffix
    if name_token != token:
        return False
    if kind == "old":
        try:
            return not foreign_entries(path)
        except OSError:
            return False
    return True


def recover_leftovers(out: Path, stream: Optional[TextIO] = None) -> list[str]:
    """Repair what a killed build left beside ``out`` (returns the messages, also printed on
    ``stream``): no ``out`` but a stranded ``.out.old-*`` report -> the newest is renamed back;
    ``.out.old-*`` reports beside an existing ``out`` -> removed; ``.out.tmp-*`` directories of
    builds no longer running -> removed.  Only this command's own leftovers are touched
    (:func:`own_leftover`: the marker written by the build holds the token of the directory's
    name); "cleaned" is said only of what is gone."""
    stream = sys.stderr if stream is None else stream  # the current stderr, not the one at import
    out = Path(out).absolute()
    if not out.parent.is_dir():
        return []
    with _locked(out.parent, out, stream):     # never while another command swaps its report
        messages = _recover(out, stream)
    for message in messages:
        print(message, file=stream, flush=True)
    return messages


def _recover(out: Path, stream: TextIO) -> list[str]:
    parent, messages = out.parent, []
    olds = sorted((p for p in parent.glob(f"{glob_escape('.' + out.name)}.old-*") if own_leftover(p, "old")),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    if olds and not out.exists() and not out.is_symlink():
        os.rename(olds[0], out)
        messages.append(f"recovered: {out} was missing (a build was killed while swapping reports); "
                        f"restored the previous report from {olds[0].name}")
        olds = olds[1:]
    for old in olds:
        message = _remove(old, "a replaced report a killed build left behind", stream)
        if message and message.startswith("cleaned"):
            messages.append(message)
    now = time.time()
    for tmp in parent.glob(f"{glob_escape('.' + out.name)}.tmp-*"):
        if not own_leftover(tmp, "tmp"):
            continue
        pid_text = tmp.name[len(f".{out.name}.tmp-"):].split("-", 1)[0]
        if pid_text.isdigit():
            stale = int(pid_text) != os.getpid() and not _pid_alive(int(pid_text))
        else:
            stale = now - tmp.stat().st_mtime > STALE_TMP_SECONDS
        if stale:
            message = _remove(tmp, "the unfinished output of a killed build", stream)
            if message and message.startswith("cleaned"):
                messages.append(message)
    return messages
