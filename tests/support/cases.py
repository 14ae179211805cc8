"""Conversations used across the tests, written as plain JSON dicts the way users and mapping give them."""

from __future__ import annotations

import copy
from typing import Any

FLIGHTS_SERVER: dict[str, Any] = {
    "server_name": "flights",
    "transport": "streamable-http",
    "available_tools": [
        {
            "name": "search_flights",
            "description": "Search flights between two airports on a date.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string", "minLength": 3, "maxLength": 3},
                    "destination": {"type": "string", "minLength": 3, "maxLength": 3},
                    "date": {"type": "string", "format": "date"},
                },
                "required": ["origin", "destination", "date"],
                "additionalProperties": False,
            },
        },
        {
            "name": "book_flight",
            "description": "Book a flight by id.",
            "inputSchema": {
                "type": "object",
                "properties": {"flight_id": {"type": "string"}, "seats": {"type": "integer", "minimum": 1}},
                "required": ["flight_id"],
            },
        },
    ],
    "available_resources": [{"uri": "flights://airports", "name": "airports", "mimeType": "application/json"}],
    "available_prompts": [
        {"name": "itinerary", "description": "Format an itinerary.",
         "arguments": [{"name": "flight_id", "required": True}, {"name": "style"}]},
    ],
}

WEATHER_SERVER: dict[str, Any] = {
    "server_name": "weather",
    "available_tools": [
        {"name": "forecast", "description": "Weather forecast for a city.",
         "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    ],
}


def search_call(origin: str = "SFO", destination: str = "JFK", date: str = "2026-12-24") -> dict[str, Any]:
    return {
        "name": "search_flights",
        "args": {"origin": origin, "destination": destination, "date": date},
        "result": {
            "content": [{"type": "text", "text": "UA 100 08:00, DL 200 11:30"}],
            "structuredContent": {"flights": [{"id": "UA100"}, {"id": "DL200"}]},
            "isError": False,
        },
    }


def two_turn_case() -> dict[str, Any]:
    """The most common shape: one user turn and one assistant turn with a tool call (DeepEval scores 0)."""
    return {
        "name": "two-turn",
        "turns": [
            {"role": "user", "content": "Find flights from SFO to JFK on 2026-12-24."},
            {"role": "assistant", "content": "UA 100 at 08:00 or DL 200 at 11:30.",
             "mcpToolsCalled": [search_call()]},
        ],
        "mcp_servers": copy.deepcopy([FLIGHTS_SERVER, WEATHER_SERVER]),  # tests may edit their copy
    }


def three_task_case() -> dict[str, Any]:
    """Three tasks: flights (tool call), weather (tool call), and a chat task with no MCP call."""
    return {
        "name": "three-tasks",
        "turns": [
            {"role": "user", "content": "Find flights from SFO to JFK on 2026-12-24."},
            {"role": "assistant", "content": "", "mcp_tools_called": [search_call()]},
            {"role": "assistant", "content": "UA 100 at 08:00 or DL 200 at 11:30."},
            {"role": "user", "content": "What's the weather in New York?"},
            {"role": "assistant", "content": "Snow, -2C.",
             "mcp_tools_called": [{"name": "forecast", "args": {"city": "New York"},
                                   "result": {"content": [{"type": "text", "text": "snow -2C"}]}}]},
            {"role": "user", "content": "Thanks!"},
            {"role": "user", "content": "That's all."},
            {"role": "assistant", "content": "You're welcome."},
        ],
        "mcp_servers": copy.deepcopy([FLIGHTS_SERVER, WEATHER_SERVER]),
    }


def wide_server(tools: int = 120, name: str = "github") -> dict[str, Any]:
    """A server advertising many tools with schemas as long as real ones (GitHub's server has over 100)."""
    def schema(i: int) -> dict[str, Any]:
        props = {f"field_{j}": {"type": "string", "description": f"Field {j} of operation {i}: the value to set, "
                                "as the API documents it, with its format and limits spelled out in full."}
                 for j in range(8)}
        return {"type": "object", "properties": {"owner": {"type": "string"}, "repo": {"type": "string"}, **props},
                "required": ["owner", "repo"]}
    return {"server_name": name, "available_tools": [
        {"name": f"operation_{i}", "description": f"Operation {i} on a repository.\nLonger notes on operation {i} "
         "that span several lines, as real servers write them.", "inputSchema": schema(i)} for i in range(tools)]}


def wide_case(turns: int = 5, tools: int = 120, result_chars: int = 400, seed: int = 0) -> dict[str, Any]:
    """`turns` user requests, each answered after one call to one of `tools` tools returning `result_chars`."""
    body: list[dict[str, Any]] = []
    for t in range(turns):
        tool = (seed * 7 + t * 13) % tools
        text = (f"row {t}: " + "lorem ipsum dolor sit amet " * (result_chars // 27 + 1))[:result_chars]
        body += [
            {"role": "user", "content": f"Run operation {tool} on octo/repo (request {seed}.{t})."},
            {"role": "assistant", "content": f"Done: operation {tool} returned its rows.",
             "mcp_tools_called": [{"name": f"operation_{tool}", "args": {"owner": "octo", "repo": "repo"},
                                   "result": {"content": [{"type": "text", "text": text}]}}]},
        ]
    return {"name": f"wide-{seed}", "turns": body, "mcp_servers": [wide_server(tools)]}
