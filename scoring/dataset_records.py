"""Goldens and test cases as DeepEval writes them to files: JSON and JSON Lines records, and CSV rows whose list
cells are joined with `|` and whose structured cells hold JSON. Read both ways, so DeepEval's dataset files load
here and files written here load in DeepEval.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tracejudge.test_case import RetrievedContextData

LIST_DELIMITER = "|"
# a RetrievedContextData on disk (DeepEval's marker), so its source survives a save and load
_MARKER = re.compile(r"^deepeval_source=(?P<source>.*?),deepeval_context=(?P<context>.*)$", re.DOTALL)
JSON_CELLS = frozenset({"tools_called", "expected_tools", "additional_metadata", "metadata",
                        "custom_column_key_values", "turns"})
LIST_CELLS = frozenset({"context", "retrieval_context"})


def context_out(items: list[Any] | None) -> list[str] | None:
    """Retrieval context for a file: strings as they are, RetrievedContextData as DeepEval's marker."""
    if items is None:
        return None
    return [f"deepeval_source={i.source},deepeval_context={i.context}" if isinstance(i, RetrievedContextData)
            else i for i in items]


def context_in(items: list[Any] | None) -> list[Any] | None:
    """Retrieval context from a file: a marker becomes the RetrievedContextData it stands for."""
    if items is None:
        return None
    out: list[Any] = []
    for item in items:
        found = _MARKER.match(item) if isinstance(item, str) else None
        out.append(RetrievedContextData(context=found["context"], source=found["source"]) if found else item)
    return out


def turns_in(turns: Any) -> Any:
    """Turns from a file: a JSON string (as DeepEval's JSON files hold them) is parsed; retrieval context markers
    are rebuilt."""
    if isinstance(turns, str):
        turns = json.loads(turns)
    if isinstance(turns, list):
        return [{**t, "retrieval_context": context_in(t.get("retrieval_context"))} if isinstance(t, dict) else t
                for t in turns]
    return turns


def csv_cell(key: str, value: Any) -> str:
    """A value as its CSV cell: lists of strings joined with `|`, structures as JSON, None as empty."""
    if value is None:
        return ""
    if key in LIST_CELLS:
        return LIST_DELIMITER.join(str(v) for v in value)
    if key in JSON_CELLS:
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def from_csv_cell(key: str, text: str, delimiter: str = LIST_DELIMITER) -> Any:
    """A CSV cell back as its value: an empty list cell is an empty list (the column is there), a list cell
    that holds a JSON list (as earlier tracejudge files wrote it) is that list."""
    if key in LIST_CELLS:
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, list):
                return parsed
        return text.split(delimiter) if text else []
    if key in JSON_CELLS:
        return json.loads(text) if text else None
    return text or None
