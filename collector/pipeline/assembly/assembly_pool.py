"""Build conversations in worker processes, so the server's GIL serves the receivers and the span writer.

Mapping and composing a conversation is pure Python: run in the server, it took the core ingest needs and held
exports up behind it (`python bench/pipeline_pace.py`). The assembler reads a batch's span rows as Arrow (no Python
objects per span in the server), sends them here as a file of their buffers (`span_columns`), and gets back each
conversation as plain data ready to write (`conversation_builder.Built`). Workers are spawned, never forked (gRPC
does not survive a fork), and one that dies is replaced: its batch fails, and its conversations wait another quiet
period and are built again from their stored spans, so nothing is lost. With `workers = 0` the batch is built in the
calling thread.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pyarrow as pa

from tracejudge.collector.pipeline.assembly.assembly_worker import build_from_file, worker_start
from tracejudge.collector.pipeline.assembly.conversation_builder import (
    BatchResult,
    BuildConfig,
    Resources,
    Scopes,
    build_batch,
)
from tracejudge.collector.pipeline.assembly.span_columns import ArrowColumns, write_columns
from tracejudge.collector.worker_process import ready, usable_cpus
from tracejudge.errors import TracejudgeError

BATCH_TIMEOUT_S = 600.0  # a batch not back by then is treated as lost with its worker (a batch takes seconds)


class AssemblyWorkerLost(TracejudgeError):
    """An assembly worker stopped mid-batch (out of memory?); it was replaced, and the batch is built again after
    another quiet period."""


def default_workers() -> int:
    """One process per core (at most 8): they run at a lower priority than the server, so they take the cores
    ingest leaves idle without slowing it; 0 on one core, where they would only take turns with the server."""
    cores = usable_cpus()
    return 0 if cores < 2 else min(8, cores)


SPILL_PREFIX = "tracejudge-assembly-"  # then the server's pid: a directory whose server is gone is removed


def _remove_orphans() -> None:
    """Batch files left by a server that was killed (a clean stop removes its own)."""
    for folder in Path(_spill_root() or tempfile.gettempdir()).glob(f"{SPILL_PREFIX}*-*"):
        pid = folder.name.removeprefix(SPILL_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def _spill_root() -> str | None:
    """Memory-backed where there is one (/dev/shm), else the system's temporary directory."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


class AssemblyPool:
    """Started by the first batch (a collector that only ingests, or sees few conversations, runs none: each
    worker peaked at 58 MB in `python bench/pipeline_pace.py`)."""

    def __init__(self, workers: int, config: BuildConfig, on_start: Callable[[int], None] | None = None) -> None:
        self.workers = workers
        self.config = config
        self.on_start = on_start  # told the number of workers each time a pool starts
        self.restarts = 0
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        # id(future) -> the pool it went to (replaced once) and the file its rows are in
        self._sent_to: dict[int, tuple[ProcessPoolExecutor, Path]] = {}
        self._spill_dir: Path | None = None
        self._spilled = 0

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                # no max_tasks_per_child: on Python 3.11-3.13 a worker retiring with tasks queued may never be
                # replaced (CPython gh-115634), and the assembler always has a batch queued
                executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                               initializer=worker_start)
                try:
                    for future in [executor.submit(ready) for _ in range(self.workers)]:
                        future.result(BATCH_TIMEOUT_S)  # every worker started now, not inside the first batches
                except BaseException:
                    executor.shutdown(wait=False, cancel_futures=True)
                    raise
                self._executor = executor
                if self.on_start is not None:
                    self.on_start(self.workers)
            return self._executor

    def start(self) -> None:
        if self.workers:
            self._pool()

    def submit(self, table: pa.Table, conversations: dict[str, list[str]], scopes: Scopes,
               resources: Resources) -> Future[BatchResult]:
        """Build these conversations from the span rows in `table` (blocking to submit; `result` waits)."""
        if not conversations or self.workers == 0:
            return self._built_here(table, conversations, scopes, resources)
        try:
            path = self._spill(table)
        except OSError:  # no room where batches go (a small /dev/shm), a column it cannot take: built here instead
            return self._built_here(table, conversations, scopes, resources)
        executor = self._pool()
        try:
            future = executor.submit(build_from_file, str(path), conversations, scopes, resources, self.config)
        except BrokenProcessPool:  # a worker died between batches: this one goes to a new pool
            self._replace(executor)
            executor = self._pool()
            future = executor.submit(build_from_file, str(path), conversations, scopes, resources, self.config)
        self._sent_to[id(future)] = (executor, path)
        return future

    def _built_here(self, table: pa.Table, conversations: dict[str, list[str]], scopes: Scopes,
                    resources: Resources) -> Future[BatchResult]:
        """The batch built in the calling thread now, with that thread's CPU for it."""
        started = time.thread_time()
        done: Future[BatchResult] = Future()
        result = build_batch(ArrowColumns(table), conversations, scopes, resources, self.config) if conversations \
            else BatchResult()
        result.cpu_s, result.here = time.thread_time() - started, True
        done.set_result(result)
        return done

    def _spill(self, table: pa.Table) -> Path:
        """The rows as a file of their Arrow buffers (`span_columns`) the worker maps without a copy: sent through
        the pool's pipe, each batch was pickled whole in the server first (+170 MB peak with three batches in
        flight)."""
        with self._lock:
            if self._spill_dir is None:
                _remove_orphans()
                self._spill_dir = Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=_spill_root()))
            self._spilled += 1
            path = self._spill_dir / f"{self._spilled}.columns"
        try:
            write_columns(table, path)
        except (OSError, pa.ArrowException, TypeError) as exc:  # TypeError: a column type the file does not take
            with contextlib.suppress(OSError):
                path.unlink()
            raise OSError(f"the batch file {path} could not be written: {exc}") from exc
        return path

    def result(self, future: Future[BatchResult], conversations: list[str]) -> BatchResult:
        """The batch built; when its worker died, every conversation of it failed (built again later)."""
        executor, path = self._sent_to.pop(id(future), (None, None))
        try:
            return future.result(BATCH_TIMEOUT_S)
        except (BrokenProcessPool, TimeoutError):
            self._replace(executor)
            reason = str(AssemblyWorkerLost("an assembly worker stopped mid-batch; it was replaced"))
            return BatchResult(failed=dict.fromkeys(conversations, reason))
        except Exception as exc:  # noqa: BLE001 - the batch could not be sent or built: retried after a quiet period
            return BatchResult(failed=dict.fromkeys(conversations, f"{type(exc).__name__}: {exc}"))
        finally:
            if path is not None:  # the worker removes it once read; not when it died first
                with contextlib.suppress(OSError):
                    path.unlink()

    def _replace(self, broken: ProcessPoolExecutor | None) -> None:
        """Drop the broken pool (once, however many of its batches noticed); the next batch starts a new one."""
        with self._lock:
            if broken is None or broken is not self._executor:
                return
            self._executor = None
            self.restarts += 1
        broken.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
            spill_dir, self._spill_dir = self._spill_dir, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=False)
        if spill_dir is not None:
            shutil.rmtree(spill_dir, ignore_errors=True)
