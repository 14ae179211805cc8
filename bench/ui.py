"""Web UI page times on a large history: a DuckDB file with N conversations (three scores each, MCP calls with
errors), then each page's data queries timed as a page load runs them (summary refresh included).
Run: `python bench/ui.py [--conversations 100000]`."""

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--memory-limit", default=StoreSettings().memory_limit,
                        help="DuckDB's memory_limit for the file (default: the collector's [store] memory_limit)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore(Path(tmp) / "ui.duckdb", memory_limit=args.memory_limit, threads=StoreSettings().threads)
        print(f"memory_limit {args.memory_limit}")
        store.open()
        started = time.perf_counter()
        populate(store.cursor(), args.conversations)
        store.cursor().execute("CHECKPOINT")  # as a long-running collector's file is: its WAL checkpointed
        print(f"{args.conversations:,} conversations and {3 * args.conversations:,} scores written in "
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
        }
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
