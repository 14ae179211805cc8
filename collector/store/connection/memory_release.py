"""Give freed memory back to the system at once: a hostile or merely large query must not leave the server
holding what it freed while the next one arrives.

DuckDB allocates through its own jemalloc, which keeps freed pages until they decay (seconds): back-to-back
queries stopped at `memory_limit` stacked about 140 MB each on top of one another. glibc keeps a large
request's heap until trimmed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from pathlib import Path

_ALL_ARENAS = b"arena.4096.purge"  # MALLCTL_ARENAS_ALL: every arena


@functools.cache
def _duckdb_mallctl() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """DuckDB's jemalloc control function, where its library exports one (Linux builds do; others, None)."""
    import duckdb

    for library in Path(duckdb.__file__).parent.parent.glob("_duckdb*.so"):
        with contextlib.suppress(OSError, AttributeError):
            function = ctypes.CDLL(str(library)).duckdb_je_mallctl
            function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
            function.restype = ctypes.c_int
            return function
    return None


def release_duckdb_memory() -> bool:
    """Purge every arena of DuckDB's allocator; whether it could (without it, memory still decays in seconds)."""
    mallctl = _duckdb_mallctl()
    return mallctl is not None and mallctl(_ALL_ARENAS, None, None, None, 0) == 0


def release_heap() -> None:
    """Ask glibc to return the free pages of this process's heap (a no-op where there is no glibc)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def arrow_on_the_system_allocator() -> None:
    """Arrow's buffers from glibc instead of mimalloc, which kept freed pages: with the server and its decode
    workers on it, `python bench/ingest.py` peaked about 15 MB lower at the same throughput. Set in the environment
    too, so workers spawned later start on it; a user's ARROW_DEFAULT_MEMORY_POOL wins."""
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        import pyarrow as pa  # here: a decode worker imports this module for release_heap, and not pyarrow

        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
        pa.set_memory_pool(pa.system_memory_pool())


M_ARENA_MAX = -8  # glibc's mallopt parameter


def fewer_malloc_arenas(arenas: int = 2) -> bool:
    """At most `arenas` glibc malloc arenas for this process (glibc's default is eight per core): the receivers',
    decode and writer threads each got an arena of their own, each holding its own freed memory. Whether it was set;
    a user's MALLOC_ARENA_MAX wins."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, arenas) == 1
    return False
