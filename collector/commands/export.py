"""`tracejudge export`: scores and conversations as Parquet files."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

import duckdb

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.durations import DurationError, parse_since
from tracejudge.collector.history.output_paths import OutputPathError, confined


def run(args: argparse.Namespace) -> int:
    try:
        since = parse_since(args.since, dt.datetime.now(dt.UTC).date())
    except DurationError as exc:
        print(f"tracejudge export: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    db = Path(args.db or os.environ.get("TRACEJUDGE_DB") or "tracejudge.duckdb")
    out = Path(args.to)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        targets = {table: confined(out, f"{table}.parquet") for table in ("scores", "conversations")}
    except OutputPathError as exc:
        print(f"tracejudge export: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        with duckdb.connect(str(db), read_only=True) as con:
            for table, column in (("scores", "scored_at"), ("conversations", "assembled_at")):
                target = targets[table]
                quoted = str(target).replace("'", "''")
                con.execute(f"COPY (SELECT * FROM {table} WHERE {column} >= DATE '{since.isoformat()}') "
                            f"TO '{quoted}' (FORMAT parquet)")
                [(rows,)] = con.execute(f"SELECT count(*) FROM read_parquet('{quoted}')").fetchall()
                written.append(f"{target} ({rows} rows)")
    except duckdb.Error as exc:
        print(f"tracejudge export: cannot export from {db}: {exc}; stop the collector first if it holds the file",
              file=sys.stderr)
        return EXIT_FAIL
    print("wrote " + ", ".join(written))
    return EXIT_PASS
