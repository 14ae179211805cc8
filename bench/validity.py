"""Do the scores mean something? Run any metric, eval mode and judge over the labelled corpus
(bench/validity/corpus.jsonl) and measure how well each metric separates faulty conversations from clean ones.

Per metric it prints ROC AUC of (1 - score) against the label (faulty vs clean), accuracy at the threshold
(a score under it predicts "faulty"), the detection rate per fault type and the false-alarm rate on clean
conversations, agreement between runs (repeatability), and judge calls, tokens and cost. It writes
`results.json` and `validity.html` (a chart) to --out. A metric that does not apply (no MCP call for
mcp_call_validity) counts as "no fault found". mcp_call_validity flags a conversation with any invalid call
(score under 1), whatever --threshold says: its score is the share of valid calls.

The judged metrics are also measured per task, against the corpus's per-task labels: detection per fault type
and AUC of the task scores, in each metric's scope (EXPECTED: the faults a metric is built to see; one outside
it is not charged to the metric), and the conversation level under both aggregations (the mean over tasks,
DeepEval's; any_task, the worst task). `--scripted labels` answers every task question from its label (1 clean,
0 faulty): the per-task AUC must then be 1.0, and with `--scripted` (noise) about 0.5.

    python bench/validity.py --metric mcp_call_validity                   # deterministic, no judge
    python bench/validity.py --scripted --runs 2                          # plumbing only: random scores
    python bench/validity.py --scripted labels                            # an oracle judge: per-task AUC 1.0
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python bench/validity.py --model Qwen/Qwen2.5-7B-Instruct \\
        --eval-mode llm --sample 120 --runs 2 --concurrency 16            # a real judge
    python bench/validity.py --eval-mode system_one --system-one-model logprob:MODEL   # logprob System One
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.validity.generate import CORPUS, FAULTS, HONEST_FAILURE  # noqa: E402
from tests.support.scripted_server import Reply, Request, ScriptedServer, completion  # noqa: E402
from tracejudge import METRICS, BaseMetric, LLMJudge, evaluate  # noqa: E402
from tracejudge.calibration import CalibrationExample  # noqa: E402
from tracejudge.interactions import split_tasks  # noqa: E402
from tracejudge.judged_metric import task_scores  # noqa: E402
from tracejudge.test_case import ConversationalTestCase  # noqa: E402

# the faults each metric is built to see (README, "Which task failed"): a fault outside a metric's scope is
# reported, not counted against it
EXPECTED = {
    "mcp_call_validity": {"schema_invalid_arguments", "unknown_tool", "ignored_tool_error"},
    "mcp_use": {"wrong_tool", "missing_call", "unnecessary_call", "wrong_argument_value", "schema_invalid_arguments",
                "unknown_tool"},
    "mcp_task_completion": {"missing_call", "wrong_argument_value", "ignored_tool_error", "hallucination",
                            "unanswered", "partial_answer", HONEST_FAILURE},
}


def roc_auc(faulty: list[float], clean: list[float]) -> float | None:
    """P(a faulty conversation scores lower than a clean one), ties counting half (Mann-Whitney)."""
    if not faulty or not clean:
        return None
    wins = sum((f < c) + 0.5 * (f == c) for f in faulty for c in clean)
    return wins / (len(faulty) * len(clean))


def sample(rows: list[dict[str, Any]], size: int | None, seed: int) -> list[dict[str, Any]]:
    """`size` conversations stratified by fault (every fault keeps its share), in corpus order."""
    if size is None or size >= len(rows):
        return rows
    rng = random.Random(seed)
    by_fault: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        by_fault[row["labels"]["fault"]].append(i)
    chosen: list[int] = []
    for indices in by_fault.values():
        chosen += rng.sample(indices, max(1, round(size * len(indices) / len(rows))))
    return [rows[i] for i in sorted(chosen)]


def scripted_answer(request: Request) -> Reply:
    """Plumbing only: a score from the prompt's hash, unrelated to any fault."""
    if request.judge == "final_reason":
        return completion({"reason": "scripted"})
    digest = hashlib.sha256(request.user.encode()).digest()
    return completion({"reason": "scripted", "score": round(digest[0] / 255, 2)})


def _task_key(text: str, steps: Any) -> str:
    return text + "\x00" + json.dumps(steps, sort_keys=True, default=str)


def label_oracle(rows: list[dict[str, Any]]) -> Any:
    """A judge that knows the labels: each task question is answered 1.0 for a clean task and 0.0 for a faulty
    one, the task found by its request and steps as the metrics send them (what the per-task AUC must score 1.0
    on). A question it cannot place gets 0.5."""
    labels: dict[str, str] = {}
    for row in rows:
        tasks = split_tasks(ConversationalTestCase.model_validate(row["test_case"]))
        for task, fault in zip(tasks, row["labels"].get("tasks") or [], strict=False):
            labels[_task_key(task.text, list(task.steps))] = fault

    def answer(request: Request) -> Reply:
        if request.judge == "final_reason":
            return completion({"reason": "oracle"})
        data = request.data if isinstance(request.data, dict) else {}
        fault = labels.get(_task_key(data.get("task", ""), data.get("steps")))
        return completion({"reason": f"oracle: {fault}", "score": 0.5 if fault is None else
                           (1.0 if fault == "clean" else 0.0)})
    return answer


def build_metrics(names: list[str], args: argparse.Namespace, judge: LLMJudge | None,
                  examples: Sequence[CalibrationExample] = ()) -> list[BaseMetric]:
    metrics: list[BaseMetric] = []
    for name in names:
        if name == "mcp_call_validity":
            metrics.append(METRICS[name](threshold=args.threshold))
        else:
            metrics.append(METRICS[name](threshold=args.threshold, model=judge, eval_mode=args.eval_mode,
                                         system_one_model=args.system_one_model, calibration_examples=examples))
    return metrics


def run_once(rows: list[dict[str, Any]], names: list[str], args: argparse.Namespace, judge: LLMJudge | None,
             examples: Sequence[CalibrationExample] = (),
             ) -> tuple[dict[str, list[float | None]], dict[str, dict[str, float]], float,
                        dict[str, list[dict[int, float] | None]]]:
    """Scores per metric in corpus order (None: error), usage per metric, wall seconds, and each judged metric's
    per-task scores (task index -> score); the judged metrics calibrated with `examples` when given
    (bench/calibration.py)."""
    metrics = build_metrics(names, args, judge, examples)
    started = time.perf_counter()
    result = evaluate([r["test_case"] for r in rows], metrics, max_concurrency=args.concurrency,
                      file=io.StringIO())
    wall = time.perf_counter() - started
    scores: dict[str, list[float | None]] = {n: [] for n in names}
    tasks: dict[str, list[dict[int, float] | None]] = {n: [] for n in names}
    usage: dict[str, dict[str, float]] = {n: defaultdict(float) for n in names}
    for test in result.test_results:
        for name, m in zip(names, test.metrics, strict=True):
            if m.error is not None and not m.error.startswith("not applicable"):
                scores[name].append(None)
                tasks[name].append(None)
                usage[name]["errors"] += 1
            else:
                scores[name].append(1.0 if m.score is None else m.score)  # not applicable: nothing found
                rows_ = (m.score_breakdown or {}).get("tasks") or []
                tasks[name].append({r["task_index"]: s for r, s in zip(rows_, task_scores({"tasks": rows_}),
                                                                         strict=False)})
            breakdown = m.score_breakdown or {}
            usage[name]["judge_calls"] += breakdown.get("judge_calls", 0)
            usage[name]["input_tokens"] += breakdown.get("input_tokens", 0)
            usage[name]["output_tokens"] += breakdown.get("output_tokens", 0)
            usage[name]["cost_usd"] += m.evaluation_cost or 0.0
    return scores, usage, wall, tasks


def label(row: dict[str, Any], metric: str) -> str:
    """The row's label for this metric: a reviewed conversation (`tracejudge export --reviews`) is labelled per
    metric by its reviewers ("clean" when they passed it, "human_fail" when not); a generated one by its fault."""
    verdicts = row["labels"].get("metrics")
    if verdicts is not None:
        return "clean" if verdicts.get(metric) else "human_fail"
    return row["labels"]["fault"]


def summarise(rows: list[dict[str, Any]], runs: list[list[float | None]], threshold: float,
              metric: str) -> dict[str, Any]:
    first = runs[0]
    labels = [label(r, metric) for r in rows]
    pairs = [(s, f) for s, f in zip(first, labels, strict=True) if s is not None]
    faulty = [s for s, f in pairs if f != "clean"]
    clean = [s for s, f in pairs if f == "clean"]
    per_fault = {}
    for fault in [*FAULTS, *sorted(set(labels) - set(FAULTS))]:
        scored = [s for s, f in pairs if f == fault]
        if scored:
            per_fault[fault] = {"n": len(scored), "flagged": sum(s < threshold for s in scored) / len(scored),
                                "auc_vs_clean": roc_auc(scored, clean) if fault != "clean" else None}
    correct = sum((s < threshold) == (f != "clean") for s, f in pairs)
    out: dict[str, Any] = {"auc": roc_auc(faulty, clean), "accuracy": correct / len(pairs) if pairs else None,
                           "scored": len(pairs), "errors": len(first) - len(pairs), "per_fault": per_fault}
    if len(runs) > 1:
        both = [(a, b) for a, b in zip(runs[0], runs[1], strict=True) if a is not None and b is not None]
        out["repeatability"] = {
            "same_verdict": sum((a < threshold) == (b < threshold) for a, b in both) / len(both) if both else None,
            "mean_abs_difference": sum(abs(a - b) for a, b in both) / len(both) if both else None,
            "changed": sum(a != b for a, b in both)}
    return out


def summarise_tasks(rows: list[dict[str, Any]], tasks: list[dict[int, float] | None], threshold: float,
                    metric: str) -> dict[str, Any] | None:
    """Task scores against task labels: detection and AUC vs clean tasks per fault, the AUC over the faults in the
    metric's scope, and the conversation level under both aggregations (in-scope faulty vs clean conversations)."""
    pairs = [(score, fault) for row, per_task in zip(rows, tasks, strict=True) if per_task is not None
             for index, fault in enumerate(row["labels"].get("tasks") or []) if (score := per_task.get(index))
             is not None]
    if not pairs:
        return None
    scope = EXPECTED.get(metric, set())
    clean = [s for s, f in pairs if f == "clean"]
    per_fault = {}
    for fault in [*FAULTS, *sorted({f for _, f in pairs} - set(FAULTS))]:
        scored = [s for s, f in pairs if f == fault]
        if scored:
            per_fault[fault] = {"n": len(scored), "in_scope": fault in scope,
                                "flagged": sum(s < threshold for s in scored) / len(scored),
                                "auc_vs_clean": roc_auc(scored, clean) if fault != "clean" else None}
    conversations: dict[str, Any] = {}
    for aggregation, combine in (("mean", lambda v: sum(v) / len(v)), ("any_task", min)):
        scored = [(combine(list(per_task.values())), row) for row, per_task in zip(rows, tasks, strict=True)
                  if per_task]
        faulty = [s for s, row in scored if any(f in scope for f in row["labels"].get("tasks") or [])]
        fine = [s for s, row in scored if all(f == "clean" for f in row["labels"].get("tasks") or [])]
        conversations[aggregation] = {
            "auc": roc_auc(faulty, fine), "detected": sum(s < threshold for s in faulty) / len(faulty) if faulty
            else None, "false_alarms": sum(s < threshold for s in fine) / len(fine) if fine else None}
    return {"tasks": len(pairs), "auc_in_scope": roc_auc([s for s, f in pairs if f in scope], clean),
            "auc_all_faults": roc_auc([s for s, f in pairs if f != "clean"], clean), "per_fault": per_fault,
            "conversation_level": conversations}


CHART = Environment(autoescape=True).from_string("""<!doctype html>
<html><head><meta charset="utf-8"><title>tracejudge validity: {{ title }}</title>
<style>body{font:14px system-ui,sans-serif;margin:24px;color:#1c2430}h1{font-size:20px}table{border-collapse:collapse}
td,th{padding:4px 10px;border-bottom:1px solid #e3e7ee;text-align:left}.bar{fill:#3b6fd8}.clean{fill:#d8843b}
.axis{stroke:#9aa4b2}.muted{color:#667085}</style></head><body>
<h1>Validity: {{ title }}</h1>
<p class="muted">{{ rows }} conversations of bench/validity/corpus.jsonl; a bar is the share of conversations with
that fault scored under the metric's threshold (for clean ones: false alarms).</p>
{% for name, m in metrics.items() %}
<h2>{{ name }}: AUC {{ '%.3f'|format(m.auc) if m.auc is not none else 'n/a' }}, accuracy
{{ '%.3f'|format(m.accuracy) if m.accuracy is not none else 'n/a' }} at threshold {{ m.threshold }}</h2>
<svg width="640" height="{{ 24 * (m.per_fault|length) + 10 }}" role="img" aria-label="{{ name }} detection rates">
{% for fault, f in m.per_fault.items() %}
<text x="0" y="{{ 24 * loop.index0 + 16 }}">{{ fault }}</text>
<rect class="{{ 'clean' if fault == 'clean' else 'bar' }}" x="200" y="{{ 24 * loop.index0 + 4 }}"
 width="{{ (360 * f.flagged)|round(1) }}" height="16"><title>{{ fault }}: {{ '%.0f'|format(100 * f.flagged) }}% of
 {{ f.n }}</title></rect>
<text x="{{ 206 + 360 * f.flagged }}" y="{{ 24 * loop.index0 + 16 }}">{{ '%.0f'|format(100 * f.flagged) }}%</text>
{% endfor %}<line class="axis" x1="200" x2="200" y1="0" y2="{{ 24 * (m.per_fault|length) + 4 }}"/></svg>
{% endfor %}</body></html>""")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--metric", action="append", choices=list(METRICS), help="repeatable; default all three")
    parser.add_argument("--eval-mode", choices=["llm", "hybrid", "system_one"], default="llm")
    parser.add_argument("--model", help="LLM judge model at OPENAI_BASE_URL (default gpt-5.4)")
    parser.add_argument("--system-one-model", help="TypeSafe model or logprob:MODEL, for hybrid/system_one")
    parser.add_argument("--scripted", nargs="?", const="noise", choices=["noise", "labels"],
                        help="a loopback judge: noise (random scores: plumbing) or labels (answers each task from "
                        "its label: an oracle the per-task figures must score perfectly)")
    parser.add_argument("--sample", type=int, help="score a stratified sample of this many conversations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=1, help="2 measures repeatability")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--context-tokens", type=int, help="the judge model's context window")
    parser.add_argument("--out", default="validity-results", help="directory for results.json and validity.html")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="a labelled corpus: the generated one (default), "
                        "or reviews.jsonl from `tracejudge export --reviews` (your traffic, labelled by reviewers)")
    args = parser.parse_args()
    names = args.metric or list(METRICS)
    rows = [json.loads(line) for line in args.corpus.read_text().splitlines() if line.strip()]
    if any("metrics" in r["labels"] for r in rows):  # reviewed: only the metrics reviewers labelled
        names = [n for n in names if any(n in r["labels"].get("metrics", {}) for r in rows)] or names
        rows = [r for r in rows if any(n in r["labels"].get("metrics", {}) for n in names)]
    rows = sample(rows, args.sample, args.seed)
    judged = any(n != "mcp_call_validity" for n in names)
    script = label_oracle(rows) if args.scripted == "labels" else scripted_answer
    server = ScriptedServer(script=script) if args.scripted and judged else None
    judge = None
    if judged and args.eval_mode != "system_one":
        judge = LLMJudge(args.model or "gpt-5.4", base_url=server.base_url if server else None,
                         api_key="sk-scripted" if server else None, context_tokens=args.context_tokens)
    runs: list[dict[str, list[float | None]]] = []
    usage: list[dict[str, dict[str, float]]] = []
    task_runs: list[dict[str, list[dict[int, float] | None]]] = []
    with server or _Nothing():
        for run in range(args.runs):
            scores, spent, wall, per_task = run_once(rows, names, args, judge)
            runs.append(scores)
            usage.append(spent)
            task_runs.append(per_task)
            print(f"run {run + 1}: {len(rows)} conversations x {len(names)} metrics in {wall:.1f} s", file=sys.stderr)
    title = {"noise": "scripted judge (plumbing, not validity)", "labels": "oracle judge answering from the labels "
             "(plumbing, not validity)"}.get(args.scripted or "") or (
        f"{args.eval_mode} mode, judge {args.model or 'gpt-5.4'}" if judged else "deterministic checks")
    results = {"title": title, "conversations": len(rows), "threshold": args.threshold, "metrics": {}}
    for name in names:
        cut = 1.0 if name == "mcp_call_validity" else args.threshold
        summary = summarise(rows, [r[name] for r in runs], cut, name)
        summary["threshold"] = cut
        if name != "mcp_call_validity":
            summary["task_level"] = summarise_tasks(rows, task_runs[0][name], cut, name)
        summary["usage_per_run"] = {k: v / args.runs for k, v in
                                    {k: sum(u[name][k] for u in usage) for k in usage[0][name]}.items()}
        results["metrics"][name] = summary
        auc = summary["auc"]
        print(f"{name}: AUC {auc:.3f} accuracy {summary['accuracy']:.3f} ({summary['scored']} scored, "
              f"{summary['errors']} errors)" if auc is not None else f"{name}: no AUC (one class only)")
        for fault, f in summary["per_fault"].items():
            vs = f"  AUC vs clean {f['auc_vs_clean']:.3f}" if f["auc_vs_clean"] is not None else ""
            print(f"  {fault:26} n={f['n']:3}  {'false alarms' if fault == 'clean' else 'detected'} "
                  f"{f['flagged']:6.1%}{vs}")
        if "repeatability" in summary:
            rep = summary["repeatability"]
            print(f"  repeatability: same verdict {rep['same_verdict']:.1%}, mean |delta score| "
                  f"{rep['mean_abs_difference']:.3f}, {rep['changed']} scores changed")
        task_level = summary.get("task_level")
        if task_level:
            print(f"  per task ({task_level['tasks']} tasks): AUC in scope {_fmt(task_level['auc_in_scope'])}, "
                  f"all faults {_fmt(task_level['auc_all_faults'])}")
            for fault, f in task_level["per_fault"].items():
                vs = f"  AUC vs clean {f['auc_vs_clean']:.3f}" if f["auc_vs_clean"] is not None else ""
                scope = "" if fault == "clean" else (" in scope" if f["in_scope"] else " (outside its scope)")
                print(f"    {fault:26} n={f['n']:3}  {'false alarms' if fault == 'clean' else 'detected'} "
                      f"{f['flagged']:6.1%}{vs}{scope}")
            for aggregation, c in task_level["conversation_level"].items():
                print(f"  conversations, {aggregation:8}: AUC {_fmt(c['auc'])}, in-scope faults detected "
                      f"{_fmt(c['detected'], '.1%')}, false alarms {_fmt(c['false_alarms'], '.1%')}")
        use = summary["usage_per_run"]
        print(f"  judge per run: {use.get('judge_calls', 0):.0f} calls, {use.get('input_tokens', 0):,.0f} input "
              f"tokens, {use.get('output_tokens', 0):,.0f} output tokens, ${use.get('cost_usd', 0):.4f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "validity.html").write_text(CHART.render(title=title, rows=len(rows), threshold=args.threshold,
                                                    metrics=results["metrics"]))
    print(f"wrote {out / 'results.json'} and {out / 'validity.html'}", file=sys.stderr)
    return 0


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
