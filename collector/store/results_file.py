"""Scored test cases written into a DuckDB history file as conversations and scores, so the score history, the web
UI, `tracejudge compare` and the canary gate read them like production: `assert_test` results of a pytest run
(the pytest plugin) and simulated conversations (`tracejudge simulate`)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracejudge.collector.store.assembled_index import restamp

if TYPE_CHECKING:
    from tracejudge.evaluation import TestResult
    from tracejudge.test_case import ConversationalTestCase


@dataclass(frozen=True)
class ScoredCase:
    conversation_id: str
    agent: str | None
    case: ConversationalTestCase
    result: TestResult
    attributes: dict[str, list[str]] = field(default_factory=dict)  # cohort keys (`tracejudge.cohort`, ...)


def write_results(path: Path, scored: Sequence[ScoredCase], service: str, config_prefix: str) -> None:
    """Each case as version 1 of its conversation, each metric result as its score (metric_config
    `<config_prefix>:<position>`, so the same metric twice keeps both rows), in one transaction."""
    from tracejudge.collector.store.connection.database_file import connect_file
    from tracejudge.collector.store.schema import migrate

    now = dt.datetime.now(dt.UTC)
    with connect_file(path) as con:
        migrate(con)
        con.execute("BEGIN TRANSACTION")
        for item in scored:
            case = item.case
            text = case.model_dump_json(exclude_none=True)
            calls = sum(len(t.mcp_tools_called or []) + len(t.mcp_resources_called or [])
                        + len(t.mcp_prompts_called or []) for t in case.turns)
            con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, service_name, "
                        "agent_name, turns, mcp_calls, trace_ids, test_case, assembled_at, attributes) VALUES "
                        "(?, 1, ?, 'complete', ?, ?, ?, ?, [], ?, ?, ?)",
                        [item.conversation_id, hashlib.sha256(text.encode()).hexdigest(), service, item.agent,
                         len(case.turns), calls, text, now, json.dumps(item.attributes)])
            for position, m in enumerate(item.result.metrics):
                con.execute("INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, "
                            "score, success, threshold, strict_mode, reason, judge_model, evaluation_cost, "
                            "input_tokens, output_tokens, breakdown, error, service_name, agent_name, scored_at, "
                            "inclusion_probability) VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1.0)",
                            [item.conversation_id, m.metric, f"{config_prefix}:{position}", m.score, m.success,
                             m.threshold, m.strict_mode, m.reason, m.evaluation_model, m.evaluation_cost,
                             m.input_tokens, m.output_tokens, _json(m.score_breakdown), m.error, service, item.agent,
                             now])
        restamp(con)  # a collector's index of this file (if it is one) sees a change it did not make: made again
        con.execute("COMMIT")


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)
