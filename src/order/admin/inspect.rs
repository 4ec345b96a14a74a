//! Read-only queries behind the order side's timeline and backlog: the order database only.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::db::{self, purge};
use crate::domain::OutboxStatus;
use crate::entity::{orders, outbox_event};
use crate::outbox;

/// What the order database holds for one event.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub(crate) event_id: String,
    pub(crate) order: Option<orders::Model>,
    pub(crate) outbox: Option<outbox_event::Model>,
}

impl Timeline {
    /// Neither table knows the event.
    pub(crate) fn is_empty(&self) -> bool {
        self.order.is_none() && self.outbox.is_none()
    }
}

/// Rows of one status, and the backlog as the relay sees it.
#[derive(Debug, Clone)]
pub(crate) struct Backlog {
    pub(crate) entries: Vec<outbox_event::Model>,
    pub(crate) stats: outbox::Backlog,
    /// The database's clock when the backlog was read, to age its oldest row by.
    pub(crate) now: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub(crate) struct Inspector {
    db: DatabaseConnection,
}

impl Inspector {
    pub(crate) fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    pub(crate) fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// The event's timeline; empty when no table knows it.
    pub(crate) async fn timeline(&self, event_id: &str) -> Result<Timeline, DbErr> {
        let order = orders::Entity::find()
            .filter(orders::Column::AcceptanceEventId.eq(event_id))
            .one(&self.db)
            .await?;
        let outbox = outbox_event::Entity::find_by_id(event_id.to_owned()).one(&self.db).await?;
        Ok(Timeline { event_id: event_id.to_owned(), order, outbox })
    }

    /// The timeline of the order accepted under `(tenant_id, request_id)`, if one committed.
    pub(crate) async fn find(&self, tenant_id: i64, request_id: &str) -> Result<Option<Timeline>, DbErr> {
        let order = orders::Entity::find()
            .filter(orders::Column::TenantId.eq(tenant_id))
            .filter(orders::Column::RequestId.eq(request_id))
            .one(&self.db)
            .await?;
        match order {
            Some(order) => Ok(Some(self.timeline(&order.acceptance_event_id).await?)),
            None => Ok(None),
        }
    }

    /// Up to `limit` rows in `status` created at least `older_than` ago (database clock), oldest
    /// first, with the backlog's counts ([`outbox::backlog`]). The listing reads
    /// `idx_outbox_due` in order and stops at `limit`, whatever the status.
    pub(crate) async fn backlog(
        &self,
        status: OutboxStatus,
        older_than: Option<Duration>,
        limit: u64,
    ) -> Result<Backlog, DbErr> {
        let now = db::now(&self.db).await?;
        let mut query = outbox_event::Entity::find().filter(outbox_event::Column::Status.eq(status.as_str()));
        if let Some(age) = older_than {
            query = query.filter(outbox_event::Column::CreatedAt.lte(purge::before(now, age)?));
        }
        let entries = query
            .order_by_asc(outbox_event::Column::CreatedAt)
            .order_by_asc(outbox_event::Column::EventId)
            .limit(limit)
            .all(&self.db)
            .await?;
        let stats = outbox::backlog(&self.db).await?;
        Ok(Backlog { entries, stats, now })
    }
}
