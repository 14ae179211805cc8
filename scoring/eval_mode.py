"""Which eval mode a metric runs in: its argument, else TRACEJUDGE_EVAL_MODE, else the config file, else llm."""

from __future__ import annotations

import os
import tomllib
from enum import StrEnum
from pathlib import Path

from tracejudge.errors import EvalModeError


class EvalMode(StrEnum):
    LLM = "llm"
    HYBRID = "hybrid"
    SYSTEM_ONE = "system_one"


_VALID = ", ".join(repr(m.value) for m in EvalMode)


def _parse(value: str, source: str) -> EvalMode:
    try:
        return EvalMode(value.strip().lower())
    except ValueError:
        raise EvalModeError(f"unknown eval mode {value!r} from {source}; valid values: {_VALID}") from None


def config_path() -> Path:
    """The config file the CLI and the collector read: TRACEJUDGE_CONFIG, else ./tracejudge.toml."""
    return Path(os.environ.get("TRACEJUDGE_CONFIG") or "tracejudge.toml")


def _from_config_file() -> tuple[str, str] | None:
    path = config_path()
    if not path.is_file():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EvalModeError(f"cannot read the eval mode from {path}: {exc}") from exc
    section = data.get("scoring", {})
    if not isinstance(section, dict):
        raise EvalModeError(f"'scoring' in {path} must be a table ([scoring]), not a {type(section).__name__}")
    value = section.get("eval_mode")
    if value is None:
        return None
    if not isinstance(value, str):
        raise EvalModeError(f"[scoring] eval_mode in {path} must be a string; valid values: {_VALID}")
    return value, f"[scoring] eval_mode in {path}"


def resolve_eval_mode(value: str | EvalMode | None) -> EvalMode:
    """The effective mode; raises EvalModeError naming the valid values for an unknown one."""
    if value is not None:
        mode = _parse(str(value), "the eval_mode argument")
    elif env := os.environ.get("TRACEJUDGE_EVAL_MODE"):
        mode = _parse(env, "TRACEJUDGE_EVAL_MODE")
    elif found := _from_config_file():
        mode = _parse(*found)
    else:
        mode = EvalMode.LLM
    return mode
