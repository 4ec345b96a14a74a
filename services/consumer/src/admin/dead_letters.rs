//! The dead-letter listing a page at a time: records in id order, read without their payloads
//! (a record's value as the broker delivered it, up to the broker's record size), a page going on
//! after the last id of the one before, payloads read in small batches only when asked for, and
//! no more records than the answer's byte budget takes.

use std::collections::HashMap;

use idempost_proto::v1 as pb;
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, DerivePartialModel, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};

use idempost::domain::{FieldViolation, InvalidInput};
use idempost::edge::{self, ByteBudget, PAYLOAD_BATCH};
use idempost::entity::dead_letter::{self, Column};

/// What one page asks for.
#[derive(Debug, Clone)]
pub(super) struct Ask {
    consumer_name: String,
    limit: u64,
    payloads: bool,
    /// The last id of the page before.
    after: Option<i64>,
}

impl TryFrom<pb::ListDeadLettersRequest> for Ask {
    type Error = InvalidInput;

    fn try_from(ask: pb::ListDeadLettersRequest) -> Result<Self, InvalidInput> {
        let mut violations = Vec::new();
        let limit = edge::limit(ask.limit, &mut violations);
        let after = match ask.page_token.as_str() {
            "" => None,
            token => token
                .parse::<i64>()
                .map_err(|_| {
                    violations.push(FieldViolation::new(
                        "page_token",
                        "is not a next_page_token of ListDeadLetters",
                    ));
                })
                .ok(),
        };
        InvalidInput::check(violations)?;
        Ok(Self {
            consumer_name: ask.consumer_name,
            limit: u64::from(limit),
            payloads: ask.include_payloads,
            after,
        })
    }
}

/// A dead letter without its payload.
#[derive(Debug, Clone, DerivePartialModel)]
#[sea_orm(entity = "dead_letter::Entity")]
struct Listed {
    id: i64,
    consumer_name: String,
    topic: String,
    partition_id: i32,
    offset_id: i64,
    record_key: Option<Vec<u8>>,
    event_id: Option<String>,
    error: String,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl From<Listed> for dead_letter::Model {
    fn from(d: Listed) -> Self {
        Self {
            id: d.id,
            consumer_name: d.consumer_name,
            topic: d.topic,
            partition_id: d.partition_id,
            offset_id: d.offset_id,
            record_key: d.record_key,
            payload: Vec::new(),
            event_id: d.event_id,
            error: d.error,
            created_at: d.created_at,
        }
    }
}

/// One page: up to `ask.limit` records after `ask.after`, oldest first, until the byte budget
/// would be passed; the next page's token when records follow.
pub(super) async fn page(db: &DatabaseConnection, ask: Ask) -> Result<pb::ListDeadLettersResponse, DbErr> {
    let mut query = dead_letter::Entity::find();
    if !ask.consumer_name.is_empty() {
        query = query.filter(Column::ConsumerName.eq(ask.consumer_name));
    }
    if let Some(after) = ask.after {
        query = query.filter(Column::Id.gt(after));
    }
    let listed =
        query.order_by_asc(Column::Id).limit(ask.limit + 1).into_partial_model::<Listed>().all(db).await?;
    let mut more = listed.len() as u64 > ask.limit;
    let (mut budget, mut last, mut dead_letters) = (ByteBudget::listing(), None, Vec::new());
    let mut listed = listed.into_iter().take(usize::try_from(ask.limit).unwrap_or(usize::MAX)).peekable();
    'batches: while listed.peek().is_some() {
        let mut batch: Vec<dead_letter::Model> =
            listed.by_ref().take(PAYLOAD_BATCH).map(Into::into).collect();
        if ask.payloads {
            let mut payloads = payloads(db, &batch).await?;
            for row in &mut batch {
                row.payload = payloads.remove(&row.id).unwrap_or_default();
            }
        }
        for row in batch {
            let id = row.id;
            let record = pb::DeadLetterRecord::from(row);
            if !budget.take(&record) {
                more = true;
                break 'batches;
            }
            dead_letters.push(record);
            last = Some(id);
        }
    }
    let next_page_token =
        if more { last.map(|id| id.to_string()).unwrap_or_default() } else { String::new() };
    Ok(pb::ListDeadLettersResponse { dead_letters, next_page_token })
}

/// The payloads of `rows`, by id: one query of at most [`PAYLOAD_BATCH`] ids.
async fn payloads(
    db: &DatabaseConnection,
    rows: &[dead_letter::Model],
) -> Result<HashMap<i64, Vec<u8>>, DbErr> {
    let found: Vec<(i64, Vec<u8>)> = dead_letter::Entity::find()
        .select_only()
        .column(Column::Id)
        .column(Column::Payload)
        .filter(Column::Id.is_in(rows.iter().map(|row| row.id)))
        .into_tuple()
        .all(db)
        .await?;
    Ok(found.into_iter().collect())
}
