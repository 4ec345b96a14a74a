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
            tracestate: headers.remove("tracestate").and_then(|s| fit_tracestate(&s, TRACESTATE_MAX)),
        }
    }
}

/// The longest `tracestate` stored with an event: the `outbox_event.tracestate` column's length,
/// and the 512 characters W3C asks every vendor to propagate at least.
const TRACESTATE_MAX: usize = 512;

/// What of `tracestate` fits in `max` characters by the W3C rules: list members longer than 128
/// characters go first, then members from the end, until the rest fits. `None` when nothing is
/// left. A caller's trace context never fails its order: it is only ever shortened.
fn fit_tracestate(tracestate: &str, max: usize) -> Option<String> {
    const LONG_MEMBER: usize = 128;
    let mut members: Vec<&str> =
        tracestate.split(',').map(|m| m.trim_matches([' ', '\t'])).filter(|m| !m.is_empty()).collect();
    let length = |members: &[&str]| members.iter().map(|m| m.len() + 1).sum::<usize>().saturating_sub(1);
    while length(&members) > max {
        match members.iter().rposition(|m| m.len() > LONG_MEMBER) {
            Some(long) => members.remove(long),
            None => members.pop().unwrap_or_default(),
        };
    }
    (!members.is_empty()).then(|| members.join(","))
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

/// The trace id of the current span, when it is traced: what ties a record written in a call
/// (an audit row) to the call's span and log lines.
pub fn current_trace_id() -> Option<String> {
    let context = Span::current().context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
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
    use super::*;

    #[test]
    fn a_stored_traceparent_gives_its_trace_id_and_anything_else_none() {
        let traceparent = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id_of(traceparent).as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(trace_id_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of("00-4bf92f35-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of("garbage"), None);
    }

    fn member(key: usize, length: usize) -> String {
        let key = format!("v{key}=");
        format!("{key}{}", "x".repeat(length - key.len()))
    }

    #[test]
    fn a_tracestate_that_fits_is_kept_as_sent_without_blank_members() {
        assert_eq!(fit_tracestate("a=1,b=2", 512).as_deref(), Some("a=1,b=2"));
        assert_eq!(fit_tracestate("a=1 , ,\tb=2", 512).as_deref(), Some("a=1,b=2"));
        assert_eq!(fit_tracestate(" , ", 512), None);
    }

    #[test]
    fn members_are_dropped_from_the_end_until_the_rest_fits() {
        let members: Vec<String> = (0..20).map(|k| member(k, 40)).collect();
        // Twelve members of 40 characters and their commas: 491; a thirteenth would pass 512.
        assert_eq!(fit_tracestate(&members.join(","), TRACESTATE_MAX), Some(members[..12].join(",")));
    }

    #[test]
    fn members_longer_than_128_characters_go_first_wherever_they_are() {
        let (long, short) = (member(1, 300), member(2, 100));
        let sent = [member(0, 100), long, short.clone(), member(3, 100), member(4, 100)].join(",");
        let kept = [member(0, 100), short, member(3, 100), member(4, 100)].join(",");
        assert_eq!(fit_tracestate(&sent, TRACESTATE_MAX), Some(kept));
    }

    #[test]
    fn a_single_member_too_long_to_fit_leaves_nothing() {
        assert_eq!(fit_tracestate(&member(0, 600), TRACESTATE_MAX), None);
    }
}
