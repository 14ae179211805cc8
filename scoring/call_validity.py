"""MCP Call Validity: deterministic checks of every MCP call, cheap enough to run on every conversation.

A call is valid when its primitive is advertised by some server (checked per kind, only when some server
lists that kind: traces often hold a `tools/list` and nothing about resources or prompts), its arguments
validate against the tool's `inputSchema` (or the prompt's declared arguments), its result is not an
error, and it does not repeat an identical call of the same task.
Score = valid calls / calls; a conversation without MCP calls is not applicable (score None).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.validators import validator_for

from tracejudge.interactions import unit_indices
from tracejudge.json_encoding import json_bytes
from tracejudge.metric import BaseMetric, Scored, Usage
from tracejudge.test_case import CallToolResult, ConversationalTestCase, MCPServer, Prompt, Tool, inferred_from_call

MAX_SCHEMA_ERRORS = 3


@dataclass(slots=True)
class _Call:
    turn: int
    unit: int
    kind: str
    name: str
    args: dict[str, Any] | None
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


MAX_TEMPLATE_CHARS = 512
MAX_TEMPLATE_WILDCARDS = 4  # templates come from spans anyone can send: keep matching linear-ish


def _template_pattern(template: str) -> re.Pattern[str] | None:
    """An RFC 6570 URI template as a regex: `{var}` matches one path segment, `{+var}` / `{/var*}` more.
    Adjacent expressions merge, and a template too long or with too many wildcards is not matched at all."""
    if len(template) > MAX_TEMPLATE_CHARS:
        return None
    parts: list[str] = []
    pos = 0
    for match in re.finditer(r"\{([^}]*)\}", template):
        literal = template[pos:match.start()]
        expression = match.group(1)
        wildcard = ".*" if expression[:1] in ("+", "#", "/") or expression.endswith("*") else "[^/?#]*"
        if literal:
            parts.append(re.escape(literal))
        if not literal and parts and parts[-1] in (".*", "[^/?#]*"):
            parts[-1] = ".*" if ".*" in (parts[-1], wildcard) else parts[-1]  # {a}{b} matches what one would
        else:
            parts.append(wildcard)
        pos = match.end()
    parts.append(re.escape(template[pos:]))
    if sum(p == ".*" for p in parts) > MAX_TEMPLATE_WILDCARDS:
        return None
    return re.compile("".join(parts))


class _Inventory:
    """What the servers advertise, and for each kind (tools, resources, prompts) whether any list was seen."""

    def __init__(self, servers: list[MCPServer]) -> None:
        self.tools: dict[str, Tool] = {}
        self.resources: set[str] = set()
        self.templates: list[re.Pattern[str]] = []
        self.prompts: dict[str, Prompt] = {}
        for server in servers:
            for tool in server.available_tools:
                self.tools.setdefault(tool.name, tool)
            self.resources.update(r.uri for r in server.available_resources if not inferred_from_call(r))
            self.templates += [p for t in server.available_resource_templates
                               if (p := _template_pattern(t.uri_template)) is not None]
            for prompt in server.available_prompts:
                if not inferred_from_call(prompt):  # only what a listing advertised
                    self.prompts.setdefault(prompt.name, prompt)
        self.known = {"tools": bool(self.tools), "resources": bool(self.resources or self.templates),
                      "prompts": bool(self.prompts)}

    def has_resource(self, uri: str) -> bool:
        return uri in self.resources or any(p.fullmatch(uri) for p in self.templates)


def _checked_validator(schema: dict[str, Any]) -> Any:
    """A validator for the schema, or the reason the schema itself is invalid (a str)."""
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        return exc.message
    return cls(schema)


CACHED_SCHEMAS = 256  # distinct inputSchemas whose checked validators are kept
CACHED_SCHEMA_CHARS = 16 * 1024  # larger schemas are checked every time: the cache stays a few MB at most


@functools.lru_cache(maxsize=CACHED_SCHEMAS)
def _validator_for_json(schema_json: str) -> Any:
    """Checking a schema against its meta-schema costs about 0.5 ms, 50x validating one call's arguments, and
    a server's tools come back in every conversation: each distinct schema is checked once. Built from the JSON
    (a private copy, in the schema's own key order, so errors come out in the same order as before)."""
    return _checked_validator(json.loads(schema_json))


def _validator(schema: dict[str, Any]) -> Any:
    try:
        key = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError):  # not plain JSON: checked every time, as before
        return _checked_validator(schema)
    return _validator_for_json(key) if len(key) <= CACHED_SCHEMA_CHARS else _checked_validator(schema)


ANY_OBJECT = ({"type": "object"}, {})  # schemas every arguments object satisfies (the default a bare tool name gets)


def _schema_violations(args: dict[str, Any], schema: dict[str, Any], call: _Call,
                       validators: dict[int, Any]) -> None:
    """`validators`: this case's, by schema object: a tool called 30 times is looked up once, not 30 times. The
    caller skips the schemas every arguments object satisfies (`ANY_OBJECT`)."""
    validator = validators.get(id(schema))
    if validator is None:
        validator = validators[id(schema)] = _validator(schema)
    if isinstance(validator, str):
        call.notes.append(f"the server's inputSchema is itself invalid ({validator}); arguments not checked")
        return
    errors = sorted(validator.iter_errors(args), key=lambda e: list(map(str, e.absolute_path)))
    for err in errors[:MAX_SCHEMA_ERRORS]:
        where = "/".join(map(str, err.absolute_path))
        call.violations.append(f"arguments do not match inputSchema{f' at {where}' if where else ''}: "
                               f"{err.message}")
    if len(errors) > MAX_SCHEMA_ERRORS:
        call.violations.append(f"... and {len(errors) - MAX_SCHEMA_ERRORS} more schema errors")


def _tool_error(result: CallToolResult | None) -> str | None:
    if result is None:
        return None
    if result.is_error:
        text = " ".join(b.text for b in result.content if b.text).strip()
        return "the call returned an error (isError)" + (f": {text[:200]}" if text else "")
    structured = result.structured_content
    if isinstance(structured, dict) and isinstance(structured.get("error"), dict | str) and structured["error"]:
        return f"the call returned an error object: {json.dumps(structured['error'])[:200]}"
    return None


def _prompt_violations(args: dict[str, Any], prompt: Prompt, call: _Call) -> None:
    declared = {a.name for a in prompt.arguments}
    missing = sorted(a.name for a in prompt.arguments if a.required and a.name not in args)
    unexpected = sorted(set(args) - declared)
    if missing:
        call.violations.append(f"missing required prompt arguments: {', '.join(missing)}")
    if unexpected:
        call.violations.append(f"arguments the prompt does not declare: {', '.join(unexpected)}")


def check_calls(test_case: ConversationalTestCase) -> tuple[list[_Call], dict[str, bool]]:
    """Every MCP call with its violations, in conversation order, and which kinds' lists were known."""
    inventory = _Inventory(test_case.mcp_servers or [])
    calls: list[_Call] = []
    seen: dict[tuple[int, str, str, str], int] = {}
    validators: dict[int, Any] = {}  # the case's schemas live as long as it does: their ids stay theirs
    tools_known = inventory.known["tools"]
    for turn_index, (turn, unit) in enumerate(zip(test_case.turns, unit_indices(test_case.turns), strict=True)):
        for tool in turn.mcp_tools_called or []:
            call = _Call(turn_index, unit, "tool", tool.name, tool.args)
            advertised = inventory.tools.get(tool.name)
            if advertised is None:
                if tools_known:
                    call.violations.append("tool not advertised by any MCP server")
            elif advertised.input_schema not in ANY_OBJECT:  # arguments are always an object: nothing to check
                _schema_violations(tool.args, advertised.input_schema, call, validators)
            if (problem := _tool_error(tool.result)) is not None:
                call.violations.append(problem)
            calls.append(call)
        for resource in turn.mcp_resources_called or []:
            call = _Call(turn_index, unit, "resource", resource.uri, None)
            if inventory.known["resources"] and not inventory.has_resource(resource.uri):
                call.violations.append("resource not advertised by any MCP server")
            calls.append(call)
        for prompt in turn.mcp_prompts_called or []:
            call = _Call(turn_index, unit, "prompt", prompt.name, prompt.args)
            declared = inventory.prompts.get(prompt.name)
            if inventory.known["prompts"] and declared is None:
                call.violations.append("prompt not advertised by any MCP server")
            if declared is not None:
                _prompt_violations(prompt.args, declared, call)
            calls.append(call)
    for call in calls:
        key = (call.unit, call.kind, call.name, _arguments_key(call.args))
        if key in seen:
            call.violations.append(f"repeats the identical call of turn {seen[key]} in the same task")
        else:
            seen[key] = call.turn
    return calls, inventory.known


def _arguments_key(args: dict[str, Any] | None) -> bytes:
    """The arguments as canonical JSON, to find identical calls (the standard library's encoder was a tenth of call
    validity). NaN and the infinities, which no JSON-RPC request can carry, are written as null."""
    return json_bytes(args, sort_keys=True)


class MCPCallValidityMetric(BaseMetric):
    metric_id = "mcp_call_validity"
    display_name = "MCP Call Validity"

    async def _score(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        calls, inventory_known = check_calls(test_case)
        rows = [
            {"turn": c.turn, "kind": c.kind, "name": c.name, "valid": not c.violations,
             "violations": c.violations, "notes": c.notes}
            for c in calls
        ]
        breakdown: dict[str, Any] = {"calls": rows, "inventory_known": inventory_known,
                                     "lists_seen": [kind for kind, seen in inventory_known.items() if seen],
                                     "equation": "valid calls / calls"}
        if not calls:
            return Scored(None, breakdown, reason="No MCP calls in the conversation: not applicable.")
        valid = sum(1 for c in calls if not c.violations)
        lines = [f"{valid} of {len(calls)} MCP calls are valid."]
        unknown = [kind for kind, seen in inventory_known.items() if not seen]
        if len(unknown) == len(inventory_known):
            lines.append("No MCP server inventory was given, so advertisement and schemas were not checked.")
        elif unknown:
            lines.append(f"No server listed its {' or '.join(unknown)}, so those calls were not checked against "
                         "a list.")
        for c in calls:
            lines.extend(f"- turn {c.turn}, {c.kind} {c.name}: {v}" for v in c.violations)
        return Scored(valid / len(calls), breakdown, reason="\n".join(lines))
