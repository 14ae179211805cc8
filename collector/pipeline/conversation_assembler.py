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
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracejudge.collector.config import Settings
from tracejudge.collector.log import Logger
from tracejudge.collector.pipeline.mapped_traces import ENTRY_OVERHEAD, TEXT_FACTOR, KeptTrace, MappedTraceCache
from tracejudge.collector.pipeline.sampling import (
    attribute_keys,
    attribute_values,
    decide,
    findings,
    model_usage,
    needs_findings,
)
from tracejudge.collector.pipeline.session_index import SessionIndex
from tracejudge.collector.receivers.span_rows import plain_strings
from tracejudge.collector.store.id_table import id_table, registered
from tracejudge.collector.store.transaction import in_transaction
from tracejudge.mapping import Conversation, Span, compose_conversation, map_traces
from tracejudge.mapping.conversation_key import KEY_PRECEDENCE, TRACE_KEY

MAX_PER_POLL = 256  # conversations assembled per poll: a backlog never hides a newly end-marked one for long
SPANS_PER_READ = 50_000  # spans read back in one query while assembling; bounds the assembler's memory
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
# from span_records, not the spans view: a batch's resources and scopes are read and parsed once each
# (`_dictionaries`), not joined onto every span and parsed again per span
_COLUMNS = ("trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message, "
            "scope_id, resource_id, attributes, events, links, received_at")
_Scopes = dict[int, tuple[str, str]]
_NO_SCOPE = ("", "")
_Resources = dict[int, dict]


# a rebuilt conversation, its attribute values (sampling filters' and cohorts' keys), its agent's tokens per model
_Built = tuple[Conversation, dict[str, set[str]], dict[str, tuple[int, int]]]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A span committed after its trace's first commit was received at most this much before that commit's oldest
# span (a request waits in the decode pool and the writer's queue for seconds; a retried export is stamped anew).
RECEIVED_SLACK = timedelta(hours=1)


class _Due(NamedTuple):
    last: float  # the conversation's last span (monotonic) when chosen: a later one means it changed meanwhile
    first_us: int  # received_at (µs) its waiting traces' spans are no older than, less RECEIVED_SLACK (0: unknown)
    traces: set[str]


def _calls(conversation: Conversation) -> int:
    return sum(len(t.mcp_tools_called or []) + len(t.mcp_resources_called or []) + len(t.mcp_prompts_called or [])
               for t in conversation.test_case.turns)


def _at(since_us: int) -> datetime:
    """A read's lower bound on received_at."""
    return _EPOCH + timedelta(microseconds=since_us)


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


class ConversationAssembler:
    """Keeps, in memory and updated from each commit, which traces wait and which conversation each belongs
    to, so a poll costs what changed and what is due, not the size of the quiet window."""

    def __init__(self, con: duckdb.DuckDBPyConnection, settings: Settings, logger: Logger,
                 job_status: Callable[[str], str], metric_configs: dict[str, str],
                 writer_busy_s: Callable[[], float] | None = None) -> None:
        self.con = con
        self.settings = settings
        self.log = logger
        self.job_status = job_status  # metric -> the status a new job starts in
        self.metric_configs = metric_configs  # metric -> config hash (part of the job and score key)
        self._attribute_keys = attribute_keys(settings.sampling, settings.cohorts.attributes)
        self._new_cohorts = [rule for rule in settings.sampling.rules if rule.when == "new_cohort"]
        self._cohort_counts: dict[tuple[str, str], int] | None = None  # read once, then kept as it is written
        self.writer_busy_s = writer_busy_s  # the span writer's seconds spent committing so far (None: not known)
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
        self._ended: set[str] = set()  # traces with a span that carried the end marker
        self.cache = MappedTraceCache(settings.conversations.trace_cache)  # traces assembled before, mapped
        self.sessions = SessionIndex(SESSIONS_KEPT)  # MCP sessions -> their conversation, context waiting on them
        self._attached: list[tuple[str, int]] = []  # context traces attached this round, to wait again after it
        self._lock = threading.Lock()
        # received_at (µs) from which traces were stored without a place in the index (it was full), or since
        # which a restart must look: they are taken in as it has room (None: nothing left out)
        self._left_out_since: int | None = None
        self.left_out = 0  # traces left out of the full index (taken in later), since the start
        self.assembled = 0
        self.late_after_prune = 0  # conversations that got spans after retention pruned theirs (not assembled)

    def observe(self, table: pa.Table) -> None:
        """Called by the span writer after each commit (its thread)."""
        keys = _commit_keys(table)
        traces = pc.unique(table.column("trace_id")).to_pylist()
        end_marked = pc.match_substring(plain_strings(table.column("attributes")), END_MARKER)
        ended = table.filter(end_marked).column("trace_id")
        oldest = pc.min(table.column("received_at")).value
        first_us = max(0, (oldest or 0) - RECEIVED_SLACK // timedelta(microseconds=1))
        limit = self.settings.conversations.max_waiting_traces
        with self._lock:
            now = time.monotonic()
            for trace in traces:
                if self.cache.size:
                    self.cache.discard(trace)  # its mapped part no longer holds: it is read again when it is due
                if len(self._group_of) >= limit and trace not in self._group_of:
                    self._leave_out(first_us)
                    continue
                self._note(trace, keys.get(trace), now, first_us)
            self._ended.update(t for t in ended.to_pylist() if t in self._group_of)

    def _leave_out(self, first_us: int) -> None:
        """A new trace finds the index full: it is stored, and taken in by `take_in` once there is room; the lock is
        held."""
        if self._left_out_since is None:
            self.log.warning("the waiting index is full: new traces are stored and assembled once it has room",
                             max_waiting_traces=self.settings.conversations.max_waiting_traces,
                             advice="a shorter [conversations] quiet_period_s holds fewer traces at this traffic; "
                                    "raise max_waiting_traces to give the index more memory (about 250 bytes a trace)")
        self._left_out_since = min(first_us, self._left_out_since if self._left_out_since is not None else first_us)
        self.left_out += 1

    def _note(self, trace: str, key: tuple[int, str] | None, now: float, first_us: int) -> None:
        """A trace has new spans (`key`: their strongest conversation key; none received before `first_us`); the
        lock is held."""
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
                self._leave(trace, old)
            self._join(trace, group, first_us, rank)
        elif key is not None and rank == key[0]:  # a stronger key naming the same conversation
            self._set_rank(trace, group, rank)
        self._last[group] = now
        self._last.move_to_end(group)

    def _join(self, trace: str, group: str, first_us: int, rank: int) -> None:
        """The trace waits with this conversation from now on (its spans received from `first_us` on, its key of
        precedence `rank`); the lock is held."""
        self._first[group] = min(first_us, self._first.get(group, first_us))
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
        self._key_rank.pop(group, None)
        return True

    def recover(self) -> None:
        """After a restart: every trace with spans newer than its last assembly waits for a quiet period again (as
        many as the index holds; the rest as it has room)."""
        with self._lock:
            self._left_out_since = 0  # its spans may be as old as the file
        self.take_in()

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
            "max(received_at) AS last FROM spans WHERE received_at >= ? GROUP BY trace_id) s "
            "LEFT JOIN assembled_traces a USING (trace_id) WHERE a.assembled_at IS NULL OR s.last > a.assembled_at "
            "ORDER BY s.first, s.trace_id LIMIT ?", [_at(since), room + 1]).fetchall()
        taken = self._wait_for([(trace, since) for trace, _ in rows[:room]])
        with self._lock:
            if self.left_out == left_out:  # what is left starts at the first trace not taken (less the slack)
                self._left_out_since = (max(0, rows[room][1] - RECEIVED_SLACK // timedelta(microseconds=1))
                                        if len(rows) > room else None)
            # else traces were left out meanwhile, maybe after the query: look again from the same mark
        return taken

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            done = 0
            started, busy = time.monotonic(), self._writer_busy()
            try:
                await asyncio.to_thread(self.take_in)
                done = await asyncio.to_thread(self.assemble_due, False, MAX_PER_POLL)
            except Exception as exc:  # a bad conversation must not stop the loop; it is logged and retried
                self.log.error("assembly failed", reason=f"{type(exc).__name__}: {exc}")
            # a backlog: go on at once (looking again for end-marked conversations first), unless ingest presses
            wait = max(0.0 if done >= MAX_PER_POLL else self.settings.conversations.poll_s,
                       self.pause_for_ingest(time.monotonic() - started, self._writer_busy() - busy))
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)

    def _writer_busy(self) -> float:
        return self.writer_busy_s() if self.writer_busy_s is not None else 0.0

    def pause_for_ingest(self, spent_s: float, writer_busy_s: float) -> float:
        """How long to pause after a full batch that took `spent_s`, during which the span writer was committing
        for `writer_busy_s`. Both share two cores and one database: when the writer was busy half the time or
        more, the assembler keeps to `[conversations] share_under_load` so exports stay fast (its backlog waits,
        stored); otherwise it goes on at once."""
        share = self.settings.conversations.share_under_load
        if spent_s <= 0 or writer_busy_s < spent_s / 2 or share >= 1:
            return 0.0
        return spent_s * (1 - share) / share

    def _due(self, force: bool, limit: int | None) -> dict[str, _Due]:
        """End-marked conversations first, then those quiet for the quiet period, oldest first."""
        quiet = self.settings.conversations.quiet_period_s
        now = time.monotonic()
        with self._lock:
            chosen = list(dict.fromkeys(self._group_of[t] for t in self._ended if t in self._group_of))
            for group, last in self._last.items():
                if limit is not None and len(chosen) >= limit:
                    break
                if not force and now - last < quiet:
                    break  # ordered by last span: every later one is newer still
                if group not in chosen:
                    chosen.append(group)
            return {g: _Due(self._last[g], self._first.get(g, 0), self._traces_of(g)) for g in chosen[:limit]}

    def assemble_due(self, force: bool = False, limit: int | None = None) -> int:
        """Assemble the conversations that are complete (all of them with `force`), end-marked ones first, at
        most `limit` in this call; how many were assembled."""
        due = self._due(force, limit)
        if not due:
            return 0
        waiting = set().union(*(d.traces for d in due.values()))
        # a waiting trace assembled before (a late span) has older spans: as old as its first assembly says
        since = min(d.first_us for d in due.values())
        assembled_before = self._assembled(waiting)
        since = min([since, *self._assembled_since(assembled_before)])
        owners = self._trace_keys(waiting, since)  # the stored spans decide: a late span may carry no key itself
        # a trace that a stronger key moved to another conversation leaves its old one short of it
        moved = {trace: old for trace, old, _ in assembled_before if old != owners.get(trace, trace)}
        conversations: dict[str, set[str]] = {}
        for trace in waiting:
            conversations.setdefault(owners.get(trace, trace), set()).add(trace)
        if not force:
            self._wait_with_active(due, owners, conversations)
        keyed = {c for c in conversations if c in owners.values()}
        kept: dict[str, KeptTrace] = {}
        going_on: set[str] = set()  # conversations that had traces assembled before: their traces are kept mapped
        if keyed:  # the conversation's earlier traces, assembled before, belong to it too
            earlier = self._assembled_into(keyed)
            with self._lock:  # mapped before and unchanged since: neither read nor mapped again
                for trace, into, _ in earlier:
                    hit = self.cache.get(trace) if trace not in waiting else None
                    if hit is not None:
                        kept[trace] = hit
                        if hit.mapped is not None:  # a trace with no key of its own belongs where it was attached
                            unkeyed = hit.mapped.key == TRACE_KEY
                            owners.setdefault(trace, into if unkeyed else hit.mapped.conversation_id)
            unread = [row for row in earlier if row[0] not in kept]
            since = min([since, *self._assembled_since(unread)])
            owners.update(self._trace_keys({t for t, _, _ in unread} - set(owners), since))
            for trace, key, _ in earlier:
                if owners.get(trace, trace) == key:
                    conversations[key].add(trace)
                    going_on.add(key)
        failed, mapped = self._assemble_all(conversations, since, kept, going_on)
        # once the trace is in its new conversation's version, its old one gets a version without it
        left = {old for trace, old in moved.items()
                if owners.get(trace, trace) in conversations and owners.get(trace, trace) not in failed}
        done = 0
        with self._lock:
            now = time.monotonic()
            for group, chosen in due.items():
                if any(owners.get(t, t) in failed for t in chosen.traces):
                    if self._last.get(group) == chosen.last:
                        self._last[group] = now  # wait another quiet period before the next try
                        self._last.move_to_end(group)
                    continue
                self._forget(group, chosen.last)
                done += 1
            for trace, part in mapped.items():
                if trace not in self._group_of:  # a trace with spans committed since its read waits to be read again
                    self.cache.put(trace, part)
        if left:
            self._wait_again(left)
        if self._attached:
            attached, self._attached = self._attached, []
            self._wait_for(attached)
        return done

    def _wait_again(self, conversations: set[str]) -> None:
        """The traces still assembled into these conversations wait again, so each gets a version without the
        traces that left it."""
        rows = self._assembled_into(conversations)
        self._wait_for(list(zip((trace for trace, _, _ in rows), self._assembled_since(rows), strict=True)))

    def _wait_for(self, traces: list[tuple[str, int]]) -> int:
        """These stored traces (each with the received_at, µs, its spans are no older than) wait for a quiet period
        under their strongest key, unless they wait already; how many were taken in."""
        keys = self._strongest_keys([trace for trace, _ in traces], min((s for _, s in traces), default=0))
        now = time.monotonic()
        taken = 0
        with self._lock:
            for trace, since in traces:
                if trace not in self._group_of:
                    self._note(trace, keys.get(trace), now, since)
                    taken += 1
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
                        self._leave(trace, group)
                        self._join(trace, target, first_us, rank)
        for conversation_id in active:
            del conversations[conversation_id]

    def _strongest_keys(self, traces: set[str] | list[str], since_us: int = 0) -> dict[str, tuple[int, str]]:
        """Each trace's strongest conversation key over all its stored spans (received from `since_us` on):
        (precedence, value)."""
        if not traces:
            return {}
        with id_table(self.con, traces) as ids:
            rows = self.con.execute(
                f"SELECT trace_id, min(rank), arg_min(key, rank) FROM (SELECT trace_id, {_RANK} AS rank, "
                f"conversation_key AS key FROM spans WHERE received_at >= ? AND trace_id IN (SELECT id FROM {ids}) "
                f"AND conversation_key IS NOT NULL UNION ALL SELECT trace_id, {_ATTACHED}, conversation_id FROM "
                f"trace_attachments WHERE trace_id IN (SELECT id FROM {ids})) GROUP BY trace_id",
                [_at(since_us)]).fetchall()
        return {trace: (rank if rank is not None else _UNKEYED, key) for trace, rank, key in rows}

    def _trace_keys(self, traces: set[str], since_us: int) -> dict[str, str]:
        """Each trace's conversation: the highest-precedence key on any of its spans (as the mapping does)."""
        return {trace: key for trace, (_, key) in self._strongest_keys(traces, since_us).items()}

    def _assembled(self, traces: set[str]) -> list[tuple[str, str, int | None]]:
        """(trace, conversation, its oldest span's received_at in µs or None) of these traces, assembled before."""
        with id_table(self.con, traces) as ids:
            return self._assembled_rows(f"trace_id IN (SELECT id FROM {ids})")

    def _assembled_into(self, keys: set[str]) -> list[tuple[str, str, int | None]]:
        """The same, of every trace assembled before into one of these conversations: their earlier traces (a
        trace belongs to its strongest key's conversation; one that gets a stronger key waits again)."""
        with id_table(self.con, keys) as ids:
            return self._assembled_rows(f"conversation_id IN (SELECT id FROM {ids})")

    def _assembled_rows(self, where: str) -> list[tuple[str, str, int | None]]:
        return self.con.execute(f"SELECT trace_id, conversation_id, epoch_us(first_received_at) FROM "
                                f"assembled_traces WHERE {where}").fetchall()

    @staticmethod
    def _assembled_since(rows: list[tuple[str, str, int | None]]) -> list[int]:
        """The received_at bound (µs) these traces' spans need; 0 where it is not known (traces assembled by a
        version that did not keep it)."""
        slack = RECEIVED_SLACK // timedelta(microseconds=1)
        return [max(0, first - slack) if first is not None else 0 for _, _, first in rows]

    def _assemble_all(self, conversations: dict[str, set[str]], since_us: int, kept: dict[str, KeptTrace],
                      going_on: set[str]) -> tuple[set[str], dict[str, KeptTrace]]:
        """Read back (the spans received from `since_us` on) every trace not `kept` from before, map it, then
        compose and write every conversation, a bounded number of spans per query. The ids that failed (retried
        after another quiet period) and the traces mapped of the conversations `going_on` (to keep: most
        conversations arrive within one quiet period and never need them again)."""
        unread = set().union(*conversations.values()) - kept.keys()
        with id_table(self.con, unread) as ids:
            counts = dict(self.con.execute(
                f"SELECT trace_id, count(*) FROM spans WHERE received_at >= ? AND trace_id IN (SELECT id FROM {ids}) "
                "GROUP BY trace_id", [_at(since_us)]).fetchall())
        counts.update((t, k.spans) for t, k in kept.items())
        limit = self.settings.conversations.max_spans
        failed: set[str] = set()
        mapped: dict[str, KeptTrace] = {}
        batch: list[str] = []
        size = 0
        for conversation_id, members in conversations.items():
            count = sum(counts.get(t, 0) for t in members)
            if count > limit:  # bounded by design: one huge conversation must not take the server's memory
                self.log.warning("conversation too large to assemble", conversation_id=conversation_id,
                                 spans=count, max_spans=limit,
                                 advice="raise [conversations] max_spans if it is a real conversation")
                self._mark_assembled({conversation_id: members}, {}, {})
                continue
            unread_count = sum(counts.get(t, 0) for t in members if t not in kept)
            if batch and size + unread_count > SPANS_PER_READ:
                failed |= self._assemble_batch(batch, conversations, since_us, kept, mapped, going_on)
                batch, size = [], 0
            batch.append(conversation_id)
            size += unread_count
        if batch:
            failed |= self._assemble_batch(batch, conversations, since_us, kept, mapped, going_on)
        return failed, mapped

    def _assemble_batch(self, batch: list[str], conversations: dict[str, set[str]], since_us: int,
                        kept: dict[str, KeptTrace], mapped: dict[str, KeptTrace], going_on: set[str]) -> set[str]:
        """Read, map and write these conversations; the traces mapped here of those `going_on` go to `mapped`."""
        unread = {t for c in batch for t in conversations[c]} - kept.keys()
        self.con.execute("BEGIN TRANSACTION")  # the spans and their resources from one snapshot: none pruned between
        try:
            with id_table(self.con, unread) as ids:
                # a span sent again inside another request is stored twice: the last copy received counts, once
                rows = self.con.execute(
                    f"SELECT {_COLUMNS} FROM span_records WHERE received_at >= ? AND trace_id IN "
                    f"(SELECT id FROM {ids}) "
                    "QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received_at DESC) = 1",
                    [_at(since_us)]).fetchall()
            scopes, resources = self._dictionaries({r[9] for r in rows}, {r[10] for r in rows})
        finally:
            with contextlib.suppress(duckdb.Error):  # read only: nothing to keep or lose
                self.con.execute("ROLLBACK")
        by_trace: dict[str, list[tuple]] = {}
        for row in rows:
            by_trace.setdefault(row[0], []).append(row)
        failed: set[str] = set()
        built: dict[str, list[_Built]] = {}
        parts_of: dict[str, list[KeptTrace]] = {}
        for conversation_id in batch:
            try:
                parts = [kept.get(t) or self._map_trace(by_trace[t], scopes, resources)
                         for t in conversations[conversation_id]
                         if t in kept or t in by_trace]
                built[conversation_id] = self._compose(conversation_id, parts)
            except Exception as exc:  # one bad conversation must not hold up the others; it is retried later
                self._failed(conversation_id, exc)
                failed.add(conversation_id)
                continue
            parts_of[conversation_id] = parts
        attach = self._plan_attachments(parts_of)
        failed |= self._write_all(built, unjudged=set(attach.values()))
        done = {c: parts for c, parts in parts_of.items() if c not in failed}
        for conversation_id, parts in done.items():
            if conversation_id in going_on:
                mapped.update((p.trace_id, p) for p in parts if p.trace_id not in kept)
        self._mark_assembled(  # a kept trace's row already names this conversation and is newer than its spans
            {c: conversations[c] - kept.keys() for c in done},
            # the newest span assembled, not the clock: a span committed meanwhile is still newer after a restart
            {c: max((p.newest for p in parts), default=datetime.now(UTC)) for c, parts in done.items()},
            {p.trace_id: p.first for parts in done.values() for p in parts})
        attach = {trace: owner for trace, owner in attach.items() if owner not in failed}
        if attach:
            self._attach(attach, since_us)
        return failed

    def _plan_attachments(self, parts_of: dict[str, list[KeptTrace]]) -> dict[str, str]:
        """Context traces (MCP calls outside any run, no key of their own) that join the one conversation sharing
        their MCP session: decided after the whole batch is known (the conversations of the batch first, so which
        comes first in it does not decide), from the sessions remembered as conversations are assembled, in
        whichever order they come. Context trace -> its conversation; a conversation that gets context now is
        written without jobs, since its next version (with the context) follows within a quiet period."""
        context: dict[str, frozenset[str]] = {}
        for conversation_id, parts in parts_of.items():
            mapped = [p.mapped for p in parts if p.mapped is not None]
            sessions = frozenset(s for m in mapped for s in m.sessions)
            if mapped and all(m.context_only and m.key == TRACE_KEY for m in mapped):
                context[conversation_id] = sessions
            else:
                self.sessions.owned(conversation_id, sessions)
        attach: dict[str, str] = {}
        candidates = set(context) | self.sessions.waiting_for(s for ss in context.values() for s in ss) | \
            self.sessions.waiting_for(s for c, parts in parts_of.items() if c not in context
                                      for p in parts if p.mapped is not None for s in p.mapped.sessions)
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
        restart before the conversation's next version takes them in again)."""
        now = datetime.now(UTC)
        rows = pa.table({"trace_id": list(attach), "conversation_id": list(attach.values()),
                         "attached_at": pa.array([now] * len(attach), _UTC_US)})
        with registered(self.con, rows) as name:
            def work() -> None:
                self.con.execute(f"INSERT OR REPLACE INTO trace_attachments SELECT * FROM {name}")
                self.con.execute(f"DELETE FROM assembled_traces WHERE trace_id IN (SELECT trace_id FROM {name})")
                for table in ("conversations", "conversation_summary", "call_summary"):
                    status = f" AND status = '{CONTEXT_ONLY}'" if table == "conversations" else ""
                    self.con.execute(f"DELETE FROM {table} WHERE conversation_id IN (SELECT trace_id FROM {name})"
                                     + status)
            try:
                in_transaction(self.con, work)
            except duckdb.Error as exc:  # they wait again: their next assembly tries once more
                self.log.warning("context not attached", traces=len(attach), reason=str(exc))
                self._attached.extend((trace, since_us) for trace in attach)
                return
        for trace, conversation_id in attach.items():
            self.log.info("context attached", trace_id=trace, conversation_id=conversation_id)
        self._attached.extend((trace, since_us) for trace in attach)  # waits again once this round forgets it

    def _failed(self, conversation_id: str, exc: Exception) -> None:
        self.log.error("assembly failed", conversation_id=conversation_id, reason=f"{type(exc).__name__}: {exc}")

    def _mark_assembled(self, conversations: dict[str, set[str]], newest: dict[str, datetime],
                        first: dict[str, datetime]) -> None:
        """Each trace's conversation, its newest span assembled (a restart re-queues what came after) and its
        oldest (later reads of it start there; None: not read)."""
        if not conversations:
            return
        now = datetime.now(UTC)
        traces = [t for members in conversations.values() for t in members]
        table = pa.table({
            "trace_id": traces,
            "conversation_id": [c for c, members in conversations.items() for _ in members],
            "assembled_at": pa.array([newest.get(c, now) for c, members in conversations.items() for _ in members],
                                     _UTC_US),
            "first_received_at": pa.array([first.get(t) for t in traces], _UTC_US),
        })
        with registered(self.con, table) as name:
            self.con.execute(f"INSERT OR REPLACE INTO assembled_traces BY NAME SELECT * FROM {name}")

    def _dictionaries(self, scope_ids: set[int], resource_ids: set[int]) -> tuple[_Scopes, _Resources]:
        """The scopes (name, version) and resources (parsed attributes) these spans refer to, each read once."""
        with id_table(self.con, scope_ids, pa.int64()) as ids:
            scopes = {i: (n, v) for i, n, v in self.con.execute(
                f"SELECT scope_id, name, version FROM span_scopes WHERE scope_id IN (SELECT id FROM {ids})").fetchall()}
        with id_table(self.con, resource_ids, pa.int64()) as ids:
            resources = {i: json.loads(text) for i, text in self.con.execute(
                f"SELECT resource_id, attributes FROM span_resources WHERE resource_id IN (SELECT id FROM {ids})"
            ).fetchall()}
        return scopes, resources

    def _map_trace(self, rows: list[tuple], scopes: _Scopes, resources: _Resources) -> KeptTrace:
        """One trace mapped from its stored rows, with what the sampling filters and `assembled_traces` need. Spans
        of one resource share its parsed attributes, as the spans of one ResourceSpans do when decoded."""
        spans = [Span.from_record({
            "trace_id": r[0], "span_id": r[1], "parent_span_id": r[2], "name": r[3], "kind": r[4],
            "start_ns": r[5], "end_ns": r[6], "status_code": r[7], "status_message": r[8],
            "scope_name": (scope := scopes.get(r[9], _NO_SCOPE))[0], "scope_version": scope[1],
            "attributes": json.loads(r[11]), "resource": resources.get(r[10], {}),
            "events": json.loads(r[12]), "links": json.loads(r[13]),
        }) for r in rows]
        mapped = map_traces(spans)
        received = [r[14] for r in rows]
        return KeptTrace(rows[0][0], mapped[0] if mapped else None, attribute_values(self._attribute_keys, spans),
                         len(rows), min(received), max(received),
                         ENTRY_OVERHEAD + TEXT_FACTOR * sum(len(r[11]) + len(r[12]) for r in rows),
                         model_usage(spans))

    def _compose(self, conversation_id: str, parts: list[KeptTrace]) -> list[_Built]:
        """The conversation composed from its traces' mapped parts, with the sampling filters' attribute values
        (none when it has no turn)."""
        # traces with no key of their own are here because they were attached to it: even once they show a run
        mine = [p for p in parts if p.mapped is not None and (p.mapped.conversation_id == conversation_id
                                                               or p.mapped.key == TRACE_KEY)]
        conversation = compose_conversation([p.mapped for p in mine if p.mapped is not None],
                                            mcp_tools=self.settings.mapping.mcp_tools)
        if conversation is None:
            return []
        values: dict[str, set[str]] = {}
        usage: dict[str, tuple[int, int]] = {}
        for part in mine:
            for key, found in part.attributes.items():
                values.setdefault(key, set()).update(found)
            for model, (tokens_in, tokens_out) in part.usage.items():
                seen_in, seen_out = usage.get(model, (0, 0))
                usage[model] = (seen_in + tokens_in, seen_out + tokens_out)
        return [(conversation, values, usage)]

    def _write_all(self, built: dict[str, list[_Built]], unjudged: set[str] | None = None) -> set[str]:
        """Write a batch's new versions in one transaction (a commit per conversation cost 7 ms of CPU); when
        that fails, each conversation alone, so one that cannot be written does not hold up the rest. The ids
        that failed."""
        try:
            self.write_versions([b for items in built.values() for b in items], unjudged)
            return set()
        except Exception as exc:
            if len(built) == 1:
                self._failed(next(iter(built)), exc)
                return set(built)
        failed = set()
        for conversation_id, items in built.items():
            try:
                self.write_versions(items, unjudged)
            except Exception as exc:
                self._failed(conversation_id, exc)
                failed.add(conversation_id)
        return failed

    def write_versions(self, built: list[_Built], unjudged: set[str] | None = None) -> list[int | None]:
        """A new version of each conversation whose content changed, with its jobs, in one transaction; per
        conversation its version, or None when this content is already stored (or its spans were pruned).
        Each item: the conversation and the values of the sampling filters' attribute keys in its spans."""
        if not built:
            return []
        with id_table(self.con, {c.conversation_id for c, *_ in built}) as ids:
            pruned = {cid for (cid,) in self.con.execute(
                f"SELECT conversation_id FROM pruned_conversations WHERE conversation_id IN (SELECT id FROM {ids})"
            ).fetchall()}
            latest: dict[str, tuple[int, str]] = {}
            previous: dict[str, str | None] = {}  # each conversation's latest inclusion probabilities
            for cid, version, digest, inclusion in self.con.execute(
                    f"SELECT conversation_id, max(version), arg_max(content_hash, version), "
                    f"arg_max(inclusion, version) FROM conversations WHERE conversation_id IN (SELECT id FROM {ids}) "
                    f"GROUP BY conversation_id").fetchall():
                latest[cid], previous[cid] = (version, digest), inclusion
        now = datetime.now(UTC)
        metrics = self.settings.scoring.metrics
        versions: list[int | None] = []
        rows: list[dict[str, object]] = []
        jobs: list[dict[str, object]] = []
        counted: dict[tuple[str, str], int] = {}  # new conversations per cohort value, for the new_cohort rules
        written: list[tuple[Conversation, int, list[str]]] = []  # logged once they are committed
        late: list[Conversation] = []  # so are these, so a batch retried alone does not count them twice
        for conversation, attributes, usage in built:
            cid = conversation.conversation_id
            if cid in pruned:  # its earlier spans were pruned by retention: the rest would be a truncated conversation
                late.append(conversation)
                versions.append(None)
                continue
            last = latest.get(cid)
            if last is not None and last[1] == conversation.content_hash:
                versions.append(None)
                continue
            version = (last[0] if last else 0) + 1
            latest[cid] = (version, conversation.content_hash)
            found = findings(conversation.test_case) if needs_findings(self.settings.sampling) else set()
            if self._new_cohorts and self._is_new(attributes, counted if version == 1 else None):
                found.add("new_cohort")
            value, sampled, inclusion = decide(self.settings.sampling, metrics, cid, conversation.service_name,
                                               conversation.agent_name, attributes, found)
            if previous.get(cid):  # a later version keeps the chance its conversation already had (sticky up)
                for metric, p in json.loads(previous[cid] or "{}").items():
                    if metric in inclusion and p > inclusion[metric]:
                        inclusion[metric] = p
                        sampled[metric] = sampled[metric] or value < p
            # MCP calls outside any run, in no known session: kept, never scored; a conversation about to get its
            # context: its next version is scored
            if conversation.context_only or cid in (unjudged or ()):
                sampled = dict.fromkeys(sampled, False)
            rows.append({"conversation_id": cid, "version": version, "content_hash": conversation.content_hash,
                         "status": CONTEXT_ONLY if conversation.context_only else "complete",
                         "key_source": conversation.key,
                         "service_name": conversation.service_name, "agent_name": conversation.agent_name,
                         "turns": len(conversation.test_case.turns), "mcp_calls": _calls(conversation),
                         "trace_ids": list(conversation.trace_ids), "first_span_ns": conversation.first_span_ns,
                         "last_span_ns": conversation.last_span_ns,
                         "test_case": conversation.test_case.model_dump_json(exclude_none=True),
                         "sample_value": value, "sampled": json.dumps(sampled), "assembled_at": now,
                         "attributes": json.dumps({k: sorted(v) for k, v in sorted(attributes.items())}),
                         "inclusion": json.dumps(inclusion),
                         "agent_usage": json.dumps({m: list(t) for m, t in usage.items()}) if usage else None})
            jobs.extend({"conversation_id": cid, "conversation_version": version, "metric": metric,
                         "metric_config": self.metric_configs[metric], "status": self.job_status(metric),
                         "created_at": now, "updated_at": now} for metric, chosen in sampled.items() if chosen)
            versions.append(version)
            written.append((conversation, version, [m for m, chosen in sampled.items() if chosen]))
        if rows:
            try:
                self._insert(rows, jobs, counted)
            except Exception:
                self._cohort_counts = None  # read again: this batch's counts were not committed
                raise
        for conversation in late:
            self.late_after_prune += 1
            self.log.warning("late spans for a pruned conversation: stored, not assembled",
                             conversation_id=conversation.conversation_id, traces=len(conversation.trace_ids))
        for conversation, version, queued in written:
            self.assembled += 1
            self.log.info("conversation complete", conversation_id=conversation.conversation_id, version=version,
                          turns=len(conversation.test_case.turns), mcp_calls=_calls(conversation),
                          metrics_queued=queued)
        return versions

    def _is_new(self, attributes: dict[str, set[str]], counted: dict[tuple[str, str], int] | None) -> bool:
        """Whether a conversation is among the first `first` of a value of a new_cohort rule's key; a first
        version (`counted` given) is counted, so the next one sees it."""
        if self._cohort_counts is None:
            self._cohort_counts = {(k, v): n for k, v, n in self.con.execute(
                "SELECT key, value, conversations FROM cohort_counts").fetchall()}
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

    def _insert(self, rows: list[dict[str, object]], jobs: list[dict[str, object]],
                counted: dict[tuple[str, str], int] | None = None) -> None:
        """The versions and their jobs, as two Arrow appends in one transaction, with the cohort counts."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            if counted:
                self.con.executemany(
                    "INSERT INTO cohort_counts VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET "
                    "conversations = cohort_counts.conversations + excluded.conversations",
                    [[k, v, n] for (k, v), n in counted.items()])
            with registered(self.con, pa.Table.from_pylist(rows, schema=_VERSION_SCHEMA)) as name:
                self.con.execute(f"INSERT INTO conversations BY NAME SELECT * FROM {name}")
            if jobs:
                with registered(self.con, pa.Table.from_pylist(jobs, schema=_JOB_SCHEMA)) as name:
                    self.con.execute(f"INSERT INTO eval_jobs BY NAME SELECT * FROM {name}")
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise

    def pending_traces(self) -> int:
        with self._lock:
            return len(self._group_of)

    def pending_conversations(self) -> int:
        """Conversations waiting for their quiet period; never more than the traces they wait with."""
        with self._lock:
            return len(self._last)

