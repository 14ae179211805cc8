"""Retention, archive and the disk budget: old rows go in small batches, archived first when asked.

Spans go per conversation, once the conversation is complete and was last assembled before the cutoff, so a
conversation never loses part of its spans while it can still change. A span batch is journaled
(`retention_batches`, with a snapshot time) before it is archived and deleted; the archive file's name comes
from the batch, so a restart in the middle writes the same file again and deletes the same rows: nothing is
lost or duplicated. The conversation is then recorded in `pruned_conversations`, and a late span for it is
stored but not assembled into a new, truncated version while the marker lasts. Conversations, scores, jobs,
reviews and the bookkeeping beside them go by age (`windows`: each follows the data it is for), in batches
bounded by a timestamp, archived the same way; rows that exist only for a pruned row (a version's jobs, a score's
export mark and reuse entry) go in its transaction.

DuckDB reuses the blocks that deleted rows free, so the file stops growing at steady state, but it does not
give them back to the filesystem; `tracejudge compact` rewrites the file for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from tracejudge.collector.config import RetentionSettings
from tracejudge.collector.store.assembled_index import AssembledIndex, Change, epoch_us, index_bytes, index_path
from tracejudge.collector.store.connection.arrow_reads import arrow_table
from tracejudge.collector.store.connection.checkpoint_gate import CheckpointGate, WritesRefused
from tracejudge.collector.store.connection.id_table import id_table
from tracejudge.collector.store.connection.transaction import in_transaction
from tracejudge.collector.store.durable_files import write_durably
from tracejudge.collector.store.span_tables import prune_unreferenced
from tracejudge.collector.store.table_compaction import compact, garbage, keyed_tables

Log = Callable[..., None]
DISK_HIGH, DISK_LOW = 0.9, 0.8  # share of max_disk where the budget starts pruning, and where it stops
CHECKPOINT_WAIT_S = 2.0  # how long a checkpoint waits for the pipeline's writes to pause before the next round
# a keyed table with more live rows, or more bytes of them (rows x sampled width), is not rewritten: the
# pipeline's writes wait for the copy
MAX_COMPACT_ROWS = 200_000
MAX_COMPACT_BYTES = 256 * 1024 * 1024
COMPACT_BACKOFF_ROUNDS = 10  # a table whose rewrite failed is tried again after this many rounds
BUDGET_BATCHES_PER_ROUND = 20  # the budget prunes at most this many batches a round, and stops when one frees nothing


@dataclass
class RetentionStats:
    """What retention did since the collector started, for /metrics."""

    pruned: dict[str, int] = field(default_factory=dict)
    archived: dict[str, int] = field(default_factory=dict)
    last_prune_at: float | None = None
    disk_full: str | None = None  # why ingest is refused, while nothing can be freed under the disk budget
    checkpoints: dict[str, int] = field(default_factory=dict)  # by outcome: done, refused
    compacted: dict[str, int] = field(default_factory=dict)  # deleted rows freed by rewriting keyed tables

    def add(self, table: str, pruned: int, archived: int) -> None:
        self.pruned[table] = self.pruned.get(table, 0) + pruned
        self.archived[table] = self.archived.get(table, 0) + archived


@dataclass(frozen=True)
class StorageReport:
    """Rows per table, the database's bytes (used and free blocks, WAL) and retention's totals, for /metrics."""

    table_rows: dict[str, int]
    db_bytes: dict[str, int]
    table_bytes: dict[str, int]  # an estimate (`Retention.table_bytes`)
    pruned: dict[str, int]
    archived: dict[str, int]
    last_prune_at: float | None
    checkpoints: dict[str, int] = field(default_factory=dict)
    compacted: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _AgedTable:
    table: str
    column: str  # the timestamp that ages a row
    extra: str = ""  # more conditions, e.g. only failed jobs
    # statements (one `?`: the batch's bound) run in the batch's transaction before its rows go: rows of other
    # tables that exist for these (a score's export mark and reuse entry, a conversation version's jobs)
    dependents: tuple[str, ...] = ()
    summaries: tuple[str, ...] = ()  # the web UI's summary rows that go with the pruned rows (after them)
    versions: bool = False  # the assembler's index keeps each conversation's newest row (`AssembledIndex`)


_SCORE_KEY = ("s.conversation_id = d.conversation_id AND s.conversation_version = d.conversation_version "
              "AND s.metric = d.metric AND s.metric_config = d.metric_config")
AGED = {
    # a pruned version's finished jobs go with it; its pending ones are the scoring stage's to lease (it fails them:
    # "the conversation version is gone"), and deleting rows it updates meanwhile is a write conflict that undid the
    # whole batch, round after round, under a judge that could not keep up (`python bench/retention.py`)
    "conversations": _AgedTable("conversations", "assembled_at", dependents=(
        "DELETE FROM eval_jobs d WHERE status IN ('done', 'failed') AND EXISTS (SELECT 1 FROM conversations c "
        "WHERE c.assembled_at <= ? AND c.conversation_id = d.conversation_id AND c.version = d.conversation_version)",),
        summaries=(
        "DELETE FROM conversation_summary WHERE assembled_at <= ? AND conversation_id NOT IN "
        "(SELECT conversation_id FROM conversations)",
        "DELETE FROM call_summary WHERE assembled_at <= ? AND conversation_id NOT IN "
        "(SELECT conversation_id FROM conversations)"), versions=True),
    "scores": _AgedTable("scores", "scored_at", dependents=tuple(
        f"DELETE FROM {table} d WHERE EXISTS (SELECT 1 FROM scores s WHERE s.scored_at <= ? AND {_SCORE_KEY})"
        for table in ("score_exports", "judged_content", "judge_calls")),
        summaries=("DELETE FROM score_summary WHERE scored_at <= ?",)),
    "failed_jobs": _AgedTable("eval_jobs", "updated_at", "AND status = 'failed'"),
    "done_jobs": _AgedTable("eval_jobs", "updated_at", "AND status = 'done'"),
    "reviews": _AgedTable("reviews", "reviewed_at"),
    "review_queue": _AgedTable("review_queue", "enqueued_at"),
    "review_thumbs_down": _AgedTable("review_thumbs_down", "received_at"),
    "cohort_counts": _AgedTable("cohort_counts", "last_seen_at"),
    "pruned_conversations": _AgedTable("pruned_conversations", "pruned_at"),
    "judge_batches": _AgedTable("judge_batch_requests", "submitted_at"),
    "judge_calls": _AgedTable("judge_calls", "called_at"),
}
WIDTH_SAMPLE_ROWS = 256  # rows per table whose width estimates its bytes
WIDTH_REFRESH_S = 600.0
REVIEW_RULE_EDITS_KEPT = 100  # the review rules' edit history: the newest this many edits


def _shortest(*windows: float | None) -> float | None:
    kept = [w for w in windows if w is not None]
    return min(kept) if kept else None


def windows(settings: RetentionSettings, late_window_s: float) -> dict[str, float | None]:
    """How long each AGED table keeps its rows (None: for ever). The bookkeeping follows the data it is for: a
    done job, a review queue item and a thumbs-down go once their score or conversation version may have (the
    shorter window); a cohort value not seen for the conversations' window is new again; a pruned conversation's
    marker as long as the versions it keeps from a truncated successor (the conversations' window, at least the
    spans' and the late-span window; kept while conversations are)."""
    s = settings
    with_data = _shortest(s.scores, s.conversations)
    return {"conversations": s.conversations, "scores": s.scores, "failed_jobs": s.failed_jobs,
            "done_jobs": with_data, "reviews": s.reviews, "review_queue": with_data, "review_thumbs_down": with_data,
            "cohort_counts": s.conversations,
            "pruned_conversations": None if s.conversations is None else max(s.conversations, s.spans or 0.0,
                                                                             late_window_s),
            "judge_batches": s.judge_batches, "judge_calls": _shortest(s.judge_calls, s.scores)}


class Retention:
    def __init__(self, con: duckdb.DuckDBPyConnection, settings: RetentionSettings, log: Log, db_path: Path,
                 max_disk: int | None = None, on_report: Callable[[StorageReport], None] | None = None,
                 late_window_s: float = 240.0,
                 prune_dictionaries: Callable[[], None] | None = None, gate: CheckpointGate | None = None,
                 index: AssembledIndex | None = None, waiting: Callable[[], list[str]] | None = None) -> None:
        """`late_window_s`: the disk budget never takes spans of a conversation assembled more recently.
        `prune_dictionaries`: delete the resources and scopes no span refers to any more, where the span writer
        runs it between commits (`SpanStore.run_in_writer`); None: on this connection (no writer runs).
        `gate`: the store's, which the pipeline's writers hold (`SpanStore.gate`); None: no other writer.
        `index`: the assembler's index of assembled_traces (`AssembledIndex`); None: the file's, opened when spans
        are first pruned. `waiting`: the traces the assembler holds (waiting for their quiet period, or read and
        being built), which are not "never assembled" yet whatever their age."""
        self.con = con
        self._index = index
        self.waiting = waiting
        self.gate = gate or CheckpointGate()
        self.prune_dictionaries = prune_dictionaries or (lambda: prune_unreferenced(self.con))
        self._spans_pruned = False  # since the resources and scopes were last pruned
        self.late_window_s = late_window_s
        self.settings = settings
        self.log = log
        self.db_path = db_path
        self.max_disk = max_disk
        self.on_report = on_report
        self.stats = RetentionStats()
        self._widths: dict[str, float] = {}  # average row width of each table, as text (`table_bytes`)
        self._widths_at: float | None = None
        self._checkpoint_due = False  # rows were deleted and the checkpoint that frees their blocks was skipped
        self._round = 0
        self._compact_after: dict[str, int] = {}  # table -> the round its rewrite may be tried again

    @property
    def index(self) -> AssembledIndex:
        if self._index is None:
            self._index = AssembledIndex(index_path(self.db_path), self.con.cursor(), self.log)
        return self._index

    @property
    def enabled(self) -> bool:
        """Always, in effect: the judge's batch ledger expires by default."""
        return (self.max_disk is not None or self.settings.spans is not None
                or any(w is not None for w in windows(self.settings, self.late_window_s).values()))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if self.enabled:
                    try:
                        await asyncio.to_thread(self.apply)
                    except WritesRefused as exc:  # the store takes no delete now (a full disk): next interval
                        self.log("info", "retention waits for the store to take writes", reason=str(exc))
                if self.on_report is not None:
                    self.on_report(await asyncio.to_thread(self.report))
            except Exception as exc:  # retention must never stop the collector; it tries again next interval
                self.log("error", "retention failed", reason=f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.interval_s)

    def apply(self) -> None:
        """One round: unfinished batches, then each table's retention, then the disk budget (measured even when the
        store refuses the round's deletes, so what it reports stays current)."""
        now = datetime.now(UTC)
        try:
            self._prune_round(now)
        finally:
            self._disk_budget(now)
            self.stats.last_prune_at = time.time()

    def _prune_round(self, now: datetime) -> None:
        before = sum(self.stats.pruned.values())
        for batch_id, in self.con.execute("SELECT batch_id FROM retention_batches ORDER BY snapshot_at").fetchall():
            self._finish_span_batch(batch_id)
        if self.settings.spans is not None:
            self.prune_spans(now - timedelta(seconds=self.settings.spans))
        for name, keep in windows(self.settings, self.late_window_s).items():
            if keep is None:
                continue
            try:
                self._prune_aged(AGED[name], now - timedelta(seconds=keep), name)
            except duckdb.Error as exc:  # a write conflict with the pipeline: the other tables go on, this one
                self.log("warning", "retention of a table deferred", table=name,  # next round
                         reason=f"{type(exc).__name__}: {str(exc)[:300]}")
        self._prune_rule_edits()
        if self._spans_pruned:  # before the checkpoint, which then frees their blocks too
            self._spans_pruned = False
            self.prune_dictionaries()
        compacted = self._compact()
        if sum(self.stats.pruned.values()) > before or self._checkpoint_due or compacted:
            self._checkpoint()

    def _compact(self) -> bool:
        """Rewrite each keyed table that holds more deleted rows than live ones (DuckDB does not vacuum them:
        `table_compaction`), with the pipeline's writes and transactions paused; whether any was. A table too
        large to copy in one pause, or whose copy would not fit under the disk budget, is left as it is; one
        whose rewrite failed waits COMPACT_BACKOFF_ROUNDS rounds."""
        done = False
        self._round += 1
        for table in keyed_tables(self.con):
            found = garbage(self.con, table)
            if not found.worth_compacting or self._compact_after.get(table, 0) > self._round:
                continue
            if table not in self._widths:  # its row width is sampled by the first report: until then, no estimate
                continue
            copy_bytes = found.live * self._widths[table]
            if found.live > MAX_COMPACT_ROWS or copy_bytes > MAX_COMPACT_BYTES or (
                    self.max_disk is not None and self.used_bytes() + copy_bytes > self.max_disk * 0.9):
                continue
            try:
                ran = self.gate.alone(lambda table=table: compact(self.con, table), CHECKPOINT_WAIT_S,
                                      no_transactions=True)
            except (duckdb.Error, ValueError) as exc:  # the table is as it was; it waits some rounds
                self._compact_after[table] = self._round + COMPACT_BACKOFF_ROUNDS
                self.log("warning", "table compaction deferred", table=table, reason=f"{type(exc).__name__}: {exc}",
                         retry_in_rounds=COMPACT_BACKOFF_ROUNDS)
                continue
            if ran:
                done = True
                freed = found.stored - found.live
                self.stats.compacted[table] = self.stats.compacted.get(table, 0) + freed
                self.log("info", "table compacted", table=table, live_rows=found.live, deleted_rows_freed=freed)
        return done

    def _checkpoint(self) -> None:
        """Deleted rows free their blocks for reuse only once checkpointed; without it the WAL keeps growing
        until DuckDB's own threshold. Taken between the pipeline's writes (`CheckpointGate`)."""
        try:
            done = self.gate.alone(lambda: self.con.execute("CHECKPOINT"), CHECKPOINT_WAIT_S)
            outcome = "done" if done else "timed_out"
            if not done:
                self.log("info", "retention checkpoint deferred", reason=f"a writer held the database for over "
                         f"{CHECKPOINT_WAIT_S:.0f} s; the next round tries again")
        except duckdb.Error as exc:  # a connection outside the gate changed rows in place: the next round
            outcome = "refused"
            self.log("info", "retention checkpoint deferred", reason=str(exc))
        self._checkpoint_due = outcome != "done"
        self.stats.checkpoints[outcome] = self.stats.checkpoints.get(outcome, 0) + 1

    def report(self, con: duckdb.DuckDBPyConnection | None = None) -> StorageReport:
        """Table rows and database bytes now, with retention's totals; on `con` when another thread asks."""
        con = con or self.con
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = "
                                            "current_database() AND NOT temporary").fetchall()]
        # counted, not DuckDB's estimated_size: that counts deleted rows until their whole row group goes, so under
        # retention it only ever grew (`python bench/retention.py`)
        rows = dict(con.execute(" UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in tables)).fetchall()) \
            if tables else {}
        rows["spans"] = rows.pop("span_records", 0)  # the view users query
        [(block, used, free)] = con.execute(
            "SELECT block_size, used_blocks, free_blocks FROM pragma_database_size() "
            "WHERE database_name = current_database()").fetchall()
        wal = Path(str(self.db_path) + ".wal")
        sizes = {"used": block * used, "free": block * free, "wal": wal.stat().st_size if wal.exists() else 0}
        return StorageReport(rows, sizes, self.table_bytes(con, rows, block * used), dict(self.stats.pruned),
                             dict(self.stats.archived), self.stats.last_prune_at, dict(self.stats.checkpoints),
                             dict(self.stats.compacted))

    def table_bytes(self, con: duckdb.DuckDBPyConnection, rows: dict[str, int], used: int) -> dict[str, int]:
        """The database's used bytes split between the tables by rows x average row width. The width is of the
        first WIDTH_SAMPLE_ROWS rows of each table as text, measured at most every WIDTH_REFRESH_S: what it
        costs does not grow with the file. An estimate (compression differs by column), whose sum is the real
        total."""
        now = time.monotonic()
        if self._widths_at is None or now - self._widths_at > WIDTH_REFRESH_S or rows.keys() - self._widths.keys():
            widths = {}
            for table in rows:
                source = "span_records" if table == "spans" else table
                widths[table] = 0.0  # a table dropped meanwhile stays at 0 until the next measure
                with contextlib.suppress(duckdb.Error):
                    [(width,)] = con.execute(f"SELECT avg(strlen(CAST(t AS VARCHAR))) FROM (SELECT * FROM "
                                             f"{source} LIMIT {WIDTH_SAMPLE_ROWS}) t").fetchall()
                    widths[table] = float(width or 0.0)
            self._widths, self._widths_at = widths, now
        weight = {t: n * self._widths.get(t, 0.0) for t, n in rows.items()}
        total = sum(weight.values())
        return {t: round(used * w / total) if total else 0 for t, w in weight.items()}

    def used_bytes(self) -> int:
        """Bytes the database holds in use (not the free blocks DuckDB will reuse), plus its WAL and the assembled
        traces' index beside it."""
        report = self.report()
        return report.db_bytes["used"] + report.db_bytes["wal"] + index_bytes(self.db_path)

    # --- spans -----------------------------------------------------------------------------------------

    def prune_spans(self, cutoff: datetime, limit: int | None = None, orphans: bool = True) -> int:
        """Prune the spans of every conversation last assembled before `cutoff` (or the `limit` oldest), and with
        `orphans` the spans of traces never assembled (no conversation) received before it."""
        total = 0
        while limit is None or total < limit:
            size = self.settings.batch_conversations if limit is None else min(self.settings.batch_conversations,
                                                                                limit - total)
            picked = self.con.execute(
                "SELECT conversation_id, list(trace_id ORDER BY trace_id) FROM assembled_traces GROUP BY 1 "
                "HAVING max(assembled_at) < ? ORDER BY max(assembled_at), conversation_id LIMIT ?",
                [cutoff, size]).fetchall()
            lone = [] if picked or not orphans else self._never_assembled(cutoff, size * 10)
            if not picked and not lone:
                return total
            conversations = [c for c, _ in picked]
            traces = sorted({t for _, ts in picked for t in ts} | set(lone))
            batch_id = uuid.uuid4().hex  # the journal row makes a restart finish this batch under the same name
            self.con.execute("INSERT INTO retention_batches VALUES (?, now(), ?, ?)", [batch_id, conversations, traces])
            self._finish_span_batch(batch_id)
            total += len(conversations) or len(lone)
        return total

    def _never_assembled(self, cutoff: datetime, limit: int) -> list[str]:
        """Traces with no assembled_traces row and no span received since `cutoff`, except those the assembler
        holds: one read and being built has no row until its version is written, and pruned as never assembled its
        conversation would lose its spans with no marker left for a late span (a real collector's 2 s span window
        on a busy machine)."""
        with id_table(self.con, self.waiting() if self.waiting is not None else []) as held:
            return [t for (t,) in self.con.execute(
                "SELECT trace_id FROM span_records WHERE trace_id NOT IN (SELECT trace_id FROM assembled_traces) "
                f"AND trace_id NOT IN (SELECT id FROM {held}) GROUP BY 1 HAVING max(received_at) < ? "
                "ORDER BY trace_id LIMIT ?", [cutoff, limit]).fetchall()]

    def _finish_span_batch(self, batch_id: str) -> None:
        """Archive (idempotently) and delete the journaled batch's spans, in that order."""
        [(snapshot, conversations, traces)] = self.con.execute(
            "SELECT snapshot_at, conversation_ids, trace_ids FROM retention_batches WHERE batch_id = ?",
            [batch_id]).fetchall()
        with id_table(self.con, traces) as ids, id_table(self.con, conversations) as pruned:
            where = f"trace_id IN (SELECT id FROM {ids}) AND received_at <= ?"
            archived = self._archive("spans", f"SELECT * FROM spans WHERE {where}", [snapshot],
                                     "CAST(coalesce(make_timestamp(start_ns // 1000), timezone('UTC', received_at)) "
                                     "AS DATE)", batch_id)
            counted: list[int] = []

            def work() -> None:
                counted.extend(self.con.execute(f"DELETE FROM span_records WHERE {where}", [snapshot]).fetchall()[0])
                # the traces' rows from whenever they were written: a full scan, once a batch (not once a poll)
                self.con.execute(f"DELETE FROM assembled_traces WHERE trace_id IN (SELECT id FROM {ids})")
                self.con.execute(f"DELETE FROM trace_attachments WHERE trace_id IN (SELECT id FROM {ids})")
                self.con.execute(f"INSERT OR REPLACE INTO pruned_conversations SELECT id, now() FROM {pruned}")
                self.con.execute("DELETE FROM retention_batches WHERE batch_id = ?", [batch_id])

            self.index.write(self.con, work, Change(remove=list(traces)))
            deleted = counted[0]
        self._spans_pruned = True
        self.stats.add("spans", deleted, archived)
        self.log("debug", "spans pruned", conversations=len(conversations), traces=len(traces), spans=deleted,
                 archived=archived)

    # --- conversations, scores, failed jobs ------------------------------------------------------------

    def _prune_aged(self, aged: _AgedTable, cutoff: datetime, name: str) -> None:
        size = self.settings.batch_conversations * 10
        while True:
            bound = self.con.execute(
                f"SELECT max({aged.column}) FROM (SELECT {aged.column} FROM {aged.table} WHERE {aged.column} < ? "
                f"{aged.extra} ORDER BY {aged.column} LIMIT ?)", [cutoff, size]).fetchall()[0][0]
            if bound is None:
                return
            where = f"{aged.column} <= ? {aged.extra}"
            batch_id = f"{int(bound.timestamp() * 1e6)}"
            archived = self._archive(name, f"SELECT * FROM {aged.table} WHERE {where}", [bound],
                                     f"CAST(timezone('UTC', {aged.column}) AS DATE)", batch_id)
            counted: list[int] = []

            def work(aged: _AgedTable = aged, where: str = where, bound: datetime = bound,
                     counted: list[int] = counted) -> None:
                for statement in aged.dependents:
                    self.con.execute(statement, [bound])
                counted.extend(self.con.execute(f"DELETE FROM {aged.table} WHERE {where}", [bound]).fetchall()[0])
                for statement in aged.summaries:
                    self.con.execute(statement, [bound])

            if aged.versions:  # the assembler's index forgets the conversations with no version left
                self.index.write(self.con, work, Change(versions_through_us=epoch_us(bound)))
            else:
                in_transaction(self.con, work)
            deleted = counted[0]
            self.stats.add(name, deleted, archived)
            self.log("debug", f"{name} pruned", rows=deleted, archived=archived, up_to=bound.isoformat())
            if deleted < size:
                return

    def _prune_rule_edits(self) -> None:
        """The review rules as last edited are what counts; their history keeps the newest edits only."""
        [(deleted,)] = self.con.execute(
            "DELETE FROM review_rules WHERE edited_at < (SELECT min(edited_at) FROM (SELECT edited_at FROM "
            "review_rules ORDER BY edited_at DESC LIMIT ?))", [REVIEW_RULE_EDITS_KEPT]).fetchall()
        if deleted:
            self.stats.add("review_rules", deleted, 0)

    # --- archive ---------------------------------------------------------------------------------------

    def _archive(self, name: str, select: str, params: list[Any], day: str, batch_id: str) -> int:
        """Write the rows of `select` under archive_dir/name/day=YYYY-MM-DD/, one file per day named for the
        batch, fsynced before returning; 0 without an archive_dir."""
        root = self.settings.archive_dir
        if root is None:
            return 0
        table = arrow_table(self.con, f"SELECT *, {day} AS __day FROM ({select})", params)
        written = 0
        days = table.column("__day").to_pylist()
        for day in sorted(set(days), key=str):
            mask = pa.array([d == day for d in days])
            part = table.filter(mask).drop_columns(["__day"])
            directory = Path(root) / name / f"day={day}"
            directory.mkdir(parents=True, exist_ok=True)
            write_durably(part, directory / f"batch-{batch_id}.parquet")
            written += part.num_rows
        return written

    # --- disk budget -----------------------------------------------------------------------------------

    def _disk_budget(self, now: datetime) -> None:
        if self.max_disk is None:
            return
        used = self.used_bytes()
        if used < DISK_HIGH * self.max_disk:
            if self.stats.disk_full is not None:
                self.log("info", "disk budget: ingest resumes", used_bytes=used, max_disk=self.max_disk)
            self.stats.disk_full = None
            return
        pruned_any = False
        for _ in range(BUDGET_BATCHES_PER_ROUND):
            if used < DISK_LOW * self.max_disk:
                break
            try:
                freed = self.prune_spans(now - timedelta(seconds=self.late_window_s),
                                         limit=self.settings.batch_conversations, orphans=False)
            except WritesRefused:  # the disk itself is full: nothing can be freed now, so ingest is refused below
                break
            if not freed:
                break
            pruned_any = True
            self._checkpoint()
            after = self.used_bytes()
            if after >= used:  # blocks are freed only by a checkpoint no write transaction overlaps: next round
                used = after
                break
            used = after
        if used >= self.max_disk and not pruned_any:  # pruned but not yet freed: the next round's checkpoint
            reason = (f"the database uses {used:,} bytes of its {self.max_disk:,}-byte disk budget and no complete "
                      "conversation's spans are left to prune; raise [store] max_disk or shorten [retention]")
            if self.stats.disk_full is None:
                self.log("error", "disk budget exhausted: ingest refused", reason=reason)
            self.stats.disk_full = reason
        elif used < self.max_disk:
            self.stats.disk_full = None
