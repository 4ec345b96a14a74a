//! Per-order order, checked on the evidence: on the topic every order's versions are
//! non-decreasing and complete (a re-sent earlier version may repeat only before the next version
//! appears), and the consumer's read model of every order (order_view) equals the order table.

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbErr};

use crate::evidence::{Record, statement};

/// What the per-order checks found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrderCheck {
    /// Orders checked.
    pub orders: u64,
    /// Versions checked: the sum over the orders of their version in the order table.
    pub versions: u64,
    /// Every violation, naming its order; empty when all held.
    pub violations: Vec<String>,
}

impl OrderCheck {
    /// `N order(s), M version(s)` and the violations, for a report.
    pub fn describe(&self) -> String {
        let checked = format!("{} order(s), {} version(s) checked", self.orders, self.versions);
        if self.violations.is_empty() {
            checked
        } else {
            format!("{checked}; {}", self.violations.join("; "))
        }
    }
}

/// Checks the topic's records of every order in `last` (order id → its version in the order
/// table): each order's records lie on one partition and, in offset order, show versions
/// 1, 2, …, last, each possibly repeated (a re-sent record) but never after the next version
/// appeared, never skipped, never missing at the end. Records of other orders are not checked.
pub fn versions_in_order(records: &[Record], last: &BTreeMap<i64, i64>) -> OrderCheck {
    let mut check = OrderCheck::default();
    for (&order_id, &last_version) in last {
        let key = order_id.to_string();
        let mut seen: Vec<&Record> = records.iter().filter(|r| r.aggregate_id == key).collect();
        seen.sort_by_key(|r| (r.delivery.partition, r.delivery.offset));
        let versions: Vec<Option<i64>> = seen.iter().map(|r| r.version).collect();
        if seen.iter().any(|r| r.delivery.partition != seen[0].delivery.partition) {
            check.violations.push(format!("order {order_id} is on more than one partition"));
        }
        if let Some(problem) = sequence_problem(&versions, last_version) {
            check.violations.push(format!("order {order_id}: {problem}; on the topic: {versions:?}"));
        }
        check.orders += 1;
        check.versions += u64::try_from(last_version).unwrap_or_default();
    }
    check
}

/// Why `versions` (in offset order) is not 1..=last with repeats only in place; `None` when it is.
fn sequence_problem(versions: &[Option<i64>], last: i64) -> Option<String> {
    let mut current = 0;
    for version in versions {
        let Some(version) = *version else { return Some("a record without its event_version".into()) };
        if version == current + 1 {
            current = version;
        } else if version == current {
            // A re-sent copy of the version just published: allowed.
        } else if version < current {
            return Some(format!("version {version} after version {current}"));
        } else {
            return Some(format!("version {version} skips ahead of version {current}"));
        }
    }
    (current != last).then(|| format!("ends at version {current}, the order is at version {last}"))
}

/// One order as the order table has it and as a consumer's read model has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderState {
    /// The order's id.
    pub order_id: i64,
    /// `(version, status)` in the order table.
    pub order: (i64, String),
    /// `(version, status)` in the consumer's read model (order_view); `None` when it has none.
    pub view: Option<(i64, String)>,
}

/// Every order of `tenant_id` with its read model in `consumer_name`'s order_view.
pub async fn order_states(
    db: &DatabaseConnection,
    tenant_id: i64,
    consumer_name: &str,
) -> Result<Vec<OrderState>, DbErr> {
    let sql = "SELECT o.id, o.version, o.status, v.version, v.status FROM orders o \
               LEFT JOIN order_view v ON v.order_id = o.id AND v.consumer_name = ? \
               WHERE o.tenant_id = ? ORDER BY o.id";
    let rows = db.query_all_raw(statement(db, sql, vec![consumer_name.into(), tenant_id.into()])).await?;
    rows.iter()
        .map(|row| {
            let view_version: Option<i64> = row.try_get_by_index(3)?;
            let view_status: Option<String> = row.try_get_by_index(4)?;
            Ok(OrderState {
                order_id: row.try_get_by_index(0)?,
                order: (row.try_get_by_index(1)?, row.try_get_by_index(2)?),
                view: view_version.zip(view_status),
            })
        })
        .collect()
}

/// The orders whose read model differs from the order table, each described.
pub fn read_model_differences(states: &[OrderState]) -> Vec<String> {
    states
        .iter()
        .filter(|s| s.view.as_ref() != Some(&s.order))
        .map(|s| format!("order {}: order table {:?}, read model {:?}", s.order_id, s.order, s.view))
        .collect()
}

/// Both checks over `tenant_id`'s orders: the topic's versions against the order table, and the
/// read model against it.
pub async fn check_orders(
    db: &DatabaseConnection,
    records: &[Record],
    tenant_id: i64,
    consumer_name: &str,
) -> Result<OrderCheck, DbErr> {
    let states = order_states(db, tenant_id, consumer_name).await?;
    let last = states.iter().map(|s| (s.order_id, s.order.0)).collect();
    let mut check = versions_in_order(records, &last);
    check.violations.extend(read_model_differences(&states));
    Ok(check)
}

#[cfg(test)]
mod tests {
    use idempost_relay::Delivery;

    use super::*;

    /// Records of order 7 with these versions, at offsets 0, 1, … of partition 0.
    fn topic(versions: &[i64]) -> Vec<Record> {
        versions
            .iter()
            .zip(0..)
            .map(|(&version, offset)| Record {
                event_id: format!("event-{version}"),
                aggregate_id: "7".into(),
                version: Some(version),
                delivery: Delivery { topic: "t".into(), partition: 0, offset },
            })
            .collect()
    }

    fn check(versions: &[i64], last: i64) -> OrderCheck {
        versions_in_order(&topic(versions), &BTreeMap::from([(7, last)]))
    }

    #[test]
    fn versions_in_order_with_repeats_before_the_next_version_pass_and_are_counted() {
        let passed = check(&[1, 1, 2, 3, 3], 3);

        assert_eq!(passed, OrderCheck { orders: 1, versions: 3, violations: Vec::new() });
        assert_eq!(passed.describe(), "1 order(s), 3 version(s) checked");
    }

    #[test]
    fn a_reordered_sequence_fails() {
        let violations = check(&[1, 3, 2], 3).violations;

        assert_eq!(
            violations,
            ["order 7: version 3 skips ahead of version 1; on the topic: [Some(1), Some(3), Some(2)]"]
        );
        assert_eq!(check(&[2, 1, 3], 3).violations.len(), 1, "the first version must be 1");
    }

    #[test]
    fn an_earlier_version_re_sent_after_a_later_one_fails() {
        assert_eq!(
            check(&[1, 2, 1, 2, 3], 3).violations,
            [
                "order 7: version 1 after version 2; on the topic: [Some(1), Some(2), Some(1), Some(2), Some(3)]"
            ]
        );
    }

    #[test]
    fn a_missing_last_version_or_an_order_never_published_fails() {
        assert_eq!(check(&[1, 2], 3).violations.len(), 1, "incomplete");
        let nothing = versions_in_order(&[], &BTreeMap::from([(7, 1)]));
        assert_eq!(
            nothing.violations,
            ["order 7: ends at version 0, the order is at version 1; on the topic: []"]
        );
    }

    #[test]
    fn an_order_split_over_partitions_fails() {
        let mut records = topic(&[1, 2]);
        records[1].delivery.partition = 1;

        let violations = versions_in_order(&records, &BTreeMap::from([(7, 2)])).violations;

        assert_eq!(violations, ["order 7 is on more than one partition"]);
    }

    #[test]
    fn a_read_model_behind_or_in_another_status_differs() {
        let state = |view: Option<(i64, &str)>| OrderState {
            order_id: 7,
            order: (3, "CANCELLED".into()),
            view: view.map(|(v, s)| (v, s.to_owned())),
        };

        let states = [state(Some((3, "CANCELLED"))), state(Some((2, "ACCEPTED"))), state(None)];

        assert_eq!(
            read_model_differences(&states),
            [
                "order 7: order table (3, \"CANCELLED\"), read model Some((2, \"ACCEPTED\"))",
                "order 7: order table (3, \"CANCELLED\"), read model None",
            ]
        );
    }
}
