"""pydantic-ai: the agent run span carries the whole history (`pydantic_ai.all_messages`) and where this
run's messages start (`pydantic_ai.new_message_index`)."""

from __future__ import annotations

from tracejudge.mapping.dialects.base import AgentRun, Dialect
from tracejudge.mapping.messages import parse_messages
from tracejudge.mapping.spans import Span


class PydanticAI(Dialect):
    name = "pydantic_ai"

    def applies(self, span: Span) -> bool:
        return "pydantic_ai.all_messages" in span.attributes

    def agent_run(self, span: Span) -> AgentRun | None:
        history = parse_messages(span.json_attr("pydantic_ai.all_messages"))
        index = span.attr("pydantic_ai.new_message_index")
        final = span.json_attr("final_result")
        return AgentRun(
            agent_name=span.str_attr("gen_ai.agent.name") or span.str_attr("agent_name"),
            output_text=final if isinstance(final, str) else None,
            history=history,
            new_from=index if isinstance(index, int) and 0 <= index <= len(history) else 0,
        )
