"""An LLM judge over any OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, llama.cpp).

Every call is bounded: a per-judge concurrency cap, a timeout, retries with backoff that honour
Retry-After, and strict output parsing with a few retries for invalid answers. Structured output
(JSON schema) is asked for first; a server that rejects it gets plain JSON-in-text from then on.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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
from scoring.judges.pricing import TokenPrice, known_price
from scoring.judges.retry import RETRYABLE_STATUS, RetryPolicy, parse_retry_after
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


@dataclass
class _LoopState:
    semaphore: asyncio.Semaphore
    client: openai.AsyncOpenAI | None = None
    sessions: int = 0


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
        self.price: TokenPrice | None = (
            TokenPrice(input_price_per_token, output_price_per_token)  # type: ignore[arg-type]
            if input_price_per_token is not None
            else known_price(model)
        )
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self.output_retries = output_retries
        self.temperature = temperature
        self.retry = retry_policy or RetryPolicy(max_retries=max_retries)
        self.structured_output = True
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LLMJudge(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def id(self) -> str:
        return f"llm:{self.model}"

    def _state(self) -> _LoopState:
        """State of the running loop: asyncio objects and connections must not cross event loops."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.get(loop)
            if state is None:
                state = self._states[loop] = _LoopState(asyncio.Semaphore(self.max_concurrency))
            return state

    @asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        """Keep one connection pool open for the calls inside; the last session out closes it.

        Metrics and `evaluate()` open a session around their calls, so connections are reused within a
        run and closed before its event loop ends.
        """
        state = self._state()
        state.sessions += 1
        try:
            yield
        finally:
            state.sessions -= 1
            if state.sessions == 0 and state.client is not None:
                client, state.client = state.client, None
                await client.close()

    async def judge(self, messages: list[dict[str, str]], output: type[T], spec: OutputSpec) -> Judgement[T]:
        """Ask once, retrying transport failures and invalid answers; raise a JudgeError when out of tries."""
        async with self.session():
            state = self._state()
            if state.client is None:
                state.client = openai.AsyncOpenAI(
                    api_key=self._api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0
                )
            async with state.semaphore:
                return await self._judge(state.client, messages, output, spec)

    async def _judge(
        self, client: openai.AsyncOpenAI, messages: list[dict[str, str]], output: type[T], spec: OutputSpec
    ) -> Judgement[T]:
        input_tokens = output_tokens = attempts = failures = invalid = 0
        structured = self.structured_output
        rejection: openai.APIStatusError | None = None
        while True:
            attempts += 1
            try:
                completion = await self._create(client, messages, spec, structured)
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status in (401, 403):
                    raise JudgeAuthenticationError(
                        f"the LLM judge at {self._where()} refused the credentials (HTTP {status}): "
                        f"{_server_message(exc)}; check OPENAI_API_KEY or the judge's api_key"
                    ) from exc
                if structured and status in (400, 422):
                    structured, rejection = False, exc  # ask again with the schema in the prompt only
                    continue
                if status not in RETRYABLE_STATUS:
                    also = f" (with a JSON schema response format: {_server_message(rejection)})" if rejection else ""
                    raise JudgeRequestError(
                        f"the LLM judge at {self._where()} rejected the request (HTTP {status}): "
                        f"{_server_message(exc)}{also}"
                    ) from exc
                if failures >= self.retry.max_retries:
                    raise self._unavailable(f"HTTP {status}: {_server_message(exc)}", attempts) from exc
                await self.retry.sleep(self.retry.delay(failures, parse_retry_after(exc.response.headers)))
                failures += 1
                continue
            except (openai.APIConnectionError, openai.APIResponseValidationError) as exc:
                if failures >= self.retry.max_retries:
                    raise self._unavailable(f"{type(exc).__name__}: {exc}", attempts) from exc
                await self.retry.sleep(self.retry.delay(failures))
                failures += 1
                continue
            if rejection is not None:
                self.structured_output = False  # this server answers without a JSON schema format
            usage = completion.usage
            if usage is not None:
                input_tokens += usage.prompt_tokens or 0
                output_tokens += usage.completion_tokens or 0
            try:
                value = parse_output(_content(completion), output)
            except JudgeOutputError as exc:
                invalid += 1
                if invalid > self.output_retries:
                    raise JudgeOutputError(f"{exc} (after {invalid} answers from {self.model})") from exc
                continue
            cost = self.price.cost(input_tokens, output_tokens) if self.price else None
            model = completion.model or self.model
            return Judgement(value, model, input_tokens, output_tokens, cost, attempts)

    async def _create(
        self, client: openai.AsyncOpenAI, messages: list[dict[str, str]], spec: OutputSpec, structured: bool
    ) -> Any:
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if structured:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.name, "schema": spec.schema, "strict": True},
            }
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        return await client.chat.completions.create(**kwargs)

    def _where(self) -> str:
        return self.base_url or "api.openai.com"

    def _unavailable(self, last: str, attempts: int) -> JudgeUnavailableError:
        return JudgeUnavailableError(
            f"the LLM judge at {self._where()} kept failing after {attempts} attempts (last: {last}); "
            "the judge may be down or rate-limiting: retry later or lower max_concurrency"
        )


def _content(completion: Any) -> str | None:
    if not completion.choices:
        return None
    message = completion.choices[0].message
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


def resolve_llm_judge(model: str | LLMJudge | None) -> LLMJudge:
    """A metric's `model` argument as a judge: a model name, a judge object, or None for the default."""
    if isinstance(model, LLMJudge):
        return model
    if model is None or isinstance(model, str):
        return LLMJudge(model or DEFAULT_MODEL)
    raise JudgeConfigurationError(
        f"model must be a model name or an LLMJudge, not {type(model).__name__}"
    )
