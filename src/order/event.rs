//! The OrderAccepted event as the outbox stores it: the order's facts at acceptance, encoded once.

use chrono::{DateTime, Utc};
use prost::Message;

use crate::domain::{EventId, SubmitOrder};
use crate::edge::timestamp;
use crate::proto::v1 as pb;

/// Encodes the acceptance snapshot of `submit` as committed under `order_id`.
pub(crate) fn encode_order_accepted(
    event_id: EventId,
    order_id: i64,
    version: i64,
    submit: &SubmitOrder,
    accepted_at: DateTime<Utc>,
) -> Vec<u8> {
    let order = &submit.order;
    pb::OrderAccepted {
        event_id: event_id.to_string(),
        event_version: version,
        order_id,
        tenant_id: submit.tenant_id.get(),
        request_id: submit.request_id.to_string(),
        customer_id: order.customer_id().as_str().to_owned(),
        currency: order.currency().to_owned(),
        line_items: order.lines().iter().map(pb::LineItem::from).collect(),
        total_minor: order.total_minor(),
        accepted_at: Some(timestamp(accepted_at)),
    }
    .encode_to_vec()
}
