"""Which conversations the judged metrics score: a hash of the conversation id against each metric's rate.

sha256(id) mapped to [0, 1) is the same on every restart and replica, and nested: a conversation sampled
at 10% is also sampled at 50%. Filters on service and agent name and on span or resource attribute values
apply first; `mcp_call_validity` is cheap and runs on every conversation unless a rate is given for it.
Rules raise the judged metrics' rate where the deterministic checks found something (an MCP error, an invalid
call); the rate a conversation got is its inclusion probability, recorded with its scores and weighed back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tracejudge.call_validity import check_calls
from tracejudge.mapping.spans import Span
from tracejudge.test_case import ConversationalTestCase

if TYPE_CHECKING:  # annotations only: the assembly workers need none of the settings models
    from tracejudge.collector.config import SamplingSettings

ALWAYS = "mcp_call_validity"


def sample_value(conversation_id: str) -> float:
    digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


MAX_VALUES = 16  # per key and conversation: a key with a value per request (an id) is not a cohort key
MAX_VALUE_CHARS = 256


def attribute_keys(sampling: SamplingSettings, cohort_keys: Iterable[str] = ()) -> frozenset[str]:
    """The attribute keys whose values a conversation keeps: the sampling filters' and the cohorts'."""
    return (frozenset(sampling.include_attributes) | frozenset(sampling.exclude_attributes) | frozenset(cohort_keys)
            | {rule.key for rule in sampling.rules if rule.when == "new_cohort"})


def attribute_values(keys: frozenset[str], spans: Iterable[Span]) -> dict[str, set[str]]:
    """The values (as text) the conversation's spans and resources hold for these keys (at most MAX_VALUES per
    key, each at most MAX_VALUE_CHARS). A resource's values are kept under `<its service.name>:<key>` too, so an
    instrumented MCP server's own version (`shop-mcp-server:service.version`) is a cohort key apart from the
    agent's."""
    found: dict[str, set[str]] = {}
    if not keys:
        return found

    def keep(key: str, value: Any) -> None:
        values = found.setdefault(key, set())
        if len(values) < MAX_VALUES:
            values.add(_text(value)[:MAX_VALUE_CHARS])

    for span in spans:
        for key in keys & span.attributes.keys():
            keep(key, span.attributes[key])
        service = span.resource.get("service.name")
        for key in keys & span.resource.keys():
            keep(key, span.resource[key])
            if isinstance(service, str) and service:
                keep(f"{service[:64]}:{key}", span.resource[key])
    return found


MODEL_CALLS = frozenset({"chat", "text_completion", "generate_content"})


def model_usage(spans: Iterable[Span]) -> dict[str, tuple[int, int]]:
    """The agent's own LLM tokens per model, from the GenAI usage attributes (`gen_ai.usage.*`, the model from
    `gen_ai.response.model`, else `gen_ai.request.model`) of its model-call spans; where none reports usage, of
    its agent spans (frameworks that total a run there). Never both: a run's total would count every call twice."""
    calls: dict[str, tuple[int, int]] = {}
    runs: dict[str, tuple[int, int]] = {}
    for span in spans:
        a = span.attributes
        tokens_in, tokens_out = a.get("gen_ai.usage.input_tokens"), a.get("gen_ai.usage.output_tokens")
        if not isinstance(tokens_in, int) and not isinstance(tokens_out, int):
            continue
        target = calls if a.get("gen_ai.operation.name") in MODEL_CALLS else runs
        model = str(a.get("gen_ai.response.model") or a.get("gen_ai.request.model") or "unknown")[:128]
        seen_in, seen_out = target.get(model, (0, 0))
        target[model] = (seen_in + (tokens_in if isinstance(tokens_in, int) else 0),
                         seen_out + (tokens_out if isinstance(tokens_out, int) else 0))
    return calls or runs


def _any_match(filters: dict[str, list[str]], values: dict[str, set[str]]) -> bool:
    return any(values.get(key, set()) & set(wanted) for key, wanted in filters.items())


def needs_findings(settings: SamplingSettings) -> bool:
    """Whether sampling depends on what the deterministic checks find (then the assembler looks)."""
    return bool(settings.rules) or not settings.judge_invalid


def findings(test_case: ConversationalTestCase) -> set[str]:
    """What the deterministic checks find in a conversation, as the sampling rules name it (a call that returned an
    error is also an invalid call, as call validity counts it)."""
    found = set()
    if any(call.result is not None and call.result.is_error
           for turn in test_case.turns for call in turn.mcp_tools_called or ()):
        found.add("mcp_error")
    calls, _ = check_calls(test_case)
    if any(c.violations for c in calls):
        found.add("invalid_call")
    return found


def decide(settings: SamplingSettings, metrics: list[str], conversation_id: str, service_name: str | None,
           agent_name: str | None, attributes: dict[str, set[str]] | None = None,
           found: set[str] | None = None) -> tuple[float, dict[str, bool], dict[str, float]]:
    """(sample value, metric -> scored?, metric -> inclusion probability) for one conversation; `attributes` from
    `attribute_values`, `found` from `findings`. A metric is scored when the conversation's hash value is under its
    rate, so the rate is the probability it had of being scored: 1 / rate weighs it back to all traffic."""
    value = sample_value(conversation_id)
    attributes = attributes or {}
    found = found or set()
    allowed = (
        (not settings.include_services or service_name in settings.include_services)
        and service_name not in settings.exclude_services
        and (not settings.include_agents or agent_name in settings.include_agents)
        and agent_name not in settings.exclude_agents
        and (not settings.include_attributes or _any_match(settings.include_attributes, attributes))
        and not _any_match(settings.exclude_attributes, attributes)
    )
    ruled = [rule.rate for rule in settings.rules if rule.when in found]
    decisions, probabilities = {}, {}
    for metric in metrics:
        rate = settings.metric_rates.get(metric, 1.0 if metric == ALWAYS else settings.rate)
        if metric != ALWAYS:
            rate = max([rate, *ruled])
            if not settings.judge_invalid and "invalid_call" in found:
                rate = 0.0
        probabilities[metric] = rate if allowed else 0.0
        decisions[metric] = allowed and value < rate
    return value, decisions, probabilities
