//! Per-order order as the tests check it: the changes of an order, version by version, and the
//! read model a consumer must end with.

use std::collections::BTreeMap;

use idempost_proto::v1 as pb;
use prost::Message as _;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, Statement};

use crate::order::{order, order_accepted};

/// The final state the read model must show for an order after its versions `1..=versions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub version: i64,
    pub status: String,
    pub total: i64,
}

/// The total version `version` of order `order_id` carries.
fn total_of(order_id: i64, version: i64) -> i64 {
    1_000 * version + order_id % 1_000
}

/// The event type and payload of version `version` of order `order_id`: OrderAccepted at 1,
/// OrderCancelled at `last` for even orders, OrderAmended otherwise.
pub fn change_payload(order_id: i64, version: i64, last: i64, event_id: &str) -> (&'static str, Vec<u8>) {
    let total_minor = total_of(order_id, version);
    if version == 1 {
        let accepted = order_accepted(order_id, event_id, total_minor);
        return ("idempost.v1.OrderAccepted", accepted.encode_to_vec());
    }
    if version == last && order_id % 2 == 0 {
        let cancelled = pb::OrderCancelled {
            event_id: event_id.to_owned(),
            event_version: version,
            order_id,
            tenant_id: 7,
            request_id: format!("req-{order_id}-{version}"),
            reason: pb::CancelReason::CustomerRequest.into(),
            note: "changed my mind".to_owned(),
            total_minor,
            cancelled_at: None,
        };
        return ("idempost.v1.OrderCancelled", cancelled.encode_to_vec());
    }
    let amended = pb::OrderAmended {
        event_id: event_id.to_owned(),
        event_version: version,
        order_id,
        tenant_id: 7,
        request_id: format!("req-{order_id}-{version}"),
        customer_id: "c".to_owned(),
        currency: "EUR".to_owned(),
        line_items: order(7, "x").line_items,
        total_minor,
        amended_at: None,
    };
    ("idempost.v1.OrderAmended", amended.encode_to_vec())
}

/// What the read model must hold for order `order_id` after versions `1..=last`.
pub fn expected(order_id: i64, last: i64) -> Expected {
    let cancelled = last > 1 && order_id % 2 == 0;
    Expected {
        version: last,
        status: if cancelled { "CANCELLED" } else { "ACCEPTED" }.to_owned(),
        total: total_of(order_id, last),
    }
}

/// The consumer `name`'s read model, by order id.
pub async fn read_model(conn: &DatabaseConnection, name: &str) -> BTreeMap<i64, Expected> {
    let backend = conn.get_database_backend();
    let placeholder = if backend == DbBackend::Postgres { "$1" } else { "?" };
    let sql = format!(
        "SELECT order_id, version, status, total_minor FROM order_view WHERE consumer_name = {placeholder}"
    );
    conn.query_all_raw(Statement::from_sql_and_values(backend, sql, [name.into()]))
        .await
        .unwrap()
        .iter()
        .map(|row| {
            let order_id: i64 = row.try_get_by_index(0).unwrap();
            let expected = Expected {
                version: row.try_get_by_index(1).unwrap(),
                status: row.try_get_by_index(2).unwrap(),
                total: row.try_get_by_index(3).unwrap(),
            };
            (order_id, expected)
        })
        .collect()
}
