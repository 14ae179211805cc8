"""Structured logs: one JSON object per line on stderr, so log shippers parse them without rules."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class Logger:
    def __init__(self, level: str = "info", stream: TextIO | None = None) -> None:
        self.threshold = LEVELS[level]
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def log(self, level: str, event: str, **fields: Any) -> None:
        if LEVELS[level] < self.threshold:
            return
        record = {"ts": round(time.time(), 3), "level": level, "event": event, **fields}
        line = json.dumps(record, ensure_ascii=False, default=str)
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def info(self, event: str, **fields: Any) -> None:
        self.log("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.log("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self.log("error", event, **fields)

    def critical(self, event: str, **fields: Any) -> None:
        """The collector cannot go on and stops: what happened and what to do."""
        self.log("critical", event, **fields)

    def debug(self, event: str, **fields: Any) -> None:
        self.log("debug", event, **fields)
