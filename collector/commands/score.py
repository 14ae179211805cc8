"""`tracejudge score --pending`: run waiting and failed jobs, on the running collector or the file."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.commands.admin_client import admin_headers
from tracejudge.collector.config import ConfigError, judge_flags, load_settings
from tracejudge.collector.log import Logger
from tracejudge.collector.pipeline.scoring_stage import ScoringStage
from tracejudge.collector.server import stage_config
from tracejudge.collector.store.connection.checkpoint_gate import WritesRefused
from tracejudge.collector.store.span_store import SpanStore, StoreOpenError


def _score_on_collector(args: argparse.Namespace) -> int | None:
    """`score --pending` through a running collector's admin API: it re-queues the jobs and its own scoring stage
    runs them; this waits (printing progress) until they are done. None when no collector answers."""
    given = [flag for flag, value in (("--batch", args.batch), ("--judge-timeout", args.judge_timeout),
                                      ("--judge-concurrency", args.judge_concurrency),
                                      ("--judge-context-tokens", args.judge_context_tokens)) if value]
    if given:
        try:
            httpx.get(f"{args.url.rstrip('/')}/healthz", timeout=5)
        except httpx.HTTPError:
            return None  # no collector: this process scores the file with the flags given
        print(f"tracejudge score: a collector is running at {args.url} and scores with its own judge settings, so "
              f"{', '.join(given)} would be ignored; set them in its [scoring] settings and restart it, or stop it "
              "and run this again", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        reply = httpx.post(f"{args.url.rstrip('/')}/api/score-pending", json={}, headers=admin_headers(), timeout=30)
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        print(f"tracejudge score: the collector at {args.url} refused: {reply.json().get('error', reply.text)}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    body = reply.json()
    for metric, why in body["waiting_for_judge"].items():
        print(f"tracejudge score: {metric} has no judge in the running collector ({why}); its jobs keep waiting",
              file=sys.stderr)
    ids, deadline, shown = body["job_ids"], time.monotonic() + args.wait, None
    print(f"the collector at {args.url} is scoring {len(ids)} job(s)", file=sys.stderr)
    counts: dict[str, int] = {}
    while ids:
        sql = ("SELECT status, count(*) FROM eval_jobs WHERE job_id IN (" + ", ".join(map(str, ids)) + ") "
               "GROUP BY 1")
        answer = httpx.post(f"{args.url.rstrip('/')}/api/query", json={"sql": sql}, headers=admin_headers(),
                            timeout=30)
        counts = dict(answer.json()["rows"]) if answer.status_code == 200 else counts
        open_jobs = counts.get("pending", 0) + counts.get("running", 0)
        if counts != shown:
            print("  " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())), file=sys.stderr)
            shown = counts
        if not open_jobs or time.monotonic() > deadline:
            break
        time.sleep(1)
    done, failed = counts.get("done", 0), counts.get("failed", 0)
    waiting = sum(n for state, n in counts.items() if state not in ("done", "failed"))
    print(f"scored {done} job(s); {failed} failed, {waiting} still waiting")
    return EXIT_PASS if not failed and not waiting else EXIT_FAIL


def run(args: argparse.Namespace) -> int:
    on_collector = _score_on_collector(args)
    if on_collector is not None:
        return on_collector
    try:
        settings = load_settings(Path(args.config) if args.config else None, {"db": args.db, **judge_flags(args)})
    except ConfigError as exc:
        print(f"tracejudge score: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logger = Logger(settings.log.level)
    store = SpanStore(settings.store.db)
    try:
        store.open()
    except StoreOpenError as exc:
        print(f"tracejudge score: {exc}; stop the collector first (it holds the file)", file=sys.stderr)
        return EXIT_FAIL
    try:
        stage = ScoringStage(store.cursor(), stage_config(settings), logger.log)
        stage.recover()
        done = asyncio.run(stage.score_pending())
        [(failed,)] = store.cursor().execute("SELECT count(*) FROM eval_jobs WHERE status = 'failed'").fetchall()
        [(waiting,)] = store.cursor().execute(
            "SELECT count(*) FROM eval_jobs WHERE status IN ('waiting_for_judge', 'budget', 'pending')").fetchall()
    except WritesRefused as exc:
        print(f"tracejudge score: {exc}", file=sys.stderr)
        return EXIT_FAIL
    finally:
        store.close()
    print(f"scored {done} job(s); {failed} failed, {waiting} still waiting")
    return EXIT_PASS if not failed and not waiting else EXIT_FAIL
