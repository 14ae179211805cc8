"""Build conversations from their traces' stored span rows: map, compose, and run the deterministic checks.

Everything here is CPU work on data in memory (no database), so it runs in the assembly worker processes
(`assembly_pool`) as well as in the server: what comes back is plain data, cheap to send between processes, with
all the collector writes in one append: the test case's JSON and content hash, the sampling filters' attribute
values, the agent's token usage, what the deterministic checks found and scored, and the UI summaries' rows.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from tracejudge.call_validity import MCPCallValidityMetric
from tracejudge.collector.pipeline.assembly.mapped_traces import ENTRY_OVERHEAD, TEXT_FACTOR, KeptTrace
from tracejudge.collector.pipeline.assembly.span_columns import SpanColumns
from tracejudge.collector.pipeline.sampling import attribute_values, findings, model_usage
from tracejudge.errors import InvalidTestCaseError, NoTaskError
from tracejudge.json_encoding import json_bytes
from tracejudge.mapping import compose_conversation, map_traces
from tracejudge.mapping.conversation import CONTENT_MISSING
from tracejudge.mapping.conversation_key import TRACE_KEY
from tracejudge.mapping.stored_spans import STORED_COLUMNS, Resources, Scopes, latest_copies, stored_spans
from tracejudge.metric import BaseMetric
from tracejudge.test_case import ConversationalTestCase

# The span columns assembly reads, in the order the mapping's `stored_spans` takes them (from span_records: a batch's
# resources and scopes are read and parsed once each, not joined onto every span and parsed again per span);
# `received_us` is received_at in integer µs (a datetime per span cost as much as the rest of the columns, and a
# cast here loaded pyarrow.compute, 11 MB, into every worker).
SPAN_SELECT = ", ".join("epoch_us(received_at) AS received_us" if c == "received_us" else c for c in STORED_COLUMNS)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CHECKED_METRICS = {"mcp_call_validity": MCPCallValidityMetric}  # the checks that need no judge, run at assembly


@dataclass(frozen=True)
class BuildConfig:
    """What building needs of the collector's settings (small: sent with each batch)."""

    mcp_tools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    attribute_keys: frozenset[str] = frozenset()
    with_findings: bool = False  # sampling depends on what the checks find
    checks: tuple[str, ...] = ()  # deterministic metrics to measure (`CHECKED_METRICS`)
    threshold: float | None = 0.5
    strict_mode: bool = False


@dataclass(frozen=True)
class TracePart:
    """What the assembler keeps of a mapped trace: where it belongs, its MCP sessions, and its received span
    times (for `assembled_traces`)."""

    trace_id: str
    mapped: bool  # whether the trace had anything to map yet
    conversation_id: str | None
    key: str | None
    sessions: frozenset[str]
    context_only: bool
    first: datetime
    newest: datetime

    @classmethod
    def of(cls, kept: KeptTrace) -> TracePart:
        m = kept.mapped
        return cls(kept.trace_id, m is not None, m.conversation_id if m else None, m.key if m else None,
                   m.sessions if m else frozenset(), bool(m and m.context_only), kept.first, kept.newest)

    @property
    def context_trace(self) -> bool:
        """MCP calls outside any run, with no key of its own: context that joins the conversation of its session."""
        return self.mapped and self.context_only and self.key == TRACE_KEY


@dataclass(frozen=True)
class Check:
    """A deterministic metric's outcome on one conversation, as its score row takes it."""

    score: float | None
    success: bool | None
    threshold: float | None
    strict_mode: bool
    reason: str | None
    breakdown: str  # JSON
    error: str | None
    latency_ms: float = field(compare=False)  # how long it took, not what it found


class CheckedScore(NamedTuple):
    """A deterministic metric's score, written with its conversation's version (for the scoring stage's
    observers)."""

    conversation_id: str
    version: int
    metric: str
    check: Check
    service_name: str | None
    agent_name: str | None
    last_span_ns: int
    probability: float | None
    attributes: str  # the conversation's attribute values (JSON)


@dataclass(frozen=True)
class Built:
    """One conversation as the collector writes it."""

    conversation_id: str
    key: str
    context_only: bool
    service_name: str | None
    agent_name: str | None
    turns: int
    mcp_calls: int
    mcp_errors: int
    trace_ids: tuple[str, ...]
    first_span_ns: int
    last_span_ns: int
    content_hash: str
    test_case_json: str
    attributes: dict[str, set[str]]  # the sampling filters' and cohorts' keys -> the values its spans hold
    usage: dict[str, tuple[int, int]]  # the agent's own model -> input and output tokens
    findings: frozenset[str]  # what the checks found, as the sampling rules name it (when sampling needs it)
    checks: dict[str, Check | None]  # deterministic metric -> its outcome (None: its measure raised)
    # (turn, index, kind, server, name, is_error, duration_ms)
    calls: tuple[tuple[int, int, str, str | None, str, bool, float | None], ...]


@dataclass
class BatchResult:
    """A batch built: conversation -> Built (None: no turn yet) or why it failed; each mapped trace's part."""

    built: dict[str, Built | None] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    parts: dict[str, list[TracePart]] = field(default_factory=dict)  # conversation -> the traces it was built from
    cpu_s: float = 0.0  # CPU seconds the batch took to read and build, in the process that built it
    here: bool = False  # built in the server, at submit (no worker to send it to): `cpu_s` is the caller's thread's


ROWS_AT_ONCE = 2048  # span rows made Python objects together while a batch is built


def rows_by_conversation(table: SpanColumns, conversations: dict[str, list[str]]
                         ) -> Iterator[tuple[str, dict[str, list[tuple[Any, ...]]]]]:
    """Each conversation's span rows by trace, handed on as soon as its last row is read: the batch is made Python
    objects `ROWS_AT_ONCE` rows at a time, not whole (that held 17 MB more in each worker, 16,000 spans), tuples in
    `STORED_COLUMNS` order. A batch
    comes in the order its spans were stored, so a conversation whose spans arrived close together is handed on
    early; rows in any order give the same conversations, held longer (reading them sorted by conversation cost the
    server more CPU than the memory was worth, `python bench/pipeline_pace.py`)."""
    owners: dict[str, list[str]] = {}
    for conversation_id, traces in conversations.items():
        for trace in dict.fromkeys(traces):  # a trace listed twice is still read once
            owners.setdefault(trace, []).append(conversation_id)
    left = dict.fromkeys(conversations, 0)  # rows still to come
    for trace, count in Counter(table.values("trace_id")).items():
        for conversation_id in owners.get(trace, ()):
            left[conversation_id] += count
    rows_of: dict[str, dict[str, list[tuple[Any, ...]]]] = {}
    for conversation_id in [c for c, count in left.items() if count == 0]:
        yield conversation_id, {}
    for start in range(0, table.num_rows, ROWS_AT_ONCE):
        stop = start + ROWS_AT_ONCE
        for row in zip(*(table.values(name, start, stop) for name in STORED_COLUMNS), strict=True):
            for conversation_id in owners.get(row[0], ()):
                rows_of.setdefault(conversation_id, {}).setdefault(row[0], []).append(row)
                left[conversation_id] -= 1
                if left[conversation_id] == 0:
                    yield conversation_id, rows_of.pop(conversation_id)


def map_trace(rows: list[tuple[Any, ...]], scopes: Scopes, resources: Resources,
              attribute_keys: frozenset[str]) -> KeptTrace:
    """One trace mapped from its stored rows (`rows_by_conversation`), with what the sampling filters and
    `assembled_traces` need."""
    rows = latest_copies(rows)
    spans = stored_spans(rows, scopes, resources)
    mapped = map_traces(spans)
    received = [r[14] for r in rows]
    return KeptTrace(rows[0][0], mapped[0] if mapped else None, attribute_values(attribute_keys, spans),
                     len(rows), _EPOCH + timedelta(microseconds=min(received)),
                     _EPOCH + timedelta(microseconds=max(received)),
                     ENTRY_OVERHEAD + TEXT_FACTOR * sum(len(r[11]) + len(r[12]) for r in rows),
                     model_usage(spans))


def build(conversation_id: str, parts: list[KeptTrace], config: BuildConfig) -> Built | None:
    """The conversation composed from its traces' mapped parts, with everything written beside it (None when it
    has no turn). Traces with no key of their own are here because they were attached to it."""
    mine = [p for p in parts if p.mapped is not None and (p.mapped.conversation_id == conversation_id
                                                           or p.mapped.key == TRACE_KEY)]
    conversation = compose_conversation([p.mapped for p in mine if p.mapped is not None],
                                        mcp_tools=config.mcp_tools, copy_values=False)
    if conversation is None:
        return None
    values: dict[str, set[str]] = {}
    usage: dict[str, tuple[int, int]] = {}
    for part in mine:
        for key, found in part.attributes.items():
            values.setdefault(key, set()).update(found)
        for model, (tokens_in, tokens_out) in part.usage.items():
            seen_in, seen_out = usage.get(model, (0, 0))
            usage[model] = (seen_in + tokens_in, seen_out + tokens_out)
    case = conversation.test_case
    calls = _calls(case)
    return Built(
        conversation_id=conversation.conversation_id, key=conversation.key, context_only=conversation.context_only,
        service_name=conversation.service_name, agent_name=conversation.agent_name, turns=len(case.turns),
        mcp_calls=len(calls), mcp_errors=sum(1 for c in calls if c[5]), trace_ids=conversation.trace_ids,
        first_span_ns=conversation.first_span_ns, last_span_ns=conversation.last_span_ns,
        content_hash=conversation.content_hash, test_case_json=conversation.stored_json(), attributes=values,
        usage=usage, findings=frozenset(findings(case)) if config.with_findings else frozenset(),
        checks={metric: _check(metric, case, config) for metric in config.checks if metric in CHECKED_METRICS},
        calls=calls)


def build_batch(table: SpanColumns, conversations: dict[str, list[str]], scopes: Scopes, resources: Resources,
                config: BuildConfig) -> BatchResult:
    """Map the traces of these conversations from their span rows and build each conversation; one that fails is
    reported, not raised, so it does not hold up the others."""
    result = BatchResult()
    for conversation_id, by_trace in rows_by_conversation(table, conversations):
        try:
            parts = [map_trace(by_trace[t], scopes, resources, config.attribute_keys)
                     for t in conversations[conversation_id] if t in by_trace]
            result.built[conversation_id] = build(conversation_id, parts, config)
        except Exception as exc:  # noqa: BLE001 - the assembler logs it and retries the conversation later
            result.failed[conversation_id] = f"{type(exc).__name__}: {exc}"
            continue
        result.parts[conversation_id] = [TracePart.of(p) for p in parts]
    return result


def _calls(case: ConversationalTestCase) -> tuple[tuple[int, int, str, str | None, str, bool, float | None], ...]:
    """Every MCP call as the UI's call summary lists it: its tool's server (the first by name that lists it), its
    name (a resource's URI), whether it returned an error, and how long its spans say it took."""
    servers: dict[str, str] = {}
    for server in case.mcp_servers or []:
        for tool in server.available_tools or []:
            if tool.name not in servers or server.server_name < servers[tool.name]:
                servers[tool.name] = server.server_name
    out: list[tuple[int, int, str, str | None, str, bool, float | None]] = []
    for index, turn in enumerate(case.turns):
        tools, resources, prompts = turn.mcp_tools_called, turn.mcp_resources_called, turn.mcp_prompts_called
        if not (tools or resources or prompts):
            continue
        spans = (turn.metadata or {}).get("call_spans") or {}
        if tools:
            took = _durations(spans, "tool", len(tools))
            out.extend((index, i, "tool", servers.get(c.name), c.name,
                        bool(c.result is not None and c.result.is_error), took[i]) for i, c in enumerate(tools))
        if resources:
            took = _durations(spans, "resource", len(resources))
            out.extend((index, i, "resource", None, c.uri, False, took[i]) for i, c in enumerate(resources))
        if prompts:
            took = _durations(spans, "prompt", len(prompts))
            out.extend((index, i, "prompt", None, c.name, False, took[i]) for i, c in enumerate(prompts))
    return tuple(out)


def _durations(spans: dict[str, Any], kind: str, count: int) -> list[float | None]:
    """How long each of a turn's `count` calls of a kind took, by their spans (`call_spans`; None where not
    recorded)."""
    recorded = spans.get(kind)
    took = [r.get("duration_ms") if isinstance(r, dict) else None for r in recorded[:count]] \
        if isinstance(recorded, list | tuple) else []
    return took + [None] * (count - len(took))


async def measure_recorded(metric: BaseMetric, metric_id: str, case: ConversationalTestCase) -> None:
    """Measure the case, unless its spans recorded none of what the metric reads (no messages for a judged metric,
    no arguments for call validity): then it is not applicable, with what to turn on to record it."""
    gaps = (case.metadata or {}).get(CONTENT_MISSING)
    needed = "arguments" if metric_id in CHECKED_METRICS else "messages"
    if isinstance(gaps, dict) and needed in (gaps.get("missing") or []):
        raise NoTaskError(f"the conversation's spans recorded no {needed}, so there is nothing to score; to "
                          f"record them: {gaps.get('how_to_record')}")
    await metric.a_measure(case)


def not_applicable(metric: BaseMetric, reason: Exception) -> None:
    """Nothing to judge is neither a pass nor a fail: no score, no success, the reason kept."""
    metric.error = f"not applicable: {reason}"
    metric.score = metric.success = None


class _Waited(Exception):
    """A deterministic metric's measure waited on something (none does): it is measured as a job instead."""


def _run_unwaiting(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never waits to its end without an event loop: a loop's task and callbacks were about
    a third of each conversation's check."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise _Waited


def _check(metric_id: str, case: ConversationalTestCase, config: BuildConfig) -> Check | None:
    """Measure one deterministic metric, as the scoring stage would; None when its measure raised or waited (the
    scoring stage then measures it again as a job, with its retries and logs)."""
    metric = CHECKED_METRICS[metric_id](threshold=config.threshold, strict_mode=config.strict_mode)
    started = time.perf_counter()
    try:
        _run_unwaiting(measure_recorded(metric, metric_id, case))
    except (NoTaskError, InvalidTestCaseError) as exc:
        not_applicable(metric, exc)
    except Exception:  # noqa: BLE001 - measured again by the scoring stage, which logs and retries it
        return None
    return Check(metric.score, metric.success, metric.threshold, metric.strict_mode, metric.reason,
                 json_bytes(metric.score_breakdown or {}).decode(), metric.error,
                 (time.perf_counter() - started) * 1000)


