"""Judge requests through the OpenAI Batch API: half the price, answers within the provider's 24 h window.

Requests are gathered for `flush_s` (or until `max_requests`), written as one JSONL file, uploaded and submitted
as a batch; a poller per batch downloads the results and wakes the metrics waiting on them. Every request is
keyed by the digest of its body, and a ledger (the collector keeps it in DuckDB) records which batch holds it
and its answer, so after a restart the same request, asked again by the retried job, waits on the batch
already submitted instead of paying twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracejudge.errors import JudgeUnavailableError

BATCH_DISCOUNT = 0.5  # OpenAI prices Batch API tokens at half the synchronous rate
WAIT_LIMIT_S = 26 * 3600  # the provider's 24 h window and a margin: past it a batch's requests are asked again
ENDPOINT = "/v1/chat/completions"


@dataclass(frozen=True)
class BatchAnswer:
    """One request's outcome from a results file: the HTTP status and body the server would have sent."""

    status: int
    body: dict[str, Any]


class BatchLedger(Protocol):
    """Where submitted requests and their answers are kept across restarts."""

    async def lookup(self, digest: str) -> tuple[str, BatchAnswer | None] | None:
        """(batch id, answer or None while pending) of a request submitted before, else None."""
        ...

    async def submitted(self, batch_id: str, digests: list[str]) -> None: ...

    async def answered(self, batch_id: str, answers: dict[str, BatchAnswer]) -> None:
        """Keep these successful answers (HTTP 200) for the requests of `batch_id`."""
        ...

    async def forget(self, batch_id: str) -> None:
        """The batch failed or expired: its requests are submitted again when asked for."""
        ...

    async def forget_requests(self, digests: list[str]) -> None:
        """These requests' answers are not to be reused (an error, an invalid answer): ask again next time."""
        ...


@dataclass
class MemoryLedger:
    """A ledger for one process (the library's `evaluate()`): nothing survives a restart."""

    entries: dict[str, tuple[str, BatchAnswer | None]] = field(default_factory=dict)

    async def lookup(self, digest: str) -> tuple[str, BatchAnswer | None] | None:
        return self.entries.get(digest)

    async def submitted(self, batch_id: str, digests: list[str]) -> None:
        self.entries.update({d: (batch_id, None) for d in digests})

    async def answered(self, batch_id: str, answers: dict[str, BatchAnswer]) -> None:
        self.entries.update({d: (batch_id, a) for d, a in answers.items()})

    async def forget(self, batch_id: str) -> None:
        self.entries = {d: e for d, e in self.entries.items() if e[0] != batch_id}

    async def forget_requests(self, digests: list[str]) -> None:
        for digest in digests:
            self.entries.pop(digest, None)


def request_digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


Files = Callable[[], Any]  # returns an openai.AsyncOpenAI client


@dataclass(frozen=True)
class BatchOptions:
    """How a judge batches: the ledger that survives restarts, how long requests gather before a batch is
    submitted, the most per batch, and how often a running batch is polled."""

    ledger: BatchLedger | None = None
    flush_s: float = 5.0
    max_requests: int = 10_000
    poll_s: float = 30.0


class BatchQueue:
    """Collects chat completion bodies into batches and returns each one's answer when its batch is done."""

    def __init__(self, client: Files, ledger: BatchLedger | None = None, *, flush_s: float = 5.0,
                 max_requests: int = 10_000, poll_s: float = 30.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._client = client
        self.ledger: BatchLedger = ledger or MemoryLedger()
        self.flush_s, self.max_requests, self.poll_s = flush_s, max_requests, poll_s
        self._sleep = sleep
        self._pending: dict[str, dict[str, Any]] = {}
        self._waiting: dict[str, list[asyncio.Future[BatchAnswer]]] = {}
        self._flush: asyncio.Task[None] | None = None
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._members: dict[str, set[str]] = {}  # batch id -> digests this process waits on in it
        self.batches_submitted = 0

    async def answer(self, body: dict[str, Any]) -> BatchAnswer:
        """The answer to `body`, from the ledger, the batch already holding it, or a new batch."""
        digest = request_digest(body)
        future: asyncio.Future[BatchAnswer] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(digest, []).append(future)
        known = await self.ledger.lookup(digest)
        if known is not None and known[1] is not None:
            self._resolve(digest, known[1])
        elif known is not None:
            self._members.setdefault(known[0], set()).add(digest)
            self._poll(known[0])
        else:
            self._pending.setdefault(digest, body)
            if len(self._pending) >= self.max_requests:
                await self._submit()
            elif self._flush is None or self._flush.done():
                self._flush = asyncio.create_task(self._flush_later())
        return await future

    async def _flush_later(self) -> None:
        await self._sleep(self.flush_s)
        await self._submit()

    async def discard(self, body: dict[str, Any]) -> None:
        """The answer to `body` was not usable: the next ask submits it again instead of replaying it."""
        await self.ledger.forget_requests([request_digest(body)])

    async def _submit(self) -> None:
        pending, self._pending = self._pending, {}
        if not pending:
            return
        lines = "".join(json.dumps({"custom_id": d, "method": "POST", "url": ENDPOINT, "body": b}) + "\n"
                        for d, b in pending.items())
        try:
            client = self._client()
            uploaded = await client.files.create(file=("tracejudge-batch.jsonl", lines.encode()), purpose="batch")
            batch = await client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT,
                                                completion_window="24h")
        except Exception as exc:
            self._fail(list(pending), f"could not submit a batch of {len(pending)} judge requests: "
                                      f"{type(exc).__name__}: {exc}")
            return
        self.batches_submitted += 1
        self._members.setdefault(batch.id, set()).update(pending)
        try:
            await self.ledger.submitted(batch.id, list(pending))
        finally:
            self._poll(batch.id)  # wait on it even when the ledger could not record it

    def _poll(self, batch_id: str) -> None:
        if batch_id not in self._pollers or self._pollers[batch_id].done():
            self._pollers[batch_id] = asyncio.create_task(self._poll_until_done(batch_id))

    async def _poll_until_done(self, batch_id: str) -> None:
        import openai  # on first use, as the judge does (scoring/judges/llm.py)

        client = self._client()
        waited = 0.0
        while True:
            ended: str | None = None
            try:
                batch = await client.batches.retrieve(batch_id)
                if batch.status == "completed":
                    break
                if batch.status in ("failed", "expired", "cancelled", "cancelling"):
                    ended = f"ended as {batch.status}"
            except (openai.NotFoundError, openai.AuthenticationError, openai.PermissionDeniedError) as exc:
                ended = f"cannot be read ({type(exc).__name__}: {exc})"  # another key or server: it never will
            except Exception:  # a blip while polling: the batch is still running at the provider
                pass
            if ended is None and waited > WAIT_LIMIT_S:
                ended = f"has not finished after {waited / 3600:.0f} h"
            if ended is not None:
                await self.ledger.forget(batch_id)
                self._fail(list(self._members.pop(batch_id, ())),
                           f"the judge batch {batch_id} {ended}; its requests are submitted again when their jobs "
                           "are retried")
                return
            await self._sleep(self.poll_s)
            waited += self.poll_s
        answers: dict[str, BatchAnswer] = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                answers.update(_parse_results((await client.files.content(file_id)).text))
        await self.ledger.answered(batch_id, {d: a for d, a in answers.items() if a.status == 200})
        await self.ledger.forget_requests([d for d, a in answers.items() if a.status != 200])
        for digest, answer in answers.items():
            self._resolve(digest, answer)
        self._fail(list(self._members.pop(batch_id, set()) - set(answers)),
                   f"the judge batch {batch_id} completed without an answer to this request")

    def _resolve(self, digest: str, answer: BatchAnswer) -> None:
        for future in self._waiting.pop(digest, []):
            if not future.done():
                future.set_result(answer)

    def _fail(self, digests: list[str], message: str) -> None:
        for digest in digests:
            for future in self._waiting.pop(digest, []):
                if not future.done():
                    future.set_exception(JudgeUnavailableError(message))


def _parse_results(text: str) -> dict[str, BatchAnswer]:
    """A results or errors file: one JSON line per request, keyed by its custom_id."""
    answers: dict[str, BatchAnswer] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        response = row.get("response") or {}
        if response.get("body") is not None:
            answers[row["custom_id"]] = BatchAnswer(int(response.get("status_code", 200)), response["body"])
        else:
            error = row.get("error") or {"message": "the batch returned no response for this request"}
            answers[row["custom_id"]] = BatchAnswer(500, {"error": error})
    return answers
