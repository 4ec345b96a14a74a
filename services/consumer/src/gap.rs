//! An operator's release of a gap in one order's read model: the missing versions are given up
//! and what waits behind them is applied in version order, in one audited transaction. A parked
//! event that is given up becomes a dead letter, payload and all: nothing an operator gives up
//! is deleted.

use chrono::{DateTime, SubsecRound as _, Utc};
use sea_orm::{
    ActiveValue::NotSet, ActiveValue::Set, ColumnTrait as _, DatabaseConnection, DatabaseTransaction, DbErr,
    EntityTrait as _, PaginatorTrait as _, QueryFilter as _, TransactionTrait as _,
};

use super::inbox::model;
use idempost::audit::{self, Action, Entry};
use idempost::entity::{dead_letter, parked_event};

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Released {
    /// The versions given up, `from..=to` (empty when `to < from`).
    pub(crate) from: i64,
    pub(crate) to: i64,
    /// The versions applied, in order.
    pub(crate) applied: Vec<i64>,
    /// The read model's version after it.
    pub(crate) version: i64,
    /// The order's events still parked (behind a further gap).
    pub(crate) still_parked: u64,
}

/// Who released a gap, and why.
#[derive(Debug, Clone)]
pub(crate) struct Audit<'a> {
    pub(crate) released_by: &'a str,
    pub(crate) reason: &'a str,
}

/// Releases `order_id`'s gap in `consumer`'s read model; `None` when the order has no parked
/// event (nothing is written then).
///
/// First applies whatever already follows the model (a consumer upgraded since it parked an
/// event of a type it did not know applies it now). If events still wait, the versions before
/// the first of them are given up, or that first event itself when it follows on but cannot be
/// applied here (kept as a dead letter: [`keep_as_dead_letter`]); then what follows is applied
/// up to the next gap. The release is recorded in the audit (a RELEASE_GAP row) with the caller's
/// subject and reason, in the same transaction.
pub(crate) async fn release(
    db: &DatabaseConnection,
    consumer: &str,
    order_id: i64,
    audit: &Audit<'_>,
) -> Result<Option<Released>, DbErr> {
    let now = Utc::now().trunc_subsecs(6);
    let txn = db.begin().await?;
    let view = model::locked_view(&txn, consumer, order_id).await?;
    let current = match &view {
        Some(view) => view.version,
        None => model::legacy_version(&txn, consumer, order_id, None).await?,
    };
    if model::parked(&txn, consumer, order_id).await?.is_empty() {
        txn.rollback().await?;
        return Ok(None);
    }
    let (current, mut applied) = model::drain(&txn, consumer, order_id, current, view.is_some(), now).await?;
    let exists = view.is_some() || !applied.is_empty();
    let waiting = model::parked(&txn, consumer, order_id).await?;
    let head = waiting.first();
    let mut kept = None;
    let given_up = match (give_up(current, head.map(|head| head.version)), head) {
        (GiveUp::Nothing, _) | (_, None) => None,
        (GiveUp::Missing { from, to }, Some(_)) => Some((from, to)),
        (GiveUp::Head(version), Some(head)) => {
            parked_event::Entity::delete_many()
                .filter(parked_event::Column::ConsumerName.eq(consumer))
                .filter(parked_event::Column::EventId.eq(head.event_id.as_str()))
                .exec(&txn)
                .await?;
            kept = Some(head.clone());
            Some((version, version))
        }
    };
    let (from, to, version) = match given_up {
        // Nothing given up: the empty range `from > to`, written without overflow at i64::MAX.
        None => match current.checked_add(1) {
            Some(next) => (next, current, current),
            None => (current, current - 1, current),
        },
        Some((from, to)) => {
            model::skip_to(&txn, consumer, order_id, to, now).await?;
            let (version, more) = model::drain(&txn, consumer, order_id, to, exists, now).await?;
            applied.extend(more);
            (from, to, version)
        }
    };
    let outcome = if from > to {
        format!("nothing given up; applied versions {applied:?}; read model at version {version}")
    } else {
        format!(
            "versions {from}..={to} given up; applied versions {applied:?}; read model at version {version}"
        )
    };
    let mut entry = Entry::new(Action::ReleaseGap, audit.released_by, audit.reason, outcome);
    entry.order_id = Some(order_id);
    entry.consumer_name = Some(consumer.to_owned());
    entry.event_id = kept.as_ref().map(|head| head.event_id.clone());
    let audit_id = audit::record(&txn, entry).await?;
    if let Some(head) = kept {
        keep_as_dead_letter(&txn, head, audit_id, audit.reason, now).await?;
    }
    let still_parked = parked_event::Entity::find()
        .filter(parked_event::Column::ConsumerName.eq(consumer))
        .filter(parked_event::Column::OrderId.eq(order_id))
        .count(&txn)
        .await?;
    txn.commit().await?;
    Ok(Some(Released { from, to, applied, version, still_parked }))
}

/// Where a dead letter made of a given-up parked event says it came from: no broker coordinates
/// are kept with a parked event, so its `partition_id` is this and its `offset_id` the release's
/// audit row id (unique, as the dead letters' coordinates must be).
const RELEASED_TOPIC: &str = "(released gap)";
const RELEASED_PARTITION: i32 = -1;

/// The given-up parked event `head` as a dead letter of its consumer, with its payload, its
/// event id and the release's reason: an operator can still read what was given up, and
/// AwaitConsumed and the timelines show it as dead-lettered.
async fn keep_as_dead_letter(
    txn: &DatabaseTransaction,
    head: parked_event::Model,
    audit_id: i64,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    let error = format!(
        "given up by an operator's release of order {}'s gap (audit row {audit_id}; parked because: {}): {reason}",
        head.order_id, head.reason
    );
    dead_letter::Entity::insert(dead_letter::ActiveModel {
        id: NotSet,
        consumer_name: Set(head.consumer_name),
        topic: Set(RELEASED_TOPIC.to_owned()),
        partition_id: Set(RELEASED_PARTITION),
        offset_id: Set(audit_id),
        record_key: Set(Some(head.order_id.to_string().into_bytes())),
        payload: Set(head.payload),
        event_id: Set(Some(head.event_id)),
        error: Set(error.chars().take(1024).collect()),
        created_at: Set(now),
    })
    .exec_without_returning(txn)
    .await?;
    Ok(())
}

/// What a release gives up, with the model at `current` and `head` the lowest version still
/// parked after the model took what it could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GiveUp {
    /// Nothing waits any more: nothing is given up.
    Nothing,
    /// The versions missing before the head, `from..=to`.
    Missing { from: i64, to: i64 },
    /// The head itself: it follows on but cannot be applied here.
    Head(i64),
}

fn give_up(current: i64, head: Option<i64>) -> GiveUp {
    match head {
        None => GiveUp::Nothing,
        // A gap before the head means `current + 1 < head`: neither bound below overflows.
        Some(head) if model::skips_ahead(head, current) => {
            GiveUp::Missing { from: current + 1, to: head - 1 }
        }
        Some(head) => GiveUp::Head(head),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_gives_up_the_versions_missing_before_the_first_parked_one() {
        assert_eq!(give_up(2, Some(5)), GiveUp::Missing { from: 3, to: 4 });
        assert_eq!(give_up(0, Some(2)), GiveUp::Missing { from: 1, to: 1 }, "a lost first version");
    }

    #[test]
    fn a_parked_event_that_follows_on_but_cannot_be_applied_is_itself_given_up() {
        assert_eq!(give_up(2, Some(3)), GiveUp::Head(3));
    }

    #[test]
    fn with_nothing_parked_a_release_gives_up_nothing() {
        assert_eq!(give_up(7, None), GiveUp::Nothing);
    }
}
