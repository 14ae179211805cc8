"""What the assembler's index of waiting traces costs in memory, per trace, as the quiet window fills.

Feeds the real `ConversationAssembler.observe` the committed tables it gets in the collector (4,096 one-span
traces per commit, ids and keys as new strings each time, as Arrow hands them over) and reads the Python memory
the index then holds with `tracemalloc`: trace ids and conversation keys included. Two shapes: traces that carry
no conversation key (each its own conversation) and traces keyed `gen_ai.conversation.id`, eight to a
conversation. Run: `python bench/waiting_index.py [--traces 200000]`; against older code, copy this file into a
worktree of it.

`--cpu` times `observe` instead, on the span writer's thread's share of each commit: CPU ms per commit of one and of
four of `bench/ingest.py`'s requests (512 agent spans each, 64 traces, 8 conversations), built by the receivers'
`spans_to_arrow` as a commit hands them over, the fastest of `--repeat` runs on a fresh assembler each.

    python bench/waiting_index.py --cpu [--repeat 30]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import sys
import time
import tracemalloc
from pathlib import Path

import duckdb
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracejudge.collector.config import Settings  # noqa: E402
from tracejudge.collector.log import Logger  # noqa: E402
from tracejudge.collector.pipeline.assembly.conversation_assembler import ConversationAssembler  # noqa: E402
from tracejudge.collector.store.schema import migrate  # noqa: E402

COMMIT = 4096


def commits(traces: int, per_conversation: int | None) -> list[pa.Table]:
    """The committed tables: one span per trace, keyed `per_conversation` traces to a conversation (None: none)."""
    attributes = json.dumps({"gen_ai.operation.name": "chat"})
    now = dt.datetime.now(dt.UTC)
    out = []
    for start in range(0, traces, COMMIT):
        ids = range(start, min(start + COMMIT, traces))
        keys = [f"conv-{i // per_conversation:08d}" for i in ids] if per_conversation else [None] * len(ids)
        out.append(pa.table({
            "trace_id": [f"{i:032x}" for i in ids],
            "conversation_key": pa.array(keys, pa.string()),
            "conversation_key_source": pa.array(["gen_ai.conversation.id" if k else None for k in keys], pa.string()),
            "attributes": [attributes] * len(ids),
            "received_at": pa.array([now] * len(ids), pa.timestamp("us", tz="UTC")),
        }))
    return out


def bytes_per_trace(traces: int, per_conversation: int | None) -> float:
    tables = commits(traces, per_conversation)
    con = duckdb.connect()
    migrate(con)
    assembler = ConversationAssembler(con, Settings(), Logger(stream=io.StringIO()),
                                      lambda metric: "pending", {})
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for table in tables:
        assembler.observe(table)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert assembler.pending_traces() == traces
    return held / traces


def observe_cpu_ms(requests: int, repeat: int) -> float:
    """CPU ms of one `observe` of a commit of `requests` of bench/ingest.py's requests, the fastest of `repeat`."""
    from bench.ingest import as_received, build_requests

    now = dt.datetime.now(dt.UTC)
    table = pa.concat_tables([as_received(body, now).spans for body in build_requests(requests, 512)])
    best = float("inf")
    for _ in range(repeat):
        con = duckdb.connect()
        migrate(con)
        assembler = ConversationAssembler(con, Settings(), Logger(stream=io.StringIO()), lambda metric: "pending", {})
        started = time.thread_time()
        assembler.observe(table)
        best = min(best, time.thread_time() - started)
        con.close()
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=200_000)
    parser.add_argument("--cpu", action="store_true", help="time observe's CPU per commit instead of the memory")
    parser.add_argument("--repeat", type=int, default=30, help="with --cpu: runs; the fastest is printed")
    args = parser.parse_args()
    if args.cpu:
        for requests in (1, 4):
            print(f"observe, a commit of {requests} request(s) of 512 agent spans: "
                  f"{observe_cpu_ms(requests, args.repeat):.3f} ms CPU (best of {args.repeat})")
        return
    for label, per in (("no conversation key (each trace its own conversation)", None),
                       ("keyed, 8 traces to a conversation", 8)):
        print(f"{label}: {bytes_per_trace(args.traces, per):,.0f} bytes per waiting trace, ids and keys included "
              f"({args.traces:,} traces)")


if __name__ == "__main__":
    main()
