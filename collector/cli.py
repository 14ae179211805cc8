"""The `tracejudge` command line: the parser, and dispatch to the command's own module (collector.commands),
imported only when that command runs."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
from collections.abc import Sequence

from tracejudge.collector.commands import EXIT_PASS
from tracejudge.metric_ids import METRIC_IDS

EVAL_MODES = ("llm", "hybrid", "system_one")


class _ServeHelp(argparse.RawDescriptionHelpFormatter):
    """The settings table (it needs the config models) is built only when `serve --help` is printed."""

    def _format_text(self, text: str) -> str:
        if text == SETTINGS_PLACEHOLDER:
            from tracejudge.collector.config import settings_help

            text = settings_help()
        return super()._format_text(text)


SETTINGS_PLACEHOLDER = "(settings)"


def _threshold(value: str) -> float | None:
    if value.lower() == "none":
        return None
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"threshold must be a number between 0 and 1, or 'none', not {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError("threshold must be between 0 and 1, or 'none'")
    return number


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {value!r}")
    return number


def _judge_connection_flags(parser: argparse.ArgumentParser) -> None:
    """How the LLM judge talks to its server; a slow local server needs a long timeout and one request at once."""
    parser.add_argument("--judge-timeout", type=float, metavar="SECONDS",
                        help="timeout of one LLM judge request (default 60; raise it for a slow local server)")
    parser.add_argument("--judge-concurrency", type=_positive, metavar="N",
                        help="LLM judge requests in flight at once (default 8; 1 for a one-at-a-time server)")
    parser.add_argument("--judge-context-tokens", type=_positive, metavar="TOKENS",
                        help="the judge model's context window; longer prompts are reduced to fit (default: known "
                        "for OpenAI models, else 32768)")


def _workers(text: str) -> str:
    if text == "auto" or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', not {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracejudge",
        description="Evaluation collector for MCP-based LLM agents: OTLP traces in, MCP metric scores out.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the OTLP collector",
        description="Receive OTLP traces over gRPC and HTTP and store every span in DuckDB. Settings come from "
        "embedded defaults, then tracejudge.toml (or --config / TRACEJUDGE_CONFIG), then environment "
        "variables, then these flags; the settings, their defaults, variables and flags:",
        epilog=SETTINGS_PLACEHOLDER,
        formatter_class=_ServeHelp,
    )
    serve.add_argument("--config", metavar="FILE", help="config file (default: TRACEJUDGE_CONFIG or ./tracejudge.toml)")
    serve.add_argument("--host", help="bind address of the OTLP receivers (default 127.0.0.1; 0.0.0.0 for every "
                       "interface)")
    serve.add_argument("--admin-host", help="bind address of the admin API (default 127.0.0.1; another address "
                       "needs TRACEJUDGE_QUERY_TOKEN)")
    serve.add_argument("--grpc-port", type=int, help="OTLP/gRPC port (default 4317; 0 picks a free one)")
    serve.add_argument("--http-port", type=int, help="OTLP/HTTP port (default 4318)")
    serve.add_argument("--admin-port", type=int, help="admin port: /healthz /readyz /metrics (default 4319)")
    serve.add_argument("--db", help="DuckDB file (default ./tracejudge.duckdb, or TRACEJUDGE_DB)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log level (default info)")
    serve.add_argument("--replica", help="this replica's name in a shared [lake] (default: the host name)")
    serve.add_argument("--quiet-period", help="a conversation is complete after this long without a new span "
                       "(default 120s; 5s to see scores at once while trying tracejudge out)")
    serve.add_argument("--judge-model", help="LLM judge model (default gpt-5.4 on api.openai.com; with "
                       "OPENAI_BASE_URL, the name your server serves)")
    serve.add_argument("--system-one-model", help="System One model for hybrid/system_one (default jev-latest)")
    _judge_connection_flags(serve)
    serve.set_defaults(command_module="serve")

    ev = sub.add_parser(
        "evaluate",
        help="score test cases from JSON or JSON Lines files, or the conversations of OTLP files",
        description="Score ConversationalTestCase records from FILEs (a JSON object, a JSON list, or JSON "
        "Lines), or the conversations rebuilt from OTLP files (a trace file, with its log file where the framework "
        "logs the messages as log records, as Semantic Kernel does). Exit status: 0 all pass, 1 any fails or "
        "errors, 2 bad input or settings. The LLM judge uses OPENAI_API_KEY and OPENAI_BASE_URL (any "
        "OpenAI-compatible server).",
    )
    ev.add_argument("files", nargs="+", metavar="FILE",
                    help="test cases: .json (one case or a list) or .jsonl; or OTLP trace and log files (.json, "
                    ".jsonl, .pb), mapped together")
    ev.add_argument("--metric", action="append", choices=list(METRIC_IDS),
                    help="metric to run (repeatable; default: all three)")
    ev.add_argument("--threshold", type=_threshold, default=0.5,
                    help="pass mark in [0, 1], or 'none' to score only (default 0.5)")
    ev.add_argument("--strict", action="store_true", help="strict mode: a score is 1 or 0, threshold 1")
    ev.add_argument("--model", default=None, help="LLM judge model name (default gpt-5.4)")
    ev.add_argument("--eval-mode", default=None, choices=["llm", "hybrid", "system_one"],
                    help="eval mode of the judged metrics (default: TRACEJUDGE_EVAL_MODE, config, else llm)")
    ev.add_argument("--system-one-model", default=None, metavar="MODEL",
                    help="System One judge for hybrid/system_one: a TypeSafe model (default jev-latest; "
                    "TYPESAFE_API_KEY, TYPESAFE_BASE_URL) or logprob:MODEL for an OpenAI-compatible model's logprobs")
    ev.add_argument("--concurrency", type=_positive, default=8, help="measures run at once (default 8)")
    ev.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    _judge_connection_flags(ev)
    ev.set_defaults(command_module="evaluate")

    inspect = sub.add_parser(
        "inspect",
        help="print the conversations a trace file maps to, or how a collector maps a stored conversation",
        description="Decode OTLP files (OTLP/JSON: one export request or one per line; .pb: protobuf) and print "
        "each conversation they map to: turns, MCP calls with arguments and results, and the MCP servers. Use it "
        "to check how your agent's traces are read. A trace file and a log file given together map as one: "
        "frameworks that log the messages as OTLP log records (Semantic Kernel) need both. Given a conversation "
        "id instead of files, the running collector at --url maps that conversation's stored spans again (with "
        "--explain: from which span each part came).",
    )
    inspect.add_argument("files", nargs="+", metavar="FILE_OR_CONVERSATION_ID",
                         help="OTLP/JSON (.json, .jsonl) or protobuf (.pb) trace and log files, or one conversation "
                         "id")
    inspect.add_argument("--url", default="http://127.0.0.1:4319",
                         help="admin API of the running collector that holds the conversation (TRACEJUDGE_QUERY_TOKEN "
                         "if it needs one)")
    inspect.add_argument("--servers", metavar="FILE", help="MCP server inventory (JSON or TOML) to merge in")
    inspect.add_argument("--format", choices=["text", "json"], default="text", help="output format")
    inspect.add_argument("--explain", action="store_true",
                         help="also show, for each turn and call, the span and dialect it came from, why a tool "
                         "counts as MCP ([mapping] mcp_tools in tracejudge.toml names tools for frameworks "
                         "without MCP spans) and which result envelope was removed")
    inspect.set_defaults(command_module="inspect")

    rp = sub.add_parser(
        "replay",
        help="send saved trace files to a running collector",
        description="Send OTLP trace and log files (OTLP/JSON, JSON Lines of requests, or .pb protobuf) to a "
        "collector over OTLP/HTTP (default) or OTLP/gRPC: traces to /v1/traces (TraceService), log records to "
        "/v1/logs (LogsService). Exit status 0 when every span and log record was accepted.",
    )
    rp.add_argument("files", nargs="+", metavar="FILE")
    rp.add_argument("--protocol", choices=["http", "grpc"], default="http")
    rp.add_argument("--endpoint", help="default http://127.0.0.1:4318 (http: the base URL, to which /v1/traces and "
                    "/v1/logs are added, as OTEL_EXPORTER_OTLP_ENDPOINT takes it) or 127.0.0.1:4317 (grpc)")
    rp.add_argument("--token", help="bearer token (default TRACEJUDGE_INGEST_TOKEN)")
    rp.set_defaults(command_module="replay")

    query = sub.add_parser(
        "query",
        help="run read-only SQL over spans, conversations and scores",
        description="Run one read-only SELECT. With a collector running the query goes to its admin API "
        "(POST /api/query, bearer TRACEJUDGE_QUERY_TOKEN when set); otherwise the database file is opened "
        "read-only. Tables: spans, conversations, eval_jobs, scores; views latest_scores, daily_scores.",
    )
    query.add_argument("sql", metavar="SQL")
    query.add_argument("--url", default="http://127.0.0.1:4319", help="admin API of a running collector")
    query.add_argument("--db", action="append", help="database file when no collector runs (default TRACEJUDGE_DB "
                       "or ./tracejudge.duckdb); repeat it to query several replicas' files as one, with a "
                       "replica column")
    query.add_argument("--lake", action="store_true", help="query the shared DuckLake of [lake] (every "
                       "replica's conversations and scores)")
    query.add_argument("--config", metavar="FILE", help="config file for --lake (default: TRACEJUDGE_CONFIG "
                       "or ./tracejudge.toml)")
    query.add_argument("--archive", metavar="DIR", help="also read what retention archived to DIR ([retention] "
                       "archive_dir): views archived_spans, archived_conversations, archived_scores, "
                       "archived_failed_jobs, and all_<table> with the live rows too (reads the database file)")
    query.add_argument("--format", choices=["table", "csv", "json"], default="table")
    query.add_argument("--limit", type=_positive, default=1000, help="most rows returned (default 1000)")
    query.add_argument("--timeout", type=float, default=30.0, help="seconds before the query is stopped")
    query.set_defaults(command_module="query")

    simulate = sub.add_parser(
        "simulate",
        help="drive goldens through an agent (a scripted or simulated user) and store them as a cohort",
        description=textwrap.fill(
            "Run goldens against an agent: each golden's user turns are replayed (scripted), or a model plays the "
            "user from its scenario until the expected outcome is reached or --max-turns. The conversations are "
            "scored with the configured metrics and written to --out as the cohort tracejudge.cohort=NAME, which "
            "`tracejudge compare` reads (with --db repeated, next to production's file). With --traced, the "
            "agent's own OpenTelemetry spans (a TracerProvider set up when its module is imported) give each "
            "conversation's MCP calls, as in production.", 100),
        epilog="example:\n  tracejudge simulate --from-history 7d --history-db prod.duckdb --scripted --agent "
        "my_agent:reply --traced --cohort v1.4.2 \\\n      --fail-if-worse mcp_task_completion:0.02 --baseline "
        "'service.version=1.4.1' --baseline-db prod.duckdb",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    simulate.add_argument("--agent", required=True, metavar="MODULE:CALLABLE", help="the model_callback: "
                          "(input, turns=, thread_id=) -> reply text or Turn, sync or async")
    simulate.add_argument("--goldens", metavar="FILE", help="goldens as JSON (a list) or CSV, DeepEval's format")
    simulate.add_argument("--from-history", metavar="SINCE", help="goldens from a history file's conversations of "
                          "the last SINCE (7d): failing ones, or all with --all")
    simulate.add_argument("--history-db", default="tracejudge.duckdb", help="the history file for --from-history")
    simulate.add_argument("--all", action="store_true", help="with --from-history: passing conversations too")
    simulate.add_argument("--scripted", action="store_true", help="replay every golden's user turns (a "
                          "production transcript's recorded replies are produced again by the agent)")
    simulate.add_argument("--simulator-model", help="the model that plays the user (OPENAI_BASE_URL; default "
                          "gpt-5.4)")
    simulate.add_argument("--max-turns", type=_positive, default=6, help="simulated user turns at most (default 6)")
    simulate.add_argument("--traced", action="store_true", help="build each conversation from the agent's own "
                          "OpenTelemetry spans")
    simulate.add_argument("--metric", action="append", help="metric to score (repeat; default [scoring] metrics)")
    simulate.add_argument("--cohort", default="candidate", help="cohort name (tracejudge.cohort=NAME)")
    simulate.add_argument("--out", default="simulations.duckdb", help="history file the cohort is written to")
    simulate.add_argument("--concurrency", type=_positive, default=5, help="conversations at once")
    simulate.add_argument("--fail-if-worse", metavar="METRIC:MARGIN", help="then gate against --baseline")
    simulate.add_argument("--baseline", default="tracejudge.cohort=baseline", metavar="COHORT",
                          help="the gate's baseline cohort (default tracejudge.cohort=baseline)")
    simulate.add_argument("--baseline-db", action="append", metavar="FILE", help="more history files the baseline "
                          "is in (production's)")
    simulate.add_argument("--confidence", type=float, default=0.95)
    simulate.add_argument("--config", metavar="FILE", help="config file ([scoring] metrics and judge)")
    simulate.set_defaults(command_module="simulate")

    compare = sub.add_parser(
        "compare",
        help="compare two cohorts of conversations, or gate a canary",
        description=textwrap.fill(
        "Compare two cohorts (filters over the latest version of each conversation): per metric the pass rate "
        "and mean score with 95 % intervals (Wilson, Welch), B - A with its interval (Newcombe, Welch) "
        "and Holm-adjusted p-values; per MCP server and tool the call volume, MCP error and schema-invalid "
        "rates and the judge's wrong-argument share; time and judge cost per conversation. A cohort is "
        "comma-separated KEY=VALUE terms that all hold: service=, agent=, since=24h, until=2026-12-01, or any "
        "attribute recorded per conversation ([cohorts] attributes, e.g. service.version=1.4.2), or a name saved "
        "in [cohorts] saved. With --fail-if-worse it is a canary gate: exit 1 when the candidate's pass rate is "
        "worse than the baseline's by more than the margin, 0 when it is not, 3 when there is not enough data "
        "yet (it says about how many more conversations); its always-valid confidence sequence may be checked "
        "as often as you like while the canary runs.", 100),
        epilog="examples:\n  tracejudge compare 'service.version=1.4.1' 'service.version=1.4.2'\n"
        "  tracejudge compare --baseline 'service.version=1.4.1' --candidate 'service.version=1.4.2' "
        "--fail-if-worse mcp_task_completion:0.02",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compare.add_argument("a", nargs="?", metavar="A", help="the first cohort")
    compare.add_argument("b", nargs="?", metavar="B", help="the second cohort (differences are B - A)")
    compare.add_argument("--baseline", metavar="COHORT", help="the gate's baseline cohort")
    compare.add_argument("--candidate", metavar="COHORT", help="the gate's candidate cohort")
    compare.add_argument("--fail-if-worse", metavar="METRIC:MARGIN", help="gate on METRIC's pass rate: fail when "
                         "the candidate is worse by more than MARGIN (0.02: two points)")
    compare.add_argument("--confidence", type=float, default=0.95, help="the gate's confidence (default 0.95)")
    compare.add_argument("--format", choices=["table", "json"], default="table")
    compare.add_argument("--url", default="http://127.0.0.1:4319", help="admin API of a running collector")
    compare.add_argument("--db", action="append", help="database file(s) when no collector runs; repeat for "
                         "several replicas")
    compare.add_argument("--lake", action="store_true", help="compare on the shared DuckLake of [lake]")
    compare.add_argument("--config", metavar="FILE", help="config file ([cohorts] saved, [lake])")
    compare.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a running collector")
    compare.set_defaults(command_module="compare")

    report = sub.add_parser(
        "report",
        help="write score history as one self-contained HTML page",
        description="Write an HTML report (no network needed to open it): per metric and service the daily "
        "mean, p10 and pass rate, the score distribution, eval cost per day, the worst conversations with "
        "their reasons and transcripts, and the judge's fallbacks and failures. Reads a running collector "
        "(GET /report on --url), else the database file, several --db files, or the --lake.",
    )
    report.add_argument("--since", default="7d", help="first day: 7d, 24h, 2w or a date like 2026-11-25 "
                        "(default 7d, UTC days)")
    report.add_argument("--out", default="report.html", help="the HTML file to write (default report.html)")
    report.add_argument("--url", default="http://127.0.0.1:4319", help="admin API of a running collector")
    report.add_argument("--db", action="append", help="database file(s) when no collector runs; repeat for "
                        "several replicas")
    report.add_argument("--lake", action="store_true", help="report on the shared DuckLake of [lake]")
    report.add_argument("--config", metavar="FILE", help="config file for --lake")
    report.set_defaults(command_module="report")

    score = sub.add_parser(
        "score",
        help="score waiting and failed jobs now",
        description="Score jobs that wait for a judge, for the budget, or failed. With a collector running at "
        "--url, its scoring stage takes them (with the judge it was started with) and this waits for them; "
        "otherwise the database file is opened and scored here with the current settings (judge keys, "
        "[scoring] config).",
    )
    score.add_argument("--pending", action="store_true", required=True, help="score every waiting/failed job")
    score.add_argument("--db", help="database file (default from config, TRACEJUDGE_DB, ./tracejudge.duckdb)")
    score.add_argument("--config", metavar="FILE")
    score.add_argument("--url", default="http://127.0.0.1:4319", help="admin API of a running collector")
    score.add_argument("--wait", type=float, default=600, help="seconds to wait for a running collector to "
                       "score the jobs (default 600)")
    _judge_connection_flags(score)
    score.add_argument("--batch", action="store_true", help="send the judge requests through the OpenAI Batch "
                       "API (half price; waits until the provider finishes the batch, up to 24h; a rerun after an "
                       "interruption waits on the batches already submitted)")
    score.set_defaults(command_module="score")

    rejudge = sub.add_parser(
        "rejudge",
        help="score one stored conversation again with today's judge, beside its stored score",
        description="Measure METRIC again on a stored conversation (its latest version, or --version) with the "
        "current judge, and print the stored score and the new one side by side, task by task. Nothing is "
        "written: the stored score stays the record. With a collector running at --url, its judge scores it; "
        "otherwise (or with --db) the database file is opened here with the current settings.",
    )
    rejudge.add_argument("conversation", help="the conversation id")
    rejudge.add_argument("--metric", required=True, help="mcp_use, mcp_task_completion or mcp_call_validity")
    rejudge.add_argument("--version", type=int, help="the conversation version (default: the latest)")
    rejudge.add_argument("--exchanges", action="store_true", help="print the new judge requests and answers")
    rejudge.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    rejudge.add_argument("--url", default="http://127.0.0.1:4319", help="admin API of a running collector")
    rejudge.add_argument("--timeout", type=float, default=300, help="seconds to wait for the collector's judge")
    rejudge.add_argument("--db", help="score on this database file, not a running collector")
    rejudge.add_argument("--config", metavar="FILE")
    rejudge.set_defaults(command_module="rejudge")

    compact = sub.add_parser(
        "compact", help="rewrite the database file to give freed space back to the filesystem",
        description="DuckDB reuses the space that deleted rows (retention) free, so the file stops growing, but "
        "it never shrinks. This copies every table into a new file and replaces the old one with it; the old "
        "file is kept as FILE.bak until the copy is complete. Stop the collector first.")
    compact.add_argument("--db", help="database file (default TRACEJUDGE_DB or ./tracejudge.duckdb)")
    compact.add_argument("--keep-backup", action="store_true", help="keep FILE.bak after a successful compaction")
    compact.set_defaults(command_module="compact")

    exp = sub.add_parser("export", help="write scores and conversations as Parquet",
                         description="Write scores and conversations since a date to DIR/scores.parquet and "
                         "DIR/conversations.parquet (reads the database file; stop the collector first).")
    exp.add_argument("--since", required=True, help="first UTC day to include: 7d, 24h, 2w or a date like "
                     "2026-12-01")
    exp.add_argument("--to", required=True, metavar="DIR")
    exp.add_argument("--db", help="database file (default TRACEJUDGE_DB or ./tracejudge.duckdb)")
    exp.add_argument("--reviews", action="store_true", help="also write reviews.jsonl: the reviewed conversations as "
                     "a labelled corpus for `python bench/validity.py --corpus reviews.jsonl`")
    exp.set_defaults(command_module="export")

    test = sub.add_parser("test", help="run assert_test tests (DeepEval's `deepeval test run`)",
                          description="Run tests that call assert_test, as `deepeval test run` does.")
    test_sub = test.add_subparsers(dest="test_command", required=True, metavar="COMMAND")
    test_run = test_sub.add_parser(
        "run", help="run pytest on test files, in parallel workers and recorded to DuckDB if asked",
        description="Run pytest on the given test files or directories; every argument this command does not "
        "know (paths, -k, -x, ...) goes to pytest as it is. Exit status is pytest's: 0 every test passed, 1 a "
        "test failed (a failing metric names itself with its score and reason), 2-5 interrupted or bad usage.",
        usage="tracejudge test run [-n N] [--db FILE] [pytest arguments ...]")
    test_run.add_argument("-n", "--workers", type=_workers, metavar="N",
                          help="run tests in N parallel processes ('auto': one per CPU); needs pytest-xdist")
    test_run.add_argument("--db", metavar="FILE", help="record every assert_test result into this tracejudge "
                          "DuckDB file (service 'ci'), next to production scores; not one a collector holds")
    test_run.set_defaults(command_module="test_run", takes_extra_arguments=True)

    mode = sub.add_parser(
        "set-eval-mode",
        help="write the default eval mode to the config file",
        description="Write [scoring] eval_mode to the config file the CLI and the collector read "
        "(TRACEJUDGE_CONFIG, else ./tracejudge.toml), keeping the rest of the file. TRACEJUDGE_EVAL_MODE and "
        "a metric's eval_mode argument still take precedence.",
    )
    mode.add_argument("mode", choices=list(EVAL_MODES), help="llm, hybrid or system_one")
    mode.add_argument("--url", default="http://127.0.0.1:4319", help="admin API of a running collector, to "
                      "tell you to restart it")
    mode.set_defaults(command_module="eval_mode")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.pytest_args = extra
    command = importlib.import_module(f"tracejudge.collector.commands.{args.command_module}")
    try:
        return int(command.run(args))
    except BrokenPipeError:  # `tracejudge inspect ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error flushing stdout
        return EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
