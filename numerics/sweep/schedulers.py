"""Where the points run: serially in the client, in a local process pool, or on Dask (a
``LocalCluster`` or any running scheduler: Slurm, PBS, Kubernetes, ... through dask-jobqueue /
dask-kubernetes, with no change here).

Each scheduler hands every finished point to the client's :class:`~numerics.sweep.store.Sink`,
which stores it at once. What each does when a worker process dies is in its docstring.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import re
import traceback
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from typing import Optional

import torch

from numerics.io import die_with_parent
from numerics.sweep.execute import execute_point
from numerics.sweep.store import Item, Sink


def _mp_context():
    # forkserver: workers fork from a clean single-threaded server that imported torch once
    # (cheaper to replace a dead worker; no fork of a process with live OpenMP threads).
    # spawn where forkserver does not exist (Windows).
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        # torch only: the project's modules are imported by each worker when it unpickles
        # its first point, from the files then on disk, which its code version hashes
        ctx.set_forkserver_preload(["torch"])
        return ctx
    return multiprocessing.get_context("spawn")


def run_serial(items: list[Item], fn, code: str, sink: Sink) -> None:
    """One point after the other in this process (the default point function sets one torch
    thread; the client's setting is restored afterwards)."""
    threads = torch.get_num_threads()
    try:
        for item in items:
            sink.record(item, execute_point(item.point, fn, code))
    finally:
        torch.set_num_threads(threads)


def run_pool(items: list[Item], fn, code: str, workers: int, retries: int, sink: Sink) -> None:
    """A process pool that survives the death of its workers.

    At most ``workers`` points are in flight, so each is running. When a worker dies the
    pool is broken and every in-flight future fails with ``BrokenProcessPool``; the culprit
    is unknown, so each of those points is rerun *alone* ("suspect"), uncharged. A point that
    kills its worker while alone is charged one death and, within ``retries``, rerun alone
    again; beyond, it is recorded as failed. Each worker exits when the client dies
    (:func:`numerics.io.die_with_parent`: a worker waits on the pool's call queue,
    whose write end it holds itself, so without it a SIGKILLed client would leave its workers
    behind for good, ~220 MB each)."""
    ctx = _mp_context()
    client = os.getpid()

    def new_pool() -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=die_with_parent,
                                      initargs=(client,))

    pending = deque(items)
    suspects: deque[Item] = deque()
    inflight: dict[cf.Future, Item] = {}
    pool = new_pool()
    try:
        while pending or suspects or inflight:
            source = suspects if suspects else pending
            room = (0 if inflight else 1) if suspects else workers - len(inflight)
            batch = [source.popleft() for _ in range(min(len(source), room))]
            for n, item in enumerate(batch):
                try:
                    inflight[pool.submit(execute_point, item.point, fn, code)] = item
                except BrokenProcessPool:  # a worker died while idle: nobody to blame, start afresh
                    source.extendleft(reversed(batch[n:]))
                    break
            if not inflight:
                pool.shutdown(wait=True, cancel_futures=True)
                pool = new_pool()
                continue
            done, _ = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
            broken: list[Item] = []
            if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                cf.wait(inflight)  # the others of a broken pool fail at once too
                done = set(inflight)
            for f in done:
                item = inflight.pop(f)
                exc = f.exception()
                if isinstance(exc, BrokenProcessPool):
                    broken.append(item)
                elif exc is not None:  # e.g. the point function cannot be pickled
                    sink.record(item, {"result": None, "error": f"{type(exc).__name__}: {exc}",
                                       "traceback": "".join(traceback.format_exception(exc)),
                                       "worker": None, "wall_seconds": None})
                else:
                    sink.record(item, f.result())
            if broken:
                pool.shutdown(wait=True, cancel_futures=True)
                pool = new_pool()
                if len(broken) == 1:
                    item = broken[0]
                    item.deaths += 1
                    sink.died(broken, charged=True)
                    if item.deaths > retries:
                        sink.record(item, sink.death_failure(item, f"{item.deaths} times"))
                    else:
                        suspects.append(item)
                else:
                    sink.died(broken, charged=False)
                    suspects.extend(broken)
    except BaseException:
        # interrupted (Ctrl-C, SIGTERM): stop the points in flight now rather than let the
        # interpreter wait for them at exit; the executor has no public way to (before 3.14)
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_dask(items: list[Item], fn, code: str, scheduler: str, workers: Optional[int], retries: int,
              sink: Sink) -> None:
    """On Dask the scheduler resubmits a task whose worker died, up to its
    ``distributed.scheduler.allowed-failures`` times, then fails it with ``KilledWorker``.
    For ``local`` we set that to ``retries`` (and worker-saturation 1.0, so no task waits
    queued on a worker and only the running one is blamed for its death); a remote
    scheduler keeps its own setting."""
    require_dask(scheduler)
    import dask
    import distributed
    from distributed import Client, LocalCluster, as_completed

    cluster = None
    if scheduler == "local":
        with dask.config.set({"distributed.scheduler.allowed-failures": retries,
                              "distributed.scheduler.worker-saturation": 1.0}):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout="30s")
        except OSError as exc:
            raise RuntimeError(f"cannot reach the Dask scheduler at {scheduler!r}: {exc}") from None
    futures: dict = {}
    try:
        futures = {client.submit(execute_point, item.point, fn, code, key=f"sweep-point-{item.id}-{sink.run_token}",
                                 pure=False): item for item in items}
        for future in as_completed(futures):
            item = futures[future]
            if future.status == "finished":
                sink.record(item, future.result())
                future.release()
                continue
            exc = future.exception() if future.status == "error" else RuntimeError(
                f"the Dask future ended as {future.status!r} (scheduler restarted or task cancelled)")
            if isinstance(exc, distributed.KilledWorker):
                allowed = exc.args[2] if len(exc.args) > 2 and isinstance(exc.args[2], int) else retries
                item.deaths = allowed + 1
                sink.record(item, sink.death_failure(item, f"on {allowed + 1} Dask workers (KilledWorker)", allowed))
            else:
                sink.record(item, {"result": None, "error": f"{type(exc).__name__}: {exc}", "traceback": None,
                                   "worker": None, "wall_seconds": None})
            future.release()
    except BaseException:
        client.cancel(list(futures))  # a remote cluster would otherwise go on computing them
        raise
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def require_dask(scheduler: str) -> None:
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        raise RuntimeError(f"scheduler={scheduler!r} needs dask.distributed, an optional extra: "
                           f"pip install -e .[dask] (or run with no scheduler: a local process pool)") from None


def check_scheduler(scheduler: Optional[str]) -> str:
    if scheduler is None or scheduler == "pool":
        return "pool"
    if not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be None, 'serial', 'local' or a Dask address, got {scheduler!r}")
    if scheduler in ("serial", "local"):
        return scheduler
    if re.fullmatch(r"(tcp|tls|inproc|ucx|ws|wss)://\S+|[\w.\-\[\]:]+:\d+", scheduler):
        return scheduler
    raise ValueError(f"unknown scheduler {scheduler!r}: use none (a local process pool), 'serial' (in this "
                     f"process), 'local' (a Dask LocalCluster) or a Dask scheduler address such as "
                     f"tcp://10.0.0.1:8786")
