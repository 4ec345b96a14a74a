//! ListAudit, which both admin services serve from their own database: the request checked, a
//! page of `admin_audit` read, the rows as the contract carries them.

use idempost_proto::v1 as pb;
use sea_orm::ConnectionTrait;

use super::{CallError, parse_event_id, timestamp};
use crate::audit::{self, Action, Page};
use crate::domain::{FieldViolation, InvalidInput};
use crate::entity::admin_audit;

/// A page of the audit for `ask`; the caller's scope is the service's to check first.
pub async fn list_audit(
    db: &impl ConnectionTrait,
    ask: pb::ListAuditRequest,
) -> Result<pb::ListAuditResponse, CallError> {
    let page = parse_list_audit(&ask)?;
    let rows = audit::page(db, &page).await?;
    let full = rows.len() as u64 == page.limit;
    let next_before_id = if full { rows.last().map_or(0, |row| row.id) } else { 0 };
    let records = rows.into_iter().map(Into::into).collect();
    Ok(pb::ListAuditResponse { records, next_before_id, next_page_token: String::new() })
}

/// The rows `ask` selects, checked; `page_token` is left to the service that reads several
/// databases (the order service over its shards), which alone hands one out.
pub fn parse_list_audit(ask: &pb::ListAuditRequest) -> Result<Page, InvalidInput> {
    let mut violations = Vec::new();
    let limit = super::limit(ask.limit, &mut violations);
    let before_id = match ask.before_id {
        0 => None,
        id if id > 0 => Some(id),
        _ => {
            violations.push(FieldViolation::new("before_id", "must be positive, or 0 for the newest"));
            None
        }
    };
    let action = match ask.action.as_str() {
        "" => None,
        text => Action::from_stored(&text.to_ascii_uppercase()).or_else(|| {
            let known: Vec<_> = Action::ALL.iter().map(|a| a.as_str()).collect();
            violations.push(FieldViolation::new("action", format!("must be one of {}", known.join(", "))));
            None
        }),
    };
    let order_id = match ask.order_id {
        0 => None,
        id if id > 0 => Some(id),
        _ => {
            violations.push(FieldViolation::new("order_id", "must be positive, or 0 for any"));
            None
        }
    };
    let event_id = match ask.event_id.as_str() {
        "" => None,
        text => parse_event_id(text).map_err(|e| violations.extend(e.violations)).ok(),
    };
    InvalidInput::check(violations)?;
    Ok(Page { before_id, action, order_id, event_id, limit: u64::from(limit) })
}

impl From<admin_audit::Model> for pb::AuditRecord {
    fn from(row: admin_audit::Model) -> Self {
        Self {
            id: row.id,
            recorded_at: Some(timestamp(row.recorded_at)),
            actor: row.actor,
            action: row.action,
            event_id: row.event_id.unwrap_or_default(),
            order_id: row.order_id.unwrap_or_default(),
            consumer_name: row.consumer_name.unwrap_or_default(),
            reason: row.reason,
            trace_id: row.trace_id.unwrap_or_default(),
            outcome: row.outcome,
        }
    }
}
