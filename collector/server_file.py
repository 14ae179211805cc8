"""Read a user-supplied MCP server inventory (JSON or TOML) for the mapping's `servers=`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tracejudge.errors import TracejudgeError
from tracejudge.test_case import MCPServer


class ServerFileError(TracejudgeError):
    """The server file cannot be read or does not describe MCP servers."""


def read_server_file(path: Path) -> list[MCPServer]:
    """`{"servers": [...]}`, a list of servers, or TOML `[[servers]]`; each in the MCPServer shape."""
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ServerFileError(f"cannot read the server file {path}: {exc}") from exc
    items = data.get("servers") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ServerFileError(f"{path} must hold a list of servers, or an object with a 'servers' list")
    servers = []
    for i, item in enumerate(items):
        try:
            servers.append(MCPServer.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ServerFileError(f"{path}: server {i}: {where}: {first['msg']}") from exc
    return servers
