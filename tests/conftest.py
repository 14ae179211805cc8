from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.scripted_server import SYSTEM_ONE_PATH, ScriptedServer
from tracejudge import LLMJudge, RetryPolicy
from tracejudge.collector.worker_process import usable_cpus
from tracejudge.judges import TypeSafeJudge

MAX_TEST_WORKERS = 4  # each test may run a collector with its own worker processes: more would only contend


@pytest.hookimpl(optionalhook=True)  # xdist's hook: this file loads whether xdist is installed or not
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): one test process per usable core, at most `MAX_TEST_WORKERS`."""
    return min(MAX_TEST_WORKERS, usable_cpus())


class SleepRecorder:
    """Records the waits a judge asks for instead of sleeping, so backoff is checked exactly and fast."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TYPESAFE_API_KEY", "TYPESAFE_BASE_URL",
                 "TRACEJUDGE_EVAL_MODE", "TRACEJUDGE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def judge_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
        yield server


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def judge(judge_server: ScriptedServer, sleeps: SleepRecorder) -> LLMJudge:
    return LLMJudge("gpt-4o-mini", base_url=judge_server.base_url, api_key="sk-test-not-a-secret",
                    retry_policy=RetryPolicy(max_retries=3, sleep=sleeps))


@pytest.fixture
def s1_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    with ScriptedServer(SYSTEM_ONE_PATH) as server:
        monkeypatch.setenv("TYPESAFE_BASE_URL", server.root_url)
        monkeypatch.setenv("TYPESAFE_API_KEY", "ts-test-not-a-secret")
        yield server


@pytest.fixture
def s1(s1_server: ScriptedServer, sleeps: SleepRecorder) -> TypeSafeJudge:
    return TypeSafeJudge("jev-latest", retry_policy=RetryPolicy(max_retries=2, sleep=sleeps))


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where a browser test puts its screenshots: TRACEJUDGE_SCREENSHOTS when set (the docs' come from there)."""
    folder = Path(os.environ.get("TRACEJUDGE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
