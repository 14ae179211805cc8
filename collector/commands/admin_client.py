"""Talking to a running collector's admin API (httpx only: a query to a running collector starts fast)."""

from __future__ import annotations

import argparse
import os
from typing import Any

import httpx


def admin_headers() -> dict[str, str]:
    token = os.environ.get("TRACEJUDGE_QUERY_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def from_collector(args: argparse.Namespace, send: Any) -> httpx.Response | None:
    """Ask the running collector at --url, unless the history is the lake or several files; None when no
    collector answers (then the file is read directly)."""
    if args.lake or len(args.db or []) > 1:
        return None
    try:
        return send(args.url.rstrip("/"), admin_headers())
    except httpx.HTTPError:
        return None
