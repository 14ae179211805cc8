"""`export` and `report` write only inside the directory the user names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracejudge.collector.history.output_paths import OutputPathError, confined
from tracejudge.collector.store.span_store import SpanStore


@pytest.mark.parametrize("name", ["../escape.parquet", "a/b.parquet", "..", "", "x\0y"])
def test_names_with_separators_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(OutputPathError, match="not a plain file name"):
        confined(tmp_path, name)


def test_a_symlink_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "scores.parquet").symlink_to(tmp_path / "victim")
    with pytest.raises(OutputPathError, match="outside"):
        confined(tmp_path / "out", "scores.parquet")
    assert confined(tmp_path / "out", "conversations.parquet") == (tmp_path / "out" / "conversations.parquet").resolve()


def test_export_does_not_follow_a_planted_symlink(tmp_path: Path) -> None:
    store = SpanStore(tmp_path / "t.duckdb")
    store.close()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "conversations.parquet").symlink_to(victim)
    proc = subprocess.run([sys.executable, "-m", "tracejudge.collector.cli", "export", "--since", "2020-01-01",
                           "--to", str(out), "--db", str(tmp_path / "t.duckdb")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "outside" in proc.stderr, proc.stderr
    assert victim.read_text() == "keep me" and not (out / "scores.parquet").exists()
