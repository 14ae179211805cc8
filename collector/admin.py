"""Admin HTTP API on port 4319: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collector.metrics import CollectorMetrics
from collector.span_store import SpanStore


class AdminServer:
    def __init__(self, host: str, port: int, store: SpanStore, metrics: CollectorMetrics) -> None:
        self.host, self.requested_port = host, port
        self.store, self.metrics = store, metrics
        self.port: int | None = None
        self.app = web.Application()
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.requested_port).start()
        self.port = int(self._runner.addresses[-1][1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        problems = []
        if not self.store.healthy:
            problems.append(f"the span store cannot write: {self.store.stats.last_error}")
        if self.store.saturated:
            problems.append(f"{self.store.queued_spans} spans wait for a commit (limit {self.store.max_queue_spans})")
        body = {"ready": not problems, "problems": problems, "queued_spans": self.store.queued_spans}
        return web.Response(status=503 if problems else 200, text=json.dumps(body), content_type="application/json")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
