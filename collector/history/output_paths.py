"""Files tracejudge writes stay inside the directory the user named, whatever is already there."""

from __future__ import annotations

from pathlib import Path

from tracejudge.errors import TracejudgeError


class OutputPathError(TracejudgeError):
    """A file to write would land outside its directory (a symlink or a name with a separator)."""


def confined(directory: Path, name: str) -> Path:
    """`directory/name`, resolved; refuses names with separators and symlinks that lead elsewhere."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise OutputPathError(f"{name!r} is not a plain file name; give a name without separators")
    root = directory.resolve()
    target = (root / name).resolve()
    if target.parent != root:
        raise OutputPathError(f"{root / name} leads to {target}, outside {root} (a symlink?); remove it or "
                              "choose another directory")
    return target
