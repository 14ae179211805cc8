"""What an instrumentation left out of a conversation (messages, tool arguments, results) and the switch that
records it, by the instrumentation's scope name: a conversation with nothing to judge says why and what to turn
on, instead of being scored from nothing."""

from __future__ import annotations

import functools
from collections.abc import Iterable

# (scope name prefix, what to turn on); the first prefix that matches a scope of the conversation wins
SWITCHES: tuple[tuple[str, str], ...] = (
    ("autogen", "AutoGen's built-in tracing records agent and tool names only: instrument its model client as well "
                "(opentelemetry-instrumentation-openai-v2 with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="
                "true, or openinference-instrumentation-openai) and put a gen_ai.conversation.id on the runs"),
    ("pydantic-ai", "pydantic-ai: InstrumentationSettings(include_content=True) (logfire.instrument_pydantic_ai() "
                    "includes content unless include_content=False)"),
    ("strands", "Strands: OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental"),
    ("gcp.vertex.agent", "Google ADK: ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS=true"),
    ("openinference", "OpenInference: leave OPENINFERENCE_HIDE_INPUTS, _HIDE_OUTPUTS, _HIDE_INPUT_MESSAGES and "
                      "_HIDE_OUTPUT_MESSAGES unset (or false)"),
    ("traceloop", "OpenLLMetry: TRACELOOP_TRACE_CONTENT=true"),
    ("opentelemetry.instrumentation.mcp", "OpenLLMetry: TRACELOOP_TRACE_CONTENT=true"),
    ("opentelemetry.instrumentation.openai", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true"),
    ("ai", "Vercel AI SDK: experimental_telemetry {isEnabled: true, recordInputs: true, recordOutputs: true}"),
)
DEFAULT_SWITCH = ("turn on your instrumentation's message-content capture (the OpenTelemetry GenAI "
                  "instrumentations: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)")


def switch_for(scopes: Iterable[str]) -> str:
    """What to turn on to record content, for the instrumentation scopes a conversation's spans came from."""
    return _switch_for(frozenset(scopes))


@functools.lru_cache(maxsize=256)
def _switch_for(scopes: frozenset[str]) -> str:
    names = sorted(scopes)
    for prefix, switch in SWITCHES:
        if any(name == prefix or name.startswith(prefix + ".") or name.startswith(prefix + "-") for name in names):
            return switch
    return DEFAULT_SWITCH


def missing_content(*, has_messages: bool, calls: int, with_arguments: int, with_results: int) -> list[str]:
    """Which kinds of content the conversation's spans hold none of: `messages` (no user or assistant text at
    all), `arguments` and `results` (calls were made, and not one of them has any)."""
    missing = [] if has_messages else ["messages"]
    if calls and not with_arguments:
        missing.append("arguments")
    if calls and not with_results:
        missing.append("results")
    return missing
