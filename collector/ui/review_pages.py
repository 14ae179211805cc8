"""The review pages of the web UI: the queue with its rules, the review screen (a conversation as the conversation
page shows it, beside a keyboard-driven form per metric, task and call), and the agreement page.

A reviewer signs in with their own token (the login sets a signed cookie with their name); they see these pages
and nothing else. Whoever may see the admin pages sees them too and edits the rules, but records no review: a
review needs a name.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

import duckdb
from aiohttp import web
from pydantic import ValidationError

from tracejudge.collector.config import ReviewSettings
from tracejudge.collector.review import queue
from tracejudge.collector.review.reviews import (
    AgreementCache,
    PartLabel,
    ReviewError,
    ReviewIn,
    judged_parts,
    record_review,
)
from tracejudge.collector.ui import views
from tracejudge.collector.ui.routes import WebUI

MAX_FORM_BYTES = 256 * 1024  # a review form: notes of a few metrics and a checkbox per task or call
MAX_SKIPPED = 50  # conversations a reviewer skipped in a row, carried in the next link


class ReviewPages:
    def __init__(self, ui: WebUI, rules: ReviewSettings, agreement: AgreementCache) -> None:
        self.ui, self.configured, self._agreement = ui, rules, agreement
        self._refreshing = asyncio.Lock()  # one queue refresh at a time: two would upsert the same rows

    def register(self, app: web.Application) -> None:
        guard = self.ui.guard_reviewing
        app.router.add_get("/review", guard(self.queue_page))
        app.router.add_get("/review/next", guard(self.next_item))
        app.router.add_get("/review/items/{conversation_id}", guard(self.item))
        app.router.add_post("/review/items/{conversation_id}", guard(self.record))
        app.router.add_post("/review/rules", guard(self.edit_rules))
        app.router.add_get("/agreement", guard(self.agreement))

    async def refreshed(self) -> ReviewSettings:
        """The rules in force, after the queue has taken what was scored since it last looked."""
        async with self._refreshing:
            def work(con: duckdb.DuckDBPyConnection) -> ReviewSettings:
                rules, _ = queue.current_rules(con, self.configured)
                queue.refresh(con, rules)
                return rules
            return await self.ui.data(work)

    async def queue_page(self, request: web.Request) -> web.StreamResponse:
        rules = await self.refreshed()
        reviewer = self.ui.reviewer(request) or ""
        summary, edited = await self.ui.data(lambda con: (queue.summary(con, reviewer, rules),
                                                          queue.current_rules(con, self.configured)[1]))
        return self.ui.render(request, "review_queue.html", page="review", summary=summary, rules=rules,
                              described=queue.describe(rules), edited=edited, live=False,
                              message=request.query.get("message", "")[:200])

    async def next_item(self, request: web.Request) -> web.StreamResponse:
        reviewer = self.ui.reviewer(request)
        rules = await self.refreshed()
        skipped = _skipped(request)
        item = await self.ui.data(queue.next_item, reviewer or "", rules, skipped)
        if item is None:
            message = "Nothing else is waiting for you in the queue." if skipped else \
                "Nothing is waiting for you in the queue."
            raise web.HTTPSeeOther("/review?message=" + quote(message))
        after = f"?skipped={quote(','.join(skipped))}" if skipped else ""
        raise web.HTTPSeeOther(f"/review/items/{quote(item.conversation_id, safe='')}{after}")

    async def item(self, request: web.Request) -> web.StreamResponse:
        conversation_id = request.match_info["conversation_id"]
        c = await self.ui.data(views.conversation, conversation_id, None, self.ui.trace_url)
        if c is None:
            return self.ui.render(request, "missing.html", conversation_id=conversation_id, page="review", status=404)
        entry = await self.ui.data(queue.queue_item, conversation_id)
        if entry is None and not self.ui.allowed(request):  # a reviewer sees what the queue holds, nothing else
            return self.ui.render(request, "missing.html", conversation_id=conversation_id, page="review", status=404)
        metrics = _reviewable(c.scores)
        skip = ",".join([*_skipped(request), conversation_id][-MAX_SKIPPED:])
        return self.ui.render(request, "review_item.html", page="review", c=c, metrics=metrics, entry=entry,
                              live=False, error=request.query.get("error", "")[:500], skip=skip)

    async def record(self, request: web.Request) -> web.StreamResponse:
        reviewer = self.ui.reviewer(request)
        if reviewer is None:
            return web.json_response({"error": "sign in with your reviewer token to record a review"}, status=403)
        if (request.content_length or 0) > MAX_FORM_BYTES:
            return web.json_response({"error": "the review form is too large"}, status=413)
        form = await request.post()
        if self.ui.form_forged(form):
            return web.json_response({"error": "the form came from another page; review from /review"}, status=403)
        conversation_id = request.match_info["conversation_id"]
        item = f"/review/items/{quote(conversation_id, safe='')}"
        try:
            version = int(str(form.get("version", "")))
            reviews = _reviews_from_form(conversation_id, version, form)
        except (ValueError, ValidationError) as exc:
            raise web.HTTPSeeOther(f"{item}?error={quote(str(exc)[:400])}") from exc
        if not reviews:
            raise web.HTTPSeeOther(f"{item}?error={quote('Choose agree or disagree for at least one metric.')}")
        try:
            await self.ui.data(lambda con: [record_review(con, r, reviewer) for r in reviews])
        except ReviewError as exc:
            raise web.HTTPSeeOther(f"{item}?error={quote(str(exc)[:400])}") from exc
        raise web.HTTPSeeOther("/review/next")

    async def edit_rules(self, request: web.Request) -> web.StreamResponse:
        if not self.ui.allowed(request):
            return web.json_response({"error": "the rules are edited by whoever holds the query token"}, status=403)
        form = await request.post()
        if self.ui.form_forged(form):
            return web.json_response({"error": "the form came from another page; edit the rules at /review"},
                                     status=403)
        if form.get("reset"):
            await self.ui.data(queue.reset_rules)
            raise web.HTTPSeeOther("/review?message=" + quote("The rules are the configuration's [review] again."))
        try:
            rules = ReviewSettings.model_validate({
                "failing": "failing" in form, "metric_disagreement": "metric_disagreement" in form,
                "hybrid_fallback": "hybrid_fallback" in form, "thumbs_down": "thumbs_down" in form,
                "low_confidence_below": str(form.get("low_confidence_below", "")).strip() or None,
                "feedback_below": form.get("feedback_below", "0.5"), "random_rate": form.get("random_rate", "0"),
                "reviews_per_item": form.get("reviews_per_item", "1")})
        except ValidationError as exc:
            message = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())
            raise web.HTTPSeeOther("/review?message=" + quote(f"Not saved: {message}"[:300])) from exc
        await self.ui.data(queue.save_rules, rules, self.ui.reviewer(request) or "the query-token holder")
        raise web.HTTPSeeOther("/review?message=" + quote("Saved: the rules apply to conversations scored from now."))

    async def agreement(self, request: web.Request) -> web.StreamResponse:
        rows = await self.ui.data(self._agreement.report)
        return self.ui.render(request, "agreement.html", page="agreement", rows=rows, live=False)


def _skipped(request: web.Request) -> list[str]:
    """The conversations this reviewer skipped in a row (the skip link carries them), so skipping moves on."""
    text = request.query.get("skipped", "")
    return [part for part in text.split(",") if part][-MAX_SKIPPED:]


def _reviewable(scores: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest score of each metric that has a pass/fail to agree with, with the tasks or calls it decided."""
    seen: set[str] = set()
    out = []
    for score in scores:  # newest first per metric
        if score["metric"] in seen or score["success"] is None:
            continue
        seen.add(score["metric"])
        parts = judged_parts(score["breakdown"], score["threshold"])
        out.append({**score, "parts": parts, "part_keys": [f"{p.kind}.{p.index}" for p in parts]})
    return out


def _reviews_from_form(conversation_id: str, version: int, form: Any) -> list[ReviewIn]:
    """One review per metric that has a verdict: `verdict.M`, `score.M`, `note.M`, and `wrong.M.task.I` /
    `wrong.M.call.I` for each task or call the reviewer says the judge got wrong (the others listed in
    `parts.M` as agreed)."""
    reviews = []
    metrics = {key.split(".", 1)[1] for key in form if key.startswith("verdict.")}
    for metric in sorted(metrics):
        score = str(form.get(f"score.{metric}", "")).strip()
        labels: dict[str, list[PartLabel]] = {"task": [], "call": []}
        parts = json.loads(str(form.get(f"parts.{metric}", "[]")))
        if not isinstance(parts, list):
            raise ValueError(f"parts.{metric} must be a list of task or call keys")
        for part in parts[:1000]:
            kind, _, index = str(part).partition(".")
            if kind in labels:
                wrong = f"wrong.{metric}.{kind}.{index}" in form
                labels[kind].append(PartLabel(index=int(index), verdict="disagree" if wrong else "agree"))
        reviews.append(ReviewIn(conversation_id=conversation_id, version=version, metric=metric,
                                verdict=form[f"verdict.{metric}"], human_score=float(score) if score else None,
                                note=str(form.get(f"note.{metric}", "")).strip() or None,
                                tasks=labels["task"], calls=labels["call"]))
    return reviews
