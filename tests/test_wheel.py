"""The package as a user installs it: the sdist and the wheel built from it, installed in a fresh virtual
environment and run from outside the repository, once with a C compiler (the C walk built) and once without one
(every request decoded in Python). A file missing from the package data or a broken package mapping fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.support.collector_process import CollectorProcess

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "real" / "pydantic_ai_mcp.otlp.json"


def _run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return done


@pytest.mark.parametrize("compiler", [True, False], ids=["with a C compiler", "without a C compiler"])
def test_the_wheel_installs_and_serves_outside_the_repository(tmp_path: Path, compiler: bool) -> None:
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    env = {**os.environ, **({} if compiler else {"CC": "false"})}
    # the sdist, then the wheel from it (python -m build's order), in this environment: no index needed
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)], env=env, cwd=work)
    [wheel] = dist.glob("tracejudge-*.whl")
    [_sdist] = dist.glob("tracejudge-*.tar.gz")
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # the dependencies from this environment's site-packages (its .pth files, the editable install, are not read)
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])
    imported = _run([str(python), "-c", (
        "import collector, collector.receivers.otlp_columns as c, json; "
        "from scoring import MultiTurnMCPUseMetric, MCPTaskCompletionMetric, evaluate, assert_test; "
        "from scoring.test_case import ConversationalTestCase, Turn, MCPServer, MCPToolCall; "
        "print(json.dumps([collector.__file__, c.native_decode_built()]))")], cwd=work).stdout
    where, built = json.loads(imported)
    assert where.startswith(site) and built == compiler
    config = tmp_path / "tracejudge.toml"
    config.write_text("[conversations]\nquiet_period_s = 1\npoll_s = 0.1\n")
    with CollectorProcess(tmp_path / "t.duckdb", config=config, cwd=work,
                          command=[str(venv / "bin" / "tracejudge")]) as collector:
        assert collector.start_line["decoder"] == ("c" if compiler else "python")
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
