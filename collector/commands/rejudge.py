"""`tracejudge rejudge CONVERSATION --metric M`: the stored score and today's judge, side by side.

On a running collector (its judge, through the admin API), else on the database file with the current settings.
Nothing is written either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.commands.admin_client import admin_headers


def _on_collector(args: argparse.Namespace) -> tuple[int, dict[str, Any] | None] | None:
    try:
        reply = httpx.post(f"{args.url.rstrip('/')}/api/rejudge", headers=admin_headers(), timeout=args.timeout,
                           json={"conversation_id": args.conversation, "metric": args.metric,
                                 "version": args.version})
    except httpx.ConnectError:
        return None  # no collector: the file is scored here
    except httpx.HTTPError as exc:
        print(f"tracejudge rejudge: the collector at {args.url} did not answer in {args.timeout:.0f} s ({exc}); "
              "raise --timeout for a slow judge", file=sys.stderr)
        return EXIT_FAIL, None
    if reply.status_code != 200:
        print(f"tracejudge rejudge: {reply.json().get('error', reply.text)}", file=sys.stderr)
        return EXIT_BAD_INPUT, None
    return EXIT_PASS, reply.json()


def _on_file(args: argparse.Namespace) -> tuple[int, dict[str, Any] | None]:
    import duckdb

    from tracejudge.collector.config import ConfigError, load_settings
    from tracejudge.collector.log import Logger
    from tracejudge.collector.pipeline.rejudge import RejudgeError
    from tracejudge.collector.pipeline.scoring_stage import ScoringStage
    from tracejudge.collector.server import stage_config
    from tracejudge.collector.store.schema import SCHEMA_VERSION

    try:
        settings = load_settings(Path(args.config) if args.config else None, {"db": args.db})
    except ConfigError as exc:
        print(f"tracejudge rejudge: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT, None
    if settings.scoring.batch:
        print("tracejudge rejudge: [scoring] batch sends requests through the Batch API (hours); rejudge asks the "
              "judge directly: run it with batch = false", file=sys.stderr)
        return EXIT_BAD_INPUT, None
    try:  # read-only: nothing is written, and the file is not even upgraded
        con = duckdb.connect(str(settings.store.db), read_only=True)
    except duckdb.Error as exc:
        print(f"tracejudge rejudge: cannot open {settings.store.db} ({exc}); if a collector holds it, leave out "
              "--db to ask that collector", file=sys.stderr)
        return EXIT_FAIL, None
    try:
        found = con.execute("SELECT max(version) FROM tracejudge_schema").fetchone()
        if not found or found[0] != SCHEMA_VERSION:
            print(f"tracejudge rejudge: {settings.store.db} is at schema {found[0] if found else 'none'}, this "
                  f"tracejudge at {SCHEMA_VERSION}: start `tracejudge serve` on it once to upgrade it",
                  file=sys.stderr)
            return EXIT_BAD_INPUT, None
        stage = ScoringStage(con.cursor(), stage_config(settings), Logger(settings.log.level).log,
                             redactor=settings.redaction.redactor())
        return EXIT_PASS, asyncio.run(stage.rejudge(args.conversation, args.metric, args.version))
    except RejudgeError as exc:
        print(f"tracejudge rejudge: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT, None
    except duckdb.CatalogException as exc:
        print(f"tracejudge rejudge: {settings.store.db} is not a tracejudge database ({exc})", file=sys.stderr)
        return EXIT_BAD_INPUT, None
    finally:
        con.close()


def _value(score: float | None, success: bool | None) -> str:
    if score is None:
        return "not applicable"
    return f"{score:.2f} {'PASS' if success else 'FAIL' if success is False else ''}".strip()


def _print(answer: dict[str, Any], show_exchanges: bool) -> None:
    before, now = answer.get("stored"), answer["now"]
    print(f"{answer['metric']} on {answer['conversation_id']} v{answer['version']}")
    rows = [("score", _value(before["score"], before["success"]) if before else "not scored",
             _value(now["score"], now["success"]) + (f" (error: {now['error']})" if now.get("error") else "")),
            ("judge", f"{before['judge'] or '–'} ({before['eval_mode'] or 'deterministic'})" if before else "–",
             f"{now['judge'] or '–'} ({now['eval_mode'] or 'deterministic'})"),
            ("judge calls", str(before["judge_calls"]) if before else "–", str(now["judge_calls"])),
            ("when", before["scored_at"] if before else "–", "now (not stored)")]
    if before and not before["same_settings"]:
        rows.append(("settings", f"config {before['metric_config']} (not today's)", "today's [scoring] settings"))
    width = max(len(r[1]) for r in rows) + 2
    print(f"{'':14}{'stored':{width}}now")
    for name, was, is_ in rows:
        print(f"{name:14}{was:{width}}{is_}")
    tasks_before = {t["task"]: t for t in (before or {}).get("tasks") or []}
    for task in now["tasks"] or [{"task": t, "score": None, "reason": None} for t in tasks_before]:
        was = tasks_before.get(task["task"], {})
        print(f"\ntask: {textwrap.shorten(task['task'] or '', 110)}")
        print(f"  stored {_num(was.get('score'))}: {textwrap.shorten(was.get('reason') or '–', 150)}")
        print(f"  now    {_num(task.get('score'))}: {textwrap.shorten(task.get('reason') or '–', 150)}")
    for name, reason in (("stored", (before or {}).get("reason")), ("now", now.get("reason"))):
        if reason:
            print(f"\nreason ({name}):\n" + textwrap.indent(textwrap.fill(reason, 110), "  "))
    if show_exchanges:
        for i, exchange in enumerate(now["exchanges"], 1):
            print(f"\n--- judge call {i}: {exchange['judge']}, {exchange['latency_ms']:.0f} ms")
            for message in exchange["request"].get("messages") or []:
                print(f"[{message.get('role')}]\n{message.get('content')}")
            if not exchange["request"].get("messages"):
                print(json.dumps(exchange["request"], indent=2))
            print(f"[answer]\n{exchange['response'] if exchange['error'] is None else 'error: ' + exchange['error']}")
    elif now["exchanges"]:
        print(f"\n{len(now['exchanges'])} judge exchange(s) made now: --exchanges prints them as sent and answered")


def _num(value: float | None) -> str:
    return "   – " if value is None else f"{value:.2f}"


def run(args: argparse.Namespace) -> int:
    outcome = _on_collector(args) if not args.db else None
    code, answer = outcome if outcome is not None else _on_file(args)
    if answer is None:
        return code
    if args.json:
        print(json.dumps(answer, indent=2, default=str))
    else:
        _print(answer, args.exchanges)
    return EXIT_FAIL if answer["now"].get("error") else EXIT_PASS
