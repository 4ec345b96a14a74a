//! The order's events as the outbox stores them: OrderAccepted (the facts at acceptance),
//! OrderAmended (the whole order after a change) and OrderCancelled, each encoded once.

use chrono::{DateTime, Utc};
use idempost_proto::EventId;
use idempost_proto::v1 as pb;
use prost::Message;

use idempost::domain::{CancelReason, ChangeOrder, NewOrder, SubmitOrder};
use idempost::edge::timestamp;

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

/// The order as a change left it, for its event.
#[derive(Debug, Clone)]
pub(crate) struct ChangedOrder<'a> {
    pub(crate) event_id: EventId,
    pub(crate) order_id: i64,
    pub(crate) version: i64,
    pub(crate) change: &'a ChangeOrder,
    pub(crate) committed_at: DateTime<Utc>,
}

/// Encodes the OrderAmended snapshot: the whole order after the change.
pub(crate) fn encode_order_amended(changed: &ChangedOrder<'_>, order: &NewOrder) -> Vec<u8> {
    pb::OrderAmended {
        event_id: changed.event_id.to_string(),
        event_version: changed.version,
        order_id: changed.order_id,
        tenant_id: changed.change.tenant_id.get(),
        request_id: changed.change.request_id.to_string(),
        customer_id: order.customer_id().as_str().to_owned(),
        currency: order.currency().to_owned(),
        line_items: order.lines().iter().map(pb::LineItem::from).collect(),
        total_minor: order.total_minor(),
        amended_at: Some(timestamp(changed.committed_at)),
    }
    .encode_to_vec()
}

/// Encodes the OrderCancelled event of an order whose total was `total_minor`.
pub(crate) fn encode_order_cancelled(
    changed: &ChangedOrder<'_>,
    reason: CancelReason,
    note: &str,
    total_minor: i64,
) -> Vec<u8> {
    pb::OrderCancelled {
        event_id: changed.event_id.to_string(),
        event_version: changed.version,
        order_id: changed.order_id,
        tenant_id: changed.change.tenant_id.get(),
        request_id: changed.change.request_id.to_string(),
        reason: pb::CancelReason::from(reason).into(),
        note: note.to_owned(),
        total_minor,
        cancelled_at: Some(timestamp(changed.committed_at)),
    }
    .encode_to_vec()
}
