"""Collector settings: embedded defaults < tracejudge.toml < environment < command-line flags.

Every setting has a TOML name (`[section] key`), and the common ones an environment variable and a
flag; an invalid value fails at start with its name and where it came from.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scoring.errors import TracejudgeError

MiB = 1024 * 1024


class ConfigError(TracejudgeError):
    """A setting is invalid; the message names it and where it came from."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Section):
    host: str = Field("127.0.0.1", description="address the receivers and admin API bind to")
    grpc_port: int = Field(4317, ge=0, le=65535, description="OTLP/gRPC port (0: any free port)")
    http_port: int = Field(4318, ge=0, le=65535, description="OTLP/HTTP port (0: any free port)")
    admin_port: int = Field(4319, ge=0, le=65535, description="admin HTTP port: /healthz /readyz /metrics")
    max_message_bytes: int = Field(64 * MiB, ge=1024, description="largest request accepted, after decompression")
    ingest_token: str | None = Field(None, description="bearer token OTLP exporters must send (none: no auth)")
    tls_cert: Path | None = Field(None, description="PEM certificate for both receivers (TLS on when set)")
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert")
    tls_client_ca: Path | None = Field(None, description="PEM CA bundle: require client certificates (mTLS)")
    shutdown_grace_s: float = Field(10.0, gt=0, description="how long SIGTERM waits for in-flight exports")
    decode_workers: int = Field(-1, ge=-1, le=64, description="processes decoding requests (-1: one per core, "
                                "0: in the receiver process)")

    @field_validator("tls_cert", "tls_key", "tls_client_ca")
    @classmethod
    def _readable(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"{path} is not a readable file")
        return path


class StoreSettings(_Section):
    db: Path = Field(Path("tracejudge.duckdb"), description="the DuckDB file spans, conversations and scores go to")
    max_batch_spans: int = Field(50_000, ge=1, description="most spans committed in one transaction")
    max_queue_spans: int = Field(500_000, ge=1, description="spans waiting for a commit before receivers push back")
    retry_after_s: int = Field(1, ge=1, description="Retry-After given to exporters under backpressure")


class LogSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")


class Settings(_Section):
    server: ServerSettings = Field(default_factory=ServerSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    log: LogSettings = Field(default_factory=LogSettings)

    def model_post_init(self, _: Any) -> None:
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
    ("server", "ingest_token", "TRACEJUDGE_INGEST_TOKEN", None),
    ("store", "db", "TRACEJUDGE_DB", "--db"),
    ("log", "level", "TRACEJUDGE_LOG_LEVEL", "--log-level"),
)


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
            if section == "scoring":
                continue  # read by the scoring library
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
        return Settings.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(x) for x in err["loc"])
        name = f"[{loc[0]}] {'.'.join(loc[1:])}" if len(loc) > 1 else loc[0]
        source = sources.get((loc[0], loc[1]) if len(loc) > 1 else (loc[0], ""), "the defaults")
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"unknown setting {name} (from {source}); see tracejudge serve --help") from exc
        raise ConfigError(f"invalid setting {name} = {err.get('input')!r} (from {source}): {err['msg']}") from exc


def settings_help() -> str:
    """Every setting with its default, environment variable and flag, for `serve --help`."""
    env_flags = {(s, k): (e, f) for s, k, e, f in ENV_AND_FLAGS}
    lines = []
    for section, model in (("server", ServerSettings), ("store", StoreSettings), ("log", LogSettings)):
        lines.append(f"[{section}]")
        for key, field in model.model_fields.items():
            env, flag = env_flags.get((section, key), (None, None))
            extra = ", ".join(x for x in (env, flag) if x)
            default = field.default
            shown = "(none)" if default is None else str(default)
            lines.append(f"  {key} = {shown}  {field.description}" + (f"  [{extra}]" if extra else ""))
    return "\n".join(lines)
