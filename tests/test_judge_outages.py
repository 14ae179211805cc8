"""Judge outages, flapping and 429 storms against a real collector: bounded retries, paused metrics,
the budget respected, and everything scored once the judge is back."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, completion, error
from tests.test_pipeline import config, export, query, turn

OUTAGE = "outage_backoff_s = 0.2\noutage_max_backoff_s = 1.0\nmax_attempts = 2\n"
JUDGE_TRIES = 5  # the LLM judge's first try and its 4 retries
OUTAGE_CALLS = 160


def _conversations(n: int, start: int = 0) -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "outage-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(start, n):
        turn(provider.get_tracer("agent"), f"conv-{i}", f"Question {i}?", "lookup", {"i": i}, f"result {i}",
             f"Answer {i}.", end=True)
    provider.shutdown()
    return list(memory.get_finished_spans())


def _answer(request: Request) -> Reply:
    return completion({"reason": "final"} if request.judge == "final_reason" else {"reason": "ok", "score": 0.5})


def _unavailable(status: int) -> Reply:
    return error(status, "overloaded", headers={"Retry-After": "0"})


def _events(collector: CollectorProcess, name: str) -> list[dict[str, Any]]:
    out = []
    for line in collector.log_lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("event") == name:
            out.append(record)
    return out


def _wait_done(collector: CollectorProcess, jobs: int, timeout: float = 90) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        states = dict(map(tuple, query(collector, "SELECT status, count(*) FROM eval_jobs GROUP BY 1")))
        if states.get("done", 0) + states.get("failed", 0) >= jobs or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def test_an_outage_then_flapping_costs_no_job_and_everything_is_scored(tmp_path: Path, judge_server) -> None:
    lock = threading.Lock()
    calls = {"n": 0}

    def script(request: Request) -> Reply:
        """The first 160 calls fail (an outage), the next 40 alternate 429/502 and answers, then all answer."""
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n <= OUTAGE_CALLS:
            return _unavailable(503)
        if n <= OUTAGE_CALLS + 40 and n % 2:
            return _unavailable(429 if n % 4 == 1 else 502)
        return _answer(request)

    judge_server.script = script
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path, OUTAGE), env=env) as collector:
        export(collector, _conversations(4))
        states = _wait_done(collector, 12)
        assert states == {"done": 12}, states  # max_attempts = 2, yet the outage failed nothing
        waits = _events(collector, "judge unavailable; its jobs wait")
        attempts = query(collector, "SELECT max(attempts) FROM eval_jobs")
        collector.stop()
    assert attempts[0][0] <= 2
    # jobs in flight when a pause begins count once, so each pause is one step of the doubling; a step
    # costs at most 4 jobs x 2 concurrent calls x 5 tries = 40 failing calls across both metrics
    assert max(w["consecutive"] for w in waits) >= OUTAGE_CALLS // (4 * 2 * JUDGE_TRIES) // 2
    pauses = [time.mktime(time.strptime(w["retry_at"][:19], "%Y-%m-%dT%H:%M:%S")) - w["ts"] for w in waits]
    assert max(pauses) <= 1.0 + 1.0  # capped at outage_max_backoff_s (retry_at is cut to whole seconds)


def test_a_429_storm_respects_the_budget_and_scores_once_it_passes(tmp_path: Path, judge_server) -> None:
    rng = random.Random(7)
    lock = threading.Lock()

    def storm(request: Request) -> Reply:
        with lock:
            refused = rng.random() < 0.6
        return _unavailable(429) if refused else _answer(request)

    judge_server.script = storm
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    budget = 0.0004  # gpt-4o-mini list price: a few measures' worth
    cfg = config(tmp_path, OUTAGE + f"daily_budget_usd = {budget}\nconcurrency = 2\n")
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        export(collector, _conversations(8))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            states = dict(map(tuple, query(collector, "SELECT status, count(*) FROM eval_jobs GROUP BY 1")))
            if states.get("budget") and not states.get("pending") and not states.get("running"):
                break
            time.sleep(0.2)
        [[spent, most, judged]] = query(collector, "SELECT sum(evaluation_cost), max(evaluation_cost), count(*) "
                                                   "FROM scores WHERE metric <> 'mcp_call_validity'")
        collector.stop()
    assert states.get("budget", 0) >= 1 and "failed" not in states, states
    assert judged >= 1 and spent <= budget + 2 * most  # at most the measures already running when it ran out


def test_a_job_the_judge_always_fails_while_others_score_still_fails(tmp_path: Path, judge_server) -> None:
    """Unavailability of one conversation only (say it always times out) is not an outage: it uses up
    attempts and fails, instead of being given back forever."""
    def script(request: Request) -> Reply:
        return _unavailable(503) if "Question 0?" in request.user else _answer(request)

    judge_server.script = script
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    cfg = config(tmp_path, OUTAGE + "concurrency = 1\n")
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        # conv-0 first: its failures must be seen while the judge still answers the others (with nothing else
        # left to score, a job the judge keeps failing looks like an outage and waits)
        export(collector, _conversations(1))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not query(collector, "SELECT 1 FROM eval_jobs WHERE attempts > 0 "
                                                                   "AND metric = 'mcp_use'"):
            time.sleep(0.05)
        export(collector, _conversations(3, start=1))
        states = _wait_done(collector, 9)
        failed = query(collector, "SELECT DISTINCT conversation_id FROM eval_jobs WHERE status = 'failed'")
        collector.stop()
    assert states.get("done") == 7 and states.get("failed") == 2, states  # conv-0's two judged metrics
    assert failed == [["conv-0"]]


def test_jobs_failing_together_count_as_one_step_of_an_outage() -> None:
    from datetime import UTC, datetime, timedelta

    from tracejudge.outage import JudgeOutage

    outage, now = JudgeOutage(base_s=1.0, max_s=8.0), datetime(2026, 12, 2, tzinfo=UTC)
    first = outage.failed(now)
    assert first == now + timedelta(seconds=1) and outage.failed(now) == first and outage.streak == 1
    assert outage.failed(first) == first + timedelta(seconds=2) and outage.streak == 2
    outage.succeeded()
    assert not outage.blocks(first) and outage.streak == 0 and outage.successes == 1
