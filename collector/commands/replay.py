"""`tracejudge replay`: send saved trace files to a running collector."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import httpx

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.replay import ReplayError, grpc_target, replay


def run(args: argparse.Namespace) -> int:
    endpoint = args.endpoint or ("http://127.0.0.1:4318" if args.protocol == "http" else "127.0.0.1:4317")
    endpoint = endpoint if args.protocol == "http" else grpc_target(endpoint)
    token = args.token or os.environ.get("TRACEJUDGE_INGEST_TOKEN")
    try:
        report = replay([Path(f) for f in args.files], args.protocol, endpoint, token)
    except ReplayError as exc:
        print(f"tracejudge replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (httpx.HTTPError, OSError) as exc:
        print(f"tracejudge replay: cannot reach {endpoint}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    for line in report.messages + report.failures:
        print(line, file=sys.stderr)
    print(f"sent {report.requests} request(s) to {', '.join(report.sent_to) or endpoint}: "
          f"{len(report.failures)} failed, "
          f"{report.rejected_spans} span(s) rejected" + (f", {report.rejected_log_records} log record(s) rejected"
                                                          if report.rejected_log_records else ""))
    return EXIT_PASS if not report.failures and not report.rejected else EXIT_FAIL
