"""Judges against scripted servers that answer the way real OpenAI-compatible servers do (llama.cpp's server,
vLLM, a reasoning model), and conversations larger than the judge's context window."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable

import bpe_openai
import pytest

from tests.support.cases import two_turn_case, wide_case
from tests.support.scripted_server import Reply, Request, ScriptedServer, completion, error, in_flight_tracker
from tests.test_cli import run
from tracejudge import LLMJudge, MCPTaskCompletionMetric, MultiTurnMCPUseMetric, RetryPolicy
from tracejudge.prompts import REASON_OUTPUT, SCORE_OUTPUT

_O200K = bpe_openai.get_encoding("o200k_base")


def answer(request: Request) -> Reply:
    if request.judge == "final_reason":
        return completion({"reason": "final"})
    return completion({"reason": "fine", "score": 0.75})


def server_tokens(request: Request) -> int:
    """What a server counts: its tokenizer over every message."""
    text = "".join(m["content"] for m in request.body["messages"])
    return sum(len(_O200K.encode_ordinary(text[i:i + 100_000])) for i in range(0, len(text), 100_000))


def with_window(window: int, message: Callable[[int], str]) -> Callable[[Request], Reply]:
    """A server that refuses prompts over `window` tokens with its own error text, else answers."""
    def script(request: Request) -> Reply:
        tokens = server_tokens(request)
        return error(400, message(tokens)) if tokens > window else answer(request)
    return script


def judge_for(server: ScriptedServer, model: str = "gpt-4o-mini", sleeps=None, **options) -> LLMJudge:
    return LLMJudge(model, base_url=server.base_url, api_key="sk-test-not-a-secret",
                    retry_policy=RetryPolicy(max_retries=2, sleep=sleeps) if sleeps else None, **options)


def test_llama_cpp_server_refusing_json_schema_with_a_500_gets_json_object_with_the_schema(
        judge_server, sleeps) -> None:
    def llama_cpp(request: Request) -> Reply:
        if request.format == "json_schema":  # llama-cpp-python's pydantic validation of the request
            return error(500, "1 validation error for CreateChatCompletionRequest\nresponse_format.type\n"
                              "  Input should be 'text' or 'json_object'")
        schema = request.body["response_format"]["schema"]
        assert schema in (SCORE_OUTPUT.schema, REASON_OUTPUT.schema)
        return answer(request)

    judge_server.script = llama_cpp
    judge = judge_for(judge_server, "qwen2.5-1.5b-instruct", sleeps)
    metric = MCPTaskCompletionMetric(model=judge)
    assert metric.measure(two_turn_case()) == pytest.approx(0.75)
    assert sleeps.delays == []  # a refusal of the format is not an outage: no backoff, no retries
    assert judge.output_format == "json_object"
    first = len(judge_server.calls())
    metric.measure(two_turn_case())
    assert {r.format for r in judge_server.calls()[first:]} == {"json_object"}  # remembered per judge


def test_vllm_server_is_asked_at_temperature_zero_and_cached_tokens_are_priced_at_the_cached_rate(
        judge_server) -> None:
    judge_server.script = lambda r: completion({"reason": "ok", "score": 1.0} if r.judge != "final_reason"
                                               else {"reason": "final"},
                                               prompt_tokens=1000, completion_tokens=20, cached_tokens=800)
    metric = MCPTaskCompletionMetric(model=judge_for(judge_server))
    metric.measure(two_turn_case())
    calls = judge_server.calls()
    assert [r.body.get("temperature") for r in calls] == [0.0] * len(calls)
    assert {r.format for r in calls} == {"json_schema"}
    assert metric.score_breakdown["cached_input_tokens"] == 800 * len(calls)
    per_call = (200 * 0.15 + 800 * 0.075 + 20 * 0.60) / 1e6  # gpt-4o-mini: input, cached input, output
    assert metric.evaluation_cost == pytest.approx(len(calls) * per_call)


def test_a_model_that_refuses_a_temperature_is_asked_without_one_from_then_on(judge_server) -> None:
    def reasoning_model(request: Request) -> Reply:
        if "temperature" in request.body:
            return error(400, "Unsupported value: 'temperature' does not support 0 with this model. "
                              "Only the default (1) value is supported.")
        return answer(request)

    judge_server.script = reasoning_model
    judge = judge_for(judge_server, "o4-mini")
    metric = MCPTaskCompletionMetric(model=judge)
    assert metric.measure(two_turn_case()) == pytest.approx(0.75)
    assert judge.send_temperature is False
    answered = [r for r in judge_server.calls() if "temperature" not in r.body]
    assert len(answered) == 2 and all(r.format == "json_schema" for r in answered)  # the format was kept


def test_temperature_none_sends_the_servers_default(judge_server) -> None:
    judge_server.script = answer
    MCPTaskCompletionMetric(model=judge_for(judge_server, temperature=None)).measure(two_turn_case())
    assert all("temperature" not in r.body for r in judge_server.calls())


def test_a_server_window_smaller_than_assumed_is_learned_from_its_error_and_the_prompt_reduced(
        judge_server) -> None:
    vllm_message = ("This model's maximum context length is 8192 tokens. However, you requested {} tokens in the "
                    "messages, Please reduce the length of the messages.").format
    judge_server.script = with_window(8192, vllm_message)
    judge = judge_for(judge_server, "Qwen/Qwen2.5-7B-Instruct")
    assert judge.context_tokens == 32_768  # unknown model: the default window
    metric = MultiTurnMCPUseMetric(model=judge)
    assert metric.measure(wide_case(turns=2, tools=20, result_chars=30_000)) == pytest.approx(0.75)
    assert judge.context_tokens == 8192
    answered = [r for r in judge_server.calls() if server_tokens(r) <= 8192]
    assert len(answered) == len(judge_server.calls()) - sum(server_tokens(r) > 8192 for r in judge_server.calls())
    assert all(server_tokens(r) <= 8192 - 2048 for r in answered)  # room left for the answer
    reductions = metric.score_breakdown["prompt_reductions"]
    assert {r["part"] for r in reductions} == {"t0.primitives", "t0.arguments", "t1.primitives", "t1.arguments"}
    assert all(r["fits"] and r["budget"] == 8192 - 2048 and r["tokens_before"] > r["tokens_after"]
               for r in reductions)
    assert all("estimate" in r["tokenizer"] for r in reductions)  # not an OpenAI model: o200k with a margin


def test_a_too_long_answer_naming_no_smaller_window_still_shrinks_the_next_prompt() -> None:
    judge = LLMJudge("qwen2.5-7b", api_key="unused", context_tokens=8192)
    judge.lower_context(32_768)  # our token count was the problem, not the window we assumed
    assert judge.context_tokens == 6144
    judge.lower_context(None)
    assert judge.context_tokens == 4608
    judge.lower_context(2048)
    assert judge.context_tokens == 2048


def test_a_500_kb_tool_result_is_scored_with_its_head_and_tail(judge_server) -> None:
    digest = hashlib.sha256(b"seed").hexdigest()
    blob = "".join(hashlib.sha256(f"{digest}{i}".encode()).hexdigest() for i in range(8_000))[:500_000]
    case = two_turn_case()
    case["turns"][1]["mcpToolsCalled"][0]["result"]["content"][0]["text"] = blob
    window = 128_000  # gpt-4o-mini's
    judge_server.script = with_window(window, lambda n: f"maximum context length is {window} tokens, you sent {n}")
    metric = MultiTurnMCPUseMetric(model=judge_for(judge_server))
    assert metric.measure(case) == pytest.approx(0.75)
    calls = judge_server.calls()
    assert all(server_tokens(r) <= window for r in calls)  # reduced before sending: never refused
    judged = [r for r in calls if r.judge == "mcp_argument_correctness"]
    text = judged[0].data["steps"][0]["mcp_calls"][0]["result"]["text"]
    assert text.startswith(blob[:1000]) and text.endswith(blob[-1000:])
    omitted = len(blob) - (len(text) - len(text.split("\n")[1]) - 2)
    assert f"[... {omitted:,} characters omitted ...]" in text


def test_a_wide_inventory_keeps_the_called_tools_in_full_and_the_others_by_name(judge_server) -> None:
    judge_server.script = answer
    metric = MultiTurnMCPUseMetric(model=judge_for(judge_server, context_tokens=8192))
    metric.measure(wide_case(turns=2, tools=120))
    called = {"operation_0", "operation_13"}
    for request in judge_server.calls(judge="mcp_primitive_selection"):
        tools = request.data["mcp_servers"][0]["tools"]
        assert {t["name"] for t in tools} == {f"operation_{i}" for i in range(120)}  # every tool still named
        full = {t["name"] for t in tools if "input_schema" in t}
        assert full == called & {c["name"] for s in request.data["steps"] for c in s.get("mcp_calls", [])}
        assert all("\n" not in t.get("description", "") for t in tools if t["name"] not in full)
    [inventory] = {r["inventory"] for r in metric.score_breakdown["prompt_reductions"]
                   if r["judge"] == "mcp_primitive_selection"}
    assert inventory.startswith("1 called primitives in full; 119 others")


def test_prompts_share_a_byte_identical_prefix_through_the_inventory(judge_server) -> None:
    judge_server.script = answer
    judge = judge_for(judge_server)
    for seed in range(2):  # two conversations of one agent
        MultiTurnMCPUseMetric(model=judge).measure(wide_case(turns=3, tools=120, seed=seed))
    for name in ("mcp_primitive_selection", "mcp_argument_correctness"):
        requests = judge_server.calls(judge=name)
        assert len(requests) == 6 and len({r.system for r in requests}) == 1
        shared = os.path.commonprefix([r.user for r in requests])
        assert '"operation_119"' in shared and '"steps"' not in shared  # the whole inventory, no task data
        assert len(shared) / max(len(r.user) for r in requests) > 0.9


def test_a_one_request_at_a_time_server_gets_one_request_at_a_time_with_the_timeout_it_needs(
        judge_server, tmp_path) -> None:
    """A CPU llama.cpp server computes one request at a time: with eight in flight the last ones wait behind
    the others and time out although the server is still computing them."""
    state, judge_server.script = in_flight_tracker(answer, 0.3)
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in (two_turn_case(), two_turn_case())) + "\n")
    proc = run(["evaluate", str(path), "--model", "qwen2.5-1.5b-instruct", "--judge-concurrency", "1",
                "--judge-timeout", "20", "--format", "json"],
               {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"})
    assert proc.returncode == 0, proc.stderr
    assert state["max"] == 1 and len(judge_server.calls()) == 10  # 2 cases x (3 MCP use + 2 completion)
    results = json.loads(proc.stdout)["test_results"]
    assert all(m["error"] is None for r in results for m in r["metrics"])
