"""TypeSafe System One over HTTP: `POST {base}/v1/systemone` with `{model, state, questions}`.

Works with hosted Jev and with any compatible local server (`TYPESAFE_BASE_URL`). Retries 408/429/5xx/529
with backoff honouring `retry-after-ms` / `retry-after`; 401/403 are permanent; 422 reports the server's
`detail`; a request over the model's context comes back as ContextBudgetError.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx

from tracejudge.errors import (
    ContextBudgetError,
    JudgeAuthenticationError,
    JudgeConfigurationError,
    JudgeError,
    JudgeOutputError,
    JudgeRequestError,
    JudgeUnavailableError,
)
from tracejudge.judges.budget import DEFAULT_BUDGET, Budget
from tracejudge.judges.exchanges import record
from tracejudge.judges.loop_pool import LoopPool
from tracejudge.judges.questions import Question, parse_wire_answer
from tracejudge.judges.retry import Retry, RetryPolicy, call_with_retries, parse_retry_after, retryable_status
from tracejudge.judges.secret_mask import mask_secret, mask_url
from tracejudge.judges.ssl_context import shared_ssl_context
from tracejudge.judges.system_one import Decision
from tracejudge.task_group import gather_all

DEFAULT_BASE_URL = "https://api.typesafe.ai"
DEFAULT_MODEL = "jev-latest"
JEV_INPUT_PRICE = 0.042 / 1e6  # USD per input token; output tokens are free


class _StatusError(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _detail(response: httpx.Response, secret: str | None) -> tuple[str, str | None]:
    """The server's explanation (without our key, should it echo it), and its `error_type` when it gives one."""
    try:
        body = response.json()
    except ValueError:
        return mask_secret(response.text, secret)[:300] or response.reason_phrase, None
    detail = body.get("detail", body.get("error", body)) if isinstance(body, dict) else body
    error_type = detail.get("error_type") if isinstance(detail, dict) else None
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(x) for x in item.get("loc", []))
                parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
            else:
                parts.append(str(item))
        return "; ".join(parts), error_type
    if isinstance(detail, dict):
        return str(detail.get("message") or detail.get("msg") or detail), error_type
    return str(detail), error_type


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def json_safe(value: Any) -> Any:
    """The value as strict JSON data: non-finite floats become null, other objects their str()."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


class TypeSafeJudge:
    """A System One judge over TypeSafe's wire protocol."""

    calibrated = True

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        input_price_per_token: float = JEV_INPUT_PRICE,
        timeout: float = 15.0,
        max_retries: int = 4,
        max_concurrency: int = 8,
        budget: Budget = DEFAULT_BUDGET,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        if not model:
            raise JudgeConfigurationError("the System One model must be a non-empty name, e.g. 'jev-latest'")
        self.model = model
        configured_url = base_url or os.environ.get("TYPESAFE_BASE_URL") or None
        self.base_url = (configured_url or DEFAULT_BASE_URL).rstrip("/")
        self._api_key = api_key or os.environ.get("TYPESAFE_API_KEY") or None
        if self._api_key is None and configured_url is None:
            raise JudgeConfigurationError(
                "no API key for System One: set TYPESAFE_API_KEY, or TYPESAFE_BASE_URL for a compatible local "
                "server, or pass TypeSafeJudge(api_key=...); or use eval_mode='llm'"
            )
        self.input_price_per_token = input_price_per_token
        self.budget = budget
        self.retry = retry_policy or RetryPolicy(max_retries=max_retries)
        headers = {"Accept": "application/json", "User-Agent": "tracejudge/0.1"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._pool: LoopPool[httpx.AsyncClient] = LoopPool(
            lambda: httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout,
                                      verify=shared_ssl_context()),
            lambda client: client.aclose(),
            max_concurrency,
        )

    def __repr__(self) -> str:
        return f"TypeSafeJudge(model={self.model!r}, base_url={mask_url(self.base_url)!r})"

    @property
    def id(self) -> str:
        return f"system_one:{self.model}"

    def session(self) -> AbstractAsyncContextManager[None]:
        return self._pool.session()

    async def decide(self, state: Any, questions: Mapping[str, Question]) -> Decision:
        """All answers, in as few requests as the context budget allows (normally one)."""
        plan = self.budget.plan(state, questions)
        state = json_safe(state)
        async with self.session():
            parts = await gather_all([self._request(state, {k: questions[k] for k in keys}) for keys in plan])
        answers = {k: a for part in parts for k, a in part.answers.items()}
        input_tokens = sum(p.input_tokens for p in parts)
        known = all(p.cost is not None for p in parts)  # a response without usage: cost unknown, not free
        return Decision(
            answers=answers,
            model=parts[0].model,
            input_tokens=input_tokens,
            output_tokens=sum(p.output_tokens for p in parts),
            cost=input_tokens * self.input_price_per_token if known else None,
            requests=len(parts),
        )

    async def _request(self, state: Any, questions: Mapping[str, Question]) -> Decision:
        body = {"model": self.model, "state": state, "questions": {k: q.wire() for k, q in questions.items()}}
        started = time.time()
        try:
            async with self._pool.slot() as client:
                response = await call_with_retries(self.retry, lambda: self._post(client, body), self._classify,
                                                   self._unavailable)
        except JudgeError as exc:
            record(self.id, body, None, str(exc), started)
            raise
        record(self.id, body, response.text, None, started)
        try:
            payload = response.json()
        except ValueError as exc:
            raise JudgeOutputError(f"System One at {mask_url(self.base_url)} answered with non-JSON: "
                                   f"{response.text[:200]!r}") from exc
        raw_answers = payload.get("answers") if isinstance(payload, dict) else None
        if not isinstance(raw_answers, dict):
            raise JudgeOutputError(f"System One at {mask_url(self.base_url)} answered without an 'answers' map: "
                                   f"{str(payload)[:200]}")
        missing = [k for k in questions if k not in raw_answers]
        if missing:
            raise JudgeOutputError(f"System One gave no answer for {', '.join(missing)}")
        answers = {k: parse_wire_answer(k, q, raw_answers[k]) for k, q in questions.items()}
        usage = payload.get("usage")
        input_tokens = _count(usage.get("input_tokens")) if isinstance(usage, dict) else None
        output_tokens = _count(usage.get("output_tokens")) if isinstance(usage, dict) else None
        model = payload.get("model") if isinstance(payload.get("model"), str) else self.model
        return Decision(answers, model, input_tokens or 0, output_tokens or 0,
                        None if input_tokens is None else 0.0, 1)

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
        response = await client.post("/v1/systemone", json=body)
        if response.status_code >= 400:
            raise _StatusError(response)
        return response

    def _classify(self, exc: Exception) -> Retry | None:
        if isinstance(exc, _StatusError):
            response = exc.response
            status = response.status_code
            message, error_type = _detail(response, self._api_key)
            message = mask_secret(message, self._api_key)
            if status in (401, 403):
                raise JudgeAuthenticationError(
                    f"System One at {mask_url(self.base_url)} refused the credentials (HTTP {status}): {message}; "
                    "check TYPESAFE_API_KEY"
                )
            if error_type == "max_tokens_exceeded":
                raise ContextBudgetError(f"System One says the request is over its context ({message}); "
                                         "score this conversation with eval_mode='llm'")
            if retryable_status(status):
                return Retry(f"HTTP {status}: {message}", parse_retry_after(response.headers))
            raise JudgeRequestError(f"System One at {mask_url(self.base_url)} rejected the request "
                                    f"(HTTP {status}): {message}", status=status)
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
            raise JudgeConfigurationError(f"the System One base URL {mask_url(self.base_url)!r} is not usable ({exc}); "
                                          "give a full URL such as http://127.0.0.1:8080")
        if isinstance(exc, httpx.TransportError):
            return Retry(f"{type(exc).__name__}: {exc}")
        return None

    def _unavailable(self, last: str, attempts: int) -> JudgeUnavailableError:
        return JudgeUnavailableError(
            f"System One at {mask_url(self.base_url)} kept failing after {attempts} attempts (last: {last}); "
            "retry later, or use eval_mode='llm'"
        )
