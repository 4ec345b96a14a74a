//! ConsumerAdminService.AwaitConsumed: a bounded wait until a named consumer has consumed,
//! dead-lettered or parked one event, for users' integration tests.

use idempost_proto::v1 as pb;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use idempost::domain::InvalidInput;
use idempost::edge::{CallError, LongPoll, parse_event_id};
use idempost::entity::{consumed_event, dead_letter, parked_event};

/// Waits as `ask` says (within `waits`' bounds) for `ask.consumer_name` (or `own_name` when it
/// is empty) to be done with the event, one way or another.
pub(super) async fn await_consumed(
    db: &DatabaseConnection,
    waits: &LongPoll,
    own_name: &str,
    ask: pb::AwaitConsumedRequest,
) -> Result<pb::AwaitConsumedResponse, CallError> {
    let mut violations = Vec::new();
    let event_id = parse_event_id(&ask.event_id).map_err(|e| violations.extend(e.violations)).ok();
    let wait = waits.wait_for("wait", ask.wait, &mut violations);
    InvalidInput::check(violations)?;
    let event_id = event_id.unwrap_or_default();
    let consumer = if ask.consumer_name.is_empty() { own_name } else { ask.consumer_name.as_str() };
    let read = || async { seen(db, consumer, &event_id).await };
    let polled = waits.poll(wait, read, |(state, _): &Seen| *state != pb::ConsumeState::Waiting).await?;
    let (state, detail) = polled.state;
    Ok(pb::AwaitConsumedResponse {
        state: state.into(),
        consumer_name: consumer.to_owned(),
        detail,
        retry_after: polled.retry_after.and_then(|after| prost_types::Duration::try_from(after).ok()),
    })
}

/// Where the event is for the consumer, and why when it was set aside.
type Seen = (pb::ConsumeState, String);

/// One read of the consumer's records of the event. A parked event has its dedup row too, so
/// parking is looked for first; a dead letter counts only while no later delivery consumed it.
async fn seen(db: &DatabaseConnection, consumer: &str, event_id: &str) -> Result<Seen, DbErr> {
    let parked = parked_event::Entity::find()
        .select_only()
        .column(parked_event::Column::Reason)
        .filter(parked_event::Column::ConsumerName.eq(consumer))
        .filter(parked_event::Column::EventId.eq(event_id))
        .into_tuple::<String>()
        .one(db)
        .await?;
    if let Some(reason) = parked {
        return Ok((pb::ConsumeState::Parked, reason));
    }
    let consumed = consumed_event::Entity::find()
        .select_only()
        .column(consumed_event::Column::Id)
        .filter(consumed_event::Column::ConsumerName.eq(consumer))
        .filter(consumed_event::Column::EventId.eq(event_id))
        .into_tuple::<i64>()
        .one(db)
        .await?;
    if consumed.is_some() {
        return Ok((pb::ConsumeState::Consumed, String::new()));
    }
    let dead = dead_letter::Entity::find()
        .select_only()
        .column(dead_letter::Column::Error)
        .filter(dead_letter::Column::ConsumerName.eq(consumer))
        .filter(dead_letter::Column::EventId.eq(event_id))
        .order_by_asc(dead_letter::Column::Id)
        .into_tuple::<String>()
        .one(db)
        .await?;
    Ok(match dead {
        Some(error) => (pb::ConsumeState::DeadLettered, error),
        None => (pb::ConsumeState::Waiting, String::new()),
    })
}
