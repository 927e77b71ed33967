"""The command line itself: what no single option can cause, handled once for every
``main(argv)`` of the project."""
from __future__ import annotations

import os

from numerics.io.files import _FULL, EXIT_DISK_FULL, DiskFull

DELETED_CWD = ("error: the current directory no longer exists (it was deleted or moved away); cd to an existing "
               "directory and run the command again")


def refuse_a_deleted_cwd_at_startup() -> None:
    """Called first by the packages whose command lines import torch (``numerics``): while
    ``python -m`` imports the package (``sys.argv[0] == "-m"``), a working directory that no longer
    exists would make torch's import abort ("Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so")
    before any command line could say what is wrong; this says it and exits 2.  A library import
    (any other ``sys.argv``) is left alone."""
    import sys

    if sys.argv[:1] != ["-m"]:
        return
    _exit_if_the_cwd_is_gone()


def _exit_if_the_cwd_is_gone() -> None:
    """Say :data:`DELETED_CWD` and exit 2 if the working directory no longer exists."""
    import sys

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
        _exit_if_the_cwd_is_gone()
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
