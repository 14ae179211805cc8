"""An LLM judge over any OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, llama.cpp).

Every call is bounded: a per-judge concurrency cap, a timeout, retries with backoff that honour
Retry-After, and strict output parsing with a few retries for invalid answers. The output format falls
back per judge, on a refusal of the format whatever its status code: `json_schema`, then `json_object` with
the schema (llama.cpp's server), then plain JSON-in-text. Judges ask at temperature 0 (repeatable scores)
unless the model refuses a temperature. A prompt the server says is too long lowers the judge's window.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from tracejudge.errors import (
    JudgeAuthenticationError,
    JudgeConfigurationError,
    JudgeContextOverflowError,
    JudgeError,
    JudgeOutputError,
    JudgeRequestError,
    JudgeUnavailableError,
)
from tracejudge.judges.batch import BATCH_DISCOUNT, BatchOptions, BatchQueue
from tracejudge.judges.context_windows import (
    DEFAULT_CONTEXT_TOKENS,
    known_context_tokens,
    overflow_limit,
    prompt_budget,
)
from tracejudge.judges.exchanges import is_recording, record
from tracejudge.judges.images import with_images
from tracejudge.judges.loop_pool import LoopPool
from tracejudge.judges.pricing import TokenPrice, known_price
from tracejudge.judges.retry import Retry, RetryPolicy, call_with_retries, parse_retry_after, retryable_status
from tracejudge.judges.secret_mask import mask_secret, mask_url
from tracejudge.judges.ssl_context import shared_ssl_context
from tracejudge.judges.structured_output import parse_output
from tracejudge.judges.tokens import TokenCounter, counter_for_model
from tracejudge.prompts import OutputSpec

if TYPE_CHECKING:
    import openai

DEFAULT_MODEL = "gpt-5.4"
OUTPUT_FORMATS = ("json_schema", "json_object", "text")  # tried in this order, per judge
_FORMAT_WORDS = re.compile(r"response_format|json_schema|json_object|structured output|grammar|schema", re.I)
_TEMPERATURE = re.compile(r"temperature", re.I)


class _Refused(Exception):
    """The server refused one optional request field (`response_format` or `temperature`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

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
    cached_tokens: int = 0  # input tokens the server read from its prompt cache (priced at the cached rate)


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
        cached_input_price_per_token: float | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        max_concurrency: int = 8,
        output_retries: int = 2,
        temperature: float | None = 0.0,
        retry_policy: RetryPolicy | None = None,
        context_tokens: int | None = None,
        batch: BatchOptions | bool = False,
    ) -> None:
        """`temperature=None` sends none (the server's default); `context_tokens` is the model's window
        (default: the known window of OpenAI models, else 32,768); `batch=True` (or BatchOptions with a durable
        ledger) sends every request through the OpenAI Batch API at half price."""
        if not model or not isinstance(model, str):
            raise JudgeConfigurationError("the judge model must be a non-empty model name, e.g. 'gpt-5.4'")
        if (input_price_per_token is None) != (output_price_per_token is None):
            raise JudgeConfigurationError(
                "give both input_price_per_token and output_price_per_token (USD per token), or neither"
            )
        if max_concurrency < 1:
            raise JudgeConfigurationError("max_concurrency must be at least 1")
        if context_tokens is not None and context_tokens < 1024:
            raise JudgeConfigurationError(f"context_tokens must be at least 1024, not {context_tokens}")
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
            TokenPrice(input_price_per_token, output_price_per_token,  # type: ignore[arg-type]
                       cached_input_price_per_token)
            if input_price_per_token is not None else None
        )
        self.answered_model: str | None = None  # the model the server says answered, once one did
        self.timeout = timeout
        self.output_retries = output_retries
        self.temperature = temperature
        self.retry = retry_policy or RetryPolicy(max_retries=max_retries)
        self.output_format = OUTPUT_FORMATS[0]  # lowered for good when the server refuses a format
        self.format_confirmed = False  # a valid answer came back in `output_format`
        self.send_temperature = temperature is not None
        self.context_tokens = context_tokens or known_context_tokens(model) or DEFAULT_CONTEXT_TOKENS
        self.tokens: TokenCounter = counter_for_model(model)
        self._pool: LoopPool[openai.AsyncOpenAI] = LoopPool(self._new_client, lambda client: client.close(),
                                                            max_concurrency)
        options = BatchOptions() if batch is True else batch or None
        self.batch: BatchQueue | None = None if options is None else BatchQueue(
            self._new_client, options.ledger, flush_s=options.flush_s, max_requests=options.max_requests,
            poll_s=options.poll_s)

    def _new_client(self) -> openai.AsyncOpenAI:
        import openai  # on the first judge call: 27 MB a collector without an LLM judge never needs

        return openai.AsyncOpenAI(api_key=self._api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0,
                                  http_client=openai.DefaultAsyncHttpxClient(verify=shared_ssl_context()))

    def __repr__(self) -> str:
        return f"LLMJudge(model={self.model!r}, base_url={mask_url(self.base_url) if self.base_url else None!r})"

    @property
    def id(self) -> str:
        return f"llm:{self.model}"

    @property
    def price(self) -> TokenPrice | None:
        """Given prices, else the list price of the model that answered (or was asked for, before any answer)."""
        return self._given_price or known_price(self.answered_model or self.model)

    @property
    def structured_output(self) -> bool:
        """Whether the server is sent a JSON schema format (`json_schema` or `json_object` with a schema)."""
        return self.output_format != "text"

    @property
    def prompt_tokens(self) -> int:
        """The most tokens a prompt may take: the context window less room for the answer."""
        return prompt_budget(self.context_tokens)

    def lower_context(self, limit: int | None, built_for: int | None = None) -> None:
        """The server said a prompt built for a window of `built_for` tokens was too long: take the window it
        names when that is smaller than ours; else (no number, or our count was the problem) shrink ours by a
        quarter. A refusal of a prompt built before an earlier lowering changes nothing."""
        if built_for is not None and built_for > self.context_tokens:
            return  # concurrent calls sent before we learned the window: it is already lowered
        smaller = limit if limit is not None and limit < self.context_tokens else self.context_tokens * 3 // 4
        self.context_tokens = max(1024, smaller)

    def session(self) -> AbstractAsyncContextManager[None]:
        """Reuse one connection pool for the calls inside (metrics and `evaluate()` open one per run)."""
        return self._pool.session()

    async def complete(self, **request: Any) -> Any:
        """One chat completion under the concurrency cap, retried on 429, 5xx, timeouts and connection errors.

        Raises JudgeAuthenticationError (401/403), JudgeContextOverflowError, JudgeRequestError (other 4xx)
        or JudgeUnavailableError.
        """
        started = time.time()
        try:
            completion = await self._complete(request)
        except JudgeError as exc:
            record(self.id, {"model": self.model, **request}, None, str(exc), started)
            raise
        if is_recording():
            usage = getattr(completion, "usage", None)
            choices = getattr(completion, "choices", None) or []
            message = getattr(choices[0], "message", None) if choices else None
            record(self.id, {"model": self.model, **request},
                   getattr(message, "content", None) or getattr(message, "refusal", None), None, started,
                   getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)
        return completion

    async def _complete(self, request: dict[str, Any]) -> Any:
        if self.batch is not None:
            return await self._complete_in_batch(request)
        async with self._pool.slot() as client:
            try:
                return await call_with_retries(
                    self.retry,
                    lambda: client.chat.completions.create(model=self.model, **request),
                    lambda exc: self._classify(exc, request),
                    self._unavailable,
                )
            except (ValueError, TypeError, AttributeError) as exc:  # a 200 whose body is not a completion
                raise JudgeOutputError(
                    f"the LLM judge at {self._where()} answered with a malformed response: {type(exc).__name__}: "
                    f"{str(exc)[:200]}"
                ) from exc

    async def _complete_in_batch(self, request: dict[str, Any]) -> Any:
        """The request's line in a batch; a failed line is classified like the same synchronous answer."""
        assert self.batch is not None
        body = {"model": self.model, **request}
        answer = await self.batch.answer(body)
        if answer.status == 200:
            try:
                from openai.types.chat import ChatCompletion

                return ChatCompletion.model_validate(answer.body)
            except ValueError as exc:
                await self.batch.discard(body)
                raise JudgeOutputError(f"the LLM judge's batch answer is not a chat completion: {exc}") from exc
        response = httpx.Response(answer.status, json=answer.body,
                                  request=httpx.Request("POST", f"{self.base_url or 'https://api.openai.com/v1'}"))
        import openai

        error = openai.APIStatusError(str(answer.body)[:200], response=response, body=answer.body)
        retry = self._classify(error, request)
        raise self._unavailable(retry.what if retry else str(answer.body)[:200], 1)

    def _classify(self, exc: Exception, request: dict[str, Any] | None = None) -> Retry | None:
        import openai

        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (401, 403):
                raise JudgeAuthenticationError(
                    f"the LLM judge at {self._where()} refused the credentials (HTTP {status}): "
                    f"{self._server_message(exc)}; check OPENAI_API_KEY or the judge's api_key"
                ) from exc
            message = self._server_message(exc)
            if status not in (408, 409, 429):
                overflow = overflow_limit(message)
                if overflow is not False:
                    raise JudgeContextOverflowError(
                        f"the LLM judge at {self._where()} says the prompt is too long (HTTP {status}): {message}",
                        status=status, limit=overflow if isinstance(overflow, int) and overflow > 1 else None,
                    ) from exc
                request = request or {}
                client_error = status in (400, 422)
                if "temperature" in request and _TEMPERATURE.search(message) and (client_error or status >= 500):
                    raise _Refused("temperature", message) from exc
                if "response_format" in request and (client_error or _FORMAT_WORDS.search(message)):
                    raise _Refused("response_format", message) from exc
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
        input_tokens = output_tokens = cached_tokens = attempts = invalid = 0
        usage_known = True
        fmt, temperature = self.output_format, self.send_temperature
        while True:
            attempts += 1
            try:
                completion = await self.complete(**self._request(messages, spec, fmt, temperature))
            except _Refused as refused:
                if refused.field == "temperature":
                    temperature = self.send_temperature = False  # a reasoning model: its default only
                else:
                    fmt = self._lower_format(fmt, refused)
                continue
            usage = getattr(completion, "usage", None)
            if usage is not None and usage.prompt_tokens is not None:
                input_tokens += usage.prompt_tokens or 0
                output_tokens += usage.completion_tokens or 0
                cached_tokens += _cached_tokens(usage)
            else:
                usage_known = False  # the server did not say what it cost: cost unknown, not free
            model = getattr(completion, "model", None) or self.model
            self.answered_model = model
            price = self._given_price or known_price(model)  # the model that answered, not the one asked for
            cost = price.cost(input_tokens, output_tokens, cached_tokens) if price and usage_known else None
            if cost is not None and self.batch is not None:
                cost *= BATCH_DISCOUNT
            try:
                value = parse_output(_content(completion), output)
            except JudgeOutputError as exc:
                if self.batch is not None:  # ask again for real, not the same stored answer
                    await self.batch.discard({"model": self.model, **self._request(messages, spec, fmt, temperature)})
                invalid += 1
                if invalid > self.output_retries:
                    error = JudgeOutputError(f"{exc} (after {invalid} answers from {self.model})")
                    error.spent = (model, input_tokens, output_tokens, cost)
                    raise error from exc
                continue
            if fmt == self.output_format:
                self.format_confirmed = True
            elif OUTPUT_FORMATS.index(fmt) > OUTPUT_FORMATS.index(self.output_format):
                self.output_format, self.format_confirmed = fmt, True  # remembered for every later call
            return Judgement(value, model, input_tokens, output_tokens, cost, attempts, cached_tokens)

    def _lower_format(self, fmt: str, cause: Exception) -> str:
        """The next output format after a refusal; the refusal itself when there is none left."""
        if fmt == "text":
            raise JudgeRequestError(f"the LLM judge at {self._where()} rejected the request: {cause}") from cause
        return OUTPUT_FORMATS[OUTPUT_FORMATS.index(fmt) + 1]

    def _request(self, messages: list[dict[str, str]], spec: OutputSpec, fmt: str,
                 temperature: bool) -> dict[str, Any]:
        request: dict[str, Any] = {"messages": with_images(messages)}  # a case's images go as image parts
        if fmt == "json_schema":
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.name, "schema": spec.schema, "strict": True},
            }
        elif fmt == "json_object":
            request["response_format"] = {"type": "json_object", "schema": spec.schema}
        if temperature and self.temperature is not None:
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


def load_client_library() -> None:
    """Import the openai package now; the collector runs this in a thread when it has an LLM judge, so the first
    judge call does not stop its event loop (and ingest with it) for the half second the import takes."""
    import openai  # noqa: F401


def _cached_tokens(usage: Any) -> int:
    """OpenAI's `prompt_tokens_details.cached_tokens` (vLLM reports it too), 0 where absent."""
    details = getattr(usage, "prompt_tokens_details", None)
    if details is None:
        return 0
    cached = details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    return cached if isinstance(cached, int) and cached > 0 else 0


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
