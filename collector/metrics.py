"""The collector's Prometheus metrics, in a registry of its own (served on the admin port at /metrics)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from tracejudge.collector.process_memory import children_resident_bytes, resident_bytes

if TYPE_CHECKING:
    from tracejudge.collector.pipeline.retention import StorageReport
    from tracejudge.collector.pipeline.scoring_stage import ScoredEvent

MAX_LABEL_VALUES = 50  # distinct services (and agents) labelled apart; the rest are "other"


class BoundedLabel:
    """Label values as they come, up to a fixed number; later new values become "other", so a label cannot
    grow the time series without bound."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        value = value or "unknown"
        if value in self.seen:
            return value
        if len(self.seen) < self.limit:
            self.seen.add(value)
            return value
        return "other"


class CollectorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.spans_received = Counter("tracejudge_spans_received", "Spans in export requests", registry=self.registry)
        self.spans_accepted = Counter("tracejudge_spans_accepted", "Spans committed to the store (new ones only)",
                                      registry=self.registry)
        self.spans_duplicate = Counter("tracejudge_spans_duplicate", "Redelivered spans already stored (ignored)",
                                       registry=self.registry)
        self.spans_rejected = Counter("tracejudge_spans_rejected", "Spans not stored, by reason", ["reason"],
                                      registry=self.registry)
        for reason in ("invalid_span", "backpressure", "store_error"):  # at 0 from the start, so rates work
            self.spans_rejected.labels(reason)
        self.requests = Counter("tracejudge_export_requests", "Export requests by protocol and answer",
                                ["protocol", "status"], registry=self.registry)
        self.commit_seconds = Histogram("tracejudge_commit_seconds", "Time of one group commit",
                                        buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                                        registry=self.registry)
        self.commit_spans = Histogram("tracejudge_commit_spans", "Spans in one group commit",
                                      buckets=(1, 10, 100, 1000, 5000, 10_000, 50_000), registry=self.registry)
        self.queue_spans = Gauge("tracejudge_queue_spans", "Spans waiting for a commit", registry=self.registry)
        self.assembler_errors = Counter("tracejudge_assembler_errors", "Commits the conversation assembler failed "
                                        "to take in (their traces are assembled after a restart)",
                                        registry=self.registry)
        self.traces_waiting = Gauge("tracejudge_traces_waiting", "Traces whose conversation waits for its quiet "
                                    "period (or end marker) before it is assembled", registry=self.registry)
        self.conversations_waiting = Gauge("tracejudge_conversations_waiting", "Conversations those traces wait "
                                           "in", registry=self.registry)
        self.conversations_assembled = Gauge("tracejudge_conversations_assembled_total", "Conversation versions "
                                             "written since the start (each is scored)", registry=self.registry)
        self.read_spans = Gauge("tracejudge_assembly_read_spans_total", "Spans read back to assemble conversations "
                                "(each read counts the spans it returned)", registry=self.registry)
        self.read_seconds = Gauge("tracejudge_assembly_read_seconds_total", "Time those reads took: it follows "
                                  "what they scan, the spans received since the oldest of the poll's waiting "
                                  "conversations began", registry=self.registry)
        self.assembly_cpu = Gauge("tracejudge_assembly_cpu_seconds_total", "CPU seconds assembly spent, by stage: "
                                  "plan (the rest of its rounds: choosing due conversations, their keys and batches, "
                                  "the waiting set's upkeep), read (spans read back), build (mapping, composing and "
                                  "the checks: the workers' CPU and the server's), write (versions, jobs, scores, "
                                  "summaries), observe (noting each commit, on the span writer's thread); each "
                                  "thread's own CPU, not DuckDB's worker threads ([store] threads above 1)",
                                  ["stage"], registry=self.registry)
        self.assembly_workers = Gauge("tracejudge_assembly_workers", "Assembly worker processes running (none until "
                                      "the first conversation is built)", registry=self.registry)
        self.assembly_workers_lost = Gauge("tracejudge_assembly_workers_lost_total", "Assembly workers that died "
                                           "(killed, out of memory) and were replaced; a batch one died in is built "
                                           "again after another quiet period", registry=self.registry)
        self.journaled_spans = Gauge("tracejudge_ingest_journaled_spans_total", "Spans acknowledged from the ingest "
                                     "journal because their commit was held up (a checkpoint), since start",
                                     registry=self.registry)
        self.requests_slowed = Gauge("tracejudge_ingest_requests_slowed_total", "Export requests answered 50 ms or "
                                     "more after they reached the span writer (by their commit, or by the ingest "
                                     "journal), since start: the assembler pauses for ingest only after a pass that "
                                     "slowed one",
                                     registry=self.registry)
        self.index_rebuilds = Gauge("tracejudge_assembled_index_rebuilds_total", "Times the index of assembled "
                                    "traces beside the database was found behind it and made again from it (a kill "
                                    "between their commits, a restored file, a damaged index file): about 6 s a "
                                    "million traces, assembly waiting", registry=self.registry)
        self.traces_left_out = Gauge("tracejudge_traces_left_out_total", "Traces stored while the waiting index "
                                     "was full ([conversations] max_waiting_traces), and commits the assembler "
                                     "failed on, taken in and assembled later",
                                     registry=self.registry)
        self.trace_cache_bytes = Gauge("tracejudge_trace_cache_bytes", "Estimated memory of the mapped traces kept "
                                       "for conversations that go on ([conversations] trace_cache)",
                                       registry=self.registry)
        self.trace_cache_lookups = Gauge("tracejudge_trace_cache_lookups_total", "Earlier traces of conversations "
                                         "that went on: found mapped (hit) or read back and mapped again (miss)",
                                         ["result"], registry=self.registry)
        self.jobs = Gauge("tracejudge_eval_jobs", "Scoring jobs by state", ["state"], registry=self.registry)
        self.cost_today = Gauge("tracejudge_judge_cost_today_usd", "Judge spend since 00:00 UTC",
                                registry=self.registry)
        self.measure_seconds = Histogram("tracejudge_measure_seconds", "Time to score one job, judge calls "
                                         "included", ["metric"], buckets=(0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60),
                                         registry=self.registry)
        self.judge_errors = Counter("tracejudge_judge_errors", "Scoring attempts that failed, by error kind",
                                    ["metric", "kind"], registry=self.registry)
        self.store_bytes = Gauge("tracejudge_store_bytes", "Size of the database file and its WAL",
                                 registry=self.registry)
        labels = ["metric", "service", "agent"]
        self.score = Histogram("tracejudge_score", "Scores written, by metric, service and agent", labels,
                               buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=self.registry)
        self.scores = Counter("tracejudge_scores", "Scores written, by result (pass, fail, scored, n/a)",
                              [*labels, "result"], registry=self.registry)
        self.scores_weighted = Counter("tracejudge_scores_weighted", "Scores written, each counted 1 / the probability "
                                       "its conversation had of being scored (sums estimate all traffic; their "
                                       "ratios are Hajek pass rates), by metric, service, service.version and result",
                                       ["metric", "service", "service_version", "result"], registry=self.registry)
        self.canary = Gauge("tracejudge_canary_state", "The canary gate of each watched cohort pair ([cohorts] "
                            "watch): 1 the candidate is worse by more than the margin, 0 it is not, -1 not enough "
                            "data yet (an always-valid confidence sequence: alert on it directly)",
                            ["baseline", "candidate", "metric"], registry=self.registry)
        self.canary_difference = Gauge("tracejudge_canary_difference", "Candidate minus baseline pass rate of each "
                                       "watched cohort pair", ["baseline", "candidate", "metric"],
                                       registry=self.registry)
        self.judge_cost = Counter("tracejudge_judge_cost_usd", "Judge spend of scores written (known prices only)",
                                  ["metric"], registry=self.registry)
        self.judge_tokens = Counter("tracejudge_judge_tokens", "Judge tokens of scores written", ["metric",
                                    "direction"], registry=self.registry)
        self.agreement_kappa = Gauge("tracejudge_judge_agreement_kappa", "Cohen's kappa between the judge's and "
                                     "reviewers' pass/fail (weighted by queue-sampling probability; see "
                                     "/api/agreement for intervals)", ["metric", "metric_config", "judge_model"],
                                     registry=self.registry)
        self.agreement_accuracy = Gauge("tracejudge_judge_agreement_accuracy", "Share of reviews where judge and "
                                        "reviewer agree on pass/fail (weighted as kappa)",
                                        ["metric", "metric_config", "judge_model"], registry=self.registry)
        self.agreement_reviews = Gauge("tracejudge_judge_agreement_reviews", "Reviews behind the agreement figures",
                                       ["metric", "metric_config", "judge_model"], registry=self.registry)
        self.oldest_waiting = Gauge("tracejudge_oldest_waiting_job_seconds", "Age of the oldest job not yet scored "
                                    "(pending, waiting for a judge or the budget)", registry=self.registry)
        self._service, self._agent, self._version = BoundedLabel(), BoundedLabel(), BoundedLabel()
        self.table_rows = Gauge("tracejudge_table_rows", "Rows per table", ["table"],
                                registry=self.registry)
        self.db_bytes = Gauge("tracejudge_db_bytes", "Database blocks in use and free for reuse, and the WAL",
                              ["kind"], registry=self.registry)
        self.table_bytes = Gauge("tracejudge_table_bytes", "Database bytes in use per table, estimated: the used "
                                 "blocks split by rows x the average width of a sample of each table's rows",
                                 ["table"], registry=self.registry)
        self.rows_pruned = Gauge("tracejudge_rows_pruned_total", "Rows retention deleted since the start, by table",
                                 ["table"], registry=self.registry)
        self.rows_archived = Gauge("tracejudge_rows_archived_total", "Rows retention archived since the start, by "
                                   "table", ["table"], registry=self.registry)
        self.last_prune = Gauge("tracejudge_last_prune_timestamp_seconds", "When retention last ran (Unix time)",
                                registry=self.registry)
        self.rows_compacted = Gauge("tracejudge_rows_compacted_total", "Deleted rows freed since the start by "
                                    "rewriting keyed tables (DuckDB does not vacuum them), by table", ["table"],
                                    registry=self.registry)
        self.task_results = Counter("tracejudge_task_results", "Judged tasks by metric and result at the "
                                    "threshold (pass / fail): a conversation's score averages them unless "
                                    "[scoring] aggregation = \"any_task\"", ["metric", "result"],
                                    registry=self.registry)
        self.checkpoints = Gauge("tracejudge_checkpoints_total", "Retention's checkpoints since the start, by outcome: "
                                 "done; timed_out (a writer held the database past the wait); refused (DuckDB "
                                 "refused it for a write outside the checkpoint gate)", ["outcome"],
                                 registry=self.registry)
        self.late_after_prune = Gauge("tracejudge_late_spans_after_prune_total", "Conversations that got spans "
                                      "after retention pruned theirs (stored, not assembled)", registry=self.registry)
        ProcessCollector(registry=self.registry)  # process_*: the server's CPU, memory, open files
        self.resident = Gauge("tracejudge_resident_memory_bytes", "Resident memory now of the server and of its "
                              "child processes together (assembly and decode workers, query processes): summed, "
                              "what a container's memory limit counts", ["process"], registry=self.registry)
        self.resident.labels("server").set_function(lambda: resident_bytes(os.getpid()))
        self.resident.labels("children").set_function(children_resident_bytes)
        self.duckdb_memory = Gauge("tracejudge_duckdb_memory_bytes", "DuckDB's memory by what holds it "
                                   "(duckdb_memory(): base_table, hash_table, ...), within [store] memory_limit",
                                   ["tag"], registry=self.registry)
        self.duckdb_spilled = Gauge("tracejudge_duckdb_temporary_bytes", "What DuckDB spilled to temporary files, "
                                    "by what holds it", ["tag"], registry=self.registry)
        self.duckdb_memory_limit = Gauge("tracejudge_duckdb_memory_limit_bytes", "DuckDB's memory_limit in bytes",
                                         registry=self.registry)

    def on_commit(self, seconds: float, spans: int, duplicates: int = 0) -> None:
        """One group commit: `spans` newly stored, `duplicates` redelivered and ignored."""
        self.commit_seconds.observe(seconds)
        self.commit_spans.observe(spans + duplicates)
        self.spans_accepted.inc(spans)
        self.spans_duplicate.inc(duplicates)

    def on_measured(self, metric: str, seconds: float, error_kind: str | None) -> None:
        self.measure_seconds.labels(metric).observe(seconds)
        if error_kind is not None:
            self.judge_errors.labels(metric, error_kind).inc()

    def on_scored(self, event: ScoredEvent) -> None:
        service, agent = self._service(event.service), self._agent(event.agent)
        if event.tasks_passed:
            self.task_results.labels(event.metric, "pass").inc(event.tasks_passed)
        if event.tasks_failed:
            self.task_results.labels(event.metric, "fail").inc(event.tasks_failed)
        if event.score is not None:
            self.score.labels(event.metric, service, agent).observe(event.score)
        self.scores.labels(event.metric, service, agent, event.result).inc()
        self.scores_weighted.labels(event.metric, service, self._version(event.service_version),
                                    event.result).inc(event.weight)
        if event.cost_usd:
            self.judge_cost.labels(event.metric).inc(event.cost_usd)
        self.judge_tokens.labels(event.metric, "input").inc(event.input_tokens)
        self.judge_tokens.labels(event.metric, "output").inc(event.output_tokens)

    def on_storage(self, report: StorageReport) -> None:
        """Table sizes and retention's work, refreshed by the retention loop."""
        for table, rows in report.table_rows.items():
            self.table_rows.labels(table).set(rows)
        for kind, size in report.db_bytes.items():
            self.db_bytes.labels(kind).set(size)
        for table, size in report.table_bytes.items():
            self.table_bytes.labels(table).set(size)
        for table, rows in report.pruned.items():
            self.rows_pruned.labels(table).set(rows)
        for table, rows in report.archived.items():
            self.rows_archived.labels(table).set(rows)
        for outcome, count in report.checkpoints.items():
            self.checkpoints.labels(outcome).set(count)
        for table, rows in report.compacted.items():
            self.rows_compacted.labels(table).set(rows)
        if report.last_prune_at is not None:
            self.last_prune.set(report.last_prune_at)

    def on_duckdb_memory(self, rows: list[tuple[str, int, int]], limit: int | None) -> None:
        """duckdb_memory()'s rows (tag, bytes in memory, bytes spilled), and the memory limit in bytes."""
        for tag, in_memory, spilled in rows:
            self.duckdb_memory.labels(tag.lower()).set(in_memory)
            self.duckdb_spilled.labels(tag.lower()).set(spilled)
        if limit is not None:
            self.duckdb_memory_limit.set(limit)

    def watch(self, queue_spans: Callable[[], float], store_bytes: Callable[[], float]) -> None:
        self.queue_spans.set_function(queue_spans)
        self.store_bytes.set_function(store_bytes)
