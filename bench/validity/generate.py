"""Generate the labelled validity corpus: clean multi-turn MCP conversations, and copies with one fault seeded
into one task, so every label is known by construction. Part of it comes from the recorded framework traces in
tests/fixtures/real (mapped to test cases, then seeded the same way).

    python bench/validity/generate.py            # writes bench/validity/corpus.jsonl (deterministic)

Each line: {"id", "labels": {"fault", "variant", "hard", "server", "source", "tasks": [fault per task],
"faulty_calls": [{"turn", "name", "fault"}]}, "test_case": {...}}. `fault` is one of FAULTS; the variant
`clean_long_way` (a correct answer reached with an extra reasonable step) is labelled clean and hard. A
`faulty_calls` entry with fault `tool_error` is a call that failed in a recording whose agent reported the
failure: the call is not clean, the agent's behaviour is.
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.validity.servers import SERVERS, TASKS, Call, Task  # noqa: E402

CORPUS = Path(__file__).with_name("corpus.jsonl")
FAULTS = ("clean", "wrong_tool", "missing_call", "unnecessary_call", "wrong_argument_value",
          "schema_invalid_arguments", "unknown_tool", "ignored_tool_error", "hallucination", "unanswered",
          "partial_answer")
VARIANTS = (*FAULTS, "clean_long_way")
CALL_FAULTS = ("schema_invalid_arguments", "unknown_tool", "ignored_tool_error")  # what mcp_call_validity sees
# a task label, not a fault: the agent behaved well (reported a failed call as failed), the task was not done
HONEST_FAILURE = "honest_failure"
BASES_PER_SERVER = 8
NEAR_MISS = {"read_text_file": "read_file", "search_files": "find_files", "get_file_info": "stat_file",
             "read_query": "run_sql", "get_issue": "get_issue_details", "search_issues": "search_github_issues",
             "list_events": "get_events", "find_free_slots": "find_availability", "brave_web_search": "web_search",
             "brave_local_search": "local_search"}
ERRORS = ("Error: permission denied", "Error: 404 Not Found", "Error: rate limit exceeded, retry later",
          "Error: connection reset by the upstream service")
GENERIC = {"path": "/srv", "query": "recent", "owner": "acme", "repo": "atlas", "calendarId": "primary",
           "url": "https://example.com/status", "table_name": "users", "title": "Follow-up", "body": "See above.",
           "summary": "Sync", "eventId": "evt_1", "source": "/tmp/a.txt", "destination": "/tmp/b.txt",
           "content": "draft", "pattern": "*"}


def valid_args(schema: dict[str, Any]) -> dict[str, Any]:
    """Schema-valid, unremarkable arguments for any tool of the corpus."""
    out: dict[str, Any] = {}
    for name in schema.get("required", []):
        prop = schema["properties"][name]
        if "enum" in prop:
            out[name] = prop["enum"][0]
        elif prop.get("type") == "integer":
            out[name] = max(1, prop.get("minimum", 1))
        elif prop.get("format") == "date-time":
            out[name] = "2026-12-10T09:00:00Z"
        elif prop.get("format") == "date":
            out[name] = "2026-12-10"
        else:
            out[name] = GENERIC.get(name, "value")
    return out


def two_part(first: Task, second: Task) -> Task:
    """One user turn asking two things, served by both tasks' calls; the answer covers both."""
    request = f"{first.request} Also: {second.request}"
    return Task(request, first.calls + second.calls, f"{first.answer} {second.answer}",
                first.facts + second.facts, first.other, first.detour or second.detour,
                labels={"first_answer": first.answer})


def other_tool(server: str, task: Task, rng: random.Random) -> dict[str, Any]:
    """A tool of the server that this task does not use (nor its detour), else one it does not use first."""
    tools = SERVERS[server]["available_tools"]
    used = {c.name for c in task.calls}
    for avoid in (used | ({task.detour.name} if task.detour else set()), used, {task.calls[0].name}):
        choices = [t for t in tools if t["name"] not in avoid]
        if choices:
            return rng.choice(choices)
    raise ValueError(f"{server} has a single tool")


def seed(task: Task, fault: str, server: str, rng: random.Random) -> tuple[list[Call], str, list[int]]:
    """The task's calls and answer with `fault` in them, and which calls carry a call-level fault."""
    calls = [copy.deepcopy(c) for c in task.calls]
    answer = task.answer
    first = calls[0]
    if fault == "wrong_tool":
        spec = other_tool(server, task, rng)
        calls[0] = Call(spec["name"], valid_args(spec["inputSchema"]), "OK: 3 items")
    elif fault == "missing_call":
        calls, answer = [], f"From what I remember, {answer[0].lower()}{answer[1:]}"
    elif fault == "unnecessary_call":
        spec = other_tool(server, task, rng)
        calls.insert(0, Call(spec["name"], valid_args(spec["inputSchema"]), "OK"))
    elif fault == "wrong_argument_value":
        args, result, wrong_answer = task.other()
        calls[0] = Call(first.name, args, result)
        answer = wrong_answer if len(calls) == 1 else answer.replace(task.calls[0].result, result)
        if len(task.calls) > 1:
            answer = f"{wrong_answer} {answer.split('. ', 1)[-1]}"
    elif fault == "schema_invalid_arguments":
        ints = [k for k, v in first.args.items() if isinstance(v, int)]
        if ints:
            first.args[ints[0]] = f"{first.args[ints[0]]} please"
        else:
            first.args.pop(next(iter(first.args)))
        return calls, answer, [0]
    elif fault == "unknown_tool":
        calls[0] = Call(NEAR_MISS[first.name], first.args, f"Unknown tool: {NEAR_MISS[first.name]}", True)
        return calls, answer, [0]
    elif fault == "ignored_tool_error":
        calls[0] = Call(first.name, first.args, rng.choice(ERRORS), True)
        return calls, answer, [0]
    elif fault == "hallucination":
        true, fake = task.facts[0]
        assert true in answer, (true, answer)
        answer = answer.replace(true, fake, 1)
    elif fault == "unanswered":
        answer = "Let me look into that for you."
    elif fault == "partial_answer":
        answer = task.labels["first_answer"]
    elif fault == "clean_long_way":
        assert task.detour is not None
        calls.insert(0, copy.deepcopy(task.detour))
    return calls, answer, []


def build(server: str, base: int) -> list[dict[str, Any]]:
    rng = random.Random(f"{server}-{base}")
    asked: set[str] = set()

    def make() -> Task:
        """A task whose request is not already in the conversation."""
        while True:
            task = TASKS[server](rng)
            if task.request not in asked:
                asked.add(task.request)
                return task

    tasks = [make(), two_part(make(), make())]
    if rng.random() < 0.5:
        tasks.append(make())
    out = []
    for variant in VARIANTS:
        vr = random.Random(f"{server}-{base}-{variant}")
        if variant == "partial_answer":
            target = 1
        elif variant == "clean_long_way":
            candidates = [i for i, t in enumerate(tasks) if t.detour is not None]
            if not candidates:
                continue
            target = vr.choice(candidates)
        else:
            target = vr.randrange(len(tasks))
        fault = "clean" if variant == "clean_long_way" else variant
        turns: list[dict[str, Any]] = []
        faulty_calls: list[dict[str, Any]] = []
        for i, task in enumerate(tasks):
            calls, answer, bad = (seed(task, variant, server, vr) if i == target and variant != "clean"
                                  else (task.calls, task.answer, []))
            turns.append({"role": "user", "content": task.request})
            turn: dict[str, Any] = {"role": "assistant", "content": answer}
            if calls:
                turn["mcp_tools_called"] = [
                    {"name": c.name, "args": c.args,
                     "result": {"content": [{"type": "text", "text": c.result}], "isError": c.is_error}}
                    for c in calls]
            faulty_calls += [{"turn": len(turns), "name": calls[k].name, "fault": fault} for k in bad]
            turns.append(turn)
        labels = {"fault": fault, "variant": variant, "hard": variant in ("clean_long_way", "wrong_argument_value"),
                  "server": server, "source": "generated",
                  "tasks": [fault if i == target and fault != "clean" else "clean" for i in range(len(tasks))],
                  "faulty_calls": faulty_calls}
        out.append({"id": f"{server}-{base}-{variant}", "labels": labels,
                    "test_case": {"name": f"{server}-{base}-{variant}", "turns": turns,
                                  "mcp_servers": [copy.deepcopy(SERVERS[server])]}})
    return out


def wrong_typed(call: dict[str, Any], servers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The call's arguments with one typed property given a value of another type, if its schema says types."""
    schema = next((t.get("input_schema") or t.get("inputSchema") for s in servers for t in s.get("available_tools", [])
                   if t["name"] == call["name"]), None)
    for name, prop in ((schema or {}).get("properties") or {}).items():
        kind = prop.get("type")
        if kind in ("string", "integer", "number", "boolean", "array", "object"):
            return {**(call.get("args") or {}), name: [] if kind == "string" else "not-a-" + kind}
    return None


# The recorded traces the corpus holds: the figures in BENCHMARKS.md were measured on exactly these, so a newer
# recording (Semantic Kernel, Mastra) joins only with the corpus regenerated and the figures measured again.
# The simulator's own fixture (simulated_pydantic_ai) is no framework scenario.
RECORDED = ("adk", "autogen", "crewai", "langgraph", "llamaindex", "openai_agents", "openinference",
            "openllmetry_mcp", "pydantic_ai_mcp", "pydantic_ai_session", "smolagents", "strands", "vercel_ai")


def from_recorded() -> list[dict[str, Any]]:
    """Conversations mapped from the recorded framework traces, clean and with call-level faults seeded."""
    from tracejudge.collector.input_files import read_test_cases
    from tracejudge.interactions import unit_indices
    from tracejudge.test_case import Turn

    out = []
    for name in RECORDED:
        path = ROOT / "tests" / "fixtures" / "real" / f"{name}.otlp.json"
        for n, case in enumerate(read_test_cases(path)):
            data = case.model_dump(mode="json", by_alias=False, exclude_none=True)
            data.pop("metadata", None)
            for turn in data["turns"]:
                turn.pop("metadata", None)
                # a resource read or prompt get whose recording holds neither what was read nor its result (MCP
                # spans without content capture) is left out: a judge could only mark the unknown down, and the
                # label is about what the agent did, which the recording does not say
                for key in ("mcp_resources_called", "mcp_prompts_called"):
                    kept = [c for c in turn.get(key) or [] if c.get("result")]
                    if kept:
                        turn[key] = kept
                    else:
                        turn.pop(key, None)
            called = [(i, t) for i, t in enumerate(data["turns"]) if t.get("mcp_tools_called")]
            if not called:
                continue
            units = unit_indices([Turn.model_validate(t) for t in data["turns"]])
            for variant in ("clean", "schema_invalid_arguments", "unknown_tool", "ignored_tool_error",
                            "unanswered"):
                variant_data = copy.deepcopy(data)
                turn_index, _ = called[0]
                call = variant_data["turns"][turn_index]["mcp_tools_called"][0]
                faulty: list[dict[str, Any]] = []
                if variant == "schema_invalid_arguments":
                    wrong = wrong_typed(call, variant_data.get("mcp_servers") or [])
                    if wrong is None:
                        continue  # the recording has no schema to break
                    call["args"] = wrong
                elif variant == "unknown_tool":
                    call["name"] = f"{call['name']}_v2"
                    call["result"] = {"content": [{"type": "text", "text": f"Unknown tool: {call['name']}"}],
                                      "isError": True}
                elif variant == "ignored_tool_error":
                    call["result"] = {"content": [{"type": "text", "text": ERRORS[0]}], "isError": True}
                elif variant == "unanswered":
                    last = max(i for i, t in enumerate(variant_data["turns"]) if t["role"] == "assistant"
                               and units[i] == units[turn_index])
                    variant_data["turns"][last]["content"] = "Let me look into that for you."
                if variant in CALL_FAULTS:
                    faulty.append({"turn": turn_index, "name": call["name"], "fault": variant})
                faulty += [  # errors the recorded agent saw and reported: the call failed, the agent did not
                    {"turn": i, "name": c["name"], "fault": "tool_error"}
                    for i, t in enumerate(variant_data["turns"]) for c in t.get("mcp_tools_called") or []
                    if ((c.get("result") or {}).get("is_error") or (c.get("result") or {}).get("isError")) and not (i == turn_index and variant in CALL_FAULTS
                                                                       and c is call)]
                tasks = ["clean"] * (max(units) + 1)
                if variant != "clean":
                    tasks[units[turn_index]] = variant
                for seen in faulty:  # the agent reported a failed call honestly: it behaved well, the task is
                    if seen["fault"] == "tool_error" and tasks[units[seen["turn"]]] == "clean":  # not done
                        tasks[units[seen["turn"]]] = HONEST_FAILURE
                name = f"recorded-{path.name.removesuffix('.otlp.json')}-{n}-{variant}"
                variant_data["name"] = name
                out.append({"id": name, "labels": {
                    "fault": variant, "variant": variant, "hard": False, "server": "recorded", "source": path.name,
                    "tasks": tasks, "faulty_calls": faulty}, "test_case": variant_data})
    return out


def corpus() -> list[dict[str, Any]]:
    rows = [row for server in SERVERS for base in range(BASES_PER_SERVER) for row in build(server, base)]
    return rows + from_recorded()


def main() -> None:
    rows = corpus()
    CORPUS.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    by_fault: dict[str, int] = {}
    for r in rows:
        by_fault[r["labels"]["variant"]] = by_fault.get(r["labels"]["variant"], 0) + 1
    print(f"wrote {len(rows)} conversations to {CORPUS.relative_to(ROOT)}: {json.dumps(by_fault)}")


if __name__ == "__main__":
    main()
