"""Compact builders for hand-written OTLP/JSON edge-case fixtures (hex ids, camelCase, AnyValues)."""

from __future__ import annotations

import json
from typing import Any

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns


def any_value(value: Any) -> dict[str, Any]:
    """Strings, numbers and booleans as their AnyValue; dicts and lists as JSON strings, as SDKs send them."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    return {"stringValue": json.dumps(value)}


def attrs(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": any_value(v)} for k, v in values.items()]


def tid(n: int) -> str:
    return f"{n:032x}"


def sid(n: int) -> str:
    return f"{n:016x}"


def span(trace: int, span_id: int, name: str, parent: int | None = None, *, kind: int = 1, start: int = 0,
         end: int | None = None, attributes: dict[str, Any] | None = None, status: int = 0, message: str = "",
         events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": tid(trace), "spanId": sid(span_id), "name": name, "kind": kind,
        "startTimeUnixNano": str(T0 + start * 1_000_000), "endTimeUnixNano": str(T0 + (end or start + 1) * 1_000_000),
        "attributes": attrs(attributes or {}), "status": {"code": status, "message": message},
    }
    if parent is not None:
        out["parentSpanId"] = sid(parent)
    if events:
        out["events"] = [{"name": e["name"], "timeUnixNano": str(T0), "attributes": attrs(e.get("attributes", {}))}
                         for e in events]
    return out


def request(*groups: tuple[dict[str, Any], list[dict[str, Any]]]) -> dict[str, Any]:
    """groups of (resource attributes, spans) -> an ExportTraceServiceRequest as OTLP/JSON."""
    return {"resourceSpans": [
        {"resource": {"attributes": attrs(resource)}, "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}
        for resource, spans in groups
    ]}
