"""Scoring benchmark: DeepEval's MCP metrics against tracejudge's, same conversations, same loopback judge.

Reports, per metric and conversation size (1, 3, 10 tasks): judge calls and prompt characters per measure
and CPU ms per measure at zero judge latency; then wall time for 50 conversations of 3 tasks measured
concurrently at 0.2 s judge latency; and whether a tool result whose structuredContent has no "result"
key crashes the metric. DeepEval runs in its own venv with telemetry off:

    python3 -m venv /tmp/venv-deepeval && /tmp/venv-deepeval/bin/pip install deepeval 'mcp<2'
    python bench/scoring.py --deepeval-python /tmp/venv-deepeval/bin/python

(with mcp 2.x DeepEval 4.3.1 fails on every MCP result: it reads `structuredContent`, which mcp 2 renamed).
`python bench/scoring.py --call-validity` only times the deterministic mcp_call_validity, in this process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.judge_stub import JudgeStub  # noqa: E402

RUNNER = str(Path(__file__).with_name("scoring_runner.py"))
METRICS = ("mcp_use", "mcp_task_completion")


def run(python: str, impl: str, stub: JudgeStub, *extra: str) -> dict:
    stub.reset()
    proc = subprocess.run([python, RUNNER, "--impl", impl, "--base-url", stub.base_url, *extra],
                          capture_output=True, text=True, timeout=900)
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    result = json.loads(line)
    if not result:
        result["error"] = proc.stderr.strip()[-300:]
    result["judge_calls"], result["prompt_chars"] = stub.stats()
    return result


def call_validity(repeat: int) -> None:
    """CPU per measure of the deterministic metric, as the collector runs it on every conversation: the first
    measure (a server's schemas checked against the meta-schema) and the rest."""
    import time

    from tests.support.cases import three_task_case
    from tracejudge import MCPCallValidityMetric

    case = three_task_case()
    times = []
    for _ in range(repeat):
        started = time.process_time()
        MCPCallValidityMetric().measure(case)
        times.append(time.process_time() - started)
    rest = sorted(times[1:])
    print(f"mcp_call_validity, 3 tasks: first measure {times[0] * 1000:.2f} ms CPU, then median "
          f"{rest[len(rest) // 2] * 1000:.2f} ms over {repeat - 1}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deepeval-python", default="/tmp/venv-deepeval/bin/python")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--call-validity", action="store_true",
                        help="only time mcp_call_validity (deterministic, in this process) on a 3-task case")
    args = parser.parse_args()
    if args.call_validity:
        call_validity(max(args.repeat, 100))
        return
    sides = {"deepeval": args.deepeval_python, "tracejudge": sys.executable}
    rows = []
    with JudgeStub() as fast:
        print(f"{'impl':10} {'metric':20} {'tasks':>5} {'calls':>6} {'prompt chars':>13} {'CPU ms':>8}")
        for metric in METRICS:
            for tasks in (1, 3, 10):
                for impl, python in sides.items():
                    r = run(python, impl, fast, "--metric", metric, "--tasks", str(tasks), "--repeat", str(args.repeat))
                    measures = args.repeat + 1  # the warm-up measure is counted by the judge too
                    calls, chars = r["judge_calls"] / measures, r["prompt_chars"] / measures
                    rows.append({**r, "calls_per_measure": calls, "chars_per_measure": chars})
                    cpu = r.get("cpu_ms_per_measure")
                    note = f"  {r['error']}" if "error" in r else ""
                    print(f"{impl:10} {metric:20} {tasks:>5} {calls:>6.1f} {chars:>13,.0f} "
                          f"{cpu if cpu is None else round(cpu, 1)!s:>8}{note}")
        for metric in METRICS:
            for impl, python in sides.items():
                r = run(python, impl, fast, "--metric", metric, "--tasks", "3", "--result-shape", "other")
                rows.append({**r, "shape": "structuredContent without result"})
                print(f"{impl:10} {metric:20} structuredContent without 'result': "
                      + (f"crash ({r['error']})" if "error" in r else f"ok, score {r.get('score')}"))
    with JudgeStub(latency_s=0.2) as slow:
        for metric in METRICS:
            for impl, python in sides.items():
                r = run(python, impl, slow, "--metric", metric, "--tasks", "3", "--conversations",
                        str(args.conversations))
                rows.append(r)
                wall = r.get("wall_s")
                print(f"{impl:10} {metric:20} {args.conversations} conversations x 3 tasks at 0.2 s judge latency: "
                      + (f"{wall:.2f} s wall, {r['judge_calls']} judge calls" if wall else f"error {r.get('error')}"))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
