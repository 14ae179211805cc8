"""The package as a user installs it: the sdist and the wheel built from it, installed in a fresh virtual
environment and run from outside the repository, once with a C compiler (the C walk built) and once without one
(every request decoded in Python). A file missing from the package data or a broken package mapping fails here."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.collector_process import CollectorProcess

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "real" / "pydantic_ai_mcp.otlp.json"


def _run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return done


@contextlib.contextmanager
def _one_build_at_a_time() -> Iterator[None]:
    """Builds from the repository write its egg-info and a temporary sdist tree in it: two at once (the suite runs
    in several processes) pull files from under each other, so they take turns (a lock the system releases when its
    holder exits, however it exits)."""
    lock = Path(tempfile.gettempdir()) / f"tracejudge-build-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]}.lock"
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.mark.parametrize("compiler", [True, False], ids=["with a C compiler", "without a C compiler"])
def test_the_wheel_installs_and_serves_outside_the_repository(tmp_path: Path, compiler: bool) -> None:
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    env = {**os.environ, **({} if compiler else {"CC": "false"})}
    # the sdist, then the wheel from it (python -m build's order), in this environment: no index needed
    with _one_build_at_a_time():
        _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)], env=env, cwd=work)
    [wheel] = dist.glob("tracejudge-*.whl")
    [_sdist] = dist.glob("tracejudge-*.tar.gz")
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # the dependencies from this environment's site-packages (its .pth files, the editable install, are not read)
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"tracejudge", "-".join(wheel.name.split("-")[:2]) + ".dist-info"}, tops  # nothing else on top
    imported = _run([str(python), "-c", (
        "import importlib, json, pkgutil, tracejudge, tracejudge.collector.receivers.otlp_columns as c\n"
        "from tracejudge.test_case import ConversationalTestCase, Turn, MCPServer, MCPToolCall, MCPPromptCall\n"
        "from tracejudge.metrics import MultiTurnMCPUseMetric, MCPTaskCompletionMetric, BaseConversationalMetric\n"
        "from tracejudge.dataset import EvaluationDataset, ConversationalGolden\n"
        "from tracejudge.evaluate.configs import AsyncConfig, CacheConfig, DisplayConfig, ErrorConfig\n"
        "from tracejudge import evaluate, assert_test\n"
        "names = [m.name for m in pkgutil.walk_packages(tracejudge.__path__, 'tracejudge.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "from tracejudge.mapping.compiled import running_compiled\n"
        "print(json.dumps([tracejudge.collector.__file__, c.native_decode_built(), len(names), running_compiled()]))")],
        cwd=work).stdout
    where, built, modules, mapping_compiled = json.loads(imported)
    assert where.startswith(site) and built == compiler and modules > 100
    assert mapping_compiled == compiler  # mypyc compiled the mapping into the wheel where a C compiler was
    for old in ("collector", "mapping", "scoring"):  # the generic names are not ours to take
        refused = subprocess.run([str(python), "-c", f"import {old}"], capture_output=True, text=True, cwd=work)
        assert refused.returncode == 1 and f"No module named '{old}'" in refused.stderr
    config = tmp_path / "tracejudge.toml"
    config.write_text("[conversations]\nquiet_period_s = 1\npoll_s = 0.1\n")
    with CollectorProcess(tmp_path / "t.duckdb", config=config, cwd=work,
                          command=[str(venv / "bin" / "tracejudge")]) as collector:
        assert collector.start_line["decoder"] == ("c" if compiler else "python")
        assert collector.start_line["mapping"] == ("compiled" if compiler else "python")
        _run([str(venv / "bin" / "tracejudge"), "replay", str(FIXTURE), "--endpoint", collector.http_url], cwd=work)
        url = collector.admin_url
        deadline, rows = time.monotonic() + 60, []
        while not rows and time.monotonic() < deadline:
            rows = json.loads(_run([str(venv / "bin" / "tracejudge"), "query", "--url", url, "--format", "json",
                                    "SELECT metric, score FROM latest_scores WHERE metric = 'mcp_call_validity'"],
                                   cwd=work).stdout or "[]")
            time.sleep(0.3)
        assert rows, "no score from the installed collector"
        page = _run([sys.executable, "-c", f"import httpx; print(httpx.get('{url}/').status_code)"]).stdout
        assert page.strip() == "200"  # the UI's templates are in the wheel


def test_every_import_uses_the_installed_names_not_the_repository_folders() -> None:
    """The folders are importable from the repository root only by accident of sys.path: `collector.x` next to
    `tracejudge.collector.x` would be two copies of one module (two stores, classes that are not each other). So
    no module, test or benchmark imports them or names them in a string (`-m`, mock targets, lazy maps)."""
    folder = re.compile(r"^(collector|mapping|scoring)(\.[a-z_]+)*$")
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    found = []
    for name in files:
        for node in ast.walk(ast.parse((ROOT / name).read_text(), name)):
            if isinstance(node, ast.Import):
                found += [f"{name}: import {a.name}" for a in node.names if folder.match(a.name)]
            elif isinstance(node, ast.ImportFrom) and not node.level and folder.match(node.module or ""):
                found.append(f"{name}: from {node.module}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and folder.match(node.value) \
                    and "." in node.value:
                found.append(f"{name}: {node.value!r}")
    assert len(files) > 150 and not found, found
