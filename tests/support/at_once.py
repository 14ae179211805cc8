"""Run the same client call from several threads at once and wait for all of them: how attacks arrive."""

from __future__ import annotations

import threading
from collections.abc import Callable


def at_once(call: Callable[[], None], times: int) -> None:
    """`call` in `times` threads started together; returns when every one has returned."""
    threads = [threading.Thread(target=call) for _ in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
