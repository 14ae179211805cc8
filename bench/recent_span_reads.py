"""What the assembler's span read costs on spans committed seconds before, by DuckDB's pool size and checkpoint
threshold. `bench/ingest.py`'s spans (random trace ids) are written through a real span store one request (512 spans)
a commit, received a second apart, none checkpointed unless the WAL reaches `--checkpoint-threshold`. After the
first half, and then each time another `1/(2 * --repeat)` of them is written, the assembler's read is made as
`tracejudge serve` makes it while ingest goes on: the spans of the 2,000 traces (16,000 spans) received one after
another just before the last `--lag` requests (the conversations that went quiet while newer spans kept coming),
read back into Arrow with their ids registered, in a transaction, bounded below by their first span's receipt (so
the read scans from there to the newest span). Prints the CPU of the reading thread (the collector's `read` stage
counts the same) at fastest and median, the WAL's size and DuckDB's temporary files once everything is written.
Run it with either DuckDB (`PYTHONPATH=DIR` where DIR holds another version) to compare them:

    python bench/recent_span_reads.py [--requests 750] [--repeat 9] [--lag 64] [--memory-limit 96MB]
        [--checkpoint-threshold 256MB]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402

from bench.assembly import random_trace_ids  # noqa: E402
from bench.ingest import as_received, build_requests  # noqa: E402
from tracejudge.collector.pipeline.assembly.conversation_builder import SPAN_SELECT  # noqa: E402
from tracejudge.collector.store.connection.arrow_reads import arrow_table  # noqa: E402
from tracejudge.collector.store.connection.id_table import id_table  # noqa: E402
from tracejudge.collector.store.span_store import SpanStore  # noqa: E402
from tracejudge.collector.store.span_tables import SpanRows  # noqa: E402

TRACES_PER_READ = 2_000  # 16,000 spans: the most the assembler reads back at once (SPANS_PER_READ)


def temporary_mb(con: duckdb.DuckDBPyConnection) -> int:
    [(size,)] = con.execute("SELECT coalesce(sum(size), 0) FROM duckdb_temporary_files()").fetchall()
    return int(size) >> 20


def read_quiet(con: duckdb.DuckDBPyConnection, traces: list[str], since: dt.datetime) -> tuple[float, int]:
    """The assembler's read of these traces' spans: the reading thread's CPU seconds and the rows read."""
    started = time.thread_time()
    con.execute("BEGIN TRANSACTION")
    try:
        with id_table(con, traces) as ids:
            rows = arrow_table(con, f"SELECT {SPAN_SELECT} FROM span_records WHERE received_at >= ? AND trace_id IN "
                                    f"(SELECT id FROM {ids})", [since]).num_rows
    finally:
        con.execute("ROLLBACK")
    return time.thread_time() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=750, help="exports of 512 spans written")
    parser.add_argument("--repeat", type=int, default=9, help="reads, spread over the second half of the writing")
    parser.add_argument("--lag", type=int, default=64, help="requests written after the traces read")
    parser.add_argument("--memory-limit", default="96MB", help="[store] memory_limit")
    parser.add_argument("--checkpoint-threshold", default="256MB", help="[store] checkpoint_threshold")
    args = parser.parse_args()
    bodies = random_trace_ids(build_requests(args.requests, 512), 2)
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    batches: list[SpanRows] = [as_received(body, start + dt.timedelta(seconds=n)) for n, body in enumerate(bodies)]
    traces_of = [list(dict.fromkeys(batch.spans.column("trace_id").to_pylist())) for batch in batches]
    read_after = sorted({len(batches) // 2 + (len(batches) - len(batches) // 2) * k // args.repeat
                         for k in range(args.repeat)})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reads.duckdb"
        store = SpanStore(path, memory_limit=args.memory_limit, checkpoint_threshold=args.checkpoint_threshold,
                          threads=1)
        store.open()
        try:
            con = store.cursor()
            took: list[float] = []
            rows = 0

            async def write_and_read() -> None:
                nonlocal rows
                for n, batch in enumerate(batches, 1):
                    await store.write(batch)
                    if n not in read_after or n <= args.lag:
                        continue
                    chosen: list[str] = []
                    first = n - args.lag  # the newest request read; older ones until 2,000 traces
                    while len(chosen) < TRACES_PER_READ and first > 0:
                        first -= 1
                        chosen = traces_of[first] + chosen
                    cpu, rows = read_quiet(con, chosen[-TRACES_PER_READ:], start + dt.timedelta(seconds=first))
                    took.append(cpu)

            started = time.perf_counter()
            asyncio.run(write_and_read())
            wall = time.perf_counter() - started
            wal = Path(f"{path}.wal")
            print(f"DuckDB {duckdb.__version__}, memory_limit {args.memory_limit}, checkpoint_threshold "
                  f"{args.checkpoint_threshold}: {len(batches) * 512:,} spans written and read in {wall:.1f} s; a read "
                  f"of {rows:,} spans, {args.lag} requests behind the newest: {min(took) * 1000:.1f} ms of CPU at "
                  f"fastest, {statistics.median(took) * 1000:.1f} median ({len(took)} reads); then "
                  f"{(wal.stat().st_size if wal.exists() else 0) >> 20} MB of WAL and {temporary_mb(con)} MB in "
                  f"DuckDB's temporary files")
        finally:
            store.close()


if __name__ == "__main__":
    main()
