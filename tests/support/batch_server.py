"""A loopback stand-in for the OpenAI Batch API: file upload (multipart), batch create, batch retrieve and the
results file, speaking the real wire format. Each line of a batch is answered by a per-test script, the same
kind of script the chat completions server takes. A batch stays `in_progress` until `release()` (or at once
with `auto_complete`), so tests can stop a collector while its batch is still running at the "provider".
"""

from __future__ import annotations

import json
import threading
import time
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from tests.support.scripted_server import LoopbackServer, QuietHandler, Request, Script, completion


class BatchServer(LoopbackServer):
    def __init__(self, script: Script | None = None, auto_complete: bool = True) -> None:
        self.script: Script = script or (lambda r: completion({"reason": "ok", "score": 1.0}))
        self.auto_complete = auto_complete
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.lines: list[Request] = []  # every batch line answered, in order
        self.released: set[str] = set()
        self.polls = 0
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def _send(self, status: int, body: Any, raw: bytes | None = None) -> None:
                payload = raw if raw is not None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json" if raw is None else "application/octet-stream")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/v1/files":
                    self._send(200, server._upload(self.headers.get("content-type", ""), raw))
                elif self.path == "/v1/batches":
                    self._send(200, server._create(json.loads(raw)))
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                if len(parts) == 3 and parts[1] == "batches" and parts[2] in server.batches:
                    self._send(200, server._retrieve(parts[2]))
                elif len(parts) == 4 and parts[1] == "files" and parts[3] == "content" and parts[2] in server.files:
                    self._send(200, None, raw=server.files[parts[2]])
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

        self._listen(Handler)

    def release(self) -> None:
        """Let every batch created so far complete at its next poll."""
        with self._lock:
            self.released.update(self.batches)

    def uploaded_lines(self) -> list[dict[str, Any]]:
        """Every request line of every batch submitted."""
        with self._lock:
            return [json.loads(line) for b in self.batches.values()
                    for line in self.files[b["input_file_id"]].decode().splitlines() if line.strip()]

    def _upload(self, content_type: str, raw: bytes) -> dict[str, Any]:
        message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
        fields = {part.get_param("name", header="content-disposition"): part for part in message.iter_parts()}
        assert fields["purpose"].get_content().strip() == "batch"
        data = fields["file"].get_payload(decode=True)
        with self._lock:
            file_id = f"file-{len(self.files) + 1}"
            self.files[file_id] = data
        return {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": "batch.jsonl", "purpose": "batch", "status": "processed"}

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        assert body["endpoint"] == "/v1/chat/completions" and body["completion_window"] == "24h"
        with self._lock:
            batch_id = f"batch_{len(self.batches) + 1}"
            self.batches[batch_id] = {"id": batch_id, "object": "batch", "endpoint": body["endpoint"],
                                      "input_file_id": body["input_file_id"], "completion_window": "24h",
                                      "status": "in_progress", "created_at": int(time.time())}
            if self.auto_complete:
                self.released.add(batch_id)
            return dict(self.batches[batch_id])

    def _retrieve(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            self.polls += 1
            batch = self.batches[batch_id]
            ready = batch["status"] == "in_progress" and batch_id in self.released
        if ready:
            self._complete(batch)
        with self._lock:
            return dict(batch)

    def _complete(self, batch: dict[str, Any]) -> None:
        out = []
        for line in self.files[batch["input_file_id"]].decode().splitlines():
            row = json.loads(line)
            request = Request(row["url"], {}, row["body"], time.monotonic())
            reply = self.script(request)
            if isinstance(reply.body, dict) and "choices" in reply.body and reply.body.get("model") is None:
                reply.body = {**reply.body, "model": row["body"].get("model")}
            with self._lock:
                self.lines.append(request)
            out.append(json.dumps({"id": f"resp-{len(out)}", "custom_id": row["custom_id"], "error": None,
                                   "response": {"status_code": reply.status, "request_id": "req",
                                                "body": reply.body}}))
        with self._lock:
            file_id = f"file-{len(self.files) + 1}"
            self.files[file_id] = ("\n".join(out) + "\n").encode()
            batch.update(status="completed", output_file_id=file_id, completed_at=int(time.time()))
