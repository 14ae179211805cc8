"""When a simulated conversation ends: DeepEval's controller contract (`end()` / `proceed()`, arguments passed by
name), and by default when a judge says the golden's expected outcome has been reached."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Decision:
    should_end: bool
    reason: str | None = None


def proceed() -> Decision:
    """Go on: the simulated user speaks again (unless the turn limit is reached)."""
    return Decision(False)


def end(reason: str | None = None) -> Decision:
    """Stop the conversation here, saying why."""
    return Decision(True, reason)


CONTROLLER_ARGUMENTS = ("turns", "golden", "index", "thread_id", "simulated_user_turns", "max_user_simulations",
                        "last_user_turn", "last_assistant_turn")


def call_by_name(function: Any, available: dict[str, Any]) -> Any:
    """Call `function` with the arguments of `available` it names (a callback may take any subset, as DeepEval's)."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return function(**available)
    return function(**{name: value for name, value in available.items() if name in parameters})
