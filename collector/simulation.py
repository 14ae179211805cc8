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
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracejudge.mapping import build_conversations
from tracejudge.mapping.otlp import decode_otlp
from tracejudge.simulator import CONVERSATION_ID
from tracejudge.test_case import ConversationalTestCase


class TracingError(RuntimeError):
    """The agent's spans cannot be captured, with what to do."""


class _ConversationIdFromBaggage(SpanProcessor):
    """Every span started while a simulated conversation runs carries its id (from the baggage the simulator
    sets), so the mapping groups them as it groups production spans keyed by `gen_ai.conversation.id`."""

    def __init__(self) -> None:
        self.active = True

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        value = baggage.get_baggage(CONVERSATION_ID, parent_context)
        if self.active and value is not None and span.attributes is not None \
                and CONVERSATION_ID not in span.attributes:
            span.set_attribute(CONVERSATION_ID, str(value))

    def on_end(self, span: ReadableSpan) -> None:
        return None


class TracedConversations:
    def __init__(self, provider: TracerProvider | None = None,
                 mcp_tools: Mapping[str, Sequence[str]] | None = None) -> None:
        """`provider`: the SDK TracerProvider the agent's instrumentation uses (default: the global one).
        `mcp_tools`: per MCP server, the tools that are MCP primitives, for frameworks that emit no MCP span."""
        found = provider or trace.get_tracer_provider()
        if not isinstance(found, TracerProvider):
            raise TracingError("the agent's spans need an OpenTelemetry SDK TracerProvider: set one up "
                               "(trace.set_tracer_provider(TracerProvider())) before instrumenting the agent, or "
                               "pass provider=")
        self.provider, self.mcp_tools = found, mcp_tools
        self._stamp = _ConversationIdFromBaggage()
        self._exporter = InMemorySpanExporter()
        self._started = False

    def __enter__(self) -> TracedConversations:
        if not self._started:  # an SDK provider cannot drop a processor: they are added once and paused on exit
            self.provider.add_span_processor(self._stamp)
            self.provider.add_span_processor(SimpleSpanProcessor(self._exporter))
            self._started = True
        self._stamp.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self.provider.force_flush()
        self._stamp.active = False

    def test_cases(self, simulated: Sequence[ConversationalTestCase]) -> list[ConversationalTestCase]:
        """Each simulated conversation as its spans describe it (turns, MCP calls and inventory from the trace),
        keeping the golden's scenario, expected outcome, user description, name and the simulation's metadata. A
        conversation no span carried keeps its simulated turns and says so in `metadata["simulation"]`."""
        spans = [s for s in self._exporter.get_finished_spans() if (s.attributes or {}).get(CONVERSATION_ID)]
        built = {}
        if spans:
            decoded = decode_otlp(encode_spans(spans).SerializeToString(), "application/x-protobuf")
            built = {c.conversation_id: c for c in build_conversations(decoded.spans, mcp_tools=self.mcp_tools)}
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
