"""Decode export requests into Arrow tables, in worker processes so decoding uses every core.

Decoding holds the GIL (the C walk briefly, the Python decoder long); the receivers, gRPC's threads and the
DuckDB writer then share one core. Worker processes (spawned, never forked: gRPC does not survive a fork; their
code is `decode_worker`) decode in parallel and hand back column buffers or Arrow IPC bytes, which the writer
appends as they are. With `workers = 0` decoding runs in the receiver's own process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import astuple, dataclass

import pyarrow as pa

from collector.receivers.decode_worker import Signal, WorkerResult, decode_request, ready, worker_init
from collector.receivers.otlp_columns import NativeColumns, native_decode_enabled
from collector.receivers.span_rows import columns_to_arrow
from mapping.otlp import DEFAULT_LIMITS, SpanLimits, SpanProblem
from mapping.redaction import Redactor
from scoring.errors import TracejudgeError

MAX_TASKS_PER_WORKER = 5000


class DecoderUnavailable(TracejudgeError):
    """A worker died mid-request; the pool was rebuilt and the exporter should retry."""


def usable_cpus() -> int:
    """Cores this process may run on (a container's CPU set, not the host's core count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class DecodedBatch:
    table: pa.Table
    spans: int
    problems: list[SpanProblem]
    truncated: int = 0  # spans stored with attributes, events or values cut to the span limits
    digest: bytes | None = None  # the same spans redelivered have the same digest (request_digest.ids_digest)


def _batch(result: WorkerResult) -> DecodedBatch:
    """A worker's answer as the store takes it: Arrow over the C walk's buffers, or read from IPC bytes."""
    rows, count, problems, truncated, digest = result
    table = columns_to_arrow(rows) if isinstance(rows, NativeColumns) else pa.ipc.open_stream(rows).read_all()
    return DecodedBatch(table, count, problems, truncated, digest)


def default_workers(redaction: bool) -> int:
    """One decode worker per core but one, where the C walk decodes (the server's receivers and span writer keep a
    core busy at full speed, and one worker decodes faster than the writer stores); one per core with redaction
    on, where every span goes through the Python decoder (`python bench/ingest.py [--redaction]`)."""
    cores = usable_cpus()
    return cores if redaction or not native_decode_enabled() else max(1, cores - 1)


class DecodePool:
    def __init__(self, workers: int, redactor: Redactor | None = None, limits: SpanLimits = DEFAULT_LIMITS) -> None:
        self.workers = workers
        self.redactor = redactor
        self.limits = astuple(limits)  # a plain tuple: a worker unpickles it without importing the Python decoder
        self._executor: Executor | None = None
        self.restarts = 0

    def start(self) -> None:
        if self.workers > 0:
            self._executor = self._new_executor()

    def _new_executor(self) -> Executor:
        # a worker is replaced after this many requests, so memory a hostile request left behind is returned
        executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=worker_init, max_tasks_per_child=MAX_TASKS_PER_WORKER)
        for future in [executor.submit(ready) for _ in range(self.workers)]:
            future.result()  # start every worker now, not on the first export
        return executor

    async def decode(self, payload: bytes, content_type: str, signal: Signal = "traces") -> DecodedBatch:
        """The request's spans; OTLPDecodeError for a bad request, DecoderUnavailable when a worker died."""
        if self._executor is None:
            return _batch(decode_request(payload, content_type, self.limits, self.redactor, signal))
        loop = asyncio.get_running_loop()
        executor = self._executor
        try:
            result = await loop.run_in_executor(
                executor, decode_request, payload, content_type, self.limits, self.redactor, signal)
        except BrokenProcessPool as exc:
            if self._executor is executor:  # the first to notice replaces the pool; the export is retried
                await asyncio.to_thread(self._replace, executor)
            raise DecoderUnavailable("a decode worker stopped (out of memory?); it was restarted, retry") from exc
        return _batch(result)

    def _replace(self, broken: Executor) -> None:
        """A new pool, then the swap: requests meanwhile are told to retry, never decoded on the receiver's loop."""
        broken.shutdown(wait=False, cancel_futures=True)
        self._executor = self._new_executor()
        self.restarts += 1

    def stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=False)
            self._executor = None
