"""A throwaway PostgreSQL server for the lake tests: its own cluster in a temp dir, on a free loopback port.

Uses Debian's `postgresql` package (`.ci/run` installs it). initdb refuses to run as root, so as root the
server runs as the `postgres` system user the package creates.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _bin_dir() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tracejudge-pg-"))
        self.data = self.root / "data"
        self.user = "tracejudge"

    @property
    def available(self) -> bool:
        return self.bin is not None

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user, "--no-sync")
        self.resume()
        return self

    def resume(self) -> None:
        """Start the server on its data directory (again, after `crash`)."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.root / "server.log"), "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def crash(self) -> None:
        """Stop the server the way a crash does: no shutdown checkpoint, connections cut."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")

    def create_database(self, name: str) -> str:
        """A new database; its libpq connection string."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
                break
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return f"dbname={name} host=127.0.0.1 port={self.port} user={self.user}"

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
