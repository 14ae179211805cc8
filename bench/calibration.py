"""Does calibration from reviews make a judge agree more with people? Agreement before and after, on held-out
reviewed conversations.

The labelled corpus (bench/validity/corpus.jsonl, or reviews.jsonl from `tracejudge export --reviews`) is split
by a seeded shuffle into a reviewed half and a held-out half. The judge scores the reviewed half uncalibrated; its
verdicts that disagree with the labels become calibration examples, chosen as the collector chooses reviewers'
corrections (furthest from the label first, false passes and false fails in turn). Then the judge scores the
held-out half twice, without and with the examples, and the bench prints Cohen's kappa and accuracy against the
labels for each, with 95 % percentile-bootstrap intervals, and the paired change in accuracy with its interval
(conversations resampled).

    python bench/calibration.py --scripted                        # plumbing only: a loopback judge, see below
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python bench/calibration.py --model Qwen/Qwen2.5-7B-Instruct \\
        --metric mcp_task_completion --sample 160 --examples 4    # a real judge

--scripted runs a loopback judge that scores from the prompt's hash (no relation to the labels) shifted down by
0.2, and moves each score by the mean correction of the examples it is shown. It checks the plumbing (examples
reach the judge, the run is measured before and after); its figures say nothing about a real judge.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import random
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.validity.generate import CORPUS  # noqa: E402
from tests.support.scripted_server import Reply, Request, ScriptedServer, completion  # noqa: E402
from tracejudge import LLMJudge  # noqa: E402
from tracejudge.calibration import CalibrationExample, most_informative  # noqa: E402
from tracejudge.collector.history.agreement import agreement, bootstrap  # noqa: E402
from tracejudge.interactions import split_tasks  # noqa: E402
from tracejudge.test_case import load_test_case  # noqa: E402

SCRIPTED_BIAS = -0.2
# bench/validity.py (its folder bench/validity/ takes the package name): the corpus labels and the measured run
_spec = importlib.util.spec_from_file_location("validity_bench", Path(__file__).with_name("validity.py"))
assert _spec is not None and _spec.loader is not None
validity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(validity)
label, run_once, sample = validity.label, validity.run_once, validity.sample


def scripted_answer(request: Request) -> Reply:
    """A judge with a bias that corrections can show it: hash score + bias, moved by the examples' mean
    correction (reviewer score - judge score)."""
    if request.judge == "final_reason":
        return completion({"reason": "scripted"})
    data = request.data
    base = hashlib.sha256(json.dumps(data.get("task", ""), sort_keys=True).encode()).digest()[0] / 255
    examples = data.get("reviewed_examples") or []
    shift = fmean(e.get("reviewer_score", 1.0 if e["reviewer_verdict"] == "pass" else 0.0) - e["judge_score"]
                  for e in examples) if examples else 0.0
    return completion({"reason": "scripted", "score": round(min(1.0, max(0.0, base + SCRIPTED_BIAS + shift)), 3)})


def task_text(row: dict[str, Any]) -> str:
    """The request to show in an example: the first task a generated row labels faulty, else the first task."""
    tasks = split_tasks(load_test_case(json.dumps(row["test_case"])))
    faults = row["labels"].get("tasks") or []
    chosen = next((i for i, fault in enumerate(faults) if fault != "clean" and i < len(tasks)), 0)
    return tasks[chosen].text if tasks else ""


def examples_from(rows: list[dict[str, Any]], scores: list[float | None], metric: str, threshold: float,
                  limit: int) -> list[CalibrationExample]:
    """The judge's verdicts the labels disagree with, chosen as the collector chooses reviewers' corrections."""
    wrong = []
    for row, score in zip(rows, scores, strict=True):
        human = label(row, metric) == "clean"
        if score is not None and (score >= threshold) != human:
            wrong.append(CalibrationExample(task_text(row), score, "pass" if human else "fail", float(human),
                                            f"labelled {label(row, metric)}"))
    return most_informative(wrong, limit)


def measured(rows: list[dict[str, Any]], scores: list[float | None], metric: str, threshold: float,
             resamples: int) -> dict[str, Any]:
    pairs = [(s >= threshold, label(r, metric) == "clean") for r, s in zip(rows, scores, strict=True) if s is not None]
    result = agreement([j for j, _ in pairs], [h for _, h in pairs], resamples=resamples)
    return {"kappa": vars(result.kappa), "accuracy": vars(result.accuracy), "scored": len(pairs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--metric", default="mcp_task_completion", choices=["mcp_task_completion", "mcp_use"])
    parser.add_argument("--model", help="LLM judge model at OPENAI_BASE_URL (default gpt-5.4)")
    parser.add_argument("--scripted", action="store_true", help="a loopback judge (plumbing, not validity)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--sample", type=int, help="a stratified sample of this many conversations")
    parser.add_argument("--examples", type=int, default=4, help="calibration examples (as [scoring] "
                        "calibration_examples)")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--context-tokens", type=int)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.eval_mode, args.system_one_model = "llm", None
    rows = [json.loads(line) for line in args.corpus.read_text().splitlines() if line.strip()]
    rows = [r for r in sample(rows, args.sample, args.seed) if "metrics" not in r["labels"]
            or args.metric in r["labels"]["metrics"]]
    random.Random(args.seed).shuffle(rows)
    reviewed, held_out = rows[: len(rows) // 2], rows[len(rows) // 2:]
    server = ScriptedServer(script=scripted_answer) if args.scripted else None
    judge = LLMJudge(args.model or "gpt-5.4", base_url=server.base_url if server else None,
                     api_key="sk-scripted" if server else None, context_tokens=args.context_tokens)
    names = [args.metric]
    with server or contextlib.nullcontext():
        first, _, _, _ = run_once(reviewed, names, args, judge)
        examples = examples_from(reviewed, first[args.metric], args.metric, args.threshold, args.examples)
        before, _, _, _ = run_once(held_out, names, args, judge)
        after, _, _, _ = run_once(held_out, names, args, judge, examples)
    results = {"judge": "scripted (plumbing, not validity)" if args.scripted else args.model or "gpt-5.4",
               "metric": args.metric, "reviewed": len(reviewed), "held_out": len(held_out),
               "examples": len(examples),
               "before": measured(held_out, before[args.metric], args.metric, args.threshold, args.resamples),
               "after": measured(held_out, after[args.metric], args.metric, args.threshold, args.resamples)}
    paired = [(b >= args.threshold, a >= args.threshold, label(r, args.metric) == "clean")
              for r, b, a in zip(held_out, before[args.metric], after[args.metric], strict=True)
              if b is not None and a is not None]
    change = bootstrap(paired, lambda s: fmean((a == h) - (b == h) for b, a, h in s) if s else None,
                       resamples=args.resamples, seed=args.seed)
    results["accuracy_change"] = vars(change)
    print(f"{results['judge']}, {args.metric}: {len(examples)} examples from {len(reviewed)} reviewed "
          f"conversations; {len(held_out)} held out")
    for when in ("before", "after"):
        k, a = results[when]["kappa"], results[when]["accuracy"]
        print(f"  {when:6}  kappa {_fmt(k)}  accuracy {_fmt(a)}  ({results[when]['scored']} scored)")
    print(f"  accuracy change (after - before, paired): {_fmt(results['accuracy_change'])}")
    print(json.dumps(results))
    return 0


def _fmt(e: dict[str, Any]) -> str:
    if e["value"] is None:
        return "n/a"
    interval = f" [{e['low']:.3f}, {e['high']:.3f}]" if e["low"] is not None else ""
    return f"{e['value']:.3f}{interval}"


if __name__ == "__main__":
    sys.exit(main())
