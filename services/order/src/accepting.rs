//! One accepted order as the database holds it: the rows it writes, how a clash with a stored
//! order is decided, and the answers every write path (one transaction per order, or group
//! commit) gives. Both paths build on this module; neither on the other's internals.

use chrono::{DateTime, Utc};
use idempost_proto::EventId;
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ColumnTrait, ConnectionTrait, DatabaseTransaction, DbErr, EntityTrait, QueryFilter, QueryOrder,
};

use super::event::encode_order_accepted;
use idempost::contract::{AGGREGATE_TYPE, EVENT_TYPE};
use idempost::db::{TxFailure, UniqueKey};
use idempost::domain::{
    CustomerId, LineItem, NewOrder, Operation, OrderStatus, OutboxStatus, RequestId, Sku, SubmitOrder,
    TenantId,
};
use idempost::entity::{order_line, order_version, orders, outbox_event};
use idempost::telemetry::TraceHeaders;

/// The version of an order's facts when it is accepted.
pub(super) const FIRST_VERSION: i64 = 1;

/// Runs of the order transaction after the first one that lost a lock conflict.
pub(super) const LOCK_CONFLICT_RETRIES: u32 = 5;

/// An order that committed with its acceptance event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AcceptedOrder {
    /// The server-assigned order id.
    pub(crate) order_id: i64,
    /// The acceptance event committed with the order.
    pub(crate) event_id: EventId,
    /// Total in minor units.
    pub(crate) total_minor: i64,
    /// Version of the order's facts.
    pub(crate) version: i64,
    /// Where the order is in its life.
    pub(crate) status: OrderStatus,
    /// When it was accepted, to the microsecond the database keeps.
    pub(crate) accepted_at: DateTime<Utc>,
}

/// A successful submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Submitted {
    /// The committed order.
    pub(crate) order: AcceptedOrder,
    /// True when an identical earlier submission had committed it; nothing new was written.
    pub(crate) replayed: bool,
}

/// A submission that did not produce a committed order.
///
/// Each variant says what is known about the database afterwards.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubmitError {
    /// `(tenant_id, request_id)` already holds an order with other content; nothing was written.
    #[error("request id already holds a different order ({existing_event_id})")]
    RequestIdReused {
        /// The acceptance event of the order that holds the key.
        existing_event_id: EventId,
    },
    /// The event id already belongs to another order; nothing was written.
    #[error("event id {event_id} already belongs to another order")]
    EventIdInUse {
        /// The event id the caller sent.
        event_id: EventId,
    },
    /// The transaction failed before commit and its rollback was confirmed: nothing was written.
    /// Safe to retry with the same ids.
    #[error("rolled back before commit: {cause}")]
    RolledBack {
        /// The event id to reuse on retry.
        event_id: EventId,
        /// What failed.
        cause: TxFailure,
    },
    /// No transaction could begin (the database is unreachable or the pool has no connection
    /// for it): nothing was written. Safe to retry with the same ids.
    #[error("no transaction began: {cause}")]
    Unavailable {
        /// The event id to reuse on retry.
        event_id: EventId,
        /// What failed.
        cause: TxFailure,
    },
    /// `commit()` or `rollback()` failed: the order may or may not exist. Reconcile decides.
    #[error("outcome unknown: {cause}")]
    OutcomeUnknown {
        /// The event id the order has if it committed.
        event_id: EventId,
        /// What failed.
        cause: TxFailure,
    },
    /// The queue in front of the group-commit writers is full: nothing was written. Safe to
    /// retry with the same ids after a backoff.
    #[error("{queued} orders are already waiting for a transaction")]
    Overloaded {
        /// The event id to reuse on retry.
        event_id: EventId,
        /// The queue bound that was reached.
        queued: usize,
    },
}

/// One order on its way into the database: everything that stays the same across every run of
/// its transaction, made before the first.
#[derive(Debug, Clone)]
pub(super) struct Accepting {
    pub(super) submit: SubmitOrder,
    pub(super) event_id: EventId,
    pub(super) accepted_at: DateTime<Utc>,
    pub(super) trace: TraceHeaders,
}

impl Accepting {
    /// The answer once the order committed under `order_id`.
    pub(super) fn accepted(&self, order_id: i64) -> Submitted {
        accepted(&self.submit, self.event_id, self.accepted_at, order_id)
    }
}

/// The answer to `submit` once it committed under `order_id`.
pub(super) fn accepted(
    submit: &SubmitOrder,
    event_id: EventId,
    accepted_at: DateTime<Utc>,
    order_id: i64,
) -> Submitted {
    Submitted {
        order: AcceptedOrder {
            order_id,
            event_id,
            total_minor: submit.order.total_minor(),
            version: FIRST_VERSION,
            status: OrderStatus::Accepted,
            accepted_at,
        },
        replayed: false,
    }
}

/// The order row with `(tenant_id, request_id)` as `conn` sees it.
pub(super) async fn find_row(
    conn: &impl ConnectionTrait,
    tenant_id: TenantId,
    request_id: &RequestId,
) -> Result<Option<orders::Model>, DbErr> {
    orders::Entity::find()
        .filter(orders::Column::TenantId.eq(tenant_id.get()))
        .filter(orders::Column::RequestId.eq(request_id.as_str()))
        .one(conn)
        .await
}

/// What holds an idempotency key a submission clashed with.
#[derive(Debug)]
pub(super) enum KeyHolder {
    /// An order submitted under it (as it was accepted), and its content as submitted.
    Order(AcceptedOrder, Submission),
    /// An amendment or cancellation, by its event id.
    Change(EventId),
}

/// The content an order was submitted with, to compare a resubmission with.
#[derive(Debug)]
pub(super) enum Submission {
    /// The order's facts, while it is at its first version (they are the submitted ones).
    Facts(NewOrder),
    /// The fingerprint of the submitted facts, once a change replaced them (`None` only if an
    /// order accepted before fingerprints existed was changed without one being kept).
    Fingerprint(Option<String>),
}

impl Submission {
    fn matches(&self, order: &NewOrder) -> bool {
        match self {
            Self::Facts(facts) => facts == order,
            Self::Fingerprint(fingerprint) => fingerprint.as_deref() == Some(order.fingerprint().as_str()),
        }
    }
}

/// The `order_version` row of the operation that used `(tenant_id, request_id)`, as `conn`
/// sees it.
pub(super) async fn find_version(
    conn: &impl ConnectionTrait,
    tenant_id: TenantId,
    request_id: &RequestId,
) -> Result<Option<order_version::Model>, DbErr> {
    order_version::Entity::find()
        .filter(order_version::Column::TenantId.eq(tenant_id.get()))
        .filter(order_version::Column::RequestId.eq(request_id.as_str()))
        .one(conn)
        .await
}

/// What holds this key as `conn` sees it: an order with its facts (for comparison with a
/// resubmission), or a change.
pub(super) async fn find(
    conn: &impl ConnectionTrait,
    tenant_id: TenantId,
    request_id: &RequestId,
) -> Result<Option<KeyHolder>, DbErr> {
    let Some(row) = find_row(conn, tenant_id, request_id).await? else {
        let change = find_version(conn, tenant_id, request_id).await?;
        return change
            .map(|v| EventId::parse(&v.event_id).map(KeyHolder::Change).map_err(corrupt))
            .transpose();
    };
    if row.version > FIRST_VERSION {
        // Changed since: the answer and the content are those of the first version.
        let first = order_version::Entity::find_by_id((row.id, FIRST_VERSION))
            .one(conn)
            .await?
            .ok_or_else(|| corrupt("no first version"))?;
        let order =
            AcceptedOrder { version: FIRST_VERSION, total_minor: first.total, ..accepted_order(row)? };
        return Ok(Some(KeyHolder::Order(order, Submission::Fingerprint(first.fingerprint))));
    }
    let facts = stored_facts(conn, &row).await?;
    Ok(Some(KeyHolder::Order(accepted_order(row)?, Submission::Facts(facts))))
}

/// The order's facts as stored now: its customer, currency, lines and total.
pub(super) async fn stored_facts(
    conn: &impl ConnectionTrait,
    row: &orders::Model,
) -> Result<NewOrder, DbErr> {
    let lines = order_line::Entity::find()
        .filter(order_line::Column::OrderId.eq(row.id))
        .order_by_asc(order_line::Column::LineNo)
        .all(conn)
        .await?
        .into_iter()
        .map(stored_line)
        .collect::<Result<Vec<_>, _>>()?;
    let customer_id = CustomerId::parse(row.customer_id.clone()).map_err(corrupt)?;
    Ok(NewOrder::from_stored(customer_id, row.currency.clone(), lines, row.total))
}

/// Decides a submission whose insert violated `clash`, given the order that holds its key (if
/// any): a replay when that order has the same content, REQUEST_ID_REUSED when it differs,
/// EVENT_ID_IN_USE when no order holds the key and the event id clashed.
#[allow(clippy::result_large_err)] // the answer every submission path returns, unboxed
pub(super) fn decide_clash(
    submit: &SubmitOrder,
    event_id: EventId,
    clash: UniqueKey,
    existing: Option<KeyHolder>,
) -> Result<Submitted, SubmitError> {
    let (order, submitted) = match existing {
        Some(KeyHolder::Order(order, submitted)) => (order, submitted),
        Some(KeyHolder::Change(existing_event_id)) => {
            tracing::warn!(%existing_event_id, "request id already used by an order change");
            return Err(SubmitError::RequestIdReused { existing_event_id });
        }
        None => return Err(no_holder(event_id, clash)),
    };
    if !submitted.matches(&submit.order) {
        tracing::warn!(existing_event_id = %order.event_id, "request id reused for a different order");
        return Err(SubmitError::RequestIdReused { existing_event_id: order.event_id });
    }
    // A caller that made a new event id for the same request still gets the original
    // one back: the event id names the acceptance, which happened once.
    tracing::info!(order_id = order.order_id, replayed_event_id = %order.event_id, "replay of a committed order");
    Ok(Submitted { order, replayed: true })
}

/// A clash on `clash` while nothing holds the request's key: the event id is another request's,
/// or the holder vanished.
pub(super) fn no_holder(event_id: EventId, clash: UniqueKey) -> SubmitError {
    if clash.is_event_key() {
        tracing::warn!(outcome = "ROLLED_BACK", "event id already belongs to another request");
        return SubmitError::EventIdInUse { event_id };
    }
    // The row holding the key vanished (only manual deletion does that): this attempt wrote
    // nothing, and a retry will tell.
    let cause = TxFailure::from(DbErr::RecordNotFound("order holding the key".into()));
    rolled_back(event_id, cause)
}

/// Writes one order: its row, its lines and its PENDING outbox row, in `txn`.
pub(super) async fn insert_order(
    txn: &DatabaseTransaction,
    submit: &SubmitOrder,
    event_id: EventId,
    accepted_at: DateTime<Utc>,
    trace: &TraceHeaders,
) -> Result<i64, TxFailure> {
    let inserted = orders::Entity::insert(order_row(submit, event_id, accepted_at)).exec(txn).await?;
    let order_id = inserted.last_insert_id;
    order_line::Entity::insert_many(line_rows(submit.order.lines(), order_id))
        .exec_without_returning(txn)
        .await?;
    order_version::Entity::insert(submitted_version_row(submit, event_id, accepted_at, order_id))
        .exec_without_returning(txn)
        .await?;
    outbox_event::Entity::insert(outbox_row(submit, event_id, accepted_at, trace, order_id))
        .exec_without_returning(txn)
        .await?;
    tracing::info!(order_id, "order and PENDING outbox row written; not yet committed");
    Ok(order_id)
}

/// The `orders` row of an accepted order; the database assigns its id.
pub(super) fn order_row(
    submit: &SubmitOrder,
    event_id: EventId,
    accepted_at: DateTime<Utc>,
) -> orders::ActiveModel {
    let order = &submit.order;
    orders::ActiveModel {
        id: NotSet,
        tenant_id: Set(submit.tenant_id.get()),
        request_id: Set(submit.request_id.to_string()),
        acceptance_event_id: Set(event_id.to_string()),
        customer_id: Set(order.customer_id().as_str().to_owned()),
        currency: Set(order.currency().to_owned()),
        total: Set(order.total_minor()),
        version: Set(FIRST_VERSION),
        status: Set(OrderStatus::Accepted.as_str().to_owned()),
        created_at: Set(accepted_at),
    }
}

/// The `order_line` rows of `lines` for the order stored under `order_id`, numbered from 1.
pub(super) fn line_rows(
    lines: &[LineItem],
    order_id: i64,
) -> impl Iterator<Item = order_line::ActiveModel> + '_ {
    lines.iter().zip(1..).map(move |(line, line_no)| order_line::ActiveModel {
        order_id: Set(order_id),
        line_no: Set(line_no),
        sku: Set(line.sku.as_str().to_owned()),
        // At most LineItem::MAX_QUANTITY, far below i32::MAX.
        quantity: Set(line.quantity as i32),
        unit_price_minor: Set(line.unit_price_minor),
    })
}

/// The `order_version` row of version 1 of the order stored under `order_id`: it holds the
/// submission's key in the tenant's one key space, and the fingerprint of the submitted facts
/// for the day a change replaces them.
pub(super) fn submitted_version_row(
    submit: &SubmitOrder,
    event_id: EventId,
    accepted_at: DateTime<Utc>,
    order_id: i64,
) -> order_version::ActiveModel {
    order_version::ActiveModel {
        order_id: Set(order_id),
        version: Set(FIRST_VERSION),
        tenant_id: Set(submit.tenant_id.get()),
        request_id: Set(submit.request_id.to_string()),
        event_id: Set(event_id.to_string()),
        operation: Set(Operation::Submit.as_str().to_owned()),
        fingerprint: Set(Some(submit.order.fingerprint())),
        total: Set(submit.order.total_minor()),
        committed_at: Set(accepted_at),
    }
}

/// The PENDING outbox row that announces the order stored under `order_id`.
pub(super) fn outbox_row(
    submit: &SubmitOrder,
    event_id: EventId,
    accepted_at: DateTime<Utc>,
    trace: &TraceHeaders,
    order_id: i64,
) -> outbox_event::ActiveModel {
    let event = OrderEvent {
        event_id,
        order_id,
        version: FIRST_VERSION,
        event_type: EVENT_TYPE,
        payload: encode_order_accepted(event_id, order_id, FIRST_VERSION, submit, accepted_at),
        created_at: accepted_at,
    };
    event_row(event, trace)
}

/// One event of an order, encoded, on its way into the outbox.
#[derive(Debug)]
pub(super) struct OrderEvent {
    pub(super) event_id: EventId,
    pub(super) order_id: i64,
    /// The order's version the event describes.
    pub(super) version: i64,
    pub(super) event_type: &'static str,
    pub(super) payload: Vec<u8>,
    /// When the operation that made it committed.
    pub(super) created_at: DateTime<Utc>,
}

/// The PENDING outbox row of `event`, carrying the trace context of the call that made it.
pub(super) fn event_row(event: OrderEvent, trace: &TraceHeaders) -> outbox_event::ActiveModel {
    outbox_event::ActiveModel {
        event_id: Set(event.event_id.to_string()),
        aggregate_type: Set(AGGREGATE_TYPE.to_owned()),
        aggregate_id: Set(event.order_id.to_string()),
        event_type: Set(event.event_type.to_owned()),
        event_version: Set(event.version),
        payload: Set(event.payload),
        status: Set(OutboxStatus::Pending.as_str().to_owned()),
        lease_owner: Set(None),
        lease_until: Set(None),
        attempts: Set(0),
        last_error: Set(None),
        created_at: Set(event.created_at),
        published_at: Set(None),
        published_topic: Set(None),
        published_partition: Set(None),
        published_offset: Set(None),
        traceparent: Set(trace.traceparent.clone()),
        tracestate: Set(trace.tracestate.clone()),
        redrive_count: Set(0),
        last_redriven_at: Set(None),
        last_redriven_by: Set(None),
        last_redrive_reason: Set(None),
        held_back: Set(false),
    }
}

pub(super) fn accepted_order(row: orders::Model) -> Result<AcceptedOrder, DbErr> {
    Ok(AcceptedOrder {
        order_id: row.id,
        event_id: EventId::parse(&row.acceptance_event_id).map_err(corrupt)?,
        total_minor: row.total,
        version: row.version,
        status: OrderStatus::from_stored(&row.status).ok_or_else(|| corrupt("unknown order status"))?,
        accepted_at: row.created_at,
    })
}

pub(super) fn stored_line(row: order_line::Model) -> Result<LineItem, DbErr> {
    Ok(LineItem {
        sku: Sku::parse(row.sku).map_err(corrupt)?,
        quantity: u32::try_from(row.quantity).map_err(|_| corrupt("negative quantity"))?,
        unit_price_minor: row.unit_price_minor,
    })
}

/// A stored value that no version of Idempost writes.
pub(super) fn corrupt(what: &str) -> DbErr {
    DbErr::Type(format!("stored order is not valid: {what}"))
}

pub(super) fn rolled_back(event_id: EventId, cause: TxFailure) -> SubmitError {
    tracing::warn!(outcome = "ROLLED_BACK", error = %cause, "order transaction rolled back");
    SubmitError::RolledBack { event_id, cause }
}

pub(super) fn unknown(event_id: EventId, cause: TxFailure) -> SubmitError {
    tracing::error!(outcome = "UNKNOWN", error = %cause, "order transaction outcome unknown; caller must reconcile");
    SubmitError::OutcomeUnknown { event_id, cause }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempost::db::LockConflict;

    #[test]
    fn lock_conflict_retries_wait_a_jittered_doubling_time_that_stays_bounded() {
        for retry in 1..=LOCK_CONFLICT_RETRIES {
            let ceiling = std::time::Duration::from_millis(10 * (1 << (retry - 1)));
            let wait = LockConflict::backoff(retry);
            assert!(wait >= ceiling / 2 && wait <= ceiling, "retry {retry}: {wait:?}");
        }
        assert!(LockConflict::backoff(u32::MAX) <= std::time::Duration::from_millis(1280));
    }
}
