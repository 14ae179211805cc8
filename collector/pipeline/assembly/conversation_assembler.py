"""Rebuild conversations from stored spans once they are complete, and plan their scoring jobs.

The span writer tells the assembler which traces each commit touched. A conversation is complete when
none of its traces has had a new span for `quiet_period_s`, or at once when a span carries
`tracejudge.conversation.end = true`. Its spans are then read back, mapped with
`tracejudge.mapping.build_conversations`, and written as a new version of the conversation when the content hash
changed (late spans re-score; old versions and their scores stay), together with one job per sampled metric.

`spans` has no index on trace_id, so a read by trace ids scans the table. Every read is bounded by `received_at`
from the oldest span the conversations can hold (the first commit of each waiting trace; `assembled_traces`
remembers it for traces assembled before), which lets DuckDB skip the older row groups by their min/max: what a
poll costs follows the conversations it assembles, not how many spans the table keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracejudge.collector.config import Settings
from tracejudge.collector.log import Logger
from tracejudge.collector.pipeline.assembly.assembly_pool import AssemblyPool, default_workers
from tracejudge.collector.pipeline.assembly.conversation_builder import (
    SPAN_SELECT,
    BatchResult,
    BuildConfig,
    Built,
    CheckedScore,
    Resources,
    Scopes,
    TracePart,
    build,
    map_trace,
    rows_by_conversation,
)
from tracejudge.collector.pipeline.assembly.mapped_traces import KeptTrace, MappedTraceCache
from tracejudge.collector.pipeline.assembly.session_index import SessionIndex
from tracejudge.collector.pipeline.assembly.span_columns import ArrowColumns
from tracejudge.collector.pipeline.sampling import attribute_keys, decide, needs_findings
from tracejudge.collector.pipeline.scoring_stage import SCORE_SCHEMA, checked_score_row
from tracejudge.collector.receivers.span_rows import plain_strings
from tracejudge.collector.store.assembled_index import (
    LATEST_VERSIONS,
    Assembled,
    AssembledIndex,
    Change,
    Latest,
    at_epoch_us,
    epoch_us,
)
from tracejudge.collector.store.connection.arrow_reads import arrow_table
from tracejudge.collector.store.connection.id_table import id_table, registered
from tracejudge.collector.store.connection.memory_release import release_heap
from tracejudge.mapping.conversation_key import KEY_PRECEDENCE, TRACE_KEY

_T = TypeVar("_T")
PAUSE_STEP_S = 0.25  # how often a pause for ingest looks whether ingest stopped
WRITER_IDLE = 0.1  # a step in which the span writer was busy less than this share of it ends the pause
WORKER_START_LEAD_S = 1.0  # the workers start this long (and a poll) before the first conversation is due
MAX_PER_POLL = 512  # conversations assembled per poll: a backlog never hides a newly end-marked one for long
WRITE_AT_ONCE = 128  # conversations written per transaction while exports come in (`write_versions`)
# where the assembly's CPU goes (tracejudge_assembly_cpu_seconds_total): choosing and planning polls, reading spans
# back, building conversations (the workers' and this process's), writing them, and noting each commit of the span
# writer (on its thread); `python bench/pipeline_pace.py` prints it per conversation
CPU_STAGES = ("plan", "read", "build", "write", "observe")
WAIT_FOR_AT_ONCE = 1000  # traces taken into the waiting index per hold of its lock (`_wait_for`)
UNBOUNDED = 1 << 62  # a conversation's newest receipt when not known (a trace taken in from the store): no bound
SPANS_PER_READ = 16_000  # spans read back in one query while assembling; with the batches in flight (workers + 1)
# it bounds the assembler's memory
END_MARKER = '"tracejudge.conversation.end":true'
CONTEXT_ONLY = "context_only"  # conversations.status of MCP calls made outside any agent run, in no known session
_RANK = "CASE conversation_key_source " + " ".join(
    f"WHEN '{key}' THEN {i}" for i, key in enumerate(KEY_PRECEDENCE)) + " END"
_ATTACHED = len(KEY_PRECEDENCE)  # the rank of a context trace's attachment (trace_attachments): weaker than any key
_UNKEYED = _ATTACHED + 1  # the rank of a trace that carries no conversation key (its own conversation)
SESSIONS_KEPT = 50_000  # MCP sessions remembered, each with the conversations seen in it (oldest forgotten first)
_PRECEDENCE = pa.array(KEY_PRECEDENCE)
_UTC_US = pa.timestamp("us", tz="UTC")
_VERSION_SCHEMA = pa.schema([
    ("conversation_id", pa.string()), ("version", pa.int32()), ("content_hash", pa.string()), ("status", pa.string()),
    ("key_source", pa.string()), ("service_name", pa.string()), ("agent_name", pa.string()), ("turns", pa.int32()),
    ("mcp_calls", pa.int32()), ("trace_ids", pa.list_(pa.string())), ("first_span_ns", pa.int64()),
    ("last_span_ns", pa.int64()), ("test_case", pa.string()), ("sample_value", pa.float64()),
    ("sampled", pa.string()), ("assembled_at", _UTC_US), ("attributes", pa.string()), ("inclusion", pa.string()),
    ("agent_usage", pa.string())])
_JOB_SCHEMA = pa.schema([
    ("conversation_id", pa.string()), ("conversation_version", pa.int32()), ("metric", pa.string()),
    ("metric_config", pa.string()), ("status", pa.string()), ("created_at", _UTC_US), ("updated_at", _UTC_US)])
_CONVERSATION_SUMMARY_SCHEMA = pa.schema([
    ("conversation_id", pa.string()), ("version", pa.int32()), ("service_name", pa.string()),
    ("agent_name", pa.string()), ("turns", pa.int32()), ("mcp_calls", pa.int32()), ("mcp_errors", pa.int32()),
    ("assembled_at", _UTC_US), ("summary_note", pa.string())])
_CALL_SUMMARY_SCHEMA = pa.schema([
    ("conversation_id", pa.string()), ("version", pa.int32()), ("turn", pa.int32()), ("call_index", pa.int32()),
    ("kind", pa.string()), ("server", pa.string()), ("name", pa.string()), ("is_error", pa.bool_()),
    ("assembled_at", _UTC_US), ("duration_ms", pa.float64())])


class _Due(NamedTuple):
    last: float  # the conversation's last span (monotonic) when chosen: a later one means it changed meanwhile
    first_us: int  # received_at (µs) its waiting traces' spans are no older than (0: unknown)
    traces: set[str]
    newest_us: int  # received_at (µs) its waiting traces' spans committed so far are no newer than (UNBOUNDED)


class _Batch(NamedTuple):
    """A batch read and sent to the workers, waiting to be finished."""

    there: list[str]  # built in the workers
    here: list[str]  # built in the server (traces kept from their earlier versions)
    local_rows: pa.Table | None  # their spans
    scopes: Scopes
    resources: Resources
    future: Future[BatchResult]


@dataclass
class _Work:
    """A poll's batches: those still to read, those read and sent, and what came back so far."""

    batches: deque[list[str]]
    in_flight: deque[_Batch] = field(default_factory=deque)
    result: BatchResult = field(default_factory=BatchResult)
    local: dict[str, list[KeptTrace]] = field(default_factory=dict)  # the traces mapped in the server


@dataclass
class _Poll:
    """The conversations of one poll, planned and sent to the workers, waiting to be written (`finish`)."""

    due: dict[str, _Due]
    owners: dict[str, str]
    moved: dict[str, str]
    conversations: dict[str, set[str]]
    since_us: int
    until_us: int | None  # the newest receipt its reads need (None: no bound): `_received`
    kept: dict[str, KeptTrace]
    going_on: set[str]
    work: _Work
    left_out: int  # the assembler's `left_out` when it was planned (traces left out, commits it failed on)
    # conversations that context traces joined while this poll was pending: written without judged jobs, as the
    # version with that context follows (judged then, once)
    unjudged: set[str] = field(default_factory=set)

    @functools.cached_property
    def traces(self) -> frozenset[str]:
        return frozenset().union(*self.conversations.values())

    def holds(self, conversation_id: str, traces: set[str]) -> bool:
        """Whether a conversation planned now would be built from what this poll has yet to write: the same
        conversation (or waiting group), or one of its traces."""
        return (conversation_id in self.conversations or conversation_id in self.due
                or not self.traces.isdisjoint(traces))


_CALL_FIELDS = ("turn", "call_index", "kind", "server", "name", "is_error", "duration_ms")  # `Built.calls` order


class _CallColumns:
    """The call summary's rows, gathered column by column: a conversation has dozens of calls, and a dict per call
    made into Arrow row by row cost three times as much of the server's CPU (`python bench/pipeline_pace.py`)."""

    def __init__(self) -> None:
        self.conversation_ids: list[str] = []
        self.versions: list[int] = []
        self.fields: dict[str, list[object]] = {name: [] for name in _CALL_FIELDS}

    def add(self, conversation_id: str, version: int, calls: tuple[tuple[object, ...], ...]) -> None:
        if not calls:
            return
        self.conversation_ids += [conversation_id] * len(calls)
        self.versions += [version] * len(calls)
        for name, values in zip(_CALL_FIELDS, zip(*calls, strict=True), strict=True):
            self.fields[name] += values

    def table(self, assembled_at: datetime) -> pa.Table:
        rows = len(self.versions)
        columns = {"conversation_id": self.conversation_ids, "version": self.versions, **self.fields}
        return pa.Table.from_arrays(
            [pa.repeat(pa.scalar(assembled_at, field.type), rows) if field.name == "assembled_at"
             else pa.array(columns[field.name], field.type) for field in _CALL_SUMMARY_SCHEMA],
            schema=_CALL_SUMMARY_SCHEMA)


class _Rows:
    """What one batch of versions writes, table by table."""

    def __init__(self, now: datetime) -> None:
        self.now = now  # when they were assembled
        self.versions: list[dict[str, object]] = []
        self.latest: list[Latest] = []  # the same versions, as the index keeps each conversation's newest
        self.jobs: list[dict[str, object]] = []
        self.checked: list[CheckedScore] = []
        self.summaries: list[dict[str, object]] = []
        self.calls = _CallColumns()


def _only(table: pa.Table, traces: list[str]) -> pa.Table:
    """The rows of these traces."""
    return table.filter(pc.is_in(table.column("trace_id"), pa.array(traces, pa.string())))


def _received(since_us: int, until_us: int | None) -> tuple[str, list[datetime]]:
    """The condition on received_at of a poll's span reads, and its parameters: from the oldest receipt its traces
    need to the newest (None: no upper bound). The upper bound lets DuckDB skip the row groups received after: in a
    backlog, a poll read every span since its oldest conversation's, most of the table."""
    if until_us is None:
        return "received_at >= ?", [at_epoch_us(since_us)]
    return "received_at BETWEEN ? AND ?", [at_epoch_us(since_us), at_epoch_us(until_us)]


def _built_here_cpu(future: Future[BatchResult]) -> float:
    """The CPU of a batch the pool built in the calling thread at submit; 0 for one sent to a worker."""
    if not future.done() or future.exception() is not None:
        return 0.0
    result = future.result()
    return result.cpu_s if result.here else 0.0


def _may_hold(column: pa.ChunkedArray, text: str) -> bool:
    """Whether a value of this string column may hold `text`: one search of each chunk's character data, where every
    value's bytes lie, instead of a search of each value (`pc.match_substring` took 0.39 ms for a commit of 512 spans
    on the span writer's thread, this 0.06 ms). It may say yes for bytes across two values, never no for a value that
    holds it; a chunk that is a slice is searched within its own values' bytes."""
    needle = text.encode()
    for chunk in plain_strings(column).chunks:
        if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
            return True  # another layout: the values are searched one by one
        _, offsets, data = chunk.buffers()
        if data is None or len(chunk) == 0:
            continue
        start, end = (_offset(offsets, chunk.type, i) for i in (chunk.offset, chunk.offset + len(chunk)))
        if needle in data.slice(start, end - start).to_pybytes():
            return True
    return False


def _offset(offsets: pa.Buffer, kind: pa.DataType, index: int) -> int:
    """Where value `index` of a string array begins in its character data (its end, for the last value + 1)."""
    width = 8 if pa.types.is_large_string(kind) else 4
    return int.from_bytes(memoryview(offsets)[index * width:(index + 1) * width], "little", signed=True)


def _commit_keys(table: pa.Table) -> dict[str, tuple[int, str]]:
    """Each trace's strongest conversation key among the committed rows, computed on the Arrow columns."""
    keyed = table.select(["trace_id", "conversation_key", "conversation_key_source"]).filter(
        pc.is_valid(table.column("conversation_key")))
    if keyed.num_rows == 0:
        return {}
    rank = pc.fill_null(pc.index_in(keyed.column("conversation_key_source"), value_set=_PRECEDENCE), _UNKEYED)
    keyed = keyed.append_column("rank", rank).sort_by([("rank", "ascending")])
    best = keyed.group_by("trace_id", use_threads=False).aggregate(
        [("rank", "first"), ("conversation_key", "first")])
    return dict(zip(best.column("trace_id").to_pylist(),
                    zip(best.column("rank_first").to_pylist(), best.column("conversation_key_first").to_pylist(),
                        strict=True), strict=True))


class _Counting(threading.local):
    """Per thread: whether an entry point of assembly runs (`_plan_stage`), and the CPU its inner stages took."""

    depth = 0
    inner = 0.0


def _plan_stage(method: Callable[..., _T]) -> Callable[..., _T]:
    """An entry point of the assembly thread's work (a round's steps, a take-in, a poll dropped or written at a
    stop): its CPU that reading, building and writing did not count goes to the `plan` stage: choosing due
    conversations, their keys and batches, the waiting set's upkeep, giving memory back. Once, in the outermost."""
    @functools.wraps(method)
    def counted(self: ConversationAssembler, *args: Any, **kwargs: Any) -> _T:
        counting = self._counting
        counting.depth += 1
        started, inner = time.thread_time(), counting.inner
        try:
            return method(self, *args, **kwargs)
        finally:
            counting.depth -= 1
            if counting.depth == 0:
                self.cpu_seconds["plan"] += time.thread_time() - started - (counting.inner - inner)
    return counted


class ConversationAssembler:
    """Keeps, in memory and updated from each commit, which traces wait and which conversation each belongs
    to, so a poll costs what changed and what is due, not the size of the quiet window."""

    def __init__(self, con: duckdb.DuckDBPyConnection, settings: Settings, logger: Logger,
                 job_status: Callable[[str], str], metric_configs: dict[str, str],
                 writer_busy_s: Callable[[], float] | None = None, slowed_requests: Callable[[], int] | None = None,
                 checks: tuple[str, ...] = (),
                 on_checked: Callable[[list[CheckedScore]], None] | None = None,
                 index: AssembledIndex | None = None) -> None:
        self.con = con
        # which traces were assembled into which conversation, looked up by id each poll (None: one in memory, built
        # from the table; the collector keeps one in a file beside the database, shared with retention)
        self.index = index or AssembledIndex(None, con.cursor(), logger.log)
        self.settings = settings
        self.log = logger
        self.job_status = job_status  # metric -> the status a new job starts in
        self.metric_configs = metric_configs  # metric -> config hash (part of the job and score key)
        self._attribute_keys = attribute_keys(settings.sampling, settings.cohorts.attributes)
        # `checks`: the deterministic metrics scored as each conversation is built, written with its version (the
        # scoring stage's, told through `on_checked`); a check that raises leaves its job pending for the stage
        self.on_checked = on_checked
        self.build_config = BuildConfig(
            mcp_tools={server: tuple(tools) for server, tools in settings.mapping.mcp_tools.items()},
            attribute_keys=self._attribute_keys, with_findings=needs_findings(settings.sampling), checks=checks,
            threshold=settings.scoring.threshold, strict_mode=settings.scoring.strict_mode)
        workers = settings.conversations.assembly_workers
        self.pool = AssemblyPool(default_workers() if workers < 0 else workers, self.build_config,
                                 on_start=lambda n: self.log.info("assembly workers started", workers=n))
        self.pool_wait_s = 0.0  # seconds spent waiting for the workers (not the server's CPU)
        self.fold_s = 0.0  # seconds spent folding the WAL (`fold_wal`): ingest's checkpoint, not assembly's work
        # spans read back for assembly and the time those reads took: a read's cost follows what it scans, which
        # its received_at bound keeps to the spans since the poll's oldest waiting conversation began
        # (tracejudge_assembly_read_*)
        self.read_spans = 0
        self.read_seconds = 0.0
        self.cpu_seconds = dict.fromkeys(CPU_STAGES, 0.0)  # stage -> CPU seconds (its threads', the workers')
        self._counting = _Counting()  # per thread: inside an entry point, and the CPU its inner stages took
        self._new_cohorts = [rule for rule in settings.sampling.rules if rule.when == "new_cohort"]
        # the batch being written's counts of the new_cohort rules' values (read per batch: retention forgets values
        # not seen for the conversations' window, and a client sending endless values grows no memory here)
        self._cohort_counts: dict[tuple[str, str], int] = {}
        self.writer_busy_s = writer_busy_s  # the span writer's seconds spent committing so far (None: not known)
        self._busy_at_write = 0.0  # `writer_busy_s` when versions were last written
        # how many requests the span writer answered 50 ms or more after they reached it, so far (None: not
        # known): a round that slowed none took nothing from ingest that exports felt
        self.slowed_requests = slowed_requests
        self.store_writable: Callable[[], bool] = lambda: True  # False while the store takes no pipeline write
        # after each poll's writes, on this cursor: the store checkpoints the WAL once it is past its assembling
        # threshold (`SpanStore.fold_wal`), in smaller folds than DuckDB's own while conversations are assembled
        self.fold_wal: Callable[[duckdb.DuckDBPyConnection], object] = lambda con: None
        self._writable = True
        self._group_of: dict[str, str] = {}  # waiting trace -> the conversation its spans name so far
        # a waiting trace's key precedence (_UNKEYED: none) is its conversation's in _key_rank, except where it
        # differs (kept in _rank_of): one entry per conversation, not one per trace (42 bytes each)
        self._key_rank: dict[str, int] = {}  # conversation -> precedence of the key its keyed traces hold
        self._rank_of: dict[str, int] = {}  # waiting trace -> its precedence, where it is not its conversation's
        # conversation -> its waiting traces, only where they are not just the conversation's own trace: most
        # traces carry no key and are their own conversation, and a set would be half of what each one costs
        self._members: dict[str, set[str]] = {}
        self._last: OrderedDict[str, float] = OrderedDict()  # conversation -> last span (monotonic), oldest first
        # conversation -> the oldest received_at (µs) of the commits that brought its waiting traces (0: unknown)
        self._first: dict[str, int] = {}
        # conversation -> the newest received_at (µs) of those commits (UNBOUNDED: not known), so a poll reads the
        # spans received between its conversations' first and last commits, not every span received since its first
        # (in a backlog, most of the table: `python bench/pipeline_pace.py`)
        self._newest: dict[str, int] = {}
        self._ended: set[str] = set()  # traces with a span that carried the end marker
        self.cache = MappedTraceCache(settings.conversations.trace_cache)  # traces assembled before, mapped
        self.sessions = SessionIndex(SESSIONS_KEPT)  # MCP sessions -> their conversation, context waiting on them
        self._attached: list[tuple[str, int]] = []  # context traces attached this round, to wait again after it
        self._attached_to: set[str] = set()  # the conversations they were attached to
        self._lock = threading.Lock()
        # received_at (µs) from which traces were stored without a place in the index (it was full), or since
        # which a restart must look: they are taken in as it has room (None: nothing left out)
        self._left_out_since: int | None = None
        self.left_out = 0  # traces left out of the full index (taken in later), since the start
        self.assembled = 0
        self.deferred = 0  # conversations a poll left to the next because the poll pending was building them
        self._replays_waiting = False  # `recover` found traces in journal_replays: assembling one deletes its rows
        self.late_after_prune = 0  # conversations that got spans after retention pruned theirs (not assembled)

    def observe(self, table: pa.Table) -> None:
        """Called by the span writer after each commit (its thread). A commit it fails on is treated as left out of
        the index, so `take_in` finds its traces by their stored spans."""
        try:
            with self._stage("observe"):
                self._observe(table)
        except Exception:
            try:
                first_us = pc.min(table.column("received_at")).value or 0
            except Exception:  # noqa: BLE001 - not even its time: the traces left out are looked for from the start
                first_us = 0
            traces: list[str] | None
            try:
                traces = pc.unique(table.column("trace_id")).to_pylist()
            except Exception:  # noqa: BLE001 - not even its traces: nothing mapped before is kept as current
                traces = None
            with self._lock:
                if traces is None:
                    self.cache.clear()
                    traces = []
                self._mark_left_out(first_us)
                now = time.monotonic()
                for trace in traces:  # those waiting already wait again, from this commit's spans on
                    self.cache.discard(trace)
                    if trace in self._group_of:
                        self._note(trace, None, now, first_us)
            raise

    def _observe(self, table: pa.Table) -> None:
        keys = _commit_keys(table)
        traces = pc.unique(table.column("trace_id")).to_pylist()
        attributes = plain_strings(table.column("attributes"))
        ended: list[str] = []
        if _may_hold(attributes, END_MARKER):  # nearly never: only then are the values searched one by one
            ended = table.filter(pc.match_substring(attributes, END_MARKER)).column("trace_id").to_pylist()
        received = pc.min_max(table.column("received_at"))
        first_us = received["min"].value or 0
        newest_us = received["max"].value
        newest_us = UNBOUNDED if newest_us is None else newest_us
        limit = self.settings.conversations.max_waiting_traces
        with self._lock:
            now = time.monotonic()
            for trace in traces:
                if self.cache.size:
                    self.cache.discard(trace)  # its mapped part no longer holds: it is read again when it is due
                if trace in self._group_of:
                    self._note(trace, keys.get(trace), now, first_us, newest_us)
                elif len(self._group_of) >= limit:
                    self._leave_out(first_us)
                else:  # it may be one of the traces left out earlier, not taken in yet: its spans from then on,
                    # which an earlier commit may have brought with newer receipts than this one's
                    left = self._left_out_since
                    self._note(trace, keys.get(trace), now, first_us if left is None else min(first_us, left),
                               newest_us if left is None else UNBOUNDED)
            self._ended.update(t for t in ended if t in self._group_of)

    def _leave_out(self, first_us: int) -> None:
        """A new trace finds the index full: it is stored, and taken in by `take_in` once there is room; the lock is
        held."""
        if self._left_out_since is None:
            self.log.warning("the waiting index is full: new traces are stored and assembled once it has room",
                             max_waiting_traces=self.settings.conversations.max_waiting_traces,
                             advice="a shorter [conversations] quiet_period_s holds fewer traces at this traffic; "
                                    "raise max_waiting_traces to give the index more memory (about 250 bytes a trace)")
        self._mark_left_out(first_us)

    def _mark_left_out(self, first_us: int) -> None:
        """Spans received from `first_us` on wait to be taken in by `take_in`; the lock is held."""
        self._left_out_since = min(first_us, self._left_out_since if self._left_out_since is not None else first_us)
        self.left_out += 1

    def _note(self, trace: str, key: tuple[int, str] | None, now: float, first_us: int,
              newest_us: int = UNBOUNDED) -> None:
        """A trace has new spans (`key`: their strongest conversation key; none received before `first_us`, nor
        after `newest_us`); the lock is held."""
        old = self._group_of.get(trace)
        group = old or trace
        rank = self._rank(trace, old) if old is not None else _UNKEYED
        if key is not None and key[0] < rank:
            rank, group = key
            members = self._members.get(group)
            if members:  # the key string its other traces hold: one per conversation, not one per trace (62 bytes)
                group = self._group_of[next(iter(members))]
        if group != old:
            if old is not None:  # the trace's earlier spans came with its old conversation's commits
                first_us = min(first_us, self._first.get(old, 0))
                newest_us = max(newest_us, self._newest.get(old, UNBOUNDED))
                self._leave(trace, old)
            self._join(trace, group, first_us, rank, newest_us)
        else:  # a later commit may bring spans received before the first's (they waited longer to be written)
            if first_us < self._first.get(group, first_us):
                self._first[group] = first_us
            if newest_us > self._newest.get(group, newest_us):
                self._newest[group] = newest_us
            if key is not None and rank == key[0]:  # a stronger key naming the same conversation
                self._set_rank(trace, group, rank)
        self._last[group] = now
        self._last.move_to_end(group)

    def _join(self, trace: str, group: str, first_us: int, rank: int, newest_us: int) -> None:
        """The trace waits with this conversation from now on (its spans received from `first_us` to `newest_us`,
        its key of precedence `rank`); the lock is held."""
        self._first[group] = min(first_us, self._first.get(group, first_us))
        self._newest[group] = max(newest_us, self._newest.get(group, newest_us))
        self._group_of[trace] = group
        members = self._members.get(group)
        if members is not None:
            members.add(trace)
        elif trace != group:
            self._members[group] = {trace} | self._own_trace(group)
        self._set_rank(trace, group, rank)

    def _rank(self, trace: str, group: str) -> int:
        """The precedence of the strongest key the waiting trace's spans carried (_UNKEYED: none)."""
        return self._rank_of.get(trace, self._key_rank.get(group, _UNKEYED))

    def _set_rank(self, trace: str, group: str, rank: int) -> None:
        """Record the waiting trace's key precedence: nothing where it is its conversation's."""
        base = self._key_rank.get(group)
        if base is None and rank != _UNKEYED:  # the conversation's first keyed trace: the others carry no key
            for member in self._traces_of(group) - {trace}:
                self._rank_of.setdefault(member, _UNKEYED)
            self._key_rank[group] = base = rank
        if rank == (_UNKEYED if base is None else base):
            self._rank_of.pop(trace, None)
        else:
            self._rank_of[trace] = rank

    def _leave(self, trace: str, group: str) -> None:
        """The trace no longer waits with this conversation (its `_group_of` entry is the caller's to change)."""
        self._rank_of.pop(trace, None)
        members = self._members.get(group)
        if members is not None:
            members.discard(trace)
            empty = not members
            if empty:
                del self._members[group]
        else:
            empty = trace == group  # the conversation's only waiting trace was its own
        if empty:
            self._last.pop(group, None)
            self._first.pop(group, None)
            self._newest.pop(group, None)
            self._key_rank.pop(group, None)

    def _own_trace(self, group: str) -> set[str]:
        """The trace whose id is the conversation's, if it waits in it (a conversation without a member set)."""
        return {group} if self._group_of.get(group) == group else set()

    def _traces_of(self, group: str) -> set[str]:
        """The conversation's waiting traces; the lock is held."""
        members = self._members.get(group)
        return set(members) if members is not None else self._own_trace(group)

    def _forget(self, group: str, last: float) -> bool:
        """Drop an assembled conversation from the waiting set unless a span arrived for it meanwhile."""
        if self._last.get(group) != last:
            return False
        for trace in self._traces_of(group):
            self._group_of.pop(trace, None)
            self._rank_of.pop(trace, None)
            self._ended.discard(trace)
        self._members.pop(group, None)
        self._last.pop(group, None)
        self._first.pop(group, None)
        self._newest.pop(group, None)
        self._key_rank.pop(group, None)
        return True

    def recover(self) -> None:
        """After a restart: every trace with spans newer than its last assembly waits for a quiet period again (as
        many as the index holds; the rest as it has room), and so does each trace with spans committed from the
        ingest journal (`journal_replays`), which may be older than its last assembly: its row goes once it is
        assembled again (or its spans are gone), so one not taken now is taken at a later start."""
        with self._lock:
            self._left_out_since = 0  # its spans may be as old as the file
        if self.con.execute("SELECT count(*) FROM journal_replays").fetchone()[0]:
            self._replays_waiting = True
            self.con.execute("DELETE FROM journal_replays r WHERE NOT EXISTS (SELECT 1 FROM span_records s WHERE "
                             "s.trace_id = r.trace_id AND s.received_at >= r.received_at)")  # pruned since
            replays = self.con.execute("SELECT trace_id, epoch_us(min(received_at)) AS since FROM journal_replays "
                                       "GROUP BY trace_id ORDER BY since, trace_id").fetchall()
            room = max(0, self.settings.conversations.max_waiting_traces - len(self._group_of))
            self._wait_for([(trace, since) for trace, since in replays[:room]])
        self.take_in()

    @_plan_stage
    def take_in(self) -> int:
        """Traces left out of the index while it was full (or before a restart) that wait for assembly, taken in
        oldest first once a tenth of it is free; how many. One query over the spans received since the first of
        them."""
        limit = self.settings.conversations.max_waiting_traces
        with self._lock:
            since, room, left_out = self._left_out_since, limit - len(self._group_of), self.left_out
        if since is None or room < max(1, limit // 10):
            return 0
        rows = self.con.execute(
            "SELECT s.trace_id, epoch_us(s.first) FROM (SELECT trace_id, min(received_at) AS first, "
            "max(received_at) AS last FROM span_records WHERE received_at >= ? GROUP BY trace_id) s "
            "LEFT JOIN assembled_traces a USING (trace_id) WHERE a.assembled_at IS NULL OR s.last > a.assembled_at "
            "ORDER BY s.first, s.trace_id LIMIT ?", [at_epoch_us(since), room + 1]).fetchall()
        taken = self._wait_for([(trace, since) for trace, _ in rows[:room]])
        with self._lock:
            if self.left_out == left_out:  # what is left starts at the first trace not taken
                self._left_out_since = rows[room][1] if len(rows) > room else None
            # else traces were left out meanwhile, maybe after the query: look again from the same mark
        return taken

    async def run(self, stop: asyncio.Event) -> None:
        pending: _Poll | None = None  # sent to the workers, written in the next round (`assemble_next`)
        try:
            while not stop.is_set():
                done, deferred, worked = 0, False, False  # worked: took traces in, wrote or sent a poll, or failed
                started, busy, waited, folded = time.monotonic(), self._writer_busy(), self.pool_wait_s, self.fold_s
                slowed = self._slowed()
                try:
                    await asyncio.to_thread(self._start_workers_if_due)
                except Exception as exc:  # the first batch starts them (or builds here), as without this
                    self.log.error("assembly workers could not start", reason=f"{type(exc).__name__}: {exc}")
                try:
                    worked = bool(await asyncio.to_thread(self.take_in))
                    writable = self.store_writable()  # a failing disk: a commit now would fail, and DuckDB can abort
                    if writable != self._writable:  # the process reverting it; said once each way
                        self._writable = writable
                        self.log.log("info" if writable else "warning",
                                     "the pipeline goes on: the store takes writes again" if writable else
                                     "the pipeline waits: the store takes no writes now (GET /readyz says why)")
                    poll, pending = pending, None  # the thread owns it now: written or dropped there
                    worked = worked or poll is not None
                    if writable:
                        deferred = self.deferred
                        done, pending = await asyncio.to_thread(self.assemble_next, poll, MAX_PER_POLL)
                        deferred = self.deferred > deferred
                    elif poll is not None:
                        await asyncio.to_thread(self.abandon, poll)
                except Exception as exc:  # a bad conversation must not stop the loop; it is logged and retried
                    worked = True
                    self.log.error("assembly failed", reason=f"{type(exc).__name__}: {exc}")
                # a backlog: go on at once (looking again for end-marked conversations first), unless ingest
                # presses; the time the workers built (on other cores) is not time taken from ingest, nor is the
                # WAL's fold: the checkpoint of ingest's own spans, which DuckDB would make at its threshold anyway
                # (counted in the share, at a steady 20,000 spans/s a fold every 64 MB paused the assembler for
                # seconds and it fell behind, `python bench/pipeline_pace.py --requests 1500 --rates 20000`)
                spent = time.monotonic() - started - (self.pool_wait_s - waited) - (self.fold_s - folded)
                paused = await self.pause(self.pause_for_ingest(spent, self._writer_busy() - busy,
                                                                worked=worked or pending is not None,
                                                                slowed=self._slowed_since(slowed)), stop)
                backlog = done >= MAX_PER_POLL or pending is not None or deferred
                wait = 0.0 if backlog else self.settings.conversations.poll_s - paused
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
        except asyncio.CancelledError:
            pending = None  # the grace ran out and the store closes: it is assembled again after the restart
            raise
        finally:
            if pending is not None:  # built already: written now, not built again after the restart
                await asyncio.to_thread(self._last_poll, pending)

    def _start_workers_if_due(self) -> None:
        """Start the assembly workers once the first waiting conversation goes quiet within the next polls. Started
        by its batch, their start (imports, 0.3-0.5 s of a core each) landed on the exports of the moment
        conversations began to complete (`python bench/pipeline_pace.py --tail`)."""
        if not self.pool.workers or self.pool.started:
            return
        with self._lock:
            oldest = next(iter(self._last.values()), None)
        conversations = self.settings.conversations
        if oldest is not None and time.monotonic() - oldest >= \
                conversations.quiet_period_s - conversations.poll_s - WORKER_START_LEAD_S:
            self.pool.start()

    @_plan_stage
    def _last_poll(self, poll: _Poll) -> None:
        """The poll pending at a stop: written if the store takes writes, else dropped (its conversations are
        assembled after the restart); a failure is logged."""
        try:
            if self.store_writable():
                self.finish(poll)
            else:
                self.abandon(poll)
        except Exception as exc:  # noqa: BLE001 - logged; its conversations wait in the store, nothing is lost
            self.log.error("assembly failed", reason=f"{type(exc).__name__}: {exc}")

    async def pause(self, seconds: float, stop: asyncio.Event) -> float:
        """Give way to ingest for up to `seconds`, a step at a time: the pause ends as soon as a step finds the
        span writer all but idle (busy under a tenth of it: ingest stopped), so the cores do not idle through a
        pause decided while exports still came in (`python bench/pipeline_pace.py --timeline`: 90-97 % idle in
        the seconds after the last export). A writer still busy now and then keeps the pause, as ingest's
        priority asks (ending it at half busy, the rule a pause is decided by, would let the assembler in between
        commits). How long it paused."""
        started = time.monotonic()
        while not stop.is_set() and (left := started + seconds - time.monotonic()) > 0:
            busy, step = self._writer_busy(), min(left, PAUSE_STEP_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), step)
            if self._writer_busy() - busy < step * WRITER_IDLE:
                break
        return time.monotonic() - started

    def _writer_busy(self) -> float:
        return self.writer_busy_s() if self.writer_busy_s is not None else 0.0

    def _slowed(self) -> int | None:
        """The span writer's count of slowed exports so far; None when it is not known (every busy pass pauses)."""
        return self.slowed_requests() if self.slowed_requests is not None else None

    def _slowed_since(self, before: int | None) -> int | None:
        """Exports slowed since the count was `before` (None: not known)."""
        now = self._slowed()
        return None if now is None or before is None else now - before

    def pause_for_ingest(self, spent_s: float, writer_busy_s: float, worked: bool = True,
                         slowed: int | None = None) -> float:
        """How long to pause after a round that took `spent_s`, during which the span writer was committing
        for `writer_busy_s` and answered `slowed` requests 50 ms or more after they reached it (None: not known).
        Both share two cores and one database: when the writer was busy half the time or more and the round slowed
        an export, the assembler keeps to `[conversations] share_under_load` so exports stay fast (its backlog
        waits, stored); otherwise it goes on at once. The writer's commits slow down while the assembler writes, so
        at 20,000 spans/s it looked busy half the time in most rounds, though no export waited: the pause after
        each held the assembler to a quarter of the time and it fell 6-7 s behind in 38 s (`python
        bench/pipeline_pace.py --requests 1500 --rates 20000 --paced-only`). A round that took no trace in, wrote
        and sent no poll and did not fail (`worked` False) took next to nothing from ingest, however long it waited
        for the GIL: no pause (one of 1.4 s, after a round that found nothing due yet, held back the first
        conversations due, `python bench/pipeline_pace.py`)."""
        share = self.settings.conversations.share_under_load
        if not worked or spent_s <= 0 or writer_busy_s < spent_s / 2 or share >= 1 or slowed == 0:
            return 0.0
        return spent_s * (1 - share) / share

    def _due(self, force: bool, limit: int | None, busy: _Poll | None = None) -> dict[str, _Due]:
        """End-marked conversations first, then those quiet for the quiet period, oldest first; none of those the
        `busy` poll has yet to write."""
        quiet = self.settings.conversations.quiet_period_s
        now = time.monotonic()
        taken = busy.due if busy is not None else {}
        with self._lock:
            chosen = list(dict.fromkeys(g for t in self._ended if (g := self._group_of.get(t)) is not None
                                        and g not in taken))
            for group, last in self._last.items():
                if limit is not None and len(chosen) >= limit:
                    break
                if not force and now - last < quiet:
                    break  # ordered by last span: every later one is newer still
                if group not in chosen and group not in taken:
                    chosen.append(group)
            return {g: _Due(self._last[g], self._first.get(g, 0), self._traces_of(g),
                         self._newest.get(g, UNBOUNDED)) for g in chosen[:limit]}

    @_plan_stage
    def assemble_due(self, force: bool = False, limit: int | None = None) -> int:
        """Assemble the conversations that are complete (all of them with `force`), end-marked ones first, at
        most `limit` in this call; how many were assembled."""
        poll = self.plan(force, limit)
        return self.finish(poll) if poll is not None else 0

    @_plan_stage
    def assemble_next(self, pending: _Poll | None, limit: int) -> tuple[int, _Poll | None]:
        """Plan the next poll and send its conversations to the workers, then write the `pending` one: the workers
        build the one while the server writes the other, where one poll after another left them idle for a fifth
        of the time (`python bench/pipeline_pace.py --timeline`). How many conversations `pending` assembled, and
        the poll now pending (None: nothing was due)."""
        try:
            following = self.plan(False, limit, busy=pending)
        except Exception:
            if pending is not None:
                self.finish(pending)
            raise
        try:
            done = self.finish(pending) if pending is not None else 0
        except Exception:
            if following is not None:
                self.abandon(following)
            raise
        finally:
            if pending is not None:
                # a poll's rows, results and Arrow tables leave glibc's heap full of free pages, given back here
                # (about 2 ms a poll); two runs of `python bench/pipeline_pace.py` peaked 20-40 MB lower with it, but
                # later pairs' peaks varied as much from run to run (issue 41's note)
                release_heap()
        if following is not None and pending is not None:
            following.unjudged |= self._attached_to & following.conversations.keys()
        return done, following

    def plan(self, force: bool = False, limit: int | None = None, busy: _Poll | None = None) -> _Poll | None:
        """Choose the conversations due (none that `busy`, a poll not yet written, is building: their traces and
        versions are its to write), find each one's traces, and send the first batches to the workers."""
        due = self._due(force, limit, busy)
        if not due:
            return None
        waiting = set().union(*(d.traces for d in due.values()))
        # a waiting trace assembled before (a late span) has older spans: as old as its first assembly says
        since = min(d.first_us for d in due.values())
        assembled_before = self._assembled(waiting)
        since = min([since, *self._assembled_since(assembled_before)])
        # and no newer than the newest their commits brought; a trace assembled before has spans no commit noted
        # while it waited here (its earlier ones, and late ones noted in another conversation's wait): no bound
        newest = max(d.newest_us for d in due.values())
        until = None if assembled_before or newest >= UNBOUNDED else newest  # None: no upper bound
        owners = self._trace_keys(waiting, since, until)  # the stored spans decide: a late span may carry no key itself
        # a trace that a stronger key moved to another conversation leaves its old one short of it
        moved = {row.trace_id: row.conversation_id for row in assembled_before
                 if row.conversation_id != owners.get(row.trace_id, row.trace_id)}
        conversations: dict[str, set[str]] = {}
        for trace in waiting:
            conversations.setdefault(owners.get(trace, trace), set()).add(trace)
        if busy is not None:  # what the busy poll builds waits for the next poll, which sees it written
            clash = {c for c, traces in conversations.items() if busy.holds(c, traces)}
            self.deferred += len(clash)
            for group in [g for g, d in due.items() if any(owners.get(t, t) in clash for t in d.traces)]:
                del due[group]
            for conversation_id in clash:
                del conversations[conversation_id]
            if not due:
                return None
        if not force:
            self._wait_with_active(due, owners, conversations)
        keyed = {c for c in conversations if c in owners.values()}
        kept: dict[str, KeptTrace] = {}
        going_on: set[str] = set()  # conversations that had traces assembled before: their traces are kept mapped
        earlier: list[Assembled] = []
        if keyed:  # the conversation's earlier traces, assembled before, belong to it too
            earlier = self._assembled_into(keyed)
            with self._lock:  # mapped before and unchanged since: neither read nor mapped again
                for trace, into, _, _ in earlier:
                    hit = self.cache.get(trace) if trace not in waiting else None
                    if hit is not None:
                        kept[trace] = hit
                        if hit.mapped is not None:  # a trace with no key of its own belongs where it was attached
                            unkeyed = hit.mapped.key == TRACE_KEY
                            owners.setdefault(trace, into if unkeyed else hit.mapped.conversation_id)
            unread = [row for row in earlier if row.trace_id not in kept]
            since = min([since, *self._assembled_since(unread)])
            until = None if unread else until
            owners.update(self._trace_keys({row.trace_id for row in unread} - set(owners), since, until))
            for trace, key, _, _ in earlier:
                if owners.get(trace, trace) == key:
                    conversations[key].add(trace)
                    going_on.add(key)
        poll = _Poll(due, owners, moved, conversations, since, until, kept, going_on,
                     self._batches(conversations, since, until, kept), self.left_out)
        try:
            self._send(poll, self.pool.workers + 1)
        except Exception:
            self.abandon(poll)
            raise
        return poll

    def finish(self, poll: _Poll) -> int:
        """Build the rest of the poll, write it, and drop what it assembled from the waiting set; how many
        conversations it assembled."""
        failed, mapped = self._finish_all(poll)
        with self._stage("write"):
            started = time.monotonic()
            self.fold_wal(self.con)
            self.fold_s += time.monotonic() - started
        owners = poll.owners
        # once the trace is in its new conversation's version, its old one gets a version without it
        left = {old for trace, old in poll.moved.items()
                if owners.get(trace, trace) in poll.conversations and owners.get(trace, trace) not in failed}
        done = 0
        with self._lock:
            now = time.monotonic()
            for group, chosen in poll.due.items():
                if any(owners.get(t, t) in failed for t in chosen.traces):
                    if self._last.get(group) == chosen.last:
                        self._last[group] = now  # wait another quiet period before the next try
                        self._last.move_to_end(group)
                    continue
                self._forget(group, chosen.last)
                done += 1
            # a trace with spans committed since its read waits to be read again; one left out of the index
            # meanwhile is not in it either, so nothing is kept while the poll was pending across such a commit
            if self.left_out == poll.left_out:
                for trace, part in mapped.items():
                    if trace not in self._group_of:
                        self.cache.put(trace, part)
        if left:
            self._wait_again(left)
        if self._attached:
            attached, self._attached = self._attached, []
            self._wait_for(attached)
        return done

    @_plan_stage
    def abandon(self, poll: _Poll) -> None:
        """Drop a poll unwritten (the store failed meanwhile): what was sent is waited for, so its files are removed;
        its conversations still wait, and a later poll builds them."""
        for read in poll.work.in_flight:
            self.pool.result(read.future, read.there)
        poll.work.in_flight.clear()
        poll.work.batches.clear()

    def _wait_again(self, conversations: set[str]) -> None:
        """The traces still assembled into these conversations wait again, so each gets a version without the
        traces that left it."""
        rows = self._assembled_into(conversations)
        self._wait_for(list(zip((row.trace_id for row in rows), self._assembled_since(rows), strict=True)))

    def _wait_for(self, traces: list[tuple[str, int]]) -> int:
        """These stored traces (each with the received_at, µs, its spans are no older than) wait for a quiet period
        under their strongest key, unless they wait already; how many were taken in."""
        keys = self._strongest_keys([trace for trace, _ in traces], min((s for _, s in traces), default=0))
        taken = 0
        # the lock a thousand traces at a time: the span writer notes each commit under it (an export waits for
        # that), and take_in after a full index takes up to max_waiting_traces (100,000 noted in one hold took
        # 0.23 s of CPU). Each trace is noted on its own, at the time of its hold (a time read before a commit noted
        # in between would make its conversation's last span older than that commit's)
        for start in range(0, len(traces), WAIT_FOR_AT_ONCE):
            with self._lock:
                now = time.monotonic()
                for trace, since in traces[start:start + WAIT_FOR_AT_ONCE]:
                    group = self._group_of.get(trace)
                    if group is None:
                        self._note(trace, keys.get(trace), now, since)
                        taken += 1
                    else:  # its stored spans may be older than its first commit noted, or newer than its last
                        self._newest[group] = UNBOUNDED
                        if since < self._first.get(group, since):  # waiting since a later commit: read from here
                            self._first[group] = since
        return taken

    def _wait_with_active(self, due: dict[str, _Due], owners: dict[str, str],
                          conversations: dict[str, set[str]]) -> None:
        """A due trace whose stored spans name a conversation that still has waiting, not yet quiet traces (a
        late span without a key, after an earlier assembly) joins that conversation's wait instead of having it
        assembled early."""
        with self._lock:
            active = {c for c in conversations if c in self._last and c not in due}  # still waiting
            for group, chosen in due.items():
                for trace in chosen.traces:
                    target = owners.get(trace, trace)
                    if target in active and self._group_of.get(trace) == group:
                        first_us, rank = self._first.get(group, 0), self._rank(trace, group)
                        newest_us = self._newest.get(group, UNBOUNDED)
                        self._leave(trace, group)
                        self._join(trace, target, first_us, rank, newest_us)
        for conversation_id in active:
            del conversations[conversation_id]

    def _strongest_keys(self, traces: set[str] | list[str], since_us: int = 0,
                        until_us: int | None = None) -> dict[str, tuple[int, str]]:
        """Each trace's strongest conversation key over all its stored spans (received from `since_us` on, up to
        `until_us`): (precedence, value)."""
        if not traces:
            return {}
        received, bounds = _received(since_us, until_us)
        with id_table(self.con, traces) as ids:
            # span_records, not the `spans` view: its joins (resources, scopes) were a third of these reads' CPU
            rows = self.con.execute(
                f"SELECT trace_id, min(rank), arg_min(key, rank) FROM (SELECT trace_id, {_RANK} AS rank, "
                f"conversation_key AS key FROM span_records WHERE {received} AND trace_id IN "
                f"(SELECT id FROM {ids}) AND conversation_key IS NOT NULL UNION ALL SELECT trace_id, {_ATTACHED}, "
                f"conversation_id FROM trace_attachments WHERE trace_id IN (SELECT id FROM {ids})) GROUP BY trace_id",
                bounds).fetchall()
        return {trace: (rank if rank is not None else _UNKEYED, key) for trace, rank, key in rows}

    def _trace_keys(self, traces: set[str], since_us: int, until_us: int | None) -> dict[str, str]:
        """Each trace's conversation: the highest-precedence key on any of its spans (as the mapping does)."""
        return {trace: key for trace, (_, key) in
                self._strongest_keys(traces, since_us, until_us).items()}

    def _assembled(self, traces: set[str]) -> list[Assembled]:
        """(trace, conversation, its oldest span's received_at in µs or None, ...) of these traces, assembled
        before."""
        return self.index.by_trace(traces)

    def _assembled_into(self, keys: set[str]) -> list[Assembled]:
        """The same, of every trace assembled before into one of these conversations: their earlier traces (a
        trace belongs to its strongest key's conversation; one that gets a stronger key waits again)."""
        return self.index.by_conversation(keys)

    @staticmethod
    def _assembled_since(rows: list[Assembled]) -> list[int]:
        """The received_at bound (µs) these traces' spans need; 0 where it is not known (traces assembled by a
        version that did not keep it)."""
        return [row.first_us if row.first_us is not None else 0 for row in rows]

    def _batches(self, conversations: dict[str, set[str]], since_us: int, until_us: int | None,
                 kept: dict[str, KeptTrace]) -> _Work:
        """The conversations in batches of a bounded number of spans to read back (the spans received from
        `since_us` to `until_us`, of every trace not `kept` from before); one too large to assemble is marked
        assembled and left out."""
        unread = set().union(*conversations.values()) - kept.keys()
        received, bounds = _received(since_us, until_us)
        with id_table(self.con, unread) as ids:
            counts = dict(self.con.execute(
                f"SELECT trace_id, count(*) FROM span_records WHERE {received} AND trace_id IN "
                f"(SELECT id FROM {ids}) GROUP BY trace_id", bounds).fetchall())
        counts.update((t, k.spans) for t, k in kept.items())
        limit = self.settings.conversations.max_spans
        sizes: dict[str, int] = {}  # conversation -> its spans to read
        for conversation_id, members in conversations.items():
            count = sum(counts.get(t, 0) for t in members)
            if count > limit:  # bounded by design: one huge conversation must not take the server's memory
                self.log.warning("conversation too large to assemble", conversation_id=conversation_id,
                                 spans=count, max_spans=limit,
                                 advice="raise [conversations] max_spans if it is a real conversation")
                self._mark_assembled({conversation_id: members}, {}, {})
                continue
            sizes[conversation_id] = sum(counts.get(t, 0) for t in members if t not in kept)
        # at least a batch per worker, so a poll keeps them all busy, of about even size: filled up to
        # SPANS_PER_READ, a poll of 512 conversations was read 250 + 250 + 12, and the last read cost about what a
        # full one did; a conversation goes to the next batch when this one is nearer its share without it (the
        # last batch takes the rest)
        total = sum(sizes.values())
        reads = max(self.pool.workers, -(-total // SPANS_PER_READ))
        per_batch = max(1, -(-total // max(1, reads)))
        batches: list[list[str]] = [[]]
        size = 0
        for conversation_id, count in sizes.items():
            nearer = len(batches) < reads and abs(size + count - per_batch) > abs(size - per_batch)
            if batches[-1] and (nearer or size + count > SPANS_PER_READ):
                batches.append([])
                size = 0
            batches[-1].append(conversation_id)
            size += count
        return _Work(deque(b for b in batches if b))

    def _send(self, poll: _Poll, in_flight: int) -> None:
        """Read and send the poll's next batches until `in_flight` of them are with the workers."""
        work = poll.work
        while work.batches and len(work.in_flight) < in_flight:
            work.in_flight.append(self._read_and_submit(work.batches.popleft(), poll.conversations, poll.since_us,
                                                        poll.until_us, poll.kept, poll.going_on))

    def _finish_all(self, poll: _Poll) -> tuple[set[str], dict[str, KeptTrace]]:
        """Build every batch of the poll, then compose and write every conversation. The ids that failed (retried
        after another quiet period) and the traces mapped of the conversations going on (to keep: most
        conversations arrive within one quiet period and never need them again)."""
        # read ahead while the workers build: every worker busy, one batch more waiting, no more rows in memory;
        # what comes back (the built conversations) is small, and is written once the whole poll is built, so the
        # context traces are matched to their conversations over all of it, whichever batch each came in
        work = poll.work
        try:
            while work.batches or work.in_flight:
                self._send(poll, self.pool.workers + 1)
                self._collect(work.in_flight.popleft(), poll.conversations, poll.kept, work.result, work.local)
        finally:  # a read that failed: what was sent is waited for (its files removed), and the poll retried
            self.abandon(poll)
        mapped: dict[str, KeptTrace] = {}
        with self._stage("write"):
            failed = self._write_built(work.result, work.local, poll.conversations, poll.since_us, poll.kept, mapped,
                                       poll.going_on, poll.unjudged)
        return failed, mapped

    def _read_and_submit(self, batch: list[str], conversations: dict[str, set[str]], since_us: int,
                         until_us: int | None, kept: dict[str, KeptTrace], going_on: set[str]) -> _Batch:
        """Read these conversations' spans and send those seen for the first time (nearly all) to the workers;
        those that went on are built here, where the traces kept from their earlier versions are."""
        with self._stage("read"):
            read = self._read_batch(batch, conversations, since_us, until_us, kept, going_on)
            # without workers the pool built the batch at submit, in this thread: that is the build stage's
            built = _built_here_cpu(read.future)
            self.cpu_seconds["read"] -= built
            self.cpu_seconds["build"] += built
        return read

    def _read_batch(self, batch: list[str], conversations: dict[str, set[str]], since_us: int,
                    until_us: int | None, kept: dict[str, KeptTrace], going_on: set[str]) -> _Batch:
        unread = {t for c in batch for t in conversations[c]} - kept.keys()
        started = time.perf_counter()
        self.con.execute("BEGIN TRANSACTION")  # the spans and their resources from one snapshot: none pruned between
        try:
            with id_table(self.con, unread) as ids:
                # every stored copy of a span: the last received counts, once (`conversation_builder.latest_copies`)
                received, bounds = _received(since_us, until_us)
                table = arrow_table(
                    self.con, f"SELECT {SPAN_SELECT} FROM span_records WHERE {received} AND trace_id IN "
                    f"(SELECT id FROM {ids})", bounds)
            scopes, resources = self._dictionaries(set(pc.unique(table.column("scope_id")).to_pylist()),
                                                   set(pc.unique(table.column("resource_id")).to_pylist()))
        finally:
            with contextlib.suppress(duckdb.Error):  # read only: nothing to keep or lose
                self.con.execute("ROLLBACK")
        self.read_seconds += time.perf_counter() - started
        self.read_spans += table.num_rows
        here = [c for c in batch if c in going_on or not conversations[c].isdisjoint(kept)]
        there = {c: sorted(conversations[c]) for c in batch if c not in set(here)}
        future = self.pool.submit(
            _only(table, [t for traces in there.values() for t in traces]) if here else table, there, scopes, resources)
        return _Batch(list(there), here,
                      _only(table, [t for c in here for t in conversations[c]]) if here else None, scopes, resources,
                      future)

    def _collect(self, read: _Batch, conversations: dict[str, set[str]], kept: dict[str, KeptTrace],
                 result: BatchResult, local: dict[str, list[KeptTrace]]) -> None:
        """Build what stayed here and wait for the workers' part of a batch, into `result` (and `local`: the traces
        mapped here)."""
        with self._stage("build"):
            local.update(self._build_here(read.here, conversations, read.local_rows, read.scopes, read.resources,
                                          kept, result))
        started = time.monotonic()
        built_there = self.pool.result(read.future, read.there)
        self.pool_wait_s += time.monotonic() - started
        if not built_there.here:  # a worker's CPU (one built here at submit was counted as it was read)
            self.cpu_seconds["build"] += built_there.cpu_s
        result.built.update(built_there.built)
        result.failed.update(built_there.failed)
        result.parts.update(built_there.parts)

    def _write_built(self, result: BatchResult, local: dict[str, list[KeptTrace]],
                     conversations: dict[str, set[str]], since_us: int, kept: dict[str, KeptTrace],
                     mapped: dict[str, KeptTrace], going_on: set[str], unjudged: set[str]) -> set[str]:
        """Write the conversations built (those `unjudged` without judged jobs), mark their traces assembled and
        attach context traces; the traces mapped here of those `going_on` go to `mapped`. The ids that failed."""
        for conversation_id, reason in result.failed.items():
            self._failed(conversation_id, reason)
        failed = set(result.failed)
        built = {c: [b] if b is not None else [] for c, b in result.built.items()}
        attach = self._plan_attachments(result.parts)
        failed |= self._write_all(built, unjudged=set(attach.values()) | unjudged)
        done = {c: parts for c, parts in result.parts.items() if c not in failed}
        for conversation_id in done:
            if conversation_id in going_on:
                mapped.update((p.trace_id, p) for p in local.get(conversation_id, []) if p.trace_id not in kept)
        # the newest span assembled, not the clock: a span committed meanwhile is still newer after a restart; each
        # trace's own (the conversation's newest hid a late span of an older trace, received before the newest but
        # committed after the read, from take_in), the conversation's for a trace with no span read
        newest = {p.trace_id: p.newest for parts in done.values() for p in parts}
        latest = {c: max((p.newest for p in parts), default=datetime.now(UTC)) for c, parts in done.items()}
        marked = {c: conversations[c] - kept.keys() for c in done}  # a kept trace's row is newer than its spans
        self._mark_assembled(marked, {t: newest.get(t, latest[c]) for c, traces in marked.items() for t in traces},
                             {p.trace_id: p.first for parts in done.values() for p in parts})
        attach = {trace: owner for trace, owner in attach.items() if owner not in failed}
        self._attached_to = set(attach.values())
        if attach:
            self._attach(attach, since_us)
        return failed

    def _build_here(self, here: list[str], conversations: dict[str, set[str]], table: pa.Table | None,
                    scopes: Scopes, resources: Resources, kept: dict[str, KeptTrace],
                    result: BatchResult) -> dict[str, list[KeptTrace]]:
        """Build in this process the conversations with traces kept from before (into `result`); their mapped
        traces, for the cache."""
        rows = rows_by_conversation(ArrowColumns(table), {c: list(conversations[c]) for c in here}) \
            if table is not None else ((c, {}) for c in here)
        local: dict[str, list[KeptTrace]] = {}
        for conversation_id, by_trace in rows:
            try:
                parts = [kept.get(t) or map_trace(by_trace[t], scopes, resources, self._attribute_keys)
                         for t in conversations[conversation_id] if t in kept or t in by_trace]
                result.built[conversation_id] = build(conversation_id, parts, self.build_config)
            except Exception as exc:  # one bad conversation must not hold up the others; it is retried later
                result.failed[conversation_id] = f"{type(exc).__name__}: {exc}"
                continue
            local[conversation_id] = parts
            result.parts[conversation_id] = [TracePart.of(p) for p in parts]
        return local

    def _plan_attachments(self, parts_of: dict[str, list[TracePart]]) -> dict[str, str]:
        """Context traces (MCP calls outside any run, no key of their own) that join the one conversation sharing
        their MCP session: decided after the whole batch is known (the conversations of the batch first, so which
        comes first in it does not decide), from the sessions remembered as conversations are assembled, in
        whichever order they come. Context trace -> its conversation; a conversation that gets context now is
        written without jobs, since its next version (with the context) follows within a quiet period."""
        context: dict[str, frozenset[str]] = {}
        for conversation_id, parts in parts_of.items():
            mapped = [p for p in parts if p.mapped]
            sessions = frozenset(s for p in mapped for s in p.sessions)
            if mapped and all(p.context_trace for p in mapped):
                context[conversation_id] = sessions
            else:
                self.sessions.owned(conversation_id, sessions)
        attach: dict[str, str] = {}
        candidates = set(context) | self.sessions.waiting_for(s for ss in context.values() for s in ss) | \
            self.sessions.waiting_for(s for c, parts in parts_of.items() if c not in context
                                      for p in parts for s in p.sessions)
        for candidate in candidates:  # a context conversation's id is its one trace's id
            sessions = context.get(candidate) or self.sessions.sessions_of(candidate)
            owner = self.sessions.owner(sessions)
            if owner is not None:
                attach[candidate] = owner
                self.sessions.forget(candidate)
            elif candidate in context:
                self.sessions.wait(candidate, sessions)
        return attach

    def _attach(self, attach: dict[str, str], since_us: int) -> None:
        """Give each context trace its conversation's key and let it wait again; drop the context-only
        conversations they were (never scored: nothing else refers to them) and the traces' assembled rows (so a
        restart before the conversation's next version takes them in again). Each waits from its own oldest span:
        a context trace held from an earlier poll is older than this poll's spans (`since_us`)."""
        try:
            found = self._assembled(set(attach))
            oldest = {row.trace_id: first for row, first in zip(found, self._assembled_since(found), strict=True)}
        except (duckdb.Error, sqlite3.Error):  # not known: they wait from the start of the table
            oldest = {}
        since = [(trace, min(since_us, oldest.get(trace, 0))) for trace in attach]
        now = datetime.now(UTC)
        rows = pa.table({"trace_id": list(attach), "conversation_id": list(attach.values()),
                         "attached_at": pa.array([now] * len(attach), _UTC_US)})
        change = Change(remove=list(attach))
        with registered(self.con, rows) as name, id_table(self.con, attach) as ids:
            def work() -> None:
                self.con.execute(f"INSERT OR REPLACE INTO trace_attachments SELECT * FROM {name}")
                self.index.delete_earlier(self.con, ids, self.index.marks(attach))
                for table in ("conversations", "conversation_summary", "call_summary"):
                    status = f" AND status = '{CONTEXT_ONLY}'" if table == "conversations" else ""
                    self.con.execute(f"DELETE FROM {table} WHERE conversation_id IN (SELECT trace_id FROM {name})"
                                     + status)
                # what versions those conversations have left (none, unless one was more than context once), in
                # place of what the index held (dropped first: an upsert would keep the newer time of the deleted)
                change.versions = [Latest(*row) for row in self.con.execute(
                    f"{LATEST_VERSIONS} WHERE conversation_id IN (SELECT id FROM {ids}) GROUP BY conversation_id"
                ).fetchall()]
                change.drop_versions = list(attach)
            try:
                self.index.write(self.con, work, change)
            except duckdb.Error as exc:  # they wait again: their next assembly tries once more
                self.log.warning("context not attached", traces=len(attach), reason=str(exc))
                self._attached.extend(since)
                return
        for trace, conversation_id in attach.items():
            self.log.info("context attached", trace_id=trace, conversation_id=conversation_id)
        self._attached.extend(since)  # waits again once this round forgets it

    def _failed(self, conversation_id: str, reason: str) -> None:
        self.log.error("assembly failed", conversation_id=conversation_id, reason=reason)

    def _mark_assembled(self, conversations: dict[str, set[str]], newest: dict[str, datetime],
                        first: dict[str, datetime]) -> None:
        """Each trace's conversation, its newest span assembled (a restart or `take_in` re-queues what came after)
        and its oldest (later reads of it start there; None: not read). One row a trace: `assembled_traces` has no key
        (its index made every checkpoint, and the exports waiting on it, longer as it grew), so a trace's earlier
        row is deleted in the same transaction, found by when it was written (`AssembledIndex.delete_earlier`)."""
        if not conversations:
            return
        now = datetime.now(UTC)
        marked_us = epoch_us(now)
        owner = {t: c for c, members in conversations.items() for t in members}  # a trace once (the last naming it)
        traces = list(owner)
        firsts = [first.get(t) for t in traces]
        table = pa.table({
            "trace_id": traces,
            "conversation_id": [owner[t] for t in traces],
            "assembled_at": pa.array([newest.get(t, now) for t in traces], _UTC_US),
            "first_received_at": pa.array(firsts, _UTC_US),
            "marked_at": pa.array([marked_us] * len(traces), _UTC_US),
        })
        rows = [Assembled(t, owner[t], None if f is None else epoch_us(f),
                          marked_us) for t, f in zip(traces, firsts, strict=True)]
        with registered(self.con, table) as name, id_table(self.con, traces) as ids:
            def work() -> None:
                marks = self.index.marks(traces)  # most traces are new: no row, nothing to delete
                if marks:
                    self.index.delete_earlier(self.con, ids, marks)
                self.con.execute(f"INSERT INTO assembled_traces BY NAME SELECT * FROM {name}")
                if self._replays_waiting:
                    self.con.execute(f"DELETE FROM journal_replays WHERE trace_id IN (SELECT id FROM {ids})")
            self.index.write(self.con, work, Change(put=rows))

    def _dictionaries(self, scope_ids: set[int], resource_ids: set[int]) -> tuple[Scopes, Resources]:
        """The scopes (name, version) and resources (parsed attributes) these spans refer to, each read once."""
        with id_table(self.con, scope_ids, pa.int64()) as ids:
            scopes = {i: (n, v) for i, n, v in self.con.execute(
                f"SELECT scope_id, name, version FROM span_scopes WHERE scope_id IN (SELECT id FROM {ids})").fetchall()}
        with id_table(self.con, resource_ids, pa.int64()) as ids:
            resources = {i: json.loads(text) for i, text in self.con.execute(
                f"SELECT resource_id, attributes FROM span_resources WHERE resource_id IN (SELECT id FROM {ids})"
            ).fetchall()}
        return scopes, resources

    def _write_all(self, built: dict[str, list[Built]], unjudged: set[str] | None = None) -> set[str]:
        """Write a batch's new versions (`write_versions`); when that fails, each conversation alone, so one that
        cannot be written does not hold up the rest (those written already are found stored). The ids that
        failed."""
        try:
            self.write_versions([b for items in built.values() for b in items], unjudged)
            return set()
        except Exception as exc:
            if len(built) == 1:
                self._failed(next(iter(built)), f"{type(exc).__name__}: {exc}")
                return set(built)
        failed = set()
        for conversation_id, items in built.items():
            try:
                self.write_versions(items, unjudged)
            except Exception as exc:
                self._failed(conversation_id, f"{type(exc).__name__}: {exc}")
                failed.add(conversation_id)
        return failed

    def write_versions(self, built: list[Built], unjudged: set[str] | None = None) -> list[int | None]:
        """A new version of each conversation whose content changed, with its jobs, its UI summary rows and the
        scores of the checks that ran as it was built; per conversation its version, or None when this content is
        already stored (or its spans were pruned). What is stored is looked up once for all of them. While exports
        come in (the span writer committed since the last write) they are written `WRITE_AT_ONCE` to a transaction:
        a poll of 512 in one held the database and a core for about 200 ms, and the exports committing meanwhile
        waited that long. Otherwise all in one: each commit syncs the WAL, and four a poll always put the last score
        1-2 s later at 45,000 spans/s (`python bench/pipeline_pace.py`; a commit per conversation cost 7 ms of CPU)."""
        if not built:
            return []
        busy = self._writer_busy()
        at_once = WRITE_AT_ONCE if busy > self._busy_at_write else len(built)
        self._busy_at_write = busy
        with id_table(self.con, {b.conversation_id for b in built}) as ids:
            pruned = {cid for (cid,) in self.con.execute(
                f"SELECT conversation_id FROM pruned_conversations WHERE conversation_id IN (SELECT id FROM {ids})"
            ).fetchall()}
        latest: dict[str, tuple[int, str]] = {}
        previous: dict[str, str | None] = {}  # each conversation's latest inclusion probabilities
        for newest in self.index.latest(b.conversation_id for b in built):  # not a scan of every version ever
            latest[newest.conversation_id] = (newest.version, newest.content_hash)
            previous[newest.conversation_id] = newest.inclusion
        # pruned: nothing to write, logged once everything is written (a poll retried one by one counts them once)
        late = [b for b in built if b.conversation_id in pruned]
        versions: list[int | None] = []
        for start in range(0, len(built), at_once):
            versions += self._write_chunk(built[start:start + at_once], pruned, latest, previous, unjudged)
        for b in late:
            self.late_after_prune += 1
            self.log.warning("late spans for a pruned conversation: stored, not assembled",
                             conversation_id=b.conversation_id, traces=len(b.trace_ids))
        return versions

    def _write_chunk(self, built: list[Built], pruned: set[str], latest: dict[str, tuple[int, str]],
                     previous: dict[str, str | None], unjudged: set[str] | None) -> list[int | None]:
        """`write_versions` for some of its conversations, in one transaction; `latest` takes the versions they
        get."""
        now = datetime.now(UTC)
        now_us = epoch_us(now)
        metrics = self.settings.scoring.metrics
        versions: list[int | None] = []
        out = _Rows(now)
        counted: dict[tuple[str, str], int] = {}  # new conversations per cohort value, for the new_cohort rules
        if self._new_cohorts:
            self._cohort_counts = self._counts_of(built)
        written: list[tuple[Built, int, list[str]]] = []  # logged once they are committed
        for b in built:
            cid = b.conversation_id
            if cid in pruned:  # its earlier spans were pruned by retention: the rest would be a truncated conversation
                versions.append(None)
                continue
            last = latest.get(cid)
            if last is not None and last[1] == b.content_hash:
                versions.append(None)
                continue
            version = (last[0] if last else 0) + 1
            latest[cid] = (version, b.content_hash)
            found = set(b.findings)
            if self._new_cohorts and self._is_new(b.attributes, counted if version == 1 else None):
                found.add("new_cohort")
            value, sampled, inclusion = decide(self.settings.sampling, metrics, cid, b.service_name,
                                               b.agent_name, b.attributes, found)
            if previous.get(cid):  # a later version keeps the chance its conversation already had (sticky up)
                for metric, p in json.loads(previous[cid] or "{}").items():
                    if metric in inclusion and p > inclusion[metric]:
                        inclusion[metric] = p
                        sampled[metric] = sampled[metric] or value < p
            # MCP calls outside any run, in no known session: kept, never scored; a conversation about to get its
            # context: its next version is scored
            if b.context_only or cid in (unjudged or ()):
                sampled = dict.fromkeys(sampled, False)
            attributes = json.dumps({k: sorted(v) for k, v in sorted(b.attributes.items())})
            chances = json.dumps(inclusion)
            out.latest.append(Latest(cid, version, b.content_hash, chances, now_us))
            out.versions.append({
                "conversation_id": cid, "version": version, "content_hash": b.content_hash,
                "status": CONTEXT_ONLY if b.context_only else "complete", "key_source": b.key,
                "service_name": b.service_name, "agent_name": b.agent_name, "turns": b.turns, "mcp_calls": b.mcp_calls,
                "trace_ids": list(b.trace_ids), "first_span_ns": b.first_span_ns, "last_span_ns": b.last_span_ns,
                "test_case": b.test_case_json, "sample_value": value, "sampled": json.dumps(sampled),
                "assembled_at": now, "attributes": attributes, "inclusion": chances,
                "agent_usage": json.dumps({m: list(t) for m, t in b.usage.items()}) if b.usage else None})
            for metric, chosen in sampled.items():
                if not chosen:
                    continue
                check = b.checks.get(metric)
                out.jobs.append({"conversation_id": cid, "conversation_version": version, "metric": metric,
                                 "metric_config": self.metric_configs[metric],
                                 "status": "done" if check is not None else self.job_status(metric),
                                 "created_at": now, "updated_at": now})
                if check is not None:
                    out.checked.append(CheckedScore(cid, version, metric, check, b.service_name, b.agent_name,
                                                    b.last_span_ns, inclusion.get(metric), attributes))
            out.summaries.append({"conversation_id": cid, "version": version, "service_name": b.service_name,
                                  "agent_name": b.agent_name, "turns": b.turns, "mcp_calls": b.mcp_calls,
                                  "mcp_errors": b.mcp_errors, "assembled_at": now, "summary_note": None})
            out.calls.add(cid, version, b.calls)
            versions.append(version)
            written.append((b, version, [m for m, chosen in sampled.items() if chosen]))
        if out.versions:
            try:
                self._insert(out, counted)
            finally:
                self._cohort_counts = {}
        for b, version, queued in written:
            self.assembled += 1
            self.log.info("conversation complete", conversation_id=b.conversation_id, version=version,
                          turns=b.turns, mcp_calls=b.mcp_calls, metrics_queued=queued)
        if out.checked and self.on_checked is not None:
            try:
                self.on_checked(out.checked)
            except Exception as exc:  # committed: an observer failing must not make the batch look unwritten
                self.log.error("check scores written but not reported", reason=f"{type(exc).__name__}: {exc}")
        return versions

    def _counts_of(self, built: list[Built]) -> dict[tuple[str, str], int]:
        """The stored counts of the new_cohort rules' values these conversations hold."""
        keys = {rule.key for rule in self._new_cohorts}
        pairs = {(k, v) for b in built for k in keys for v in b.attributes.get(k, ())}
        if not pairs:
            return {}
        with registered(self.con, pa.table({"key": [k for k, _ in pairs], "value": [v for _, v in pairs]})) as name:
            return {(k, v): n for k, v, n in self.con.execute(
                f"SELECT c.key, c.value, c.conversations FROM cohort_counts c JOIN {name} p USING (key, value)"
            ).fetchall()}

    def _is_new(self, attributes: dict[str, set[str]], counted: dict[tuple[str, str], int] | None) -> bool:
        """Whether a conversation is among the first `first` of a value of a new_cohort rule's key; a first
        version (`counted` given) is counted, so the next one sees it."""
        new = False
        for rule in self._new_cohorts:
            for value in attributes.get(rule.key, ()):
                seen = self._cohort_counts.get((rule.key, value), 0)
                new = new or (rule.first is not None and seen < rule.first)
        if counted is not None:
            for key in {rule.key for rule in self._new_cohorts}:
                for value in attributes.get(key, ()):
                    self._cohort_counts[(key, value)] = self._cohort_counts.get((key, value), 0) + 1
                    counted[(key, value)] = counted.get((key, value), 0) + 1
        return new

    def _insert(self, out: _Rows, counted: dict[str, int] | dict[tuple[str, str], int] | None = None) -> None:
        """The versions, their jobs, summary rows and check scores, as Arrow appends in one transaction, with the
        cohort counts."""
        def work() -> None:
            if counted:
                self.con.executemany(
                    "INSERT INTO cohort_counts VALUES (?, ?, ?, now()) ON CONFLICT DO UPDATE SET "
                    "conversations = cohort_counts.conversations + excluded.conversations, last_seen_at = now()",
                    [[k, v, n] for (k, v), n in counted.items()])
            self._append("conversations", out.versions, _VERSION_SCHEMA)
            self._append("eval_jobs", out.jobs, _JOB_SCHEMA)
            if out.checked:
                self._append("scores", [checked_score_row(c.conversation_id, c.version, c.metric,
                                                          self.metric_configs[c.metric], c.check, c.service_name,
                                                          c.agent_name, c.last_span_ns, c.probability)
                                        for c in out.checked], SCORE_SCHEMA, "INSERT OR IGNORE")
            # the UI's summaries of the latest version: a later version replaces its conversation's row
            self._append("conversation_summary", out.summaries, _CONVERSATION_SUMMARY_SCHEMA, "INSERT OR REPLACE")
            later = [r for r in out.summaries if r["version"] > 1]  # a first version has no older calls to drop
            if later:  # the calls of a conversation's older versions: the UI lists its latest only
                with registered(self.con, pa.table({
                        "conversation_id": [r["conversation_id"] for r in later],
                        "version": pa.array([r["version"] for r in later], pa.int32())})) as name:
                    self.con.execute(f"DELETE FROM call_summary k USING {name} n WHERE k.conversation_id = "
                                     "n.conversation_id AND k.version < n.version")
            if out.calls.versions:
                with registered(self.con, out.calls.table(out.now)) as name:
                    self.con.execute(f"INSERT INTO call_summary BY NAME SELECT * FROM {name}")

        self.index.write(self.con, work, Change(versions=out.latest))

    def _append(self, table: str, rows: list[dict[str, object]], schema: pa.Schema, verb: str = "INSERT") -> None:
        if rows:
            with registered(self.con, pa.Table.from_pylist(rows, schema=schema)) as name:
                self.con.execute(f"{verb} INTO {table} BY NAME SELECT * FROM {name}")

    @contextlib.contextmanager
    def _stage(self, stage: str) -> Iterator[None]:
        """This thread's CPU in the block, counted to `stage` (and, inside an entry point, left out of its `plan`)."""
        started = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - started
            self.cpu_seconds[stage] += spent
            self._counting.inner += spent

    def waiting_traces(self) -> list[str]:
        """The traces waiting for their quiet period, those of a poll read and being built among them (they leave
        the waiting set once their versions are written): retention does not take them for never assembled."""
        with self._lock:
            return list(self._group_of)

    def pending_traces(self) -> int:
        """Traces waiting for their quiet period. Read without the lock (a dict's size is read whole): /metrics runs
        on the receivers' event loop, which must not wait while the assembler holds it."""
        return len(self._group_of)

    def pending_conversations(self) -> int:
        """Conversations waiting for their quiet period (no lock, as `pending_traces`: each gauge is read on its own,
        so the two may come from moments apart)."""
        return len(self._last)

