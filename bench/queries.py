"""What `/api/query` costs and what a hostile query does to the collector, against a real `tracejudge serve`.

Stores `--spans` spans of `bench/ingest.py` over gRPC, then times each query below (the best of `--repeat`: since
users' SQL runs in a child process over a copy of the tables it reads, the time includes starting the child and
copying), and last sends `SELECT repeat('x', 600000000)` and prints the collector's RSS before and its peak after.
Run: `python bench/queries.py [--spans 200000] [--repeat 3]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import grpc
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ingest import EXPORT, build_requests, export_retrying, status_mb  # noqa: E402
from tests.support.collector_process import CollectorProcess  # noqa: E402

QUERIES = ["SELECT 1", "SELECT count(*) FROM latest_scores", "SELECT count(*) FROM spans",
           "SELECT name, count(*) FROM spans GROUP BY 1 ORDER BY 2 DESC LIMIT 5",
           "SELECT trace_id, attributes FROM spans WHERE name LIKE 'chat%' LIMIT 100"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, CollectorProcess(Path(tmp) / "q.duckdb") as collector:
        assert collector.proc is not None
        with grpc.insecure_channel(collector.grpc_endpoint) as channel:
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for body in build_requests(args.spans // 512, 512):
                export_retrying(export, body)
        url = f"{collector.admin_url}/api/query"
        for sql in QUERIES:
            best, answer = float("inf"), None
            for _ in range(args.repeat):
                started = time.perf_counter()
                answer = httpx.post(url, json={"sql": sql}, timeout=300)
                best = min(best, time.perf_counter() - started)
            assert answer is not None
            print(f"{best * 1000:8.0f} ms  HTTP {answer.status_code}  {sql}")
        before = status_mb(collector.proc.pid, "VmRSS")
        started = time.perf_counter()
        answer = httpx.post(url, json={"sql": "SELECT repeat('x', 600000000)"}, timeout=300)
        took, peak = time.perf_counter() - started, status_mb(collector.proc.pid, "VmHWM")
        print(f"SELECT repeat('x', 600000000): HTTP {answer.status_code} in {took:.1f} s ({answer.text[:90]}...); "
              f"collector RSS {before:.0f} MB before, peak {peak:.0f} MB, "
              f"{status_mb(collector.proc.pid, 'VmRSS'):.0f} MB after")


if __name__ == "__main__":
    main()
