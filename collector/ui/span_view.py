"""The spans behind a conversation: a tree per trace with a timeline, and each turn's time, tokens and cost.

Read from the stored spans of the conversation's traces, bounded by its first and last span times (so DuckDB
skips row groups by `start_ns`), with only the few attributes the tree shows; a span's full attributes and events
are read one span at a time when a user opens it (`span_detail`). The tree is paged (`PAGE_SPANS` rows a page)
so a conversation of thousands of spans renders in the page time target (`python bench/ui.py`).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb

from tracejudge.collector.pipeline.sampling import MODEL_CALLS
from tracejudge.judges.pricing import known_price
from tracejudge.mapping.log_events import fold_log_events
from tracejudge.mapping.model_inputs import ModelInputs, model_inputs, offered_tools
from tracejudge.mapping.spans import Span, SpanEvent

PAGE_SPANS = 500
TOOLS_LISTED_ABOVE = 3  # how far above a model call its offered tools may be listed (SK: chat < loop < agent)
MAX_INDENT = 16  # the template's indent steps (base.html: td.d1 .. td.d16)
# the attributes the tree shows (model, tokens, tool), extracted in one JSON parse per span
_SHOWN = ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.input_tokens",
          "gen_ai.usage.output_tokens", "gen_ai.tool.name", "mcp.method.name", "gen_ai.agent.name")
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass
class SpanRow:
    """One span as the tree shows it: where it sits (depth) and when (offset and width, in % of its trace)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str
    status_message: str | None
    operation: str | None
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    tool: str | None
    depth: int = 0
    offset_pct: float = 0.0
    width_pct: float = 0.0
    turn: int | None = None  # the transcript turn this trace became
    call: str | None = None  # "tool get_forecast": the MCP call the mapping built from this span

    @property
    def duration_ms(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e6

    @property
    def indent(self) -> int:
        """The depth the tree indents (deeper spans line up at the last step)."""
        return self.depth if self.depth < MAX_INDENT else MAX_INDENT

    @property
    def is_model_call(self) -> bool:
        return self.operation in MODEL_CALLS


@dataclass
class TraceFigures:
    """A trace's (a turn's) wall time, the time in model calls and in MCP calls (each the union of the spans'
    intervals, so parallel calls are not counted twice), and the agent's tokens and cost."""

    trace_id: str
    turn: int | None
    spans: int
    wall_ms: float
    model_ms: float
    mcp_ms: float
    tokens: dict[str, tuple[int, int]]  # model -> (input, output)
    cost_usd: float | None  # None when a model has no known price

    @property
    def input_tokens(self) -> int:
        return sum(t[0] for t in self.tokens.values())

    @property
    def output_tokens(self) -> int:
        return sum(t[1] for t in self.tokens.values())


@dataclass
class SpanTree:
    rows: list[SpanRow]  # this page's, in tree order
    page: int
    pages: int
    total: int
    figures: list[TraceFigures]
    totals: TraceFigures | None
    page_of: dict[str, int] = field(default_factory=dict)  # span id -> the page that shows it
    offsets_ms: dict[str, float] = field(default_factory=dict)  # span id -> ms since its trace's first span
    missing_traces: list[str] = field(default_factory=list)  # pruned by retention or never stored
    trace_page: dict[str, int] = field(default_factory=dict)  # trace id -> the page its first span is on
    by_trace: dict[str, TraceFigures] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_trace = {f.trace_id: f for f in self.figures}


def span_tree(con: duckdb.DuckDBPyConnection, test_case: dict[str, Any], trace_ids: list[str],
              first_ns: int | None, last_ns: int | None, page: int = 1) -> SpanTree:
    """The conversation's spans as a paged tree, with each trace's figures; MCP calls and turns are tied to the
    spans the mapping recorded for them (the turns' `span_id` and `call_spans`)."""
    rows = _read(con, trace_ids, first_ns, last_ns)
    turn_of_trace, call_of_span, call_roots = _links(test_case)
    ordered = _tree_order(rows)
    for row in ordered:
        row.turn = turn_of_trace.get(row.trace_id)
        row.call = call_of_span.get(row.span_id)
    offsets = _place(ordered)
    pages = max(1, -(-len(ordered) // PAGE_SPANS))
    page = min(max(1, page), pages)
    page_of = {row.span_id: i // PAGE_SPANS + 1 for i, row in enumerate(ordered)}
    figures = [_figures(trace, turn_of_trace.get(trace), spans, call_roots)
               for trace, spans in _by_trace(ordered).items()]
    totals = _total(figures) if figures else None
    seen = {row.trace_id for row in rows}
    trace_page: dict[str, int] = {}
    for row in ordered:
        trace_page.setdefault(row.trace_id, page_of[row.span_id])
    return SpanTree(ordered[(page - 1) * PAGE_SPANS:page * PAGE_SPANS], page, pages, len(ordered), figures, totals,
                    page_of, offsets, [t for t in trace_ids if t not in seen], trace_page)


def span_detail(con: duckdb.DuckDBPyConnection, trace_id: str, span_id: str) -> dict[str, Any] | None:
    """One span in full: its attributes, events, links and resource, as stored (redaction already applied)."""
    found = con.execute(
        "SELECT name, kind, start_ns, end_ns, status_code, status_message, service_name, scope_name, scope_version, "
        "attributes, events, links, resource_attributes FROM spans WHERE trace_id = ? AND span_id = ? "
        "ORDER BY received_at DESC LIMIT 1",
        [trace_id, span_id]).fetchall()
    if not found:
        return None
    (name, kind, start, end, status, message, service, scope, scope_version, attributes, events, links,
     resource) = found[0]
    return {"trace_id": trace_id, "span_id": span_id, "name": name, "kind": _KINDS.get(kind, str(kind)),
            "duration_ms": max(0, (end or 0) - (start or 0)) / 1e6, "status": _STATUS.get(status, str(status)),
            "status_message": message, "service": service, "scope": f"{scope or ''} {scope_version or ''}".strip(),
            "attributes": _loads(attributes), "events": _loads(events) or [], "links": _loads(links) or [],
            "resource": _loads(resource)}


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _read(con: duckdb.DuckDBPyConnection, trace_ids: list[str], first_ns: int | None,
          last_ns: int | None) -> list[SpanRow]:
    if not trace_ids:
        return []
    bounds, params = "", [trace_ids]
    if first_ns is not None and last_ns is not None:  # spans of the conversation started within its span times
        bounds, params = " AND start_ns BETWEEN ? AND ?", [trace_ids, first_ns, last_ns]
    paths = ", ".join(f"'$.\"{key}\"'" for key in _SHOWN)
    found = con.execute(
        f"SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message, "
        f"json_extract_string(attributes, [{paths}]) FROM span_records "
        f"WHERE list_contains(?, trace_id){bounds} "
        # a span sent again is stored again: the last copy received counts, as for the assembler
        "QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received_at DESC) = 1",
        params).fetchall()
    out = []
    for trace, span, parent, name, kind, start, end, status, message, shown in found:
        operation, request_model, response_model, tokens_in, tokens_out, tool, method, _agent = shown
        out.append(SpanRow(trace, span, parent or None, name or "", _KINDS.get(kind, str(kind)), start or 0,
                           end or start or 0, _STATUS.get(status, str(status)), message, operation,
                           response_model or request_model, _int(tokens_in), _int(tokens_out), tool or method))
    return out


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _links(test_case: dict[str, Any]) -> tuple[dict[str, int], dict[str, str], dict[str, set[str]]]:
    """From the test case: the turn each trace became, the MCP call each span recorded, and per trace the spans
    of its MCP calls (the union of their intervals is the time in MCP calls, as each call's own time is)."""
    turn_of_trace: dict[str, int] = {}
    call_of_span: dict[str, str] = {}
    call_roots: dict[str, set[str]] = {}
    for index, turn in enumerate(test_case.get("turns") or []):
        metadata = turn.get("metadata") or {}
        trace = metadata.get("trace_id")
        if not trace:
            continue
        turn_of_trace.setdefault(trace, index)
        fields_ = {"tool": "mcp_tools_called", "resource": "mcp_resources_called", "prompt": "mcp_prompts_called"}
        for kind, recorded in (metadata.get("call_spans") or {}).items():
            calls = turn.get(fields_.get(kind, "")) or []
            for i, spans in enumerate(recorded):
                ids = spans.get("span_ids") or [] if isinstance(spans, dict) else []
                label = f"{kind} {_call_name(calls[i]) if i < len(calls) else ''}".strip()
                for span_id in ids:
                    call_of_span.setdefault(span_id, label)
                call_roots.setdefault(trace, set()).update(ids)  # the union of their intervals: the call's time
    return turn_of_trace, call_of_span, call_roots


def _call_name(call: Any) -> str:
    return str(call.get("name") or call.get("uri") or "") if isinstance(call, dict) else ""


def _tree_order(rows: list[SpanRow]) -> list[SpanRow]:
    """Traces by their first span, and within each the spans depth first, children by start time; a span whose
    parent is not stored starts a tree of its own. Iterative, and safe against parent cycles."""
    by_id = {(r.trace_id, r.span_id): r for r in rows}
    children: dict[tuple[str, str], list[SpanRow]] = {}
    roots: list[SpanRow] = []
    for row in rows:
        parent = (row.trace_id, row.parent_span_id) if row.parent_span_id else None
        if parent is not None and parent in by_id and parent != (row.trace_id, row.span_id):
            children.setdefault(parent, []).append(row)
        else:
            roots.append(row)
    first = {}
    for row in rows:
        first[row.trace_id] = min(first.get(row.trace_id, row.start_ns), row.start_ns)
    key = lambda r: (first[r.trace_id], r.trace_id, r.start_ns, r.span_id)  # noqa: E731
    out: list[SpanRow] = []
    seen: set[tuple[str, str]] = set()
    stack = [(r, 0) for r in sorted(roots, key=key, reverse=True)]
    while stack:
        row, depth = stack.pop()
        ident = (row.trace_id, row.span_id)
        if ident in seen:
            continue
        seen.add(ident)
        row.depth = depth
        out.append(row)
        stack += [(c, depth + 1) for c in sorted(children.get(ident, []), key=key, reverse=True)]
    out += [r for r in sorted(rows, key=key) if (r.trace_id, r.span_id) not in seen]  # a cycle with no root
    return out


def _by_trace(rows: list[SpanRow]) -> dict[str, list[SpanRow]]:
    grouped: dict[str, list[SpanRow]] = {}
    for row in rows:
        grouped.setdefault(row.trace_id, []).append(row)
    return grouped


def _place(rows: list[SpanRow]) -> dict[str, float]:
    """Each span's offset and width in % of its trace's time, for the timeline bars; ms offsets by span id."""
    offsets: dict[str, float] = {}
    for spans in _by_trace(rows).values():
        start = min(r.start_ns for r in spans)
        end = max(r.end_ns for r in spans)
        total = max(end - start, 1)
        for r in spans:
            r.offset_pct = 100.0 * (r.start_ns - start) / total
            r.width_pct = max(0.3, 100.0 * (r.end_ns - r.start_ns) / total)
            offsets[r.span_id] = (r.start_ns - start) / 1e6
    return offsets


def _union_ms(intervals: list[tuple[int, int]]) -> float:
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total / 1e6


def _figures(trace: str, turn: int | None, spans: list[SpanRow], call_roots: dict[str, set[str]]) -> TraceFigures:
    calls = call_roots.get(trace, set())
    model_calls = [r for r in spans if r.is_model_call]
    tokens: dict[str, tuple[int, int]] = {}
    # the model calls' usage; where none reports it, the agent spans' (frameworks that total a run there)
    reporting = [r for r in model_calls if r.input_tokens is not None or r.output_tokens is not None] or \
                [r for r in spans if r.input_tokens is not None or r.output_tokens is not None]
    for r in reporting:
        seen_in, seen_out = tokens.get(r.model or "unknown", (0, 0))
        tokens[r.model or "unknown"] = (seen_in + (r.input_tokens or 0), seen_out + (r.output_tokens or 0))
    return TraceFigures(trace, turn, len(spans),
                        (max(r.end_ns for r in spans) - min(r.start_ns for r in spans)) / 1e6,
                        _union_ms([(r.start_ns, r.end_ns) for r in model_calls]),
                        _union_ms([(r.start_ns, r.end_ns) for r in spans if r.span_id in calls]),
                        tokens, _cost(tokens))


def _cost(tokens: dict[str, tuple[int, int]]) -> float | None:
    if not tokens:
        return None
    prices = {model: known_price(model) for model in tokens}
    if any(price is None for price in prices.values()):
        return None
    return sum(price.cost(*tokens[model]) for model, price in prices.items() if price is not None)


def _total(figures: list[TraceFigures]) -> TraceFigures:
    tokens: dict[str, tuple[int, int]] = {}
    for f in figures:
        for model, (tokens_in, tokens_out) in f.tokens.items():
            seen_in, seen_out = tokens.get(model, (0, 0))
            tokens[model] = (seen_in + tokens_in, seen_out + tokens_out)
    return TraceFigures("", None, sum(f.spans for f in figures), sum(f.wall_ms for f in figures),
                        sum(f.model_ms for f in figures), sum(f.mcp_ms for f in figures), tokens, _cost(tokens))


MODEL_CALLS_SHOWN = 60  # model calls whose inputs a page shows (those of the spans on it)


@dataclass
class ModelGiven:
    """A model call's system prompt and offered tools, and how they differ from the call before it."""

    inputs: ModelInputs
    offset_ms: float
    first: bool  # the first shown: everything in full
    system_diff: list[str]  # unified diff lines against the previous call's system prompt; [] when the same
    tools_added: list[str]
    tools_removed: list[str]
    tools_changed: list[str]  # same name, other description or schema


def _ancestors(row: SpanRow, rows: dict[str, SpanRow], levels: int) -> list[SpanRow]:
    """The spans above a row, nearest first, at most `levels` of them (a parent cycle ends the walk)."""
    out: list[SpanRow] = []
    seen, parent = {row.span_id}, row.parent_span_id
    while len(out) < levels and parent is not None and parent in rows and parent not in seen:
        above = rows[parent]
        out.append(above)
        seen.add(parent)
        parent = above.parent_span_id
    return out


def _inputs_around(row: SpanRow, spans: dict[tuple[str, str], Span], above: list[SpanRow]) -> ModelInputs | None:
    """What a model call was given, from its own span or, where that records nothing, from the spans above it: the
    step around it for its prompt (Mastra's model_step), the agent span for its tools (Semantic Kernel's
    invoke_agent)."""
    spans_above = [found for a in above if (found := spans.get((a.trace_id, a.span_id))) is not None]
    own, parent = spans.get((row.trace_id, row.span_id)), spans.get((row.trace_id, row.parent_span_id or ""))
    inputs = model_inputs(own) if own is not None else None
    around = model_inputs(parent) if parent is not None and (inputs is None or inputs.system is None
                                                             and not inputs.tools) else None
    if around is not None:
        inputs = replace(around, span_id=row.span_id, start_ns=row.start_ns,
                         model=(inputs.model if inputs else None) or row.model or around.model)
    if inputs is not None and not inputs.tools:
        inputs = replace(inputs, tools=next((tools for s in spans_above if (tools := offered_tools(s))), ()))
    return inputs


def model_calls(con: duckdb.DuckDBPyConnection, tree: SpanTree) -> tuple[list[ModelGiven], int]:
    """What each model call among the page's spans was given, each compared with the one before; and how many
    model calls the page has (only the first MODEL_CALLS_SHOWN are read)."""
    calls = [r for r in tree.rows if r.is_model_call]
    chosen = calls[:MODEL_CALLS_SHOWN]
    if not chosen:
        return [], 0
    # with the spans above them (`_inputs_around`) and their children (the messages a framework logs as log
    # records, Semantic Kernel's, hang below)
    rows = {r.span_id: r for r in tree.rows}
    ids = {r.span_id for r in chosen}
    above = {a.span_id: a for r in chosen for a in _ancestors(r, rows, TOOLS_LISTED_ABOVE)}
    read = chosen + list(above.values()) + [r for r in tree.rows if r.parent_span_id in ids]
    found = con.execute(  # bounded by the spans' start times, so DuckDB skips the other row groups
        "SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, attributes, events, "
        "(SELECT name FROM span_scopes WHERE span_scopes.scope_id = span_records.scope_id) "
        "FROM span_records WHERE list_contains(?, span_id) AND list_contains(?, trace_id) "
        "AND start_ns BETWEEN ? AND ? "
        "QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received_at DESC) = 1",
        [[r.span_id for r in read], list({r.trace_id for r in read}), min(r.start_ns for r in read),
         max(r.start_ns for r in read)]).fetchall()
    spans = {span.key: span for span in fold_log_events([
        Span(trace, span, parent, name or "", kind or 0, start or 0, end or 0, attributes=_loads(attributes) or {},
             events=[SpanEvent(e.get("name") or "", int(e.get("time_ns") or 0), e.get("attributes") or {})
                     for e in _loads(events) or []], scope_name=scope or "")
        for trace, span, parent, name, kind, start, end, attributes, events, scope in found])}
    out: list[ModelGiven] = []
    previous: ModelInputs | None = None
    for row in chosen:
        inputs = _inputs_around(row, spans, _ancestors(row, rows, TOOLS_LISTED_ABOVE))
        if inputs is None:
            continue
        offset = tree.offsets_ms.get(row.span_id, 0.0)
        if previous is None:
            out.append(ModelGiven(inputs, offset, True, [], [], [], []))
        else:
            before = {t.name: t for t in previous.tools}
            now = {t.name: t for t in inputs.tools}
            diff = list(difflib.unified_diff((previous.system or "").splitlines(), (inputs.system or "").splitlines(),
                                             "the call before", "this call", lineterm="", n=1))
            out.append(ModelGiven(inputs, offset, False, diff, sorted(now.keys() - before.keys()),
                                  sorted(before.keys() - now.keys()),
                                  sorted(n for n in now.keys() & before.keys() if now[n] != before[n])))
        previous = inputs
    return out, len(calls)
