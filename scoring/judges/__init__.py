"""Judges the metrics ask: an LLM over any OpenAI-compatible API (System One judges come next)."""

from scoring.judges.llm import DEFAULT_MODEL, Judgement, LLMJudge, resolve_llm_judge
from scoring.judges.pricing import TokenPrice, known_price
from scoring.judges.retry import RetryPolicy

__all__ = [
    "DEFAULT_MODEL",
    "Judgement",
    "LLMJudge",
    "RetryPolicy",
    "TokenPrice",
    "known_price",
    "resolve_llm_judge",
]
