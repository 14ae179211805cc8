"""What a checkpoint costs as a keyed table grows. While DuckDB checkpoints, every commit waits, the span writer's
too, and so do the exports in it: a checkpoint's length is a pause in ingest. DuckDB 1.5 rewrites a table's whole
PRIMARY KEY index at a checkpoint that follows inserts into it, so that pause grows with the table, not with what
was written since the last one.

For each size, a fresh database file holds a table shaped like `assembled_traces` (trace_id, conversation_id,
assembled_at; the collector writes 8 rows a conversation), with the PRIMARY KEY on trace_id it had until schema 27
and without it, filled to that many rows of random trace ids and checkpointed; then `--rounds` times a poll's write of
4,096 rows (what one assembler poll of 512 conversations adds: INSERT OR REPLACE into the keyed table; into the
unkeyed one, the traces' earlier rows deleted and the new ones inserted in one transaction, as the assembler does
now) and a CHECKPOINT. Prints the median checkpoint and the median write, with the key and without.

Then whether a checkpoint holds a commit that only appends to a table with no index (what the span writer's
commits would be without `span_resources`' and `span_scopes`' keys): a thread commits 512 span-like rows every
20 ms while another connection's cursor checkpoints about 80 MB of WAL; prints the checkpoint's length and the
longest commit meanwhile.

    python bench/checkpoint_cost.py [--sizes 100000,400000,1600000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa

POLL_ROWS = 4096  # the rows one assembler poll adds: 512 conversations of 8 traces
FILL_ROWS = 65_536  # rows inserted per statement while filling


def rows(count: int) -> pa.Table:
    ids = [uuid.uuid4().hex for _ in range(count)]
    now = dt.datetime.now(dt.UTC)
    return pa.table({"trace_id": ids, "conversation_id": [i[:16] for i in ids],
                     "assembled_at": pa.array([now] * count, pa.timestamp("us", tz="UTC"))})


def checkpoints(size: int, keyed: bool, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds of each poll's write and of the CHECKPOINT after it, in a table of `size` rows: keyed, the write is
    the INSERT OR REPLACE the assembler used; unkeyed, the delete of the traces' earlier rows and the insert, in one
    transaction, that it uses now."""
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(str(Path(tmp) / "bench.duckdb"))
        con.execute("CREATE TABLE assembled_traces (trace_id VARCHAR" + (" PRIMARY KEY" if keyed else "") +
                    ", conversation_id VARCHAR NOT NULL, assembled_at TIMESTAMPTZ NOT NULL)")
        for start in range(0, size, FILL_ROWS):
            batch = rows(min(FILL_ROWS, size - start))  # noqa: F841 - read by name in the statement
            con.execute("INSERT INTO assembled_traces SELECT * FROM batch")
        con.execute("CHECKPOINT")
        writes, out = [], []
        for _ in range(rounds):
            batch = rows(POLL_ROWS)  # noqa: F841
            started = time.perf_counter()
            if keyed:
                con.execute("INSERT OR REPLACE INTO assembled_traces SELECT * FROM batch")
            else:
                con.execute("BEGIN TRANSACTION")
                con.execute("DELETE FROM assembled_traces WHERE trace_id IN (SELECT trace_id FROM batch)")
                con.execute("INSERT INTO assembled_traces SELECT * FROM batch")
                con.execute("COMMIT")
            writes.append(time.perf_counter() - started)
            started = time.perf_counter()
            con.execute("CHECKPOINT")
            out.append(time.perf_counter() - started)
        con.close()
    return writes, out


def commit_during_checkpoint() -> tuple[float, float]:
    """(seconds the CHECKPOINT took, the longest insert-only commit into an unindexed table while it ran)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = duckdb.connect(str(Path(tmp) / "bench.duckdb"), config={"checkpoint_threshold": "10GB"})
        db.execute("CREATE TABLE spans (trace_id VARCHAR, body VARCHAR)")
        body = "x" * 600  # about what a span's attributes take

        def batch(count: int) -> pa.Table:
            return pa.table({"trace_id": [uuid.uuid4().hex for _ in range(count)],
                             "body": [body + uuid.uuid4().hex for _ in range(count)]})

        for _ in range(60):
            fill = batch(2048)  # noqa: F841 - read by name in the statement
            db.execute("INSERT INTO spans SELECT * FROM fill")
        commits: list[tuple[float, float]] = []  # (ended at, seconds)
        done = threading.Event()

        def writer() -> None:
            cursor = db.cursor()
            while not done.is_set():
                rows = batch(512)  # noqa: F841
                started = time.perf_counter()
                cursor.execute("BEGIN TRANSACTION")
                cursor.execute("INSERT INTO spans SELECT * FROM rows")
                cursor.execute("COMMIT")
                commits.append((time.perf_counter(), time.perf_counter() - started))
                time.sleep(0.02)

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(0.5)
        started = time.perf_counter()
        db.cursor().execute("CHECKPOINT")
        ended = time.perf_counter()
        time.sleep(0.3)
        done.set()
        thread.join()
        db.close()
    return ended - started, max(took for at, took in commits if at >= started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda text: [int(v) for v in text.split(",")],
                        default=[100_000, 400_000, 1_600_000], help="table sizes, in rows (comma-separated)")
    parser.add_argument("--rounds", type=int, default=5, help="checkpoints timed per size")
    args = parser.parse_args()
    print(f"DuckDB {duckdb.__version__}; {POLL_ROWS:,} rows added before each checkpoint, median of {args.rounds}")
    print("        rows  checkpoint: with PRIMARY KEY  without  ratio   a poll's write: keyed  unkeyed")
    for size in args.sizes:
        keyed_writes, keyed = (statistics.median(v) for v in checkpoints(size, True, args.rounds))
        plain_writes, plain = (statistics.median(v) for v in checkpoints(size, False, args.rounds))
        print(f"{size:12,}  {keyed * 1000:25.0f} ms  {plain * 1000:4.0f} ms  {keyed / plain:5.1f}x  "
              f"{keyed_writes * 1000:19.1f} ms  {plain_writes * 1000:5.1f} ms")
    checkpoint, longest = commit_during_checkpoint()
    print(f"a checkpoint of about 80 MB of WAL took {checkpoint * 1000:.0f} ms; the longest insert-only commit into "
          f"an unindexed table while it ran took {longest * 1000:.0f} ms")


if __name__ == "__main__":
    main()
