//! The consumer's read model of each order (`order_view`), applied in version order: an event
//! one version ahead of the model is applied, one at or below it is a duplicate, and one that
//! skips ahead (or whose type this consumer does not know) is parked (`parked_event`) until the
//! gap is filled or an operator releases it. Every write happens in the caller's transaction,
//! the one that holds the event's dedup row.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{ArrayType, Expr, Func, LockType, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait as _, ConnectionTrait as _, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait as _, FromQueryResult as _, QueryFilter as _, QueryOrder as _, QuerySelect as _, Statement,
    Value,
};

use super::super::decode::{OrderEvent, OrderState, decode_known};
use idempost::entity::{notification_job, order_view, parked_event};

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
    if skips_ahead(event.version, current) {
        // Parked events this consumer can apply now (an upgrade taught it their type) may fill
        // the gap; only an event out of order pays for the look.
        let (after, applied) = drain(txn, consumer, event.order_id, current, exists, now).await?;
        if !applied.is_empty() {
            (current, exists) = (after, true);
        }
    }
    let why = match decide(event.version, current, event.change.as_ref()) {
        Decision::Stale => return Ok(Outcome::Stale),
        Decision::Apply(state) => {
            let id = event.event_id.to_string();
            put_view(txn, consumer, event.order_id, exists, (&id, event.version, state), now).await?;
            drain(txn, consumer, event.order_id, event.version, true, now).await?;
            return Ok(Outcome::Applied);
        }
        Decision::Park(why) => why,
    };
    park(txn, consumer, event, &why.reason(&event.event_type), now).await?;
    Ok(Outcome::Parked)
}

/// Whether `version` is the model's next after `current`. Versions come from the topic, which
/// anyone allowed to produce to it can write: a record claiming `i64::MAX` must not make the
/// next version overflow (a panic in a debug build, a wrap to `i64::MIN` in a release build).
pub(crate) fn is_next(version: i64, current: i64) -> bool {
    current.checked_add(1) == Some(version)
}

/// Whether `version` lies more than one ahead of `current` (a gap before it), without overflow.
pub(crate) fn skips_ahead(version: i64, current: i64) -> bool {
    i128::from(version) > i128::from(current) + 1
}

/// What the read model does with one event, by its version and the model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision<S> {
    /// At or below the model's version: a duplicate, absorbed.
    Stale,
    /// The model's next version, of a type this consumer knows: applied, as this state.
    Apply(S),
    /// Parked until the gap fills or an operator releases it.
    Park(ParkReason),
}

/// Why an event is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParkReason {
    /// Its version is more than one ahead of the model's.
    SkipsAhead { version: i64, current: i64 },
    /// Its type is one this consumer does not know (`change` is `None`).
    UnknownType,
}

impl ParkReason {
    /// The reason as stored in `parked_event.reason`.
    pub(crate) fn reason(self, event_type: &str) -> String {
        match self {
            Self::SkipsAhead { version, current } => {
                format!("version {version} skips ahead of the read model's {current}")
            }
            Self::UnknownType => format!("event type `{event_type}` is unknown to this consumer"),
        }
    }
}

/// Decides an event of `version` against a model at `current`: a duplicate whatever its type
/// when at or below it; applied when it is the next version and its state is known (`change`);
/// parked otherwise. The one rule [`apply`] and [`apply_all`] share.
pub(crate) fn decide<S>(version: i64, current: i64, change: Option<S>) -> Decision<S> {
    if version <= current {
        return Decision::Stale;
    }
    match change {
        Some(state) if is_next(version, current) => Decision::Apply(state),
        Some(_) => Decision::Park(ParkReason::SkipsAhead { version, current }),
        None => Decision::Park(ParkReason::UnknownType),
    }
}

/// What draining does with a parked event of `version` when the model stands at `current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainStep {
    /// A version is missing before it: draining stops here.
    Gap,
    /// The model's next version: applied (if it can be decoded here), then removed.
    Next,
    /// At or below the model: removed as a duplicate.
    Duplicate,
}

/// The draining rule for one parked event, in version order.
pub(crate) fn drain_step(version: i64, current: i64) -> DrainStep {
    if skips_ahead(version, current) {
        DrainStep::Gap
    } else if is_next(version, current) {
        DrainStep::Next
    } else {
        DrainStep::Duplicate
    }
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
    let views = locked_views(txn, consumer, &orders)
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
        let state = match decide(event.version, current, event.change.as_ref()) {
            Decision::Stale => continue,
            Decision::Apply(state) => state,
            Decision::Park(_) => return Ok(false),
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

/// `consumer`'s models of `orders` (those that exist), locked for the transaction.
///
/// On PostgreSQL one primary-key probe per order, whatever the statistics say: until the first
/// ANALYZE of `order_view` (a consumer's first minute on a new database, however many events it
/// drains meanwhile) the planner takes `consumer_name = $1` for 0.5 % of the table, where it is
/// all of it, and read the batch's models as `consumer_name = $1 AND order_id IN (…)` by scanning
/// every model of the consumer, so each batch cost more as the models grew (figures in
/// `docs/design/per-order-order.md`). A lateral probe per order leaves it nothing else to choose.
async fn locked_views(
    txn: &DatabaseTransaction,
    consumer: &str,
    orders: &[i64],
) -> Result<Vec<order_view::Model>, DbErr> {
    if txn.get_database_backend() == DbBackend::Postgres {
        let orders = orders.iter().map(|&id| Value::from(id)).collect();
        let sql = "SELECT v.* FROM unnest($2::bigint[]) AS k(order_id) CROSS JOIN LATERAL \
                   (SELECT * FROM order_view AS o WHERE o.consumer_name = $1 AND o.order_id = k.order_id \
                   FOR UPDATE) AS v";
        let values = [Value::from(consumer), Value::Array(ArrayType::BigInt, Some(Box::new(orders)))];
        let statement = Statement::from_sql_and_values(DbBackend::Postgres, sql, values);
        return order_view::Model::find_by_statement(statement).all(txn).await;
    }
    locked(
        order_view::Entity::find()
            .filter(order_view::Column::ConsumerName.eq(consumer))
            .filter(order_view::Column::OrderId.is_in(orders.iter().copied())),
        txn,
    )
    .all(txn)
    .await
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
        match drain_step(event.version, current) {
            DrainStep::Gap => break,
            DrainStep::Next => {
                let Ok(Some((_, _, _, state))) = decode_known(&event.event_type, &event.payload) else {
                    break;
                };
                put_view(txn, consumer, order_id, view_exists, (&event.event_id, event.version, &state), now)
                    .await?;
                view_exists = true;
                current = event.version;
                applied.push(event.version);
            }
            DrainStep::Duplicate => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_at_the_end_of_the_range_decide_without_overflow() {
        assert_eq!(decide(i64::MAX, i64::MAX, Some(())), Decision::Stale);
        assert_eq!(decide(2, i64::MAX, Some(())), Decision::Stale);
        assert_eq!(decide(i64::MAX, i64::MAX - 1, Some(())), Decision::Apply(()));
        assert_eq!(
            decide(i64::MAX, 1, Some(())),
            Decision::Park(ParkReason::SkipsAhead { version: i64::MAX, current: 1 })
        );
        assert_eq!(drain_step(i64::MAX, i64::MAX), DrainStep::Duplicate);
        assert_eq!(drain_step(i64::MIN, i64::MAX), DrainStep::Duplicate);
        assert_eq!(drain_step(i64::MAX, i64::MAX - 1), DrainStep::Next);
    }

    #[test]
    fn an_event_at_or_below_the_models_version_is_a_duplicate_whatever_its_type() {
        assert_eq!(decide(3, 3, Some("state")), Decision::Stale);
        assert_eq!(decide(1, 3, Some("state")), Decision::Stale);
        assert_eq!(decide::<&str>(2, 3, None), Decision::Stale, "an unknown type already passed is absorbed");
    }

    #[test]
    fn the_models_next_version_of_a_known_type_is_applied() {
        assert_eq!(decide(4, 3, Some("state")), Decision::Apply("state"));
        assert_eq!(decide(1, 0, Some("first")), Decision::Apply("first"), "a new order's first version");
    }

    #[test]
    fn an_event_that_skips_ahead_is_parked_and_says_which_versions_it_skips() {
        let decision = decide(6, 3, Some("state"));
        assert_eq!(decision, Decision::Park(ParkReason::SkipsAhead { version: 6, current: 3 }));
        let Decision::Park(why) = decision else { unreachable!() };
        assert_eq!(why.reason("OrderAccepted"), "version 6 skips ahead of the read model's 3");
    }

    #[test]
    fn an_event_of_an_unknown_type_is_parked_even_when_it_is_next() {
        for version in [4, 9] {
            assert_eq!(decide::<&str>(version, 3, None), Decision::Park(ParkReason::UnknownType));
        }
        assert_eq!(
            ParkReason::UnknownType.reason("OrderRefunded"),
            "event type `OrderRefunded` is unknown to this consumer"
        );
    }

    #[test]
    fn draining_applies_the_next_version_drops_duplicates_and_stops_at_a_gap() {
        assert_eq!(drain_step(4, 3), DrainStep::Next);
        assert_eq!(drain_step(3, 3), DrainStep::Duplicate);
        assert_eq!(drain_step(1, 3), DrainStep::Duplicate);
        assert_eq!(drain_step(5, 3), DrainStep::Gap);
    }
}
