"""The shipped OpenTelemetry Collector configurations are valid and point at tracejudge's defaults.

There is no otelcol-contrib binary here to run `otelcol validate`, so this checks what that would, for the
parts these files use: the YAML parses, every pipeline names defined components, every component type
is one collector-contrib ships, every authenticator is a defined and enabled extension, every ${env:}
variable is documented in the file, the processors are in a working order, and the ports and paths match
what `tracejudge serve` listens on by default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tracejudge.collector.config import ServerSettings
from tracejudge.collector.receivers.otlp_http import TRACES_PATH

CONFIG_DIR = Path(__file__).resolve().parent.parent / "otel-config"
YAMLS = sorted(CONFIG_DIR.glob("*.yaml"))
KNOWN_TYPES = {
    "receivers": {"otlp"},
    "processors": {"memory_limiter", "batch", "tail_sampling", "groupbytrace", "attributes", "transform"},
    "exporters": {"otlp", "otlphttp", "loadbalancing", "debug"},
    "extensions": {"health_check", "bearertokenauth", "pprof", "zpages"},
}
DEFAULTS = ServerSettings()


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _type(name: str) -> str:
    return name.split("/", 1)[0]


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_there_is_a_config_for_each_deployment() -> None:
    assert {p.name for p in YAMLS} == {"gateway.yaml", "loadbalancing.yaml"}
    readme = (CONFIG_DIR / "README.md").read_text()
    for path in [*YAMLS, CONFIG_DIR / "agent.env"]:
        assert f"`{path.name}`" in readme, f"README.md does not say when to use {path.name}"


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_pipelines_reference_defined_components_of_known_types(path: Path) -> None:
    config = _load(path)
    service = config["service"]
    for kind in ("receivers", "processors", "exporters", "extensions"):
        for name in config.get(kind) or {}:
            assert _type(name) in KNOWN_TYPES[kind], f"{path.name}: unknown {kind[:-1]} type {name}"
    for name in service.get("extensions", []):
        assert name in config["extensions"], f"{path.name}: service uses undefined extension {name}"
    assert service["pipelines"], f"{path.name} defines no pipeline"
    for pipeline, spec in service["pipelines"].items():
        assert _type(pipeline) == "traces"
        for kind in ("receivers", "processors", "exporters"):
            for name in spec.get(kind, []):
                assert name in (config.get(kind) or {}), f"{path.name}: {pipeline} uses undefined {name}"
        processors = [_type(p) for p in spec.get("processors", [])]
        assert processors[0] == "memory_limiter", "memory_limiter must come first to protect the collector"
        if "tail_sampling" in processors and "batch" in processors:
            assert processors.index("tail_sampling") < processors.index("batch")
    defined = set(config.get("extensions") or {})
    for match in re.finditer(r"authenticator: (\S+)", path.read_text()):
        assert match.group(1) in defined and match.group(1) in service["extensions"]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_environment_variable_is_documented_in_the_header(path: Path) -> None:
    text = path.read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for variable in set(re.findall(r"\$\{env:([A-Z0-9_]+)", text)):
        assert variable in header, f"{path.name} uses ${{env:{variable}}} but its header does not explain it"


def _exporter_endpoints(config: dict[str, Any]) -> list[str]:
    endpoints = []
    for name, spec in config["exporters"].items():
        if _type(name) == "otlp":
            endpoints.append(re.sub(r"\$\{env:[A-Z_]+:-([^}]+)\}", r"\1", spec["endpoint"]))
        if _type(name) == "loadbalancing":
            endpoints += spec["resolver"]["static"]["hostnames"]
            assert "endpoint" not in spec["protocol"]["otlp"], "loadbalancing sets each backend's endpoint"
    return endpoints


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_exports_go_to_tracejudges_grpc_port_with_auth_and_tls(path: Path) -> None:
    config = _load(path)
    endpoints = _exporter_endpoints(config)
    assert endpoints and all(_port(e) == DEFAULTS.grpc_port for e in endpoints), endpoints
    for name, spec in config["exporters"].items():
        otlp = spec["protocol"]["otlp"] if _type(name) == "loadbalancing" else spec
        assert otlp["auth"]["authenticator"].startswith("bearertokenauth")
        assert otlp["tls"].get("insecure") is not True and otlp["tls"]["ca_file"]
        assert otlp["retry_on_failure"]["enabled"] is True  # tracejudge answers UNAVAILABLE when it pushes back
    receiver = config["receivers"]["otlp"]["protocols"]
    assert _port(receiver["grpc"]["endpoint"]) == 4317 and _port(receiver["http"]["endpoint"]) == 4318


def test_tail_sampling_keeps_agent_and_mcp_traces() -> None:
    policies = _load(CONFIG_DIR / "gateway.yaml")["processors"]["tail_sampling"]["policies"]
    keys = {sub["string_attribute"]["key"] for p in policies for sub in p["and"]["and_sub_policy"]
            if sub["type"] == "string_attribute"}
    assert keys == {"gen_ai.operation.name", "mcp.method.name"}
    rates = [sub["probabilistic"]["sampling_percentage"] for p in policies for sub in p["and"]["and_sub_policy"]
             if sub["type"] == "probabilistic"]
    assert rates and all(r == "${env:AGENT_TRACE_PERCENT:-100}" for r in rates)


def test_loadbalancing_routes_on_the_conversation_attribute() -> None:
    exporter = _load(CONFIG_DIR / "loadbalancing.yaml")["exporters"]["loadbalancing/tracejudge"]
    assert exporter["routing_key"] == "attributes"
    assert exporter["routing_attributes"] == ["gen_ai.conversation.id"]
    assert "trace-ID routing" in (CONFIG_DIR / "loadbalancing.yaml").read_text()


def _agent_env() -> dict[str, str]:
    values = {}
    for line in (CONFIG_DIR / "agent.env").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert re.fullmatch(r"[A-Z][A-Z0-9_]*", key), f"not a variable assignment: {line!r}"
            values[key] = value
    return values


def test_agent_environment_points_at_tracejudges_defaults() -> None:
    env = _agent_env()
    endpoint = urlsplit(env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
    assert endpoint.port == DEFAULTS.grpc_port and env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc"
    text = (CONFIG_DIR / "agent.env").read_text()
    http = re.search(r"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=(http://\S+/v1/traces)", text)
    assert http and urlsplit(http.group(1)).port == DEFAULTS.http_port and urlsplit(http.group(1)).path == TRACES_PATH
    assert env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] == "true"
    assert env["TRACELOOP_TRACE_CONTENT"] == "true" and env["OPENINFERENCE_HIDE_INPUTS"] == "false"


def test_dashboard_and_alerts_name_only_metrics_the_collector_exports(tmp_path, judge_server) -> None:
    """Every tracejudge_* series the Grafana dashboard and the alert rules read is on a running collector's
    /metrics after it scored something (parsed with prometheus_client's own parser)."""
    import json as json_module
    import re

    from prometheus_client.parser import text_string_to_metric_families

    from tests.support.collector_process import CollectorProcess
    from tests.test_pipeline import config, conversations, export, judge_script, wait_for

    judge_server.script = judge_script
    env = {"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": "sk-test-not-a-secret"}
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path), env=env) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT 1 FROM scores", 6)
        import httpx

        text = httpx.get(f"{collector.admin_url}/metrics").text
        collector.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    exported = {sample.name for f in families.values() for sample in f.samples} | set(families)
    dashboard = json_module.loads((CONFIG_DIR / "grafana-dashboard.json").read_text())
    rules = yaml.safe_load((CONFIG_DIR / "prometheus-alerts.yml").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    named = {name for expr in expressions for name in re.findall(r"tracejudge_[a-z_]+", expr)}
    assert named and named <= exported, named - exported
    scores = families["tracejudge_score"]
    counts = {s.labels["metric"]: s.value for s in scores.samples if s.name == "tracejudge_score_count"}
    assert counts == {"mcp_use": 2, "mcp_task_completion": 2, "mcp_call_validity": 2}
    results = {(s.labels["metric"], s.labels["result"]): s.value for s in families["tracejudge_scores"].samples
               if s.name == "tracejudge_scores_total" and s.labels["metric"] == "mcp_call_validity"}
    assert results == {("mcp_call_validity", "pass"): 1, ("mcp_call_validity", "fail"): 1}
    assert {s.labels["service"] for s in scores.samples} == {"weather-agent"}
