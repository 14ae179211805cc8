"""A batch of span rows as the assembly workers read it (`span_columns`): every range of every column gives the values
pyarrow gives, whatever the table's chunks, slices, nulls and text, so a conversation built in a worker is the one
the server would build."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracejudge.collector.pipeline.assembly.span_columns import ColumnFile, write_columns

INTS = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    """A table of strings and integers with nulls, in one or more chunks, perhaps a slice of a larger one."""
    rows = draw(st.integers(0, 60))
    kinds = draw(st.lists(st.sampled_from([pa.string(), *INTS]), min_size=1, max_size=5))
    columns = {}
    for i, kind in enumerate(kinds):
        if kind == pa.string():
            value = st.text(max_size=12)  # any code point: ASCII, Latin-1, CJK, astral, NUL
        else:
            bits = INTS[kind]
            value = st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        columns[f"c{i}"] = pa.array(draw(st.lists(st.none() | value, min_size=rows, max_size=rows)), kind)
    table = pa.table(columns)
    if draw(st.booleans()) and rows:  # several chunks, as concatenated record batches are
        cut = draw(st.integers(0, rows))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    if draw(st.booleans()) and rows:  # a slice: its arrays start at an offset into their buffers
        start = draw(st.integers(0, rows))
        table = table.slice(start, draw(st.integers(0, rows - start)))
    return table


@settings(max_examples=300, deadline=None)
@given(table=tables(), data=st.data())
def test_every_range_of_every_column_reads_as_pyarrow_reads_it(table: pa.Table, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batch.columns"
        write_columns(table, path)
        with ColumnFile(path) as columns:
            assert columns.num_rows == table.num_rows
            for name in table.column_names:
                assert columns.values(name) == table.column(name).to_pylist()
                start = data.draw(st.integers(0, table.num_rows))
                stop = data.draw(st.integers(start, table.num_rows + 3))  # past the end: up to the last row
                assert columns.values(name, start, stop) == table.column(name).slice(start, stop - start).to_pylist()


def test_a_column_of_another_type_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="column when is timestamp"):
        write_columns(pa.table({"when": pa.array([0], pa.timestamp("us"))}), tmp_path / "batch.columns")


def test_a_file_that_is_not_a_batch_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "batch.columns"
    path.write_bytes(b"ARROW1\0\0" + bytes(64))
    with pytest.raises(ValueError, match="not a batch of span columns"):
        ColumnFile(path)
