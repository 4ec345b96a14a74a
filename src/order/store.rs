//! Writes an order and its outbox event in one local transaction and reports the exact outcome.

use chrono::{SubsecRound, Utc};
use sea_orm::{DatabaseConnection, DbErr};

use super::accepting::{AcceptedOrder, Accepting, SubmitError, Submitted, accepted_order, find_row};
use super::alone::Alone;
use super::group::{BatchStats, GroupCommit, GroupCommitSettings};
use crate::domain::{EventId, RequestId, SubmitOrder, TenantId};
use crate::telemetry::{self, TraceHeaders};

/// Orders and their outbox events in one database.
#[derive(Debug, Clone)]
pub struct OrderStore {
    db: DatabaseConnection,
    alone: Alone,
    /// The writers that share transactions between orders; `None` writes one transaction per
    /// order.
    group: Option<GroupCommit>,
}

impl OrderStore {
    /// A store over `db`, which must be the primary, writing one transaction per order.
    pub fn new(db: DatabaseConnection) -> Self {
        Self { alone: Alone::new(db.clone()), db, group: None }
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
        Self { alone: Alone::new(db.clone()), db, group }
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
                return self.alone.submit_alone(submit, event_id, accepted_at, &trace).await;
            }
            let accepting = Accepting { submit: submit.clone(), event_id, accepted_at, trace };
            return group.submit(accepting).await;
        }
        self.alone.submit_alone(submit, event_id, accepted_at, &trace).await
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
