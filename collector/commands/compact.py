"""`tracejudge compact`: rewrite the database file so the space retention freed goes back to the filesystem."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import duckdb

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.store.connection.database_file import connect_file
from tracejudge.collector.store.durable_files import fsync_path


def run(args: argparse.Namespace) -> int:
    path = Path(args.db or os.environ.get("TRACEJUDGE_DB") or "tracejudge.duckdb")
    if not path.is_file():
        print(f"tracejudge compact: there is no database file {path}", file=sys.stderr)
        return EXIT_BAD_INPUT
    fresh, backup = path.with_name(path.name + ".compact"), path.with_name(path.name + ".bak")
    if backup.exists():
        print(f"tracejudge compact: {backup} exists (a kept backup, or an interrupted run): move it away first",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    for leftover in (fresh, Path(str(fresh) + ".wal")):
        leftover.unlink(missing_ok=True)  # an interrupted earlier run
    try:
        con = connect_file(path)
    except duckdb.Error as exc:
        print(f"tracejudge compact: cannot open {path} ({exc}); stop the collector first", file=sys.stderr)
        return EXIT_FAIL
    before = path.stat().st_size + _size(Path(str(path) + ".wal"))
    try:
        con.execute("CHECKPOINT")
        con.execute(f"ATTACH '{_quoted(str(fresh))}' AS fresh")
        [(source,)] = con.execute("SELECT current_database()").fetchall()
        con.execute(f"COPY FROM DATABASE \"{source}\" TO fresh")
        con.execute("DETACH fresh")
    except duckdb.Error as exc:
        fresh.unlink(missing_ok=True)
        print(f"tracejudge compact: the copy failed, {path} is unchanged: {exc}", file=sys.stderr)
        return EXIT_FAIL
    finally:
        con.close()
    fsync_path(fresh)
    wal = Path(str(path) + ".wal")
    if wal.exists():  # checkpointed and closed, it should be gone; never let it replay onto the new file
        os.replace(wal, Path(str(backup) + ".wal"))
    os.link(path, backup)  # the old file stays reachable; the database path is never missing
    os.replace(fresh, path)  # one atomic swap
    fsync_path(path.parent)
    if not args.keep_backup:
        backup.unlink()
        Path(str(backup) + ".wal").unlink(missing_ok=True)
    after = path.stat().st_size
    print(f"compacted {path}: {before:,} -> {after:,} bytes" + (f" (old file kept as {backup})"
                                                                if args.keep_backup else ""))
    return EXIT_PASS


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _quoted(text: str) -> str:
    return text.replace("'", "''")
