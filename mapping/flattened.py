"""Regroup flattened, indexed attributes (`llm.input_messages.10.message.role`) into ordered records.

Indices sort numerically, so message 10 comes after message 9, and gaps are skipped.
"""

from __future__ import annotations

from typing import Any


def group_indexed(flat: dict[str, Any]) -> list[dict[str, Any]]:
    """{"0.a": 1, "0.b": 2, "10.a": 3, "2.a": 4} -> [{"a": 1, "b": 2}, {"a": 4}, {"a": 3}]."""
    groups: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        head, _, rest = key.partition(".")
        if not head.isdigit() or not rest:
            continue
        groups.setdefault(int(head), {})[rest] = value
    return [groups[i] for i in sorted(groups)]


def sub(record: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The keys of `record` under `prefix.`, with the prefix removed."""
    dotted = prefix + "."
    return {k[len(dotted):]: v for k, v in record.items() if k.startswith(dotted)}
