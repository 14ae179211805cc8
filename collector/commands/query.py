"""`tracejudge query`: one read-only SELECT, on the running collector or the history files."""

from __future__ import annotations

import argparse
import sys

import httpx

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_PASS
from tracejudge.collector.commands.admin_client import from_collector
from tracejudge.collector.commands.table_output import print_result
from tracejudge.collector.history.query_result import QueryResult


def run(args: argparse.Namespace) -> int:
    reply = None if args.archive else from_collector(args, lambda url, headers: httpx.post(
        f"{url}/api/query", json={"sql": args.sql, "limit": args.limit}, headers=headers, timeout=args.timeout + 5))
    if reply is not None:
        if reply.status_code != 200:
            print(f"tracejudge query: {reply.json().get('error', reply.text)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        body = reply.json()
        print_result(QueryResult(body["columns"], body["rows"], body["truncated"]), args.format)
        return EXIT_PASS
    from tracejudge.collector.commands.history_files import history  # DuckDB: only when no collector answered
    from tracejudge.collector.history.query import QueryFailed, QueryRefused, run_read_query

    opened = history(args, "query")
    if opened is None:
        return EXIT_BAD_INPUT
    con, _ = opened
    try:
        result = run_read_query(con, args.sql, args.limit, args.timeout)
    except (QueryRefused, QueryFailed) as exc:
        print(f"tracejudge query: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        con.close()
    print_result(result, args.format)
    return EXIT_PASS
