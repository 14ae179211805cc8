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
import pyarrow as pa

from tracejudge.collector.store.connection.id_table import registered
from tracejudge.collector.store.connection.transaction import in_transaction

MARGIN = dt.timedelta(seconds=60)  # a row stamped earlier may commit after a later one; read back this far
# How often `tracejudge serve` refreshes on its own. Each refresh reads back the margin's minute of rows whatever it
# finds, so once a poll (every second) read each row sixty times; pages and exports refresh before they read, and
# the assembler writes the conversations' summaries with their versions, so only `score_summary` waits this long.
REFRESH_EVERY_S = 10.0
# test-case bytes summarised in one transaction: parsed, they must fit the 96 MB buffer pool beside ingest
BATCH_BYTES = 4 * 1024 * 1024
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# The latest version of each conversation written since the last refresh, not yet summarised: its id, version and
# the size of its test case, so a refresh can take them in batches of bounded size.
# The test case is not read here: the assembler summarises what it writes in the same transaction, so nearly every
# refresh finds nothing, and reading every recent test case to learn that cost a core's share at high traffic.
_FRESH_IDS = """
SELECT c.conversation_id, c.version
FROM conversations c
WHERE c.assembled_at >= ?
  AND NOT EXISTS (SELECT 1 FROM conversation_summary s
                  WHERE s.conversation_id = c.conversation_id AND s.version >= c.version)
QUALIFY row_number() OVER (PARTITION BY c.conversation_id ORDER BY c.version DESC) = 1
ORDER BY c.assembled_at
"""
_SIZES = """
SELECT c.conversation_id, c.version, strlen(CAST(c.test_case AS VARCHAR))
FROM conversations c JOIN {ids} i ON i.conversation_id = c.conversation_id AND i.version = c.version
WHERE c.assembled_at >= ?
"""

_FRESH_CONVERSATIONS = """
CREATE OR REPLACE TEMP TABLE fresh_conversations AS
SELECT c.conversation_id, c.version, c.service_name, c.agent_name, c.turns, c.mcp_calls, c.test_case, c.assembled_at
FROM conversations c JOIN {ids} i ON i.conversation_id = c.conversation_id AND i.version = c.version
"""

# Only the fields the summaries need, parsed once into typed lists (`from_json`): `json_each` over every turn, once
# per kind of call, copied each turn's text three times and took a 3.7 MB conversation past the 96 MB pool.
_CALL = '{"name": "VARCHAR", "uri": "VARCHAR", "result": {"isError": "VARCHAR"}}'
_SPANS = '[{"duration_ms": "DOUBLE"}]'
_CASE_SHAPE = ('{"turns": [{"mcp_tools_called": [' + _CALL + '], "mcp_resources_called": [' + _CALL + '], '
               '"mcp_prompts_called": [' + _CALL + '], '
               '"metadata": {"call_spans": {"tool": ' + _SPANS + ', "resource": ' + _SPANS + ', "prompt": '
               + _SPANS + '}}}], '
               '"mcp_servers": [{"server_name": "VARCHAR", "available_tools": [{"name": "VARCHAR"}]}]}')

_FRESH_CALLS = f"""
CREATE OR REPLACE TEMP TABLE fresh_calls AS
WITH parsed AS (
    SELECT conversation_id, version, assembled_at, from_json(test_case, '{_CASE_SHAPE}') AS tc
    FROM fresh_conversations),
servers AS (
    SELECT conversation_id, s.server_name AS server, unnest(s.available_tools).name AS tool
    FROM (SELECT conversation_id, unnest(tc.mcp_servers) AS s FROM parsed)),
turns AS (
    SELECT conversation_id, version, assembled_at, unnest(tc.turns) AS t,
           generate_subscripts(tc.turns, 1) - 1 AS turn
    FROM parsed),
calls AS (
    SELECT conversation_id, version, turn, 'tool' AS kind, unnest(t.mcp_tools_called) AS c,
           generate_subscripts(t.mcp_tools_called, 1) - 1 AS call_index, assembled_at,
           t.metadata.call_spans.tool AS spans FROM turns
    UNION ALL
    SELECT conversation_id, version, turn, 'resource', unnest(t.mcp_resources_called),
           generate_subscripts(t.mcp_resources_called, 1) - 1, assembled_at, t.metadata.call_spans.resource FROM turns
    UNION ALL
    SELECT conversation_id, version, turn, 'prompt', unnest(t.mcp_prompts_called),
           generate_subscripts(t.mcp_prompts_called, 1) - 1, assembled_at, t.metadata.call_spans.prompt FROM turns)
SELECT calls.conversation_id, calls.version, calls.turn, calls.call_index, calls.kind,
       (SELECT min(s.server) FROM servers s WHERE s.conversation_id = calls.conversation_id
                                              AND s.tool = calls.c.name AND calls.kind = 'tool') AS server,
       coalesce(calls.c.name, calls.c.uri) AS name,
       coalesce(TRY_CAST(calls.c.result.isError AS BOOLEAN), false) AS is_error, calls.assembled_at,
       calls.spans[calls.call_index + 1].duration_ms AS duration_ms
FROM calls
"""

_SCORES = """
INSERT INTO score_summary
SELECT conversation_id, metric, conversation_version, score, success, evaluation_cost, service_name, agent_name,
       CASE WHEN metric = 'mcp_call_validity' THEN
           (SELECT coalesce(list(c.turn || chr(9) || c.kind || chr(9) || c.name), [])
            FROM (SELECT unnest(from_json(breakdown, '{"calls": [{"turn": "VARCHAR", "kind": "VARCHAR",
                                                      "name": "VARCHAR", "violations": "JSON"}]}').calls) AS c)
            WHERE contains(CAST(c.violations AS VARCHAR), 'inputSchema')) END,
       scored_at, 1.0 / coalesce(nullif(inclusion_probability, 0), 1.0),
       CASE WHEN metric IN ('mcp_use', 'mcp_task_completion') AND threshold IS NOT NULL THEN
           (SELECT count(*) FROM (SELECT unnest(from_json(breakdown, '{"tasks": ["JSON"]}').tasks) AS t)) END,
       CASE WHEN metric IN ('mcp_use', 'mcp_task_completion') AND threshold IS NOT NULL THEN
           (SELECT count(*) FILTER (WHERE coalesce(TRY_CAST(t->>'alignment_score' AS DOUBLE),
                                                   TRY_CAST(t->>'score' AS DOUBLE)) < x.threshold)
            FROM (SELECT unnest(from_json(breakdown, '{"tasks": ["JSON"]}').tasks) AS t)) END
FROM scores x WHERE scored_at >= ?
  AND NOT EXISTS (SELECT 1 FROM score_summary s  -- already there: most of the window, every refresh
                  WHERE s.conversation_id = x.conversation_id AND s.metric = x.metric
                    AND (s.conversation_version > x.conversation_version
                         OR (s.conversation_version = x.conversation_version AND s.scored_at >= x.scored_at)))
QUALIFY row_number() OVER (PARTITION BY conversation_id, metric
                           ORDER BY conversation_version DESC, scored_at DESC) = 1
ON CONFLICT (conversation_id, metric) DO UPDATE SET
    conversation_version = excluded.conversation_version, score = excluded.score, success = excluded.success,
    evaluation_cost = excluded.evaluation_cost, service_name = excluded.service_name,
    agent_name = excluded.agent_name, invalid_calls = excluded.invalid_calls, scored_at = excluded.scored_at,
    weight = excluded.weight, tasks = excluded.tasks, tasks_failed = excluded.tasks_failed
WHERE excluded.conversation_version > score_summary.conversation_version
   OR (excluded.conversation_version = score_summary.conversation_version
       AND excluded.scored_at >= score_summary.scored_at)
"""


class SummaryTables:
    """One per database: refreshes are serialized, and each starts where the previous one ended. Conversations are
    summarised in batches of bounded size; one that cannot be (too large for the buffer pool) is summarised
    without its calls and marked (`summary_note`), so it never holds up the conversations after it."""

    def __init__(self, margin: dt.timedelta = MARGIN, batch_bytes: int = BATCH_BYTES,
                 log: Callable[..., None] | None = None) -> None:
        self.margin = margin
        self.batch_bytes = batch_bytes
        self.log = log
        self._lock = threading.Lock()
        self._conversations_from: dt.datetime | None = None
        self._scores_from: dt.datetime | None = None
        self._seen: tuple[object, object] | None = None  # the newest rows at the last refresh
        self.failure: str | None = None  # why the last refresh failed: what the pages show may be stale
        self.failed_since: dt.datetime | None = None

    def refresh(self, con: duckdb.DuckDBPyConnection) -> None:
        """Bring the summaries up to the rows committed so far (from the start on the first call)."""
        with self._lock:
            try:
                self._refresh(con)
            except Exception as exc:
                self.failure = f"{type(exc).__name__}: {str(exc)[:300]}"
                self.failed_since = self.failed_since or dt.datetime.now(dt.UTC)
                raise
            self.failure = self.failed_since = None

    def _refresh(self, con: duckdb.DuckDBPyConnection) -> None:
        if self._conversations_from is None:
            self._conversations_from, self._scores_from = self._resume(con, self.margin)
        [(conversations_upto, scores_upto)] = con.execute(
            "SELECT (SELECT max(assembled_at) FROM conversations), (SELECT max(scored_at) FROM scores)").fetchall()
        if self._seen == (conversations_upto, scores_upto):
            return  # nothing written since
        fresh = con.execute(_FRESH_IDS, [self._conversations_from]).fetchall()
        batch: list[tuple[str, int]] = []
        size = 0
        for conversation_id, version, length in self._sizes(con, fresh):
            if batch and size + (length or 0) > self.batch_bytes:
                self._summarise(con, batch)
                batch, size = [], 0
            batch.append((conversation_id, version))
            size += length or 0
        if batch:
            self._summarise(con, batch)
        in_transaction(con, lambda: con.execute(_SCORES, [self._scores_from]))
        self._seen = (conversations_upto, scores_upto)
        if conversations_upto is not None:
            self._conversations_from = conversations_upto - self.margin
        if scores_upto is not None:
            self._scores_from = scores_upto - self.margin

    def _sizes(self, con: duckdb.DuckDBPyConnection, fresh: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
        """The fresh versions with their test cases' sizes, in the order given."""
        if not fresh:
            return []
        with registered(con, pa.table({"conversation_id": [c for c, _ in fresh],
                                       "version": pa.array([v for _, v in fresh], pa.int32())})) as ids:
            sizes = {(c, v): n for c, v, n in con.execute(_SIZES.format(ids=ids), [self._conversations_from])
                     .fetchall()}
        return [(c, v, sizes.get((c, v)) or 0) for c, v in fresh]

    def _summarise(self, con: duckdb.DuckDBPyConnection, batch: list[tuple[str, int]]) -> None:
        """Summarise these conversations in one transaction; when that fails, each alone, and one that fails alone
        without its calls, marked."""
        try:
            in_transaction(con, lambda: self._summarise_batch(con, batch))
            return
        except duckdb.Error as exc:
            if len(batch) > 1:
                for one in batch:
                    self._summarise(con, [one])
                return
            note = f"its MCP calls were not summarised ({type(exc).__name__}: {str(exc)[:200]})"
        [(conversation_id, version)] = batch
        if self.log is not None:
            self.log("warning", "conversation not summarised", conversation_id=conversation_id, version=version,
                     reason=note, advice="its page shows it whole; raise [store] memory_limit to list its calls")
        in_transaction(con, lambda: self._summarise_batch(con, batch, note))

    @staticmethod
    def _summarise_batch(con: duckdb.DuckDBPyConnection, batch: list[tuple[str, int]],
                         note: str | None = None) -> None:
        with registered(con, pa.table({"conversation_id": [c for c, _ in batch],
                                       "version": pa.array([v for _, v in batch], pa.int32())})) as ids:
            con.execute(_FRESH_CONVERSATIONS.format(ids=ids))
        if note is None:
            con.execute(_FRESH_CALLS)
        else:
            con.execute("CREATE OR REPLACE TEMP TABLE fresh_calls AS SELECT * FROM call_summary LIMIT 0")
        con.execute("INSERT INTO call_summary SELECT * FROM fresh_calls")
        con.execute(
            "INSERT OR REPLACE INTO conversation_summary "
            "SELECT f.conversation_id, f.version, f.service_name, f.agent_name, f.turns, f.mcp_calls, "
            "CASE WHEN ? IS NULL THEN coalesce(e.errors, 0) END, f.assembled_at, ? FROM fresh_conversations f "
            "LEFT JOIN (SELECT conversation_id, count(*) FILTER (WHERE is_error) AS errors FROM fresh_calls "
            "GROUP BY ALL) e USING (conversation_id)", [note, note])
        con.execute("DROP TABLE fresh_calls")
        con.execute("DROP TABLE fresh_conversations")

    @staticmethod
    def _resume(con: duckdb.DuckDBPyConnection, margin: dt.timedelta) -> tuple[dt.datetime, dt.datetime]:
        """Where the summaries end: a restart reads on from there, a new database from the beginning."""
        [(conversations, scores)] = con.execute(
            "SELECT (SELECT max(assembled_at) FROM conversation_summary), "
            "(SELECT max(scored_at) FROM score_summary)").fetchall()
        return ((conversations - margin) if conversations else _EPOCH, (scores - margin) if scores else _EPOCH)

    async def run(self, con: duckdb.DuckDBPyConnection, stop: asyncio.Event, period_s: float,
                  log: Callable[..., None]) -> None:
        """Refresh every `period_s`, so a page load finds little left to do; a conversation skipped is logged."""
        self.log = self.log or log
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.refresh, con)
            except Exception as exc:  # the pages refresh on their own; a failure here is logged and retried
                log("error", "summary refresh failed", reason=f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period_s)
