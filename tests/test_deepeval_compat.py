"""DeepEval-style tests of the test-case model, written here: what a DeepEval user's own tests check about
`Turn` and `ConversationalTestCase` passes after changing the import to tracejudge."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import duckdb
import pytest

from tests.support.cases import two_turn_case
from tests.support.scripted_server import completion
from tracejudge import (
    AsyncConfig,
    CacheConfig,
    DisplayConfig,
    ErrorConfig,
    LLMJudge,
    MCPCallValidityMetric,
    MCPTaskCompletionMetric,
    assert_test,
    evaluate,
)
from tracejudge.errors import EvaluationError, InvalidTestCaseError
from tracejudge.test_case import ConversationalTestCase, MCPServer, MCPToolCall, Turn, load_test_case

DEEPEVAL_EXAMPLE = Path(__file__).parent / "fixtures" / "deepeval"


def _turns() -> list[Turn]:
    return [Turn(role="user", content="Book a table for two"), Turn(role="assistant", content="Booked for 19:00")]


def test_turn_takes_additional_metadata_under_every_spelling() -> None:
    assert Turn(role="user", content="hi", additional_metadata={"a": 1}).metadata == {"a": 1}
    assert Turn.model_validate({"role": "user", "content": "hi", "additionalMetadata": {"b": 2}}).metadata == {"b": 2}
    turn = Turn(role="user", content="hi", metadata={"c": 3})
    with pytest.warns(DeprecationWarning, match="use 'metadata'"):
        assert turn.additional_metadata == {"c": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        turn.additional_metadata = {"d": 4}
    assert turn.metadata == {"d": 4}


def test_the_case_takes_deepevals_fields_and_detects_multimodal_placeholders() -> None:
    case = ConversationalTestCase(turns=_turns(), comments="flaky on Mondays", flaky=True,
                                  additional_metadata={"team": "search"})
    assert (case.comments, case.flaky, case.metadata, case.multimodal) == ("flaky on Mondays", True,
                                                                           {"team": "search"}, False)
    pictured = ConversationalTestCase(turns=[Turn(role="user", content="What is this? [DEEPEVAL:IMAGE:abc123]")])
    assert pictured.multimodal is True
    assert ConversationalTestCase.model_validate(case.model_dump()).comments == "flaky on Mondays"


def test_turns_are_copied_so_changing_one_afterwards_leaves_the_case_alone() -> None:
    turns = _turns()
    case = ConversationalTestCase(turns=turns)
    turns[0].content = "Cancel everything"
    turns.append(Turn(role="user", content="and one more"))
    assert case.turns[0].content == "Book a table for two" and len(case.turns) == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"turns": []}, "'turns' must not be empty"),
    ({"turns": ["hello"]}, "'turns' must be a list of Turn or dict, got <class 'str'>"),
    ({"turns": [Turn(role="user", content="hi")], "context": "not a list"}, "'context' must be None or a list"),
    ({"turns": [Turn(role="user", content="hi")], "context": ["ok", 3]}, "'context' must be None or a list"),
])
def test_wrong_shapes_raise_type_error_with_deepevals_message(kwargs: dict, message: str) -> None:
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ConversationalTestCase(**kwargs)


def test_files_with_those_shapes_still_get_tracejudges_error_naming_the_problem() -> None:
    with pytest.raises(InvalidTestCaseError, match="'turns' must not be empty"):
        load_test_case({"turns": []})


def _broken_case() -> dict:
    """A call to a tool no server advertises: mcp_call_validity fails it without a judge."""
    case = two_turn_case()
    case["turns"][1]["mcpToolsCalled"][0]["name"] = "book_hotel"
    return case


def test_assert_test_passes_quietly_and_fails_naming_the_metric_and_its_reason() -> None:
    assert_test(two_turn_case(), [MCPCallValidityMetric()])
    with pytest.raises(AssertionError) as failed:
        assert_test(_broken_case(), [MCPCallValidityMetric()])
    message = str(failed.value)
    assert message.startswith("Metrics: MCP Call Validity (score: 0.000, threshold: 0.5") and "book_hotel" in message


def test_a_pytest_run_with_assert_test_fails_with_the_reason(tmp_path: Path) -> None:
    test_file = tmp_path / "test_agent.py"
    test_file.write_text(
        "import json\n"
        "from tracejudge import MCPCallValidityMetric, assert_test\n"
        f"CASES = json.loads({json.dumps(json.dumps([two_turn_case(), _broken_case()]))})\n"
        "def test_good():\n    assert_test(CASES[0], [MCPCallValidityMetric(), MCPCallValidityMetric(threshold=0.9)])\n"
        "def test_bad():\n    assert_test(CASES[1], [MCPCallValidityMetric()])\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed" in done.stdout and "book_hotel" in done.stdout

    # the same run recorded in a tracejudge database: CI results answer the same SQL as production scores
    db = tmp_path / "ci.duckdb"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file),
                           "--tracejudge-db", str(db)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1 and "recorded 2 assert_test result(s)" in done.stdout, done.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT agent_name, metric, success, reason FROM latest_scores WHERE service_name = 'ci' "
                           "ORDER BY agent_name").fetchall()
        [(turns,)] = con.execute("SELECT DISTINCT turns FROM conversations").fetchall()
        [(score_rows,)] = con.execute("SELECT count(*) FROM scores").fetchone(),  # the same metric twice: 2 rows
    assert [(agent.split("::")[1], metric, success) for agent, metric, success, _ in rows] == \
        [("test_bad", "mcp_call_validity", False), ("test_good", "mcp_call_validity", True)]
    assert "book_hotel" in rows[0][3] and turns == 2 and score_rows == 3


def test_tracejudge_test_run_runs_tests_in_parallel_workers_and_records_every_result(tmp_path: Path) -> None:
    """`deepeval test run -n 2` becomes `tracejudge test run -n 2`: pytest-xdist workers, one record at the end."""
    pytest.importorskip("xdist")
    (tmp_path / "pids").mkdir()
    test_file = tmp_path / "test_agents.py"
    test_file.write_text(
        "import json, os, pathlib, time\n"
        "import pytest\n"
        "from tracejudge import MCPCallValidityMetric, assert_test\n"
        f"CASES = json.loads({json.dumps(json.dumps([two_turn_case(), _broken_case()]))})\n"
        "@pytest.mark.parametrize('n', range(4))\n"
        "def test_agent(n):\n"
        f"    pathlib.Path({str(tmp_path / 'pids')!r}, str(n)).write_text(str(os.getpid()))\n"
        "    time.sleep(0.5)  # long enough that both workers take tests\n"
        "    assert_test(CASES[n % 2], [MCPCallValidityMetric()])\n")
    db = tmp_path / "ci.duckdb"
    done = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "test", "run", str(test_file), "-n", "2",
                           "--db", str(db), "-p", "no:cacheprovider", "-q"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 failed, 2 passed" in done.stdout and "book_hotel" in done.stdout
    assert "recorded 4 assert_test result(s)" in done.stdout
    assert len({p.read_text() for p in (tmp_path / "pids").iterdir()}) == 2  # two worker processes
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT agent_name, success FROM latest_scores WHERE service_name = 'ci' "
                           "ORDER BY agent_name").fetchall()
    assert [(agent.split("::")[1], success) for agent, success in rows] == [
        ("test_agent[0]", True), ("test_agent[1]", False), ("test_agent[2]", True), ("test_agent[3]", False)]

    bad = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "test", "run", "-n", "zero"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode == 2 and "expected a number of workers or 'auto'" in bad.stderr


def test_evaluate_returns_deepevals_result_shape_and_takes_its_configs() -> None:
    result = evaluate([two_turn_case(), _broken_case()], [MCPCallValidityMetric()],
                      async_config=AsyncConfig(max_concurrent=2), display_config=DisplayConfig(print_results=False),
                      error_config=ErrorConfig(ignore_errors=True), cache_config=CacheConfig(write_cache=False))
    good, bad = result.test_results
    assert (good.success, bad.success, good.conversational) == (True, False, True)
    data = bad.metrics_data[0]
    assert (data.name, data.success, data.strict_mode, data.evaluation_model, data.input_tokens) == \
        ("MCP Call Validity", False, False, None, 0)


@pytest.mark.parametrize("config, message", [
    ({"async_config": AsyncConfig(throttle_value=2)}, "lower max_concurrent"),
    ({"display_config": DisplayConfig(file_output_dir="out")}, "model_dump_json"),
    ({"cache_config": CacheConfig()}, "keeps no result cache"),
    ({"cache_config": CacheConfig(write_cache=False, use_cache=True)}, "keeps no result cache"),
])
def test_configs_it_cannot_honour_are_refused_not_ignored(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate([two_turn_case()], [MCPCallValidityMetric()], print_results=False, **config)


def test_error_config_raises_on_a_metric_error_or_skips_a_case_without_a_task() -> None:
    no_task = {"turns": [{"role": "assistant", "content": "Hello, how can I help?"}]}
    judge = LLMJudge("gpt-4.1-mini", base_url="http://127.0.0.1:9/v1", api_key="sk-test-not-a-secret")  # never called
    with pytest.raises(EvaluationError, match="ignore_errors=True"):
        evaluate([no_task], [MCPTaskCompletionMetric(model=judge)], print_results=False,
                 error_config=ErrorConfig())
    result = evaluate([no_task], [MCPTaskCompletionMetric(model=judge)], print_results=False,
                      error_config=ErrorConfig(skip_on_missing_params=True))
    [skipped] = result.test_results[0].metrics_data
    assert skipped.skipped and skipped.error is None and skipped.score is None


def test_servers_take_duck_typed_tools_and_the_mcp_sdks_types() -> None:
    from types import SimpleNamespace

    mcp_types = pytest.importorskip("mcp.types")
    server = MCPServer(server_name="flights", available_tools=[
        SimpleNamespace(name="search_flights", description="Find flights",
                        inputSchema={"type": "object", "properties": {"to": {"type": "string"}}}),
        mcp_types.Tool(name="book_flight", inputSchema={"type": "object"}),
    ])
    assert [t.name for t in server.available_tools] == ["search_flights", "book_flight"]
    assert server.available_tools[0].input_schema["properties"] == {"to": {"type": "string"}}
    case = ConversationalTestCase(turns=_turns(), mcp_servers=[server])
    assert MCPCallValidityMetric().measure(case) is None  # no calls: not applicable, and no error


def _sdk_flights_server():  # noqa: ANN202 - the MCP SDK's own server class
    """The DeepEval example's server (tests/fixtures/deepeval/flights_server.py), built in memory."""
    pytest.importorskip("mcp.server.mcpserver")
    spec = importlib.util.spec_from_file_location("flights_server", DEEPEVAL_EXAMPLE / "flights_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.flights_server()


def test_a_case_takes_the_mcp_sdks_server_object_and_refuses_what_cannot_be_a_server() -> None:
    case = ConversationalTestCase(turns=_turns(), mcp_servers=[_sdk_flights_server(), {"server_name": "internal"}])
    assert [s.server_name for s in case.mcp_servers] == ["flights", "internal"]
    assert [t.name for t in case.mcp_servers[0].available_tools] == ["search_flights"]
    assert len(case.mcp_servers[0].available_resources) == 1 and len(case.mcp_servers[0].available_prompts) == 1
    with pytest.raises(TypeError, match="'mcp_servers' must be a list of MCPServer, dict or MCP SDK server"):
        ConversationalTestCase(turns=_turns(), mcp_servers=["not-a-server"])


async def test_inside_a_running_event_loop_the_server_object_is_refused_with_what_to_do() -> None:
    server = _sdk_flights_server()
    with pytest.raises(TypeError, match=r"await MCPServer.from_mcp\(server\)"):
        ConversationalTestCase(turns=_turns(), mcp_servers=[server])
    case = ConversationalTestCase(turns=_turns(), mcp_servers=[await MCPServer.from_mcp(server)])
    assert case.mcp_servers[0].available_tools[0].name == "search_flights"


async def test_from_mcp_reads_every_page_and_only_a_missing_capability_is_an_empty_listing() -> None:
    """A session that pages its tools (the MCP SDK's ListToolsResult with next_cursor) and lacks prompts."""
    mcp_types = pytest.importorskip("mcp.types")
    from mcp.shared.exceptions import MCPError

    class PagedSession:  # the client side of a server that pages; its answers are the SDK's own types
        server_info = mcp_types.Implementation(name="paged", version="1")

        async def list_tools(self, cursor: str | None = None) -> object:
            page = int(cursor or 0)
            tools = [mcp_types.Tool(name=f"tool_{page}_{i}", input_schema={"type": "object"}) for i in range(2)]
            return mcp_types.ListToolsResult(tools=tools, next_cursor=str(page + 1) if page < 2 else None)

        async def list_prompts(self, cursor: str | None = None) -> object:
            raise MCPError(-32601, "Method not found")

    server = await MCPServer.from_mcp(PagedSession())
    assert server.server_name == "paged" and len(server.available_tools) == 6 and server.available_prompts == []

    class SdkSession(PagedSession):  # mcp 2.x's ClientSession: the cursor travels in `params`
        async def list_tools(self, *, params: object = None) -> object:
            return await PagedSession.list_tools(self, getattr(params, "cursor", None))

    assert len((await MCPServer.from_mcp(SdkSession())).available_tools) == 6

    class Looping(PagedSession):  # a server that hands back the same cursor forever
        async def list_tools(self, cursor: str | None = None) -> object:
            return mcp_types.ListToolsResult(tools=[mcp_types.Tool(name="t", input_schema={})], next_cursor="again")

    with pytest.raises(ValueError, match="listing does not end"):
        await MCPServer.from_mcp(Looping())

    class BrokenSession(PagedSession):
        async def list_prompts(self, cursor: str | None = None) -> object:
            raise FileNotFoundError("prompts/not found on disk")  # a real failure is not "no prompts"

    with pytest.raises(FileNotFoundError):
        await MCPServer.from_mcp(BrokenSession())
    first_page = await PagedSession().list_tools()
    with pytest.warns(UserWarning, match="later pages are missing"):
        MCPServer(server_name="paged", available_tools=first_page)


def test_a_kept_object_does_not_stop_scoring_a_case_with_other_python_objects_in_its_metadata() -> None:
    import datetime as dt

    mcp_types = pytest.importorskip("mcp.types")
    when = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
    case = ConversationalTestCase(turns=_turns(), metadata={"run": object(), "at": when}, mcp_servers=[MCPServer(
        server_name="flights", available_tools=[mcp_types.Tool(name="search_flights", input_schema={})])])
    normalized = case.normalized()
    assert normalized.metadata["at"] is when and type(normalized.mcp_servers[0].available_tools[0]).__module__ \
        == "tracejudge.test_case"
    assert MCPCallValidityMetric().measure(case) is None  # no calls: not applicable, and no error
    resource = mcp_types.Resource(name="r", uri="file:///r")  # fits a tool's JSON, but is not kept as a tool
    assert type(MCPServer(server_name="x", available_tools=[resource]).available_tools[0]).__name__ == "Tool"


async def test_live_mcp_objects_are_kept_as_given_scored_and_round_trip_to_the_same_json() -> None:
    """What a DeepEval user builds from a real MCP session: the SDK's Tool and CallToolResult objects, kept."""
    mcp = pytest.importorskip("mcp")
    mcp_types = pytest.importorskip("mcp.types")
    sdk_server = _sdk_flights_server()
    async with mcp.Client(sdk_server) as client:
        listed = await client.list_tools()
        result = await client.call_tool("search_flights", {"to": "Paris", "date": "2026-12-24"})
        server = await MCPServer.from_mcp(client, transport="stdio")
    assert server.server_name == "flights" and [t.name for t in server.available_tools] == ["search_flights"]
    assert len(server.available_resources) == 1 and len(server.available_prompts) == 1
    assert isinstance(server.available_tools[0], mcp_types.Tool)
    assert [t.name for t in MCPServer(server_name="f", available_tools=listed).available_tools] == ["search_flights"]
    assert (await MCPServer.from_mcp(sdk_server)).available_tools[0].name == "search_flights"  # the server itself

    call = MCPToolCall(name="search_flights", args={"to": "Paris"}, result=result)  # "date" is required
    case = ConversationalTestCase(mcp_servers=[server], turns=[
        Turn(role="user", content="Flights to Paris on Christmas Eve?"),
        Turn(role="assistant", content="AF123 it is.", mcp_tools_called=[call])])
    kept = case.turns[1].mcp_tools_called[0].result
    assert isinstance(kept, mcp_types.CallToolResult) and kept == result  # turns are copied, as in DeepEval
    assert case.mcp_servers[0].available_tools[0] is server.available_tools[0]

    text = case.model_dump_json()
    again = ConversationalTestCase.model_validate_json(text)
    assert again.model_dump_json() == text  # the same JSON whichever way the case was built
    dumped_result = json.loads(text)["turns"][1]["mcp_tools_called"][0]["result"]
    assert dumped_result["content"][0]["text"] == "Paris-2026-12-24: AF123"

    metric = MCPCallValidityMetric()
    assert metric.measure(case) == 0.0 and "date" in (metric.reason or "")  # read through the kept tool's schema
    assert MCPCallValidityMetric().measure(again) == 0.0
    assert isinstance(case.turns[1].mcp_tools_called[0].result, mcp_types.CallToolResult)  # scoring read a copy


def test_deepevals_mcp_example_runs_after_replacing_deepeval_with_tracejudge(judge_server, tmp_path: Path) -> None:
    """DeepEval's MCP walkthrough (tests/fixtures/deepeval/mcp_multi_turn.py, in DeepEval's API) run after `sed
    s/deepeval/tracejudge/g` and nothing else: a real MCP server over stdio, both MCP metrics through `evaluate()`
    and one `measure()`d standalone (judge: a scripted server on loopback)."""
    pytest.importorskip("mcp")

    def script(request):  # noqa: ANN001, ANN202
        if request.judge == "final_reason":
            return completion({"reason": f"final {request.data['score']:.2f}"})
        return completion({"reason": f"{request.judge} ok", "score": 0.8})

    judge_server.script = script
    for name in ("mcp_multi_turn.py", "flights_server.py"):
        (tmp_path / name).write_bytes((DEEPEVAL_EXAMPLE / name).read_bytes())
    subprocess.run(["sed", "-i", "s/deepeval/tracejudge/g", "mcp_multi_turn.py"], cwd=tmp_path, check=True)
    assert "deepeval" in (DEEPEVAL_EXAMPLE / "mcp_multi_turn.py").read_text()  # the original is DeepEval's
    done = subprocess.run([sys.executable, "mcp_multi_turn.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    summary, standalone = done.stdout, done.stdout.rstrip().splitlines()[-1]
    assert "1/1 test cases passed" in summary and "mcp_use " in summary and "mcp_task_completion " in summary
    assert standalone == "0.8 final 0.80"

    # the judge saw the live results' contents, read through the MCP SDK's own objects
    steps = [r.data for r in judge_server.calls("mcp_argument_correctness")][0]["steps"][0]["mcp_calls"]
    assert [c["kind"] for c in steps] == ["tool", "resource", "prompt"]
    assert "AF123" in steps[0]["result"]["text"] and "CDG" in steps[1]["result"]["text"]
    assert steps[2]["result"]["messages"][0]["text"] == "Plan a trip to Paris"


@pytest.mark.parametrize("override, expected", [
    (lambda task: task.task, "T"),                                     # by name, as DeepEval passes them
    (lambda t: t.task, "T"),                                           # by position, as older DeepEval did
    (lambda t, strict: f"{t.task} {strict}", "T True"),                # mixed: the named one by name
    (lambda t, extra=1: f"{t.task} {extra}", "T 1"),                   # an unnamed default keeps its value
    (lambda task, **rest: ",".join(sorted(rest)), "multimodal,steps_taken,strict"),
])
def test_template_overrides_get_deepevals_variables_whatever_they_call_them(override, expected) -> None:
    from tracejudge.evaluation_template import TemplateTask, call_declared

    context = {"task": TemplateTask(task="T"), "steps_taken": "S", "multimodal": False, "strict": True}
    assert call_declared(override, "get_task_completion_score", context) == expected


def test_the_evaluation_library_imports_none_of_the_collector() -> None:
    """A DeepEval user importing the library gets no database, no gRPC server and no web server with it: every
    module of `tracejudge` outside its collector and mapping imports without DuckDB, gRPC, aiohttp, pyarrow or
    them."""
    code = ("import importlib, pkgutil, sys, tracejudge\n"
            "names = [m.name for m in pkgutil.walk_packages(tracejudge.__path__, 'tracejudge.')\n"
            "         if not m.name.startswith(('tracejudge.collector', 'tracejudge.mapping'))]\n"
            "for name in names: importlib.import_module(name)\n"
            "print(len(names), sorted(k for k in ('duckdb', 'grpc', 'aiohttp', 'pyarrow', 'tracejudge.collector', "
            "'tracejudge.mapping') if k in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, imported = done.stdout.split(" ", 1)
    assert int(count) > 20 and imported.strip() == "[]", done.stdout


def test_tracejudge_test_run_without_pytest_says_what_to_install(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['pytest'] = None; sys.argv = ['tracejudge', 'test', 'run', 'x.py']\n"
            "from tracejudge.collector.cli import main; sys.exit(main())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "pip install pytest" in done.stderr


# --- the single-turn surface: LLMTestCase, MLLMImage, MCPUseMetric ----------------------------------------


def test_an_llm_test_case_takes_deepevals_fields_spellings_and_type_errors() -> None:
    from tracejudge.test_case import LLMTestCase, ToolCall

    case = LLMTestCase(input="q", actualOutput="a", retrievalContext=["r"], toolsCalled=[ToolCall(name="t")],
                       additional_metadata={"k": 1}, tokenCost=0.5)
    assert (case.actual_output, case.retrieval_context, case.metadata, case.token_cost) == ("a", ["r"], {"k": 1}, 0.5)
    dumped = case.model_dump(by_alias=True)
    assert {"actualOutput", "retrievalContext", "toolsCalled", "tokenCost", "metadata"} <= dumped.keys()
    assert "additionalMetadata" not in dumped and case._identifier != LLMTestCase(input="q")._identifier
    for bad, message in (({"input": 1}, "'input' must be a string"),
                         ({"input": "q", "context": "c"}, "'context' must be None or a list of strings"),
                         ({"input": "q", "tools_called": [{"name": "t"}]}, "list of `ToolCall`")):
        with pytest.raises(TypeError, match=message):
            LLMTestCase(**bad)


def test_tool_calls_are_equal_by_value_and_hashable_as_deepevals_are() -> None:
    from tracejudge.test_case import ToolCall

    class Opaque:
        __hash__ = None  # type: ignore[assignment]

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Opaque)

    a, b = ToolCall(name="t", input_parameters={"q": 1}), ToolCall(name="t", input_parameters={"q": 1})
    assert a == b and hash(a) == hash(b) and len({a, b, ToolCall(name="u")}) == 2
    c = ToolCall(name="t", input_parameters={"q": 1.0})  # equal to a in Python, so the same hash
    assert a == c and hash(a) == hash(c)
    assert hash(ToolCall(name="t", output=Opaque())) == hash(ToolCall(name="t", output=Opaque()))
    assert repr(ToolCall(name="t", description="d")) == 'ToolCall(name="t", description="d")'


def test_deepevals_older_parameter_names_still_import_with_a_deprecation_warning() -> None:
    from tracejudge.test_case import MultiTurnParams, SingleTurnParams

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from tracejudge.test_case import LLMTestCaseParams, TurnParams
        from tracejudge.test_case.conversational_test_case import TurnParams as SubmoduleTurnParams
    assert LLMTestCaseParams is SingleTurnParams and TurnParams is MultiTurnParams is SubmoduleTurnParams
    warned = {str(w.message).split()[0] for w in caught if issubclass(w.category, DeprecationWarning)}
    assert warned == {"LLMTestCaseParams", "TurnParams"}


def test_an_image_makes_a_case_multimodal_and_a_text_only_judge_is_refused_before_any_call(
        tmp_path: Path, judge_server) -> None:
    from tracejudge.errors import TextOnlyJudgeError
    from tracejudge.metrics import MCPUseMetric
    from tracejudge.test_case import LLMTestCase, MLLMImage

    png = tmp_path / "car.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16)
    image = MLLMImage(url=str(png))
    assert image.local and image.mimeType == "image/png" and image.dataBase64 and str(image).startswith(
        "[DEEPEVAL:IMAGE:")
    case = LLMTestCase(input=f"What is in {image}?", actual_output="A car.")
    assert case.multimodal and not LLMTestCase(input="q").multimodal
    with pytest.raises(ValueError, match="https://"):
        MLLMImage(url="ftp://example.com/car.png")
    metric = MCPUseMetric(model=LLMJudge("gpt-3.5-turbo", base_url=judge_server.base_url, api_key="sk-test"))
    with pytest.raises(TextOnlyJudgeError, match="reads text only"):
        metric.measure(case)
    assert judge_server.requests == [] and isinstance(TextOnlyJudgeError("x"), ValueError)

    judge_server.script = lambda r: completion({"reason": "ok", "score": 0.9})  # a judge that reads images
    seeing = MCPUseMetric(model=LLMJudge("gpt-4o-mini", base_url=judge_server.base_url, api_key="sk-test"))
    assert seeing.measure(case) == pytest.approx(0.9)
    parts = [part for r in judge_server.requests for m in r.body["messages"] if isinstance(m["content"], list)
             for part in m["content"]]
    images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert images and all(url == f"data:image/png;base64,{image.dataBase64}" for url in images)
    assert not any(str(image) in p.get("text", "") for p in parts)  # the placeholder became the image


def test_evaluate_takes_llm_test_cases_and_dataset_errors_are_value_errors(judge_server) -> None:
    from tracejudge.dataset import DatasetError, EvaluationDataset
    from tracejudge.metrics import MCPUseMetric
    from tracejudge.test_case import LLMTestCase

    judge_server.script = lambda r: completion({"reason": "ok", "score": 0.9})
    judge = LLMJudge("gpt-4o-mini", base_url=judge_server.base_url, api_key="sk-test")
    result = evaluate([LLMTestCase(input="What if these shoes don't fit?", actual_output="Full refund.",
                                   mcp_servers=[MCPServer(server_name="shop")])], [MCPUseMetric(model=judge)],
                      print_results=False)
    assert result.test_results[0].metrics[0].score == pytest.approx(0.9)
    with pytest.raises(ValueError):  # DeepEval's users catch ValueError
        EvaluationDataset().save_as(file_type="xml", directory="/tmp")
    assert issubclass(DatasetError, ValueError)


def test_a_nameless_tool_is_left_out_of_a_server_and_its_names_are_listed_as_deepeval_lists_them() -> None:
    from types import SimpleNamespace

    from tracejudge.test_case import get_available_mcp_tool_names, normalize_mcp_servers

    with pytest.warns(UserWarning, match="without a name"):
        server = MCPServer(server_name="GitHub", available_tools=[{"description": "no name"}, {"name": "search"},
                                                                  SimpleNamespace(name="create_issue")])
    assert get_available_mcp_tool_names([server, {"server_name": "Slack", "available_tools": [{"name": "post"}]}]) \
        == {"search", "create_issue", "post"}
    assert normalize_mcp_servers([server])[0] is server


def test_a_persona_is_validated_and_kept_in_step_with_the_older_user_description(tmp_path: Path) -> None:
    from tracejudge.dataset import (
        BackgroundNoiseSettings,
        ConversationalGolden,
        EvaluationDataset,
        InterruptionBehavior,
        Persona,
    )

    with pytest.raises(ValueError, match="interruption frequency"):
        InterruptionBehavior(frequency="always")
    with pytest.raises(ValueError, match="overlap behavior"):
        InterruptionBehavior(overlap="shout")
    with pytest.raises(ValueError):
        BackgroundNoiseSettings(audio="cafe.wav", volume=1.5)
    with pytest.raises(ValueError):
        Persona(characteristics="Anyone", hold_timeout=0)
    assert Persona(characteristics="Anyone").tts_kwargs() == {}
    assert Persona(characteristics="Anyone", voice="coral").tts_kwargs() == {"voice": "coral"}
    assert Persona(characteristics="  In a hurry.  ").prompt_block() == "<persona>\nIn a hurry.\n</persona>"
    with pytest.warns(DeprecationWarning, match="user_description"):
        old = ConversationalGolden(scenario="Refund", user_description="An impatient caller.")
    assert old.persona == Persona(characteristics="An impatient caller.")
    with pytest.raises(ValueError, match="conflicting"):
        ConversationalGolden(scenario="Refund", persona=Persona(characteristics="Calm."), user_description="Loud.")
    assert ConversationalGolden(scenario="Refund").persona is None
    # a dataset file's user_description is its text, not a deprecated call: loaded without a warning
    path = tmp_path / "goldens.json"
    dataset = EvaluationDataset(goldens=[ConversationalGolden(
        scenario="Refund", persona=Persona(name="Dana", characteristics="An impatient caller.", voice="coral"))])
    dataset.save_as("json", str(tmp_path), file_name="goldens")
    loaded = EvaluationDataset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        loaded.add_goldens_from_json_file(str(path))
    [golden] = loaded.goldens
    assert golden.persona == Persona(name="Dana", characteristics="An impatient caller.", voice="coral")
    assert golden.user_description == "An impatient caller."


def test_goldens_convert_to_test_cases_and_back_keeping_what_each_holds() -> None:
    from tracejudge.dataset import ConversationalGolden, Golden, Persona
    from tracejudge.dataset.utils import (
        convert_convo_goldens_to_convo_test_cases,
        convert_convo_test_cases_to_convo_goldens,
        convert_goldens_to_test_cases,
        convert_test_cases_to_goldens,
    )

    golden = ConversationalGolden(scenario="Refund", expected_outcome="refunded", context=["order 42"],
                                  turns=[Turn(role="user", content="Hi")], persona=Persona(characteristics="Terse."),
                                  metadata={"team": "billing"})
    [case] = convert_convo_goldens_to_convo_test_cases([golden])
    assert (case.scenario, case.expected_outcome, case.user_description, case.context, case.metadata) == (
        "Refund", "refunded", "Terse.", ["order 42"], {"team": "billing"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the case's text becomes a persona, not a warning
        [back] = convert_convo_test_cases_to_convo_goldens([case])
    assert back.persona == Persona(characteristics="Terse.") and back.turns == golden.turns
    single = Golden(input="Weather in Oslo?", expected_output="snow", name="oslo", metadata={"k": 1})
    assert convert_test_cases_to_goldens(convert_goldens_to_test_cases([single])) == [single]


def test_deepevals_unit_interactions_join_users_and_leave_out_a_trailing_one() -> None:
    from tracejudge.metrics.utils import get_unit_interactions

    def units(*roles: str) -> list[list[str]]:
        turns = [Turn(role=role, content=f"{role[0]}{i}") for i, role in enumerate(roles)]  # type: ignore[arg-type]
        return [[t.content for t in unit] for unit in get_unit_interactions(turns)]

    assert units("user", "user", "assistant") == [["u0", "u1", "a2"]]
    assert units("user", "assistant", "user", "assistant") == [["u0", "a1"], ["u2", "a3"]]
    assert units("assistant", "user", "assistant") == [["a0", "u1", "a2"]]  # what came before opens the first
    assert units("user", "assistant", "user") == [["u0", "a1"]]  # the user turn never answered is no unit
    assert units("assistant", "assistant", "user") == [] and units() == []
