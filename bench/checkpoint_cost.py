"""What a checkpoint costs as a keyed table grows. While DuckDB checkpoints, every commit waits, the span writer's
too, and so do the exports in it: a checkpoint's length is a pause in ingest. DuckDB 1.5 rewrites a table's whole
PRIMARY KEY index at a checkpoint that follows inserts into it, so that pause grows with the table, not with what
was written since the last one.

For each size, a fresh database file holds a table shaped like `assembled_traces` (trace_id VARCHAR PRIMARY KEY,
conversation_id VARCHAR, assembled_at TIMESTAMPTZ; the collector writes 8 rows a conversation), filled to that many
rows of random trace ids and checkpointed; then `--rounds` times 4,096 new rows (what one assembler poll of 512
conversations adds) and a CHECKPOINT. Prints the median
checkpoint, with the PRIMARY KEY and without, and their ratio.

    python bench/checkpoint_cost.py [--sizes 100000,400000,1600000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
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


def checkpoints(size: int, keyed: bool, rounds: int) -> list[float]:
    """Seconds of each CHECKPOINT after a poll's rows, in a table of `size` rows."""
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(str(Path(tmp) / "bench.duckdb"))
        con.execute("CREATE TABLE assembled_traces (trace_id VARCHAR" + (" PRIMARY KEY" if keyed else "") +
                    ", conversation_id VARCHAR NOT NULL, assembled_at TIMESTAMPTZ NOT NULL)")
        for start in range(0, size, FILL_ROWS):
            batch = rows(min(FILL_ROWS, size - start))  # noqa: F841 - read by name in the statement
            con.execute("INSERT INTO assembled_traces SELECT * FROM batch")
        con.execute("CHECKPOINT")
        out = []
        for _ in range(rounds):
            batch = rows(POLL_ROWS)  # noqa: F841
            con.execute("INSERT INTO assembled_traces SELECT * FROM batch")
            started = time.perf_counter()
            con.execute("CHECKPOINT")
            out.append(time.perf_counter() - started)
        con.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda text: [int(v) for v in text.split(",")],
                        default=[100_000, 400_000, 1_600_000], help="table sizes, in rows (comma-separated)")
    parser.add_argument("--rounds", type=int, default=5, help="checkpoints timed per size")
    args = parser.parse_args()
    print(f"DuckDB {duckdb.__version__}; {POLL_ROWS:,} rows added before each checkpoint, median of {args.rounds}")
    print("        rows  with PRIMARY KEY  without  ratio")
    for size in args.sizes:
        keyed = statistics.median(checkpoints(size, True, args.rounds))
        plain = statistics.median(checkpoints(size, False, args.rounds))
        print(f"{size:12,}  {keyed * 1000:13.0f} ms  {plain * 1000:4.0f} ms  {keyed / plain:5.1f}x")


if __name__ == "__main__":
    main()
