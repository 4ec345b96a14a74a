//! Writes an order and its outbox event in one local transaction and reports the exact outcome.

use chrono::{DateTime, SubsecRound, Utc};
use opentelemetry::KeyValue;
use sea_orm::{
    ActiveValue::{NotSet, Set},
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait, QueryFilter,
    QueryOrder, TransactionTrait,
};

use super::event::encode_order_accepted;
use super::group::{BatchStats, GroupCommit, GroupCommitSettings};
use crate::contract::{AGGREGATE_TYPE, EVENT_TYPE};
use crate::db::{LockConflict, TxFailure, UniqueKey, lock_conflict, violated_unique_key};
use crate::domain::{
    CustomerId, EventId, LineItem, NewOrder, OrderStatus, OutboxStatus, RequestId, Sku, SubmitOrder, TenantId,
};
use crate::entity::{order_line, orders, outbox_event};
use crate::failpoint;
use crate::telemetry::{self, TraceHeaders, metrics};

/// The version of an order's facts when it is accepted.
pub(super) const FIRST_VERSION: i64 = 1;

/// Runs of the order transaction after the first one that lost a lock conflict.
pub(super) const LOCK_CONFLICT_RETRIES: u32 = 5;

/// An order that committed with its acceptance event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedOrder {
    /// The server-assigned order id.
    pub order_id: i64,
    /// The acceptance event committed with the order.
    pub event_id: EventId,
    /// Total in minor units.
    pub total_minor: i64,
    /// Version of the order's facts.
    pub version: i64,
    /// Where the order is in its life.
    pub status: OrderStatus,
    /// When it was accepted, to the microsecond the database keeps.
    pub accepted_at: DateTime<Utc>,
}

/// A successful submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The committed order.
    pub order: AcceptedOrder,
    /// True when an identical earlier submission had committed it; nothing new was written.
    pub replayed: bool,
}

/// A submission that did not produce a committed order.
///
/// Each variant says what is known about the database afterwards.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
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
fn accepted(submit: &SubmitOrder, event_id: EventId, accepted_at: DateTime<Utc>, order_id: i64) -> Submitted {
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

/// Orders and their outbox events in one database.
#[derive(Debug, Clone)]
pub struct OrderStore {
    db: DatabaseConnection,
    /// The writers that share transactions between orders; `None` writes one transaction per
    /// order.
    group: Option<GroupCommit>,
}

impl OrderStore {
    /// A store over `db`, which must be the primary, writing one transaction per order.
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db, group: None }
    }

    /// A store over `db` that writes orders as `settings` say: with group commit on, it starts
    /// the writers (on the current Tokio runtime); they stop once every clone of the store is
    /// dropped and the queue is drained.
    pub(super) fn with_settings(
        db: DatabaseConnection,
        settings: &GroupCommitSettings,
        stats: BatchStats,
    ) -> Self {
        let group = settings.is_on().then(|| GroupCommit::start(db.clone(), settings, stats));
        Self { db, group }
    }

    /// `db.system.name` of the database, for spans.
    fn db_system(&self) -> &'static str {
        crate::db::system_name(&self.db)
    }

    /// Accepts `submit` idempotently by `(tenant_id, request_id)`.
    ///
    /// The event id exists before the transaction begins. The order row, its lines and the
    /// PENDING outbox row are written on one connection in one transaction. A repeat of an
    /// order that already committed returns that order with `replayed = true`; only a violation
    /// of `uq_orders_tenant_request` is taken to mean that.
    #[tracing::instrument(
        name = "order transaction",
        skip_all,
        fields(
            otel.kind = "client",
            db.system.name = self.db_system(),
            db.operation.name = "INSERT orders, order_line, outbox_event",
            tenant_id = %submit.tenant_id,
            request_id = %submit.request_id,
            outpost.event_id,
            trace_id,
        )
    )]
    pub async fn submit(&self, submit: &SubmitOrder) -> Result<Submitted, SubmitError> {
        let event_id = submit.event_id.unwrap_or_else(EventId::new);
        let span = tracing::Span::current();
        span.record("outpost.event_id", tracing::field::display(event_id));
        telemetry::record_trace_id(&span);
        let trace = TraceHeaders::of(&span);
        // The database keeps microseconds; truncating here makes the stored, published and
        // returned timestamps one and the same value.
        let accepted_at = Utc::now().trunc_subsecs(6);
        if let Some(group) = &self.group {
            if let Some(_slot) = group.free_slot() {
                return self.submit_alone(submit, event_id, accepted_at, &trace).await;
            }
            let accepting = Accepting { submit: submit.clone(), event_id, accepted_at, trace };
            return group.submit(accepting).await;
        }
        self.submit_alone(submit, event_id, accepted_at, &trace).await
    }

    /// Writes one order in a transaction of its own, running it again after a lost lock
    /// conflict.
    pub(super) async fn submit_alone(
        &self,
        submit: &SubmitOrder,
        event_id: EventId,
        accepted_at: DateTime<Utc>,
        trace: &TraceHeaders,
    ) -> Result<Submitted, SubmitError> {
        // A deadlock or lock-wait-timeout victim was rolled back by the server (and then by us,
        // confirmed): nothing of it remains, so it runs again with the same ids before the
        // caller hears ROLLED_BACK.
        let mut retries = 0;
        loop {
            match self.attempt(submit, event_id, accepted_at, trace).await {
                Err(SubmitError::RolledBack { event_id, cause }) => {
                    let Some(conflict) = cause.db_err().and_then(lock_conflict) else {
                        // Final, and already logged.
                        return Err(SubmitError::RolledBack { event_id, cause });
                    };
                    if retries == LOCK_CONFLICT_RETRIES {
                        return Err(rolled_back(event_id, cause));
                    }
                    retries += 1;
                    metrics().order_lock_retries.add(1, &[KeyValue::new("reason", conflict.as_str())]);
                    let wait = LockConflict::backoff(retries);
                    tracing::warn!(
                        reason = conflict.as_str(),
                        retry = retries,
                        ?wait,
                        error = %cause,
                        "order transaction lost a lock conflict and was rolled back; retrying with the same ids"
                    );
                    tokio::time::sleep(wait).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// One run of the order transaction. A lock-conflict victim comes back as an unlogged
    /// `RolledBack` (the caller decides whether it is final); every other outcome is final.
    async fn attempt(
        &self,
        submit: &SubmitOrder,
        event_id: EventId,
        accepted_at: DateTime<Utc>,
        trace: &TraceHeaders,
    ) -> Result<Submitted, SubmitError> {
        let txn = match self.db.begin().await {
            Ok(txn) => txn,
            // No transaction began, so nothing can have been written.
            Err(e) => {
                let cause = TxFailure::from(e);
                tracing::warn!(outcome = "UNAVAILABLE", error = %cause, "no transaction began; nothing written");
                return Err(SubmitError::Unavailable { event_id, cause });
            }
        };
        let written = async {
            let order_id = insert_order(&txn, submit, event_id, accepted_at, trace).await?;
            failpoint::hit(failpoint::BEFORE_ORDER_TRANSACTION_COMMIT)?;
            Ok::<_, TxFailure>(order_id)
        }
        .await;
        let order_id = match written {
            Ok(order_id) => order_id,
            Err(cause) => return self.after_failed_write(txn, submit, event_id, cause).await,
        };

        if let Err(injected) = failpoint::hit(failpoint::COMMIT_FAILS_WITHOUT_COMMITTING) {
            let _ = txn.rollback().await;
            return Err(unknown(event_id, injected.into()));
        }
        if let Err(e) = txn.commit().await {
            // The server may have committed and only the acknowledgement was lost. Never turn
            // this into ROLLED_BACK: a later rollback cannot prove the commit did not happen.
            return Err(unknown(event_id, e.into()));
        }
        failpoint::hit(failpoint::COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION)
            .map_err(|injected| unknown(event_id, injected.into()))?;

        tracing::info!(
            order_id,
            outcome = "COMMITTED",
            "transaction committed; order ACCEPTED, outbox event PENDING"
        );
        Ok(accepted(submit, event_id, accepted_at, order_id))
    }

    /// Rolls back after a failed write and decides what the failure means.
    async fn after_failed_write(
        &self,
        txn: DatabaseTransaction,
        submit: &SubmitOrder,
        event_id: EventId,
        cause: TxFailure,
    ) -> Result<Submitted, SubmitError> {
        if let Err(e) = txn.rollback().await {
            tracing::warn!(error = %e, "rollback failed; outcome unknown");
            return Err(unknown(event_id, cause));
        }
        match cause.db_err().and_then(violated_unique_key) {
            // SQLite reports only one violated index, and names the event id key when both
            // keys clash. Either way the decision below rests on the stored row that holds
            // this request's key, never on a guess from some other constraint.
            Some(key @ (UniqueKey::OrdersTenantRequest | UniqueKey::OrdersAcceptanceEvent)) => {
                self.replay(submit, event_id, key).await
            }
            // Logged by `submit` once it knows whether the transaction runs again.
            _ if cause.db_err().and_then(lock_conflict).is_some() => {
                Err(SubmitError::RolledBack { event_id, cause })
            }
            _ => Err(rolled_back(event_id, cause)),
        }
    }

    /// Answers a submission that clashed with a committed order: a replay when an order with
    /// the same key and the same content exists.
    async fn replay(
        &self,
        submit: &SubmitOrder,
        event_id: EventId,
        clash: UniqueKey,
    ) -> Result<Submitted, SubmitError> {
        let existing = find(&self.db, submit.tenant_id, &submit.request_id)
            .await
            .map_err(|e| rolled_back(event_id, e.into()))?;
        decide_clash(submit, event_id, clash, existing)
    }

    /// The committed order with `(tenant_id, request_id)`, read from this store's database.
    ///
    /// Never returns another tenant's order.
    pub async fn reconcile(
        &self,
        tenant_id: TenantId,
        request_id: &RequestId,
    ) -> Result<Option<AcceptedOrder>, DbErr> {
        find_row(&self.db, tenant_id, request_id).await?.map(accepted_order).transpose()
    }
}

/// The order row with `(tenant_id, request_id)` as `conn` sees it.
async fn find_row(
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

/// The order with this key and its facts as `conn` sees them, for comparison with a
/// resubmission.
pub(super) async fn find(
    conn: &impl ConnectionTrait,
    tenant_id: TenantId,
    request_id: &RequestId,
) -> Result<Option<(AcceptedOrder, NewOrder)>, DbErr> {
    let Some(row) = find_row(conn, tenant_id, request_id).await? else {
        return Ok(None);
    };
    let lines = order_line::Entity::find()
        .filter(order_line::Column::OrderId.eq(row.id))
        .order_by_asc(order_line::Column::LineNo)
        .all(conn)
        .await?
        .into_iter()
        .map(stored_line)
        .collect::<Result<Vec<_>, _>>()?;
    let customer_id = CustomerId::parse(row.customer_id.clone()).map_err(corrupt)?;
    let facts = NewOrder::from_stored(customer_id, row.currency.clone(), lines, row.total);
    Ok(Some((accepted_order(row)?, facts)))
}

/// Decides a submission whose insert violated `clash`, given the order that holds its key (if
/// any): a replay when that order has the same content, REQUEST_ID_REUSED when it differs,
/// EVENT_ID_IN_USE when no order holds the key and the event id clashed.
#[allow(clippy::result_large_err)] // the answer every submission path returns, unboxed
pub(super) fn decide_clash(
    submit: &SubmitOrder,
    event_id: EventId,
    clash: UniqueKey,
    existing: Option<(AcceptedOrder, NewOrder)>,
) -> Result<Submitted, SubmitError> {
    let Some((order, facts)) = existing else {
        if clash == UniqueKey::OrdersAcceptanceEvent {
            tracing::warn!(outcome = "ROLLED_BACK", "event id already belongs to another order");
            return Err(SubmitError::EventIdInUse { event_id });
        }
        // The order holding the key vanished (only manual deletion does that): this
        // attempt wrote nothing, and a retry will tell.
        let cause = TxFailure::from(DbErr::RecordNotFound("order holding the key".into()));
        return Err(rolled_back(event_id, cause));
    };
    if facts != submit.order {
        tracing::warn!(existing_event_id = %order.event_id, "request id reused for a different order");
        return Err(SubmitError::RequestIdReused { existing_event_id: order.event_id });
    }
    // A caller that made a new event id for the same request still gets the original
    // one back: the event id names the acceptance, which happened once.
    tracing::info!(order_id = order.order_id, replayed_event_id = %order.event_id, "replay of a committed order");
    Ok(Submitted { order, replayed: true })
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
    order_line::Entity::insert_many(line_rows(submit, order_id)).exec_without_returning(txn).await?;
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

/// The `order_line` rows of the order stored under `order_id`, numbered from 1.
pub(super) fn line_rows(
    submit: &SubmitOrder,
    order_id: i64,
) -> impl Iterator<Item = order_line::ActiveModel> + '_ {
    submit.order.lines().iter().zip(1..).map(move |(line, line_no)| order_line::ActiveModel {
        order_id: Set(order_id),
        line_no: Set(line_no),
        sku: Set(line.sku.as_str().to_owned()),
        // At most LineItem::MAX_QUANTITY, far below i32::MAX.
        quantity: Set(line.quantity as i32),
        unit_price_minor: Set(line.unit_price_minor),
    })
}

/// The PENDING outbox row that announces the order stored under `order_id`.
pub(super) fn outbox_row(
    submit: &SubmitOrder,
    event_id: EventId,
    accepted_at: DateTime<Utc>,
    trace: &TraceHeaders,
    order_id: i64,
) -> outbox_event::ActiveModel {
    outbox_event::ActiveModel {
        event_id: Set(event_id.to_string()),
        aggregate_type: Set(AGGREGATE_TYPE.to_owned()),
        aggregate_id: Set(order_id.to_string()),
        event_type: Set(EVENT_TYPE.to_owned()),
        event_version: Set(FIRST_VERSION),
        payload: Set(encode_order_accepted(event_id, order_id, FIRST_VERSION, submit, accepted_at)),
        status: Set(OutboxStatus::Pending.as_str().to_owned()),
        lease_owner: Set(None),
        lease_until: Set(None),
        attempts: Set(0),
        last_error: Set(None),
        created_at: Set(accepted_at),
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
    }
}

fn accepted_order(row: orders::Model) -> Result<AcceptedOrder, DbErr> {
    Ok(AcceptedOrder {
        order_id: row.id,
        event_id: EventId::parse(&row.acceptance_event_id).map_err(corrupt)?,
        total_minor: row.total,
        version: row.version,
        status: OrderStatus::from_stored(&row.status).ok_or_else(|| corrupt("unknown order status"))?,
        accepted_at: row.created_at,
    })
}

fn stored_line(row: order_line::Model) -> Result<LineItem, DbErr> {
    Ok(LineItem {
        sku: Sku::parse(row.sku).map_err(corrupt)?,
        quantity: u32::try_from(row.quantity).map_err(|_| corrupt("negative quantity"))?,
        unit_price_minor: row.unit_price_minor,
    })
}

/// A stored value that no version of Outpost writes.
fn corrupt(what: &str) -> DbErr {
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
