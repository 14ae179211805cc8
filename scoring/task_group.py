"""Run judge calls concurrently; on the first failure cancel the others, so no call keeps spending."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


async def gather_all(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Results in order; the first exception is raised as itself (not an ExceptionGroup)."""

    async def run(call: Awaitable[T]) -> T:
        return await call

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run(call)) for call in calls]
    except BaseExceptionGroup as failed:
        first: Any = failed.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [task.result() for task in tasks]
