//! ListAudit over the shards it reads: one database's audit as every service lists it, or,
//! with a shard map and neither an order nor an event to narrow it, every shard's audit merged
//! into one listing, newest first.
//!
//! Each shard numbers its `admin_audit` rows itself, so no one id orders them all, and
//! `before_id` (an id of one database) cannot say where a merged page ends. The merge takes,
//! again and again, the newest of the shards' next rows by `recorded_at` (ties to the shard
//! first in the map), each shard's own rows in their id order; its page token
//! ([`token::Cursor`]) keeps one position per shard. Taking the next page from those positions
//! is the same merge carried on, so pages never repeat or skip a row, as `before_id` never did
//! on one database; and, as there, rows written after the first page are not listed by its
//! later pages (a shard's position is set at the first page that reads it).

mod token;

use idempost::audit;
use idempost::domain::{FieldViolation, InvalidInput};
use idempost::edge::{CallError, parse_list_audit};
use idempost::entity::admin_audit;
use idempost_proto::v1 as pb;
use sea_orm::DatabaseConnection;

use token::Cursor;

/// One shard the listing reads: its number in the map (its key in the page token) and its
/// database.
pub(super) type AuditShard = (u32, DatabaseConnection);

/// A page of the audit of `shards` (at least one) for `ask`; the caller's scope is checked.
pub(super) async fn list(
    shards: Vec<AuditShard>,
    ask: pb::ListAuditRequest,
) -> Result<pb::ListAuditResponse, CallError> {
    let mut page = parse_list_audit(&ask)?;
    let merged = shards.len() > 1;
    let cursor = starting_cursor(&ask, merged)?;
    let mut heads = Vec::with_capacity(shards.len());
    for (number, db) in &shards {
        let before = cursor.before(*number);
        // A position of 1 is a shard read to its end: no row has an id below 1.
        let rows = match before {
            Some(1) => Vec::new(),
            _ => {
                page.before_id = before;
                audit::page(db, &page).await?
            }
        };
        heads.push(Head { number: *number, rows, taken: 0 });
    }
    let records = merge(&mut heads, page.limit);
    let full = records.len() as u64 == page.limit;
    let last = records.last().map_or(0, |row| row.id);
    let next = Cursor::after(heads.iter().map(Head::position), merged);
    Ok(pb::ListAuditResponse {
        // One database: the next page's `before_id`, as always; merged: only "there is more".
        next_before_id: if full { last } else { 0 },
        next_page_token: if full { next.to_string() } else { String::new() },
        records: records.into_iter().map(Into::into).collect(),
    })
}

/// Where this page starts: the token, or `before_id` on one database, or the newest.
fn starting_cursor(ask: &pb::ListAuditRequest, merged: bool) -> Result<Cursor, InvalidInput> {
    let violation =
        |field: &str, why: &str| InvalidInput { violations: vec![FieldViolation::new(field, why)] };
    match (ask.page_token.as_str(), ask.before_id) {
        ("", 0) => Ok(Cursor::Newest),
        ("", _) if merged => Err(violation(
            "before_id",
            "is an id of one database, and this listing merges every shard's: continue with page_token",
        )),
        ("", id) => Ok(Cursor::One(id)),
        (_, 0) => Cursor::parse(&ask.page_token, merged)
            .ok_or_else(|| violation("page_token", "is not a token this listing handed out (a listing's filters stay the same; start again without one)")),
        _ => Err(violation("page_token", "is not given with before_id: the token says where to go on")),
    }
}

/// One shard's rows for this page, newest first, and how many of them the page took.
struct Head {
    number: u32,
    rows: Vec<admin_audit::Model>,
    taken: usize,
}

impl Head {
    fn next(&self) -> Option<&admin_audit::Model> {
        self.rows.get(self.taken)
    }

    /// Where this shard's next page starts: below its last row taken; at its first row read
    /// when none was taken (so that rows written since are not listed); at its end (1) when it
    /// had none left.
    fn position(&self) -> (u32, i64) {
        let at = match (self.taken, self.rows.first()) {
            (0, Some(first)) => first.id + 1,
            (0, None) => 1,
            (n, _) => self.rows[n - 1].id,
        };
        (self.number, at)
    }
}

/// Up to `limit` rows of `heads`, newest first: each time the next row of the shard whose next
/// row was recorded last, the first shard in the map's order on a tie.
fn merge(heads: &mut [Head], limit: u64) -> Vec<admin_audit::Model> {
    let mut records = Vec::new();
    while (records.len() as u64) < limit {
        let mut newest: Option<usize> = None;
        for (i, head) in heads.iter().enumerate() {
            let Some(row) = head.next() else { continue };
            if newest.and_then(|n| heads[n].next()).is_none_or(|best| row.recorded_at > best.recorded_at) {
                newest = Some(i);
            }
        }
        let Some(i) = newest else { break };
        records.push(heads[i].rows[heads[i].taken].clone());
        heads[i].taken += 1;
    }
    records
}
