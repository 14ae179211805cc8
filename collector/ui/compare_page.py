"""The Compare page: two cohorts side by side (`/compare?a=...&b=...`, a link anyone with access can share), the
same figures as `tracejudge compare` and `/api/compare`."""

from __future__ import annotations

from typing import Any

import duckdb
from aiohttp import web

from tracejudge.collector.history.compare import CohortError, compare, parse_cohort
from tracejudge.collector.ui.routes import WebUI


class ComparePage:
    def __init__(self, ui: WebUI, saved: dict[str, str]) -> None:
        self.ui, self.saved = ui, saved

    def register(self, app: web.Application) -> None:
        app.router.add_get("/compare", self.ui.guard(self.page))

    async def page(self, request: web.Request) -> web.StreamResponse:
        a, b = request.query.get("a", "").strip()[:500], request.query.get("b", "").strip()[:500]
        result: dict[str, Any] | None = None
        error = None
        if a and b:
            try:
                cohorts = parse_cohort(a, self.saved), parse_cohort(b, self.saved)
                result = await self.ui.data(lambda con: compare(con, *cohorts))
            except CohortError as exc:
                error = str(exc)
            except duckdb.Error as exc:
                error = f"cannot compare on this history: {exc}"
        return self.ui.render(request, "compare.html", page="compare", a=a, b=b, result=result, error=error,
                              saved=self.saved, live=False)
