"""MCP semantic conventions: client and server spans with `mcp.method.name` (and the MCP SDK's
`MCP send {method} {name}` client spans)."""

from __future__ import annotations

from typing import Literal

from tracejudge.mapping.dialects.base import Dialect, MCPOperation, span_error
from tracejudge.mapping.spans import Span

SDK_CLIENT_PREFIX = "MCP send "
SERVER, CLIENT = 2, 3


class MCPSemconv(Dialect):
    name = "mcp"

    def applies(self, span: Span) -> bool:
        return "mcp.method.name" in span.attributes or span.name.startswith(SDK_CLIENT_PREFIX)

    def mcp_operation(self, span: Span) -> MCPOperation | None:
        method = span.str_attr("mcp.method.name")
        name_target = None
        if span.name.startswith(SDK_CLIENT_PREFIX):
            words = span.name[len(SDK_CLIENT_PREFIX):].split(" ", 1)
            method = method or words[0]
            name_target = words[1] if len(words) > 1 else None
        elif method and span.name.startswith(method + " "):
            name_target = span.name[len(method) + 1:]
        if not method:
            return None
        target = (span.str_attr("gen_ai.tool.name") or span.str_attr("gen_ai.prompt.name")
                  or span.str_attr("mcp.resource.uri") or name_target)
        arguments = span.json_attr("gen_ai.tool.call.arguments")
        if method == "prompts/get":
            variables = span.prefixed("gen_ai.prompt.variable.")
            arguments = variables or arguments
        failed, message = span_error(span)
        side: Literal["client", "server"] = "server" if span.kind == SERVER else "client"
        server = span.str_attr("fastmcp.server.name") or (span.service_name if side == "server" else
                                                          span.str_attr("server.address"))
        return MCPOperation(method=method, side=side, target=target, arguments=arguments,
                            result=span.json_attr("gen_ai.tool.call.result"), error=failed, error_message=message,
                            request_id=span.str_attr("jsonrpc.request.id"), server=server)
