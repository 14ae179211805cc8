"""The assembly workers: conversations built in other processes come back as the server would have built them, and
a worker that dies fails only its batch (built again later from the stored spans) and is replaced."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pytest

from tests.support.collector_process import CollectorProcess
from tests.test_pipeline import config, conversations, export, query, wait_for
from tracejudge.collector.pipeline.assembly import conversation_builder
from tracejudge.collector.pipeline.assembly.assembly_pool import (
    SPILL_PREFIX,
    WORKER_MODULE,
    AssemblyPool,
    AssemblyWorkerLost,
    _spill_root,
    default_workers,
)
from tracejudge.collector.pipeline.assembly.assembly_worker import NICENESS
from tracejudge.collector.pipeline.assembly.conversation_builder import (
    BuildConfig,
    build,
    build_batch,
    map_trace,
)
from tracejudge.collector.pipeline.assembly.span_columns import ArrowColumns, write_columns
from tracejudge.mapping.stored_spans import STORED_COLUMNS

SCHEMA = pa.schema([("trace_id", pa.string()), ("span_id", pa.string()), ("parent_span_id", pa.string()),
                    ("name", pa.string()), ("kind", pa.int32()), ("start_ns", pa.int64()), ("end_ns", pa.int64()),
                    ("status_code", pa.int32()), ("status_message", pa.string()), ("scope_id", pa.int64()),
                    ("resource_id", pa.int64()), ("attributes", pa.string()), ("events", pa.string()),
                    ("links", pa.string()), ("received_us", pa.int64())])
CONFIG = BuildConfig(checks=("mcp_call_validity",))
SERVER_ONLY = ("google.protobuf", "duckdb", "pyarrow", "tracejudge.collector.config")  # no worker imports them


def _messages(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])


def _rows(conversations: int, traces: int = 1) -> tuple[pa.Table, dict[str, list[str]]]:
    """`traces` model calls per conversation (a trace of one span each): the user asks, the assistant answers."""
    rows = []
    for i in range(conversations * traces):
        rows.append({
            "trace_id": f"{i:032x}", "span_id": f"{i:016x}", "parent_span_id": None, "name": "chat gpt-4o",
            "kind": 3, "start_ns": 1_000 + i, "end_ns": 2_000 + i, "status_code": 0, "status_message": "",
            "scope_id": 1, "resource_id": 1, "events": "[]", "links": "[]", "received_us": time.time_ns() // 1000,
            "attributes": json.dumps({"gen_ai.operation.name": "chat",
                                      "gen_ai.conversation.id": f"conv-{i // traces}",
                                      "gen_ai.input.messages": _messages("user", f"question {i}"),
                                      "gen_ai.output.messages": _messages("assistant", f"answer {i}")})})
    table = pa.Table.from_pylist(rows, schema=SCHEMA).select(list(STORED_COLUMNS))
    return table, {f"conv-{c}": [f"{c * traces + t:032x}" for t in range(traces)] for c in range(conversations)}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


SCOPES = {1: ("test", "1")}
RESOURCES = {1: {"service.name": "shop"}}


def test_a_conversation_built_in_a_worker_is_the_one_built_in_the_server() -> None:
    table, conversations = _rows(3)
    here = build_batch(ArrowColumns(table), conversations, SCOPES, RESOURCES, CONFIG)
    pool = AssemblyPool(1, CONFIG)
    try:
        there = pool.result(pool.submit(table, conversations, SCOPES, RESOURCES), list(conversations))
    finally:
        pool.stop()
    assert not there.failed and there.built.keys() == set(conversations)
    for conversation_id, built in here.built.items():
        assert built is not None and there.built[conversation_id] == built
        assert built.turns == 2 and built.service_name == "shop"
        assert "question" in built.test_case_json and built.checks["mcp_call_validity"] is not None
    assert [p.trace_id for p in there.parts["conv-0"]] == [f"{0:032x}"]
    # with the CPU it took, which the server counts as assembly's build stage: a worker's, or the server's own
    assert there.cpu_s > 0 and not there.here
    without_workers = AssemblyPool(0, CONFIG)
    local = without_workers.result(without_workers.submit(table, conversations, SCOPES, RESOURCES), list(conversations))
    assert local.built == there.built and local.here and local.cpu_s > 0


def _span(index: int, name: str, start_ms: float, end_ms: float, attributes: dict[str, str],
          trace: str = "a") -> dict[str, object]:
    """A span of trace `trace * 32` under its agent span (index 1), over `start_ms`..`end_ms`."""
    return {"trace_id": trace * 32, "span_id": f"{index:016x}", "parent_span_id": None if index == 1 else f"{1:016x}",
            "name": name, "kind": 1 if index == 1 else 3, "start_ns": int(start_ms * 1e6), "end_ns": int(end_ms * 1e6),
            "status_code": 0, "status_message": "", "scope_id": 1, "resource_id": 1, "events": "[]", "links": "[]",
            "received_us": time.time_ns() // 1000,
            "attributes": json.dumps({"gen_ai.conversation.id": "c", **attributes})}


def test_each_mcp_call_is_summarised_with_its_server_its_error_and_how_long_its_span_took() -> None:
    """The UI's call summary (its tools page's p50/p95) comes from the built conversation: each turn's tool calls,
    resource reads and prompt gets, turn by turn, with the server that lists the tool (the first by name, when two
    do), whether the result was an error, and the duration of the span that recorded the call."""
    rows = [_span(1, "invoke_agent shop", 0, 100, {"gen_ai.operation.name": "invoke_agent",
                                                   "gen_ai.input.messages": _messages("user", "weather?"),
                                                   "gen_ai.output.messages": _messages("assistant", "done")}),
            _span(3, "tools/call get-weather", 10, 12, {
                "mcp.method.name": "tools/call", "gen_ai.tool.name": "get-weather", "server.address": "weather",
                "gen_ai.tool.call.arguments": '{"city": "Atlantis"}',
                "gen_ai.tool.call.result": '{"content": [{"type": "text", "text": "no such city"}], "isError": true}'}),
            _span(4, "tools/call get-weather", 13, 20.5, {
                "mcp.method.name": "tools/call", "gen_ai.tool.name": "get-weather", "server.address": "weather",
                "gen_ai.tool.call.arguments": '{"city": "Paris"}',
                "gen_ai.tool.call.result": '{"content": [{"type": "text", "text": "rain"}]}'}),
            _span(5, "resources/read file:///a.txt", 21, 24, {"mcp.method.name": "resources/read",
                                                              "mcp.resource.uri": "file:///a.txt"}),
            _span(6, "prompts/get greet", 30, 34.5, {"mcp.method.name": "prompts/get", "gen_ai.prompt.name": "greet"}),
            _span(1, "invoke_agent shop", 200, 300, {"gen_ai.operation.name": "invoke_agent",
                                                     "gen_ai.input.messages": _messages("user", "and Rome?"),
                                                     "gen_ai.output.messages": _messages("assistant", "sun")}, "b"),
            _span(3, "tools/call get-weather", 210, 211.25, {
                "mcp.method.name": "tools/call", "gen_ai.tool.name": "get-weather", "server.address": "weather",
                "gen_ai.tool.call.arguments": '{"city": "Rome"}',
                "gen_ai.tool.call.result": '{"content": [{"type": "text", "text": "sun"}]}'}, "b")]
    table = pa.Table.from_pylist(rows, schema=SCHEMA).select(list(STORED_COLUMNS))
    # the calls went to `weather`; [mapping] mcp_tools names the tool for `a-mirror` too, first by name
    mirrored = BuildConfig(checks=CONFIG.checks, mcp_tools={"a-mirror": ("get-weather",)})
    built = build_batch(ArrowColumns(table), {"c": ["a" * 32, "b" * 32]}, SCOPES, RESOURCES, mirrored).built["c"]
    assert built is not None
    assert built.calls == ((1, 0, "tool", "a-mirror", "get-weather", True, 2.0),
                           (1, 1, "tool", "a-mirror", "get-weather", False, 7.5),
                           (1, 0, "resource", None, "file:///a.txt", False, 3.0),
                           (1, 0, "prompt", None, "greet", False, 4.5),
                           (3, 0, "tool", "a-mirror", "get-weather", False, 1.25))
    assert (built.turns, built.mcp_calls, built.mcp_errors) == (4, 5, 1)


def test_a_batch_builds_the_same_in_whatever_order_its_rows_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker makes a batch's rows Python objects a chunk at a time and builds each conversation once its last
    row is read: rows interleaved across conversations, and a conversation's traces apart, build the same
    conversations as rows in conversation order, each with all of its turns."""
    table, conversations = _rows(6, traces=2)
    by_trace: dict[str, list[tuple]] = {}  # the whole batch at once, as a worker read it before
    for row in zip(*(table.column(name).to_pylist() for name in STORED_COLUMNS), strict=True):
        by_trace.setdefault(row[0], []).append(row)
    whole = {c: build(c, [map_trace(by_trace[t], SCOPES, RESOURCES, CONFIG.attribute_keys) for t in traces], CONFIG)
             for c, traces in conversations.items()}
    ordered = build_batch(ArrowColumns(table), conversations, SCOPES, RESOURCES, CONFIG)
    assert ordered.built == whole
    monkeypatch.setattr(conversation_builder, "ROWS_AT_ONCE", 5)  # chunks that end inside conversations
    shuffled = table.take(pa.array([5, 0, 11, 2, 7, 1, 9, 3, 10, 4, 8, 6]))
    assert build_batch(ArrowColumns(shuffled), conversations, SCOPES, RESOURCES, CONFIG).built == whole
    assert not ordered.failed and all(b is not None and b.turns == 4 for b in ordered.built.values())
    assert {p.trace_id for p in ordered.parts["conv-2"]} == {f"{4:032x}", f"{5:032x}"}


def test_a_worker_builds_a_batch_without_the_modules_only_the_server_needs(tmp_path: Path) -> None:
    """Each assembly worker holds its own copy of what it imports (two of them on two cores): building a batch loads
    no protobuf decoder, DuckDB, pyarrow (30 MB of each worker's peak) or settings models, and gives what the
    server would build."""
    table, conversations = _rows(2)
    path = tmp_path / "batch.columns"
    write_columns(table, path)
    code = f"""if True:
        import pickle, sys
        from tracejudge.collector.pipeline.assembly.assembly_worker import build_from_file
        result = build_from_file(*pickle.loads(sys.stdin.buffer.read()))
        print(sorted(m for m in {SERVER_ONLY!r} if m in sys.modules))
        sys.stdout.buffer.write(pickle.dumps(result))
    """
    run = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((str(path), conversations, SCOPES,
                                                                          RESOURCES, CONFIG)),
                         capture_output=True, check=True)
    imported, _, answer = run.stdout.partition(b"\n")
    assert imported == b"[]", f"an assembly worker imported {imported.decode()}"
    here = build_batch(ArrowColumns(table), conversations, SCOPES, RESOURCES, CONFIG)
    assert pickle.loads(answer).built == here.built
    assert not path.exists()  # a worker removes its batch's file once read
    pool = AssemblyPool(1, CONFIG)  # and a worker as the pool spawns it, with its start-up, after a batch
    try:
        assert not pool.result(pool.submit(table, conversations, SCOPES, RESOURCES), list(conversations)).failed
        assert pool.call(eval, f"sorted(m for m in {SERVER_ONLY!r} if m in __import__('sys').modules)"
                         ).result(60) == []
    finally:
        pool.stop()


def _niceness(pid: int) -> dict[str, int]:
    """Each thread of a process -> its niceness (Linux: a thread's own, field 19 of its stat); a thread that ends
    while they are read is left out."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[task.name] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
        except OSError:
            continue
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads each thread's priority from /proc (Linux)")
def test_every_thread_of_an_assembly_worker_runs_below_the_collector() -> None:
    """The workers build at a lower priority than the server, so the receivers and the span writer get a core
    first: every thread of a worker, the parent watch it starts and any thread its imports started before it lowered
    itself too (pyarrow's allocator thread, when workers imported it, had kept the server's)."""
    base = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's niceness, which the pool's processes start from
    if base + NICENESS > 19:
        pytest.skip("the suite runs niced already: a worker cannot go 10 lower")
    table, conversations = _rows(2)
    pool = AssemblyPool(1, CONFIG)
    try:
        assert not pool.result(pool.submit(table, conversations, SCOPES, RESOURCES), list(conversations)).failed
        (worker,) = pool.worker_pids()  # the pool's one worker process
        threads = _niceness(worker)
    finally:
        pool.stop()
    assert len(threads) >= 2 and set(threads.values()) == {base + NICENESS}, threads


def test_a_worker_killed_mid_batch_fails_that_batch_only_and_is_replaced() -> None:
    table, conversations = _rows(5000)  # a batch that takes the worker about a second
    pool = AssemblyPool(1, CONFIG)
    pool.start()
    try:
        [pid] = pool.worker_pids()  # the worker process, as the OS sees it
        started = _cpu_s(pid)
        future = pool.submit(table, conversations, SCOPES, RESOURCES)
        deadline = time.monotonic() + 30
        while _cpu_s(pid) < started + 0.1 and time.monotonic() < deadline:  # until it is building the batch
            time.sleep(0.01)
        assert not future.done(), "the batch ended before the worker could be killed in it"
        os.kill(pid, signal.SIGKILL)
        lost = pool.result(future, list(conversations))
        assert lost.failed.keys() == set(conversations) and not lost.built
        assert all(reason == str(AssemblyWorkerLost("an assembly worker stopped mid-batch; it was replaced"))
                   for reason in lost.failed.values())
        small, few = _rows(3)
        again = pool.result(pool.submit(small, few, SCOPES, RESOURCES), list(few))
        assert not again.failed and set(again.built) == set(few)
        assert pool.restarts == 1
        spill = pool._spill_dir
        assert spill is not None and list(spill.iterdir()) == []  # no batch file left behind
    finally:
        pool.stop()
    assert not spill.exists()


def test_a_worker_that_died_between_batches_is_replaced_and_the_next_batch_is_built() -> None:
    """A worker killed while idle (the OOM killer, an operator) costs no batch: the next one goes to its
    replacement."""
    table, conversations = _rows(3)
    pool = AssemblyPool(1, CONFIG)
    pool.start()
    try:
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30  # until its death can be seen by its parent, here (not reaped: WNOWAIT)
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        result = pool.result(pool.submit(table, conversations, SCOPES, RESOURCES), list(conversations))
        assert not result.failed and set(result.built) == set(conversations)
        assert pool.restarts == 1 and pool.worker_pids() != [pid]
    finally:
        pool.stop()


def test_a_batch_that_raises_in_its_worker_fails_with_the_reason_and_the_worker_goes_on() -> None:
    table, conversations = _rows(2)
    pool = AssemblyPool(1, CONFIG)
    try:
        failed = pool.result(pool.call(int, "not a number"), list(conversations))
        assert failed.failed == dict.fromkeys(conversations, "ValueError: invalid literal for int() with base 10: "
                                                             "'not a number'")
        unsendable = pool.result(pool.call(threading.Lock), list(conversations))  # a result pickle refuses
        assert unsendable.failed == dict.fromkeys(
            conversations, "the result could not be sent: TypeError: cannot pickle '_thread.lock' object")
        built = pool.result(pool.submit(table, conversations, SCOPES, RESOURCES), list(conversations))
        assert not built.failed and pool.restarts == 0
    finally:
        pool.stop()


def test_a_stop_waits_for_the_calls_before_it_and_a_call_racing_it_is_answered_too() -> None:
    """The collector's stop can meet the assembler's last submit (a thread still finishing its poll): the stop
    returns once its workers have answered what they were sent, and the late call is answered by a pool of its own
    rather than left queued behind the stop (it hung the stop, or waited out the batch timeout)."""
    pool = AssemblyPool(1, CONFIG)
    pool.start()
    busy = pool.call(time.sleep, 1.0)  # a batch in flight as the stop comes
    stopper = threading.Thread(target=pool.stop, daemon=True)
    try:
        time.sleep(0.2)
        stopper.start()
        time.sleep(0.1)  # the stop has taken the running workers
        late = pool.call(time.sleep, 0)
        assert busy.result(60) is None and late.result(60) is None
        stopper.join(60)
        assert not stopper.is_alive(), "the stop did not return"
    finally:
        pool.stop()
    assert pool.worker_pids() == []


@pytest.mark.parametrize("workers", [0, 2])
def test_every_conversation_of_a_batch_comes_back_whatever_the_workers(workers: int) -> None:
    table, conversations = _rows(20)
    pool = AssemblyPool(workers, CONFIG)
    try:
        result = pool.result(pool.submit(table, conversations, SCOPES, RESOURCES), list(conversations))
    finally:
        pool.stop()
    assert set(result.built) == set(conversations) and not result.failed


def test_batch_files_of_a_killed_server_are_removed_by_the_next_one() -> None:
    root = Path(_spill_root() or tempfile.gettempdir())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = root / f"{SPILL_PREFIX}{gone.stdout.strip()}-test"  # a server that no longer runs
    orphan.mkdir()
    (orphan / "1.arrow").write_bytes(b"left behind")
    table, conversations = _rows(1)
    pool = AssemblyPool(1, CONFIG)
    try:
        assert not pool.result(pool.submit(table, conversations, SCOPES, RESOURCES), list(conversations)).failed
        assert not orphan.exists()
        assert pool._spill_dir is not None and pool._spill_dir.exists()  # its own, while it runs
    finally:
        pool.stop()


def test_call_validity_is_scored_as_the_conversation_is_built_never_leased(tmp_path: Path) -> None:
    """A real collector: the check runs where the conversation is built and its score and done job are written
    with the version; the scoring stage never leases the job (attempts stay 0)."""
    with CollectorProcess(tmp_path / "t.duckdb",
                          config=config(tmp_path, 'metrics = ["mcp_call_validity"]\n')) as collector:
        export(collector, conversations(end=True))
        scores = wait_for(collector, "SELECT conversation_id, score FROM scores ORDER BY 1", 2)
        assert [r[0] for r in scores] == ["conv-a", "conv-b"]
        jobs = query(collector, "SELECT status, attempts FROM eval_jobs ORDER BY conversation_id")
        assert jobs == [["done", 0], ["done", 0]]
        calls = query(collector, "SELECT conversation_id, name, is_error FROM call_summary ORDER BY 1, turn")
        assert calls == [["conv-a", "get-weather", False], ["conv-a", "get-weather", False],
                         ["conv-b", "book-umbrella", True]]
        collector.stop()


def test_a_check_that_waits_is_left_to_the_scoring_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks run at assembly without an event loop: one whose measure waits on something is not scored there
    (None: the scoring stage measures it as a job, with its retries) and the conversation is still built."""
    from tracejudge.call_validity import MCPCallValidityMetric

    class Waiting(MCPCallValidityMetric):
        async def _score(self, test_case, usage):  # type: ignore[no-untyped-def]
            await asyncio.sleep(0)
            return await super()._score(test_case, usage)

    monkeypatch.setitem(conversation_builder.CHECKED_METRICS, "mcp_call_validity", Waiting)
    table, conversations = _rows(2)
    result = build_batch(ArrowColumns(table), conversations, SCOPES, RESOURCES, CONFIG)
    assert not result.failed and len(result.built) == 2
    assert all(b is not None and b.checks == {"mcp_call_validity": None} for b in result.built.values())
    monkeypatch.setitem(conversation_builder.CHECKED_METRICS, "mcp_call_validity", MCPCallValidityMetric)
    again = build_batch(ArrowColumns(table), conversations, SCOPES, RESOURCES, CONFIG)
    assert all(b is not None and b.checks["mcp_call_validity"] is not None for b in again.built.values())


def _samples(text: str, name: str) -> dict[str, float]:
    """A metric's samples in /metrics' text: its label set (or "") -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            if head == name or head.startswith(name + "{"):
                out[head[len(name):]] = float(value)
    return out


def _rss(pid: int) -> int:
    """A process's VmRSS from /proc/PID/status, in bytes (0: gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


def _children_by_ppid(pid: int) -> list[int]:
    """The processes whose parent is `pid`, found by scanning every /proc/*/status (not as the collector finds them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        if any(line.split()[1:] == [str(pid)] for line in status.splitlines() if line.startswith("PPid:")):
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads processes from /proc (Linux)")
def test_metrics_give_the_memory_of_the_server_its_workers_and_duckdb(tmp_path: Path) -> None:
    """Memory is bounded for all the collector's processes together: /metrics gives the server's resident memory and
    its child processes' (the assembly workers once conversations are built), and DuckDB's memory against its
    memory_limit, so an operator sees what a container limit will count and what to raise."""
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path)) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT conversation_id FROM conversations", 2)  # built in the assembly workers
        assert collector.proc is not None
        server = collector.proc.pid
        children = _children_by_ppid(server)
        assert children, "no worker process below the collector"
        expected = {'{process="server"}': _rss(server), '{process="children"}': sum(_rss(c) for c in children)}
        text = httpx.get(f"{collector.admin_url}/metrics", timeout=10).text
        resident = _samples(text, "tracejudge_resident_memory_bytes")
        for label, value in expected.items():  # read moments apart: within a fifth of each other
            assert abs(resident[label] - value) <= 0.2 * value, (label, resident, expected)
        assert _samples(text, "process_resident_memory_bytes")[""] > 0
        [limit] = _samples(text, "tracejudge_duckdb_memory_limit_bytes").values()
        assert abs(limit - 96e6) < 1e6  # the default [store] memory_limit, 96MB, as DuckDB holds it (91.5 MiB)
        in_memory = _samples(text, "tracejudge_duckdb_memory_bytes")
        assert in_memory['{tag="base_table"}'] > 0 and sum(in_memory.values()) <= limit
        collector.stop()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads processes from /proc (Linux)")
def test_an_assembly_worker_killed_under_a_running_collector_is_replaced_counted_and_nothing_is_lost(
        tmp_path: Path) -> None:
    """The OOM killer takes an idle worker: /metrics shows the workers running and the ones lost, the dead one is
    replaced without waiting for a batch, and the conversations that come next are assembled."""
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path)) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT conversation_id FROM conversations", 2)
        assert collector.proc is not None
        workers = _children_by_ppid(collector.proc.pid)
        assert collector.metric("tracejudge_assembly_workers") == len(workers) == default_workers()
        assert collector.metric("tracejudge_assembly_workers_lost_total") == 0
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (collector.metric("tracejudge_assembly_workers_lost_total") < 1
               or collector.metric("tracejudge_assembly_workers") < default_workers()) and time.monotonic() < deadline:
            time.sleep(0.1)  # its replacement starting
        assert collector.metric("tracejudge_assembly_workers_lost_total") == 1
        assert collector.metric("tracejudge_assembly_workers") == default_workers()
        assert workers[0] not in _children_by_ppid(collector.proc.pid)
        export(collector, conversations())  # both conversations go on: their second versions are built
        rows = wait_for(collector, "SELECT conversation_id FROM conversations WHERE version = 2", 2)
        assert sorted(r[0] for r in rows) == ["conv-a", "conv-b"]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads processes from /proc (Linux)")
def test_the_collector_runs_only_its_workers_beside_it_and_they_exit_when_it_is_killed(tmp_path: Path) -> None:
    """Every process of the collector counts against a container's memory: beside the server there are its
    assembly workers and nothing else (a multiprocessing pool's resource tracker was one more Python process, 13 MB),
    and a collector killed with -9 leaves none of them running."""
    with CollectorProcess(tmp_path / "t.duckdb", config=config(tmp_path)) as collector:
        export(collector, conversations(end=True))
        wait_for(collector, "SELECT conversation_id FROM conversations", 2)  # built in the assembly workers
        assert collector.proc is not None
        children = _children_by_ppid(collector.proc.pid)
        commands = [Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode() for c in children]
        assert len(children) == default_workers() and all(WORKER_MODULE in c for c in commands), commands
        collector.proc.send_signal(signal.SIGKILL)
        collector.proc.wait(10)
        deadline = time.monotonic() + 15  # an idle worker sees its stdin close; a busy one, its parent change
        while [c for c in children if _alive(c)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c for c in children if _alive(c)], "assembly workers outlived a killed collector"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a dead parent's reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
