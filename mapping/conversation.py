"""Group normalized spans into conversations and rebuild each as a ConversationalTestCase.

One trace belongs to one conversation (semconv.md section 7 rule 2 picks the key). Within a trace each
outermost agent-run span is one turn: the user's message, the agent's reply, and every MCP tool,
resource and prompt call under it with arguments and results. Calls are assembled from every source
that saw them (tool spans, MCP client and server spans, tool-call parts of LLM messages) and paired by
call id, so one call is one record however many spans describe it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from tracejudge.mapping.content_capture import missing_content, switch_for
from tracejudge.mapping.conversation_key import TRACE_KEY, trace_conversation_key
from tracejudge.mapping.dialects import (
    DIALECTS,
    AgentRun,
    Dialect,
    LLMCall,
    MCPOperation,
    ToolDefinition,
    ToolExecution,
)
from tracejudge.mapping.envelopes import unwrap_tool_result
from tracejudge.mapping.log_events import fold_log_events
from tracejudge.mapping.messages import Message, final_assistant_text, last_user_text
from tracejudge.mapping.results import prompt_result, resource_result, tool_result
from tracejudge.mapping.spans import Span, as_text, by_fields
from tracejudge.test_case import (
    INFERRED_FROM_CALL,
    OWNED_TURNS,
    ConversationalTestCase,
    MCPPromptCall,
    MCPResourceCall,
    MCPServer,
    MCPToolCall,
    ToolCall,
    Turn,
)

DEFAULT_SERVER = "mcp"
UNKNOWN = "unknown"  # the name of a call no span named
_BARE_SCHEMA_KEYS = frozenset({"type", "$schema"})
CONTENT_MISSING = "content_missing"  # the test case's metadata key: what the spans recorded none of, and why
OUTSIDE_RUN = ("MCP calls the app made outside any agent run (no agent or model span in the trace): context the "
               "agent had, in time order")
SERVER_KIND = 2  # OTLP SpanKind SERVER


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    key: str
    test_case: ConversationalTestCase
    service_name: str | None
    agent_name: str | None
    trace_ids: tuple[str, ...]
    first_span_ns: int
    last_span_ns: int
    content_hash: str
    explanation: tuple[dict[str, Any], ...] = ()  # with build_conversations(explain=True): where each turn came from
    context_only: bool = False  # only MCP calls made outside any agent run: nothing to score (see MappedTrace)
    # the test case as stored (`model_dump_json(exclude_none=True)`), made once for the content hash ("": not made)
    test_case_json: str = field(default="", repr=False, compare=False)

    def stored_json(self) -> str:
        """The test case's JSON as the collector stores it."""
        return self.test_case_json or self.test_case.model_dump_json(exclude_none=True)

    def document(self, explain: bool = False) -> dict[str, Any]:
        """The conversation as JSON (`tracejudge inspect --format json`, the admin API's mapping of a stored one)."""
        return {
            "conversation_id": self.conversation_id, "key": self.key, "service_name": self.service_name,
            "agent_name": self.agent_name, "trace_ids": list(self.trace_ids), "first_span_ns": self.first_span_ns,
            "last_span_ns": self.last_span_ns, "content_hash": self.content_hash, "context_only": self.context_only,
            "test_case": self.test_case.model_dump(mode="json", exclude_none=True),
            **({"explanation": list(self.explanation)} if explain else {}),
        }

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> Conversation:
        return cls(conversation_id=str(doc["conversation_id"]), key=str(doc["key"]),
                   test_case=ConversationalTestCase.model_validate(doc["test_case"]),
                   service_name=as_text(doc.get("service_name")), agent_name=as_text(doc.get("agent_name")),
                   trace_ids=tuple(doc.get("trace_ids", ())), first_span_ns=int(doc.get("first_span_ns") or 0),
                   last_span_ns=int(doc.get("last_span_ns") or 0), content_hash=str(doc.get("content_hash") or ""),
                   explanation=tuple(doc.get("explanation", ())), context_only=bool(doc.get("context_only")))

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


@dataclass(init=False)
class SpanFacts:
    """What the dialects say of one span, first answer first (`span_facts`). Its `__init__` and `_Call`'s are
    written out: compiled, a dataclass's generated one stays interpreted (`spans.Span`)."""

    span: Span
    run: AgentRun | None = None
    llm: LLMCall | None = None
    tool: ToolExecution | None = None
    op: MCPOperation | None = None
    definitions: list[ToolDefinition] = field(default_factory=list)

    def __init__(self, span: Span, run: AgentRun | None = None, llm: LLMCall | None = None,
                 tool: ToolExecution | None = None, op: MCPOperation | None = None,
                 definitions: list[ToolDefinition] | None = None) -> None:
        self.span = span
        self.run = run
        self.llm = llm
        self.tool = tool
        self.op = op
        self.definitions = [] if definitions is None else definitions

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)

    def where(self, aspect: str) -> str:
        """`span 'name' (id) via dialect`, for `inspect --explain` (the dialect is looked up only then)."""
        method = _ASK[aspect]
        dialect = next((d.name for d in DIALECTS if d.applies(self.span)
                        and getattr(d, method)(self.span) is not None), "?")
        return f"span '{self.span.name}' {self.span.span_id} via {dialect}"


_ASK = {"run": "agent_run", "llm": "llm_call", "tool": "tool_execution", "op": "mcp_operation"}
# where a turn's text or a call came from: (facts, aspect, note), formatted only when `inspect --explain` asks
Where = tuple["SpanFacts | None", str, str]


def _where_text(where: Where) -> str:
    facts, aspect, note = where
    base = facts.where(aspect) if facts is not None else ""
    return f"{base}: {note}" if base and note else base or note


def _own(dialect: Dialect, method: str) -> Any:
    """The dialect's bound method, or None where it keeps the base class's (which has nothing to say)."""
    return getattr(dialect, method) if getattr(type(dialect), method) is not getattr(Dialect, method) else None


# each dialect's own readers, looked up once: a span asks only what a dialect can answer (every span asked every
# dialect all six questions, most of them answered by the base class with None)
_READERS = tuple((d.applies, *(_own(d, m) for m in ("agent_run", "llm_call", "tool_execution", "mcp_operation",
                                                     "tool_definitions", "exclusive"))) for d in DIALECTS)


def span_facts(span: Span) -> SpanFacts:
    """One span read by every dialect that applies, in order of richness, until an exclusive one: what the
    conversation is rebuilt from, and what the conversation page shows a model call was given."""
    facts = SpanFacts(span)
    for applies, run, llm, tool, op, definitions, exclusive in _READERS:
        if not applies(span):
            continue
        if run is not None and facts.run is None:
            facts.run = run(span)
        if llm is not None and facts.llm is None:
            facts.llm = llm(span)
        if tool is not None and facts.tool is None:
            facts.tool = tool(span)
        if op is not None and facts.op is None:
            facts.op = op(span)
        if definitions is not None and (offered := definitions(span)):
            facts.definitions = merge_definitions(facts.definitions, offered) if facts.definitions else offered
        if exclusive is not None and exclusive(span):
            break
    return facts


def merge_definitions(kept: list[ToolDefinition], more: list[ToolDefinition]) -> list[ToolDefinition]:
    """One definition per tool name from several views of the offered tools: the first schema that says more than
    `{"type": "object"}`, the first description and server, MCP if any view says so."""
    if not more:
        return kept
    by_name = {d.name: d for d in kept}
    for definition in more:
        seen = by_name.get(definition.name)
        if seen is None:
            by_name[definition.name] = definition
            continue
        better_schema = not _has_properties(seen.input_schema) and _has_properties(definition.input_schema)
        if better_schema or (definition.description and not seen.description) or (definition.mcp and not seen.mcp) \
                or (definition.server and not seen.server):  # most views repeat what is kept: no copy then
            by_name[definition.name] = ToolDefinition(
                seen.name, seen.description or definition.description,
                definition.input_schema if better_schema else seen.input_schema,
                seen.mcp or definition.mcp, seen.server or definition.server)
    return list(by_name.values())


@dataclass(init=False)
class _Call:
    kind: str  # tool | resource | prompt
    name: str
    start_ns: int
    call_id: str | None = None
    arguments: Any = None
    result: Any = None
    error: bool = False
    error_message: str | None = None
    mcp: bool = False
    server: str | None = None
    executed: bool = True  # False for a call the model asked for that no span shows running
    order: tuple[int, int] | None = None  # (start of the LLM call that asked for it, position in its answer)
    mcp_rule: Where | None = None  # why the call counts as an MCP primitive
    sources: list[Where] = field(default_factory=list)
    # the spans that recorded it (tool, MCP client and server spans) and the interval they cover: kept when the
    # sources are slimmed away, for the conversation page's links and the call's time
    span_ids: list[str] = field(default_factory=list)
    span_interval: tuple[int, int] | None = None

    def __init__(self, kind: str, name: str, start_ns: int, call_id: str | None = None, arguments: Any = None,
                 result: Any = None, error: bool = False, error_message: str | None = None, mcp: bool = False,
                 server: str | None = None, executed: bool = True, order: tuple[int, int] | None = None,
                 mcp_rule: Where | None = None, sources: list[Where] | None = None,
                 span_ids: list[str] | None = None, span_interval: tuple[int, int] | None = None) -> None:
        self.kind = kind
        self.name = name
        self.start_ns = start_ns
        self.call_id = call_id
        self.arguments = arguments
        self.result = result
        self.error = error
        self.error_message = error_message
        self.mcp = mcp
        self.server = server
        self.executed = executed
        self.order = order
        self.mcp_rule = mcp_rule
        self.sources = [] if sources is None else sources
        self.span_ids = [] if span_ids is None else span_ids
        self.span_interval = span_interval

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)

    def recorded_by(self, span: Span) -> None:
        self.span_ids.append(span.span_id)
        start, end = span.start_ns, max(span.end_ns, span.start_ns)
        self.span_interval = (start, end) if self.span_interval is None else (
            min(self.span_interval[0], start), max(self.span_interval[1], end))

    def absorb(self, arguments: Any, result: Any, error: bool, error_message: str | None) -> None:
        """Fill what this record lacks from another view of the same call; an error on either side counts."""
        if self.arguments is None:
            self.arguments = arguments
        if self.result is None:
            self.result = result
        self.error = self.error or error
        self.error_message = self.error_message or error_message

    def absorb_request(self, arguments: Any) -> None:
        """The model's own tool call: its named arguments win over a positional input the tool span recorded."""
        if isinstance(arguments, dict) and arguments and _positional(self.arguments) or self.arguments is None:
            self.arguments = arguments

    def become(self, kind: str, name: str) -> _Call:
        """An app-side tool that only wraps an MCP resource read or prompt get is that read or get: the tool span
        has the URI or arguments and the contents, the MCP span below it only the method."""
        self.kind, self.name = kind, name
        return self

    def mark_mcp(self, rule: Where) -> None:
        self.mcp = True
        self.mcp_rule = self.mcp_rule or rule


def _positional(arguments: Any) -> bool:
    """Arguments a framework recorded without their names: a bare value or LangChain's `{"input": ...}`."""
    if arguments is None:
        return True
    if isinstance(arguments, dict):
        return set(arguments) == {"input"}
    return True


@dataclass(init=False)
class _Draft:
    """One turn being rebuilt from one agent run (its `__init__` written out, as `_Call`'s)."""

    start_ns: int
    trace_id: str
    run_span_id: str
    service_name: str | None
    agent_name: str | None = None
    user_text: str | None = None
    context_only: bool = False  # a trace with no agent run and no model call: MCP calls the app made itself
    scopes: frozenset[str] = frozenset()  # the instrumentation scopes of its spans (what to turn on, if empty)
    reply: str | None = None
    calls: list[_Call] = field(default_factory=list)
    listed: list[tuple[str, str | None, dict[str, Any]]] = field(default_factory=list)  # (method, server, item)
    definitions: list[ToolDefinition] = field(default_factory=list)
    sources: dict[str, Where] = field(default_factory=dict)  # "user" / "assistant" -> where the text came from
    # the turns last built from it and what they depended on (whether they copied the values; each call's name and
    # whether it counts as MCP): a conversation composed again from the same mapped traces builds only its new turns
    built: tuple[tuple[bool, tuple[tuple[str, bool], ...]], Turn | None, Turn | None] | None = field(
        default=None, repr=False, compare=False)

    def __init__(self, start_ns: int, trace_id: str, run_span_id: str, service_name: str | None,
                 agent_name: str | None = None, user_text: str | None = None, context_only: bool = False,
                 scopes: frozenset[str] = frozenset(), reply: str | None = None, calls: list[_Call] | None = None,
                 listed: list[tuple[str, str | None, dict[str, Any]]] | None = None,
                 definitions: list[ToolDefinition] | None = None, sources: dict[str, Where] | None = None,
                 built: tuple[tuple[bool, tuple[tuple[str, bool], ...]], Turn | None, Turn | None] | None = None,
                 ) -> None:
        self.start_ns = start_ns
        self.trace_id = trace_id
        self.run_span_id = run_span_id
        self.service_name = service_name
        self.agent_name = agent_name
        self.user_text = user_text
        self.context_only = context_only
        self.scopes = scopes
        self.reply = reply
        self.calls = [] if calls is None else calls
        self.listed = [] if listed is None else listed
        self.definitions = [] if definitions is None else definitions
        self.sources = {} if sources is None else sources
        self.built = built

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


class _Trace:
    def __init__(self, spans: list[Span]) -> None:
        self.facts = {s.span_id: span_facts(s) for s in sorted(spans, key=lambda s: (s.start_ns, s.span_id))}
        # the spans of MCP operations: what ties the trace to an MCP session
        self.ops = [f.span for f in self.facts.values() if f.op is not None]

    def parent(self, facts: SpanFacts) -> SpanFacts | None:
        pid = facts.span.parent_span_id
        return self.facts.get(pid) if pid else None

    def ancestors(self, facts: SpanFacts) -> Iterable[SpanFacts]:
        seen = {facts.span.span_id}
        current = self.parent(facts)
        while current is not None and current.span.span_id not in seen:  # a parent cycle must not hang us
            seen.add(current.span.span_id)
            yield current
            current = self.parent(current)

    def outermost_runs(self) -> dict[str, SpanFacts | None]:
        """For each span, the outermost agent-run span among itself and its ancestors (one walk per chain:
        each span's answer is memoized, so a deep trace costs linear time)."""
        outer: dict[str, SpanFacts | None] = {}
        for facts in self.facts.values():
            chain: list[SpanFacts] = []
            in_chain: set[str] = set()
            current: SpanFacts | None = facts
            while current is not None and current.span.span_id not in outer:
                if current.span.span_id in in_chain:  # a parent cycle must not hang us
                    break
                chain.append(current)
                in_chain.add(current.span.span_id)
                current = self.parent(current)
            above = outer.get(current.span.span_id) if current is not None else None
            for member in reversed(chain):
                above = above or (member if member.run else None)
                outer[member.span.span_id] = above
        return outer

    def _wrapped_operations(self, members: list[SpanFacts]) -> dict[str, set[tuple[str, str | None]]]:
        """For each tool span that is no MCP span itself, the (method, target) of the MCP client spans beneath it:
        what decides whether the tool only wraps one resource read or prompt get."""
        wrapped: dict[str, set[tuple[str, str | None]]] = {}
        for f in members:
            if f.op is None or f.span.kind == SERVER_KIND or f.op.method.endswith("/list"):
                continue
            tool = next((a for a in self.ancestors(f) if a.tool is not None and a.op is None), None)
            if tool is not None:
                wrapped.setdefault(tool.span.span_id, set()).add((f.op.method, f.op.target))
        return wrapped

    def sessions(self) -> frozenset[str]:
        """What ties this trace's MCP calls to one MCP session: its `mcp.session.id`s, and each pair of client and
        server process (service name and instance) that its MCP spans show talking (a stdio server lives as long
        as its client's session)."""
        ops = self.ops
        if not ops:
            return frozenset()
        found: set[str] = set()
        clients: set[str] = set()
        servers: set[str] = set()
        resources: set[tuple[bool, int]] = set()  # a request's spans share their resource's dict: read each once
        for span in ops:
            session = span.attributes.get("mcp.session.id")
            if session:
                found.add(f"mcp.session.id {session}")
            side = (span.kind == SERVER_KIND, id(span.resource))
            if side not in resources:
                resources.add(side)
                instance = span.resource.get("service.instance.id")
                if instance:
                    (servers if side[0] else clients).add(f"{span.service_name}/{instance}")
        found.update(f"{client} -> {server}" for client in clients for server in servers)
        return frozenset(found)

    def drafts(self) -> list[_Draft]:
        all_facts = list(self.facts.values())
        outer = self.outermost_runs()
        runs = [f for f in all_facts if outer.get(f.span.span_id) is f]
        if not runs:  # no agent span: the whole trace is one run
            if all(f.span.kind == SERVER_KIND for f in all_facts) and not any(f.llm for f in all_facts):
                return []  # an MCP server's own trace: its calls' client side (the conversation) is elsewhere
            root = next((f for f in all_facts if self.parent(f) is None), all_facts[0])
            draft = self._draft(root, AgentRun(), all_facts)
            draft.context_only = draft.user_text is None and not any(f.llm for f in all_facts)
            if draft.context_only:
                draft.sources["assistant"] = (None, "", f"trace {root.span.trace_id}: no agent or model span, "
                                                        "MCP calls the app made outside any agent run")
            return [draft]
        members: dict[str, list[SpanFacts]] = {r.span.span_id: [] for r in runs}
        for f in all_facts:
            owner = outer.get(f.span.span_id)
            if owner is None:  # an orphan: the run whose time window holds it, else the first run
                owner = next((r for r in runs if r.span.start_ns <= f.span.start_ns <= r.span.end_ns), runs[0])
            members[owner.span.span_id].append(f)
        return [self._draft(r, r.run or AgentRun(), members[r.span.span_id]) for r in runs]

    def _draft(self, root: SpanFacts, run: AgentRun, members: list[SpanFacts]) -> _Draft:
        llm_facts = [f for f in members if f.llm is not None]
        draft = _Draft(start_ns=root.span.start_ns, trace_id=root.span.trace_id, run_span_id=root.span.span_id,
                       service_name=root.span.service_name, agent_name=run.agent_name,  # the run's and models' scopes
                       scopes=frozenset({root.span.scope_name, *(f.span.scope_name for f in llm_facts)}))
        llms = [f.llm for f in llm_facts if f.llm is not None]
        run_where = (root, "run", "")
        if run.history is not None:
            new = run.history[run.new_from or 0:]
            draft.user_text = "\n".join(m.text for m in new if m.is_user_text) or None
            draft.reply = final_assistant_text(new) or run.output_text
            draft.sources = {"user": (root, "run", "the run's new messages"),
                             "assistant": (root, "run", "the run's new messages")}
            message_sources = [(new, True, run_where, root.span.start_ns)]
        else:
            # the run's own input is what the user typed; LLM inputs may wrap it in a template ("New task: ...")
            first = next(((f, text) for f in llm_facts if f.llm is not None
                          and (text := last_user_text(f.llm.input))), None)
            draft.user_text = run.input_text or (first[1] if first else None)
            draft.sources["user"] = ((root, "run", "the run's input") if run.input_text else
                                     (first[0], "llm", "last user message of the first LLM input")
                                     if first else (None, "", "(none)"))
            final = final_assistant_text(llms[-1].output) if llms else None
            draft.reply = final or run.output_text
            draft.sources["assistant"] = ((llm_facts[-1], "llm", "text of the last LLM output") if final
                                          else (root, "run", "the run's output"))
            # inputs repeat the whole history: they may pair results with this run's calls, never add calls
            message_sources = [(messages, own, (f, "llm", ""), f.span.start_ns)
                               for f in llm_facts if f.llm is not None
                               for messages, own in ((f.llm.output, True), (f.llm.input, False))]
        if draft.agent_name is None:
            names = ((f.run.agent_name if f.run else None) or f.span.str_attr("gen_ai.agent.name") for f in members)
            draft.agent_name = next((n for n in names if n), None)
        self._collect_calls(draft, members)
        for messages, may_add, where, asked_ns in message_sources:
            _pair_parts(draft.calls, messages, asked_ns, may_add, where)
        for f in members:
            draft.definitions += f.definitions  # merged once, when the conversation is composed
            if f.op is not None and f.op.method.endswith("/list"):
                draft.listed += [(f.op.method, f.op.server, item) for item in f.op.listed]
        draft.calls.sort(key=lambda c: c.order or (c.start_ns, 0))
        return draft

    def _collect_calls(self, draft: _Draft, members: list[SpanFacts]) -> None:
        by_span: dict[str, _Call] = {}
        by_request: dict[tuple[str, str], _Call] = {}
        wrapped: dict[str, set[tuple[str, str | None]]] | None = None  # computed when first needed (rarely)
        for f in members:
            span, tool, op = f.span, f.tool, f.op
            if tool is None and op is None:
                continue
            if op is not None and op.method.endswith("/list"):
                continue
            if tool is not None and op is None and tool.name in ANSWER_TOOLS and not tool.mcp:
                continue
            kind = "tool" if tool is not None else _OP_KINDS.get(op.method) if op is not None else None
            if kind is None:
                continue
            name = tool.name if tool is not None else (op.target if op is not None else None) or UNKNOWN
            above = next((a for a in self.ancestors(f) if a.span.span_id in by_span), None)
            owner = by_span[above.span.span_id] if above is not None else None
            request_key = (op.method, op.request_id) if op is not None and op.request_id else None
            named = tool is not None or (op is not None and op.target is not None)
            same = owner if owner is not None and owner.kind == kind and (owner.name == name or not named) else None
            same = same or (by_request.get(request_key) if request_key else None)
            if same is None and owner is not None and op is not None and kind != "tool" and above is not None \
                    and _wraps(owner, f):
                if wrapped is None:
                    wrapped = self._wrapped_operations(members)
                if _only_one_read(wrapped.get(above.span.span_id, set())):
                    same = owner.become(kind, name if op.target else _named_in(owner.arguments, kind) or name)
            view = tool or op
            assert view is not None
            if same is not None:  # another view of a call already seen: the MCP server side, a nested span
                same.absorb(view.arguments, view.result, view.error, view.error_message)
                call = same
            else:
                call = _Call(kind, name, span.start_ns, tool.call_id if tool else None, view.arguments, view.result,
                             view.error, view.error_message, False, tool.server if tool else None)
                draft.calls.append(call)
            call.sources.append((f, "tool" if tool is not None else "op", ""))
            call.recorded_by(span)
            if tool is not None and tool.mcp:
                call.mark_mcp((f, "tool", "the tool span says MCP"))
            if op is not None:
                call.mark_mcp((f, "op", f"an MCP {op.side or 'client'} span"))
                if op.server and (op.side == "server" or call.server is None):
                    call.server = op.server  # the server's own name beats the address the client dialled
            by_span[span.span_id] = call
            if request_key:
                by_request[request_key] = call


def _wraps(owner: _Call, facts: SpanFacts) -> bool:
    """The call above an MCP client span is a function tool of the app (not MCP itself, no other MCP call yet)."""
    return owner.kind == "tool" and not owner.mcp and facts.span.kind != SERVER_KIND


def _only_one_read(operations: set[tuple[str, str | None]]) -> bool:
    """One resource read or one prompt get beneath a tool (however many client spans record it): a tool that also
    calls an MCP tool, or reads two resources, does more than wrap one read, and stays a function tool."""
    methods = {method for method, _ in operations}
    targets = {target for _, target in operations if target is not None}
    return len(methods) == 1 and methods <= {"resources/read", "prompts/get"} and len(targets) <= 1


def _named_in(arguments: Any, kind: str) -> str | None:
    """The resource URI or prompt name an app-side tool was called with, if it takes one by a usual name."""
    if not isinstance(arguments, dict):
        return None
    for key in (("uri", "resource_uri", "url") if kind == "resource" else ("name", "prompt_name", "prompt")):
        if isinstance(arguments.get(key), str) and arguments[key]:
            return arguments[key]
    return None


_NOT_WORD = re.compile(r"[^0-9A-Za-z]+")
_OP_KINDS = {"tools/call": "tool", "resources/read": "resource", "prompts/get": "prompt"}
# Tools whose call is how the agent gives its answer, not an action (smolagents' ToolCallingAgent)
ANSWER_TOOLS = frozenset({"final_answer"})


@functools.lru_cache(maxsize=4096)
def _tool_key(name: str) -> str:
    return _NOT_WORD.sub("_", name).lower()


def same_tool_name(a: str, b: str) -> bool:
    """Frameworks name an MCP tool as they registered it: `weather__get_weather`, `mcp.get_weather`, CrewAI's
    `server.py_get_weather` on its tool span and `server_py_get_weather` in the model's call."""
    if a == b:
        return True
    ka, kb = _tool_key(a), _tool_key(b)
    return ka == kb or ka.endswith("_" + kb) or kb.endswith("_" + ka)


def _same_tool(call: _Call, name: str | None) -> bool:
    return call.kind == "tool" and bool(name) and same_tool_name(call.name, name or "")


def _unidentified_match(calls: list[_Call], part: Any) -> _Call | None:
    """The executed call a requested call without a matching id is: same tool, and the same arguments when
    two calls of the tool are open (two `get_weather` calls in one step), else the first in time."""
    open_calls = [c for c in calls if c.call_id is None and _same_tool(c, part.name)]
    same_args = [c for c in open_calls if c.arguments == part.arguments
                 or (_positional(c.arguments) and c.arguments is not None and isinstance(part.arguments, dict)
                     and (c.arguments.get("input") if isinstance(c.arguments, dict) else c.arguments)
                     in part.arguments.values())]
    found = same_args or open_calls
    return found[0] if found else None


def _pair_parts(calls: list[_Call], messages: list[Message], asked_ns: int, may_add: bool, where: Where) -> None:
    """Tool-call and tool-result parts of messages, joined with the calls spans showed running: by call id,
    else by tool and arguments. A call only parts describe is added when `may_add` (the messages are this
    run's own, not replayed history) and counts as executed only once a result for it is seen."""
    by_id = {c.call_id: c for c in calls if c.call_id}
    position = 0
    for message in messages:
        for part in message.tool_calls:
            if part.name in ANSWER_TOOLS:
                continue
            position += 1
            call = by_id.get(part.id) if part.id else None
            if call is None and may_add:  # replayed history must never claim this run's calls
                call = _unidentified_match(calls, part)
                if call is not None:
                    call.call_id = part.id
            if call is None:
                if not may_add:
                    continue
                call = _Call("tool", part.name or UNKNOWN, asked_ns, part.id, executed=False)
                calls.append(call)
            if part.id:
                by_id[part.id] = call
            call.absorb_request(part.arguments)
            if may_add:  # parallel calls run in any order: keep the order the model asked in
                call.order = call.order or (asked_ns, position)
                call.sources.append((where[0], where[1], "the model's tool call"))
        for part in message.tool_results:
            call = by_id.get(part.id) if part.id else None
            if call is not None:
                call.absorb(None, part.result, False, None)
                if not call.executed:
                    call.executed = True
                    call.sources.append((where[0], where[1], "the tool's result message"))


# --- the MCP server inventory ---------------------------------------------------------------------------


class _Inventory:
    """The MCP servers' tools, resources and prompts, and for each tool where we learned it is MCP."""

    def __init__(self, given: Sequence[MCPServer], named: Mapping[str, Sequence[str]]) -> None:
        self.servers: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        self.origin: dict[str, str] = {}  # tool name -> how it entered the inventory
        # tool name -> `server_of_tool`, asked several times per call: forgotten whenever a tool is added
        self._server_of: dict[str, str | None] = {}
        for server in given:
            data = server.model_dump(mode="json", exclude_none=True)
            entry = self._server(server.server_name)
            entry["meta"]["transport"] = {"transport": server.transport} if server.transport else {}
            for tool in data.get("available_tools", []):
                entry["tools"][tool["name"]] = tool
                self.origin.setdefault(tool["name"], f"listed for server '{server.server_name}' in the servers file")
            for res in data.get("available_resources", []):
                entry["resources"][res["uri"]] = res
            for template in data.get("available_resource_templates", []):
                entry["resource_templates"][template["uriTemplate"]] = template
            for prompt in data.get("available_prompts", []):
                entry["prompts"][prompt["name"]] = prompt
        self.named = {name for tools in named.values() for name in tools}
        for server_name, tools in named.items():
            for name in tools:
                self._server(server_name)["tools"].setdefault(name, {"name": name})
                self.origin.setdefault(name, f"named for server '{server_name}' in [mapping] mcp_tools")

    def _server(self, name: str) -> dict[str, dict[str, dict[str, Any]]]:
        return self.servers.setdefault(name, {"tools": {}, "resources": {}, "resource_templates": {},
                                              "prompts": {}, "meta": {}})

    def add_listed(self, method: str, server: str | None, item: dict[str, Any]) -> None:
        section = "resource_templates" if method == "resources/templates/list" else method.split("/", 1)[0]
        key = {"resources": "uri", "resource_templates": "uriTemplate"}.get(section, "name")
        if section in ("tools", "resources", "resource_templates", "prompts") and isinstance(item.get(key), str):
            listed = self._server(server or DEFAULT_SERVER)[section]
            if section == "tools" and item[key] not in listed:
                self._server_of.clear()
            existing = listed.setdefault(item[key], {})
            existing.update({k: v for k, v in item.items() if v is not None})
            if section == "tools":
                self.origin.setdefault(item[key], f"listed by an MCP {method} span")

    def add_called(self, kind: str, server: str, name: str, arguments: Any) -> None:
        """A resource read or a prompt got proves the server has it, though no listing span says so."""
        inferred = {"_meta": {INFERRED_FROM_CALL: "called; no listing of it was recorded"}}
        if kind == "resource" and name != UNKNOWN:
            self._server(server)["resources"].setdefault(name, {"uri": name, **inferred})
        elif kind == "prompt" and name != UNKNOWN:
            prompt = self._server(server)["prompts"].setdefault(name, {"name": name, **inferred})
            if isinstance(arguments, dict) and arguments and not prompt.get("arguments"):
                prompt["arguments"] = [{"name": key} for key in sorted(arguments)]

    def takes_arguments(self, name: str) -> bool:
        """Whether the tool's schema has parameters (True when no schema of it is known)."""
        tool = next((entry["tools"][name] for entry in self.servers.values() if name in entry["tools"]), None)
        schema = tool.get("inputSchema") if tool else None
        return not isinstance(schema, dict) or _has_properties(schema) and bool(schema.get("properties", True))

    def server_of_tool(self, name: str) -> str | None:
        if name not in self._server_of:
            self._server_of[name] = next((s for s, entry in self.servers.items() if name in entry["tools"]), None)
        return self._server_of[name]

    def canonical_tool(self, name: str, named_only: bool = False) -> str | None:
        """The inventory's name for a tool the framework renamed (prefixed with its server), if exactly one fits;
        `named_only`: only among the tools [mapping] mcp_tools names (a call with no MCP evidence of its own)."""
        if self.server_of_tool(name) is not None:
            return name
        matches = {tool for entry in self.servers.values() for tool in entry["tools"]
                   if same_tool_name(tool, name) and (not named_only or tool in self.named)}
        return matches.pop() if len(matches) == 1 else None

    def add_definition(self, server: str, definition: ToolDefinition) -> None:
        tools = self._server(server)["tools"]
        if definition.name not in tools:
            self._server_of.clear()
        tool = tools.setdefault(definition.name, {"name": definition.name})
        if definition.description and not tool.get("description"):
            tool["description"] = definition.description
        if definition.input_schema and not _has_properties(tool.get("inputSchema")):
            tool["inputSchema"] = definition.input_schema

    def to_servers(self, copy_values: bool = True) -> list[MCPServer]:
        out = []
        own = _owned if copy_values else _as_is
        for name in sorted(self.servers):
            entry = self.servers[name]
            out.append(_valid_server(own({  # a case's own copy of the spans' schemas
                "server_name": name,
                **entry["meta"].get("transport", {}),
                "available_tools": [entry["tools"][k] for k in sorted(entry["tools"])],
                "available_resources": [entry["resources"][k] for k in sorted(entry["resources"])],
                "available_resource_templates": [entry["resource_templates"][k]
                                                 for k in sorted(entry["resource_templates"])],
                "available_prompts": [entry["prompts"][k] for k in sorted(entry["prompts"])],
            })))
        return out


_LISTINGS = ("available_tools", "available_resources", "available_resource_templates", "available_prompts")


def _valid_server(document: dict[str, Any]) -> MCPServer:
    """The server as the case holds it, without the listing entries MCP's shapes refuse (a tool whose
    `inputSchema` is no object, say): one bad entry in a `*/list` result must not keep the conversation from being
    built (it was retried, and refused, after every quiet period)."""
    while True:
        try:
            return MCPServer.model_validate(document)
        except ValidationError as exc:
            refused = {(loc[0], loc[1]) for error in exc.errors() if len(loc := error["loc"]) > 1
                       and loc[0] in _LISTINGS and isinstance(loc[1], int)}
            if not refused:
                raise
            for listing in {listing for listing, _ in refused}:
                document[listing] = [item for i, item in enumerate(document[listing]) if (listing, i) not in refused]


def _has_properties(schema: Any) -> bool:
    """A schema that says more than `{"type": "object"}` (the default a bare tool name gets)."""
    return isinstance(schema, dict) and bool(schema.keys() - _BARE_SCHEMA_KEYS)


def _args(value: Any, name: str, notes: list[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    notes.append(f"arguments of {name} are not a JSON object (kept out of args): {str(value)[:200]}")
    return {}


def _as_is(value: Any) -> Any:
    return value


def _owned(value: Any) -> Any:
    """A copy of a span's value for a Turn to own: spans cache their parsed JSON and a case's user may change its
    Turns. Plain JSON is copied by hand; `copy.deepcopy` of whole Turns cost a quarter of assembling them."""
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_owned(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return copy.deepcopy(value)


def _explain_call(call: _Call, name: str, verdict: str, envelope: str | None, inventory: _Inventory) -> dict[str, Any]:
    sources = [_where_text(source) for source in call.sources]
    if name != call.name:
        sources.append(f"the framework named it '{call.name}'; the MCP inventory calls it '{name}'")
    entry: dict[str, Any] = {"kind": call.kind, "name": name, "call_id": call.call_id, "counted_as": verdict,
                             "sources": sources}
    rule = call.mcp_rule or ((None, "", inventory.origin.get(name, "in the MCP inventory"))
                             if verdict == "MCP tool call" else None)
    if rule:
        entry["mcp_rule"] = _where_text(rule)
    if envelope:
        entry["result_envelope"] = envelope
    return entry


def _spans_of(call: _Call) -> dict[str, Any]:
    """The spans that recorded a call and how long it took (from the first start to the last end of them): what
    the conversation page links the call to."""
    interval = call.span_interval
    return {"span_ids": list(dict.fromkeys(call.span_ids)),
            "duration_ms": round((interval[1] - interval[0]) / 1e6, 3) if interval is not None else None}


def _assistant_turn(draft: _Draft, inventory: _Inventory, names: Mapping[int, str],
                    explain: list[dict[str, Any]] | None, copy_values: bool = True) -> Turn | None:
    """The draft's assistant turn; `names`: the inventory's name of each call (by id) the framework named
    otherwise. Changes nothing in the draft, so it can be composed again."""
    own = _owned if copy_values else _as_is
    tools, resources, prompts, functions = [], [], [], []
    notes: list[str] = []
    not_executed: list[dict[str, Any]] = []
    call_spans: dict[str, list[dict[str, Any]]] = {}  # per kind, in the order of the turn's MCP calls
    for call in draft.calls:
        name = names.get(id(call), call.name)
        envelope = None
        arguments, result = own(call.arguments), own(call.result)
        if not call.executed:  # asked for by the model, never run: visible, but never a made call
            not_executed.append({"name": name, "args": arguments, "call_id": call.call_id})
            verdict = "not executed"
        elif call.kind == "resource":
            resources.append(MCPResourceCall(uri=name, result=resource_result(result, name)))
            verdict = "MCP resource read"
        elif call.kind == "prompt":
            prompts.append(MCPPromptCall(name=name, args=_args(arguments, name, notes),
                                         result=prompt_result(result)))
            verdict = "MCP prompt get"
        elif call.mcp or inventory.server_of_tool(name):
            unwrapped = unwrap_tool_result(result)
            envelope = unwrapped.envelope
            tools.append(MCPToolCall(name=name, args=_args(arguments, name, notes),
                                     result=tool_result(unwrapped.value, call.error or unwrapped.error,
                                                        call.error_message)))
            verdict = "MCP tool call"
        else:
            params = arguments if isinstance(arguments, dict) or arguments is None \
                else {"input": arguments}
            functions.append(ToolCall(name=name, input_parameters=params, output=result, type="function"))
            verdict = "function tool (no MCP span, tools/list or [mapping] mcp_tools names it)"
        if verdict.startswith("MCP"):
            call_spans.setdefault(call.kind, []).append(_spans_of(call))
        if explain is not None:
            explain.append(_explain_call(call, name, verdict, envelope, inventory))
    if not (draft.reply or tools or resources or prompts or functions or not_executed):
        return None
    metadata: dict[str, Any] = {"trace_id": draft.trace_id, "span_id": draft.run_span_id}
    if draft.context_only:
        metadata["outside_run"] = OUTSIDE_RUN
    if notes:
        metadata["mapping_notes"] = notes
    if not_executed:
        metadata["calls_not_executed"] = not_executed
    if call_spans:
        metadata["call_spans"] = call_spans
    return Turn(role="assistant", content=draft.reply or "", mcp_tools_called=tools or None,
                mcp_resources_called=resources or None, mcp_prompts_called=prompts or None,
                tools_called=functions or None, metadata=metadata)


def _draft_turns(draft: _Draft, inventory: _Inventory, names: Mapping[int, str],
                 explain: list[dict[str, Any]] | None, copy_values: bool = True) -> tuple[Turn | None, Turn | None]:
    """The draft's user turn (None without the user's text) and assistant turn (None when it has nothing)."""
    user = Turn(role="user", content=draft.user_text) if draft.user_text else None
    return user, _assistant_turn(draft, inventory, names, explain, copy_values)


def _dedupe(spans: Iterable[Span | dict[str, Any]]) -> list[Span]:
    """One span per (trace_id, span_id): exporters retry, so the same span can arrive twice."""
    unique: dict[tuple[str, str], Span] = {}
    for item in spans:
        span = item if isinstance(item, Span) else Span.from_record(item)
        kept = unique.get(span.key)
        if kept is None or len(span.attributes) > len(kept.attributes):
            unique[span.key] = span
    return list(unique.values())


@dataclass(frozen=True)
class MappedTrace:
    """One trace's part of its conversation, mapped on its own: a conversation whose later turns arrive in new
    traces is composed from the earlier traces' parts and the new ones', without mapping its old spans again.
    Mapped without `explain`, it holds no reference to the spans, only the values the turns take from them."""

    trace_id: str
    conversation_id: str  # the trace's conversation key's value (semconv.md section 7 rule 2)
    key: str  # the attribute that key came from
    drafts: tuple[_Draft, ...]
    first_span_ns: int
    last_span_ns: int
    sessions: frozenset[str] = frozenset()  # what ties its MCP calls to one MCP session (`_Trace.sessions`)
    # no agent run, no model call: MCP calls the app made outside any run (context loaded at session start, say),
    # which belong to the conversation of their MCP session, not to one of their own
    context_only: bool = False

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


def _slim(draft: _Draft) -> _Draft:
    """The draft without where its parts came from (those point at the spans, which `inspect --explain` alone
    needs). Done as each trace is mapped, so its spans are freed at once: slimming only the traces the collector
    keeps left a batch's spans alive and cost 4-10% more CPU per conversation (`python bench/assembly.py`). In
    place: the draft and its calls were made for this mapping alone (a copy of each was 2 % of building)."""
    draft.sources = {}
    for call in draft.calls:
        call.sources = []
        call.mcp_rule = None
    return draft


def map_traces(spans: Iterable[Span | dict[str, Any]], *, explain: bool = False) -> list[MappedTrace]:
    """Each trace the spans hold, mapped on its own (exporters' retries counted once, log-event carriers folded
    into their spans); `explain` keeps where each turn and call came from."""
    by_trace: dict[str, list[Span]] = {}
    for span in fold_log_events(_dedupe(spans)):
        by_trace.setdefault(span.trace_id, []).append(span)
    mapped = []
    for trace_id, trace_spans in by_trace.items():
        key, value = trace_conversation_key(trace_spans)
        trace = _Trace(trace_spans)
        drafts = trace.drafts()
        mapped.append(MappedTrace(
            trace_id=trace_id, conversation_id=value, key=key,
            drafts=tuple(drafts if explain else (_slim(d) for d in drafts)),
            first_span_ns=min(s.start_ns for s in trace_spans),
            last_span_ns=max(max(s.end_ns, s.start_ns) for s in trace_spans), sessions=trace.sessions(),
            context_only=bool(drafts) and all(d.context_only for d in drafts)))
    return mapped


def build_conversations(spans: Iterable[Span | dict[str, Any]],
                        servers: Sequence[MCPServer | dict[str, Any]] | None = None, *,
                        mcp_tools: Mapping[str, Sequence[str]] | None = None,
                        explain: bool = False) -> list[Conversation]:
    """Every conversation the spans describe, as test cases with the MCP servers' inventory.

    `servers` is a user-supplied inventory (MCPServer objects or dicts), merged by server name with what the
    traces listed. `mcp_tools` names, per MCP server, the tools that are MCP primitives for frameworks that
    emit no MCP span. With `explain`, each conversation says which span and rule gave each turn and call.
    Conversations with no turn (e.g. only MCP housekeeping) are left out.
    """
    groups: dict[str, list[MappedTrace]] = {}
    for trace in map_traces(spans, explain=explain):
        groups.setdefault(trace.conversation_id, []).append(trace)
    attach_context_traces(groups)
    conversations = []
    for traces in groups.values():
        conversation = compose_conversation(traces, servers, mcp_tools=mcp_tools, explain=explain)
        if conversation is not None:
            conversations.append(conversation)
    return sorted(conversations, key=lambda c: (c.first_span_ns, c.conversation_id))


def _content_gaps(drafts: Sequence[_Draft], inventory: _Inventory) -> dict[str, Any] | None:
    """What the runs' spans recorded none of, and the switch that records it; None when nothing is missing. Only
    tool calls count (an MCP client span of a read or get records neither by design), and for arguments only
    tools whose schema takes any (a tool without parameters may have none recorded)."""
    runs = [d for d in drafts if not d.context_only]
    if not runs:  # MCP calls outside any run: no messages to expect (they are marked context-only instead)
        return None
    calls = [c for d in runs for c in d.calls if c.executed and c.kind == "tool"]
    taking = [c for c in calls if inventory.takes_arguments(c.name)]
    missing = missing_content(has_messages=any(d.user_text or d.reply for d in runs), calls=len(calls),
                              with_arguments=sum(c.arguments is not None for c in taking) if taking else len(calls),
                              with_results=sum(c.result is not None or c.error for c in calls))
    if not missing:
        return None
    return {"missing": missing, "how_to_record": switch_for(s for d in runs for s in d.scopes if s)}


def _gap_text(gaps: dict[str, Any]) -> str:
    return f"the spans hold no {', no '.join(gaps['missing'])}: {gaps['how_to_record']}"


ATTACHABLE_KEYS = frozenset({TRACE_KEY, "mcp.session.id"})  # keys of context traces that may join a conversation


def attach_context_traces(groups: dict[str, list[MappedTrace]]) -> None:
    """Move each group of only context traces with no conversation key of their own (MCP calls the app made outside
    any agent run) into the one conversation that shares their MCP session; a group that matches none, or several,
    stays as it is (composed, it is marked context-only and is not scored)."""
    waiting = [c for c, traces in groups.items() if all(t.context_only and t.key in ATTACHABLE_KEYS for t in traces)]
    if not waiting:
        return
    owners: dict[str, set[str]] = {}
    for conversation_id, traces in groups.items():
        if not all(t.context_only for t in traces):
            for trace in traces:
                for session in trace.sessions:
                    owners.setdefault(session, set()).add(conversation_id)
    for conversation_id in waiting:
        traces = groups[conversation_id]
        targets = {owner for t in traces for session in t.sessions for owner in owners.get(session, ())}
        if len(targets) == 1:
            groups[targets.pop()].extend(traces)
            del groups[conversation_id]


def compose_conversation(traces: Sequence[MappedTrace], servers: Sequence[MCPServer | dict[str, Any]] | None = None,
                         *, mcp_tools: Mapping[str, Sequence[str]] | None = None,
                         explain: bool = False, copy_values: bool = True) -> Conversation | None:
    """The conversation these mapped traces (all of one conversation, in any order) make; None when it has no
    turn. The same traces give the same conversation however they were mapped, together or one at a time, and
    composing changes none of them. Composed again with more traces, a trace's turns are built again only where
    the inventory changed what they say; its conversations share those Turns, so treat them as read-only.
    `copy_values=False`: the case shares the traces' parsed arguments, results and schemas instead of owning
    copies, for a caller that only reads it (the collector, which writes its JSON: copying was 4 % of building)."""
    if not traces:
        return None
    traces = sorted(traces, key=lambda t: (t.first_span_ns, t.trace_id))
    named_by = next((t for t in traces if not t.context_only), traces[0])  # context read before the first run
    conversation_id, key = named_by.conversation_id, named_by.key
    context_only = named_by.context_only
    given = [s if isinstance(s, MCPServer) else MCPServer.model_validate(s) for s in servers or []]
    drafts = sorted((d for t in traces for d in t.drafts), key=lambda d: d.start_ns)
    inventory = _Inventory(given, mcp_tools or {})
    definitions = {d.name: d for d in merge_definitions([], [d for draft in drafts for d in draft.definitions])}
    seen = ({c.server for d in drafts for c in d.calls if c.server} | {srv for d in drafts for _, srv, _ in d.listed
                                                                       if srv}
            | {d.server for d in definitions.values() if d.server} | set(inventory.servers))
    default_server = next(iter(seen)) if len(seen) == 1 else DEFAULT_SERVER
    for draft in drafts:
        for method, server, item in draft.listed:
            inventory.add_listed(method, server or default_server, item)
    names: dict[int, str] = {}  # id(call) -> the inventory's name for a call the framework named otherwise
    for draft in drafts:
        for call in draft.calls:
            name = call.name
            canonical = inventory.canonical_tool(name, named_only=not call.mcp) if call.kind == "tool" else None
            if canonical is not None and canonical != name:
                names[id(call)] = name = canonical
            offered = definitions.get(name)
            if call.kind == "tool" and (call.mcp or inventory.server_of_tool(name) or (offered and offered.mcp)):
                server = call.server or inventory.server_of_tool(name) or (offered and offered.server) \
                    or default_server
                definition = definitions.get(name) or next(
                    (d for d in definitions.values() if same_tool_name(d.name, name)), None)
                if definition is not None and definition.name != name:
                    definition = replace(definition, name=name)
                inventory.add_definition(server, definition or ToolDefinition(name))
            elif call.kind != "tool" and call.executed:  # a resource read or prompt got: the server offers it
                inventory.add_called(call.kind, call.server or default_server, name, call.arguments)
    for definition in definitions.values():  # every other MCP tool the model was offered: where its calls went
        if definition.mcp and inventory.server_of_tool(definition.name) is None:
            inventory.add_definition(definition.server or default_server, definition)
    turns: list[Turn] = []
    explanation: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] | None
    for draft in drafts:
        if explain:
            user, assistant = _draft_turns(draft, inventory, names, calls := [], copy_values)
        else:
            calls = None
            depends = (copy_values, tuple((n := names.get(id(c), c.name), bool(c.mcp or inventory.server_of_tool(n)))
                                          for c in draft.calls))
            if draft.built is None or draft.built[0] != depends:
                draft.built = (depends, *_draft_turns(draft, inventory, names, None, copy_values))
            _, user, assistant = draft.built
        if user is not None:
            turns.append(user)
            if explain:
                explanation.append({"turn": len(turns) - 1, "role": "user",
                                    "source": _where_text(draft.sources["user"])})
        if assistant is not None:
            turns.append(assistant)
            if explain:
                explanation.append({"turn": len(turns) - 1, "role": "assistant",
                                    "source": _where_text(draft.sources.get("assistant", (None, "", ""))),
                                    "calls": calls})
    if not turns:
        return None
    case: dict[str, Any] = {"turns": turns, "name": conversation_id, "mcp_servers": inventory.to_servers(copy_values)}
    gaps = _content_gaps(drafts, inventory)
    if gaps is not None:
        case["metadata"] = {CONTENT_MISSING: gaps}
        if explain:
            explanation.append({"turn": None, "role": "content missing", "source": _gap_text(gaps)})
    # the Turns were built for this case (their values copied unless `copy_values=False`): no deep copy
    test_case = ConversationalTestCase.model_validate(
        case, context={OWNED_TURNS: True})
    stored = test_case.model_dump_json(exclude_none=True)  # the hash is of what is stored: one encoding, not two
    digest = hashlib.sha256(stored.encode()).hexdigest()
    return Conversation(
        conversation_id=conversation_id,
        key=key,
        test_case=test_case,
        service_name=next((d.service_name for d in drafts if d.service_name), None),
        agent_name=next((d.agent_name for d in drafts if d.agent_name), None),
        trace_ids=tuple(sorted({t.trace_id for t in traces})),
        first_span_ns=min(t.first_span_ns for t in traces),
        last_span_ns=max(t.last_span_ns for t in traces),
        content_hash=digest,
        explanation=tuple(explanation),
        context_only=context_only,
        test_case_json=stored,
    )
