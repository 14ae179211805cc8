"""The files users hand to `evaluate`, `inspect` and `replay`: test cases (JSON or JSON Lines), what `inspect
--format json` printed, and OTLP trace files (OTLP/JSON, JSON Lines of requests, protobuf).

Each command accepts what it can use and names what a file is when it cannot, with the command to run
instead; a bad line is reported with every other bad line, not one at a time.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from tracejudge.errors import InvalidTestCaseError, TracejudgeError
from tracejudge.mapping import OTLPDecodeError, Span, build_conversations, decode_otlp
from tracejudge.mapping.redaction import Redactor
from tracejudge.test_case import ConversationalTestCase, load_test_case

FileKind = Literal["otlp", "test_cases", "inspect", "unknown"]
PROTOBUF_SUFFIXES = (".pb", ".bin", ".protobuf")
MAX_ERRORS_SHOWN = 20


class InputFileError(TracejudgeError):
    """The file cannot be read, is not what the command takes, or some of its records do not validate."""


def _documents(path: Path) -> tuple[list[tuple[int | None, Any]], list[str]]:
    """The JSON values of a file (one document, or one per line) with line numbers, and the bad lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read {path}: {exc}") from exc
    try:
        return [(None, json.loads(text))], []
    except json.JSONDecodeError as exc:
        first = next((line for line in text.splitlines() if line.strip()), "")
        if text.lstrip()[:1] in ("{", "[") and not _is_json(first):  # one JSON document spread over lines
            raise InputFileError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from exc
    documents, errors = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            documents.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            errors.append(f"{path}:{number}: not valid JSON ({exc.msg})")
    return documents, errors


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def kind_of(value: Any) -> FileKind:
    """What one JSON document is."""
    items = value if isinstance(value, list) else [value]
    first = next((item for item in items if isinstance(item, dict)), None)
    if first is None:
        return "unknown"
    if "resourceSpans" in first or "resource_spans" in first:
        return "otlp"
    if "test_case" in first and "conversation_id" in first:
        return "inspect"
    if "turns" in first:
        return "test_cases"
    return "unknown"


def sniff(path: Path) -> FileKind:
    """What a file holds, from its first JSON document (protobuf files are OTLP)."""
    if path.suffix in PROTOBUF_SUFFIXES:
        return "otlp"
    try:
        documents, _ = _documents(path)
    except InputFileError:
        return "unknown"
    return kind_of(documents[0][1]) if documents else "unknown"


def _raise_all(errors: Sequence[str]) -> None:
    if errors:
        shown = list(errors[:MAX_ERRORS_SHOWN])
        if len(errors) > MAX_ERRORS_SHOWN:
            shown.append(f"... and {len(errors) - MAX_ERRORS_SHOWN} more")
        raise InputFileError(f"{len(errors)} bad record(s):\n  " + "\n  ".join(shown))


def read_test_cases(path: Path, redactor: Redactor | None = None, *,
                    mcp_tools: Mapping[str, Sequence[str]] | None = None,
                    on_problem: Callable[[str], None] | None = None) -> list[ConversationalTestCase]:
    """Test cases from a test-case file (JSON, JSON Lines), `inspect --format json` output, or an OTLP trace
    file (mapped to its conversations first); redacted first. Every bad record is reported at once."""
    if sniff(path) == "otlp":
        spans = read_trace_file(path, on_problem)
        conversations = build_conversations(redactor.spans(spans) if redactor is not None else spans,
                                            mcp_tools=mcp_tools)
        if not conversations:
            raise InputFileError(f"{path} is an OTLP trace file, but no conversation could be rebuilt from it; "
                                 f"run `tracejudge inspect {path} --explain` to see what its spans hold")
        return [c.test_case for c in conversations]
    documents, errors = _documents(path)
    items: list[tuple[str, Any]] = []
    for line, document in documents:
        for i, item in enumerate(document if isinstance(document, list) else [document]):
            where = f"{path}:{line}" if line is not None else f"{path} case {i}"
            if isinstance(item, dict) and "test_case" in item and "conversation_id" in item:  # inspect --format json
                item = {**item["test_case"], "name": item["test_case"].get("name") or item["conversation_id"]}
            items.append((where, item))
    if not items and not errors:
        raise InputFileError(f"{path} holds no test case")
    cases = []
    for where, data in items:
        try:
            cases.append(load_test_case(redactor.value(data) if redactor is not None else data))
        except InvalidTestCaseError as exc:
            errors.append(f"{where}: {exc}")
    _raise_all(errors)
    return cases


def trace_requests(path: Path) -> Iterator[tuple[int | None, bytes, str]]:
    """(line, payload, content type) of each export request in a trace file; a test-case file is refused
    with the command that takes it."""
    if path.suffix in PROTOBUF_SUFFIXES:
        try:
            yield None, path.read_bytes(), "application/x-protobuf"
        except OSError as exc:
            raise InputFileError(f"cannot read {path}: {exc}") from exc
        return
    documents, errors = _documents(path)
    _raise_all(errors)
    if documents and kind_of(documents[0][1]) in ("test_cases", "inspect"):
        raise InputFileError(f"{path} is a test-case file (it has turns, not OTLP spans): score it with "
                             f"`tracejudge evaluate {path}`")
    for line, document in documents:
        if kind_of(document) != "otlp":
            raise InputFileError(f"{path}{f':{line}' if line else ''}: not an OTLP trace request (an object with "
                                 "'resourceSpans'); `tracejudge inspect` and `replay` take OTLP/JSON or .pb files")
        yield line, json.dumps(document).encode(), "application/json"


def read_trace_file(path: Path, on_problem: Callable[[str], None] | None = None) -> list[Span]:
    """Spans from an OTLP/JSON file (one request, or one request per line) or an OTLP protobuf file; spans
    that cannot be kept are passed to `on_problem` (default: printed to stderr)."""
    spans: list[Span] = []
    for line, payload, content_type in trace_requests(path):
        try:
            decoded = decode_otlp(payload, content_type)
        except OTLPDecodeError as exc:
            raise InputFileError(f"{path}{f':{line}' if line else ''}: {exc}") from exc
        for problem in decoded.problems:
            (on_problem or _stderr)(f"skipped {problem}")
        spans.extend(decoded.spans)
    return spans


def _stderr(message: str) -> None:
    print(f"tracejudge: {message}", file=sys.stderr)
