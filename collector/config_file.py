"""Edit one setting of `tracejudge.toml` in place, keeping every other line and comment as it was."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

from tracejudge.errors import TracejudgeError


class ConfigFileError(TracejudgeError):
    """The config file cannot be read, parsed or written."""


def set_value(path: Path, section: str, key: str, value: str) -> None:
    """Set `[section] key = "value"`, adding the section or key when missing; the result must parse."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"cannot read {path}: {exc}") from exc
    setting = f"{key} = {json.dumps(value)}"
    header = re.compile(rf"^\s*\[\s*{re.escape(section)}\s*\]\s*(#.*)?$")
    any_header = re.compile(r"^\s*\[")
    assignment = re.compile(rf"^\s*{re.escape(key)}\s*=")
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        if lines and lines[-1].strip():
            lines.append("")
        lines += [f"[{section}]", setting]
    else:
        end = next((i for i in range(start + 1, len(lines)) if any_header.match(lines[i])), len(lines))
        found = next((i for i in range(start + 1, end) if assignment.match(lines[i])), None)
        if found is not None:
            lines[found] = setting
        else:
            last = max((i for i in range(start, end) if lines[i].strip()), default=start)
            lines.insert(last + 1, setting)
    text = "\n".join(lines) + "\n"
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path} is not valid TOML ({exc}); fix it by hand, then run this again") from exc
    if parsed.get(section, {}).get(key) != value:
        raise ConfigFileError(f"could not set [{section}] {key} in {path}: the file defines it in a form "
                              "this command does not edit (e.g. a dotted key); edit it by hand")
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigFileError(f"cannot write {path}: {exc}") from exc
