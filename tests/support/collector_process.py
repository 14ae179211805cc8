"""Run `tracejudge serve` as a real process on loopback ports picked by the OS, as users run it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx


class CollectorProcess:
    def __init__(self, db: Path, *, config: Path | None = None, env: dict[str, str] | None = None,
                 cwd: Path | None = None, command: list[str] | None = None) -> None:
        self.db = db
        self.command = command or [sys.executable, "-m", "tracejudge.collector.cli"]  # or an installed `tracejudge`
        self.cwd = cwd  # the collector's working directory (None: the test's)
        self.config = config
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.start_line: dict[str, Any] = {}
        self.log_lines: list[str] = []

    def start(self) -> CollectorProcess:
        # only what the test passes: judge keys in the test's own environment must not leak into the collector
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEJUDGE_", "OPENAI_", "TYPESAFE_"))}
        env.update(self.env)
        args = [*self.command, "serve", "--grpc-port", "0", "--http-port", "0",
                "--admin-port", "0", "--db", str(self.db)]
        if self.config:
            args += ["--config", str(self.config)]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                                     cwd=self.cwd)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"the collector exited early (status {self.proc.wait()}): {self.log_lines}")
            self.log_lines.append(line)
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("event") == "listening":
                self.start_line = record
                # keep reading: a full stderr pipe would block the server's log writes
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        raise RuntimeError("the collector did not start listening within 30 s")

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log_lines.append(line)

    @property
    def grpc_endpoint(self) -> str:
        return self.start_line["otlp_grpc"]

    @property
    def http_url(self) -> str:
        return self.start_line["otlp_http"]

    @property
    def admin_url(self) -> str:
        return self.start_line["admin"]

    def metric(self, name: str) -> float:
        """A sample's value from /metrics (summed over labels)."""
        text = httpx.get(f"{self.admin_url}/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                head, value = line.rsplit(" ", 1)
                if head == name or head.startswith(name + "{"):
                    total += float(value)
        return total

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait: the collector drains and exits 0."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        time.sleep(0.1)  # let the drain thread take the last lines
        return code

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def __enter__(self) -> CollectorProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
