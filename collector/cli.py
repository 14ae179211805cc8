"""The `tracejudge` command: `serve` runs the collector, `evaluate` scores test-case files, `inspect` shows
how trace files map to conversations, `set-eval-mode` edits the config file."""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import httpx

from collector.config import ConfigError, load_settings, settings_help
from collector.config_file import ConfigFileError, set_value
from collector.history_sources import open_history
from collector.lake import LakeError
from collector.log import Logger
from collector.output_paths import OutputPathError, confined
from collector.query import QueryFailed, QueryRefused, QueryResult, run_read_query
from collector.replay import ReplayError, replay
from collector.replica_files import ReplicaFileError
from collector.report import build_report
from collector.report_data import ReportError
from collector.server import serve, stage_config
from collector.server_file import ServerFileError, read_server_file
from collector.span_store import SpanStore, StoreOpenError
from mapping import Conversation, OTLPDecodeError, Span, build_conversations, decode_otlp
from mapping.redaction import Redactor
from scoring import METRICS, BaseMetric, TracejudgeError, evaluate
from scoring.errors import InvalidTestCaseError, JudgeConfigurationError
from scoring.eval_mode import EvalMode, config_path
from scoring.stage import ScoringStage
from scoring.test_case import ConversationalTestCase, load_test_case

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


class InputFileError(TracejudgeError):
    """The test-case file cannot be read or one of its cases does not validate."""


def read_test_cases(path: Path, redactor: Redactor | None = None) -> list[ConversationalTestCase]:
    """Test cases from a JSON file (one case or a list) or JSON Lines (one case per line), redacted first."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read {path}: {exc}") from exc
    try:
        whole: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        whole = None
        first = next((line for line in text.splitlines() if line.strip()), "")
        if text.lstrip()[:1] in ("{", "[") and not _is_json(first):  # one JSON document spread over lines
            raise InputFileError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from exc
    if isinstance(whole, dict | list):
        items = [(None, c) for c in (whole if isinstance(whole, list) else [whole])]
    else:
        items = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise InputFileError(f"{path}:{number}: not valid JSON ({exc.msg}); expected a JSON file "
                                     "or one test case per line (JSON Lines)") from exc
    if not items:
        raise InputFileError(f"{path} holds no test case")
    cases = []
    for i, (line, data) in enumerate(items):
        try:
            cases.append(load_test_case(redactor.value(data) if redactor is not None else data))
        except InvalidTestCaseError as exc:
            where = f"{path}:{line}" if line is not None else f"{path} case {i}"
            raise InputFileError(f"{where}: {exc}") from exc
    return cases


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _build_metrics(args: argparse.Namespace) -> list[BaseMetric]:
    names = args.metric or list(METRICS)
    metrics: list[BaseMetric] = []
    for name in dict.fromkeys(names):
        cls = METRICS[name]
        kwargs: dict[str, Any] = {"threshold": args.threshold, "strict_mode": args.strict}
        if name != "mcp_call_validity":
            kwargs.update(model=args.model, eval_mode=args.eval_mode, system_one_model=args.system_one_model)
        metrics.append(cls(**kwargs))
    return metrics


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


def cmd_evaluate(args: argparse.Namespace) -> int:
    try:
        cases = read_test_cases(Path(args.file), load_settings().redaction.redactor())
        metrics = _build_metrics(args)
    except (InputFileError, JudgeConfigurationError, TracejudgeError, ValueError) as exc:
        print(f"tracejudge evaluate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = evaluate(cases, metrics, max_concurrency=args.concurrency, print_results=args.format == "table")
    if args.format == "json":
        print(result.model_dump_json(indent=2))
    return EXIT_PASS if result.passed else EXIT_FAIL


def read_trace_file(path: Path) -> list[Span]:
    """Spans from an OTLP/JSON file (one request, or one request per line) or an OTLP protobuf file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"cannot read {path}: {exc}") from exc
    if path.suffix in (".pb", ".bin", ".protobuf"):
        requests = [(raw, "application/x-protobuf")]
    else:
        text = raw.decode("utf-8", errors="replace")
        try:
            json.loads(text)
            requests = [(raw, "application/json")]
        except json.JSONDecodeError:
            requests = [(line.encode(), "application/json") for line in text.splitlines() if line.strip()]
    spans: list[Span] = []
    for number, (payload, content_type) in enumerate(requests, start=1):
        try:
            decoded = decode_otlp(payload, content_type)
        except OTLPDecodeError as exc:
            where = f"{path}:{number}" if len(requests) > 1 else str(path)
            raise InputFileError(f"{where}: {exc}") from exc
        for problem in decoded.problems:
            print(f"tracejudge inspect: skipped {problem}", file=sys.stderr)
        spans.extend(decoded.spans)
    return spans


def _describe(conversation: Conversation) -> str:
    c, tc = conversation, conversation.test_case
    lines = [f"conversation {c.conversation_id} (from {c.key}; service {c.service_name or '-'}, "
             f"agent {c.agent_name or '-'}, {len(c.trace_ids)} trace(s), {len(tc.turns)} turn(s))"]
    for i, turn in enumerate(tc.turns):
        lines.append(f"  [{i}] {turn.role}: {turn.content}")
        for call in turn.mcp_tools_called or []:
            result = call.result
            text = " ".join(b.text or f"[{b.type}]" for b in result.content) if result else "(no result)"
            flag = " ERROR" if result and result.is_error else ""
            lines.append(f"      MCP tool {call.name} {json.dumps(call.args, ensure_ascii=False)} ->{flag} {text}")
        for res in turn.mcp_resources_called or []:
            lines.append(f"      MCP resource {res.uri}" + ("" if res.result else " (no result)"))
        for prompt in turn.mcp_prompts_called or []:
            lines.append(f"      MCP prompt {prompt.name} {json.dumps(prompt.args, ensure_ascii=False)}")
        for tool in turn.tools_called or []:
            lines.append(f"      function {tool.name} {json.dumps(tool.input_parameters, ensure_ascii=False)}")
        for asked in (turn.metadata or {}).get("calls_not_executed", []):
            lines.append(f"      requested, never executed: {asked['name']} "
                         f"{json.dumps(asked['args'], ensure_ascii=False)}")
    for server in tc.mcp_servers or []:
        names = ", ".join(t.name for t in server.available_tools) or "-"
        lines.append(f"  server {server.server_name}: tools {names}; {len(server.available_resources)} resource(s), "
                     f"{len(server.available_prompts)} prompt(s)")
    return "\n".join(lines)


def _explain(conversation: Conversation) -> str:
    """Where each turn and call came from: the span, the dialect that read it, and the MCP rule that decided."""
    lines = [f"conversation {conversation.conversation_id}: where each turn and call came from"]
    for entry in conversation.explanation:
        lines.append(f"  [{entry['turn']}] {entry['role']}: {entry.get('source') or '(no text)'}")
        for call in entry.get("calls") or []:
            lines.append(f"      {call['kind']} {call['name']} (call id {call.get('call_id') or '-'}): "
                         f"{call['counted_as']}")
            if call.get("mcp_rule"):
                lines.append(f"        MCP because: {call['mcp_rule']}")
            if call.get("result_envelope"):
                lines.append(f"        result unwrapped from: {call['result_envelope']}")
            lines.extend(f"        from {source}" for source in call["sources"])
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        spans = read_trace_file(Path(args.file))
        servers = read_server_file(Path(args.servers)) if args.servers else None
        settings = load_settings()
        redactor = settings.redaction.redactor()
    except (InputFileError, ServerFileError, ConfigError) as exc:
        print(f"tracejudge inspect: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    conversations = build_conversations(redactor.spans(spans) if redactor is not None else spans, servers,
                                        mcp_tools=settings.mapping.mcp_tools, explain=args.explain)
    if args.format == "json":
        print(json.dumps([{
            "conversation_id": c.conversation_id, "key": c.key, "service_name": c.service_name,
            "agent_name": c.agent_name, "trace_ids": list(c.trace_ids), "first_span_ns": c.first_span_ns,
            "last_span_ns": c.last_span_ns, "content_hash": c.content_hash,
            "test_case": c.test_case.model_dump(mode="json", exclude_none=True),
            **({"explanation": list(c.explanation)} if args.explain else {}),
        } for c in conversations], indent=2, ensure_ascii=False))
    else:
        texts = [_describe(c) + ("\n" + _explain(c) if args.explain else "") for c in conversations]
        print("\n\n".join(texts) or f"no conversation in {len(spans)} span(s)")
    return EXIT_PASS


def cmd_replay(args: argparse.Namespace) -> int:
    endpoint = args.endpoint or ("http://127.0.0.1:4318/v1/traces" if args.protocol == "http" else "127.0.0.1:4317")
    token = args.token or os.environ.get("TRACEJUDGE_INGEST_TOKEN")
    try:
        report = replay([Path(f) for f in args.files], args.protocol, endpoint, token)
    except ReplayError as exc:
        print(f"tracejudge replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (httpx.HTTPError, OSError) as exc:
        print(f"tracejudge replay: cannot reach {endpoint}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    for line in report.messages + report.failures:
        print(line, file=sys.stderr)
    print(f"sent {report.requests} request(s) to {endpoint}: {len(report.failures)} failed, "
          f"{report.rejected_spans} span(s) rejected")
    return EXIT_PASS if not report.failures and not report.rejected_spans else EXIT_FAIL


def _print_result(result: QueryResult, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(result.to_json(), indent=2, default=str, ensure_ascii=False))
        return
    rows = [[_cell(v) for v in row] for row in result.to_json()["rows"]]
    if fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(result.columns)
        writer.writerows(rows)
        return
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(result.columns)]
    print("  ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', truncated' if result.truncated else ''})")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())  # one line per row, whatever the cell holds
    return text if len(text) <= 80 else text[:77] + "..."


def _admin_headers() -> dict[str, str]:
    token = os.environ.get("TRACEJUDGE_QUERY_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _from_collector(args: argparse.Namespace, send: Any) -> httpx.Response | None:
    """Ask the running collector at --url, unless the history is the lake or several files; None when no
    collector answers (then the file is read directly)."""
    if args.lake or len(args.db or []) > 1:
        return None
    try:
        return send(args.url.rstrip("/"), _admin_headers())
    except httpx.HTTPError:
        return None


def _history(args: argparse.Namespace, command: str) -> tuple[duckdb.DuckDBPyConnection, str] | None:
    try:
        return open_history(args.lake, args.db, args.config)
    except (LakeError, ReplicaFileError, ConfigError) as exc:
        hint = "" if args.lake or args.db else f"no collector answers at {args.url}, and "
        print(f"tracejudge {command}: {hint}{exc}", file=sys.stderr)
        return None


def cmd_query(args: argparse.Namespace) -> int:
    reply = _from_collector(args, lambda url, headers: httpx.post(
        f"{url}/api/query", json={"sql": args.sql, "limit": args.limit}, headers=headers, timeout=args.timeout + 5))
    if reply is not None:
        if reply.status_code != 200:
            print(f"tracejudge query: {reply.json().get('error', reply.text)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        body = reply.json()
        _print_result(QueryResult(body["columns"], body["rows"], body["truncated"]), args.format)
        return EXIT_PASS
    opened = _history(args, "query")
    if opened is None:
        return EXIT_BAD_INPUT
    con, _ = opened
    try:
        result = run_read_query(con, args.sql, args.limit, args.timeout)
    except (QueryRefused, QueryFailed) as exc:
        print(f"tracejudge query: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        con.close()
    _print_result(result, args.format)
    return EXIT_PASS


def cmd_report(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        target = confined(out.parent, out.name)
    except OutputPathError as exc:
        print(f"tracejudge report: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    reply = _from_collector(args, lambda url, headers: httpx.get(
        f"{url}/report", params={"since": args.since}, headers=headers, timeout=120))
    if reply is not None:
        if reply.status_code != 200:
            print(f"tracejudge report: {reply.json().get('error', reply.text)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        page = reply.text
    else:
        opened = _history(args, "report")
        if opened is None:
            return EXIT_BAD_INPUT
        con, source = opened
        try:
            page = build_report(con, args.since, source)
        except ReportError as exc:
            print(f"tracejudge report: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        finally:
            con.close()
    target.write_text(page, encoding="utf-8")
    print(f"wrote {target} ({len(page.encode())} bytes)")
    return EXIT_PASS


def cmd_score(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(Path(args.config) if args.config else None, {"db": args.db})
    except ConfigError as exc:
        print(f"tracejudge score: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logger = Logger(settings.log.level)
    store = SpanStore(settings.store.db)
    try:
        store.open()
    except StoreOpenError as exc:
        print(f"tracejudge score: {exc}; stop the collector first (it holds the file)", file=sys.stderr)
        return EXIT_FAIL
    try:
        stage = ScoringStage(store.cursor(), stage_config(settings), logger.log)
        stage.recover()
        done = asyncio.run(stage.score_pending())
        [(failed,)] = store.cursor().execute("SELECT count(*) FROM eval_jobs WHERE status = 'failed'").fetchall()
        [(waiting,)] = store.cursor().execute(
            "SELECT count(*) FROM eval_jobs WHERE status IN ('waiting_for_judge', 'budget', 'pending')").fetchall()
    finally:
        store.close()
    print(f"scored {done} job(s); {failed} failed, {waiting} still waiting")
    return EXIT_PASS if not failed and not waiting else EXIT_FAIL


def cmd_export(args: argparse.Namespace) -> int:
    try:
        since = dt.date.fromisoformat(args.since)
    except ValueError:
        print(f"tracejudge export: --since must be a date like 2026-12-01, not {args.since!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    db = Path(args.db or os.environ.get("TRACEJUDGE_DB") or "tracejudge.duckdb")
    out = Path(args.to)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        targets = {table: confined(out, f"{table}.parquet") for table in ("scores", "conversations")}
    except OutputPathError as exc:
        print(f"tracejudge export: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        with duckdb.connect(str(db), read_only=True) as con:
            for table, column in (("scores", "scored_at"), ("conversations", "assembled_at")):
                target = targets[table]
                quoted = str(target).replace("'", "''")
                con.execute(f"COPY (SELECT * FROM {table} WHERE {column} >= DATE '{since.isoformat()}') "
                            f"TO '{quoted}' (FORMAT parquet)")
                [(rows,)] = con.execute(f"SELECT count(*) FROM read_parquet('{quoted}')").fetchall()
                written.append(f"{target} ({rows} rows)")
    except duckdb.Error as exc:
        print(f"tracejudge export: cannot export from {db}: {exc}; stop the collector first if it holds the file",
              file=sys.stderr)
        return EXIT_FAIL
    print("wrote " + ", ".join(written))
    return EXIT_PASS


def cmd_set_eval_mode(args: argparse.Namespace) -> int:
    path = config_path()
    try:
        set_value(path, "scoring", "eval_mode", args.mode)
    except ConfigFileError as exc:
        print(f"tracejudge set-eval-mode: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"eval_mode = {args.mode!r} written to [scoring] in {path.resolve()}")
    if os.environ.get("TRACEJUDGE_EVAL_MODE"):
        print(f"note: TRACEJUDGE_EVAL_MODE={os.environ['TRACEJUDGE_EVAL_MODE']} is set and takes precedence "
              "over the config file", file=sys.stderr)
    return EXIT_PASS


def cmd_serve(args: argparse.Namespace) -> int:
    flags = {"host": args.host, "grpc_port": args.grpc_port, "http_port": args.http_port,
             "admin_port": args.admin_port, "db": args.db, "level": args.log_level, "replica": args.replica}
    try:
        settings = load_settings(Path(args.config) if args.config else None, flags)
        settings.lake.check_publishing()
    except ConfigError as exc:
        print(f"tracejudge serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logger = Logger(settings.log.level)
    try:
        asyncio.run(serve(settings, logger))
    except StoreOpenError as exc:
        logger.error("cannot start", reason=str(exc))
        return EXIT_FAIL
    except OSError as exc:
        logger.error("cannot start", reason=f"{exc}; is another process listening on that port?")
        return EXIT_FAIL
    return EXIT_PASS


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
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--config", metavar="FILE", help="config file (default: TRACEJUDGE_CONFIG or ./tracejudge.toml)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1; 0.0.0.0 for every interface)")
    serve.add_argument("--grpc-port", type=int, help="OTLP/gRPC port (default 4317; 0 picks a free one)")
    serve.add_argument("--http-port", type=int, help="OTLP/HTTP port (default 4318)")
    serve.add_argument("--admin-port", type=int, help="admin port: /healthz /readyz /metrics (default 4319)")
    serve.add_argument("--db", help="DuckDB file (default ./tracejudge.duckdb, or TRACEJUDGE_DB)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log level (default info)")
    serve.add_argument("--replica", help="this replica's name in a shared [lake] (default: the host name)")
    serve.set_defaults(func=cmd_serve)

    ev = sub.add_parser(
        "evaluate",
        help="score test cases from a JSON or JSON Lines file",
        description="Score ConversationalTestCase records from FILE (a JSON object, a JSON list, or JSON "
        "Lines). Exit status: 0 all pass, 1 any fails or errors, 2 bad input or settings. The LLM judge "
        "uses OPENAI_API_KEY and OPENAI_BASE_URL (any OpenAI-compatible server).",
    )
    ev.add_argument("file", metavar="FILE", help="test cases: .json (one case or a list) or .jsonl")
    ev.add_argument("--metric", action="append", choices=list(METRICS),
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
    ev.set_defaults(func=cmd_evaluate)

    inspect = sub.add_parser(
        "inspect",
        help="print the conversations a trace file maps to",
        description="Decode an OTLP trace file (OTLP/JSON: one ExportTraceServiceRequest or one per line; "
        ".pb: protobuf) and print each conversation it maps to: turns, MCP calls with arguments and results, "
        "and the MCP servers. Use it to check how your agent's traces are read.",
    )
    inspect.add_argument("file", metavar="FILE", help="OTLP/JSON (.json, .jsonl) or protobuf (.pb) trace file")
    inspect.add_argument("--servers", metavar="FILE", help="MCP server inventory (JSON or TOML) to merge in")
    inspect.add_argument("--format", choices=["text", "json"], default="text", help="output format")
    inspect.add_argument("--explain", action="store_true",
                         help="also show, for each turn and call, the span and dialect it came from, why a tool "
                         "counts as MCP ([mapping] mcp_tools in tracejudge.toml names tools for frameworks "
                         "without MCP spans) and which result envelope was removed")
    inspect.set_defaults(func=cmd_inspect)

    rp = sub.add_parser(
        "replay",
        help="send saved trace files to a running collector",
        description="Send OTLP trace files (OTLP/JSON, JSON Lines of requests, or .pb protobuf) to a collector "
        "over OTLP/HTTP (default) or OTLP/gRPC. Exit status 0 when every span was accepted.",
    )
    rp.add_argument("files", nargs="+", metavar="FILE")
    rp.add_argument("--protocol", choices=["http", "grpc"], default="http")
    rp.add_argument("--endpoint", help="default http://127.0.0.1:4318/v1/traces (http) or 127.0.0.1:4317 (grpc)")
    rp.add_argument("--token", help="bearer token (default TRACEJUDGE_INGEST_TOKEN)")
    rp.set_defaults(func=cmd_replay)

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
    query.add_argument("--format", choices=["table", "csv", "json"], default="table")
    query.add_argument("--limit", type=_positive, default=1000, help="most rows returned (default 1000)")
    query.add_argument("--timeout", type=float, default=30.0, help="seconds before the query is stopped")
    query.set_defaults(func=cmd_query)

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
    report.set_defaults(func=cmd_report)

    score = sub.add_parser(
        "score",
        help="score waiting and failed jobs now (collector stopped)",
        description="Score jobs that wait for a judge, for the budget, or failed, with the current settings "
        "(judge keys, [scoring] config). Run it while the collector is stopped: it opens the database file.",
    )
    score.add_argument("--pending", action="store_true", required=True, help="score every waiting/failed job")
    score.add_argument("--db", help="database file (default from config, TRACEJUDGE_DB, ./tracejudge.duckdb)")
    score.add_argument("--config", metavar="FILE")
    score.set_defaults(func=cmd_score)

    exp = sub.add_parser("export", help="write scores and conversations as Parquet",
                         description="Write scores and conversations since a date to DIR/scores.parquet and "
                         "DIR/conversations.parquet (reads the database file; stop the collector first).")
    exp.add_argument("--since", required=True, help="first UTC day to include, e.g. 2026-12-01")
    exp.add_argument("--to", required=True, metavar="DIR")
    exp.add_argument("--db", help="database file (default TRACEJUDGE_DB or ./tracejudge.duckdb)")
    exp.set_defaults(func=cmd_export)

    mode = sub.add_parser(
        "set-eval-mode",
        help="write the default eval mode to the config file",
        description="Write [scoring] eval_mode to the config file the CLI and the collector read "
        "(TRACEJUDGE_CONFIG, else ./tracejudge.toml), keeping the rest of the file. TRACEJUDGE_EVAL_MODE and "
        "a metric's eval_mode argument still take precedence.",
    )
    mode.add_argument("mode", choices=[m.value for m in EvalMode], help="llm, hybrid or system_one")
    mode.set_defaults(func=cmd_set_eval_mode)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
