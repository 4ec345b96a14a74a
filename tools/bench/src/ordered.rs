//! The ordered-relay phase's pure parts: the shape of its backlog (many versions per order),
//! the order the backlog is written in, and the ratio it is judged by.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

use crate::measure::now_micros;
use crate::payload;
use crate::sql::statement;

/// Orders and versions (events) per order of the backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) orders: u64,
    pub(crate) versions: u64,
}

impl Shape {
    /// The full run's: 10,000 events over 1,000 orders (issue 25, item 7).
    pub(crate) const FULL: Self = Self { orders: 1_000, versions: 10 };
    /// `--quick`'s: 1,000 events over 100 orders.
    pub(crate) const QUICK: Self = Self { orders: 100, versions: 10 };

    /// Events in the backlog.
    pub(crate) fn events(self) -> u64 {
        self.orders * self.versions
    }
}

/// The ordered relay's rate over the one-event-per-order relay's on the same number of events
/// must be at least this (issue 25).
pub(crate) const TARGET: f64 = 0.8;

/// Amends offered per second in the latency part: modest, a few per cent of what the pipeline
/// sustains, so the figure is the ordering's cost and not a queue.
pub(crate) const AMEND_RATE: f64 = 100.0;

/// Orders the amends go round: each is amended every `AMENDED_ORDERS / AMEND_RATE` s (0.5 s).
pub(crate) const AMENDED_ORDERS: usize = 50;

/// The ordered relay's rate over the one-event-per-order relay's; none without a baseline.
pub(crate) fn ratio(ordered: f64, one_per_order: f64) -> Option<f64> {
    (one_per_order > 0.0 && ordered.is_finite()).then(|| ordered / one_per_order)
}

/// The backlog's events, oldest first, as (order, version), orders numbered from 1: in rounds,
/// every order's version n before any order's version n + 1, as a client that accepts its
/// orders and then amends them in turn writes them.
pub(crate) fn layout(shape: Shape) -> impl Iterator<Item = (u64, u64)> {
    (1..=shape.versions).flat_map(move |version| (1..=shape.orders).map(move |order| (order, version)))
}

/// Fills the outbox with the backlog of `shape` as [`layout`] orders it: PENDING rows as the
/// order service writes them (version 1 an `OrderAccepted`, later ones `OrderAmended`, aggregate
/// id = order id, `event_version` = version), in multi-row inserts like the relay phase's
/// backlog; versions after the first `held_back`, as the order service writes a change whose
/// previous version is not yet published. Only outbox rows: the relay reads nothing else.
pub(crate) async fn prefill(db: &DatabaseConnection, shape: Shape) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let base = now_micros() - chrono::Duration::hours(1);
    let events: Vec<(u64, u64)> = layout(shape).collect();
    for (chunk_no, chunk) in events.chunks(500).enumerate() {
        let mut sql = String::from(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
             payload, status, attempts, created_at, held_back) VALUES ",
        );
        let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 10);
        for (i, &(order, version)) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
            let n = i64::try_from(chunk_no * 500 + i).unwrap_or(i64::MAX);
            let at = base + chrono::Duration::microseconds(n * 10);
            let event_id = uuid::Uuid::now_v7().to_string();
            let order_id = i64::try_from(order).unwrap_or(i64::MAX);
            let version = i64::try_from(version).unwrap_or(i64::MAX);
            let request_id = format!("bench-{event_id}");
            let (event_type, payload) = if version == 1 {
                (
                    idempost::contract::EVENT_TYPE,
                    payload::order_accepted(&event_id, order_id, &request_id, at),
                )
            } else {
                let amended = payload::order_amended(&event_id, order_id, version, &request_id, at);
                (idempost::contract::ORDER_AMENDED_EVENT_TYPE, amended)
            };
            values.extend([
                event_id.into(),
                idempost::contract::AGGREGATE_TYPE.into(),
                order_id.to_string().into(),
                event_type.into(),
                version.into(),
                payload.into(),
                "PENDING".into(),
                0i32.into(),
                at.into(),
                // As the order service writes a change while its previous version is unpublished.
                (version > 1).into(),
            ]);
        }
        db.execute_raw(statement(backend, &sql, values)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_shape_is_ten_thousand_events_over_a_thousand_orders() {
        assert_eq!(Shape::FULL.events(), 10_000);
        assert_eq!(Shape::FULL.orders, 1_000);
        assert_eq!(Shape::QUICK.events(), 1_000);
    }

    #[test]
    fn the_layout_writes_every_orders_version_n_before_any_orders_version_n_plus_one() {
        let shape = Shape { orders: 3, versions: 2 };
        let events: Vec<_> = layout(shape).collect();
        assert_eq!(events, vec![(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (3, 2)]);
    }

    #[test]
    fn the_layout_holds_each_orders_versions_once_and_in_order() {
        let shape = Shape { orders: 7, versions: 5 };
        let events: Vec<_> = layout(shape).collect();
        assert_eq!(events.len() as u64, shape.events());
        for order in 1..=shape.orders {
            let versions: Vec<u64> = events.iter().filter(|(o, _)| *o == order).map(|(_, v)| *v).collect();
            assert_eq!(versions, (1..=shape.versions).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_ratio_is_the_ordered_rate_over_the_one_per_order_rate() {
        assert_eq!(ratio(4_000.0, 5_000.0), Some(0.8));
        assert!(ratio(4_000.0, 5_000.0).is_some_and(|r| r >= TARGET));
        assert!(ratio(3_999.0, 5_000.0).is_some_and(|r| r < TARGET));
    }

    #[test]
    fn there_is_no_ratio_without_a_baseline() {
        assert_eq!(ratio(4_000.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 5_000.0), None);
    }
}
