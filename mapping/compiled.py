"""Whether the mapping runs compiled or as Python, and a guard for checkouts installed in place.

`pip install` compiles the mapping's hot modules with mypyc (setup.py) where it can; each extension module then sits
beside its source and Python imports it first. In an editable checkout a source edited after the build would be
shadowed by the extension built from its older text, so a developer's change would silently not run: when any
source is newer than its extension, every compiled module is imported from its source instead (all of them: a
compiled class cannot be subclassed by an interpreted one), with a warning that says how to rebuild.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE = "tracejudge.mapping"
_HERE = Path(__file__).resolve().parent
SLACK_S = 2.0  # an installer writes a module's source and its extension in either order, moments apart


def compiled_sources() -> dict[str, Path]:
    """Module name -> its source, for each mapping module built beside it as an extension module."""
    out = {}
    for source in _HERE.rglob("*.py"):
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if source.with_name(source.stem + suffix).exists():
                parts = source.relative_to(_HERE).with_suffix("").parts
                name = ".".join((PACKAGE, *parts[:-1])) if parts[-1] == "__init__" else ".".join((PACKAGE, *parts))
                out[name] = source
                break
    return out


def stale_sources(sources: dict[str, Path]) -> list[str]:
    """The modules whose source changed after their extension was built."""
    stale = []
    for name, source in sources.items():
        built = min(source.with_name(source.stem + suffix).stat().st_mtime
                    for suffix in importlib.machinery.EXTENSION_SUFFIXES
                    if source.with_name(source.stem + suffix).exists())
        if source.stat().st_mtime > built + SLACK_S:
            stale.append(name)
    return sorted(stale)


class _SourcesFirst(importlib.abc.MetaPathFinder):
    """Imports the named modules from their sources, ahead of the extensions beside them."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        search = [str(source.parent)] if source.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(fullname, source, submodule_search_locations=search)


def prefer_fresh_sources() -> list[str]:
    """Import the mapping from its sources when any was edited after it was compiled; the stale modules."""
    sources = compiled_sources()
    stale = stale_sources(sources) if sources else []
    if stale and not any(isinstance(f, _SourcesFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourcesFirst(sources))
        warnings.warn(f"{', '.join(stale)} changed after the mapping was compiled: it runs as Python (slower) until "
                      "`pip install -e .` compiles it again", RuntimeWarning, stacklevel=2)
    return stale


def running_compiled() -> bool:
    """Whether conversations are built by the compiled mapping (what `tracejudge serve` reports at start)."""
    from tracejudge.mapping import conversation

    return not (conversation.__file__ or "").endswith(".py")
