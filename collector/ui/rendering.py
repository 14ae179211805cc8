"""The Jinja2 environment both the live pages and the exported report render with: one set of templates, so
the report shows what the UI shows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2

STATIC_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"  # an exported page loads and runs nothing


def environment(static: bool) -> jinja2.Environment:
    """Autoescaping everywhere; `static`: links point inside one self-contained page instead of to the server."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
                             undefined=jinja2.StrictUndefined)
    url: Callable[..., str] = in_page_url if static else server_url
    env.globals.update(url=url, pct=pct, num=num, ms=ms, when=when, static=static, static_csp=STATIC_CSP)
    env.filters["segment"] = path_segment
    return env


def path_segment(value: Any) -> str:
    """One path segment: every reserved character encoded, `/` too, so an id like `../../tools` stays one
    segment of its own link (Jinja's `urlencode` leaves `/` as it is)."""
    return quote(str(value), safe="")


def server_url(path: str, params: dict[str, Any] | None = None) -> str:
    query = urlencode({k: v for k, v in (params or {}).items() if v not in ("", None)})
    return f"{path}?{query}" if query else path


def in_page_url(path: str, params: dict[str, Any] | None = None) -> str:
    """The section of the exported page that stands for a server page (filters cannot apply offline)."""
    if path.startswith("/conversations/"):
        return "#" + quote("conversation-") + path.removeprefix("/conversations/")
    return {"/": "#overview", "/conversations": "#conversations", "/tools": "#tools"}.get(path, "#overview")


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


def num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def ms(value: float | None) -> str:
    """A duration: `850 ms`, `12.4 s`, `3.2 min`."""
    if value is None:
        return "–"
    if value < 1000:
        return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"
    return f"{value / 1000:.1f} s" if value < 120_000 else f"{value / 60_000:.1f} min"


def when(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):  # Unix time
        value = dt.datetime.fromtimestamp(value, dt.UTC)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "–" if value is None else str(value)
