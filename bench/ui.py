"""Web UI page times on a large history: a DuckDB file with N conversations (three scores each, MCP calls with
errors, 8 spans each), then each page's data queries timed as a page load runs them (summary refresh included);
the conversation page of one conversation with `--big-spans` spans (50 traces of model calls with their system
prompt and tools, MCP calls) is timed with its HTML rendered too.
Run: `python bench/ui.py [--conversations 100000] [--big-spans 5000]`."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracejudge.collector.config import StoreSettings  # noqa: E402
from tracejudge.collector.pipeline.summary_tables import SummaryTables  # noqa: E402
from tracejudge.collector.store.span_store import SpanStore  # noqa: E402
from tracejudge.collector.ui import views  # noqa: E402
from tracejudge.collector.ui.rendering import environment  # noqa: E402


def populate(con, n: int) -> None:  # noqa: ANN001
    case = {"turns": [{"role": "user", "content": "What's the weather in Paris?"},
                      {"role": "assistant", "content": "Rainy.", "mcp_tools_called": [
                          {"name": "get_weather", "args": {"city": "Paris"},
                           "result": {"content": [{"type": "text", "text": "Rainy"}], "isError": False}}]}],
            "mcp_servers": [{"server_name": "weather", "available_tools": [{"name": "get_weather"}]}]}
    failed = json.loads(json.dumps(case))
    failed["turns"][1]["mcp_tools_called"][0]["result"]["isError"] = True
    con.execute("CREATE TEMP TABLE cases AS SELECT ?::JSON AS ok, ?::JSON AS bad", [json.dumps(case),
                                                                                  json.dumps(failed)])
    con.execute(f"""
        INSERT INTO conversations (conversation_id, version, content_hash, status, service_name, agent_name, turns,
                                   mcp_calls, trace_ids, test_case, assembled_at)
        SELECT 'c' || i, 1, md5(i::VARCHAR), 'complete', 'svc-' || (i % 5), 'agent-' || (i % 3), 2, 1,
               ['t' || i], CASE WHEN i % 10 = 0 THEN bad ELSE ok END,
               now() - to_seconds(i * 6) FROM range({n}) t(i), cases""")
    for metric in ("mcp_use", "mcp_task_completion", "mcp_call_validity"):
        con.execute(f"""
            INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, score, success,
                                service_name, agent_name, evaluation_cost, breakdown, scored_at)
            SELECT 'c' || i, 1, '{metric}', 'cfg', (i % 100) / 100.0, (i % 100) >= 50, 'svc-' || (i % 5),
                   'agent-' || (i % 3), 0.001, '{{}}', now() - to_seconds(i * 6) FROM range({n}) t(i)""")


SPANS_PER_CONVERSATION = 8


def populate_spans(con, n: int, big_spans: int) -> None:  # noqa: ANN001
    """8 spans for each of the `n` conversations (their start times spread as the conversations'), then one
    conversation 'big' of `big_spans` spans in 50 traces: a root run span, then model calls (usage, system prompt,
    offered tools, 1 KB of messages), an MCP tool call every sixth span (as in the recorded frameworks: 800
    calls in 5,000 spans) and agent steps under it."""
    con.execute(f"""
        INSERT INTO span_records
        SELECT 't' || i, printf('%016x', i * 8 + j), CASE WHEN j = 0 THEN NULL ELSE printf('%016x', i * 8) END,
               CASE WHEN j = 0 THEN 'invoke_agent' WHEN j % 2 = 1 THEN 'chat' ELSE 'execute_tool get_weather' END,
               1, epoch_ns(now()) - i * 6000000000 + j * 1000000,
               epoch_ns(now()) - i * 6000000000 + j * 1000000 + 900000,
               0, NULL, 1, 1,
               json_object('gen_ai.operation.name', CASE WHEN j = 0 THEN 'invoke_agent' WHEN j % 2 = 1 THEN 'chat'
                                                        ELSE 'execute_tool' END,
                           'gen_ai.usage.input_tokens', 120, 'gen_ai.usage.output_tokens', 20,
                           'gen_ai.request.model', 'gpt-4o-mini', 'filler', repeat('x', 200)),
               '[]', '[]', 'c' || i, 'gen_ai.conversation.id', now() - to_seconds(i * 6)
        FROM range({n}) t(i), range({SPANS_PER_CONVERSATION}) s(j)""")
    traces, per_trace = 50, max(2, big_spans // 50)
    start = "epoch_ns(now()) - 3600000000000"
    system = json.dumps([{"role": "system", "parts": [{"type": "text", "content": "You are a helpful weather "
                                                                                  "assistant. " * 20}]},
                         {"role": "user", "parts": [{"type": "text", "content": "What's the weather? " * 50}]}])
    tools = json.dumps([{"type": "function", "name": name, "description": f"{name} of a city",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
                        for name in ("get_weather", "book_umbrella")])
    con.execute(f"""
        INSERT INTO span_records
        SELECT 'big' || t, printf('b%07x%08x', t, j), CASE WHEN j = 0 THEN NULL ELSE printf('b%07x%08x', t, 0) END,
               CASE WHEN j = 0 THEN 'invoke_agent' WHEN j % 2 = 1 THEN 'chat' WHEN j % 6 = 2
                    THEN 'execute_tool get_weather' ELSE 'agent step' END,
               1, {start} + t * 10000000000 + j * 2000000, {start} + t * 10000000000 + j * 2000000 + 1500000,
               0, NULL, 1, 1,
               CASE WHEN j = 0 THEN json_object('gen_ai.operation.name', 'invoke_agent')
                    WHEN j % 2 = 1 THEN json_object('gen_ai.operation.name', 'chat', 'gen_ai.request.model',
                        'gpt-4o-mini', 'gen_ai.usage.input_tokens', 900, 'gen_ai.usage.output_tokens', 40,
                        'gen_ai.input.messages', ?, 'gen_ai.tool.definitions', ?)
                    WHEN j % 6 = 2 THEN json_object('gen_ai.operation.name', 'execute_tool', 'gen_ai.tool.name',
                        'get_weather', 'mcp.method.name', 'tools/call', 'gen_ai.tool.call.arguments',
                        '{{"city": "Paris"}}')
                    ELSE json_object('step', j)
               END, '[]', '[]', 'big', 'gen_ai.conversation.id', now()
        FROM range({traces}) a(t), range({per_trace}) b(j)""", [system, tools])
    turns = []
    for t in range(traces):
        turns.append({"role": "user", "content": f"Question {t}"})
        calls = list(range(2, per_trace, 6))  # a call every sixth span, as in the recorded frameworks
        turns.append({"role": "assistant", "content": f"Answer {t}", "mcp_tools_called": [
            {"name": "get_weather", "args": {"city": "Paris"},
             "result": {"content": [{"type": "text", "text": "Rainy"}], "isError": False}} for _ in calls],
            "metadata": {"trace_id": f"big{t}", "span_id": f"b{t:07x}{0:08x}", "call_spans": {"tool": [
                {"span_ids": [f"b{t:07x}{j:08x}"], "duration_ms": 1.5} for j in calls]}}})
    case = {"turns": turns, "mcp_servers": [{"server_name": "weather", "available_tools": [{"name": "get_weather"}]}]}
    con.execute("""
        INSERT INTO conversations (conversation_id, version, content_hash, status, service_name, agent_name, turns,
                                   mcp_calls, trace_ids, first_span_ns, last_span_ns, test_case, assembled_at)
        SELECT 'big', 1, 'h', 'complete', 'svc', 'agent', ?, ?, ?,
               (SELECT min(start_ns) FROM span_records WHERE conversation_key = 'big'),
               (SELECT max(end_ns) FROM span_records WHERE conversation_key = 'big'), ?, now()""",
                [len(turns), sum(len(t.get("mcp_tools_called", [])) for t in turns),
                 [f"big{t}" for t in range(traces)], json.dumps(case)])


def render_conversation(env, data) -> str:  # noqa: ANN001
    """The conversation page's HTML, as the web UI renders it."""
    return env.get_template("conversation.html").render(
        c=data, page="conversations", nonce="n", signed_in=False, csrf="", stale=None, reviewer=None, admin=True,
        reviewing=False, live=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--big-spans", type=int, default=5000, help="spans of the one large conversation")
    parser.add_argument("--memory-limit", default=StoreSettings().memory_limit,
                        help="DuckDB's memory_limit for the file (default: the collector's [store] memory_limit)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore(Path(tmp) / "ui.duckdb", memory_limit=args.memory_limit, threads=StoreSettings().threads)
        print(f"memory_limit {args.memory_limit}")
        store.open()
        started = time.perf_counter()
        populate(store.cursor(), args.conversations)
        populate_spans(store.cursor(), args.conversations, args.big_spans)
        store.cursor().execute("CHECKPOINT")  # as a long-running collector's file is: its WAL checkpointed
        print(f"{args.conversations:,} conversations, their {SPANS_PER_CONVERSATION * args.conversations:,} spans, "
              f"{3 * args.conversations:,} scores and a conversation of {args.big_spans:,} spans written in "
              f"{time.perf_counter() - started:.1f} s")
        summaries = SummaryTables()
        started = time.perf_counter()
        summaries.refresh(store.cursor())
        print(f"summary tables built from scratch in {time.perf_counter() - started:.1f} s (once, at the upgrade)")
        pages = {
            "overview (7d)": lambda con: views.overview(con, "7d", "", None),
            "overview (30d, by service)": lambda con: views.overview(con, "30d", "service", None),
            "conversations, first page": lambda con: views.conversations(con, views.ConversationFilter()),
            "conversations, failing mcp_use, page 20": lambda con: views.conversations(
                con, views.ConversationFilter(metric="mcp_use", result="fail", page=20)),
            "conversations with an MCP error": lambda con: views.conversations(
                con, views.ConversationFilter(mcp_error="1")),
            "conversations, text search": lambda con: views.conversations(con, views.ConversationFilter(q="paris")),
            "one conversation": lambda con: views.conversation(con, "c12345", None, None),
            "MCP tools (7d)": lambda con: views.tools(con, "7d"),
            f"conversation of {args.big_spans:,} spans": lambda con: views.conversation(con, "big", None, None),
            f"conversation of {args.big_spans:,} spans, rendered": lambda con: render_conversation(
                env, views.conversation(con, "big", None, None)),
            f"conversation of {args.big_spans:,} spans, last page, rendered": lambda con: render_conversation(
                env, views.conversation(con, "big", None, None, 1_000)),
        }
        env = environment(static=False)
        for name, page in pages.items():
            times = []
            for _ in range(args.repeat):
                con = store.cursor()
                t = time.perf_counter()
                summaries.refresh(con)  # as each page load does: nothing new here, so only the check
                page(con)
                times.append((time.perf_counter() - t) * 1000)
            print(f"{name:42} median {statistics.median(times):7.1f} ms, best {min(times):7.1f} ms")
        store.close()


if __name__ == "__main__":
    main()
