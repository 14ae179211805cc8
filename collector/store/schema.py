"""The database schema, as numbered migrations applied in order at start-up.

Tables: `spans` (ingest), `conversations` (one row per version of a rebuilt conversation), `eval_jobs`
(durable scoring work) and `scores`; views `latest_scores` and `daily_scores` for history queries;
`assembled_traces` remembers when each trace was last assembled, so a restart re-queues exactly the rest.
"""

from __future__ import annotations

import duckdb


def history_views(scores: str, partition: str, temporary: bool = False) -> str:
    """`latest_scores` and `daily_scores` over a scores table; `partition` adds columns that keep two
    replicas' copies of one conversation apart (e.g. "replica, ")."""
    temp = "TEMP " if temporary else ""
    return f"""
    CREATE OR REPLACE {temp}VIEW latest_scores AS
        SELECT * FROM {scores}
        QUALIFY row_number() OVER (PARTITION BY {partition}conversation_id, metric
                                   ORDER BY conversation_version DESC, scored_at DESC) = 1;
    CREATE OR REPLACE {temp}VIEW daily_scores AS
        SELECT CAST(timezone('UTC', scored_at) AS DATE) AS day, metric, service_name,
               count(*) AS conversations, avg(score) AS mean_score,
               quantile_cont(score, 0.1) AS p10, quantile_cont(score, 0.5) AS p50,
               avg(CASE WHEN success THEN 1.0 WHEN NOT success THEN 0.0 END) AS pass_rate,
               sum(evaluation_cost) AS cost_usd
        FROM latest_scores WHERE score IS NOT NULL
        GROUP BY ALL;
    """


SCHEMA_VERSION = 3
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE IF NOT EXISTS spans (
        trace_id VARCHAR NOT NULL,
        span_id VARCHAR NOT NULL,
        parent_span_id VARCHAR,
        name VARCHAR,
        kind TINYINT,
        start_ns BIGINT,
        end_ns BIGINT,
        status_code TINYINT,
        status_message VARCHAR,
        service_name VARCHAR,
        scope_name VARCHAR,
        scope_version VARCHAR,
        attributes JSON,
        resource_attributes JSON,
        events JSON,
        links JSON,
        conversation_key VARCHAR,
        conversation_key_source VARCHAR,
        received_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (trace_id, span_id)
    );
    """,
    2: """
    CREATE TABLE IF NOT EXISTS conversations (
        conversation_id VARCHAR NOT NULL,
        version INTEGER NOT NULL,
        content_hash VARCHAR NOT NULL,
        status VARCHAR NOT NULL,
        key_source VARCHAR,
        service_name VARCHAR,
        agent_name VARCHAR,
        turns INTEGER,
        mcp_calls INTEGER,
        trace_ids VARCHAR[],
        first_span_ns BIGINT,
        last_span_ns BIGINT,
        test_case JSON,
        sample_value DOUBLE,
        sampled JSON,
        assembled_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (conversation_id, version)
    );
    CREATE SEQUENCE IF NOT EXISTS eval_job_ids;
    CREATE TABLE IF NOT EXISTS eval_jobs (
        job_id BIGINT PRIMARY KEY DEFAULT nextval('eval_job_ids'),
        conversation_id VARCHAR NOT NULL,
        conversation_version INTEGER NOT NULL,
        metric VARCHAR NOT NULL,
        metric_config VARCHAR NOT NULL,
        status VARCHAR NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        not_before TIMESTAMPTZ,
        lease_until TIMESTAMPTZ,
        last_error VARCHAR,
        created_at TIMESTAMPTZ NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL
    );
    CREATE TABLE IF NOT EXISTS scores (
        conversation_id VARCHAR NOT NULL,
        conversation_version INTEGER NOT NULL,
        metric VARCHAR NOT NULL,
        metric_config VARCHAR NOT NULL,
        eval_mode VARCHAR,
        score DOUBLE,
        success BOOLEAN,
        threshold DOUBLE,
        strict_mode BOOLEAN,
        reason VARCHAR,
        confidence DOUBLE,
        judge_model VARCHAR,
        system_one_model VARCHAR,
        evaluation_cost DOUBLE,
        input_tokens BIGINT,
        output_tokens BIGINT,
        judge_calls INTEGER,
        latency_ms DOUBLE,
        breakdown JSON,
        fallback_reason VARCHAR,
        error VARCHAR,
        service_name VARCHAR,
        agent_name VARCHAR,
        conversation_end_time TIMESTAMPTZ,
        scored_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (conversation_id, conversation_version, metric, metric_config)
    );
    """ + history_views("scores", "") + """
    """,
    3: """
    CREATE TABLE IF NOT EXISTS assembled_traces (
        trace_id VARCHAR PRIMARY KEY,
        conversation_id VARCHAR NOT NULL,
        assembled_at TIMESTAMPTZ NOT NULL
    );
    """,
}


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Bring the schema to SCHEMA_VERSION; returns the version found before."""
    con.execute("CREATE TABLE IF NOT EXISTS tracejudge_schema (version INTEGER NOT NULL, applied_at TIMESTAMPTZ)")
    row = con.execute("SELECT max(version) FROM tracejudge_schema").fetchone()
    found = (row[0] if row else None) or 0
    for version in range(found + 1, SCHEMA_VERSION + 1):
        con.execute("BEGIN TRANSACTION")
        con.execute(MIGRATIONS[version])
        con.execute("INSERT INTO tracejudge_schema VALUES (?, now())", [version])
        con.execute("COMMIT")
    return found
