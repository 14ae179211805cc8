"""Simulated conversations traced like production: the agent under test runs with its own OpenTelemetry
instrumentation, each simulated conversation's spans carry its id, and each test case is rebuilt from those spans
through tracejudge's mapping, so its MCP tool calls, resource reads, prompt gets and server inventory are what
the trace says, exactly as the collector would score them in production; the callback only returns the reply.

    with TracedConversations() as traced:            # on the global SDK TracerProvider, or pass provider=
        simulated = ConversationSimulator(model_callback=agent).simulate(goldens)
    cases = traced.test_cases(simulated)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracejudge.mapping import build_conversations
from tracejudge.mapping.otlp import decode_otlp
from tracejudge.mapping.spans import Span as MappedSpan
from tracejudge.simulator import CONVERSATION_ID, THREAD_ID
from tracejudge.test_case import ConversationalTestCase


class TracingError(RuntimeError):
    """The agent's spans cannot be captured, with what to do."""


class _ConversationIdFromBaggage(SpanProcessor):
    """Every span started while a simulated conversation runs carries its thread id (from the baggage the
    simulator sets) in an attribute of its own: a framework that names its runs' conversations itself (pydantic-ai
    gives each run a new `gen_ai.conversation.id`) cannot overwrite it."""

    def __init__(self) -> None:
        self.active = True

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        value = baggage.get_baggage(THREAD_ID, parent_context)
        if self.active and value is not None:
            span.set_attribute(THREAD_ID, str(value))

    def on_end(self, span: ReadableSpan) -> None:
        return None


class TracedConversations:
    def __init__(self, provider: TracerProvider | None = None,
                 mcp_tools: Mapping[str, Sequence[str]] | None = None, *, attach: bool = True) -> None:
        """`provider`: the SDK TracerProvider the agent's instrumentation uses (default: the global one).
        `mcp_tools`: per MCP server, the tools that are MCP primitives, for frameworks that emit no MCP span.
        `attach=False`: add `span_processors` yourself (a framework that builds its own provider, such as
        `logfire.configure(additional_span_processors=traced.span_processors)`)."""
        self.mcp_tools = mcp_tools
        self._stamp = _ConversationIdFromBaggage()
        self._exporter = InMemorySpanExporter()
        self.span_processors: list[SpanProcessor] = [self._stamp, SimpleSpanProcessor(self._exporter)]
        self.provider: TracerProvider | None = None
        if attach:
            found = provider or trace.get_tracer_provider()
            if not isinstance(found, TracerProvider):
                raise TracingError("the agent's spans need an OpenTelemetry SDK TracerProvider: set one up "
                                   "(trace.set_tracer_provider(TracerProvider())) before instrumenting the agent, "
                                   "pass provider=, or pass attach=False and add span_processors to yours")
            self.provider = found
        self._started = False

    def __enter__(self) -> TracedConversations:
        if self.provider is not None and not self._started:  # an SDK provider cannot drop a processor: added
            for processor in self.span_processors:          # once, paused on exit
                self.provider.add_span_processor(processor)
            self._started = True
        self._stamp.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.provider is not None:
            self.provider.force_flush()
        self._stamp.active = False

    def spans(self) -> list[ReadableSpan]:
        """The finished spans of the traces a simulated conversation ran in."""
        finished = self._exporter.get_finished_spans()
        traces = {s.context.trace_id for s in finished if s.context and (s.attributes or {}).get(THREAD_ID)}
        return [s for s in finished if s.context and s.context.trace_id in traces]

    def test_cases(self, simulated: Sequence[ConversationalTestCase]) -> list[ConversationalTestCase]:
        """Each simulated conversation as its spans describe it (see `from_spans`)."""
        spans = self.spans()
        decoded = decode_otlp(encode_spans(spans).SerializeToString(), "application/x-protobuf").spans if spans \
            else []
        return from_spans(decoded, simulated, self.mcp_tools)


def from_spans(spans: Sequence[MappedSpan], simulated: Sequence[ConversationalTestCase],
               mcp_tools: Mapping[str, Sequence[str]] | None = None) -> list[ConversationalTestCase]:
    """Each simulated conversation rebuilt from the decoded spans that carry its thread id (turns, MCP calls and
    inventory from the trace), keeping the golden's scenario, expected outcome, user description, name and the
    simulation's metadata. A conversation no span carried keeps its simulated turns and says so in
    `metadata["simulation"]["traced"]`."""
    thread_of: dict[str, str] = {}  # trace -> the simulated conversation it ran in
    for span in spans:
        if span.attributes.get(THREAD_ID):
            thread_of.setdefault(span.trace_id, str(span.attributes[THREAD_ID]))
    keyed = [replace(span, attributes={**span.attributes, CONVERSATION_ID: thread_of[span.trace_id]}, _parsed={})
             for span in spans if span.trace_id in thread_of]  # the simulation's id wins over a framework's own
    built = {c.conversation_id: c for c in build_conversations(keyed, mcp_tools=mcp_tools)} if keyed else {}
    out = []
    for case in simulated:
        simulation = dict((case.metadata or {}).get("simulation") or {})
        conversation = built.get(simulation.get("thread_id", ""))
        if conversation is None:
            simulation["traced"] = ("no span of the agent carried this conversation's id: is the agent "
                                    "instrumented with OpenTelemetry on this TracerProvider?")
            out.append(case.model_copy(update={"metadata": {**(case.metadata or {}), "simulation": simulation}}))
            continue
        simulation["traced"] = f"{len(conversation.trace_ids)} traces"
        traced = conversation.test_case
        out.append(traced.model_copy(update={
            "scenario": case.scenario, "expected_outcome": case.expected_outcome,
            "user_description": case.user_description, "name": case.name, "context": case.context,
            "metadata": {**(traced.metadata or {}), **(case.metadata or {}), "simulation": simulation}}))
    return out
