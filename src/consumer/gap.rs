//! An operator's release of a gap in one order's read model: the missing versions are given up
//! and what waits behind them is applied in version order, in one audited transaction.

use chrono::{SubsecRound as _, Utc};
use sea_orm::{
    ActiveValue::NotSet, ActiveValue::Set, ColumnTrait as _, DatabaseConnection, DbErr, EntityTrait as _,
    PaginatorTrait as _, QueryFilter as _, TransactionTrait as _,
};

use super::inbox::model;
use crate::entity::{gap_release, parked_event};

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
/// applied here; then what follows is applied up to the next gap. The release is recorded in
/// `gap_release` with the caller's subject and reason, in the same transaction.
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
    let (from, to, version) = match waiting.first() {
        None => (current + 1, current, current),
        Some(head) => {
            let (from, to) = if head.version > current + 1 {
                (current + 1, head.version - 1)
            } else {
                // It follows on but cannot be applied here: it is the version given up.
                parked_event::Entity::delete_many()
                    .filter(parked_event::Column::ConsumerName.eq(consumer))
                    .filter(parked_event::Column::EventId.eq(head.event_id.as_str()))
                    .exec(&txn)
                    .await?;
                (head.version, head.version)
            };
            model::skip_to(&txn, consumer, order_id, to, now).await?;
            let (version, more) = model::drain(&txn, consumer, order_id, to, exists, now).await?;
            applied.extend(more);
            (from, to, version)
        }
    };
    gap_release::Entity::insert(gap_release::ActiveModel {
        id: NotSet,
        consumer_name: Set(consumer.to_owned()),
        order_id: Set(order_id),
        from_version: Set(from),
        to_version: Set(to),
        released_by: Set(audit.released_by.chars().take(256).collect()),
        reason: Set(audit.reason.chars().take(1000).collect()),
        released_at: Set(now),
    })
    .exec_without_returning(&txn)
    .await?;
    let still_parked = parked_event::Entity::find()
        .filter(parked_event::Column::ConsumerName.eq(consumer))
        .filter(parked_event::Column::OrderId.eq(order_id))
        .count(&txn)
        .await?;
    txn.commit().await?;
    Ok(Some(Released { from, to, applied, version, still_parked }))
}
