"""Judge cost on real-size conversations, with the scripted judge on loopback (plumbing and tokens, not validity).

Each conversation has 5 user turns, each answered after a call to one of 120 tools with GitHub-length schemas.
The scripted judge reports usage as OpenAI does: prompt tokens counted with o200k, and `cached_tokens` for the
longest prefix (in 128-token steps from 1,024) that an earlier request of the same judge already sent. It prints:

1. judge input tokens per conversation, the share that is a repeated (cacheable) prefix with today's layout
   (inventory first) and with the layout before it (inventory after the task data), and the cost in USD;
2. wall time and cost for N conversations scored synchronously and through the Batch API stand-in;
3. a 500 KB tool result scored on a 128k-token model: tokens before and after reduction, and the score.

    python bench/judge_cost.py --conversations 1000
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.batch_server import BatchServer  # noqa: E402
from tests.support.cases import two_turn_case, wide_case  # noqa: E402
from tests.support.scripted_server import Reply, Request, ScriptedServer, completion  # noqa: E402
from tracejudge import LLMJudge, MCPTaskCompletionMetric, MultiTurnMCPUseMetric, evaluate  # noqa: E402
from tracejudge.judges.batch import BatchOptions  # noqa: E402
from tracejudge.judges.tokens import BpeCounter  # noqa: E402
from tracejudge.prompts import DATA_CLOSE, DATA_OPEN, encode_data  # noqa: E402

MODEL = "gpt-5.4"
COUNTER = BpeCounter("o200k_base")


class PrefixCache:
    """OpenAI-style automatic prefix caching, per judge: a request reuses the longest prefix an earlier one
    sent, counted in 128-token steps once at least 1,024 tokens match."""

    def __init__(self) -> None:
        self.previous: dict[str, str] = {}
        self._tokens: dict[str, int] = {}

    def tokens(self, text: str) -> int:
        key = hashlib.sha256(text.encode()).hexdigest()
        if key not in self._tokens:
            self._tokens[key] = COUNTER.count(text)
        return self._tokens[key]

    def usage(self, judge: str, text: str) -> tuple[int, int]:
        """(prompt tokens, cached tokens) of `text`; the shared prefix is counted once and remembered."""
        before = self.previous.get(judge, "")
        self.previous[judge] = text
        shared = 0
        for a, b in zip(before, text, strict=False):
            if a != b:
                break
            shared += 1
        prefix = self.tokens(text[:shared]) if shared else 0
        total = prefix + COUNTER.count(text[shared:])
        cached = (prefix // 128) * 128 if prefix >= 1024 else 0
        return total, cached


def old_layout(request: Request) -> str:
    """The same request with the inventory after the task data, as prompts were laid out before."""
    data = request.data
    if isinstance(data, dict) and "mcp_servers" in data:
        data = {k: v for k, v in data.items() if k != "mcp_servers"} | {"mcp_servers": data["mcp_servers"]}
    return request.system + f"{DATA_OPEN}\n{encode_data(data)}\n{DATA_CLOSE}"


class Judge:
    """The scripted judge: a fixed verdict, usage as the provider would report it for both layouts."""

    def __init__(self) -> None:
        self.now, self.before = PrefixCache(), PrefixCache()
        self.totals = {"input": 0, "cached": 0, "input_before": 0, "cached_before": 0, "requests": 0}

    def __call__(self, request: Request) -> Reply:
        text = request.system + request.user
        total, cached = self.now.usage(request.judge, text)
        total_b, cached_b = self.before.usage(request.judge, old_layout(request))
        for key, value in (("input", total), ("cached", cached), ("input_before", total_b),
                           ("cached_before", cached_b), ("requests", 1)):
            self.totals[key] += value
        body = {"reason": "final"} if request.judge == "final_reason" else {"reason": "fine", "score": 0.8}
        return completion(body, prompt_tokens=total, completion_tokens=40, cached_tokens=cached)


def cost(input_tokens: int, cached: int, output_tokens: int) -> float:
    price = LLMJudge(MODEL, api_key="unused").price
    assert price is not None
    return price.cost(input_tokens, output_tokens, cached)


def run(cases: list[dict[str, Any]], judge: LLMJudge) -> tuple[float, float, int, int]:
    """Wall seconds, total cost as tracejudge accounted it, judge calls, errors."""
    metrics = [MultiTurnMCPUseMetric(model=judge), MCPTaskCompletionMetric(model=judge)]
    started = time.perf_counter()
    result = evaluate(cases, metrics, max_concurrency=32, file=io.StringIO())
    wall = time.perf_counter() - started
    scored = [m for t in result.test_results for m in t.metrics]
    return (wall, sum(m.evaluation_cost or 0.0 for m in scored), sum(m.score_breakdown["llm_calls"]
            for m in scored if m.score_breakdown), sum(m.error is not None for m in scored))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=200)
    args = parser.parse_args()
    cases = [wide_case(turns=5, tools=120, result_chars=1200, seed=i) for i in range(args.conversations)]

    script = Judge()
    with ScriptedServer(script=script) as server:
        sync = run(cases, LLMJudge(MODEL, base_url=server.base_url, api_key="sk-bench"))
    t, n = script.totals, args.conversations
    print(f"{n} conversations x 5 turns, 120-tool inventory, judge {MODEL} (scripted), {t['requests']} requests")
    print(f"  input tokens per conversation: {t['input'] / n:,.0f}")
    for label, inp, cached in (("inventory first (now)", t["input"], t["cached"]),
                               ("inventory last (before)", t["input_before"], t["cached_before"])):
        usd = cost(inp, cached, 40 * t["requests"])
        print(f"  {label:24} repeated prefix {cached / inp:6.1%}   cost ${usd:8.2f}  (${usd / n:.4f}/conversation)")
    ratio = cost(t["input"], t["cached"], 40 * t["requests"]) / cost(t["input_before"], t["cached_before"],
                                                                     40 * t["requests"])
    print(f"  cost ratio now/before: {ratio:.2f}")

    batch_script = Judge()
    with BatchServer(batch_script) as server:
        batch = run(cases, LLMJudge(MODEL, base_url=server.base_url, api_key="sk-bench",
                                    batch=BatchOptions(flush_s=1.0, poll_s=0.2)))
        batches = len(server.batches)
    print(f"synchronous: {sync[0]:6.1f} s wall, ${sync[1]:8.2f} as accounted, {sync[2]} calls, {sync[3]} errors")
    print(f"batch:       {batch[0]:6.1f} s wall, ${batch[1]:8.2f} as accounted, {batch[2]} calls, {batch[3]} errors, "
          f"{batches} batches (wall time at a real provider: up to its 24 h window)")
    print(f"  batch/synchronous cost: {batch[1] / sync[1]:.2f}")

    big = two_turn_case()
    blob = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(16_000))[:500_000]
    big["turns"][1]["mcpToolsCalled"][0]["result"]["content"][0]["text"] = blob
    with ScriptedServer(script=Judge()) as server:
        metric = MultiTurnMCPUseMetric(model=LLMJudge("gpt-4o-mini", base_url=server.base_url, api_key="sk-bench"))
        started = time.perf_counter()
        score = metric.measure(big)
        wall = time.perf_counter() - started
    reductions = metric.score_breakdown["prompt_reductions"]
    print(f"500 KB tool result on gpt-4o-mini (128k window): score {score}, {len(reductions)} prompts reduced, "
          f"tokens {reductions[0]['tokens_before']:,} -> {reductions[0]['tokens_after']:,} "
          f"(budget {reductions[0]['budget']:,}), {wall:.2f} s")
    print(json.dumps({"input_per_conversation": t["input"] / n, "cached_share": t["cached"] / t["input"],
                      "cached_share_before": t["cached_before"] / t["input_before"]}))


if __name__ == "__main__":
    main()
