"""The web UI on the admin port: overview, conversations, one conversation, MCP tools, and the login that
guards them when a query token is set.

Pages are Jinja2 templates with autoescaping (everything from a conversation is escaped); each response has a
Content-Security-Policy that loads nothing from elsewhere and runs only the page's own script, by nonce. The
script only refreshes the page's main content when the data changed; every page works without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

import duckdb
from aiohttp import web

from tracejudge.collector.pipeline.summary_tables import SummaryTables
from tracejudge.collector.receivers.ingest import bearer_matches
from tracejudge.collector.review.reviews import reviewer_named
from tracejudge.collector.ui import views
from tracejudge.collector.ui.charts import trend_chart
from tracejudge.collector.ui.rendering import environment
from tracejudge.collector.ui.span_view import span_detail

COOKIE = "tracejudge_session"
REVIEWER_COOKIE = "tracejudge_reviewer"  # a reviewer's name, signed: it opens the review pages only
if TYPE_CHECKING:
    from tracejudge.collector.pipeline.retention import StorageReport

Cursor = Callable[[], duckdb.DuckDBPyConnection]


def csp(nonce: str) -> str:
    return ("default-src 'none'; img-src 'self' data:; connect-src 'self'; form-action 'self'; "
            f"style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; base-uri 'none'; frame-ancestors 'none'")


class WebUI:
    def __init__(self, cursor: Cursor, executor: Executor, query_token: str | None, summaries: SummaryTables, *,
                 budget_usd: float | None = None, trace_url: str | None = None,
                 reviewers: dict[bytes, str] | None = None) -> None:
        self.cursor, self.executor, self.summaries = cursor, executor, summaries
        self._token = query_token.encode() if query_token else None
        self.reviewers = reviewers or {}  # token -> reviewer name
        self._session_key = secrets.token_bytes(32)  # a restart signs everyone out
        # the login and logout forms carry it: a page elsewhere cannot read it, so it cannot post either form
        self._csrf = hmac.new(self._session_key, b"form", hashlib.sha256).hexdigest()
        self.budget_usd, self.trace_url = budget_usd, trace_url
        self.storage: Callable[[duckdb.DuckDBPyConnection], StorageReport] | None = None  # rows, bytes, pruning
        self.env = environment(static=False)

    def register(self, app: web.Application) -> None:
        app.router.add_get("/", self.guard(self.overview))
        app.router.add_get("/conversations", self.guard(self.conversation_list))
        app.router.add_get("/conversations/{conversation_id}", self.guard(self.conversation))
        app.router.add_get("/spans/{trace_id}/{span_id}", self.guard(self.span))
        app.router.add_get("/traces/{trace_id}", self.guard(self.trace))
        app.router.add_get("/tools", self.guard(self.tools))
        app.router.add_get("/ui/changes", self.guard(self.changes))
        app.router.add_get("/login", self.login_form)
        app.router.add_post("/login", self.login)
        app.router.add_post("/logout", self.logout)

    # --- access ---------------------------------------------------------------------------------------

    def _session(self) -> str:
        assert self._token is not None
        return hmac.new(self._session_key, self._token, hashlib.sha256).hexdigest()

    def allowed(self, request: web.Request) -> bool:
        """No token: everyone who reaches the page (the admin port is on loopback unless a token is set, and its
        guard refuses a Host a rebinding DNS name would bring). Else the session cookie the login set, or the token
        as a bearer header."""
        if self._token is None:
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self._session().encode()) or \
            (bool(request.headers.get("Authorization")) and bearer_matches(request.headers["Authorization"],
                                                                             self._token))

    def _reviewer_session(self, name: str) -> str:
        return hmac.new(self._session_key, b"reviewer:" + name.encode(), hashlib.sha256).hexdigest()

    def reviewer(self, request: web.Request) -> str | None:
        """The signed-in reviewer's name (from the cookie the login set with their own token), if any."""
        name, _, signature = request.cookies.get(REVIEWER_COOKIE, "").rpartition(".")
        if name and name in self.reviewers.values() and hmac.compare_digest(
                signature.encode(), self._reviewer_session(name).encode()):
            return name
        return None

    def guard(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
               ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.allowed(request):
                if request.path.startswith("/ui/"):
                    return web.json_response({"error": "sign in first"}, status=401)
                if self.reviewer(request) is not None:  # a reviewer sees the review pages only
                    raise web.HTTPSeeOther("/review")
                raise web.HTTPSeeOther(f"/login?{urlencode({'next': request.path_qs})}")
            return await handler(request)
        return guarded

    def guard_reviewing(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The review pages: a signed-in reviewer, or whoever may see the admin pages."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.allowed(request) and self.reviewer(request) is None:
                raise web.HTTPSeeOther(f"/login?{urlencode({'next': request.path_qs})}")
            return await handler(request)
        return guarded

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        return self.render(request, "login.html", next=_safe_next(request.query.get("next", "/")), failed=False,
                           page="login", status=200)

    def form_forged(self, form: Any) -> bool:
        return not hmac.compare_digest(str(form.get("csrf", "")).encode(), self._csrf.encode())

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        if self.form_forged(form):
            return web.json_response({"error": "the form came from another page; sign in from /login"}, status=403)
        target = _safe_next(str(form.get("next", "/")))
        header = f"Bearer {form.get('token', '')}"
        reviewer = reviewer_named(header, self.reviewers)
        if reviewer is not None:
            response = web.HTTPSeeOther(target if target.startswith(("/review", "/agreement")) else "/review")
            response.set_cookie(REVIEWER_COOKIE, f"{reviewer}.{self._reviewer_session(reviewer)}", httponly=True,
                                samesite="Strict", path="/", secure=request.secure)
            raise response
        if self._token is None:
            raise web.HTTPSeeOther(target)
        if not bearer_matches(header, self._token):
            return self.render(request, "login.html", next=target, failed=True, page="login", status=200)
        response = web.HTTPSeeOther(target)
        response.set_cookie(COOKIE, self._session(), httponly=True, samesite="Strict", path="/",
                            secure=request.secure)
        raise response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        if self.form_forged(await request.post()):
            return web.json_response({"error": "the form came from another page; sign out from a page of this UI"},
                                     status=403)
        response = web.HTTPSeeOther("/login")
        response.del_cookie(COOKIE, path="/")
        response.del_cookie(REVIEWER_COOKIE, path="/")
        raise response

    # --- pages ----------------------------------------------------------------------------------------

    async def data(self, fn: Callable[..., Any], *args: Any) -> Any:
        def read() -> Any:
            con = self.cursor()
            with contextlib.suppress(duckdb.Error):  # the pipeline's refresh logs it; show what is summarized
                self.summaries.refresh(con)  # what was written since the last refresh only
            return fn(con, *args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, read)

    async def overview(self, request: web.Request) -> web.StreamResponse:
        window = request.query.get("window", "7d")
        window = window if window in views.WINDOWS else "7d"
        split = request.query.get("split", "")
        data: views.Overview = await self.data(views.overview, window, split, self.budget_usd)
        end = dt.datetime.now(dt.UTC)
        start = views.window_start(window)
        charts = [(t, trend_chart(t.points, start, end)) for t in data.trends]
        storage = await self.data(self.storage) if self.storage is not None else None
        return self.render(request, "overview.html", data=data, charts=charts, windows=views.WINDOWS, page="overview",
                            storage=storage)

    async def conversation_list(self, request: web.Request) -> web.StreamResponse:
        f = views.ConversationFilter.from_query(request.query)
        data: views.ConversationPage = await self.data(views.conversations, f)
        return self.render(request, "conversations.html", data=data, f=f, windows=views.WINDOWS, page="conversations")

    async def conversation(self, request: web.Request) -> web.StreamResponse:
        version, spans_page = _number(request.query.get("version", "")), _number(request.query.get("spans_page", ""))
        data = await self.data(views.conversation, request.match_info["conversation_id"], version, self.trace_url,
                                spans_page or 1)
        if data is None:
            return self.render(request, "missing.html", conversation_id=request.match_info["conversation_id"],
                                page="conversations", status=404)
        return self.render(request, "conversation.html", c=data, page="conversations")

    async def span(self, request: web.Request) -> web.StreamResponse:
        """One span's attributes and events: the conversation page loads it into the tree when a span is opened
        (`?fragment=1`); on its own it is a page."""
        trace_id, span_id = request.match_info["trace_id"], request.match_info["span_id"]
        detail = await self.data(span_detail, trace_id[:64], span_id[:32])
        if detail is None:
            return self.render(request, "missing.html", thing=f"span {span_id} in trace {trace_id}",
                                page="conversations", status=404)
        template = "_span.html" if request.query.get("fragment") == "1" else "span.html"
        return self.render(request, template, s=detail, page="conversations")

    async def trace(self, request: web.Request) -> web.StreamResponse:
        """A trace id's own page here: the conversation it became, at the trace's first span in the tree."""
        trace_id = request.match_info["trace_id"][:64]
        found = await self.data(views.conversation_of_trace, trace_id)
        if found is None:
            return self.render(request, "missing.html", thing=f"conversation holds trace {trace_id}",
                                page="conversations", status=404)
        shown = await self.data(views.conversation, found, None, self.trace_url)
        page = shown.spans.trace_page.get(trace_id, 1) if shown is not None and shown.spans else 1
        raise web.HTTPSeeOther(f"/conversations/{quote(found, safe='')}?spans_page={page}#trace-{trace_id}")

    async def tools(self, request: web.Request) -> web.StreamResponse:
        window = request.query.get("window", "7d")
        window = window if window in views.WINDOWS else "7d"
        rows = await self.data(views.tools, window)
        return self.render(request, "tools.html", rows=rows, window=window, windows=views.WINDOWS, page="tools")

    async def changes(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"token": await self.data(views.change_token)})

    def _stale(self) -> str | None:
        """What the pages say while the summaries cannot be refreshed: the lists may miss new conversations."""
        failure, since = self.summaries.failure, self.summaries.failed_since
        if failure is None or since is None:
            return None
        return (f"The lists may be stale: the summaries have not been refreshed since {since:%Y-%m-%d %H:%M:%S} UTC "
                f"({failure}). The collector's log says more.")

    def render(self, request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
        nonce = secrets.token_urlsafe(16)
        context.setdefault("page", "")
        context.setdefault("live", self.allowed(request))
        reviewer = self.reviewer(request)
        signed_in = (self._token is not None and self.allowed(request)) or reviewer is not None
        page = self.env.get_template(template).render(nonce=nonce, signed_in=signed_in, csrf=self._csrf,
                                                      stale=self._stale(), reviewer=reviewer,
                                                      admin=self.allowed(request), reviewing=bool(self.reviewers),
                                                      **context)
        return web.Response(text=page, status=status, content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": csp(nonce), "X-Content-Type-Options": "nosniff",
                                     "Referrer-Policy": "same-origin", "Cache-Control": "no-store"})


def _number(text: str) -> int | None:
    """A page or version number from the query; None for anything else."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 9 else None


def _safe_next(target: str) -> str:
    """Only a path on this server (no `//host` or scheme): the login cannot send a user elsewhere."""
    parts = urlsplit(target)
    safe = (target.startswith("/") and not target.startswith("//") and "\\" not in target
            and all(0x20 <= ord(ch) != 0x7F for ch in target) and not parts.scheme and not parts.netloc)
    return target if safe else "/"
