"""One side of bench/scoring.py: measure DeepEval's or tracejudge's MCP metrics on the same conversations.

Run by bench/scoring.py with the Python of the library's own venv; prints one JSON line. A conversation
has N tasks, each [user, assistant with an MCP tool call, assistant reply] (three turns, so DeepEval does
not skip it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DEEPEVAL_TELEMETRY_OPT_OUT", "YES")
os.environ.setdefault("DEEPEVAL_GRPC_LOGGING", "NO")

TOOL = {"name": "get_weather", "description": "Current weather for a city.",
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def plain_case(tasks: int, result_shape: str) -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    for i in range(tasks):
        structured = {"result": f"Rainy {i}"} if result_shape == "result" else {"temperature_c": 14, "sky": "rain"}
        turns += [
            {"role": "user", "content": f"What's the weather in city {i}?"},
            {"role": "assistant", "content": "", "mcp_tools_called": [{
                "name": "get_weather", "args": {"city": f"city {i}"},
                "result": {"content": [{"type": "text", "text": f"Rainy {i}"}], "structuredContent": structured,
                           "isError": False}}]},
            {"role": "assistant", "content": f"It is rainy in city {i}."},
        ]
    return {"turns": turns, "mcp_servers": [{"server_name": "weather", "transport": "stdio",
                                             "available_tools": [TOOL]}]}


def deepeval_side(base_url: str) -> tuple[Any, Any]:
    import mcp.types as mt
    from deepeval.metrics import MCPTaskCompletionMetric, MultiTurnMCPUseMetric
    from deepeval.models import OpenAIModel
    from deepeval.test_case import ConversationalTestCase, MCPServer, MCPToolCall, Turn

    def build(case: dict[str, Any]) -> Any:
        turns = []
        for t in case["turns"]:
            calls = [MCPToolCall(name=c["name"], args=c["args"], result=mt.CallToolResult.model_validate(c["result"]))
                     for c in t.get("mcp_tools_called", [])]
            turns.append(Turn(role=t["role"], content=t["content"], mcp_tools_called=calls or None))
        server = MCPServer(server_name="weather", transport="stdio", available_tools=[mt.Tool.model_validate(TOOL)])
        return ConversationalTestCase(turns=turns, mcp_servers=[server])

    model = OpenAIModel(model="gpt-4o-mini", api_key="sk-bench", base_url=base_url)
    metrics = {"mcp_use": lambda: MultiTurnMCPUseMetric(model=model),
               "mcp_task_completion": lambda: MCPTaskCompletionMetric(model=model)}
    return build, metrics


def tracejudge_side(base_url: str) -> tuple[Any, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tracejudge import LLMJudge, MCPTaskCompletionMetric, MultiTurnMCPUseMetric
    from tracejudge.test_case import load_test_case

    judge = LLMJudge("gpt-4o-mini", base_url=base_url, api_key="sk-bench", max_concurrency=256)
    metrics = {"mcp_use": lambda: MultiTurnMCPUseMetric(model=judge),
               "mcp_task_completion": lambda: MCPTaskCompletionMetric(model=judge)}
    return load_test_case, metrics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=["deepeval", "tracejudge"], required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--metric", choices=["mcp_use", "mcp_task_completion"], required=True)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1, help="sequential measures (CPU per measure)")
    parser.add_argument("--conversations", type=int, default=0, help="concurrent a_measure calls (wall time)")
    parser.add_argument("--result-shape", choices=["result", "other"], default="result")
    args = parser.parse_args()
    build, metrics = (deepeval_side if args.impl == "deepeval" else tracejudge_side)(args.base_url)
    case = build(plain_case(args.tasks, args.result_shape))
    out: dict[str, Any] = {"impl": args.impl, "metric": args.metric, "tasks": args.tasks}
    try:
        if args.conversations:
            async def many() -> None:
                await asyncio.gather(*(metrics[args.metric]().a_measure(case) for _ in range(args.conversations)))
            started = time.perf_counter()
            asyncio.run(many())
            out["wall_s"] = time.perf_counter() - started
        else:
            metric = metrics[args.metric]()
            metric.measure(case)  # warm-up (imports, clients) outside the timing
            cpu = time.process_time()
            for _ in range(args.repeat):
                metric = metrics[args.metric]()
                metric.measure(case)
            out["cpu_ms_per_measure"] = (time.process_time() - cpu) * 1000 / args.repeat
            out["score"] = metric.score
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
