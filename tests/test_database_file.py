"""The collector's database file stays readable by the lake's DuckDB (1.5.5, `tracejudge[lake]`) when the default
DuckDB (2) wrote it: a deployment that adds the lake later, or goes back a version, keeps its history."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

REPOSITORY = str(Path(__file__).resolve().parent.parent)
WRITE = """
import asyncio, datetime as dt, sys
from pathlib import Path
import duckdb
from tests.test_assembler import _spans
from tracejudge.collector.receivers.span_rows import spans_to_arrow
from tracejudge.collector.store.span_store import SpanStore
store = SpanStore(Path(sys.argv[1]))
store.open()
asyncio.run(store.write(spans_to_arrow(_spans(1, 1, session="chat-1", turn="hello"), dt.datetime.now(dt.UTC))))
store.close()
print(duckdb.__version__)
"""


@pytest.mark.lake
def test_a_database_the_default_duckdb_wrote_opens_on_the_lakes_duckdb(tmp_path: Path) -> None:
    """Run where the lake's DuckDB comes first on PYTHONPATH (`.ci/run`'s lake step): the file is written by a
    collector process on the environment's own DuckDB, then read here."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    db = tmp_path / "t.duckdb"
    done = subprocess.run([sys.executable, "-c", WRITE, str(db)], cwd=REPOSITORY, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    writer = done.stdout.split()[-1]
    if writer == duckdb.__version__:
        pytest.skip(f"the file was written by this test's own DuckDB ({writer}): run it as .ci/run's lake step does, "
                    "with the lake's DuckDB on PYTHONPATH")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT trace_id, name FROM span_records").fetchall() == [
            ("00000000000000000000000000000001", "invoke_agent")], writer
