"""MCP Call Validity: deterministic checks of every MCP call, cheap enough to run on every conversation.

A call is valid when its primitive is advertised by some server (checked only when the test case lists
servers), its arguments validate against the tool's `inputSchema` (or the prompt's declared
arguments), its result is not an error, and it does not repeat an identical call of the same task.
Score = valid calls / calls; a conversation without MCP calls is not applicable (score None).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.validators import validator_for

from scoring.interactions import unit_indices
from scoring.metric import BaseMetric, Scored, Usage
from scoring.test_case import CallToolResult, ConversationalTestCase, MCPServer, Prompt, Tool

MAX_SCHEMA_ERRORS = 3


@dataclass
class _Call:
    turn: int
    unit: int
    kind: str
    name: str
    args: dict[str, Any] | None
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Inventory:
    def __init__(self, servers: list[MCPServer]) -> None:
        self.known = bool(servers)
        self.tools: dict[str, Tool] = {}
        self.resources: set[str] = set()
        self.prompts: dict[str, Prompt] = {}
        for server in servers:
            for tool in server.available_tools:
                self.tools.setdefault(tool.name, tool)
            self.resources.update(r.uri for r in server.available_resources)
            for prompt in server.available_prompts:
                self.prompts.setdefault(prompt.name, prompt)


def _schema_violations(args: dict[str, Any], schema: dict[str, Any], call: _Call) -> None:
    try:
        cls = validator_for(schema, default=Draft202012Validator)
        cls.check_schema(schema)
    except SchemaError as exc:
        call.notes.append(f"the server's inputSchema is itself invalid ({exc.message}); arguments not checked")
        return
    errors = sorted(cls(schema).iter_errors(args), key=lambda e: list(map(str, e.absolute_path)))
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


def check_calls(test_case: ConversationalTestCase) -> tuple[list[_Call], bool]:
    """Every MCP call with its violations, in conversation order, and whether an inventory was known."""
    inventory = _Inventory(test_case.mcp_servers or [])
    calls: list[_Call] = []
    seen: dict[tuple[int, str, str, str], int] = {}
    for turn_index, (turn, unit) in enumerate(zip(test_case.turns, unit_indices(test_case.turns), strict=True)):
        for tool in turn.mcp_tools_called or []:
            call = _Call(turn_index, unit, "tool", tool.name, tool.args)
            advertised = inventory.tools.get(tool.name)
            if inventory.known and advertised is None:
                call.violations.append("tool not advertised by any MCP server")
            if advertised is not None:
                _schema_violations(tool.args, advertised.input_schema, call)
            if (problem := _tool_error(tool.result)) is not None:
                call.violations.append(problem)
            calls.append(call)
        for resource in turn.mcp_resources_called or []:
            call = _Call(turn_index, unit, "resource", resource.uri, None)
            if inventory.known and resource.uri not in inventory.resources:
                call.violations.append("resource not advertised by any MCP server")
            calls.append(call)
        for prompt in turn.mcp_prompts_called or []:
            call = _Call(turn_index, unit, "prompt", prompt.name, prompt.args)
            declared = inventory.prompts.get(prompt.name)
            if inventory.known and declared is None:
                call.violations.append("prompt not advertised by any MCP server")
            if declared is not None:
                _prompt_violations(prompt.args, declared, call)
            calls.append(call)
    for call in calls:
        key = (call.unit, call.kind, call.name, json.dumps(call.args, sort_keys=True, default=str))
        if key in seen:
            call.violations.append(f"repeats the identical call of turn {seen[key]} in the same task")
        else:
            seen[key] = call.turn
    return calls, inventory.known


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
                                     "equation": "valid calls / calls"}
        if not calls:
            return Scored(None, breakdown, reason="No MCP calls in the conversation: not applicable.")
        valid = sum(1 for c in calls if not c.violations)
        lines = [f"{valid} of {len(calls)} MCP calls are valid."]
        if not inventory_known:
            lines.append("No MCP server inventory was given, so advertisement and schemas were not checked.")
        for c in calls:
            lines.extend(f"- turn {c.turn}, {c.kind} {c.name}: {v}" for v in c.violations)
        return Scored(valid / len(calls), breakdown, reason="\n".join(lines))
