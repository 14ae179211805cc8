"""What an assembly worker process runs: its start, its loop of calls from the server, and a batch built from the
file the server wrote.

A module of its own so that a worker imports only this and the building code, and no pyarrow (30 MB of a worker's
memory, `span_columns`): the pool's module writes the files, with pyarrow, in the server. A worker is a plain
`python` process talking to the server over its standard input and output (`assembly_pool`), not a
multiprocessing pool's: that one's named semaphores needed multiprocessing's resource tracker, one more Python
process (13 MB) beside every collector.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import sys
import time
from typing import IO, Any

from tracejudge.collector.pipeline.assembly.conversation_builder import BatchResult, BuildConfig, build_batch
from tracejudge.collector.pipeline.assembly.span_columns import ColumnFile
from tracejudge.collector.worker_process import start_below
from tracejudge.mapping.stored_spans import Resources, Scopes

NICENESS = 10  # below the server: while both want a core, the receivers and the span writer get it
FRAME = struct.Struct("<Q")  # each message on the pipes: its length, then its pickle
READY = b"ready"  # a worker's first message: imported and lowered, so its first batch is built at once


def send(pipe: IO[bytes], message: object) -> None:
    """One message, framed: a pickle's length, then the pickle (pickled whole first: one that cannot be pickled
    raises before a byte is written, so the pipe stays framed)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(FRAME.pack(len(body)))
    pipe.write(body)
    pipe.flush()


def receive_bytes(pipe: IO[bytes]) -> bytes:
    """The next framed message's pickle; EOFError when the other side has gone (closed or died)."""
    head = pipe.read(FRAME.size)
    if len(head) < FRAME.size:
        raise EOFError("the pipe closed")
    size = FRAME.unpack(head)[0]
    body = pipe.read(size)
    if len(body) < size:
        raise EOFError("the pipe closed mid-message")
    return body


def receive(pipe: IO[bytes]) -> Any:
    """The next framed message, unpickled."""
    return pickle.loads(receive_bytes(pipe))


def build_from_file(path: str, conversations: dict[str, list[str]], scopes: Scopes, resources: Resources,
                    config: BuildConfig) -> BatchResult:
    """The batch's rows read from their file (removed once read), then built, with the worker's CPU for it (the
    server counts it as assembly's build stage)."""
    started = time.process_time()
    try:
        with ColumnFile(path) as columns:
            result = build_batch(columns, conversations, scopes, resources, config)
        result.cpu_s = time.process_time() - started
        return result
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def serve(calls: IO[bytes], answers: IO[bytes]) -> None:
    """Answer the server's calls, (function, arguments) -> ("ok", its result) or ("error", what it raised), until
    the server closes the pipe (a stop, or its death: a worker never outlives its collector)."""
    send(answers, READY)
    while True:
        try:
            answer_one(receive_bytes(calls), answers)
        except EOFError:
            return


def answer_one(call: bytes, answers: IO[bytes]) -> None:
    """One call run and answered; its arguments and result are freed on return, before the worker waits for the
    next (held while it waited, the last batch's result stayed beside the next one's: 3 MB more at each worker's
    peak, `python bench/pipeline_pace.py`). A call that cannot be read, or a result that cannot be pickled, is
    answered with the error: the frames around it are whole, so the worker goes on."""
    try:
        function, arguments = pickle.loads(call)
        answer: tuple[str, object] = ("ok", function(*arguments))
    except Exception as exc:  # noqa: BLE001 - the server fails this batch with the reason and retries it later
        answer = ("error", f"{type(exc).__name__}: {exc}")
    try:
        send(answers, answer)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
        send(answers, ("error", f"the result could not be sent: {type(exc).__name__}: {exc}"))


def main() -> None:
    """The worker's start: the modules above were imported at the server's priority (0.3-0.5 s of a core: imported
    lowered, beside a busy core, they took seconds, the likely cause of a CI failure, 30a98a8), then lowered, then
    serving. The pipes are its own copies of stdin and stdout; fd 0 then reads /dev/null and fd 1 writes to stderr,
    so a stray read or print cannot take or corrupt a message. Ctrl-C in the server's terminal reaches its whole
    process group: a worker ignores it and stops when the server closes its pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    calls = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    with open(os.devnull, "rb") as nothing:
        os.dup2(nothing.fileno(), 0)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin for as long as it runs
    sys.stdout = sys.stderr
    start_below(NICENESS)
    serve(calls, answers)
