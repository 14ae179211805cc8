"""A loopback OpenAI-compatible judge for benchmarks: answers any response schema with a valid object.

Both DeepEval and tracejudge ask for JSON-schema outputs; this server builds a conforming answer from
the schema in the request (scores 0.8, strings "ok", empty lists), optionally after a fixed latency, and
counts calls and prompt characters.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tests.support.scripted_server import Reply, Request, ScriptedServer, completion


def fabricate(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    if "$ref" in schema:
        return fabricate(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for combinator in ("anyOf", "oneOf", "allOf"):
        if combinator in schema:
            options = [s for s in schema[combinator] if s.get("type") != "null"] or schema[combinator]
            return fabricate(options[0], defs)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: fabricate(sub, defs) for name, sub in props.items()}
    if kind == "array":
        return []
    if kind == "number":
        return 0.8
    if kind == "integer":
        return 1
    if kind == "boolean":
        return True
    return "ok"


GENERIC = {"score": 0.8, "reason": "ok", "verdict": "yes", "tasks": []}


class JudgeStub:
    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self.server = ScriptedServer(script=self._answer)
        self._lock = threading.Lock()

    def _answer(self, request: Request) -> Reply:
        if self.latency_s:
            time.sleep(self.latency_s)
        fmt = request.body.get("response_format") or {}
        schema = (fmt.get("json_schema") or {}).get("schema") if isinstance(fmt, dict) else None
        answer = fabricate(schema, schema.get("$defs", {})) if schema else GENERIC
        return completion(json.dumps(answer), prompt_tokens=200, completion_tokens=20, model="gpt-4o-mini")

    def __enter__(self) -> JudgeStub:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.__exit__(*exc)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def reset(self) -> None:
        with self.server._lock:  # noqa: SLF001 - the stub owns its server
            self.server.requests.clear()

    def stats(self) -> tuple[int, int]:
        """(calls, prompt characters) since the last reset."""
        calls = self.server.calls()
        return len(calls), sum(_chars(m.get("content")) for r in calls for m in r.body.get("messages", []))


def _chars(content: Any) -> int:
    """Characters of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return 0
