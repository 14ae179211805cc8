"""The durable span store: one DuckDB file, one writer thread, group commit, Arrow appends.

Receivers hand decoded spans to `write()` and await it; the writer takes everything queued (up to
`max_batch_spans`), appends it as one Arrow table in one transaction, and only then resolves every
waiting request. So an export is acknowledged only once its spans are committed, many requests share
one commit, and redelivered spans (same trace_id, span_id) are ignored by the primary key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from collector.schema import migrate
from mapping.conversation_key import resource_conversation_key, span_own_conversation_key
from mapping.spans import Span
from scoring.errors import TracejudgeError

_SCHEMA = pa.schema([
    ("trace_id", pa.string()), ("span_id", pa.string()), ("parent_span_id", pa.string()), ("name", pa.string()),
    ("kind", pa.int8()), ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("status_code", pa.int8()),
    ("status_message", pa.string()), ("service_name", pa.string()), ("scope_name", pa.string()),
    ("scope_version", pa.string()), ("attributes", pa.string()), ("resource_attributes", pa.string()),
    ("events", pa.string()), ("links", pa.string()), ("conversation_key", pa.string()),
    ("conversation_key_source", pa.string()), ("received_at", pa.timestamp("us", tz="UTC")),
])
MAX_INT64 = 2**63 - 1


class StoreError(TracejudgeError):
    """The store cannot open or write; exporters get a retryable answer and nothing acknowledged is lost."""


class StoreOpenError(StoreError):
    pass


class Backpressure(StoreError):
    """Too many spans wait for a commit: the exporter should retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=str)


def to_json(value: Any) -> str:
    """Strict JSON DuckDB's JSON type accepts: NaN and Infinity as strings, lone surrogates as U+FFFD."""
    try:
        text = _ENCODER.encode(value)
    except ValueError:
        text = _ENCODER.encode(_finite(value))
    return _text(text)


def _text(value: str) -> str:
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")


def _clamp(ns: int) -> int:
    return min(max(ns, 0), MAX_INT64)


def spans_to_arrow(spans: list[Span], received_at: datetime) -> pa.Table:
    """Columns of the spans table; one row per (trace_id, span_id), the last delivery winning in a batch."""
    unique = {s.key: s for s in spans}
    columns: dict[str, list[Any]] = {name: [] for name in _SCHEMA.names}
    resources: dict[int, tuple[str, tuple[str, str] | None]] = {}  # spans of one request share their resource
    c_trace, c_span, c_parent = columns["trace_id"], columns["span_id"], columns["parent_span_id"]
    c_name, c_kind, c_start, c_end = columns["name"], columns["kind"], columns["start_ns"], columns["end_ns"]
    c_code, c_message, c_service = columns["status_code"], columns["status_message"], columns["service_name"]
    c_scope, c_version, c_attrs = columns["scope_name"], columns["scope_version"], columns["attributes"]
    c_resource, c_events, c_links = columns["resource_attributes"], columns["events"], columns["links"]
    c_key, c_source = columns["conversation_key"], columns["conversation_key_source"]
    for s in unique.values():
        cached = resources.get(id(s.resource))
        if cached is None:
            cached = resources[id(s.resource)] = (to_json(s.resource), resource_conversation_key(s.resource))
        resource_json, resource_key = cached
        key = span_own_conversation_key(s) or resource_key
        c_trace.append(s.trace_id)
        c_span.append(s.span_id)
        c_parent.append(s.parent_span_id)
        c_name.append(_text(s.name))
        c_kind.append(s.kind if -128 <= s.kind <= 127 else 0)
        c_start.append(_clamp(s.start_ns))
        c_end.append(_clamp(s.end_ns))
        c_code.append(s.status_code if -128 <= s.status_code <= 127 else 0)
        c_message.append(_text(s.status_message))
        service = s.resource.get("service.name")
        c_service.append(_text(service) if isinstance(service, str) else None)
        c_scope.append(_text(s.scope_name))
        c_version.append(_text(s.scope_version))
        c_attrs.append(to_json(s.attributes))
        c_resource.append(resource_json)
        c_events.append(to_json([{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes}
                                 for e in s.events]) if s.events else "[]")
        c_links.append(to_json([{"trace_id": lk.trace_id, "span_id": lk.span_id, "attributes": lk.attributes}
                                for lk in s.links]) if s.links else "[]")
        c_key.append(_text(key[1]) if key else None)
        c_source.append(key[0] if key else None)
    columns["received_at"] = [received_at] * len(unique)
    return pa.table(columns, schema=_SCHEMA)


@dataclass
class _Pending:
    table: pa.Table
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]


@dataclass
class StoreStats:
    commits: int = 0
    spans_committed: int = 0
    last_commit_s: float = 0.0
    last_error: str | None = None


class SpanStore:
    def __init__(self, path: Path, *, max_batch_spans: int = 50_000, max_queue_spans: int = 500_000,
                 retry_after_s: int = 1, on_commit: Callable[[float, int], None] | None = None,
                 memory_limit: str | None = None) -> None:
        self.path = path
        self.memory_limit = memory_limit
        self.on_commit = on_commit
        self.listeners: list[Callable[[pa.Table], None]] = []  # told of every committed table (writer thread)
        self.max_batch_spans = max_batch_spans
        self.max_queue_spans = max_queue_spans
        self.retry_after_s = retry_after_s
        self.stats = StoreStats()
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._queued_spans = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self.healthy = False

    @property
    def queued_spans(self) -> int:
        return self._queued_spans

    @property
    def saturated(self) -> bool:
        return self._queued_spans >= self.max_queue_spans

    def open(self) -> None:
        """Open (or create and migrate) the file and start the writer; StoreOpenError says why not."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._con = duckdb.connect(str(self.path))
        except (duckdb.Error, OSError) as exc:
            raise StoreOpenError(f"cannot open the database file {self.path}: {exc}") from exc
        migrate(self._con)
        # Fewer, larger checkpoints: each one stalls the writer, and at ingest rates the 16 MB default WAL
        # fills several times a second.
        self._con.execute("SET checkpoint_threshold = '256MB'")
        if self.memory_limit:
            try:
                self._con.execute("SET memory_limit = ?", [self.memory_limit])
            except duckdb.Error as exc:
                self._con.close()
                self._con = None
                raise StoreOpenError(f"[store] memory_limit = {self.memory_limit!r} is not a size DuckDB accepts "
                                     f"(like '1GB' or '512MB'): {exc}") from exc
        lock_down(self._con)
        self.healthy = True
        self._thread = threading.Thread(target=self._run, name="tracejudge-span-writer", daemon=True)
        self._thread.start()

    async def write(self, table: pa.Table) -> int:
        """Return once the rows (from `spans_to_arrow`) are committed; Backpressure or StoreError otherwise."""
        rows = table.num_rows
        if not rows:
            return 0
        with self._lock:
            if self._queued_spans + rows > self.max_queue_spans and self._queued_spans > 0:
                raise Backpressure(f"{self._queued_spans} spans are waiting for the database; retry shortly",
                                   self.retry_after_s)
            self._queued_spans += rows
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._queue.put(_Pending(table, loop, future))
        return await future

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of this database for another thread (the pipeline, the admin API)."""
        assert self._con is not None, "open() the store first"
        return self._con.cursor()

    def close(self) -> None:
        """Commit everything queued, then stop the writer and close the file."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._con is not None:
            self._con.close()
            self._con = None

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", ".wal"):
            path = Path(str(self.path) + suffix)
            if path.exists():
                total += path.stat().st_size
        return total

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            batch, count = [first], first.table.num_rows
            while count < self.max_batch_spans:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
                count += item.table.num_rows
            self._commit(batch, count)

    def _commit(self, batch: list[_Pending], count: int) -> None:
        if len(batch) == 1:
            self._commit_group(batch, count, answer_failure=True)
        elif not self._commit_group(batch, count, answer_failure=False):
            for pending in batch:  # one request's bad data must not fail the others it was grouped with
                self._commit_group([pending], pending.table.num_rows, answer_failure=True)

    def _commit_group(self, batch: list[_Pending], count: int, answer_failure: bool) -> bool:
        """Commit the batch in one transaction and answer its requests; on failure answer them only if asked."""
        assert self._con is not None
        started = time.perf_counter()
        error: BaseException | None = None
        table = pa.concat_tables([p.table for p in batch]) if len(batch) > 1 else batch[0].table
        try:
            self._con.execute("BEGIN TRANSACTION")
            self._con.register("incoming_spans", table)
            try:
                self._con.execute("INSERT OR IGNORE INTO spans SELECT * FROM incoming_spans")
            finally:
                self._con.unregister("incoming_spans")
            self._con.execute("COMMIT")
        except Exception as exc:
            error = exc
            with contextlib.suppress(duckdb.Error):
                self._con.execute("ROLLBACK")
        elapsed = time.perf_counter() - started
        if error is not None and not answer_failure:
            return False
        with self._lock:
            self._queued_spans -= count
        if error is None:
            self.healthy = True
            self.stats.commits += 1
            self.stats.spans_committed += count
            self.stats.last_commit_s = elapsed
            if self.on_commit is not None:
                self.on_commit(elapsed, count)
            for listener in self.listeners:
                with contextlib.suppress(Exception):  # a listener must never fail a commit already made
                    listener(table)
        else:
            self.stats.last_error = f"{type(error).__name__}: {error}"
            self.healthy = False
        for pending in batch:
            outcome: Any = (StoreError(f"the span store could not commit ({self.stats.last_error}); "
                                       "the export was not acknowledged and can be retried")
                            if error is not None else pending.table.num_rows)
            if not pending.loop.is_closed():
                # the receiver's loop may close while we commit; then nothing is waiting any more
                with contextlib.suppress(RuntimeError):
                    pending.loop.call_soon_threadsafe(_resolve, pending.future, outcome)
        return error is None


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """No file access from SQL (read_csv('/etc/...') in a query) and no settings changes afterwards."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _resolve(future: asyncio.Future[int], outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
