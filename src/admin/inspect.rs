//! Read-only queries behind the timeline and the backlog.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::db;
use crate::domain::OutboxStatus;
use crate::entity::{consumed_event, dead_letter, notification_job, orders, outbox_event};

/// Everything the tables hold for one event.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub(crate) event_id: String,
    pub(crate) order: Option<orders::Model>,
    pub(crate) outbox: Option<outbox_event::Model>,
    pub(crate) consumers: Vec<consumed_event::Model>,
    /// One per consumer name that committed the event, oldest first.
    pub(crate) jobs: Vec<notification_job::Model>,
    pub(crate) dead_letters: Vec<dead_letter::Model>,
}

impl Timeline {
    /// No table knows the event.
    pub(crate) fn is_empty(&self) -> bool {
        self.order.is_none()
            && self.outbox.is_none()
            && self.consumers.is_empty()
            && self.jobs.is_empty()
            && self.dead_letters.is_empty()
    }
}

/// Rows of one status and counts over the whole outbox.
#[derive(Debug, Clone)]
pub(crate) struct Backlog {
    pub(crate) entries: Vec<outbox_event::Model>,
    pub(crate) counts: Vec<(OutboxStatus, u64)>,
    pub(crate) oldest_pending_age: Option<Duration>,
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
        let consumers = consumed_event::Entity::find()
            .filter(consumed_event::Column::EventId.eq(event_id))
            .order_by_asc(consumed_event::Column::ConsumedAt)
            .all(&self.db)
            .await?;
        let jobs = notification_job::Entity::find()
            .filter(notification_job::Column::EventId.eq(event_id))
            .order_by_asc(notification_job::Column::CreatedAt)
            .order_by_asc(notification_job::Column::ConsumerName)
            .all(&self.db)
            .await?;
        let dead_letters = dead_letter::Entity::find()
            .filter(dead_letter::Column::EventId.eq(event_id))
            .order_by_asc(dead_letter::Column::Id)
            .all(&self.db)
            .await?;
        Ok(Timeline { event_id: event_id.to_owned(), order, outbox, consumers, jobs, dead_letters })
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
    /// first, with the count of every status and the age of the oldest PENDING row.
    pub(crate) async fn backlog(
        &self,
        status: OutboxStatus,
        older_than: Option<Duration>,
        limit: u64,
    ) -> Result<Backlog, DbErr> {
        let now = db::now(&self.db).await?;
        let mut query = outbox_event::Entity::find().filter(outbox_event::Column::Status.eq(status.as_str()));
        if let Some(age) = older_than {
            query = query.filter(outbox_event::Column::CreatedAt.lte(before(now, age)?));
        }
        let entries = query
            .order_by_asc(outbox_event::Column::CreatedAt)
            .order_by_asc(outbox_event::Column::EventId)
            .limit(limit)
            .all(&self.db)
            .await?;
        let stored: Vec<(String, i64)> = outbox_event::Entity::find()
            .select_only()
            .column(outbox_event::Column::Status)
            .column_as(Expr::col(outbox_event::Column::EventId).count(), "n")
            .group_by(outbox_event::Column::Status)
            .into_tuple()
            .all(&self.db)
            .await?;
        let counts =
            [OutboxStatus::Pending, OutboxStatus::Publishing, OutboxStatus::Published, OutboxStatus::Failed]
                .into_iter()
                .map(|s| {
                    let n = stored.iter().find(|(stored, _)| stored == s.as_str()).map_or(0, |(_, n)| *n);
                    (s, u64::try_from(n).unwrap_or(0))
                })
                .collect();
        let oldest = outbox_event::Entity::find()
            .filter(outbox_event::Column::Status.eq(OutboxStatus::Pending.as_str()))
            .order_by_asc(outbox_event::Column::CreatedAt)
            .one(&self.db)
            .await?;
        let oldest_pending_age = oldest.map(|row| (now - row.created_at).to_std().unwrap_or_default());
        Ok(Backlog { entries, counts, oldest_pending_age })
    }
}

/// `at - age`, refusing an age beyond what timestamps can hold.
pub(crate) fn before(at: DateTime<Utc>, age: Duration) -> Result<DateTime<Utc>, DbErr> {
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| at.checked_sub_signed(age))
        .ok_or_else(|| DbErr::Custom(format!("{age:?} reaches before the earliest representable time")))
}
