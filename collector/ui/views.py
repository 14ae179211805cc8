"""What each page of the web UI shows, read from the database: plain data, no HTML (the templates render it).

Every query is parameterized, and every filter a user can set is a field of `ConversationFilter`, read from
and written back to the URL so a view can be shared.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import duckdb

from tracejudge.collector.durations import DurationError, parse_duration
from tracejudge.collector.store.connection.id_table import id_table
from tracejudge.collector.ui.span_view import ModelGiven, SpanTree, model_calls, span_tree

WINDOWS = ("1h", "24h", "7d", "30d", "90d")
PAGE_SIZE = 50
MAX_PAGE = 100_000
SORTS = {"time": "c.assembled_at", "turns": "c.turns", "calls": "c.mcp_calls", "conversation": "c.conversation_id"}


@dataclass
class ConversationFilter:
    """The conversations table's filters, sort and page, as URL query parameters."""

    window: str = "7d"
    service: str = ""
    agent: str = ""
    metric: str = ""
    result: str = ""  # pass | fail (of `metric`, else of any metric)
    min_score: str = ""
    max_score: str = ""
    mcp_error: str = ""  # "1": only conversations with an MCP call that returned an error
    tool: str = ""
    q: str = ""  # text in the turns
    sort: str = "time"
    order: str = "desc"
    page: int = 1

    @classmethod
    def from_query(cls, query: Any) -> ConversationFilter:
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = query.get(f.name)
            if raw is None:
                continue
            text = str(raw)
            values[f.name] = (min(max(1, int(text)), MAX_PAGE) if text.isascii() and text.isdigit()
                              and len(text) < 9 else 1) if f.name == "page" else text[:200]
        chosen = cls(**{k: v for k, v in values.items() if not (k == "page" and not isinstance(v, int))})
        if chosen.sort not in SORTS:
            chosen.sort = "time"
        chosen.order = "asc" if chosen.order == "asc" else "desc"
        chosen.window = chosen.window if chosen.window in WINDOWS else "7d"  # 9999999d: a date before year 1
        chosen.result = chosen.result if chosen.result in ("pass", "fail") else ""
        chosen.mcp_error = "1" if chosen.mcp_error == "1" else ""
        chosen.min_score, chosen.max_score = _score_bound(chosen.min_score), _score_bound(chosen.max_score)
        return chosen

    def query(self, **changes: Any) -> dict[str, str]:
        """The URL parameters of this filter with `changes`, defaults left out."""
        merged = {**asdict(self), **changes}
        defaults = asdict(ConversationFilter())
        return {k: str(v) for k, v in merged.items() if v not in ("", None) and v != defaults[k]}


def _score_bound(text: str) -> str:
    """A score bound as typed when it is a number from 0 to 1, else none."""
    try:
        return text if 0.0 <= float(text) <= 1.0 else ""
    except ValueError:
        return ""


def window_start(window: str) -> dt.datetime:
    try:
        seconds = parse_duration(window)
    except DurationError:
        seconds = parse_duration("7d")
    return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cursor = con.execute(sql, params)
    names = [d[0] for d in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


# --- overview -----------------------------------------------------------------------------------------------


@dataclass
class Trend:
    metric: str
    group: str
    points: list[tuple[dt.datetime, float | None, float | None, float | None]]  # bucket, mean, p10, pass rate


@dataclass
class Overview:
    window: str
    split: str
    received: int
    complete: int
    scored: int
    metrics: list[dict[str, Any]]
    trends: list[Trend]
    bucket: str
    spend: list[dict[str, Any]]
    budget: float | None
    jobs: dict[str, int]
    failed: list[dict[str, Any]]
    jobs_known: bool = True  # False over the lake: jobs stay in each replica's own file


WEIGHTED_MEAN = "sum(coalesce(weight, 1) * score) / sum(coalesce(weight, 1))"
WEIGHTED_PASS = ("sum(coalesce(weight, 1) * CASE WHEN success THEN 1.0 WHEN NOT success THEN 0.0 END) / "
                 "sum(CASE WHEN success IS NOT NULL THEN coalesce(weight, 1) END)")


def overview(con: duckdb.DuckDBPyConnection, window: str, split: str, budget: float | None) -> Overview:
    since = window_start(window)
    bucket = "hour" if dt.datetime.now(dt.UTC) - since <= dt.timedelta(days=2) else "day"
    [(received, complete)] = con.execute(
        "SELECT count(*), count(*) FROM conversation_summary WHERE assembled_at >= ?", [since]).fetchall()
    [(scored,)] = con.execute("SELECT count(DISTINCT conversation_id) FROM score_summary WHERE scored_at >= ? "
                              "AND score IS NOT NULL", [since]).fetchall()
    # Hajek: each score weighs 1 / the chance its conversation had of being judged ([sampling] rules); p10 is of
    # the scored sample
    metrics = _rows(con, f"SELECT metric, count(*) AS conversations, {WEIGHTED_MEAN} AS mean, "
                         f"quantile_cont(score, 0.1) AS p10, {WEIGHTED_PASS} AS pass_rate, "
                         "sum(tasks) AS tasks, sum(tasks_failed) AS tasks_failed, "
                         "count(*) FILTER (WHERE tasks_failed > 0) AS with_failed_task FROM score_summary "
                         "WHERE scored_at >= ? AND score IS NOT NULL GROUP BY metric ORDER BY metric", [since])
    group = {"service": "coalesce(service_name, '-')", "agent": "coalesce(agent_name, '-')"}.get(split, "'all'")
    width = 3_600_000_000 if bucket == "hour" else 86_400_000_000  # UTC buckets by arithmetic: no time zone lookups
    points = con.execute(
        f"SELECT metric, {group} AS grp, to_timestamp(epoch_us(scored_at) // {width} * {width // 1_000_000}) "
        "AS bucket, "
        f"{WEIGHTED_MEAN}, quantile_cont(score, 0.1), {WEIGHTED_PASS} "
        "FROM score_summary WHERE scored_at >= ? AND score IS NOT NULL GROUP BY ALL ORDER BY 1, 2, 3",
        [since]).fetchall()
    trends: dict[tuple[str, str], Trend] = {}
    for metric, grp, at, mean, p10, rate in points:
        trends.setdefault((metric, grp), Trend(metric, grp, [])).points.append((at, mean, p10, rate))
    spend = _rows(con, "SELECT DATE '1970-01-01' + CAST(epoch_us(scored_at) // 86400000000 AS INTEGER) AS day, "
                       "sum(evaluation_cost) AS cost, count(*) FILTER (WHERE evaluation_cost IS NULL AND "
                       "judge_calls > 0) AS unpriced "
                       "FROM scores WHERE scored_at >= ? GROUP BY 1 ORDER BY 1", [since])
    jobs: dict[str, int] = {}
    failed: list[dict[str, Any]] = []
    try:
        jobs = dict(con.execute("SELECT status, count(*) FROM eval_jobs GROUP BY 1 ORDER BY 1").fetchall())
        failed = _rows(con, "SELECT conversation_id, metric, attempts, last_error, updated_at FROM eval_jobs "
                            "WHERE status = 'failed' ORDER BY updated_at DESC LIMIT 10", [])
        jobs_known = True
    except duckdb.CatalogException:  # a history without the job queue (the lake)
        jobs_known = False
    return Overview(window, split, received, complete, scored, metrics, list(trends.values()), bucket, spend,
                    budget, jobs, failed, jobs_known)


# --- conversations ----------------------------------------------------------------------------------------


@dataclass
class ConversationPage:
    filter: ConversationFilter
    rows: list[dict[str, Any]]
    total: int
    metrics: list[str]
    services: list[str]
    agents: list[str]

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // PAGE_SIZE))


def conversations(con: duckdb.DuckDBPyConnection, f: ConversationFilter) -> ConversationPage:
    where = ["c.assembled_at >= ?"]
    params: list[Any] = [window_start(f.window)]
    if f.service:
        where.append("c.service_name = ?")
        params.append(f.service)
    if f.agent:
        where.append("c.agent_name = ?")
        params.append(f.agent)
    if f.q:
        where.append("EXISTS (SELECT 1 FROM conversations t WHERE t.conversation_id = c.conversation_id "
                     "AND t.version = c.version AND contains(lower(CAST(t.test_case AS VARCHAR)), lower(?)))")
        params.append(f.q)
    if f.mcp_error == "1":
        where.append("c.mcp_errors > 0")
    if f.tool:
        where.append("EXISTS (SELECT 1 FROM call_summary k WHERE k.conversation_id = c.conversation_id "
                     "AND k.version = c.version AND k.name = ?)")
        params.append(f.tool)
    score_filter = []
    if f.metric:
        score_filter.append("s.metric = ?")
        params.append(f.metric)
    if f.result in ("pass", "fail"):
        score_filter.append("s.success = " + ("true" if f.result == "pass" else "false"))
    for bound, op in ((f.min_score, ">="), (f.max_score, "<=")):
        try:
            value = float(bound)
        except ValueError:
            continue
        score_filter.append(f"s.score {op} ?")
        params.append(value)
    if score_filter:
        where.append("c.conversation_id IN (SELECT s.conversation_id FROM score_summary s WHERE "
                     + " AND ".join(score_filter) + ")")
    base = "FROM conversation_summary c WHERE " + " AND ".join(where)
    [(total,)] = con.execute(f"SELECT count(*) {base}", params).fetchall()
    order = f"{SORTS[f.sort]} {'ASC' if f.order == 'asc' else 'DESC'} NULLS LAST, c.conversation_id"
    rows = _rows(con, "SELECT c.conversation_id, c.version, c.service_name, c.agent_name, c.turns, c.mcp_calls, "
                      f"c.mcp_errors, c.assembled_at, c.summary_note {base} ORDER BY {order} LIMIT ? OFFSET ?",
                 [*params, PAGE_SIZE, (f.page - 1) * PAGE_SIZE])
    ids = [r["conversation_id"] for r in rows]
    scores: list[tuple[Any, ...]] = []
    if ids:
        with id_table(con, ids) as page:
            scores = con.execute("SELECT conversation_id, metric, score, success FROM score_summary "
                                 f"WHERE conversation_id IN (SELECT id FROM {page})").fetchall()
    by_id: dict[str, dict[str, tuple[float | None, bool | None]]] = {}
    for cid, metric, score, success in scores:
        by_id.setdefault(cid, {})[metric] = (score, success)
    for row in rows:
        row["scores"] = by_id.get(row["conversation_id"], {})
        row["mcp_error"] = bool(row.pop("mcp_errors"))
    metrics = [m for (m,) in con.execute("SELECT DISTINCT metric FROM score_summary ORDER BY 1").fetchall()]
    services = [s for (s,) in con.execute("SELECT DISTINCT service_name FROM conversation_summary "
                                          "WHERE service_name IS NOT NULL ORDER BY 1 LIMIT 200").fetchall()]
    agents = [a for (a,) in con.execute("SELECT DISTINCT agent_name FROM conversation_summary "
                                        "WHERE agent_name IS NOT NULL ORDER BY 1 LIMIT 200").fetchall()]
    return ConversationPage(f, rows, total, metrics, services, agents)


# --- one conversation -------------------------------------------------------------------------------------


@dataclass
class ConversationView:
    conversation_id: str
    version: int
    versions: list[dict[str, Any]]
    test_case: dict[str, Any]
    trace_ids: list[str]
    service_name: str | None
    agent_name: str | None
    scores: list[dict[str, Any]]
    violations: dict[tuple[int, str, str], list[str]] = field(default_factory=dict)  # (turn, kind, name)
    trace_url: str | None = None
    spans: SpanTree | None = None
    model_given: list[ModelGiven] = field(default_factory=list)  # what the page's model calls were given
    model_calls: int = 0  # model calls among the page's spans
    test_case_text: str | None = None  # the test case as stored

    def trace_link(self, trace_id: str) -> str:
        """The configured trace backend's page for the trace, else this page's own span view of it."""
        if self.trace_url:
            return self.trace_url.replace("{trace_id}", trace_id)
        first = next((r for r in (self.spans.rows if self.spans else []) if r.trace_id == trace_id), None)
        return f"#span-{first.span_id}" if first else f"/traces/{trace_id}"

    def span_link(self, span_id: str) -> str:
        """Where the span's row is: this page of the span tree, or another."""
        if self.spans is None or span_id not in self.spans.page_of:
            return ""
        page = self.spans.page_of[span_id]
        return f"#span-{span_id}" if page == self.spans.page else \
            f"?version={self.version}&spans_page={page}#span-{span_id}"

    @property
    def test_case_json(self) -> str:
        """Indented when small; a large case as it is stored (Python indents JSON ten times slower)."""
        if self.test_case_text is not None and len(self.test_case_text) > PRETTY_JSON_BYTES:
            return self.test_case_text
        return json.dumps(self.test_case, indent=2, ensure_ascii=False)

    @property
    def turn_calls(self) -> list[list[dict[str, Any]]]:
        """Per turn, its MCP calls as the transcript shows them: kind, name, the call, its server, the spans that
        recorded it, the call validity problems found in it, and whether it returned an error."""
        servers: dict[str, str] = {}
        for server in self.test_case.get("mcp_servers") or []:
            for tool in server.get("available_tools") or []:
                servers.setdefault(tool.get("name"), server.get("server_name"))
        out = []
        for index, turn in enumerate(self.test_case.get("turns") or []):
            recorded = (turn.get("metadata") or {}).get("call_spans") or {}
            calls = []
            for kind, key, name_key in (("tool", "mcp_tools_called", "name"),
                                        ("resource", "mcp_resources_called", "uri"),
                                        ("prompt", "mcp_prompts_called", "name")):
                spans = recorded.get(kind) or []
                for i, call in enumerate(turn.get(key) or []):
                    name = call.get(name_key) or ""
                    result = call.get("result") or {}
                    calls.append({"kind": kind, "name": name, "call": call, "server": servers.get(name)
                                  if kind == "tool" else None, "spans": spans[i] if i < len(spans) else None,
                                  "problems": self.violations.get((index, kind, name), []),
                                  "failed": bool(isinstance(result, dict) and result.get("isError"))})
            out.append(calls)
        return out


def conversation(con: duckdb.DuckDBPyConnection, conversation_id: str, version: int | None,
                 trace_url: str | None, spans_page: int = 1) -> ConversationView | None:
    versions = _rows(con, "SELECT version, content_hash, turns, mcp_calls, assembled_at FROM conversations "
                          "WHERE conversation_id = ? ORDER BY version", [conversation_id])
    if not versions:
        return None
    chosen = version if version in {v["version"] for v in versions} else versions[-1]["version"]
    [(test_case, trace_ids, service, agent, first_ns, last_ns)] = con.execute(
        "SELECT test_case, trace_ids, service_name, agent_name, first_span_ns, last_span_ns FROM conversations "
        "WHERE conversation_id = ? AND version = ?", [conversation_id, chosen]).fetchall()
    for previous, current in zip(versions, versions[1:], strict=False):
        changes = []
        if current["turns"] != previous["turns"]:
            changes.append(f"turns {previous['turns']} → {current['turns']}")
        if current["mcp_calls"] != previous["mcp_calls"]:
            changes.append(f"MCP calls {previous['mcp_calls']} → {current['mcp_calls']}")
        current["changed"] = ", ".join(changes) or "content of a turn or call"
    scores = _rows(con, "SELECT metric, metric_config, eval_mode, score, success, threshold, reason, confidence, "
                        "judge_model, system_one_model, evaluation_cost, breakdown, fallback_reason, error, "
                        "scored_at FROM scores WHERE conversation_id = ? AND conversation_version = ? "
                        "ORDER BY metric, scored_at DESC",
                   [conversation_id, chosen])
    violations: dict[tuple[int, str, str], list[str]] = {}
    for score in scores:
        breakdown = json.loads(score["breakdown"]) if isinstance(score["breakdown"], str) else score["breakdown"]
        score["breakdown"] = breakdown or {}
        score["decisions"] = _decisions(score["breakdown"])
        source = score["breakdown"].get("reused_from") or {}
        score["exchanges"], score["exchange_count"] = _exchanges(
            con, source.get("conversation_id", conversation_id), source.get("conversation_version", chosen),
            score["metric"], score["metric_config"])
        if score["metric"] == "mcp_call_validity":
            for call in score["breakdown"].get("calls", []):
                if call.get("violations"):
                    violations.setdefault((call["turn"], call["kind"], call["name"]), []).extend(call["violations"])
    case = json.loads(test_case)
    traces = list(trace_ids or [])
    tree, given, model_call_count = None, [], 0
    if _has_table(con, "span_records"):  # the lake and replicas' reports hold no spans
        tree = span_tree(con, case, traces, first_ns, last_ns, spans_page)
        given, model_call_count = model_calls(con, tree)
    return ConversationView(conversation_id, chosen, versions, case, traces, service, agent, scores, violations,
                            trace_url, tree, given, model_call_count, test_case)


PRETTY_JSON_BYTES = 100_000
EXCHANGES_SHOWN = 40  # a score's judge exchanges on its page; `judge_calls` has them all


def _exchanges(con: duckdb.DuckDBPyConnection, conversation_id: str, version: int, metric: str,
               config: str) -> tuple[list[dict[str, Any]], int]:
    """The judge's requests (messages, model, parameters as sent) and raw answers for one score, and how many."""
    if not _has_table(con, "judge_calls"):  # a history older than schema 25 (a replica's file, the lake)
        return [], 0
    rows = _rows(con, "SELECT seq, judge, request, response, error, input_tokens, output_tokens, latency_ms, "
                      "called_at, count(*) OVER () AS total FROM judge_calls WHERE conversation_id = ? "
                      "AND conversation_version = ? AND metric = ? AND metric_config = ? ORDER BY seq "
                      f"LIMIT {EXCHANGES_SHOWN}", [conversation_id, version, metric, config])
    for row in rows:
        request = json.loads(row["request"]) if isinstance(row["request"], str) else row["request"] or {}
        row["messages"] = request.pop("messages", None) if isinstance(request, dict) else None
        row["parameters"] = request
    return rows, rows[0]["total"] if rows else 0


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = ? UNION ALL "
                            "SELECT 1 FROM duckdb_views() WHERE view_name = ?", [name, name]).fetchall())


def conversation_of_trace(con: duckdb.DuckDBPyConnection, trace_id: str) -> str | None:
    """The conversation a trace was assembled into, if it was."""
    found = con.execute("SELECT conversation_id FROM assembled_traces WHERE trace_id = ?", [trace_id]).fetchall()
    return found[0][0] if found else None


def _decisions(breakdown: dict[str, Any]) -> list[dict[str, Any]]:
    """Each judged task's values, who decided them (LLM or System One, with confidence) and why: one row per
    question and distinct reason, naming the tasks it covers (a judge often gives several tasks the same reason)."""
    rows: dict[tuple[str, str, str, Any], dict[str, Any]] = {}
    for task in breakdown.get("tasks") or []:
        if "primitive_score" in task:
            questions = [("primitive choice", task.get("primitive_score"), task.get("primitive") or {},
                          task.get("primitive_reason")),
                         ("argument correctness", task.get("argument_score"), task.get("argument") or {},
                          task.get("argument_reason"))]
        else:
            questions = [("task completion", task.get("score"), task, task.get("reason"))]
        for question, value, decision, reason in questions:
            key = (question, reason or "", decision.get("decided_by", ""), decision.get("system_one_fallback_reason"))
            row = rows.setdefault(key, {"tasks": [], "scores": [], "question": question,
                                        "decided_by": key[2], "confidences": [], "fallback": key[3],
                                        "reason": key[1]})
            row["tasks"].append(task.get("task", ""))
            row["scores"].append(value)
            if decision.get("confidence") is not None:
                row["confidences"].append(decision["confidence"])
    return list(rows.values())


# --- MCP servers and tools --------------------------------------------------------------------------------


def tools(con: duckdb.DuckDBPyConnection, window: str) -> list[dict[str, Any]]:
    """Per server and tool of the latest conversation versions in the window: calls, error rate, and the share of
    calls whose arguments broke the tool's input schema (the latest mcp_call_validity scores name each such call
    by turn, kind and name; it is counted on the server of that call), and the median and p95 of the calls' time
    (from the spans that recorded them)."""
    return _rows(con, """
        WITH invalid AS (
            SELECT s.conversation_id, s.conversation_version AS version,
                   CAST(split_part(x, chr(9), 1) AS INTEGER) AS turn, split_part(x, chr(9), 2) AS kind,
                   split_part(x, chr(9), 3) AS name, count(*) AS n
            FROM score_summary s, unnest(s.invalid_calls) AS u(x)
            WHERE s.metric = 'mcp_call_validity' AND len(s.invalid_calls) > 0 GROUP BY ALL),
        calls AS (
            SELECT k.conversation_id, k.version, k.turn, k.kind, k.name, coalesce(k.server, '-') AS server,
                   count(*) AS calls, count(*) FILTER (WHERE k.is_error) AS errors
            FROM call_summary k JOIN conversation_summary c
                 ON c.conversation_id = k.conversation_id AND c.version = k.version
            WHERE c.assembled_at >= ? GROUP BY ALL),
        latency AS (
            SELECT coalesce(k.server, '-') AS server, k.kind, k.name,
                   quantile_cont(k.duration_ms, 0.5) AS p50_ms, quantile_cont(k.duration_ms, 0.95) AS p95_ms,
                   count(k.duration_ms) AS timed
            FROM call_summary k JOIN conversation_summary c
                 ON c.conversation_id = k.conversation_id AND c.version = k.version
            WHERE c.assembled_at >= ? GROUP BY ALL)
        SELECT c.server, c.kind, c.name, sum(c.calls) AS calls, sum(c.errors) / sum(c.calls) AS error_rate,
               sum(least(coalesce(i.n, 0), c.calls)) / sum(c.calls) AS invalid_rate,
               count(DISTINCT c.conversation_id) AS conversations,
               any_value(l.p50_ms) AS p50_ms, any_value(l.p95_ms) AS p95_ms, any_value(l.timed) AS timed
        FROM calls c LEFT JOIN invalid i USING (conversation_id, version, turn, kind, name)
             LEFT JOIN latency l ON l.server = c.server AND l.kind = c.kind AND l.name = c.name
        GROUP BY c.server, c.kind, c.name ORDER BY calls DESC, c.name LIMIT 500""",
                 [window_start(window), window_start(window)])


def change_token(con: duckdb.DuckDBPyConnection) -> str:
    """Changes whenever a conversation or score is written: the live pages poll it."""
    [(conversations_at, scores_at, jobs)] = con.execute(
        "SELECT (SELECT max(assembled_at) FROM conversations), (SELECT max(scored_at) FROM scores), "
        "(SELECT count(*) FROM eval_jobs WHERE status IN ('pending', 'running'))").fetchall()
    return f"{conversations_at}|{scores_at}|{jobs}"
