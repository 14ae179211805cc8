"""A stored conversation mapped again from its stored spans, with where each turn and call came from: what
`tracejudge inspect CONVERSATION_ID --explain` asks a running collector for."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb

from tracejudge.mapping import Span, compose_conversation, map_traces

_COLUMNS = ("trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message, "
            "scope_name, scope_version, attributes, resource_attributes, events, links")


class ConversationNotFound(LookupError):
    """No such conversation, or its spans are gone."""


class ConversationTooLarge(ValueError):
    """More spans than the assembler maps for one conversation."""


def explain_stored(con: duckdb.DuckDBPyConnection, conversation_id: str, *,
                   mcp_tools: Mapping[str, Sequence[str]] | None, max_spans: int) -> dict[str, Any]:
    """The latest version's traces (attached context included), read back and mapped with `explain`, as
    `Conversation.document(explain=True)`."""
    found = con.execute("SELECT trace_ids FROM conversations WHERE conversation_id = ? ORDER BY version DESC "
                        "LIMIT 1", [conversation_id]).fetchall()
    if not found:
        raise ConversationNotFound(f"no conversation {conversation_id!r} here; list them with tracejudge query "
                                   "\"SELECT conversation_id FROM latest_conversations\"")
    traces = list(found[0][0] or [])
    [(count,)] = con.execute("SELECT count(*) FROM spans WHERE trace_id IN (SELECT unnest(?))", [traces]).fetchall()
    if count > max_spans:
        raise ConversationTooLarge(f"conversation {conversation_id!r} has {count} spans, more than [conversations] "
                                   f"max_spans ({max_spans}) maps at once")
    rows = con.execute(f"SELECT {_COLUMNS} FROM spans WHERE trace_id IN (SELECT unnest(?)) QUALIFY row_number() "
                       "OVER (PARTITION BY trace_id, span_id ORDER BY received_at DESC) = 1", [traces]).fetchall()
    spans = [Span.from_record({
        "trace_id": r[0], "span_id": r[1], "parent_span_id": r[2], "name": r[3], "kind": r[4], "start_ns": r[5],
        "end_ns": r[6], "status_code": r[7], "status_message": r[8], "scope_name": r[9] or "",
        "scope_version": r[10] or "", "attributes": json.loads(r[11]), "resource": json.loads(r[12] or "{}"),
        "events": json.loads(r[13]), "links": json.loads(r[14])}) for r in rows]
    conversation = compose_conversation(map_traces(spans, explain=True), mcp_tools=mcp_tools, explain=True)
    if conversation is None:
        raise ConversationNotFound(f"the spans of conversation {conversation_id!r} are gone (pruned by retention); "
                                   "its stored test case is in the conversations table")
    return conversation.document(explain=True)
