"""One TLS context for every judge client: building one loads the CA bundle, about 30 ms each time, and a
client is made per event loop (so per `measure()` call from synchronous code)."""

from __future__ import annotations

import functools
import ssl


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context()
