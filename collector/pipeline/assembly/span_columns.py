"""A batch of span rows as a file an assembly worker reads without pyarrow.

pyarrow was 30 of each worker's 88 MB at peak (`python bench/pipeline_pace.py`), and the collector's memory is
bounded for all its processes together. The server writes the Arrow table's own buffers after a small JSON header (no
work per value: the server's CPU is what ingest needs); a worker maps the file and makes the Python values of a range
of rows at a time with memoryview casts, the values pyarrow's `to_pylist` gives. Only the types the span store's
columns have are written: strings, and signed integers of 8 to 64 bits.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

MAGIC = b"TJSPANS1"
_LENGTH = struct.Struct("<I")
_ALIGN = 8  # every buffer starts at a multiple of this, so a cast reads whole integers
_INTS = {"int8": "b", "int16": "h", "int32": "i", "int64": "q"}


class SpanColumns(Protocol):
    """Rows by column, as building reads them: `values(name, start, stop)` is the column's rows in that range as
    Python values (None for NULL)."""

    @property
    def num_rows(self) -> int: ...

    def values(self, name: str, start: int = 0, stop: int | None = None) -> list[Any]: ...


class ArrowColumns:
    """An Arrow table read as `SpanColumns` (in the server, where pyarrow is loaded anyway)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)

    def values(self, name: str, start: int = 0, stop: int | None = None) -> list[Any]:
        column = self.table.column(name)
        if start or stop is not None:
            column = column.slice(start, (self.num_rows if stop is None else stop) - start)
        values: list[Any] = column.to_pylist()
        return values


def write_columns(table: pa.Table, path: Path) -> None:
    """The table's columns as a file `ColumnFile` reads: each column's validity, offsets and data buffers as Arrow
    holds them (an array sliced from a larger one keeps its offset, so nothing is copied)."""
    columns: list[dict[str, Any]] = []
    buffers: list[Any] = []
    at = 0
    for name in table.column_names:
        column = table.column(name)  # one chunk as DuckDB reads a batch, written as it is (combining copies it)
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        kind = str(array.type)
        if kind != "string" and kind not in _INTS:
            raise TypeError(f"column {name} is {kind}: only strings and signed integers are written")
        places: list[list[int] | None] = []
        for buffer in array.buffers():
            if buffer is None:
                places.append(None)
                continue
            places.append([at, buffer.size])
            buffers.append(buffer)
            at += _padded(buffer.size)
        columns.append({"name": name, "type": kind, "offset": array.offset, "nulls": array.null_count,
                        "buffers": places})
    header = json.dumps({"rows": table.num_rows, "columns": columns}).encode()
    start = _padded(len(MAGIC) + _LENGTH.size + len(header))
    with open(path, "wb") as out:
        out.write(MAGIC + _LENGTH.pack(len(header)) + header)
        out.write(b"\0" * (start - len(MAGIC) - _LENGTH.size - len(header)))
        for buffer in buffers:
            out.write(buffer)
            out.write(b"\0" * (_padded(buffer.size) - buffer.size))


class ColumnFile:
    """A file `write_columns` wrote, mapped read-only: a column's values are made only for the rows asked, so a
    worker holds one range of a batch as Python objects at a time, never the whole batch."""

    def __init__(self, path: Path | str) -> None:
        with open(path, "rb") as source:
            self._map = mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            if self._map[:len(MAGIC)] != MAGIC:
                raise ValueError(f"{path} is not a batch of span columns")
            (length,) = _LENGTH.unpack_from(self._map, len(MAGIC))
            head = len(MAGIC) + _LENGTH.size
            header = json.loads(self._map[head:head + length])
        except BaseException:
            self._map.close()
            raise
        self._base = _padded(head + length)
        self._rows: int = header["rows"]
        self._columns: dict[str, dict[str, Any]] = {c["name"]: c for c in header["columns"]}

    @property
    def num_rows(self) -> int:
        return self._rows

    def values(self, name: str, start: int = 0, stop: int | None = None) -> list[Any]:
        column = self._columns[name]
        stop = self._rows if stop is None else min(stop, self._rows)
        count = max(stop - start, 0)
        first = column["offset"] + start  # the array's own index of the range's first row
        buffers = column["buffers"]
        kind = column["type"]
        if kind == "string":
            offsets = self._ints(buffers[1], "i", first, count + 1) if count else [0]
            values = self._strings(buffers[2], offsets)
        else:
            values = self._ints(buffers[1], _INTS[kind], first, count)
        if column["nulls"]:
            at, size = buffers[0]
            with memoryview(self._map) as whole, whole[self._base + at:self._base + at + size] as bits:
                values = [v if bits[(first + i) >> 3] >> ((first + i) & 7) & 1 else None for i, v in enumerate(values)]
        return values

    def _ints(self, place: list[int] | None, code: str, first: int, count: int) -> list[int]:
        if place is None or not count:
            return [0] * count
        at, size = place
        width = struct.calcsize(code)
        start = self._base + at
        with memoryview(self._map) as whole, whole[start:start + size - size % width] as raw, \
                raw.cast(code) as ints:
            values: list[int] = ints[first:first + count].tolist()
            return values

    def _strings(self, place: list[int] | None, offsets: list[int]) -> list[str]:
        """The strings between consecutive `offsets` of the data buffer. Decoded as Latin-1 (a byte a character, so
        the byte offsets hold in the text), then the few that are not ASCII decoded again as the UTF-8 they are."""
        low, high = offsets[0], offsets[-1]
        if place is None or high == low:
            return [""] * (len(offsets) - 1)
        start = self._base + place[0]
        text = str(self._map[start + low:start + high], "latin-1")
        if low:
            offsets = [o - low for o in offsets]
        values = [text[a:b] for a, b in zip(offsets, offsets[1:])]  # noqa: B905 - one shorter, by design
        if not text.isascii():
            values = [v if v.isascii() else v.encode("latin-1").decode("utf-8") for v in values]
        return values

    def close(self) -> None:
        self._map.close()

    def __enter__(self) -> ColumnFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def _padded(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN
