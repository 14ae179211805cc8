"""The assembler's bookkeeping against a real span store: a late span that carries no conversation key waits
with the rest of its conversation instead of having it assembled early, a span stored twice counts once, and
whatever order spans and polls come in, every trace ends in the conversation its spans name."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.otlp_json import request, span, tid
from tracejudge.collector.config import Settings
from tracejudge.collector.log import Logger
from tracejudge.collector.pipeline.assembly import conversation_assembler
from tracejudge.collector.pipeline.assembly.conversation_assembler import MAX_PER_POLL, ConversationAssembler
from tracejudge.collector.receivers.span_rows import spans_to_arrow
from tracejudge.collector.store.assembled_index import AssembledIndex, index_path
from tracejudge.collector.store.span_store import SpanStore, StoreStats
from tracejudge.mapping import build_conversations, decode_otlp


def _spans(trace: int, first_id: int, *, session: str | None, turn: str | None = None,
           key: str = "gen_ai.conversation.id") -> list:
    attributes: dict[str, str] = {"gen_ai.operation.name": "invoke_agent"}
    if session:
        attributes[key] = session
    if turn:
        attributes["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [
            {"type": "text", "content": turn}]}])
    body = request(({"service.name": "agent"}, [span(trace, first_id, "invoke_agent", attributes=attributes)]))
    return decode_otlp(json.dumps(body), "application/json").spans


def _assembling_store(path: Path, *, quiet_period_s: float, trace_cache: int | None = None,
                      max_waiting_traces: int | None = None,
                      assembly_workers: int | None = None) -> tuple[SpanStore, ConversationAssembler]:
    """An open store whose commits the assembler observes, as in `tracejudge serve`."""
    store = SpanStore(path)
    store.open()
    config = Settings()
    config.conversations.quiet_period_s = quiet_period_s
    if trace_cache is not None:
        config.conversations.trace_cache = trace_cache
    if max_waiting_traces is not None:
        config.conversations.max_waiting_traces = max_waiting_traces
    if assembly_workers is not None:
        config.conversations.assembly_workers = assembly_workers
    assembler = ConversationAssembler(store.cursor(), config, Logger(stream=io.StringIO()),
                                      lambda metric: "pending", {m: "x" for m in config.scoring.metrics},
                                      index=AssembledIndex(index_path(path), store.cursor()))
    store.listeners.append(assembler.observe)
    return store, assembler


async def _assembled_conversations(store: SpanStore, assembler: ConversationAssembler, count: int) -> None:
    """`count` one-turn conversations (chat-0, chat-1, ...) stored, assembled and their jobs queued."""
    for trace in range(count):
        await store.write(spans_to_arrow(_spans(trace + 1, trace + 1, session=f"chat-{trace}", turn="hello"),
                                         dt.datetime.now(dt.UTC)))
    await asyncio.sleep(0.2)
    assert assembler.assemble_due() == count


def _drain(assembler: ConversationAssembler) -> None:
    """Assemble until nothing is due and nothing left out of the index waits to be taken in."""
    while assembler.assemble_due() or assembler.take_in():
        pass


async def _write_turn(store: SpanStore, trace: int, span: int, session: str | None, turn: str,
                      received: dt.datetime) -> None:
    """A span of `trace` carrying one user turn (and `session` as its conversation key), stored as received then."""
    await store.write(spans_to_arrow(_spans(trace, span, session=session, turn=turn), received))


def _miss_next_commit(assembler: ConversationAssembler, monkeypatch) -> None:
    """The assembler fails on the next commit it is told of (as a bug in it would), then works again."""
    observe = assembler._observe

    def fail_once(table) -> None:
        monkeypatch.setattr(assembler, "_observe", observe)
        raise RuntimeError("the assembler missed this commit")

    monkeypatch.setattr(assembler, "_observe", fail_once)


def _versions(store: SpanStore) -> list[tuple]:
    """(conversation, version, turns) of every version stored."""
    return store.cursor().execute("SELECT conversation_id, version, turns FROM conversations ORDER BY 1, 2").fetchall()


async def _rounds(assembler: ConversationAssembler, pending) -> None:
    """Rounds as `serve` runs them, until one finds nothing due and nothing pending."""
    while True:
        done, pending = assembler.assemble_next(pending, MAX_PER_POLL)
        if pending is None and not done:
            return


async def _until(con, query: str, expected: list[tuple], seconds: float = 10) -> list[tuple]:
    """The query's rows once they are `expected`, or as they stand after `seconds`."""
    rows = con.execute(query).fetchall()
    for _ in range(int(seconds / 0.05)):
        if rows == expected:
            break
        await asyncio.sleep(0.05)
        rows = con.execute(query).fetchall()
    return rows


def test_a_late_span_without_a_key_waits_for_its_still_active_conversation(tmp_path: Path) -> None:
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.2)

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


@pytest.mark.parametrize("later, key_kept", [
    pytest.param("a new trace", True, id="next turn in a new trace"),
    pytest.param("a late span of the first trace", True, id="late span, no key of its own"),
    pytest.param("a new trace", False, id="first trace assembled by a version that did not keep its age"),
])
def test_a_conversations_earlier_turns_received_hours_ago_are_in_its_next_version(
        tmp_path: Path, later: str, key_kept: bool) -> None:
    """Reads skip the spans received before a conversation's oldest one (so a poll does not scan the whole table):
    the turns it had hours ago must still be read back when it goes on, and its spans still name its key."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    now = dt.datetime.now(dt.UTC)

    async def scenario() -> None:
        await store.write(spans_to_arrow(_spans(1, 1, session="chat-1", turn="first question"),
                                         now - dt.timedelta(hours=5)))
        assert assembler.assemble_due() == 1
        if not key_kept:
            store.cursor().execute("UPDATE assembled_traces SET first_received_at = NULL")
        late = (_spans(2, 2, session="chat-1", turn="second question") if later == "a new trace" else
                _spans(1, 2, session=None, turn="second question"))
        await store.write(spans_to_arrow(late, now))
        assert assembler.assemble_due() == 1

    try:
        asyncio.run(scenario())
        rows = store.cursor().execute("SELECT conversation_id, version, turns FROM conversations "
                                      "ORDER BY conversation_id, version").fetchall()
        assert rows == [("chat-1", 1, 1), ("chat-1", 2, 2)], rows
    finally:
        store.close()


def test_a_delayed_turn_received_before_its_conversations_earlier_trace_gets_a_version_with_both(
        tmp_path: Path) -> None:
    """A poll reads only the spans received up to the newest its conversations' commits brought (so in a backlog it
    does not scan every span stored after them); a trace assembled before, read again with a new one whose request
    was stamped earlier (it waited in a retry), is bounded by its own assembly, not by the new trace's receipt."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    now = dt.datetime.now(dt.UTC)

    async def scenario() -> None:
        await _write_turn(store, 1, 1, "chat-1", "second question", now)
        assert assembler.assemble_due() == 1
        await _write_turn(store, 2, 2, "chat-1", "first question", now - dt.timedelta(minutes=30))
        assert assembler.assemble_due() == 1

    try:
        asyncio.run(scenario())
        rows = store.cursor().execute("SELECT version, turns FROM conversations ORDER BY version").fetchall()
        assert rows == [(1, 1), (2, 2)], rows
    finally:
        store.close()


@pytest.mark.parametrize("late_key", [None, "chat-2"], ids=["late span without a key", "late span naming another"])
def test_an_earlier_traces_late_span_waiting_apart_is_in_its_conversations_next_version(tmp_path: Path,
                                                                                   late_key: str | None) -> None:
    """A conversation goes on past a trace assembled long before, whose late span waits apart (its own wait, not yet
    quiet): the poll of the conversation reads that trace with no upper bound, so the version has the late span,
    or, when it names a stronger key, leaves the trace to that conversation, as without the bound (the review's
    finding: bounded by when the trace was assembled, the version missed it and another followed)."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.3)
    now = dt.datetime.now(dt.UTC)

    async def write(trace: int, span: int, session: str | None, turn: str | None, key: str, minutes: int) -> None:
        await store.write(spans_to_arrow(_spans(trace, span, session=session, turn=turn, key=key),
                                         now + dt.timedelta(minutes=minutes)))

    async def scenario() -> None:
        await write(1, 1, "chat-1", "first question", "session.id", 0)
        await asyncio.sleep(0.35)
        assert assembler.assemble_due() == 1
        await write(2, 2, "chat-1", "second question", "session.id", 20)
        await asyncio.sleep(0.15)
        await write(1, 3, late_key, "more of the first" if late_key is None else None, "gen_ai.conversation.id", 21)
        await asyncio.sleep(0.2)
        assembler.assemble_due()  # chat-1 is due; the late span's own wait is not
        await asyncio.sleep(0.35)
        while assembler.assemble_due():
            await asyncio.sleep(0.35)

    try:
        asyncio.run(scenario())
        expected = [("chat-1", 1, 1), ("chat-1", 2, 3)] if late_key is None else \
            [("chat-1", 1, 1), ("chat-1", 2, 1), ("chat-2", 1, 1)]
        assert _versions(store) == expected
    finally:
        store.close()


def test_a_trace_left_out_of_a_full_index_then_noted_by_an_older_commit_is_read_whole(tmp_path: Path) -> None:
    """Commits do not come in the order of receipt: a trace left out of a full index, then noted by a later commit
    of spans received earlier, has newer spans than that commit's, and its read has no upper bound."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0, max_waiting_traces=20)
    now = dt.datetime.now(dt.UTC)

    async def scenario() -> None:
        for i in range(20):
            await _write_turn(store, 100 + i, 100 + i, f"chat-{i}", "hi", now)
        await _write_turn(store, 1, 1, "chat-x", "first question", now + dt.timedelta(seconds=2))
        assert assembler.left_out == 1
        assert assembler.assemble_due(limit=1) == 1  # one place free: fewer than take_in waits for
        await _write_turn(store, 1, 2, "chat-x", "second question", now + dt.timedelta(seconds=1))
        _drain(assembler)

    try:
        asyncio.run(scenario())
        assert [v for v in _versions(store) if v[0] == "chat-x"] == [("chat-x", 1, 2)]
    finally:
        store.close()


def test_a_trace_received_before_the_clock_was_set_back_stays_in_its_conversation(tmp_path: Path) -> None:
    """Reads of traces assembled before are not bounded by when they were assembled (a wall clock reading): spans
    stamped while the clock ran half an hour ahead are still read when the conversation goes on."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    now = dt.datetime.now(dt.UTC)

    async def scenario() -> None:
        await _write_turn(store, 1, 1, "chat-1", "first question", now + dt.timedelta(minutes=30))
        assert assembler.assemble_due() == 1
        await _write_turn(store, 2, 2, "chat-1", "second question", now)
        assert assembler.assemble_due() == 1
        await _write_turn(store, 3, 3, "chat-1", "third question", now + dt.timedelta(seconds=1))
        assert assembler.assemble_due() == 1

    try:
        asyncio.run(scenario())
        assert _versions(store) == [("chat-1", 1, 1), ("chat-1", 2, 2), ("chat-1", 3, 3)]
    finally:
        store.close()


def test_a_poll_in_a_backlog_reads_up_to_its_conversations_newest_receipt_and_a_later_span_goes_in_the_next(
        tmp_path: Path) -> None:
    """The span read of a poll stops at the newest receipt its conversations' commits brought when it was
    planned: a span of one of its traces committed after the plan (received later) is not lost, its conversation
    waits again and gets the next version with it."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    now = dt.datetime.now(dt.UTC)

    async def scenario() -> None:
        await _write_turn(store, 1, 1, "chat-1", "first question", now)
        poll = assembler.plan()
        assert poll is not None and poll.until_us == int(now.timestamp() * 1_000_000)
        await _write_turn(store, 1, 2, None, "more of it", now + dt.timedelta(seconds=1))  # after the plan
        assert assembler.finish(poll) == 1 and assembler.pending_conversations() == 1  # changed meanwhile: waits
        assert assembler.assemble_due() == 1

    try:
        asyncio.run(scenario())
        rows = store.cursor().execute("SELECT version, turns FROM conversations ORDER BY version").fetchall()
        [whole] = build_conversations(_stored_spans(store))
        assert rows == [(1, 1), (2, 2)], rows
        assert store.cursor().execute("SELECT content_hash FROM conversations WHERE version = 2").fetchone()[0] == \
            whole.content_hash
    finally:
        store.close()


# each trace's conversation key under gen_ai.conversation.id and under the weaker session.id (None: it has none),
# then steps: a span of trace N (carrying the strong key, the weak one or none), a poll that assembles what is due,
# or a round as `tracejudge serve` runs them: the next poll planned and sent to the workers, then the one pending
# from the round before written (spans keep coming while a poll is pending)
_KEYS = st.lists(st.sampled_from([None, "chat-a", "chat-b"]), min_size=4, max_size=4)
_WEAK_KEYS = st.lists(st.sampled_from([None, "chat-a", "chat-c"]), min_size=4, max_size=4)
_STEPS = st.lists(st.one_of(st.tuples(st.integers(0, 3), st.sampled_from(["strong", "weak", "none"])),
                            st.sampled_from(["poll", "poll one", "round", "round of one"])), min_size=1, max_size=12)


@pytest.mark.parametrize("same_trace", [True, False], ids=["same trace", "another trace of the conversation"])
def test_spans_committed_after_newer_ones_of_their_conversation_are_still_read(tmp_path: Path,
                                                                              same_trace: bool) -> None:
    """A request stamped at receipt can be written after a later one (it waited in the decode pool or the writer's
    queue, or a retry was stamped anew): the conversation's read starts at the oldest span of all its commits, not
    of its first one, or that request's turn is missing from the version."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    now = dt.datetime.now(dt.UTC)

    async def scenario() -> None:
        await _write_turn(store, 1, 1, "chat-1", "second question", now)
        await _write_turn(store, 1 if same_trace else 2, 2, "chat-1", "first question", now - dt.timedelta(minutes=10))
        assert assembler.assemble_due() == 1

    try:
        asyncio.run(scenario())
        rows = store.cursor().execute("SELECT conversation_id, version, turns FROM conversations").fetchall()
        assert rows == [("chat-1", 1, 2)], rows
    finally:
        store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=_KEYS, weak_keys=_WEAK_KEYS, steps=_STEPS)
def test_whatever_the_order_every_trace_ends_in_the_conversation_its_spans_name(
        tmp_path_factory, keys: list[str | None], weak_keys: list[str | None], steps: list) -> None:
    """A trace belongs to the conversation its strongest key names (gen_ai.conversation.id over session.id), however
    its spans and the polls interleave."""
    store, assembler = _assembling_store(tmp_path_factory.mktemp("assembler") / "t.duckdb", quiet_period_s=0.0)
    named: dict[int, dict[str, str]] = {}  # trace -> key attribute -> the value its stored spans carry
    sent: set[int] = set()
    # each step received two hours after the one before: reads that start too late would lose a trace's spans
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2 * len(steps))

    async def scenario() -> None:
        pending = None
        for n, step in enumerate(steps):
            if step in ("poll", "poll one"):  # one at a time leaves the others waiting, as a backlog does
                if pending is not None:  # `serve` runs no poll beside its rounds: the pending one is written first
                    assembler.finish(pending)
                    pending = None
                assembler.assemble_due(limit=1 if step == "poll one" else None)
            elif step in ("round", "round of one"):
                _, pending = assembler.assemble_next(pending, 1 if step == "round of one" else MAX_PER_POLL)
            else:
                trace, strength = step
                attribute = "gen_ai.conversation.id" if strength == "strong" else "session.id"
                key = {"strong": keys, "weak": weak_keys, "none": [None] * 4}[strength][trace]
                await store.write(spans_to_arrow(_spans(trace + 1, n + 1, session=key, turn=f"turn {n}",
                                                        key=attribute), start + dt.timedelta(hours=2 * n)))
                sent.add(trace)
                if key is not None:
                    named.setdefault(trace, {})[attribute] = key
            # the waiting index holds no conversation without a waiting trace (its memory follows the traces)
            assert assembler.pending_conversations() <= assembler.pending_traces()
        await _rounds(assembler, pending)
        while assembler.assemble_due(force=True):  # a conversation a trace left waits again, for the next poll
            pass

    try:
        asyncio.run(scenario())
        assert assembler.pending_traces() == 0, "traces left waiting after everything was assembled"
        latest = dict(store.cursor().execute(
            "SELECT conversation_id, trace_ids FROM conversations "
            "QUALIFY row_number() OVER (PARTITION BY conversation_id ORDER BY version DESC) = 1").fetchall())
        expected: dict[str, set[str]] = {}
        for trace in sent:
            held = named.get(trace, {})
            conversation = held.get("gen_ai.conversation.id") or held.get("session.id") or tid(trace + 1)
            expected.setdefault(conversation, set()).add(tid(trace + 1))
        for conversation_id, traces in expected.items():
            assert set(latest.get(conversation_id) or ()) == traces, (conversation_id, latest)
        # and each is the conversation all of its stored spans make, though later versions reuse earlier traces'
        # mapped turns instead of reading them again (a trace with new spans must be mapped again)
        hashes = dict(store.cursor().execute(
            "SELECT conversation_id, arg_max(content_hash, version) FROM conversations GROUP BY ALL").fetchall())
        whole = {c.conversation_id: c.content_hash for c in build_conversations(_stored_spans(store))}
        assert {c: hashes.get(c) for c in whole} == whole  # (a conversation whose traces all moved keeps its last)
    finally:
        store.close()


def test_a_round_leaves_to_the_next_what_the_pending_poll_is_building(tmp_path: Path) -> None:
    """`serve` plans the next poll while the workers build the pending one: a late span (no key of its own) of a
    trace assembled before names a conversation the pending poll is building; planned now, it would be built
    from the traces assembled so far, without the pending poll's new trace, and written after it as the latest
    version. It waits for the round after, and the latest version holds every trace."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)

    async def write(spans: list) -> None:
        await store.write(spans_to_arrow(spans, dt.datetime.now(dt.UTC)))

    def latest() -> tuple:
        return store.cursor().execute(
            "SELECT version, list_sort(trace_ids), turns FROM conversations WHERE conversation_id = 'chat-1' "
            "ORDER BY version DESC LIMIT 1").fetchone()

    async def scenario() -> None:
        await write(_spans(1, 1, session="chat-1", turn="first question"))
        assert assembler.assemble_due() == 1
        await write(_spans(2, 2, session="chat-1", turn="second question"))  # the conversation goes on
        done, pending = assembler.assemble_next(None, MAX_PER_POLL)  # sent to the workers, not yet written
        assert done == 0 and pending is not None
        await write(_spans(1, 3, session=None, turn="first question, asked again"))  # a late span, no key
        done, pending = assembler.assemble_next(pending, MAX_PER_POLL)
        assert done == 1, "the pending poll was written"
        assert latest() == (2, [tid(1), tid(2)], 2)
        assert assembler.pending_traces() == 1, "the late span's trace waits for the next round"
        await _rounds(assembler, pending)
        assert assembler.pending_traces() == 0

    try:
        asyncio.run(scenario())
        version, traces, _ = latest()
        assert traces == [tid(1), tid(2)], f"version {version} lost a trace: {traces}"
        hashes = dict(store.cursor().execute(
            "SELECT conversation_id, arg_max(content_hash, version) FROM conversations GROUP BY ALL").fetchall())
        assert hashes == {c.conversation_id: c.content_hash for c in build_conversations(_stored_spans(store))}
    finally:
        store.close()


def test_context_attached_while_a_round_was_pending_is_judged_with_its_conversation_once(tmp_path: Path) -> None:
    """The session-start resource read of a real pydantic-ai session arrives after the session's conversation was
    assembled, and is written while the next poll, holding the conversation's newest trace, is already with the
    workers. That poll's version lacks the context that joined meanwhile: it is written without judged jobs, and
    the version with the context follows and is the one judged, once (as when polls run one after another)."""
    decoded = decode_otlp((Path(__file__).parent / "fixtures" / "real" / "pydantic_ai_session.otlp.json")
                          .read_bytes(), "application/json")
    keyed = sorted({s.trace_id for s in decoded.spans if s.attributes.get("gen_ai.conversation.id")})
    [context] = {s.trace_id for s in decoded.spans if s.name == "resources/read" and s.trace_id not in keyed}
    last = max(keyed, key=lambda t: min(s.start_ns for s in decoded.spans if s.trace_id == t))
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)

    async def write(traces: set[str]) -> None:
        await store.write(spans_to_arrow([s for s in decoded.spans if s.trace_id in traces], dt.datetime.now(dt.UTC)))

    async def scenario() -> None:
        await write(set(keyed) - {last})
        assert assembler.assemble_due() == 1
        await write({context})
        _, pending = assembler.assemble_next(None, MAX_PER_POLL)  # the context, sent to the workers
        await write({last})  # the conversation goes on: planned next, before the context is written
        _, pending = assembler.assemble_next(pending, MAX_PER_POLL)
        await _rounds(assembler, pending)

    try:
        asyncio.run(scenario())
        con = store.cursor()
        [conversation] = {c for (c,) in con.execute("SELECT conversation_id FROM conversations "
                                                    "WHERE status IS DISTINCT FROM 'context_only'").fetchall()}
        latest = con.execute("SELECT version, trace_ids FROM conversations WHERE conversation_id = ? "
                             "ORDER BY version DESC LIMIT 1", [conversation]).fetchone()
        assert context in latest[1] and last in latest[1], latest
        judged = con.execute("SELECT conversation_version, count(*) FROM eval_jobs WHERE conversation_id = ? "
                             "AND metric IN ('mcp_use', 'mcp_task_completion') GROUP BY ALL ORDER BY 1",
                             [conversation]).fetchall()
        assert [v for v, _ in judged] == [1, latest[0]], f"judged versions {judged}, latest {latest[0]}"
    finally:
        store.close()


def test_context_held_from_an_earlier_poll_joins_its_conversation_with_its_spans(tmp_path: Path) -> None:
    """The session-start resource read of a real pydantic-ai session arrives first, is assembled alone (context
    waiting for its session), and its conversation comes a minute later: the context trace waits again from its
    own spans, which are older than the conversation's, and the next version holds it."""
    decoded = decode_otlp((Path(__file__).parent / "fixtures" / "real" / "pydantic_ai_session.otlp.json")
                          .read_bytes(), "application/json")
    keyed = {s.trace_id for s in decoded.spans if s.attributes.get("gen_ai.conversation.id")}
    [context] = {s.trace_id for s in decoded.spans if s.name == "resources/read" and s.trace_id not in keyed}
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    now = dt.datetime.now(dt.UTC)

    async def write(traces: set[str], ago_s: float) -> None:
        await store.write(spans_to_arrow([s for s in decoded.spans if s.trace_id in traces],
                                         now - dt.timedelta(seconds=ago_s)))

    async def scenario() -> None:
        await write({context}, 60)
        assert assembler.assemble_due() == 1  # context only: it waits for its session's conversation
        await write(keyed, 0)
        while assembler.assemble_due():
            pass

    try:
        asyncio.run(scenario())
        latest = store.cursor().execute(
            "SELECT trace_ids FROM conversations WHERE status IS DISTINCT FROM 'context_only' "
            "ORDER BY version DESC LIMIT 1").fetchone()
        assert latest is not None and context in latest[0], latest
        # the context-only conversation went with its attachment, from the index of newest versions too
        con = store.cursor()
        stored = {r[0] for r in con.execute("SELECT DISTINCT conversation_id FROM conversations").fetchall()}
        newest = {r.conversation_id: r for r in assembler.index.latest([context, *stored])}
        assert context not in newest and newest.keys() == stored
        assert {(r.conversation_id, r.version, r.content_hash) for r in newest.values()} == set(con.execute(
            "SELECT conversation_id, max(version), arg_max(content_hash, version) FROM conversations GROUP BY 1"
        ).fetchall())
    finally:
        store.close()


def _stored_spans(store: SpanStore) -> list[dict]:
    """Every stored span as a record `build_conversations` takes."""
    rows = store.cursor().execute(
        "SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, attributes, resource_attributes, "
        "events FROM spans").fetchall()
    return [{"trace_id": r[0], "span_id": r[1], "parent_span_id": r[2], "name": r[3], "kind": r[4], "start_ns": r[5],
             "end_ns": r[6], "attributes": json.loads(r[7]), "resource": json.loads(r[8]), "events": json.loads(r[9])}
            for r in rows]


def test_a_trace_whose_id_another_trace_names_as_its_conversation_is_assembled_with_it(tmp_path: Path) -> None:
    """A conversation key may be a trace id (a framework that keys sessions by their first trace): the trace that
    is that id, waiting as its own conversation, must stay in it when another trace joins, not be forgotten."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=60.0)

    async def scenario() -> None:
        for spans in (_spans(1, 1, session=None, turn="first"), _spans(2, 2, session=tid(1), turn="second")):
            await store.write(spans_to_arrow(spans, dt.datetime.now(dt.UTC)))
        assert (assembler.pending_traces(), assembler.pending_conversations()) == (2, 1)
        assembler.assemble_due(force=True)

    try:
        asyncio.run(scenario())
        assert assembler.pending_traces() == 0, "a trace was left waiting for ever"
        rows = store.cursor().execute("SELECT DISTINCT unnest(trace_ids) FROM conversations").fetchall()
        assert {t for (t,) in rows} == {tid(1), tid(2)}
    finally:
        store.close()


def test_an_end_marked_conversation_is_assembled_in_the_first_poll_even_behind_a_backlog(tmp_path: Path) -> None:
    """After a burst of traces all due at once, a conversation whose last span says it ended must not wait behind
    them (it waited 260 s behind 50,000 in the adversarial review): the first poll takes it."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    backlog = [span(n, n, "invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"})
               for n in range(1, 4 * MAX_PER_POLL + 1)]
    ended = span(99_999, 99_999, "invoke_agent", attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "chat-ended",
        "tracejudge.conversation.end": True, "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "the last question"}]}])})

    async def scenario() -> None:
        for spans in (backlog, [ended]):
            decoded = decode_otlp(json.dumps(request(({"service.name": "agent"}, spans))), "application/json")
            await store.write(spans_to_arrow(decoded.spans, dt.datetime.now(dt.UTC)))

    try:
        asyncio.run(scenario())
        assert assembler.assemble_due(limit=MAX_PER_POLL) == MAX_PER_POLL  # one poll's worth: the backlog stays
        assert store.cursor().execute(
            "SELECT count(*) FROM conversations WHERE conversation_id = 'chat-ended'").fetchone() == (1,)
        assert assembler.pending_traces() == 3 * MAX_PER_POLL + 1
    finally:
        store.close()


def test_an_end_marker_on_one_span_inside_a_large_commit_puts_its_conversation_first(tmp_path: Path) -> None:
    """The marker is looked for in the commit's attribute bytes at once before value by value: one span among
    hundreds in the same commit, older conversations all due, still goes first."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    turn = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hello"}]}])
    spans = [span(n, n, "invoke_agent", attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.input.messages": turn, "gen_ai.conversation.id": f"chat-{n}"})
        for n in range(1, 301)]
    spans[150]["attributes"].append({"key": "tracejudge.conversation.end", "value": {"boolValue": True}})

    async def commit() -> None:
        decoded = decode_otlp(json.dumps(request(({"service.name": "agent"}, spans))), "application/json")
        await store.write(spans_to_arrow(decoded.spans, dt.datetime.now(dt.UTC)))

    try:
        asyncio.run(commit())
        assert assembler.assemble_due(limit=1) == 1
        assert store.cursor().execute("SELECT conversation_id FROM conversations").fetchall() == [("chat-151",)]
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["string", "large_string", "sliced string", "sliced large_string", "chunked",
                                  "spans"])
def test_the_quick_look_for_a_marker_finds_every_value_that_holds_it_and_nothing_outside_a_slice(kind: str) -> None:
    import pyarrow as pa

    values = ['{"a":1}', '{"tracejudge.conversation.end":true}', '{"b":2}']
    if kind == "spans":  # the column as the receivers build it (the JSON extension type)
        spans = [span(n, n, "invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}) for n in (1, 2)]
        spans[1]["attributes"].append({"key": "tracejudge.conversation.end", "value": {"boolValue": True}})
        rows = spans_to_arrow(decode_otlp(json.dumps(request(({"service.name": "a"}, spans))), "application/json")
                              .spans, dt.datetime.now(dt.UTC))
        column, without = rows.spans.column("attributes"), rows.spans.slice(0, 1).column("attributes")
    elif kind.startswith("sliced"):  # a slice's buffers hold its neighbours' bytes too
        whole = pa.array(values, getattr(pa, kind.split()[1])())
        column = pa.chunked_array([whole.slice(1, 1)])
        without = pa.chunked_array([whole.slice(2, 1), whole.slice(0, 1), whole.slice(3, 0)])
    elif kind == "chunked":
        column = pa.chunked_array([pa.array(values[:1]), pa.array(values[1:])])
        without = pa.chunked_array([pa.array(values[:1]), pa.array(values[2:])])
    else:
        column = pa.chunked_array([pa.array(values, getattr(pa, kind)())])
        without = pa.chunked_array([pa.array([values[0], values[2]], getattr(pa, kind)())])
    marker = conversation_assembler.END_MARKER
    assert conversation_assembler._may_hold(column, marker)
    assert not conversation_assembler._may_hold(without, marker)


def test_the_assembler_keeps_to_its_share_only_while_ingest_keeps_the_writer_busy(tmp_path: Path) -> None:
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=1)
    assembler.settings.conversations.share_under_load = 0.25
    assert assembler.pause_for_ingest(1.0, 0.9) == 3.0  # a quarter of the time: 1 s of work, 3 s of pause
    assert assembler.pause_for_ingest(1.0, 0.5) == 3.0
    assert assembler.pause_for_ingest(1.0, 0.4) == 0.0  # light ingest: a backlog is worked through at once
    assert assembler.pause_for_ingest(0.0, 0.0) == 0.0
    assert assembler.pause_for_ingest(0.5, 0.5, worked=False) == 0.0  # nothing was due: nothing taken from ingest
    # the writer looked busy (its commits slow down while the assembler writes) but no export waited 50 ms: go on
    assert assembler.pause_for_ingest(1.0, 0.9, slowed=0) == 0.0
    assert assembler.pause_for_ingest(1.0, 0.9, slowed=1) == 3.0
    assert assembler.pause_for_ingest(1.0, 0.9, slowed=None) == 3.0  # not known (no span writer's count): pauses
    assembler.writer_busy_s, assembler.slowed_requests = None, None
    assert assembler._slowed_since(0) is None  # an assembler not wired to the count never skips a pause
    assert assembler.pause_for_ingest(1.0, 0.4, slowed=5) == 0.0  # light ingest: a slowed export is not the round's
    assembler.settings.conversations.share_under_load = 1
    assert assembler.pause_for_ingest(1.0, 1.0) == 0.0
    store.close()


def test_a_pause_for_ingest_ends_once_ingest_stops_and_not_while_it_presses(tmp_path: Path) -> None:
    """A pause decided while exports came in must not leave the cores idle after they stop; while the span writer
    is committing (a checkpoint's commit runs over a second, counted as it goes), the pause goes on."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=1)
    stats = StoreStats()
    looks: list[float] = []

    def busy_s() -> float:
        looks.append(time.monotonic())
        return stats.busy_now()

    assembler.writer_busy_s = busy_s

    async def scenario() -> None:
        stop = asyncio.Event()
        stats.busy_since = time.perf_counter()  # one long commit under way: busy_s itself does not move
        pausing = asyncio.create_task(assembler.pause(3600.0, stop))
        while len(looks) < 6 and not pausing.done():  # three steps into the commit: still pausing
            await asyncio.sleep(0.05)
        assert not pausing.done()
        stats.busy_s, stats.busy_since = stats.busy_now(), None  # the commit ended and no export came since
        await asyncio.wait_for(pausing, 60)  # the next step ends the pause, not the hour
        await asyncio.wait_for(assembler.pause(3600.0, stop), 60)  # an idle writer: one step at most

    try:
        asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        store.close()


@pytest.mark.parametrize("case_bytes", [16 * 1024 * 1024, 1], ids=["one part", "a part per job"])
def test_deterministic_jobs_are_scored_in_batches_not_a_lease_per_poll(tmp_path: Path, monkeypatch,
                                                                       case_bytes: int) -> None:
    """Forty call-validity jobs, two judge slots, a 60 s poll: every one is scored long before a second poll, and
    a job whose conversation version is gone is dropped (logged) instead of holding up the batch; a batch whose
    test cases are larger than the memory it may use is read in parts, with the same outcome."""
    from tracejudge.collector.pipeline.scoring_stage import ScoringStage, StageConfig

    monkeypatch.setattr("tracejudge.collector.pipeline.scoring_stage.BATCH_CASE_BYTES", case_bytes)

    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.1)
    assembler.settings.scoring.metrics = ["mcp_call_validity"]

    async def scenario() -> tuple[list[tuple], list[tuple]]:
        await _assembled_conversations(store, assembler, 40)
        con = store.cursor()
        con.execute("DELETE FROM conversations WHERE conversation_id = 'chat-7'")
        stage = ScoringStage(store.cursor(), StageConfig(metrics=("mcp_call_validity",), concurrency=2, poll_s=60),
                             lambda *a, **k: logged.append((a, k)))
        stop = asyncio.Event()
        running = asyncio.create_task(stage.run(stop))
        # up to 20 s, a third of one poll period
        await _until(con, "SELECT status, count(*) FROM eval_jobs GROUP BY ALL ORDER BY 1", [("done", 39)],
                     seconds=20)
        stop.set()
        await running
        return (con.execute("SELECT conversation_id, metric, score, reason FROM scores ORDER BY 1").fetchall(),
                con.execute("SELECT conversation_id, last_error FROM eval_jobs WHERE status = 'failed'").fetchall())

    logged: list[tuple[tuple, dict]] = []
    scores, failed = asyncio.run(scenario())
    # no MCP call in these conversations: the check does not apply, and says so in the score row
    assert [s[:2] for s in scores] == sorted((f"chat-{i}", "mcp_call_validity") for i in range(40) if i != 7)
    assert all(s[2] is None and s[3].endswith("not applicable.") for s in scores), scores[0]
    assert failed == []
    assert [k["jobs"] for a, k in logged if "pruned before they were scored" in a[1]] == [1]
    store.close()


@pytest.mark.parametrize("stored_first", ["earlier copy", "later copy"])
def test_a_span_stored_twice_counts_once_as_its_last_copy_received(tmp_path: Path, stored_first: str) -> None:
    """An exporter that sends a span again inside another request stores it twice; the conversation is built
    from the copy received last, whichever the store holds first."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    received = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    copies = {"earlier copy": (received, "the first words"),
              "later copy": (received + dt.timedelta(seconds=30), "the words sent last")}
    order = [stored_first, *(c for c in copies if c != stored_first)]

    async def scenario() -> None:
        for copy in order:
            at, words = copies[copy]
            await store.write(spans_to_arrow(_spans(1, 1, session="chat", turn=words), at))
        await _rounds(assembler, None)
        while assembler.assemble_due(force=True):
            pass

    try:
        asyncio.run(scenario())
        [(case,)] = store.cursor().execute(
            "SELECT test_case FROM conversations WHERE conversation_id = 'chat' ORDER BY version DESC LIMIT 1"
        ).fetchall()
        assert json.loads(case)["turns"][0]["content"] == "the words sent last"
        assert store.cursor().execute("SELECT count(*) FROM span_records").fetchone() == (2,)  # both kept
    finally:
        assembler.pool.stop()  # the worker processes, as `serve` stops them
        store.close()


def test_a_trace_assembled_again_keeps_one_row_and_a_restart_queues_nothing_already_assembled(
        tmp_path: Path) -> None:
    """`assembled_traces` has no key (its index lengthened every checkpoint): a trace assembled again after a late
    span of its own still has one row, naming its conversation and its newest span, so a restart re-queues only
    what came after it."""
    path = tmp_path / "t.duckdb"

    async def main() -> None:
        store, assembler = _assembling_store(path, quiet_period_s=0.05)
        try:
            await _assembled_conversations(store, assembler, 2)
            con = store.cursor()
            [(first,)] = con.execute("SELECT assembled_at FROM assembled_traces WHERE trace_id = ?",
                                     [tid(1)]).fetchall()
            await store.write(spans_to_arrow(_spans(1, 9, session="chat-0", turn="and again"), dt.datetime.now(dt.UTC)))
            await asyncio.sleep(0.2)
            assert assembler.assemble_due() == 1
            rows = con.execute("SELECT trace_id, conversation_id, assembled_at FROM assembled_traces "
                               "ORDER BY trace_id").fetchall()
            assert [(t, c) for t, c, _ in rows] == [(tid(1), "chat-0"), (tid(2), "chat-1")]
            assert rows[0][2] > first
            assert con.execute("SELECT max(version) FROM conversations WHERE conversation_id = 'chat-0'"
                               ).fetchall() == [(2,)]
        finally:
            store.close()
        store, assembler = _assembling_store(path, quiet_period_s=0.05)
        try:
            assembler.recover()
            assert assembler.assemble_due(True) == 0
        finally:
            store.close()

    asyncio.run(main())


def test_a_schema_26_file_keeps_its_assembled_traces_without_their_index(tmp_path: Path) -> None:
    """Schema 27 drops `assembled_traces`' primary key: an older file keeps every row, and the feedback view that
    joins it still reads."""
    import duckdb

    from tracejudge.collector.store.schema import migrate

    path = tmp_path / "v26.duckdb"
    with duckdb.connect(str(path)) as con:
        migrate(con, 26)
        con.execute("INSERT INTO assembled_traces SELECT 't' || i, 'c' || (i // 8), now(), now() FROM range(80) r(i)")
    store = SpanStore(path)
    store.open()
    try:
        con = store.cursor()
        assert con.execute("SELECT count(*), count(DISTINCT trace_id), count(DISTINCT conversation_id), "
                           "count(first_received_at) FROM assembled_traces").fetchone() == (80, 80, 10, 80)
        assert con.execute("SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'assembled_traces' "
                           "AND constraint_type = 'PRIMARY KEY'").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM feedback").fetchone() == (0,)
    finally:
        store.close()


def test_a_poll_written_in_several_transactions_counts_a_new_cohort_once(tmp_path: Path) -> None:
    """While exports come in, a poll's conversations are written `WRITE_AT_ONCE` to a transaction: a new_cohort
    rule's first N are still exactly the first N of the poll across them, and each conversation gets one version."""
    from tracejudge.collector.config import SamplingRule
    from tracejudge.collector.pipeline.assembly.conversation_assembler import WRITE_AT_ONCE

    count, first = 2 * WRITE_AT_ONCE + 44, WRITE_AT_ONCE + 30  # three transactions; the first N end in the second
    store = SpanStore(tmp_path / "t.duckdb")
    store.open()
    config = Settings()
    config.conversations.quiet_period_s = 0.0
    config.sampling.rate = 0.0
    config.sampling.rules = [SamplingRule(when="new_cohort", first=first, rate=1.0)]
    assembler = ConversationAssembler(store.cursor(), config, Logger(stream=io.StringIO()),
                                      lambda metric: "pending", {m: "x" for m in config.scoring.metrics},
                                      writer_busy_s=store.stats.busy_now,  # the span writer's, as serve wires it
                                      slowed_requests=lambda: store.stats.requests_slowed)
    store.listeners.append(assembler.observe)
    transactions: list[int] = []
    write_chunk = assembler._write_chunk
    assembler._write_chunk = lambda built, *rest: transactions.append(len(built)) or write_chunk(built, *rest)

    async def scenario() -> None:
        spans = [span(n + 1, n + 1, "invoke_agent", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": f"chat-{n}",
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}])})
            for n in range(count)]
        body = request(({"service.name": "agent", "service.version": "2.0"}, spans))
        await store.write(spans_to_arrow(decode_otlp(json.dumps(body), "application/json").spans,
                                         dt.datetime.now(dt.UTC)))

    try:
        asyncio.run(scenario())
        assert assembler.assemble_due() == count
        assert transactions == [WRITE_AT_ONCE, WRITE_AT_ONCE, count - 2 * WRITE_AT_ONCE]  # the spans' commit: ingest
        con = store.cursor()
        metric = next(m for m in config.scoring.metrics if m != "mcp_call_validity")
        assert con.execute("SELECT count(*), count(DISTINCT conversation_id), max(version) FROM conversations"
                           ).fetchone() == (count, count, 1)
        assert con.execute(f"SELECT count(*) FROM conversations WHERE (inclusion::JSON->>'{metric}')::DOUBLE = 1"
                           ).fetchone() == (first,)
        assert con.execute("SELECT value, conversations FROM cohort_counts WHERE key = 'service.version'"
                           ).fetchall() == [("2.0", count)]
        judged = [m for m in config.scoring.metrics if m != "mcp_call_validity"]  # call validity: always, at 1.0
        assert judged and con.execute("SELECT count(*) FROM eval_jobs WHERE metric <> 'mcp_call_validity'"
                                      ).fetchone() == (first * len(judged),)
    finally:
        store.close()


def test_a_batch_that_cannot_be_written_is_logged_and_its_jobs_scored_on_a_later_round(tmp_path: Path) -> None:
    """The scores table is away while the first batch commits: the batch's jobs are released with the reason,
    not left leased for `lease_s`, and once the table is back every job is scored exactly once."""
    from tracejudge.collector.pipeline.scoring_stage import ScoringStage, StageConfig

    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.1)
    assembler.settings.scoring.metrics = ["mcp_call_validity"]
    logged: list[tuple[str, str, dict]] = []

    async def scenario() -> tuple[list[tuple], list[tuple]]:
        await _assembled_conversations(store, assembler, 5)
        con = store.cursor()
        con.execute("ALTER TABLE scores RENAME TO scores_away")
        stage = ScoringStage(store.cursor(), StageConfig(metrics=("mcp_call_validity",), poll_s=0.1,
                                                         retry_backoff_s=0.5),
                             lambda level, event, **fields: logged.append((level, event, fields)))
        stop = asyncio.Event()
        running = asyncio.create_task(stage.run(stop))
        released = await _until(con, "SELECT count(*) FROM eval_jobs WHERE status = 'pending' AND last_error LIKE "
                                     "'%scores%'", [(5,)])
        assert released == [(5,)], con.execute("SELECT status, last_error FROM eval_jobs").fetchall()
        con.execute("ALTER TABLE scores_away RENAME TO scores")
        await _until(con, "SELECT count(*) FROM eval_jobs WHERE status = 'done'", [(5,)])
        stop.set()
        await running
        return (con.execute("SELECT conversation_id FROM scores ORDER BY 1").fetchall(),
                con.execute("SELECT DISTINCT status, attempts FROM eval_jobs").fetchall())

    scores, jobs = asyncio.run(scenario())
    assert scores == [(f"chat-{i}",) for i in range(5)]
    assert jobs == [("done", 2)]
    failures = [fields for level, event, fields in logged if event.startswith("scoring batch failed")]
    assert failures and failures[0]["jobs"] == 5 and "scores" in failures[0]["reason"]
    store.close()


def test_score_pending_waits_for_the_deterministic_batch_it_started(tmp_path: Path) -> None:
    """`tracejudge score --pending` counts what it scored and returns only when nothing it leased still runs."""
    from tracejudge.collector.pipeline.scoring_stage import ScoringStage, StageConfig

    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.1)
    assembler.settings.scoring.metrics = ["mcp_call_validity"]

    async def scenario() -> tuple[int, list[tuple]]:
        await _assembled_conversations(store, assembler, 30)
        stage = ScoringStage(store.cursor(), StageConfig(metrics=("mcp_call_validity",)), lambda *a, **k: None)
        scored = await stage.score_pending()
        return scored, store.cursor().execute("SELECT status, count(*) FROM eval_jobs GROUP BY ALL").fetchall()

    assert asyncio.run(scenario()) == (30, [("done", 30)])
    store.close()


def test_expired_leases_go_back_except_the_jobs_this_process_still_measures(tmp_path: Path) -> None:
    """A job whose worker died is retried (or failed past max_attempts); one this process is measuring keeps its
    lease however long it takes."""
    import duckdb

    from tracejudge.collector.pipeline.scoring_stage import ScoringStage, StageConfig
    from tracejudge.collector.store.schema import migrate

    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    migrate(con)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    con.execute("INSERT INTO eval_jobs (job_id, conversation_id, conversation_version, metric, metric_config, status, "
                "attempts, lease_until, created_at, updated_at) VALUES (1, 'a', 1, 'mcp_call_validity', 'x', "
                "'running', 1, ?, ?, ?), (2, 'b', 1, 'mcp_call_validity', 'x', 'running', 5, ?, ?, ?), "
                "(3, 'c', 1, 'mcp_call_validity', 'x', 'running', 1, ?, ?, ?)", [past] * 9)
    stage = ScoringStage(con, StageConfig(metrics=("mcp_call_validity",), max_attempts=5), lambda *a, **k: None)
    stage._expire_leases(dt.datetime.now(dt.UTC), [3])
    assert con.execute("SELECT job_id, status FROM eval_jobs ORDER BY 1").fetchall() == [
        (1, "pending"), (2, "failed"), (3, "running")]
    con.close()


@pytest.mark.parametrize("trace_cache", [Settings().conversations.trace_cache, 0], ids=["default", "off"])
def test_a_conversation_that_goes_on_maps_only_its_new_trace(tmp_path: Path, trace_cache: int) -> None:
    """A chat whose turns come minutes apart gets a trace per turn, each after the last was assembled: from its
    third version on, each maps its new trace and takes the earlier ones' turns as they were mapped (`[conversations]
    trace_cache`), and is the conversation all its spans make; with the cache off every trace is read again."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0, trace_cache=trace_cache)

    async def scenario() -> None:
        for n in range(1, 5):
            await store.write(spans_to_arrow(_spans(n, n, session="chat-1", turn=f"question {n}"),
                                             dt.datetime.now(dt.UTC)))
            assert assembler.assemble_due() == 1

    try:
        asyncio.run(scenario())
        rows = store.cursor().execute("SELECT version, turns, content_hash FROM conversations ORDER BY version")
        versions = rows.fetchall()
        [whole] = build_conversations(_stored_spans(store))
        assert [v[:2] for v in versions] == [(1, 1), (2, 2), (3, 3), (4, 4)] and versions[-1][2] == whole.content_hash
        # version 2 reads trace 1 (its conversation had not gone on before); versions 3 and 4 read their new trace only
        assert assembler.cache.hits == (2 + 3 if trace_cache else 0)
        assert assembler.cache.size <= trace_cache
    finally:
        store.close()


def test_a_kept_trace_that_moves_to_another_conversation_leaves_the_one_it_was_kept_for(tmp_path: Path) -> None:
    """Trace 1 is kept mapped for chat-a, which went on; then a span gives it a stronger key (chat-b). While it
    waits there, chat-a's next version must not take trace 1's turns from the cache."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)

    async def write(trace: int, span_id: int, session: str, key: str) -> None:
        await store.write(spans_to_arrow(_spans(trace, span_id, session=session, turn=f"question {span_id}", key=key),
                                         dt.datetime.now(dt.UTC)))

    async def scenario() -> None:
        await write(1, 1, "chat-a", "session.id")
        assert assembler.assemble_due() == 1
        await write(2, 2, "chat-a", "session.id")
        assert assembler.assemble_due() == 1 and len(assembler.cache) == 2
        await write(3, 3, "chat-a", "session.id")
        await write(1, 4, "chat-b", "gen_ai.conversation.id")
        assert assembler.assemble_due(limit=1) == 1  # chat-a (its span came first); trace 1 still waits
        assert assembler.assemble_due() == 1

    try:
        asyncio.run(scenario())
        latest = dict(store.cursor().execute(
            "SELECT conversation_id, arg_max(trace_ids, version) FROM conversations GROUP BY ALL").fetchall())
        assert latest == {"chat-a": [tid(2), tid(3)], "chat-b": [tid(1)]}
    finally:
        store.close()


def test_a_full_waiting_index_stores_new_traces_and_takes_them_in_when_it_has_room(tmp_path: Path) -> None:
    """Memory for waiting traces is bounded whatever the traffic (a client can make any number of trace ids): past
    `[conversations] max_waiting_traces` a new trace is stored but not indexed, and taken in, oldest first, once
    the index has room; every conversation is still assembled, whole."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    assembler.settings.conversations.max_waiting_traces = 3
    sessions = [None, None, None, "chat-1", None, "chat-1"]

    async def scenario() -> None:
        for n, session in enumerate(sessions, start=1):
            await store.write(spans_to_arrow(_spans(n, n, session=session, turn=f"question {n}"),
                                             dt.datetime.now(dt.UTC)))
            assert assembler.pending_traces() <= 3
        assert (assembler.pending_traces(), assembler.left_out) == (3, 3)
        while assembler.take_in() or assembler.assemble_due(force=True):
            assert assembler.pending_traces() <= 3

    try:
        asyncio.run(scenario())
        latest = dict(store.cursor().execute(
            "SELECT conversation_id, arg_max(trace_ids, version) FROM conversations GROUP BY ALL").fetchall())
        assert latest == {tid(1): [tid(1)], tid(2): [tid(2)], tid(3): [tid(3)], tid(5): [tid(5)],
                          "chat-1": [tid(4), tid(6)]}
        assert assembler.pending_traces() == 0 and assembler.take_in() == 0
    finally:
        store.close()


def test_a_trace_left_out_of_a_full_index_is_read_from_its_first_spans_once_taken_in(tmp_path: Path) -> None:
    """A trace left out while the waiting index was full gets more spans once there is room, before `take_in`
    runs: it waits from then on, and its version still holds the turn that came while it was left out."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0, max_waiting_traces=1)
    now = dt.datetime.now(dt.UTC)

    async def write(trace: int, span: int, session: str | None, turn: str, ago_s: float) -> None:
        await _write_turn(store, trace, span, session, turn, now - dt.timedelta(seconds=ago_s))

    async def scenario() -> None:
        await write(1, 1, "chat-a", "hello", 30)
        await write(2, 2, "chat-b", "first question", 20)  # the index is full: left out
        assert assembler.left_out == 1
        assert assembler.assemble_due() == 1  # chat-a, which makes room
        await write(2, 3, "chat-b", "second question", 10)  # taken in by its new spans, not by take_in
        _drain(assembler)

    try:
        asyncio.run(scenario())
        rows = _versions(store)
        assert rows == [("chat-a", 1, 1), ("chat-b", 1, 2)], rows
    finally:
        store.close()


def test_a_commit_the_assembler_fails_on_is_assembled_though_a_poll_was_pending(tmp_path: Path,
                                                                                monkeypatch) -> None:
    """The assembler fails to take in a commit (a bug; the span writer logs it) while a poll that already read the
    conversation is pending: the commit's turn is still in the conversation's next version, as `serve` runs a
    round (`take_in`, then the pending poll written)."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    now = dt.datetime.now(dt.UTC)

    async def scenario() -> None:
        await _write_turn(store, 1, 1, "chat-a", "first", now - dt.timedelta(seconds=30))
        pending = assembler.plan()  # chat-a's spans read: the poll waits to be written
        _miss_next_commit(assembler, monkeypatch)
        await _write_turn(store, 1, 2, "chat-a", "second", now - dt.timedelta(seconds=20))
        assert assembler.left_out == 1
        assembler.take_in()
        assert pending is not None and assembler.finish(pending) == 1  # its first version
        assert assembler.pending_traces() == 1  # and the trace waits on: it has a turn that version lacks
        _drain(assembler)

    try:
        asyncio.run(scenario())
        rows = _versions(store)
        assert rows == [("chat-a", 1, 1), ("chat-a", 2, 2)], rows
    finally:
        store.close()


def test_a_late_span_of_an_earlier_trace_missed_while_a_poll_was_pending_is_assembled(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """A late span of a conversation's earlier trace, received before its newest turn but committed after a pending
    poll read them, in a commit the assembler fails on: `take_in` finds it by that trace's own newest span assembled
    (the conversation's newest hid it), and the next version holds it."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.0)
    now = dt.datetime.now(dt.UTC)

    async def write(trace: int, span: int, session: str | None, turn: str, ago_s: float) -> None:
        await _write_turn(store, trace, span, session, turn, now - dt.timedelta(seconds=ago_s))

    async def scenario() -> None:
        await write(1, 1, "chat-a", "first", 40)
        assert assembler.assemble_due() == 1
        await write(2, 2, "chat-a", "second", 10)
        pending = assembler.plan()  # reads trace 1 (an earlier trace) and trace 2
        assembler.take_in()
        _miss_next_commit(assembler, monkeypatch)
        await write(1, 3, None, "late", 20)
        assert pending is not None and assembler.finish(pending) == 1
        _drain(assembler)

    try:
        asyncio.run(scenario())
        assert _versions(store) == [("chat-a", 1, 1), ("chat-a", 2, 2), ("chat-a", 3, 3)], _versions(store)
    finally:
        store.close()


def test_mcp_calls_made_outside_any_run_are_kept_marked_and_never_scored(tmp_path: Path) -> None:
    """The session-start resource read of a real pydantic-ai session (tests/fixtures/real/pydantic_ai_session),
    arriving with no run to attach it to: stored as its own conversation with status context_only, no job
    queued for any metric."""
    decoded = decode_otlp((Path(__file__).parent / "fixtures" / "real" / "pydantic_ai_session.otlp.json")
                          .read_bytes(), "application/json")
    keyed = {s.trace_id for s in decoded.spans if s.attributes.get("gen_ai.conversation.id")}
    [trace] = {s.trace_id for s in decoded.spans if s.name == "resources/read" and s.trace_id not in keyed}

    async def go() -> None:
        store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=0.1)
        try:
            await store.write(spans_to_arrow([s for s in decoded.spans if s.trace_id == trace],
                                             dt.datetime.now(dt.UTC)))
            await asyncio.sleep(0.2)
            assert assembler.assemble_due() == 1
            con = store.cursor()
            assert con.execute("SELECT conversation_id, status, turns FROM conversations").fetchall() == [
                (trace, "context_only", 1)]
            assert con.execute("SELECT count(*) FROM eval_jobs").fetchone() == (0,)
        finally:
            store.close()

    asyncio.run(go())


def test_the_waiting_gauges_answer_while_the_assembler_holds_its_lock(tmp_path) -> None:
    """/metrics runs on the receivers' event loop: how many traces and conversations wait is read without waiting
    for the assembler (a poll or a take_in holding its lock), or exports would wait behind it."""
    async def scenario() -> None:
        store, assembler = _assembling_store(tmp_path / "g.duckdb", quiet_period_s=60)
        try:
            await _write_turn(store, 1, 1, "chat-a", "first", dt.datetime.now(dt.UTC))
            await _write_turn(store, 2, 2, "chat-a", "second", dt.datetime.now(dt.UTC))
            with assembler._lock:
                read = asyncio.to_thread(lambda: (assembler.pending_traces(), assembler.pending_conversations()))
                assert await asyncio.wait_for(read, 10) == (2, 1)
        finally:
            store.close()

    asyncio.run(scenario())


def test_assemblys_cpu_adds_up_by_stage_each_second_counted_once(tmp_path: Path) -> None:
    """tracejudge_assembly_cpu_seconds_total splits assembly's CPU by stage: built in this thread (no workers),
    the stages of a poll add up to the thread's CPU for it, the conversations built as their spans are read counted
    as build, not as read as well."""
    store, assembler = _assembling_store(tmp_path / "c.duckdb", quiet_period_s=0.0, assembly_workers=0)

    async def scenario() -> float:
        for n in range(1, 41):
            await store.write(spans_to_arrow(_spans(n, n, session=f"chat-{n}", turn=f"question {n}"),
                                             dt.datetime.now(dt.UTC)))
        started = time.thread_time()
        assert assembler.assemble_due(force=True) == 40
        return time.thread_time() - started

    try:
        spent = asyncio.run(scenario())
        stages = assembler.cpu_seconds
        assert min(stages.values()) > 0, stages
        assert abs(sum(stages[s] for s in ("plan", "read", "build", "write")) - spent) < 0.002, (stages, spent)
    finally:
        store.close()


class _NotingHolds:
    """The assembler's lock, recording how many traces each hold of it took into the waiting index."""

    def __init__(self, assembler: ConversationAssembler) -> None:
        self.assembler, self.lock, self.noted = assembler, assembler._lock, []

    def __enter__(self) -> None:
        self.lock.acquire()
        self._before = len(self.assembler._group_of)

    def __exit__(self, *exc: object) -> None:
        self.noted.append(len(self.assembler._group_of) - self._before)
        self.lock.release()


def test_take_in_notes_traces_a_chunk_per_hold_so_commits_are_noted_in_between(tmp_path: Path,
                                                                              monkeypatch) -> None:
    """After a full waiting index, take_in notes up to max_waiting_traces stored traces; the span writer notes each
    commit under the same lock, so it is taken a chunk at a time and an export's commit waits for one chunk, not
    for all of them (100,000 in one hold took 0.23 s)."""
    monkeypatch.setattr(conversation_assembler, "WAIT_FOR_AT_ONCE", 2)
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=60, max_waiting_traces=10)

    async def scenario() -> None:
        for n in range(1, 18):
            await store.write(spans_to_arrow(_spans(n, n, session=None, turn=f"question {n}"),
                                             dt.datetime.now(dt.UTC)))

    try:
        asyncio.run(scenario())
        assert (assembler.pending_traces(), assembler.left_out) == (10, 7)
        assert assembler.assemble_due(force=True) == 10
        holds = _NotingHolds(assembler)
        assembler._lock = holds
        assert assembler.take_in() == 7 and assembler.pending_traces() == 7
        assert max(holds.noted) == 2 and sum(holds.noted) == 7
    finally:
        store.close()


@pytest.mark.parametrize("quiet_period_s", [4.0, 3600.0])
def test_the_workers_start_ahead_of_the_first_conversation_due_and_not_for_one_far_off(tmp_path: Path,
                                                                                       quiet_period_s: float) -> None:
    """The assembly workers start while the first conversation still waits out its quiet period, once it is due
    within a poll and a second: their start (imports, a core for a few tenths of a second each) then does not land
    on the exports of the moment conversations begin to complete. A collector whose conversations go quiet an hour
    from now starts none yet (55 MB each)."""
    store, assembler = _assembling_store(tmp_path / "t.duckdb", quiet_period_s=quiet_period_s, assembly_workers=1)
    assembler.settings.conversations.poll_s = 0.1
    sent_before_start: list[int] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(assembler.run(stop))
        await _write_turn(store, 1, 1, "chat-1", "hello", dt.datetime.now(dt.UTC))
        for _ in range(int((quiet_period_s + 30 if quiet_period_s < 60 else 3) / 0.02)):
            if assembler.pool.started:
                sent_before_start.append(assembler.pool._spilled)  # batches sent to workers before they ran
                break
            await asyncio.sleep(0.02)
        if quiet_period_s < 60:
            await _until(store.cursor(), "SELECT count(*) FROM conversations", [(1,)], seconds=30)
        stop.set()
        await running

    try:
        asyncio.run(scenario())
        if quiet_period_s < 60:
            assert sent_before_start == [0]  # started ahead of its first batch, not by it
            assert _versions(store) == [("chat-1", 1, 1)]
        else:
            assert sent_before_start == [] and not assembler.pool.started
    finally:
        assembler.pool.stop()
        store.close()


def test_the_wal_is_folded_at_the_smaller_threshold_after_the_assemblers_writes(tmp_path: Path) -> None:
    """After a poll's writes the WAL is folded into the file once it is past `[store]
    assembling_checkpoint_threshold`: on DuckDB 2 a read of recent spans beside a large WAL costs twice the CPU.
    While nothing is assembled only DuckDB's own checkpoint, at the larger `checkpoint_threshold`, runs: the fewest
    checkpoints for ingest alone."""
    db = tmp_path / "t.duckdb"
    store = SpanStore(db, checkpoint_threshold="256MiB", assembling_checkpoint_threshold="1KiB")
    store.open()
    config = Settings()
    config.conversations.quiet_period_s = 0.0
    config.conversations.assembly_workers = 0
    assembler = ConversationAssembler(store.cursor(), config, Logger(stream=io.StringIO()),
                                      lambda metric: "pending", {m: "x" for m in config.scoring.metrics})
    store.listeners.append(assembler.observe)
    assembler.fold_wal = store.fold_wal  # as `serve` wires them
    wal = Path(str(db) + ".wal")

    def ingest(*conversations: int) -> int:
        for n in conversations:
            asyncio.run(_write_turn(store, n, n, f"chat-{n}", "hello", dt.datetime.now(dt.UTC)))
        return wal.stat().st_size

    try:
        ingested = ingest(1, 2)  # past 1 KiB, not folded: nothing assembled
        assert assembler.assemble_due() == 2
        assembled = wal.stat().st_size if wal.exists() else 0
        ingested_again = ingest(3, 4)
        assert (store.stats.assembling_checkpoints, ingested > 1024, assembled, ingested_again > 1024) == \
            (1, True, 0, True)
    finally:
        store.close()
