"""The assembler's bookkeeping against a real span store: a late span that carries no conversation key waits
with the rest of its conversation instead of having it assembled early, and a span stored twice counts once."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
from pathlib import Path

from collector.config import Settings
from collector.log import Logger
from collector.pipeline.conversation_assembler import ConversationAssembler
from collector.receivers.span_rows import spans_to_arrow
from collector.store.span_store import SpanStore
from mapping import decode_otlp
from tests.support.otlp_json import request, span


def _spans(trace: int, first_id: int, *, session: str | None, turn: str | None = None) -> list:
    attributes = {"gen_ai.operation.name": "invoke_agent"}
    if session:
        attributes["gen_ai.conversation.id"] = session
    if turn:
        attributes["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [
            {"type": "text", "content": turn}]}])
    body = request(({"service.name": "agent"}, [span(trace, first_id, "invoke_agent", attributes=attributes)]))
    return decode_otlp(json.dumps(body), "application/json").spans


def test_a_late_span_without_a_key_waits_for_its_still_active_conversation(tmp_path: Path) -> None:
    store = SpanStore(tmp_path / "t.duckdb")
    store.open()
    settings = Settings()
    settings.conversations.quiet_period_s = 0.2
    assembler = ConversationAssembler(store.cursor(), settings, Logger(stream=io.StringIO()),
                                      lambda metric: "pending", {m: "x" for m in settings.scoring.metrics})
    store.listeners.append(assembler.observe)

    async def write(spans: list) -> None:
        await store.write(spans_to_arrow(spans, dt.datetime.now(dt.UTC)))

    def versions() -> list[tuple]:
        return store.cursor().execute("SELECT conversation_id, version, turns FROM conversations "
                                      "ORDER BY version").fetchall()

    async def scenario() -> None:
        await write(_spans(1, 1, session="chat-1", turn="first question"))
        await asyncio.sleep(0.3)
        assert assembler.assemble_due() == 1 and versions() == [("chat-1", 1, 1)]
        await write(_spans(2, 2, session="chat-1", turn="second question"))  # the conversation goes on
        await write(_spans(1, 3, session=None))  # and a late span of the first trace, with no key of its own
        await asyncio.sleep(0.3)
        await write(_spans(2, 4, session="chat-1"))  # trace 2 is still active: nothing may be assembled yet
        assembler.assemble_due()
        assert versions() == [("chat-1", 1, 1)], "assembled while the conversation was still active"
        await asyncio.sleep(0.3)
        assert assembler.assemble_due() == 1
        assert [v[:2] for v in versions()] == [("chat-1", 1), ("chat-1", 2)] and assembler.pending_traces() == 0

    asyncio.run(scenario())
    store.close()
