"""hybrid and system_one modes against a scripted TypeSafe-compatible server and a scripted LLM, both on loopback."""

from __future__ import annotations

import io
import math
import re
import threading

import pytest

from tests.support.cases import three_task_case, two_turn_case
from tests.support.scripted_server import Reply, Request, completion, error, system_one_answers
from tests.test_metrics_llm import scripted
from tracejudge import (
    MCPTaskCompletionMetric,
    MultiTurnMCPUseMetric,
    RetryPolicy,
    evaluate,
)
from tracejudge.errors import (
    ContextBudgetError,
    JudgeAuthenticationError,
    JudgeConfigurationError,
    JudgeOutputError,
    JudgeRequestError,
)
from tracejudge.judges import Budget, LLMJudge, LogprobJudge, TypeSafeJudge

# P0 = 0.9, P1 = 0.6, expected level 2 of 3  ->  (1.8 + 0.6 + 0.667) / 4
GIVEN = {"q_0": 0.9, "q_1": 0.6, "q_2": [0.0, 0.2, 0.6, 0.2]}
GIVEN_SCORE = (2 * 0.9 + 0.6 + 2 / 3) / 4


def answer_all(table: dict) -> callable:
    """Answer every question asked, by the suffix of its key (so namespaced keys work too)."""
    def script(request: Request) -> Reply:
        return system_one_answers({key: table[key.rsplit(".", 1)[-1]] for key in request.questions})
    return script


def test_system_one_score_confidence_and_request(s1_server, s1, judge_server) -> None:
    s1_server.script = answer_all(GIVEN)
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
    assert metric.model is None  # no LLM is constructed in system_one
    assert metric.measure(two_turn_case()) == pytest.approx(GIVEN_SCORE)
    assert metric.confidence == pytest.approx(0.2)  # min(|2*0.9-1|, |2*0.6-1|, (4*0.6-1)/3)
    assert metric.success is True
    [request] = s1_server.calls()
    assert request.headers["authorization"] == "Bearer ts-test-not-a-secret"
    assert request.body["model"] == "jev-latest"
    assert [q["type"] for q in request.questions.values()] == ["noul", "noul", "score"]
    assert request.questions["q_2"]["criteria"] == ["Wrong use", "Poor use", "Adequate use", "Correct use"]
    assert [t["role"] for t in request.state["turns"]] == ["user", "assistant"]
    assert request.state["mcp_servers"][0]["server_name"] == "flights"
    assert judge_server.calls() == []
    breakdown = metric.score_breakdown
    assert breakdown["model"] == "jev-1.13.0" and breakdown["equation"] == "(2*v0 + v1 + v2) / 4"
    assert [q["decided_by"] for q in breakdown["questions"]] == ["system_one:jev-1.13.0"] * 3
    assert metric.evaluation_cost == pytest.approx(1000 * 0.042e-6)


def test_system_one_task_completion_state_has_no_inventory(s1_server, s1) -> None:
    s1_server.script = answer_all({"q_0": 1.0, "q_1": 1.0, "q_2": [0, 0, 0, 1.0]})
    metric = MCPTaskCompletionMetric(eval_mode="system_one", system_one_model=s1)
    assert metric.measure(three_task_case()) == 1.0
    [request] = s1_server.calls()
    assert "mcp_servers" not in request.state and len(request.state["turns"]) == 8


def test_system_one_reason_is_deterministic_and_stable(s1_server, s1) -> None:
    s1_server.script = answer_all(GIVEN)
    reasons = []
    for _ in range(2):
        metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
        metric.measure(two_turn_case())
        reasons.append(metric.reason)
    assert reasons[0] == reasons[1]
    lines = reasons[0].splitlines()
    assert lines[0] == "System One model jev-1.13.0 judged Multi-Turn MCP Use; minimum confidence 0.20."
    assert lines[1].startswith("q_0 (weight 2) right MCP primitives: clearly holds (P(yes) = 0.90")
    assert lines[2].startswith("q_1 (weight 1) arguments match schemas and request: unclear (P(yes) = 0.60")
    assert 'most likely "Adequate use" (expected level 2.00 of 3, value 0.667' in lines[3]
    assert lines[4] == "Weighted score 0.767 = (2 x 0.900 + 1 x 0.600 + 1 x 0.667) / 4."


def test_system_one_strict_mode_needs_every_question_to_pass(s1_server, s1) -> None:
    s1_server.script = answer_all(GIVEN)  # q_2's most likely level is 2, not the top
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1, strict_mode=True)
    assert metric.measure(two_turn_case()) == 0.0 and metric.success is False
    assert metric.reason.endswith("Strict mode: q_2 do not pass, score 0.")
    s1_server.script = answer_all({"q_0": 0.9, "q_1": 0.5, "q_2": [0.0, 0.1, 0.3, 0.6]})
    assert metric.measure(two_turn_case()) == 1.0 and metric.success is True


def test_evaluate_sends_one_request_for_both_metrics_and_splits_the_cost(s1_server, s1, judge_server) -> None:
    s1_server.script = answer_all(GIVEN)
    metrics = [MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1),
               MCPTaskCompletionMetric(eval_mode="system_one", system_one_model=s1)]
    result = evaluate([two_turn_case()], metrics, file=io.StringIO())
    [request] = s1_server.calls()
    assert sorted(request.questions) == sorted(
        f"{m}.q_{i}" for m in ("0.mcp_use", "1.mcp_task_completion") for i in range(3))
    assert judge_server.calls() == []
    use, done = result.test_results[0].metrics
    assert use.score == pytest.approx(GIVEN_SCORE) and done.score == pytest.approx(GIVEN_SCORE)
    assert use.evaluation_cost == pytest.approx(1000 * 0.042e-6 / 2)
    assert done.evaluation_cost == pytest.approx(1000 * 0.042e-6 / 2)
    assert use.score_breakdown["shared_request"] is True


def test_deepeval_units_without_a_qualifying_unit_cost_no_system_one_request(s1_server, s1) -> None:
    s1_server.script = answer_all(GIVEN)
    metrics = [MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1, units="deepeval"),
               MCPTaskCompletionMetric(eval_mode="system_one", system_one_model=s1, units="deepeval")]
    use, done = evaluate([two_turn_case()], metrics, file=io.StringIO()).test_results[0].metrics
    assert (use.score, done.score) == (0.0, 0.0) and s1_server.calls() == []
    assert use.score_breakdown["units"] == "deepeval"
    scored = evaluate([three_task_case()], metrics, file=io.StringIO()).test_results[0].metrics  # it has units
    assert len(s1_server.calls()) == 1 and all(m.score_breakdown["units"] == "deepeval" for m in scored)


def test_shared_request_failure_is_each_metrics_error(s1_server, s1) -> None:
    s1_server.script = lambda r: error(401, "bad key")
    metrics = [MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1),
               MCPTaskCompletionMetric(eval_mode="system_one", system_one_model=s1)]
    result = evaluate([two_turn_case()], metrics, file=io.StringIO())
    assert len(s1_server.calls()) == 1
    assert all(m.error.startswith("JudgeAuthenticationError") for m in result.test_results[0].metrics)


def level(n: int) -> list[float]:
    return [1.0 if i == n else 0.0 for i in range(4)]


HYBRID = {"t0.primitives": level(3), "t1.primitives": level(3), "t2.primitives": level(3),
          "t0.arguments": level(2), "t1.arguments": level(1)}


def test_hybrid_packs_every_decision_into_one_request_and_the_llm_writes_the_reason(
        s1_server, s1, judge_server, judge) -> None:
    s1_server.script = lambda r: system_one_answers({k: HYBRID[k] for k in r.questions})
    judge_server.script = scripted
    metric = MultiTurnMCPUseMetric(eval_mode="hybrid", model=judge, system_one_model=s1)
    assert metric.measure(three_task_case()) == pytest.approx((2 / 3 + 1 / 3 + 1.0) / 3)
    [request] = s1_server.calls()
    assert sorted(request.questions) == sorted(HYBRID)
    assert [t["task_index"] for t in request.state["tasks"]] == [0, 1, 2]
    assert "task_index 1" in request.questions["t1.arguments"]["instructions"]
    assert request.questions["t0.arguments"]["criteria"] == [
        "Incorrect", "Mostly incorrect", "Mostly correct", "Fully correct"]
    assert [r.judge for r in judge_server.calls()] == ["final_reason"]
    row = metric.score_breakdown["tasks"][0]
    assert row["primitive"]["decided_by"] == "system_one:jev-1.13.0"
    assert metric.system_one_fallback_reason is None and metric.confidence == 1.0


def test_hybrid_task_completion_levels(s1_server, s1, judge_server, judge) -> None:
    s1_server.script = lambda r: system_one_answers({k: [0.0, 0.0, 0.5, 0.5] for k in r.questions})
    judge_server.script = scripted
    metric = MCPTaskCompletionMetric(eval_mode="hybrid", model=judge, system_one_model=s1, include_reason=False)
    assert metric.measure(three_task_case()) == pytest.approx(2.5 / 3)
    assert metric.confidence == pytest.approx((4 * 0.5 - 1) / 3)
    [request] = s1_server.calls()
    assert "mcp_servers" not in request.state
    assert judge_server.calls() == []


@pytest.mark.parametrize("failure", ["connection refused", "503", "520", "timeout"])
def test_hybrid_falls_back_to_the_llm_when_system_one_fails(s1_server, judge_server, judge, sleeps, failure) -> None:
    judge_server.script = scripted
    if failure == "connection refused":
        s1 = TypeSafeJudge(base_url="http://127.0.0.1:9", retry_policy=RetryPolicy(max_retries=1, sleep=sleeps))
    elif failure in ("503", "520"):
        s1_server.script = lambda r: error(int(failure), "overloaded")
        s1 = TypeSafeJudge(retry_policy=RetryPolicy(max_retries=1, sleep=sleeps))
    else:
        def slow(request: Request) -> Reply:
            threading.Event().wait(1.0)
            return system_one_answers({k: HYBRID[k] for k in request.questions})
        s1_server.script = slow
        s1 = TypeSafeJudge(timeout=0.2, retry_policy=RetryPolicy(max_retries=0, sleep=sleeps))
    metric = MultiTurnMCPUseMetric(eval_mode="hybrid", model=judge, system_one_model=s1)
    assert metric.measure(three_task_case()) == pytest.approx(2 / 3)  # the LLM's scores, as in llm mode
    assert "JudgeUnavailableError" in metric.system_one_fallback_reason
    row = metric.score_breakdown["tasks"][1]
    assert row["argument"]["decided_by"] == "llm:gpt-4o-mini"
    assert "JudgeUnavailableError" in row["argument"]["system_one_fallback_reason"]
    assert metric.confidence is None
    assert len(judge_server.calls()) == 6


def test_auth_failure_disables_system_one_for_the_rest_of_the_measure(s1_server, judge_server, judge) -> None:
    s1_server.script = lambda r: error(401, "invalid TypeSafe key")
    judge_server.script = scripted
    tiny = Budget(state_and_question=900, request=1_000)  # forces one request per task
    s1 = TypeSafeJudge(budget=tiny)
    metric = MultiTurnMCPUseMetric(eval_mode="hybrid", model=judge, system_one_model=s1)
    assert metric.measure(three_task_case()) == pytest.approx(2 / 3)
    assert len(s1_server.calls()) == 1
    assert "System One disabled for this measure" in metric.system_one_fallback_reason
    assert "invalid TypeSafe key" in metric.system_one_fallback_reason


def test_hybrid_splits_requests_by_budget(s1_server, judge_server, judge) -> None:
    s1_server.script = lambda r: system_one_answers({k: HYBRID[k] for k in r.questions})
    judge_server.script = scripted
    s1 = TypeSafeJudge(budget=Budget(state_and_question=900, request=1_000))
    metric = MultiTurnMCPUseMetric(eval_mode="hybrid", model=judge, system_one_model=s1)
    assert metric.measure(three_task_case()) == pytest.approx((2 / 3 + 1 / 3 + 1.0) / 3)
    requests = s1_server.calls()
    assert 1 < len(requests) <= 3
    assert sorted(k for r in requests for k in r.questions) == sorted(HYBRID)
    assert metric.score_breakdown["system_one_requests"] == len(requests)


def test_system_one_errors_surface_in_system_one_mode(s1_server, s1) -> None:
    s1_server.script = lambda r: error(403, "forbidden")
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
    with pytest.raises(JudgeAuthenticationError, match="check TYPESAFE_API_KEY"):
        metric.measure(two_turn_case())
    assert metric.error.startswith("JudgeAuthenticationError") and len(s1_server.calls()) == 1


def test_429_retry_after_is_honoured(s1_server, s1, sleeps) -> None:
    replies = iter([error(429, "rate limited", {"retry-after-ms": "250", "retry-after": "9"})])
    s1_server.script = lambda r: next(replies, None) or answer_all(GIVEN)(r)
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
    assert metric.measure(two_turn_case()) == pytest.approx(GIVEN_SCORE)
    assert sleeps.delays == [0.25] and len(s1_server.calls()) == 2


def test_422_reports_the_servers_detail(s1_server, s1) -> None:
    s1_server.script = lambda r: Reply(422, {"detail": [{"loc": ["body", "questions", "q_0", "criteria"],
                                                         "msg": "Field required", "type": "missing"}]})
    with pytest.raises(JudgeRequestError, match="body.questions.q_0.criteria: Field required"):
        MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1).measure(two_turn_case())
    assert len(s1_server.calls()) == 1


def test_missing_answer_is_an_error_never_a_default(s1_server, s1) -> None:
    s1_server.script = lambda r: system_one_answers({"q_0": 0.9, "q_2": GIVEN["q_2"]})
    with pytest.raises(JudgeOutputError, match="no answer for q_1"):
        MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1).measure(two_turn_case())


def huge_case() -> dict:
    case = two_turn_case()
    case["turns"][1]["mcpToolsCalled"][0]["result"]["content"][0]["text"] = "x" * 120_000
    return case


def test_a_conversation_over_budget_is_reduced_to_fit_system_one(s1_server, s1) -> None:
    s1_server.script = lambda r: system_one_answers({"q_0": 0.9, "q_1": 0.8, "q_2": [0, 0, 0.2, 0.8]})
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
    assert metric.measure(huge_case()) is not None
    [request] = s1_server.calls()
    result = request.state["turns"][1]["mcp_calls"][0]["result"]["text"]
    kept = 120_000 - reduction_omitted(result)
    assert result.startswith("x" * (kept // 2)) and 20_000 < kept < 96_000  # as much as the budget holds
    [reduction] = metric.score_breakdown["prompt_reductions"]
    assert reduction["judge"] == "system_one" and reduction["fits"] is True
    assert reduction["tokens_before"] > 32_000 >= reduction["tokens_after"]


def reduction_omitted(text: str) -> int:
    return int(re.search(r"\[\.\.\. ([\d,]+) characters omitted \.\.\.\]", text).group(1).replace(",", ""))


def test_a_conversation_that_cannot_be_reduced_enough_is_a_clear_error_and_nothing_is_sent(s1_server, s1) -> None:
    case = two_turn_case()
    schema = {"type": "object", "properties": {f"p{j}": {"type": "string", "description": "d" * 40} for j in range(20)}}
    case["mcp_servers"] = [{"server_name": "big", "available_tools": [
        {"name": f"tool_{i}", "inputSchema": schema} for i in range(150)]}]
    case["turns"][1]["mcpToolsCalled"] = [{"name": f"tool_{i}", "args": {}} for i in range(150)]
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
    with pytest.raises(ContextBudgetError, match="eval_mode='llm'") as info:
        metric.measure(case)
    assert "32,000" in str(info.value)
    assert s1_server.calls() == []


def test_over_budget_task_falls_back_to_the_llm_in_hybrid(s1_server, s1, judge_server, judge) -> None:
    judge_server.script = lambda r: completion({"reason": "r", "score": 0.5}) if r.judge != "final_reason" \
        else completion({"reason": "final"})
    metric = MultiTurnMCPUseMetric(eval_mode="hybrid", model=judge, system_one_model=s1)
    assert metric.measure(huge_case()) == pytest.approx(0.5)
    assert s1_server.calls() == []
    assert metric.system_one_fallback_reason.startswith("context budget exceeded")


def test_missing_system_one_credentials_say_what_to_set() -> None:
    with pytest.raises(JudgeConfigurationError, match="set TYPESAFE_API_KEY, or TYPESAFE_BASE_URL"):
        MultiTurnMCPUseMetric(eval_mode="system_one")


def logprob_reply(top: dict[str, float]) -> Reply:
    entries = [{"token": t, "logprob": math.log(p), "bytes": None} for t, p in top.items()]
    reply = completion("A", prompt_tokens=50, completion_tokens=1)
    reply.body["choices"][0]["logprobs"] = {"content": [{"token": "A", "logprob": entries[0]["logprob"],
                                                         "bytes": None, "top_logprobs": entries}]}
    return reply


def test_logprob_judge_reads_letter_probabilities(judge_server) -> None:
    top = {"A": 0.6, " A": 0.1, "B": 0.2, "Hello": 0.05}
    judge_server.script = lambda r: logprob_reply(top)
    s1 = LogprobJudge(LLMJudge("gpt-4o-mini"))
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
    p_yes = 0.7 / 0.9
    floor = 0.05 * math.exp(-5)
    levels = [0.7, 0.2, floor, floor]
    expected = sum(i * p for i, p in enumerate(levels)) / sum(levels) / 3
    assert metric.measure(two_turn_case()) == pytest.approx((2 * p_yes + p_yes + expected) / 4)
    requests = judge_server.calls()
    assert len(requests) == 3
    assert all(r.body["logprobs"] is True and r.body["top_logprobs"] == 20 and r.body["max_tokens"] == 1
               for r in requests)
    assert all(r.user.endswith("Answer with the letter only.") for r in requests)
    assert sum("A. yes" in r.user for r in requests) == 2  # calls run concurrently: any order
    assert sum("D. Correct use" in r.user for r in requests) == 1
    assert metric.score_breakdown["calibrated"] is False
    assert metric.score_breakdown["model"] == "gpt-4o-mini"  # the model the server says answered


def test_logprob_judge_without_logprobs_fails_clearly(judge_server) -> None:
    judge_server.script = lambda r: completion("A")
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=LogprobJudge("llama-local"))
    with pytest.raises(JudgeOutputError, match="returned no logprobs"):
        metric.measure(two_turn_case())


def test_joint_request_over_budget_lets_each_metric_ask_alone(s1_server, s1) -> None:
    s1_server.script = answer_all(GIVEN)
    case = two_turn_case()
    case["mcp_servers"][0]["available_tools"][0]["description"] = "d" * 100_000  # the called tool: kept in full
    metrics = [MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1),
               MCPTaskCompletionMetric(eval_mode="system_one", system_one_model=s1)]
    use, done = evaluate([case], metrics, file=io.StringIO()).test_results[0].metrics
    assert use.error.startswith("ContextBudgetError")  # the inventory makes MCP use too large on its own
    assert done.score == pytest.approx(GIVEN_SCORE) and done.error is None
    [request] = s1_server.calls()
    assert "mcp_servers" not in request.state


def test_two_metrics_of_one_kind_share_a_request_without_double_charging(s1_server, s1) -> None:
    s1_server.script = answer_all(GIVEN)
    metrics = [MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1),
               MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1, strict_mode=True)]
    lenient, strict = evaluate([two_turn_case()], metrics, file=io.StringIO()).test_results[0].metrics
    [request] = s1_server.calls()
    assert len(request.questions) == 6
    assert lenient.score == pytest.approx(GIVEN_SCORE) and strict.score == 0.0
    assert lenient.evaluation_cost + strict.evaluation_cost == pytest.approx(1000 * 0.042e-6)


def test_questions_over_the_request_budget_are_split_across_requests(s1_server) -> None:
    s1_server.script = answer_all(GIVEN)
    s1 = TypeSafeJudge(budget=Budget(state_and_question=2_000, request=700))
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
    assert metric.measure(two_turn_case()) == pytest.approx(GIVEN_SCORE)
    requests = s1_server.calls()
    assert len(requests) > 1 and sorted(k for r in requests for k in r.questions) == ["q_0", "q_1", "q_2"]
    assert metric.score_breakdown["system_one_requests"] == len(requests)
    assert metric.evaluation_cost == pytest.approx(len(requests) * 1000 * 0.042e-6)


def test_a_response_without_usage_has_unknown_cost(s1_server, s1) -> None:
    def no_usage(request: Request) -> Reply:
        reply = answer_all(GIVEN)(request)
        del reply.body["usage"]
        return reply

    s1_server.script = no_usage
    metric = MultiTurnMCPUseMetric(eval_mode="system_one", system_one_model=s1)
    metric.measure(two_turn_case())
    assert metric.evaluation_cost is None
