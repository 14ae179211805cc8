"""DeepEval's import path for its unit-interaction split (`deepeval.metrics.utils.get_unit_interactions`), for
custom metrics written against it; the split lives in `tracejudge.interactions`."""

from tracejudge.interactions import get_unit_interactions

__all__ = ["get_unit_interactions"]
