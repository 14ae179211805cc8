"""An LLM judge over any OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, llama.cpp).

Every call is bounded: a per-judge concurrency cap, a timeout, retries with backoff that honour
Retry-After, and strict output parsing with a few retries for invalid answers. Structured output
(JSON schema) is asked for first; a server that rejects it gets plain JSON-in-text from then on.
"""

from __future__ import annotations

import os
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import openai
from pydantic import BaseModel

from scoring.errors import (
    JudgeAuthenticationError,
    JudgeConfigurationError,
    JudgeOutputError,
    JudgeRequestError,
    JudgeUnavailableError,
)
from scoring.judges.loop_pool import LoopPool
from scoring.judges.pricing import TokenPrice, known_price
from scoring.judges.retry import Retry, RetryPolicy, call_with_retries, parse_retry_after, retryable_status
from scoring.judges.secret_mask import mask_secret, mask_url
from scoring.judges.ssl_context import shared_ssl_context
from scoring.judges.structured_output import parse_output
from scoring.prompts import OutputSpec

DEFAULT_MODEL = "gpt-5.4"

T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True)
class Judgement(Generic[T]):
    """A validated answer with what it cost: tokens over every attempt, and USD when the price is known."""

    value: T
    model: str
    input_tokens: int
    output_tokens: int
    cost: float | None
    attempts: int


class LLMJudge:
    """Judge settings plus the clients it needs; one instance shares its concurrency cap across metrics."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        input_price_per_token: float | None = None,
        output_price_per_token: float | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        max_concurrency: int = 8,
        output_retries: int = 2,
        temperature: float | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        if not model or not isinstance(model, str):
            raise JudgeConfigurationError("the judge model must be a non-empty model name, e.g. 'gpt-5.4'")
        if (input_price_per_token is None) != (output_price_per_token is None):
            raise JudgeConfigurationError(
                "give both input_price_per_token and output_price_per_token (USD per token), or neither"
            )
        if max_concurrency < 1:
            raise JudgeConfigurationError("max_concurrency must be at least 1")
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if key is None and self.base_url is None:
            raise JudgeConfigurationError(
                "no API key for the LLM judge: set OPENAI_API_KEY, or OPENAI_BASE_URL for a local "
                "OpenAI-compatible server (vLLM, Ollama), or pass LLMJudge(api_key=..., base_url=...)"
            )
        self._api_key = key or "not-needed"
        self._given_price: TokenPrice | None = (
            TokenPrice(input_price_per_token, output_price_per_token)  # type: ignore[arg-type]
            if input_price_per_token is not None else None
        )
        self.answered_model: str | None = None  # the model the server says answered, once one did
        self.timeout = timeout
        self.output_retries = output_retries
        self.temperature = temperature
        self.retry = retry_policy or RetryPolicy(max_retries=max_retries)
        self.structured_output = True
        self._pool: LoopPool[openai.AsyncOpenAI] = LoopPool(
            lambda: openai.AsyncOpenAI(api_key=self._api_key, base_url=self.base_url, timeout=self.timeout,
                                       max_retries=0,
                                       http_client=openai.DefaultAsyncHttpxClient(verify=shared_ssl_context())),
            lambda client: client.close(),
            max_concurrency,
        )

    def __repr__(self) -> str:
        return f"LLMJudge(model={self.model!r}, base_url={mask_url(self.base_url) if self.base_url else None!r})"

    @property
    def id(self) -> str:
        return f"llm:{self.model}"

    @property
    def price(self) -> TokenPrice | None:
        """Given prices, else the list price of the model that answered (or was asked for, before any answer)."""
        return self._given_price or known_price(self.answered_model or self.model)

    def session(self) -> AbstractAsyncContextManager[None]:
        """Reuse one connection pool for the calls inside (metrics and `evaluate()` open one per run)."""
        return self._pool.session()

    async def complete(self, **request: Any) -> Any:
        """One chat completion under the concurrency cap, retried on 429, 5xx, timeouts and connection errors.

        Raises JudgeAuthenticationError (401/403), JudgeRequestError (other 4xx) or JudgeUnavailableError.
        """
        async with self._pool.slot() as client:
            try:
                return await call_with_retries(
                    self.retry,
                    lambda: client.chat.completions.create(model=self.model, **request),
                    self._classify,
                    self._unavailable,
                )
            except (ValueError, TypeError, AttributeError) as exc:  # a 200 whose body is not a completion
                raise JudgeOutputError(
                    f"the LLM judge at {self._where()} answered with a malformed response: {type(exc).__name__}: "
                    f"{str(exc)[:200]}"
                ) from exc

    def _classify(self, exc: Exception) -> Retry | None:
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (401, 403):
                raise JudgeAuthenticationError(
                    f"the LLM judge at {self._where()} refused the credentials (HTTP {status}): "
                    f"{self._server_message(exc)}; check OPENAI_API_KEY or the judge's api_key"
                ) from exc
            if retryable_status(status):
                return Retry(f"HTTP {status}: {self._server_message(exc)}", parse_retry_after(exc.response.headers))
            raise JudgeRequestError(
                f"the LLM judge at {self._where()} rejected the request (HTTP {status}): {self._server_message(exc)}",
                status=status,
            ) from exc
        if isinstance(exc, openai.APIConnectionError | openai.APIResponseValidationError):
            return Retry(f"{type(exc).__name__}: {exc}")
        return None

    async def judge(self, messages: list[dict[str, str]], output: type[T], spec: OutputSpec) -> Judgement[T]:
        """Ask until a valid answer arrives; invalid answers are retried a few times, then JudgeOutputError."""
        input_tokens = output_tokens = attempts = invalid = 0
        usage_known = True
        structured = self.structured_output
        while True:
            attempts += 1
            try:
                completion = await self.complete(**self._request(messages, spec, structured))
            except JudgeRequestError as exc:
                if structured and exc.status in (400, 422):
                    structured = False  # ask again with the schema spelled out in the prompt only
                    continue
                raise
            if structured != self.structured_output:
                self.structured_output = False  # this server answers without a JSON schema format
            usage = getattr(completion, "usage", None)
            if usage is not None and usage.prompt_tokens is not None:
                input_tokens += usage.prompt_tokens or 0
                output_tokens += usage.completion_tokens or 0
            else:
                usage_known = False  # the server did not say what it cost: cost unknown, not free
            model = getattr(completion, "model", None) or self.model
            self.answered_model = model
            price = self._given_price or known_price(model)  # the model that answered, not the one asked for
            cost = price.cost(input_tokens, output_tokens) if price and usage_known else None
            try:
                value = parse_output(_content(completion), output)
            except JudgeOutputError as exc:
                invalid += 1
                if invalid > self.output_retries:
                    error = JudgeOutputError(f"{exc} (after {invalid} answers from {self.model})")
                    error.spent = (model, input_tokens, output_tokens, cost)
                    raise error from exc
                continue
            return Judgement(value, model, input_tokens, output_tokens, cost, attempts)

    def _request(self, messages: list[dict[str, str]], spec: OutputSpec, structured: bool) -> dict[str, Any]:
        request: dict[str, Any] = {"messages": messages}
        if structured:
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.name, "schema": spec.schema, "strict": True},
            }
        if self.temperature is not None:
            request["temperature"] = self.temperature
        return request

    def _server_message(self, exc: openai.APIStatusError) -> str:
        return mask_secret(_server_message(exc), self._api_key)

    def _where(self) -> str:
        return mask_url(self.base_url) if self.base_url else "api.openai.com"

    def _unavailable(self, last: str, attempts: int) -> JudgeUnavailableError:
        return JudgeUnavailableError(
            f"the LLM judge at {self._where()} kept failing after {attempts} attempts (last: {last}); "
            "the judge may be down or rate-limiting: retry later or lower max_concurrency"
        )


def _content(completion: Any) -> str | None:
    choices = getattr(completion, "choices", None)
    if not choices:
        return None
    message = getattr(choices[0], "message", None)
    if message is None:
        return None
    if getattr(message, "refusal", None):
        raise JudgeOutputError(f"the judge refused to answer: {message.refusal}")
    return message.content


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(body.get("detail"), str):
            return body["detail"]
    return str(exc.message)
