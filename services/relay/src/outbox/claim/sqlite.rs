//! SQLite's claim.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, Query};
use sea_orm::{ColumnTrait, Condition, DbBackend, DbErr, EntityTrait, QueryFilter};

use super::{claimed, first_unpublished, lease_to};
use crate::lease::LeaseToken;
use crate::outbox::event::ClaimedEvent;
use crate::outbox::table::{Outbox, lease_end};
use idempost::db;
use idempost::domain::OutboxStatus;
use idempost::entity::outbox_event::{self, Column};

impl Outbox {
    pub(super) async fn claim_single_writer(
        &self,
        token: &LeaseToken,
        lease: Duration,
        batch_size: u64,
    ) -> Result<Vec<ClaimedEvent>, DbErr> {
        let now = db::now(&self.db).await?;
        let lease_until = lease_end(now, lease)?;
        let candidates = Query::select()
            .column(Column::EventId)
            .from(outbox_event::Entity)
            .cond_where(
                Condition::all()
                    .add(claimable(now))
                    .add(Expr::cust(first_unpublished(DbBackend::Sqlite, "outbox_event"))),
            )
            .order_by(Column::CreatedAt, sea_orm::Order::Asc)
            .order_by(Column::EventId, sea_orm::Order::Asc)
            .limit(batch_size)
            .to_owned();
        let mut rows = lease_to(outbox_event::Entity::update_many(), token, lease_until)
            .filter(Column::EventId.in_subquery(candidates))
            .exec_with_returning(&self.db)
            .await?;
        rows.sort_by(|a, b| (a.created_at, &a.event_id).cmp(&(b.created_at, &b.event_id)));
        // RETURNING shows the row after the update: its attempts already count this claim.
        Ok(rows.into_iter().map(|row| claimed(row, 0, lease_until, token)).collect())
    }
}

fn claimable(now: DateTime<Utc>) -> Condition {
    Condition::any().add(due(now)).add(expired(now))
}

/// PENDING events not held back whose retry time, if any, has come.
fn due(now: DateTime<Utc>) -> Condition {
    Condition::all()
        .add(Column::Status.eq(OutboxStatus::Pending.as_str()))
        .add(Column::HeldBack.eq(false))
        .add(Condition::any().add(Column::LeaseUntil.is_null()).add(Column::LeaseUntil.lte(now)))
}

/// PUBLISHING events whose lease has run out.
fn expired(now: DateTime<Utc>) -> Condition {
    Condition::all().add(Column::Status.eq(OutboxStatus::Publishing.as_str())).add(Column::LeaseUntil.lt(now))
}
