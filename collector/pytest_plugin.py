"""pytest plugin: `pytest --tracejudge-db ci.duckdb` records every `assert_test` of the run into a tracejudge
database, so CI runs and production scores answer the same SQL (`latest_scores`, the web UI, `report`).

Each test's cases become conversations `ci:<run>:<test id>#<n>` of service `ci` (agent: the test id), each
metric result a score row. Without the option the plugin does nothing. With pytest-xdist (`-n 4`, or
`tracejudge test run -n 4`) each worker hands its results to the controller, which writes them all at once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tracejudge.evaluation import TestResult
    from tracejudge.test_case import ConversationalTestCase


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("tracejudge").addoption(
        "--tracejudge-db", default=None, metavar="FILE",
        help="record every assert_test result into this tracejudge DuckDB file (service 'ci'); it must not be "
             "held by a running collector")


WORKER_OUTPUT = "tracejudge_results"  # key of a pytest-xdist worker's results in its `workeroutput`


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--tracejudge-db")
    if path:
        config.pluginmanager.register(Recorder(Path(path), config), "tracejudge-recorder")


class Recorder:
    """Collects assert_test results during the run and writes them in one transaction at its end (in the
    controller, when pytest-xdist runs the tests in workers)."""

    def __init__(self, path: Path, config: pytest.Config) -> None:
        self.path = path
        self.worker_output: dict[str, Any] | None = getattr(config, "workeroutput", None)
        self.run = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        self.test: str | None = None
        self.results: list[tuple[str, ConversationalTestCase, TestResult]] = []
        self.lost: list[str] = []  # results a pytest-xdist worker could not hand over, and why
        self.outcome = ""

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        from tracejudge import assertions

        assertions.listeners.append(self._record)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        self.test = item.nodeid
        try:
            return (yield)
        finally:
            self.test = None

    def _record(self, case: ConversationalTestCase, result: TestResult) -> None:
        self.results.append((self.test or "outside a test", case, result))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A pytest-xdist worker finished: take over the results it recorded."""
        from tracejudge.evaluation import TestResult
        from tracejudge.test_case import ConversationalTestCase

        output = getattr(node, "workeroutput", None) or {}
        if WORKER_OUTPUT not in output:
            if error is not None:
                self.lost.append(f"worker {getattr(node, 'gateway', node)!s} crashed ({error})")
            return
        for test, case, result in json.loads(output[WORKER_OUTPUT]):
            try:
                self.results.append((test, ConversationalTestCase.model_validate(case),
                                     TestResult.model_validate(result)))
            except ValueError as exc:
                self.lost.append(f"{test}: {exc}")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from tracejudge import assertions

        if self._record in assertions.listeners:
            assertions.listeners.remove(self._record)
        if self.worker_output is not None:  # a pytest-xdist worker: the controller writes
            self.worker_output[WORKER_OUTPUT] = json.dumps(
                [[test, case.model_dump(mode="json", fallback=str), result.model_dump(mode="json", fallback=str)]
                 for test, case, result in self.results])
            return
        if not self.results:
            self.outcome = f"tracejudge: no assert_test result to record in {self.path}" + (
                f"; not recorded: {'; '.join(self.lost)}" if self.lost else "")
            return
        try:
            self._write()
        except Exception as exc:  # the tests' own outcome stands; say why the record is missing
            self.outcome = f"tracejudge: could not record into {self.path}: {type(exc).__name__}: {exc}"
            return
        self.outcome = (f"tracejudge: recorded {len(self.results)} assert_test result(s) of run {self.run} "
                        f"in {self.path}")
        if self.lost:
            self.outcome += f"; not recorded: {'; '.join(self.lost)}"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.outcome:
            terminalreporter.write_line(self.outcome)

    def _write(self) -> None:
        import duckdb

        from tracejudge.collector.store.schema import migrate

        now = dt.datetime.now(dt.UTC)
        seen: dict[str, int] = {}
        with duckdb.connect(str(self.path)) as con:
            migrate(con)
            con.execute("BEGIN TRANSACTION")
            for test, case, result in self.results:
                seen[test] = seen.get(test, 0) + 1
                cid = f"ci:{self.run}:{test}#{seen[test]}"
                text = case.model_dump_json(exclude_none=True)
                calls = sum(len(t.mcp_tools_called or []) + len(t.mcp_resources_called or [])
                            + len(t.mcp_prompts_called or []) for t in case.turns)
                con.execute("INSERT INTO conversations (conversation_id, version, content_hash, status, service_name, "
                            "agent_name, turns, mcp_calls, trace_ids, test_case, assembled_at) VALUES "
                            "(?, 1, ?, 'complete', 'ci', ?, ?, ?, [], ?, ?)",
                            [cid, hashlib.sha256(text.encode()).hexdigest(), test, len(case.turns), calls, text, now])
                for position, m in enumerate(result.metrics):  # the same metric twice keeps both rows
                    con.execute("INSERT INTO scores (conversation_id, conversation_version, metric, metric_config, "
                                "score, success, threshold, strict_mode, reason, judge_model, evaluation_cost, "
                                "input_tokens, output_tokens, breakdown, error, service_name, agent_name, scored_at) "
                                "VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'ci', ?, ?)",
                                [cid, m.metric, f"ci:{position}", m.score, m.success, m.threshold, m.strict_mode,
                                 m.reason, m.evaluation_model, m.evaluation_cost, m.input_tokens, m.output_tokens,
                                 _json(m.score_breakdown), m.error, test, now])
            con.execute("COMMIT")


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)
