"""Assembly benchmark: CPU per conversation that the assembler rebuilds and writes, alone on this machine.

Stores `--requests` requests of `bench/ingest.py` (512 agent-shaped spans each, 8 spans per trace, 8 traces per
conversation, random trace ids) through a real span store, then has the real assembler take every waiting
conversation, 256 per call as it does in `tracejudge serve` (`--per-call`): read the spans back, map them
(`build_conversations`) and write the versions and their scoring jobs. Prints CPU and wall time per conversation,
the best of `--repeat` runs. `--stored-spans N` first stores N spans of other conversations, received a day before
(`--stored-ago 30m`: half an hour) and not waiting: what a conversation costs should not grow with them.
`--assembled-before N` first writes N rows of traces assembled before (`assembled_traces`, as days of traffic leave
it, written over the day before; none of them the bench's) and a version of each of their conversations (8 traces
each), and times making the index beside the file from them.
`--going-on`: each conversation has an earlier trace, assembled ten minutes before (its row is looked up by
conversation and replaced). `--sdk-resource`: each request's resource is what an SDK in a container sends (about
1 KB of JSON; `bench/ingest.py`'s SDK_RESOURCE). `--assembly-workers 0 --call-validity` measures all of a
conversation's assembly in this one process, with the check `tracejudge serve` runs as it builds. Run: `python
bench/assembly.py [--requests 40] [--repeat 3] [--stored-spans 0] [--stored-ago 1d] [--assembled-before 0]
[--going-on] [--per-call 256] [--sdk-resource] [--assembly-workers N] [--call-validity] [--profile]`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime as dt
import io
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from bench.ingest import build_requests  # noqa: E402
from tracejudge.collector.config import Settings  # noqa: E402
from tracejudge.collector.durations import parse_duration  # noqa: E402
from tracejudge.collector.log import Logger  # noqa: E402
from tracejudge.collector.pipeline.assembly.conversation_assembler import MAX_PER_POLL, ConversationAssembler  # noqa: E402
from tracejudge.collector.receivers.span_rows import spans_to_arrow  # noqa: E402
from tracejudge.collector.store.assembled_index import AssembledIndex, index_bytes, index_path  # noqa: E402
from tracejudge.collector.store.span_store import SpanStore, mark_pandas_absent  # noqa: E402
from tracejudge.mapping import decode_otlp  # noqa: E402


def random_trace_ids(requests: list[bytes], seed: int) -> list[bytes]:
    """The requests with each trace id replaced by a random one, as real traffic has them (sequential ids would let
    DuckDB skip whole row groups by their min/max, which real ids never allow)."""
    rng, ids, out = random.Random(seed), {}, []
    for body in requests:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    span.trace_id = ids.setdefault(span.trace_id, rng.randbytes(16))
        out.append(request.SerializeToString())
    return out


def once(requests: list[bytes], stored: list[bytes], per_call: int, profile: cProfile.Profile | None,
         workers: int = -1, checks: tuple[str, ...] = (),
         stored_ago: dt.timedelta = dt.timedelta(days=1), assembled_before: int = 0,
         going_on: bool = False) -> tuple[int, float, float, float]:
    """(conversations, CPU seconds, wall seconds, seconds to make the index) of assembling everything the requests
    hold, after `stored`."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore(Path(tmp) / "bench.duckdb")
        store.open()
        settings = Settings()
        settings.conversations.assembly_workers = workers
        index = AssembledIndex(index_path(Path(tmp) / "bench.duckdb"), store.cursor())  # as `tracejudge serve` has it
        assembler = ConversationAssembler(store.cursor(), settings, Logger(stream=io.StringIO()),
                                          lambda metric: "pending", {m: "x" for m in settings.scoring.metrics},
                                          checks=checks, index=index)

        async def fill(bodies: list[bytes], ago: dt.timedelta) -> None:
            for body in bodies:
                spans = decode_otlp(body, "application/x-protobuf").spans
                await store.write(spans_to_arrow(spans, dt.datetime.now(dt.UTC) - ago))

        asyncio.run(fill(stored, stored_ago))  # received before the assembler listens: not waiting
        con = store.cursor()
        if assembled_before:  # the rows earlier assemblies leave, 8 traces a conversation (ids that never match)
            con.execute(
                "INSERT INTO assembled_traces BY NAME SELECT md5('bench-' || i) AS trace_id, 'bench-conv-' || (i // 8) "
                "AS conversation_id, now() - INTERVAL 1 DAY AS assembled_at, now() - INTERVAL 1 DAY AS "
                f"first_received_at, now() - INTERVAL 1 DAY + to_microseconds(i * 86400000000 // {assembled_before}) "
                f"AS marked_at FROM range({assembled_before}) t(i)")
            con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, assembled_at, "
                        "inclusion) SELECT 'bench-conv-' || i, 1, md5('bench-conv-' || i), 'complete', now() - "
                        f"INTERVAL 1 DAY, '{{}}' FROM range({assembled_before // 8}) t(i)")
        store.listeners.append(assembler.observe)
        asyncio.run(fill(requests, dt.timedelta()))
        if going_on:  # an earlier trace and version of each conversation, assembled ten minutes ago (no spans left)
            con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, assembled_at) "
                        "SELECT DISTINCT conversation_key, 1, 'earlier', 'complete', now() - INTERVAL 10 MINUTE "
                        "FROM span_records WHERE conversation_key IS NOT NULL")
            con.execute("INSERT INTO assembled_traces BY NAME SELECT md5('earlier-' || key) AS trace_id, key AS "
                        "conversation_id, now() - INTERVAL 10 MINUTE AS assembled_at, now() - INTERVAL 11 MINUTE AS "
                        "first_received_at, now() - INTERVAL 10 MINUTE AS marked_at FROM (SELECT DISTINCT "
                        "conversation_key AS key FROM span_records WHERE conversation_key IS NOT NULL)")
        con.execute("UPDATE assembled_index SET generation = generation + 1")  # as a change the index did not see
        started = time.perf_counter()
        index.follow()
        indexed = time.perf_counter() - started
        if assembled_before:
            print(f"the index made from {assembled_before:,} traces in {indexed:.1f} s: "
                  f"{index_bytes(Path(tmp) / 'bench.duckdb') / assembled_before:.0f} bytes a trace on disk")
        cpu, wall, total = time.process_time(), time.perf_counter(), 0
        if profile is not None:
            profile.enable()
        while done := assembler.assemble_due(True, per_call):
            total += done
        if profile is not None:
            profile.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        store.close()
        index.close()
    return total, cpu, wall, indexed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stored-spans", type=int, default=0, help="spans of other conversations stored first")
    parser.add_argument("--stored-ago", type=lambda text: dt.timedelta(seconds=parse_duration(text)),
                        default=dt.timedelta(days=1), metavar="DURATION",
                        help="how long before the conversations the stored spans were received (default 1d)")
    parser.add_argument("--assembled-before", type=int, default=0, metavar="TRACES",
                        help="rows of traces assembled before (assembled_traces), as days of traffic leave them")
    parser.add_argument("--going-on", action="store_true",
                        help="each conversation has an earlier trace, assembled ten minutes before")
    parser.add_argument("--per-call", type=int, default=MAX_PER_POLL,
                        help="conversations per assembler call (a trickle of conversations: 1)")
    parser.add_argument("--profile", action="store_true", help="print the 30 costliest calls (cumulative)")
    parser.add_argument("--sdk-resource", action="store_true", help="about 1 KB of resource per request, not 1 key")
    parser.add_argument("--assembly-workers", type=int, default=-1, help="[conversations] assembly_workers (default "
                        "one per core: the CPU measured is then the server's alone; 0: all of it, in this process)")
    parser.add_argument("--call-validity", action="store_true", help="check call validity as each conversation is "
                        "built, as `tracejudge serve` does")
    args = parser.parse_args()
    mark_pandas_absent()  # as `tracejudge serve` does
    stored = random_trace_ids(build_requests(args.stored_spans // 512, 512, sdk_resource=args.sdk_resource), 1)
    requests = random_trace_ids(build_requests(args.requests, 512, len(stored), args.sdk_resource), 2)
    profile = cProfile.Profile() if args.profile else None
    checks = ("mcp_call_validity",) if args.call_validity else ()
    runs = [once(requests, stored, args.per_call, profile, args.assembly_workers, checks, args.stored_ago,
                 args.assembled_before, args.going_on) for _ in range(args.repeat)]
    conversations, cpu, wall, indexed = min(runs, key=lambda r: r[1])
    print(f"{conversations} conversations of 64 spans{' going on' if args.going_on else ''}, {args.per_call} per "
          f"call, after {len(stored) * 512:,} stored spans received {args.stored_ago} before, "
          f"{args.assembled_before:,} traces assembled before: {cpu / conversations * 1000:.2f} ms CPU and "
          f"{wall / conversations * 1000:.2f} ms wall per conversation (best of {args.repeat}); the index made "
          f"from the table in {indexed:.1f} s")
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
