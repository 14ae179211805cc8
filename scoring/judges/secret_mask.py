"""Keep credentials out of error messages: some judge servers echo the key they refused."""

from __future__ import annotations

import re

_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{6,}")


def mask_secret(text: str, secret: str | None) -> str:
    """`text` with the secret, and any bearer token, shown only by its last four characters."""
    if secret and len(secret) >= 8:
        text = text.replace(secret, "…" + secret[-4:])
    return _BEARER.sub(lambda m: m.group(1) + "…", text)


_USERINFO = re.compile(r"(://)[^/@\s]+@")
_QUERY_SECRET = re.compile(r"(?i)([?&](?:api[_-]?key|key|token|secret|password)=)[^&\s]+")


def mask_url(url: str) -> str:
    """A judge's base URL for messages: credentials in its user info or query string replaced by ***."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub(r"\1***@", url))
