"""[redaction]: personal data and secrets are replaced before spans are stored or sent to a judge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import duckdb
import httpx
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.collector_process import CollectorProcess
from tests.support.scripted_server import Reply, Request, completion
from tests.test_pipeline import config, export, query, turn, wait_for
from tracejudge.collector.config import ConfigError, load_settings
from tracejudge.mapping.redaction import RedactionRuleError, Redactor

EMAIL, OTHER_EMAIL = "jane.doe@example.com", "bob@example.org"
KEY, CARD, EMPLOYEE = "sk-proj-Abcdefghijklmnop0123456789", "4111 1111 1111 1111", "EMP-204981"
SECRETS = (EMAIL, OTHER_EMAIL, KEY, CARD, EMPLOYEE, "4111111111111111")

ALL_RULES = Redactor.build(["email", "api_key", "card_number"], {"employee": r"EMP-\d{6}"})


@pytest.mark.parametrize("text", [
    f"write to {EMAIL} today", f"key={KEY}", "AKIAIOSFODNN7EXAMPLE", "Authorization: Bearer abc.def-123_456789",
    "ghp_0123456789abcdefghijABCDEFGHIJ0123456", f"card {CARD} exp 12/29", "card 4111-1111-1111-1111",
    "https://api.example.com/v1?token=eyJhbGciOi12345678", "emp EMP-204981 joined",
])
def test_each_rule_redacts_what_it_names(text: str) -> None:
    redacted = ALL_RULES.text(text)
    assert "[REDACTED:" in redacted
    assert not any(s in redacted for s in SECRETS + ("AKIAIOSFODNN7EXAMPLE", "abc.def-123_456789"))


@pytest.mark.parametrize("text", [
    "span took 1733140000000000000 ns", "order 4111 1111 1111 1112 (fails the Luhn check)",
    "call get-weather with city=Paris", "version 2026-12-02", "user@localhost has no domain",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert ALL_RULES.text(text) == text


def test_distinct_values_stay_distinct_and_equal_values_equal() -> None:
    a, b, a2 = (ALL_RULES.text(x) for x in (EMAIL, OTHER_EMAIL, EMAIL))
    assert a == a2 and a != b
    salted = Redactor.build(["email"], {}, salt="s3cret")
    assert salted.text(EMAIL) != ALL_RULES.text(EMAIL)
    assert Redactor.build(["email"], {}, hashed=False).text(EMAIL) == "[REDACTED:email]"


def test_nested_values_are_redacted_and_other_types_kept() -> None:
    value = {"to": [EMAIL, {"cc": OTHER_EMAIL}], "count": 3, "ok": True, "ratio": 0.5}
    out = ALL_RULES.value(value)
    assert out["count"] == 3 and out["ok"] is True and out["ratio"] == 0.5
    assert EMAIL not in json.dumps(out) and OTHER_EMAIL not in json.dumps(out)


def test_bad_rules_are_refused_with_their_name(tmp_path: Path) -> None:
    with pytest.raises(RedactionRuleError, match="rule 'broken'.*not a valid regular expression"):
        Redactor.build([], {"broken": "(unclosed"})
    with pytest.raises(RedactionRuleError, match="matches the empty string"):
        Redactor.build([], {"everything": ".*"})
    path = tmp_path / "tracejudge.toml"
    path.write_text('[redaction]\nenabled = true\nbuiltin = ["email", "phone"]\n')
    with pytest.raises(ConfigError, match=r"\[redaction\] builtin.*unknown builtin rule\(s\) phone"):
        load_settings(path, environ={})
    path.write_text('[redaction]\nenabled = true\npatterns = {x = "[a-"}\n')
    with pytest.raises(ConfigError, match=r"\[redaction\] patterns.*rule 'x'"):
        load_settings(path, environ={})


def _conversations_with_secrets() -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("agent")
    turn(tracer, f"user:{EMAIL}", f"Refund card {CARD}, my mail is {EMAIL}", "refund",
         {"card": CARD, "api_key": KEY}, f"Refunded; receipt sent to {EMAIL}", f"Done, {EMPLOYEE} handled it.",
         end=True)
    turn(tracer, f"user:{OTHER_EMAIL}", "Status of my order?", "order-status", {"email": OTHER_EMAIL},
         "Shipped", "It has shipped.", end=True)
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_collector_stores_and_judges_only_redacted_text(tmp_path: Path, judge_server) -> None:
    def script(request: Request) -> Reply:
        if request.judge == "final_reason":
            return completion({"reason": "final"})
        return completion({"reason": "ok", "score": 1.0})

    judge_server.script = script
    cfg = config(tmp_path, '[redaction]\nenabled = true\npatterns = {employee = "EMP-\\\\d{6}"}\n')
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    with CollectorProcess(tmp_path / "t.duckdb", config=cfg, env=env) as collector:
        export(collector, _conversations_with_secrets())
        wait_for(collector, "SELECT * FROM scores", 6)
        [[conversation]] = query(collector, "SELECT conversation_id FROM scores WHERE metric = 'mcp_use' "
                                            "ORDER BY judge_calls DESC LIMIT 1")
        page = httpx.get(f"{collector.admin_url}/conversations/{quote(conversation, safe='')}", timeout=30).text
        collector.stop()
    sent = json.dumps([r.body for r in judge_server.requests])
    assert judge_server.requests and "[REDACTED:card_number:" in sent and "[REDACTED:employee:" in sent
    with duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True) as con:
        stored = json.dumps([con.execute(f"SELECT * FROM {t}").fetchall()
                             for t in ("spans", "conversations", "scores", "judge_calls")], default=str)
        ids = [r[0] for r in con.execute("SELECT DISTINCT conversation_id FROM conversations").fetchall()]
        exchanges = con.execute("SELECT request, response FROM judge_calls").fetchall()
        [(calls_counted,)] = con.execute("SELECT sum(judge_calls) FROM scores").fetchall()
    for secret in SECRETS:
        assert secret not in sent and secret not in stored, secret
    assert len(ids) == 2, "two users' conversations must stay apart after their ids are redacted"
    # what the judge saw and said, as it was sent and answered: one row per call the scores counted
    assert len(exchanges) == calls_counted == len(judge_server.requests)
    bodies = [(r.body["messages"], r.body["model"]) for r in judge_server.requests]
    for request, response in exchanges:
        request = json.loads(request)
        assert (request["messages"], request["model"]) in bodies
        assert json.loads(response) in ({"reason": "ok", "score": 1.0}, {"reason": "final"})
    shown = page[page.index("What the judge saw and said"):]
    shown = shown[:shown.index("</details>")]
    assert "[REDACTED:" in shown and '"score": 1.0' in shown.replace("&#34;", '"')


def test_evaluate_redacts_test_case_files_when_configured(tmp_path: Path, judge_server) -> None:
    judge_server.script = lambda r: completion({"reason": "final"} if r.judge == "final_reason"
                                               else {"reason": "ok", "score": 1.0})
    case = {"turns": [{"role": "user", "content": f"I am {EMAIL}"},
                      {"role": "assistant", "content": "Hi", "mcpToolsCalled": [
                          {"name": "lookup", "args": {"key": KEY}, "result": {"content": [
                              {"type": "text", "text": f"card {CARD}"}]}}]}]}
    (tmp_path / "case.json").write_text(json.dumps(case))
    (tmp_path / "tracejudge.toml").write_text("[redaction]\nenabled = true\n")
    env = {"PATH": "", "OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret",
           "TRACEJUDGE_CONFIG": str(tmp_path / "tracejudge.toml")}
    done = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "evaluate", "case.json",
                           "--metric", "mcp_use", "--model", "gpt-4o-mini", "--format", "json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    sent = json.dumps([r.body for r in judge_server.requests])
    assert judge_server.requests and "[REDACTED:email:" in sent
    assert EMAIL not in sent and KEY not in sent and CARD not in sent
