"""Goldens and datasets: a dataset round-trips through every file type, bad records are named, and the
collector's history becomes a dataset of the conversations that failed."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tests.support.cases import three_task_case, two_turn_case
from tracejudge import ConversationalGolden, DatasetError, EvaluationDataset, MCPCallValidityMetric, evaluate
from tracejudge.collector.store.span_store import SpanStore
from tracejudge.dataset import Persona
from tracejudge.test_case import ConversationalTestCase, load_test_case


def _goldens() -> list[ConversationalGolden]:
    return [
        ConversationalGolden(scenario="Find a flight to JFK for Christmas Eve", expected_outcome="a booked flight",
                             persona=Persona(characteristics="a traveller in SFO"), context=["prefers mornings"],
                             additional_metadata={"team": "travel"}),
        ConversationalGolden.from_test_case(_case_with_comments()),
    ]


def _case_with_comments() -> ConversationalTestCase:
    case = load_test_case(two_turn_case())
    case.comments = 'has "quotes", commas,\nand a newline'
    return case


@pytest.mark.parametrize("file_type", ["json", "jsonl", "csv"])
def test_goldens_and_test_cases_round_trip_through_every_file_type(tmp_path: Path, file_type: str) -> None:
    dataset = EvaluationDataset(goldens=_goldens(), test_cases=[three_task_case()])
    path = dataset.save_as(file_type, tmp_path / "out", file_name="set", include_test_cases=True)
    assert path == str(tmp_path / "out" / f"set.{file_type}")
    loaded = EvaluationDataset()
    if file_type == "csv":
        loaded.add_goldens_from_csv_file(path)
    else:
        loaded.add_goldens_from_json_file(path)
    expected = [g.model_dump(mode="json") for g in dataset.goldens] + \
        [ConversationalGolden.from_test_case(c).model_dump(mode="json") for c in dataset.test_cases]
    assert [g.model_dump(mode="json") for g in loaded] == expected
    assert loaded.goldens[1].turns[1].mcp_tools_called[0].name == "search_flights"


def test_bad_records_are_named_and_nothing_is_added(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"scenario": "ok"}, {"expected_outcome": "no scenario"}, {"scenario": 3}]))
    dataset = EvaluationDataset()
    with pytest.raises(DatasetError, match="2 invalid golden") as failed:
        dataset.add_goldens_from_json_file(path)
    assert "record 1" in str(failed.value) and "record 2" in str(failed.value) and len(dataset) == 0
    with pytest.raises(DatasetError, match="No goldens found in the dataset to save"):
        EvaluationDataset().save_as("json", tmp_path)


def test_the_history_gives_the_failing_conversations_as_test_cases_and_goldens(tmp_path: Path) -> None:
    store = SpanStore(tmp_path / "t.duckdb")
    store.open()
    con = store.cursor()
    now = dt.datetime.now(dt.UTC)
    for cid, score, at in (("good", 0.9, now), ("bad", 0.2, now), ("old-bad", 0.1, now - dt.timedelta(days=30))):
        con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, test_case, "
                    "assembled_at) VALUES (?, 1, 'h', 'complete', ?, ?)", [cid, json.dumps(two_turn_case()), at])
        con.execute("INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, score, "
                    "success, scored_at) VALUES (?, 1, 'mcp_use', 'x', ?, ?, ?)", [cid, score, score >= 0.5, at])
    failing = EvaluationDataset.from_history(con)
    assert [c.metadata["conversation_id"] for c in failing.test_cases] == ["bad"]
    assert failing.test_cases[0].metadata["failed_metrics"] == ["mcp_use"]
    assert failing.goldens[0].scenario == two_turn_case()["turns"][0]["content"]
    everything = EvaluationDataset.from_history(con, since=dt.timedelta(days=90), failing_only=False)
    assert sorted(c.metadata["conversation_id"] for c in everything.test_cases) == ["bad", "good", "old-bad"]
    result = evaluate(everything, [MCPCallValidityMetric()], print_results=False)
    assert len(result.test_results) == 3 and all(t.success for t in result.test_results)
    store.close()


# --- DeepEval's single-turn goldens and its file formats ----------------------------------------------


def test_single_turn_goldens_round_trip_every_format_with_their_retrieval_sources(tmp_path: Path) -> None:
    from tracejudge.dataset import Golden
    from tracejudge.test_case import RetrievedContextData, ToolCall

    golden = Golden(input="q", actual_output="a", context=["c1", "c2"],
                    retrieval_context=[RetrievedContextData(context="doc", source="kb"), "plain"],
                    tools_called=[ToolCall(name="search", input_parameters={"q": "x"})], source_file="f.txt",
                    additional_metadata={"flagged": True}, custom_column_key_values={"owner": "platform"})
    for file_type in ("json", "jsonl", "csv"):
        path = EvaluationDataset([golden]).save_as(file_type, tmp_path, file_name=f"g-{file_type}")
        loaded = EvaluationDataset()
        (loaded.add_goldens_from_csv_file if file_type == "csv" else loaded.add_goldens_from_json_file)(path)
        back = loaded.goldens[0]
        assert back.retrieval_context == [RetrievedContextData(context="doc", source="kb"), "plain"], file_type
        assert (back.context, back.source_file, back.metadata, back.custom_column_key_values) == (
            ["c1", "c2"], "f.txt", {"flagged": True}, {"owner": "platform"}), file_type
        assert back.tools_called[0].input_parameters == {"q": "x"}, file_type
    saved = (tmp_path / "g-json.json").read_text()
    assert '"deepeval_source=kb,deepeval_context=doc"' in saved and '"additional_metadata"' in saved


def test_deepevals_csv_files_load_with_pipe_lists_json_cells_and_renamed_columns(tmp_path: Path) -> None:
    path = tmp_path / "deepeval.csv"
    path.write_text('question,actual_output,context,tools_called\n'
                    'Tallest mountain?,Everest,Geography|Mountains,"[{""name"": ""lookup"", '
                    '""inputParameters"": {""q"": ""tallest""}}]"\n')
    dataset = EvaluationDataset()
    dataset.add_goldens_from_csv_file(path, input_col_name="question")
    golden = dataset.goldens[0]
    assert (golden.input, golden.context, golden.retrieval_context) == ("Tallest mountain?",
                                                                        ["Geography", "Mountains"], None)
    assert golden.tools_called[0].input_parameters == {"q": "tallest"}
    cases = EvaluationDataset()
    cases.add_test_cases_from_csv_file(path, "question", "actual_output")
    assert cases.test_cases[0].context == ["Geography", "Mountains"] and cases.test_cases[0].expected_tools is None


def test_a_dataset_is_single_or_multi_turn_and_says_so_as_deepeval_does(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([{"input": "single"}, {"scenario": "multi"}]))
    with pytest.raises(TypeError, match="You cannot add 'ConversationalGolden' to a single-turn dataset."):
        EvaluationDataset().add_goldens_from_json_file(mixed)
    turns_as_text = tmp_path / "convo.json"  # DeepEval's JSON files hold the turns as a JSON string
    turns_as_text.write_text(json.dumps([{"scenario": "s", "turns": json.dumps([{"role": "user", "content": "hi"}]),
                                          "context": ["Weather", "Paris"]}]))
    dataset = EvaluationDataset()
    dataset.add_goldens_from_json_file(turns_as_text)
    assert dataset.goldens[0].turns[0].content == "hi"
    with pytest.raises(TypeError, match="You cannot add 'Golden' to a multi-turn dataset."):
        dataset.add_golden({"input": "single"})


def test_deepevals_loader_arguments_delimiters_and_extra_columns(tmp_path: Path) -> None:
    path = tmp_path / "extra.csv"
    path.write_text("id,question,context,notes\n7,Why?,a;b,internal note\n")
    dataset = EvaluationDataset()
    dataset.add_goldens_from_csv_file(path, "question", context_col_delimiter=";", name_key_name="id",
                                      tools_called_col_delimiter=";")
    golden = dataset.goldens[0]
    assert (golden.input, golden.context, golden.name) == ("Why?", ["a", "b"], "7")  # `notes` is no field
    cases = EvaluationDataset()
    cases.add_test_cases_from_csv_file(path, "question", "answer", context_col_delimiter=";")
    assert cases.test_cases[0].context == ["a", "b"]
    cases.add_test_case({"input": "q", "actual_output": "a"})  # a dict with an input is a single-turn case
    assert cases.test_cases[1].actual_output == "a"
