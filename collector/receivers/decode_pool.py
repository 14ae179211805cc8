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
import contextlib
import multiprocessing
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import astuple, dataclass

from tracejudge.collector.log import Logger
from tracejudge.collector.receivers.decode_worker import (
    Signal,
    WorkerResult,
    decode_native,
    decode_request,
    decode_worker_start,
)
from tracejudge.collector.receivers.otlp_columns import NativeColumns, native_decode_enabled
from tracejudge.collector.receivers.span_rows import columns_to_arrow, rows_from_ipc
from tracejudge.collector.store.span_tables import SpanRows
from tracejudge.collector.worker_process import ready, usable_cpus
from tracejudge.errors import TracejudgeError
from tracejudge.mapping.otlp import DEFAULT_LIMITS, SpanLimits, SpanProblem
from tracejudge.mapping.redaction import Redactor

MAX_TASKS_PER_WORKER = 5000


class DecoderUnavailable(TracejudgeError):
    """A worker died mid-request; the pool was rebuilt and the exporter should retry."""


@dataclass(frozen=True)
class DecodedBatch:
    rows: SpanRows
    spans: int
    problems: list[SpanProblem]
    truncated: int = 0  # spans stored with attributes, events or values cut to the span limits
    digest: bytes | None = None  # the same spans redelivered have the same digest (request_digest.ids_digest)


def _batch(result: WorkerResult) -> DecodedBatch:
    """A worker's answer as the store takes it: Arrow over the C walk's buffers, or read from IPC bytes."""
    rows, count, problems, truncated, digest = result
    tables = columns_to_arrow(rows) if isinstance(rows, NativeColumns) else rows_from_ipc(rows)
    return DecodedBatch(tables, count, problems, truncated, digest)


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
        self._workers_lock = threading.Lock()  # one start or replacement of the worker processes at a time
        self.restarts = 0

    def start(self) -> None:
        if self.threads:
            self._threads = ThreadPoolExecutor(self.threads, thread_name_prefix="tracejudge-decode")
        elif self.workers > 0:  # every request goes to the Python decoder: its processes start now
            self._workers()

    def _workers(self, broken: Executor | None = None) -> Executor:
        """The Python decoder's processes (blocking: run in a thread): started when there are none, replaced when
        `broken` is still the pool in use. The pool is assigned here, not by the caller, so a request cancelled
        while it waits leaves no pool behind; a start that fails leaves none either."""
        with self._workers_lock:
            if self._executor is not None and self._executor is not broken:
                return self._executor  # started or replaced meanwhile by another request
            if broken is not None:
                broken.shutdown(wait=False, cancel_futures=True)
                self._executor = None
                self.restarts += 1
            # a worker is replaced after this many requests, so memory a hostile request left behind is returned
            executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=decode_worker_start, max_tasks_per_child=MAX_TASKS_PER_WORKER)
            try:
                for future in [executor.submit(ready) for _ in range(self.workers)]:
                    future.result()  # start every worker now, not on their first request
            except BaseException:
                executor.shutdown(wait=False, cancel_futures=True)
                raise
            self._executor = executor
        if broken is None and self.threads and self.log is not None:
            self.log.info("decode workers started", workers=self.workers,
                          reason="a request needs the Python decoder (OTLP/JSON, logs, or a span the C walk leaves "
                                 "to it)")
        return executor

    async def decode(self, payload: bytes, content_type: str, signal: Signal = "traces") -> DecodedBatch:
        """The request's spans; OTLPDecodeError for a bad request, DecoderUnavailable when a worker died or the
        workers could not start (the exporter retries)."""
        loop = asyncio.get_running_loop()
        native = self._threads is not None and signal == "traces"
        if native:
            result = await loop.run_in_executor(self._threads, decode_native, payload, content_type, self.limits)
            if result is not None:
                return _batch(result)
        if self.workers == 0:
            return _batch(decode_request(payload, content_type, self.limits, self.redactor, signal, not native))
        executor = self._executor
        if executor is None:  # the first request that needs the Python decoder starts its processes
            try:
                executor = await asyncio.to_thread(self._workers)
            except Exception as exc:
                raise DecoderUnavailable(f"the decode workers could not start ({type(exc).__name__}: {exc}); "
                                         "retry") from exc
        try:
            result = await loop.run_in_executor(
                executor, decode_request, payload, content_type, self.limits, self.redactor, signal, not native)
        except BrokenProcessPool as exc:
            with contextlib.suppress(Exception):  # a replacement that fails leaves none: the next request starts one
                await asyncio.to_thread(self._workers, executor)  # replaced once, however many requests noticed
            raise DecoderUnavailable("a decode worker stopped (out of memory?); it was restarted, retry") from exc
        return _batch(result)

    def stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=False)
            self._executor = None
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
