"""What decodes one export request to the rows of the `spans` table: the C walk on the server's threads
(`decode_native`), and a decode worker process's whole job (`decode_request`).

Imported by every spawned worker, so it imports only what the C walk needs (`otlp_columns`). The Python decoder
and pyarrow are imported on the first request the C walk leaves to them (OTLP/JSON, logs, redaction, a span with
a problem): a worker that never meets one stays about 35 MB smaller (`python bench/decode.py`'s last line).
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Literal

from tracejudge.collector.receivers.otlp_columns import NativeColumns, native_columns
from tracejudge.collector.receivers.request_digest import ids_digest
from tracejudge.collector.store.connection.memory_release import release_heap
from tracejudge.collector.worker_process import worker_init

if TYPE_CHECKING:
    from tracejudge.mapping.otlp import SpanProblem
    from tracejudge.mapping.redaction import Redactor

Signal = Literal["traces", "logs"]  # logs: GenAI events, stored as carrier spans
BIG_REQUEST = 4 * 1024 * 1024  # after one this large, a worker hands its freed memory back to the system
# Rows as column buffers (the C walk) or as Arrow IPC bytes of the spans, resources and scopes (the Python decoder),
# the span count, the spans reported as problems, the spans cut to the limits, and the request's digest
# (span_rows.request_digest).
WorkerResult = tuple["NativeColumns | tuple[bytes, bytes, bytes]", int, "list[SpanProblem]", int, bytes]


def decode_native(payload: bytes, content_type: str, limits: tuple[int, ...]) -> WorkerResult | None:
    """The C walk's rows of a protobuf trace request, or None when the Python decoder must take it. Run on the
    server's decode threads (the walk releases the GIL) or in a worker. `limits` is `dataclasses.astuple(SpanLimits)`:
    unpickling the dataclass would import the Python decoder into every worker."""
    native = native_columns(payload, content_type, limits, time.time_ns() // 1000)
    if len(payload) >= BIG_REQUEST:
        release_heap()
    if native is None:
        return None
    return native, native.rows, [], 0, ids_digest(native.ids())


def decode_request(payload: bytes, content_type: str, limits: tuple[int, ...], redactor: Redactor | None = None,
                   signal: Signal = "traces", native: bool = True) -> WorkerResult:
    """Run in a worker (or in the receiver with `decode_workers = 0`): OTLPDecodeError propagates to the caller
    as itself. `native`: try the C walk first (False: it already left this request to Python)."""
    if native and signal == "traces" and redactor is None:
        result = decode_native(payload, content_type, limits)  # which hands a large request's memory back itself
        if result is not None:
            return result
    try:
        from tracejudge.collector.receivers.span_rows import (
            decode_to_ipc,  # the Python decoder: pyarrow, protobuf classes
        )
        return decode_to_ipc(payload, content_type, redactor, signal, limits, time.time_ns() // 1000)
    finally:
        if len(payload) >= BIG_REQUEST:
            _give_memory_back()


def _give_memory_back() -> None:
    """A large request leaves the worker's heap large; collect and ask glibc to return the free pages."""
    gc.collect()
    release_heap()


def decode_worker_start() -> None:
    """A decode worker's start: named here, so spawning one imports this module (the C walk) before its first
    export, not during it."""
    worker_init()
