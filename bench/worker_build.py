"""What an assembly worker spends on a conversation: `build_batch` alone (map, compose, call validity, the rows
written beside it), on rows read back from a real span store as the assembler reads them, with the workers' GC
settings. No database, no server, no other process: the figure moves only with the building code, so it compares
two versions of it where `bench/pipeline_pace.py` (the whole pipeline, on a machine whose speed moves by a third
within the hour) cannot. Prints the best of `--repeat` runs, in CPU ms per conversation; pin it to one core
(`taskset -c 1`) and run the versions in turn.

    python bench/worker_build.py [--requests 64] [--repeat 7]
    python bench/worker_build.py --instructions [--requests 4]
    python bench/worker_build.py --read [--requests 64]
    python bench/worker_build.py --stages [--requests 64]

`--read` times only the reading: the batch's rows made Python values 2,048 at a time, as a worker reads them from
the server's file (`span_columns.ColumnFile`, no pyarrow) against pyarrow's `to_pylist` on the same table.

`--stages` times each step of building apart (`time_stages`): where a worker's CPU goes.

`--instructions` counts instead of timing: the instructions `build_batch` executes per conversation, under valgrind's
callgrind (Debian's `valgrind`; about a minute). The count does not move with the machine's load, so it tells apart
changes of a few percent that timings on a shared machine cannot (an instruction is not a nanosecond: confirm a
gain by time as well).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.assembly import random_trace_ids  # noqa: E402
from bench.ingest import as_received, build_requests  # noqa: E402
from tracejudge.collector.pipeline.assembly import conversation_builder  # noqa: E402
from tracejudge.collector.pipeline.assembly.conversation_builder import (  # noqa: E402
    ROWS_AT_ONCE,
    BuildConfig,
    build_batch,
)
from tracejudge.collector.pipeline.assembly.span_columns import (  # noqa: E402
    ArrowColumns,
    ColumnFile,
    SpanColumns,
    write_columns,
)
from tracejudge.collector.pipeline.sampling import attribute_values, model_usage  # noqa: E402
from tracejudge.collector.store.span_store import SpanStore  # noqa: E402
from tracejudge.mapping import compose_conversation, map_traces  # noqa: E402
from tracejudge.mapping.stored_spans import STORED_COLUMNS, latest_copies, stored_spans  # noqa: E402


def stored_batch(requests: int) -> tuple:
    """`bench/ingest.py`'s conversations stored and read back as the assembler reads a batch: (rows, conversation ->
    its traces, scopes, resources)."""
    bodies = random_trace_ids(build_requests(requests, 512), 2)
    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore(Path(tmp) / "build.duckdb")
        store.open()
        try:
            async def fill() -> None:
                for body in bodies:
                    await store.write(as_received(body, dt.datetime.now(dt.UTC)))

            asyncio.run(fill())
            con = store.cursor()
            # the select of the code measured (older code cast received_at itself, from SPAN_COLUMNS)
            select = getattr(conversation_builder, "SPAN_SELECT", None) or ", ".join(conversation_builder.SPAN_COLUMNS)
            table = con.execute(f"SELECT {select} FROM span_records").to_arrow_table()
            keys = con.execute("SELECT trace_id, any_value(json_extract_string(attributes, "
                               "'$.\"gen_ai.conversation.id\"')) FROM spans GROUP BY trace_id ORDER BY 1").fetchall()
            scopes = {i: (n, v) for i, n, v in
                      con.execute("SELECT scope_id, name, version FROM span_scopes").fetchall()}
            resources = {i: json.loads(a) for i, a in
                         con.execute("SELECT resource_id, attributes FROM span_resources").fetchall()}
        finally:
            store.close()
    conversations: dict[str, list[str]] = {}
    for trace, key in keys:
        conversations.setdefault(key, []).append(trace)
    return table, conversations, scopes, resources


CONFIG = BuildConfig(checks=("mcp_call_validity",))
COUNTED_RUNS = (1, 3)  # builds under callgrind: the difference is two builds, without start-up and imports


def build_saved(folder: Path, runs: int) -> None:
    """In the process callgrind counts: the batch `count_instructions` saved, built `runs` times."""
    conversations, scopes, resources = pickle.loads((folder / "rest.pickle").read_bytes())
    gc.set_threshold(100_000, 50, 100)
    with ColumnFile(folder / "rows.columns") as columns:
        for _ in range(runs):
            build_batch(columns, conversations, scopes, resources, CONFIG)


def count_instructions(requests: int) -> None:
    """Instructions per conversation of `build_batch`: callgrind's totals of `COUNTED_RUNS` builds, subtracted."""
    if shutil.which("valgrind") is None:
        sys.exit("--instructions runs valgrind's callgrind: install it (apt-get install valgrind)")
    table, conversations, scopes, resources = stored_batch(requests)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_columns(table, folder / "rows.columns")
        (folder / "rest.pickle").write_bytes(pickle.dumps((conversations, scopes, resources)))
        totals = []
        for runs in COUNTED_RUNS:
            done = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder / 'callgrind.out'}",
                 sys.executable, __file__, "--build-saved", str(folder), str(runs)],
                capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False)
            found = re.search(r"Collected : (\d+)", done.stderr)
            if done.returncode or found is None:
                sys.exit(f"callgrind failed: {done.stderr[-2000:]}")
            totals.append(int(found.group(1)))
    per = (totals[1] - totals[0]) / (COUNTED_RUNS[1] - COUNTED_RUNS[0]) / len(conversations)
    print(f"{len(conversations)} conversations of 64 spans: build_batch {per / 1e6:.3f} M instructions per "
          f"conversation (callgrind)")


def time_reads(table: object, conversations: int, repeat: int) -> None:
    """CPU ms per conversation to make a batch's rows Python values as `rows_by_conversation` does, from the
    worker's file and through pyarrow, best of `repeat` each."""
    def read(columns: SpanColumns) -> None:
        for start in range(0, columns.num_rows, ROWS_AT_ONCE):
            for name in STORED_COLUMNS:
                columns.values(name, start, start + ROWS_AT_ONCE)

    with tempfile.TemporaryDirectory() as tmp:
        write_columns(table, Path(tmp) / "rows.columns")
        with ColumnFile(Path(tmp) / "rows.columns") as file:
            best = {}
            for label, columns in (("file", file), ("pyarrow", ArrowColumns(table))):
                times = []
                for _ in range(repeat):
                    started = time.process_time()
                    read(columns)
                    times.append(time.process_time() - started)
                best[label] = min(times) / conversations * 1000
                print(f"{conversations} conversations of 64 spans: read through {label} {best[label]:.3f} ms CPU per "
                      f"conversation (best of {repeat})")
    print(f"ratio, the worker's file to pyarrow's to_pylist: {best['file'] / best['pyarrow']:.2f}x")


STAGES = ("rows", "stored_spans", "map_traces", "sampling", "compose", "call_summary", "call_validity")


def time_stages(columns: SpanColumns, conversations: dict[str, list[str]], scopes: object, resources: object,
                repeat: int) -> None:
    """CPU ms per conversation of each step `build_batch` takes, the fastest of `repeat` runs each: the rows made
    Python values and grouped (`rows_by_conversation`), each trace's spans made (`stored_spans`, the attributes'
    JSON parsed) and mapped (`map_traces`), the sampling filters' values and token usage, composing (the test case
    built, validated and dumped as JSON), the UI's call summary and call validity. A mapped conversation is composed
    once a run, as a worker does (composed again, a trace keeps the turns it built)."""
    best = dict.fromkeys(STAGES, float("inf"))
    for _ in range(repeat):
        spent = dict.fromkeys(STAGES, 0.0)

        def timed(stage: str, work: Any, *args: Any, spent: dict[str, float] = spent, **kwargs: Any) -> Any:
            started = time.process_time()
            out = work(*args, **kwargs)
            spent[stage] += time.process_time() - started
            return out

        gc.collect()
        grouped = timed("rows", lambda: list(conversation_builder.rows_by_conversation(columns, conversations)))
        for conversation_id, by_trace in grouped:
            mapped = []
            for trace in conversations[conversation_id]:
                spans = timed("stored_spans", stored_spans, latest_copies(by_trace[trace]), scopes, resources)
                mapped.append(timed("map_traces", map_traces, spans)[0])
                timed("sampling", lambda s=spans: (attribute_values(CONFIG.attribute_keys, s), model_usage(s)))
            conversation = timed("compose", compose_conversation, mapped, mcp_tools={}, copy_values=False)
            timed("call_summary", conversation_builder._calls, conversation.test_case)
            timed("call_validity", conversation_builder._check, "mcp_call_validity", conversation.test_case, CONFIG)
        for stage in STAGES:
            best[stage] = min(best[stage], spent[stage])
    count = len(conversations)
    print(f"{count} conversations of 64 spans, CPU ms per conversation by step (best of {repeat} each): "
          + ", ".join(f"{stage} {best[stage] / count * 1000:.3f}" for stage in STAGES)
          + f"; sum {sum(best.values()) / count * 1000:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=None,
                        help="exports of 512 spans (8 conversations each; default 64, 4 with --instructions)")
    parser.add_argument("--repeat", type=int, default=7, help="runs; the fastest is printed")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under valgrind's callgrind instead of timing")
    parser.add_argument("--read", action="store_true", help="time reading the batch's rows only: the worker's "
                        "file against pyarrow's to_pylist")
    parser.add_argument("--stages", action="store_true", help="time each step of building apart (rows, spans, "
                        "mapping, sampling values, composing, call summary, call validity)")
    parser.add_argument("--build-saved", nargs=2, metavar=("FOLDER", "RUNS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_saved:
        build_saved(Path(args.build_saved[0]), int(args.build_saved[1]))
        return
    if args.instructions:
        count_instructions(args.requests or 4)
        return
    table, conversations, scopes, resources = stored_batch(args.requests or 64)
    gc.set_threshold(100_000, 50, 100)  # as every worker process runs (`collector/worker_process.py`)
    if args.read:
        time_reads(table, len(conversations), args.repeat)
        return
    if args.stages:
        with tempfile.TemporaryDirectory() as tmp:
            write_columns(table, Path(tmp) / "rows.columns")
            with ColumnFile(Path(tmp) / "rows.columns") as columns:
                time_stages(columns, conversations, scopes, resources, args.repeat)
        return
    best = float("inf")
    with tempfile.TemporaryDirectory() as tmp:  # read as a worker reads its batch: from the file the server wrote
        write_columns(table, Path(tmp) / "rows.columns")
        with ColumnFile(Path(tmp) / "rows.columns") as columns:
            for _ in range(args.repeat):
                gc.collect()
                started = time.process_time()
                result = build_batch(columns, conversations, scopes, resources, CONFIG)
                best = min(best, time.process_time() - started)
                if len(result.built) != len(conversations) or result.failed:
                    sys.exit(f"{len(result.failed)} conversations failed to build: "
                             f"{next(iter(result.failed.values()))}")
    print(f"{len(conversations)} conversations of 64 spans: build_batch {best / len(conversations) * 1000:.3f} ms "
          f"CPU per conversation (best of {args.repeat})")


if __name__ == "__main__":
    main()
