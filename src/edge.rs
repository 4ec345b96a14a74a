//! Helpers every gRPC edge shares (the order service's and the AdminService's): the error
//! domain, server spans that continue the caller's trace, and timestamps as the proto carries
//! them.

use chrono::{DateTime, Utc};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::telemetry;

/// `ErrorInfo.domain` of every error Outpost's services return.
pub const ERROR_DOMAIN: &str = "outpost.v1";

/// A server span for one call, continuing the caller's trace from its request metadata.
pub(crate) fn rpc_span(
    service: &'static str,
    method: &'static str,
    metadata: &tonic::metadata::MetadataMap,
) -> tracing::Span {
    let span = tracing::info_span!(
        "rpc",
        otel.name = format!("{service}/{method}"),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        outpost.event_id = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    telemetry::follow(&span, telemetry::grpc_context(metadata));
    span
}

/// Records the call's gRPC status (and the event id an error names) on its server span.
pub(crate) fn record_status<T>(span: &tracing::Span, answer: &Result<T, Status>) {
    let code = answer.as_ref().err().map_or(Code::Ok, Status::code);
    span.record("rpc.grpc.status_code", code as i32);
    if let Err(status) = answer {
        span.record("otel.status_code", "ERROR");
        if let Some(event_id) =
            status.get_details_error_info().and_then(|i| i.metadata.get("event_id").cloned())
        {
            span.record("outpost.event_id", event_id);
        }
    }
}

/// A protobuf timestamp with the same microseconds the database keeps.
pub(crate) fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: at.timestamp(),
        // Always below 10^9, so the cast cannot truncate.
        nanos: at.timestamp_subsec_nanos() as i32,
    }
}
