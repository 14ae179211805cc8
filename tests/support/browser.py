"""Headless Chromium (Debian's package) driven over the DevTools protocol, for testing the HTML report.

Loads a page, waits for it, and returns what a person would see: console messages and uncaught errors,
the value of a JavaScript expression over the DOM, and optionally a PNG screenshot. The flags keep
Chromium off the network (this machine has none): no background services, no component updates.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--remote-debugging-port=0", "--remote-allow-origins=*"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageVisit:
    console: list[dict[str, Any]] = field(default_factory=list)  # Runtime.consoleAPICalled and Log entries
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    value: Any = None
    screenshot: bytes | None = None

    @property
    def errors(self) -> list[str]:
        out = [json.dumps(e)[:500] for e in self.exceptions]
        out += [json.dumps(m)[:500] for m in self.console if m.get("level") in ("error", "warning")]
        return out


class _Session:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.next_id, self.events = ws, 0, []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        call_id = self.next_id
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), 30)
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    async def wait_for(self, event: str, timeout: float = 30) -> None:
        if any(e.get("method") == event for e in self.events):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = await asyncio.wait_for(self.ws.receive_json(), deadline - time.monotonic())
            self.events.append(message)
            if message.get("method") == event:
                return
        raise TimeoutError(event)


async def _visit(port: int, url: str, expression: str, screenshot: bool) -> PageVisit:
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://127.0.0.1:{port}/json/new?about:blank") as reply:
            target = await reply.json()
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=64 * 1024 * 1024) as ws:
            session = _Session(ws)
            for domain in ("Page", "Runtime", "Log"):
                await session.call(f"{domain}.enable")
            await session.call("Emulation.setDeviceMetricsOverride", width=1100, height=1600,
                               deviceScaleFactor=1, mobile=False)
            await session.call("Page.navigate", url=url)
            await session.wait_for("Page.loadEventFired")
            await asyncio.sleep(0.3)  # late console messages
            visit = PageVisit()
            result = await session.call("Runtime.evaluate", expression=expression, returnByValue=True)
            visit.value = result.get("result", {}).get("value")
            if screenshot:
                shot = await session.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                visit.screenshot = base64.b64decode(shot["data"])
            for event in session.events:
                method, params = event.get("method"), event.get("params", {})
                if method == "Runtime.consoleAPICalled":
                    visit.console.append({"level": params.get("type"), "args": params.get("args")})
                elif method == "Log.entryAdded":
                    visit.console.append({"level": params["entry"].get("level"), "text": params["entry"].get("text")})
                elif method == "Runtime.exceptionThrown":
                    visit.exceptions.append(params.get("exceptionDetails", {}))
            return visit


def visit(url: str, expression: str, screenshot: bool = False) -> PageVisit:
    """Open `url` in a fresh headless Chromium and evaluate `expression` once the page has loaded."""
    binary = chromium_path()
    assert binary, "chromium is not installed"
    profile = Path(tempfile.mkdtemp(prefix="tracejudge-chromium-"))
    proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        return asyncio.run(_visit(port, url, expression, screenshot))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
