"""The asynchronous scoring stage: lease durable jobs from `eval_jobs`, run the metric, write the score.

A job is leased (`running` until `lease_until`), measured, and its score written together with the job's
completion in one transaction, so a score row exists exactly once per (conversation, version, metric,
metric config). A crashed worker's lease expires and the job runs again; a failing job is retried with
exponential backoff and after `max_attempts` is `failed` with its error. Judge metrics that cannot get a
judge wait as `waiting_for_judge`; over the daily budget they wait as `budget` until the next UTC day.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa

from tracejudge.calibration import CalibrationExample, calibration_digest
from tracejudge.call_validity import MCPCallValidityMetric
from tracejudge.collector.pipeline.assembly.conversation_builder import (
    Check,
    CheckedScore,
    measure_recorded,
    not_applicable,
)
from tracejudge.collector.pipeline.batch_ledger import DuckDBBatchLedger
from tracejudge.collector.pipeline.rejudge import RejudgeError, rejudge, stored_case, stored_score
from tracejudge.collector.review.calibration import calibration_examples
from tracejudge.collector.store.connection.id_table import id_table, registered
from tracejudge.errors import (
    EvalModeError,
    InvalidTestCaseError,
    JudgeConfigurationError,
    JudgeUnavailableError,
    NoTaskError,
    TextOnlyJudgeError,
)
from tracejudge.eval_mode import EvalMode, resolve_eval_mode
from tracejudge.interactions import conversation_data
from tracejudge.json_encoding import json_bytes
from tracejudge.judged_metric import JudgedMetric, task_scores
from tracejudge.judges.exchanges import JudgeExchange, recording
from tracejudge.judges.llm import LLMJudge, load_client_library
from tracejudge.judges.resolve import JudgeOptions
from tracejudge.judges.secret_mask import mask_url
from tracejudge.mapping.redaction import Redactor
from tracejudge.mcp_use import MultiTurnMCPUseMetric
from tracejudge.metric import BaseMetric
from tracejudge.outage import JudgeOutage
from tracejudge.task_completion import MCPTaskCompletionMetric
from tracejudge.test_case import load_test_case

JUDGED = {"mcp_use": MultiTurnMCPUseMetric, "mcp_task_completion": MCPTaskCompletionMetric}
OUTAGE_GIVE_UP_STREAK = 4  # `score --pending` stops waiting for a judge after this many failures in a row
BATCH_CONCURRENCY = 2_000  # jobs measured at once in batch mode
DETERMINISTIC_BATCH = 256  # deterministic jobs leased, measured and committed together
BATCH_CASE_BYTES = 16 * 1024 * 1024  # test-case JSON of a batch loaded at once (a batch is read in parts past it)
ORPHAN_SWEEP_S = 30.0  # how often jobs of pruned conversation versions are dropped
OWN_FAILURE_STRIKES = 3  # unavailable this often while the judge answered others: the job's own failure
Log = Callable[..., None]


@dataclass(frozen=True)
class StageConfig:
    metrics: tuple[str, ...] = ("mcp_use", "mcp_task_completion", "mcp_call_validity")
    eval_mode: str | None = None
    model: str | None = None
    system_one_model: str | None = None
    threshold: float | None = 0.5
    strict_mode: bool = False
    aggregation: str = "mean"  # or "any_task": the judged metrics score the worst task
    concurrency: int = 4
    daily_budget_usd: float | None = None
    max_attempts: int = 5
    lease_s: float = 300.0
    retry_backoff_s: float = 30.0
    outage_backoff_s: float = 5.0
    outage_max_backoff_s: float = 300.0
    poll_s: float = 0.5
    judge: JudgeOptions = JudgeOptions()
    calibration: str = "off"  # "reviews": reviewers' corrections as examples in the judged metrics' prompts
    calibration_examples: int = 4


@dataclass(frozen=True)
class ScoredEvent:
    """One score as written, for observers (the collector's Prometheus metrics)."""

    metric: str
    service: str | None
    agent: str | None
    score: float | None
    result: str  # pass | fail | scored | n/a
    cost_usd: float | None
    input_tokens: int
    output_tokens: int
    weight: float = 1.0  # 1 / the probability the conversation had of being scored on this metric
    service_version: str | None = None  # its service.version attribute, if recorded
    tasks_passed: int = 0  # a judged score's tasks at or above the threshold
    tasks_failed: int = 0


def metric_config(config: StageConfig, metric: str, examples: Sequence[CalibrationExample] = ()) -> str:
    """A short hash of every setting that changes a metric's score: part of the unique score key. Calibration
    examples are part of it, so scores judged with other examples never blend with these."""
    relevant: dict[str, Any] = {"metric": metric, "threshold": config.threshold, "strict_mode": config.strict_mode}
    if examples:
        relevant["calibration"] = calibration_digest(examples)
    if metric in JUDGED:
        relevant.update(eval_mode=config.eval_mode, model=config.model, system_one_model=config.system_one_model)
        if config.aggregation != StageConfig.aggregation:
            relevant["aggregation"] = config.aggregation
        judge = config.judge  # only what changes a score, and only when set, so default hashes stay as they were
        if judge.temperature != JudgeOptions.temperature:
            relevant["temperature"] = judge.temperature
        if judge.context_tokens is not None:
            relevant["context_tokens"] = judge.context_tokens
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


_UTC_US = pa.timestamp("us", tz="UTC")
SCORE_SCHEMA = pa.schema([  # the `scores` table's columns, in order: a score row, and a batch's Arrow append
    ("conversation_id", pa.string()), ("conversation_version", pa.int32()), ("metric", pa.string()),
    ("metric_config", pa.string()), ("eval_mode", pa.string()), ("score", pa.float64()), ("success", pa.bool_()),
    ("threshold", pa.float64()), ("strict_mode", pa.bool_()), ("reason", pa.string()), ("confidence", pa.float64()),
    ("judge_model", pa.string()), ("system_one_model", pa.string()), ("evaluation_cost", pa.float64()),
    ("input_tokens", pa.int64()), ("output_tokens", pa.int64()), ("judge_calls", pa.int32()),
    ("latency_ms", pa.float64()), ("breakdown", pa.string()), ("fallback_reason", pa.string()), ("error", pa.string()),
    ("service_name", pa.string()), ("agent_name", pa.string()), ("conversation_end_time", _UTC_US),
    ("scored_at", _UTC_US), ("inclusion_probability", pa.float64())])
SCORE_COLUMNS = tuple(SCORE_SCHEMA.names)
JUDGE_CALLS_SCHEMA = pa.schema([  # the `judge_calls` table's columns, in order
    ("conversation_id", pa.string()), ("conversation_version", pa.int32()), ("metric", pa.string()),
    ("metric_config", pa.string()), ("seq", pa.int32()), ("judge", pa.string()), ("request", pa.string()),
    ("response", pa.string()), ("error", pa.string()), ("input_tokens", pa.int64()), ("output_tokens", pa.int64()),
    ("latency_ms", pa.float64()), ("called_at", _UTC_US)])


def checked_score_row(conversation_id: str, version: int, metric_id: str, config: str, check: Check,
                      service: str | None, agent: str | None, last_ns: int | None,
                      probability: float | None) -> dict[str, Any]:
    """The `scores` row of a deterministic check run as its conversation was built (no judge: no cost, tokens or
    model)."""
    return {"conversation_id": conversation_id, "conversation_version": version, "metric": metric_id,
            "metric_config": config, "score": check.score, "success": check.success, "threshold": check.threshold,
            "strict_mode": check.strict_mode, "reason": check.reason, "evaluation_cost": 0.0, "input_tokens": 0,
            "output_tokens": 0, "judge_calls": 0, "latency_ms": check.latency_ms, "breakdown": check.breakdown,
            "error": check.error, "service_name": service, "agent_name": agent, "conversation_end_time":
            datetime.fromtimestamp(last_ns / 1e9, UTC) if last_ns else None, "scored_at": datetime.now(UTC),
            "inclusion_probability": probability}


def content_digest(test_case_json: str) -> str | None:
    """What a judge sees of a conversation (turns, MCP calls and results, the servers), hashed; span ids, names
    and metadata are not part of it. None for a test case that does not load."""
    try:
        case = load_test_case(test_case_json)
    except InvalidTestCaseError:
        return None
    seen = conversation_data(case, include_inventory=True)
    return hashlib.sha256(json.dumps(seen, sort_keys=True, default=str, separators=(",", ":")).encode()).hexdigest()


def _probability(inclusion: str | None, metric: str) -> float | None:
    """The probability the conversation had of being scored on this metric, as the assembler recorded it (None for
    versions assembled before it was recorded: they count with weight 1)."""
    value = json.loads(inclusion).get(metric) if inclusion else None
    return float(value) if isinstance(value, int | float) else None


def _service_version(attributes: str | None) -> str | None:
    """The conversation's service.version attribute (the first, when its spans hold several)."""
    values = json.loads(attributes).get("service.version") if attributes else None
    return str(values[0]) if isinstance(values, list) and values else None


def _versions(jobs: list[tuple[Any, ...]]) -> pa.Table:
    """The (conversation, version) of each leased job, as a table DuckDB can join."""
    return pa.table({"conversation_id": [j[1] for j in jobs], "version": pa.array([j[2] for j in jobs], pa.int32())})


def _task_counts(breakdown: dict[str, Any] | None, threshold: float | None) -> tuple[int, int]:
    """A judged score's tasks (passed, failed) at its threshold; (0, 0) without tasks or a threshold."""
    if threshold is None:
        return 0, 0
    scores = task_scores(breakdown)
    failed = sum(score < threshold for score in scores)
    return len(scores) - failed, failed


def _next_utc_midnight(now: datetime) -> datetime:
    return datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)


class ScoringStage:
    def __init__(self, con: duckdb.DuckDBPyConnection, config: StageConfig, log: Log,
                 on_measured: Callable[[str, float, str | None], None] | None = None,
                 on_scored: Callable[[ScoredEvent], None] | None = None, redactor: Redactor | None = None) -> None:
        """`redactor`: applied to the judge exchanges kept with each score (`judge_calls`), as to spans."""
        self.con = con
        self.redactor = redactor
        self.config = config
        self.log = log
        self.on_measured = on_measured  # (metric, seconds, error kind or None) after every measure
        self.on_scored = on_scored  # every score written, for the Prometheus score metrics
        self.store_writable: Callable[[], bool] = lambda: True  # False while the store takes no pipeline write
        self.recover_pending = False  # `recover` was refused at start (a full disk): run it once writes go again
        self.metrics: dict[str, BaseMetric] = {}
        self._llm_judge: LLMJudge | None = None
        self.unavailable: dict[str, str] = {}  # metric -> why no judge could be built
        self.calibration = self._calibration()
        for metric in config.metrics:
            try:
                self.metrics[metric] = self._build(metric)
            except (JudgeConfigurationError, EvalModeError) as exc:
                self.unavailable[metric] = str(exc)
        self.configs = {m: metric_config(config, m, self.calibration.get(m, ())) for m in config.metrics}
        self.outages = {m: JudgeOutage(config.outage_backoff_s, config.outage_max_backoff_s) for m in JUDGED}
        self._db = asyncio.Lock()
        self._running: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()  # a running job (or deterministic batch) ended: room to lease into
        # metrics that need no judge: leased in batches, apart from the judged jobs' `concurrency`
        self.deterministic = tuple(m for m, t in self.metrics.items() if not isinstance(t, JudgedMetric))
        self._batch: asyncio.Task[None] | None = None
        self._active: set[int] = set()  # job ids this process is measuring: their leases never expire here
        # job id -> (its metric's success count when an outage first gave its attempt back, failures since)
        self._given_back: dict[int, tuple[int, int]] = {}
        self._own_failures: set[int] = set()  # jobs unavailable while their metric's judge answered others
        self.processed = 0
        self.resumed = 0  # jobs recover() took out of waiting_for_judge
        self._swept_at: datetime | None = None  # when jobs of pruned versions were last dropped

    def _calibration(self) -> dict[str, tuple[CalibrationExample, ...]]:
        """Per judged metric, the reviewers' corrections it is calibrated with (chosen once, at start)."""
        if self.config.calibration != "reviews":
            return {}
        chosen = {}
        for metric in self.config.metrics:
            if metric in JUDGED:
                examples = tuple(calibration_examples(self.con, metric, self.config.calibration_examples))
                self.log("info", "calibration", metric=metric, examples=len(examples),
                         advice=None if examples else "no reviewer has disagreed with this metric yet: it runs "
                         "uncalibrated until a restart after the first disagreement")
                if examples:
                    chosen[metric] = examples
        return chosen

    def _build(self, metric: str) -> BaseMetric:
        c = self.config
        if metric == "mcp_call_validity":
            return MCPCallValidityMetric(threshold=c.threshold, strict_mode=c.strict_mode)
        model: str | LLMJudge | None = c.model
        if resolve_eval_mode(c.eval_mode) is not EvalMode.SYSTEM_ONE:  # system_one never needs an LLM key
            if self._llm_judge is None:  # one judge for every metric: `judge_concurrency` is the server's load
                self._llm_judge = c.judge.llm_judge(c.model, DuckDBBatchLedger(self._sql))
            model = self._llm_judge
        mean = "mean_of_minima" if metric == "mcp_use" else "mean"
        return JUDGED[metric](threshold=c.threshold, strict_mode=c.strict_mode, model=model,
                              system_one_model=c.system_one_model, eval_mode=c.eval_mode,
                              calibration_examples=self.calibration.get(metric, ()),
                              aggregation=mean if c.aggregation == "mean" else c.aggregation)

    def initial_status(self, metric: str) -> str:
        return "waiting_for_judge" if metric in self.unavailable else "pending"

    async def _sql(self, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        async with self._db:
            return await asyncio.to_thread(lambda: self.con.execute(query, params or []).fetchall())

    def recover(self) -> int:
        """At start: this process is the only worker of its file, so every `running` job is orphaned; one
        whose worker died `max_attempts` times (a conversation that kills the process) is failed."""
        self.con.execute("UPDATE eval_jobs SET status = 'failed', lease_until = NULL, updated_at = now(), "
                         "last_error = 'the worker stopped while scoring this job ' || attempts || ' times' "
                         "WHERE status = 'running' AND attempts >= ?", [self.config.max_attempts])
        rows = self.con.execute("UPDATE eval_jobs SET status = 'pending', lease_until = NULL, updated_at = now() "
                                "WHERE status = 'running' RETURNING job_id").fetchall()
        self.resumed = self._match_judges()
        return len(rows)

    def _match_judges(self) -> int:
        """Jobs that waited for a judge run now that their metric has one (and wait when it lost it)."""
        available = [m for m in self.config.metrics if m not in self.unavailable]
        resumed = self.con.execute(
            "UPDATE eval_jobs SET status = 'pending', not_before = NULL, updated_at = now() "
            "WHERE status = 'waiting_for_judge' AND metric IN (SELECT unnest(?)) RETURNING job_id",
            [available]).fetchall()
        self.con.execute("UPDATE eval_jobs SET status = 'waiting_for_judge', updated_at = now() "
                         "WHERE status = 'pending' AND metric IN (SELECT unnest(?))", [list(self.unavailable)])
        return len(resumed)

    async def requeue(self, include_failed: bool = True) -> list[int]:
        """Waiting (judge, budget) and failed jobs back to pending with fresh attempts; their ids."""
        statuses = ["waiting_for_judge", "budget"] + (["failed"] if include_failed else [])
        metrics = [m for m in self.config.metrics if m not in self.unavailable]
        rows = await self._sql("UPDATE eval_jobs SET status = 'pending', attempts = 0, not_before = NULL, "
                               "updated_at = now() WHERE status IN (SELECT unnest(?)) "
                               "AND metric IN (SELECT unnest(?)) RETURNING job_id", [statuses, metrics])
        return [job_id for (job_id,) in rows]

    async def run(self, stop: asyncio.Event) -> None:
        if self._llm_judge is not None:
            await asyncio.to_thread(load_client_library)
        while not stop.is_set():
            self._slot_freed.clear()
            try:
                if self.store_writable():  # else a lease would be refused: wait, quietly (readyz says why)
                    if self.recover_pending:
                        async with self._db:  # the stage's cursor, shared with the admin API's requeue
                            await asyncio.to_thread(self.recover)
                        self.recover_pending = False
                    await self.step()
            except Exception as exc:  # the stage keeps going; the job stays leased and is retried
                self.log("error", "scoring step failed", reason=f"{type(exc).__name__}: {exc}")
            # while work runs, lease again as soon as some ends: waiting out the poll after every lease held the
            # stage to `concurrency` jobs per poll (8 a second), far behind the conversations assembled
            waits = [asyncio.ensure_future(stop.wait())] + (
                [asyncio.ensure_future(self._slot_freed.wait())] if self._in_flight() else [])
            await asyncio.wait(waits, timeout=self.config.poll_s, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
        if running := self._in_flight():
            await asyncio.gather(*running, return_exceptions=True)

    def _in_flight(self) -> list[asyncio.Task[None]]:
        """The judged jobs and the deterministic batch still running."""
        batch = [self._batch] if self._batch is not None and not self._batch.done() else []
        return [*self._running, *batch]

    async def step(self) -> int:
        """Expire leases, apply the budget, lease what free slots allow and start those jobs; how many."""
        now = datetime.now(UTC)
        async with self._db:
            await asyncio.to_thread(self._expire_leases, now, list(self._active))
        if self._swept_at is None or (now - self._swept_at).total_seconds() >= ORPHAN_SWEEP_S:
            self._swept_at = now
            async with self._db:
                await asyncio.to_thread(self._drop_orphans)
        batch = 0
        if self.deterministic and (self._batch is None or self._batch.done()):
            batch = await self._lease_deterministic(now)
        judged_allowed = await self._within_budget(now)
        # a batch answers within hours: lease enough jobs to fill one, since each waits without using the judge
        limit = BATCH_CONCURRENCY if self.config.judge.batch else self.config.concurrency
        if self.config.judge.batch and self.config.daily_budget_usd is not None:
            limit = min(limit, await self._batch_budget_slots(now))
        free = limit - len(self._running)
        if free <= 0:
            return batch
        paused = [m for m, outage in self.outages.items() if outage.blocks(now)]
        if not judged_allowed:
            paused = list(JUDGED)
        paused += self.deterministic  # leased in batches above
        only = f"AND metric NOT IN ({', '.join('?' * len(paused))})" if paused else ""
        leased = await self._sql(
            "UPDATE eval_jobs SET status = 'running', attempts = attempts + 1, lease_until = ?, updated_at = ? "
            "WHERE job_id IN (SELECT job_id FROM eval_jobs WHERE status = 'pending' AND "
            f"(not_before IS NULL OR not_before <= ?) {only} "
            "ORDER BY job_id LIMIT ?) "
            "RETURNING job_id, conversation_id, conversation_version, metric, metric_config, attempts",
            [now + timedelta(seconds=self.config.lease_s), now, now, *paused, free])
        for job in leased:
            self._active.add(job[0])
            task = asyncio.create_task(self._run_job(*job))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            task.add_done_callback(lambda _: self._slot_freed.set())
            task.add_done_callback(lambda _, job_id=job[0]: self._active.discard(job_id))
        return batch + len(leased)

    def _drop_orphans(self) -> None:
        """Jobs waiting for a conversation version retention has pruned: nothing is left to score. Dropped here,
        where the jobs are leased (retention deleting the oldest pending jobs conflicted with these very leases),
        so a judge slower than the traffic does not leave them to grow without end."""
        [(dropped,)] = self.con.execute(
            "DELETE FROM eval_jobs j WHERE status IN ('pending', 'waiting_for_judge', 'budget') AND NOT EXISTS "
            "(SELECT 1 FROM conversations c WHERE c.conversation_id = j.conversation_id "
            "AND c.version = j.conversation_version)").fetchall()
        if dropped:
            self.log("info", "jobs dropped: their conversation versions were pruned before they were scored",
                     jobs=dropped, advice="a longer [retention] conversations, or a faster judge ([scoring] "
                     "concurrency, sampling rate), scores them in time")

    def _expire_leases(self, now: datetime, active: list[int]) -> None:
        """Expired leases back to pending (failed past `max_attempts`), except the jobs this process measures, and
        budget-parked jobs whose day is over; the ids go to DuckDB as Arrow (a batch alone is 256)."""
        with id_table(self.con, active, pa.int64()) as name:
            self.con.execute(
                "UPDATE eval_jobs SET status = CASE WHEN status = 'running' AND attempts >= ? THEN 'failed' "
                "ELSE 'pending' END, lease_until = NULL, updated_at = ? "
                f"WHERE (status = 'running' AND lease_until < ? AND job_id NOT IN (SELECT id FROM {name})) "
                "OR (status = 'budget' AND not_before <= ?)", [self.config.max_attempts, now, now, now]).fetchall()

    async def _lease_deterministic(self, now: datetime) -> int:
        """Lease up to DETERMINISTIC_BATCH jobs of the metrics that need no judge and measure them as one batch."""
        marks = ", ".join("?" * len(self.deterministic))
        jobs = await self._sql(
            "UPDATE eval_jobs SET status = 'running', attempts = attempts + 1, lease_until = ?, updated_at = ? "
            "WHERE job_id IN (SELECT job_id FROM eval_jobs WHERE status = 'pending' AND "
            f"(not_before IS NULL OR not_before <= ?) AND metric IN ({marks}) ORDER BY job_id LIMIT ?) "
            "RETURNING job_id, conversation_id, conversation_version, metric, attempts",
            [now + timedelta(seconds=self.config.lease_s), now, now, *self.deterministic, DETERMINISTIC_BATCH])
        if jobs:
            self._active.update(job[0] for job in jobs)  # measured here: their leases never expire meanwhile
            self._batch = asyncio.create_task(self._run_deterministic(jobs))
            self._batch.add_done_callback(lambda _: self._slot_freed.set())
        return len(jobs)

    async def _run_deterministic(self, jobs: list[tuple[Any, ...]]) -> None:
        """Measure a batch of deterministic jobs in a worker thread and commit their scores in one transaction:
        each takes a fraction of a millisecond, less than a transaction of its own costs. When the batch fails,
        its jobs that are still leased go back to pending (or fail past `max_attempts`) with the reason."""
        try:
            await self._score_batch(jobs)
        except Exception as exc:  # noqa: BLE001 - logged, and the jobs released rather than left leased
            reason = f"{type(exc).__name__}: {exc}"
            self.log("error", "scoring batch failed; its jobs are retried", jobs=len(jobs), reason=reason)
            retry_at = datetime.now(UTC) + timedelta(seconds=self.config.retry_backoff_s)
            with contextlib.suppress(Exception):  # the database failing too: the leases expire instead
                async with self._db:
                    await asyncio.to_thread(self._release, [job[0] for job in jobs], reason, retry_at)
        finally:
            self._active.difference_update(job[0] for job in jobs)

    def _release(self, job_ids: list[int], reason: str, retry_at: datetime) -> None:
        with id_table(self.con, job_ids, pa.int64()) as name:
            self.con.execute(
                "UPDATE eval_jobs SET status = CASE WHEN attempts >= ? THEN 'failed' ELSE 'pending' END, "
                "lease_until = NULL, not_before = ?, last_error = ?, updated_at = now() "
                f"WHERE job_id IN (SELECT id FROM {name}) AND status = 'running'",
                [self.config.max_attempts, retry_at, reason])

    async def _score_batch(self, jobs: list[tuple[Any, ...]]) -> None:
        rows, done, gone = [], [], []
        measured: list[tuple[tuple[Any, ...], tuple[Any, ...], BaseMetric, BaseException | None, float]] = []
        for chunk in await self._chunks(jobs):  # a bounded amount of test-case JSON in memory at once
            async with self._db:
                cases = await asyncio.to_thread(self._cases_of, _versions(chunk))
            results = await asyncio.to_thread(self._measure_all, chunk, cases)
            for job, (metric, error, latency_ms) in zip(chunk, results, strict=True):
                job_id, conversation_id, version, metric_id, _ = job
                case = cases.get((conversation_id, version))
                if case is None:
                    gone.append(job_id)
                    continue
                case = (None, *case[1:])  # the JSON is not needed past here
                measured.append((job, case, metric, error, latency_ms))
                if error is None:
                    rows.append(self._score_row(conversation_id, version, metric_id, metric, case[1], case[2],
                                                case[3], latency_ms, _probability(case[4], metric_id)))
                    done.append(job_id)
        async with self._db:
            await asyncio.to_thread(self._commit_batch, rows, done, gone)
        for (job_id, conversation_id, version, metric_id, attempts), case, metric, error, latency_ms in measured:
            if self.on_measured is not None:
                self.on_measured(metric_id, latency_ms / 1000, type(error).__name__ if error else None)
            if error is None:
                self._scored(conversation_id, version, metric_id, metric, case[1], case[2],
                             _probability(case[4], metric_id), _service_version(case[5]))
            else:
                await self._job_failed(job_id, metric_id, attempts, error, None, None)

    async def _chunks(self, jobs: list[tuple[Any, ...]]) -> list[list[tuple[Any, ...]]]:
        """The batch cut so that each part's test cases hold at most BATCH_CASE_BYTES of JSON (a conversation
        may be megabytes; a part always has at least one job)."""
        async with self._db:
            sizes = dict(await asyncio.to_thread(self._case_sizes, _versions(jobs)))
        chunks: list[list[tuple[Any, ...]]] = [[]]
        size = 0
        for job in jobs:
            length = sizes.get((job[1], job[2]), 0)
            if chunks[-1] and size + length > BATCH_CASE_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(job)
            size += length
        return chunks

    def _case_sizes(self, keys: pa.Table) -> list[tuple[tuple[str, int], int]]:
        return [((r[0], r[1]), r[2]) for r in self._stored(keys, "strlen(c.test_case::VARCHAR)")]

    def _cases_of(self, keys: pa.Table) -> dict[tuple[str, int], tuple[Any, ...]]:
        """(conversation, version) -> (test case JSON, service, agent, last span ns, inclusion JSON, attributes
        JSON), for the versions still stored."""
        rows = self._stored(keys, "c.test_case, c.service_name, c.agent_name, c.last_span_ns, c.inclusion, "
                                  "c.attributes")
        return {(r[0], r[1]): tuple(r[2:]) for r in rows}

    def _stored(self, keys: pa.Table, columns: str) -> list[tuple[Any, ...]]:
        """(conversation, version, *columns) of the conversation versions `keys` names that are still stored."""
        with registered(self.con, keys) as name:
            return self.con.execute(
                f"SELECT c.conversation_id, c.version, {columns} FROM conversations c "
                f"JOIN (SELECT DISTINCT * FROM {name}) k USING (conversation_id, version)").fetchall()

    def _measure_all(self, jobs: list[tuple[Any, ...]], cases: dict[tuple[str, int], tuple[Any, ...]]
                     ) -> list[tuple[BaseMetric, BaseException | None, float]]:
        """Each job's measured metric, the error its measure raised (None: a score) and its milliseconds; runs in a
        worker thread, on an event loop of its own, so the stage's loop never waits on it. Only for metrics that
        need no judge: they hold no client or other state bound to the stage's event loop."""
        async def measure_all() -> list[tuple[BaseMetric, BaseException | None, float]]:
            out = []
            for _, conversation_id, version, metric_id, _ in jobs:
                metric = self.metrics[metric_id].copy()
                case = cases.get((conversation_id, version))
                started, error = time.perf_counter(), None
                if case is not None:
                    try:
                        await measure_recorded(metric, metric_id, load_test_case(case[0]))
                    except (NoTaskError, InvalidTestCaseError, TextOnlyJudgeError) as exc:
                        not_applicable(metric, exc)  # recorded as a score row, not retried
                    except Exception as exc:  # noqa: BLE001 - retried or failed like any job's error
                        error = exc
                out.append((metric, error, (time.perf_counter() - started) * 1000))
            return out

        return asyncio.run(measure_all())

    def _commit_batch(self, rows: list[list[Any]], done: list[int], gone: list[int]) -> None:
        """The batch's scores and its jobs' outcomes in one transaction (two Arrow appends, two updates)."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            if rows:
                table = pa.Table.from_pylist([dict(zip(SCORE_COLUMNS, row, strict=True)) for row in rows],
                                             schema=SCORE_SCHEMA)
                with registered(self.con, table) as name:
                    self.con.execute(f"INSERT OR IGNORE INTO scores BY NAME SELECT * FROM {name}")
            for ids, change in ((done, "status = 'done', last_error = NULL"),
                                (gone, "status = 'failed', last_error = 'the conversation version is gone'")):
                if ids:
                    with id_table(self.con, ids, pa.int64()) as name:
                        self.con.execute(f"UPDATE eval_jobs SET {change}, lease_until = NULL, updated_at = now() "
                                         f"WHERE job_id IN (SELECT id FROM {name}) AND status = 'running'")
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise

    async def _batch_budget_slots(self, now: datetime) -> int:
        """In batch mode spend lands hours after jobs are leased: lease only as many as the budget left pays for
        at today's mean cost per judged job (the running ones counted as already spent)."""
        day = datetime(now.year, now.month, now.day, tzinfo=UTC)
        [(spent, mean)] = await self._sql(
            "SELECT coalesce(sum(evaluation_cost) FILTER (WHERE scored_at >= ?), 0), avg(evaluation_cost) FILTER "
            "(WHERE evaluation_cost > 0 AND metric <> 'mcp_call_validity') FROM scores "
            "WHERE scored_at >= ? - INTERVAL 7 DAY", [day, day])
        if not mean:
            return self.config.concurrency  # no cost known yet: start as the synchronous stage would
        left = (self.config.daily_budget_usd or 0.0) - spent
        return max(0, int(left / mean))

    async def _within_budget(self, now: datetime) -> bool:
        budget = self.config.daily_budget_usd
        if budget is None:
            return True
        day = datetime(now.year, now.month, now.day, tzinfo=UTC)
        [(spent,)] = await self._sql("SELECT coalesce(sum(evaluation_cost), 0) FROM scores WHERE scored_at >= ?",
                                     [day])
        if spent < budget:
            return True
        parked = await self._sql(
            "UPDATE eval_jobs SET status = 'budget', not_before = ?, updated_at = ? WHERE status = 'pending' "
            "AND metric <> 'mcp_call_validity' RETURNING job_id", [_next_utc_midnight(now), now])
        if parked:
            self.log("warning", "daily judge budget spent", spent_usd=round(spent, 6), budget_usd=budget,
                     jobs_waiting=len(parked))
        return False

    async def _run_job(self, job_id: int, conversation_id: str, version: int, metric_id: str, _job_config: str,
                       attempts: int) -> None:
        """Measure one leased job; the score is keyed by the current settings' config hash (score --pending
        re-scores old jobs with today's settings)."""
        rows = await self._sql("SELECT test_case, service_name, agent_name, last_span_ns, inclusion, attributes "
                               "FROM conversations WHERE conversation_id = ? AND version = ?",
                               [conversation_id, version])
        template = self.metrics.get(metric_id)
        if not rows or template is None:
            reason = "the conversation version is gone" if not rows else self.unavailable.get(metric_id, "unknown")
            await self._sql("UPDATE eval_jobs SET status = ?, lease_until = NULL, last_error = ?, updated_at = now() "
                            "WHERE job_id = ?", ["failed" if not rows else "waiting_for_judge", reason, job_id])
            return
        test_case_json, service, agent, last_ns, inclusion, attributes = rows[0]
        probability, service_version = _probability(inclusion, metric_id), _service_version(attributes)
        digest = await asyncio.to_thread(content_digest, test_case_json) if metric_id in JUDGED else None
        if digest is not None and await self._reuse(job_id, conversation_id, version, metric_id, digest,
                                                    service, agent, last_ns, probability, service_version):
            return
        metric = template.copy()
        started = time.perf_counter()
        error: BaseException | None = None
        with recording() as exchanges:
            try:
                await measure_recorded(metric, metric_id, load_test_case(test_case_json))
            except (NoTaskError, InvalidTestCaseError, TextOnlyJudgeError) as exc:
                not_applicable(metric, exc)  # deterministic: recorded as a score row, not retried
            except Exception as exc:
                error = exc
        latency_ms = (time.perf_counter() - started) * 1000
        if self.on_measured is not None:
            self.on_measured(metric_id, latency_ms / 1000, type(error).__name__ if error else None)
        outage = self.outages.get(metric_id)
        given_back = self._given_back.pop(job_id, None)
        if error is None:
            self._own_failures.discard(job_id)
            if outage is not None:
                outage.succeeded()
            await self._write_score(job_id, conversation_id, version, metric_id, metric, service, agent,
                                    last_ns, latency_ms, digest, probability, exchanges.exchanges)
            self._scored(conversation_id, version, metric_id, metric, service, agent, probability, service_version)
            return
        await self._job_failed(job_id, metric_id, attempts, error, outage, given_back)

    def _scored(self, conversation_id: str, version: int, metric_id: str, metric: BaseMetric, service: str | None,
                agent: str | None, probability: float | None = None, service_version: str | None = None) -> None:
        """A score is committed: count it, tell the observers and log it."""
        self._report(conversation_id, version, metric_id, metric.score, metric.success, metric.evaluation_cost,
                     metric.usage.input_tokens, metric.usage.output_tokens, service, agent, probability,
                     service_version, _task_counts(metric.score_breakdown, metric.threshold))

    def checked(self, scores: Sequence[CheckedScore]) -> None:
        """Scores the assembler wrote with their conversations' versions (checks run as they were built)."""
        for c in scores:
            if self.on_measured is not None:
                self.on_measured(c.metric, c.check.latency_ms / 1000, None)
            self._report(c.conversation_id, c.version, c.metric, c.check.score, c.check.success, 0.0, 0, 0,
                         c.service_name, c.agent_name, c.probability, _service_version(c.attributes))

    def _report(self, conversation_id: str, version: int, metric_id: str, score: float | None,
                success: bool | None, cost: float | None, input_tokens: int, output_tokens: int,
                service: str | None, agent: str | None, probability: float | None,
                service_version: str | None, tasks: tuple[int, int] = (0, 0)) -> None:
        self.processed += 1
        result = "n/a" if score is None else "scored" if success is None else ("pass" if success else "fail")
        if self.on_scored is not None:
            self.on_scored(ScoredEvent(metric_id, service, agent, score, result, cost, input_tokens, output_tokens,
                                       1.0 / probability if probability else 1.0, service_version, *tasks))
        self.log("info", "score written", conversation_id=conversation_id, version=version, metric=metric_id,
                 score=None if score is None else round(score, 4), result=result, cost_usd=cost)

    async def _job_failed(self, job_id: int, metric_id: str, attempts: int, error: BaseException,
                          outage: JudgeOutage | None, given_back: tuple[int, int] | None) -> None:
        """A measure raised: the judge's outage gives the attempt back, else the job is retried or failed."""
        message = f"{type(error).__name__}: {error}"
        # an outage gives the attempt back; but a job still unavailable after OWN_FAILURE_STRIKES tries,
        # while the judge has answered other jobs since its first, fails by itself (say it always times
        # out): from then on its failures count like any other. A flapping judge rarely fails one job so often.
        unavailable = outage is not None and isinstance(error, JudgeUnavailableError)
        first_seen, failures = given_back if given_back is not None else (None, 0)
        failures += 1
        if unavailable and first_seen is not None and first_seen != outage.successes \
                and failures >= OWN_FAILURE_STRIKES:
            self._own_failures.add(job_id)
        if unavailable and job_id not in self._own_failures:
            self._given_back[job_id] = (outage.successes if first_seen is None else first_seen, failures)
            now = datetime.now(UTC)
            retry_at = outage.failed(now)
            # the metric resumes at retry_at with other jobs; this one waits as long again, so a job that
            # only fails by itself cannot be first in line every time and hide that the judge is back
            await self._sql("UPDATE eval_jobs SET status = 'pending', attempts = attempts - 1, lease_until = NULL, "
                            "not_before = ?, last_error = ?, updated_at = now() WHERE job_id = ? AND status = "
                            "'running'", [retry_at + (retry_at - now), message, job_id])
            self.log("warning", "judge unavailable; its jobs wait", metric=metric_id, retry_at=retry_at.isoformat(),
                     consecutive=outage.streak, reason=message)
            return
        if attempts >= self.config.max_attempts:
            self._own_failures.discard(job_id)
            await self._sql("UPDATE eval_jobs SET status = 'failed', lease_until = NULL, last_error = ?, "
                            "updated_at = now() WHERE job_id = ? AND status = 'running'", [message, job_id])
            self.log("error", "scoring job failed", job_id=job_id, metric=metric_id, attempts=attempts, reason=message)
            return
        retry_at = datetime.now(UTC) + timedelta(seconds=self.config.retry_backoff_s * 2 ** (attempts - 1))
        await self._sql("UPDATE eval_jobs SET status = 'pending', lease_until = NULL, not_before = ?, last_error = ?, "
                        "updated_at = now() WHERE job_id = ? AND status = 'running'", [retry_at, message, job_id])
        self.log("warning", "scoring job will be retried", job_id=job_id, metric=metric_id, attempts=attempts,
                 retry_at=retry_at.isoformat(), reason=message)

    async def _reuse(self, job_id: int, conversation_id: str, version: int, metric_id: str, digest: str,
                     service: str | None, agent: str | None, last_ns: int | None,
                     probability: float | None = None, service_version: str | None = None) -> bool:
        """Write the score of identical content measured before with the same metric config, if there is one:
        the judge is never asked twice about the same conversation (a new version, a replay)."""
        found = await self._sql(
            "SELECT s.* FROM judged_content j JOIN scores s ON s.conversation_id = j.conversation_id AND "
            "s.conversation_version = j.conversation_version AND s.metric = j.metric AND "
            "s.metric_config = j.metric_config WHERE j.content_digest = ? AND j.metric = ? AND j.metric_config = ?",
            [digest, metric_id, self.configs[metric_id]])
        if not found:
            return False
        row = list(found[0])
        breakdown = json.loads(row[SCORE_COLUMNS.index("breakdown")] or "{}")
        source = breakdown.get("reused_from") or {"conversation_id": row[0], "conversation_version": row[1]}
        end_time = datetime.fromtimestamp(last_ns / 1e9, UTC) if last_ns else None
        row[SCORE_COLUMNS.index("breakdown")] = json.dumps({**breakdown, "reused_from": source})
        replaced = {"conversation_id": conversation_id, "conversation_version": version, "evaluation_cost": 0.0,
                    "input_tokens": 0, "output_tokens": 0, "judge_calls": 0, "latency_ms": 0.0,
                    "service_name": service, "agent_name": agent, "conversation_end_time": end_time,
                    "scored_at": datetime.now(UTC), "inclusion_probability": probability}
        for column, value in replaced.items():
            row[SCORE_COLUMNS.index(column)] = value
        await self._commit_score(job_id, row, None)
        score, success = row[SCORE_COLUMNS.index("score")], row[SCORE_COLUMNS.index("success")]
        result = "n/a" if score is None else "scored" if success is None else ("pass" if success else "fail")
        self.processed += 1
        if self.on_scored is not None:
            self.on_scored(ScoredEvent(metric_id, service, agent, score, result, 0.0, 0, 0,
                                       1.0 / probability if probability else 1.0, service_version,
                                       *_task_counts(breakdown, row[SCORE_COLUMNS.index("threshold")])))
        self.log("info", "score reused", conversation_id=conversation_id, version=version, metric=metric_id,
                 from_conversation=source["conversation_id"], from_version=source["conversation_version"])
        return True

    async def _write_score(self, job_id: int, conversation_id: str, version: int, metric_id: str,
                           metric: BaseMetric, service: str | None, agent: str | None, last_ns: int | None,
                           latency_ms: float, digest: str | None = None, probability: float | None = None,
                           exchanges: Sequence[JudgeExchange] = ()) -> None:
        row = self._score_row(conversation_id, version, metric_id, metric, service, agent, last_ns, latency_ms,
                              probability)
        await self._commit_score(job_id, row, digest if metric.error is None else None,
                                 self._judge_calls(row, exchanges))

    def _judge_calls(self, row: list[Any], exchanges: Sequence[JudgeExchange]) -> pa.Table | None:
        """The score's judge exchanges as `judge_calls` rows, redacted as spans are."""
        if not exchanges:
            return None
        clean = self.redactor.value if self.redactor is not None else (lambda value: value)
        return pa.Table.from_pylist([
            {"conversation_id": row[0], "conversation_version": row[1], "metric": row[2], "metric_config": row[3],
             "seq": seq, "judge": e.judge, "request": json.dumps(clean(e.request), default=str),
             "response": clean(e.response), "error": clean(e.error), "input_tokens": e.input_tokens,
             "output_tokens": e.output_tokens, "latency_ms": e.latency_ms,
             "called_at": datetime.fromtimestamp(e.started_at, UTC)}
            for seq, e in enumerate(exchanges)], schema=JUDGE_CALLS_SCHEMA)

    def _score_row(self, conversation_id: str, version: int, metric_id: str, metric: BaseMetric,
                   service: str | None, agent: str | None, last_ns: int | None, latency_ms: float,
                   probability: float | None = None) -> list[Any]:
        """The `scores` row of a measured metric, in SCORE_COLUMNS order."""
        judged = isinstance(metric, JudgedMetric)
        breakdown = metric.score_breakdown or {}
        end_time = datetime.fromtimestamp(last_ns / 1e9, UTC) if last_ns else None
        row = [
            conversation_id, version, metric_id, self.configs[metric_id],
            metric.eval_mode.value if judged else None, metric.score,
            metric.success, metric.threshold, metric.strict_mode, metric.reason, metric.confidence,
            (metric.model.answered_model or metric.model.model) if judged and metric.model else None,
            metric.system_one.id if judged and metric.system_one else None, metric.evaluation_cost,
            metric.usage.input_tokens, metric.usage.output_tokens, metric.usage.calls, latency_ms,
            json_bytes(breakdown).decode(), getattr(metric, "system_one_fallback_reason", None), metric.error,
            service, agent, end_time, datetime.now(UTC), probability,
        ]
        return row

    async def _commit_score(self, job_id: int, row: list[Any], digest: str | None,
                            calls: pa.Table | None = None) -> None:
        """The score row, what content it was measured on (when `digest`), its judge exchanges (unless the score
        was there already) and the job done: one transaction."""
        def write() -> None:
            self.con.execute("BEGIN TRANSACTION")
            try:
                if calls is not None:
                    with registered(self.con, calls) as name:
                        self.con.execute(
                            f"INSERT INTO judge_calls SELECT * FROM {name} WHERE NOT EXISTS (SELECT 1 FROM scores "
                            "WHERE conversation_id = ? AND conversation_version = ? AND metric = ? "
                            "AND metric_config = ?)", row[:4])
                self.con.execute("INSERT OR IGNORE INTO scores VALUES (" + ", ".join("?" * len(row)) + ")", row)
                if digest is not None:
                    self.con.execute("INSERT OR REPLACE INTO judged_content VALUES (?, ?, ?, ?, ?)",
                                     [digest, row[2], row[3], row[0], row[1]])
                self.con.execute("UPDATE eval_jobs SET status = 'done', lease_until = NULL, last_error = NULL, "
                                 "updated_at = now() WHERE job_id = ? AND status = 'running'", [job_id])
                self.con.execute("COMMIT")
            except Exception:
                self.con.execute("ROLLBACK")
                raise

        async with self._db:
            await asyncio.to_thread(write)

    async def rejudge(self, conversation_id: str, metric_id: str, version: int | None = None) -> dict[str, Any]:
        """One metric measured again on a stored conversation with this stage's judge, beside the stored score;
        nothing is written (`tracejudge rejudge`). RejudgeError when the conversation or metric is not here."""
        template = self.metrics.get(metric_id)
        if template is None:
            why = self.unavailable.get(metric_id) or f"it is not one of [scoring] metrics ({', '.join(self.metrics)})"
            raise RejudgeError(f"cannot score {metric_id!r} again: {why}")
        budget = self.config.daily_budget_usd
        if budget is not None and metric_id in JUDGED:
            day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            [(spent,)] = await self._sql("SELECT coalesce(sum(evaluation_cost), 0) FROM scores "
                                         "WHERE scored_at >= ?", [day])
            if spent >= budget:
                raise RejudgeError(f"today's judge budget is spent (${spent:.4f} of ${budget:.4f}, "
                                   "[scoring] daily_budget_usd): try again after midnight UTC")
        async with self._db:
            chosen, test_case_json = await asyncio.to_thread(stored_case, self.con, conversation_id, version)
            before = await asyncio.to_thread(stored_score, self.con, conversation_id, chosen, metric_id,
                                             self.configs[metric_id])
        now = await rejudge(template, metric_id, test_case_json)
        if self.redactor is not None:
            now["exchanges"] = self.redactor.value(now["exchanges"])
        return {"conversation_id": conversation_id, "version": chosen, "metric": metric_id, "stored": before,
                "now": now}

    async def score_pending(self, include_failed: bool = True) -> int:
        """`tracejudge score --pending`: retry waiting and failed jobs now, with the current settings."""
        await self.requeue(include_failed)
        before = self.processed
        while True:
            started = await self.step()
            if running := self._in_flight():
                await asyncio.gather(*running, return_exceptions=True)
            left = dict(await self._sql("SELECT metric, count(*) FROM eval_jobs WHERE status = 'pending' AND "
                                        "(not_before IS NULL OR not_before <= now()) GROUP BY 1"))
            if not started and not left:
                return self.processed - before
            if not started:  # what is left belongs to metrics paused by a judge outage
                now = datetime.now(UTC)
                paused = [self.outages[m] for m in left if m in self.outages and self.outages[m].blocks(now)]
                if not paused or len(paused) < len(left):
                    continue
                if all(o.streak >= OUTAGE_GIVE_UP_STREAK for o in paused):
                    return self.processed - before  # the judge stays down: leave the jobs pending for later
                until = min(o.until for o in paused if o.until is not None)
                await asyncio.sleep(max(0.0, (until - now).total_seconds()))

    async def job_counts(self) -> dict[str, int]:
        """Jobs by state, for the progress line and /metrics."""
        return {status: count for status, count in await self._sql(
            "SELECT status, count(*) FROM eval_jobs GROUP BY status ORDER BY status")}

    def judges(self) -> dict[str, Any]:
        """The judge model, its base URL (credentials masked) and the System One model, for the start line."""
        judged = next((m for m in self.metrics.values() if isinstance(m, JudgedMetric)), None)
        llm = judged.model if judged is not None else None
        system_one = judged.system_one if judged is not None else None
        return {"eval_mode": self.config.eval_mode or "llm",
                "judge_model": llm.model if llm is not None else None,
                "judge_base_url": (mask_url(llm.base_url) if llm.base_url else "https://api.openai.com/v1")
                if llm is not None else None,
                "system_one": system_one.id if system_one is not None else None}

    def describe(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "waiting_for_judge": self.unavailable}
