"""DeepEval's import path for the golden and test-case conversions (`deepeval.dataset.utils`); they live in
`tracejudge.dataset.conversions`."""

from tracejudge.dataset.conversions import (
    convert_convo_goldens_to_convo_test_cases,
    convert_convo_test_cases_to_convo_goldens,
    convert_goldens_to_test_cases,
    convert_test_cases_to_goldens,
)

__all__ = ["convert_convo_goldens_to_convo_test_cases", "convert_convo_test_cases_to_convo_goldens",
           "convert_goldens_to_test_cases", "convert_test_cases_to_goldens"]
