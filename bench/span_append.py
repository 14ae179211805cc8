"""What the span table's design costs the writer, measured in DuckDB alone on one connection.

1. Appends of 4,096-row Arrow tables (the spans of `bench/ingest.py`'s requests, decoded as the collector
   decodes them) into `spans` with the old primary key on (trace_id, span_id) and without it (schema 7), per
   block of rows as the table grows: CPU per row and rows/s.
2. A set of trace ids handed to a query as a Python list parameter (`IN (SELECT unnest(?))`, how the assembler
   used to pass them) and as a registered Arrow table (`collector/store/connection/id_table.py`, how it does now).
3. The writer's settings (`--writer-settings`): DuckDB's default threads vs `threads = 1`, and the JSON columns
   sent as plain strings (DuckDB parses each value) vs Arrow's JSON extension type (taken as they are), each
   variant appending the same 4,096-row tables, interleaved and repeated.
4. The request digests each commit records (`--request-digests`): `INSERT OR REPLACE` into the keyed table of
   schema 10 vs a plain `INSERT` into the unkeyed one of schema 11, 4 digests per commit over 20,000 kept ones.
5. The WAL's checkpoints (`--checkpoints`): commit latency of the same appends at each `checkpoint_threshold`
   (the commit that crosses it waits for the checkpoint), and with the checkpoint run by another thread instead.
6. The largest commit (`--largest-commit`): one transaction appending 16 to 256 MB of JSON text into a table
   under the collector's 96 MB `memory_limit` on one thread, each in a fresh file: which commit, which fail
   (what `[limits] request_row_bytes` is sized by).
7. The span writer's cost per commit (`--commit-overhead`): the real `SpanStore` (no checkpoint within the run)
   committing `bench/ingest.py`'s requests one a commit (as at half load, where each export commits alone) and eight
   a commit (as at full speed): the writer's busy time per commit and per request. Compare versions of the writer by
   running it on each in turn.
Run: `python bench/span_append.py [--blocks 8] [--block-rows 204800] [--ids 60000] [--writer-settings]
[--request-digests] [--checkpoints] [--largest-commit] [--commit-overhead]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from dataclasses import astuple
from pathlib import Path

import duckdb
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import as_received, build_requests  # noqa: E402
from tracejudge.collector.receivers.span_rows import (
    decode_to_arrow,  # noqa: E402
    plain_strings,  # noqa: E402
)
from tracejudge.collector.store.connection.id_table import id_table  # noqa: E402
from tracejudge.collector.store.schema import SPANS_COLUMNS  # noqa: E402
from tracejudge.mapping.otlp import DEFAULT_LIMITS  # noqa: E402

BATCH = 4096


def _rows(request: bytes) -> pa.Table:
    """The rows the collector stores for a request (the Python decoder's: the same rows as the C walk's)."""
    return decode_to_arrow(request, "application/x-protobuf", None, "traces", astuple(DEFAULT_LIMITS),
                           time.time_ns() // 1000)[0]


def appends(keyed: bool, blocks: int, block_rows: int, tmp: Path) -> list[tuple[float, float]]:
    con = duckdb.connect(str(tmp / f"{'keyed' if keyed else 'unkeyed'}.duckdb"), config={"memory_limit": "256MB"})
    key = ", PRIMARY KEY (trace_id, span_id)" if keyed else ""
    con.execute(f"CREATE TABLE spans ({SPANS_COLUMNS}{key})")
    con.execute("SET checkpoint_threshold = '256MB'")
    insert = "INSERT OR IGNORE INTO spans SELECT * FROM t" if keyed else "INSERT INTO spans SELECT * FROM t"
    out = []
    for block in range(blocks):
        per_block = block_rows // BATCH
        tables = [_rows(r)
                  for r in build_requests(per_block, BATCH, block * per_block)]
        wall, cpu = time.perf_counter(), time.process_time()
        for t in tables:
            con.execute("BEGIN")
            con.register("t", t)
            con.execute(insert)
            con.unregister("t")
            con.execute("COMMIT")
        rows = sum(t.num_rows for t in tables)
        out.append((rows / (time.perf_counter() - wall), (time.process_time() - cpu) / rows * 1e6))
    con.close()
    return out


def _plain_json_columns(table: pa.Table) -> pa.Table:
    """The table as the writer got it before: JSON columns as plain strings."""
    return pa.table([plain_strings(col) for col in table.columns], names=table.column_names)


def writer_settings(tmp: Path, tables: int = 60, rounds: int = 3) -> None:
    """CPU and wall time per appended row for each writer setting, interleaved so drift hits all alike."""
    base = pa.concat_tables([_rows(r)
                             for r in build_requests(BATCH // 512, 512)])
    variants = {"threads default, JSON as strings": (None, _plain_json_columns(base)),
                "threads default, JSON extension": (None, base),
                "threads = 1, JSON as strings": (1, _plain_json_columns(base)),
                "threads = 1, JSON extension": (1, base)}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for n in range(rounds):
        for v, (name, (threads, table)) in enumerate(variants.items()):
            con = duckdb.connect(str(tmp / f"writer-{n}-{v}.duckdb"),
                                 config={"memory_limit": "256MB"})
            con.execute(f"CREATE TABLE spans ({SPANS_COLUMNS})")
            con.execute("SET checkpoint_threshold = '256MB'")
            if threads:
                con.execute(f"SET threads = {threads}")
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(tables):
                con.execute("BEGIN")
                con.register("t", table)
                con.execute("INSERT INTO spans SELECT * FROM t")
                con.unregister("t")
                con.execute("COMMIT")
            rows = tables * table.num_rows
            results[name].append(((time.process_time() - cpu) / rows * 1e6, (time.perf_counter() - wall) / rows * 1e6))
            con.close()
    first = None
    for name, runs in results.items():
        cpu = sum(c for c, _ in runs) / len(runs)
        wall = sum(w for _, w in runs) / len(runs)
        first = first or cpu
        print(f"{name:34s} {cpu:5.2f} µs CPU/row, {wall:5.2f} µs wall/row ({cpu / first:.2f}x the CPU of the first)")


def request_digests(tmp: Path, commits: int = 2000, per_commit: int = 4) -> None:
    """CPU and wall time per commit of recording the request digests, keyed (before) and unkeyed (now)."""
    for label, key, insert in (("primary key, INSERT OR REPLACE (schema 10)", " PRIMARY KEY", "INSERT OR REPLACE"),
                               ("no key, INSERT (schema 11)", "", "INSERT")):
        con = duckdb.connect(str(tmp / f"digests-{bool(key)}.duckdb"))
        con.execute("SET threads = 1")
        con.execute(f"CREATE TABLE ingest_requests (digest BLOB NOT NULL{key}, received_at TIMESTAMPTZ NOT NULL)")
        con.execute("INSERT INTO ingest_requests SELECT md5(i::VARCHAR)::BLOB, now() FROM range(20000) t(i)")
        now = int(time.time() * 1e6)  # microseconds since the epoch, as the timestamp column stores them
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(commits):
            rows = pa.table({"digest": pa.array([os.urandom(16) for _ in range(per_commit)], pa.binary()),
                             "received_at": pa.array([now] * per_commit, pa.timestamp("us", tz="UTC"))})
            con.execute("BEGIN")
            con.register("r", rows)
            con.execute(f"{insert} INTO ingest_requests SELECT * FROM r")
            con.unregister("r")
            con.execute("COMMIT")
        print(f"{label:44s} {(time.process_time() - cpu) / commits * 1e3:.2f} ms CPU, "
              f"{(time.perf_counter() - wall) / commits * 1e3:.2f} ms wall per commit")
        con.close()


def _commit_latencies(con: duckdb.DuckDBPyConnection, tables: list[pa.Table],
                      commits: int) -> tuple[float, list[float]]:
    """Append `commits` tables in a transaction each, as the span writer does: (wall s, sorted latencies s)."""
    latencies = []
    started = time.perf_counter()
    for n in range(commits):
        began = time.perf_counter()
        con.execute("BEGIN")
        con.register("t", tables[n % len(tables)])
        con.execute("INSERT INTO spans SELECT * FROM t")
        con.unregister("t")
        con.execute("COMMIT")
        latencies.append(time.perf_counter() - began)
    return time.perf_counter() - started, sorted(latencies)


def checkpoints(tmp: Path, rows: int = 1_638_400, per_commit: int = 2048) -> None:
    """Longest and p99 commit latency, and rows/s, per checkpoint threshold; then a checkpointing thread."""
    tables = [_rows(r) for r in build_requests(16, per_commit, 0)]
    commits = rows // per_commit
    variants = [(f"checkpoint_threshold {t}", t, False) for t in ("16MB", "32MB", "64MB", "256MB")]
    variants.append(("64MB checkpoints from another thread", "100GB", True))
    for n, (label, threshold, background) in enumerate(variants):
        path = tmp / f"checkpoints-{n}.duckdb"
        con = duckdb.connect(str(path), config={"memory_limit": "128MB", "threads": 1})
        con.execute(f"CREATE TABLE spans ({SPANS_COLUMNS})")
        con.execute("SET checkpoint_threshold = ?", [threshold])
        done = threading.Event()
        pauses: list[float] = []

        def checkpointer(con: duckdb.DuckDBPyConnection = con, wal: Path = Path(f"{path}.wal"),
                         done: threading.Event = done, pauses: list[float] = pauses) -> None:
            cursor = con.cursor()
            while not done.wait(0.01):
                if wal.exists() and wal.stat().st_size > 64 * 2**20:
                    began = time.perf_counter()
                    cursor.execute("CHECKPOINT")
                    pauses.append(time.perf_counter() - began)

        thread = threading.Thread(target=checkpointer) if background else None
        if thread:
            thread.start()
        wall, latencies = _commit_latencies(con, tables, commits)
        done.set()
        if thread:
            thread.join()
        p50 = latencies[len(latencies) // 2]
        print(f"{label:38s} {commits * per_commit / wall:9,.0f} rows/s; commit p50 {p50 * 1000:6.1f} ms, "
              f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:7.1f} ms, longest {latencies[-1] * 1000:7.1f} ms"
              + (f"; {len(pauses)} checkpoints of {sum(pauses) / len(pauses):.2f} s" if pauses else ""))
        con.close()


def id_sets(count: int) -> tuple[float, float]:
    con = duckdb.connect()
    con.execute("CREATE TABLE spans AS SELECT md5(i::VARCHAR) AS trace_id FROM range(1000000) t(i)")
    ids = [r[0] for r in con.execute(f"SELECT trace_id FROM spans USING SAMPLE {count} ROWS").fetchall()]
    cpu = time.process_time()
    con.execute("SELECT count(*) FROM spans WHERE trace_id IN (SELECT unnest(?))", [ids]).fetchall()
    as_list = time.process_time() - cpu
    cpu = time.process_time()
    with id_table(con, ids) as name:
        con.execute(f"SELECT count(*) FROM spans WHERE trace_id IN (SELECT id FROM {name})").fetchall()
    return as_list, time.process_time() - cpu


def largest_commit(tmp: Path, memory_limit: str = "96MB") -> None:
    """Part 6: a commit of N MB of JSON text (2,000 rows) within the buffer pool, or its error."""
    for mb in (16, 32, 48, 64, 96, 128, 256):
        with duckdb.connect(str(tmp / f"commit{mb}.duckdb")) as con:
            con.execute(f"SET memory_limit = '{memory_limit}'")
            con.execute("SET threads = 1")
            con.execute("CREATE TABLE t (k VARCHAR, j JSON)")
            text = '"' + "x" * (mb * 2**20 // 2000) + '"'
            rows = pa.table({"k": pa.array(["k"] * 2000), "j": pa.array([text] * 2000, pa.json_(pa.string()))})
            started = time.perf_counter()
            try:
                con.execute("BEGIN TRANSACTION")
                con.register("rows", rows)
                con.execute("INSERT INTO t SELECT * FROM rows")
                con.execute("COMMIT")
                outcome = f"committed in {time.perf_counter() - started:.2f} s"
            except duckdb.Error as exc:
                outcome = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:110]}"
        print(f"{mb:4d} MB of JSON text in one commit under memory_limit {memory_limit}: {outcome}")


def commit_overhead(folder: Path, requests: int = 400, rounds: int = 2) -> None:
    """The span writer's busy time per commit of 1 and of 8 requests of 512 spans (part 7)."""
    import asyncio
    import datetime as dt
    import hashlib

    from tracejudge.collector.store.span_store import SpanStore

    now = dt.datetime.now(dt.UTC)
    rows = [as_received(body, now) for body in build_requests(requests, 512)]
    store = SpanStore(folder / "commits.duckdb", checkpoint_threshold="4GB")
    store.open()
    try:
        for run in range(rounds):
            for group in (1, 8):
                async def send(group: int = group, run: int = run) -> None:
                    for start in range(0, len(rows), group):
                        await asyncio.gather(*[
                            store.write(r, hashlib.sha256(f"{run}-{group}-{start + i}".encode()).digest())
                            for i, r in enumerate(rows[start:start + group])])

                busy, commits = store.stats.busy_s, store.stats.commits
                asyncio.run(send())
                busy, commits = store.stats.busy_s - busy, store.stats.commits - commits
                print(f"{group} request(s) of 512 spans a commit: {commits} commits, the writer busy "
                      f"{busy / commits * 1000:.2f} ms a commit, {busy / len(rows) * 1000:.2f} ms a request")
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block-rows", type=int, default=204_800)
    parser.add_argument("--ids", type=int, default=60_000)
    parser.add_argument("--writer-settings", action="store_true", help="only compare the writer's settings (part 3)")
    parser.add_argument("--request-digests", action="store_true", help="only compare the digest table (part 4)")
    parser.add_argument("--checkpoints", action="store_true", help="only compare checkpoint thresholds (part 5)")
    parser.add_argument("--commit-rows", type=int, default=2048, help="rows per commit in part 5")
    parser.add_argument("--largest-commit", action="store_true", help="only the largest commit the pool holds (6)")
    parser.add_argument("--commit-overhead", action="store_true", help="only the span writer's cost per commit (7)")
    args = parser.parse_args()
    if args.commit_overhead:
        with tempfile.TemporaryDirectory() as tmp:
            commit_overhead(Path(tmp))
        return
    if args.largest_commit:
        with tempfile.TemporaryDirectory() as tmp:
            largest_commit(Path(tmp))
        return
    if args.checkpoints:
        with tempfile.TemporaryDirectory() as tmp:
            checkpoints(Path(tmp), per_commit=args.commit_rows)
        return
    if args.request_digests:
        with tempfile.TemporaryDirectory() as tmp:
            request_digests(Path(tmp))
        return
    if args.writer_settings:
        with tempfile.TemporaryDirectory() as tmp:
            writer_settings(Path(tmp))
        return
    with tempfile.TemporaryDirectory() as tmp:
        keyed = appends(True, args.blocks, args.block_rows, Path(tmp))
        unkeyed = appends(False, args.blocks, args.block_rows, Path(tmp))
    for block, ((k_rate, k_cpu), (u_rate, u_cpu)) in enumerate(zip(keyed, unkeyed, strict=True)):
        print(f"rows {block * args.block_rows:>9,}+: primary key {k_cpu:5.1f} µs CPU/row ({k_rate:8,.0f} rows/s); "
              f"none {u_cpu:5.1f} µs CPU/row ({u_rate:8,.0f} rows/s); {k_cpu / u_cpu:.2f}x")
    mean = [sum(c for _, c in runs) / len(runs) for runs in (keyed, unkeyed)]
    print(f"mean CPU per row over {args.blocks * args.block_rows:,} rows: primary key {mean[0]:.1f} µs, none "
          f"{mean[1]:.1f} µs ({mean[0] / mean[1]:.2f}x)")
    as_list, as_arrow = id_sets(args.ids)
    print(f"{args.ids:,} trace ids into a query over 1,000,000 rows: Python list parameter {as_list * 1000:,.0f} ms "
          f"CPU, Arrow table {as_arrow * 1000:,.0f} ms CPU ({as_list / as_arrow:.0f}x)")


if __name__ == "__main__":
    pa.set_cpu_count(1)
    main()
