"""Names a package exports but imports on first use (PEP 562): a process that needs one module of the package
(a decode worker needs only `tracejudge.errors`) does not load the rest."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(namespace: dict[str, Any], where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports each name in `where` from its module when first asked and keeps it in
    the module's `namespace`, so later lookups are plain attribute reads."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value
        return value

    return __getattr__


def deprecated_getattr(module: str, renamed: Mapping[str, tuple[str, Any]]) -> Callable[[str], Any]:
    """A module `__getattr__` for names a library renamed: each old name gives the new object with a
    DeprecationWarning that names the new one (DeepEval's `LLMTestCaseParams` -> `SingleTurnParams`)."""

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, value = renamed[name]
        warnings.warn(f"{name} is deprecated, use {new}", DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
