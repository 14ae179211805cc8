"""What every request to the admin port must pass before its route runs: a Host this server answers to, and for
anything that changes state or runs SQL, no cross-site origin and a JSON body.

A web page the operator visits can make the browser send requests to 127.0.0.1:4319 (cross-site requests), and a
DNS name the attacker controls can be re-pointed at 127.0.0.1 so that the browser treats the admin port as the
attacker's own origin (DNS rebinding) and lets the page read the answers. The Host check stops rebinding: the
browser sends the attacker's name, which is neither loopback nor configured. The Origin and content-type checks
stop cross-site requests: a browser always says where a POST comes from (`Origin`, `Sec-Fetch-Site`), and a body
of `application/json` cannot be sent cross-site without a CORS preflight, which this server never grants.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import web

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain", "ip6-localhost"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Routes that run SQL or change state: their body must be JSON, so no HTML form or simple fetch can send one.
JSON_ROUTES = frozenset({"/api/query", "/api/score-pending", "/api/feedback", "/api/reviews"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def host_name(host: str) -> str:
    """The name in a Host header, without its port, lower case, without a trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class AdminGuard:
    """Host and origin checks for the admin port; `allowed_hosts` are the names besides loopback and IP literals
    (rebinding needs a DNS name, so an address typed as such is safe) that it answers to."""

    def __init__(self, allowed_hosts: Iterable[str] = ()) -> None:
        self.allowed = LOOPBACK_NAMES | {host_name(h) for h in allowed_hosts if h and h not in ("0.0.0.0", "::")}

    def host_allowed(self, host: str | None) -> bool:
        name = host_name(host or "")
        return bool(name) and (name in self.allowed or _is_ip(name))

    def refusal(self, request: web.Request) -> tuple[int, str] | None:
        """Why the request is refused (status and message), or None."""
        if not self.host_allowed(request.headers.get("Host")):
            return 421, (f"this admin port does not answer to the host {host_name(request.headers.get('Host', ''))!r}:"
                         " use 127.0.0.1 or localhost, or add the name to [server] admin_allowed_hosts")
        if request.method in SAFE_METHODS:
            return None
        fetch_site = request.headers.get("Sec-Fetch-Site", "").lower()
        if fetch_site and fetch_site not in ("same-origin", "none"):
            return 403, "cross-site requests are refused on the admin port"
        origin = request.headers.get("Origin")
        # a browser that says where the request comes from (Sec-Fetch-Site) is believed over an Origin of "null",
        # which it sends for its own forms under some referrer policies; without it, the Origin must be this server
        if not fetch_site and origin is not None and not _same_origin(origin, request.headers.get("Host", "")):
            return 403, f"requests from the origin {origin[:100]!r} are refused on the admin port"
        if request.path in JSON_ROUTES and request.content_type != "application/json":
            return 415, f"send the body as application/json (not {request.content_type or 'nothing'})"
        return None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is not None:
            status, message = refused
            return web.json_response({"error": message}, status=status)
        return await handler(request)


def _same_origin(origin: str, host: str) -> bool:
    """The Origin names this server as the browser reached it (scheme aside: TLS is the server's, not the page's)."""
    parts = urlsplit(origin.strip())
    return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc.lower() == host.strip().lower()
