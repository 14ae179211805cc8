"""`tracejudge compare A B` and the canary gate `tracejudge compare --baseline A --candidate B --fail-if-worse
METRIC:MARGIN`, on a running collector (GET /api/compare), a file, several replicas' files or the lake."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from tracejudge.collector.commands import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS
from tracejudge.collector.commands.admin_client import from_collector
from tracejudge.collector.commands.table_output import print_result
from tracejudge.collector.history.query_result import QueryResult

EXIT_UNDECIDED = 3  # the gate: not enough data yet to say either way


def run(args: argparse.Namespace) -> int:
    gate = args.fail_if_worse is not None
    a, b = (args.baseline, args.candidate) if gate else (args.a, args.b)
    if not a or not b:
        print("tracejudge compare: name two cohorts: `tracejudge compare A B`, or --baseline A --candidate B "
              "with --fail-if-worse METRIC:MARGIN", file=sys.stderr)
        return EXIT_BAD_INPUT
    params: dict[str, Any] = {"a": a, "b": b}
    if gate:
        try:
            metric, margin = parse_gate(args.fail_if_worse)
        except ValueError as exc:
            print(f"tracejudge compare: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        params.update(gate=metric, margin=margin, confidence=args.confidence)
    reply = from_collector(args, lambda url, headers: httpx.get(f"{url}/api/compare", params=params,
                                                                headers=headers, timeout=args.timeout))
    if reply is not None:
        if reply.status_code != 200:
            print(f"tracejudge compare: {reply.json().get('error', reply.text)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        result = reply.json()
    else:
        computed = _from_files(args, params)
        if computed is None:
            return EXIT_BAD_INPUT
        result = computed
    if gate:
        return gate_answer(result, args.format)
    _print_comparison(result, args.format)
    return EXIT_PASS


def _from_files(args: argparse.Namespace, params: dict[str, Any]) -> dict[str, Any] | None:
    import duckdb

    from tracejudge.collector.commands.history_files import history  # DuckDB: only when no collector answered
    from tracejudge.collector.config import ConfigError, load_settings
    from tracejudge.collector.history.compare import CohortError, canary, compare, parse_cohort

    try:
        saved = load_settings(Path(args.config) if args.config else None).cohorts.saved
    except ConfigError as exc:
        print(f"tracejudge compare: {exc}", file=sys.stderr)
        return None
    opened = history(args, "compare")
    if opened is None:
        return None
    con, _ = opened
    try:
        a, b = parse_cohort(params["a"], saved), parse_cohort(params["b"], saved)
        if "gate" in params:
            return canary(con, a, b, params["gate"], params["margin"], 1 - params["confidence"])
        return compare(con, a, b)
    except CohortError as exc:
        print(f"tracejudge compare: {exc}", file=sys.stderr)
        return None
    except duckdb.Error as exc:
        print(f"tracejudge compare: cannot compare on this history ({exc}); a file written by an older collector "
              "is brought up to date by starting this version's collector on it once", file=sys.stderr)
        return None
    finally:
        con.close()


def _interval(e: dict[str, Any], pct: bool = True) -> str:
    if e.get("value") is None:
        return "–"
    scale, unit = (100, "%") if pct else (1, "")
    text = f"{e['value'] * scale:.1f}{unit}" if pct else f"{e['value']:.3f}"
    if e.get("low") is not None:
        text += f" [{e['low'] * scale:.1f}, {e['high'] * scale:.1f}]" if pct else f" [{e['low']:.3f}, {e['high']:.3f}]"
    return text


def _p(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _print_comparison(result: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(result, indent=2, default=str))
        return
    a, b = result["a"], result["b"]
    for label, side in (("A", a), ("B", b)):
        agent = ""
        if side.get("agent_input_tokens") is not None:
            cost = side.get("agent_cost_usd")
            agent = (f"; agent {side['agent_input_tokens']:.0f} tokens in, {side['agent_output_tokens']:.0f} out, "
                     f"{'cost unknown' if cost is None else f'${cost:.5f}'} per conversation")
        print(f"{label}: {side['cohort']}  ({side['conversations']} conversations{agent})")
    print()
    rows = [[m["metric"], _interval(m["a"]["pass_rate"]), m["a"]["pass_rate"]["n"], _interval(m["b"]["pass_rate"]),
             m["b"]["pass_rate"]["n"], _interval(m["pass_rate_difference"]),
             _p(m["pass_rate_difference"]["p_holm"]), _interval(m["mean_score_difference"], pct=False),
             _p(m["mean_score_difference"]["p_holm"])] for m in result["metrics"]]
    print_result(QueryResult(["metric", "A pass rate", "A n", "B pass rate", "B n", "B - A", "p (Holm)",
                              "mean score B - A", "p (Holm)"], rows, False), fmt)
    tools = [[t["server"], t["name"], t["a"]["calls"], t["b"]["calls"], _interval(t["a"]["error_rate"]),
              _interval(t["b"]["error_rate"]), _p(t["error_rate_difference"]["p_holm"]),
              _interval(t["a"]["invalid_rate"]), _interval(t["b"]["invalid_rate"]),
              _interval(t["b"]["wrong_arguments_rate"])] for t in result["tools"][:15]]
    if tools:
        print()
        print_result(QueryResult(["server", "tool", "A calls", "B calls", "A MCP errors", "B MCP errors", "p (Holm)",
                                  "A schema-invalid", "B schema-invalid", "B wrong args (judge)"], tools, False), fmt)
    for m in result["metrics"]:
        if m.get("examples"):
            e = m["examples"]
            print(f"\n{m['metric']}: {e['name']} ({e['server']}) rose most in errors; B failing: "
                  f"{', '.join(e['b_failing']) or '–'}; A passing: {', '.join(e['a_passing']) or '–'}")
    print(f"\n95 % intervals: Wilson for rates, Newcombe for differences of rates, Welch for means; "
          f"{result['multiple_comparisons']}.")


def parse_gate(spec: str) -> tuple[str, float]:
    """`--fail-if-worse METRIC:MARGIN` -> (metric, margin); ValueError saying how to write it."""
    metric, sep, margin = spec.partition(":")
    try:
        value = float(margin)
    except ValueError:
        sep = ""
    if not sep or not metric:
        raise ValueError(f"--fail-if-worse takes METRIC:MARGIN, e.g. mcp_task_completion:0.02, not {spec!r}")
    return metric, value


def gate_answer(result: dict[str, Any], fmt: str) -> int:
    outcome = result["outcome"]
    if fmt == "json":
        print(json.dumps(result, indent=2, default=str))
    else:
        span = (f"{result['difference'] * 100:+.1f} points [{result['low'] * 100:+.1f}, {result['high'] * 100:+.1f}]"
                if result["difference"] is not None else "no data")
        says = {"fail": f"FAIL: the candidate's {result['metric']} pass rate is worse than the baseline's by more "
                        f"than {result['margin'] * 100:g} points",
                "pass": f"PASS: the candidate is not worse than the baseline by more than {result['margin'] * 100:g} "
                        f"points in {result['metric']} pass rate",
                "undecided": "NOT ENOUGH DATA: cannot tell yet"
                             + (f"; about {result['more_needed']} more judged conversations per cohort would decide "
                                "it if the rates stay as they are" if result["more_needed"] else "")}[outcome]
        print(f"{says}\n  baseline {result['baseline']}: {result['baseline_n']} judged; candidate "
              f"{result['candidate']}: {result['candidate_n']} judged\n  candidate - baseline: {span} "
              f"(always-valid {result['confidence']:.0%} confidence sequence: check it as often as you like)")
    return {"fail": EXIT_FAIL, "pass": EXIT_PASS, "undecided": EXIT_UNDECIDED}[outcome]
