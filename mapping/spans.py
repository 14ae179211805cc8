"""The normalized span record every dialect reads: hex ids, ns times, decoded attributes and events.

Attribute values are plain Python (str, bool, int, float, list, dict). Values that carry JSON as a
string (messages, arguments, results) are parsed on first use by `json_attr`, which tolerates
truncated or invalid JSON by returning the raw string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

SPAN_KIND_NAMES = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_ERROR = 2


def by_fields(item: Any) -> tuple[Any, ...]:
    """`__reduce__` of the frozen dataclasses mypyc compiles: their constructor and field values (pickle and copy
    restore a compiled instance by setting its attributes, which a frozen one refuses)."""
    return type(item), tuple(getattr(item, f.name) for f in fields(item))


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


@dataclass(frozen=True)
class SpanLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)


_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # typeshed leaves the scanner out
_MAYBE_JSON = frozenset('{["tfn-0123456789')  # the first characters of text that may be JSON (the checks below)


def parse_json_value(value: Any) -> Any:
    """A JSON string as its value; anything else (or text that is not JSON) unchanged. The text is stripped, so
    the decoder's own scanner reads it whole (what `json.loads` does around it, twice a value, cost a third of
    parsing a short one). Plain text (most message contents) is told by its first character, without a copy."""
    if value.__class__ is str and value[:1] not in _MAYBE_JSON and not value[:1].isspace():
        return value
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "[", '"') or text in ("true", "false", "null") or _looks_numeric(text):
            try:
                parsed, end = _scan(text, 0)
            except (StopIteration, ValueError, RecursionError):
                return value
            return parsed if end == len(text) else value
    return value


def only_text(value: Any) -> str | None:
    """Text as given; anything else (a number, an object a framework put there) as no text."""
    return value if isinstance(value, str) else None


def as_text(value: Any) -> str | None:
    """None stays None; anything else as its text (an id a framework wrote as a number)."""
    return None if value is None else str(value)


def as_list(value: Any) -> list[Any]:
    """The value if it is a list, else []: recorded JSON may have any shape."""
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict[str, Any]:
    """The value if it is a dict, else {}."""
    return value if isinstance(value, dict) else {}


def _looks_numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or (text[0] == "-" and text[1:2].isdigit()))


@dataclass(init=False)
class Span:
    """One span as every dialect reads it. Its `__init__` is written out: compiled, a dataclass's generated one
    stays interpreted, and a conversation makes one span per stored row (`python bench/worker_build.py`)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int = 0
    status_message: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    links: list[SpanLink] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)
    scope_name: str = ""
    scope_version: str = ""
    _parsed: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __init__(self, trace_id: str, span_id: str, parent_span_id: str | None, name: str, kind: int,
                 start_ns: int, end_ns: int, status_code: int = 0, status_message: str = "",
                 attributes: dict[str, Any] | None = None, events: list[SpanEvent] | None = None,
                 links: list[SpanLink] | None = None, resource: dict[str, Any] | None = None, scope_name: str = "",
                 scope_version: str = "", _parsed: dict[str, Any] | None = None) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.name = name
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.status_code = status_code
        self.status_message = status_message
        self.attributes = {} if attributes is None else attributes
        self.events = [] if events is None else events
        self.links = [] if links is None else links
        self.resource = {} if resource is None else resource
        self.scope_name = scope_name
        self.scope_version = scope_version
        self._parsed = {} if _parsed is None else _parsed

    def __reduce__(self) -> tuple[Any, ...]:
        return by_fields(self)  # compiled, restoring an instance would call this __init__ with no arguments

    @property
    def key(self) -> tuple[str, str]:
        return (self.trace_id, self.span_id)

    @property
    def service_name(self) -> str | None:
        value = self.resource.get("service.name")
        return value if isinstance(value, str) else None

    @property
    def is_error(self) -> bool:
        return self.status_code == STATUS_ERROR

    def attr(self, key: str) -> Any:
        return self.attributes.get(key)

    def str_attr(self, key: str) -> str | None:
        value = self.attributes.get(key)
        if value.__class__ is str:  # nearly always: the dialects ask ten of these a span
            return value
        if value is None or isinstance(value, dict | list):
            return None
        return value if isinstance(value, str) else str(value)

    def json_attr(self, key: str) -> Any:
        """The attribute with JSON strings parsed (once); None when absent."""
        if key not in self._parsed:
            self._parsed[key] = parse_json_value(self.attributes.get(key))
        return self._parsed[key]

    def genai_json(self, key: str) -> Any:
        """A GenAI content attribute from the span's attributes, else from the first span event carrying it.

        Instrumentations on the latest GenAI conventions (Strands, OTel GenAI event mode) put
        `gen_ai.input.messages` and friends on an event such as `gen_ai.client.inference.operation.details`.
        """
        if key in self.attributes or not self.events:
            return self.json_attr(key)
        event_key = "event:" + key
        if event_key not in self._parsed:
            raw = next((e.attributes[key] for e in self.events if key in e.attributes), None)
            self._parsed[event_key] = parse_json_value(raw)
        return self._parsed[event_key]

    def prefixed(self, prefix: str) -> dict[str, Any]:
        """Attributes under `prefix` with the prefix removed (for flattened, indexed keys)."""
        return {k[len(prefix):]: v for k, v in self.attributes.items() if k.startswith(prefix)}

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready dict of the span (for storage and fixtures)."""
        return {
            "trace_id": self.trace_id, "span_id": self.span_id, "parent_span_id": self.parent_span_id,
            "name": self.name, "kind": self.kind, "start_ns": self.start_ns, "end_ns": self.end_ns,
            "status_code": self.status_code, "status_message": self.status_message,
            "attributes": self.attributes,
            "events": [{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes} for e in self.events],
            "links": [{"trace_id": lk.trace_id, "span_id": lk.span_id, "attributes": lk.attributes}
                      for lk in self.links],
            "resource": self.resource, "scope_name": self.scope_name, "scope_version": self.scope_version,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Span:
        """A span from its record (`to_record`, or a stored row's columns, where a column may be NULL)."""
        parent = record.get("parent_span_id")
        return cls(
            trace_id=str(record["trace_id"]), span_id=str(record["span_id"]),
            parent_span_id=str(parent) if parent else None, name=str(record.get("name") or ""),
            kind=int(record.get("kind") or 0), start_ns=int(record.get("start_ns") or 0),
            end_ns=int(record.get("end_ns") or 0), status_code=int(record.get("status_code") or 0),
            status_message=str(record.get("status_message") or ""), attributes=dict(record.get("attributes") or {}),
            events=[SpanEvent(str(e.get("name") or ""), int(e.get("time_ns") or 0), dict(e.get("attributes") or {}))
                    for e in record.get("events") or []],
            links=[SpanLink(str(lk["trace_id"]), str(lk["span_id"]), dict(lk.get("attributes") or {}))
                   for lk in record.get("links") or []],
            resource=dict(record.get("resource") or {}), scope_name=str(record.get("scope_name") or ""),
            scope_version=str(record.get("scope_version") or ""),
        )
