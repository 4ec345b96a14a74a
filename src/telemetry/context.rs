//! W3C trace context in and out of gRPC metadata, outbox rows and Kafka headers.

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt as _;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// A span context in W3C form, as stored in `outbox_event.traceparent` / `tracestate`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    /// The `traceparent` header; `None` when no trace is active.
    pub traceparent: Option<String>,
    /// The `tracestate` header, when there is one.
    pub tracestate: Option<String>,
}

impl TraceHeaders {
    /// The context of `span`; empty when tracing export is off.
    pub fn of(span: &Span) -> Self {
        let mut headers = HashMap::new();
        opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&span.context(), &mut headers));
        Self {
            traceparent: headers.remove("traceparent"),
            tracestate: headers.remove("tracestate").filter(|s| !s.is_empty()),
        }
    }
}

/// The context described by stored W3C headers; an empty context when there are none.
pub fn context_from(traceparent: Option<&str>, tracestate: Option<&str>) -> Context {
    let mut headers = HashMap::new();
    if let Some(traceparent) = traceparent {
        headers.insert("traceparent".to_owned(), traceparent.to_owned());
    }
    if let Some(tracestate) = tracestate {
        headers.insert("tracestate".to_owned(), tracestate.to_owned());
    }
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&headers))
}

/// The trace id of a stored `traceparent` (`<version>-<trace id>-<span id>-<flags>`) as 32
/// lower-case hex digits; `None` when it holds none (malformed, or the all-zero invalid id).
pub fn trace_id_of(traceparent: &str) -> Option<String> {
    let trace = traceparent.split('-').nth(1).filter(|t| t.len() == 32)?;
    let id = opentelemetry::trace::TraceId::from_hex(trace).ok()?;
    (id != opentelemetry::trace::TraceId::INVALID).then(|| id.to_string())
}

/// Makes `span` continue `parent`, if `parent` holds a span context.
pub fn follow(span: &Span, parent: Context) {
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    record_trace_id(span);
}

/// Writes `span`'s trace id into its `trace_id` field, so logs can be matched to traces.
pub fn record_trace_id(span: &Span) {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    if span_context.is_valid() {
        span.record("trace_id", tracing::field::display(span_context.trace_id()));
    }
}

/// The context a gRPC caller sent in its request metadata.
pub fn grpc_context(metadata: &tonic::metadata::MetadataMap) -> Context {
    struct Metadata<'a>(&'a tonic::metadata::MetadataMap);
    impl Extractor for Metadata<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0
                .keys()
                .filter_map(|k| match k {
                    tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                    tonic::metadata::KeyRef::Binary(_) => None,
                })
                .collect()
        }
    }
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&Metadata(metadata)))
}

/// Writes `span`'s context as W3C headers through `set(name, value)`.
pub fn inject_into(span: &Span, mut set: impl FnMut(&str, String)) {
    struct Setter<'a, F: FnMut(&str, String)>(&'a mut F);
    impl<F: FnMut(&str, String)> Injector for Setter<'_, F> {
        fn set(&mut self, key: &str, value: String) {
            (self.0)(key, value);
        }
    }
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&span.context(), &mut Setter(&mut set))
    });
}

#[cfg(test)]
mod tests {
    use super::trace_id_of;

    #[test]
    fn a_stored_traceparent_gives_its_trace_id_and_anything_else_none() {
        let traceparent = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id_of(traceparent).as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(trace_id_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of("00-4bf92f35-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of("garbage"), None);
    }
}
