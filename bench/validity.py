"""Do the scores mean something? Run any metric, eval mode and judge over the labelled corpus
(bench/validity/corpus.jsonl) and measure how well each metric separates faulty conversations from clean ones.

Per metric it prints ROC AUC of (1 - score) against the label (faulty vs clean), accuracy at the threshold
(a score under it predicts "faulty"), the detection rate per fault type and the false-alarm rate on clean
conversations, agreement between runs (repeatability), and judge calls, tokens and cost. It writes
`results.json` and `validity.html` (a chart) to --out. A metric that does not apply (no MCP call for
mcp_call_validity) counts as "no fault found". mcp_call_validity flags a conversation with any invalid call
(score under 1), whatever --threshold says: its score is the share of valid calls.

    python bench/validity.py --metric mcp_call_validity                   # deterministic, no judge
    python bench/validity.py --scripted --runs 2                          # plumbing only: random scores
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
from bench.validity.generate import CORPUS, FAULTS  # noqa: E402
from tests.support.scripted_server import Reply, Request, ScriptedServer, completion  # noqa: E402
from tracejudge import METRICS, BaseMetric, LLMJudge, evaluate  # noqa: E402
from tracejudge.calibration import CalibrationExample  # noqa: E402


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
             ) -> tuple[dict[str, list[float | None]], dict[str, dict[str, float]], float]:
    """Scores per metric in corpus order (None: error), usage per metric, and wall seconds; the judged metrics
    calibrated with `examples` when given (bench/calibration.py)."""
    metrics = build_metrics(names, args, judge, examples)
    started = time.perf_counter()
    result = evaluate([r["test_case"] for r in rows], metrics, max_concurrency=args.concurrency,
                      file=io.StringIO())
    wall = time.perf_counter() - started
    scores: dict[str, list[float | None]] = {n: [] for n in names}
    usage: dict[str, dict[str, float]] = {n: defaultdict(float) for n in names}
    for test in result.test_results:
        for name, m in zip(names, test.metrics, strict=True):
            if m.error is not None and not m.error.startswith("not applicable"):
                scores[name].append(None)
                usage[name]["errors"] += 1
            else:
                scores[name].append(1.0 if m.score is None else m.score)  # not applicable: nothing found
            breakdown = m.score_breakdown or {}
            usage[name]["judge_calls"] += breakdown.get("judge_calls", 0)
            usage[name]["input_tokens"] += breakdown.get("input_tokens", 0)
            usage[name]["output_tokens"] += breakdown.get("output_tokens", 0)
            usage[name]["cost_usd"] += m.evaluation_cost or 0.0
    return scores, usage, wall


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
    parser.add_argument("--scripted", action="store_true", help="a loopback judge with random scores (plumbing)")
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
    server = ScriptedServer(script=scripted_answer) if args.scripted and judged else None
    judge = None
    if judged and args.eval_mode != "system_one":
        judge = LLMJudge(args.model or "gpt-5.4", base_url=server.base_url if server else None,
                         api_key="sk-scripted" if server else None, context_tokens=args.context_tokens)
    runs: list[dict[str, list[float | None]]] = []
    usage: list[dict[str, dict[str, float]]] = []
    with server or _Nothing():
        for run in range(args.runs):
            scores, spent, wall = run_once(rows, names, args, judge)
            runs.append(scores)
            usage.append(spent)
            print(f"run {run + 1}: {len(rows)} conversations x {len(names)} metrics in {wall:.1f} s", file=sys.stderr)
    title = "scripted judge (plumbing, not validity)" if args.scripted else (
        f"{args.eval_mode} mode, judge {args.model or 'gpt-5.4'}" if judged else "deterministic checks")
    results = {"title": title, "conversations": len(rows), "threshold": args.threshold, "metrics": {}}
    for name in names:
        cut = 1.0 if name == "mcp_call_validity" else args.threshold
        summary = summarise(rows, [r[name] for r in runs], cut, name)
        summary["threshold"] = cut
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


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
