"""Keep the web UI's summary tables current from the rows written since the last refresh.

`conversation_summary` (the latest version of each conversation), `call_summary` (its MCP calls) and
`score_summary` (the latest score per conversation and metric) answer the UI's pages in milliseconds where the
`latest_scores` and `mcp_calls` views recompute over the whole history. A refresh reads only conversations and
scores written since the previous one (less a margin for commits that finish out of timestamp order), so its
cost follows what changed, not the size of the database; rows are upserted, so reading one twice is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
from collections.abc import Callable

import duckdb

MARGIN = dt.timedelta(seconds=60)  # a row stamped earlier may commit after a later one; read back this far
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

_FRESH_CONVERSATIONS = """
CREATE OR REPLACE TEMP TABLE fresh_conversations AS
SELECT c.conversation_id, c.version, c.service_name, c.agent_name, c.turns, c.mcp_calls, c.test_case, c.assembled_at
FROM conversations c
WHERE c.assembled_at >= ?
  AND NOT EXISTS (SELECT 1 FROM conversation_summary s
                  WHERE s.conversation_id = c.conversation_id AND s.version >= c.version)
QUALIFY row_number() OVER (PARTITION BY c.conversation_id ORDER BY c.version DESC) = 1
"""

_FRESH_CALLS = """
CREATE OR REPLACE TEMP TABLE fresh_calls AS
WITH servers AS (
    SELECT f.conversation_id, s.value->>'server_name' AS server, tool.value->>'name' AS tool
    FROM fresh_conversations f, json_each(f.test_case, '$.mcp_servers') s,
         json_each(s.value, '$.available_tools') tool),
calls AS (
    SELECT f.conversation_id, f.version, t.key::INTEGER AS turn, k.kind, c.key::INTEGER AS call_index,
           coalesce(c.value->>'name', c.value->>'uri') AS name,
           coalesce(TRY_CAST(c.value->'result'->>'isError' AS BOOLEAN), false) AS is_error, f.assembled_at
    FROM fresh_conversations f, json_each(f.test_case, '$.turns') t,
         (VALUES ('tool', 'mcp_tools_called'), ('resource', 'mcp_resources_called'),
                 ('prompt', 'mcp_prompts_called')) k(kind, field),
         json_each(t.value, '$.' || k.field) c)
SELECT calls.conversation_id, calls.version, calls.turn, calls.call_index, calls.kind,
       (SELECT min(s.server) FROM servers s WHERE s.conversation_id = calls.conversation_id
                                              AND s.tool = calls.name AND calls.kind = 'tool') AS server,
       calls.name, calls.is_error, calls.assembled_at
FROM calls
"""

_SCORES = """
INSERT INTO score_summary
SELECT conversation_id, metric, conversation_version, score, success, evaluation_cost, service_name, agent_name,
       CASE WHEN metric = 'mcp_call_validity' THEN
           (SELECT coalesce(list((c.value->>'turn') || chr(9) || (c.value->>'kind') || chr(9)
                                 || (c.value->>'name')), [])
            FROM json_each(breakdown, '$.calls') c
            WHERE contains(CAST(c.value->'violations' AS VARCHAR), 'inputSchema')) END,
       scored_at
FROM scores WHERE scored_at >= ?
QUALIFY row_number() OVER (PARTITION BY conversation_id, metric
                           ORDER BY conversation_version DESC, scored_at DESC) = 1
ON CONFLICT (conversation_id, metric) DO UPDATE SET
    conversation_version = excluded.conversation_version, score = excluded.score, success = excluded.success,
    evaluation_cost = excluded.evaluation_cost, service_name = excluded.service_name,
    agent_name = excluded.agent_name, invalid_calls = excluded.invalid_calls, scored_at = excluded.scored_at
WHERE excluded.conversation_version > score_summary.conversation_version
   OR (excluded.conversation_version = score_summary.conversation_version
       AND excluded.scored_at >= score_summary.scored_at)
"""


class SummaryTables:
    """One per database: refreshes are serialized, and each starts where the previous one ended."""

    def __init__(self, margin: dt.timedelta = MARGIN) -> None:
        self.margin = margin
        self._lock = threading.Lock()
        self._conversations_from: dt.datetime | None = None
        self._scores_from: dt.datetime | None = None
        self._seen: tuple[object, object] | None = None  # the newest rows at the last refresh

    def refresh(self, con: duckdb.DuckDBPyConnection) -> None:
        """Bring the summaries up to the rows committed so far (from the start on the first call)."""
        with self._lock:
            if self._conversations_from is None:
                self._conversations_from, self._scores_from = self._resume(con, self.margin)
            [(conversations_upto, scores_upto)] = con.execute(
                "SELECT (SELECT max(assembled_at) FROM conversations), (SELECT max(scored_at) FROM scores)"
            ).fetchall()
            if self._seen == (conversations_upto, scores_upto):
                return  # nothing written since
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(_FRESH_CONVERSATIONS, [self._conversations_from])
                con.execute(_FRESH_CALLS)
                con.execute("INSERT INTO call_summary SELECT * FROM fresh_calls")
                con.execute(
                    "INSERT OR REPLACE INTO conversation_summary "
                    "SELECT f.conversation_id, f.version, f.service_name, f.agent_name, f.turns, f.mcp_calls, "
                    "coalesce(e.errors, 0), f.assembled_at FROM fresh_conversations f LEFT JOIN "
                    "(SELECT conversation_id, count(*) FILTER (WHERE is_error) AS errors FROM fresh_calls "
                    "GROUP BY ALL) e USING (conversation_id)")
                con.execute(_SCORES, [self._scores_from])
                con.execute("DROP TABLE fresh_calls")
                con.execute("DROP TABLE fresh_conversations")
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            self._seen = (conversations_upto, scores_upto)
            if conversations_upto is not None:
                self._conversations_from = conversations_upto - self.margin
            if scores_upto is not None:
                self._scores_from = scores_upto - self.margin

    @staticmethod
    def _resume(con: duckdb.DuckDBPyConnection, margin: dt.timedelta) -> tuple[dt.datetime, dt.datetime]:
        """Where the summaries end: a restart reads on from there, a new database from the beginning."""
        [(conversations, scores)] = con.execute(
            "SELECT (SELECT max(assembled_at) FROM conversation_summary), "
            "(SELECT max(scored_at) FROM score_summary)").fetchall()
        return ((conversations - margin) if conversations else _EPOCH, (scores - margin) if scores else _EPOCH)

    async def run(self, con: duckdb.DuckDBPyConnection, stop: asyncio.Event, period_s: float,
                  log: Callable[..., None]) -> None:
        """Refresh every `period_s`, so a page load finds little left to do."""
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.refresh, con)
            except Exception as exc:  # the pages refresh on their own; a failure here is logged and retried
                log("error", "summary refresh failed", reason=f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period_s)
