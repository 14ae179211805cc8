"""Build conversations in worker processes, so the server's GIL serves the receivers and the span writer.

Mapping and composing a conversation is pure Python: run in the server, it took the core ingest needs and held
exports up behind it (`python bench/pipeline_pace.py`). The assembler reads a batch's span rows as Arrow (no Python
objects per span in the server), sends them here as a file of their buffers (`span_columns`), and gets back each
conversation as plain data ready to write (`conversation_builder.Built`). Workers are plain processes
(`assembly_worker`), each served by a thread here that writes it a batch and reads back the result, and one that dies
is replaced: its batch fails, and its conversations wait another quiet
period and are built again from their stored spans, so nothing is lost. With `workers = 0` the batch is built in the
calling thread.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from tracejudge.collector.pipeline.assembly.assembly_worker import READY, build_from_file, receive, send
from tracejudge.collector.pipeline.assembly.conversation_builder import (
    BatchResult,
    BuildConfig,
    Resources,
    Scopes,
    build_batch,
)
from tracejudge.collector.pipeline.assembly.span_columns import ArrowColumns, write_columns
from tracejudge.collector.worker_process import usable_cpus
from tracejudge.errors import TracejudgeError

WORKER_MODULE = "tracejudge.collector.pipeline.assembly.assembly_worker"
START_TIMEOUT_S = 600.0  # a worker not answering its start by then is killed and the batch fails
STOP_TIMEOUT_S = 30.0  # a worker not gone this long after its stdin closed is killed
WATCH_S = 1.0  # how often an idle worker's thread looks whether its process still runs
BATCH_TIMEOUT_S = 600.0  # a batch not back by then is treated as lost with its worker (a batch takes seconds)


_T = TypeVar("_T")
_Tasks = queue.SimpleQueue[tuple[Future[Any], Any] | None]  # calls for a pool start's workers; None: a thread's end


class AssemblyWorkerLost(TracejudgeError):
    """An assembly worker stopped mid-batch (out of memory?); it was replaced, and the batch is built again after
    another quiet period."""


class AssemblyBatchFailed(TracejudgeError):
    """A worker raised while building a batch (the message is what it raised); the batch is built again after
    another quiet period, and the worker goes on to the next."""


def default_workers() -> int:
    """One process per core (at most 8): they run at a lower priority than the server, so they take the cores
    ingest leaves idle without slowing it; 0 on one core, where they would only take turns with the server."""
    cores = usable_cpus()
    return 0 if cores < 2 else min(8, cores)


SPILL_PREFIX = "tracejudge-assembly-"  # then the server's pid: a directory whose server is gone is removed


def _remove_orphans() -> None:
    """Batch files left by a server that was killed (a clean stop removes its own)."""
    for folder in Path(_spill_root() or tempfile.gettempdir()).glob(f"{SPILL_PREFIX}*-*"):
        pid = folder.name.removeprefix(SPILL_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def _spill_root() -> str | None:
    """Memory-backed where there is one (/dev/shm), else the system's temporary directory."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def _alive(pid: int) -> bool:
    """Running, not a zombie its thread has yet to reap (read without reaping it: only that thread waits for it)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


class _Worker:
    """One worker process and the server thread that talks to it: a batch at a time, written to its stdin and read
    back from its stdout; a process that dies fails its batch and is started again for the next."""

    def __init__(self, pool: AssemblyPool, number: int, tasks: _Tasks) -> None:
        self.pool = pool
        self.number = number
        self.tasks = tasks  # its pool start's queue: a later start has its own, so a stop's ends reach these threads
        self.process: subprocess.Popen[bytes] | None = None
        self.current: Future[BatchResult] | None = None  # the batch it builds now
        self.thread = threading.Thread(target=self._run, name=f"tracejudge-assembly-{number}", daemon=True)

    def start_process(self) -> None:
        """Spawned, never forked (gRPC does not survive a fork), without the working directory on its path (`-P`:
        a user's `json.py` there must not shadow a module); back once it has imported its modules, so the first batch
        is built at once."""
        process = subprocess.Popen([sys.executable, "-P", "-c", f"from {WORKER_MODULE} import main; main()"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdout is not None
        try:
            if not select.select([process.stdout], [], [], START_TIMEOUT_S)[0]:
                raise AssemblyWorkerLost(f"an assembly worker did not start within {START_TIMEOUT_S:.0f} s")
            if receive(process.stdout) != READY:
                raise AssemblyWorkerLost("an assembly worker answered its start with something else")
        except EOFError as exc:
            process.kill()
            process.wait()
            raise AssemblyWorkerLost("an assembly worker exited as it started: its error is on the collector's "
                                     "stderr") from exc
        except BaseException:
            process.kill()
            process.wait()
            raise
        self.process = process

    def _run(self) -> None:
        while True:
            try:
                task = self.tasks.get(timeout=WATCH_S)
            except queue.Empty:  # idle: a worker that died meanwhile (the OOM killer) is replaced now
                self._replace_if_dead()
                continue
            if task is None:
                return
            self._run_one(*task)
            del task

    def _replace_if_dead(self) -> None:
        process = self.process
        if process is None or process.poll() is None:
            return
        try:
            self._replace()
        except Exception:  # noqa: BLE001 - the next batch starts one, or fails with why
            self.stop_process(kill=True)

    def _run_one(self, future: Future[Any], call: tuple[Callable[..., object], tuple[object, ...]]) -> None:
        """One call, its answer set on its future; nothing of it is held here once it returns (the thread waits for
        the next call meanwhile, and a batch's results are megabytes)."""
        if not future.set_running_or_notify_cancel():
            return
        self.current = future
        try:
            answer = self._call(call)
        except BaseException as exc:  # noqa: BLE001 - the batch fails; its conversations are built again later
            future.set_exception(exc)
            return
        finally:
            self.current = None
        if answer[0] == "ok":
            future.set_result(answer[1])
        else:
            future.set_exception(AssemblyBatchFailed(str(answer[1])))

    def _call(self, call: tuple[Callable[..., object], tuple[object, ...]]) -> tuple[str, object]:
        """The call sent and its answer read; a worker found dead as the call is sent (it died between batches) is
        replaced and sent it instead."""
        if self.process is None:
            self.start_process()
        process = self.process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            send(process.stdin, call)
        except OSError:  # it died since: the call never reached it
            self._replace()
            process = self.process
            assert process is not None and process.stdin is not None and process.stdout is not None
            send(process.stdin, call)
        try:
            return receive(process.stdout)  # type: ignore[no-any-return]
        except (EOFError, OSError) as exc:  # it died mid-batch (killed, out of memory): replaced for the next
            self.stop_process(kill=True)
            self.pool._lost()
            raise AssemblyWorkerLost("an assembly worker stopped mid-batch; it was replaced") from exc

    def _replace(self) -> None:
        self.stop_process(kill=True)
        self.pool._lost()
        self.start_process()

    def stop_process(self, kill: bool = False) -> None:
        """Its stdin closed (the worker's loop ends) and the process waited for; killed when it does not go."""
        process, self.process = self.process, None
        if process is None:
            return
        if kill:
            process.kill()
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


class AssemblyPool:
    """Started by the assembler shortly before its first conversation is due, or by the first batch (a collector
    that only ingests runs none: each worker peaked at 55 MB in `python bench/pipeline_pace.py`)."""

    def __init__(self, workers: int, config: BuildConfig, on_start: Callable[[int], None] | None = None) -> None:
        self.workers = workers
        self.config = config
        self.on_start = on_start  # told the number of workers each time the pool starts
        self.restarts = 0
        self._lock = threading.Lock()  # the pool's start, its calls' queueing and its stop
        self._count_lock = threading.Lock()
        self._tasks: _Tasks | None = None  # the running pool's calls; None while it runs no workers
        self._running: list[_Worker] = []
        self._sent: dict[int, Path] = {}  # id(future) -> the file its rows are in
        self._spill_dir: Path | None = None
        self._spilled = 0

    def _start_locked(self) -> _Tasks:
        """The running pool's queue, its workers started first if none run (every worker now, not inside the
        first batches); the caller holds `_lock`."""
        if self._tasks is None:
            tasks: _Tasks = queue.SimpleQueue()
            running = [_Worker(self, n, tasks) for n in range(self.workers)]
            try:
                for worker in running:
                    worker.start_process()
            except BaseException:
                for worker in running:
                    worker.stop_process(kill=True)
                raise
            for worker in running:
                worker.thread.start()
            self._tasks, self._running = tasks, running
            if self.on_start is not None:
                self.on_start(self.workers)
        return self._tasks

    def _lost(self) -> None:
        with self._count_lock:
            self.restarts += 1

    def call(self, function: Callable[..., _T], *arguments: object) -> Future[_T]:
        """`function(*arguments)` run in the next free worker (a module-level function: it goes by name)."""
        future: Future[Any] = Future()
        with self._lock:  # queued to the pool that runs now, ahead of any stop's ends
            self._start_locked().put((future, (function, arguments)))
        return future

    def worker_pids(self) -> list[int]:
        """The running workers' process ids, as the OS sees them (none before the pool starts; one that died is
        left out until it is replaced)."""
        return [process.pid for w in list(self._running)
                if (process := w.process) is not None and process.returncode is None and _alive(process.pid)]

    @property
    def started(self) -> bool:
        """Whether its workers run (or start now)."""
        return self._tasks is not None

    def start(self) -> None:
        if self.workers:
            with self._lock:
                self._start_locked()

    def submit(self, table: pa.Table, conversations: dict[str, list[str]], scopes: Scopes,
               resources: Resources) -> Future[BatchResult]:
        """Build these conversations from the span rows in `table` (blocking to submit; `result` waits)."""
        if not conversations or self.workers == 0:
            return self._built_here(table, conversations, scopes, resources)
        try:
            path = self._spill(table)
        except OSError:  # no room where batches go (a small /dev/shm), a column it cannot take: built here instead
            return self._built_here(table, conversations, scopes, resources)
        future = self.call(build_from_file, str(path), conversations, scopes, resources, self.config)
        self._sent[id(future)] = path
        return future

    def _built_here(self, table: pa.Table, conversations: dict[str, list[str]], scopes: Scopes,
                    resources: Resources) -> Future[BatchResult]:
        """The batch built in the calling thread now, with that thread's CPU for it."""
        started = time.thread_time()
        done: Future[BatchResult] = Future()
        result = build_batch(ArrowColumns(table), conversations, scopes, resources, self.config) if conversations \
            else BatchResult()
        result.cpu_s, result.here = time.thread_time() - started, True
        done.set_result(result)
        return done

    def _spill(self, table: pa.Table) -> Path:
        """The rows as a file of their Arrow buffers (`span_columns`) the worker maps without a copy: sent through
        the pool's pipe, each batch was pickled whole in the server first (+170 MB peak with three batches in
        flight)."""
        with self._lock:
            if self._spill_dir is None:
                _remove_orphans()
                self._spill_dir = Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=_spill_root()))
            self._spilled += 1
            path = self._spill_dir / f"{self._spilled}.columns"
        try:
            write_columns(table, path)
        except (OSError, pa.ArrowException, TypeError) as exc:  # TypeError: a column type the file does not take
            with contextlib.suppress(OSError):
                path.unlink()
            raise OSError(f"the batch file {path} could not be written: {exc}") from exc
        return path

    def result(self, future: Future[BatchResult], conversations: list[str]) -> BatchResult:
        """The batch built; when its worker died, every conversation of it failed (built again later)."""
        path = self._sent.pop(id(future), None)
        try:
            return future.result(BATCH_TIMEOUT_S)
        except TimeoutError:  # a worker stuck in a batch: killed, so its thread replaces it
            for worker in list(self._running):
                process = worker.process
                if worker.current is future and process is not None:
                    with contextlib.suppress(OSError):
                        process.kill()
            reason = str(AssemblyWorkerLost("an assembly worker stopped mid-batch; it was replaced"))
            return BatchResult(failed=dict.fromkeys(conversations, reason))
        except Exception as exc:  # noqa: BLE001 - lost with its worker, or could not be built: retried later
            return BatchResult(failed=dict.fromkeys(conversations, str(exc) if isinstance(exc, TracejudgeError)
                                                    else f"{type(exc).__name__}: {exc}"))
        finally:
            if path is not None:  # the worker removes it once read; not when it died first
                with contextlib.suppress(OSError):
                    path.unlink()

    def stop(self) -> None:
        """The calls queued are answered first, then each worker's stdin closed and the process waited for. A call
        after this starts the pool again, on a queue of its own."""
        with self._lock:
            running, tasks, self._running, self._tasks = self._running, self._tasks, [], None
            spill_dir, self._spill_dir = self._spill_dir, None
            for _ in running:
                assert tasks is not None
                tasks.put(None)  # behind every call queued to these workers
        for worker in running:
            worker.thread.join()
            worker.stop_process()
        if spill_dir is not None:
            shutil.rmtree(spill_dir, ignore_errors=True)
