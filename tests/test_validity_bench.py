"""bench/validity.py as users run it: a real process over a sample of the corpus, with the scripted judge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_validity_benchmark_reports_every_metric_and_fault_and_repeatability(tmp_path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "validity.py"), "--scripted", "--sample", "40",
                           "--runs", "2", "--metric", "mcp_task_completion", "--metric", "mcp_call_validity",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert 40 <= results["conversations"] <= 48  # a stratified sample: every fault keeps its share
    validity = results["metrics"]["mcp_call_validity"]
    for fault in ("schema_invalid_arguments", "unknown_tool", "ignored_tool_error"):
        assert validity["per_fault"][fault]["flagged"] == 1.0 and validity["per_fault"][fault]["auc_vs_clean"] > 0.9
    assert validity["per_fault"]["clean"]["flagged"] < 0.2
    completion = results["metrics"]["mcp_task_completion"]
    assert set(completion["per_fault"]) == set(validity["per_fault"]) and len(completion["per_fault"]) == 11
    assert completion["repeatability"]["same_verdict"] == 1.0  # the scripted judge answers the same prompt alike
    assert completion["usage_per_run"]["judge_calls"] > 40 and completion["errors"] == 0
    html = (tmp_path / "validity.html").read_text()
    assert "scripted judge (plumbing, not validity)" in html and html.count("<svg") == 2
    assert "mcp_call_validity: AUC" in proc.stdout
