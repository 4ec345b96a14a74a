//! Replay: PUBLISHED outbox rows back to PENDING, so the relays publish them again, audited in
//! `admin_audit` (a REPLAY row). The sibling of the redrive (FAILED back to PENDING): the relay's claim does
//! the rest, with the same event ids and one order's versions in order, because a version is
//! claimed only once every earlier version of its order is PUBLISHED.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect, TransactionTrait, Value,
};

use super::audit::audit_of;
use idempost::audit::{self, Action, Entry};
use idempost::backlog::{self, RedriveAudit};
use idempost::contract::{AGGREGATE_TYPE, EVENT_TYPE, ORDER_AMENDED_EVENT_TYPE, ORDER_CANCELLED_EVENT_TYPE};
use idempost::db;
use idempost::domain::{FieldViolation, InvalidInput, Operation, OutboxStatus};
use idempost::edge::timestamp;
use idempost::entity::{order_version, outbox_event};
use idempost::security::Caller;
use idempost::telemetry::logged;
use idempost_proto::v1 as pb;

/// The most events one replay returns to PENDING: one transaction, one `IN` list, one audit
/// row of a size an operator can check. A filter matching more is refused, not cut.
pub(crate) const MAX_EVENTS: u64 = 1000;
/// Events listed in an answer when the request does not say.
const DEFAULT_LISTED: u32 = 20;

/// Which events to replay: every given part must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Filter {
    order_id: Option<i64>,
    created_from: Option<DateTime<Utc>>,
    created_to: Option<DateTime<Utc>>,
    event_type: Option<&'static str>,
}

/// A validated replay request.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    filter: Filter,
    dry_run: bool,
    listed: usize,
    audit: RedriveAudit,
}

/// What a replay did, or in a dry run would do.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    replayed: u64,
    events: Vec<outbox_event::Model>,
    not_published: u64,
    purged: u64,
    dry_run: bool,
    audit_id: Option<i64>,
    at: DateTime<Utc>,
}

/// A replay's answer: done, or refused as larger than [`MAX_EVENTS`].
#[derive(Debug)]
pub(crate) enum Replayed {
    Done(Report),
    TooLarge,
}

impl Ask {
    /// The request checked field by field, with who asks and why recorded as for a redrive.
    pub(crate) fn parse(ask: pb::ReplayRequest, caller: &Caller) -> Result<Self, InvalidInput> {
        let mut violations = Vec::new();
        let order_id = match ask.order_id {
            0 => None,
            id if id > 0 => Some(id),
            _ => {
                violations.push(FieldViolation::new("order_id", "must be greater than zero, or 0 for any"));
                None
            }
        };
        let created_from = instant("created_from", ask.created_from, &mut violations);
        let created_to = instant("created_to", ask.created_to, &mut violations);
        if order_id.is_none() && ask.created_from.is_none() {
            violations.push(FieldViolation::new(
                "created_from",
                "is required without an order_id: a replay of the whole history is never meant",
            ));
        }
        if let (Some(from), Some(to)) = (created_from, created_to)
            && from >= to
        {
            violations.push(FieldViolation::new("created_to", "must be after created_from"));
        }
        let event_type = parse_event_type(&ask.event_type, &mut violations);
        let listed = match ask.list_limit {
            0 => DEFAULT_LISTED,
            n if u64::from(n) <= MAX_EVENTS => n,
            _ => {
                violations.push(FieldViolation::new("list_limit", format!("must be at most {MAX_EVENTS}")));
                DEFAULT_LISTED
            }
        };
        if ask.reason.trim().is_empty() {
            violations.push(FieldViolation::new("reason", "is required: a replay is audited"));
        }
        if caller.subject.is_none() && ask.requested_by.trim().is_empty() {
            violations.push(FieldViolation::new("requested_by", "is required without a token"));
        }
        InvalidInput::check(violations)?;
        let audit = audit_of(caller, ask.requested_by, ask.reason);
        Ok(Self {
            filter: Filter { order_id, created_from, created_to, event_type },
            dry_run: ask.dry_run,
            listed: usize::try_from(listed).unwrap_or(usize::MAX),
            audit,
        })
    }
}

fn instant(
    field: &str,
    value: Option<prost_types::Timestamp>,
    violations: &mut Vec<FieldViolation>,
) -> Option<DateTime<Utc>> {
    let value = value?;
    let at = u32::try_from(value.nanos).ok().and_then(|nanos| DateTime::from_timestamp(value.seconds, nanos));
    if at.is_none() {
        violations.push(FieldViolation::new(field, "is not a valid timestamp"));
    }
    at
}

fn parse_event_type(text: &str, violations: &mut Vec<FieldViolation>) -> Option<&'static str> {
    if text.is_empty() {
        return None;
    }
    let known = [EVENT_TYPE, ORDER_AMENDED_EVENT_TYPE, ORDER_CANCELLED_EVENT_TYPE];
    let found = known.into_iter().find(|t| *t == text);
    if found.is_none() {
        violations.push(FieldViolation::new("event_type", format!("must be one of {}", known.join(", "))));
    }
    found
}

/// The operation whose `order_version` rows commit events of `event_type`.
fn operation_of(event_type: &str) -> Operation {
    match event_type {
        ORDER_AMENDED_EVENT_TYPE => Operation::Amend,
        ORDER_CANCELLED_EVENT_TYPE => Operation::Cancel,
        _ => Operation::Submit,
    }
}

impl Filter {
    /// The filter on outbox rows.
    fn outbox(&self) -> Condition {
        use outbox_event::Column;
        let mut condition = Condition::all();
        if let Some(order_id) = self.order_id {
            condition = condition
                .add(Column::AggregateType.eq(AGGREGATE_TYPE))
                .add(Column::AggregateId.eq(order_id.to_string()));
        }
        if let Some(from) = self.created_from {
            condition = condition.add(Column::CreatedAt.gte(from));
        }
        if let Some(to) = self.created_to {
            condition = condition.add(Column::CreatedAt.lt(to));
        }
        if let Some(event_type) = self.event_type {
            condition = condition.add(Column::EventType.eq(event_type));
        }
        condition
    }

    /// The filter on `order_version` rows whose outbox row is gone: retention deleted it after
    /// publication. The commit time stands in for the row's creation time (one transaction).
    fn purged(&self) -> Condition {
        use order_version::Column;
        let mut condition = Condition::all();
        if let Some(order_id) = self.order_id {
            condition = condition.add(Column::OrderId.eq(order_id));
        }
        if let Some(from) = self.created_from {
            condition = condition.add(Column::CommittedAt.gte(from));
        }
        if let Some(to) = self.created_to {
            condition = condition.add(Column::CommittedAt.lt(to));
        }
        if let Some(event_type) = self.event_type {
            condition = condition.add(Column::Operation.eq(operation_of(event_type).as_str()));
        }
        let outbox_row = Query::select()
            .expr(Expr::val(1))
            .from(outbox_event::Entity)
            .and_where(
                Expr::col((outbox_event::Entity, outbox_event::Column::EventId))
                    .equals((order_version::Entity, Column::EventId)),
            )
            .to_owned();
        condition.add(Expr::exists(outbox_row).not())
    }
}

/// Replays what `ask` matches, in one transaction: finds the PUBLISHED rows (refusing more than
/// [`MAX_EVENTS`]), counts those not published yet and those retention purged, and unless it is
/// a dry run returns the PUBLISHED ones to PENDING and writes the audit row.
pub(crate) async fn replay(db: &DatabaseConnection, ask: &Ask) -> Result<Replayed, DbErr> {
    let txn = db.begin().await?;
    let at = db::now(&txn).await?;
    let published = published(&txn, &ask.filter).await?;
    if published.len() as u64 > MAX_EVENTS {
        txn.rollback().await?;
        return Ok(Replayed::TooLarge);
    }
    let not_published = outbox_event::Entity::find()
        .filter(outbox_event::Column::Status.is_in(backlog::NEEDS_ATTENTION.map(OutboxStatus::as_str)))
        .filter(ask.filter.outbox())
        .count(&txn)
        .await?;
    // Bounded like the replay: past the bound the count says "more than MAX_EVENTS". A range
    // without an order reads `order_version` by commit time, which no index orders: a scan of
    // the orders' history, acceptable for an operator's rare call, not for a hot path.
    let purged = order_version::Entity::find()
        .select_only()
        .column(order_version::Column::EventId)
        .filter(ask.filter.purged())
        .limit(MAX_EVENTS + 1)
        .into_tuple::<String>()
        .all(&txn)
        .await?
        .len() as u64;
    let mut report = Report {
        replayed: published.len() as u64,
        events: published,
        not_published,
        purged,
        dry_run: ask.dry_run,
        audit_id: None,
        at,
    };
    if ask.dry_run {
        txn.rollback().await?;
    } else {
        report.replayed = to_pending(&txn, &report.events).await?;
        report.audit_id = Some(record(&txn, ask, &report).await?);
        txn.commit().await?;
    }
    report.events.truncate(ask.listed);
    Ok(Replayed::Done(report))
}

/// The oldest `MAX_EVENTS + 1` PUBLISHED rows the filter matches. A range of creation times is
/// read on `idx_outbox_ready` (status, held_back, created_at), once per value of `held_back` as
/// the backlog does, so that the read follows the range and not the whole PUBLISHED history.
async fn published(txn: &impl ConnectionTrait, filter: &Filter) -> Result<Vec<outbox_event::Model>, DbErr> {
    use outbox_event::Column;
    let mut rows = Vec::new();
    for held_back in backlog::HELD_BACK {
        rows.extend(
            outbox_event::Entity::find()
                .filter(Column::Status.eq(OutboxStatus::Published.as_str()))
                .filter(Column::HeldBack.eq(held_back))
                .filter(filter.outbox())
                .order_by_asc(Column::CreatedAt)
                .order_by_asc(Column::EventId)
                .limit(MAX_EVENTS + 1)
                .all(txn)
                .await?,
        );
    }
    rows.sort_by(|a, b| (a.created_at, &a.event_id).cmp(&(b.created_at, &b.event_id)));
    rows.truncate(usize::try_from(MAX_EVENTS + 1).unwrap_or(usize::MAX));
    Ok(rows)
}

/// Returns the rows to PENDING as a relay would find a new event: no lease, no attempts, not held
/// back (the claim's check of earlier versions decides). Only rows still PUBLISHED change, so
/// no relay's lease is touched; the first publication's coordinates stay until the next mark.
async fn to_pending(txn: &impl ConnectionTrait, rows: &[outbox_event::Model]) -> Result<u64, DbErr> {
    use outbox_event::Column;
    if rows.is_empty() {
        return Ok(0);
    }
    let result = outbox_event::Entity::update_many()
        .col_expr(Column::Status, Expr::value(OutboxStatus::Pending.as_str()))
        .col_expr(Column::Attempts, Expr::value(0))
        .col_expr(Column::LeaseOwner, Expr::value(Value::String(None)))
        .col_expr(Column::LeaseUntil, Expr::value(Option::<DateTime<Utc>>::None))
        .col_expr(Column::HeldBack, Expr::value(false))
        .filter(Column::EventId.is_in(rows.iter().map(|row| row.event_id.clone())))
        .filter(Column::Status.eq(OutboxStatus::Published.as_str()))
        .exec(txn)
        .await?;
    Ok(result.rows_affected)
}

/// The audit row: who, when, why, the filter, how many.
async fn record(txn: &impl ConnectionTrait, ask: &Ask, report: &Report) -> Result<i64, DbErr> {
    let filter = &ask.filter;
    let at = |t: Option<DateTime<Utc>>| t.map_or_else(|| "-".to_owned(), |t| t.to_rfc3339());
    let outcome = format!(
        "replayed {}, not published {}, purged {}; filter: created {}..{}, event type {}",
        report.replayed,
        report.not_published,
        report.purged,
        at(filter.created_from),
        at(filter.created_to),
        filter.event_type.unwrap_or("any"),
    );
    let mut entry = Entry::new(Action::Replay, &ask.audit.requested_by, &ask.audit.reason, outcome);
    entry.order_id = filter.order_id;
    let id = audit::record(txn, entry).await?;
    tracing::info!(
        audit_id = id,
        requested_by = %logged(&ask.audit.requested_by),
        reason = %logged(&ask.audit.reason),
        replayed = report.replayed,
        "replayed: PUBLISHED -> PENDING"
    );
    Ok(id)
}

impl From<Report> for pb::ReplayResponse {
    fn from(report: Report) -> Self {
        Self {
            replayed: report.replayed,
            events: report.events.into_iter().map(listed).collect(),
            not_published: report.not_published,
            purged: report.purged,
            dry_run: report.dry_run,
            audit_id: report.audit_id.unwrap_or(0),
            replayed_at: Some(timestamp(report.at)),
        }
    }
}

/// One replayed row as the answer lists it.
fn listed(row: outbox_event::Model) -> pb::ReplayedEvent {
    pb::ReplayedEvent {
        order_id: row.aggregate_id.parse().unwrap_or(0),
        version: row.event_version,
        event_type: row.event_type,
        created_at: Some(timestamp(row.created_at)),
        event_id: row.event_id,
    }
}
