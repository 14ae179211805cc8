"""The files users hand to `evaluate`, `inspect` and `replay`: test cases (JSON or JSON Lines), what `inspect
--format json` printed, and OTLP files (OTLP/JSON, JSON Lines of requests, protobuf) of traces or of log records.

Log files matter because some frameworks (Semantic Kernel, OTel's GenAI instrumentations in event mode) write the
messages as log records beside the spans: a trace file and its log file, given together, map as the collector
maps the two signals it received. Each command accepts what it can use and names what a file is when it cannot,
with the command to run instead; a bad line is reported with every other bad line, not one at a time.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracejudge.errors import InvalidTestCaseError, TracejudgeError
from tracejudge.mapping import OTLPDecodeError, Span, build_conversations, decode_otlp
from tracejudge.mapping.otlp_logs import decode_otlp_logs
from tracejudge.mapping.redaction import Redactor
from tracejudge.test_case import ConversationalTestCase, load_test_case

FileKind = Literal["otlp", "otlp_logs", "test_cases", "inspect", "unknown"]
Signal = Literal["traces", "logs"]
OTLP_KINDS = ("otlp", "otlp_logs")
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
    if "resourceLogs" in first or "resource_logs" in first:
        return "otlp_logs"
    if "test_case" in first and "conversation_id" in first:
        return "inspect"
    if "turns" in first:
        return "test_cases"
    return "unknown"


def sniff(path: Path) -> FileKind:
    """What a file holds, from its first JSON document (protobuf files are OTLP traces or logs)."""
    if path.suffix in PROTOBUF_SUFFIXES:
        try:
            return "otlp_logs" if protobuf_signal(path.read_bytes()) == "logs" else "otlp"
        except OSError:
            return "unknown"
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


def read_test_cases(paths: Path | Sequence[Path], redactor: Redactor | None = None, *,
                    mcp_tools: Mapping[str, Sequence[str]] | None = None,
                    on_problem: Callable[[str], None] | None = None) -> list[ConversationalTestCase]:
    """Test cases from test-case files (JSON, JSON Lines), `inspect --format json` output, or OTLP files (the
    trace and log files together mapped to their conversations first); redacted first. Every bad record is
    reported at once."""
    paths = [paths] if isinstance(paths, Path) else list(paths)
    otlp = [path for path in paths if sniff(path) in OTLP_KINDS]
    cases = []
    if otlp:
        spans = read_otlp_files(otlp, on_problem)
        conversations = build_conversations(redactor.spans(spans) if redactor is not None else spans,
                                            mcp_tools=mcp_tools)
        if not conversations:
            named = " ".join(str(path) for path in otlp)
            raise InputFileError(f"{named}: OTLP {'files' if len(otlp) > 1 else 'file'}, but no conversation could "
                                 f"be rebuilt from {'them' if len(otlp) > 1 else 'it'}; run `tracejudge inspect "
                                 f"{named} --explain` to see what the spans hold")
        cases = [c.test_case for c in conversations]
    for path in paths:
        if path not in otlp:
            cases.extend(_read_case_file(path, redactor))
    return cases


def _read_case_file(path: Path, redactor: Redactor | None) -> list[ConversationalTestCase]:
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


class OTLPRequest(NamedTuple):
    """One export request of a file: where it is, its body as sent, and which signal's endpoint takes it."""

    line: int | None
    payload: bytes
    content_type: str
    signal: Signal


def protobuf_signal(payload: bytes) -> Signal:
    """Whether protobuf bytes are a trace or a logs export request. The two messages share their outer field
    numbers, so each may parse as the other; only a trace request's spans have 16-byte trace ids and 8-byte span
    ids (a log record's field 1 is its time). Undecided (no span, no record): traces, whose decoder explains."""
    traces = ExportTraceServiceRequest()
    try:
        traces.ParseFromString(payload)
        if any(len(span.trace_id) == 16 and len(span.span_id) == 8
               for rs in traces.resource_spans for ss in rs.scope_spans for span in ss.spans):
            return "traces"
    except Exception:  # noqa: BLE001, S110 - protobuf raises several types: then it is no trace request
        pass
    logs = ExportLogsServiceRequest()
    try:
        logs.ParseFromString(payload)
    except Exception:  # noqa: BLE001 - neither: the trace decoder names what is wrong
        return "traces"
    return "logs" if any(sl.log_records for rl in logs.resource_logs for sl in rl.scope_logs) else "traces"


def otlp_requests(path: Path) -> Iterator[OTLPRequest]:
    """Each export request of an OTLP file (traces or logs); a test-case file is refused with the command that
    takes it."""
    if path.suffix in PROTOBUF_SUFFIXES:
        try:
            payload = path.read_bytes()
        except OSError as exc:
            raise InputFileError(f"cannot read {path}: {exc}") from exc
        yield OTLPRequest(None, payload, "application/x-protobuf", protobuf_signal(payload))
        return
    documents, errors = _documents(path)
    _raise_all(errors)
    if documents and kind_of(documents[0][1]) in ("test_cases", "inspect"):
        raise InputFileError(f"{path} is a test-case file (it has turns, not OTLP spans): score it with "
                             f"`tracejudge evaluate {path}`")
    for line, document in documents:
        kind = kind_of(document)
        if kind not in OTLP_KINDS:
            raise InputFileError(f"{path}{f':{line}' if line else ''}: not an OTLP export request (an object with "
                                 "'resourceSpans', or 'resourceLogs' for log records); `tracejudge inspect` and "
                                 "`replay` take OTLP/JSON or .pb files")
        yield OTLPRequest(line, json.dumps(document).encode(), "application/json",
                          "logs" if kind == "otlp_logs" else "traces")


def read_otlp_files(paths: Sequence[Path], on_problem: Callable[[str], None] | None = None) -> list[Span]:
    """Spans from OTLP trace files, and the GenAI events of OTLP log files as the collector keeps them (each
    joins the span it names when a conversation is built); spans that cannot be kept are passed to
    `on_problem` (default: printed to stderr)."""
    spans: list[Span] = []
    for path in paths:
        for request in otlp_requests(path):
            decode = decode_otlp_logs if request.signal == "logs" else decode_otlp
            try:
                decoded = decode(request.payload, request.content_type)
            except OTLPDecodeError as exc:
                raise InputFileError(f"{path}{f':{request.line}' if request.line else ''}: {exc}") from exc
            for problem in decoded.problems:
                (on_problem or _stderr)(f"skipped {problem}")
            spans.extend(decoded.spans)
    return spans


def _stderr(message: str) -> None:
    print(f"tracejudge: {message}", file=sys.stderr)
