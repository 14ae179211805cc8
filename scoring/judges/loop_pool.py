"""A judge's HTTP clients, one per event loop, and its concurrency cap, one for every loop and thread.

Pooled connections must not cross event loops (`measure()` may run each call on a fresh loop), and a
client left open when its loop ends logs errors; so each loop gets its own client, created on first use
inside a session and closed when the last session on that loop ends. The cap is shared by all loops, so
`max_concurrency` holds however many threads call `measure()` at once.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C")


class CrossLoopSemaphore:
    """An async semaphore whose waiters may sit on different event loops (and threads)."""

    def __init__(self, value: int) -> None:
        self._value = value
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def acquire(self) -> None:
        with self._lock:
            if self._value > 0 and not self._waiters:
                self._value -= 1
                return
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            with self._lock:
                if (loop, waiter) in self._waiters:
                    self._waiters.remove((loop, waiter))
                    raise
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted just as we were cancelled: hand it on
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                if not loop.is_closed():
                    loop.call_soon_threadsafe(self._grant, waiter)
                    return
            self._value += 1

    def _grant(self, waiter: asyncio.Future[None]) -> None:
        if waiter.cancelled():
            self.release()
        else:
            waiter.set_result(None)

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


@dataclass
class _LoopState(Generic[C]):
    client: C | None = None
    sessions: int = 0


class LoopPool(Generic[C]):
    def __init__(self, open_client: Callable[[], C], close_client: Callable[[C], Awaitable[None]],
                 max_concurrency: int) -> None:
        self._open = open_client
        self._close = close_client
        self.max_concurrency = max_concurrency
        self._cap = CrossLoopSemaphore(max_concurrency)
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState[C]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def _state(self) -> _LoopState[C]:
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.get(loop)
            if state is None:
                state = self._states[loop] = _LoopState()
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
            async with self._cap.hold():
                yield state.client
