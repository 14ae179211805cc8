"""Conversations that go on: CPU of each new version as a conversation grows, with and without the trace cache.

A chat whose turns come minutes apart gets a trace per turn, each after the last was assembled. `--conversations`
conversations each get `--turns` turns, one trace of 8 agent-shaped spans (`bench/ingest.py`'s, random trace ids)
per turn; after each round of turns the real assembler, on a real span store, writes every conversation's next
version. Prints the CPU per version at a few turn counts, with `[conversations] trace_cache` at its default (earlier
traces' mapped turns kept) and at 0 (every earlier trace read back and mapped again), and their ratio. The cost of a
version should follow its new trace, not the conversation's length (the composed test case itself still grows).
`--cache-memory` instead measures what the kept traces really hold (tracemalloc, with an unbounded cache) against
the cache's estimate of them (`collector/pipeline/assembly/mapped_traces.py`'s TEXT_FACTOR).
Run: `python bench/conversation_growth.py [--conversations 64] [--turns 40] [--cache-memory]`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import io
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from bench.ingest import as_received, build_requests  # noqa: E402
from tracejudge.collector.config import Settings  # noqa: E402
from tracejudge.collector.log import Logger  # noqa: E402
from tracejudge.collector.pipeline.assembly.conversation_assembler import ConversationAssembler  # noqa: E402
from tracejudge.collector.pipeline.assembly.mapped_traces import MappedTraceCache  # noqa: E402
from tracejudge.collector.store.span_store import SpanStore, mark_pandas_absent  # noqa: E402


def turn_request(conversation: int, turn: int, rng: random.Random) -> bytes:
    """One turn of a conversation: a trace of 8 spans under a new random trace id, keyed to the conversation."""
    [body] = build_requests(1, 8, offset=turn)
    request = ExportTraceServiceRequest.FromString(body)
    trace_id = rng.randbytes(16)
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                span.trace_id = trace_id
                for attribute in span.attributes:
                    if attribute.key == "gen_ai.conversation.id":
                        attribute.value.string_value = f"conv-{conversation:06d}"
    return request.SerializeToString()


def run(conversations: int, turns: int, trace_cache: int, measure_cache: bool = False) -> list[float]:
    """CPU seconds per conversation version, for each turn count 1..turns; with `measure_cache`, prints the
    memory the kept traces hold against the cache's estimate instead."""
    rng = random.Random(7)
    per_turn = []
    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore(Path(tmp) / "bench.duckdb")
        store.open()
        settings = Settings()
        settings.conversations.trace_cache = trace_cache
        assembler = ConversationAssembler(store.cursor(), settings, Logger(stream=io.StringIO()),
                                          lambda metric: "pending", {m: "x" for m in settings.scoring.metrics})
        store.listeners.append(assembler.observe)

        async def fill(bodies: list[bytes]) -> None:
            for body in bodies:
                await store.write(as_received(body, dt.datetime.now(dt.UTC)))

        for turn in range(turns):
            asyncio.run(fill([turn_request(c, turn, rng) for c in range(conversations)]))
            cpu, done = time.process_time(), 0
            while assembled := assembler.assemble_due(True):
                done += assembled
            per_turn.append((time.process_time() - cpu) / max(done, 1))
        if measure_cache:
            gc.collect()
            held, (entries, estimate) = tracemalloc.get_traced_memory()[0], (len(assembler.cache), assembler.cache.size)
            assembler.cache = MappedTraceCache(0)
            gc.collect()
            measured = held - tracemalloc.get_traced_memory()[0]
            print(f"{entries:,} traces kept: {measured / 1e6:.1f} MB measured, {estimate / 1e6:.1f} MB estimated "
                  f"({measured / max(entries, 1):,.0f} against {estimate / max(entries, 1):,.0f} bytes a trace, "
                  f"{measured / max(estimate, 1):.2f}x)")
        store.close()
    return per_turn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--cache-memory", action="store_true", help="measure the kept traces' memory instead")
    args = parser.parse_args()
    mark_pandas_absent()  # as `tracejudge serve` does
    if args.cache_memory:
        tracemalloc.start()
        run(args.conversations, args.turns, 10**12, measure_cache=True)
        return
    default = Settings().conversations.trace_cache
    kept = run(args.conversations, args.turns, default)
    again = run(args.conversations, args.turns, 0)
    shown = sorted({1, 2, 5, 10, 20, args.turns} & set(range(1, args.turns + 1)))
    print(f"{args.conversations} conversations, one 8-span trace per turn; ms of CPU per version:")
    print(f"{'turns':>6} {'cache ' + str(default // 1_000_000) + 'MB':>12} {'cache 0':>10} {'ratio':>7}")
    for turn in shown:
        k, a = kept[turn - 1] * 1000, again[turn - 1] * 1000
        print(f"{turn:>6} {k:>12.2f} {a:>10.2f} {a / k:>6.2f}x")
    print(f"growth from turn 1 to {args.turns}: cache {kept[-1] / kept[0]:.2f}x, no cache {again[-1] / again[0]:.2f}x")


if __name__ == "__main__":
    main()
