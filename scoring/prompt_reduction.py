"""Fit judge data into a token budget by a fixed, deterministic series of reductions.

Each level is applied to the original data, and the first that fits is used, so the same conversation and
budget always give the same prompt. In order: long values (tool results, arguments, turns) are cut to head
and tail with an explicit `[... N characters omitted ...]` marker; the server inventory keeps the primitives
the data calls in full and lists the others by name and one-line description, then by name only; the middle
steps of a very long conversation are replaced by a marker. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

INVENTORY_KEY = "mcp_servers"
SEQUENCE_KEYS = ("steps", "turns")
PAYLOAD_KEYS = frozenset({"result", "arguments", "structured_content", "input", "output", "other_tool_calls"})
ONE_LINE = 160


@dataclass(frozen=True)
class Level:
    """One reduction: values cut to `cap` characters, inventory level 0-3, steps kept at each end."""

    cap: int
    inventory: int = 0
    keep_steps: int | None = None


LEVELS: tuple[Level, ...] = (
    Level(20_000), Level(8_000), Level(3_000),
    Level(3_000, 1), Level(3_000, 2), Level(1_000, 2), Level(400, 2),
    Level(400, 2, 16), Level(400, 2, 8), Level(300, 3, 4), Level(200, 3, 2), Level(200, 3, 1),
)


@dataclass(frozen=True)
class Reduction:
    """What was reduced to make a prompt fit; goes into the score breakdown."""

    tokens_before: int
    tokens_after: int
    budget: int
    tokenizer: str
    value_cap_chars: int | None
    values_cut: int
    characters_omitted: int
    inventory: str | None
    steps_omitted: int
    fits: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cut_middle(text: str, keep: int) -> tuple[str, int]:
    """`text` with its middle replaced by a marker when longer than `keep` characters; and how many went."""
    if len(text) <= keep:
        return text, 0
    head = keep // 2
    tail = keep - head
    omitted = len(text) - keep
    return f"{text[:head]}\n[... {omitted:,} characters omitted ...]\n{text[len(text) - tail:]}", omitted


def reduce_to_fit(data: dict[str, Any], measure: Callable[[dict[str, Any]], int], budget: int,
                  tokenizer: str) -> tuple[dict[str, Any], Reduction | None]:
    """`data` itself when `measure(data) <= budget`, else the first reduction level that fits (or the last)."""
    before = measure(data)
    if before <= budget:
        return data, None
    called = _called(data)
    reduced, tokens, stats = data, before, _Stats()
    # a large budget first gets gentle cuts in proportion to it (about 3 characters a token), so a 500 KB result
    # keeps as much as a 128k window holds rather than the fixed 20,000 characters
    gentle = [Level(cap) for cap in (budget * 3 // 2, budget * 3 // 4, budget * 3 // 8) if cap > LEVELS[0].cap]
    for level in (*gentle, *LEVELS):
        stats = _Stats()
        reduced = _apply(data, level, called, stats)
        tokens = measure(reduced)
        if tokens <= budget:
            break
    return reduced, Reduction(before, tokens, budget, tokenizer, stats.cap, stats.cut, stats.omitted,
                              stats.inventory, stats.steps_omitted, tokens <= budget)


class _Stats:
    def __init__(self) -> None:
        self.cap: int | None = None
        self.cut = 0
        self.omitted = 0
        self.inventory: str | None = None
        self.steps_omitted = 0


def _apply(data: dict[str, Any], level: Level, called: set[tuple[str, str]], stats: _Stats) -> dict[str, Any]:
    stats.cap = level.cap
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == INVENTORY_KEY and isinstance(value, list):
            out[key] = _inventory(value, level.inventory, called, stats)
            continue
        if key in SEQUENCE_KEYS and isinstance(value, list) and level.keep_steps is not None:
            value = _keep_ends(value, level.keep_steps, stats)
        out[key] = _cut(value, level.cap, key in PAYLOAD_KEYS, stats) if level.cap is not None else value
    return out


def _keep_ends(items: list[Any], keep: int, stats: _Stats) -> list[Any]:
    if len(items) <= 2 * keep + 1:
        return items
    dropped = len(items) - 2 * keep
    stats.steps_omitted = dropped
    return [*items[:keep], {"omitted": f"[... {dropped} steps omitted ...]"}, *items[-keep:]]


def _cut(value: Any, cap: int, payload: bool, stats: _Stats) -> Any:
    """Strings over `cap` cut; a payload container still over twice `cap` as JSON (many small values, such as
    query rows) becomes its JSON text, cut."""
    if isinstance(value, str):
        text, omitted = cut_middle(value, cap)
        if omitted:
            stats.cut += 1
            stats.omitted += omitted
        return text
    if isinstance(value, dict):
        new: Any = {k: _cut(v, cap, payload or k in PAYLOAD_KEYS, stats) for k, v in value.items()}
    elif isinstance(value, list):
        new = [_cut(v, cap, payload, stats) for v in value]
    else:
        return value
    if payload and new:
        text = json.dumps(new, ensure_ascii=False, default=str)
        if len(text) > 2 * cap:
            cut, omitted = cut_middle(text, cap)
            stats.cut += 1
            stats.omitted += omitted
            return cut
    return new


def _called(data: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, name or uri) of every MCP call in the data's steps or turns."""
    found: set[tuple[str, str]] = set()
    for key in SEQUENCE_KEYS:
        for step in data.get(key) or []:
            if isinstance(step, dict):
                for call in step.get("mcp_calls") or []:
                    found.add((call.get("kind", ""), call.get("name") or call.get("uri") or ""))
    return found


_KINDS = (("tools", "tool", "name"), ("resources", "resource", "uri"), ("prompts", "prompt", "name"))


def _inventory(servers: list[dict[str, Any]], level: int, called: set[tuple[str, str]],
               stats: _Stats) -> list[dict[str, Any]]:
    if level == 0:
        return servers
    kept = brief = 0
    out: list[dict[str, Any]] = []
    for server in servers:
        entry: dict[str, Any] = {k: v for k, v in server.items() if k not in ("tools", "resources", "prompts")}
        for field, kind, id_key in _KINDS:
            items = server.get(field) or []
            full = [i for i in items if (kind, i.get(id_key) or "") in called]
            others = [i for i in items if (kind, i.get(id_key) or "") not in called]
            kept += len(full)
            brief += len(others)
            if level == 1:
                shown = [_one_line(i, id_key) for i in others]
            elif level == 2:
                shown = [{id_key: i.get(id_key)} for i in others]
            else:
                shown = [{"not_shown": f"{len(others)} more {field} not called in this task"}] if others else []
            entry[field] = full + shown
        out.append(entry)
    how = {1: "by name and one-line description", 2: "by name only", 3: "as a count"}[level]
    stats.inventory = f"{kept} called primitives in full; {brief} others {how}"
    return out


def _one_line(item: dict[str, Any], id_key: str) -> dict[str, Any]:
    out: dict[str, Any] = {id_key: item.get(id_key)}
    description = item.get("description")
    if isinstance(description, str) and description.strip():
        line = description.strip().splitlines()[0]
        out["description"] = line if len(line) <= ONE_LINE else line[:ONE_LINE - 3] + "..."
    return out
