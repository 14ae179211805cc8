"""Slow and numerous clients cannot hold an HTTP port: a cap on open connections, a deadline for the request
headers, and a deadline for the body derived from its length; used by the OTLP/HTTP receiver and the admin API.

aiohttp times out idle keep-alive connections but not a client that sends its headers a byte a minute
(slowloris), so the listening socket is made here, with a protocol factory that refuses connections past the
cap and closes those that have not sent a whole request head in time.
"""

from __future__ import annotations

import asyncio
import resource
import ssl
from typing import Any

from aiohttp import web

MIN_BODY_BYTES_PER_S = 64 * 1024  # a body slower than this (after the header deadline) is cut off


class _Refused(asyncio.Protocol):
    """Closes a connection past the cap at once (the client sees it closed; nothing is read)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class GuardedSite:
    """An aiohttp app served on a TCP listener with connection and header-time limits; it owns the runner so
    every HTTP port starts and drains the same way."""

    def __init__(self, app: web.Application, host: str, port: int, *, max_connections: int,
                 header_timeout_s: float, ssl_context: ssl.SSLContext | None = None,
                 auto_decompress: bool = True) -> None:
        self.runner = web.AppRunner(app, auto_decompress=auto_decompress, access_log=None, keepalive_timeout=30)
        self.host, self.port = host, port
        self.max_connections, self.header_timeout_s = max_connections, header_timeout_s
        self.ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self.refused = 0
        self.timed_out = 0

    def _open(self) -> int:
        server = self.runner.server
        return len(server.connections) if server is not None else 0

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self.runner.server
        assert server is not None, "set the runner up first"
        if self._open() >= self.max_connections:
            self.refused += 1
            return _Refused()
        handler = server()
        asyncio.get_running_loop().call_later(self.header_timeout_s, self._check_head, handler)
        return handler

    def _check_head(self, handler: Any) -> None:
        """No request head complete by the deadline (and none running): close the connection."""
        transport = getattr(handler, "transport", None)
        if transport is None or transport.is_closing():
            return
        if getattr(handler, "_request_count", 1) == 0 and not getattr(handler, "_request_in_progress", True):
            self.timed_out += 1
            transport.close()

    async def start(self) -> int:
        await self.runner.setup()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, self.host, self.port, ssl=self.ssl_context,
                                                backlog=min(1024, self.max_connections), reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop accepting; the runner's cleanup lets in-flight requests finish, then tears the app down."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await self.runner.cleanup()


def body_deadline_s(content_length: int | None, max_bytes: int, header_timeout_s: float) -> float:
    """How long a request body may take: the header deadline plus its length at the minimum rate."""
    size = content_length if content_length is not None else max_bytes
    return header_timeout_s + size / MIN_BODY_BYTES_PER_S


def raise_open_file_limit(wanted: int = 65536) -> int:
    """The soft limit on open files raised towards the hard one, so connection caps bind before descriptors
    run out; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft
