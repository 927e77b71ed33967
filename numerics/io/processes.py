"""Processes: a worker that dies with the command that started it, one BLAS thread per worker
process, and a command run as its own process group under a timeout (killed whole when it runs
past it)."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Optional

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


