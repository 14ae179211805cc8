"""Where ingest time goes, on one core: decode_otlp, the Arrow columns, and the DuckDB append.

Decoding is measured with Python's default GC thresholds, with the collector's (gen-0 100,000) and with GC
off, on the same pre-built requests as bench/ingest.py. Run: `python bench/decode.py [--requests 40]`.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import build_requests  # noqa: E402
from collector.schema import migrate  # noqa: E402
from collector.span_rows import spans_to_arrow  # noqa: E402
from mapping import decode_otlp  # noqa: E402


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
    started = time.perf_counter()
    table = spans_to_arrow(spans, datetime.now(UTC))
    print(f"spans_to_arrow: {n / (time.perf_counter() - started):,.0f} spans/s")
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(str(Path(tmp) / "decode.duckdb"))
        migrate(con)
        con.register("incoming", table)
        started = time.perf_counter()
        con.execute("INSERT OR IGNORE INTO spans SELECT * FROM incoming")
        print(f"DuckDB INSERT OR IGNORE of the Arrow table: {n / (time.perf_counter() - started):,.0f} rows/s")
        con.close()


if __name__ == "__main__":
    main()
