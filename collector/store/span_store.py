"""The durable span store: one DuckDB file, one writer thread, group commit, Arrow appends.

Receivers hand decoded spans to `write()` and await it; the writer takes everything queued (up to
`max_batch_spans`), appends it as one Arrow table in one transaction, and then resolves every
waiting request. So an export is acknowledged once its spans are committed (or journaled, below), and many requests
share one commit.

When a commit runs longer than `journal_after_s` (a checkpoint holds every commit for about a second), the requests
waiting on it are written to the ingest journal beside the file, synced, and acknowledged there instead
(`ingest_journal`); they are committed as usual, and replayed at the next start if the process dies first.

A redelivered request (an exporter retrying an export whose answer it never got) is recognised by the digest
of its span ids, recorded in `ingest_requests` in the same transaction as its spans, for `DEDUP_WINDOW_S`: it
is acknowledged and not stored again. `spans` has no primary key; its index made every append slower as the
table grew. Spans sent again inside a different request are stored again, and the assembler reads each span
once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import importlib.abc
import importlib.util
import queue
import shutil
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import duckdb
import pyarrow as pa

from tracejudge.collector.sizes import parse_size
from tracejudge.collector.store.connection.checkpoint_gate import CheckpointGate, GatedCursor
from tracejudge.collector.store.connection.database_file import connect_file
from tracejudge.collector.store.ingest_journal import IngestJournal, JournalError, JournalFile
from tracejudge.collector.store.schema import migrate
from tracejudge.collector.store.span_tables import MAX_KNOWN_IDS, SpanRows
from tracejudge.errors import TracejudgeError

MEMORY_RETRY_PAUSES_S = (0.02, 0.05, 0.1, 0.2, 0.3)  # 0.67 s in all, then the exporter is told to retry
DEDUP_WINDOW_S = 900.0  # longer than the OTLP exporters' retry horizons (the Collector's: 300 s)
# below this much free space the pipeline's writes wait and the span writer keeps what is left for spans
PIPELINE_MIN_FREE_BYTES = 16 * 1024 * 1024  # more than the assembler's largest transaction writes
FREE_SPACE_TTL_S = 1.0
_WAITS = ("; the pipeline goes on by itself once the span writer's commits succeed again: free space where the "
          "database is (GET /readyz says what is wrong)")
PROBE_S = 2.0  # while its last commit failed and no spans come, the writer tries a small commit this often
PARKED_MAX_WAIT_S = 60.0  # the longest wait between two tries of a journal file whose commit failed
# Arrow bytes of journaled requests not committed yet (on disk: their rows are dropped from memory once synced and
# read back for the commit): past it, exports wait for their commit again (a second's checkpoint at 45k spans/s
# journals about 40 MB)
JOURNAL_MAX_BYTES = 256 * 1024 * 1024
# of requests a journal file holds (the copy its write makes in memory); a larger request is never journaled
JOURNAL_FILE_BYTES = 8 * 1024 * 1024
DIGESTS_AT_ONCE = 500  # request digests recorded by one statement


class StoreError(TracejudgeError):
    """The store cannot open or write; exporters get a retryable answer (an acknowledged request is kept in the
    journal until it is committed)."""


class StoreOpenError(StoreError):
    pass


class StoreInvalidated(StoreError):
    """DuckDB invalidated the database after a fatal error (a failed checkpoint or rollback): every statement fails
    from then on, in this process, until the database is opened again."""

    advice = ("restart the collector: every acknowledged span is in the database file, its WAL or the ingest "
              "journal beside it, and is replayed at start, and what the pipeline had in flight is taken up again. "
              "If DuckDB's error says Out of "
              "Memory, raise [store] memory_limit; if it names the disk, free space where the database is")

    def __init__(self, error: str) -> None:
        super().__init__(f"DuckDB invalidated the database after a fatal error ({error}); {self.advice}")
        self.error = error


class Backpressure(StoreError):
    """Too many spans wait for a commit: the exporter should retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _Pending:
    rows: SpanRows | None  # None once journaled: the writer reads them back from the file (`_rows_of`)
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]
    count: int  # spans
    nbytes: int  # Arrow bytes of its rows
    digest: bytes | None = None
    journal: JournalFile | None = None  # the file it was acknowledged from, while its commit was held up
    done: bool = False  # committed, or answered: never journaled after this
    queued_at: float = field(default_factory=time.perf_counter)  # when it was handed to the writer


@dataclass
class _WriterJob:
    """Work that must not interleave with a commit (pruning the resources and scopes no span refers to)."""

    run: Callable[[duckdb.DuckDBPyConnection], Any]
    future: concurrent.futures.Future[Any]


@dataclass
class StoreStats:
    commits: int = 0
    spans_committed: int = 0  # newly stored; redelivered spans are counted apart
    duplicates: int = 0
    last_commit_s: float = 0.0
    last_error: str | None = None
    listener_errors: int = 0  # commits a listener (the assembler) failed to take in
    memory_retries: int = 0  # commits retried because a query held DuckDB's memory
    busy_s: float = 0.0  # seconds the writer spent committing: how hard ingest presses the database
    busy_since: float | None = None  # perf_counter when the commit under way began (None: the writer waits)
    journaled_requests: int = 0  # acknowledged from the journal while their commit was held up
    journaled_spans: int = 0
    journal_errors: int = 0  # journal writes the disk refused (those requests waited for their commit)
    journal_error: str | None = None  # the journal's last problem
    replayed_spans: int = 0  # spans committed from journal files: at start (left by a crash), or parked ones
    assembling_checkpoints: int = 0  # WAL folds made after the assembler's writes (`fold_wal`)
    # requests answered (committed, failed, or acknowledged from the journal) `SLOW_REQUEST_S` or more after they
    # reached the writer: the exports that waited for the database
    requests_slowed: int = 0

    def busy_now(self) -> float:
        """`busy_s` with the commit under way counted so far: a checkpoint's commit takes over a second, and
        counted only once it ended, a second of pressing ingest looked like an idle writer."""
        since = self.busy_since
        return self.busy_s + (time.perf_counter() - since if since is not None else 0.0)


# a request answered this long or longer after it reached the writer was slowed: the assembler pauses for ingest only
# after a pass that slowed one (half of issue 41's 100 ms export bound, the rest for decoding and the network)
SLOW_REQUEST_S = 0.05
FOLD_WAIT_S = 0.5  # how long the assembler's checkpoint waits for the other writers to leave the gate


class SpanStore:
    def __init__(self, path: Path, *, max_batch_spans: int = 50_000, max_queue_spans: int = 500_000,
                 retry_after_s: int = 1, on_commit: Callable[[float, int, int], None] | None = None,
                 memory_limit: str | None = None, temp_limit: str | None = None, threads: int | None = None,
                 checkpoint_threshold: str | None = None, journal_after_s: float | None = None,
                 assembling_checkpoint_threshold: str | None = None) -> None:
        self.path = path
        self.wal_path = Path(str(path) + ".wal")  # DuckDB's write-ahead log beside the file
        # a commit running this long has the requests waiting on it journaled and acknowledged (None: never)
        self.journal_after_s = journal_after_s
        self.journal = IngestJournal.beside(path)
        self.on_journal_error: Callable[[str], None] | None = None  # a journal write failed, or journaled spans
        # WAL size at which a commit checkpoints it (and waits); None: DuckDB's default (16 MiB)
        self.checkpoint_threshold = checkpoint_threshold
        # the WAL size the assembler folds it at after its writes (`fold_wal`; None: only DuckDB's own checkpoints): a
        # read of recent spans beside a large WAL costs twice the CPU on DuckDB 2
        self.assembling_checkpoint_threshold = assembling_checkpoint_threshold
        self._assembling_bytes = parse_size(assembling_checkpoint_threshold) if assembling_checkpoint_threshold \
            else None
        self.threads = threads  # DuckDB's worker threads for this database; None: DuckDB's default (the cores)
        self.memory_limit = memory_limit  # DuckDB's buffer pool, shared by ingest and every query
        self.temp_limit = temp_limit  # what a query may spill to disk
        self.on_commit = on_commit
        self.listeners: list[Callable[[pa.Table], None]] = []  # told of every committed table (writer thread)
        self.on_listener_error: Callable[[Exception], None] | None = None  # a listener failed on a commit
        self.max_batch_spans = max_batch_spans
        self.max_queue_spans = max_queue_spans
        self.refusal: Callable[[], str | None] = lambda: None  # why ingest is refused (the disk budget), if it is
        self.retry_after_s = retry_after_s
        self.stats = StoreStats()
        self._queue: queue.Queue[_Pending | _WriterJob | None] = queue.Queue()
        # ids of the resources and scopes stored, so a commit inserts only new ones (cleared when they are pruned)
        self._known_resources: set[int] = set()
        self._known_scopes: set[int] = set()
        self._queued_spans = 0
        self._unacked: dict[int, _Pending] = {}  # id -> a request not answered yet (the journal's candidates)
        # journal files with a request whose commit failed, committed from the file once the store takes commits
        self._parked: set[Path] = set()
        self._parked_retry_at = 0.0
        self._parked_wait_s = PROBE_S
        self._journaled_bytes = 0  # of the journaled requests not committed yet (`JOURNAL_MAX_BYTES`)
        self._journal_retry_at = 0.0  # after a failed journal write, the journal rests until then
        self._journal_stop = threading.Event()
        self._journal_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.gate = CheckpointGate()  # held by the writer's commits and every cursor()'s writes
        self._thread: threading.Thread | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self._committed: OrderedDict[bytes, float] = OrderedDict()  # request digest -> when (epoch s), oldest first
        self._last_prune = 0.0
        self._closing = False
        self.healthy = False
        self.invalidated: StoreInvalidated | None = None  # set once, by the first FatalException seen
        self.on_invalidated: Callable[[StoreInvalidated], None] | None = None  # told once, from any thread
        self._free_checked: tuple[float, int | None] = (-FREE_SPACE_TTL_S - 1, None)  # (when, bytes free there)

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
            self._con = connect_file(self.path)
        except (duckdb.Error, OSError) as exc:
            raise StoreOpenError(f"cannot open the database file {self.path}: {exc}") from exc
        migrate(self._con)
        # Give memory back to the system after a large query or a failed one: at DuckDB's defaults (flush after
        # a 512 MB bulk free, no background purge) queries stopped by memory_limit left 420 MB held.
        self._con.execute("SET allocator_bulk_deallocation_flush_threshold = '64MB'")
        self._con.execute("SET allocator_flush_threshold = '32MB'")
        self._con.execute("SET allocator_background_threads = true")
        if self.threads:
            # One thread appends a span batch with about 0.6x the CPU of two and no more wall time
            # (`python bench/span_append.py --writer-settings`), CPU the decode workers need on a small machine.
            self._con.execute(f"SET threads = {int(self.threads)}")
        for setting, name, value in (("memory_limit", "memory_limit", self.memory_limit),
                                     ("max_temp_directory_size", "temp_limit", self.temp_limit),
                                     ("checkpoint_threshold", "checkpoint_threshold", self.checkpoint_threshold)):
            if not value:
                continue
            try:
                self._con.execute(f"SET {setting} = ?", [value])
            except duckdb.Error as exc:
                self._con.close()
                self._con = None
                raise StoreOpenError(f"[store] {name} = {value!r} is not a size DuckDB accepts "
                                     f"(like '1GB' or '512MB'): {exc}") from exc
        lock_down(self._con)
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=DEDUP_WINDOW_S)
        recent = self._con.execute("SELECT digest, max(received_at) AS last_at FROM ingest_requests "
                                   "WHERE received_at >= ? GROUP BY digest ORDER BY last_at", [since]).fetchall()
        for digest, at in recent:
            self._committed[bytes(digest)] = at.timestamp()
        try:
            self._replay_journal()
        except StoreError:
            self._con.close()
            self._con = None
            raise
        self.healthy = True
        self._thread = threading.Thread(target=self._run, name="tracejudge-span-writer", daemon=True)
        self._thread.start()
        if self.journal_after_s is not None:
            self._journal_stop.clear()
            self._journal_thread = threading.Thread(target=self._watch_commits, name="tracejudge-ingest-journal",
                                                    daemon=True)
            self._journal_thread.start()

    async def write(self, span_rows: SpanRows, digest: bytes | None = None) -> int:
        """Return once the rows (from `spans_to_arrow`) are committed, known to be (a redelivery of the request
        with this `digest`), or synced to the journal while their commit is held up; Backpressure or StoreError
        otherwise."""
        rows = span_rows.num_rows
        if not rows:
            return 0
        if self.invalidated is not None:  # a new exception each time: a shared one would keep every request's frames
            raise StoreInvalidated(self.invalidated.error)
        refused = self.refusal()
        if refused is not None:
            raise Backpressure(f"not accepting spans: {refused}", self.retry_after_s * 30)
        with self._lock:
            if self._queued_spans + rows > self.max_queue_spans and self._queued_spans > 0:
                raise Backpressure(f"{self._queued_spans} spans are waiting for the database; retry shortly",
                                   self.retry_after_s)
            self._queued_spans += rows
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        pending = _Pending(span_rows, loop, future, rows, span_rows.nbytes, digest)
        with self._lock:
            self._unacked[id(pending)] = pending
        self._queue.put(pending)
        return await future

    def run_in_writer(self, job: Callable[[duckdb.DuckDBPyConnection], Any]) -> concurrent.futures.Future[Any]:
        """Run `job` on the writer's connection between two commits; its future holds the result or the error."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._thread is None or self._closing:
                future.set_exception(StoreError("the span store is closed; the job did not run"))
                return future
            self._queue.put(_WriterJob(job, future))
        return future

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of this database for another thread (the pipeline, the admin API); its writes hold
        `gate`, so retention's checkpoint can wait for a pause in them."""
        assert self._con is not None, "open() the store first"
        return cast(duckdb.DuckDBPyConnection, GatedCursor(self._con.cursor(), self.gate, self.write_refusal,
                                                           self.note_fatal))

    def note_fatal(self, exc: BaseException) -> None:
        """Told of a failed statement: if it was DuckDB's fatal error (from the writer, the pipeline, a checkpoint, a
        query), the database is invalid for this process from now on. The first one is kept and told to
        `on_invalidated`, once; any other error is no concern here."""
        if not isinstance(exc, duckdb.FatalException):
            return
        with self._lock:
            if self.invalidated is not None:
                return
            self.invalidated = StoreInvalidated(str(exc).replace("\n", " "))
        self.healthy = False
        self.stats.last_error = str(self.invalidated)
        if self.on_invalidated is not None:
            with contextlib.suppress(Exception):  # the writer thread must go on answering exports whatever it does
                self.on_invalidated(self.invalidated)

    def write_refusal(self) -> str | None:
        """Why the pipeline's writes must wait, if they must: the span writer's last commit failed (disk full, file
        gone), or less than `PIPELINE_MIN_FREE_BYTES` is free where the file is. Spans keep priority: the writer
        goes on trying them, and probes the store while idle, so the pipeline resumes when they commit again."""
        if self.invalidated is not None:
            return str(self.invalidated)
        if not self.healthy:
            return f"its last commit failed ({self.stats.last_error}){_WAITS}"
        now = time.monotonic()
        if now - self._free_checked[0] > FREE_SPACE_TTL_S:  # statvfs once a second, not per transaction (NFS)
            try:
                self._free_checked = (now, shutil.disk_usage(self.path.parent).free)
            except OSError:
                self._free_checked = (now, None)  # not knowable here: the write itself will say
        free = self._free_checked[1]
        if free is not None and free < PIPELINE_MIN_FREE_BYTES:
            return f"only {free // 1024} KB is free on the database's file system{_WAITS}"
        return None

    def close(self) -> None:
        """Commit everything queued, then stop the writer and close the file (what is journaled and not committed,
        the store failing, stays in the journal for the next start)."""
        if self._thread is not None:
            with self._lock:
                self._closing = True
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._journal_thread is not None:
            self._journal_stop.set()
            self._journal_thread.join()
            self._journal_thread = None
        if self._con is not None:
            self._con.close()
            self._con = None

    def size_bytes(self) -> int:
        total = self.journal.size_bytes()
        for path in (self.path, self.wal_path):
            if path.exists():
                total += path.stat().st_size
        return total

    def _run(self) -> None:
        stopping = False
        while not stopping:
            job: _WriterJob | None = None
            batch: list[_Pending] = []
            if self._parked and self.healthy and time.monotonic() >= self._parked_retry_at:
                with self._busy():
                    self._commit_parked()
            try:  # while the store is at fault or files are parked, idle time goes to probing it and to them
                first = self._queue.get(timeout=None if self.healthy and not self._parked else PROBE_S)
            except queue.Empty:
                if not self.healthy:
                    self.healthy = self._can_commit()
                continue
            if first is None:
                break
            if isinstance(first, _WriterJob):
                job = first
            else:
                batch = [first]
            count = sum(p.count for p in batch)
            while job is None and count < self.max_batch_spans:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                if isinstance(item, _WriterJob):
                    job = item  # after the batch gathered so far
                    break
                batch.append(item)
                count += item.count
            with self._busy():
                if batch:
                    self._commit(batch, count)
                if job is not None:
                    self._run_job(job)
        if self._parked and self.healthy:  # a last try; what fails stays in the journal for the next start
            self._commit_parked()
        while True:  # jobs queued behind the stop are answered, not left waiting
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _WriterJob):
                item.future.set_exception(StoreError("the span store closed before the job ran"))

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        """The writer's work in the block counts as busy (`busy_since` while it runs: the journal's thread and the
        assembler's pacing read it)."""
        started = self.stats.busy_since = time.perf_counter()
        try:
            yield
        finally:  # counted before it is cleared: a reader in between counts it twice, never not at all
            self.stats.busy_s += time.perf_counter() - started
            self.stats.busy_since = None

    def _watch_commits(self) -> None:
        """The journal's thread: while a commit (or a writer job) has run past `journal_after_s`, the requests
        waiting on it are journaled and acknowledged, a round every half of that."""
        assert self.journal_after_s is not None
        after = self.journal_after_s
        while not self._journal_stop.wait(max(after / 2, 0.005)):
            since = self.stats.busy_since
            if since is None or time.perf_counter() - since < after or time.monotonic() < self._journal_retry_at:
                continue
            try:
                self._journal_waiting()
            except Exception as exc:  # noqa: BLE001 - the requests wait for their commit; the thread goes on
                self._journal_failed(exc)

    def _journal_failed(self, exc: BaseException) -> None:
        """A journal write failed: its requests wait for their commit, and the journal rests for `PROBE_S` (a full
        disk is not written to, and logged, every round)."""
        self.stats.journal_errors += 1
        self._journal_retry_at = time.monotonic() + PROBE_S
        self._journal_problem(f"cannot write the ingest journal ({type(exc).__name__}: {exc}); exports wait for "
                              "their commit meanwhile")

    def _journal_waiting(self) -> None:
        """Journal the requests not answered yet (those with a digest, by which a replay knows a committed one),
        sync them, and acknowledge them."""
        if self.invalidated is not None or self._closing:
            return
        while self._journal_some():
            pass

    def _journal_some(self) -> bool:
        """Journal and acknowledge up to `JOURNAL_FILE_BYTES` of the requests waiting, in one file; whether it
        did."""
        with self._lock:
            room = JOURNAL_MAX_BYTES - self._journaled_bytes
            fresh: list[_Pending] = []
            size = 0
            requests: list[tuple[bytes, SpanRows]] = []  # taken under the lock: a commit ending drops the rows
            for pending in self._unacked.values():
                # a request larger than a file waits for its commit: one past DuckDB's buffer pool (a raised
                # [limits] request_row_bytes) must get its retryable failure, not an acknowledgment it never commits
                if pending.journal is None and not pending.done and pending.digest is not None \
                        and pending.rows is not None and pending.nbytes <= JOURNAL_FILE_BYTES:
                    room -= pending.nbytes
                    if room < 0 or (fresh and size + pending.nbytes > JOURNAL_FILE_BYTES):
                        break
                    fresh.append(pending)
                    requests.append((pending.digest, pending.rows))
                    size += pending.nbytes
        if not fresh:
            return False
        path = self.journal.write(requests)
        del requests
        file = JournalFile(path)
        with self._lock:
            for pending in fresh:
                if not pending.done:  # committed meanwhile: it needs no file
                    pending.journal = file
                    file.outstanding.add(id(pending))
                    self._journaled_bytes += pending.nbytes
                    pending.rows = None  # held on disk, not in memory, until its commit (set after `journal`)
            acknowledged = [p for p in fresh if p.journal is file]
            self.stats.requests_slowed += _slowed(acknowledged)
        if not file.outstanding:
            self._remove_journal_file(path)
        self.stats.journaled_requests += len(acknowledged)
        self.stats.journaled_spans += sum(p.count for p in acknowledged)
        for pending in acknowledged:
            _answer(pending, pending.count)
        return True

    def _remove_journal_file(self, path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # replayed at the next start, every request in it skipped as committed
            self._journal_problem(f"cannot remove the ingest journal file {path} ({exc})")

    def _journal_problem(self, message: str) -> None:
        self.stats.journal_error = message
        if self.on_journal_error is not None:
            with contextlib.suppress(Exception):  # the writer must go on whatever the log does
                self.on_journal_error(message)

    def _replay_journal(self) -> None:
        """At open, before the writer runs: commit the requests journaled before the last stop that are not in the
        database. A file the store cannot take now is parked for the writer to commit (the start goes on); one that
        cannot be read stops the start (StoreOpenError), naming it."""
        self.journal.remove_unfinished()
        for path in self.journal.files():
            try:
                error = self._commit_file(path)
            except Exception as exc:  # noqa: BLE001 - kept for the writer to try again; the start goes on
                error = exc
            if isinstance(error, JournalError):
                raise StoreOpenError(str(error)) from error
            if error is not None:
                self._park_file(path, error)

    def _park_file(self, path: Path, error: Exception) -> None:
        """Keep a journal file whose requests could not all be committed; the writer tries the parked files again,
        waiting twice as long each round they fail, up to a minute."""
        if path in self._parked:
            self._parked_wait_s = min(self._parked_wait_s * 2, PARKED_MAX_WAIT_S)
        else:
            self._parked.add(path)
        self._parked_retry_at = time.monotonic() + self._parked_wait_s
        self._journal_problem(f"acknowledged spans in the ingest journal file {path} could not be committed "
                              f"({type(error).__name__}: {error}); tried again in {self._parked_wait_s:.0f} s. They "
                              "are kept: free space or raise [store] memory_limit if DuckDB's error says so")

    def _commit_parked(self) -> None:
        """Commit the parked journal files (on the writer's thread, between two commits)."""
        failed = False
        for path in sorted(self._parked):  # each one: a file that cannot be read must not hold up the others
            try:
                error = self._commit_file(path)
            except Exception as exc:  # noqa: BLE001 - the writer must go on; the file is kept
                error = exc
            if error is not None:
                self._park_file(path, error)
                failed = True
            else:
                self._parked.discard(path)
        if not failed:
            self._parked_wait_s = PROBE_S
            self._journal_problem("the acknowledged spans parked in the ingest journal are committed")

    def _commit_file(self, path: Path) -> Exception | None:
        """Commit a journal file's requests that are not in the database yet (by digest), in one transaction or, if
        that fails, one by one, and remove the file once all are in; the first error otherwise (the file is kept,
        and its committed requests are skipped by digest next time). Nothing acknowledged is ever dropped."""
        try:
            requests = list(self.journal.read(path))
            stored = self._stored_digests([r.digest for r in requests])
        except (JournalError, duckdb.Error) as exc:
            self.note_fatal(exc)
            return exc
        fresh: dict[bytes, SpanRows] = {}
        for request in requests:
            if request.digest not in stored:
                fresh.setdefault(request.digest, request.rows)
        failed: Exception | None = None
        groups = [list(fresh.items())] if fresh else []
        while groups:
            group = groups.pop(0)
            error = self._commit_requests(group)
            if error is not None and len(group) > 1:
                groups[:0] = [[item] for item in group]
            elif error is not None:
                failed = failed or error
        if failed is None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return failed

    def _stored_digests(self, digests: list[bytes]) -> set[bytes]:
        """Which of these request digests are in the database (any age: replay runs before any prune)."""
        assert self._con is not None
        found = {d for d in digests if d in self._committed}
        rest = [d for d in digests if d not in found]
        if rest:
            found.update(bytes(d) for (d,) in self._con.execute(
                "SELECT DISTINCT digest FROM ingest_requests WHERE list_contains(?, digest)", [rest]).fetchall())
        return found

    def _commit_requests(self, requests: list[tuple[bytes, SpanRows]]) -> Exception | None:
        """Commit journaled requests (digests recorded with them) and tell the listeners; the error, if any."""
        table, resources, scopes = _combined([r for _, r in requests], set(), set())
        now = time.time()
        oldest = table.group_by("trace_id").aggregate([("received_at", "min")])
        # in the same commit: a span of the journal may be older than its trace's last assembly (`journal_replays`)
        replays = pa.table({"trace_id": oldest.column("trace_id"), "received_at": oldest.column("received_at_min")})
        error = self._transaction(table, resources, scopes, {d for d, _ in requests}, now, replays)
        if error is not None:
            return error
        self.stats.replayed_spans += table.num_rows
        for digest, _ in requests:
            self._committed[digest] = now
        self._tell_listeners(table)
        return None

    def _tell_listeners(self, table: pa.Table) -> None:
        """Hand committed spans to the listeners (the assembler); one failing never fails the commit."""
        for listener in self.listeners:
            try:
                listener(table)
            except Exception as exc:  # noqa: BLE001 - a listener must never fail a commit already made
                self.stats.listener_errors += 1
                if self.on_listener_error is not None:
                    with contextlib.suppress(Exception):  # counted above; the exporters still get their answer
                        self.on_listener_error(exc)

    def _run_job(self, job: _WriterJob) -> None:
        assert self._con is not None
        try:
            with self.gate.writing():  # a job deletes (resources and scopes no span refers to)
                result = job.run(self._con)
        except Exception as exc:  # noqa: BLE001 - handed to whoever queued the job
            self.note_fatal(exc)
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)
        finally:  # what the job deleted may be among the ids known to be stored
            self._known_resources.clear()
            self._known_scopes.clear()

    def _commit(self, batch: list[_Pending], count: int) -> None:
        if len(batch) == 1:
            self._commit_group(batch, count, answer_failure=True)
        elif not self._commit_group(batch, count, answer_failure=False):
            with contextlib.suppress(JournalError, OSError, KeyError):  # each request's own commit says it again
                for pending, rows in zip(batch, self._rows_of(batch), strict=True):
                    pending.rows = rows  # journal files read once, not once a request (dropped when settled)
            for pending in batch:  # one request's bad data must not fail the others it was grouped with
                self._commit_group([pending], pending.count, answer_failure=True)

    def _commit_group(self, batch: list[_Pending], count: int, answer_failure: bool) -> bool:
        """Commit the batch in one transaction and answer its requests; on failure answer them only if asked."""
        assert self._con is not None
        started = time.perf_counter()
        fresh: list[_Pending] = []
        digests: set[bytes] = set()
        for pending in batch:  # a redelivered request, or the same request twice in this batch, is stored once
            if pending.digest is not None and (pending.digest in self._committed or pending.digest in digests):
                continue
            fresh.append(pending)
            if pending.digest is not None:
                digests.add(pending.digest)
        # nothing to write when every request is a redelivery (its journal file may be gone: committed from there)
        error: Exception | None = None
        tables: tuple[pa.Table, pa.Table, pa.Table] | None = None
        if fresh:
            try:
                tables = _combined(self._rows_of(fresh), self._known_resources, self._known_scopes)
            except (JournalError, OSError, KeyError) as exc:  # a journal file damaged or gone: the request stays
                error = exc
        inserted = tables[0].num_rows if tables is not None else 0
        now = time.time()
        if tables is not None:
            table, resources, scopes = tables
            error = self._transaction(table, resources, scopes, digests, now)
            for pause in MEMORY_RETRY_PAUSES_S:
                if error is None or not _memory_failure(error):
                    break
                # the buffer pool is shared with /api/query: a query holding it fails or ends within moments, so
                # wait for it here rather than make the exporter back off for a second or more
                self.stats.memory_retries += 1
                time.sleep(pause)
                error = self._transaction(table, resources, scopes, digests, now)
            if error is None:
                for known, new, column in ((self._known_resources, resources, "resource_id"),
                                           (self._known_scopes, scopes, "scope_id")):
                    if len(known) + new.num_rows > MAX_KNOWN_IDS:
                        known.clear()  # a cache: a commit that meets an id not in it inserts it again, ignored
                    known.update(new.column(column).to_pylist())
        if error is None:
            for digest in digests:
                self._committed[digest] = now
            self._prune(now)
        elapsed = time.perf_counter() - started
        if error is not None and not answer_failure:
            return False
        emptied = self._settle(batch, error)
        with self._lock:
            self._queued_spans -= count
        if error is None:
            self.healthy = self.invalidated is None  # a pipeline statement may have met a fatal error meanwhile
            self.stats.commits += 1
            self.stats.spans_committed += inserted
            self.stats.duplicates += count - inserted
            self.stats.last_commit_s = elapsed
            if self.on_commit is not None:
                self.on_commit(elapsed, inserted, count - inserted)
            if tables is not None and inserted:
                self._tell_listeners(tables[0])
        else:
            self.stats.last_error = f"{type(error).__name__}: {error}"
            # a request too large for the memory left must not make the collector unready for everyone: after a
            # memory failure (or a journal file that cannot be read back) the store is unhealthy only if a small
            # write fails too; any other failure (disk full, file gone) makes it unhealthy until a commit succeeds
            self.healthy = (_memory_failure(error) or isinstance(error, JournalError | OSError | KeyError)) \
                and self._can_commit()
        with self._lock:  # those acknowledged from the journal were counted then (settled: none is journaled now)
            self.stats.requests_slowed += _slowed([p for p in batch if p.journal is None])
        for pending in batch:
            outcome: Any = (StoreError(f"the span store could not commit ({self.stats.last_error}); "
                                       "the export was not acknowledged and can be retried")
                            if error is not None else pending.count)
            _answer(pending, outcome)
        for path in emptied:
            self._remove_journal_file(path)
        return error is None

    def _rows_of(self, pending: list[_Pending]) -> list[SpanRows]:
        """Each request's rows: in memory, or read back from the journal file it was acknowledged from (each file
        once)."""
        files: dict[Path, dict[bytes, SpanRows]] = {}
        out = []
        for p in pending:
            rows = p.rows  # read once: the journal's thread may release it meanwhile, having set `journal` first
            if rows is None:
                assert p.journal is not None and p.digest is not None
                path = p.journal.path
                if path not in files:
                    files[path] = {r.digest: r.rows for r in self.journal.read(path)}
                rows = files[path][p.digest]
            out.append(rows)
        return out

    def _settle(self, batch: list[_Pending], error: Exception | None) -> list[Path]:
        """After a commit, or a failed one answered: every request is done. A journaled one whose commit failed
        (already acknowledged) leaves its file parked: the writer commits it from there once the store takes
        commits, or the next start does. Journal files with no request outstanding are returned, to be removed."""
        emptied: list[Path] = []
        failed: set[Path] = set()
        with self._lock:
            for pending in batch:
                file = pending.journal
                pending.done = True
                pending.rows = None
                self._unacked.pop(id(pending), None)
                if file is None:
                    continue
                self._journaled_bytes -= pending.nbytes
                file.outstanding.discard(id(pending))
                if error is not None:
                    failed.add(file.path)
                elif not file.outstanding and file.path not in self._parked:
                    emptied.append(file.path)
        for path in failed - self._parked:  # `_parked` is the writer's own (this thread): no lock
            self._park_file(path, error)  # type: ignore[arg-type]
        return emptied

    def fold_wal(self, con: duckdb.DuckDBPyConnection) -> bool:
        """Checkpoint the WAL into the file on `con` (the assembler's cursor, after a poll's writes) once it has
        reached `assembling_checkpoint_threshold`; whether it did. DuckDB's own threshold cannot be lowered while
        conversations are assembled (the configuration is locked, `lock_down`), and ingest alone keeps DuckDB's
        larger one. Taken through the gate like retention's checkpoint; one that cannot be taken soon, or that
        DuckDB refuses, is left to the next poll."""
        if self._assembling_bytes is None:
            return False
        try:
            if self.wal_path.stat().st_size < self._assembling_bytes:
                return False
        except OSError:
            return False
        try:
            done = self.gate.alone(lambda: con.execute("CHECKPOINT"), FOLD_WAIT_S)
        except duckdb.Error:  # a row updated in place outside the gate: the next poll tries again
            return False
        self.stats.assembling_checkpoints += done
        return done

    def _transaction(self, table: pa.Table, resources: pa.Table, scopes: pa.Table, digests: set[bytes],
                     now: float, replays: pa.Table | None = None) -> Exception | None:
        """Append the spans, the resources and scopes not stored yet, the request digests, and for spans committed
        from the journal their traces (`replays`), in one transaction; the error that stopped it, if any."""
        assert self._con is not None
        if self.invalidated is not None:  # every statement would fail: the exporters are answered at once
            return self.invalidated
        with self.gate.writing():  # its appends can refuse a checkpoint too (the soak counted them)
            try:
                self._con.execute("BEGIN TRANSACTION")
                # the known ids are a bounded cache: a row may be stored already (OR IGNORE), never missing
                self._insert_missing("span_resources", resources)
                self._insert_missing("span_scopes", scopes)
                self._insert("span_records", table)
                if replays is not None:
                    self._insert("journal_replays", replays)
                self._record_digests(sorted(digests), dt.datetime.fromtimestamp(now, dt.UTC))
                self._con.execute("COMMIT")
            except Exception as exc:
                self.note_fatal(exc)  # an autocheckpoint failing after a durable COMMIT says so in its message
                with contextlib.suppress(duckdb.Error):
                    self._con.execute("ROLLBACK")
                return exc
        return None

    def _insert(self, name: str, table: pa.Table) -> None:
        """Append the table's rows, in the table's column order, from a relation of the Arrow table: registering and
        dropping a view for it (as `_insert_missing` must) cost about 0.8 ms a statement. With `_record_digests`, a
        commit of one request took 6.0-6.1 ms of the writer's time against 7.6-8.0 (`python bench/span_append.py
        --commit-overhead`): at half load nearly every export commits alone."""
        assert self._con is not None
        if table.num_rows:
            self._con.from_arrow(table).insert_into(name)

    def _record_digests(self, digests: list[bytes], at: dt.datetime) -> None:
        """The requests' digests, a redelivery's proof: one statement with the values as parameters, about a third of
        the cost of appending a registered Arrow table of a few rows."""
        assert self._con is not None
        for start in range(0, len(digests), DIGESTS_AT_ONCE):
            chunk = digests[start:start + DIGESTS_AT_ONCE]
            self._con.execute("INSERT INTO ingest_requests VALUES " + ", ".join(["(?, ?)"] * len(chunk)),
                              [value for digest in chunk for value in (digest, at)])

    def _insert_missing(self, name: str, table: pa.Table) -> None:
        """Append the rows whose key is not stored yet (`INSERT OR IGNORE`, which a relation's `insert_into` does not
        take: through a registered view; after the first commits these tables are nearly always empty)."""
        assert self._con is not None
        if not table.num_rows:
            return
        self._con.register("incoming", table)
        try:
            self._con.execute(f"INSERT OR IGNORE INTO {name} SELECT * FROM incoming")
        finally:  # in an aborted transaction this fails too, and would hide the error that aborted it
            with contextlib.suppress(duckdb.Error):
                self._con.unregister("incoming")

    def _can_commit(self) -> bool:
        """Whether a small transaction that writes commits: after a failed commit, whether the store is at fault
        (disk full, file gone) or only the request was."""
        assert self._con is not None
        if self.invalidated is not None:
            return False
        try:
            with self.gate.writing():
                self._con.execute("BEGIN TRANSACTION")
                # a real write (the WAL must take it); received in 1970, so the next prune of old digests removes it
                self._con.execute("INSERT INTO ingest_requests VALUES (''::BLOB, '1970-01-01 00:00:00+00')")
                self._con.execute("COMMIT")
        except duckdb.Error as exc:
            self.note_fatal(exc)
            with contextlib.suppress(duckdb.Error):
                self._con.execute("ROLLBACK")
            return False
        return True

    def _prune(self, now: float) -> None:
        """Forget request digests past the window, in memory at once and in the table once a minute."""
        horizon = now - DEDUP_WINDOW_S
        while self._committed and next(iter(self._committed.values())) < horizon:
            self._committed.popitem(last=False)
        if now - self._last_prune < 60 or self._con is None:
            return
        self._last_prune = now
        for path in self.journal.files():  # the digests a journal file's requests may be checked against stay
            with contextlib.suppress(OSError):
                horizon = min(horizon, path.stat().st_mtime - DEDUP_WINDOW_S)
        try:
            with self.gate.writing():
                self._con.execute("DELETE FROM ingest_requests WHERE received_at < ?",
                                  [dt.datetime.fromtimestamp(horizon, dt.UTC)])
        except duckdb.Error as exc:  # pruning can wait for the next minute; a fatal error cannot
            self.note_fatal(exc)


class _PandasAbsent(importlib.abc.MetaPathFinder):
    """Answers `import pandas` with ModuleNotFoundError at once, as a search of sys.path would, only faster."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")
        return None


def mark_pandas_absent() -> None:
    """DuckDB 1.5 tries `import pandas` twice for every query parameter; without pandas installed each try is a
    full search of sys.path (a third of a one-parameter query's time here: 643 -> 397 us). Failing the import at
    once keeps the outcome every caller expects (pyarrow too); an installed pandas is left alone. Only for the
    collector's own process: `importlib.util.find_spec("pandas")` raises instead of returning None afterwards."""
    if any(isinstance(f, _PandasAbsent) for f in sys.meta_path) or "pandas" in sys.modules:
        return
    if importlib.util.find_spec("pandas") is None:
        sys.meta_path.insert(0, _PandasAbsent())


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """No file access from SQL (read_csv('/etc/...') in a query) and no settings changes afterwards."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _memory_failure(error: Exception) -> bool:
    """DuckDB ran out of its buffer pool: during the insert (OutOfMemoryException), or at commit, where it is a
    TransactionException "failed to pin block", or from DuckDB 2 "failed to offload data block" when nothing can be
    spilled (the same class a full disk raises, with another message)."""
    message = str(error).lower()
    return isinstance(error, duckdb.OutOfMemoryException) or (
        isinstance(error, duckdb.TransactionException)
        and ("failed to pin block" in message or "failed to offload data block" in message))


def _new_rows(tables: list[pa.Table], column: str, known: set[int]) -> pa.Table:
    """The rows of these resource or scope tables whose id is neither stored (`known`) nor repeated earlier."""
    seen = set(known)
    keep: list[pa.Table] = []
    for table in tables:
        ids = table.column(column).to_pylist()
        rows = [i for i, value in enumerate(ids) if value not in seen]
        seen.update(ids)
        if rows:
            keep.append(table if len(rows) == len(ids) else table.take(rows))
    if not keep:
        return tables[0].slice(0, 0) if tables else pa.table({column: pa.array([], pa.int64())})
    return pa.concat_tables(keep) if len(keep) > 1 else keep[0]


def _combined(rows: list[SpanRows], known_resources: set[int], known_scopes: set[int]
              ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Requests' rows as one append: their spans, and the resources and scopes not known to be stored."""
    spans = pa.concat_tables([r.spans for r in rows]) if len(rows) > 1 else rows[0].spans
    return (spans, _new_rows([r.resources for r in rows], "resource_id", known_resources),
            _new_rows([r.scopes for r in rows], "scope_id", known_scopes))


def _slowed(answered: list[_Pending]) -> int:
    """How many of the requests about to be answered waited `SLOW_REQUEST_S` or more since they reached the writer."""
    now = time.perf_counter()
    return sum(now - pending.queued_at >= SLOW_REQUEST_S for pending in answered)


def _answer(pending: _Pending, outcome: Any) -> None:
    """Answer a request's export on its receiver's loop (once: a later answer is ignored)."""
    if not pending.loop.is_closed():
        # the receiver's loop may close while we commit; then nothing is waiting any more
        with contextlib.suppress(RuntimeError):
            pending.loop.call_soon_threadsafe(_resolve, pending.future, outcome)


def _resolve(future: asyncio.Future[int], outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
