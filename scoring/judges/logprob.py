"""System One decisions from any OpenAI-compatible chat model's letter logprobs (vLLM, llama.cpp, Ollama).

Each question becomes one call: the options lettered A, B, C..., one output token, `top_logprobs`. The
probability of each option is the summed probability of the tokens that read as its letter (`A`, ` A`),
a letter missing from the top list gets a floor (the smallest returned probability times e^-5), and the
result is renormalised. The answers are not calibrated and say so.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple

from tracejudge.errors import JudgeConfigurationError, JudgeOutputError
from tracejudge.judges.budget import DEFAULT_BUDGET, Budget
from tracejudge.judges.llm import LLMJudge
from tracejudge.judges.questions import Answer, Question, answer_from_probabilities
from tracejudge.judges.system_one import Decision
from tracejudge.prompts import DATA_CLOSE, DATA_OPEN, GUARD, encode_data
from tracejudge.task_group import gather_all

MISSING_FLOOR = math.exp(-5)

_INSTRUCTIONS = (
    "You are a decision model. Read the state, then answer the question by choosing exactly one of the "
    "lettered options. Reply with the option's letter only: one capital letter, nothing else.\n\n" + GUARD
)


class _Asked(NamedTuple):
    answer: Answer
    input_tokens: int
    output_tokens: int
    cost: float | None
    model: str


class LogprobJudge:
    """A System One judge built on an LLM judge's endpoint; `model` is a model name or an LLMJudge."""

    calibrated = False
    one_call_per_question = True  # hybrid packing gives each question only its own task's state

    def __init__(self, model: str | LLMJudge, *, base_url: str | None = None, api_key: str | None = None,
                 top_logprobs: int = 20, budget: Budget = DEFAULT_BUDGET) -> None:
        self.llm = model if isinstance(model, LLMJudge) else LLMJudge(model, base_url=base_url, api_key=api_key)
        if not 1 <= top_logprobs <= 20:
            raise JudgeConfigurationError("top_logprobs must be between 1 and 20 (the OpenAI API's range)")
        self.top_logprobs = top_logprobs
        self.budget = budget

    def __repr__(self) -> str:
        return f"LogprobJudge(model={self.llm.model!r}, base_url={self.llm.base_url!r})"

    @property
    def id(self) -> str:
        return f"logprob:{self.llm.model}"

    def session(self) -> AbstractAsyncContextManager[None]:
        return self.llm.session()

    async def decide(self, state: Any, questions: Mapping[str, Question]) -> Decision:
        self.budget.plan(state, questions)
        async with self.session():
            results = await gather_all([self._ask(key, state, q) for key, q in questions.items()])
        costs = [r.cost for r in results]
        return Decision(
            answers={key: r.answer for key, r in zip(questions, results, strict=True)},
            model=results[0].model if results else self.llm.model,
            input_tokens=sum(r.input_tokens for r in results),
            output_tokens=sum(r.output_tokens for r in results),
            cost=None if None in costs else sum(costs),  # type: ignore[arg-type]
            requests=len(results),
            calibrated=False,
        )

    async def _ask(self, key: str, state: Any, question: Question) -> _Asked:
        options = list(question.options.items())
        if len(options) > self.top_logprobs:
            raise JudgeConfigurationError(
                f"question {key!r} has {len(options)} options, more than top_logprobs={self.top_logprobs} can read"
            )
        letters = string.ascii_uppercase[: len(options)]
        listed = "\n".join(f"{letter}. {_option_text(question, label, desc)}"
                           for letter, (label, desc) in zip(letters, options, strict=True))
        user = (f"{DATA_OPEN}\n{encode_data(state)}\n{DATA_CLOSE}\n\nQuestion: {question.instructions}\n\n"
                f"Options:\n{listed}\n\nAnswer with the letter only.")
        completion = await self.llm.complete(
            messages=[{"role": "system", "content": _INSTRUCTIONS}, {"role": "user", "content": user}],
            max_tokens=1, temperature=0, logprobs=True, top_logprobs=self.top_logprobs,
        )
        letter_p = _letter_probabilities(completion, letters, key, self.llm)
        answer = answer_from_probabilities(
            question, {label: letter_p[letter] for letter, (label, _) in zip(letters, options, strict=True)})
        usage = getattr(completion, "usage", None)
        in_t, out_t = (usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else (0, 0)
        cost = self.llm.price.cost(in_t, out_t) if self.llm.price and usage else None
        return _Asked(answer, in_t, out_t, cost, completion.model or self.llm.model)


def _option_text(question: Question, label: str, description: str | None) -> str:
    """A score level reads as its name; a yes/no or choice option as its label and description."""
    if question.kind == "score":
        return description or label
    return f"{label}: {description}" if description else label


def _letter_probabilities(completion: Any, letters: str, key: str, llm: LLMJudge) -> dict[str, float]:
    choice = completion.choices[0] if completion.choices else None
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    top = getattr(content[0], "top_logprobs", None) if content else None
    if not top:
        raise JudgeOutputError(
            f"the model {llm.model!r} at {llm.base_url or 'api.openai.com'} returned no logprobs for {key!r}; "
            "the logprob System One judge needs a server that returns top_logprobs (vLLM, llama.cpp server, "
            "Ollama, OpenAI), or use eval_mode='llm'"
        )
    mass = dict.fromkeys(letters, 0.0)
    returned = []
    for entry in top:
        logprob, token = getattr(entry, "logprob", None), getattr(entry, "token", None)
        if not isinstance(logprob, int | float) or not isinstance(token, str) or not math.isfinite(logprob):
            continue
        p = math.exp(logprob)
        returned.append(p)
        text = token.strip()
        if text in mass:
            mass[text] += p
    if not returned:
        raise JudgeOutputError(f"the model {llm.model!r} returned no usable logprobs for {key!r}")
    floor = min(returned) * MISSING_FLOOR
    return {letter: p if p > 0 else floor for letter, p in mass.items()}
