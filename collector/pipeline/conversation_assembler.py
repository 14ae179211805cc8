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
from collections.abc import Callable
from datetime import UTC, datetime

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from collector.config import Settings
from collector.log import Logger
from collector.pipeline.sampling import attribute_values, decide
from mapping import Conversation, Span, build_conversations
from mapping.conversation_key import KEY_PRECEDENCE

MAX_PER_POLL = 256  # conversations assembled per poll: a backlog never hides a newly end-marked one for long
END_MARKER = '"tracejudge.conversation.end":true'
_RANK = "CASE conversation_key_source " + " ".join(
    f"WHEN '{key}' THEN {i}" for i, key in enumerate(KEY_PRECEDENCE)) + " END"


def _calls(conversation: Conversation) -> int:
    return sum(len(t.mcp_tools_called or []) + len(t.mcp_resources_called or []) + len(t.mcp_prompts_called or [])
               for t in conversation.test_case.turns)


class ConversationAssembler:
    def __init__(self, con: duckdb.DuckDBPyConnection, settings: Settings, logger: Logger,
                 job_status: Callable[[str], str], metric_configs: dict[str, str]) -> None:
        self.con = con
        self.settings = settings
        self.log = logger
        self.job_status = job_status  # metric -> the status a new job starts in
        self.metric_configs = metric_configs  # metric -> config hash (part of the job and score key)
        self._seen: dict[str, float] = {}  # trace_id -> monotonic time of its last span
        self._ended: set[str] = set()
        self._lock = threading.Lock()
        self.assembled = 0

    def observe(self, table: pa.Table) -> None:
        """Called by the span writer after each commit (its thread)."""
        now = time.monotonic()
        traces = pc.unique(table.column("trace_id")).to_pylist()
        ended = table.filter(pc.match_substring(table.column("attributes"), END_MARKER)).column("trace_id")
        with self._lock:
            for trace in traces:
                self._seen[trace] = now
            self._ended.update(ended.to_pylist())

    def recover(self) -> None:
        """After a restart: every trace with spans newer than its last assembly waits for a quiet period again."""
        rows = self.con.execute(
            "SELECT s.trace_id FROM (SELECT trace_id, max(received_at) AS last FROM spans GROUP BY trace_id) s "
            "LEFT JOIN assembled_traces a USING (trace_id) WHERE a.assembled_at IS NULL OR s.last > a.assembled_at"
        ).fetchall()
        now = time.monotonic()
        with self._lock:
            for (trace,) in rows:
                self._seen.setdefault(trace, now)

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

    def assemble_due(self, force: bool = False, limit: int | None = None) -> int:
        """Assemble the conversations that are complete (all of them with `force`), end-marked ones first, at
        most `limit` in this call; how many were assembled."""
        with self._lock:
            seen, ended = dict(self._seen), set(self._ended)
        if not seen:
            return 0
        keys = self._trace_keys(list(seen))
        groups: dict[str, list[str]] = {}
        for trace in seen:
            groups.setdefault(keys.get(trace) or trace, []).append(trace)
        quiet = self.settings.conversations.quiet_period_s
        now = time.monotonic()
        done = 0
        # conversations an end marker closed go first: a backlog of quiet ones must not hold them up
        for conversation_id, traces in sorted(groups.items(), key=lambda item: not (set(item[1]) & ended)):
            if limit is not None and done >= limit:
                break
            if not force and not (set(traces) & ended) and now - max(seen[t] for t in traces) < quiet:
                continue
            try:
                self._assemble(conversation_id, traces, keyed=conversation_id in keys.values())
            except Exception as exc:  # one bad conversation must not hold up the others; it is retried later
                self.log.error("assembly failed", conversation_id=conversation_id,
                               reason=f"{type(exc).__name__}: {exc}")
                with self._lock:
                    for trace in traces:
                        if self._seen.get(trace) == seen[trace]:
                            self._seen[trace] = now  # wait another quiet period before the next try
                continue
            with self._lock:
                for trace in traces:
                    if self._seen.get(trace) == seen[trace]:  # no newer span arrived meanwhile
                        del self._seen[trace]
                        self._ended.discard(trace)
            done += 1
        return done

    def _trace_keys(self, traces: list[str]) -> dict[str, str]:
        """Each trace's conversation: the highest-precedence key on any of its spans (as the mapping does)."""
        return dict(self.con.execute(
            f"SELECT trace_id, arg_min(conversation_key, {_RANK}) FROM spans WHERE trace_id IN "
            "(SELECT unnest(?)) AND conversation_key IS NOT NULL GROUP BY trace_id", [traces]).fetchall())

    def _assemble(self, conversation_id: str, traces: list[str], keyed: bool) -> None:
        if keyed:
            candidates = sorted(set(traces) | {t for (t,) in self.con.execute(
                "SELECT DISTINCT trace_id FROM spans WHERE conversation_key = ?", [conversation_id]).fetchall()})
            # a span may carry this value under a weaker key (say mcp.session.id) while its trace belongs to
            # another conversation: keep only the traces whose own conversation this is
            owners = self._trace_keys(candidates)
            traces = [t for t in candidates if owners.get(t, t) == conversation_id]
        limit = self.settings.conversations.max_spans
        [(count,)] = self.con.execute("SELECT count(*) FROM spans WHERE trace_id IN (SELECT unnest(?))",
                                      [traces]).fetchall()
        if count > limit:  # bounded by design: one huge conversation must not take the server's memory
            self.log.warning("conversation too large to assemble", conversation_id=conversation_id, spans=count,
                             max_spans=limit, advice="raise [conversations] max_spans if it is a real conversation")
            self.con.execute("INSERT OR REPLACE INTO assembled_traces SELECT unnest(?), ?, now()",
                             [traces, conversation_id])
            return
        rows = self.con.execute(
            "SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message, "
            "scope_name, scope_version, attributes, resource_attributes, events, links, received_at FROM spans "
            "WHERE trace_id IN (SELECT unnest(?))", [traces]).fetchall()
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
        # the newest span assembled, not the clock: a span committed meanwhile is still newer after a restart
        newest = max((r[15] for r in rows), default=datetime.now(UTC))
        self.con.execute("INSERT OR REPLACE INTO assembled_traces SELECT unnest(?), ?, ?",
                         [traces, conversation_id, newest])

    def write_version(self, conversation: Conversation,
                      attributes: dict[str, set[str]] | None = None) -> int | None:
        """A new version when the content changed (with its jobs); None when this content is already stored.
        `attributes`: the values of the sampling filters' attribute keys in the conversation's spans."""
        cid = conversation.conversation_id
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
            return len(self._seen)

