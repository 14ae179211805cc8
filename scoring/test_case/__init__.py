"""The conversational test-case model, in DeepEval's field names, that every stage exchanges.

Two kinds of model live here. Test-case models (`Turn`, `ConversationalTestCase`, the MCP call records)
use DeepEval's snake_case names and also accept camelCase. MCP protocol shapes (`Tool`,
`CallToolResult`, ...) are the MCP JSON: they dump in camelCase (`inputSchema`, `structuredContent`,
`isError`) and keep unknown protocol fields, so nothing a server sent is lost. Live `mcp.types`
objects (or another library's pydantic objects of the same class name and JSON) are validated as their JSON
and kept as given, as DeepEval keeps them; metrics read a `normalized()` copy. `mcp` is not required.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
import warnings
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AliasChoices,
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapSerializer,
    WrapValidator,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from tracejudge.errors import InvalidTestCaseError

__all__ = [
    "CallToolResult",
    "ContentBlock",
    "ConversationalTestCase",
    "GetPromptResult",
    "MCPPromptCall",
    "MCPResourceCall",
    "MCPServer",
    "MCPToolCall",
    "Prompt",
    "PromptArgument",
    "PromptMessage",
    "RetrievedContextData",
    "ReadResourceResult",
    "Resource",
    "ResourceContents",
    "Tool",
    "ToolCall",
    "Turn",
    "get_available_mcp_tool_names",
    "load_test_case",
    "normalize_mcp_servers",
]


class _Model(BaseModel):
    """Accepts another library's pydantic object (e.g. `mcp.types.Tool`) as its protocol JSON, and any other
    object by its public attributes (a `SimpleNamespace(name=..., description=...)`, another SDK's tool)."""

    @model_validator(mode="before")
    @classmethod
    def _accept_foreign_models(cls, value: Any) -> Any:
        if value.__class__ is dict:  # nearly always (the mapping builds every case from dicts): nothing to convert
            return value
        if isinstance(value, BaseModel) and not isinstance(value, cls):
            return value.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not isinstance(value, dict | BaseModel | str | bytes | list | tuple) and hasattr(value, "__dict__"):
            return {k: v for k, v in vars(value).items() if not k.startswith("_") and v is not None}
        return value


class _CaseModel(_Model):
    """A test-case record: snake_case names, camelCase accepted, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        validate_by_name=True,
        validate_by_alias=True,
        loc_by_alias=False,  # errors name the snake_case field, whichever spelling came in
        extra="forbid",
    )


class _ProtocolModel(_Model):
    """An MCP protocol shape: camelCase on the wire, snake_case in Python, unknown fields kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
    )


# --- MCP protocol shapes ------------------------------------------------------------------------------

# The `_meta` key of an inventory entry the mapping inferred from a call (a resource read, a prompt got) because no
# listing of it was recorded: the server has it, but it was not seen advertised (call validity checks no call
# against such an entry)
INFERRED_FROM_CALL = "tracejudge/inferred_from_call"


def inferred_from_call(item: BaseModel) -> bool:
    meta = (item.model_extra or {}).get("_meta")
    return isinstance(meta, dict) and INFERRED_FROM_CALL in meta


class ContentBlock(_ProtocolModel):
    """One content block: text, image, audio, resource (embedded) or resource_link, or a future type."""

    type: str
    text: str | None = None
    data: str | None = None
    mime_type: str | None = None
    uri: str | None = None
    name: str | None = None
    resource: dict[str, Any] | None = None



class CallToolResult(_ProtocolModel):
    content: list[ContentBlock] = Field(default_factory=list)
    structured_content: Any = None
    is_error: bool = False

    @field_validator("content", "is_error", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: Any) -> Any:
        if value is None:
            return [] if info.field_name == "content" else False
        return value


class ResourceContents(_ProtocolModel):
    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: str | None = None


class ReadResourceResult(_ProtocolModel):
    contents: list[ResourceContents] = Field(default_factory=list)


class PromptMessage(_ProtocolModel):
    role: str
    content: ContentBlock


class GetPromptResult(_ProtocolModel):
    description: str | None = None
    messages: list[PromptMessage] = Field(default_factory=list)


class Tool(_ProtocolModel):
    name: str
    title: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None


class Resource(_ProtocolModel):
    uri: str
    name: str | None = None
    description: str | None = None
    mime_type: str | None = None


class ResourceTemplate(_ProtocolModel):
    uri_template: str
    name: str | None = None
    description: str | None = None
    mime_type: str | None = None


class PromptArgument(_ProtocolModel):
    name: str
    description: str | None = None
    required: bool | None = None


class Prompt(_ProtocolModel):
    name: str
    description: str | None = None
    arguments: list[PromptArgument] = Field(default_factory=list)


# --- live objects of other libraries, kept as given ----------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def _is_given(value: Any) -> bool:
    """Another library's pydantic object (an `mcp.types.Tool`, a `CallToolResult`): kept as the user gave it."""
    return isinstance(value, BaseModel) and not isinstance(value, _Model)


def _keep_given(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    checked = handler(value)  # validated as its JSON, so a bad object is refused as a bad dict would be
    # kept only when it is the same protocol shape (an mcp.types.Tool as a tool, not a Resource that happens to fit)
    return value if _is_given(value) and type(value).__name__ == type(checked).__name__ else checked


def _dump_as(model: type[M]) -> Callable[[Any, SerializerFunctionWrapHandler, SerializationInfo], Any]:
    def dump(value: Any, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        # dumped as the JSON of our model, so a case round-trips to the same JSON however it was built
        return handler(model.model_validate(value) if _is_given(value) else value)
    return dump


def _ours(model: type[M], value: Any) -> Any:
    """A kept object of another library as tracejudge's model; anything else as it is."""
    return model.model_validate(value) if _is_given(value) else value


def _kept(model: type[M]) -> Any:
    """`model`, or a live object of another library with the same JSON, kept as it was given."""
    return Annotated[model, WrapValidator(_keep_given), WrapSerializer(_dump_as(model))]


GivenTool = _kept(Tool)
GivenResource = _kept(Resource)
GivenResourceTemplate = _kept(ResourceTemplate)
GivenPrompt = _kept(Prompt)
GivenCallToolResult = _kept(CallToolResult)
GivenReadResourceResult = _kept(ReadResourceResult)
GivenGetPromptResult = _kept(GetPromptResult)

_LISTINGS = {"available_tools": "tools", "available_resources": "resources",
             "available_resource_templates": "resource_templates", "available_prompts": "prompts"}


# --- test-case records --------------------------------------------------------------------------------


class MCPServer(_CaseModel):
    """What one MCP server advertised: the inventory the agent chose from."""

    server_name: str
    transport: Literal["stdio", "sse", "streamable-http"] | None = None
    available_tools: list[GivenTool] = Field(default_factory=list)
    available_resources: list[GivenResource] = Field(default_factory=list)
    available_resource_templates: list[GivenResourceTemplate] = Field(default_factory=list)
    available_prompts: list[GivenPrompt] = Field(default_factory=list)

    @field_validator(*_LISTINGS, mode="before")
    @classmethod
    def _listing_results(cls, value: Any, info: Any) -> Any:
        """A `ListToolsResult` (what `session.list_tools()` returns) is taken as its list of tools; None as none;
        a tool or prompt without a name is left out, as DeepEval leaves it out (with a warning here)."""
        if value is None:
            return []
        if isinstance(value, list | tuple) and info.field_name in ("available_tools", "available_prompts"):
            named = [item for item in value if _name_of(item)]
            if len(named) < len(value):
                warnings.warn(f"{info.field_name}: {len(value) - len(named)} entries without a name were left out",
                              UserWarning, stacklevel=2)
            value = named
        attribute = _LISTINGS[info.field_name]
        for name in (attribute, to_camel(attribute)):
            listed = getattr(value, name, None)
            if isinstance(listed, list | tuple) and not isinstance(value, list | tuple | dict):
                if getattr(value, "next_cursor", None) or getattr(value, "nextCursor", None):
                    warnings.warn(f"{info.field_name} got one page of a paginated listing (next_cursor is set), so "
                                  "later pages are missing: use `await MCPServer.from_mcp(session)`, which reads "
                                  "every page", UserWarning, stacklevel=2)
                return list(listed)
        return value

    @classmethod
    async def from_mcp(cls, source: Any, *, server_name: str | None = None,
                       transport: Literal["stdio", "sse", "streamable-http"] | None = None) -> MCPServer:
        """What a live MCP server advertises, read through the MCP SDK: a connected `ClientSession` or
        `Client`, or a server object (`MCPServer`/`FastMCP`). Listings the server does not support stay empty."""
        listed: dict[str, list[Any]] = {}
        for field, method in (("available_tools", "list_tools"), ("available_resources", "list_resources"),
                              ("available_resource_templates", "list_resource_templates"),
                              ("available_prompts", "list_prompts")):
            call = getattr(source, method, None)
            if call is not None:
                listed[field] = await _every_page(call, _LISTINGS[field])
        name = server_name or _server_name(source)
        if name is None:
            raise ValueError("the MCP server's name is unknown: pass server_name=")
        return cls(server_name=name, transport=transport, **listed)


class _NamedCall(_CaseModel):
    """A call of a named primitive with arguments (tools and prompts); null arguments mean none."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("args", mode="before")
    @classmethod
    def _null_args(cls, value: Any) -> Any:
        return {} if value is None else value


class MCPToolCall(_NamedCall):
    result: GivenCallToolResult | None = None


class MCPResourceCall(_CaseModel):
    uri: str
    result: GivenReadResourceResult | None = None


class MCPPromptCall(_NamedCall):
    result: GivenGetPromptResult | None = None


METHOD_NOT_FOUND = -32601  # JSON-RPC's answer when a server lacks a capability (no prompts, say)


MAX_PAGES = 10_000  # a server that keeps answering with new cursors is stopped here, not followed forever


def _page(call: Callable[..., Any], cursor: str | None) -> Any:
    """One page of a listing: `Client` takes `cursor=`, mcp 2.x's `ClientSession` `params=` with the cursor."""
    if cursor is None:
        return call()
    parameters = inspect.signature(call).parameters
    if "cursor" in parameters:
        return call(cursor=cursor)
    if "params" in parameters:
        from mcp.types import PaginatedRequestParams  # only a live MCP SDK session gets here

        return call(params=PaginatedRequestParams(cursor=cursor))
    raise TypeError(f"{getattr(call, '__qualname__', call)} takes no cursor, so the listing's later pages "
                    "cannot be read")


async def _every_page(call: Callable[..., Any], attribute: str) -> list[Any]:
    """Every item of an MCP listing, following `next_cursor` through the pages a session returns; a server
    object's listing is a plain list. A capability the server lacks is an empty listing."""
    items: list[Any] = []
    cursor: str | None = None
    seen: set[str] = set()
    while True:
        try:
            answer = await _page(call, cursor)
        except Exception as exc:
            code = getattr(exc, "code", None)
            if getattr(getattr(exc, "error", None), "code", code) == METHOD_NOT_FOUND:
                return items
            raise
        if isinstance(answer, list | tuple):
            return [*items, *answer]
        items += list(getattr(answer, attribute, None) or getattr(answer, to_camel(attribute), None) or [])
        cursor = getattr(answer, "next_cursor", None) or getattr(answer, "nextCursor", None)
        if not cursor:
            return items
        if cursor in seen or len(seen) >= MAX_PAGES:
            raise ValueError(f"the MCP server's {attribute} listing does not end (cursor {cursor!r} came back, or "
                             f"more than {MAX_PAGES} pages); pass the listing to MCPServer yourself")
        seen.add(cursor)


def _is_sdk_server(value: Any) -> bool:
    """The MCP SDK's own server object (`mcp.server.MCPServer`, v1's `FastMCP`): an async `list_tools`."""
    return (type(value).__module__.startswith("mcp.server")
            and inspect.iscoroutinefunction(getattr(value, "list_tools", None)))


def _server_record(server: Any) -> Any:
    """An MCP SDK server object as what it advertises, as DeepEval takes it; a value that cannot be a server is
    DeepEval's TypeError."""
    if server is None or isinstance(server, str | bytes | int | float):
        raise TypeError(f"'mcp_servers' must be a list of MCPServer, dict or MCP SDK server objects, "
                        f"got {type(server)}")
    if not _is_sdk_server(server):
        return server
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()  # not asyncio.run: that would leave the thread without a current loop
        try:
            return loop.run_until_complete(MCPServer.from_mcp(server))
        finally:
            loop.close()
    # reading it on another loop could break a server bound to this one, and blocking this loop stalls it
    raise TypeError("an MCP SDK server object in 'mcp_servers' is read synchronously, which cannot be done inside "
                    "a running event loop: pass `await MCPServer.from_mcp(server)` instead")


def _name_of(item: Any) -> Any:
    return item.get("name") if isinstance(item, dict) else getattr(item, "name", None)


def get_available_mcp_tool_names(servers: list[Any]) -> set[str]:
    """Every tool name the servers advertise (DeepEval's helper of the same name)."""
    return {name for server in normalize_mcp_servers(servers) for tool in server.available_tools
            if (name := _name_of(tool))}


def normalize_mcp_servers(servers: list[Any]) -> list[MCPServer]:
    """The servers as `MCPServer`s: one already is kept as it is, an MCP SDK server is read for what it
    advertises, a dict is validated (DeepEval's helper of the same name)."""
    out = []
    for server in servers:
        record = server if isinstance(server, MCPServer) else _server_record(server)
        out.append(record if isinstance(record, MCPServer) else MCPServer.model_validate(record))
    return out


def _server_name(source: Any) -> str | None:
    """The name an SDK object knows its server by: a server's `name`, a client's `server_info.name`."""
    for path in (("name",), ("server_info", "name"), ("initialize_result", "server_info", "name"),
                 ("initialize_result", "serverInfo", "name")):
        value: Any = source
        for attribute in path:
            value = getattr(value, attribute, None)
            if callable(value) and not isinstance(value, str):
                value = None
        if isinstance(value, str) and value:
            return value
    return None


class ToolCall(_CaseModel):
    """A non-MCP tool (function) call, in DeepEval's shape: equal by value, hashable (DeepEval's users put them
    in sets), and shown as DeepEval shows it."""

    name: str
    input_parameters: dict[str, Any] | None = None
    output: Any = None
    type: str | None = None
    description: str | None = None
    reasoning: str | None = None

    def __eq__(self, other: object) -> bool:
        """The same call: name, arguments and output (DeepEval's equality; type, description and reasoning are
        about the call, not which call it was)."""
        if not isinstance(other, ToolCall):
            return NotImplemented
        return (self.name, self.input_parameters, self.output) == (other.name, other.input_parameters, other.output)

    def __hash__(self) -> int:
        return hash((self.name, _hashable(self.input_parameters), _hashable(self.output)))

    def __repr__(self) -> str:
        shown = [f'name="{self.name}"']
        shown += [f'{key}="{getattr(self, key)}"' for key in ("description", "reasoning", "type")
                  if getattr(self, key) is not None]
        shown += [f"{key}={getattr(self, key)!r}" for key in ("input_parameters", "output")
                  if getattr(self, key) is not None]
        return f"ToolCall({', '.join(shown)})"


def _hashable(value: Any) -> Any:
    """A hashable stand-in for a value that agrees with equality: numbers in one form (1, 1.0 and True are
    equal in Python), containers recursively, an object JSON cannot hold by its type's name (two equal objects
    must hash alike; equality tells apart those that only share a type)."""
    if isinstance(value, bool | int | float):
        return int(value) if float(value).is_integer() else float(value)
    if isinstance(value, str | None):
        return value
    if isinstance(value, dict):
        return frozenset((_hashable(k), _hashable(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return type(value).__qualname__


class _AdditionalMetadata:
    """DeepEval's older name for `metadata`, still read and set by its users' code (with its warning)."""

    metadata: dict[str, Any] | None

    @property
    def additional_metadata(self) -> dict[str, Any] | None:
        """DeepEval's older name for `metadata`."""
        warnings.warn("'additional_metadata' is deprecated, use 'metadata'", DeprecationWarning, stacklevel=2)
        return self.metadata

    @additional_metadata.setter
    def additional_metadata(self, value: dict[str, Any] | None) -> None:
        warnings.warn("'additional_metadata' is deprecated, use 'metadata'", DeprecationWarning, stacklevel=2)
        self.metadata = value


class RetrievedContextData(BaseModel):
    """A piece of retrieved context with where it came from (DeepEval's); in a test case's JSON it is the text
    `source: context`."""

    context: str
    source: str

    @model_serializer
    def _as_text(self) -> str:
        return f"{self.source}: {self.context}"


FROM_RECORDS = "tracejudge.from_records"  # validation context key: data read from files or traces (nulls allowed)


class Turn(_AdditionalMetadata, _CaseModel):
    role: Literal["user", "assistant"]
    content: str = ""
    user_id: str | None = None
    latency_ms: float | None = None
    retrieval_context: list[str | RetrievedContextData] | None = None
    tools_called: list[ToolCall] | None = None
    mcp_tools_called: list[MCPToolCall] | None = None
    mcp_resources_called: list[MCPResourceCall] | None = None
    mcp_prompts_called: list[MCPPromptCall] | None = None
    metadata: dict[str, Any] | None = Field(
        None, validation_alias=AliasChoices("metadata", "additional_metadata", "additionalMetadata"))

    @field_validator("content", mode="before")
    @classmethod
    def _null_content(cls, value: Any, info: ValidationInfo) -> Any:
        """`None` is refused, as DeepEval refuses it; a file or trace read by `load_test_case` may carry it (an
        assistant message that only calls tools), and there it is the empty string."""
        if value is None and (info.context or {}).get(FROM_RECORDS):
            return ""
        return value

    @property
    def has_mcp_calls(self) -> bool:
        return bool(self.mcp_tools_called or self.mcp_resources_called or self.mcp_prompts_called)


OWNED_TURNS = "tracejudge.owned_turns"  # validation context key: the Turns given are the case's own, not copied
MULTIMODAL_PLACEHOLDER = re.compile(r"\[DEEPEVAL:(?:IMAGE|PDF):.*?\]")  # DeepEval's placeholder for an image in text


class ConversationalTestCase(_AdditionalMetadata, _CaseModel):
    """DeepEval's conversational test case: its fields and spellings, a copy of every turn given, and DeepEval's
    `TypeError`s for what its users test (empty turns, a turn that is not a Turn or dict, a bad context)."""

    turns: list[Turn]
    scenario: str | None = None
    expected_outcome: str | None = None
    user_description: str | None = None
    chatbot_role: str | None = None
    context: list[str] | None = None
    name: str | None = None
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = Field(
        None, validation_alias=AliasChoices("metadata", "additional_metadata", "additionalMetadata"))
    comments: str | None = None
    flaky: bool = False
    multimodal: bool = False
    mcp_servers: list[MCPServer] | None = None

    @model_validator(mode="before")
    @classmethod
    def _deepeval_input(cls, data: Any, info: ValidationInfo) -> Any:
        """Turns are copied (changing a Turn afterwards does not change the case), unless the caller says it hands
        them over (`context={OWNED_TURNS: True}`: the mapping, whose Turns nothing else holds); wrong shapes are
        TypeErrors."""
        if not isinstance(data, dict):
            return data
        turns = data.get("turns")
        if isinstance(turns, list | tuple):
            if not turns:
                raise TypeError("'turns' must not be empty: a conversational test case needs at least one turn")
            for turn in turns:
                if not isinstance(turn, Turn | dict):
                    raise TypeError(f"'turns' must be a list of Turn or dict, got {type(turn)}")
            if not (info.context or {}).get(OWNED_TURNS):
                data = {**data, "turns": [copy.deepcopy(t) if isinstance(t, Turn) else t for t in turns]}
        context = data.get("context")
        if context is not None and (not isinstance(context, list) or not all(isinstance(c, str) for c in context)):
            raise TypeError("'context' must be None or a list of strings")
        servers = data.get("mcp_servers")
        if isinstance(servers, list | tuple):
            data = {**data, "mcp_servers": [_server_record(server) for server in servers]}
        return data

    def normalized(self) -> ConversationalTestCase:
        """This case with every live object of another library as tracejudge's model (what metrics read);
        the case itself when it holds none."""
        if not any(_is_given(v) for v in self._given_candidates()):
            return self
        servers = None if self.mcp_servers is None else [server.model_copy(update={
            field: [_ours(model, item) for item in getattr(server, field)]
            for field, model in (("available_tools", Tool), ("available_resources", Resource),
                                 ("available_resource_templates", ResourceTemplate), ("available_prompts", Prompt))
        }) for server in self.mcp_servers]
        turns = [turn.model_copy(update={
            field: None if calls is None else [call.model_copy(update={"result": _ours(model, call.result)})
                                               for call in calls]
            for field, model in (("mcp_tools_called", CallToolResult), ("mcp_resources_called", ReadResourceResult),
                                 ("mcp_prompts_called", GetPromptResult))
            for calls in (getattr(turn, field),)
        }) for turn in self.turns]
        return self.model_copy(update={"turns": turns, "mcp_servers": servers})

    def _given_candidates(self) -> list[Any]:
        values: list[Any] = []
        for server in self.mcp_servers or []:
            values += [*server.available_tools, *server.available_resources,
                       *server.available_resource_templates, *server.available_prompts]
        for turn in self.turns:
            values += [c.result for c in (*(turn.mcp_tools_called or ()), *(turn.mcp_resources_called or ()),
                                          *(turn.mcp_prompts_called or ()))]
        return values

    @model_validator(mode="after")
    def _set_multimodal(self) -> ConversationalTestCase:
        texts = [self.scenario, self.expected_outcome, self.user_description, *(t.content for t in self.turns)]
        if not self.multimodal and any(text and MULTIMODAL_PLACEHOLDER.search(text) for text in texts):
            self.multimodal = True
        return self


def _describe_location(loc: tuple[int | str, ...], data: Any) -> str:
    """Say where an error is in words: 'turn 2 (assistant), mcp_tools_called[0].args'."""
    parts: list[str] = []
    i = 0
    if len(loc) >= 2 and loc[0] == "turns" and isinstance(loc[1], int):
        role = None
        if isinstance(data, dict):
            turns = data.get("turns")
            if isinstance(turns, list) and loc[1] < len(turns) and isinstance(turns[loc[1]], dict):
                role = turns[loc[1]].get("role")
        parts.append(f"turn {loc[1]}" + (f" ({role})" if isinstance(role, str) else ""))
        i = 2
    path = ""
    for item in loc[i:]:
        path += f"[{item}]" if isinstance(item, int) else (f".{item}" if path else str(item))
    if path:
        parts.append(path)
    return ", ".join(parts) or "test case"


def load_test_case(data: dict[str, Any] | str | bytes | ConversationalTestCase | LLMTestCase
                   ) -> ConversationalTestCase:
    """Validate a test case from a dict or JSON text, with errors that name the turn and field; a single-turn
    `LLMTestCase` is its one-task conversation."""
    if isinstance(data, LLMTestCase):
        return data.as_conversation().normalized()
    if isinstance(data, ConversationalTestCase):
        return data.normalized()
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise InvalidTestCaseError([f"not valid JSON: {exc}"]) from exc
    try:
        return ConversationalTestCase.model_validate(data, context={FROM_RECORDS: True})
    except ValidationError as exc:
        problems = [f"{_describe_location(err['loc'], data)}: {err['msg']}" for err in exc.errors()]
        raise InvalidTestCaseError(problems) from exc
    except TypeError as exc:  # DeepEval's errors for the shape of `turns` and `context`
        raise InvalidTestCaseError([str(exc)]) from exc


# DeepEval's other test-case names, under the paths its users import them from (the submodules mirror
# deepeval.test_case.llm_test_case, .conversational_test_case and .mcp)
from tracejudge.test_case import conversational_test_case as _multi  # noqa: E402
from tracejudge.test_case import llm_test_case as _single  # noqa: E402
from tracejudge.test_case.conversational_test_case import MultiTurnParams  # noqa: E402
from tracejudge.test_case.llm_test_case import (  # noqa: E402
    LLMTestCase,
    MLLMImage,
    SingleTurnParams,
    ToolCallParams,
    ToolCallType,
)

__all__ += ["LLMTestCase", "MLLMImage", "MultiTurnParams", "SingleTurnParams", "ToolCallParams", "ToolCallType"]


def __getattr__(name: str) -> Any:
    """DeepEval's older names (`LLMTestCaseParams`, `TurnParams`), with its DeprecationWarning."""
    for module in (_single, _multi):
        if name in module.DEPRECATED:
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
