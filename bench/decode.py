"""Where ingest time goes, on one core: decode_otlp, redaction, the Arrow columns, and the DuckDB append.

Decoding is measured with Python's default GC thresholds, with the collector's (gen-0 100,000) and with GC
off, on the same pre-built requests as bench/ingest.py; then the `[redaction]` step with the builtin rules,
the Arrow columns, a decode worker's whole job per request, and the memory a decode worker process takes just
to import its code. Run: `python bench/decode.py [--requests 40]`.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import astuple
from datetime import UTC, datetime
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import build_requests  # noqa: E402
from tracejudge.collector.receivers.decode_worker import decode_request  # noqa: E402
from tracejudge.collector.receivers.span_rows import spans_to_arrow  # noqa: E402
from tracejudge.collector.store.schema import migrate  # noqa: E402
from tracejudge.mapping import decode_otlp  # noqa: E402
from tracejudge.mapping.otlp import DEFAULT_LIMITS  # noqa: E402
from tracejudge.mapping.redaction import BUILTIN_RULES, Redactor  # noqa: E402


def import_footprint_mb(modules: str) -> float:
    """RSS of a fresh interpreter that only imports `modules` (what a spawned worker pays at start); VmRSS,
    since ru_maxrss would carry this process's peak over the fork."""
    code = (f"import {modules}; print(next(line.split()[1] for line in open('/proc/self/status') "
            "if line.startswith('VmRSS:')))")
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    return int(out.stdout) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    requests = build_requests(args.requests, 512)
    n = args.requests * 512
    default = gc.get_threshold()
    for label, setup in (("default GC", lambda: gc.set_threshold(*default)),
                         ("collector GC (100,000)", lambda: gc.set_threshold(100_000, 50, 100)),
                         ("GC off", gc.disable)):
        setup()
        started = time.perf_counter()
        decoded = [decode_otlp(r, "application/x-protobuf") for r in requests]
        print(f"decode_otlp, {label}: {n / (time.perf_counter() - started):,.0f} spans/s")
        gc.enable()
        del decoded
    gc.set_threshold(100_000, 50, 100)
    spans = [s for r in requests for s in decode_otlp(r, "application/x-protobuf").spans]
    redactor = Redactor.build(BUILTIN_RULES, {})
    started = time.perf_counter()
    redactor.spans(spans)
    print(f"redaction (builtin rules): {n / (time.perf_counter() - started):,.0f} spans/s")
    gc.disable()  # the Arrow columns alone, best of three, in CPU time
    times = []
    for _ in range(3):
        started = time.process_time()
        table = spans_to_arrow(spans, datetime.now(UTC))
        times.append(time.process_time() - started)
    gc.enable()
    print(f"spans_to_arrow: {n / min(times):,.0f} spans/s ({min(times) / n * 1e6:.1f} µs CPU per span)")
    limits = astuple(DEFAULT_LIMITS)
    for label, native in (("the C walk", "1"), ("the Python decoder, TRACEJUDGE_NATIVE_DECODE=0", "0")):
        os.environ["TRACEJUDGE_NATIVE_DECODE"] = native
        times = []  # a decode worker's whole job per request (decode, rows, digest), best of five, in CPU
        for _ in range(5):
            started = time.process_time()
            for r in requests:
                decode_request(r, "application/x-protobuf", limits)
            times.append(time.process_time() - started)
        print(f"decode_request (a worker's whole job), {label}: {min(times) / n * 1e6:.2f} µs CPU per span")
    os.environ.pop("TRACEJUDGE_NATIVE_DECODE")
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(str(Path(tmp) / "decode.duckdb"))
        migrate(con)
        con.register("incoming", table)
        started = time.perf_counter()
        con.execute("INSERT INTO spans SELECT * FROM incoming")
        print(f"DuckDB INSERT of the Arrow table: {n / (time.perf_counter() - started):,.0f} rows/s")
        con.close()
    worker = import_footprint_mb("tracejudge.collector.receivers.decode_worker")
    fallback = import_footprint_mb("tracejudge.collector.receivers.decode_worker, collector.receivers.span_rows")
    print(f"decode worker imports (collector.receivers.decode_worker): {worker:.0f} MB; {fallback:.0f} MB once a "
          f"request needs the Python decoder; the store and the scoring package, which workers imported before: "
          f"{import_footprint_mb('tracejudge.collector.store.span_store, collector.pipeline.scoring_stage'):.0f} MB")


if __name__ == "__main__":
    main()
