"""Opening the score history directly (one file, several replicas' files, or the lake) when no collector answers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb

from tracejudge.collector.config import ConfigError
from tracejudge.collector.history.history_sources import open_history
from tracejudge.collector.history.lake import LakeError
from tracejudge.collector.history.replica_files import ReplicaFileError


def history(args: argparse.Namespace, command: str) -> tuple[duckdb.DuckDBPyConnection, str] | None:
    try:
        archive = getattr(args, "archive", None)
        return open_history(args.lake, args.db, args.config, Path(archive) if archive else None)
    except (LakeError, ReplicaFileError, ConfigError) as exc:
        hint = "" if args.lake or args.db else f"no collector answers at {args.url}, and "
        print(f"tracejudge {command}: {hint}{exc}", file=sys.stderr)
        return None
