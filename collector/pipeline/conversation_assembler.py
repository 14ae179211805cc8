"""Rebuild conversations from stored spans once they are complete, and plan their scoring jobs.

The span writer tells the assembler which traces each commit touched. A conversation is complete when
none of its traces has had a new span for `quiet_period_s`, or at once when a span carries
`tracejudge.conversation.end = true`. Its spans are then read back, mapped with
`mapping.build_conversations`, and written as a new version of the conversation when the content hash
changed (late spans re-score; old versions and their scores stay), together with one job per sampled metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from collector.config import Settings
from collector.log import Logger
from collector.pipeline.sampling import attribute_values, decide
from collector.receivers.span_rows import plain_strings
from mapping import Conversation, Span, build_conversations
from mapping.conversation_key import KEY_PRECEDENCE
from scoring.id_table import id_table

MAX_PER_POLL = 256  # conversations assembled per poll: a backlog never hides a newly end-marked one for long
SPANS_PER_READ = 50_000  # spans read back in one query while assembling; bounds the assembler's memory
END_MARKER = '"tracejudge.conversation.end":true'
_RANK = "CASE conversation_key_source " + " ".join(
    f"WHEN '{key}' THEN {i}" for i, key in enumerate(KEY_PRECEDENCE)) + " END"
_UNKEYED = len(KEY_PRECEDENCE)  # the rank of a trace that carries no conversation key (its own conversation)
_PRECEDENCE = pa.array(KEY_PRECEDENCE)
_COLUMNS = ("trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message, "
            "scope_name, scope_version, attributes, resource_attributes, events, links, received_at")


def _calls(conversation: Conversation) -> int:
    return sum(len(t.mcp_tools_called or []) + len(t.mcp_resources_called or []) + len(t.mcp_prompts_called or [])
               for t in conversation.test_case.turns)


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
                 job_status: Callable[[str], str], metric_configs: dict[str, str]) -> None:
        self.con = con
        self.settings = settings
        self.log = logger
        self.job_status = job_status  # metric -> the status a new job starts in
        self.metric_configs = metric_configs  # metric -> config hash (part of the job and score key)
        self._group_of: dict[str, str] = {}  # waiting trace -> the conversation its spans name so far
        self._rank_of: dict[str, int] = {}  # waiting trace -> precedence of that key (_UNKEYED: none)
        # conversation -> its waiting traces, only where they are not just the conversation's own trace: most
        # traces carry no key and are their own conversation, and a set would be half of what each one costs
        self._members: dict[str, set[str]] = {}
        self._last: OrderedDict[str, float] = OrderedDict()  # conversation -> last span (monotonic), oldest first
        self._stamp: dict[str, int] = {}  # conversation -> change counter: was it touched while assembling?
        self._ended: set[str] = set()  # traces with a span that carried the end marker
        self._changes = 0
        self._lock = threading.Lock()
        self.assembled = 0
        self.late_after_prune = 0  # conversations that got spans after retention pruned theirs (not assembled)

    def observe(self, table: pa.Table) -> None:
        """Called by the span writer after each commit (its thread)."""
        keys = _commit_keys(table)
        traces = pc.unique(table.column("trace_id")).to_pylist()
        end_marked = pc.match_substring(plain_strings(table.column("attributes")), END_MARKER)
        ended = table.filter(end_marked).column("trace_id")
        with self._lock:
            now = time.monotonic()
            for trace in traces:
                self._note(trace, keys.get(trace), now)
            self._ended.update(ended.to_pylist())

    def _note(self, trace: str, key: tuple[int, str] | None, now: float) -> None:
        """A trace has new spans (`key`: their strongest conversation key); the lock is held."""
        old = self._group_of.get(trace)
        group = old or trace
        if key is not None and key[0] < self._rank_of.get(trace, _UNKEYED):
            self._rank_of[trace], group = key
            members = self._members.get(group)
            if members:  # the key string its other traces hold: one per conversation, not one per trace (62 bytes)
                group = self._group_of[next(iter(members))]
        if group != old:
            if old is not None:
                self._leave(trace, old)
            self._join(trace, group)
        self._changes += 1
        self._stamp[group] = self._changes
        self._last[group] = now
        self._last.move_to_end(group)

    def _join(self, trace: str, group: str) -> None:
        """The trace waits with this conversation from now on; the lock is held."""
        self._group_of[trace] = group
        members = self._members.get(group)
        if members is not None:
            members.add(trace)
        elif trace != group:
            self._members[group] = {trace} | self._own_trace(group)

    def _leave(self, trace: str, group: str) -> None:
        """The trace no longer waits with this conversation (its `_group_of` entry is the caller's to change)."""
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
            self._stamp.pop(group, None)

    def _own_trace(self, group: str) -> set[str]:
        """The trace whose id is the conversation's, if it waits in it (a conversation without a member set)."""
        return {group} if self._group_of.get(group) == group else set()

    def _traces_of(self, group: str) -> set[str]:
        """The conversation's waiting traces; the lock is held."""
        members = self._members.get(group)
        return set(members) if members is not None else self._own_trace(group)

    def _forget(self, group: str, stamp: int) -> bool:
        """Drop an assembled conversation from the waiting set unless a span arrived for it meanwhile."""
        if self._stamp.get(group) != stamp:
            return False
        for trace in self._traces_of(group):
            self._group_of.pop(trace, None)
            self._rank_of.pop(trace, None)
            self._ended.discard(trace)
        self._members.pop(group, None)
        self._last.pop(group, None)
        self._stamp.pop(group, None)
        return True

    def recover(self) -> None:
        """After a restart: every trace with spans newer than its last assembly waits for a quiet period again."""
        rows = self.con.execute(
            "SELECT s.trace_id FROM (SELECT trace_id, max(received_at) AS last FROM spans GROUP BY trace_id) s "
            "LEFT JOIN assembled_traces a USING (trace_id) WHERE a.assembled_at IS NULL OR s.last > a.assembled_at"
        ).fetchall()
        traces = [trace for (trace,) in rows]
        keys = self._strongest_keys(traces)
        now = time.monotonic()
        with self._lock:
            for trace in traces:
                if trace not in self._group_of:
                    self._note(trace, keys.get(trace), now)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            done = 0
            try:
                done = await asyncio.to_thread(self.assemble_due, False, MAX_PER_POLL)
            except Exception as exc:  # a bad conversation must not stop the loop; it is logged and retried
                self.log.error("assembly failed", reason=f"{type(exc).__name__}: {exc}")
            if done >= MAX_PER_POLL:
                continue  # a backlog: go on at once, but look again for end-marked conversations first
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.conversations.poll_s)

    def _due(self, force: bool, limit: int | None) -> dict[str, tuple[int, set[str]]]:
        """End-marked conversations first, then those quiet for the quiet period, oldest first: (stamp, traces)."""
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
            return {g: (self._stamp[g], self._traces_of(g)) for g in chosen[:limit]}

    def assemble_due(self, force: bool = False, limit: int | None = None) -> int:
        """Assemble the conversations that are complete (all of them with `force`), end-marked ones first, at
        most `limit` in this call; how many were assembled."""
        due = self._due(force, limit)
        if not due:
            return 0
        waiting = set().union(*(traces for _, traces in due.values()))
        owners = self._trace_keys(waiting)  # the stored spans decide: a late span may carry no key itself
        conversations: dict[str, set[str]] = {}
        for trace in waiting:
            conversations.setdefault(owners.get(trace, trace), set()).add(trace)
        if not force:
            self._wait_with_active(due, owners, conversations)
        keyed = {c for c in conversations if c in owners.values()}
        if keyed:  # the conversation's earlier traces, assembled before, belong to it too
            earlier = self._traces_named(keyed)
            owners.update(self._trace_keys({t for t, _ in earlier} - set(owners)))
            for trace, key in earlier:
                if owners.get(trace, trace) == key:
                    conversations[key].add(trace)
        failed = self._assemble_all(conversations)
        done = 0
        with self._lock:
            now = time.monotonic()
            for group, (stamp, traces) in due.items():
                if any(owners.get(t, t) in failed for t in traces):
                    if self._stamp.get(group) == stamp:
                        self._last[group] = now  # wait another quiet period before the next try
                        self._last.move_to_end(group)
                    continue
                self._forget(group, stamp)
                done += 1
        return done

    def _wait_with_active(self, due: dict[str, tuple[int, set[str]]], owners: dict[str, str],
                          conversations: dict[str, set[str]]) -> None:
        """A due trace whose stored spans name a conversation that still has waiting, not yet quiet traces (a
        late span without a key, after an earlier assembly) joins that conversation's wait instead of having it
        assembled early."""
        with self._lock:
            active = {c for c in conversations if c in self._last and c not in due}  # still waiting
            for group, (_, traces) in due.items():
                for trace in traces:
                    target = owners.get(trace, trace)
                    if target in active and self._group_of.get(trace) == group:
                        self._leave(trace, group)
                        self._join(trace, target)
        for conversation_id in active:
            del conversations[conversation_id]

    def _strongest_keys(self, traces: set[str] | list[str]) -> dict[str, tuple[int, str]]:
        """Each trace's strongest conversation key over all its stored spans: (precedence, value)."""
        if not traces:
            return {}
        with id_table(self.con, traces) as ids:
            rows = self.con.execute(
                f"SELECT trace_id, min({_RANK}), arg_min(conversation_key, {_RANK}) FROM spans WHERE trace_id IN "
                f"(SELECT id FROM {ids}) AND conversation_key IS NOT NULL GROUP BY trace_id").fetchall()
        return {trace: (rank if rank is not None else _UNKEYED, key) for trace, rank, key in rows}

    def _trace_keys(self, traces: set[str]) -> dict[str, str]:
        """Each trace's conversation: the highest-precedence key on any of its spans (as the mapping does)."""
        return {trace: key for trace, (_, key) in self._strongest_keys(traces).items()}

    def _traces_named(self, keys: set[str]) -> list[tuple[str, str]]:
        """(trace, key) for every stored trace with a span that names one of these conversation keys."""
        with id_table(self.con, keys) as ids:
            return self.con.execute(f"SELECT DISTINCT trace_id, conversation_key FROM spans WHERE conversation_key "
                                    f"IN (SELECT id FROM {ids})").fetchall()

    def _assemble_all(self, conversations: dict[str, set[str]]) -> set[str]:
        """Read back, map and write every conversation, a bounded number of spans per query; the ids that failed
        (retried after another quiet period)."""
        traces = set().union(*conversations.values())
        with id_table(self.con, traces) as ids:
            counts = dict(self.con.execute(f"SELECT trace_id, count(*) FROM spans WHERE trace_id IN "
                                           f"(SELECT id FROM {ids}) GROUP BY trace_id").fetchall())
        limit = self.settings.conversations.max_spans
        failed: set[str] = set()
        batch: list[str] = []
        size = 0
        for conversation_id, members in conversations.items():
            count = sum(counts.get(t, 0) for t in members)
            if count > limit:  # bounded by design: one huge conversation must not take the server's memory
                self.log.warning("conversation too large to assemble", conversation_id=conversation_id,
                                 spans=count, max_spans=limit,
                                 advice="raise [conversations] max_spans if it is a real conversation")
                self._mark_assembled({conversation_id: members}, {})
                continue
            if batch and size + count > SPANS_PER_READ:
                failed |= self._assemble_batch(batch, conversations)
                batch, size = [], 0
            batch.append(conversation_id)
            size += count
        if batch:
            failed |= self._assemble_batch(batch, conversations)
        return failed

    def _assemble_batch(self, batch: list[str], conversations: dict[str, set[str]]) -> set[str]:
        with id_table(self.con, set().union(*(conversations[c] for c in batch))) as ids:
            # a span sent again inside another request is stored twice: the last copy received counts, once
            rows = self.con.execute(
                f"SELECT {_COLUMNS} FROM spans WHERE trace_id IN (SELECT id FROM {ids}) QUALIFY row_number() "
                "OVER (PARTITION BY trace_id, span_id ORDER BY received_at DESC) = 1").fetchall()
        by_trace: dict[str, list[tuple]] = {}
        for row in rows:
            by_trace.setdefault(row[0], []).append(row)
        failed: set[str] = set()
        assembled: dict[str, set[str]] = {}
        newest: dict[str, datetime] = {}
        for conversation_id in batch:
            members = conversations[conversation_id]
            mine = [r for t in members for r in by_trace.get(t, ())]
            try:
                self._assemble(conversation_id, mine)
            except Exception as exc:  # one bad conversation must not hold up the others; it is retried later
                self.log.error("assembly failed", conversation_id=conversation_id,
                               reason=f"{type(exc).__name__}: {exc}")
                failed.add(conversation_id)
                continue
            assembled[conversation_id] = members
            # the newest span assembled, not the clock: a span committed meanwhile is still newer after a restart
            newest[conversation_id] = max((r[15] for r in mine), default=datetime.now(UTC))
        self._mark_assembled(assembled, newest)
        return failed

    def _mark_assembled(self, conversations: dict[str, set[str]], newest: dict[str, datetime]) -> None:
        if not conversations:
            return
        now = datetime.now(UTC)
        table = pa.table({
            "trace_id": [t for members in conversations.values() for t in members],
            "conversation_id": [c for c, members in conversations.items() for _ in members],
            "assembled_at": pa.array([newest.get(c, now) for c, members in conversations.items() for _ in members],
                                     pa.timestamp("us", tz="UTC")),
        })
        self.con.register("assembled_now", table)
        try:
            self.con.execute("INSERT OR REPLACE INTO assembled_traces SELECT trace_id, conversation_id, assembled_at "
                             "FROM assembled_now")
        finally:
            self.con.unregister("assembled_now")

    def _assemble(self, conversation_id: str, rows: list[tuple]) -> None:
        spans = [Span.from_record({
            "trace_id": r[0], "span_id": r[1], "parent_span_id": r[2], "name": r[3], "kind": r[4],
            "start_ns": r[5], "end_ns": r[6], "status_code": r[7], "status_message": r[8], "scope_name": r[9],
            "scope_version": r[10], "attributes": json.loads(r[11]), "resource": json.loads(r[12]),
            "events": json.loads(r[13]), "links": json.loads(r[14]),
        }) for r in rows]
        written = [c for c in build_conversations(spans, mcp_tools=self.settings.mapping.mcp_tools)
                   if c.conversation_id == conversation_id]
        for conversation in written:
            mine = set(conversation.trace_ids)
            self.write_version(conversation, attribute_values(self.settings.sampling,
                                                              (s for s in spans if s.trace_id in mine)))

    def write_version(self, conversation: Conversation,
                      attributes: dict[str, set[str]] | None = None) -> int | None:
        """A new version when the content changed (with its jobs); None when this content is already stored.
        `attributes`: the values of the sampling filters' attribute keys in the conversation's spans."""
        cid = conversation.conversation_id
        if self.con.execute("SELECT 1 FROM pruned_conversations WHERE conversation_id = ?", [cid]).fetchone():
            # its earlier spans were pruned by retention: what is left would be a truncated conversation
            self.late_after_prune += 1
            self.log.warning("late spans for a pruned conversation: stored, not assembled", conversation_id=cid,
                             traces=len(conversation.trace_ids))
            return None
        latest = self.con.execute("SELECT version, content_hash FROM conversations WHERE conversation_id = ? "
                                  "ORDER BY version DESC LIMIT 1", [cid]).fetchone()
        if latest is not None and latest[1] == conversation.content_hash:
            return None
        version = (latest[0] if latest else 0) + 1
        metrics = self.settings.scoring.metrics
        value, sampled = decide(self.settings.sampling, metrics, cid, conversation.service_name,
                                conversation.agent_name, attributes)
        now = datetime.now(UTC)
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute(
                "INSERT INTO conversations VALUES (?, ?, ?, 'complete', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [cid, version, conversation.content_hash, conversation.key, conversation.service_name,
                 conversation.agent_name, len(conversation.test_case.turns), _calls(conversation),
                 list(conversation.trace_ids), conversation.first_span_ns, conversation.last_span_ns,
                 conversation.test_case.model_dump_json(exclude_none=True), value, json.dumps(sampled), now])
            for metric, chosen in sampled.items():
                if chosen:
                    self.con.execute(
                        "INSERT INTO eval_jobs (conversation_id, conversation_version, metric, metric_config, "
                        "status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [cid, version, metric, self.metric_configs[metric], self.job_status(metric), now, now])
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise
        self.assembled += 1
        self.log.info("conversation complete", conversation_id=cid, version=version,
                      turns=len(conversation.test_case.turns), mcp_calls=_calls(conversation),
                      metrics_queued=[m for m, s in sampled.items() if s])
        return version

    def pending_traces(self) -> int:
        with self._lock:
            return len(self._group_of)

    def pending_conversations(self) -> int:
        """Conversations waiting for their quiet period; never more than the traces they wait with."""
        with self._lock:
            return len(self._last)

