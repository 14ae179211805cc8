"""What the two MCP metrics share: eval modes, their judges, per-task decisions and the final reason.

- llm: every per-task decision by the LLM judge; final reason by the LLM.
- hybrid: every per-task decision by System One as a four-level score, packed into as few requests as the
  context budget allows; a decision System One cannot make (unreachable, overloaded, over budget, bad
  credentials) falls back to the LLM and says why in `system_one_fallback_reason`.
- system_one: one request over the whole conversation with weighted questions; no LLM at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from tracejudge.calibration import CALIBRATION_NOTE, CalibrationExample, fitting_examples
from tracejudge.errors import (
    ContextBudgetError,
    JudgeAuthenticationError,
    JudgeConfigurationError,
    JudgeContextOverflowError,
    JudgeError,
    JudgeUnavailableError,
    NoTaskError,
    TextOnlyJudgeError,
)
from tracejudge.eval_mode import EvalMode, resolve_eval_mode
from tracejudge.interactions import UNITS, Task, Units, conversation_data, render_tasks_text, split_tasks
from tracejudge.judges.budget import DEFAULT_BUDGET, estimate_tokens
from tracejudge.judges.context_windows import reads_text_only
from tracejudge.judges.llm import LLMJudge
from tracejudge.judges.questions import Question, ScoreLevels
from tracejudge.judges.resolve import resolve_llm_judge, resolve_system_one_judge
from tracejudge.judges.structured_output import ReasonVerdict, ScoreVerdict
from tracejudge.judges.system_one import Decision
from tracejudge.judges.tokens import CharCounter
from tracejudge.metric import BaseMetric, Scored, Usage
from tracejudge.prompt_reduction import Reduction, reduce_to_fit
from tracejudge.prompts import FINAL_REASON, REASON_OUTPUT, SCORE_OUTPUT, fit_messages
from tracejudge.system_one_mode import WeightedQuestion, deterministic_reason, equation, weighted_score
from tracejudge.task_group import gather_all
from tracejudge.test_case import ConversationalTestCase

T = TypeVar("T")
NO_DEEPEVAL_UNIT = ("Score 0: the conversation has no unit interaction of more than two turns (a user message "
                    "followed by at least two assistant turns), and DeepEval scores such a conversation 0 "
                    "(units=\"deepeval\"). The default units judge every user request.")
OVERFLOW_RETRIES = 3  # a judge that keeps saying "too long" after this many smaller prompts fails the call


@dataclass(frozen=True)
class Ask:
    """One per-task decision: the LLM prompt that can make it and the System One question that can."""

    key: str
    task: Task
    judge_name: str
    instructions: str
    data: dict[str, Any]
    levels: tuple[str, ...]
    question: str
    render: Callable[[dict[str, Any]], str] | None = None  # a user's prompt template instead of ours


@dataclass(frozen=True)
class Verdict:
    score: float
    reason: str
    decided_by: str
    confidence: float | None = None
    fallback: str | None = None
    calibrated: bool | None = None


class JudgedMetric(BaseMetric):
    system_one_questions: ClassVar[tuple[WeightedQuestion, ...]]
    include_inventory: ClassVar[bool]

    def __init__(
        self,
        threshold: float | None = 0.5,
        model: str | LLMJudge | None = None,
        include_reason: bool = True,
        strict_mode: bool = False,
        async_mode: bool = True,
        verbose_mode: bool = False,
        flaky: bool = False,
        system_one_model: Any = None,
        eval_mode: str | EvalMode | None = None,
        units: Units = "every_unit",
        calibration_examples: Sequence[CalibrationExample] = (),
    ) -> None:
        """`units="deepeval"` splits tasks as DeepEval does (units of more than two turns only; a conversation
        without one scores 0), for users who need DeepEval's numbers; the default judges every unit.
        `calibration_examples`: reviewers' corrections of this metric, most informative first, shown to the LLM
        judge before each conversation (tracejudge.calibration)."""
        if units not in UNITS:
            raise ValueError(f"units must be one of {', '.join(UNITS)}, not {units!r}")
        super().__init__(threshold, include_reason, strict_mode, async_mode, verbose_mode, flaky)
        self.units: Units = units
        self.eval_mode = resolve_eval_mode(eval_mode)
        self.model = resolve_llm_judge(model) if self.eval_mode is not EvalMode.SYSTEM_ONE else None
        self.system_one_missing: str | None = None  # hybrid without a System One judge: why the LLM decides
        try:
            self.system_one = (resolve_system_one_judge(system_one_model)
                               if self.eval_mode is not EvalMode.LLM else None)
        except JudgeConfigurationError as exc:
            if self.eval_mode is not EvalMode.HYBRID:
                raise
            self.system_one = None  # hybrid promises the LLM decides what System One cannot
            self.system_one_missing = f"no System One judge ({exc}); the LLM decided"
        self.system_one_model = system_one_model
        self._prefetched: Decision | BaseException | None = None
        self.calibration_examples = tuple(calibration_examples)

    def _reset(self) -> None:
        super()._reset()
        self.system_one_fallback_reason: str | None = None

    def use_decision(self, decision: Decision | BaseException) -> None:
        """Score the next measure from a System One decision made for several metrics at once (evaluate())."""
        self._prefetched = decision

    async def a_measure(self, test_case: ConversationalTestCase | dict[str, Any]) -> float | None:
        async with AsyncExitStack() as stack:
            for judge in (self.model, self.system_one):
                if judge is not None:
                    await stack.enter_async_context(judge.session())
            return await super().a_measure(test_case)

    def needs_no_judge(self, test_case: ConversationalTestCase) -> bool:
        """DeepEval's units and no unit qualifies: the score is 0 without a judge (nor a shared System One request)."""
        return self.units == "deepeval" and not split_tasks(test_case, "deepeval")

    async def _score(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        model = getattr(self.model, "model", None)
        if test_case.multimodal and isinstance(model, str) and reads_text_only(model):
            raise TextOnlyJudgeError(f"the test case holds images (MLLMImage) and the judge model {model!r} reads "
                                     "text only: pass a model that reads images, such as gpt-4o or gpt-4.1")
        if self.needs_no_judge(test_case):
            return Scored(0.0, {"eval_mode": self.eval_mode.value, "units": "deepeval", "tasks": [],
                                "equation": "0: no unit interaction of more than two turns (DeepEval's rule)"},
                          reason=NO_DEEPEVAL_UNIT, detail=[])
        if self.eval_mode is EvalMode.SYSTEM_ONE:
            return await self._score_system_one(test_case, usage)
        return await self._score_tasks(test_case, usage)

    async def _score_tasks(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        raise NotImplementedError

    async def _gather(self, calls: Sequence[Awaitable[T]]) -> list[T]:
        """Independent judge calls: concurrently in async mode (the judge caps them), else one by one."""
        if self.async_mode:
            return await gather_all(calls)
        return [await call for call in calls]

    # --- per-task decisions (llm and hybrid) ---------------------------------------------------------

    async def _decide(self, asks: list[Ask], usage: Usage, shared: dict[str, Any]) -> dict[str, Verdict]:
        """Every ask decided: by the LLM in llm mode, else by System One with per-decision LLM fallback."""
        if self.eval_mode is EvalMode.LLM or self.system_one is None:
            if self.system_one_missing is not None:
                self.system_one_fallback_reason = self.system_one_missing
            verdicts = await self._gather([self._ask_llm(a, usage, self.system_one_missing) for a in asks])
            return {a.key: v for a, v in zip(asks, verdicts, strict=True)}
        decided: dict[str, Verdict] = {}
        fallbacks: list[tuple[Ask, str]] = []
        groups, oversized = self._pack(asks, shared)
        fallbacks += [(a, "context budget exceeded: the task alone is too large for System One") for a in oversized]
        disabled: str | None = None
        for group in groups:
            if disabled is not None:
                fallbacks += [(a, disabled) for a in group]
                continue
            try:
                decision = await self._system_one_decide(group, shared)
            except JudgeAuthenticationError as exc:
                disabled = f"System One disabled for this measure: {exc}"
                fallbacks += [(a, disabled) for a in group]
                continue
            except (JudgeUnavailableError, ContextBudgetError) as exc:
                fallbacks += [(a, f"{type(exc).__name__}: {exc}") for a in group]
                continue
            usage.add(decision.model, decision.input_tokens, decision.output_tokens, decision.cost,
                      system_one_requests=decision.requests)
            for ask in group:
                answer = decision.answers[ask.key]
                level = ask.levels[int(answer.most_likely)]
                decided[ask.key] = Verdict(
                    answer.value,
                    f"System One: most likely \"{level}\" (expected level {answer.expected_level:.2f} of "
                    f"{len(ask.levels) - 1}, confidence {answer.confidence:.2f})",
                    f"system_one:{decision.model}",
                    answer.confidence,
                    calibrated=decision.calibrated,
                )
        if fallbacks:
            causes = list(dict.fromkeys(cause for _, cause in fallbacks))
            self.system_one_fallback_reason = "; ".join(causes)
            verdicts = await self._gather([self._ask_llm(a, usage, cause) for a, cause in fallbacks])
            decided.update({a.key: v for (a, _), v in zip(fallbacks, verdicts, strict=True)})
        return decided

    async def _ask_llm(self, ask: Ask, usage: Usage, fallback: str | None = None) -> Verdict:
        instructions, data = ask.instructions, ask.data
        examples = self._calibration()
        if examples:  # first in the data: the same bytes open every request of this metric, so they stay cached
            instructions, data = f"{instructions}\n\n{CALIBRATION_NOTE}", {"reviewed_examples": examples, **data}
        verdict = await self._llm(usage, ask.judge_name, instructions, data, ScoreVerdict, ask.key, ask.render)
        assert self.model is not None
        return Verdict(verdict.score, verdict.reason, self.model.id, fallback=fallback)

    def _calibration(self) -> list[dict[str, Any]]:
        """The calibration examples that fit this judge's prompt budget (cached in `fitting_examples`: every job's
        copy of the metric asks again)."""
        if not self.calibration_examples or self.model is None:
            return []
        return fitting_examples(self.calibration_examples, self.model.prompt_tokens, self.model.tokens)

    async def _llm(self, usage: Usage, name: str, instructions: str, data: dict[str, Any], output: type[Any],
                   part: str = "final_reason", render: Callable[[dict[str, Any]], str] | None = None) -> Any:
        """One judged answer, its prompt reduced to the judge's window (and again if the server says so)."""
        assert self.model is not None
        spec = REASON_OUTPUT if output is ReasonVerdict else SCORE_OUTPUT
        for overflows in range(OVERFLOW_RETRIES + 1):
            window = self.model.context_tokens
            # counting tokens of a large conversation takes a while: off the event loop the receivers share
            messages, reduction = await asyncio.to_thread(fit_messages, name, instructions, data, spec,
                                                          self.model.prompt_tokens, self.model.tokens, render)
            try:
                judgement = await self.model.judge(messages, output, spec)
            except JudgeContextOverflowError as exc:
                if overflows == OVERFLOW_RETRIES:
                    raise
                self.model.lower_context(exc.limit, window)
                continue
            except JudgeError as exc:
                if exc.spent is not None:  # tokens of answers that were not usable still cost money
                    usage.add(*exc.spent)
                raise
            break
        if reduction is not None:
            usage.prompt_reductions.append({"part": part, "judge": name, **reduction.as_dict()})
        usage.add(judgement.model, judgement.input_tokens, judgement.output_tokens, judgement.cost,
                  cached_tokens=judgement.cached_tokens)
        return judgement.value

    @staticmethod
    def _task_state(task: Task) -> dict[str, Any]:
        return {"task_index": task.index, **task.data()}

    def _questions(self, asks: list[Ask]) -> dict[str, Question]:
        return {a.key: ScoreLevels(a.question, a.levels) for a in asks}

    def _pack(self, asks: list[Ask], shared: dict[str, Any]) -> tuple[list[list[Ask]], list[Ask]]:
        """Group asks by task into as few System One requests as the budget allows; too-large tasks apart."""
        budget = getattr(self.system_one, "budget", DEFAULT_BUDGET)
        by_task: dict[int, list[Ask]] = {}
        for ask in asks:
            by_task.setdefault(ask.task.index, []).append(ask)
        if getattr(self.system_one, "one_call_per_question", False):
            return list(by_task.values()), []  # the judge asks each question on its own: one task per state
        base = estimate_tokens(shared)
        groups: list[list[Ask]] = []
        oversized: list[Ask] = []
        state_tokens, q_tokens, current = base, [], []  # type: ignore[var-annotated]
        for task_asks in by_task.values():
            t_state = estimate_tokens(self._task_state(task_asks[0].task))
            t_q = [estimate_tokens(q.wire()) for q in self._questions(task_asks).values()]
            if not budget.fits(base + t_state, t_q):
                oversized += task_asks
                continue
            if current and not budget.fits(state_tokens + t_state, q_tokens + t_q):
                groups.append(current)
                state_tokens, q_tokens, current = base, [], []
            current = current + task_asks
            state_tokens += t_state
            q_tokens = q_tokens + t_q
        if current:
            groups.append(current)
        return groups, oversized

    async def _system_one_decide(self, group: list[Ask], shared: dict[str, Any]) -> Decision:
        assert self.system_one is not None
        tasks = list({a.task.index: self._task_state(a.task) for a in group}.values())
        return await self.system_one.decide({**shared, "tasks": tasks}, self._questions(group))

    # --- system_one ----------------------------------------------------------------------------------

    def system_one_request(self, test_case: ConversationalTestCase) -> tuple[dict[str, Any], dict[str, Question]]:
        """The state and the weighted questions of metrics.md section 7 for this conversation, the state reduced
        (as llm prompts are) when it would not fit System One's budget with the longest question."""
        return self._system_one_request(test_case)[:2]

    def _system_one_request(
        self, test_case: ConversationalTestCase
    ) -> tuple[dict[str, Any], dict[str, Question], Reduction | None]:
        if not any(t.role == "user" for t in test_case.turns):
            raise NoTaskError("the conversation has no user turn, so there is no task to judge")
        state = conversation_data(test_case, include_inventory=self.include_inventory)
        questions = {q.key: q.question for q in self.system_one_questions}
        budget = getattr(self.system_one, "budget", DEFAULT_BUDGET)
        room = budget.state_and_question - max(estimate_tokens(q.wire()) for q in questions.values())
        state, reduction = reduce_to_fit(state, estimate_tokens, room, CharCounter().name)
        return state, questions, reduction

    async def _score_system_one(self, test_case: ConversationalTestCase, usage: Usage) -> Scored:
        assert self.system_one is not None
        state, questions, reduction = self._system_one_request(test_case)
        if reduction is not None:
            usage.prompt_reductions.append({"part": "conversation", "judge": "system_one", **reduction.as_dict()})
        prefetched, self._prefetched = self._prefetched, None
        if isinstance(prefetched, BaseException):
            raise prefetched
        decision = prefetched or await self.system_one.decide(state, questions)
        usage.add(decision.model, decision.input_tokens, decision.output_tokens, decision.cost,
                  system_one_requests=decision.requests)
        answers = decision.answers
        qs = self.system_one_questions
        rows = [
            {"key": q.key, "label": q.label, "weight": q.weight, "type": answers[q.key].kind,
             "probabilities": answers[q.key].probabilities, "value": answers[q.key].value,
             "confidence": answers[q.key].confidence, "most_likely": answers[q.key].most_likely,
             "passes": answers[q.key].passes, "decided_by": f"system_one:{decision.model}"}
            for q in qs
        ]
        breakdown = {"eval_mode": "system_one", "units": self.units, "equation": equation(qs), "questions": rows,
                     "model": decision.model, "calibrated": decision.calibrated,
                     "shared_request": prefetched is not None}
        return Scored(
            weighted_score(qs, answers), breakdown,
            logs=render_tasks_text(split_tasks(test_case)),
            detail=(decision.model, answers),
            confidence=min(a.confidence for a in answers.values()),
            strict_pass=all(answers[q.key].passes for q in qs),
        )

    # --- final reason --------------------------------------------------------------------------------

    async def _reason(self, scored: Scored, usage: Usage) -> str | None:
        if scored.reason is NO_DEEPEVAL_UNIT:
            return NO_DEEPEVAL_UNIT
        if self.eval_mode is EvalMode.SYSTEM_ONE:
            model, answers = scored.detail
            assert self.score is not None
            return deterministic_reason(self.display_name, model, self.system_one_questions, answers,
                                        self.score, self.strict_mode)
        data = {
            "metric": self.display_name,
            "score": self.score,
            "threshold": self.threshold,
            "passed": self.success,
            "strict_mode": self.strict_mode,
            "tasks": scored.detail,
        }
        verdict = await self._llm(usage, "final_reason", FINAL_REASON, data, ReasonVerdict,
                                  render=self._final_reason_render())
        return verdict.reason

    def _final_reason_render(self) -> Callable[[dict[str, Any]], str] | None:
        """A user's template for the final reason prompt (MCP Task Completion's `evaluation_template`)."""
        return None

    def _verdict_breakdown(self, verdict: Verdict) -> dict[str, Any]:
        row: dict[str, Any] = {"decided_by": verdict.decided_by}
        if verdict.confidence is not None:
            row["confidence"] = verdict.confidence
        if verdict.calibrated is not None:
            row["calibrated"] = verdict.calibrated
        if verdict.fallback is not None:
            row["system_one_fallback_reason"] = verdict.fallback
        return row

    def _task_confidence(self, verdicts: list[Verdict]) -> float | None:
        values = [v.confidence for v in verdicts if v.confidence is not None]
        return min(values) if values else None



def task_scores(breakdown: dict[str, Any] | None) -> list[float]:
    """Each judged task's score from a judged metric's breakdown, in task order (MCP use: the task's minimum of
    primitive and argument scores; task completion: its completion score)."""
    out = []
    for task in (breakdown or {}).get("tasks") or []:
        value = task.get("alignment_score", task.get("score"))
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append(float(value))
    return out
