"""`tracejudge serve`: run the collector."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.config import ConfigError, judge_flags, load_settings
from tracejudge.collector.log import Logger
from tracejudge.collector.server import serve
from tracejudge.collector.store.span_store import StoreInvalidated, StoreOpenError


def run(args: argparse.Namespace) -> int:
    flags = {"host": args.host, "admin_host": args.admin_host, "grpc_port": args.grpc_port, "http_port": args.http_port,
             "admin_port": args.admin_port, "db": args.db, "level": args.log_level, "replica": args.replica,
             "model": args.judge_model, "system_one_model": args.system_one_model,
             "quiet_period_s": args.quiet_period, **judge_flags(args)}
    try:
        settings = load_settings(Path(args.config) if args.config else None, flags)
        settings.lake.check_publishing()
    except ConfigError as exc:
        print(f"tracejudge serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logger = Logger(settings.log.level)
    try:
        asyncio.run(serve(settings, logger))
    except StoreOpenError as exc:
        logger.error("cannot start", reason=str(exc))
        return EXIT_FAIL
    except StoreInvalidated:  # said in the critical line when it happened
        return EXIT_FAIL
    except OSError as exc:
        logger.error("cannot start", reason=f"{exc}; is another process listening on that port?")
        return EXIT_FAIL
    return EXIT_PASS
