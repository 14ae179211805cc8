"""Two cohorts of conversations compared: per metric, per MCP server and tool, and per conversation, with the
statistics of `cohort_stats` (Wilson, Newcombe, Welch, Holm), and the canary gate.

A cohort is a filter over the latest version of each conversation, written as comma-separated terms that must
all hold: `service=NAME`, `agent=NAME`, `since=7d` / `until=2026-12-01` (when it was assembled), `KEY=VALUE` for
any attribute key the collector records per conversation (`[cohorts] attributes`: service.version,
gen_ai.request.model, ...), or a saved name (`[cohorts] saved`). The queries read the `conversations`,
`latest_scores` and `mcp_calls` tables and views, so they run the same on a live file, replicas' files and the lake.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracejudge.collector.durations import DurationError
from tracejudge.collector.history.cohort_stats import (
    Moments,
    gate,
    holm,
    mean_difference,
    mean_interval,
    rate_difference,
    rate_p_value,
    wilson,
)
from tracejudge.judges.pricing import known_price
from tracejudge.metric_ids import METRIC_IDS

KEY = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")  # an attribute key, or `<service.name>:<key>` for one service's
EXAMPLES = 5
MAX_TOOLS = 50  # the busiest tools shown (and adjusted for): past that a page is no longer read


class CohortError(ValueError):
    """A cohort that cannot be read, with how to write one."""


@dataclass(frozen=True)
class Cohort:
    spec: str
    service: str | None = None
    agent: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    attributes: dict[str, str] = field(default_factory=dict)

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition on `conversations c` and its parameters."""
        terms, params = ["c.status <> 'context_only'"], []
        for column, value in (("c.service_name", self.service), ("c.agent_name", self.agent)):
            if value is not None:
                terms.append(f"{column} = ?")
                params.append(value)
        if self.since is not None:
            terms.append("c.assembled_at >= ?")
            params.append(self.since)
        if self.until is not None:
            terms.append("c.assembled_at < ?")
            params.append(self.until)
        for key, value in self.attributes.items():
            terms.append("list_contains(CAST(json_extract(c.attributes, ?) AS VARCHAR[]), ?)")
            params += [f'$."{key}"', value]
        return " AND ".join(terms), params


def parse_cohort(spec: str, saved: dict[str, str] | None = None, _depth: int = 0) -> Cohort:
    """`service.version=1.4.2,since=24h` -> Cohort; a saved name stands for its definition."""
    saved = saved or {}
    if spec.strip() in saved and _depth < 4:
        named = parse_cohort(saved[spec.strip()], saved, _depth + 1)
        return Cohort(spec.strip(), named.service, named.agent, named.since, named.until, named.attributes)
    found: dict[str, Any] = {"attributes": {}}
    for term in (t.strip() for t in spec.split(",")):
        key, sep, value = term.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value or not KEY.fullmatch(key):
            known = f"; saved cohorts: {', '.join(sorted(saved))}" if saved else ""
            raise CohortError(f"cannot read the cohort term {term[:80]!r}: write KEY=VALUE terms separated by commas, "
                              f"e.g. 'service.version=1.4.2,since=24h' (keys: service, agent, since, until, or an "
                              f"attribute recorded per conversation){known}")
        if key in found or key in found["attributes"]:
            raise CohortError(f"the cohort names {key} twice: one value per key (a cohort's terms all hold)")
        if key in ("service", "agent"):
            found[key] = value
        elif key in ("since", "until"):
            try:
                found[key] = _instant(value)
            except (DurationError, ValueError, OverflowError) as exc:
                raise CohortError(f"{key}={value}: write a duration like 24h or 7d, or a date like 2026-12-01 "
                                  f"({exc})") from exc
        else:
            found["attributes"][key] = value
    return Cohort(spec.strip(), **found)


def _is_date(value: str) -> bool:
    return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", value))


def _instant(value: str) -> dt.datetime:
    """A date (midnight UTC) or a duration back from now (24h, 7d, 2w)."""
    if _is_date(value):
        return dt.datetime.combine(dt.date.fromisoformat(value), dt.time(), dt.UTC)
    match = re.fullmatch(r"(\d+)\s*([smhdw])", value)
    if match is None:
        raise DurationError(f"write a duration like 30m, 24h, 7d or 2w, or a date like 2026-12-01, not {value!r}")
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match.group(2)] * int(match.group(1))
    return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)


# --- the comparison -------------------------------------------------------------------------------------------


def _cohort_table(con: duckdb.DuckDBPyConnection, name: str, cohort: Cohort) -> int:
    """A temporary table of the cohort's conversations (latest versions); how many."""
    where, params = cohort.where()
    for key in cohort.attributes:  # a key no conversation records makes an empty cohort: say so instead
        [(recorded,)] = con.execute("SELECT count(*) FROM (SELECT 1 FROM conversations WHERE "
                                    "json_exists(attributes, ?) LIMIT 1)", [f'$."{key}"']).fetchall()
        if not recorded:
            raise CohortError(f"no conversation records the attribute {key!r}: add it to [cohorts] attributes "
                              "(conversations assembled from then on record it), or use service= or agent=")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {name} AS
        SELECT c.conversation_id, c.version, c.first_span_ns, c.last_span_ns, c.agent_usage
        FROM (SELECT * FROM conversations
              QUALIFY row_number() OVER (PARTITION BY conversation_id ORDER BY version DESC) = 1) c
        WHERE {where}""", params)
    [(n,)] = con.execute(f"SELECT count(*) FROM {name}").fetchall()
    return n


def _metrics(con: duckdb.DuckDBPyConnection, name: str) -> dict[str, dict[str, Any]]:
    """Per metric, Hajek estimates over the cohort's scores, each weighing 1 / the probability its conversation had
    of being scored ([sampling] rate and rules), with Kish's effective sample size: the pass rate (and the
    effective number of passes), the mean score and its variance, and (judged metrics) the share of
    conversations with a task under the threshold, whatever the conversation's own verdict."""
    rows = con.execute(f"""
        WITH w AS (
            SELECT s.*, 1.0 / coalesce(nullif(s.inclusion_probability, 0), 1.0) AS w
            FROM latest_scores s JOIN {name} k ON k.conversation_id = s.conversation_id
                                               AND k.version = s.conversation_version)
        SELECT metric,
               count(*) FILTER (WHERE success IS NOT NULL),
               sum(w) FILTER (WHERE success IS NOT NULL), sum(w * w) FILTER (WHERE success IS NOT NULL),
               sum(w) FILTER (WHERE success),
               count(score), sum(w) FILTER (WHERE score IS NOT NULL), sum(w * w) FILTER (WHERE score IS NOT NULL),
               sum(w * score), sum(w * score * score), avg(evaluation_cost), any_value(threshold),
               sum(w) FILTER (WHERE failed_task IS NOT NULL), sum(w * w) FILTER (WHERE failed_task IS NOT NULL),
               sum(w) FILTER (WHERE failed_task)
        FROM (SELECT *, CASE WHEN metric IN ('mcp_use', 'mcp_task_completion') AND threshold IS NOT NULL
                             AND score IS NOT NULL THEN
                   len(list_filter(from_json(breakdown->'tasks', '["JSON"]'),
                                   lambda t: coalesce(TRY_CAST(t->>'alignment_score' AS DOUBLE),
                                                        TRY_CAST(t->>'score' AS DOUBLE)) < threshold)) > 0
                   END AS failed_task FROM w)
        GROUP BY metric""").fetchall()
    out = {}
    for (metric, judged, wsum, w2, wpass, scored, sw, sw2, swx, swxx, cost, threshold, tw, tw2,
         tfail) in rows:
        ess = wsum * wsum / w2 if wsum else 0.0
        rate = (wpass or 0.0) / wsum if wsum else None
        ess_s = sw * sw / sw2 if sw else 0.0
        mean = swx / sw if sw else None
        variance = None
        if mean is not None and ess_s > 1:
            variance = max(0.0, swxx / sw - mean * mean) * ess_s / (ess_s - 1)
        ess_t = tw * tw / tw2 if tw else 0.0
        out[metric] = {"judged": judged, "effective_n": ess, "passes": (rate or 0.0) * ess, "rate": rate,
                       "scored": scored, "effective_scored": ess_s, "mean": mean, "variance": variance,
                       "judge_cost_usd": cost, "threshold": threshold, "task_judged": ess_t,
                       "failed_task": ((tfail or 0.0) / tw if tw else 0.0) * ess_t}
    return out


def _tools(con: duckdb.DuckDBPyConnection, name: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Per server, kind and name: calls, MCP errors, schema-invalid calls, and the judge's per-task decisions on
    the tasks that called it (primitive choice and arguments under the metric's threshold)."""
    rows = con.execute(f"""
        WITH calls AS (
            SELECT m.* FROM mcp_calls m JOIN {name} k ON k.conversation_id = m.conversation_id
                                                     AND k.version = m.conversation_version),
        judged AS (
            SELECT s.conversation_id, s.conversation_version, (t.value->>'task_index')::INTEGER AS task,
                   TRY_CAST(t.value->>'primitive_score' AS DOUBLE) < coalesce(s.threshold, 0.5) AS wrong_primitive,
                   TRY_CAST(t.value->>'argument_score' AS DOUBLE) < coalesce(s.threshold, 0.5) AS wrong_arguments
            FROM latest_scores s JOIN {name} k ON k.conversation_id = s.conversation_id
                                              AND k.version = s.conversation_version,
                 json_each(s.breakdown, '$.tasks') t
            WHERE s.metric = 'mcp_use')
        SELECT coalesce(c.server, '-'), c.kind, c.name, count(*) AS calls,
               count(*) FILTER (WHERE c.is_error) AS errors,
               count(*) FILTER (WHERE json_array_length(c.violations) > 0) AS invalid,
               count(j.task) AS judged,
               count(*) FILTER (WHERE j.wrong_primitive) AS wrong_primitive,
               count(*) FILTER (WHERE j.wrong_arguments) AS wrong_arguments
        FROM calls c LEFT JOIN judged j ON j.conversation_id = c.conversation_id
                                        AND j.conversation_version = c.conversation_version AND j.task = c.task
        GROUP BY ALL""").fetchall()
    return {(r[0], r[1], r[2]): {"calls": r[3], "errors": r[4], "invalid": r[5], "judged_calls": r[6],
                                 "wrong_primitive": r[7], "wrong_arguments": r[8]} for r in rows}


def _per_conversation(con: duckdb.DuckDBPyConnection, name: str) -> dict[str, Any]:
    """Time, the judge's cost and the agent's own tokens and cost per conversation (the agent's from its spans'
    usage attributes, priced by the model's list price; a conversation with an unpriced model is left out of the
    cost, and `agent_cost_conversations` says how many had one)."""
    [(n, duration, judge_cost)] = con.execute(f"""
        SELECT count(*), avg((k.last_span_ns - k.first_span_ns) / 1e9),
               sum((SELECT sum(s.evaluation_cost) FROM latest_scores s WHERE s.conversation_id = k.conversation_id
                                                         AND s.conversation_version = k.version)) / count(*)
        FROM {name} k""").fetchall()
    tokens_in = tokens_out = with_usage = priced = 0
    cost = 0.0
    for (usage,) in con.execute(f"SELECT agent_usage FROM {name} WHERE agent_usage IS NOT NULL").fetchall():
        models = json.loads(usage)
        with_usage += 1
        tokens_in += sum(t[0] for t in models.values())
        tokens_out += sum(t[1] for t in models.values())
        prices = [known_price(model) for model in models]
        if all(p is not None for p in prices):
            priced += 1
            cost += sum(p.cost(t[0], t[1], 0) for p, t in zip(prices, models.values(), strict=True))  # type: ignore[union-attr]
    return {"conversations": n, "mean_duration_s": duration, "judge_cost_usd": judge_cost,
            "agent_input_tokens": tokens_in / with_usage if with_usage else None,
            "agent_output_tokens": tokens_out / with_usage if with_usage else None,
            "agent_cost_usd": cost / priced if priced else None, "agent_cost_conversations": priced,
            "agent_usage_conversations": with_usage}


def _examples(con: duckdb.DuckDBPyConnection, name: str, metric: str, tool: tuple[str, str, str], passed: bool
              ) -> list[str]:
    """Conversations of the cohort that called the tool and passed (or failed) the metric."""
    return [r[0] for r in con.execute(f"""
        SELECT DISTINCT m.conversation_id FROM mcp_calls m
        JOIN {name} k ON k.conversation_id = m.conversation_id AND k.version = m.conversation_version
        JOIN latest_scores s ON s.conversation_id = k.conversation_id AND s.conversation_version = k.version
        WHERE coalesce(m.server, '-') = ? AND m.kind = ? AND m.name = ? AND s.metric = ? AND s.success = ?
        ORDER BY 1 LIMIT {EXAMPLES}""", [*tool, metric, passed]).fetchall()]


def _rate(part: float, whole: float) -> dict[str, Any]:
    w = wilson(part, whole)
    return {"value": w.value, "low": w.low, "high": w.high, "n": whole}


def compare(con: duckdb.DuckDBPyConnection, a: Cohort, b: Cohort, level: float = 0.95) -> dict[str, Any]:
    """Every figure of A against B (B minus A), with intervals at `level` and Holm-adjusted p-values over all
    the metric and tool differences shown."""
    n_a, n_b = _cohort_table(con, "cohort_a", a), _cohort_table(con, "cohort_b", b)
    metrics_a, metrics_b = _metrics(con, "cohort_a"), _metrics(con, "cohort_b")
    p_values: list[float | None] = []
    metrics = []
    for metric in sorted(set(metrics_a) | set(metrics_b)):
        ma, mb = metrics_a.get(metric, {}), metrics_b.get(metric, {})
        judged_a, judged_b = ma.get("effective_n", 0), mb.get("effective_n", 0)
        passes_a, passes_b = ma.get("passes", 0), mb.get("passes", 0)
        moments_a = Moments(ma.get("effective_scored", 0), ma.get("mean"), ma.get("variance"))
        moments_b = Moments(mb.get("effective_scored", 0), mb.get("mean"), mb.get("variance"))
        diff = rate_difference(passes_a, judged_a, passes_b, judged_b, level)
        mean_diff, mean_p = mean_difference(moments_a, moments_b, level)
        rate_p = rate_p_value(passes_a, judged_a, passes_b, judged_b)
        p_values += [rate_p, mean_p]
        metrics.append({
            "metric": metric,
            "a": {"pass_rate": {**_rate(passes_a, judged_a), "n": ma.get("judged", 0), "effective_n": judged_a},
                  "mean_score": vars(mean_interval(moments_a, level)), "scored": ma.get("scored", 0),
                  "judge_cost_usd": ma.get("judge_cost_usd"),
                  "failed_task_rate": _rate(ma.get("failed_task", 0), ma.get("task_judged", 0))},
            "b": {"pass_rate": {**_rate(passes_b, judged_b), "n": mb.get("judged", 0), "effective_n": judged_b},
                  "mean_score": vars(mean_interval(moments_b, level)), "scored": mb.get("scored", 0),
                  "judge_cost_usd": mb.get("judge_cost_usd"),
                  "failed_task_rate": _rate(mb.get("failed_task", 0), mb.get("task_judged", 0))},
            "pass_rate_difference": {**vars(diff), "p_value": rate_p},
            "mean_score_difference": {**vars(mean_diff), "p_value": mean_p},
        })
    tools_a, tools_b = _tools(con, "cohort_a"), _tools(con, "cohort_b")
    tools = []
    shown = sorted(set(tools_a) | set(tools_b), key=lambda k: -(tools_a.get(k, {}).get("calls", 0)
                                                               + tools_b.get(k, {}).get("calls", 0)))[:MAX_TOOLS]
    for key in shown:
        ta, tb = tools_a.get(key, {}), tools_b.get(key, {})
        row: dict[str, Any] = {"server": key[0], "kind": key[1], "name": key[2], "a": {}, "b": {}}
        for side, t in (("a", ta), ("b", tb)):
            calls = t.get("calls", 0)
            row[side] = {"calls": calls, "error_rate": _rate(t.get("errors", 0), calls),
                         "invalid_rate": _rate(t.get("invalid", 0), calls),
                         "wrong_arguments_rate": _rate(t.get("wrong_arguments", 0), t.get("judged_calls", 0)),
                         "wrong_primitive_rate": _rate(t.get("wrong_primitive", 0), t.get("judged_calls", 0))}
        for what, count in (("error_rate", "errors"), ("invalid_rate", "invalid")):
            d = rate_difference(ta.get(count, 0), ta.get("calls", 0), tb.get(count, 0), tb.get("calls", 0), level)
            p = rate_p_value(ta.get(count, 0), ta.get("calls", 0), tb.get(count, 0), tb.get("calls", 0))
            row[f"{what}_difference"] = {**vars(d), "p_value": p}
            p_values.append(p)
        tools.append(row)
    adjusted = iter(holm(p_values))
    for m in metrics:
        m["pass_rate_difference"]["p_holm"] = next(adjusted)
        m["mean_score_difference"]["p_holm"] = next(adjusted)
    for t in tools:
        t["error_rate_difference"]["p_holm"] = next(adjusted)
        t["invalid_rate_difference"]["p_holm"] = next(adjusted)
    for m in metrics:  # where B fails that A passed: the tool whose failure share rose most, with examples
        m["examples"] = _worst_tool_examples(con, m["metric"], tools)
    return {"a": {"cohort": a.spec, **_per_conversation(con, "cohort_a")},
            "b": {"cohort": b.spec, **_per_conversation(con, "cohort_b")},
            "conversations": {"a": n_a, "b": n_b}, "level": level, "metrics": metrics, "tools": tools,
            "multiple_comparisons": "Holm step-down over every p-value shown (metrics and tools)"}


def _worst_tool_examples(con: duckdb.DuckDBPyConnection, metric: str, tools: list[dict[str, Any]]
                         ) -> dict[str, Any] | None:
    """The tool whose error or schema-invalid rate rose most from A to B, with conversations of B that called it
    and failed the metric, and conversations of A that called it and passed."""
    def rise(t: dict[str, Any]) -> float:
        return max((t[f"{w}_difference"]["value"] or 0.0) for w in ("error_rate", "invalid_rate"))

    candidates = [t for t in tools if t["b"]["calls"] and rise(t) > 0]
    if not candidates:
        return None
    worst = max(candidates, key=rise)
    key = (worst["server"], worst["kind"], worst["name"])
    return {"server": key[0], "kind": key[1], "name": key[2],
            "b_failing": _examples(con, "cohort_b", metric, key, False),
            "a_passing": _examples(con, "cohort_a", metric, key, True)}


def canary(con: duckdb.DuckDBPyConnection, baseline: Cohort, candidate: Cohort, metric: str, margin: float,
           alpha: float = 0.05) -> dict[str, Any]:
    """The canary gate on one metric's pass rate (see cohort_stats.gate)."""
    if metric not in METRIC_IDS:
        raise CohortError(f"the gate needs a metric of {', '.join(METRIC_IDS)}, not {metric!r}")
    if not (0 < margin < 1 and 0 < alpha <= 0.5):
        raise CohortError("the gate takes a margin between 0 and 1 and a confidence in [0.5, 1)")
    _cohort_table(con, "cohort_a", baseline)
    _cohort_table(con, "cohort_b", candidate)
    a, b = _metrics(con, "cohort_a").get(metric, {}), _metrics(con, "cohort_b").get(metric, {})
    decision = gate(a.get("passes", 0), a.get("effective_n", 0), b.get("passes", 0), b.get("effective_n", 0),
                    margin, alpha)
    return {"metric": metric, "margin": margin, "confidence": 1 - alpha, "baseline": baseline.spec,
            "candidate": candidate.spec, "baseline_n": a.get("judged", 0), "candidate_n": b.get("judged", 0),
            "baseline_effective_n": a.get("effective_n"), "candidate_effective_n": b.get("effective_n"),
            "baseline_pass_rate": a.get("rate"), "candidate_pass_rate": b.get("rate"), **vars(decision)}

