"""Export requests written and synced beside the database while the span writer's commit is held up.

DuckDB holds every commit while a checkpoint runs, about a second at the default 256MB threshold whatever the load,
and an export waited as long for its answer. When a commit has run longer than `[store] journal_after`, the span
store writes the requests waiting on it here, syncs them, and acknowledges them; the writer commits them as usual and
a file is removed once every request in it is in the database. At start the files left are read back and their
requests committed, each once: a request's digest is recorded with its spans (`ingest_requests`), so one already
committed before a crash is skipped.

A file is complete or absent: written under a temporary name, synced, renamed, and the folder synced. It holds four
Arrow IPC streams, each after its length: the requests (digest, spans), then their spans, resources and scopes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from tracejudge.collector.store.durable_files import fsync_path
from tracejudge.collector.store.span_tables import SpanRows
from tracejudge.errors import TracejudgeError

MAGIC = b"tracejudge ingest journal 1\n"
SUFFIX = ".journal"
_LENGTH = struct.Struct("<Q")
_REQUESTS = pa.schema([("digest", pa.binary()), ("spans", pa.int64())])


class JournalError(TracejudgeError):
    """A journal file cannot be read back: its spans were acknowledged, so the collector stops rather than lose
    them."""


@dataclass
class JournalFile:
    """One synced file and the requests in it not yet known to be in the database (by the writer's ids)."""

    path: Path
    outstanding: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class JournaledRequest:
    """A request read back from the journal: its digest and its rows."""

    digest: bytes
    rows: SpanRows


class IngestJournal:
    """The folder of journal files beside the database (`<db>.journal/`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._numbers = itertools.count(1)  # thread-safe: next() on a count holds the GIL

    @classmethod
    def beside(cls, database: Path) -> IngestJournal:
        return cls(Path(f"{database}{SUFFIX}"))

    def write(self, requests: list[tuple[bytes, SpanRows]]) -> Path:
        """Write these requests to a new file and sync it (and the folder's entry): on return they survive a
        crash. OSError when the disk refuses (the requests then wait for their commit, as without a journal)."""
        if not self.folder.is_dir():
            self.folder.mkdir(parents=True, exist_ok=True)
            fsync_path(self.folder.parent)  # the folder's own entry, or a power cut could lose the first file
        # named by time first, so `files()` sorts them in the order written, and never reused: a file parked at start
        # must not be replaced by the next process's first (in a container every start is PID 1)
        path = self.folder / f"{time.time_ns():020d}-{os.getpid()}-{next(self._numbers)}{SUFFIX}"
        tmp = self.folder / f".{path.name}.{uuid.uuid4().hex}.tmp"
        parts = [
            pa.table({"digest": pa.array([d for d, _ in requests], pa.binary()),
                      "spans": pa.array([r.num_rows for _, r in requests], pa.int64())}, schema=_REQUESTS),
            _concat([r.spans for _, r in requests]),
            _concat([r.resources for _, r in requests]),
            _concat([r.scopes for _, r in requests]),
        ]
        try:
            with open(tmp, "wb") as handle:
                handle.write(MAGIC)
                for table in parts:
                    sink = pa.BufferOutputStream()
                    with pa.ipc.new_stream(sink, table.schema) as stream:
                        stream.write_table(table)
                    data = sink.getvalue()
                    handle.write(_LENGTH.pack(data.size))
                    handle.write(data)
                handle.flush()
                os.fdatasync(handle.fileno())
            os.replace(tmp, path)
            fsync_path(self.folder)
        except BaseException:  # not acknowledged: nothing of it may stay to be replayed
            tmp.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            raise
        return path

    def remove_unfinished(self) -> None:
        """Remove the temporary files a crash left mid-write (never acknowledged); only before the writer runs."""
        if self.folder.is_dir():
            for tmp in self.folder.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)

    def files(self) -> list[Path]:
        """The complete files, in the order written (by name)."""
        return sorted(self.folder.glob(f"*{SUFFIX}")) if self.folder.is_dir() else []

    def size_bytes(self) -> int:
        """What the files take on disk (read while the writer removes them: one gone meanwhile counts 0)."""
        total = 0
        for path in self.files():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    @staticmethod
    def read(path: Path) -> Iterator[JournaledRequest]:
        """The requests of one file, in the order they were written."""
        try:
            data = path.read_bytes()
            if not data.startswith(MAGIC):
                raise ValueError("it does not start as a journal file does")
            offset, tables = len(MAGIC), []
            for _ in range(4):
                (size,) = _LENGTH.unpack_from(data, offset)
                offset += _LENGTH.size
                tables.append(pa.ipc.open_stream(pa.py_buffer(data[offset:offset + size])).read_all())
                offset += size
        except (OSError, ValueError, struct.error, pa.ArrowException) as exc:
            raise JournalError(f"the ingest journal file {path} cannot be read ({exc}); it holds acknowledged "
                               "spans: move it out of the folder to start without them, and keep it") from exc
        requests, spans, resources, scopes = tables
        start = 0
        for digest, count in zip(requests.column("digest").to_pylist(), requests.column("spans").to_pylist(),
                                 strict=True):
            yield JournaledRequest(digest, SpanRows(spans.slice(start, count), resources, scopes))
            start += count


def _concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
