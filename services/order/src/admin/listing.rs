//! The backlog listing a page at a time: rows in one status in creation order, read without
//! their payloads, a page going on after the last row of the one before (a token naming its
//! creation time and event id), payloads read in small batches only when asked for, and no more
//! rows than the caller's budget takes.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, DerivePartialModel, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect,
};

use idempost::backlog;
use idempost::db::{self, purge};
use idempost::domain::{FieldViolation, OutboxStatus};
use idempost::edge::PAYLOAD_BATCH;
use idempost::entity::outbox_event::{self, Column};

/// Where a backlog page goes on from: the last row of the page before, in the listing's order
/// (creation time, then event id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    created_at: DateTime<Utc>,
    event_id: String,
}

impl Cursor {
    fn after(row: &outbox_event::Model) -> Self {
        Self { created_at: row.created_at, event_id: row.event_id.clone() }
    }

    /// The token a caller passes back: the creation time (RFC 3339, to the precision it was read
    /// with, so that it compares equal to the stored value again, as text on SQLite) and the
    /// event id. Opaque to callers; the server reads it back with [`Cursor::parse`].
    pub(crate) fn token(&self) -> String {
        format!("{}/{}", self.created_at.to_rfc3339_opts(SecondsFormat::AutoSi, true), self.event_id)
    }

    /// A `page_token`: empty is the first page.
    pub(crate) fn parse(token: &str) -> Result<Option<Self>, FieldViolation> {
        if token.is_empty() {
            return Ok(None);
        }
        let invalid = || FieldViolation::new("page_token", "is not a next_page_token of ListBacklog");
        let (created_at, event_id) = token.split_once('/').ok_or_else(invalid)?;
        let created_at = DateTime::parse_from_rfc3339(created_at).map_err(|_| invalid())?.with_timezone(&Utc);
        let event_id = idempost::edge::parse_event_id(event_id).map_err(|_| invalid())?;
        Ok(Some(Self { created_at, event_id }))
    }
}

/// What one backlog page asks for.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    pub(crate) status: OutboxStatus,
    pub(crate) older_than: Option<Duration>,
    pub(crate) after: Option<Cursor>,
    pub(crate) limit: u64,
    pub(crate) payloads: bool,
}

/// One page of the backlog, and the backlog as the relay sees it.
#[derive(Debug, Clone)]
pub(crate) struct Page {
    /// The rows, oldest first; payloads empty unless asked for.
    pub(crate) rows: Vec<outbox_event::Model>,
    /// Where the next page starts, when rows follow this page.
    pub(crate) next: Option<Cursor>,
    pub(crate) stats: backlog::Backlog,
    /// The database's clock when the backlog was read, to age its oldest row by.
    pub(crate) now: DateTime<Utc>,
}

/// An outbox row without its payload, which may be large and is read only when asked for.
#[derive(Debug, Clone, DerivePartialModel)]
#[sea_orm(entity = "outbox_event::Entity")]
struct Listed {
    event_id: String,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    event_version: i64,
    status: String,
    lease_owner: Option<String>,
    lease_until: Option<DateTime<Utc>>,
    attempts: i32,
    last_error: Option<String>,
    created_at: DateTime<Utc>,
    published_at: Option<DateTime<Utc>>,
    published_topic: Option<String>,
    published_partition: Option<i32>,
    published_offset: Option<i64>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    redrive_count: i32,
    last_redriven_at: Option<DateTime<Utc>>,
    last_redriven_by: Option<String>,
    last_redrive_reason: Option<String>,
    held_back: bool,
}

impl From<Listed> for outbox_event::Model {
    fn from(r: Listed) -> Self {
        Self {
            event_id: r.event_id,
            aggregate_type: r.aggregate_type,
            aggregate_id: r.aggregate_id,
            event_type: r.event_type,
            event_version: r.event_version,
            payload: Vec::new(),
            status: r.status,
            lease_owner: r.lease_owner,
            lease_until: r.lease_until,
            attempts: r.attempts,
            last_error: r.last_error,
            created_at: r.created_at,
            published_at: r.published_at,
            published_topic: r.published_topic,
            published_partition: r.published_partition,
            published_offset: r.published_offset,
            traceparent: r.traceparent,
            tracestate: r.tracestate,
            redrive_count: r.redrive_count,
            last_redriven_at: r.last_redriven_at,
            last_redriven_by: r.last_redriven_by,
            last_redrive_reason: r.last_redrive_reason,
            held_back: r.held_back,
        }
    }
}

/// One page: up to `ask.limit` rows after `ask.after`, each offered to `fits` in order (with its
/// payload when asked for) until it refuses one. The listing reads `idx_outbox_ready` in order
/// once per value of `held_back`, each read stopping one row past the limit (to know whether
/// more follow), and keeps the oldest of both.
pub(crate) async fn page(
    db: &DatabaseConnection,
    ask: &Ask,
    mut fits: impl FnMut(&outbox_event::Model) -> bool,
) -> Result<Page, DbErr> {
    let now = db::now(db).await?;
    let before = ask.older_than.map(|age| purge::before(now, age)).transpose()?;
    let mut listed = Vec::new();
    for held_back in backlog::HELD_BACK {
        let mut query = outbox_event::Entity::find()
            .filter(Column::Status.eq(ask.status.as_str()))
            .filter(Column::HeldBack.eq(held_back));
        if let Some(before) = before {
            query = query.filter(Column::CreatedAt.lte(before));
        }
        if let Some(after) = &ask.after {
            query = query.filter(Column::CreatedAt.gte(after.created_at)).filter(
                Condition::any()
                    .add(Column::CreatedAt.gt(after.created_at))
                    .add(Column::EventId.gt(&after.event_id)),
            );
        }
        let rows = query
            .order_by_asc(Column::CreatedAt)
            .order_by_asc(Column::EventId)
            .limit(ask.limit + 1)
            .into_partial_model::<Listed>()
            .all(db)
            .await?;
        listed.extend(rows.into_iter().map(outbox_event::Model::from));
    }
    listed.sort_by(|a, b| (a.created_at, &a.event_id).cmp(&(b.created_at, &b.event_id)));
    let mut more = listed.len() as u64 > ask.limit;
    listed.truncate(usize::try_from(ask.limit).unwrap_or(usize::MAX));
    let mut rows = Vec::with_capacity(listed.len());
    let mut listed = listed.into_iter().peekable();
    'batches: while listed.peek().is_some() {
        let mut batch: Vec<_> = listed.by_ref().take(PAYLOAD_BATCH).collect();
        if ask.payloads {
            let mut payloads = payloads(db, &batch).await?;
            for row in &mut batch {
                row.payload = payloads.remove(&row.event_id).unwrap_or_default();
            }
        }
        for row in batch {
            if !fits(&row) {
                more = true;
                break 'batches;
            }
            rows.push(row);
        }
    }
    let next = if more { rows.last().map(Cursor::after) } else { None };
    let stats = backlog::backlog(db).await?;
    Ok(Page { rows, next, stats, now })
}

/// The payloads of `rows`, by event id: one query of at most [`PAYLOAD_BATCH`] ids.
async fn payloads(
    db: &DatabaseConnection,
    rows: &[outbox_event::Model],
) -> Result<HashMap<String, Vec<u8>>, DbErr> {
    let ids = rows.iter().map(|row| row.event_id.clone());
    let found: Vec<(String, Vec<u8>)> = outbox_event::Entity::find()
        .select_only()
        .column(Column::EventId)
        .column(Column::Payload)
        .filter(Column::EventId.is_in(ids))
        .into_tuple()
        .all(db)
        .await?;
    Ok(found.into_iter().collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_reads_back_as_the_cursor_it_was_made_from() {
        let cursor = Cursor {
            created_at: DateTime::parse_from_rfc3339("2026-12-06T12:00:00.123456Z")
                .unwrap()
                .with_timezone(&Utc),
            event_id: "0190f0e4-58a6-7c3e-9d6e-1f2a3b4c5d6e".to_owned(),
        };
        assert_eq!(Cursor::parse(&cursor.token()).unwrap(), Some(cursor));
        assert_eq!(Cursor::parse("").unwrap(), None);
        assert!(Cursor::parse("yesterday/0190f0e4-58a6-7c3e-9d6e-1f2a3b4c5d6e").is_err());
        assert!(Cursor::parse("2026-12-06T12:00:00Z/not-an-id").is_err());
    }
}
