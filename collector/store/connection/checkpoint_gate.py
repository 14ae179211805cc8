"""Let retention's checkpoint in between the pipeline's writes.

DuckDB refuses `CHECKPOINT` while another transaction has updated rows in place (an `UPDATE`, an
`INSERT OR REPLACE`, `nextval`, DDL), and the span writer's commits refused some too. Under a judge the scoring
stage updates `eval_jobs` many times a second, so about half of retention's checkpoints were refused and the WAL
and the file grew although the rows did not (`python bench/retention.py`). `FORCE CHECKPOINT` waits for every
open transaction while holding new ones off, and hung the collector. The gate does the same in Python, bounded:
the span writer's commits and jobs, and every cursor the store hands out for each writing statement or
transaction that writes, hold it shared, and a checkpoint takes it alone for at most a timeout, then gives up
and lets the writers on.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import duckdb

# Statements that only read: they never block a checkpoint, so they never wait for one either; a statement that
# starts like one but writes (`WITH ... DELETE`, `EXPLAIN ANALYZE UPDATE`) is told by its keywords
_READ_ONLY = ("SELECT", "WITH", "FROM", "PRAGMA", "DESCRIBE", "SHOW", "EXPLAIN", "SUMMARIZE")
_WRITES = re.compile(r"\b(?:INSERT|UPDATE|DELETE|MERGE|COPY|CREATE|DROP|ALTER|ATTACH|CHECKPOINT)\b")
_BEGIN = ("BEGIN",)
_END = ("COMMIT", "ROLLBACK", "ABORT", "END")
_T = TypeVar("_T")


def reads_only(statement: str) -> bool:
    head = statement.lstrip().upper()
    return head.startswith(_READ_ONLY) and not _WRITES.search(head)


class CheckpointGate:
    """A shared/exclusive lock: writers share it, a checkpoint holds it alone and new writers wait meanwhile.
    It also counts open transactions, for work that must have none (a table swap: a transaction that read the
    table and writes it after the swap would fail); while such work waits, new transactions wait too."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._writers = 0
        self._transactions = 0  # explicit transactions open on gated cursors
        self._exclusive: int | None = None  # the thread that holds (or waits for) the gate alone
        self._no_transactions = False  # the exclusive holder wants no transaction open either
        self._running = False  # the exclusive holder has stopped waiting and runs its work

    @contextmanager
    def writing(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def enter(self, in_transaction: bool = False) -> None:
        """A write begins. It waits while a checkpoint holds or waits for the gate; a transaction already open
        goes on writing while a table swap waits (the swap waits for it to end anyway, and would otherwise
        wait on a transaction that waits on the swap)."""
        with self._cond:
            if self._exclusive == threading.get_ident():  # the checkpointer's own statements
                self._writers += 1
                return
            while self._exclusive is not None and not (in_transaction and self._no_transactions
                                                       and not self._running):
                self._cond.wait()
            self._writers += 1

    def leave(self) -> None:
        with self._cond:
            self._writers -= 1
            if self._writers == 0:
                self._cond.notify_all()

    def begin(self) -> None:
        """A transaction opens: it waits only for work that wants none open."""
        with self._cond:
            while self._no_transactions and self._exclusive != threading.get_ident():
                self._cond.wait()
            self._transactions += 1

    def end(self) -> None:
        with self._cond:
            self._transactions -= 1
            if self._transactions == 0:
                self._cond.notify_all()

    def alone(self, run: Callable[[], Any], timeout_s: float, no_transactions: bool = False) -> bool:
        """Run `run` once no writer holds the gate (and, with `no_transactions`, no transaction is open); False
        (and `run` not called) if that took longer than `timeout_s`. Writers (and transactions) that arrive
        meanwhile wait, so the gate empties unless one holds it long."""
        me = threading.get_ident()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._exclusive is not None:  # another checkpointer first
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    return False
            self._exclusive, self._no_transactions = me, no_transactions
            try:
                while self._writers or (no_transactions and self._transactions):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._exclusive, self._no_transactions = None, False
                        self._cond.notify_all()
                        return False
                    self._cond.wait(left)
            except BaseException:
                self._exclusive, self._no_transactions = None, False
                self._cond.notify_all()
                raise
            self._running = True
        try:
            run()
            return True
        finally:
            with self._cond:
                self._exclusive, self._no_transactions, self._running = None, False, False
                self._cond.notify_all()


class WritesRefused(duckdb.IOException):
    """The store cannot take a write now (its disk is full, or its last commit failed): the pipeline's write was not
    started and is retried by its next poll, once the span writer's commits succeed again. An IOException, so it
    is handled where a failed write is."""


class GatedCursor:
    """A DuckDB cursor whose writing statements hold `gate` shared: one outside a transaction for itself, one
    inside a transaction from there to its COMMIT or ROLLBACK. A transaction that only reads never takes it
    (DuckDB checkpoints beside readers). Every other method is the cursor's own.

    `refuse`, asked before each statement or transaction starts writing, names why the store cannot take a write
    now: then `WritesRefused` is raised before anything is written. A commit that fails for lack of space after it
    updated a keyed table makes DuckDB 1.5 abort the whole process as it reverts it; a write not started cannot.

    `on_fatal` hears of every `duckdb.FatalException` a statement raises: after one DuckDB has invalidated the
    database and every later statement fails, so the collector must stop (or it lives on, doing nothing)."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection, gate: CheckpointGate,
                 refuse: Callable[[], str | None] | None = None,
                 on_fatal: Callable[[duckdb.FatalException], None] | None = None) -> None:
        self._cursor = cursor
        self._gate = gate
        self._refuse = refuse
        self._on_fatal = on_fatal
        self._in_transaction = False
        self._holding = False  # the open transaction has written, so holds the gate until it ends
        self._refused_commit = False  # a COMMIT was refused (and rolled back): the caller's ROLLBACK has nothing to do

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def execute(self, query: str, parameters: Any = None) -> duckdb.DuckDBPyConnection:
        return self._gated(query, lambda: self._cursor.execute(query, parameters))

    def executemany(self, query: str, parameters: Any = None) -> duckdb.DuckDBPyConnection:
        return self._gated(query, lambda: self._cursor.executemany(query, parameters))

    def cursor(self) -> GatedCursor:
        """Another cursor of the connection, gated as this one: a part handed a cursor and opening its own (the
        assembled-traces index) must not write past a checkpoint, nor meet a FatalException no one hears of."""
        return GatedCursor(self._cursor.cursor(), self._gate, self._refuse, self._on_fatal)

    def reading(self, query: str, read: Callable[[], _T]) -> _T:
        """`read`, which makes `query`'s answer outside `execute` (a relation read into Arrow, as DuckDB 2 reads):
        gated as the query is, and its FatalException heard by `on_fatal` as a statement's is."""
        return self._gated(query, read)

    def begin(self) -> duckdb.DuckDBPyConnection:
        return self.execute("BEGIN TRANSACTION")

    def commit(self) -> duckdb.DuckDBPyConnection:
        return self.execute("COMMIT")

    def rollback(self) -> duckdb.DuckDBPyConnection:
        return self.execute("ROLLBACK")

    def _gated(self, query: str, run: Callable[[], _T]) -> _T:
        try:
            return self._gated_run(query, run)
        except duckdb.FatalException as exc:
            if self._on_fatal is not None:
                self._on_fatal(exc)
            raise

    def _gated_run(self, query: str, run: Callable[[], _T]) -> _T:
        head = query.lstrip().upper()
        if self._in_transaction:
            if head.startswith(_END):
                try:
                    if self._holding and head.startswith("COMMIT") and (reason := self._reason()) is not None:
                        self._cursor.execute("ROLLBACK")  # the store went at fault meanwhile: not risked
                        self._refused_commit = True
                        raise WritesRefused(_refusal(reason))
                    return run()
                finally:
                    self._in_transaction = False
                    self._gate.end()
                    if self._holding:
                        self._holding = False
                        self._gate.leave()
            if not self._holding and not reads_only(head):
                self._gate.enter(in_transaction=True)  # the first write: a waiting checkpoint goes first
                self._holding = True  # released by the ROLLBACK the caller makes of a refused transaction
                self._check()
            return run()
        if head.startswith(_BEGIN):
            self._refused_commit = False
            self._gate.begin()
            try:
                result = run()
            except BaseException:
                self._gate.end()
                raise
            self._in_transaction = True
            return result
        if head.startswith(_END) and self._refused_commit and head.startswith("ROLLBACK"):
            self._refused_commit = False  # the refused COMMIT rolled the transaction back already
            return self._cursor  # type: ignore[return-value]  # only a ROLLBACK gets here, through execute
        if reads_only(head) or head.startswith(_END):  # an end with no transaction open writes nothing
            return run()
        self._gate.enter()
        try:
            self._check()
            return run()
        finally:
            self._gate.leave()

    def _reason(self) -> str | None:
        return self._refuse() if self._refuse is not None else None

    def _check(self) -> None:
        """Asked once the gate is held (a checkpoint waited for may have used the space)."""
        reason = self._reason()
        if reason is not None:
            raise WritesRefused(_refusal(reason))


def _refusal(reason: str) -> str:
    return f"the store takes no pipeline write now: {reason}"
