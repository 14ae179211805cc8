"""Which conversation an MCP session belongs to, remembered as conversations are assembled, so a context trace
(MCP calls the app made outside any agent run) can join the one conversation of its session, in either arrival
order. Bounded: `limit` sessions and `limit` waiting context conversations, oldest forgotten first; a session seen
in two conversations is ambiguous for good and nothing waits on it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

AMBIGUOUS = ""  # the owner of a session seen in two conversations


class SessionIndex:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._owner: OrderedDict[str, str] = OrderedDict()  # session -> its one conversation, or AMBIGUOUS
        self._waiting: OrderedDict[str, frozenset[str]] = OrderedDict()  # context conversation -> its sessions
        self._waiting_on: dict[str, set[str]] = {}  # session -> the context conversations waiting on it

    def __len__(self) -> int:
        return len(self._owner) + len(self._waiting)

    def owned(self, conversation_id: str, sessions: Iterable[str]) -> None:
        """A keyed conversation was assembled with MCP calls in these sessions."""
        for session in sessions:
            owner = self._owner.get(session)
            if owner is None:
                self._owner[session] = conversation_id
            elif owner != conversation_id and owner != AMBIGUOUS:
                self._owner[session] = AMBIGUOUS
                for waiting in list(self._waiting_on.get(session, ())):
                    self.forget(waiting)  # it can never be told apart now
            self._owner.move_to_end(session)
        while len(self._owner) > self.limit:
            self._owner.popitem(last=False)

    def owner(self, sessions: Iterable[str]) -> str | None:
        """The one conversation these sessions belong to, if exactly one is known and none is ambiguous."""
        owners = {self._owner.get(session) for session in sessions} - {None}
        return owners.pop() if len(owners) == 1 and AMBIGUOUS not in owners else None

    def wait(self, context_id: str, sessions: frozenset[str]) -> None:
        """A context-only conversation whose session has no known conversation yet."""
        if not sessions or any(self._owner.get(s) == AMBIGUOUS for s in sessions):
            return
        self._waiting[context_id] = sessions
        for session in sessions:
            self._waiting_on.setdefault(session, set()).add(context_id)
        while len(self._waiting) > self.limit:
            self.forget(next(iter(self._waiting)))

    def waiting_for(self, sessions: Iterable[str]) -> set[str]:
        """The context conversations waiting on any of these sessions."""
        return {c for session in sessions for c in self._waiting_on.get(session, ())}

    def sessions_of(self, context_id: str) -> frozenset[str]:
        return self._waiting.get(context_id, frozenset())

    def forget(self, context_id: str) -> None:
        for session in self._waiting.pop(context_id, frozenset()):
            waiting = self._waiting_on.get(session)
            if waiting is not None:
                waiting.discard(context_id)
                if not waiting:
                    del self._waiting_on[session]
