"""The mapping compiled by mypyc at install (setup.py): what runs is said, and a checkout whose sources changed after
the build runs those sources, not the extensions built from their older text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracejudge.mapping.compiled import compiled_sources, running_compiled

ROOT = Path(__file__).resolve().parent.parent
CHECK = ("import json, warnings\n"
         "with warnings.catch_warnings(record=True) as caught:\n"
         "    warnings.simplefilter('always')\n"
         "    from tracejudge.mapping import conversation\n"
         "    from tracejudge.mapping.compiled import running_compiled\n"
         "print(json.dumps([conversation.__file__, running_compiled(), [str(w.message) for w in caught]]))")


def _copy_of_the_package(tmp_path: Path) -> Path:
    """tracejudge/ as the editable install maps it (scoring/, with collector/ and mapping/ inside), copied with the
    built extension modules and their modification times."""
    package = tmp_path / "tracejudge"
    shutil.copytree(ROOT / "scoring", package, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for sub in ("mapping", "collector"):
        shutil.copytree(ROOT / sub, package / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _imported(path: Path) -> list:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(path)}, cwd=path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


needs_compiled = pytest.mark.skipif(not compiled_sources(), reason="the mapping was not compiled at install "
                                    "(no C compiler or no mypy): nothing can be stale")


@needs_compiled
def test_the_install_compiled_the_mapping_and_it_runs_compiled() -> None:
    sources = compiled_sources()
    for module in ("tracejudge.mapping.conversation", "tracejudge.mapping.spans",
                   "tracejudge.mapping.dialects.otel_genai", "tracejudge.mapping.dialects"):
        assert module in sources
    assert running_compiled()


@needs_compiled
def test_a_mapping_source_edited_after_it_was_compiled_runs_from_its_source(tmp_path: Path) -> None:
    copy = _copy_of_the_package(tmp_path)
    where, compiled, warned = _imported(copy)
    assert where.startswith(str(copy)) and not where.endswith(".py") and compiled and not warned

    edited = copy / "tracejudge" / "mapping" / "messages.py"
    later = time.time() + 60
    os.utime(edited, (later, later))  # a developer's edit after `pip install -e .`
    where, compiled, warned = _imported(copy)
    assert where == str(copy / "tracejudge" / "mapping" / "conversation.py") and not compiled
    assert len(warned) == 1 and "tracejudge.mapping.messages changed after the mapping was compiled" in warned[0]
    assert "pip install -e ." in warned[0]
