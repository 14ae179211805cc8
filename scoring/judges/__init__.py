"""Judges the metrics ask: an LLM over any OpenAI-compatible API, and System One decision models."""

from scoring.judges.budget import Budget
from scoring.judges.llm import DEFAULT_MODEL, Judgement, LLMJudge
from scoring.judges.logprob import LogprobJudge
from scoring.judges.pricing import TokenPrice, known_price
from scoring.judges.questions import Answer, Choice, Question, ScoreLevels, YesNo
from scoring.judges.resolve import resolve_llm_judge, resolve_system_one_judge
from scoring.judges.retry import RetryPolicy
from scoring.judges.system_one import Decision, SystemOneJudge
from scoring.judges.typesafe import TypeSafeJudge

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
