"""The assembler's memory of MCP sessions (collector/pipeline/assembly/session_index.py): a session shared by many
conversations (a long-lived app process talking to a long-lived MCP server) is ambiguous once, costs one entry,
and nothing waits on it; context joins the one conversation of its session whichever arrives first; the index
stays within its bounds."""

from __future__ import annotations

from tracejudge.collector.pipeline.assembly.session_index import SessionIndex


def test_context_joins_the_one_conversation_of_its_session_in_either_order() -> None:
    index = SessionIndex(limit=100)
    index.owned("conv-a", {"agent/1 -> shop/1"})
    assert index.owner({"agent/1 -> shop/1"}) == "conv-a"
    index.wait("ctx-1", frozenset({"agent/2 -> shop/2"}))  # its conversation comes later
    assert index.waiting_for({"agent/2 -> shop/2"}) == {"ctx-1"}
    index.owned("conv-b", {"agent/2 -> shop/2"})
    assert index.owner(index.sessions_of("ctx-1")) == "conv-b"


def test_a_session_of_many_conversations_is_ambiguous_once_and_holds_nothing() -> None:
    index = SessionIndex(limit=1000)
    shared = {"web/1 -> search/1"}
    index.wait("ctx-early", frozenset(shared))
    for n in range(10_000):
        index.owned(f"conv-{n}", shared)
        index.wait(f"ctx-{n}", frozenset(shared))
    assert index.owner(shared) is None  # never attached to whichever conversation came first
    assert index.waiting_for(shared) == set() and len(index) == 1


def test_the_index_keeps_to_its_bounds() -> None:
    index = SessionIndex(limit=50)
    for n in range(1_000):
        index.owned(f"conv-{n}", {f"s{n}"})
        index.wait(f"ctx-{n}", frozenset({f"t{n}"}))
    assert len(index) == 100
    assert index.owner({"s999"}) == "conv-999" and index.owner({"s0"}) is None
