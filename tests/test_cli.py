"""`tracejudge evaluate` as users run it: a real process, files on disk, the judge on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cases import three_task_case, two_turn_case
from tests.test_metrics_llm import scripted
from tracejudge.collector.config import load_settings


def run(args: list[str], env_extra: dict[str, str] | None = None, cwd: Path | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TRACEJUDGE_"))}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.fixture
def judge_env(judge_server) -> dict[str, str]:
    judge_server.script = scripted
    return {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}


def test_all_pass_exits_zero_with_a_table(tmp_path, judge_env) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in (two_turn_case(), three_task_case())) + "\n")
    proc = run(["evaluate", str(path), "--model", "gpt-4o-mini"], judge_env)
    assert proc.returncode == 0, proc.stderr
    assert "2/2 test cases passed" in proc.stdout
    assert "mcp_call_validity" in proc.stdout and "mcp_use" in proc.stdout


def test_any_failure_exits_one_and_json_format_is_machine_readable(tmp_path, judge_env) -> None:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([two_turn_case(), three_task_case()]))
    proc = run(["evaluate", str(path), "--metric", "mcp_task_completion", "--threshold", "0.8",
                "--format", "json"], judge_env)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    scores = [t["metrics"][0]["score"] for t in result["test_results"]]
    assert scores == pytest.approx([0.9, 2.2 / 3])
    assert [t["metrics"][0]["success"] for t in result["test_results"]] == [True, False]


def test_validity_only_needs_no_judge(tmp_path) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(two_turn_case()))
    proc = run(["evaluate", str(path), "--metric", "mcp_call_validity"])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("content, message", [
    ('{"turns": []}\n', "at least one turn"),
    ('{"turns": [{"role": "user", "content": "a"}]}\n{"turns": [{"role": "bot"}]}\n', "cases.jsonl:2: invalid"),
    ('{"turns": [{"role": "user", "content": "a"}]}\nnot json\n', "cases.jsonl:2: not valid JSON"),
    ("", "holds no test case"),
])
def test_bad_input_exits_two_with_a_precise_message(tmp_path, content, message) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text(content)
    proc = run(["evaluate", str(path), "--metric", "mcp_call_validity"])
    assert proc.returncode == 2
    assert message in proc.stderr


def test_without_a_judge_validity_still_runs_and_judged_metrics_are_skipped(tmp_path) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(two_turn_case()))
    proc = run(["evaluate", str(path)])
    assert proc.returncode == 0, proc.stderr
    assert "tracejudge evaluate: mcp_use skipped: no API key for the LLM judge; set OPENAI_API_KEY" in proc.stderr
    assert [line.split()[1] for line in proc.stdout.splitlines()[1:-1]] == ["mcp_call_validity"]
    proc = run(["evaluate", str(path), "--metric", "mcp_use"])  # named: it must run, so no judge is an error
    assert proc.returncode == 2 and "set OPENAI_API_KEY" in proc.stderr


def test_a_case_that_is_not_applicable_is_not_counted_as_passed(tmp_path) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps({"name": "chat-only", "turns": [{"role": "user", "content": "hi"},
                                                                {"role": "assistant", "content": "hello"}]}))
    proc = run(["evaluate", str(path), "--metric", "mcp_call_validity"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0/1 test cases passed (1 not scored); total cost $0.000000"
    assert "n/a" in proc.stdout.splitlines()[1] and "No MCP calls" in proc.stdout.splitlines()[1]


def test_hybrid_without_a_system_one_key_falls_back_to_the_llm(tmp_path, judge_env) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(two_turn_case()))
    proc = run(["evaluate", str(path), "--metric", "mcp_task_completion", "--eval-mode", "hybrid", "--format",
                "json"], judge_env)
    assert proc.returncode == 0, proc.stderr
    [metric] = json.loads(proc.stdout)["test_results"][0]["metrics"]
    assert metric["score"] is not None and "no System One judge" in metric["system_one_fallback_reason"]


def test_evaluate_takes_trace_files_and_inspect_output_and_names_every_bad_line(tmp_path) -> None:
    trace = Path(__file__).parent / "fixtures" / "real" / "pydantic_ai_mcp.otlp.json"
    proc = run(["evaluate", str(trace), "--metric", "mcp_call_validity"])
    assert proc.returncode == 0, proc.stderr
    # mapped first, then scored: 3 of 4 calls valid (the server failed book_umbrella)
    assert any(line.split()[:4] == ["conv-weather-0001", "mcp_call_validity", "0.750", "PASS"]
               for line in proc.stdout.splitlines())
    inspected = tmp_path / "inspected.json"
    inspected.write_text(run(["inspect", str(trace), "--format", "json"]).stdout)
    again = run(["evaluate", str(inspected), "--metric", "mcp_call_validity"])
    assert again.stdout.splitlines()[1:] == proc.stdout.splitlines()[1:]
    bad = tmp_path / "cases.jsonl"
    bad.write_text("\n".join([json.dumps(two_turn_case()), "not json", '{"turns": [{"role": "bot"}]}',
                              "{also not json"]) + "\n")
    proc = run(["evaluate", str(bad), "--metric", "mcp_call_validity"])
    assert proc.returncode == 2
    assert "3 bad record(s)" in proc.stderr
    for where in ("cases.jsonl:2: not valid JSON", "cases.jsonl:3: ", "cases.jsonl:4: not valid JSON"):
        assert where in proc.stderr


def test_trace_commands_say_what_a_test_case_file_is(tmp_path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(two_turn_case()) + "\n")
    for command in (["inspect", str(path)], ["replay", str(path)]):
        proc = run(command)
        assert proc.returncode == 2, command
        assert f"is a test-case file (it has turns, not OTLP spans): score it with `tracejudge evaluate {path}`" \
            in proc.stderr


def test_inspect_into_a_closed_pipe_exits_quietly() -> None:
    trace = Path(__file__).parent / "fixtures" / "real" / "strands.otlp.json"
    inspect = subprocess.Popen([sys.executable, "-m", "tracejudge.collector.cli", "inspect", str(trace), "--explain"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert inspect.stdout is not None
    inspect.stdout.readline()
    inspect.stdout.close()  # what `| head -1` does
    _, err = inspect.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err


def test_missing_file_and_bad_threshold_exit_two(tmp_path) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(two_turn_case()))
    proc = run(["evaluate", str(tmp_path / "missing.json")])
    assert proc.returncode == 2 and "cannot read" in proc.stderr
    proc = run(["evaluate", str(path), "--threshold", "7"])
    assert proc.returncode == 2 and "threshold must be between 0 and 1" in proc.stderr


LOOPBACK_ANY_PORT = ("--grpc-port", "0", "--http-port", "0", "--admin-port", "0")  # were it to start


def test_serve_refuses_a_memory_limit_that_would_let_duckdb_invalidate_the_database(tmp_path) -> None:
    """Too small a buffer pool fails commits under load, and a failed rollback invalidates the database: the
    collector refuses it at start, saying how much it needs and why, instead of stopping later with the data at
    risk."""
    config = tmp_path / "tracejudge.toml"
    for small in ("32MB", "64MiB"):
        config.write_text(f'[store]\nmemory_limit = "{small}"\n')
        proc = run(["serve", "--config", str(config), "--db", str(tmp_path / "t.duckdb"), *LOOPBACK_ANY_PORT])
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"[store] memory_limit = '{small}' is too small: the collector needs 96MB or more" in proc.stderr
        assert 'Set memory_limit = "96MB" or more' in proc.stderr
        assert not (tmp_path / "t.duckdb").exists()
    config.write_text('[store]\nmemory_limit = "none"\n')  # no cap of tracejudge's: DuckDB's own default
    assert load_settings(config, environ={}).store.memory_limit is None


def test_serve_help_documents_every_setting() -> None:
    proc = run(["serve", "--help"])
    assert proc.returncode == 0
    for setting in ("grpc_port = 4317", "http_port = 4318", "admin_port = 4319", "ingest_token", "tls_client_ca",
                    "max_message_bytes", "db = tracejudge.duckdb", "TRACEJUDGE_INGEST_TOKEN", "--grpc-port"):
        assert setting in proc.stdout


def test_set_eval_mode_writes_the_config_file_and_keeps_the_rest(tmp_path) -> None:
    config = tmp_path / "tracejudge.toml"
    config.write_text('# my settings\n[scoring]\nthreshold = 0.7  # keep\n\n[sampling]\nrate = 0.1\n')
    proc = run(["set-eval-mode", "hybrid"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert str(config) in proc.stdout
    text = config.read_text()
    assert text == ('# my settings\n[scoring]\nthreshold = 0.7  # keep\neval_mode = "hybrid"\n\n'
                    '[sampling]\nrate = 0.1\n')
    proc = run(["set-eval-mode", "system_one"], cwd=tmp_path)
    assert 'eval_mode = "system_one"' in config.read_text() and "hybrid" not in config.read_text()
    elsewhere = tmp_path / "conf" / "tj.toml"
    elsewhere.parent.mkdir()
    proc = run(["set-eval-mode", "llm"], {"TRACEJUDGE_CONFIG": str(elsewhere)}, cwd=tmp_path)
    assert proc.returncode == 0 and elsewhere.read_text() == '[scoring]\neval_mode = "llm"\n'
    assert str(elsewhere) in proc.stdout


def test_set_eval_mode_refuses_a_broken_file_and_unknown_modes(tmp_path) -> None:
    config = tmp_path / "tracejudge.toml"
    config.write_text("[scoring\n")
    proc = run(["set-eval-mode", "llm"], cwd=tmp_path)
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr
    assert config.read_text() == "[scoring\n"
    proc = run(["set-eval-mode", "fast"], cwd=tmp_path)
    assert proc.returncode == 2 and "invalid choice: 'fast'" in proc.stderr


def test_evaluate_in_system_one_mode_from_the_config_file(tmp_path, s1_server) -> None:
    from tests.support.scripted_server import system_one_answers

    s1_server.script = lambda r: system_one_answers(
        {k: (0.9 if not k.endswith("q_2") else [0.0, 0.0, 0.0, 1.0]) for k in r.questions})
    (tmp_path / "tracejudge.toml").write_text('[scoring]\neval_mode = "system_one"\n')
    path = tmp_path / "case.json"
    path.write_text(json.dumps(two_turn_case()))
    env = {"TYPESAFE_BASE_URL": s1_server.root_url}
    proc = run(["evaluate", str(path), "--system-one-model", "jev-1.13.0", "--format", "json"], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    scores = {m["metric"]: m["score"] for m in result["test_results"][0]["metrics"]}
    assert scores["mcp_use"] == pytest.approx((1.8 + 0.9 + 1.0) / 4) == scores["mcp_task_completion"]
    [request] = s1_server.calls()
    assert request.body["model"] == "jev-1.13.0" and len(request.questions) == 6


def test_inspect_prints_the_conversations_a_trace_file_maps_to(tmp_path) -> None:
    from tests.fixtures import semconv_scenarios

    path = tmp_path / "trace.json"
    path.write_text(json.dumps(semconv_scenarios.otel_genai()))
    proc = run(["inspect", str(path)])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("conversation conv_42 (from gen_ai.conversation.id;")
    assert "  [0] user: What's the weather in Paris?" in lines
    assert '      MCP tool get-weather {"city": "Paris"} -> Rainy, 14°C' in lines
    assert '      MCP tool book-umbrella {"qty": 1} -> ERROR No umbrellas left' in lines
    proc = run(["inspect", str(path), "--format", "json"])
    [conversation] = json.loads(proc.stdout)
    assert conversation["conversation_id"] == "conv_42" and len(conversation["test_case"]["turns"]) == 4


def test_inspect_explain_names_the_span_and_the_mcp_rule_of_each_call(tmp_path) -> None:
    """A smolagents trace has no MCP span: [mapping] mcp_tools in tracejudge.toml makes its tools MCP calls,
    and --explain says which span each turn and call came from and which rule decided."""
    trace = Path(__file__).parent / "fixtures" / "real" / "smolagents.otlp.json"
    proc = run(["inspect", str(trace)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "      function get_weather {\"city\": \"Paris\"}" in proc.stdout.splitlines()
    (tmp_path / "tracejudge.toml").write_text('[mapping]\nmcp_tools = {weather = ["get_weather", "book_umbrella"]}\n')
    proc = run(["inspect", str(trace), "--explain"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "      MCP tool get_weather {\"city\": \"Paris\"} -> Paris: 18°C, light rain, wind 12 km/h from the " \
           "south-west." in lines
    assert "        MCP because: named for server 'weather' in [mapping] mcp_tools" in lines
    assert any(line.startswith("        from span 'MCPAdaptTool' ") and line.endswith("via openinference")
               for line in lines)
    assert any(line.startswith("  [0] user: span 'weather_agent.run' ") for line in lines)
    (tmp_path / "tracejudge.toml").write_text('[mapping]\nmcp_tools = {weather = []}\n')
    proc = run(["inspect", str(trace)], cwd=tmp_path)
    assert proc.returncode == 2 and "[mapping] mcp_tools" in proc.stderr and "at least one tool" in proc.stderr


def test_inspect_merges_a_server_file_and_reports_bad_input(tmp_path) -> None:
    from tests.fixtures import semconv_scenarios

    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps(semconv_scenarios.openllmetry()) + "\n")
    servers = tmp_path / "servers.toml"
    servers.write_text('[[servers]]\nserver_name = "weather"\n[[servers.available_tools]]\nname = "get-weather"\n'
                       'description = "from the file"\n')
    proc = run(["inspect", str(trace), "--servers", str(servers), "--format", "json"])
    assert proc.returncode == 0, proc.stderr
    names = {s["server_name"] for s in json.loads(proc.stdout)[0]["test_case"]["mcp_servers"]}
    assert "weather" in names
    bad = tmp_path / "bad.json"
    bad.write_text('{"resourceSpans": 7}')
    proc = run(["inspect", str(bad)])
    assert proc.returncode == 2 and "'resourceSpans' must be a list" in proc.stderr
    bad_servers = tmp_path / "s.json"
    bad_servers.write_text('{"servers": [{"transport": "carrier-pigeon"}]}')
    proc = run(["inspect", str(trace), "--servers", str(bad_servers)])
    assert proc.returncode == 2 and "server 0: server_name: Field required" in proc.stderr


def test_a_pretty_printed_json_file_error_points_at_its_line(tmp_path) -> None:
    path = tmp_path / "cases.json"
    path.write_text('{\n  "turns": [\n    {"role": "user", "content": "a"},\n    oops\n  ]\n}\n')
    proc = run(["evaluate", str(path), "--metric", "mcp_call_validity"])
    assert proc.returncode == 2 and "cases.json:4:" in proc.stderr


def test_bad_numbers_and_config_sections_are_clear_errors(tmp_path) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(two_turn_case()))
    proc = run(["evaluate", str(path), "--threshold", "abc"])
    assert proc.returncode == 2 and "threshold must be a number" in proc.stderr
    proc = run(["evaluate", str(path), "--concurrency", "0"])
    assert proc.returncode == 2 and "at least 1" in proc.stderr
    (tmp_path / "tracejudge.toml").write_text('scoring = "x"\n')
    proc = run(["evaluate", str(path), "--metric", "mcp_use"], {"OPENAI_API_KEY": "k"}, cwd=tmp_path)
    assert proc.returncode == 2 and "must be a table" in proc.stderr


def test_mcp_calls_over_several_replica_files(tmp_path) -> None:
    """The mcp_calls view reads the same over one file and over several replicas' files (--db a --db b)."""
    from tracejudge.collector.store.span_store import SpanStore

    for name, tool, failed in (("a", "get_weather", False), ("b", "book_umbrella", True)):
        store = SpanStore(tmp_path / f"{name}.duckdb")
        store.open()
        case = {"turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok",
                "mcp_tools_called": [{"name": tool, "args": {}, "result": {
                    "content": [{"type": "text", "text": "r"}], "isError": failed}}]}]}
        store.cursor().execute("INSERT INTO conversations (conversation_id, version, content_hash, status, test_case, "
                               "assembled_at) VALUES (?, 1, 'h', 'complete', ?, now())", [f"conv-{name}",
                                                                                          json.dumps(case)])
        store.close()
    proc = run(["query", "--url", "http://127.0.0.1:9", "--db", str(tmp_path / "a.duckdb"), "--db",
                str(tmp_path / "b.duckdb"), "--format", "csv",
                "SELECT conversation_id, name, is_error FROM mcp_calls ORDER BY 1"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["conversation_id,name,is_error", "conv-a,get_weather,false",
                                        "conv-b,book_umbrella,true"]
