"""A judge's HTTP client and concurrency cap, one per event loop, open only while a session holds it.

asyncio objects and pooled connections must not cross event loops (`measure()` may run each call on a
fresh loop), and a client left open when its loop ends logs errors; so each loop gets its own client,
created on first use inside a session and closed when the last session on that loop ends.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C")


@dataclass
class _LoopState(Generic[C]):
    semaphore: asyncio.Semaphore
    client: C | None = None
    sessions: int = 0


class LoopPool(Generic[C]):
    def __init__(self, open_client: Callable[[], C], close_client: Callable[[C], Awaitable[None]],
                 max_concurrency: int) -> None:
        self._open = open_client
        self._close = close_client
        self.max_concurrency = max_concurrency
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState[C]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def _state(self) -> _LoopState[C]:
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.get(loop)
            if state is None:
                state = self._states[loop] = _LoopState(asyncio.Semaphore(self.max_concurrency))
            return state

    @asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        """Keep the client open for the calls inside; the last session out on this loop closes it."""
        state = self._state()
        state.sessions += 1
        try:
            yield
        finally:
            state.sessions -= 1
            if state.sessions == 0 and state.client is not None:
                client, state.client = state.client, None
                await self._close(client)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[C]:
        """The client, inside a session and under the concurrency cap."""
        async with self.session():
            state = self._state()
            if state.client is None:
                state.client = self._open()
            async with state.semaphore:
                yield state.client
