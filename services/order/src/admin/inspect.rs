//! Read-only queries behind the order side's timeline and backlog: the order database only.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use idempost::backlog;
use idempost::db::{self, purge};
use idempost::domain::OutboxStatus;
use idempost::entity::{order_version, orders, outbox_event};

/// What the order database holds for one event.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub(crate) event_id: String,
    pub(crate) order: Option<orders::Model>,
    pub(crate) outbox: Option<outbox_event::Model>,
    /// Every version of the event's order, oldest first.
    pub(crate) order_events: Vec<OrderEvent>,
}

/// One version of an order: the operation that made it and its event's outbox row, if retention
/// has not purged it.
#[derive(Debug, Clone)]
pub(crate) struct OrderEvent {
    pub(crate) version: order_version::Model,
    /// The outbox row's `event_type` and `status`.
    pub(crate) outbox: Option<(String, String)>,
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
    pub(crate) stats: backlog::Backlog,
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

    /// The event's timeline; empty when no table knows it. Every event of an order (its
    /// acceptance, amendments, cancellation) has its `order_version` row, which names the order.
    pub(crate) async fn timeline(&self, event_id: &str) -> Result<Timeline, DbErr> {
        let version = order_version::Entity::find()
            .filter(order_version::Column::EventId.eq(event_id))
            .one(&self.db)
            .await?;
        let order = match &version {
            Some(version) => orders::Entity::find_by_id(version.order_id).one(&self.db).await?,
            // Accepted by an order service older than `order_version` (a rolling upgrade).
            None => {
                orders::Entity::find()
                    .filter(orders::Column::AcceptanceEventId.eq(event_id))
                    .one(&self.db)
                    .await?
            }
        };
        let outbox = outbox_event::Entity::find_by_id(event_id.to_owned()).one(&self.db).await?;
        let order_events = match &order {
            Some(order) => self.order_events(order.id).await?,
            None => Vec::new(),
        };
        Ok(Timeline { event_id: event_id.to_owned(), order, outbox, order_events })
    }

    /// Every version of the order, oldest first, with its event's outbox type and status: one
    /// read of the order's `order_version` rows (its primary key) and one of their outbox rows
    /// (by event id).
    async fn order_events(&self, order_id: i64) -> Result<Vec<OrderEvent>, DbErr> {
        let versions = order_version::Entity::find()
            .filter(order_version::Column::OrderId.eq(order_id))
            .order_by_asc(order_version::Column::Version)
            .all(&self.db)
            .await?;
        let mut outbox: HashMap<String, (String, String)> = outbox_event::Entity::find()
            .select_only()
            .column(outbox_event::Column::EventId)
            .column(outbox_event::Column::EventType)
            .column(outbox_event::Column::Status)
            .filter(outbox_event::Column::EventId.is_in(versions.iter().map(|v| v.event_id.clone())))
            .into_tuple::<(String, String, String)>()
            .all(&self.db)
            .await?
            .into_iter()
            .map(|(event_id, event_type, status)| (event_id, (event_type, status)))
            .collect();
        Ok(versions
            .into_iter()
            .map(|version| OrderEvent { outbox: outbox.remove(&version.event_id), version })
            .collect())
    }

    /// The timeline of the event committed under `(tenant_id, request_id)` (a submission,
    /// amendment or cancellation), if one committed.
    pub(crate) async fn find(&self, tenant_id: i64, request_id: &str) -> Result<Option<Timeline>, DbErr> {
        let version = order_version::Entity::find()
            .filter(order_version::Column::TenantId.eq(tenant_id))
            .filter(order_version::Column::RequestId.eq(request_id))
            .one(&self.db)
            .await?;
        match version {
            Some(version) => Ok(Some(self.timeline(&version.event_id).await?)),
            None => Ok(None),
        }
    }

    /// Up to `limit` rows in `status` created at least `older_than` ago (database clock), oldest
    /// first, with the backlog's counts ([`backlog::backlog`]). The listing reads
    /// `idx_outbox_ready` in order once per value of `held_back`, each read stopping at `limit`,
    /// whatever the status, and keeps the oldest `limit` of both.
    pub(crate) async fn backlog(
        &self,
        status: OutboxStatus,
        older_than: Option<Duration>,
        limit: u64,
    ) -> Result<Backlog, DbErr> {
        let now = db::now(&self.db).await?;
        let before = older_than.map(|age| purge::before(now, age)).transpose()?;
        let mut entries = Vec::new();
        for held_back in backlog::HELD_BACK {
            let mut query = outbox_event::Entity::find()
                .filter(outbox_event::Column::Status.eq(status.as_str()))
                .filter(outbox_event::Column::HeldBack.eq(held_back));
            if let Some(before) = before {
                query = query.filter(outbox_event::Column::CreatedAt.lte(before));
            }
            entries.extend(
                query
                    .order_by_asc(outbox_event::Column::CreatedAt)
                    .order_by_asc(outbox_event::Column::EventId)
                    .limit(limit)
                    .all(&self.db)
                    .await?,
            );
        }
        entries.sort_by(|a, b| (a.created_at, &a.event_id).cmp(&(b.created_at, &b.event_id)));
        entries.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let stats = backlog::backlog(&self.db).await?;
        Ok(Backlog { entries, stats, now })
    }
}
