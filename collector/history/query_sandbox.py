"""Users' SQL (`/api/query`) in a process of its own, so no query can take the collector's memory.

DuckDB builds some values outside its `memory_limit` (`SELECT repeat('x', 600000000)` took the collector from 166
MB to 2.5 GB and left 677 MB held), so the query runs in a child process with its own address-space cap
(RLIMIT_DATA: what malloc and anonymous maps may take; the memory-mapped tables below do not count) and is
killed and reported when it needs more. DuckDB does not open a file that another process writes, so the
collector copies what the query reads, in one read transaction (a consistent snapshot), as Arrow IPC files in a
temporary folder: each table the query names, or that a view it names reads, streamed in record batches (the
collector's memory stays at a batch). The child maps them without copying, recreates the views over them, runs
the same read-only checks and limits as the collector (`query.run_read_query`) and writes the JSON answer.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from collector.history.query import (
    DEFAULT_TIMEOUT_S,
    QueryFailed,
    QueryRefused,
    check_read_only,
    parsed_query,
    relations_read,
)

DEFAULT_MEMORY = 1024 * 1024 * 1024
_VIEW_HEAD = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+|TEMPORARY\s+)?VIEW\s+.+?\s+AS\s+",
                        re.IGNORECASE | re.DOTALL)
BATCH_ROWS = 8192


def base_tables(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The tables the query reads, directly or through views, and the views it needs (name, CREATE statement),
    each view after the views it reads."""
    views = {name.lower(): (name, text) for name, text in con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()}
    tables: list[str] = []
    needed: list[tuple[str, str]] = []
    seen: set[str] = set()

    def visit(statement: str) -> None:
        for name in relations_read(parsed_query(con, statement)):
            if name in seen:
                continue
            seen.add(name)
            if name in views:
                view, text = views[name]
                visit(_VIEW_HEAD.sub("", text, count=1).rstrip().rstrip(";"))
                needed.append((view, text))
            else:
                tables.append(name)

    visit(sql)
    return tables, needed


def export_tables(con: duckdb.DuckDBPyConnection, tables: list[str], folder: Path) -> dict[str, str]:
    """Each table as an Arrow IPC file, all read in one transaction, streamed a batch at a time."""
    files: dict[str, str] = {}
    con.execute("BEGIN TRANSACTION")
    try:
        for table in tables:
            path = folder / f"{len(files)}.arrow"
            reader = con.execute(f'SELECT * FROM "{table}"').fetch_record_batch(BATCH_ROWS)
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
            files[table] = str(path)
    finally:
        con.execute("COMMIT")
    return files


def run_sandboxed(con: duckdb.DuckDBPyConnection, sql: str, limit: int, memory: int = DEFAULT_MEMORY,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    """The JSON answer of one read-only SELECT run in a child process capped at `memory` bytes; QueryRefused or
    QueryFailed as `run_read_query` raises them, and QueryFailed naming the cap when the child needs more."""
    check_read_only(con, sql)
    tables, views = base_tables(con, sql)
    with tempfile.TemporaryDirectory(prefix="tracejudge-query-") as folder:
        files = export_tables(con, tables, Path(folder))
        request = json.dumps({"sql": sql, "limit": limit, "timeout_s": timeout_s, "tables": files,
                              "views": views, "memory": memory}).encode()
        child = subprocess.Popen([sys.executable, "-m", "collector.history.query_sandbox"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            answer, errors = child.communicate(request, timeout=timeout_s + 30)
        except subprocess.TimeoutExpired as exc:
            child.kill()
            child.communicate()
            raise QueryFailed(f"the query ran past {timeout_s:g} s and was stopped; narrow it down") from exc
    if child.returncode == 0:
        return answer
    if child.returncode == 3:
        failure = json.loads(answer)
        raise (QueryRefused if failure["kind"] == "refused" else QueryFailed)(failure["error"])
    raise QueryFailed(f"the query needed more than the {memory // 2**20} MB a query may use ([store] query_memory) "
                      f"and was stopped; narrow it down (exit {child.returncode}: "
                      f"{errors.decode(errors='replace').strip().splitlines()[-1:] or ''})")


def _child() -> int:
    """The child's whole job: the tables mapped, the views made, the query run, its JSON answer on stdout."""
    import orjson

    from collector.history.query import run_read_query

    request: dict[str, Any] = json.loads(sys.stdin.buffer.read())
    memory = int(request["memory"])
    # from here on its heap and anonymous maps may not pass the cap (the mapped tables are file pages: not counted)
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    con = duckdb.connect(":memory:", config={"memory_limit": f"{memory // 2 // 2**20}MB", "threads": 1})
    for n, (table, path) in enumerate(request["tables"].items()):
        con.register(f"arrow_{n}", pa.ipc.open_file(pa.memory_map(path)).read_all())
        con.execute(f'CREATE TEMP VIEW "{table}" AS SELECT * FROM arrow_{n}')  # listed as one of its own views
    for _, text in request["views"]:
        con.execute(re.sub(r"^\s*CREATE\s+(TEMP\s+|TEMPORARY\s+)?VIEW", "CREATE TEMP VIEW", text, count=1,
                           flags=re.IGNORECASE))
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    try:
        payload = run_read_query(con, request["sql"], request["limit"], request["timeout_s"]).to_json()
    except (QueryRefused, QueryFailed) as exc:
        kind = "refused" if isinstance(exc, QueryRefused) else "failed"
        sys.stdout.buffer.write(json.dumps({"kind": kind, "error": str(exc)}).encode())
        return 3
    except MemoryError:
        return 4
    try:
        sys.stdout.buffer.write(orjson.dumps(payload, default=str))
    except orjson.JSONEncodeError:  # integers past 64 bits (HUGEINT)
        sys.stdout.buffer.write(json.dumps(payload, default=str, ensure_ascii=False).encode())
    return 0


if __name__ == "__main__":
    sys.exit(_child())
