"""Which conversations the judged metrics score: a hash of the conversation id against each metric's rate.

sha256(id) mapped to [0, 1) is the same on every restart and replica, and nested: a conversation sampled
at 10% is also sampled at 50%. Filters on service and agent name and on span or resource attribute values
apply first; `mcp_call_validity` is cheap and runs on every conversation unless a rate is given for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from tracejudge.collector.config import SamplingSettings
from tracejudge.mapping.spans import Span

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
    return frozenset(sampling.include_attributes) | frozenset(sampling.exclude_attributes) | frozenset(cohort_keys)


def attribute_values(keys: frozenset[str], spans: Iterable[Span]) -> dict[str, set[str]]:
    """The values (as text) the conversation's spans and resources hold for these keys (at most MAX_VALUES per
    key, each at most MAX_VALUE_CHARS)."""
    found: dict[str, set[str]] = {}
    if not keys:
        return found
    for span in spans:
        for source in (span.attributes, span.resource):
            for key in keys & source.keys():
                values = found.setdefault(key, set())
                if len(values) < MAX_VALUES:
                    values.add(_text(source[key])[:MAX_VALUE_CHARS])
    return found


def _any_match(filters: dict[str, list[str]], values: dict[str, set[str]]) -> bool:
    return any(values.get(key, set()) & set(wanted) for key, wanted in filters.items())


def decide(settings: SamplingSettings, metrics: list[str], conversation_id: str, service_name: str | None,
           agent_name: str | None, attributes: dict[str, set[str]] | None = None) -> tuple[float, dict[str, bool]]:
    """(sample value, metric -> scored?) for one conversation; `attributes` from `attribute_values`."""
    value = sample_value(conversation_id)
    attributes = attributes or {}
    allowed = (
        (not settings.include_services or service_name in settings.include_services)
        and service_name not in settings.exclude_services
        and (not settings.include_agents or agent_name in settings.include_agents)
        and agent_name not in settings.exclude_agents
        and (not settings.include_attributes or _any_match(settings.include_attributes, attributes))
        and not _any_match(settings.exclude_attributes, attributes)
    )
    decisions = {}
    for metric in metrics:
        rate = settings.metric_rates.get(metric, 1.0 if metric == ALWAYS else settings.rate)
        decisions[metric] = allowed and value < rate
    return value, decisions
