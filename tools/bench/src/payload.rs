//! The one order every phase uses, so raw and Idempost phases move the same bytes.

use chrono::{DateTime, Utc};
use prost::Message as _;

use idempost_proto::v1 as pb;

/// The bench's tenant.
pub(crate) const TENANT: i64 = 4242;
pub(crate) const CUSTOMER: &str = "bench-customer-0001";
pub(crate) const SKU: &str = "BENCH-MUG";
pub(crate) const QUANTITY: i32 = 2;
pub(crate) const UNIT_PRICE: i64 = 1250;

/// The one line item every bench order has.
fn line_items() -> Vec<pb::LineItem> {
    vec![pb::LineItem { sku: SKU.into(), quantity: QUANTITY as u32, unit_price_minor: UNIT_PRICE }]
}

/// A SubmitOrder request with a fresh request id.
pub(crate) fn request(request_id: String) -> pb::SubmitOrderRequest {
    pb::SubmitOrderRequest {
        tenant_id: TENANT,
        request_id,
        customer_id: CUSTOMER.into(),
        currency: "EUR".into(),
        line_items: line_items(),
        event_id: String::new(),
    }
}

/// What the order service would store for the same order: an encoded `OrderAccepted`.
pub(crate) fn order_accepted(event_id: &str, order_id: i64, request_id: &str, at: DateTime<Utc>) -> Vec<u8> {
    pb::OrderAccepted {
        event_id: event_id.to_owned(),
        event_version: 1,
        order_id,
        tenant_id: TENANT,
        request_id: request_id.to_owned(),
        customer_id: CUSTOMER.into(),
        currency: "EUR".into(),
        line_items: line_items(),
        total_minor: i64::from(QUANTITY) * UNIT_PRICE,
        accepted_at: Some(prost_types::Timestamp {
            seconds: at.timestamp(),
            nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
        }),
    }
    .encode_to_vec()
}

/// The amended line items of an order's `version`: the bench's one line, its quantity changed
/// with each version (1 to 5), so every amendment really changes the order.
fn amended_lines(version: i64) -> Vec<pb::LineItem> {
    let quantity = u32::try_from(1 + version.rem_euclid(5)).unwrap_or(1);
    vec![pb::LineItem { sku: SKU.into(), quantity, unit_price_minor: UNIT_PRICE }]
}

/// An AmendOrder request with a fresh request id that moves `order_id` from `expected_version`
/// to the next version.
pub(crate) fn amend_request(
    request_id: String,
    order_id: i64,
    expected_version: i64,
) -> pb::AmendOrderRequest {
    pb::AmendOrderRequest {
        tenant_id: TENANT,
        request_id,
        order_id,
        expected_version,
        line_items: amended_lines(expected_version + 1),
        customer_id: String::new(),
        event_id: String::new(),
    }
}

/// What the order service would store for version `version` of an order: an encoded
/// `OrderAmended` with the lines [`amend_request`] sets.
pub(crate) fn order_amended(
    event_id: &str,
    order_id: i64,
    version: i64,
    request_id: &str,
    at: DateTime<Utc>,
) -> Vec<u8> {
    let line_items = amended_lines(version);
    let total_minor = line_items.iter().map(|l| i64::from(l.quantity) * l.unit_price_minor).sum();
    pb::OrderAmended {
        event_id: event_id.to_owned(),
        event_version: version,
        order_id,
        tenant_id: TENANT,
        request_id: request_id.to_owned(),
        customer_id: CUSTOMER.into(),
        currency: "EUR".into(),
        line_items,
        total_minor,
        amended_at: Some(prost_types::Timestamp {
            seconds: at.timestamp(),
            nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
        }),
    }
    .encode_to_vec()
}

/// The columns of an order, its line and its outbox row, as plain values.
#[derive(Debug, Clone)]
pub(crate) struct OrderRow {
    pub(crate) request_id: String,
    pub(crate) event_id: String,
    pub(crate) at: DateTime<Utc>,
}

impl OrderRow {
    pub(crate) fn fresh() -> Self {
        let event_id = uuid::Uuid::now_v7().to_string();
        Self { request_id: format!("bench-{event_id}"), event_id, at: crate::measure::now_micros() }
    }
}
