"""Processes: a worker that dies with the command that started it, and a command run as its
own process group under a timeout (killed whole when it runs past it)."""
from __future__ import annotations

import os
import time
from typing import Optional

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


def run_in_own_group(command: list, *, timeout: float, **popen):
    """Run ``command`` (``subprocess.Popen`` keywords in ``popen``) as the leader of a new
    process group and wait at most ``timeout`` seconds: the finished ``CompletedProcess``, or
    ``subprocess.TimeoutExpired`` after the *whole group* -- the command and every worker it
    started -- was killed (SIGKILL), so a timed-out build leaves nothing computing."""
    import signal
    import subprocess

    proc = subprocess.Popen(command, start_new_session=True, **popen)

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group()
        try:   # a process that left the group may hold the pipes: do not wait on it for ever
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            out, err = None, None
        raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err) from None
    except BaseException:
        kill_group()
        proc.wait()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


