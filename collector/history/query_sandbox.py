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

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from tracejudge.collector.history.query import (
    DEFAULT_TIMEOUT_S,
    QueryFailed,
    QueryRefused,
    check_read_only,
    parsed_query,
    relations_read,
)
from tracejudge.collector.store.connection.arrow_reads import arrow_batches

DEFAULT_MEMORY = 1024 * 1024 * 1024
DEFAULT_DISK = 2 * 1024 * 1024 * 1024
# What the child gets of the collector's environment: no tokens or API keys
CHILD_ENVIRONMENT = ("PATH", "PYTHONPATH", "HOME", "LANG", "LC_ALL", "TZ", "VIRTUAL_ENV")
_VIEW_HEAD = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+|TEMPORARY\s+)?VIEW\s+.+?\s+AS\s+",
                        re.IGNORECASE | re.DOTALL)
BATCH_ROWS = 8192


@dataclass(frozen=True)
class SandboxLimits:
    """What one query may take: memory in its process, disk for the copy of its tables and its own spill (one
    budget), and time for both; `folder`: where the copies go (next to the database: on its disk, not a tmpfs)."""

    memory: int = DEFAULT_MEMORY
    disk: int = DEFAULT_DISK
    timeout_s: float = DEFAULT_TIMEOUT_S
    folder: Path | None = None


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


def export_tables(con: duckdb.DuckDBPyConnection, tables: list[str], folder: Path,
                  limits: SandboxLimits) -> tuple[dict[str, str], int]:
    """Each table as an Arrow IPC file, all read in one transaction, streamed a batch at a time, and the bytes
    written; QueryFailed when the copies pass the disk budget or the time limit (checked after every batch)."""
    files: dict[str, str] = {}
    written, deadline = 0, time.monotonic() + limits.timeout_s
    con.execute("BEGIN TRANSACTION")
    try:
        for table in tables:
            path = folder / f"{len(files)}.arrow"
            # closed however the copy ends: DuckDB 2 refuses the connection's next statement (the ROLLBACK below)
            # while a reader is open
            with arrow_batches(con, f'SELECT * FROM "{table}"', batch_rows=BATCH_ROWS) as reader, \
                    pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    written += batch.nbytes
                    if written > limits.disk:
                        raise QueryFailed(f"the tables this query reads ({', '.join(tables)}) come to more than "
                                          f"the {limits.disk // 2**20} MB a query may copy ([store] temp_limit): "
                                          "query the archive or the lake for that much, or raise the limit")
                    if time.monotonic() > deadline:
                        raise QueryFailed(f"copying the tables this query reads took past {limits.timeout_s:g} s; "
                                          "query the archive or the lake for that much")
            files[table] = str(path)
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # a failed read already ended the transaction
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return files, written


def run_sandboxed(con: duckdb.DuckDBPyConnection, sql: str, limit: int,
                  limits: SandboxLimits = SandboxLimits()) -> bytes:  # noqa: B008 - frozen
    """The JSON answer of one read-only SELECT run in a child process within `limits`; QueryRefused or QueryFailed
    as `run_read_query` raises them, and QueryFailed naming the limit when the copy or the child passes one."""
    check_read_only(con, sql)
    tables, views = base_tables(con, sql)
    with tempfile.TemporaryDirectory(prefix="tracejudge-query-", dir=limits.folder) as folder:
        try:
            files, copied = export_tables(con, tables, Path(folder), limits)
        except (duckdb.Error, OSError) as exc:
            raise QueryFailed(f"the tables this query reads could not be copied for it ({type(exc).__name__}: "
                              f"{str(exc)[:200]})") from exc
        spill = max(2**20, limits.disk - copied)  # the copies and the query's own spill share one budget
        request = json.dumps({"sql": sql, "limit": limit, "timeout_s": limits.timeout_s, "tables": files,
                              "views": views, "memory": limits.memory, "spill": spill,
                              "spill_folder": folder}).encode()
        env = {k: v for k, v in os.environ.items() if k in CHILD_ENVIRONMENT} | {"PYTHONUNBUFFERED": "1"}
        child = subprocess.Popen([sys.executable, "-m", "tracejudge.collector.history.query_sandbox"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            answer, errors = child.communicate(request, timeout=limits.timeout_s + 30)
        except subprocess.TimeoutExpired as exc:
            child.kill()
            child.communicate()
            raise QueryFailed(f"the query ran past {limits.timeout_s:g} s and was stopped; narrow it down") from exc
    return _outcome(child.returncode, answer, errors, limits)


def _outcome(code: int, answer: bytes, errors: bytes, limits: SandboxLimits) -> bytes:
    """The answer of a child that succeeded; the error it reported, or what its exit says, as QueryFailed."""
    if code == 0:
        return answer
    if code == 3:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            failure = json.loads(answer)
            raise (QueryRefused if failure["kind"] == "refused" else QueryFailed)(str(failure["error"]))
    last = errors.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
    if code in (4, -signal.SIGKILL) or "MemoryError" in last[0] or "bad_alloc" in last[0]:
        raise QueryFailed(f"the query needed more than the {limits.memory // 2**20} MB a query may use ([store] "
                          "query_memory) and was stopped; narrow it down")
    if code < 0:  # DuckDB may crash rather than raise when malloc fails at the cap
        raise QueryFailed(f"the query's process stopped (signal {-code}), most likely at the {limits.memory // 2**20} "
                          "MB a query may use ([store] query_memory); narrow it down")
    raise QueryFailed(f"the query's process failed (exit {code}: {last[0][:200]}); narrow the query down")


def _child() -> int:
    """The child's whole job: the tables mapped, the views made, the query run, its JSON answer on stdout."""
    import orjson

    from tracejudge.collector.history.query import run_read_query

    request: dict[str, Any] = json.loads(sys.stdin.buffer.read())
    memory = int(request["memory"])
    # from here on its heap and anonymous maps may not pass the cap (the mapped tables are file pages: not counted)
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    con = duckdb.connect(":memory:", config={
        "memory_limit": f"{memory // 2 // 2**20}MB", "threads": 1, "temp_directory": request["spill_folder"],
        "max_temp_directory_size": f"{int(request['spill']) // 2**20}MB"})
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
