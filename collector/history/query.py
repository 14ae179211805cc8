"""Read-only SQL over the database: the admin API's `/api/query` and `tracejudge query` both run it here.

Only SELECT statements are accepted (checked on the parsed statements, not the text), reading only tracejudge's
own tables and views (an allowlist: DuckDB's catalog views, `pg_catalog` and `information_schema` tell where the
database and its secrets live) and the table functions in `TABLE_FUNCTIONS`; results are cut at a row limit and a
query running past the timeout is interrupted.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import duckdb

from tracejudge.collector.history.query_result import QueryResult
from tracejudge.collector.store.connection.arrow_reads import DUCKDB_MAJOR, drop_unfinished
from tracejudge.errors import TracejudgeError

DEFAULT_LIMIT = 10_000
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # a larger answer is cut (truncated: true), whatever the row limit


class QueryRefused(TracejudgeError):
    """The statement is not a single read-only SELECT."""


class QueryFailed(TracejudgeError):
    """DuckDB rejected or interrupted the query."""


# Functions a SELECT can call that change state or run other SQL.
SIDE_EFFECTS = frozenset({"nextval", "setval", "checkpoint", "force_checkpoint", "query", "query_table",
                          "enable_logging", "disable_logging", "truncate_duckdb_logs",
                          "enable_profiling", "disable_profiling",
                          # runs a serialized statement the parse tree here cannot see into
                          "json_execute_serialized_sql", "json_deserialize_sql"})
# Functions that read files (the database file, its WAL and temp files stay readable to DuckDB itself even
# with external access off) or tell where they are on the server.
FILES_AND_PATHS = frozenset({"read_blob", "read_text", "glob", "read_csv", "read_csv_auto", "read_json",
                             "read_json_auto", "read_json_objects", "read_json_objects_auto", "read_ndjson",
                             "read_ndjson_auto", "read_ndjson_objects", "read_parquet", "parquet_scan",
                             "parquet_metadata", "parquet_schema", "parquet_file_metadata", "parquet_kv_metadata",
                             "parquet_bloom_probe", "sniff_csv", "duckdb_databases", "duckdb_settings",
                             "current_setting", "duckdb_temporary_files", "duckdb_extensions", "duckdb_secrets",
                             "which_secret", "getenv", "pragma_database_list", "pragma_database_size",
                             "pragma_storage_info", "duckdb_log_contexts", "duckdb_logs"})


# The lake's catalog functions: postgres_execute/postgres_query run SQL on the catalog server, and the
# ducklake_* maintenance functions delete files; only the lake's read-only listings are allowed.
CATALOG_PREFIXES = ("postgres_", "ducklake_", "sqlite_", "mysql_")
LAKE_READS = frozenset({"ducklake_snapshots", "ducklake_table_info", "ducklake_table_changes",
                        "ducklake_table_insertions", "ducklake_table_deletions", "ducklake_list_files"})


def _function_names(node: Any) -> list[str]:
    names: list[str] = []
    if isinstance(node, dict):
        if node.get("class") == "FUNCTION" or node.get("type") == "FUNCTION":
            name = node.get("function_name")
            if isinstance(name, str):
                names.append(name.lower())
        if node.get("type") == "TABLE_FUNCTION" or "function" in node:
            inner = node.get("function")
            if isinstance(inner, dict) and isinstance(inner.get("function_name"), str):
                names.append(inner["function_name"].lower())
        for value in node.values():
            names += _function_names(value)
    elif isinstance(node, list):
        for value in node:
            names += _function_names(value)
    return names


# Table functions a query may read from: generating and unnesting, and the lake's read-only listings.
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest", "json_each", "json_tree"}) | LAKE_READS
# Where tracejudge's tables and views live: the database itself, or temporary views over replicas and the lake.
OWN_SCHEMAS = frozenset({"", "main", "temp"})


def _relations(node: Any, ctes: set[str], out: list[tuple[str, str, str]], functions: list[str]) -> None:
    """Every table the query names (catalog, schema, name) and every table function it calls; `ctes`: the names
    its WITH clauses define, which it may read. A SHOW without a query of its own (SHOW TABLES, SHOW DATABASES)
    reads the catalog: it counts as reading `show <what>`, which is never one of ours."""
    if isinstance(node, dict):
        if node.get("type") == "SHOW_REF" and not node.get("query"):
            out.append(("", "", f"show {str(node.get('table_name') or '').strip(chr(34))}"))
        for entry in (node.get("cte_map") or {}).get("map") or []:
            if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                ctes.add(entry["key"].lower())
        if node.get("type") == "BASE_TABLE":
            out.append((str(node.get("catalog_name") or "").lower(), str(node.get("schema_name") or "").lower(),
                        str(node.get("table_name") or "").lower()))
        elif node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
            functions.append(str(node["function"].get("function_name") or "").lower())
        for value in node.values():
            _relations(value, ctes, out, functions)
    elif isinstance(node, list):
        for value in node:
            _relations(value, ctes, out, functions)


def relations_read(parsed: Any) -> list[str]:
    """The tables and views a parsed statement reads (lower case, each once), not the names its WITH defines."""
    ctes: set[str] = set()
    named: list[tuple[str, str, str]] = []
    _relations(parsed, ctes, named, [])
    return list(dict.fromkeys(name for _, _, name in named if name not in ctes))


def parsed_query(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """DuckDB's parse tree of the statement, as JSON; QueryRefused when it has none (not a plain SELECT)."""
    try:
        [(tree,)] = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchall()
    except duckdb.Error as exc:
        raise QueryFailed(f"cannot parse the query: {exc}") from exc
    parsed = json.loads(tree)
    if not isinstance(parsed, dict) or parsed.get("error"):
        raise QueryRefused("the query could not be checked as read-only; only plain SELECT queries are accepted")
    return parsed


def _not_ours(con: duckdb.DuckDBPyConnection, parsed: Any) -> list[str]:
    """What the query reads that is not one of tracejudge's tables or views, nor one of its own WITH names."""
    ctes: set[str] = set()
    named: list[tuple[str, str, str]] = []
    functions: list[str] = []
    _relations(parsed, ctes, named, functions)
    own = {name.lower() for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE NOT internal UNION "
        "SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    # a WITH name is visible to the whole check, not only where it is defined: one that shadows anything DuckDB
    # could resolve (a catalog view, a table function) would let the same name elsewhere read the real thing
    shadowing = ctes & {name.lower() for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() UNION SELECT view_name FROM duckdb_views() UNION "
        "SELECT function_name FROM duckdb_functions()").fetchall()}
    shadowing |= {c for c in ctes if c.startswith(("pragma_", "duckdb_", "pg_", "sqlite_"))}
    if shadowing:
        raise QueryRefused(f"the WITH name(s) {', '.join(sorted(shadowing))} are also names of tables, views or "
                           "functions; rename them")
    foreign = [".".join(p for p in (catalog, schema, name) if p) for catalog, schema, name in named
               if not (catalog in ("", "temp") and schema in OWN_SCHEMAS and (name in own or name in ctes))]
    return foreign + [f"{f}()" for f in functions if f not in TABLE_FUNCTIONS]


def _file_tables(node: Any) -> set[str]:
    """Tables named like files in FROM (`FROM 'x.duckdb'`, `FROM 'dir/x.parquet'`): DuckDB reads the file."""
    found: set[str] = set()
    if isinstance(node, dict):
        if node.get("type") == "BASE_TABLE":
            name = str(node.get("table_name") or "")
            if "/" in name or "." in name or "\\" in name:
                found.add(f"the file {name!r}")
        for value in node.values():
            found |= _file_tables(value)
    elif isinstance(node, list):
        for value in node:
            found |= _file_tables(value)
    return found


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryFailed(f"cannot parse the query: {exc}") from exc
    if len(statements) != 1:
        raise QueryRefused(f"send exactly one statement, not {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryRefused(f"only read-only SELECT queries are accepted, not {kind.name}; "
                           "tracejudge's tables change only through the collector")
    parsed = parsed_query(con, sql)
    called = set(_function_names(parsed))
    refused = {f for f in called if f in SIDE_EFFECTS or (f.startswith(CATALOG_PREFIXES) and f not in LAKE_READS)}
    if refused:
        raise QueryRefused(f"the query calls {', '.join(sorted(refused))}, which changes the database or runs "
                           "SQL elsewhere; only read-only queries are accepted")
    files = sorted(called & FILES_AND_PATHS) + sorted(_file_tables(parsed))
    if files:
        raise QueryRefused(f"the query calls {', '.join(files)}, which reads files or server paths; query "
                           "tracejudge's tables and views instead")
    foreign = _not_ours(con, parsed)
    if foreign:
        raise QueryRefused(f"the query reads {', '.join(sorted(set(foreign))[:5])}, which is not one of tracejudge's "
                           "tables or views (spans, conversations, scores, latest_scores, daily_scores, mcp_calls, "
                           "eval_jobs, ...); only those can be queried")


def _size(value: Any) -> int:
    """Roughly what a cell costs in the JSON answer; strings and blobs dominate."""
    if isinstance(value, str | bytes):
        return len(value) + 2
    if isinstance(value, list | tuple):
        return sum(_size(v) for v in value) + 2
    if isinstance(value, dict):
        return sum(len(str(k)) + _size(v) for k, v in value.items()) + 2
    return 16


def _streamed(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[Any, list[str]]:
    """What the answer's rows are fetched from, a few at a time as they are made, and its columns (None and no
    columns for a statement with no answer). DuckDB 1.5 streams a relation's rows (`execute` makes all of them
    first); 2.0's relations have no `fetchmany`, and its `execute` streams."""
    if DUCKDB_MAJOR >= 2:
        con.execute(sql)
        return (con, [column[0] for column in con.description]) if con.description is not None else (None, [])
    relation = con.sql(sql)
    return (relation, list(relation.columns)) if relation is not None else (None, [])


def run_read_query(con: duckdb.DuckDBPyConnection, sql: str, limit: int = DEFAULT_LIMIT,
                   timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> QueryResult:
    """Rows of one read-only SELECT, cut at `limit` rows or about `max_bytes` of answer (then truncated)."""
    check_read_only(con, sql)
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    rows: list[list[Any]] = []
    truncated, total = False, 0
    source: Any = None
    try:
        source, columns = _streamed(con, sql)
        step = 1  # rows may be megabytes each: fetch one, then as many as the byte budget has room for
        while source is not None and not truncated:
            chunk = source.fetchmany(min(step, limit + 1 - len(rows)))
            if not chunk:
                break
            for row in chunk:
                total += sum(_size(v) for v in row)
                if len(rows) >= limit or total > max_bytes:
                    truncated = True
                    break
                rows.append(list(row))
            average = total // max(1, len(rows))
            step = max(1, min(1024, (max_bytes - total) // (4 * average + 1)))
    except duckdb.InterruptException as exc:
        raise QueryFailed(f"the query ran past {timeout_s:g} s and was stopped; narrow it down") from exc
    except duckdb.OutOfMemoryException as exc:
        raise QueryFailed(f"the query needs more memory than a query may use ([store] query_memory, memory_limit, "
                          f"temp_limit); narrow it down: {str(exc)[:300]}") from exc
    except duckdb.Error as exc:
        raise QueryFailed(str(exc)) from exc
    except UnicodeDecodeError as exc:  # DuckDB quoted raw file bytes in its error: no detail is worth sending
        raise QueryFailed("the query failed; query tracejudge's tables and views") from exc
    finally:
        timer.cancel()
        if source is con:  # DuckDB 2: a statement cut off holds the connection until it is ended
            with contextlib.suppress(duckdb.Error):
                drop_unfinished(con)
    return QueryResult(columns, rows, truncated)
