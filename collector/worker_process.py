"""What every worker process of the collector (decode and assembly) runs at start, the cores they may use, and the
priority of the work that gives way to ingest.

Spawned workers import this before anything else, so it imports nothing of the collector: each pool's worker then
imports only its own job's modules (an assembly worker no protobuf, a decode worker no pyarrow until it needs it).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
import threading
from multiprocessing.process import BaseProcess

# Niceness added to the work that gives way to ingest (the server's assembly thread, the assembly workers): while it
# and ingest both want a core, the receivers, the decode threads and the span writer get it
BELOW_INGEST = 10


def usable_cpus() -> int:
    """Cores this process may run on (a container's CPU set, not the host's core count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def below_ingest() -> int:
    """The niceness of work that gives way to ingest: `BELOW_INGEST` more than the server's main thread's (at most
    19, the lowest; `BELOW_INGEST` where the system has no priorities to read)."""
    try:
        return min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + BELOW_INGEST)
    except (AttributeError, OSError):
        return BELOW_INGEST


def lower_this_thread(niceness: int | None = None) -> bool:
    """Run the calling thread at `niceness` (default `below_ingest()`), never higher than it runs: on Linux niceness
    belongs to each thread, and threads and processes started from it inherit it (elsewhere the same call would
    lower the whole server, so nothing changes there). Whether it did; it never raises (a thread pool's initializer
    that raised would break the pool for good)."""
    if sys.platform != "linux":
        return False
    try:
        target = below_ingest() if niceness is None else niceness
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, max(target, os.getpriority(os.PRIO_PROCESS, thread)))
    except OSError:  # a sandbox that forbids it: the thread runs as it was
        return False
    return True


def exit_with_parent(parent: BaseProcess) -> None:
    """A worker whose collector died (kill -9 leaves no time to stop the pool) exits instead of living on:
    the parent's sentinel pipe reads end-of-file once no process holds its other end."""
    parent.join()
    os._exit(0)


def ready() -> None:
    """Submitted once per worker at start, so every worker exists before the first task."""


def worker_init() -> None:
    gc.set_threshold(100_000, 50, 100)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=exit_with_parent, args=(parent,), name="tracejudge-parent-watch",
                         daemon=True).start()


def start_below_ingest(niceness: int) -> None:
    """A worker that gives way to ingest (`niceness`: the server's `below_ingest()`): its priority set before any
    thread starts (the parent's watch, a library's), since a thread runs at its creator's, then `worker_init`.
    A spawned worker is a process of its own, so outside Linux its niceness is set as a process's."""
    with contextlib.suppress(AttributeError, OSError):  # refused, or no priorities: it runs as it was spawned
        os.setpriority(os.PRIO_PROCESS, 0, max(niceness, os.getpriority(os.PRIO_PROCESS, 0)))
    worker_init()
