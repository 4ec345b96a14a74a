//! From a Kafka record to the facts the consumer acts on, or a reason it cannot.

use prost::Message as _;

use crate::contract::EVENT_TYPE;
use crate::domain::EventId;
use crate::proto::v1::OrderAccepted;

/// What the consumer needs of an OrderAccepted event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderAcceptedEvent {
    /// The event's stable id, from the payload: never a broker offset or message id.
    pub event_id: EventId,
    /// The accepted order.
    pub order_id: i64,
    /// The version of the order's facts the event describes.
    pub version: i64,
}

/// A record that cannot be acted on, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Poison {
    /// What is wrong with the record.
    pub reason: String,
    /// The event id from the `event_id` header, when there is one, so the dead letter can still
    /// be found by it.
    pub event_id: Option<String>,
}

/// Decodes a record's value, checking it against the `event_type` and `event_id` headers when
/// they are present.
pub fn decode(
    payload: Option<&[u8]>,
    header: impl Fn(&str) -> Option<String>,
) -> Result<OrderAcceptedEvent, Poison> {
    let header_event_id = header("event_id");
    let poison = |reason: String| Poison { reason, event_id: header_event_id.clone() };
    if let Some(event_type) = header("event_type")
        && event_type != EVENT_TYPE
    {
        return Err(poison(format!("unsupported event_type `{event_type}`; expected {EVENT_TYPE}")));
    }
    let payload = payload.ok_or_else(|| poison("the record has no value".to_owned()))?;
    let event = OrderAccepted::decode(payload).map_err(|e| poison(format!("not an OrderAccepted: {e}")))?;
    let event_id =
        EventId::parse(&event.event_id).map_err(|e| poison(format!("event_id `{}` {e}", event.event_id)))?;
    if header_event_id.as_deref().is_some_and(|h| h != event.event_id) {
        return Err(poison(format!("the event_id header differs from the payload's {}", event.event_id)));
    }
    if event.order_id <= 0 || event.event_version <= 0 {
        return Err(poison(format!(
            "order_id {} and event_version {} must be positive",
            event.order_id, event.event_version
        )));
    }
    Ok(OrderAcceptedEvent { event_id, order_id: event.order_id, version: event.event_version })
}
