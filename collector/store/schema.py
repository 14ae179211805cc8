"""The database schema, as numbered migrations applied in order at start-up.

Tables: `span_records` (ingest) with `span_resources` and `span_scopes` (each resource and scope once), joined
back as the view `spans`; `conversations` (one row per version of a rebuilt conversation), `eval_jobs`
(durable scoring work) and `scores`; views `latest_scores` and `daily_scores` for history queries;
`assembled_traces` remembers when each trace was last assembled, so a restart re-queues exactly the rest (change it,
and `conversations`, only through `store/assembled_index.AssembledIndex.write`, which keeps the index beside the file
in step).
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import pyarrow as pa

from tracejudge.collector.store.span_tables import resource_id, scope_id


def history_views(scores: str, partition: str, temporary: bool = False, weighted: bool = True) -> str:
    """`latest_scores` and `daily_scores` over a scores table; `partition` adds columns that keep two
    replicas' copies of one conversation apart (e.g. "replica, "). daily_scores' mean and pass rate are Hajek
    estimates: each score weighs 1 / the probability its conversation had of being scored (1 where not recorded),
    with Kish's effective sample size; p10 and p50 are of the scored sample."""
    temp = "TEMP " if temporary else ""
    weight = "1.0 / coalesce(nullif(inclusion_probability, 0), 1.0)" if weighted else "1.0"  # before schema 19
    return f"""
    CREATE OR REPLACE {temp}VIEW latest_scores AS
        SELECT * FROM {scores}
        QUALIFY row_number() OVER (PARTITION BY {partition}conversation_id, metric
                                   ORDER BY conversation_version DESC, scored_at DESC) = 1;
    CREATE OR REPLACE {temp}VIEW daily_scores AS
        SELECT CAST(timezone('UTC', scored_at) AS DATE) AS day, metric, service_name,
               count(*) AS conversations, sum(w * score) / sum(w) AS mean_score,
               quantile_cont(score, 0.1) AS p10, quantile_cont(score, 0.5) AS p50,
               sum(w * CASE WHEN success THEN 1.0 WHEN NOT success THEN 0.0 END)
                   / sum(CASE WHEN success IS NOT NULL THEN w END) AS pass_rate,
               sum(evaluation_cost) AS cost_usd, sum(w) * sum(w) / sum(w * w) AS effective_n
        FROM (SELECT *, {weight} AS w FROM latest_scores)
        WHERE score IS NOT NULL
        GROUP BY ALL;
    """


# One row per MCP call of the latest version of each conversation, with the server that advertises it and
# what mcp_call_validity found wrong with it (its latest score's breakdown), for "which tool fails" queries.
def mcp_calls_view(temporary: bool = False) -> str:
    """The `mcp_calls` view; temporary over several replicas' files or the lake (conversation ids are unique
    across replicas when each conversation is routed to one replica, as the README asks)."""
    return MCP_CALLS_VIEW.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW") if temporary \
        else MCP_CALLS_VIEW


MCP_CALLS_VIEW = """
CREATE OR REPLACE VIEW mcp_calls AS
WITH latest AS (
    SELECT * FROM conversations
    QUALIFY row_number() OVER (PARTITION BY conversation_id ORDER BY version DESC) = 1),
turns AS (
    SELECT l.conversation_id, l.version, l.service_name, l.agent_name, l.assembled_at, l.test_case,
           t.key::INTEGER AS turn, t.value AS turn_json,
           sum(CASE WHEN t.value->>'role' = 'user' THEN 1 ELSE 0 END)
               OVER (PARTITION BY l.conversation_id ORDER BY t.key::INTEGER) - 1 AS task
    FROM latest l, json_each(l.test_case, '$.turns') t),
calls AS (
    SELECT tr.*, k.kind, c.key::INTEGER AS call_index, c.value AS call
    FROM turns tr,
         (VALUES ('tool', 'mcp_tools_called'), ('resource', 'mcp_resources_called'),
                 ('prompt', 'mcp_prompts_called')) k(kind, field),
         json_each(tr.turn_json, '$.' || k.field) c),
servers AS (
    SELECT l.conversation_id, s.value->>'server_name' AS server, tool.value->>'name' AS tool
    FROM latest l, json_each(l.test_case, '$.mcp_servers') s, json_each(s.value, '$.available_tools') tool),
validity AS (
    SELECT v.conversation_id, v.conversation_version, (c.value->>'turn')::INTEGER AS turn, c.value->>'kind' AS kind,
           c.value->>'name' AS name, c.value->'violations' AS violations,
           row_number() OVER (PARTITION BY v.conversation_id, c.value->>'turn', c.value->>'kind', c.value->>'name'
                              ORDER BY c.key::INTEGER) - 1 AS nth
    FROM latest_scores v, json_each(v.breakdown, '$.calls') c
    WHERE v.metric = 'mcp_call_validity'),
numbered AS (
    SELECT calls.*, coalesce(call->>'name', call->>'uri') AS name,
           row_number() OVER (PARTITION BY conversation_id, turn, kind, coalesce(call->>'name', call->>'uri')
                              ORDER BY call_index) - 1 AS nth
    FROM calls)
SELECT n.conversation_id, n.version AS conversation_version, n.turn, n.task, n.call_index, n.kind,
       (SELECT min(s.server) FROM servers s WHERE s.conversation_id = n.conversation_id AND s.tool = n.name
                                              AND n.kind = 'tool') AS server,
       n.name, n.call->'args' AS arguments,
       coalesce(TRY_CAST(n.call->'result'->>'isError' AS BOOLEAN), false) AS is_error,
       v.violations,
       TRY_CAST(n.turn_json->'metadata'->'call_spans'->n.kind->(n.call_index)->>'duration_ms' AS DOUBLE)
           AS duration_ms, n.service_name, n.agent_name, n.assembled_at
FROM numbered n
LEFT JOIN validity v ON v.conversation_id = n.conversation_id AND v.conversation_version = n.version
                    AND v.turn = n.turn AND v.kind = n.kind
                    AND v.name = n.name AND v.nth = n.nth;
"""


def task_views(temporary: bool = False) -> str:
    """`score_tasks` and `task_verdicts`; temporary over several replicas' files or the lake."""
    return TASK_VIEWS.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW") if temporary else TASK_VIEWS


# One row per task of each judged score (its breakdown's tasks): the request, its score and reason, who decided,
# the turns it spans and the MCP calls made for it. `task_verdicts` puts the three metrics side by side per task
# of each conversation's latest version, with the schema-invalid or failed calls call validity found in its turns,
# and one verdict: which of them went wrong.
TASK_VIEWS = """
CREATE OR REPLACE VIEW score_tasks AS
WITH t AS (
    SELECT s.conversation_id, s.conversation_version, s.metric, s.metric_config, s.eval_mode, s.judge_model,
           s.threshold, s.service_name, s.agent_name, s.scored_at, j.value AS task
    FROM scores s, json_each(s.breakdown, '$.tasks') j
    WHERE s.metric IN ('mcp_use', 'mcp_task_completion') AND s.score IS NOT NULL)
SELECT conversation_id, conversation_version, metric, metric_config, eval_mode, judge_model,
       (task->>'task_index')::INTEGER AS task_index, task->>'task' AS task_text,
       coalesce(TRY_CAST(task->>'alignment_score' AS DOUBLE), TRY_CAST(task->>'score' AS DOUBLE)) AS score,
       CASE WHEN threshold IS NOT NULL THEN coalesce(TRY_CAST(task->>'alignment_score' AS DOUBLE),
                                                     TRY_CAST(task->>'score' AS DOUBLE)) >= threshold END AS passed,
       coalesce(task->>'reason', concat_ws(' / ', task->>'primitive_reason', task->>'argument_reason')) AS reason,
       coalesce(task->>'decided_by', task->'primitive'->>'decided_by') AS decided_by,
       TRY_CAST(task->'turns'->>0 AS INTEGER) AS first_turn, TRY_CAST(task->'turns'->>1 AS INTEGER) AS last_turn,
       from_json(task->'mcp_calls', '["VARCHAR"]') AS mcp_calls, service_name, agent_name, scored_at
FROM t;
CREATE OR REPLACE VIEW task_verdicts AS
WITH latest AS (
    SELECT st.* FROM score_tasks st
    JOIN latest_scores l USING (conversation_id, conversation_version, metric, metric_config)),
invalid AS (
    SELECT v.conversation_id, v.conversation_version, TRY_CAST(c.value->>'turn' AS INTEGER) AS turn,
           (c.value->>'kind') || ' ' || (c.value->>'name') AS call
    FROM latest_scores v, json_each(v.breakdown, '$.calls') c
    WHERE v.metric = 'mcp_call_validity' AND json_array_length(c.value->'violations') > 0),
tasks AS (
    SELECT conversation_id, conversation_version, task_index, any_value(task_text) AS task,
           min(first_turn) AS first_turn, max(last_turn) AS last_turn,
           any_value(score) FILTER (WHERE metric = 'mcp_use') AS mcp_use,
           any_value(passed) FILTER (WHERE metric = 'mcp_use') AS mcp_use_passed,
           any_value(reason) FILTER (WHERE metric = 'mcp_use') AS mcp_use_reason,
           any_value(score) FILTER (WHERE metric = 'mcp_task_completion') AS task_completion,
           any_value(passed) FILTER (WHERE metric = 'mcp_task_completion') AS task_completion_passed,
           any_value(reason) FILTER (WHERE metric = 'mcp_task_completion') AS task_completion_reason,
           any_value(service_name) AS service_name, any_value(agent_name) AS agent_name
    FROM latest GROUP BY conversation_id, conversation_version, task_index),
judged AS (
    SELECT t.*,
           (SELECT list(i.call ORDER BY i.turn) FROM invalid i WHERE i.conversation_id = t.conversation_id
                AND i.conversation_version = t.conversation_version AND i.turn BETWEEN t.first_turn AND t.last_turn)
               AS invalid_calls
    FROM tasks t)
SELECT *,
       concat_ws(', ',
           CASE WHEN len(invalid_calls) > 0 THEN 'invalid or failed MCP call' END,
           CASE WHEN NOT mcp_use_passed THEN 'wrong MCP use' END,
           CASE WHEN NOT task_completion_passed THEN 'not completed' END) AS went_wrong,
       coalesce(len(invalid_calls), 0) = 0 AND mcp_use_passed IS NOT FALSE
           AND task_completion_passed IS NOT FALSE AS passed
FROM judged;
"""


_SPAN_COLUMNS = """
        trace_id VARCHAR NOT NULL,
        span_id VARCHAR NOT NULL,
        parent_span_id VARCHAR,
        name VARCHAR,
        kind TINYINT,
        start_ns BIGINT,
        end_ns BIGINT,
        status_code TINYINT,
        status_message VARCHAR"""
SPANS_COLUMNS = _SPAN_COLUMNS + """,
        service_name VARCHAR,
        scope_name VARCHAR,
        scope_version VARCHAR,
        attributes JSON,
        resource_attributes JSON,
        events JSON,
        links JSON,
        conversation_key VARCHAR,
        conversation_key_source VARCHAR,
        received_at TIMESTAMPTZ NOT NULL"""


# Since schema 13 a span's resource and scope are stored once per content (collector/store/span_tables.py); the
# view `spans` has the columns the table had, so users' SQL and the archives keep working.
SPAN_RECORDS_COLUMNS = _SPAN_COLUMNS + """,
        resource_id BIGINT NOT NULL,
        scope_id BIGINT NOT NULL,
        attributes JSON,
        events JSON,
        links JSON,
        conversation_key VARCHAR,
        conversation_key_source VARCHAR,
        received_at TIMESTAMPTZ NOT NULL"""
SPAN_DICTIONARIES_DDL = """
    CREATE TABLE IF NOT EXISTS span_resources (
        resource_id BIGINT PRIMARY KEY,
        service_name VARCHAR,
        attributes JSON NOT NULL
    );
    CREATE TABLE IF NOT EXISTS span_scopes (
        scope_id BIGINT PRIMARY KEY,
        name VARCHAR NOT NULL,
        version VARCHAR NOT NULL
    );
"""
SPANS_VIEW = """
    CREATE OR REPLACE VIEW spans AS
    SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns, s.status_code,
           s.status_message, r.service_name, c.name AS scope_name, c.version AS scope_version, s.attributes,
           r.attributes AS resource_attributes, s.events, s.links, s.conversation_key, s.conversation_key_source,
           s.received_at
    FROM span_records s LEFT JOIN span_resources r ON r.resource_id = s.resource_id
         LEFT JOIN span_scopes c ON c.scope_id = s.scope_id;
"""


FEEDBACK_VIEW = """
    CREATE OR REPLACE VIEW feedback AS
    WITH results AS (
        SELECT s.trace_id, s.span_id, s.scope_name, s.received_at, e.value AS r
        FROM spans s, json_each(s.events) e
        WHERE contains(CAST(s.events AS VARCHAR), 'gen_ai.evaluation.result')
          AND (e.value->>'$.name') = 'gen_ai.evaluation.result')
    SELECT coalesce(r->>'$.attributes."gen_ai.conversation.id"', a.conversation_id) AS conversation_id,
           r->>'$.attributes."gen_ai.evaluation.name"' AS name,
           TRY_CAST(r->>'$.attributes."gen_ai.evaluation.score.value"' AS DOUBLE) AS value,
           r->>'$.attributes."gen_ai.evaluation.score.label"' AS label,
           r->>'$.attributes."gen_ai.evaluation.explanation"' AS comment,
           CASE WHEN r->>'$.attributes."tracejudge.feedback.source"' = 'api' THEN 'api'
                WHEN results.scope_name = 'tracejudge.log_event' THEN 'log_record' ELSE 'span_event' END AS source,
           make_timestamp(TRY_CAST(r->>'$.time_ns' AS BIGINT) // 1000) AS at,
           results.trace_id, results.span_id, results.received_at
    FROM results LEFT JOIN assembled_traces a ON a.trace_id = results.trace_id;
"""


def _store_resources_and_scopes_once(con: duckdb.DuckDBPyConnection) -> None:
    """Schema 13: the spans table becomes `span_records` plus one row per distinct resource and scope, ids computed
    as ingest computes them (so later spans of the same resource share its row), and the view `spans`."""
    con.execute(SPAN_DICTIONARIES_DDL)
    resources = con.execute("SELECT CAST(coalesce(resource_attributes, '{}') AS VARCHAR), any_value(service_name) "
                            "FROM spans GROUP BY 1").fetchall()
    scopes = con.execute("SELECT DISTINCT coalesce(scope_name, ''), coalesce(scope_version, '') FROM spans").fetchall()
    con.register("migrated_resources", pa.table({
        "resource_id": pa.array([resource_id(text.encode()) for text, _ in resources], pa.int64()),
        "service_name": pa.array([service for _, service in resources], pa.string()),
        "text": pa.array([text for text, _ in resources], pa.string())}))
    con.register("migrated_scopes", pa.table({
        "scope_id": pa.array([scope_id(name.encode(), version.encode()) for name, version in scopes], pa.int64()),
        "name": pa.array([name for name, _ in scopes], pa.string()),
        "version": pa.array([version for _, version in scopes], pa.string())}))
    con.execute(f"""
    INSERT INTO span_resources SELECT resource_id, service_name, text FROM migrated_resources;
    INSERT INTO span_scopes SELECT scope_id, name, version FROM migrated_scopes;
    CREATE TABLE span_records ({SPAN_RECORDS_COLUMNS}
    );
    INSERT INTO span_records
    SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns, s.status_code,
           s.status_message, r.resource_id, c.scope_id, s.attributes, s.events, s.links, s.conversation_key,
           s.conversation_key_source, s.received_at
    FROM spans s
    JOIN migrated_resources r ON r.text = CAST(coalesce(s.resource_attributes, '{{}}') AS VARCHAR)
    JOIN migrated_scopes c ON c.name = coalesce(s.scope_name, '') AND c.version = coalesce(s.scope_version, '')
    ORDER BY s.received_at;  -- reads skip row groups by received_at: keep them in arrival order
    DROP TABLE spans;
    """ + SPANS_VIEW)
    con.unregister("migrated_resources")
    con.unregister("migrated_scopes")


def summary_tables_ddl(temporary: bool = False) -> str:
    """The web UI's summary tables; temporary when built over a read-only history (replicas' files, the lake)."""
    create = "CREATE TEMP TABLE" if temporary else "CREATE TABLE IF NOT EXISTS"
    return """
    {create} conversation_summary (
        conversation_id VARCHAR PRIMARY KEY,
        version INTEGER NOT NULL,
        service_name VARCHAR,
        agent_name VARCHAR,
        turns INTEGER,
        mcp_calls INTEGER,
        mcp_errors INTEGER,
        assembled_at TIMESTAMPTZ NOT NULL,
        summary_note VARCHAR
    );
    {create} call_summary (
        conversation_id VARCHAR NOT NULL,
        version INTEGER NOT NULL,
        turn INTEGER,
        call_index INTEGER,
        kind VARCHAR,
        server VARCHAR,
        name VARCHAR,
        is_error BOOLEAN,
        assembled_at TIMESTAMPTZ NOT NULL,
        duration_ms DOUBLE
    );
    {create} score_summary (
        conversation_id VARCHAR NOT NULL,
        metric VARCHAR NOT NULL,
        conversation_version INTEGER NOT NULL,
        score DOUBLE,
        success BOOLEAN,
        evaluation_cost DOUBLE,
        service_name VARCHAR,
        agent_name VARCHAR,
        invalid_calls VARCHAR[],
        scored_at TIMESTAMPTZ NOT NULL,
        weight DOUBLE,
        tasks INTEGER,
        tasks_failed INTEGER,
        PRIMARY KEY (conversation_id, metric)
    );
    """.replace("{create}", create)


SCHEMA_VERSION = 29
# SQL, or a function of the connection where the migration needs Python (ids computed as ingest computes them)
MIGRATIONS: dict[int, str | Callable[[duckdb.DuckDBPyConnection], None]] = {
    1: f"""
    CREATE TABLE IF NOT EXISTS spans ({SPANS_COLUMNS},
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
    """ + history_views("scores", "", weighted=False) + """
    """,
    3: """
    CREATE TABLE IF NOT EXISTS assembled_traces (
        trace_id VARCHAR PRIMARY KEY,
        conversation_id VARCHAR NOT NULL,
        assembled_at TIMESTAMPTZ NOT NULL
    );
    """,
    4: MCP_CALLS_VIEW,
    # which scores went out as OTLP evaluation events ([export]): written after the backend acknowledged them
    5: """
    CREATE TABLE IF NOT EXISTS score_exports (
        conversation_id VARCHAR NOT NULL,
        conversation_version INTEGER NOT NULL,
        metric VARCHAR NOT NULL,
        metric_config VARCHAR NOT NULL,
        exported_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (conversation_id, conversation_version, metric, metric_config)
    );
    """,
    # what the web UI reads, kept current from new rows only (collector.pipeline.summary_tables): the latest
    # version of each conversation, its MCP calls, and the latest score per conversation and metric
    6: summary_tables_ddl(),
    # spans without a primary key: its index made every append slower as the table grew (BENCHMARKS.md);
    # redelivered requests are recognised by their digest instead (collector/store/span_store.py)
    7: f"""
    CREATE TABLE spans_unkeyed ({SPANS_COLUMNS}
    );
    INSERT INTO spans_unkeyed SELECT * FROM spans;
    DROP TABLE spans;
    ALTER TABLE spans_unkeyed RENAME TO spans;
    CREATE TABLE IF NOT EXISTS ingest_requests (
        digest BLOB PRIMARY KEY,
        received_at TIMESTAMPTZ NOT NULL
    );
    """,
    # which conversation content each judged score was measured on, so identical content (a new version that
    # changed nothing judged, a replay) reuses the score instead of asking the judge again
    # (collector/pipeline/scoring_stage.py)
    8: """
    CREATE TABLE IF NOT EXISTS judged_content (
        content_digest VARCHAR NOT NULL,
        metric VARCHAR NOT NULL,
        metric_config VARCHAR NOT NULL,
        conversation_id VARCHAR NOT NULL,
        conversation_version INTEGER NOT NULL,
        PRIMARY KEY (content_digest, metric, metric_config)
    );
    """,
    # judge requests sent through the OpenAI Batch API ([scoring] batch): which batch holds each request and
    # its answer once downloaded, so a job retried after a restart waits on its batch instead of paying again
    9: """
    CREATE TABLE IF NOT EXISTS judge_batch_requests (
        request_digest VARCHAR PRIMARY KEY,
        batch_id VARCHAR NOT NULL,
        submitted_at TIMESTAMPTZ NOT NULL,
        answer_status INTEGER,
        answer JSON
    );
    """,
    # retention (collector/pipeline/retention.py): a span batch is journaled before it is archived and deleted,
    # so a restart finishes it exactly once; a conversation whose spans went is never re-assembled from the rest
    10: """
    CREATE TABLE IF NOT EXISTS retention_batches (
        batch_id VARCHAR PRIMARY KEY,
        snapshot_at TIMESTAMPTZ NOT NULL,
        conversation_ids VARCHAR[] NOT NULL,
        trace_ids VARCHAR[] NOT NULL
    );
    CREATE TABLE IF NOT EXISTS pruned_conversations (
        conversation_id VARCHAR PRIMARY KEY,
        pruned_at TIMESTAMPTZ NOT NULL
    );
    """,
    # the request digests without their primary key: INSERT OR REPLACE into the index cost the writer about 2.5 ms
    # of CPU per commit; the store checks digests in memory and takes the latest row per digest when it reloads
    11: """
    CREATE TABLE ingest_requests_unkeyed (
        digest BLOB NOT NULL,
        received_at TIMESTAMPTZ NOT NULL
    );
    INSERT INTO ingest_requests_unkeyed SELECT digest, received_at FROM ingest_requests;
    DROP TABLE ingest_requests;
    ALTER TABLE ingest_requests_unkeyed RENAME TO ingest_requests;
    """,
    # each assembled trace's oldest span: re-reading a conversation's earlier traces starts there, so DuckDB skips
    # the row groups received before it (NULL for traces assembled before this version: read from the start)
    12: """
    ALTER TABLE assembled_traces ADD COLUMN first_received_at TIMESTAMPTZ;
    """,
    # each resource and scope stored once, not on every span's row: a request of 1,000 spans under a 2 MB scope
    # made 2 GB of rows (collector/store/span_tables.py)
    13: _store_resources_and_scopes_once,
    # why a conversation's calls are not in call_summary (too large to summarise within the buffer pool)
    14: """
    ALTER TABLE conversation_summary ADD COLUMN IF NOT EXISTS summary_note VARCHAR;
    """,
    # traces of MCP calls made outside any agent run (no conversation key of their own), joined to the conversation
    # that shares their MCP session: a conversation key the assembler gave them, weaker than any the spans carry
    15: """
    CREATE TABLE IF NOT EXISTS trace_attachments (
        trace_id VARCHAR PRIMARY KEY,
        conversation_id VARCHAR NOT NULL,
        attached_at TIMESTAMPTZ NOT NULL
    );
    """,
    # feedback on conversations (end users' thumbs, anyone's verdict): every gen_ai.evaluation.result event the
    # spans hold, as a span event, as a log record on a span, or as a log record or POST /api/feedback naming the
    # conversation alone; its conversation is the one it names, else the one its trace was assembled into
    16: FEEDBACK_VIEW,
    # people reviewing the judge: each verdict with the score it judged (as it was), and agreement per metric,
    # configuration and judge model, each review weighted by 1 / its queue-sampling probability
    17: """
    CREATE TABLE IF NOT EXISTS reviews (
        review_id VARCHAR PRIMARY KEY,
        conversation_id VARCHAR NOT NULL,
        conversation_version INTEGER NOT NULL,
        metric VARCHAR NOT NULL,
        metric_config VARCHAR NOT NULL,
        reviewer VARCHAR NOT NULL,
        verdict VARCHAR NOT NULL,
        human_pass BOOLEAN NOT NULL,
        human_score DOUBLE,
        note VARCHAR,
        queue_rule VARCHAR NOT NULL,
        sampling_probability DOUBLE NOT NULL,
        judge_score DOUBLE,
        judge_success BOOLEAN NOT NULL,
        judge_model VARCHAR,
        reviewed_at TIMESTAMPTZ NOT NULL
    );
    CREATE OR REPLACE VIEW judge_agreement AS
    WITH weighted AS (
        SELECT metric, metric_config, judge_model, reviewer, 1.0 / sampling_probability AS w,
               CAST(judge_success AS INTEGER) AS j, CAST(human_pass AS INTEGER) AS h FROM reviews),
    sums AS (
        SELECT metric, metric_config, judge_model, count(*) AS reviews, count(DISTINCT reviewer) AS reviewers,
               sum(w * CAST(j = h AS INTEGER)) / sum(w) AS po, sum(w * j) / sum(w) AS pj, sum(w * h) / sum(w) AS ph
        FROM weighted GROUP BY ALL)
    SELECT metric, metric_config, judge_model, reviews, reviewers, po AS accuracy,
           CASE WHEN pj * ph + (1 - pj) * (1 - ph) < 1
                THEN (po - (pj * ph + (1 - pj) * (1 - ph))) / (1 - (pj * ph + (1 - pj) * (1 - ph))) END AS kappa
    FROM sums;
    """,
    # review queues: the items the rules chose (with the rule and its sampling probability), the rules as last
    # edited in the UI, how far the queue has read scores and feedback, and a review's per-task and per-call labels
    18: """
    ALTER TABLE reviews ADD COLUMN labels JSON;
    CREATE TABLE IF NOT EXISTS review_queue (
        conversation_id VARCHAR NOT NULL,
        conversation_version INTEGER NOT NULL,
        queue_rule VARCHAR NOT NULL,
        sampling_probability DOUBLE NOT NULL,
        enqueued_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (conversation_id, conversation_version)
    );
    CREATE TABLE IF NOT EXISTS review_rules (
        rules JSON NOT NULL,
        edited_by VARCHAR NOT NULL,
        edited_at TIMESTAMPTZ NOT NULL
    );
    CREATE TABLE IF NOT EXISTS review_queue_progress (
        scores_read_to TIMESTAMPTZ,
        feedback_read_to TIMESTAMPTZ
    );
    CREATE TABLE IF NOT EXISTS review_thumbs_down (
        conversation_id VARCHAR PRIMARY KEY,
        received_at TIMESTAMPTZ NOT NULL
    );
    CREATE OR REPLACE VIEW judge_agreement AS
    WITH weighted AS (
        SELECT metric, metric_config, judge_model, reviewer, 1.0 / sampling_probability AS w,
               CAST(judge_success AS INTEGER) AS j, CAST(human_pass AS INTEGER) AS h,
               abs(judge_score - human_score) AS d FROM reviews),
    sums AS (
        SELECT metric, metric_config, judge_model, count(*) AS reviews, count(DISTINCT reviewer) AS reviewers,
               sum(w * CAST(j = h AS INTEGER)) / sum(w) AS po, sum(w * j) / sum(w) AS pj, sum(w * h) / sum(w) AS ph,
               sum(w * d) / sum(w) FILTER (WHERE d IS NOT NULL) AS mean_abs_diff
        FROM weighted GROUP BY ALL)
    SELECT metric, metric_config, judge_model, reviews, reviewers, po AS accuracy,
           CASE WHEN pj * ph + (1 - pj) * (1 - ph) < 1
                THEN (po - (pj * ph + (1 - pj) * (1 - ph))) / (1 - (pj * ph + (1 - pj) * (1 - ph))) END AS kappa,
           mean_abs_diff
    FROM sums;
    """,
    # cohorts: the values each conversation's spans and resources hold for the recorded attribute keys
    # ([cohorts] attributes: service.version, gen_ai.request.model, ...), so comparing cohorts scans no spans
    # and the probability each judged metric had of scoring the conversation ([sampling] rate and rules), carried
    # into its scores, so pass rates and means weigh the sample back to all traffic
    19: """
    ALTER TABLE conversations ADD COLUMN attributes JSON;
    ALTER TABLE conversations ADD COLUMN inclusion JSON;
    ALTER TABLE scores ADD COLUMN inclusion_probability DOUBLE;
    """ + history_views("scores", ""),
    # the agent's own LLM tokens per model, from its spans' GenAI usage attributes: cohorts compare them and their cost
    20: """
    ALTER TABLE conversations ADD COLUMN agent_usage JSON;
    """,
    # conversations seen per value of a new_cohort sampling rule's key ([sampling] rules), for "the first N"
    21: """
    CREATE TABLE IF NOT EXISTS cohort_counts (
        key VARCHAR NOT NULL,
        value VARCHAR NOT NULL,
        conversations BIGINT NOT NULL,
        PRIMARY KEY (key, value)
    );
    """,
    # the UI's latest scores carry their weight (1 / inclusion probability): the overview's rates are Hajek's too
    22: """
    ALTER TABLE score_summary ADD COLUMN IF NOT EXISTS weight DOUBLE;
    """,
    # when each cohort value was last seen: retention forgets values not seen within the conversations' window
    23: """
    ALTER TABLE cohort_counts ADD COLUMN last_seen_at TIMESTAMPTZ;
    UPDATE cohort_counts SET last_seen_at = now();
    """,
    # how long each MCP call took (the mapping records its spans): the tools page's latency percentiles
    24: """
    ALTER TABLE call_summary ADD COLUMN IF NOT EXISTS duration_ms DOUBLE;
    """,
    # what the judge was sent and answered for each score (after prompt reduction and redaction): the
    # conversation page shows it under the score, and users query it
    25: """
    CREATE TABLE IF NOT EXISTS judge_calls (
        conversation_id VARCHAR NOT NULL,
        conversation_version INTEGER NOT NULL,
        metric VARCHAR NOT NULL,
        metric_config VARCHAR NOT NULL,
        seq INTEGER NOT NULL,
        judge VARCHAR NOT NULL,
        request JSON,
        response VARCHAR,
        error VARCHAR,
        input_tokens BIGINT,
        output_tokens BIGINT,
        latency_ms DOUBLE,
        called_at TIMESTAMPTZ NOT NULL
    );
    """,
    # task-level verdicts: each judged score's tasks, and per task of the latest version what each metric said
    # (and the mcp_calls view again: its duration_ms comes from the calls' spans since schema 24)
    26: lambda con: con.execute(task_views() + MCP_CALLS_VIEW + """
    ALTER TABLE score_summary ADD COLUMN IF NOT EXISTS tasks INTEGER;
    ALTER TABLE score_summary ADD COLUMN IF NOT EXISTS tasks_failed INTEGER;
    """),
    # the assembled traces without their primary key: DuckDB rewrites a keyed table's whole index at every
    # checkpoint after inserts into it, and every commit (the exports' too) waits for the checkpoint; at 8 rows a
    # conversation this was the largest keyed table (`python bench/checkpoint_cost.py`). The assembler deletes a
    # trace's row before it writes the new one, in one transaction, so each trace still has one row
    27: """
    CREATE TABLE assembled_traces_unkeyed (
        trace_id VARCHAR NOT NULL,
        conversation_id VARCHAR NOT NULL,
        assembled_at TIMESTAMPTZ NOT NULL,
        first_received_at TIMESTAMPTZ
    );
    INSERT INTO assembled_traces_unkeyed SELECT trace_id, conversation_id, assembled_at, first_received_at
        FROM assembled_traces;
    DROP TABLE assembled_traces;
    ALTER TABLE assembled_traces_unkeyed RENAME TO assembled_traces;
    """,
    # the assembled traces indexed in SQLite beside the file (`store/assembled_index.py`): the generation every change
    # of assembled_traces bumps, so the index sees when it is behind, and when each row was written, so deleting a
    # trace's earlier row reads only the row groups written then
    28: """
    CREATE TABLE assembled_index (generation BIGINT NOT NULL);
    INSERT INTO assembled_index VALUES (0);
    ALTER TABLE assembled_traces ADD COLUMN marked_at TIMESTAMPTZ;
    """,
    # the traces of spans committed from the ingest journal (a crash's leftovers, or files parked on a full disk), with
    # the oldest receipt of those spans, written in their commit: such a span may have been received before its
    # trace's last assembly, so only this row makes the assembler take the trace up again; deleted once it has
    29: """
    CREATE TABLE journal_replays (trace_id VARCHAR NOT NULL, received_at TIMESTAMPTZ NOT NULL);
    """,
}


# columns later schemas added, which a file or lake written by an older collector lacks
LATER_COLUMNS = {"scores": {"inclusion_probability": "DOUBLE"},
                 "conversations": {"attributes": "JSON", "inclusion": "JSON", "agent_usage": "JSON"}}


def union_view(con: duckdb.DuckDBPyConnection, table: str, source_sql: str) -> None:
    """TEMP VIEW `table` over `source_sql` (several replicas' files, the lake), with the columns later schemas
    added as NULL where no source has them, so the same queries run over old and new histories."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS {source_sql}")
    present = {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}
    missing = [f"NULL::{kind} AS {name}" for name, kind in LATER_COLUMNS.get(table, {}).items() if name not in present]
    if missing:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT *, {', '.join(missing)} FROM ({source_sql})")


def migrate(con: duckdb.DuckDBPyConnection, upto: int = SCHEMA_VERSION) -> int:
    """Bring the schema to `upto` (SCHEMA_VERSION; an older one makes the file an older collector left, for the
    migrations' tests); returns the version found before."""
    con.execute("CREATE TABLE IF NOT EXISTS tracejudge_schema (version INTEGER NOT NULL, applied_at TIMESTAMPTZ)")
    row = con.execute("SELECT max(version) FROM tracejudge_schema").fetchone()
    found = (row[0] if row else None) or 0
    for version in range(found + 1, upto + 1):
        con.execute("BEGIN TRANSACTION")
        migration = MIGRATIONS[version]
        if callable(migration):
            migration(con)
        else:
            con.execute(migration)
        con.execute("INSERT INTO tracejudge_schema VALUES (?, now())", [version])
        con.execute("COMMIT")
    return found
