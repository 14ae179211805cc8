"""Decode export requests into Arrow tables, in worker processes so decoding uses every core.

Decoding (protobuf or JSON to Python values to JSON columns) is pure-Python work that holds the GIL; the
receivers, gRPC's threads and the DuckDB writer then share one core. Worker processes (spawned, never
forked: gRPC does not survive a fork) do it in parallel and hand back Arrow IPC bytes, which the writer
appends as they are. With `workers = 0` decoding runs in the receiver's own process.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import threading
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.process import BaseProcess
from typing import Literal

import pyarrow as pa

from collector.receivers.otlp_columns import protobuf_table
from collector.receivers.span_rows import request_digest, spans_to_arrow
from collector.store.memory_release import release_heap
from mapping.otlp import DEFAULT_LIMITS, SpanLimits, SpanProblem, decode_otlp
from mapping.otlp_logs import decode_otlp_logs
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
    digest: bytes | None = None  # the same spans redelivered have the same digest (span_rows.request_digest)


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


Signal = Literal["traces", "logs"]  # logs: GenAI events, stored as carrier spans
BIG_REQUEST = 4 * 1024 * 1024  # after one this large, a worker hands its freed memory back to the system


def _decode_to_arrow(payload: bytes, content_type: str, redactor: Redactor | None, signal: Signal = "traces",
                     limits: SpanLimits = DEFAULT_LIMITS) -> tuple[pa.Table, list[SpanProblem], int]:
    received_at = datetime.now(UTC)
    if signal == "traces" and redactor is None:
        table = protobuf_table(payload, content_type, limits, received_at)
        if table is not None:
            return table, [], 0
    decoded = decode_otlp(payload, content_type, limits) if signal == "traces" else \
        decode_otlp_logs(payload, content_type)
    spans = redactor.spans(decoded.spans) if redactor is not None else decoded.spans
    return spans_to_arrow(spans, received_at), decoded.problems, decoded.truncated


def decode_request(payload: bytes, content_type: str, redactor: Redactor | None = None, signal: Signal = "traces",
                   limits: SpanLimits = DEFAULT_LIMITS) -> tuple[bytes, int, list[SpanProblem], int, bytes]:
    """Run in a worker: OTLPDecodeError propagates to the caller as itself."""
    try:
        table, problems, truncated = _decode_to_arrow(payload, content_type, redactor, signal, limits)
        return _to_ipc(table), table.num_rows, problems, truncated, request_digest(table)
    finally:
        if len(payload) >= BIG_REQUEST:
            _give_memory_back()


def _give_memory_back() -> None:
    """A large request leaves the worker's heap large; collect and ask glibc to return the free pages."""
    gc.collect()
    release_heap()


def _exit_with_parent(parent: BaseProcess) -> None:
    """A worker whose collector died (kill -9 leaves no time to stop the pool) exits instead of living on:
    the parent's sentinel pipe reads end-of-file once no process holds its other end."""
    parent.join()
    os._exit(0)


def _ready() -> None:
    """Submitted once per worker at start, so every worker exists before the first export."""


def _worker_init() -> None:
    gc.set_threshold(100_000, 50, 100)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent,), name="tracejudge-parent-watch",
                         daemon=True).start()


class DecodePool:
    def __init__(self, workers: int, redactor: Redactor | None = None, limits: SpanLimits = DEFAULT_LIMITS) -> None:
        self.workers = workers
        self.redactor = redactor
        self.limits = limits
        self._executor: Executor | None = None
        self.restarts = 0

    def start(self) -> None:
        if self.workers > 0:
            self._executor = self._new_executor()

    def _new_executor(self) -> Executor:
        # a worker is replaced after this many requests, so memory a hostile request left behind is returned
        executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_worker_init, max_tasks_per_child=MAX_TASKS_PER_WORKER)
        for future in [executor.submit(_ready) for _ in range(self.workers)]:
            future.result()  # start every worker now, not on the first export
        return executor

    async def decode(self, payload: bytes, content_type: str, signal: Signal = "traces") -> DecodedBatch:
        """The request's spans; OTLPDecodeError for a bad request, DecoderUnavailable when a worker died."""
        if self._executor is None:
            table, problems, truncated = _decode_to_arrow(payload, content_type, self.redactor, signal, self.limits)
            return DecodedBatch(table, table.num_rows, problems, truncated, request_digest(table))
        loop = asyncio.get_running_loop()
        executor = self._executor
        try:
            data, rows, problems, truncated, digest = await loop.run_in_executor(
                executor, decode_request, payload, content_type, self.redactor, signal, self.limits)
        except BrokenProcessPool as exc:
            if self._executor is executor:  # the first to notice replaces the pool; the export is retried
                await asyncio.to_thread(self._replace, executor)
            raise DecoderUnavailable("a decode worker stopped (out of memory?); it was restarted, retry") from exc
        return DecodedBatch(_from_ipc(data), rows, problems, truncated, digest)

    def _replace(self, broken: Executor) -> None:
        """A new pool, then the swap: requests meanwhile are told to retry, never decoded on the receiver's loop."""
        broken.shutdown(wait=False, cancel_futures=True)
        self._executor = self._new_executor()
        self.restarts += 1

    def stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=False)
            self._executor = None
