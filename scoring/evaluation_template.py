"""DeepEval's `evaluation_template` for MCP Task Completion: a class whose static methods return prompt text.

A subclass that overrides a method sends that method's text as the judge prompt (one user message,
answered as JSON `{"score", "reason"}` or `{"reason"}`), as DeepEval does. A method left alone keeps
tracejudge's own prompt: instructions in a constant system message and the conversation as a delimited
data block, which guards against prompt injection and lets providers cache the prefix. Overrides declare
only the variables they use, as in DeepEval: `task`, `steps_taken`, `multimodal`, `strict` for a task's
score; `final_score`, `success`, `reasons`, `multimodal`, `strict` for the final reason.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from tracejudge.interactions import step_text
from tracejudge.prompts import FINAL_REASON, TASK_COMPLETION


class TemplateTask(BaseModel):
    """DeepEval's `Task`: what the user asked and the agent's steps as text, what a template interpolates."""

    task: str
    steps_taken: list[str] = Field(default_factory=list)


class MCPTaskCompletionTemplate:
    """tracejudge's prompts for MCP Task Completion. Subclass it and override a method to send your own text;
    pass the subclass as `MCPTaskCompletionMetric(evaluation_template=...)`."""

    @staticmethod
    def get_task_completion_score(task: TemplateTask, steps_taken: str, multimodal: bool = False) -> str:
        """The prompt for one task's score, as text (what an override replaces)."""
        return (f"{TASK_COMPLETION}\n\nAnswer with one JSON object with the keys 'score' (0 to 1) and "
                f"'reason'.\n\nUser task:\n{task.task}\n\nAgent steps:\n{steps_taken}\n\nJSON:")

    @staticmethod
    def generate_final_reason(final_score: float, success: bool | None, reasons: list[str]) -> str:
        """The prompt for the final reason, as text (what an override replaces)."""
        return (f"{FINAL_REASON}\n\nAnswer with one JSON object with the key 'reason'.\n\nScore: {final_score}\n"
                f"Passed: {success}\nReasons per task:\n{json.dumps(reasons, ensure_ascii=False)}\n\nJSON:")


def overridden(template: type | None, method: str) -> Callable[..., str] | None:
    """The template's own `method` when it replaces tracejudge's, else None (the built-in prompt is used)."""
    if template is None or template is MCPTaskCompletionTemplate:
        return None
    found = getattr(template, method, None)
    if found is None or found is getattr(MCPTaskCompletionTemplate, method):
        return None
    if not callable(found):
        raise TypeError(f"evaluation_template.{method} must be a static method returning the prompt text")
    check_override(found, method)
    return found


# what each method is given, in DeepEval's order (older DeepEval templates take them by position)
VARIABLES = {"get_task_completion_score": ("task", "steps_taken", "multimodal", "strict"),
             "generate_final_reason": ("final_score", "success", "reasons", "multimodal", "strict")}


def _arguments(method: Callable[..., str], name: str, context: dict[str, Any]) -> inspect.BoundArguments:
    """The override's arguments as DeepEval gives them: a parameter named after a variable gets it (all of them
    with **kwargs); any other required parameter takes the next variable not yet given, in DeepEval's order (older
    DeepEval templates take them by position); an unnamed parameter with a default keeps it."""
    signature = inspect.signature(method)
    parameters = [p for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    by_name = {p.name for p in parameters if p.kind is not p.POSITIONAL_ONLY and p.name in context}
    spare = [v for v in VARIABLES[name] if v not in by_name]
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    given = set(by_name)
    for p in parameters:
        if p.name in by_name:
            value = context[p.name]
        elif p.default is p.empty and spare:
            variable = spare.pop(0)
            given.add(variable)
            value = context[variable]
        elif p.default is not p.empty:
            continue
        else:
            raise TypeError(f"parameter {p.name!r} is left without a variable")
        if p.kind is p.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[p.name] = value
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        kwargs.update({k: v for k, v in context.items() if k not in given and k not in kwargs})
    return signature.bind(*args, **kwargs)


def check_override(method: Callable[..., str], name: str) -> None:
    """Fail at construction, not mid-run, for an override that cannot take DeepEval's variables."""
    try:
        _arguments(method, name, {v: None for v in VARIABLES[name]})
    except (TypeError, ValueError) as exc:
        raise TypeError(f"evaluation_template.{name} cannot be called with DeepEval's variables "
                        f"({', '.join(VARIABLES[name])}): {exc}") from exc


def call_declared(method: Callable[..., str], name: str, context: dict[str, Any]) -> str:
    """Call an override as DeepEval does (see `_arguments`) and check it gave text."""
    bound = _arguments(method, name, context)
    prompt = method(*bound.args, **bound.kwargs)
    if not isinstance(prompt, str):
        raise TypeError(f"evaluation_template.{name} returned {type(prompt).__name__}, not the prompt text")
    return prompt


def task_prompt(method: Callable[..., str], data: dict[str, Any], multimodal: bool, strict: bool) -> str:
    """An override's prompt for one task, from the task's judge data (reduced to fit, when it had to be)."""
    steps = [step_text(step) for step in data.get("steps", [])]
    task = TemplateTask(task=data.get("task", ""), steps_taken=steps)
    return call_declared(method, "get_task_completion_score", {
        "task": task, "steps_taken": "\n".join(steps), "multimodal": multimodal, "strict": strict})


def final_reason_prompt(method: Callable[..., str], data: dict[str, Any], multimodal: bool) -> str:
    """An override's prompt for the final reason, from the final-reason judge data."""
    reasons = [str(task.get("reason", "")) for task in data.get("tasks", [])]
    return call_declared(method, "generate_final_reason", {
        "final_score": data.get("score"), "success": data.get("passed"), "reasons": reasons,
        "multimodal": multimodal, "strict": data.get("strict_mode")})
