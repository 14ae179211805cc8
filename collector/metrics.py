"""The collector's Prometheus metrics, in a registry of its own (served on the admin port at /metrics)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
        self.requests = Counter("tracejudge_export_requests", "Export requests by protocol and answer",
                                ["protocol", "status"], registry=self.registry)
        self.commit_seconds = Histogram("tracejudge_commit_seconds", "Time of one group commit",
                                        buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                                        registry=self.registry)
        self.commit_spans = Histogram("tracejudge_commit_spans", "Spans in one group commit",
                                      buckets=(1, 10, 100, 1000, 5000, 10_000, 50_000), registry=self.registry)
        self.queue_spans = Gauge("tracejudge_queue_spans", "Spans waiting for a commit", registry=self.registry)
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

    def watch(self, queue_spans: Callable[[], float], store_bytes: Callable[[], float]) -> None:
        self.queue_spans.set_function(queue_spans)
        self.store_bytes.set_function(store_bytes)
