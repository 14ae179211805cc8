"""Files that are complete or absent after a crash: fsync of a file or directory, and an atomic Parquet write."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a directory's entries (a rename in it), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(table: pa.Table, path: Path) -> None:
    """Parquet at `path`, complete or not at all: written to a temporary name, fsynced, renamed, dir fsynced."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as handle:
        pq.write_table(table, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)
