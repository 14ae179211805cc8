"""DeepEval's `deepeval.evaluate` package under tracejudge: `evaluate`, `a_evaluate`, `assert_test`, and the
run configs in `tracejudge.evaluate.configs` (result types in `tracejudge.evaluate.types`).

`from tracejudge import evaluate` must be the function, but once this package is imported Python binds the name
`evaluate` on `tracejudge` to the package; so the package itself calls `evaluate()`, and either works. The
functions load on first use: importing the configs does not load the judges.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from tracejudge.evaluate.configs import AsyncConfig, CacheConfig, DisplayConfig, ErrorConfig
from tracejudge.lazy_names import lazy_getattr

if TYPE_CHECKING:
    from tracejudge.assertions import assert_test
    from tracejudge.evaluation import EvaluationResult, a_evaluate, evaluate

_WHERE = {"evaluate": "tracejudge.evaluation", "a_evaluate": "tracejudge.evaluation",
          "assert_test": "tracejudge.assertions"}


__getattr__ = lazy_getattr(globals(), _WHERE)


class _CallableEvaluate(types.ModuleType):
    """The package answers a call as `evaluate()` does (see the module docstring for why)."""

    def __call__(self, *args: Any, **kwargs: Any) -> EvaluationResult:
        return self.evaluate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableEvaluate

__all__ = ["AsyncConfig", "CacheConfig", "DisplayConfig", "ErrorConfig", "a_evaluate", "assert_test", "evaluate"]
