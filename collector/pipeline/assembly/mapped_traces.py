"""The mapped parts of traces assembled before, kept so a conversation that gets a new trace maps only that trace.

A conversation whose turns come minutes apart gets a trace per turn, each after the last was assembled. Without this
cache each new version re-read and re-mapped every earlier trace: its 40th version cost 13 times its first
(`python bench/conversation_growth.py`). Only conversations that went on (had traces assembled before) are kept:
most arrive within one quiet period and are never assembled again.
The cache is bounded by an estimate of its bytes; a trace that is not in it (evicted, or
after a restart) is read back from `spans` as before, so the cache changes what assembly costs, never what it gives.
"""

from __future__ import annotations

import random
from datetime import datetime
from typing import NamedTuple

from tracejudge.mapping import MappedTrace

# An entry's estimated bytes: TEXT_FACTOR times the text of its spans' attributes and events, plus ENTRY_OVERHEAD.
# What the kept traces hold (parsed JSON as Python objects, and the built Turns, about half) is 1.27x this estimate
# for bench/ingest.py's agent spans, 8 per trace (`python bench/conversation_growth.py --cache-memory`).
TEXT_FACTOR = 4
ENTRY_OVERHEAD = 1024


class KeptTrace(NamedTuple):
    """A trace as assembly needs it: mapped, with what the sampling filters and `assembled_traces` take from it."""

    trace_id: str
    mapped: MappedTrace | None  # None: nothing to map yet (only log-event carriers whose span has not arrived)
    attributes: dict[str, set[str]]  # the sampling filters' attribute keys -> the values its spans hold
    spans: int  # its stored spans (for `[conversations] max_spans`)
    first: datetime  # its oldest span's received_at: later reads of it start there
    newest: datetime  # its newest span's received_at
    weight: int  # estimated bytes (TEXT_FACTOR, ENTRY_OVERHEAD)
    usage: dict[str, tuple[int, int]] = {}  # the agent's own model -> input and output tokens its spans report


class MappedTraceCache:
    """Mapped traces within `budget` estimated bytes (0 keeps nothing), evicted at random. Not least recently used:
    conversations that go on come back in turn, so when they need more than the budget, LRU would evict exactly the
    traces needed next and every lookup would miss; at random, about budget/need of them still hit. Not thread-safe:
    the assembler calls it under its lock."""

    def __init__(self, budget: int, seed: int = 0) -> None:
        self.budget = budget
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._kept: dict[str, KeptTrace] = {}
        self._ids: list[str] = []  # the kept trace ids, for a random pick in constant time
        self._slot: dict[str, int] = {}  # trace id -> its index in _ids
        self._random = random.Random(seed)

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, trace_id: str) -> KeptTrace | None:
        kept = self._kept.get(trace_id)
        if kept is None:
            self.misses += 1
        else:
            self.hits += 1
        return kept

    def put(self, trace_id: str, kept: KeptTrace) -> None:
        self.discard(trace_id)
        if kept.weight > self.budget:
            return
        while self.size + kept.weight > self.budget:
            self.discard(self._ids[self._random.randrange(len(self._ids))])
        self._kept[trace_id] = kept
        self._slot[trace_id] = len(self._ids)
        self._ids.append(trace_id)
        self.size += kept.weight

    def clear(self) -> None:
        """Forget every trace (a commit whose traces are not known may have changed any of them)."""
        self._kept.clear()
        self._ids.clear()
        self._slot.clear()
        self.size = 0

    def discard(self, trace_id: str) -> None:
        """Forget the trace (it has new spans, or room is needed)."""
        kept = self._kept.pop(trace_id, None)
        if kept is None:
            return
        self.size -= kept.weight
        slot, last = self._slot.pop(trace_id), self._ids.pop()
        if last != trace_id:
            self._ids[slot] = last
            self._slot[last] = slot
