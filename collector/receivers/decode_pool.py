"""Decode export requests into Arrow tables on every core.

Protobuf trace requests that the C walk takes (most of them) are decoded on threads in the server: the walk runs
without the GIL, so it uses another core while the receivers and the DuckDB writer run Python, and its column
buffers need no copy between processes. Everything else goes to the Python decoder, which holds the GIL, so it runs
in worker processes (spawned, never forked: gRPC does not survive a fork; their code is `decode_worker`), started
when the first such request comes: OTLP/JSON, logs, redaction, a span with a problem, or the C walk not built.
With `workers = 0` the Python decoder runs in the receiver's own process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import astuple, dataclass

import pyarrow as pa

from collector.log import Logger
from collector.receivers.decode_worker import (
    Signal,
    WorkerResult,
    decode_native,
    decode_request,
    ready,
    worker_init,
)
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
    """Python decoder processes: one per core but one, where the C walk decodes most requests on the server's
    threads (the processes start only when a request needs them, and the server keeps a core busy at full speed);
    one per core with redaction on or without the C walk, where every span goes through the Python decoder
    (`python bench/ingest.py [--redaction]`)."""
    cores = usable_cpus()
    return cores if redaction or not native_decode_enabled() else max(1, cores - 1)


class DecodePool:
    def __init__(self, workers: int, redactor: Redactor | None = None, limits: SpanLimits = DEFAULT_LIMITS,
                 logger: Logger | None = None) -> None:
        self.workers = workers
        self.redactor = redactor
        self.limits = astuple(limits)  # a plain tuple: a worker unpickles it without importing the Python decoder
        self.log = logger
        self.threads = usable_cpus() if redactor is None and native_decode_enabled() else 0  # for the C walk
        self._threads: ThreadPoolExecutor | None = None
        self._executor: Executor | None = None
        self._starting: asyncio.Lock | None = None
        self.restarts = 0

    def start(self) -> None:
        if self.threads:
            self._threads = ThreadPoolExecutor(self.threads, thread_name_prefix="tracejudge-decode")
        elif self.workers > 0:  # every request goes to the Python decoder: its processes start now
            self._executor = self._new_executor()

    def _new_executor(self) -> Executor:
        # a worker is replaced after this many requests, so memory a hostile request left behind is returned
        executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=worker_init, max_tasks_per_child=MAX_TASKS_PER_WORKER)
        for future in [executor.submit(ready) for _ in range(self.workers)]:
            future.result()  # start every worker now, not on their first request
        return executor

    async def decode(self, payload: bytes, content_type: str, signal: Signal = "traces") -> DecodedBatch:
        """The request's spans; OTLPDecodeError for a bad request, DecoderUnavailable when a worker died."""
        loop = asyncio.get_running_loop()
        native = self._threads is not None and signal == "traces"
        if native:
            result = await loop.run_in_executor(self._threads, decode_native, payload, content_type, self.limits)
            if result is not None:
                return _batch(result)
        if self.workers == 0:
            return _batch(decode_request(payload, content_type, self.limits, self.redactor, signal, not native))
        executor = self._executor or await self._start_workers()
        try:
            result = await loop.run_in_executor(
                executor, decode_request, payload, content_type, self.limits, self.redactor, signal, not native)
        except BrokenProcessPool as exc:
            if self._executor is executor:  # the first to notice replaces the pool; the export is retried
                await asyncio.to_thread(self._replace, executor)
            raise DecoderUnavailable("a decode worker stopped (out of memory?); it was restarted, retry") from exc
        return _batch(result)

    async def _start_workers(self) -> Executor:
        """The Python decoder's processes, started by the first request that needs them (once, however many come
        at the same moment)."""
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self._executor is None:
                self._executor = await asyncio.to_thread(self._new_executor)
                if self.log is not None:
                    self.log.info("decode workers started", workers=self.workers,
                                  reason="a request needs the Python decoder (OTLP/JSON, logs, or a span the C walk "
                                         "leaves to it)")
        return self._executor

    def _replace(self, broken: Executor) -> None:
        """A new pool, then the swap: requests meanwhile are told to retry, never decoded on the receiver's loop."""
        broken.shutdown(wait=False, cancel_futures=True)
        self._executor = self._new_executor()
        self.restarts += 1

    def stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=False)
            self._executor = None
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
