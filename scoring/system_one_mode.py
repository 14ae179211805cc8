"""system_one mode: weighted questions over the whole conversation, their score, and a deterministic reason.

Score = sum(weight * value) / sum(weights); with weights 2, 1, 1 that is (2 v0 + v1 + v2) / 4. The reason is
built from the answers alone, so identical answers always give identical text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tracejudge.judges.questions import Answer, Question


@dataclass(frozen=True)
class WeightedQuestion:
    key: str
    label: str
    weight: int
    question: Question


def weighted_score(questions: Sequence[WeightedQuestion], answers: Mapping[str, Answer]) -> float:
    total = sum(q.weight for q in questions)
    return sum(q.weight * answers[q.key].value for q in questions) / total


def equation(questions: Sequence[WeightedQuestion]) -> str:
    terms = " + ".join(f"{q.weight}*v{i}" if q.weight != 1 else f"v{i}" for i, q in enumerate(questions))
    return f"({terms}) / {sum(q.weight for q in questions)}"


def probability_words(p: float) -> str:
    if p >= 0.85:
        return "clearly holds"
    if p >= 0.65:
        return "likely holds"
    if p >= 0.35:
        return "unclear"
    if p >= 0.15:
        return "likely fails"
    return "clearly fails"


def _answer_line(q: WeightedQuestion, a: Answer) -> str:
    head = f"{q.key} (weight {q.weight}) {q.label}:"
    if a.kind == "yes_no":
        return f"{head} {probability_words(a.value)} (P(yes) = {a.value:.2f}, confidence {a.confidence:.2f})"
    if a.kind == "score":
        levels = q.question.options
        name = levels.get(a.most_likely, a.most_likely)
        return (f"{head} most likely \"{name}\" (expected level {a.expected_level or 0.0:.2f} of {a.size - 1}, "
                f"value {a.value:.3f}, confidence {a.confidence:.2f})")
    return f"{head} most likely \"{a.most_likely}\" (P = {a.value:.2f}, confidence {a.confidence:.2f})"


def deterministic_reason(metric: str, model: str, questions: Sequence[WeightedQuestion],
                         answers: Mapping[str, Answer], final_score: float, strict: bool) -> str:
    confidence = min(answers[q.key].confidence for q in questions)
    lines = [f"System One model {model} judged {metric}; minimum confidence {confidence:.2f}."]
    lines += [_answer_line(q, answers[q.key]) for q in questions]
    weighted = weighted_score(questions, answers)
    terms = " + ".join(f"{q.weight} x {answers[q.key].value:.3f}" for q in questions)
    lines.append(f"Weighted score {weighted:.3f} = ({terms}) / {sum(q.weight for q in questions)}.")
    if strict:
        failing = [q.key for q in questions if not answers[q.key].passes]
        lines.append("Strict mode: every question passes, score 1." if not failing else
                     f"Strict mode: {', '.join(failing)} do not pass, score {final_score:.0f}.")
    return "\n".join(lines)
