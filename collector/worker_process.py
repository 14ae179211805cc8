"""What every worker process of the collector (decode and assembly) runs at start, and the cores they may use.

Spawned workers import this before anything else, so it imports nothing of the collector: each pool's worker then
imports only its own job's modules (an assembly worker no protobuf, a decode worker no pyarrow until it needs it).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import threading
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

ORPHAN_CHECK_S = 1.0  # how often a plain worker looks whether its collector is still its parent


def usable_cpus() -> int:
    """Cores this process may run on (a container's CPU set, not the host's core count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def exit_with_parent(parent: BaseProcess) -> None:
    """A worker whose collector died (kill -9 leaves no time to stop the pool) exits instead of living on:
    the parent's sentinel pipe reads end-of-file once no process holds its other end."""
    parent.join()
    os._exit(0)


def exit_when_orphaned(parent_pid: int) -> None:
    """The same for a worker started as a plain process (the assembly workers): once its collector is gone it is
    re-parented, so its parent's pid changes."""
    while os.getppid() == parent_pid:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(0)


def ready() -> None:
    """Submitted once per worker at start, so every worker exists before the first task."""


def worker_init() -> None:
    """Every worker's start: fewer collections of its short-lived objects, and an exit when its collector dies."""
    gc.set_threshold(100_000, 50, 100)
    parent = multiprocessing.parent_process()
    watch, on = (exit_with_parent, parent) if parent is not None else (exit_when_orphaned, os.getppid())
    threading.Thread(target=watch, args=(on,), name="tracejudge-parent-watch", daemon=True).start()


def start_below(niceness: int) -> None:
    """A worker's start `niceness` below its collector: this thread, the threads its imports started before it
    (pyarrow's jemalloc purger), and, lowered before it starts one, every thread it starts from then on (Linux:
    niceness is a thread's own, and a new thread takes its starter's). Never raises: a pool whose initializer raised
    would build nothing, for good."""
    with contextlib.suppress(OSError, AttributeError):  # a sandbox refusing it, a system without it: as it is
        lowered = os.nice(niceness)
        tasks = Path("/proc/self/task")
        for thread in tasks.iterdir() if tasks.is_dir() else ():
            with contextlib.suppress(OSError):  # one that ended meanwhile
                os.setpriority(os.PRIO_PROCESS, int(thread.name), lowered)
    worker_init()
