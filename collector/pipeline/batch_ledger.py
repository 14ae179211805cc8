"""The Batch API ledger in the collector's DuckDB file: which batch holds each judge request, and its answer.

It is what makes batch scoring durable: a job retried after a restart asks the same request (prompts are
deterministic), finds its batch here and waits on it, or finds the answer already downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from tracejudge.judges.batch import BatchAnswer

Sql = Callable[[str, list[Any]], Awaitable[list[tuple[Any, ...]]]]


class DuckDBBatchLedger:
    """BatchLedger over the `judge_batch_requests` table, through the stage's serialized SQL."""

    def __init__(self, sql: Sql) -> None:
        self._sql = sql

    async def lookup(self, digest: str) -> tuple[str, BatchAnswer | None] | None:
        rows = await self._sql("SELECT batch_id, answer_status, answer FROM judge_batch_requests "
                               "WHERE request_digest = ?", [digest])
        if not rows:
            return None
        batch_id, status, answer = rows[0]
        return batch_id, None if status is None else BatchAnswer(status, json.loads(answer))

    async def submitted(self, batch_id: str, digests: list[str]) -> None:
        await self._sql("INSERT OR REPLACE INTO judge_batch_requests SELECT unnest(?), ?, now(), NULL, NULL",
                        [digests, batch_id])

    async def answered(self, batch_id: str, answers: dict[str, BatchAnswer]) -> None:
        if not answers:
            return
        await self._sql(
            "UPDATE judge_batch_requests SET answer_status = a.status, answer = a.answer FROM (SELECT "
            "unnest(?) AS digest, unnest(?) AS status, unnest(?) AS answer) a "
            "WHERE request_digest = a.digest AND batch_id = ?",
            [list(answers), [a.status for a in answers.values()], [json.dumps(a.body) for a in answers.values()],
             batch_id])

    async def forget(self, batch_id: str) -> None:
        await self._sql("DELETE FROM judge_batch_requests WHERE batch_id = ?", [batch_id])

    async def forget_requests(self, digests: list[str]) -> None:
        if digests:
            await self._sql("DELETE FROM judge_batch_requests WHERE request_digest IN (SELECT unnest(?))", [digests])
