"""OTLP/gRPC receiver: `opentelemetry.proto.collector.trace.v1.TraceService/Export` on grpc.aio, and
`...logs.v1.LogsService/Export` for GenAI events sent as log records. `...metrics.v1.MetricsService/Export` is
answered OK and dropped: SDKs set up to export every signal (logfire's default) get no error to log.

The request arrives as raw bytes (no generated deserializer) so a malformed message gets a precise
INVALID_ARGUMENT instead of a generic error. Backpressure answers UNAVAILABLE with a google.rpc.RetryInfo,
which the OTLP exporters honour. gzip is accepted; the size cap is the server's receive limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from tracejudge.collector.config import ServerSettings
from tracejudge.collector.receivers.decode_pool import Signal
from tracejudge.collector.receivers.ingest import METRICS_DROPPED, Answer, Ingest, Outcome

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


def _status_details(code: int, message: str, retry_after_s: int | None) -> tuple[tuple[str, bytes], ...]:
    status = status_pb2.Status(code=code, message=message)
    if retry_after_s is not None:
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=Duration(seconds=retry_after_s)))
    return (("grpc-status-details-bin", status.SerializeToString()),)


MAX_STREAMS_PER_CONNECTION = 16


async def _refuse(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
    """Answer UNAUTHENTICATED without reading the request message (a streaming handler never pulls it)."""
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token",
                        _status_details(code_pb2.UNAUTHENTICATED, "missing or wrong bearer token", None))


class _AuthFirst(grpc.aio.ServerInterceptor):
    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest
        self._refusal = grpc.stream_unary_rpc_method_handler(_refuse)

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        metadata = dict(details.invocation_metadata or ())  # type: ignore[attr-defined]
        if not self.ingest.authorized(metadata.get("authorization")):
            self.ingest.metrics.requests.labels("grpc", "unauthenticated").inc()
            return self._refusal
        return await continuation(details)


class GrpcReceiver:
    def __init__(self, settings: ServerSettings, ingest: Ingest) -> None:
        self.settings = settings
        self.ingest = ingest
        self.port: int | None = None
        options = [("grpc.max_receive_message_length", settings.max_message_bytes),
                   ("grpc.max_send_message_length", 4 * 1024 * 1024),
                   ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
                   ("grpc.max_connection_idle_ms", 5 * 60 * 1000)]
        # the bearer token is checked on the metadata, before the message is read (an unauthenticated client
        # cannot make the server buffer its 64 MiB), and RPCs beyond the cap are refused, not queued
        self._server = grpc.aio.server(options=options, interceptors=[_AuthFirst(ingest)],
                                       maximum_concurrent_rpcs=settings.max_concurrent_requests)
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(
                self._export, request_deserializer=None,
                response_serializer=ExportTraceServiceResponse.SerializeToString),
        })
        logs = grpc.method_handlers_generic_handler(LOGS_SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(
                self._export_logs, request_deserializer=None,
                response_serializer=ExportLogsServiceResponse.SerializeToString),
        })
        metrics = grpc.method_handlers_generic_handler(METRICS_SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(
                self._export_metrics, request_deserializer=None,
                response_serializer=ExportMetricsServiceResponse.SerializeToString),
        })
        self._server.add_generic_rpc_handlers((handler, logs, metrics))

    async def start(self) -> int:
        s = self.settings
        address = f"{s.host}:{s.grpc_port}"
        if s.tls_cert and s.tls_key:
            credentials = grpc.ssl_server_credentials(
                [(Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes())],
                root_certificates=Path(s.tls_client_ca).read_bytes() if s.tls_client_ca else None,
                require_client_auth=s.tls_client_ca is not None,
            )
            self.port = self._server.add_secure_port(address, credentials)
        else:
            self.port = self._server.add_insecure_port(address)
        if not self.port:
            raise OSError(f"cannot listen for OTLP/gRPC on {address}")
        await self._server.start()
        return self.port

    async def stop(self, grace_s: float) -> None:
        """Refuse new RPCs and let in-flight exports finish (they complete their commit) within grace_s."""
        await self._server.stop(grace_s)

    async def _export(self, request: bytes, context: grpc.aio.ServicerContext) -> ExportTraceServiceResponse:
        outcome = await self._outcome(request, context, "traces")
        if outcome.rejected or outcome.message:
            return ExportTraceServiceResponse(partial_success=ExportTracePartialSuccess(
                rejected_spans=outcome.rejected, error_message=outcome.message))
        return ExportTraceServiceResponse()

    async def _export_logs(self, request: bytes, context: grpc.aio.ServicerContext) -> ExportLogsServiceResponse:
        outcome = await self._outcome(request, context, "logs")
        if outcome.rejected or outcome.message:
            return ExportLogsServiceResponse(partial_success=ExportLogsPartialSuccess(
                rejected_log_records=outcome.rejected, error_message=outcome.message))
        return ExportLogsServiceResponse()

    async def _export_metrics(self, request: bytes, context: grpc.aio.ServicerContext) -> ExportMetricsServiceResponse:
        """Metrics are no input of an evaluation: accepted (the bearer token was checked first) and dropped."""
        self.ingest.metrics.requests.labels("grpc", METRICS_DROPPED).inc()
        return ExportMetricsServiceResponse()

    async def _outcome(self, request: bytes, context: grpc.aio.ServicerContext, signal: Signal) -> Outcome:
        """The accepted outcome, or the RPC aborted with the matching status."""
        metadata = dict(context.invocation_metadata() or ())
        outcome = await self.ingest.export(request, "application/x-protobuf", metadata.get("authorization"), "grpc",
                                           signal)
        if outcome.answer is Answer.OK:
            return outcome
        if outcome.answer is Answer.UNAUTHENTICATED:
            code, grpc_code, retry = code_pb2.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED, None
        elif outcome.answer is Answer.UNAVAILABLE:
            code, grpc_code, retry = code_pb2.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE, outcome.retry_after_s
        else:
            code, grpc_code, retry = code_pb2.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT, None
        await context.abort(grpc_code, outcome.message, _status_details(code, outcome.message, retry))
        raise AssertionError("unreachable: abort raises")
