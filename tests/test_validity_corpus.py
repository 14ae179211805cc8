"""The labelled validity corpus: it is what its generator writes, its labels are complete, and the deterministic
MCP checks find every call-level fault in it and flag no clean call."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bench.validity.generate import CALL_FAULTS, CORPUS, FAULTS, HONEST_FAILURE, corpus
from tracejudge import MCPCallValidityMetric
from tracejudge.interactions import split_tasks
from tracejudge.test_case import load_test_case


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines()]


def test_the_corpus_file_is_what_the_generator_writes(rows) -> None:
    assert rows == json.loads(json.dumps(corpus()))  # no hand edits: every label is known by construction


def test_the_corpus_covers_every_fault_on_every_server_with_labels_per_task(rows) -> None:
    assert len(rows) >= 300
    assert len({r["id"] for r in rows}) == len(rows)
    by_fault = Counter(r["labels"]["fault"] for r in rows)
    assert set(by_fault) == set(FAULTS) and min(by_fault.values()) >= 40
    servers = Counter(r["labels"]["server"] for r in rows)
    assert {"filesystem", "database", "issues", "calendar", "search", "recorded"} <= set(servers)
    assert any(r["labels"]["hard"] and r["labels"]["fault"] == "clean" for r in rows)  # the long way, still clean
    for row in rows:
        labels = row["labels"]
        tasks = split_tasks(load_test_case(row["test_case"]))
        assert len(labels["tasks"]) == len(tasks), row["id"]
        # a recorded agent that reported a failed call honestly: its task is labelled honest_failure, not clean
        honest = {HONEST_FAILURE} if labels["source"] != "generated" else set()
        expected = ({"clean"} if labels["fault"] == "clean" else {"clean", labels["fault"]}) | honest
        faults = set(labels["tasks"]) - {HONEST_FAILURE}
        assert set(labels["tasks"]) <= expected and (labels["fault"] == "clean") == (faults == {"clean"})
    assert sum(t == HONEST_FAILURE for r in rows for t in r["labels"]["tasks"]) >= 20


def test_call_validity_finds_every_call_level_fault_and_flags_no_clean_call(rows) -> None:
    missed: list[str] = []
    false_alarms: list[str] = []
    checked = Counter()
    for row in rows:
        metric = MCPCallValidityMetric()
        metric.measure(row["test_case"])
        calls = (metric.score_breakdown or {}).get("calls", [])
        flagged = {(c["turn"], c["name"]) for c in calls if not c["valid"]}
        faulty = {(c["turn"], c["name"]) for c in row["labels"]["faulty_calls"]}
        missed += [f"{row['id']}: {call}" for call in faulty - flagged]
        false_alarms += [f"{row['id']}: {call} {[c['violations'] for c in calls if not c['valid']]}"
                         for call in flagged - faulty]
        checked.update(c["fault"] for c in row["labels"]["faulty_calls"])
        if row["labels"]["fault"] in CALL_FAULTS:
            assert faulty and metric.score is not None and metric.score < 1.0, row["id"]
    assert not missed and not false_alarms, (missed[:5], false_alarms[:5])
    assert set(CALL_FAULTS) <= set(checked) and min(checked[f] for f in CALL_FAULTS) >= 40
