"""The ingest journal: exports acknowledged while the span writer's commit is held up (a checkpoint holds every
commit), stored once whether the commit finishes or the process is killed first."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from tests.support.collector_process import CollectorProcess
from tests.test_assembler import _assembling_store, _drain, _spans, _versions, _write_turn
from tests.test_crash_recovery import Sender
from tests.test_disk_faults import small_fs  # noqa: F401 - the fixture, named by the test below
from tests.test_pipeline import config
from tracejudge.collector.config import Settings
from tracejudge.collector.receivers.span_rows import spans_to_arrow
from tracejudge.collector.store import span_store
from tracejudge.collector.store.ingest_journal import IngestJournal
from tracejudge.collector.store.span_store import SpanStore, StoreOpenError
from tracejudge.collector.store.span_tables import SpanRows

REPOSITORY = str(Path(__file__).resolve().parent.parent)


def _request(trace: int) -> SpanRows:
    return spans_to_arrow(_spans(trace, trace, session=f"chat-{trace}", turn="hello"), dt.datetime.now(dt.UTC))


def _digest(trace: int) -> bytes:
    return trace.to_bytes(16, "big")


def _stored(db: Path) -> list[tuple[str, int]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT trace_id, count(*) FROM span_records GROUP BY 1 ORDER BY 1").fetchall()


@contextlib.contextmanager
def _journaling(db: Path) -> Iterator[SpanStore]:
    """An open store that journals a commit held past 20 ms, closed after the block."""
    store = SpanStore(db, journal_after_s=0.02)
    store.open()
    try:
        yield store
    finally:
        store.close()


def _hold_writer(store: SpanStore) -> threading.Event:
    """Hold the span writer, as a checkpoint holds a commit, until the event is set."""
    release = threading.Event()
    store.run_in_writer(lambda con: release.wait(60))
    return release


def test_exports_are_acknowledged_while_the_commit_is_held_and_stored_once_when_it_finishes(
        tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with _journaling(db) as store:
        journal = IngestJournal.beside(db)
        release = _hold_writer(store)

        async def export_all() -> list[int]:
            writes = [store.write(_request(trace), _digest(trace)) for trace in (1, 2, 3)]
            return await asyncio.wait_for(asyncio.gather(*writes), 30)

        assert asyncio.run(export_all()) == [1, 1, 1]  # answered with the writer still held
        assert journal.files(), "acknowledged while held, but nothing was journaled"
        assert store.stats.journaled_requests == 3 and store.stats.commits == 0
        release.set()
    assert not journal.files(), "committed requests' journal files were kept"
    assert [n for _, n in _stored(db)] == [1, 1, 1]


def test_journaled_requests_not_yet_committed_are_bounded_and_the_rest_wait_for_their_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = _request(1).nbytes
    monkeypatch.setattr(span_store, "JOURNAL_MAX_BYTES", 2 * one)  # room for two of the three
    with _journaling(tmp_path / "t.duckdb") as store:
        release = _hold_writer(store)

        async def export_all() -> None:
            writes = [asyncio.ensure_future(store.write(_request(t), _digest(t))) for t in (1, 2, 3)]
            await asyncio.wait_for(asyncio.gather(*writes[:2]), 30)
            await asyncio.sleep(0.3)  # a dozen of the journal's rounds
            assert not writes[2].done(), "acknowledged past the journal's memory bound"
            release.set()
            assert await asyncio.wait_for(writes[2], 30) == 1

        asyncio.run(export_all())
        assert store.stats.journaled_requests == 2
    assert [n for _, n in _stored(tmp_path / "t.duckdb")] == [1, 1, 1]


def test_a_journaled_request_whose_commit_fails_on_a_full_disk_is_kept_and_committed_once_there_is_room(
        small_fs: Path) -> None:  # noqa: F811 - the fixture imported above
    db = small_fs / "t.duckdb"
    store = SpanStore(db, journal_after_s=0.02)
    store.open()
    filler = small_fs / "filler"
    try:
        release = _hold_writer(store)

        async def export() -> int:
            return await asyncio.wait_for(store.write(_big_request(), _digest(1)), 30)

        assert asyncio.run(export()) == 1  # acknowledged from the journal
        _fill(small_fs)  # the disk fills up before the commit
        release.set()
        assert _wait_until(lambda: store.stats.journal_error is not None)
        _kept_until_there_is_room(store, filler)
    finally:
        filler.unlink(missing_ok=True)
        store.close()
    assert [n for _, n in _stored(db)] == [1]


def _big_request() -> SpanRows:
    """A request of 400 KB, more than a full 3 MB file system has left for its commit."""
    return spans_to_arrow(_spans(1, 1, session="chat-1", turn="x" * 400_000), dt.datetime.now(dt.UTC))


def _kept_until_there_is_room(store: SpanStore, filler: Path) -> None:
    """The journaled request could not be committed and its file is kept; once the filler goes, the writer commits
    it by itself and removes the file."""
    assert "could not be committed" in (store.stats.journal_error or ""), store.stats.journal_error
    assert store.journal.files(), "the acknowledged request's file went with the failed commit"
    filler.unlink()
    assert _wait_until(lambda: not store.journal.files()), store.stats.journal_error


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb") as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()
    return filler


def _wait_until(done: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    return done()


def test_a_journal_file_the_store_cannot_take_at_start_does_not_stop_it_and_is_committed_later(
        small_fs: Path) -> None:  # noqa: F811 - the fixture imported above
    db = small_fs / "t.duckdb"
    store = SpanStore(db)
    store.open()
    store.close()
    IngestJournal.beside(db).write([(_digest(1), _big_request())])
    filler = _fill(small_fs)
    store = SpanStore(db)
    try:
        store.open()  # the disk is full: the file is parked, the collector starts
        _kept_until_there_is_room(store, filler)
    finally:
        filler.unlink(missing_ok=True)
        store.close()
    assert [n for _, n in _stored(db)] == [1]


def test_a_journal_file_removed_from_outside_fails_only_its_request_and_the_writer_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with _journaling(db) as store:
        journal = IngestJournal.beside(db)
        release = _hold_writer(store)

        async def export(trace: int) -> int:
            return await asyncio.wait_for(store.write(_request(trace), _digest(trace)), 30)

        assert asyncio.run(export(1)) == 1
        assert asyncio.run(export(2)) == 1  # a file each: the second round found only the second request
        first, second = journal.files()
        first.unlink()  # its request's rows were only there
        release.set()
        assert asyncio.run(export(3)) == 1  # the writer is alive and commits
        assert _wait_until(lambda: not second.exists())
        assert "could not be committed" in (store.stats.journal_error or ""), store.stats.journal_error
    assert [t for t, _ in _stored(db)] == [f"{2:032x}", f"{3:032x}"]


def test_without_a_journal_an_export_waits_for_its_commit(tmp_path: Path) -> None:
    store = SpanStore(tmp_path / "t.duckdb", journal_after_s=None)
    store.open()
    try:
        release = _hold_writer(store)

        async def export() -> None:
            write = asyncio.ensure_future(store.write(_request(1), _digest(1)))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(write), 0.5)
            release.set()
            assert await write == 1

        asyncio.run(export())
    finally:
        store.close()
    assert not IngestJournal.beside(tmp_path / "t.duckdb").folder.exists()


@pytest.mark.parametrize("answered_by", ["commit", "journal", "slow journal"])
def test_an_export_the_span_writer_held_up_is_counted_as_slowed_and_one_answered_at_once_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answered_by: str) -> None:
    """The assembler pauses for ingest only after a pass that slowed an export: the store counts the requests it
    answered `SLOW_REQUEST_S` or more after they reached the writer. One the journal acknowledged at once while the
    commit was held is not slowed, however late its commit; one whose journal file was slow to sync is."""
    monkeypatch.setattr(span_store, "SLOW_REQUEST_S", 0.4)  # far above a first commit's time, below the hold's
    store = SpanStore(tmp_path / "t.duckdb", journal_after_s=None if answered_by == "commit" else 0.02)
    store.open()
    try:
        async def export() -> None:
            assert await store.write(_request(1), _digest(1)) == 1  # the writer free: answered at once
            assert store.stats.requests_slowed == 0
            if answered_by == "slow journal":
                write_file = store.journal.write
                monkeypatch.setattr(store.journal, "write", lambda requests: time.sleep(0.6) or write_file(requests))
            journaled = store.stats.journaled_requests  # the first may have been journaled on a slow machine
            release = _hold_writer(store)
            write = asyncio.ensure_future(store.write(_request(2), _digest(2)))
            await asyncio.sleep(0.8)
            release.set()
            assert await asyncio.wait_for(write, 30) == 1
            assert store.stats.journaled_requests - journaled == (0 if answered_by == "commit" else 1)

        asyncio.run(export())
    finally:
        store.close()
    assert store.stats.requests_slowed == (0 if answered_by == "journal" else 1)


CHILD = """
import asyncio, datetime as dt, json, sys, threading
sys.path.insert(0, {repository!r})
from tests.test_ingest_journal import _digest, _request
from tracejudge.collector.store.span_store import SpanStore
store = SpanStore(__import__("pathlib").Path({db!r}), journal_after_s=0.02)
store.open()
async def main():
    await store.write(_request(1), _digest(1))  # committed before the writer is held
    store.run_in_writer(lambda con: threading.Event().wait())  # held until the kill
    # trace 2 twice (an exporter's retry while the first try waits): journaled twice, stored once
    done = await asyncio.gather(*(store.write(_request(t), _digest(t)) for t in (2, 2, 3)))
    print(json.dumps({{"acked": done, "files": len(store.journal.files())}}), flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def test_spans_acknowledged_from_the_journal_survive_kill_9_and_are_stored_once(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(repository=REPOSITORY, db=str(db))],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
    finally:
        child.kill()
        child.wait(30)
    assert json.loads(line)["acked"] == [1, 1, 1], line
    assert IngestJournal.beside(db).files()

    store = SpanStore(db)  # the journal is replayed at open, whatever journal_after is
    store.open()
    replayed = store.stats.replayed_spans
    store.close()
    assert replayed == 2
    assert [n for _, n in _stored(db)] == [1, 1, 1]
    assert not IngestJournal.beside(db).files()


@pytest.mark.parametrize("down_for", [0, 3600], ids=["restarted at once", "restarted after an hour"])
def test_a_journaled_request_committed_before_the_crash_is_not_stored_again(tmp_path: Path, down_for: int) -> None:
    db = tmp_path / "t.duckdb"
    store = SpanStore(db)
    store.open()
    asyncio.run(store.write(_request(1), _digest(1)))
    store.close()
    with duckdb.connect(str(db)) as con:  # an hour down: its digest is past the redelivery window the store loads
        con.execute("UPDATE ingest_requests SET received_at = received_at - to_seconds(?)", [down_for])
    # the file a crash left between the request's commit and the file's removal
    IngestJournal.beside(db).write([(_digest(1), _request(1)), (_digest(2), _request(2))])

    store = SpanStore(db)
    store.open()
    replayed = store.stats.replayed_spans
    store.close()
    assert replayed == 1
    assert [n for _, n in _stored(db)] == [1, 1]
    assert not IngestJournal.beside(db).files()


def test_a_damaged_journal_file_stops_the_start_naming_it_and_a_torn_one_is_dropped(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    journal = IngestJournal.beside(db)
    journal.write([(_digest(1), _request(1))])
    [written] = journal.files()
    torn = journal.folder / ".never-renamed.tmp"  # a crash mid-write: never acknowledged
    torn.write_bytes(b"tracejudge ingest")
    damaged = journal.folder / "0-damaged.journal"
    damaged.write_bytes(written.read_bytes()[:-40])

    with pytest.raises(StoreOpenError, match="0-damaged.journal.*move it out of the folder"):
        SpanStore(db).open()
    assert damaged.exists() and not torn.exists()
    damaged.rename(tmp_path / "kept.journal")
    store = SpanStore(db)
    store.open()
    store.close()
    assert [n for _, n in _stored(db)] == [1]


def test_journal_files_of_two_starts_never_replace_each_other(tmp_path: Path) -> None:
    """A file parked at one start must survive the next process's first write (in a container every start is the
    same PID)."""
    for _ in range(2):
        IngestJournal.beside(tmp_path / "t.duckdb").write([(_digest(1), _request(1))])
    assert len(IngestJournal.beside(tmp_path / "t.duckdb").files()) == 2


def test_journal_after_takes_a_duration_or_none() -> None:
    assert Settings().store.journal_after == 0.05
    assert Settings.model_validate({"store": {"journal_after": "200ms"}}).store.journal_after == pytest.approx(0.2)
    assert Settings.model_validate({"store": {"journal_after": "none"}}).store.journal_after is None


def test_kill_9_of_a_collector_acknowledging_from_its_journal_loses_and_duplicates_no_span(tmp_path: Path) -> None:
    """The real collector, its journal used on nearly every commit (journal_after 1ms), killed at random moments
    while the OTel SDK exporter sends: every acknowledged span is stored, and stored once."""
    db, cfg = tmp_path / "t.duckdb", config(tmp_path, '[store]\njournal_after = "1ms"\n')
    rng = random.Random(20261207)
    acked: dict[str, set[tuple[str, str]]] = {}
    first, journaled = 0, 0.0
    for _ in range(3):
        collector = CollectorProcess(db, config=cfg).start()
        sender = Sender(collector.grpc_endpoint, first, acked)
        sender.thread.start()
        time.sleep(rng.uniform(0.5, 1.5))
        journaled += collector.metric("tracejudge_ingest_journaled_spans_total")
        collector.kill()
        sender.stopped.set()
        sender.thread.join(30)
        first = sender.next
    assert acked and journaled > 0, "the journal was never used: the test proves nothing"
    with CollectorProcess(db, config=cfg) as collector:
        assert collector.stop() == 0
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT trace_id, span_id FROM spans").fetchall()
    missing = [c for c, keys in acked.items() if not keys <= set(rows)]
    assert not missing, f"acknowledged spans lost: {missing[:5]}"
    assert len(rows) == len(set(rows)), "a span was stored twice"
    assert not IngestJournal.beside(db).files()


def test_a_span_replayed_after_a_crash_that_was_received_before_its_trace_was_assembled_gets_it_a_new_version(
        tmp_path: Path) -> None:
    """A journaled request whose commit was held past the quiet period (a full disk parks it) was received before
    its trace's assembly; the process dies before the commit. After the restart the replayed span's conversation
    is assembled again with it, though the span is older than that assembly, even when the collector stops again
    before that (the record of the replay is in the database, written with the spans)."""
    db = tmp_path / "t.duckdb"
    received = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30)
    store, assembler = _assembling_store(db, quiet_period_s=0.0, assembly_workers=0)
    try:
        asyncio.run(_write_turn(store, 1, 1, "chat-1", "hello", received + dt.timedelta(seconds=1)))
        _drain(assembler)
        assert _versions(store) == [("chat-1", 1, 1)]
    finally:
        store.close()
    late = spans_to_arrow(_spans(1, 2, session="chat-1", turn="and tomorrow?"), received)
    IngestJournal.beside(db).write([(_digest(2), late)])  # acknowledged, then the crash

    store = SpanStore(db)
    store.open()  # replayed, then stopped again before anything was assembled
    replayed = store.stats.replayed_spans
    store.close()
    store, assembler = _assembling_store(db, quiet_period_s=0.0, assembly_workers=0)
    try:
        assembler.recover()
        _drain(assembler)
        assert replayed == 1
        assert _versions(store) == [("chat-1", 1, 1), ("chat-1", 2, 2)]
        assert store.cursor().execute("SELECT count(*) FROM journal_replays").fetchone() == (0,)  # taken up once
    finally:
        store.close()
