"""What an assembly worker process runs: its start, and a batch built from the file the server wrote.

A module of its own so that a spawned worker imports only this and the building code, and no pyarrow (30 MB of a
worker's memory, `span_columns`): the pool's module writes the files, with pyarrow, in the server.
"""

from __future__ import annotations

import contextlib
import os
import time

from tracejudge.collector.pipeline.assembly.conversation_builder import BatchResult, BuildConfig, build_batch
from tracejudge.collector.pipeline.assembly.span_columns import ColumnFile
from tracejudge.collector.worker_process import start_below
from tracejudge.mapping.stored_spans import Resources, Scopes

NICENESS = 10  # below the server: while both want a core, the receivers and the span writer get it


def worker_start() -> None:
    """The pool's initializer, here beside the job's code: a spawned worker imports its initializer's module before
    running it, so the worker's modules (pydantic, the mapping: 0.3-0.5 s of a core) are loaded while the pool
    starts, at the server's priority, and its first batch is built at once. Imported lowered, with the first batch,
    they took seconds beside a busy core: the likely cause of a CI failure (30a98a8) where a test's 2 s span
    retention pruned the spans read for that batch as never assembled."""
    start_below(NICENESS)


def build_from_file(path: str, conversations: dict[str, list[str]], scopes: Scopes, resources: Resources,
                    config: BuildConfig) -> BatchResult:
    """The batch's rows read from their file (removed once read), then built, with the worker's CPU for it (the
    server counts it as assembly's build stage)."""
    started = time.process_time()
    try:
        with ColumnFile(path) as columns:
            result = build_batch(columns, conversations, scopes, resources, config)
        result.cpu_s = time.process_time() - started
        return result
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
