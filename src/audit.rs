//! The one audit of operators' writes (table `admin_audit`), shared by the order side
//! (Redrive, Purge, Replay, the relay's `redrive` command) and the consumer (ReleaseParkedGap,
//! PurgeConsumed): each write adds its row inside its own transaction, so that no write commits
//! without its row and no row stands for a write that rolled back. Rows are only ever added.

use sea_orm::{
    ActiveValue::{NotSet, Set},
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};

use crate::db;
use crate::entity::admin_audit::{self, Column};
use crate::telemetry;

/// What an operator did: the `action` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A FAILED event back to PENDING.
    Redrive,
    /// PUBLISHED outbox rows deleted by an operator's call.
    Purge,
    /// PUBLISHED events back to PENDING, to be published again.
    Replay,
    /// A gap in one order's read model given up.
    ReleaseGap,
    /// consumed_event rows deleted by an operator's call.
    PurgeConsumed,
}

impl Action {
    /// Every action, as stored.
    pub const ALL: [Self; 5] =
        [Self::Redrive, Self::Purge, Self::Replay, Self::ReleaseGap, Self::PurgeConsumed];

    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Redrive => "REDRIVE",
            Self::Purge => "PURGE",
            Self::Replay => "REPLAY",
            Self::ReleaseGap => "RELEASE_GAP",
            Self::PurgeConsumed => "PURGE_CONSUMED",
        }
    }

    /// The action stored as `text`, if any.
    pub fn from_stored(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == text)
    }
}

/// One write to record. The columns' bounds cut longer text (the callers bound it first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Who: the token's subject, or the name given where there is no token.
    pub actor: String,
    pub action: Action,
    pub event_id: Option<String>,
    pub order_id: Option<i64>,
    pub consumer_name: Option<String>,
    /// Why, as the operator said.
    pub reason: String,
    /// What came of it, as text.
    pub outcome: String,
}

impl Entry {
    /// An entry of `action` by `actor` for `reason`, about nothing in particular yet.
    pub fn new(action: Action, actor: &str, reason: &str, outcome: String) -> Self {
        Self {
            actor: actor.to_owned(),
            action,
            event_id: None,
            order_id: None,
            consumer_name: None,
            reason: reason.to_owned(),
            outcome,
        }
    }
}

/// The most characters of each text column (as the migration made them).
const ACTOR_CHARS: usize = 256;
const TEXT_CHARS: usize = 1024;
const CONSUMER_CHARS: usize = 128;

/// Adds `entry`'s row on `txn` (the transaction of the write it records), at the database's
/// clock, with the current span's trace id; answers the row's id.
pub async fn record(txn: &impl ConnectionTrait, entry: Entry) -> Result<i64, DbErr> {
    let cut = |text: String, n: usize| text.chars().take(n).collect::<String>();
    let row = admin_audit::ActiveModel {
        id: NotSet,
        recorded_at: Set(db::now(txn).await?),
        actor: Set(cut(entry.actor, ACTOR_CHARS)),
        action: Set(entry.action.as_str().to_owned()),
        event_id: Set(entry.event_id),
        order_id: Set(entry.order_id),
        consumer_name: Set(entry.consumer_name.map(|name| cut(name, CONSUMER_CHARS))),
        reason: Set(cut(entry.reason, TEXT_CHARS)),
        trace_id: Set(telemetry::current_trace_id()),
        outcome: Set(cut(entry.outcome, TEXT_CHARS)),
    };
    let id = admin_audit::Entity::insert(row).exec(txn).await?.last_insert_id;
    Ok(id)
}

/// Which rows a page holds: every given part must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// Rows with a smaller id only.
    pub before_id: Option<i64>,
    pub action: Option<Action>,
    pub order_id: Option<i64>,
    pub event_id: Option<String>,
    /// The most rows.
    pub limit: u64,
}

/// A page of the audit, newest first, read on the primary key (and the event's or order's
/// index when the page names one).
pub async fn page(db: &impl ConnectionTrait, page: &Page) -> Result<Vec<admin_audit::Model>, DbErr> {
    let mut query = admin_audit::Entity::find();
    if let Some(before) = page.before_id {
        query = query.filter(Column::Id.lt(before));
    }
    if let Some(action) = page.action {
        query = query.filter(Column::Action.eq(action.as_str()));
    }
    if let Some(order_id) = page.order_id {
        query = query.filter(Column::OrderId.eq(order_id));
    }
    if let Some(event_id) = &page.event_id {
        query = query.filter(Column::EventId.eq(event_id.as_str()));
    }
    query.order_by_desc(Column::Id).limit(page.limit).all(db).await
}
