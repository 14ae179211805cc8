"""`tracejudge evaluate`: score test cases (or the conversations of a trace file) and print a table."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from tracejudge import METRICS, BaseMetric, TracejudgeError, evaluate
from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.config import Settings, judge_flags, judge_options, load_settings
from tracejudge.collector.input_files import InputFileError, read_test_cases
from tracejudge.errors import JudgeConfigurationError
from tracejudge.eval_mode import EvalMode, resolve_eval_mode
from tracejudge.judges.llm import LLMJudge

NO_JUDGE_ADVICE = ("set OPENAI_API_KEY, or OPENAI_BASE_URL for a local OpenAI-compatible server (then --model "
                   "NAME), to score it")


def _shared_judge(args: argparse.Namespace, settings: Settings) -> LLMJudge | str | None:
    """One LLM judge for every metric, with the connection settings; the model name where none can be built
    (each metric then says why) or none is needed (system_one)."""
    if resolve_eval_mode(args.eval_mode) is EvalMode.SYSTEM_ONE:
        return args.model
    try:
        # an interactive run never waits hours on a Batch API batch, whatever [scoring] batch says
        return replace(judge_options(settings.scoring), batch=False).llm_judge(args.model)
    except JudgeConfigurationError:
        return args.model


def _build_metrics(args: argparse.Namespace, settings: Settings) -> tuple[list[BaseMetric], dict[str, str]]:
    """The metrics asked for, and those left out for want of a judge (only when none were named)."""
    names = args.metric or list(METRICS)
    metrics: list[BaseMetric] = []
    skipped: dict[str, str] = {}
    model = _shared_judge(args, settings) if any(n != "mcp_call_validity" for n in names) else None
    for name in dict.fromkeys(names):
        cls = METRICS[name]
        kwargs: dict[str, Any] = {"threshold": args.threshold, "strict_mode": args.strict}
        if name != "mcp_call_validity":
            kwargs.update(model=model, eval_mode=args.eval_mode, system_one_model=args.system_one_model)
        try:
            metrics.append(cls(**kwargs))
        except JudgeConfigurationError as exc:
            if args.metric:  # asked for by name: the user wants to know it cannot run
                raise
            skipped[name] = f"{exc}".split(":", 1)[0] + f"; {NO_JUDGE_ADVICE}"
    return metrics, skipped


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(None, judge_flags(args))
        cases = read_test_cases([Path(f) for f in args.files], settings.redaction.redactor(),
                                mcp_tools=settings.mapping.mcp_tools)
        metrics, skipped = _build_metrics(args, settings)
    except (InputFileError, JudgeConfigurationError, TracejudgeError, ValueError) as exc:
        print(f"tracejudge evaluate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for name, why in skipped.items():
        print(f"tracejudge evaluate: {name} skipped: {why}", file=sys.stderr)
    result = evaluate(cases, metrics, max_concurrency=args.concurrency, print_results=args.format == "table")
    if args.format == "json":
        print(result.model_dump_json(indent=2))
    return EXIT_PASS if result.passed else EXIT_FAIL
