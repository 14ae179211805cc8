"""Admin HTTP API on port 4319: the web UI (`/`), liveness, readiness, Prometheus metrics, read-only SQL
(`/api/query`), the HTML score report (`/report?since=7d`), re-queueing waiting and failed jobs
(`/api/score-pending`) and a stored conversation mapped again with where each part came from
(`/api/conversations/{id}/mapping`, for `tracejudge inspect CONVERSATION_ID`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TypeVar

import duckdb
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tracejudge.collector.admin_guard import AdminGuard
from tracejudge.collector.config import CanaryWatch, ReviewSettings
from tracejudge.collector.history.compare import CohortError, canary, compare, parse_cohort
from tracejudge.collector.history.conversation_mapping import (
    ConversationNotFound,
    ConversationTooLarge,
    explain_stored,
)
from tracejudge.collector.history.query import DEFAULT_LIMIT, QueryFailed, QueryRefused
from tracejudge.collector.history.query_sandbox import SandboxLimits, run_sandboxed
from tracejudge.collector.metrics import CollectorMetrics
from tracejudge.collector.pipeline.rejudge import RejudgeError
from tracejudge.collector.pipeline.scoring_stage import ScoringStage
from tracejudge.collector.pipeline.summary_tables import SummaryTables
from tracejudge.collector.receivers.http_guard import GuardedSite
from tracejudge.collector.receivers.ingest import bearer_matches
from tracejudge.collector.receivers.span_rows import spans_to_arrow
from tracejudge.collector.review.feedback import FEEDBACK_SHAPE, FeedbackIn
from tracejudge.collector.review.reviews import (
    REVIEW_SHAPE,
    AgreementCache,
    ReviewError,
    ReviewIn,
    record_review,
    reviewer_named,
)
from tracejudge.collector.sizes import SizeError, parse_size
from tracejudge.collector.store.connection.memory_release import release_duckdb_memory
from tracejudge.collector.store.span_store import SpanStore, StoreError
from tracejudge.collector.ui.compare_page import ComparePage
from tracejudge.collector.ui.export import ReportError, export_views
from tracejudge.collector.ui.rendering import STATIC_CSP
from tracejudge.collector.ui.review_pages import ReviewPages
from tracejudge.collector.ui.routes import WebUI
from tracejudge.mapping.otlp_logs import feedback_carrier

MAX_QUERIES = 4  # queries and reports in flight (they run one at a time); more get 429
CANARY_EVERY_S = 30.0  # the watched canary gates are recomputed at most this often, however often /metrics is read
JOB_STATES = ("pending", "running", "done", "failed", "budget", "waiting_for_judge")


T = TypeVar("T")


class AdminServer:
    def __init__(self, host: str, port: int, store: SpanStore, metrics: CollectorMetrics,
                 query_token: str | None, *, max_connections: int = 256, header_timeout_s: float = 10.0,
                 budget_usd: float | None = None, trace_url: str | None = None,
                 allowed_hosts: list[str] | None = None, query_limits: SandboxLimits | None = None,
                 mcp_tools: dict[str, list[str]] | None = None, max_spans: int = 100_000,
                 reviewers: dict[str, str] | None = None, review_rules: ReviewSettings | None = None,
                 saved_cohorts: dict[str, str] | None = None, watch: list[CanaryWatch] | None = None) -> None:
        self.host, self.requested_port = host, port
        self.store, self.metrics = store, metrics
        self.stage: ScoringStage | None = None
        self._query_token = query_token.encode() if query_token else None
        self._queries = ThreadPoolExecutor(2, thread_name_prefix="tracejudge-query")  # apart from the pipeline
        self._rejudging = asyncio.Lock()  # `tracejudge rejudge`: one paid re-score at a time
        # /api/query and /report run the user's SQL one at a time: what DuckDB builds while it runs one (a 500 MB
        # vector of strings) is outside memory_limit, and two such queries at once took the server past 1 GB
        self._user_sql = ThreadPoolExecutor(1, thread_name_prefix="tracejudge-user-sql")
        self._busy = 0
        # what one user's query may take, in its own process; its copies go next to the database
        self._query_limits = query_limits or SandboxLimits(folder=store.path.parent)
        self._mcp_tools, self._max_spans = mcp_tools, max_spans  # mapping a stored conversation again
        self._reviewers = {token.encode(): name for token, name in (reviewers or {}).items()}  # token -> name
        self.port: int | None = None
        self.guard = AdminGuard([host, *(allowed_hosts or [])])
        # a query is small; every route checks Host, and the routes that change state or run SQL check the origin
        self.app = web.Application(client_max_size=1024 * 1024, middlewares=[self.guard.middleware])
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_post("/api/query", self._query)
        self.app.router.add_get("/report", self._report)
        self.app.router.add_post("/api/score-pending", self._score_pending)
        self.app.router.add_post("/api/rejudge", self._rejudge)
        self.app.router.add_get("/api/conversations/{conversation_id}/mapping", self._mapping)
        self.app.router.add_post("/api/feedback", self._feedback)
        self.app.router.add_post("/api/reviews", self._review)
        self.app.router.add_get("/api/agreement", self._agreement)
        self.app.router.add_get("/api/compare", self._compare)
        self._saved_cohorts = saved_cohorts or {}
        self._watch = watch or []
        self._canaries_at = 0.0  # when the watched gates were last computed (at most every CANARY_EVERY_S)
        self.summaries = SummaryTables()
        self._budget_usd, self._trace_url = budget_usd, trace_url
        self.ui = WebUI(self._cursor, self._queries, query_token, self.summaries, budget_usd=budget_usd,
                        trace_url=trace_url, reviewers=self._reviewers)
        self.ui.register(self.app)
        self._agreement_cache = AgreementCache()  # the API and the Agreement page share it
        self.review_pages = ReviewPages(self.ui, review_rules or ReviewSettings(), self._agreement_cache)
        self.review_pages.register(self.app)
        ComparePage(self.ui, self._saved_cohorts).register(self.app)
        self._site: GuardedSite | None = None
        self._limits = (max_connections, header_timeout_s)

    async def start(self) -> int:
        self._site = GuardedSite(self.app, self.host, self.requested_port, max_connections=self._limits[0],
                                 header_timeout_s=self._limits[1])
        self.port = await self._site.start()
        return self.port

    async def stop(self) -> None:
        if self._site is not None:
            await self._site.stop()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        """Readiness for probes; the store's error text only with the query token (or when none is set)."""
        problems = []
        if not self.store.healthy:
            detail = (f": {self.store.stats.last_error}"
                      if bearer_matches(request.headers.get("Authorization"), self._query_token) else
                      " (send the query token for the database's error, or read the collector's log)")
            problems.append(f"the span store cannot write{detail}")
        refused = self.store.refusal()
        if refused is not None:
            problems.append(refused)
        if self.store.saturated:
            problems.append(f"{self.store.queued_spans} spans wait for a commit (limit {self.store.max_queue_spans})")
        body = {"ready": not problems, "problems": problems, "queued_spans": self.store.queued_spans,
                # spans are still taken, so this alone is no problem: assembly, scoring and retention wait for it
                "pipeline_waits": self.store.write_refusal() if self.store.healthy else None}
        return web.Response(status=503 if problems else 200, text=json.dumps(body), content_type="application/json")

    async def _metrics(self, _: web.Request) -> web.Response:
        memory, [(limit,)] = await asyncio.to_thread(lambda: (
            self._cursor().execute("SELECT tag, memory_usage_bytes, temporary_storage_bytes FROM duckdb_memory()"
                                   ).fetchall(),
            self._cursor().execute("SELECT current_setting('memory_limit')").fetchall()))
        self.metrics.on_duckdb_memory(memory, _size_or_none(limit))
        if self.stage is not None:
            rows = await asyncio.to_thread(lambda: self._cursor().execute(
                "SELECT status, count(*) FROM eval_jobs GROUP BY status").fetchall())
            for status in JOB_STATES:
                self.metrics.jobs.labels(status).set(dict(rows).get(status, 0))
            [(spent,)] = await asyncio.to_thread(lambda: self._cursor().execute(
                "SELECT coalesce(sum(evaluation_cost), 0) FROM scores WHERE scored_at >= "
                "CAST(timezone('UTC', now()) AS DATE)").fetchall())
            self.metrics.cost_today.set(spent)
            [(oldest,)] = await asyncio.to_thread(lambda: self._cursor().execute(
                "SELECT coalesce(epoch(now()) - epoch(min(created_at)), 0) FROM eval_jobs "
                "WHERE status IN ('pending', 'waiting_for_judge', 'budget')").fetchall())
            self.metrics.oldest_waiting.set(oldest)
        if self._watch and time.monotonic() - self._canaries_at > CANARY_EVERY_S:
            self._canaries_at = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(self._queries, self._watch_canaries)
        agreement = await asyncio.to_thread(lambda: self._cursor().execute(
            "SELECT metric, metric_config, coalesce(judge_model, ''), kappa, accuracy, reviews FROM judge_agreement"
        ).fetchall())
        for metric, config, model, kappa, accuracy, reviews in agreement:
            if kappa is not None:
                self.metrics.agreement_kappa.labels(metric, config, model).set(kappa)
            self.metrics.agreement_accuracy.labels(metric, config, model).set(accuracy)
            self.metrics.agreement_reviews.labels(metric, config, model).set(reviews)
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        return self.store.cursor()

    def _watch_canaries(self) -> None:
        """The gate of each watched cohort pair, as Prometheus gauges (a pair that cannot be read is skipped)."""
        states = {"fail": 1, "pass": 0, "undecided": -1}
        for w in self._watch:
            labels = (w.baseline, w.candidate, w.metric)
            try:
                result = canary(self._cursor(), parse_cohort(w.baseline, self._saved_cohorts),
                                parse_cohort(w.candidate, self._saved_cohorts), w.metric, w.margin, 1 - w.confidence)
            except (CohortError, duckdb.Error):
                self.metrics.canary.labels(*labels).set(states["undecided"])  # never a stale regression
                continue
            self.metrics.canary.labels(*labels).set(states[result["outcome"]])
            if result["difference"] is not None:
                self.metrics.canary_difference.labels(*labels).set(result["difference"])

    async def _query(self, request: web.Request) -> web.Response:
        if not bearer_matches(request.headers.get("Authorization"), self._query_token):
            return _error(401, "missing or wrong bearer token (TRACEJUDGE_QUERY_TOKEN)")
        if self._busy >= MAX_QUERIES:
            return _error(429, "too many queries and reports are running; retry shortly")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, 'send JSON: {"sql": "SELECT ...", "limit": 1000}')
        sql, limit = (body.get("sql"), body.get("limit", DEFAULT_LIMIT)) if isinstance(body, dict) else (None, None)
        if not isinstance(sql, str) or not isinstance(limit, int) or not 1 <= limit <= DEFAULT_LIMIT:
            return _error(400, f'send {{"sql": "SELECT ...", "limit": 1..{DEFAULT_LIMIT}}}')
        self._busy += 1
        try:
            answer = await asyncio.get_running_loop().run_in_executor(
                self._user_sql, run_sandboxed, self._cursor(), sql, limit, self._query_limits)
        except QueryRefused as exc:
            return _error(403, str(exc))
        except QueryFailed as exc:
            return _error(400, str(exc))
        finally:
            self._busy -= 1
        return web.Response(body=answer, content_type="application/json")


    async def _report(self, request: web.Request) -> web.Response:
        """The HTML score report; it shows conversation text, so it needs the query token like /api/query."""
        if not bearer_matches(request.headers.get("Authorization"), self._query_token):
            return _error(401, "missing or wrong bearer token (TRACEJUDGE_QUERY_TOKEN)")
        since = request.query.get("since", "7d")
        try:
            page = await self._one_at_a_time(lambda: export_views(
                self._cursor(), since, f"the collector at port {self.port}", summaries=self.summaries,
                budget_usd=self._budget_usd, trace_url=self._trace_url))
        except _Busy:
            return _error(429, "too many queries and reports are running; retry shortly")
        except ReportError as exc:
            return _error(400, str(exc))
        return web.Response(text=page, content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": STATIC_CSP})

    async def _one_at_a_time(self, work: Callable[[], T]) -> T:
        """Run a report's or a mapping's work on the user-SQL thread (one at a time, at most MAX_QUERIES waiting;
        else _Busy), then hand what it freed back to the system."""
        if self._busy >= MAX_QUERIES:
            raise _Busy
        self._busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._user_sql, _then_release, work)
        finally:
            self._busy -= 1


    async def _mapping(self, request: web.Request) -> web.Response:
        """A stored conversation mapped again from its spans, with where each part came from (`tracejudge inspect
        CONVERSATION_ID --explain`); it shows conversation text, so it needs the query token."""
        if not bearer_matches(request.headers.get("Authorization"), self._query_token):
            return _error(401, "missing or wrong bearer token (TRACEJUDGE_QUERY_TOKEN)")
        try:
            document = await self._one_at_a_time(lambda: explain_stored(
                self._cursor(), request.match_info["conversation_id"], mcp_tools=self._mcp_tools,
                max_spans=self._max_spans))
        except _Busy:
            return _error(429, "too many queries and reports are running; retry shortly")
        except ConversationNotFound as exc:
            return _error(404, str(exc))
        except ConversationTooLarge as exc:
            return _error(413, str(exc))
        return web.Response(text=json.dumps(document, ensure_ascii=False), content_type="application/json")

    async def _feedback(self, request: web.Request) -> web.Response:
        """Feedback on a conversation from an application (an end user's thumbs, a comment): stored through the span
        store like the OTLP form (`gen_ai.evaluation.result`), so it is durable and waits for its conversation."""
        if not bearer_matches(request.headers.get("Authorization"), self._query_token):
            return _error(401, "missing or wrong bearer token (TRACEJUDGE_QUERY_TOKEN)")
        try:
            body = FeedbackIn.model_validate(await request.json())
        except ValueError as exc:
            return _error(400, f"send JSON {FEEDBACK_SHAPE}: {str(exc)[:300]}")
        carrier = feedback_carrier(body.conversation_id, time.time_ns(), body.attributes())
        try:
            await self.store.write(spans_to_arrow([carrier], datetime.now(UTC)))
        except StoreError as exc:  # backpressure included
            return _error(503, f"not stored: {exc}; retry shortly")
        return web.Response(status=201, text=json.dumps({"stored": True, "trace_id": carrier.trace_id}),
                            content_type="application/json")

    def _reviewer(self, request: web.Request) -> str | None:
        """The name of the reviewer whose token the request carries (compared in constant time), if any."""
        header = request.headers.get("Authorization")
        return reviewer_named(header, self._reviewers)

    async def _review(self, request: web.Request) -> web.Response:
        """A reviewer's verdict on a score: only a named reviewer token records one (the name goes with it)."""
        reviewer = self._reviewer(request)
        if reviewer is None:
            return _error(401, "a review needs a reviewer's own token (TRACEJUDGE_REVIEWER_TOKENS=name:token,...)")
        try:
            review = ReviewIn.model_validate(await request.json())
        except ValueError as exc:
            return _error(400, f"send JSON {REVIEW_SHAPE}: {str(exc)[:300]}")
        await self.review_pages.refreshed()  # the queue has taken what was scored since: the review's weight
        try:
            stored = await asyncio.get_running_loop().run_in_executor(
                self._queries, lambda: record_review(self._cursor(), review, reviewer))
        except ReviewError as exc:
            return _error(409 if "no pass/fail" in str(exc) else 404, str(exc))
        return web.Response(status=201, text=json.dumps({**stored, "reviewer": reviewer}),
                            content_type="application/json")

    async def _agreement(self, request: web.Request) -> web.Response:
        """Agreement between judge and reviewers, with intervals (for reviewers and query-token holders)."""
        header = request.headers.get("Authorization")
        if not bearer_matches(header, self._query_token) and self._reviewer(request) is None:
            return _error(401, "missing or wrong bearer token (TRACEJUDGE_QUERY_TOKEN or a reviewer's)")
        report = await asyncio.get_running_loop().run_in_executor(
            self._queries, lambda: self._agreement_cache.report(self._cursor()))
        return web.Response(text=json.dumps({"agreement": report}), content_type="application/json")

    async def _compare(self, request: web.Request) -> web.Response:
        """Two cohorts compared, or the canary gate with `gate=METRIC&margin=M` (`tracejudge compare`)."""
        if not bearer_matches(request.headers.get("Authorization"), self._query_token):
            return _error(401, "missing or wrong bearer token (TRACEJUDGE_QUERY_TOKEN)")
        q = request.query
        try:
            a, b = parse_cohort(q.get("a", ""), self._saved_cohorts), parse_cohort(q.get("b", ""), self._saved_cohorts)
            gate = q.get("gate")
            margin, confidence = float(q.get("margin", "0")), float(q.get("confidence", "0.95"))
            if gate is not None and not (0 < margin < 1 and 0.5 <= confidence < 1):
                raise CohortError("the gate takes a margin between 0 and 1 and a confidence in [0.5, 1)")
        except ValueError as exc:  # CohortError too
            return _error(400, str(exc))
        try:
            result = await self._one_at_a_time(
                lambda: canary(self._cursor(), a, b, gate, margin, 1 - confidence) if gate is not None
                else compare(self._cursor(), a, b))
        except _Busy:
            return _error(429, "too many queries and reports are running; retry shortly")
        except CohortError as exc:
            return _error(400, str(exc))
        except duckdb.Error as exc:
            return _error(400, f"cannot compare: {exc}")
        return web.Response(text=json.dumps(result, default=str), content_type="application/json")

    async def _score_pending(self, request: web.Request) -> web.Response:
        """`tracejudge score --pending` against a running collector: its own scoring stage takes the jobs."""
        if not bearer_matches(request.headers.get("Authorization"), self._query_token):
            return _error(401, "missing or wrong bearer token (TRACEJUDGE_QUERY_TOKEN)")
        if self.stage is None:
            return _error(503, "the scoring stage is not running yet; retry shortly")
        job_ids = await self.stage.requeue()
        body = {"requeued": len(job_ids), "job_ids": job_ids, "waiting_for_judge": self.stage.unavailable}
        return web.Response(text=json.dumps(body), content_type="application/json")


    async def _rejudge(self, request: web.Request) -> web.Response:
        """`tracejudge rejudge` against a running collector: its own judge scores the stored conversation again."""
        if not bearer_matches(request.headers.get("Authorization"), self._query_token):
            return _error(401, "missing or wrong bearer token (TRACEJUDGE_QUERY_TOKEN)")
        if self.stage is None:
            return _error(503, "the scoring stage is not running yet; retry shortly")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, 'send JSON: {"conversation_id": "...", "metric": "...", "version": null}')
        if not isinstance(body, dict) or not isinstance(body.get("conversation_id"), str) \
                or not isinstance(body.get("metric"), str) \
                or not isinstance(body.get("version"), int | None) or isinstance(body.get("version"), bool):
            return _error(400, 'send JSON: {"conversation_id": "...", "metric": "...", "version": null}')
        if self._rejudging.locked():
            return _error(429, "a rejudge is running (one at a time: each is a paid judge call); retry shortly")
        async with self._rejudging:
            try:
                answer = await self.stage.rejudge(body["conversation_id"], body["metric"], body.get("version"))
            except RejudgeError as exc:
                return _error(404, str(exc))
        return web.Response(text=json.dumps(answer, default=str), content_type="application/json")


class _Busy(Exception):
    """MAX_QUERIES queries, reports and mappings are already running or waiting."""


def _then_release(work: Callable[[], T]) -> T:
    """Run a query's work, then hand what it freed back to the system: the next query must not stack on it."""
    try:
        return work()
    finally:
        release_duckdb_memory()


def _size_or_none(text: str) -> int | None:
    """DuckDB's own rendering of a size ("91.5 MiB") in bytes; None if it is not one."""
    try:
        return parse_size(text)
    except SizeError:
        return None


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=json.dumps({"error": message}), content_type="application/json")
