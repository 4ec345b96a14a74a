//! AdminService.AwaitPublished: a bounded wait until one event is published or FAILED, for
//! users' integration tests. Read with the timeline's permission rules: another tenant's event
//! reads exactly like an unknown one.

use idempost_proto::v1 as pb;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QuerySelect};

use idempost::domain::{InvalidInput, OutboxStatus};
use idempost::edge::{CallError, LongPoll, parse_event_id};
use idempost::entity::{order_version, orders, outbox_event};
use idempost::security::Caller;

/// Waits as `ask` says (within `waits`' bounds) for the event to be published or FAILED.
pub(crate) async fn await_published(
    db: &DatabaseConnection,
    waits: &LongPoll,
    ask: pb::AwaitPublishedRequest,
    caller: &Caller,
) -> Result<pb::AwaitPublishedResponse, CallError> {
    let mut violations = Vec::new();
    let event_id = parse_event_id(&ask.event_id).map_err(|e| violations.extend(e.violations)).ok();
    let wait = waits.wait_for("wait", ask.wait, &mut violations);
    InvalidInput::check(violations)?;
    let event_id = event_id.unwrap_or_default();
    let read = || async { seen(db, &event_id, caller).await };
    let polled = waits.poll(wait, read, |seen: &Seen| seen.state() != pb::PublishState::Waiting).await?;
    let seen = polled.state;
    Ok(pb::AwaitPublishedResponse {
        state: seen.state().into(),
        known: seen.known,
        outbox_status: seen.outbox_status.unwrap_or_default(),
        retry_after: polled.retry_after.and_then(|after| prost_types::Duration::try_from(after).ok()),
    })
}

/// The event as `caller` may see it.
#[derive(Debug, Default)]
struct Seen {
    /// Its order committed and the caller may read its tenant's events.
    known: bool,
    /// Its outbox row's status; `None` once retention purged the row (or for an unknown event).
    outbox_status: Option<String>,
}

impl Seen {
    fn state(&self) -> pb::PublishState {
        match (self.known, self.outbox_status.as_deref().and_then(OutboxStatus::from_stored)) {
            (false, _) => pb::PublishState::Waiting,
            (true, Some(OutboxStatus::Published)) => pb::PublishState::Published,
            (true, Some(OutboxStatus::Failed)) => pb::PublishState::Failed,
            (true, Some(_)) => pb::PublishState::Waiting,
            // Retention deletes PUBLISHED rows only: a known event without its row was published.
            (true, None) => pb::PublishState::Published,
        }
    }
}

/// One read of the event: its tenant (from its `order_version` row, or its order's for an order
/// accepted before those rows existed) and its outbox row's status.
async fn seen(db: &DatabaseConnection, event_id: &str, caller: &Caller) -> Result<Seen, DbErr> {
    let tenant = match order_version::Entity::find()
        .select_only()
        .column(order_version::Column::TenantId)
        .filter(order_version::Column::EventId.eq(event_id))
        .into_tuple::<i64>()
        .one(db)
        .await?
    {
        Some(tenant) => Some(tenant),
        None => {
            orders::Entity::find()
                .select_only()
                .column(orders::Column::TenantId)
                .filter(orders::Column::AcceptanceEventId.eq(event_id))
                .into_tuple::<i64>()
                .one(db)
                .await?
        }
    };
    // Another tenant's event is answered exactly like an unknown one: its row is not even read.
    if !tenant.is_some_and(|tenant| caller.may_read(tenant)) {
        return Ok(Seen::default());
    }
    let outbox_status = outbox_event::Entity::find_by_id(event_id.to_owned())
        .select_only()
        .column(outbox_event::Column::Status)
        .into_tuple::<String>()
        .one(db)
        .await?;
    Ok(Seen { known: true, outbox_status })
}
