"""A new user's first session, timed: `--help`, `serve` until it listens, `replay` of the shipped real traces,
the first score, and a `query` against the running collector.

Run: `python bench/first_session.py [--checkout DIR] [--quiet-period 5s]`. `--checkout` times another checkout
of tracejudge (e.g. a `git worktree` of an older commit) with this interpreter; `--quiet-period ''` leaves the
collector's default. Every command runs as a user would start it: `python -m tracejudge.collector.cli ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cli(checkout: Path, *args: str, timeout: float = 120) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env = {k: v for k, v in env.items() if not k.startswith(("OPENAI_", "TRACEJUDGE_", "TYPESAFE_"))}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", *args], capture_output=True, text=True,
                          cwd=checkout, env={**env, "PYTHONPATH": str(checkout)}, timeout=timeout)
    return time.perf_counter() - started, proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--quiet-period", default="5s", help="passed to serve (empty: the default)")
    parser.add_argument("--max-wait", type=float, default=300, help="seconds to wait for the first score")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    traces = sorted(str(p) for p in (ROOT / "tests" / "fixtures" / "real").glob("*.otlp.json"))

    seconds, _ = _cli(checkout, "--help")
    print(f"tracejudge --help: {seconds:.2f} s")
    with tempfile.TemporaryDirectory() as tmp:
        serve = [sys.executable, "-m", "tracejudge.collector.cli", "serve", "--grpc-port", "0", "--http-port", "0",
                 "--admin-port", "0", "--db", str(Path(tmp) / "t.duckdb")]
        if args.quiet_period:
            serve += ["--quiet-period", args.quiet_period]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TRACEJUDGE_", "TYPESAFE_"))}
        started = time.perf_counter()
        proc = subprocess.Popen(serve, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp,
                                env={**env, "PYTHONPATH": str(checkout)})
        assert proc.stderr is not None
        try:
            start_line: dict = {}
            for line in proc.stderr:
                if '"listening"' in line:
                    start_line = json.loads(line)
                    break
            print(f"tracejudge serve until listening: {time.perf_counter() - started:.2f} s")
            http = start_line["otlp_http"]
            seconds, replayed = _cli(checkout, "replay", *traces, "--endpoint", http)
            print(f"tracejudge replay of {len(traces)} files: {seconds:.2f} s ({replayed.stdout.strip()})")
            admin = start_line["admin"]
            sent = time.perf_counter()
            while time.perf_counter() - sent < args.max_wait:
                _, answer = _cli(checkout, "query", "--url", admin, "SELECT count(*) FROM scores", "--format",
                                 "csv")
                if answer.returncode == 0 and answer.stdout.splitlines()[1:] not in ([], ["0"]):
                    print(f"first score: {time.perf_counter() - sent:.1f} s after the replay")
                    break
                time.sleep(0.5)
            else:
                print(f"no score within {args.max_wait:.0f} s")
            seconds, _ = _cli(checkout, "query", "--url", admin, "SELECT metric, count(*) FROM scores GROUP BY 1")
            print(f"tracejudge query against the running collector: {seconds:.2f} s")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
