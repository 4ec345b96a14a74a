//! From a Kafka record to the facts the consumer acts on, or a reason it cannot.

use std::borrow::Cow;

use idempost_proto::EventId;
use idempost_proto::v1::{OrderAccepted, OrderAmended, OrderCancelled};
use prost::Message as _;

use idempost::contract::{AGGREGATE_TYPE, EVENT_TYPE};

mod envelope;

/// `event_type` of OrderAmended events.
pub(crate) const ORDER_AMENDED: &str = "idempost.v1.OrderAmended";
/// `event_type` of OrderCancelled events.
pub(crate) const ORDER_CANCELLED: &str = "idempost.v1.OrderCancelled";

/// What the consumer needs of one event of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderEvent {
    /// The event's stable id, from the payload (or, for a type this consumer does not know, the
    /// `event_id` header): never a broker offset or message id.
    pub(crate) event_id: EventId,
    /// The order.
    pub(crate) order_id: i64,
    /// The version of the order's facts the event describes.
    pub(crate) version: i64,
    /// The protobuf message name of the payload.
    pub(crate) event_type: String,
    /// What the event makes of the order, or `None` for a type this consumer does not know: such
    /// an event is parked, not applied, so that a consumer that knows it applies it later.
    pub(crate) change: Option<OrderState>,
    /// The record's value, kept for parking.
    pub(crate) payload: Vec<u8>,
}

/// An order as its read model shows it after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OrderState {
    /// The tenant that owns the order.
    pub(crate) tenant_id: i64,
    /// `ACCEPTED` or `CANCELLED`.
    pub(crate) status: &'static str,
    /// The order's total after the event, in minor units.
    pub(crate) total_minor: i64,
}

/// A record that cannot be acted on, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Poison {
    /// What is wrong with the record.
    pub(crate) reason: String,
    /// The event id from the `event_id` header (else `ce_id`), when there is one, so the dead
    /// letter can still be found by it.
    pub(crate) event_id: Option<String>,
}

/// Decodes a record in any form the relay wrote: its own headers only (before CloudEvents),
/// CloudEvents binary mode (the same plus `ce_*` headers) or structured mode (the value is the
/// JSON envelope, unwrapped first). The payload is decoded by its type (the envelope's `type`, else
/// the `event_type` header, else `ce_type`, else OrderAccepted) and checked against every id the
/// record states besides (`event_id`, `ce_id`, the envelope's `id`). A type this consumer does not
/// know is not poison when the headers name its event, order and version: it comes back with no
/// [`OrderEvent::change`], to be parked.
pub fn decode(payload: Option<&[u8]>, header: impl Fn(&str) -> Option<String>) -> Result<OrderEvent, Poison> {
    let header_event_id = header("event_id").or_else(|| header("ce_id"));
    let poison = |reason: String| Poison { reason, event_id: header_event_id.clone() };
    let value = payload.ok_or_else(|| poison("the record has no value".to_owned()))?;
    let (payload, event_type, stated_ids) = if envelope::is_structured(header("content-type").as_deref()) {
        let unwrapped = envelope::unwrap(value).map_err(poison)?;
        (Cow::Owned(unwrapped.payload), Some(unwrapped.event_type), vec![Some(unwrapped.id)])
    } else {
        (Cow::Borrowed(value), None, vec![])
    };
    let stated_ids = [stated_ids, vec![header("event_id"), header("ce_id")]].concat();
    let event_type = stated_type(event_type, &header).map_err(poison)?;
    let known = decode_known(&event_type, &payload).map_err(poison)?;
    let event = match known {
        Some((event_id, order_id, version, change)) => {
            if let Some(other) = stated_ids.iter().flatten().find(|stated| **stated != event_id) {
                return Err(poison(format!("the record states event id {other}, its payload {event_id}")));
            }
            OrderEvent {
                event_id: parse_event_id(&event_id).map_err(poison)?,
                order_id,
                version,
                event_type,
                change: Some(change),
                payload: payload.into_owned(),
            }
        }
        None => unknown(event_type, &payload, &header).map_err(poison)?,
    };
    if event.order_id <= 0 || event.version <= 0 {
        return Err(poison(format!(
            "order_id {} and event_version {} must be positive",
            event.order_id, event.version
        )));
    }
    Ok(event)
}

/// The payload's type: the envelope's when there is one, else the `event_type` header, else
/// `ce_type`, else OrderAccepted (records older than the `event_type` header). Types stated twice
/// must agree.
fn stated_type(envelope: Option<String>, header: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let stated = [envelope, header("event_type"), header("ce_type")];
    let mut named = stated.iter().flatten();
    let Some(first) = named.next() else { return Ok(EVENT_TYPE.to_owned()) };
    match named.find(|other| *other != first) {
        Some(other) => Err(format!("the record states two event types, {first} and {other}")),
        None => Ok(first.clone()),
    }
}

/// The event id, order, version and resulting state of a payload of a type this consumer knows;
/// `Ok(None)` for any other type; `Err` for a payload that is not the message its type names.
pub(crate) fn decode_known(
    event_type: &str,
    payload: &[u8],
) -> Result<Option<(String, i64, i64, OrderState)>, String> {
    let not_a = |e: prost::DecodeError| format!("not an {event_type}: {e}");
    Ok(Some(match event_type {
        EVENT_TYPE => {
            let e = OrderAccepted::decode(payload).map_err(not_a)?;
            let state = OrderState { tenant_id: e.tenant_id, status: ACCEPTED, total_minor: e.total_minor };
            (e.event_id, e.order_id, e.event_version, state)
        }
        ORDER_AMENDED => {
            let e = OrderAmended::decode(payload).map_err(not_a)?;
            let state = OrderState { tenant_id: e.tenant_id, status: ACCEPTED, total_minor: e.total_minor };
            (e.event_id, e.order_id, e.event_version, state)
        }
        ORDER_CANCELLED => {
            let e = OrderCancelled::decode(payload).map_err(not_a)?;
            let state = OrderState { tenant_id: e.tenant_id, status: CANCELLED, total_minor: e.total_minor };
            (e.event_id, e.order_id, e.event_version, state)
        }
        _ => return Ok(None),
    }))
}

/// The read model's status of an order not cancelled.
pub(crate) const ACCEPTED: &str = "ACCEPTED";
/// The read model's status of a cancelled order.
pub(crate) const CANCELLED: &str = "CANCELLED";

fn parse_event_id(text: &str) -> Result<EventId, String> {
    EventId::parse(text).map_err(|e| format!("event_id `{text}` {e}"))
}

/// An event of a type this consumer does not know, identified by its headers alone.
fn unknown(
    event_type: String,
    payload: &[u8],
    header: &impl Fn(&str) -> Option<String>,
) -> Result<OrderEvent, String> {
    let unsupported = |what: &str| format!("unsupported event_type `{event_type}` {what}");
    if header("aggregate_type").as_deref() != Some(AGGREGATE_TYPE) {
        return Err(unsupported("of no order aggregate"));
    }
    // A binary-mode record written without the legacy headers (the relay's `--legacy-headers
    // false`) names its event and order in `ce_id` and `ce_subject` only.
    let event_id = header("event_id")
        .or_else(|| header("ce_id"))
        .ok_or_else(|| unsupported("without an event_id or ce_id header"))?;
    let number = |value: Option<String>| value.and_then(|value| value.parse::<i64>().ok());
    let order_id = number(header("aggregate_id").or_else(|| header("ce_subject")))
        .ok_or_else(|| unsupported("without an order id"))?;
    let version = number(header("event_version")).ok_or_else(|| unsupported("without an event_version"))?;
    Ok(OrderEvent {
        event_id: parse_event_id(&event_id)?,
        order_id,
        version,
        event_type,
        change: None,
        payload: payload.to_vec(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use base64::prelude::{BASE64_STANDARD, Engine as _};
    use idempost::contract::CONTENT_TYPE;

    fn headers(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> =
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn an_amendment_and_a_cancellation_decode_to_the_state_they_leave() {
        let id = EventId::new().to_string();
        let amended = OrderAmended {
            event_id: id.clone(),
            event_version: 2,
            order_id: 9,
            tenant_id: 3,
            total_minor: 50,
            ..Default::default()
        };
        let event = decode(
            Some(&amended.encode_to_vec()),
            headers(&[("event_type", ORDER_AMENDED), ("event_id", &id)]),
        )
        .unwrap();
        assert_eq!((event.order_id, event.version), (9, 2));
        assert_eq!(event.change, Some(OrderState { tenant_id: 3, status: ACCEPTED, total_minor: 50 }));
        let cancelled = OrderCancelled {
            event_id: id,
            event_version: 3,
            order_id: 9,
            tenant_id: 3,
            total_minor: 50,
            ..Default::default()
        };
        let event =
            decode(Some(&cancelled.encode_to_vec()), headers(&[("event_type", ORDER_CANCELLED)])).unwrap();
        assert_eq!(event.change.map(|c| c.status), Some(CANCELLED));
    }

    #[test]
    fn an_unknown_type_with_its_headers_is_an_event_to_park_and_without_them_is_poison() {
        let id = EventId::new().to_string();
        let full = [
            ("event_type", "idempost.v1.OrderShipped"),
            ("event_id", id.as_str()),
            ("aggregate_type", "order"),
            ("aggregate_id", "12"),
            ("event_version", "4"),
        ];
        let event = decode(Some(b"future bytes"), headers(&full)).unwrap();
        assert_eq!((event.order_id, event.version, event.change), (12, 4, None));
        assert_eq!(event.event_type, "idempost.v1.OrderShipped");
        let without_version = &full[..4];
        assert!(decode(Some(b"future bytes"), headers(without_version)).is_err());
    }

    #[test]
    fn an_unknown_type_named_by_its_ce_headers_alone_is_an_event_to_park() {
        let id = EventId::new().to_string();
        let without_legacy = [
            ("ce_type", "idempost.v1.OrderShipped"),
            ("ce_id", id.as_str()),
            ("aggregate_type", "order"),
            ("ce_subject", "12"),
            ("event_version", "4"),
        ];
        let event = decode(Some(b"future bytes"), headers(&without_legacy)).unwrap();
        assert_eq!((event.order_id, event.version, event.change), (12, 4, None));
        assert_eq!((event.event_id.to_string(), event.event_type.as_str()), (id, "idempost.v1.OrderShipped"));
    }
    fn accepted(id: &str) -> OrderAccepted {
        OrderAccepted {
            event_id: id.to_owned(),
            event_version: 1,
            order_id: 5,
            tenant_id: 3,
            total_minor: 700,
            ..Default::default()
        }
    }

    fn envelope(id: &str, data_base64: &str) -> Vec<u8> {
        serde_json::json!({
            "specversion": "1.0",
            "id": id,
            "source": "/idempost/orders",
            "type": EVENT_TYPE,
            "subject": "5",
            "time": "2026-12-06T09:30:00.123456Z",
            "datacontenttype": "application/x-protobuf",
            "data_base64": data_base64,
        })
        .to_string()
        .into_bytes()
    }

    const STRUCTURED: &str = "application/cloudevents+json; charset=UTF-8";

    #[test]
    fn a_record_written_before_cloudevents_with_its_own_headers_only_decodes() {
        let id = EventId::new().to_string();
        let legacy = [("event_id", id.as_str()), ("event_type", EVENT_TYPE), ("content-type", CONTENT_TYPE)];
        let event = decode(Some(&accepted(&id).encode_to_vec()), headers(&legacy)).unwrap();
        assert_eq!((event.event_id.to_string(), event.order_id, event.version), (id, 5, 1));
        assert_eq!(event.change, Some(OrderState { tenant_id: 3, status: ACCEPTED, total_minor: 700 }));
    }

    #[test]
    fn a_binary_mode_record_decodes_and_a_ce_id_or_ce_type_that_disagrees_is_poison() {
        let id = EventId::new().to_string();
        let payload = accepted(&id).encode_to_vec();
        let binary = [
            ("event_id", id.as_str()),
            ("event_type", EVENT_TYPE),
            ("content-type", CONTENT_TYPE),
            ("ce_specversion", "1.0"),
            ("ce_id", id.as_str()),
            ("ce_source", "/idempost/orders"),
            ("ce_type", EVENT_TYPE),
            ("ce_subject", "5"),
        ];
        assert_eq!(decode(Some(&payload), headers(&binary)).unwrap().order_id, 5);
        let only_ce = [("ce_id", id.as_str()), ("ce_type", EVENT_TYPE)];
        assert_eq!(decode(Some(&payload), headers(&only_ce)).unwrap().event_id.to_string(), id);
        let other = EventId::new().to_string();
        let wrong_id = [("event_id", id.as_str()), ("ce_id", other.as_str())];
        let poison = decode(Some(&payload), headers(&wrong_id)).unwrap_err();
        assert_eq!(poison.reason, format!("the record states event id {other}, its payload {id}"));
        let wrong_type = [("event_type", EVENT_TYPE), ("ce_type", ORDER_AMENDED)];
        let poison = decode(Some(&payload), headers(&wrong_type)).unwrap_err();
        assert!(poison.reason.contains("two event types"), "{poison}");
    }

    #[test]
    fn a_structured_mode_record_is_unwrapped_and_applied_like_its_payload() {
        let id = EventId::new().to_string();
        let value = envelope(&id, &BASE64_STANDARD.encode(accepted(&id).encode_to_vec()));
        let event =
            decode(Some(&value), headers(&[("content-type", STRUCTURED), ("event_id", &id)])).unwrap();
        assert_eq!((event.event_id.to_string(), event.order_id), (id.clone(), 5));
        assert_eq!(event.payload, accepted(&id).encode_to_vec(), "the payload, not the envelope, is kept");
        let upper_case = [("content-type", "Application/CloudEvents+JSON")];
        assert_eq!(decode(Some(&value), headers(&upper_case)).unwrap().order_id, 5);
    }

    #[test]
    fn a_bad_envelope_is_poison_that_says_what_is_wrong() {
        let id = EventId::new().to_string();
        let payload = BASE64_STANDARD.encode(accepted(&id).encode_to_vec());
        let other = EventId::new().to_string();
        let mut data_not_base64: serde_json::Value = serde_json::from_slice(&envelope(&id, "")).unwrap();
        data_not_base64["data"] = serde_json::json!({"order_id": 5});
        data_not_base64.as_object_mut().unwrap().remove("data_base64");
        let old_spec = String::from_utf8(envelope(&id, &payload)).unwrap().replace("\"1.0\"", "\"0.3\"");
        let cases: [(Vec<u8>, &str); 5] = [
            (b"{not json".to_vec(), "not a CloudEvents JSON envelope"),
            (old_spec.into_bytes(), "specversion `0.3` is not 1.0"),
            (data_not_base64.to_string().into_bytes(), "carries `data`, not the protobuf payload"),
            (envelope(&id, "***"), "data_base64 is not base64"),
            (envelope(&other, &payload), "states event id"),
        ];
        for (value, reason) in cases {
            let poison = decode(Some(&value), headers(&[("content-type", STRUCTURED), ("event_id", &id)]))
                .unwrap_err();
            assert!(poison.reason.contains(reason), "{reason}: {poison}");
            assert_eq!(poison.event_id.as_deref(), Some(id.as_str()), "the dead letter stays findable");
        }
    }
}
