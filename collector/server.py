"""`tracejudge serve`: wire the span store, both OTLP receivers and the admin API, and run until a signal.

Start-up opens (and migrates) the database before listening, so a locked or unwritable file fails at
once with its name. SIGTERM/SIGINT stop the receivers accepting, let in-flight exports finish their
commit, drain the writer and exit 0. A database DuckDB invalidated (a fatal error: every statement fails from
then on) stops the collector the same way, after one critical log line, and `serve` raises StoreInvalidated,
so the process exits non-zero and its supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import signal
import time

import duckdb

from tracejudge.collector.admin import AdminServer
from tracejudge.collector.config import Settings, judge_options
from tracejudge.collector.exporters.score_events import ScoreEventExporter, otlp_log_exporter
from tracejudge.collector.history.lake import LakePublisher, publish_periodically
from tracejudge.collector.history.query_sandbox import DEFAULT_DISK, SandboxLimits
from tracejudge.collector.log import Logger
from tracejudge.collector.metrics import CollectorMetrics
from tracejudge.collector.pipeline.assembly.conversation_assembler import CPU_STAGES, ConversationAssembler
from tracejudge.collector.pipeline.retention import Retention, StorageReport
from tracejudge.collector.pipeline.scoring_stage import ScoringStage, StageConfig
from tracejudge.collector.pipeline.summary_tables import REFRESH_EVERY_S
from tracejudge.collector.receivers.decode_pool import DecodePool, default_workers
from tracejudge.collector.receivers.http_guard import raise_open_file_limit
from tracejudge.collector.receivers.ingest import Ingest
from tracejudge.collector.receivers.otlp_columns import native_decode_built, native_decode_enabled
from tracejudge.collector.receivers.otlp_grpc import GrpcReceiver
from tracejudge.collector.receivers.otlp_http import HttpReceiver
from tracejudge.collector.review.reviews import reviewer_tokens
from tracejudge.collector.sizes import parse_size
from tracejudge.collector.store.assembled_index import AssembledIndex, index_path
from tracejudge.collector.store.connection.checkpoint_gate import WritesRefused
from tracejudge.collector.store.connection.memory_release import arrow_on_the_system_allocator, fewer_malloc_arenas
from tracejudge.collector.store.span_store import SpanStore, StoreInvalidated, mark_pandas_absent
from tracejudge.collector.store.span_tables import prune_unreferenced
from tracejudge.mapping.compiled import running_compiled

JUDGE_ADVICE = ("export OPENAI_API_KEY=... (or OPENAI_BASE_URL=http://127.0.0.1:8000/v1 for a local OpenAI-compatible "
                "server, with --judge-model NAME) and restart `tracejudge serve`: waiting jobs then run. Or run "
                "`tracejudge score --pending` with the key set, against this collector.")


def stage_config(settings: Settings) -> StageConfig:
    sc = settings.scoring
    return StageConfig(metrics=tuple(sc.metrics), eval_mode=sc.eval_mode, model=sc.model,
                       system_one_model=sc.system_one_model, threshold=sc.threshold, strict_mode=sc.strict_mode,
                       aggregation=sc.aggregation,
                       concurrency=sc.concurrency, daily_budget_usd=sc.daily_budget_usd,
                       max_attempts=sc.max_attempts, lease_s=sc.lease_s, retry_backoff_s=sc.retry_backoff_s,
                       outage_backoff_s=sc.outage_backoff_s, outage_max_backoff_s=sc.outage_max_backoff_s,
                       judge=judge_options(sc), calibration=sc.calibration,
                       calibration_examples=sc.calibration_examples)


class Collector:
    def __init__(self, settings: Settings, logger: Logger) -> None:
        self.settings = settings
        self.log = logger
        self.metrics = CollectorMetrics()
        st = settings.store
        self.store = SpanStore(st.db, max_batch_spans=st.max_batch_spans, max_queue_spans=st.max_queue_spans,
                               retry_after_s=st.retry_after_s, on_commit=self.metrics.on_commit,
                               memory_limit=st.memory_limit, temp_limit=st.temp_limit, threads=st.threads,
                               checkpoint_threshold=st.checkpoint_threshold, journal_after_s=st.journal_after,
                               assembling_checkpoint_threshold=st.assembling_checkpoint_threshold)
        self.metrics.watch(lambda: self.store.queued_spans, self.store.size_bytes)
        workers, redactor = settings.server.decode_workers, settings.redaction.redactor()
        self.decoder = DecodePool(default_workers(redactor is not None) if workers < 0 else workers, redactor,
                                  settings.limits.span_limits(), self.log)
        ingest = Ingest(self.store, self.metrics, settings.server.ingest_token, self.decoder,
                        max_inflight_bytes=settings.server.max_inflight_bytes)
        self.grpc = GrpcReceiver(settings.server, ingest)
        self.http = HttpReceiver(settings.server, ingest)
        self.admin = AdminServer(settings.server.admin_host, settings.server.admin_port, self.store, self.metrics,
                                 settings.server.query_token, max_connections=settings.server.max_connections,
                                 header_timeout_s=settings.server.header_timeout_s,
                                 budget_usd=settings.scoring.daily_budget_usd, trace_url=settings.ui.trace_url,
                                 allowed_hosts=settings.server.admin_allowed_hosts,
                                 query_limits=SandboxLimits(settings.store.query_memory, parse_size(
                                     settings.store.temp_limit or f"{DEFAULT_DISK}B"), folder=settings.store.db.parent),
                                 mcp_tools=settings.mapping.mcp_tools, max_spans=settings.conversations.max_spans,
                                 reviewers=reviewer_tokens(settings.server.reviewer_tokens),
                                 review_rules=settings.review, saved_cohorts=settings.cohorts.saved,
                                 watch=settings.cohorts.watch)
        self.stage: ScoringStage | None = None
        self.retention: Retention | None = None
        self.index: AssembledIndex | None = None  # assembled_traces indexed beside the database
        self.assembler: ConversationAssembler | None = None
        self.score_export: ScoreEventExporter | None = None
        self._stop_pipeline = asyncio.Event()
        self._pipeline: list[asyncio.Task[None]] = []
        self.publisher: LakePublisher | None = None
        self._stop_publishing = asyncio.Event()
        self._publishing: asyncio.Task[None] | None = None
        self.stop_requested = asyncio.Event()  # by SIGTERM/SIGINT, or (from any thread) when it cannot go on
        self._loop: asyncio.AbstractEventLoop | None = None

    def _log(self, level: str, event: str, **fields: object) -> None:
        self.log.log(level, event, **fields)

    def _on_storage(self, report: StorageReport) -> None:
        self.metrics.on_storage(report)
        if self.assembler is not None:
            self.metrics.late_after_prune.set(self.assembler.late_after_prune)

    def _assembler_missed(self, exc: Exception) -> None:
        self.metrics.assembler_errors.inc()
        self.log.error("the assembler missed a commit", error=f"{type(exc).__name__}: {exc}",
                       advice="its traces are taken in again from their stored spans, as when the waiting index "
                              "is full; please report this")

    def _store_invalidated(self, error: StoreInvalidated) -> None:
        """From whichever thread met DuckDB's fatal error first: have `serve` stop, and say so once (the stop first:
        a log that cannot be written, on the disk that failed the checkpoint, must not keep the collector up)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.stop_requested.set)
        self.log.critical("the database is invalid; stopping", reason=error.error, advice=error.advice)

    async def start(self) -> None:
        raise_open_file_limit()  # connection caps, not the descriptor limit, decide who is turned away
        self._loop = asyncio.get_running_loop()
        self.store.on_invalidated = self._store_invalidated
        self.store.on_journal_error = lambda message: self.log.error("ingest journal", reason=message)
        await asyncio.to_thread(self.store.open)
        if self.store.stats.replayed_spans:
            self.log.info("acknowledged spans committed from the ingest journal",
                          spans=self.store.stats.replayed_spans)
        self.stage = ScoringStage(self.store.cursor(), stage_config(self.settings), self._log,
                                  self.metrics.on_measured, self.metrics.on_scored,
                                  redactor=self.settings.redaction.redactor())
        # beside the database; its first lookup makes it again if it is behind (a crash between their commits, a
        # restored file), so ingest does not wait for that
        self.index = await asyncio.to_thread(AssembledIndex, index_path(self.settings.store.db), self.store.cursor(),
                                             self._log)
        self.assembler = ConversationAssembler(self.store.cursor(), self.settings, self.log,
                                               self.stage.initial_status, self.stage.configs,
                                               writer_busy_s=self.store.stats.busy_now,
                                               slowed_requests=lambda: self.store.stats.requests_slowed,
                                               checks=self.stage.deterministic, on_checked=self.stage.checked,
                                               index=self.index)
        self.store.listeners.append(self.assembler.observe)
        self.store.on_listener_error = self._assembler_missed
        self.metrics.journaled_spans.set_function(lambda: self.store.stats.journaled_spans)
        self.metrics.requests_slowed.set_function(lambda: self.store.stats.requests_slowed)
        self.metrics.traces_waiting.set_function(self.assembler.pending_traces)
        self.metrics.conversations_waiting.set_function(self.assembler.pending_conversations)
        self.metrics.conversations_assembled.set_function(lambda: self.assembler.assembled)
        self.metrics.traces_left_out.set_function(lambda: self.assembler.left_out)
        self.metrics.read_spans.set_function(lambda: self.assembler.read_spans)
        self.metrics.read_seconds.set_function(lambda: self.assembler.read_seconds)
        spent = self.assembler.cpu_seconds
        for stage in CPU_STAGES:
            self.metrics.assembly_cpu.labels(stage).set_function(functools.partial(spent.__getitem__, stage))
        pool = self.assembler.pool
        self.metrics.assembly_workers.set_function(lambda: len(pool.worker_pids()))
        self.metrics.assembly_workers_lost.set_function(lambda: pool.restarts)
        index = self.index
        self.metrics.index_rebuilds.set_function(lambda: index.rebuilds)
        cache = self.assembler.cache
        self.metrics.trace_cache_bytes.set_function(lambda: cache.size)
        self.metrics.trace_cache_lookups.labels("hit").set_function(lambda: cache.hits)
        self.metrics.trace_cache_lookups.labels("miss").set_function(lambda: cache.misses)
        await asyncio.to_thread(self.assembler.recover)
        try:
            await asyncio.to_thread(self.stage.recover)
        except WritesRefused as exc:  # a full disk must not stop the collector from starting and taking spans
            self.stage.recover_pending = True
            self._log("warning", "the last run's leased jobs are released once the store takes writes", reason=str(exc))
        self.admin.stage = self.stage
        self.retention = Retention(self.store.cursor(), self.settings.retention, self._log, self.settings.store.db,
                                   self.settings.store.max_disk, self._on_storage,
                                   late_window_s=2 * self.settings.conversations.quiet_period_s,
                                   prune_dictionaries=lambda: self.store.run_in_writer(prune_unreferenced).result(),
                                   gate=self.store.gate, index=self.index, waiting=self.assembler.waiting_traces)
        self.store.refusal = lambda: self.retention.stats.disk_full if self.retention else None
        self.assembler.store_writable = self.stage.store_writable = lambda: self.store.write_refusal() is None
        self.assembler.fold_wal = self.store.fold_wal
        self.admin.ui.storage = self.retention.report
        await asyncio.to_thread(self.decoder.start)  # before gRPC starts its threads
        s, sc = self.settings.server, self.settings.scoring
        grpc_port = await self.grpc.start()
        http_port = await self.http.start()
        admin_port = await self.admin.start()
        scheme = "https" if s.tls_cert else "http"
        config_file = self.settings.config_file
        self.log.info("listening", otlp_grpc=f"{s.host}:{grpc_port}",
                      otlp_http=f"{scheme}://{s.host}:{http_port}/v1/traces",
                      admin=f"http://{s.admin_host}:{admin_port}", db=str(self.settings.store.db.resolve()),
                      config=str(config_file.resolve()) if config_file else None,
                      tls=bool(s.tls_cert), auth=bool(s.ingest_token), metrics=list(sc.metrics),
                      quiet_period_s=self.settings.conversations.quiet_period_s, **self.stage.judges(),
                      waiting_for_judge=self.stage.unavailable, resumed_jobs=self.stage.resumed,
                      decoder="c" if native_decode_enabled() else "python",
                      mapping="compiled" if running_compiled() else "python", decode_threads=self.decoder.threads,
                      decode_workers=self.decoder.workers)
        if not running_compiled():
            self.log.warning("conversations are built by the mapping as Python, at about 1.5x the CPU",
                             reason="pip install did not compile the mapping with mypyc, or a source changed since",
                             advice="reinstall where a C compiler and Python's headers are (Debian: apt install "
                                    "gcc python3-dev; then pip install --force-reinstall --no-deps tracejudge)")
        if not native_decode_built():
            self.log.warning("protobuf requests are decoded in Python, at about 0.6x the speed",
                             reason="the C extension collector/receivers/_otlp_columns.c was not built",
                             advice="reinstall where a C compiler and Python's headers are (Debian: apt install "
                                    "gcc python3-dev; then pip install --force-reinstall --no-deps tracejudge)")
        if self.stage.unavailable:
            self.log.warning("judged metrics wait for a judge", advice=JUDGE_ADVICE)
        self._pipeline = [asyncio.create_task(self.assembler.run(self._stop_pipeline)),
                          asyncio.create_task(self.stage.run(self._stop_pipeline)),
                          asyncio.create_task(self.admin.summaries.run(
                              self.store.cursor(), self._stop_pipeline,
                              max(self.settings.conversations.poll_s, REFRESH_EVERY_S), self._log)),
                          asyncio.create_task(self.retention.run(self._stop_pipeline))]
        export = self.settings.export
        if export.endpoint:
            self.score_export = ScoreEventExporter(self.store.cursor(), otlp_log_exporter(
                export.endpoint, export.protocol, export.headers, export.insecure, export.timeout_s), self._log)
            self._pipeline.append(asyncio.create_task(self.score_export.run(self._stop_pipeline,
                                                                            export.interval_s)))
        if self.settings.log.progress_s > 0:
            self._pipeline.append(asyncio.create_task(self._progress(self._stop_pipeline)))
        lake = self.settings.lake.lake_config()
        if lake is not None:
            self.publisher = LakePublisher(self.store.cursor(), lake, self._log)
            self._publishing = asyncio.create_task(publish_periodically(
                self.publisher, self.settings.lake.publish_interval_s, self._stop_publishing, self._log))

    async def _progress(self, stop: asyncio.Event) -> None:
        """Every `[log] progress_s`: what came in and what the pipeline is doing, in one line."""
        period = self.settings.log.progress_s
        last_spans, last_at = self.store.stats.spans_committed, time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)
            if stop.is_set() or self.stage is None or self.assembler is None:
                return
            now, spans = time.monotonic(), self.store.stats.spans_committed
            try:
                jobs = await self.stage.job_counts()
            except Exception as exc:  # a progress line must never stop the collector
                jobs = {"unknown": 0}
                self.log.debug("progress: jobs not counted", reason=str(exc))
            self.log.info("progress", spans_per_s=round((spans - last_spans) / max(now - last_at, 1e-9), 1),
                          spans_total=spans, queue_spans=self.store.queued_spans,
                          traces_waiting=self.assembler.pending_traces(), conversations=self.assembler.assembled,
                          jobs=jobs)
            last_spans, last_at = spans, now

    async def stop(self) -> None:
        grace = self.settings.server.shutdown_grace_s
        self.log.info("stopping", grace_s=grace)
        await asyncio.gather(self.grpc.stop(grace), self.http.stop())
        self._stop_pipeline.set()
        _, late = await asyncio.wait(self._pipeline, timeout=grace) if self._pipeline else (set(), set())
        for task in late:  # jobs still running stay leased and are picked up again at the next start
            task.cancel()
        if self._publishing is not None and self.publisher is not None:
            self._stop_publishing.set()  # one last publish of what the pipeline finished
            await asyncio.wait([self._publishing], timeout=grace)
            await asyncio.to_thread(self.publisher.close)
        if self.score_export is not None:
            await asyncio.to_thread(self.score_export.close)
        await asyncio.to_thread(self.store.close)
        if self.index is not None:
            await asyncio.to_thread(self.index.close)
        await asyncio.to_thread(self.decoder.stop)
        if self.assembler is not None:
            await asyncio.to_thread(self.assembler.pool.stop)
        await self.admin.stop()
        self.log.info("stopped", spans_committed=self.store.stats.spans_committed,
                      spans_duplicate=self.store.stats.duplicates)


async def serve(settings: Settings, logger: Logger) -> None:
    # Decoding allocates millions of short-lived dicts; the default gen-0 threshold (700) makes the cyclic
    # collector run thousands of times a second under load (measured: ingest 1.25x faster this way).
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    mark_pandas_absent()
    fewer_malloc_arenas()
    arrow_on_the_system_allocator()
    collector = Collector(settings, logger)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before start: a signal right after "listening" must drain
        loop.add_signal_handler(sig, collector.stop_requested.set)
    try:
        await collector.start()
    except duckdb.FatalException:  # while recovering the last run's work: nothing listens yet, so nothing to drain
        if collector.store.invalidated is None:
            raise
        await asyncio.to_thread(collector.store.close)
        raise collector.store.invalidated from None
    await collector.stop_requested.wait()
    await collector.stop()
    if collector.store.invalidated is not None:
        raise collector.store.invalidated
