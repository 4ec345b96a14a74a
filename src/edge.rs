//! Helpers every gRPC edge shares (the OrderService's, the AdminService's and the consumer's
//! ConsumerAdminService): server spans that continue the caller's trace,
//! authenticated calls, error statuses, and timestamps as the proto carries them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use idempost_proto::{ERROR_DOMAIN, EventId};
use sea_orm::DbErr;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tracing::Instrument as _;

use crate::domain::{FieldViolation, InvalidInput};
use crate::security::{AuthError, Authenticator, Caller};
use crate::telemetry;

mod audit;
mod convert;
mod long_poll;
mod page;

pub use audit::{list_audit, parse_list_audit};
pub use long_poll::{LongPoll, MAX_WAIT, Polled};
pub use page::{ByteBudget, LISTING_BYTES, PAYLOAD_BATCH};

/// A server span for one call, continuing the caller's trace from its request metadata.
pub fn rpc_span(
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
        idempost.event_id = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    telemetry::follow(&span, telemetry::grpc_context(metadata));
    span
}

/// Records the call's gRPC status (and the event id an error names) on its server span.
pub fn record_status<T>(span: &tracing::Span, answer: &Result<T, Status>) {
    let code = answer.as_ref().err().map_or(Code::Ok, Status::code);
    span.record("rpc.grpc.status_code", code as i32);
    if let Err(status) = answer {
        span.record("otel.status_code", "ERROR");
        if let Some(event_id) =
            status.get_details_error_info().and_then(|i| i.metadata.get("event_id").cloned())
        {
            span.record("idempost.event_id", recorded_event_id(&event_id));
        }
    }
}

/// A protobuf timestamp with the same microseconds the database keeps.
pub fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: at.timestamp(),
        // Always below 10^9, so the cast cannot truncate.
        nanos: at.timestamp_subsec_nanos() as i32,
    }
}

/// Runs one call of `service` inside its server span: authenticates the caller (a refused caller
/// reaches no query), runs `call` with it, turns a failure into its status with `into_status`,
/// and records the status on the span.
pub async fn authenticated<R, T, E, F>(
    service: &'static str,
    method: &'static str,
    auth: &Authenticator,
    request: &Request<R>,
    event_id: Option<&str>,
    call: impl FnOnce(Caller) -> F,
    into_status: impl FnOnce(E) -> Status,
) -> Result<Response<T>, Status>
where
    F: Future<Output = Result<T, E>>,
    E: From<AuthError>,
{
    let metadata = request.metadata();
    let span = rpc_span(service, method, metadata);
    if let Some(event_id) = event_id {
        span.record("idempost.event_id", recorded_event_id(event_id));
    }
    let caller = span.in_scope(|| auth.caller(request));
    let answer = async {
        match caller {
            Ok(caller) => call(caller).await,
            Err(refused) => Err(E::from(refused)),
        }
    }
    .instrument(span.clone())
    .await
    .map(Response::new)
    .map_err(into_status);
    record_status(&span, &answer);
    answer
}

/// What any admin call can fail with, whichever admin service serves it. Each admin edge's
/// error enum holds it as `Call` (see [`from_call_error`](crate::from_call_error)) beside its own refusals.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The caller was refused.
    #[error(transparent)]
    Denied(#[from] AuthError),
    /// A field is invalid.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The database failed. Its text stays in the log: the caller gets [`incident`]'s id.
    #[error("the database failed; nothing was changed by this call")]
    Database(#[from] DbErr),
}

impl CallError {
    /// The caller's refusal as its own status, INVALID_REQUEST naming the fields, or
    /// DATABASE_UNAVAILABLE with a correlation id and no database text.
    pub fn into_status(self) -> Status {
        let message = self.to_string();
        match self {
            Self::Denied(refused) => refusal_status(refused, HashMap::new()),
            Self::Invalid(invalid) => error_status(
                Code::InvalidArgument,
                "INVALID_REQUEST",
                message,
                HashMap::new(),
                Some(&invalid),
            ),
            Self::Database(e) => {
                let id = incident("admin call failed on the database", &e);
                error_status(
                    Code::Unavailable,
                    "DATABASE_UNAVAILABLE",
                    format!("{message}: retry later (correlation_id {id})"),
                    HashMap::from([(CORRELATION_ID.to_owned(), id)]),
                    None,
                )
            }
        }
    }
}

/// The `ErrorInfo.metadata` key of the id that ties an error a caller got to its log record.
pub const CORRELATION_ID: &str = "correlation_id";

/// Logs an internal failure (database or broker text, constraint names, values) at WARN under a
/// new correlation id, and answers the id: callers get the id, never the text.
pub fn incident(what: &str, error: &dyn std::fmt::Display) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    tracing::warn!(correlation_id = %id, error = %error, "{what}");
    id
}

/// The status of a refused caller: its code and reason, counted and logged by
/// [`crate::security::note_refusal`].
pub fn refusal_status(refused: AuthError, metadata: HashMap<String, String>) -> Status {
    crate::security::note_refusal(refused);
    error_status(refused.code(), refused.reason(), refused.to_string(), metadata, None)
}

/// `From` every [`CallError`] cause for an admin edge's error enum with a `Call(CallError)`
/// variant, so `?` works on refusals, invalid input and database errors alike. Exported at the
/// crate root, as macros are, for the services' admin edges.
#[macro_export]
macro_rules! from_call_error {
    ($error:ty) => {
        impl From<$crate::security::AuthError> for $error {
            fn from(e: $crate::security::AuthError) -> Self {
                Self::Call(e.into())
            }
        }
        impl From<$crate::domain::InvalidInput> for $error {
            fn from(e: $crate::domain::InvalidInput) -> Self {
                Self::Call(e.into())
            }
        }
        impl From<sea_orm::DbErr> for $error {
            fn from(e: sea_orm::DbErr) -> Self {
                Self::Call(e.into())
            }
        }
    };
}

/// An error status with its `ErrorInfo` (this domain, `reason`, `metadata`) and, for an invalid
/// request, a `BadRequest` naming every violated field.
pub fn error_status(
    code: Code,
    reason: &str,
    message: String,
    metadata: HashMap<String, String>,
    invalid: Option<&InvalidInput>,
) -> Status {
    let mut details = ErrorDetails::new();
    for v in invalid.map(|i| i.violations.as_slice()).unwrap_or_default() {
        details.add_bad_request_violation(v.field.clone(), v.description.clone());
    }
    details.set_error_info(reason, ERROR_DOMAIN, metadata);
    Status::with_error_details(code, message, details)
}

/// The canonical form of the event id in `text`, or the violation of the `event_id` field.
pub fn parse_event_id(text: &str) -> Result<String, InvalidInput> {
    EventId::parse(text)
        .map(|id| id.to_string())
        .map_err(|e| InvalidInput { violations: vec![FieldViolation::new("event_id", e)] })
}

/// An event id as a span or a log records it: its canonical form once it parses, else only
/// that it did not and how long it was (a caller's text of up to the message limit, newlines and
/// escapes included, never reaches a span or a log).
pub fn recorded_event_id(text: &str) -> String {
    EventId::parse(text).map_or_else(|_| format!("invalid ({} bytes)", text.len()), |id| id.to_string())
}

/// The most rows one admin listing returns, and how many when the request says 0.
const MAX_LIMIT: u32 = 1000;
const DEFAULT_LIMIT: u32 = 100;

/// A listing's `limit`: 0 means the default; past the maximum is a violation of `limit`, recorded
/// in `violations` (and the default stands in).
pub fn limit(value: u32, violations: &mut Vec<FieldViolation>) -> u32 {
    match value {
        0 => DEFAULT_LIMIT,
        n if n <= MAX_LIMIT => n,
        _ => {
            violations.push(FieldViolation::new("limit", format!("must be at most {MAX_LIMIT}")));
            DEFAULT_LIMIT
        }
    }
}

/// The longest window a request may give: a cut-off further back than this is no retention at
/// all, and would reach past what the databases' timestamps hold.
pub const MAX_WINDOW: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);

/// A window given as a proto duration: absent means `default`; a negative one or one longer than
/// [`MAX_WINDOW`] is a violation of `field`, recorded in `violations` (and `default` stands in).
pub fn window(
    field: &str,
    value: Option<prost_types::Duration>,
    default: std::time::Duration,
    violations: &mut Vec<FieldViolation>,
) -> std::time::Duration {
    optional_window(field, value, violations).unwrap_or(default)
}

/// A window that may be absent ([`window`] without a default).
pub fn optional_window(
    field: &str,
    value: Option<prost_types::Duration>,
    violations: &mut Vec<FieldViolation>,
) -> Option<std::time::Duration> {
    let parsed = std::time::Duration::try_from(value?);
    match parsed {
        Ok(window) if window <= MAX_WINDOW => Some(window),
        Ok(_) => {
            violations.push(FieldViolation::new(field, "must be at most 100 years (3153600000s)"));
            None
        }
        Err(_) => {
            violations.push(FieldViolation::new(field, "must not be negative"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_of_zero_means_the_default_and_past_the_maximum_is_a_violation() {
        let mut violations = Vec::new();
        assert_eq!(limit(0, &mut violations), DEFAULT_LIMIT);
        assert_eq!(limit(MAX_LIMIT, &mut violations), MAX_LIMIT);
        assert!(violations.is_empty());
        assert_eq!(limit(MAX_LIMIT + 1, &mut violations), DEFAULT_LIMIT);
        assert_eq!(violations.iter().map(|v| v.field.as_str()).collect::<Vec<_>>(), ["limit"]);
    }

    #[test]
    fn a_negative_window_is_a_violation_and_an_absent_one_the_default() {
        let (mut violations, default) = (Vec::new(), std::time::Duration::from_secs(60));
        assert_eq!(window("w", None, default, &mut violations), default);
        let hour = prost_types::Duration { seconds: 3600, nanos: 0 };
        assert_eq!(window("w", Some(hour), default, &mut violations).as_secs(), 3600);
        assert!(violations.is_empty());
        let negative = prost_types::Duration { seconds: -1, nanos: 0 };
        assert_eq!(window("w", Some(negative), default, &mut violations), default);
        assert_eq!(violations.iter().map(|v| v.field.as_str()).collect::<Vec<_>>(), ["w"]);
    }

    #[test]
    fn a_window_past_a_hundred_years_is_a_violation_not_a_database_error() {
        let mut violations = Vec::new();
        let longest = prost_types::Duration::try_from(MAX_WINDOW).ok();
        assert_eq!(optional_window("w", longest, &mut violations), Some(MAX_WINDOW));
        assert!(violations.is_empty());
        let huge = prost_types::Duration { seconds: 10_000_000_000_000, nanos: 0 };
        assert_eq!(optional_window("older_than", Some(huge), &mut violations), None);
        assert_eq!(optional_window("older_than", None, &mut violations), None);
        assert_eq!(violations.iter().map(|v| v.field.as_str()).collect::<Vec<_>>(), ["older_than"]);
    }
}
