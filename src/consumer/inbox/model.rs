//! The consumer's read model of each order (`order_view`), applied in version order: an event
//! one version ahead of the model is applied, one at or below it is a duplicate, and one that
//! skips ahead (or whose type this consumer does not know) is parked (`parked_event`) until the
//! gap is filled or an operator releases it. Every write happens in the caller's transaction,
//! the one that holds the event's dedup row.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, Func, LockType, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait as _, ConnectionTrait as _, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait as _, QueryFilter as _, QueryOrder as _, QuerySelect as _,
};

use super::super::decode::{OrderEvent, OrderState, decode_known};
use crate::entity::{notification_job, order_view, parked_event};

/// What the read model did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The event was the model's next version (and parked successors may have followed it).
    Applied,
    /// The model is at or past the event's version already: absorbed.
    Stale,
    /// Parked: it skips ahead of the model, or its type is unknown here.
    Parked,
}

/// The most characters of a parking reason kept.
const REASON_CHARS: usize = 1000;

/// Applies `event` to `consumer`'s model of its order, or parks it; then applies whatever parked
/// events now follow on.
pub(crate) async fn apply(
    txn: &DatabaseTransaction,
    consumer: &str,
    event: &OrderEvent,
    now: DateTime<Utc>,
) -> Result<Outcome, DbErr> {
    let view = locked_view(txn, consumer, event.order_id).await?;
    let mut exists = view.is_some();
    let mut current = match &view {
        Some(view) => view.version,
        // Nothing comes before a first version.
        None if event.version == 1 => 0,
        None => legacy_version(txn, consumer, event.order_id, Some(&event.event_id.to_string())).await?,
    };
    if event.version > current + 1 {
        // Parked events this consumer can apply now (an upgrade taught it their type) may fill
        // the gap; only an event out of order pays for the look.
        let (after, applied) = drain(txn, consumer, event.order_id, current, exists, now).await?;
        if !applied.is_empty() {
            (current, exists) = (after, true);
        }
    }
    if event.version <= current {
        return Ok(Outcome::Stale);
    }
    let reason = match &event.change {
        Some(state) if event.version == current + 1 => {
            let id = event.event_id.to_string();
            put_view(txn, consumer, event.order_id, exists, (&id, event.version, state), now).await?;
            drain(txn, consumer, event.order_id, event.version, true, now).await?;
            return Ok(Outcome::Applied);
        }
        Some(_) => format!("version {} skips ahead of the read model's {current}", event.version),
        None => format!("event type `{}` is unknown to this consumer", event.event_type),
    };
    park(txn, consumer, event, &reason, now).await?;
    Ok(Outcome::Parked)
}

/// The set-based path for a batch: every event either is its order's next version (in the batch's
/// order, so an order's events apply in version order) or is a duplicate, and no event of these
/// orders is parked. Then the whole batch is one read and one upsert. `Ok(false)`: the batch is
/// not that simple; nothing was written, and the caller decides event by event with [`apply`].
pub(crate) async fn apply_all(
    txn: &DatabaseTransaction,
    consumer: &str,
    events: &[OrderEvent],
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let orders: Vec<i64> = events.iter().map(|e| e.order_id).collect();
    let views = locked(
        order_view::Entity::find()
            .filter(order_view::Column::ConsumerName.eq(consumer))
            .filter(order_view::Column::OrderId.is_in(orders.clone())),
        txn,
    )
    .all(txn)
    .await?
    .into_iter()
    .map(|view| (view.order_id, view))
    .collect::<HashMap<_, _>>();
    let parked = parked_event::Entity::find()
        .filter(parked_event::Column::ConsumerName.eq(consumer))
        .filter(parked_event::Column::OrderId.is_in(orders))
        .one(txn)
        .await?;
    if parked.is_some() {
        return Ok(false);
    }
    let mut next: BTreeMap<i64, order_view::Model> = BTreeMap::new();
    for event in events {
        let view = next.get(&event.order_id).or_else(|| views.get(&event.order_id));
        let current = view.map_or(0, |view| view.version);
        if event.version <= current {
            continue;
        }
        let Some(state) = event.change.as_ref().filter(|_| event.version == current + 1) else {
            return Ok(false);
        };
        next.insert(
            event.order_id,
            model(consumer, event.order_id, (&event.event_id.to_string(), event.version, state), now),
        );
    }
    if next.is_empty() {
        return Ok(true);
    }
    let rows = next.into_values().map(|view| active(&view));
    order_view::Entity::insert_many(rows)
        .on_conflict(
            OnConflict::columns([order_view::Column::ConsumerName, order_view::Column::OrderId])
                .update_columns([
                    order_view::Column::TenantId,
                    order_view::Column::Version,
                    order_view::Column::Status,
                    order_view::Column::TotalMinor,
                    order_view::Column::LastEventId,
                    order_view::Column::UpdatedAt,
                ])
                .to_owned(),
        )
        .exec_without_returning(txn)
        .await?;
    Ok(true)
}

/// Applies the parked events of `order_id` that follow `current` without a gap, in version
/// order, removing each from `parked_event`; parked events at or below `current` are removed as
/// duplicates. Stops at a gap, at a type this consumer does not know, or at a payload it cannot
/// decode. Answers the model's version after it and the versions applied.
pub(crate) async fn drain(
    txn: &DatabaseTransaction,
    consumer: &str,
    order_id: i64,
    mut current: i64,
    mut view_exists: bool,
    now: DateTime<Utc>,
) -> Result<(i64, Vec<i64>), DbErr> {
    let waiting = parked(txn, consumer, order_id).await?;
    let mut applied = Vec::new();
    for event in waiting {
        if event.version > current + 1 {
            break;
        }
        if event.version == current + 1 {
            let Ok(Some((_, _, _, state))) = decode_known(&event.event_type, &event.payload) else {
                break;
            };
            put_view(txn, consumer, order_id, view_exists, (&event.event_id, event.version, &state), now)
                .await?;
            view_exists = true;
            current = event.version;
            applied.push(event.version);
        }
        parked_event::Entity::delete_many()
            .filter(parked_event::Column::ConsumerName.eq(consumer))
            .filter(parked_event::Column::EventId.eq(event.event_id))
            .exec(txn)
            .await?;
    }
    Ok((current, applied))
}

/// `consumer`'s parked events of `order_id`, lowest version first, locked for the transaction.
pub(crate) async fn parked(
    txn: &DatabaseTransaction,
    consumer: &str,
    order_id: i64,
) -> Result<Vec<parked_event::Model>, DbErr> {
    locked(
        parked_event::Entity::find()
            .filter(parked_event::Column::ConsumerName.eq(consumer))
            .filter(parked_event::Column::OrderId.eq(order_id))
            .order_by_asc(parked_event::Column::Version),
        txn,
    )
    .all(txn)
    .await
}

/// `consumer`'s model of `order_id`, locked for the transaction (SQLite has one writer anyway).
pub(crate) async fn locked_view(
    txn: &DatabaseTransaction,
    consumer: &str,
    order_id: i64,
) -> Result<Option<order_view::Model>, DbErr> {
    locked(
        order_view::Entity::find()
            .filter(order_view::Column::ConsumerName.eq(consumer))
            .filter(order_view::Column::OrderId.eq(order_id)),
        txn,
    )
    .one(txn)
    .await
}

fn locked<E: sea_orm::EntityTrait>(
    query: sea_orm::Select<E>,
    txn: &DatabaseTransaction,
) -> sea_orm::Select<E> {
    if txn.get_database_backend() == DbBackend::Sqlite { query } else { query.lock(LockType::Update) }
}

/// The last version of `order_id` a consumer handled before it kept a read model (the upgrade
/// that brought the model): the highest version among the order's notification jobs that is
/// neither parked nor `except` (the event being handled). 0 when there is none. So an order
/// accepted before the upgrade applies its first amendment instead of parking it.
pub(crate) async fn legacy_version(
    txn: &DatabaseTransaction,
    consumer: &str,
    order_id: i64,
    except: Option<&str>,
) -> Result<i64, DbErr> {
    let parked: Vec<String> =
        parked(txn, consumer, order_id).await?.into_iter().map(|p| p.event_id).collect();
    let mut query = notification_job::Entity::find()
        .select_only()
        .expr_as(Func::max(Expr::col(notification_job::Column::SourceVersion)), "v")
        .filter(notification_job::Column::ConsumerName.eq(consumer))
        .filter(notification_job::Column::OrderId.eq(order_id))
        .filter(notification_job::Column::EventId.is_not_in(parked));
    if let Some(except) = except {
        query = query.filter(notification_job::Column::EventId.ne(except));
    }
    Ok(query.into_tuple::<Option<i64>>().one(txn).await?.flatten().unwrap_or(0))
}

/// Writes the model of `order_id` as `event` (id, version, state) leaves it.
async fn put_view(
    txn: &DatabaseTransaction,
    consumer: &str,
    order_id: i64,
    exists: bool,
    event: (&str, i64, &OrderState),
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    let row = active(&model(consumer, order_id, event, now));
    if exists {
        order_view::Entity::update(row).exec(txn).await?;
    } else {
        order_view::Entity::insert(row).exec_without_returning(txn).await?;
    }
    Ok(())
}

/// Moves the model of `order_id` to `version` without a state change: the versions up to it
/// were given up by an operator. Only where a model exists; without one, the next event that
/// applies creates it.
pub(crate) async fn skip_to(
    txn: &DatabaseTransaction,
    consumer: &str,
    order_id: i64,
    version: i64,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    order_view::Entity::update_many()
        .col_expr(order_view::Column::Version, Expr::value(version))
        .col_expr(order_view::Column::UpdatedAt, Expr::value(now))
        .filter(order_view::Column::ConsumerName.eq(consumer))
        .filter(order_view::Column::OrderId.eq(order_id))
        .exec(txn)
        .await?;
    Ok(())
}

fn model(
    consumer: &str,
    order_id: i64,
    (event_id, version, state): (&str, i64, &OrderState),
    now: DateTime<Utc>,
) -> order_view::Model {
    order_view::Model {
        consumer_name: consumer.to_owned(),
        order_id,
        tenant_id: state.tenant_id,
        version,
        status: state.status.to_owned(),
        total_minor: state.total_minor,
        last_event_id: event_id.to_owned(),
        updated_at: now,
    }
}

fn active(view: &order_view::Model) -> order_view::ActiveModel {
    order_view::ActiveModel {
        consumer_name: Set(view.consumer_name.clone()),
        order_id: Set(view.order_id),
        tenant_id: Set(view.tenant_id),
        version: Set(view.version),
        status: Set(view.status.clone()),
        total_minor: Set(view.total_minor),
        last_event_id: Set(view.last_event_id.clone()),
        updated_at: Set(view.updated_at),
    }
}

async fn park(
    txn: &DatabaseTransaction,
    consumer: &str,
    event: &OrderEvent,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    parked_event::Entity::insert(parked_event::ActiveModel {
        consumer_name: Set(consumer.to_owned()),
        event_id: Set(event.event_id.to_string()),
        order_id: Set(event.order_id),
        version: Set(event.version),
        event_type: Set(event.event_type.chars().take(128).collect()),
        payload: Set(event.payload.clone()),
        reason: Set(reason.chars().take(REASON_CHARS).collect()),
        parked_at: Set(now),
    })
    .exec_without_returning(txn)
    .await?;
    Ok(())
}
