//! Each record as the CloudEvents 1.0 Kafka protocol binding writes it: binary mode (the payload
//! verbatim, the attributes in `ce_*` headers) or structured mode (the value is the JSON envelope).
//! The project's own headers stay in both modes, so consumers written before either keep working.
//!
//! Written here rather than with the `cloudevents-sdk` crate: its Kafka binding is tied to an
//! rdkafka release of its own and its API is marked unstable, for a mapping of a dozen fields.

use std::borrow::Cow;

use base64::prelude::{BASE64_STANDARD, Engine as _};
use chrono::SecondsFormat;
use rdkafka::message::{Header, OwnedHeaders};

use super::super::outbox::ClaimedEvent;
use idempost::contract::{CLOUDEVENTS_JSON, CLOUDEVENTS_SOURCE, CLOUDEVENTS_SPEC_VERSION, CONTENT_TYPE};

/// How records carry the CloudEvents attributes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CloudEventsMode {
    /// The value is the protobuf payload; the attributes are `ce_*` headers.
    #[default]
    Binary,
    /// The value is the `application/cloudevents+json` envelope, the payload in `data_base64`.
    Structured,
}

/// A record's headers and value, borrowing the payload when it goes out verbatim.
pub(super) struct Encoded<'e> {
    pub(super) headers: OwnedHeaders,
    pub(super) value: Cow<'e, [u8]>,
}

/// The record for `event` in `mode`; `trace` holds the W3C trace context headers of its send.
///
/// Binary mode without `legacy_headers` leaves out the project's own headers that a `ce_*`
/// header repeats (`event_id` = `ce_id`, `event_type` = `ce_type`, `aggregate_id` =
/// `ce_subject`, `traceparent` and `tracestate` = theirs): a broker may pay for every header
/// (Tansu 0.6 writes each as a row of its own, see `docs/design/tansu.md`), and the consumer
/// reads either. Structured mode keeps them: its `ce_*` attributes are inside the value, where
/// a reader of headers does not look.
pub(super) fn encode<'e>(
    event: &'e ClaimedEvent,
    mode: CloudEventsMode,
    legacy_headers: bool,
    trace: &[(String, String)],
) -> Encoded<'e> {
    let version = event.event_version.to_string();
    let content_type = match mode {
        CloudEventsMode::Binary => CONTENT_TYPE,
        CloudEventsMode::Structured => CLOUDEVENTS_JSON,
    };
    let repeated = legacy_headers || mode == CloudEventsMode::Structured;
    let mut headers = OwnedHeaders::new_with_capacity(16);
    if repeated {
        headers = headers
            .insert(header("event_id", &event.event_id))
            .insert(header("event_type", &event.event_type));
    }
    headers = headers
        .insert(header("event_version", &version))
        .insert(header("aggregate_type", &event.aggregate_type));
    if repeated {
        headers = headers.insert(header("aggregate_id", &event.aggregate_id));
    }
    headers = headers.insert(header("content-type", content_type));
    if repeated {
        for (key, value) in trace {
            headers = headers.insert(header(key, value));
        }
    }
    match mode {
        CloudEventsMode::Binary => {
            for attribute in attributes(event, trace) {
                headers = headers.insert(header(attribute.header, &attribute.value));
            }
            Encoded { headers, value: Cow::Borrowed(&event.payload) }
        }
        CloudEventsMode::Structured => Encoded { headers, value: Cow::Owned(envelope(event, trace)) },
    }
}

/// One CloudEvents context attribute: its name in the JSON format, its binary-mode header, its
/// value (borrowed from the event where it can be).
struct Attribute<'a> {
    name: &'static str,
    header: &'static str,
    value: Cow<'a, str>,
}

/// The CloudEvents context attributes of `event` but its data content type (the `content-type`
/// header in binary mode), the distributed-tracing extension's included when the send is traced.
fn attributes<'a>(event: &'a ClaimedEvent, trace: &'a [(String, String)]) -> Vec<Attribute<'a>> {
    let attribute = |name, header, value| Attribute { name, header, value };
    let mut attributes = Vec::with_capacity(8);
    attributes.extend([
        attribute("specversion", "ce_specversion", Cow::Borrowed(CLOUDEVENTS_SPEC_VERSION)),
        attribute("id", "ce_id", Cow::Borrowed(event.event_id.as_str())),
        attribute("source", "ce_source", Cow::Borrowed(CLOUDEVENTS_SOURCE)),
        attribute("type", "ce_type", Cow::Borrowed(event.event_type.as_str())),
        attribute("subject", "ce_subject", Cow::Borrowed(event.aggregate_id.as_str())),
        attribute(
            "time",
            "ce_time",
            Cow::Owned(event.created_at.to_rfc3339_opts(SecondsFormat::Micros, true)),
        ),
    ]);
    for (key, value) in trace {
        match key.as_str() {
            "traceparent" => {
                attributes.push(attribute("traceparent", "ce_traceparent", Cow::Borrowed(value)))
            }
            "tracestate" => attributes.push(attribute("tracestate", "ce_tracestate", Cow::Borrowed(value))),
            _ => {}
        }
    }
    attributes
}

/// The JSON event format of `event`: its attributes, `datacontenttype` and the protobuf payload
/// in `data_base64` (the format's member for binary data).
fn envelope(event: &ClaimedEvent, trace: &[(String, String)]) -> Vec<u8> {
    let mut envelope: serde_json::Map<String, serde_json::Value> = attributes(event, trace)
        .into_iter()
        .map(|attribute| (attribute.name.to_owned(), attribute.value.into_owned().into()))
        .collect();
    envelope.insert("datacontenttype".to_owned(), CONTENT_TYPE.into());
    envelope.insert("data_base64".to_owned(), BASE64_STANDARD.encode(&event.payload).into());
    serde_json::Value::Object(envelope).to_string().into_bytes()
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header { key, value: Some(value) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rdkafka::message::Headers as _;

    fn event() -> ClaimedEvent {
        ClaimedEvent {
            event_id: "0190f8a6-0000-7000-8000-000000000001".to_owned(),
            aggregate_type: "order".to_owned(),
            aggregate_id: "42".to_owned(),
            event_type: "idempost.v1.OrderAccepted".to_owned(),
            event_version: 1,
            payload: vec![1, 2, 3, 250],
            attempts: 1,
            lease_until: chrono::Utc::now(),
            lease_token: crate::LeaseToken::new(&crate::WorkerId::generate()),
            created_at: "2026-12-06T09:30:00.123456Z".parse().unwrap(),
            traceparent: None,
            tracestate: None,
        }
    }

    fn text(headers: &OwnedHeaders, key: &str) -> Option<String> {
        headers
            .iter()
            .find(|h| h.key == key)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn binary_mode_keeps_the_payload_and_adds_every_attribute_as_a_ce_header() {
        let trace = [(
            "traceparent".to_owned(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
        )];
        let event = event();
        let record = encode(&event, CloudEventsMode::Binary, true, &trace);
        assert_eq!(&*record.value, &[1, 2, 3, 250]);
        let h = |key| text(&record.headers, key);
        assert_eq!(h("ce_specversion").as_deref(), Some("1.0"));
        assert_eq!(h("ce_id"), h("event_id"));
        assert_eq!(h("ce_source").as_deref(), Some("/idempost/orders"));
        assert_eq!(h("ce_type").as_deref(), Some("idempost.v1.OrderAccepted"));
        assert_eq!(h("ce_subject").as_deref(), Some("42"));
        assert_eq!(h("ce_time").as_deref(), Some("2026-12-06T09:30:00.123456Z"));
        assert_eq!(h("ce_traceparent"), h("traceparent"));
        assert_eq!(h("ce_tracestate"), None, "no tracestate when the send has none");
        assert_eq!(h("content-type").as_deref(), Some(CONTENT_TYPE));
    }

    #[test]
    fn structured_mode_puts_the_attributes_and_the_payload_in_the_envelope() {
        let event = event();
        let record = encode(&event, CloudEventsMode::Structured, false, &[]);
        let envelope: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
        assert_eq!(envelope["specversion"], "1.0");
        assert_eq!(envelope["id"], "0190f8a6-0000-7000-8000-000000000001");
        assert_eq!(envelope["subject"], "42");
        assert_eq!(envelope["datacontenttype"], CONTENT_TYPE);
        assert_eq!(
            BASE64_STANDARD.decode(envelope["data_base64"].as_str().unwrap()).unwrap(),
            [1, 2, 3, 250]
        );
        assert_eq!(text(&record.headers, "content-type").as_deref(), Some(CLOUDEVENTS_JSON));
        assert_eq!(text(&record.headers, "ce_id"), None, "the envelope alone carries the attributes");
        assert_eq!(
            text(&record.headers, "event_id").as_deref(),
            Some("0190f8a6-0000-7000-8000-000000000001")
        );
    }

    #[test]
    fn binary_mode_without_legacy_headers_leaves_out_only_what_a_ce_header_repeats() {
        let trace = [
            ("traceparent".to_owned(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned()),
            ("tracestate".to_owned(), "vendor=1".to_owned()),
        ];
        let event = event();
        let record = encode(&event, CloudEventsMode::Binary, false, &trace);
        let keys: Vec<&str> = record.headers.iter().map(|h| h.key).collect();
        assert_eq!(
            keys,
            [
                "event_version",
                "aggregate_type",
                "content-type",
                "ce_specversion",
                "ce_id",
                "ce_source",
                "ce_type",
                "ce_subject",
                "ce_time",
                "ce_traceparent",
                "ce_tracestate"
            ]
        );
        assert_eq!(text(&record.headers, "ce_id").as_deref(), Some("0190f8a6-0000-7000-8000-000000000001"));
        assert_eq!(text(&record.headers, "ce_tracestate").as_deref(), Some("vendor=1"));
        let with = encode(&event, CloudEventsMode::Binary, true, &trace);
        assert_eq!(with.headers.count(), keys.len() + 5, "the five repeated headers come back");
    }
}
