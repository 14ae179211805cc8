"""Scripted HTTP servers on loopback ports for the outside services tests cannot reach: an OpenAI-compatible
chat completions API and a TypeSafe-compatible System One API, speaking their real wire protocols.

Each test gives a `script`: a function from the parsed request to a `Reply`. The server records every
request so tests can count calls and read the exact prompts and questions sent.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tracejudge.prompts import DATA_CLOSE, DATA_OPEN


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float

    @property
    def system(self) -> str:
        return self.body["messages"][0]["content"]

    @property
    def user(self) -> str:
        return self.body["messages"][-1]["content"]

    @property
    def judge(self) -> str:
        """Which tracejudge judge sent this, from the fixed first line of the system prompt."""
        match = re.search(r"tracejudge judge '([a-z_]+)'", self.system)
        return match.group(1) if match else "unknown"

    @property
    def data(self) -> Any:
        """The JSON data block of the user message, decoded."""
        text = self.user
        start, end = text.index(DATA_OPEN) + len(DATA_OPEN), text.rindex(DATA_CLOSE)
        return json.loads(text[start:end])

    @property
    def structured(self) -> bool:
        return self.format == "json_schema"

    @property
    def format(self) -> str | None:
        """The `response_format` type asked for, None for plain text."""
        return (self.body.get("response_format") or {}).get("type")

    @property
    def state(self) -> Any:
        return self.body["state"]

    @property
    def questions(self) -> dict[str, Any]:
        return self.body["questions"]


def completion(content: str | dict[str, Any], prompt_tokens: int = 100, completion_tokens: int = 20,
               model: str | None = None, cached_tokens: int | None = None) -> Reply:
    """A chat completion; `model` None answers with the model the request asked for, as OpenAI does."""
    text = content if isinstance(content, str) else json.dumps(content)
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return Reply(body={
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": usage,
    })


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": "test", "code": None}},
                 headers=headers or {})


def system_one_answers(answers: dict[str, Any], model: str = "jev-1.13.0", input_tokens: int = 1000) -> Reply:
    """A System One response; each answer is a P(yes) float or a list of level probabilities."""
    wire: dict[str, Any] = {}
    for key, value in answers.items():
        if isinstance(value, float | int):
            wire[key] = {"type": "noul", "noul": float(value)}
        else:
            probs = {str(i): p for i, p in enumerate(value)}
            wire[key] = {"type": "score", "score": sum(i * p for i, p in enumerate(value)),
                         "confidence": 0.5, "probabilities": probs}
    return Reply(body={"model": model, "answers": wire, "usage": {"input_tokens": input_tokens, "output_tokens": 3}})


Script = Callable[[Request], Reply]


def in_flight_tracker(answer: Script, delay_s: float = 0.05) -> tuple[dict[str, int], Script]:
    """A script that answers like `answer` after `delay_s`, and a dict with the most requests it saw at once."""
    state = {"now": 0, "max": 0}
    lock = threading.Lock()

    def script(request: Request) -> Reply:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        threading.Event().wait(delay_s)
        with lock:
            state["now"] -= 1
        return answer(request)

    return state, script

CHAT_PATH = "/v1/chat/completions"
SYSTEM_ONE_PATH = "/v1/systemone"


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive, no access log on stderr."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass


class LoopbackServer:
    """A threaded HTTP server on a free loopback port, served from a daemon thread while in a `with` block."""

    def _listen(self, handler: type[BaseHTTPRequestHandler]) -> None:
        class Server(ThreadingHTTPServer):
            request_queue_size = 512  # many concurrent judge calls must queue, not be refused

            def handle_error(self, request: Any, client_address: Any) -> None:
                """A client that hangs up (a judge call cancelled, a collector killed) is what the tests do, not a
                fault of this server: only anything else is printed."""
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self._httpd = Server(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root_url}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class ScriptedServer(LoopbackServer):
    def __init__(self, path: str = CHAT_PATH, script: Script | None = None) -> None:
        self.path = path
        self.script: Script = script or (lambda r: completion({"reason": "ok", "score": 1.0}))
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()},
                                  json.loads(raw or b"{}"), time.monotonic())
                with server._lock:
                    server.requests.append(request)
                if self.path.rstrip("/") != server.path:
                    reply = error(404, f"no route {self.path}")
                else:
                    try:
                        reply = server.script(request)
                    except Exception as exc:  # a broken script must show up as a 500, not a hang
                        reply = error(500, f"script error: {exc!r}")
                    if isinstance(reply.body, dict) and "choices" in reply.body and reply.body.get("model") is None:
                        reply.body = {**reply.body, "model": request.body.get("model")}
                payload = json.dumps(reply.body).encode() if not isinstance(reply.body, bytes) else reply.body
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    if "content-length" not in {k.lower() for k in reply.headers}:
                        self.send_header("content-length", str(len(payload)))
                    else:
                        self.close_connection = True  # a scripted short body: hang up after it
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test); nothing to answer

        self._listen(Handler)

    def calls(self, judge: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if judge is None or r.judge == judge]
