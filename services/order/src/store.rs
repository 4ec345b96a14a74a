//! Writes an order and its outbox event in one local transaction and reports the exact outcome.

use chrono::{DateTime, SubsecRound, Utc};
use idempost_proto::EventId;
use sea_orm::{DatabaseConnection, DbErr, EntityTrait};

use super::accepting::{
    Accepting, FIRST_VERSION, SubmitError, Submitted, accepted_order, corrupt, find_row, find_version,
};
use super::alone::Alone;
use super::group::{BatchStats, GroupCommit, GroupCommitSettings};
use idempost::domain::{Operation, OrderStatus, RequestId, SubmitOrder, TenantId};
use idempost::entity::orders;
use idempost::telemetry::{self, TraceHeaders};

/// Orders and their outbox events in one database.
#[derive(Debug, Clone)]
pub(crate) struct OrderStore {
    db: DatabaseConnection,
    alone: Alone,
    /// The writers that share transactions between orders; `None` writes one transaction per
    /// order.
    group: Option<GroupCommit>,
}

impl OrderStore {
    /// A store over `db` that writes orders as `settings` say: with group commit on, it starts
    /// the writers (on the current Tokio runtime); they stop once every clone of the store is
    /// dropped and the queue is drained.
    pub(super) fn with_settings(
        db: DatabaseConnection,
        settings: &GroupCommitSettings,
        stats: BatchStats,
    ) -> Self {
        let group = settings.is_on().then(|| GroupCommit::start(db.clone(), settings, stats));
        Self { alone: Alone::new(db.clone()), db, group }
    }

    /// `db.system.name` of the database, for spans.
    fn db_system(&self) -> &'static str {
        idempost::db::system_name(&self.db)
    }

    /// The primary database.
    pub(super) fn db(&self) -> &DatabaseConnection {
        &self.db
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
            idempost.event_id,
            trace_id,
        )
    )]
    pub(crate) async fn submit(&self, submit: &SubmitOrder) -> Result<Submitted, SubmitError> {
        let event_id = submit.event_id.unwrap_or_else(EventId::new);
        let span = tracing::Span::current();
        span.record("idempost.event_id", tracing::field::display(event_id));
        telemetry::record_trace_id(&span);
        let trace = TraceHeaders::of(&span);
        // The database keeps microseconds; truncating here makes the stored, published and
        // returned timestamps one and the same value.
        let accepted_at = Utc::now().trunc_subsecs(6);
        if let Some(group) = &self.group {
            if let Some(_slot) = group.free_slot() {
                return self.alone.submit_alone(submit, event_id, accepted_at, &trace).await;
            }
            let accepting = Accepting { submit: submit.clone(), event_id, accepted_at, trace };
            return group.submit(accepting).await;
        }
        self.alone.submit_alone(submit, event_id, accepted_at, &trace).await
    }

    /// The committed operation (submission, amendment or cancellation) with
    /// `(tenant_id, request_id)` and its order, read from this store's database.
    ///
    /// Never returns another tenant's operation.
    pub(crate) async fn reconcile(
        &self,
        tenant_id: TenantId,
        request_id: &RequestId,
    ) -> Result<Option<Reconciled>, DbErr> {
        let Some(operation) = find_version(&self.db, tenant_id, request_id).await? else {
            // An order service older than `order_version` (beside this one in a rolling upgrade)
            // writes submissions without it: the order's own key still finds them.
            return find_row(&self.db, tenant_id, request_id).await?.map(reconciled_submission).transpose();
        };
        let order = orders::Entity::find_by_id(operation.order_id)
            .one(&self.db)
            .await?
            .ok_or_else(|| corrupt("an operation without its order"))?;
        Ok(Some(Reconciled {
            order_id: order.id,
            event_id: EventId::parse(&operation.event_id).map_err(corrupt)?,
            version: operation.version,
            operation: Operation::from_stored(&operation.operation)
                .ok_or_else(|| corrupt("unknown operation"))?,
            total_minor: operation.total,
            committed_at: operation.committed_at,
            status: OrderStatus::from_stored(&order.status).ok_or_else(|| corrupt("unknown order status"))?,
            current_version: order.version,
            accepted_at: order.created_at,
        }))
    }
}

/// A submission found by the order's own key: version 1 of the order.
fn reconciled_submission(order: orders::Model) -> Result<Reconciled, DbErr> {
    let accepted = accepted_order(order.clone())?;
    Ok(Reconciled {
        order_id: order.id,
        event_id: accepted.event_id,
        version: FIRST_VERSION,
        operation: Operation::Submit,
        total_minor: order.total,
        committed_at: order.created_at,
        status: accepted.status,
        current_version: order.version,
        accepted_at: order.created_at,
    })
}

/// The operation that used an idempotency key, and its order as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reconciled {
    /// The order.
    pub(crate) order_id: i64,
    /// The event committed with the operation.
    pub(crate) event_id: EventId,
    /// The order's version the operation made (1 for a submission).
    pub(crate) version: i64,
    /// Which operation used the key.
    pub(crate) operation: Operation,
    /// The order's total after the operation, in minor units.
    pub(crate) total_minor: i64,
    /// When the operation committed.
    pub(crate) committed_at: DateTime<Utc>,
    /// The order's status now.
    pub(crate) status: OrderStatus,
    /// The order's version now.
    pub(crate) current_version: i64,
    /// When the order was accepted.
    pub(crate) accepted_at: DateTime<Utc>,
}
