"""pytest plugin: `pytest --tracejudge-db ci.duckdb` records every `assert_test` of the run into a tracejudge
database, so CI runs and production scores answer the same SQL (`latest_scores`, the web UI, `report`).

Each test's cases become conversations `ci:<run>:<test id>#<n>` of service `ci` (agent: the test id), each
metric result a score row. Without the option the plugin does nothing. With pytest-xdist (`-n 4`, or
`tracejudge test run -n 4`) each worker hands its results to the controller, which writes them all at once.
"""

from __future__ import annotations

import datetime as dt
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
        from tracejudge.collector.store.results_file import ScoredCase, write_results

        seen: dict[str, int] = {}
        scored = []
        for test, case, result in self.results:
            seen[test] = seen.get(test, 0) + 1
            scored.append(ScoredCase(f"ci:{self.run}:{test}#{seen[test]}", test, case, result))
        write_results(self.path, scored, "ci", "ci")
