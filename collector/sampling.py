"""Which conversations the judged metrics score: a hash of the conversation id against each metric's rate.

sha256(id) mapped to [0, 1) is the same on every restart and replica, and nested: a conversation sampled
at 10% is also sampled at 50%. Filters on service and agent name apply first; `mcp_call_validity` is
cheap and runs on every conversation unless a rate is given for it.
"""

from __future__ import annotations

import hashlib

from collector.config import SamplingSettings

ALWAYS = "mcp_call_validity"


def sample_value(conversation_id: str) -> float:
    digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def decide(settings: SamplingSettings, metrics: list[str], conversation_id: str, service_name: str | None,
           agent_name: str | None) -> tuple[float, dict[str, bool]]:
    """(sample value, metric -> scored?) for one conversation."""
    value = sample_value(conversation_id)
    allowed = (
        (not settings.include_services or service_name in settings.include_services)
        and service_name not in settings.exclude_services
        and (not settings.include_agents or agent_name in settings.include_agents)
        and agent_name not in settings.exclude_agents
    )
    decisions = {}
    for metric in metrics:
        rate = settings.metric_rates.get(metric, 1.0 if metric == ALWAYS else settings.rate)
        decisions[metric] = allowed and value < rate
    return value, decisions
