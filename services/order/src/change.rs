//! Changes an existing order (AmendOrder, CancelOrder): the order row, its lines, its
//! `order_version` row and one outbox event in one local transaction, raising the order's version
//! by exactly one, with the same outcomes and idempotency as a submission.
//!
//! A change never goes through group commit. It is a compare-and-set on one order row, which it
//! then holds locked until commit: sharing a transaction would make every change in a batch wait
//! for the slowest row lock, and two changes of one order in one batch would refuse each other by
//! design. Changes are also far fewer than submissions, so batching them would buy nothing.
//!
//! In the transaction, in this order:
//! 1. `UPDATE orders SET version = version + 1 … WHERE id AND tenant_id AND version = expected AND
//!    status <> 'CANCELLED'`: the one statement that decides who wins a version. Concurrent
//!    changes of one order queue on its row lock; each later one finds the version moved and
//!    changes nothing. It comes first so that the transaction starts by writing: SQLite then
//!    waits for its write lock instead of failing on a stale read snapshot.
//! 2. With no row changed, the key: an operation committed under `(tenant_id, request_id)`
//!    answers (a replay of this very change, also once the order moved on, or
//!    REQUEST_ID_REUSED); only then does the order row tell VERSION_CONFLICT, ORDER_CANCELLED or
//!    ORDER_NOT_FOUND. A replay can never win the compare-and-set: the fingerprint covers the
//!    expected version, which the original commit moved past.
//! 3. Otherwise the change itself, the `order_version` row (whose unique keys catch a key or an
//!    event id that another operation holds; then the key is read after the rollback) and the
//!    PENDING outbox row, held back while the previous version's event is unpublished (decided
//!    by writing that event's row, which the relay's mark also writes: a row lock orders the two
//!    on one server, certification on a Galera cluster).

use chrono::{DateTime, SubsecRound, Utc};
use idempost_proto::EventId;
use sea_orm::sea_query::{Alias, Expr, ExprTrait as _};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, DbErr, EntityTrait, QueryFilter,
};

use super::accepting::{
    FIRST_VERSION, OrderEvent, SubmitError, corrupt, event_row, find_version, line_rows, no_holder,
    rolled_back, stored_facts, unknown,
};
use super::event::{ChangedOrder, encode_order_amended, encode_order_cancelled};
use super::store::OrderStore;
use super::transaction::{begin, commit, read_committed, rerun_lock_conflicts};
use idempost::contract::{AGGREGATE_TYPE, ORDER_AMENDED_EVENT_TYPE, ORDER_CANCELLED_EVENT_TYPE};
use idempost::db::{TxFailure, UniqueKey, lock_conflict, violated_unique_key};
use idempost::domain::{Change, ChangeOrder, LineItem, Operation, OrderStatus, OutboxStatus};
use idempost::entity::{order_line, order_version, orders, outbox_event};
use idempost::failpoint;
use idempost::telemetry::{self, TraceHeaders};

/// A change that committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Changed {
    /// The changed order.
    pub(crate) order_id: i64,
    /// The event committed with the change.
    pub(crate) event_id: EventId,
    /// The order's version after the change.
    pub(crate) version: i64,
    /// The order's total after the change, in minor units.
    pub(crate) total_minor: i64,
    /// The order's status after the change.
    pub(crate) status: OrderStatus,
    /// When the change committed, to the microsecond the database keeps.
    pub(crate) committed_at: DateTime<Utc>,
    /// True when an identical earlier change had committed it; nothing new was written.
    pub(crate) replayed: bool,
}

/// Why a change was refused; nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// The order is not at the expected version.
    #[error(
        "the order is at version {current_version}, not the expected one: read it, decide, and retry with a new request_id"
    )]
    VersionConflict {
        /// The order's version now.
        current_version: i64,
    },
    /// The order is cancelled: no change is accepted after it.
    #[error("the order is cancelled (version {current_version}); no change is accepted after a cancellation")]
    OrderCancelled {
        /// The order's version now (its last).
        current_version: i64,
    },
    /// The tenant has no order with that id.
    #[error("the tenant has no order with this order_id")]
    OrderNotFound,
}

/// A refused change: why, and the event id it would have committed (none was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{refusal}")]
pub(crate) struct Refused {
    /// Why.
    pub(crate) refusal: Refusal,
    /// The event id of the attempt.
    pub(crate) event_id: EventId,
}

/// A committed change, or why it was refused.
pub(crate) type ChangeOutcome = Result<Changed, Refused>;

/// How one run of a change's transaction ended before its commit.
enum Step {
    /// The change is written and waits for the commit.
    Written(Changed),
    /// Answered from what is stored; this run wrote nothing.
    Answered(Result<ChangeOutcome, SubmitError>),
}

impl OrderStore {
    /// Applies `change` idempotently by `(tenant_id, request_id)` if the order is at the
    /// expected version. The event id exists before the transaction begins and every run of it
    /// reuses it.
    #[tracing::instrument(
        name = "order change transaction",
        skip_all,
        fields(
            otel.kind = "client",
            db.system.name = idempost::db::system_name(self.db()),
            db.operation.name = "UPDATE orders, INSERT order_version, outbox_event",
            tenant_id = %change.tenant_id,
            request_id = %change.request_id,
            order_id = change.order_id,
            expected_version = change.expected_version,
            idempost.event_id,
            trace_id,
        )
    )]
    pub(crate) async fn change(&self, change: &ChangeOrder) -> Result<ChangeOutcome, SubmitError> {
        let event_id = change.event_id.unwrap_or_else(EventId::new);
        let span = tracing::Span::current();
        span.record("idempost.event_id", tracing::field::display(event_id));
        telemetry::record_trace_id(&span);
        let trace = TraceHeaders::of(&span);
        let committed_at = Utc::now().trunc_subsecs(6);
        rerun_lock_conflicts(|| self.change_attempt(change, event_id, committed_at, &trace)).await
    }

    /// One run of the change's transaction. A lock-conflict victim comes back as an unlogged
    /// `RolledBack`; every other outcome is final.
    async fn change_attempt(
        &self,
        change: &ChangeOrder,
        event_id: EventId,
        committed_at: DateTime<Utc>,
        trace: &TraceHeaders,
    ) -> Result<ChangeOutcome, SubmitError> {
        let txn = begin(self.db(), read_committed(self.db()), event_id).await?;
        let step = async {
            if !claim_version(&txn, change).await? {
                if let Some(answer) = by_key(&txn, change).await? {
                    return Ok(Step::Answered(answer));
                }
                let refusal = refusal(&txn, change).await?;
                return Ok(Step::Answered(Ok(Err(Refused { refusal, event_id }))));
            }
            let changed = write_change(&txn, change, event_id, committed_at, trace).await?;
            failpoint::hit(failpoint::BEFORE_ORDER_TRANSACTION_COMMIT)?;
            Ok::<_, TxFailure>(Step::Written(changed))
        }
        .await;
        match step {
            Ok(Step::Written(changed)) => {
                commit(txn, event_id).await?;
                tracing::info!(
                    version = changed.version,
                    outcome = "COMMITTED",
                    "transaction committed; order changed, outbox event PENDING"
                );
                Ok(Ok(changed))
            }
            Ok(Step::Answered(answer)) => {
                // The compare-and-set changed no row and only reads followed: nothing to keep, so
                // the answer stands whatever the rollback says.
                let _ = txn.rollback().await;
                if let Ok(Err(refused)) = &answer {
                    tracing::info!(refusal = %refused, "change refused; nothing written");
                }
                answer
            }
            Err(cause) => self.after_failed_change(txn, change, event_id, cause).await,
        }
    }

    /// Rolls back after a failed write and decides what the failure means: only a violation of
    /// one of `order_version`'s named keys is read as "another operation took the key or the
    /// event id".
    async fn after_failed_change(
        &self,
        txn: DatabaseTransaction,
        change: &ChangeOrder,
        event_id: EventId,
        cause: TxFailure,
    ) -> Result<ChangeOutcome, SubmitError> {
        if let Err(e) = txn.rollback().await {
            tracing::warn!(error = %e, "rollback failed; outcome unknown");
            return Err(unknown(event_id, cause));
        }
        match cause.db_err().and_then(violated_unique_key) {
            Some(clash @ (UniqueKey::OrderVersionTenantRequest | UniqueKey::OrderVersionEvent)) => {
                match by_key(self.db(), change).await {
                    Ok(Some(answer)) => answer,
                    Ok(None) => Err(no_holder(event_id, clash)),
                    Err(e) => Err(rolled_back(event_id, e)),
                }
            }
            // Logged by `rerun_lock_conflicts` once it knows whether the transaction runs again.
            _ if cause.db_err().and_then(lock_conflict).is_some() => {
                Err(SubmitError::RolledBack { event_id, cause })
            }
            _ => Err(rolled_back(event_id, cause)),
        }
    }
}

/// The answer from the operation that already used the change's key, if one did: a replay when
/// it was this very change (same fingerprint), REQUEST_ID_REUSED for anything else.
async fn by_key(
    conn: &impl ConnectionTrait,
    change: &ChangeOrder,
) -> Result<Option<Result<ChangeOutcome, SubmitError>>, TxFailure> {
    let Some(row) = find_version(conn, change.tenant_id, &change.request_id).await? else {
        return Ok(None);
    };
    let existing_event_id = EventId::parse(&row.event_id).map_err(corrupt)?;
    if row.fingerprint.as_deref() != Some(change.fingerprint().as_str()) {
        tracing::warn!(%existing_event_id, "request id already used by another operation");
        return Ok(Some(Err(SubmitError::RequestIdReused { existing_event_id })));
    }
    tracing::info!(version = row.version, replayed_event_id = %existing_event_id, "replay of a committed change");
    let status = match change.change {
        Change::Amend { .. } => OrderStatus::Accepted,
        Change::Cancel { .. } => OrderStatus::Cancelled,
    };
    Ok(Some(Ok(Ok(Changed {
        order_id: row.order_id,
        event_id: existing_event_id,
        version: row.version,
        total_minor: row.total,
        status,
        committed_at: row.committed_at,
        replayed: true,
    }))))
}

/// The compare-and-set that gives the change its version: true when the order was at the
/// expected version, not cancelled, and is now one version further (and cancelled, for a
/// cancellation), locked by this transaction until it ends.
async fn claim_version(txn: &DatabaseTransaction, change: &ChangeOrder) -> Result<bool, DbErr> {
    let mut update = orders::Entity::update_many()
        .col_expr(orders::Column::Version, Expr::col(orders::Column::Version).add(1))
        .filter(orders::Column::Id.eq(change.order_id))
        .filter(orders::Column::TenantId.eq(change.tenant_id.get()))
        .filter(orders::Column::Version.eq(change.expected_version))
        .filter(orders::Column::Status.ne(OrderStatus::Cancelled.as_str()));
    if let Change::Cancel { .. } = change.change {
        update = update.col_expr(orders::Column::Status, Expr::value(OrderStatus::Cancelled.as_str()));
    }
    // Every match changes the version, so affected rows count matches on MariaDB too.
    Ok(update.exec(txn).await?.rows_affected == 1)
}

/// Why the compare-and-set changed no row, read from the order as it is now.
async fn refusal(txn: &DatabaseTransaction, change: &ChangeOrder) -> Result<Refusal, DbErr> {
    let order = orders::Entity::find()
        .filter(orders::Column::Id.eq(change.order_id))
        .filter(orders::Column::TenantId.eq(change.tenant_id.get()))
        .one(txn)
        .await?;
    Ok(match order {
        None => Refusal::OrderNotFound,
        Some(o) if o.status == OrderStatus::Cancelled.as_str() => {
            Refusal::OrderCancelled { current_version: o.version }
        }
        Some(o) => Refusal::VersionConflict { current_version: o.version },
    })
}

/// Writes the change to the order claimed by [`claim_version`], its `order_version` row and its
/// PENDING outbox row.
async fn write_change(
    txn: &DatabaseTransaction,
    change: &ChangeOrder,
    event_id: EventId,
    committed_at: DateTime<Utc>,
    trace: &TraceHeaders,
) -> Result<Changed, TxFailure> {
    if change.expected_version == FIRST_VERSION {
        keep_submitted_fingerprint(txn, change.order_id).await?;
    }
    let version = change.new_version();
    let event = ChangedOrder { event_id, order_id: change.order_id, version, change, committed_at };
    let (status, total_minor, event_type, payload) = match &change.change {
        Change::Amend { customer_id, lines } => {
            let mut update = orders::Entity::update_many().filter(orders::Column::Id.eq(change.order_id));
            if let Some(customer_id) = customer_id {
                update = update.col_expr(orders::Column::CustomerId, Expr::value(customer_id.as_str()));
            }
            if let Some((lines, total)) = lines {
                update = update.col_expr(orders::Column::Total, Expr::value(*total));
                replace_lines(txn, change.order_id, lines).await?;
            }
            update.exec(txn).await?;
            let facts = stored_facts(txn, &order_row(txn, change.order_id).await?).await?;
            let payload = encode_order_amended(&event, &facts);
            (OrderStatus::Accepted, facts.total_minor(), ORDER_AMENDED_EVENT_TYPE, payload)
        }
        Change::Cancel { reason, note } => {
            let total = order_row(txn, change.order_id).await?.total;
            let payload = encode_order_cancelled(&event, *reason, note, total);
            (OrderStatus::Cancelled, total, ORDER_CANCELLED_EVENT_TYPE, payload)
        }
    };
    order_version::Entity::insert(order_version::ActiveModel {
        order_id: Set(change.order_id),
        version: Set(version),
        tenant_id: Set(change.tenant_id.get()),
        request_id: Set(change.request_id.to_string()),
        event_id: Set(event_id.to_string()),
        operation: Set(change.operation().as_str().to_owned()),
        fingerprint: Set(Some(change.fingerprint())),
        total: Set(total_minor),
        committed_at: Set(committed_at),
    })
    .exec_without_returning(txn)
    .await?;
    let event = OrderEvent {
        event_id,
        order_id: change.order_id,
        version,
        event_type,
        payload,
        created_at: committed_at,
    };
    let mut row = event_row(event, trace);
    row.held_back = Set(previous_version_unpublished(txn, change.order_id, version - 1).await?);
    outbox_event::Entity::insert(row).exec_without_returning(txn).await?;
    tracing::info!(version, "order change and PENDING outbox row written; not yet committed");
    Ok(Changed {
        order_id: change.order_id,
        event_id,
        version,
        total_minor,
        status,
        committed_at,
        replayed: false,
    })
}

/// Whether the order's outbox event of `version` is not yet PUBLISHED, decided by writing that
/// event's row: the new event is then written held back (`outbox_event.held_back`), and the
/// relay's mark of that version clears it in the mark's transaction after this one has committed.
///
/// The write records the new version (`successor_version`, a real change, never a no-op) only
/// while the row is unpublished, so it both locks the row and puts it in this transaction's
/// write-set. On one server its row lock orders it with the mark, which takes the same lock: if
/// the mark locked first, this statement waits and then finds PUBLISHED; if this one did, the
/// mark waits and its release, a new statement, sees this commit. On a Galera cluster a lock
/// holds only on its node, but certification refuses the second of two commits that wrote the
/// same row, so a change and a mark through different nodes can no longer both commit without
/// seeing each other: the refused one (a deadlock at COMMIT, a confirmed rollback) runs again
/// (`docs/design/per-order-order.md`, "On Galera"). It replaces a locking read of the same row:
/// the change's statement count is unchanged. A row that is gone was published (retention
/// deletes only PUBLISHED rows); SQLite has one writer, which this transaction already is.
async fn previous_version_unpublished(
    txn: &DatabaseTransaction,
    order_id: i64,
    version: i64,
) -> Result<bool, DbErr> {
    let written = outbox_event::Entity::update_many()
        .col_expr(Alias::new(SUCCESSOR_VERSION), Expr::value(version + 1))
        .filter(outbox_event::Column::AggregateType.eq(AGGREGATE_TYPE))
        .filter(outbox_event::Column::AggregateId.eq(order_id.to_string()))
        .filter(outbox_event::Column::EventVersion.eq(version))
        .filter(outbox_event::Column::Status.ne(OutboxStatus::Published.as_str()))
        .exec(txn)
        .await?;
    // Only the change that won version + 1 writes it, so the value always changes and MariaDB
    // counts the row as affected.
    Ok(written.rows_affected > 0)
}

/// `outbox_event.successor_version` (migration `m20261206_000006_successor_version`): written
/// only here and read by nothing, so it is not a field of the entity.
const SUCCESSOR_VERSION: &str = "successor_version";

/// The order row as this transaction sees it (claimed, so present).
async fn order_row(txn: &DatabaseTransaction, order_id: i64) -> Result<orders::Model, DbErr> {
    orders::Entity::find_by_id(order_id).one(txn).await?.ok_or_else(|| corrupt("claimed order vanished"))
}

/// Replaces every line of the order with `lines`.
async fn replace_lines(txn: &DatabaseTransaction, order_id: i64, lines: &[LineItem]) -> Result<(), DbErr> {
    order_line::Entity::delete_many().filter(order_line::Column::OrderId.eq(order_id)).exec(txn).await?;
    order_line::Entity::insert_many(line_rows(lines, order_id)).exec_without_returning(txn).await?;
    Ok(())
}

/// Before the first change replaces an order's facts: an order accepted before fingerprints were
/// kept gets the fingerprint of its facts now, which are still the submitted ones, so that a
/// resubmission of it is still answered as a replay afterwards. One written by an order service
/// older than `order_version` (a rolling upgrade) gets its whole version-1 row.
async fn keep_submitted_fingerprint(txn: &DatabaseTransaction, order_id: i64) -> Result<(), DbErr> {
    let first = order_version::Entity::find_by_id((order_id, FIRST_VERSION)).one(txn).await?;
    if first.as_ref().is_some_and(|row| row.fingerprint.is_some()) {
        return Ok(());
    }
    let order = order_row(txn, order_id).await?;
    let fingerprint = stored_facts(txn, &order).await?.fingerprint();
    if first.is_some() {
        order_version::Entity::update_many()
            .col_expr(order_version::Column::Fingerprint, Expr::value(fingerprint))
            .filter(order_version::Column::OrderId.eq(order_id))
            .filter(order_version::Column::Version.eq(FIRST_VERSION))
            .exec(txn)
            .await?;
        return Ok(());
    }
    order_version::Entity::insert(order_version::ActiveModel {
        order_id: Set(order_id),
        version: Set(FIRST_VERSION),
        tenant_id: Set(order.tenant_id),
        request_id: Set(order.request_id),
        event_id: Set(order.acceptance_event_id),
        operation: Set(Operation::Submit.as_str().to_owned()),
        fingerprint: Set(Some(fingerprint)),
        total: Set(order.total),
        committed_at: Set(order.created_at),
    })
    .exec_without_returning(txn)
    .await?;
    Ok(())
}
