"""Whether the mapping runs compiled or as Python, and a guard for checkouts installed in place.

`pip install` compiles the mapping's hot modules with mypyc (setup.py) where it can; each extension module then sits
beside its source and Python imports it first. In an editable checkout a source edited after the build would be
shadowed by the extension built from its older text, so a developer's change would silently not run: when any
source is not the text it was compiled from, every compiled module is imported from its source instead (all of them: a
compiled class cannot be subclassed by an interpreted one), with a warning that says how to rebuild.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE = "tracejudge.mapping"
_HERE = Path(__file__).resolve().parent
MANIFEST = "_compiled.json"  # written by the build (setup.py): each compiled module's source hash


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
    """The modules whose source is not the text their extension was built from (the build wrote each source's
    hash beside them; none recorded, every one is stale)."""
    try:
        recorded = json.loads((_HERE / MANIFEST).read_text())
    except (OSError, ValueError):
        recorded = {}
    return sorted(name for name, source in sources.items() if recorded.get(source.relative_to(_HERE).as_posix())
                  != hashlib.sha256(source.read_bytes()).hexdigest())


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
        named = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        warnings.warn(f"{named} changed after the mapping was compiled: it runs as Python (slower) until "
                      "`pip install -e .` compiles it again", RuntimeWarning, stacklevel=2)
    return stale


def running_compiled() -> bool:
    """Whether conversations are built by the compiled mapping (what `tracejudge serve` reports at start)."""
    from tracejudge.mapping import conversation

    return not (conversation.__file__ or "").endswith(".py")
