"""Collector settings: embedded defaults < tracejudge.toml < environment < command-line flags.

Every setting has a TOML name (`[section] key`), and the common ones an environment variable and a
flag; an invalid value fails at start with its name and where it came from.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from tracejudge.collector.durations import parse_duration
from tracejudge.collector.sizes import parse_size
from tracejudge.errors import TracejudgeError
from tracejudge.mapping.otlp import SpanLimits
from tracejudge.mapping.redaction import BUILTIN_RULES, RedactionRuleError, Redactor

if TYPE_CHECKING:
    from tracejudge.judges.resolve import JudgeOptions
from tracejudge.metric_ids import METRIC_IDS

if TYPE_CHECKING:
    from tracejudge.collector.history.lake import LakeConfig

MiB = 1024 * 1024


def _loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost: reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _size_text(value: Any) -> Any:
    return parse_size(value) if isinstance(value, str) else value


Bytes = Annotated[int, BeforeValidator(_size_text)]  # a byte count, or a size like "48MB"


class ConfigError(TracejudgeError):
    """A setting is invalid; the message names it and where it came from."""


def _only_known(names: Any, known: Any, what: str) -> None:
    """ValueError listing the unknown names and the known ones."""
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown {what}(s) {', '.join(unknown)}; known: {', '.join(known)}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Section):
    host: str = Field("127.0.0.1", description="address the OTLP receivers bind to")
    admin_host: str = Field("127.0.0.1", description="address the admin API (/api/query, /report, /metrics) "
                            "binds to; anything but loopback needs a query_token")
    admin_allowed_hosts: list[str] = Field(
        [], description="host names the admin port answers to besides localhost and IP addresses (the name in "
        "the browser's address bar, like tracejudge.internal); any other Host is refused, so a DNS name an attacker "
        "points at this machine (DNS rebinding) cannot reach it")
    grpc_port: int = Field(4317, ge=0, le=65535, description="OTLP/gRPC port (0: any free port)")
    http_port: int = Field(4318, ge=0, le=65535, description="OTLP/HTTP port (0: any free port)")
    admin_port: int = Field(4319, ge=0, le=65535, description="admin HTTP port: /healthz /readyz /metrics")
    max_message_bytes: int = Field(16 * MiB, ge=1024, description="largest request accepted, after "
                                   "decompression (OTel SDKs send a few MiB at most)")
    max_inflight_bytes: int = Field(192 * MiB, ge=1024, description="request bytes being read or decoded at "
                                    "once, all receivers together; past it exporters are told to retry")
    max_concurrent_requests: int = Field(32, ge=1, le=4096, description="export requests handled at once per "
                                         "receiver; more are refused with a retryable answer")
    max_connections: int = Field(256, ge=1, le=65536, description="open connections per HTTP port (receiver "
                                 "and admin); more are closed at once")
    header_timeout_s: float = Field(10.0, gt=0, description="a client must send its request headers within "
                                    "this long, and then its body at no less than 64 KiB per second")
    ingest_token: str | None = Field(None, description="bearer token OTLP exporters must send (none: no auth)")
    query_token: str | None = Field(None, description="bearer token for the admin /api/query (none: no auth)")
    reviewer_tokens: str | None = Field(None, description="name:token pairs, comma separated, of the people who "
                                        "review scores (POST /api/reviews records the name; a reviewer token opens "
                                        "nothing else but GET /api/agreement)")
    tls_cert: Path | None = Field(None, description="PEM certificate for both receivers (TLS on when set)")
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert")
    tls_client_ca: Path | None = Field(None, description="PEM CA bundle: require client certificates (mTLS)")
    shutdown_grace_s: float = Field(10.0, gt=0, description="how long SIGTERM waits for in-flight exports")
    decode_workers: int = Field(-1, ge=-1, le=64, description="processes running the Python decoder, started by "
                                "the first request that needs it: OTLP/JSON, logs, redaction, spans the C walk leaves "
                                "to it (protobuf is decoded in C on the server's threads) (-1: one per core but one, "
                                "or one per core with redaction on; 0: in the receiver process; raise it for mostly "
                                "OTLP/JSON traffic)")

    @field_validator("reviewer_tokens")
    @classmethod
    def _reviewers(cls, value: str | None) -> str | None:
        from tracejudge.collector.review.reviews import reviewer_tokens  # the one parser, its message on a bad value

        reviewer_tokens(value)
        return value

    @field_validator("tls_cert", "tls_key", "tls_client_ca")
    @classmethod
    def _readable(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"{path} is not a readable file")
        return path


# the least [store] memory_limit, the default: `python bench/pipeline_pace.py --memory-limit SIZE` invalidated the
# database at 32MB (1 run of 1) and 64MB (1 of 4): a write ran out of the pool and its rollback, finding no memory
# either, failed (DuckDB 1.5.5); at 96MB, none of about 30 runs did (BENCHMARKS.md)
MIN_MEMORY_LIMIT = 96_000_000


class StoreSettings(_Section):
    db: Path = Field(Path("tracejudge.duckdb"), description="the DuckDB file spans, conversations and scores go to")
    max_batch_spans: int = Field(50_000, ge=1, description="most spans committed in one transaction")
    max_queue_spans: int = Field(500_000, ge=1, description="spans waiting for a commit before receivers push back")
    retry_after_s: int = Field(1, ge=1, description="Retry-After given to exporters under backpressure")
    memory_limit: str | None = Field("96MB", description="cap on DuckDB's buffer memory, shared by ingest and "
                                     "queries: a query past it spills to disk or fails, the collector does not "
                                     "(none: DuckDB's default, 80% of RAM). At least 96MB, or the collector refuses "
                                     "to start: with less, commits fail under load and a rollback that finds no "
                                     "memory invalidates the database")
    temp_limit: str | None = Field("2GB", description="most disk a query may spill to (none: DuckDB's default, "
                                   "90% of the free space)")
    threads: int | None = Field(1, ge=1, description="DuckDB worker threads of the collector's database: 1 appends "
                                "spans with the least CPU, leaving the cores to the decode workers; raise it for "
                                "heavy /api/query analytics on a many-core machine (none: DuckDB's default, one "
                                "per core)")
    checkpoint_threshold: str = Field("256MB", description="WAL size at which DuckDB checkpoints it into the "
                                      "database file (DuckDB's own default is 16MiB; 256MB checkpoints far less "
                                      "often, the fastest ingest; see assembling_checkpoint_threshold); the commit "
                                      "that crosses it "
                                      "waits for the checkpoint, the exports in it are journaled after "
                                      "journal_after. Without the journal, smaller ones hold exports more often: "
                                      "over 1.5M spans 16MB gave a p99 of 1.2 s, 64MB 300 ms (BENCHMARKS.md)")
    assembling_checkpoint_threshold: str | None = Field("64MB", description="WAL size at which the assembler "
                                                        "checkpoints it after its writes, so the checkpoints made "
                                                        "while conversations complete stay small (its time does "
                                                        "not count in the assembler's share under load), while "
                                                        "ingest alone keeps checkpoint_threshold's fewer "
                                                        "checkpoints (BENCHMARKS.md); none: only DuckDB's own "
                                                        "checkpoints")
    journal_after: float | None = Field(0.05, gt=0, description="seconds, or a duration like 50ms: a commit "
                                        "running longer than this (a "
                                        "checkpoint holds every commit for about a second) has the exports waiting "
                                        "on it written to the ingest journal beside the database, synced, and "
                                        "acknowledged; they are committed as usual, or at the next start after a "
                                        "crash (none: exports always wait for their commit)")
    query_memory: Bytes = Field(1024 * 1024 * 1024, ge=500_000_000, description="memory one /api/query query may "
                                "use, in a process of its own (past it the query is stopped and the caller told); "
                                "the collector's own memory is untouched by any query. It caps the address space "
                                "DuckDB reserves too, so under about 300 MB even small queries fail: at least 500MB")
    max_disk: Bytes | None = Field(None, ge=1, description="disk budget of the database file, its WAL and its ingest "
                                 "journal, like 50GB: "
                                 "near it the oldest complete conversations' spans are pruned (archived first when "
                                 "[retention] archive_dir is set); ingest answers 503 only when nothing can be freed")

    @field_validator("memory_limit", "assembling_checkpoint_threshold", mode="before")
    @classmethod
    def _size_or_none(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("none", ""):
            return None  # DuckDB's own default; no fold by the assembler
        if value is not None:
            parse_size(value)  # a size DuckDB reads the same way (MB, MiB, ...)
        return value

    @field_validator("checkpoint_threshold")
    @classmethod
    def _checkpoint_size(cls, value: str) -> str:
        parse_size(value)  # a size, not "none": DuckDB reads that as never, and the WAL would grow without end
        return value

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> Any:
        return None if isinstance(value, str) and value.strip().lower() in ("none", "") else value

    @field_validator("journal_after", mode="before")
    @classmethod
    def _journal_after(cls, value: Any) -> Any:
        if isinstance(value, str):
            return None if value.strip().lower() in ("none", "") else parse_duration(value)
        return value


class RetentionSettings(_Section):
    """How long each table keeps its rows; "forever" (the default) keeps them. Durations like 7d, 90d, 12h. The
    bookkeeping beside them follows these windows (README: retention)."""

    spans: float | None = Field(None, description="spans of a conversation this long after it was last assembled "
                                "(complete and past the late-span window); its conversation rows and scores stay")
    conversations: float | None = Field(None, description="conversation versions this long after assembly")
    scores: float | None = Field(None, description="scores this long after they were written")
    failed_jobs: float | None = Field(None, description="failed scoring jobs this long after their last attempt")
    reviews: float | None = Field(None, description="reviewers' verdicts (with their per-task labels) this long "
                                  "after they were given; people's work, so kept by default")
    judge_batches: float | None = Field(30 * 86400.0, description="the OpenAI Batch API ledger's rows this long "
                                        "after their batch was sent (a job retried later sends its request "
                                        "again); 30d")
    judge_calls: float | None = Field(30 * 86400.0, description="the judge's requests and answers kept with each "
                                      "score (`judge_calls`) this long after they were made, or with their score "
                                      "if it goes first; 30d")
    archive_dir: Path | None = Field(None, description="pruned rows go here first, as Parquet partitioned by day "
                                     "(written and fsynced before the rows are deleted); read them back with "
                                     "tracejudge query --archive DIR")
    interval_s: float = Field(60.0, gt=0, description="how often retention and the disk budget are applied")
    batch_conversations: int = Field(200, ge=1, description="conversations pruned per transaction, so a large "
                                     "prune never holds up ingest")

    @field_validator("spans", "conversations", "scores", "failed_jobs", "reviews", "judge_batches", "judge_calls",
                     "interval_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("forever", "none", ""):
            return None
        return parse_duration(value) if isinstance(value, str) else value


class ConversationSettings(_Section):
    quiet_period_s: float = Field(120.0, gt=0, description="a conversation is complete after this long with no new "
                                  "span (or at once on tracejudge.conversation.end = true); seconds or 5s, 2m")
    poll_s: float = Field(1.0, gt=0, description="how often completed conversations are looked for")
    max_spans: int = Field(50_000, ge=1, description="a conversation with more spans is not assembled (logged), "
                           "so one runaway trace cannot take the collector's memory")
    share_under_load: float = Field(0.25, gt=0, le=1, description="while ingest keeps the span writer busy and "
                                    "exports wait for it (50 ms or more), the assembler works at most this share of "
                                    "the time (it pauses between batches of conversations, so exports stay fast); "
                                    "when ingest is light, or no export waited, it never pauses")
    max_waiting_traces: int = Field(100_000, ge=1, description="traces the assembler keeps in memory while they "
                                    "wait for their quiet period (about 250 bytes each); past it, new traces are "
                                    "stored and taken in, oldest first, once it has room (so memory stays bounded "
                                    "whatever the traffic, and such conversations are assembled later)")
    trace_cache: Bytes = Field(32_000_000, ge=0, description="memory (estimated) for the mapped turns of traces "
                             "of conversations that went on after their first version, so their next version maps "
                             "only its new trace and reads none of their earlier spans; evicted at random when "
                             "full; 0 re-reads them all; bytes or 32MB")
    assembly_workers: int = Field(-1, ge=-1, le=64, description="processes that map and compose conversations and "
                                  "run the deterministic checks, so the server's own process serves the receivers "
                                  "and the span writer; at a lower priority than the server, so ingest keeps its "
                                  "cores; -1: one per core (none on one core); 0: in the server")

    @field_validator("quiet_period_s", "poll_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value


class LimitsSettings(_Section):
    """OpenTelemetry's span limits, applied as spans are decoded; what is cut is reported to the exporter."""

    attribute_count: int = Field(4096, ge=1, description="attributes kept per span (and per link)")
    attribute_value_length: int = Field(16 * 1024 * 1024, ge=1, description="characters kept of a string "
                                        "attribute (message attributes hold whole histories: keep it large)")
    event_count: int = Field(1024, ge=0, description="events kept per span")
    link_count: int = Field(1024, ge=0, description="links kept per span")
    event_attribute_count: int = Field(1024, ge=0, description="attributes kept per event")
    request_row_bytes: Bytes = Field(
        48 * 1024 * 1024, ge=1024 * 1024, description="bytes of text one request's rows may hold once decoded "
        "(attributes, events and links as JSON, each distinct resource and scope once); past it the request is "
        "refused with 400 / INVALID_ARGUMENT: raise [store] memory_limit with it (a commit holds about two thirds "
        "of the pool)")

    def span_limits(self) -> SpanLimits:
        return SpanLimits(self.attribute_count, self.attribute_value_length, self.event_count, self.link_count,
                          self.event_attribute_count, request_row_bytes=self.request_row_bytes)


class MappingSettings(_Section):
    mcp_tools: dict[str, list[str]] = Field(default_factory=dict, description="per MCP server, the tools that are "
                                            "MCP primitives, for frameworks whose traces carry no MCP span, e.g. "
                                            "{weather = ['get_weather', 'book_umbrella']}")

    @field_validator("mcp_tools")
    @classmethod
    def _names(cls, servers: dict[str, list[str]]) -> dict[str, list[str]]:
        empty = sorted(name for name, tools in servers.items() if not name.strip() or not tools)
        if empty:
            raise ValueError(f"give each MCP server a name and at least one tool: {', '.join(empty) or '(blank)'}")
        return servers


class SamplingRule(_Section):
    """Judge some conversations at a rate of their own: where the deterministic checks found something, or the
    first conversations of a new cohort (a new service.version, say)."""

    when: Literal["mcp_error", "invalid_call", "new_cohort"] = Field(
        description="mcp_error: an MCP call returned an error; invalid_call: call validity found a call that breaks "
        "its schema or the inventory; new_cohort: one of the first `first` conversations this collector saw with "
        "a value of `key`")
    rate: float = Field(ge=0, le=1, description="share of such conversations the judged metrics score")
    first: int | None = Field(None, ge=1, le=10_000_000, description="new_cohort: how many conversations of each "
                              "new value")
    key: str = Field("service.version", min_length=1, max_length=128, description="new_cohort: the attribute whose "
                     "values are cohorts")

    @model_validator(mode="after")
    def _new_cohort_needs_first(self) -> SamplingRule:
        if self.when == "new_cohort" and self.first is None:
            raise ValueError("a new_cohort rule needs first = N (the first N conversations of each new value)")
        return self


class SamplingSettings(_Section):
    rate: float = Field(1.0, ge=0, le=1, description="share of conversations the judged metrics score "
                        "(decided by a hash of the conversation id)")
    metric_rates: dict[str, float] = Field(default_factory=dict, description="per-metric rates, e.g. "
                                           "{mcp_use = 0.1}; mcp_call_validity defaults to 1.0")
    include_services: list[str] = Field(default_factory=list, description="only these service names (empty: all)")
    exclude_services: list[str] = Field(default_factory=list, description="never these service names")
    include_agents: list[str] = Field(default_factory=list, description="only these agent names (empty: all)")
    exclude_agents: list[str] = Field(default_factory=list, description="never these agent names")
    include_attributes: dict[str, list[str]] = Field(default_factory=dict, description="only conversations with "
                                                     "one of these span or resource attribute values, e.g. "
                                                     "{'deployment.environment' = ['prod']} (empty: all)")
    exclude_attributes: dict[str, list[str]] = Field(default_factory=dict, description="never conversations with "
                                                     "one of these attribute values, e.g. {'user.tier' = ['test']}")
    rules: list[SamplingRule] = Field(default_factory=list, description="judge conversations where the "
                                      "deterministic checks found something at their own rate, e.g. [{when = "
                                      "'mcp_error', rate = 1.0}, {when = 'invalid_call', rate = 1.0}]; the highest "
                                      "rate that applies wins. Each score records its inclusion probability, and "
                                      "pass rates and means weigh it back (Hajek)")
    judge_invalid: bool = Field(True, description="false: never judge a conversation where call validity already "
                                "failed (its judged scores then describe the valid conversations only)")


    @field_validator("metric_rates")
    @classmethod
    def _rates(cls, rates: dict[str, float]) -> dict[str, float]:
        _only_known(rates, METRIC_IDS, "metric")
        bad = sorted(k for k, v in rates.items() if not 0.0 <= v <= 1.0)
        if bad:
            raise ValueError(f"rates must be between 0 and 1: {', '.join(bad)}")
        return rates


class ScoringSettings(_Section):
    metrics: list[str] = Field(["mcp_use", "mcp_task_completion", "mcp_call_validity"],
                               description="metrics run on completed conversations")
    eval_mode: Literal["llm", "hybrid", "system_one"] | None = Field(None, description="eval mode of the judged "
                                                                     "metrics (default TRACEJUDGE_EVAL_MODE, else llm)")
    model: str | None = Field(None, description="LLM judge model (default gpt-5.4; OPENAI_API_KEY/OPENAI_BASE_URL)")
    system_one_model: str | None = Field(None, description="System One model (default jev-latest; TYPESAFE_*)")
    threshold: float | None = Field(0.5, ge=0, le=1, description="pass mark of every metric")
    strict_mode: bool = Field(False, description="scores are 1 or 0")
    aggregation: Literal["mean", "any_task"] = Field(
        "mean", description="how the judged metrics turn per-task scores into the conversation's: mean (DeepEval's) "
        "or any_task (the worst task: a conversation fails when any of its tasks does)")
    concurrency: int = Field(4, ge=1, le=256, description="conversations scored at once")
    daily_budget_usd: float | None = Field(None, ge=0, description="judge spend per UTC day; then jobs wait")
    max_attempts: int = Field(5, ge=1, description="tries per job before it is failed")
    lease_s: float = Field(300.0, gt=0, description="a leased job not finished by then is retried")
    retry_backoff_s: float = Field(30.0, gt=0, description="wait before retry n is backoff * 2**(n-1)")
    outage_backoff_s: float = Field(5.0, gt=0, description="a judge still unreachable after its own retries "
                                    "pauses its metric this long, doubling per failure; no attempt is used up")
    outage_max_backoff_s: float = Field(300.0, gt=0, description="longest pause of a metric during a judge outage")
    judge_timeout_s: float = Field(60.0, gt=0, description="timeout of one LLM judge request; raise it for a slow "
                                   "local server that computes one request at a time")
    judge_concurrency: int = Field(8, ge=1, le=256, description="LLM judge requests in flight at once (1 for a "
                                   "one-request-at-a-time local server)")
    judge_context_tokens: int | None = Field(None, ge=1024, description="the judge model's context window; prompts "
                                             "are reduced to fit it (default: known for OpenAI models, else 32768)")
    judge_temperature: float | Literal["server-default"] = Field(
        0.0, description="LLM judge temperature (0: repeatable scores); 'server-default' sends none")
    batch: bool = Field(False, description="send LLM judge requests through the OpenAI Batch API: half price, "
                        "scores within the provider's 24h window; durable across restarts")
    batch_flush_s: float = Field(30.0, gt=0, description="judge requests gather this long before a batch is sent")
    batch_poll_s: float = Field(60.0, gt=0, description="how often a submitted batch is polled")
    calibration: Literal["off", "reviews"] = Field("off", description="'reviews': each judged metric's LLM prompts "
                                                   "carry the reviewers' most informative corrections of it as "
                                                   "examples, chosen at start (restart to take new reviews)")
    calibration_examples: int = Field(4, ge=1, le=32, description="corrections per metric with calibration on")

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, metrics: list[str]) -> list[str]:
        _only_known(metrics, METRIC_IDS, "metric")
        return metrics


class RedactionSettings(_Section):
    enabled: bool = Field(False, description="redact spans before they are stored or sent to a judge")
    builtin: list[str] = Field(["email", "api_key", "card_number"], description="builtin rules applied "
                               "(email, api_key, card_number: Luhn-checked)")
    patterns: dict[str, str] = Field(default_factory=dict, description="more rules, {name = 'regex'}")
    salt: str = Field("", description="secret mixed into the hash in [REDACTED:rule:hash] "
                      "(TRACEJUDGE_REDACTION_SALT)")
    hashed: bool = Field(True, description="keep a hash of each match, so distinct values stay distinct")

    def redactor(self) -> Redactor | None:
        """The redactor, or None when redaction is off."""
        if not self.enabled:
            return None
        return Redactor.build(self.builtin, self.patterns, self.salt, self.hashed)

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: dict[str, str]) -> dict[str, str]:
        try:
            Redactor.build([], patterns)
        except RedactionRuleError as exc:
            raise ValueError(str(exc)) from None
        return patterns

    @field_validator("builtin")
    @classmethod
    def _known_rules(cls, builtin: list[str]) -> list[str]:
        _only_known(builtin, BUILTIN_RULES, "builtin rule")
        return builtin


class LakeSettings(_Section):
    catalog: str | None = Field(None, description="DuckLake catalog all replicas publish to, e.g. "
                                "'postgres:dbname=tracejudge host=db user=tracejudge' (password: PGPASSWORD); "
                                "none: no lake")
    data_path: str | None = Field(None, description="shared directory (or object-store URL) for the lake's "
                                  "Parquet files; needed when the lake is created")
    replica: str | None = Field(None, description="this replica's name in the lake, unique and stable across "
                                "restarts; required with a catalog")
    publish_interval_s: float = Field(10.0, gt=0, description="how often new conversations and scores are "
                                      "published")

    def check_publishing(self) -> None:
        """A collector publishing to a lake needs its replica name (queries of the lake do not) and the lake's
        extensions installed."""
        if self.catalog and not self.replica:
            raise ConfigError("[lake] replica is required with a catalog: a unique name that stays the same "
                              "across restarts (TRACEJUDGE_REPLICA or --replica); a host name that changes "
                              "would publish the history again under a new name")
        if self.catalog:
            from tracejudge.collector.history.lake import LakeError, check_extensions
            try:
                check_extensions()
            except LakeError as exc:  # at start, not as a failed publish every interval
                raise ConfigError(f"[lake] catalog is set, but {exc}") from exc

    def lake_config(self) -> LakeConfig | None:
        """The lake to publish to and query, or None when none is configured."""
        if not self.catalog:
            return None
        from tracejudge.collector.history.lake import (
            LakeConfig,  # DuckDB and pyarrow: only for a collector that publishes
        )

        return LakeConfig(self.catalog, self.data_path, self.replica or "")


class ExportSettings(_Section):
    endpoint: str | None = Field(None, description="OTLP endpoint that receives every score as a "
                                 "gen_ai.evaluation.result log record (none: no export; OTEL_EXPORTER_OTLP_LOGS_"
                                 "ENDPOINT also sets it), e.g. 'http://otel-collector:4317'")
    protocol: Literal["grpc", "http/protobuf"] = Field("grpc", description="OTLP protocol of the export")
    headers: dict[str, str] = Field(default_factory=dict, description="headers of every export request, e.g. "
                                    "{authorization = 'Bearer ...'} (OTEL_EXPORTER_OTLP_LOGS_HEADERS also works)")
    insecure: bool | None = Field(None, description="gRPC without TLS (default: from the endpoint's scheme)")
    timeout_s: float = Field(10.0, gt=0, description="timeout of one export request")
    interval_s: float = Field(5.0, gt=0, description="how often new scores are sent")

    @field_validator("timeout_s", "interval_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value


class UISettings(_Section):
    trace_url: str | None = Field(None, description="link from a conversation to your tracing backend, with "
                                  "{trace_id}, e.g. 'http://jaeger:16686/trace/{trace_id}'")


COHORT_ATTRIBUTES = ["service.version", "deployment.environment", "deployment.environment.name",
                     "gen_ai.request.model", "gen_ai.agent.version", "gen_ai.prompt.name", "gen_ai.prompt.version"]


class CanaryWatch(_Section):
    """A cohort pair whose canary gate /metrics reports (tracejudge_canary_state)."""

    baseline: str = Field(min_length=1, max_length=500)
    candidate: str = Field(min_length=1, max_length=500)
    metric: str
    margin: float = Field(gt=0, lt=1, description="fail when the candidate's pass rate is worse by more than this")
    confidence: float = Field(0.95, ge=0.5, lt=1)

    @field_validator("metric")
    @classmethod
    def _metric(cls, metric: str) -> str:
        _only_known([metric], METRIC_IDS, "metric")
        return metric


class CohortSettings(_Section):
    attributes: list[str] = Field(COHORT_ATTRIBUTES, description="span and resource attribute keys whose values are "
                                  "recorded per conversation, for cohorts (`tracejudge compare 'service.version="
                                  "1.4.2' ...`); add your own, such as a prompt version attribute")
    saved: dict[str, str] = Field(default_factory=dict, description="named cohorts, e.g. {canary = "
                                  "'service.version=1.4.2,deployment.environment=prod'}")
    watch: list[CanaryWatch] = Field(default_factory=list, max_length=20, description="cohort pairs whose canary "
                                     "gate /metrics reports as tracejudge_canary_state, e.g. [{baseline = "
                                     "'service.version=1.4.1', candidate = 'canary', metric = 'mcp_task_completion', "
                                     "margin = 0.02}]")

    @field_validator("attributes")
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        bad = [k for k in keys if not k or len(k) > 128]
        if bad or len(keys) > 64:
            raise ValueError("at most 64 attribute keys, each 1 to 128 characters")
        return keys


class ReviewSettings(_Section):
    """The rules that put scored conversations into the review queue. Every rule but `random_rate` takes each
    conversation it matches (sampling probability 1); the random sample keeps agreement estimates about all traffic,
    not only about the failures the other rules pick."""

    failing: bool = Field(True, description="a conversation with a failing score")
    low_confidence_below: float | None = Field(0.6, ge=0, le=1, description="a judge decision (System One) whose "
                                               "confidence is below this (none: off)")
    metric_disagreement: bool = Field(True, description="metrics disagree on one conversation: one passes, another "
                                      "fails (e.g. call validity fails, task completion passes)")
    hybrid_fallback: bool = Field(True, description="hybrid mode where System One could not decide and the LLM "
                                  "did (a decision the two judges did not both make)")
    thumbs_down: bool = Field(True, description="end-user feedback below feedback_below, or labelled thumbs_down")
    feedback_below: float = Field(0.5, description="a feedback value below this is a thumbs-down")
    random_rate: float = Field(0.05, ge=0, le=1, description="share of all other scored conversations, chosen by a "
                               "hash of the conversation id, so agreement is estimated for all traffic")
    reviews_per_item: int = Field(1, ge=1, le=10, description="reviewers an item waits for (2 or more gives "
                                  "inter-reviewer agreement)")


class LogSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    progress_s: float = Field(30.0, ge=0, description="a one-line progress log this often (spans/s, queue, jobs "
                              "by state); 0 turns it off")

    @field_validator("progress_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value


class Settings(_Section):
    server: ServerSettings = Field(default_factory=ServerSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    conversations: ConversationSettings = Field(default_factory=ConversationSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    mapping: MappingSettings = Field(default_factory=MappingSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    scoring: ScoringSettings = Field(default_factory=ScoringSettings)
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)
    lake: LakeSettings = Field(default_factory=LakeSettings)
    ui: UISettings = Field(default_factory=UISettings)
    review: ReviewSettings = Field(default_factory=ReviewSettings)
    cohorts: CohortSettings = Field(default_factory=CohortSettings)
    export: ExportSettings = Field(default_factory=ExportSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    _config_file: Path | None = PrivateAttr(default=None)  # the tracejudge.toml these came from, if any

    @property
    def config_file(self) -> Path | None:
        return self._config_file

    def _check_memory_limit(self, pool: int) -> None:
        """DuckDB's buffer pool must leave room for the pipeline's reads and writes beside ingest's: short of that
        a commit fails under load and, when even its rollback finds no memory, the database is invalidated. (One
        request's commit past the pool fails alone, answered retryable: [limits] request_row_bytes is not checked
        against it.)"""
        if pool < MIN_MEMORY_LIMIT:
            raise ConfigError(
                f"[store] memory_limit = {self.store.memory_limit!r} is too small: the collector needs "
                f"{MIN_MEMORY_LIMIT // 1_000_000}MB or more for DuckDB's buffer pool (at 32MB and 64MB the whole "
                "pipeline ran it out under load, python bench/pipeline_pace.py). With less, writes fail and a rollback "
                "that finds no memory invalidates the database, which stops the collector. Set memory_limit = "
                f'"{MIN_MEMORY_LIMIT // 1_000_000}MB" or more')

    def model_post_init(self, _: Any) -> None:
        keep, quiet = self.retention.spans, self.conversations.quiet_period_s
        if keep is not None and keep < 2 * quiet:
            raise ConfigError(f"[retention] spans = {keep:g}s would prune spans of conversations still waiting out "
                              f"their quiet period ({quiet:g}s): keep spans at least twice as long as "
                              "[conversations] quiet_period_s")
        if not _loopback(self.server.admin_host) and not self.server.query_token:
            raise ConfigError(
                f"[server] admin_host = {self.server.admin_host!r} would let anyone who reaches it read every "
                "conversation through /api/query and /report: set a query token first (TRACEJUDGE_QUERY_TOKEN="
                "$(openssl rand -hex 32), or [server] query_token), or keep the admin API on 127.0.0.1")
        if self.store.memory_limit is not None:
            self._check_memory_limit(parse_size(self.store.memory_limit))
        if (self.server.tls_cert is None) != (self.server.tls_key is None):
            raise ConfigError("[server] tls_cert and tls_key go together: set both or neither")
        if self.server.tls_client_ca is not None and self.server.tls_cert is None:
            raise ConfigError("[server] tls_client_ca (mTLS) needs tls_cert and tls_key")



# (section, key, environment variable, flag)
ENV_AND_FLAGS: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("server", "host", "TRACEJUDGE_HOST", "--host"),
    ("server", "grpc_port", "TRACEJUDGE_GRPC_PORT", "--grpc-port"),
    ("server", "http_port", "TRACEJUDGE_HTTP_PORT", "--http-port"),
    ("server", "admin_port", "TRACEJUDGE_ADMIN_PORT", "--admin-port"),
    ("server", "admin_host", "TRACEJUDGE_ADMIN_HOST", "--admin-host"),
    ("server", "ingest_token", "TRACEJUDGE_INGEST_TOKEN", None),
    ("server", "query_token", "TRACEJUDGE_QUERY_TOKEN", None),
    ("server", "reviewer_tokens", "TRACEJUDGE_REVIEWER_TOKENS", None),
    ("store", "db", "TRACEJUDGE_DB", "--db"),
    ("conversations", "quiet_period_s", "TRACEJUDGE_QUIET_PERIOD", "--quiet-period"),
    ("limits", "attribute_count", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", None),
    ("limits", "attribute_value_length", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", None),
    ("limits", "event_count", "OTEL_SPAN_EVENT_COUNT_LIMIT", None),
    ("limits", "link_count", "OTEL_SPAN_LINK_COUNT_LIMIT", None),
    ("limits", "event_attribute_count", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", None),
    ("scoring", "model", "TRACEJUDGE_JUDGE_MODEL", "--judge-model"),
    ("scoring", "system_one_model", "TRACEJUDGE_SYSTEM_ONE_MODEL", "--system-one-model"),
    ("scoring", "judge_timeout_s", "TRACEJUDGE_JUDGE_TIMEOUT", "--judge-timeout"),
    ("scoring", "judge_concurrency", "TRACEJUDGE_JUDGE_CONCURRENCY", "--judge-concurrency"),
    ("scoring", "judge_context_tokens", "TRACEJUDGE_JUDGE_CONTEXT_TOKENS", "--judge-context-tokens"),
    ("scoring", "batch", "TRACEJUDGE_JUDGE_BATCH", "--batch"),
    ("redaction", "salt", "TRACEJUDGE_REDACTION_SALT", None),
    ("lake", "catalog", "TRACEJUDGE_LAKE_CATALOG", None),
    ("lake", "data_path", "TRACEJUDGE_LAKE_DATA_PATH", None),
    ("lake", "replica", "TRACEJUDGE_REPLICA", "--replica"),
    ("log", "level", "TRACEJUDGE_LOG_LEVEL", "--log-level"),
    ("export", "endpoint", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", None),
    ("export", "protocol", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", None),
)


def judge_options(sc: ScoringSettings) -> JudgeOptions:
    """The LLM judge's connection settings from [scoring] (the judge modules load only when asked for)."""
    from tracejudge.judges.resolve import JudgeOptions

    temperature = None if sc.judge_temperature == "server-default" else sc.judge_temperature
    return JudgeOptions(sc.judge_timeout_s, sc.judge_concurrency, sc.judge_context_tokens, temperature,
                        sc.batch, sc.batch_flush_s, sc.batch_poll_s)


def judge_flags(args: Any) -> dict[str, Any]:
    """The judge connection flags of a parsed command line, by setting name."""
    return {"judge_timeout_s": args.judge_timeout, "judge_concurrency": args.judge_concurrency,
            "judge_context_tokens": args.judge_context_tokens, "batch": getattr(args, "batch", None) or None}


def load_settings(config_file: Path | None = None, flags: dict[str, Any] | None = None,
                  environ: dict[str, str] | None = None) -> Settings:
    """Merge the layers; ConfigError names the first invalid setting and its source."""
    environ = dict(os.environ) if environ is None else environ
    path = config_file or (Path(environ["TRACEJUDGE_CONFIG"]) if environ.get("TRACEJUDGE_CONFIG") else None)
    data: dict[str, dict[str, Any]] = {}
    sources: dict[tuple[str, str], str] = {}
    if path is not None or Path("tracejudge.toml").is_file():
        path = path or Path("tracejudge.toml")
        try:
            loaded = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read the config file {path}: {exc}") from exc
        for section, values in loaded.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{section} in {path} must be a table ([{section}])")
            data[section] = dict(values)
            sources.update({(section, k): f"{path} [{section}]" for k in values})
    for section, key, env, flag in ENV_AND_FLAGS:
        if env and environ.get(env):
            data.setdefault(section, {})[key] = environ[env]
            sources[(section, key)] = f"environment variable {env}"
        if flag and flags and flags.get(key) is not None:
            data.setdefault(section, {})[key] = flags[key]
            sources[(section, key)] = f"flag {flag}"
    try:
        settings = Settings.model_validate(data)
        settings._config_file = path
        return settings
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(x) for x in err["loc"])
        name = f"[{loc[0]}] {'.'.join(loc[1:])}" if len(loc) > 1 else loc[0]
        source = sources.get((loc[0], loc[1]) if len(loc) > 1 else (loc[0], ""), "the defaults")
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"unknown setting {name} (from {source}); see tracejudge serve --help") from exc
        shown = "(hidden)" if "token" in name or "salt" in name else repr(err.get("input"))  # never echo a secret
        raise ConfigError(f"invalid setting {name} = {shown} (from {source}): {err['msg']}") from exc


def settings_help() -> str:
    """Every setting with its default, environment variable and flag, for `serve --help`."""
    env_flags = {(s, k): (e, f) for s, k, e, f in ENV_AND_FLAGS}
    lines = []
    for section, model in (("server", ServerSettings), ("store", StoreSettings),
                           ("conversations", ConversationSettings), ("retention", RetentionSettings),
                           ("mapping", MappingSettings),
                           ("limits", LimitsSettings),
                           ("sampling", SamplingSettings), ("scoring", ScoringSettings),
                           ("redaction", RedactionSettings),
                           ("lake", LakeSettings), ("ui", UISettings), ("review", ReviewSettings),
                           ("cohorts", CohortSettings), ("export", ExportSettings), ("log", LogSettings)):
        lines.append(f"[{section}]")
        for key, field in model.model_fields.items():
            env, flag = env_flags.get((section, key), (None, None))
            extra = ", ".join(x for x in (env, flag) if x)
            default = field.default if field.default_factory is None else field.default_factory()
            shown = "(none)" if default is None else str(default)
            lines.append(f"  {key} = {shown}  {field.description}" + (f"  [{extra}]" if extra else ""))
    return "\n".join(lines)
