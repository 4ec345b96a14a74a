//! The parked-event listing a page at a time: one consumer name's parked events by order,
//! version and event id, read without their payloads (a parked event keeps its record's value to
//! apply it later), each with the version its order's read model is at, a page going on after
//! the last event of the one before, and no more events than the answer's byte budget takes.

use std::collections::HashMap;

use idempost_proto::v1 as pb;
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, DerivePartialModel, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect,
};

use idempost::domain::{FieldViolation, InvalidInput};
use idempost::edge::{self, ByteBudget, timestamp};
use idempost::entity::order_view;
use idempost::entity::parked_event::{self, Column};

/// Where a page goes on from: the last event of the page before, in the listing's order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    order_id: i64,
    version: i64,
    event_id: String,
}

impl Cursor {
    /// The token a caller passes back: order id, version and event id. Opaque to callers.
    fn token(&self) -> String {
        format!("{}/{}/{}", self.order_id, self.version, self.event_id)
    }

    /// A `page_token`: empty is the first page.
    fn parse(token: &str) -> Result<Option<Self>, FieldViolation> {
        if token.is_empty() {
            return Ok(None);
        }
        let invalid = || FieldViolation::new("page_token", "is not a next_page_token of ListParkedEvents");
        let mut parts = token.splitn(3, '/');
        let (Some(order_id), Some(version), Some(event_id)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid());
        };
        Ok(Some(Self {
            order_id: order_id.parse().map_err(|_| invalid())?,
            version: version.parse().map_err(|_| invalid())?,
            event_id: edge::parse_event_id(event_id).map_err(|_| invalid())?,
        }))
    }
}

/// What one page asks for.
#[derive(Debug, Clone)]
pub(super) struct Ask {
    /// 0 for every order.
    order_id: i64,
    limit: u64,
    after: Option<Cursor>,
}

impl TryFrom<pb::ListParkedEventsRequest> for Ask {
    type Error = InvalidInput;

    fn try_from(ask: pb::ListParkedEventsRequest) -> Result<Self, InvalidInput> {
        let mut violations = Vec::new();
        let limit = edge::limit(ask.limit, &mut violations);
        let after = Cursor::parse(&ask.page_token).map_err(|v| violations.push(v)).ok().flatten();
        InvalidInput::check(violations)?;
        Ok(Self { order_id: ask.order_id, limit: u64::from(limit), after })
    }
}

/// A parked event without its payload.
#[derive(Debug, Clone, DerivePartialModel)]
#[sea_orm(entity = "parked_event::Entity")]
struct Listed {
    consumer_name: String,
    event_id: String,
    order_id: i64,
    version: i64,
    event_type: String,
    reason: String,
    parked_at: chrono::DateTime<chrono::Utc>,
}

/// One page of `consumer`'s parked events (of `ask.order_id`, or of every order for 0), by order
/// and version, each with the version its order's read model is at; the next page's token when
/// events follow.
pub(super) async fn page(
    db: &DatabaseConnection,
    consumer: &str,
    ask: Ask,
) -> Result<pb::ListParkedEventsResponse, DbErr> {
    let mut query = parked_event::Entity::find().filter(Column::ConsumerName.eq(consumer));
    if ask.order_id != 0 {
        query = query.filter(Column::OrderId.eq(ask.order_id));
    }
    if let Some(after) = &ask.after {
        let same_version =
            Condition::all().add(Column::Version.eq(after.version)).add(Column::EventId.gt(&after.event_id));
        let later_in_order = Condition::all()
            .add(Column::OrderId.eq(after.order_id))
            .add(Condition::any().add(Column::Version.gt(after.version)).add(same_version));
        query = query
            .filter(Column::OrderId.gte(after.order_id))
            .filter(Condition::any().add(Column::OrderId.gt(after.order_id)).add(later_in_order));
    }
    let listed = query
        .order_by_asc(Column::OrderId)
        .order_by_asc(Column::Version)
        .order_by_asc(Column::EventId)
        .limit(ask.limit + 1)
        .into_partial_model::<Listed>()
        .all(db)
        .await?;
    let mut more = listed.len() as u64 > ask.limit;
    let listed = &listed[..listed.len().min(usize::try_from(ask.limit).unwrap_or(usize::MAX))];
    let orders: Vec<i64> = listed.iter().map(|row| row.order_id).collect();
    let versions: HashMap<i64, i64> = order_view::Entity::find()
        .filter(order_view::Column::ConsumerName.eq(consumer))
        .filter(order_view::Column::OrderId.is_in(orders))
        .all(db)
        .await?
        .into_iter()
        .map(|view| (view.order_id, view.version))
        .collect();
    let (mut budget, mut last, mut parked_events) = (ByteBudget::listing(), None, Vec::new());
    for row in listed {
        let record = pb::ParkedEventRecord {
            read_model_version: versions.get(&row.order_id).copied().unwrap_or(0),
            consumer_name: row.consumer_name.clone(),
            event_id: row.event_id.clone(),
            order_id: row.order_id,
            event_version: row.version,
            event_type: row.event_type.clone(),
            reason: row.reason.clone(),
            parked_at: Some(timestamp(row.parked_at)),
        };
        if !budget.take(&record) {
            more = true;
            break;
        }
        parked_events.push(record);
        last = Some(Cursor { order_id: row.order_id, version: row.version, event_id: row.event_id.clone() });
    }
    let next_page_token = if more { last.map(|c| c.token()).unwrap_or_default() } else { String::new() };
    Ok(pb::ListParkedEventsResponse { parked_events, next_page_token })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_reads_back_as_the_cursor_it_was_made_from() {
        let cursor =
            Cursor { order_id: 42, version: 7, event_id: "0190f0e4-58a6-7c3e-9d6e-1f2a3b4c5d6e".to_owned() };
        assert_eq!(Cursor::parse(&cursor.token()).unwrap(), Some(cursor));
        assert_eq!(Cursor::parse("").unwrap(), None);
        assert!(Cursor::parse("42/7").is_err());
        assert!(Cursor::parse("42/x/0190f0e4-58a6-7c3e-9d6e-1f2a3b4c5d6e").is_err());
    }
}
