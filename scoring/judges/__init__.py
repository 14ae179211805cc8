"""Judges the metrics ask: an LLM over any OpenAI-compatible API, and System One decision models."""

from tracejudge.judges.budget import Budget
from tracejudge.judges.llm import DEFAULT_MODEL, Judgement, LLMJudge
from tracejudge.judges.logprob import LogprobJudge
from tracejudge.judges.pricing import TokenPrice, known_price
from tracejudge.judges.questions import Answer, Choice, Question, ScoreLevels, YesNo
from tracejudge.judges.resolve import resolve_llm_judge, resolve_system_one_judge
from tracejudge.judges.retry import RetryPolicy
from tracejudge.judges.system_one import Decision, SystemOneJudge
from tracejudge.judges.typesafe import TypeSafeJudge

__all__ = [
    "DEFAULT_MODEL",
    "Answer",
    "Budget",
    "Choice",
    "Decision",
    "Judgement",
    "LLMJudge",
    "LogprobJudge",
    "Question",
    "RetryPolicy",
    "ScoreLevels",
    "SystemOneJudge",
    "TokenPrice",
    "TypeSafeJudge",
    "YesNo",
    "known_price",
    "resolve_llm_judge",
    "resolve_system_one_judge",
]
