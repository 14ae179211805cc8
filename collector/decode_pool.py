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
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

from collector.span_store import spans_to_arrow
from mapping.otlp import SpanProblem, decode_otlp


@dataclass(frozen=True)
class DecodedBatch:
    table: pa.Table
    spans: int
    problems: list[SpanProblem]


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def decode_request(payload: bytes, content_type: str) -> tuple[bytes, int, list[SpanProblem]]:
    """Run in a worker: OTLPDecodeError propagates to the caller as itself."""
    decoded = decode_otlp(payload, content_type)
    table = spans_to_arrow(decoded.spans, datetime.now(UTC))
    return _to_ipc(table), table.num_rows, decoded.problems


def _worker_init() -> None:
    gc.set_threshold(100_000, 50, 100)


class DecodePool:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._executor: Executor | None = None

    def start(self) -> None:
        if self.workers > 0:
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_worker_init)
            for future in [self._executor.submit(_worker_init) for _ in range(self.workers)]:
                future.result()  # start every worker now, not on the first export

    async def decode(self, payload: bytes, content_type: str) -> DecodedBatch:
        if self._executor is None:
            decoded = decode_otlp(payload, content_type)
            table = spans_to_arrow(decoded.spans, datetime.now(UTC))
            return DecodedBatch(table, table.num_rows, decoded.problems)
        loop = asyncio.get_running_loop()
        data, rows, problems = await loop.run_in_executor(self._executor, decode_request, payload, content_type)
        return DecodedBatch(_from_ipc(data), rows, problems)

    def stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=False)
            self._executor = None
