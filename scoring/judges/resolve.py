"""Turn a metric's `model` and `system_one_model` arguments into judge objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracejudge.errors import JudgeConfigurationError
from tracejudge.judges.batch import BatchLedger, BatchOptions
from tracejudge.judges.llm import DEFAULT_MODEL, LLMJudge
from tracejudge.judges.logprob import LogprobJudge
from tracejudge.judges.system_one import SystemOneJudge
from tracejudge.judges.typesafe import DEFAULT_MODEL as DEFAULT_SYSTEM_ONE_MODEL
from tracejudge.judges.typesafe import TypeSafeJudge


def resolve_llm_judge(model: str | LLMJudge | None) -> LLMJudge:
    """A model name (OpenAI-compatible API), a judge object, or None for the default model."""
    if isinstance(model, LLMJudge):
        return model
    if model is None or isinstance(model, str):
        return LLMJudge(model or DEFAULT_MODEL)
    raise JudgeConfigurationError(f"model must be a model name or an LLMJudge, not {type(model).__name__}")


@dataclass(frozen=True)
class JudgeOptions:
    """How an LLM judge built from settings talks to its server: request timeout, requests in flight, the
    model's context window (None: known or default) and temperature (None: the server's default)."""

    timeout_s: float = 60.0
    concurrency: int = 8
    context_tokens: int | None = None
    temperature: float | None = 0.0
    batch: bool = False
    batch_flush_s: float = 5.0
    batch_poll_s: float = 30.0

    def llm_judge(self, model: str | None, ledger: BatchLedger | None = None) -> LLMJudge:
        """The judge; with `batch`, its requests go through the Batch API, recorded in `ledger`."""
        batch = BatchOptions(ledger, self.batch_flush_s, poll_s=self.batch_poll_s) if self.batch else False
        return LLMJudge(model or DEFAULT_MODEL, timeout=self.timeout_s, max_concurrency=self.concurrency,
                        context_tokens=self.context_tokens, temperature=self.temperature, batch=batch)


LOGPROB_PREFIX = "logprob:"


def resolve_system_one_judge(value: Any) -> SystemOneJudge:
    """None (TypeSafe `jev-latest`), a TypeSafe model name, `logprob:<model>` (letter logprobs of an
    OpenAI-compatible model at OPENAI_BASE_URL), or a System One judge object."""
    if isinstance(value, str) and value.startswith(LOGPROB_PREFIX):
        return LogprobJudge(value.removeprefix(LOGPROB_PREFIX) or DEFAULT_MODEL)
    if value is None or isinstance(value, str):
        return TypeSafeJudge(value or DEFAULT_SYSTEM_ONE_MODEL)
    if isinstance(value, SystemOneJudge):
        return value
    raise JudgeConfigurationError(
        "system_one_model must be a TypeSafe model name (e.g. 'jev-latest'), 'logprob:<model>', or a System One "
        "judge such as "
        f"TypeSafeJudge or LogprobJudge, not {type(value).__name__}"
    )
