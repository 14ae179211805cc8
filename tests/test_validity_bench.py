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


def _run(tmp_path: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "validity.py"), *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / "results.json").read_text())


def test_task_level_figures_score_an_oracle_perfectly_and_noise_at_chance(tmp_path) -> None:
    """A judge answering each task from its label ranks every faulty task below every clean one (per-task AUC 1.0),
    and shows why the mean over tasks is blind: it passes every conversation whose one task failed, where
    any_task fails them all. A judge answering noise sits near 0.5."""
    oracle = _run(tmp_path / "oracle", "--scripted", "labels", "--sample", "40", "--metric",
                  "mcp_task_completion")["metrics"]["mcp_task_completion"]["task_level"]
    assert oracle["auc_in_scope"] == 1.0 and oracle["auc_all_faults"] == 1.0
    assert oracle["per_fault"]["clean"]["flagged"] == 0.0
    assert all(f["flagged"] == 1.0 for fault, f in oracle["per_fault"].items() if fault != "clean")
    assert oracle["per_fault"]["unanswered"]["in_scope"] and not oracle["per_fault"]["wrong_tool"]["in_scope"]
    levels = oracle["conversation_level"]
    assert levels["any_task"]["detected"] == 1.0 and levels["any_task"]["false_alarms"] == 0.0
    # one faulty task of two or three never pulls the mean under 0.5: the mean finds only the recorded
    # conversations whose other task was an honest failure too
    assert levels["mean"]["detected"] < 0.3

    noise = _run(tmp_path / "noise", "--scripted", "--sample", "120", "--metric",
                 "mcp_task_completion")["metrics"]["mcp_task_completion"]["task_level"]
    assert 0.35 < noise["auc_in_scope"] < 0.65 and noise["tasks"] > 200
