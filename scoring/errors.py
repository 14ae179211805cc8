"""Error types of the evaluation library; each message says what to do next."""

from __future__ import annotations


class TracejudgeError(Exception):
    """Base of every error tracejudge raises on purpose."""


class InvalidTestCaseError(TracejudgeError, ValueError):
    """A test case does not validate; `problems` lists each one with the turn and field it is in."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid test case: " + "; ".join(problems))


class NoTaskError(TracejudgeError, ValueError):
    """The conversation has nothing to judge (no user turn, or no agent response for this metric)."""


class EvalModeError(TracejudgeError, ValueError):
    """An eval mode is unknown or not available."""


class JudgeConfigurationError(TracejudgeError):
    """A judge cannot be built from the settings given (missing key, bad price, ...)."""


class TextOnlyJudgeError(TracejudgeError, ValueError):
    """A test case with images (MLLMImage placeholders) and a judge model known to read text only: DeepEval's
    ValueError, raised before any judge call."""


class JudgeError(TracejudgeError):
    """A judge call failed; the metric records the message in `error`.

    `spent` is (model, input tokens, output tokens, cost) of answers received before the failure, so the
    metric can still account for them.
    """

    spent: tuple[str, int, int, float | None] | None = None


class JudgeUnavailableError(JudgeError):
    """The judge could not be reached or kept failing (429, 5xx, timeouts) after every retry."""


class JudgeAuthenticationError(JudgeError):
    """The judge refused the credentials (401/403); retrying will not help."""


class JudgeRequestError(JudgeError):
    """The judge rejected the request itself (4xx other than 401/403/429); `status` is the HTTP status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class JudgeContextOverflowError(JudgeRequestError):
    """The judge said the prompt exceeds its context window; `limit` is the window it named, if any.

    Metrics answer it by lowering the judge's `context_tokens` and sending a smaller prompt."""

    def __init__(self, message: str, status: int | None = None, limit: int | None = None) -> None:
        super().__init__(message, status)
        self.limit = limit


class JudgeOutputError(JudgeError):
    """The judge kept answering with output that is not the JSON object asked for."""


class ContextBudgetError(JudgeError):
    """The conversation does not fit the System One context budget; llm mode can still score it."""


class EvaluationError(TracejudgeError):
    """A metric failed during `evaluate()` with `ErrorConfig(ignore_errors=False)`, as DeepEval raises."""
