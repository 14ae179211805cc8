"""Mapping benchmark: spans/s through decode_otlp + build_conversations on the real-instrumentation fixtures.

Each fixture in tests/fixtures/real/ is copied N times with fresh trace ids and conversation ids, so the
mapping sees many independent conversations of the shapes real libraries produce.
Run: `python bench/mapping.py [--copies 300] [--repeat 5]` (the best of the repeats is printed). To compare
with an older commit: `git worktree add /tmp/before <commit>`, copy `tests/fixtures/real/*.otlp.json` into it,
and run both alternately on one core (`taskset -c 1`).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracejudge.mapping import build_conversations, decode_otlp  # noqa: E402

REAL = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "real"
INSTANCE = re.compile(r'("key":\s*"service\.instance\.id",\s*"value":\s*\{\s*"stringValue":\s*")([^"]*)"')


def copies(text: str, n: int) -> list[bytes]:
    """n versions of one OTLP/JSON request, each with its own trace ids and conversation ids."""
    body = json.loads(text)
    traces = sorted({s["traceId"] for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]})
    out = []
    for i in range(n):
        copy = text
        for t in traces:
            copy = copy.replace(t, f"{i:08x}{t[8:]}")
        copy = copy.replace("conv-weather-", f"conv-{i:06d}-").replace("conv-fw-", f"conv-fw-{i:06d}-")
        copy = copy.replace("conv-shop-", f"conv-shop-{i:06d}-")
        copy = INSTANCE.sub(lambda m, i=i: f'{m.group(1)}{m.group(2)}-{i}"', copy)  # each copy its own processes
        out.append(copy.encode())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1, help="runs per fixture; the fastest is printed")
    args = parser.parse_args()
    gc.set_threshold(100_000, 50, 100)  # as the collector runs
    for fixture in sorted(REAL.glob("*.otlp.json")):
        if fixture.name.endswith(".logs.otlp.json"):  # log records: no spans of their own to time
            continue
        requests = copies(fixture.read_text(), args.copies)
        best_decode = best_build = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            spans = [s for r in requests for s in decode_otlp(r, "application/json").spans]
            decoded = time.perf_counter()
            conversations = build_conversations(spans)
            built = time.perf_counter()
            best_decode, best_build = min(best_decode, decoded - started), min(best_build, built - decoded)
        n = len(spans)
        print(f"{fixture.name:28} {n:>8,} spans -> {len(conversations):>5} conversations: "
              f"decode {n / best_decode:>9,.0f} spans/s, build {n / best_build:>9,.0f} spans/s, "
              f"both {n / (best_decode + best_build):>9,.0f} spans/s")

if __name__ == "__main__":
    main()
