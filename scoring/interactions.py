"""Split a conversation into unit interactions (tasks) and render each task's steps for a judge.

A unit starts at a user turn, takes the user turns right after it and every assistant turn until the
next user turn. Unlike DeepEval, every unit with an assistant turn is a task (the common two-turn
shape is not skipped), an assistant's own text is kept beside its MCP calls, and any result shape
renders without crashing. `units="deepeval"` splits as DeepEval does instead, for users who need its numbers.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from typing import Any, Literal

from tracejudge.errors import NoTaskError
from tracejudge.test_case import (
    CallToolResult,
    ConversationalTestCase,
    GetPromptResult,
    MCPServer,
    ReadResourceResult,
    Turn,
)

HIDDEN = "not visible to the user"
Units = Literal["every_unit", "deepeval"]
UNITS: tuple[str, ...] = ("every_unit", "deepeval")


@dataclass(frozen=True)
class Task:
    """One unit interaction: what the user asked and the assistant turns that answered it."""

    index: int
    text: str
    user_turns: tuple[int, ...]
    steps: tuple[dict[str, Any], ...]
    context: tuple[dict[str, Any], ...] = ()

    @property
    def has_mcp_calls(self) -> bool:
        return any(step.get("mcp_calls") for step in self.steps)

    @property
    def answered(self) -> bool:
        return bool(self.steps)

    def scope(self) -> dict[str, Any]:
        """What a verdict on this task concerns: its first and last turn, and the MCP calls made for it (as
        "kind name"), so a failed task points at the turns and calls to look at."""
        turns = [*self.user_turns, *(step["turn"] for step in self.steps)]
        calls = [f"{call['kind']} {call.get('name') or call.get('uri')}"
                 for step in self.steps for call in step.get("mcp_calls", [])]
        return {"turns": [min(turns), max(turns)] if turns else None, "mcp_calls": calls}

    def data(self) -> dict[str, Any]:
        """The task as judge data: the request, the steps and any context before the first user turn."""
        out: dict[str, Any] = {"task": self.text, "steps": list(self.steps)}
        if self.context:
            out["assistant_turns_before_the_task"] = list(self.context)
        return out


def unit_indices(turns: list[Turn]) -> list[int]:
    """The unit interaction each turn belongs to; -1 for assistant turns before the first user turn."""
    units: list[int] = []
    unit, previous_user = -1, False
    for turn in turns:
        is_user = turn.role == "user"
        if is_user and not previous_user:
            unit += 1
        previous_user = is_user
        units.append(unit)
    return units


def deepeval_units(turns: list[Turn]) -> list[list[int]]:
    """DeepEval's unit interactions, as turn indices: a user turn after an assistant turn starts the next unit
    (assistant turns before the first user turn open the first one); a unit that never reaches an assistant turn
    (the trailing user turn) is none."""
    bounds: list[list[int]] = []
    current: list[int] = []
    seen_user = False
    for i, turn in enumerate(turns):
        if current and seen_user and turn.role == "user" and turns[current[-1]].role == "assistant":
            bounds.append(current)
            current = []
        current.append(i)
        seen_user = seen_user or turn.role == "user"
    if current and seen_user and turns[current[-1]].role == "assistant":
        bounds.append(current)
    return bounds


def get_unit_interactions(turns: list[Turn]) -> list[list[Turn]]:
    """The turns of each of DeepEval's unit interactions (its `deepeval.metrics.utils.get_unit_interactions`)."""
    return [[turns[i] for i in unit] for unit in deepeval_units(turns)]


def deepeval_unit_indices(turns: list[Turn]) -> list[int]:
    """The DeepEval unit each turn's task is in; a unit of two turns or fewer is no task for its metrics. -2 marks
    turns outside every task."""
    units = [-2] * len(turns)
    for n, members in enumerate(b for b in deepeval_units(turns) if len(b) > 2):
        for i in members:
            units[i] = n
    return units


def split_tasks(test_case: ConversationalTestCase, units_rule: Units = "every_unit") -> list[Task]:
    """Every unit interaction of the conversation, in order; raises when there is no user turn. With
    `units_rule="deepeval"`, DeepEval's units of more than two turns, and no error when there are none."""
    turns = test_case.turns
    if units_rule == "deepeval":
        return _deepeval_tasks(test_case)
    units = unit_indices(turns)
    if units[-1] < 0:
        raise NoTaskError(
            "the conversation has no user turn, so there is no task to judge; "
            "add the user's messages as turns with role 'user'"
        )
    servers = _ServerIndex(test_case.mcp_servers or [])
    asks: list[list[str]] = [[] for _ in range(units[-1] + 1)]
    user_turns: list[list[int]] = [[] for _ in asks]
    steps: list[list[dict[str, Any]]] = [[] for _ in range(len(asks) + 1)]  # last: before any user turn
    for i, (turn, unit) in enumerate(zip(turns, units, strict=True)):
        if turn.role == "user":
            asks[unit].append(turn.content)
            user_turns[unit].append(i)
        else:
            steps[unit].append(render_step(i, turn, servers))
    tasks = [
        Task(index=n, text="\n".join(asks[n]), user_turns=tuple(user_turns[n]), steps=tuple(steps[n]),
             context=tuple(steps[-1]) if n == 0 else ())
        for n in range(len(asks))
    ]
    return tasks


def _deepeval_tasks(test_case: ConversationalTestCase) -> list[Task]:
    """DeepEval's tasks: the user turns of each unit are the task, its assistant turns the steps."""
    servers = _ServerIndex(test_case.mcp_servers or [])
    units = deepeval_unit_indices(test_case.turns)
    tasks: list[Task] = []
    for n in range(max(units, default=-1) + 1):
        members = [(i, t) for i, (t, u) in enumerate(zip(test_case.turns, units, strict=True)) if u == n]
        tasks.append(Task(
            index=n, text="\n".join(t.content for _, t in members if t.role == "user"),
            user_turns=tuple(i for i, t in members if t.role == "user"),
            steps=tuple(render_step(i, t, servers) for i, t in members if t.role == "assistant")))
    return tasks


class _ServerIndex:
    """Which server advertised a tool, resource or prompt, so a call can name its server."""

    def __init__(self, servers: list[MCPServer]) -> None:
        self._by_key: dict[tuple[str, str], str] = {}
        for server in servers:
            for tool in server.available_tools:
                self._by_key.setdefault(("tool", tool.name), server.server_name)
            for resource in server.available_resources:
                self._by_key.setdefault(("resource", resource.uri), server.server_name)
            for prompt in server.available_prompts:
                self._by_key.setdefault(("prompt", prompt.name), server.server_name)

    def server_of(self, kind: str, name: str) -> str | None:
        return self._by_key.get((kind, name))


def render_step(index: int, turn: Turn, servers: _ServerIndex | None = None) -> dict[str, Any]:
    """One assistant turn as judge data: its MCP calls (hidden from the user) and its reply text."""
    servers = servers or _ServerIndex([])
    calls: list[dict[str, Any]] = []
    for tool in turn.mcp_tools_called or []:
        calls.append(_call("tool", tool.name, tool.args, render_tool_result(tool.result), servers))
    for res in turn.mcp_resources_called or []:
        calls.append(_call("resource", res.uri, None, render_resource_result(res.result), servers))
    for prompt in turn.mcp_prompts_called or []:
        calls.append(_call("prompt", prompt.name, prompt.args, render_prompt_result(prompt.result), servers))
    step: dict[str, Any] = {"turn": index}
    if calls:
        step["mcp_calls"] = calls
    if turn.tools_called:
        step["other_tool_calls"] = [
            {"name": t.name, "input": t.input_parameters, "output": t.output, "visibility": HIDDEN}
            for t in turn.tools_called
        ]
    step["response_to_user"] = turn.content
    return step


def _call(
    kind: str, name: str, args: dict[str, Any] | None, result: dict[str, Any] | None, servers: _ServerIndex
) -> dict[str, Any]:
    call: dict[str, Any] = {"kind": kind}
    server = servers.server_of(kind, name)
    if server is not None:
        call["server"] = server
    call["uri" if kind == "resource" else "name"] = name
    if args is not None:
        call["arguments"] = args
    call["result"] = result if result is not None else "no result recorded"
    call["visibility"] = HIDDEN
    return call


def _block_text(block: Any) -> str:
    """A content block as text: its text, or a short marker for binary and linked content."""
    if block.text is not None:
        return block.text
    if block.type == "resource" and isinstance(block.resource, dict):
        inner = block.resource
        text = inner.get("text")
        return text if isinstance(text, str) else f"[embedded resource {inner.get('uri', '')}]".strip()
    if block.type == "resource_link":
        return f"[resource link {block.uri or block.name or ''}]"
    if block.type in ("image", "audio"):
        return f"[{block.type} {block.mime_type or ''}]".replace(" ]", "]")
    return f"[{block.type} content]"


def render_tool_result(result: CallToolResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    out: dict[str, Any] = {"text": "\n".join(_block_text(b) for b in result.content)}
    if result.structured_content is not None:
        out["structured_content"] = result.structured_content
    out["is_error"] = result.is_error
    return out


def render_resource_result(result: ReadResourceResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    parts = [c.text if c.text is not None else f"[binary {c.mime_type or 'data'} {c.uri}]" for c in result.contents]
    return {"text": "\n".join(parts)}


def render_prompt_result(result: GetPromptResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    out: dict[str, Any] = {"messages": [{"role": m.role, "text": _block_text(m.content)} for m in result.messages]}
    if result.description:
        out["description"] = result.description
    return out


def render_tasks_text(tasks: list[Task]) -> str:
    """Tasks and steps as readable text, for `verbose_mode` and `verbose_logs`."""
    lines: list[str] = []
    for task in tasks:
        lines.append(f"Task {task.index + 1}: {task.text}")
        if not task.steps:
            lines.append("  (no assistant response)")
        lines.extend(textwrap.indent(step_text(step), "  ") for step in task.steps)
    return "\n".join(lines)


def step_text(step: dict[str, Any]) -> str:
    """One rendered step as readable text: its MCP calls (hidden from the user) and its reply."""
    lines = [f"Step (turn {step.get('turn', '?')}):"]
    for call in step.get("mcp_calls", []):
        target = call.get("name") or call.get("uri")
        where = f" on {call['server']}" if "server" in call else ""
        lines.append(f"  [{HIDDEN}] MCP {call['kind']} {target}{where}")
        if "arguments" in call:
            lines.append(f"    arguments: {json.dumps(call['arguments'], ensure_ascii=False)}")
        lines.append(f"    result: {json.dumps(call['result'], ensure_ascii=False)}")
    if step.get("response_to_user"):
        lines.append(f"  response to user: {step['response_to_user']}")
    return "\n".join(lines)


def conversation_data(test_case: ConversationalTestCase, include_inventory: bool) -> dict[str, Any]:
    """The whole conversation as one judge state: every turn with its MCP calls, and the servers if asked."""
    servers = _ServerIndex(test_case.mcp_servers or [])
    turns = [
        {"turn": i, "role": "user", "content": turn.content} if turn.role == "user"
        else {"role": "assistant", **render_step(i, turn, servers)}
        for i, turn in enumerate(test_case.turns)
    ]
    state: dict[str, Any] = {"turns": turns}
    if include_inventory:
        state["mcp_servers"] = inventory_data(test_case.mcp_servers)
    return state


def inventory_data(servers: list[MCPServer] | None) -> list[dict[str, Any]]:
    """Every server's tools, resources and prompts, each under its server's name."""
    return [
        {
            "server_name": s.server_name,
            "tools": [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in s.available_tools
            ],
            "resources": [
                {"uri": r.uri, "name": r.name, "description": r.description} for r in s.available_resources
            ],
            "prompts": [
                {
                    "name": p.name,
                    "description": p.description,
                    "arguments": [a.model_dump(exclude_none=True) for a in p.arguments],
                }
                for p in s.available_prompts
            ],
        }
        for s in servers or []
    ]
