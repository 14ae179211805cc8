"""Resident memory of the collector's processes for /metrics: the server's own and its child processes' (assembly
and decode workers, the decode pool's resource tracker, /api/query's processes), read from /proc at each scrape.
Together they are what a container's memory limit counts; the server's figure alone hides the workers'."""

from __future__ import annotations

import os
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int) -> int:
    """A process's resident memory now (0 when it is gone, or where there is no /proc)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def descendants(pid: int) -> list[int]:
    """Every process below `pid`: the children each of its threads started, and theirs (Linux's
    /proc/PID/task/TID/children; none where the kernel does not offer it)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            threads = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for thread in threads:
            try:
                children = [int(c) for c in (thread / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            stack.extend(children)
    return found


def children_resident_bytes(pid: int | None = None) -> int:
    """The resident memory of every process below this one (or `pid`), summed."""
    return sum(resident_bytes(child) for child in descendants(os.getpid() if pid is None else pid))
