"""The mapping compiled by mypyc at install (setup.py): what runs is said, and a checkout whose sources changed after
the build runs those sources, not the extensions built from their older text."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tracejudge.mapping import build_conversations, decode_otlp, map_traces
from tracejudge.mapping.compiled import compiled_sources, running_compiled
from tracejudge.mapping.dialects.base import ToolDefinition
from tracejudge.mapping.dialects.semantic_kernel import MCPContent
from tracejudge.mapping.spans import SpanEvent, SpanLink

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
    os.utime(edited)  # touched, as a checkout or a copy does: the same text still runs compiled
    assert _imported(copy)[1]
    edited.write_text(edited.read_text() + "\n# a developer's edit after `pip install -e .`\n")
    where, compiled, warned = _imported(copy)
    assert where == str(copy / "tracejudge" / "mapping" / "conversation.py") and not compiled
    assert len(warned) == 1 and "tracejudge.mapping.messages changed after the mapping was compiled" in warned[0]
    assert "pip install -e ." in warned[0]


def test_what_the_mapping_returns_pickles_and_copies_to_equal_values() -> None:
    """A library user sends conversations to other processes and copies them: compiled frozen dataclasses are
    restored by setting attributes, which they refuse, unless they say how to rebuild themselves."""
    decoded = decode_otlp((ROOT / "tests" / "fixtures" / "real" / "pydantic_ai_mcp.otlp.json").read_bytes(),
                          "application/json")
    spans = decoded.spans
    with_events = replace(spans[0], events=[SpanEvent("e", 1, {"k": "v"})], links=[SpanLink("t" * 32, "s" * 16, {})])
    [conversation, *_] = [c for c in build_conversations(spans, explain=True) if c.test_case.turns]
    traces = map_traces(spans)
    offered = ToolDefinition("get_weather", "the weather", {"type": "object"}, mcp=True, server="weather")
    for value in (conversation, traces, with_events, offered, MCPContent("tool", [{"type": "text"}], [])):
        for copied in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
            assert copied == value
    assert pickle.loads(pickle.dumps(conversation)).test_case_json == conversation.test_case_json
