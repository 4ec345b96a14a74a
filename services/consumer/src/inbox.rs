//! The consumer's side of the database: dedup row and local effect in one transaction.

use chrono::{DateTime, SubsecRound, Utc};
use sea_orm::{
    ActiveValue::NotSet, ActiveValue::Set, DatabaseConnection, DatabaseTransaction, EntityTrait,
    TransactionTrait,
};

use super::decode::OrderEvent;
use idempost::db::{TxFailure, UniqueKey, violated_unique_key};
use idempost::entity::{consumed_event, dead_letter, notification_job};
use idempost::failpoint;
use model::Outcome;

pub(crate) mod model;

/// What handling an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// The dedup row, the notification job and the read model's change committed together (an
    /// event at or below the model's version changes nothing in it: a duplicate, absorbed).
    Committed,
    /// The dedup row and the notification job committed with the event parked: its version skips
    /// ahead of the read model, or its type is unknown here. It is applied when the gap fills
    /// or an operator releases it.
    Parked,
    /// `uq_consumed_event_identity` already held this (consumer, event): nothing was written.
    AlreadyConsumed,
}

/// What storing an undecodable record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadLettered {
    /// The record is now in `dead_letter`.
    Stored,
    /// `uq_dead_letter_coordinates` already held this (consumer, topic, partition, offset): a
    /// redelivery of a record set aside before; nothing was written.
    AlreadyStored,
}

/// A record that could not be decoded, with its coordinates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PoisonRecord<'a> {
    /// Topic it came from.
    pub(crate) topic: &'a str,
    /// Partition.
    pub(crate) partition: i32,
    /// Offset in the partition.
    pub(crate) offset: i64,
    /// The record key, raw.
    pub(crate) key: Option<&'a [u8]>,
    /// The record value, raw.
    pub(crate) payload: &'a [u8],
    /// The `event_id` header, if any.
    pub(crate) event_id: Option<&'a str>,
    /// Why it could not be handled.
    pub(crate) error: &'a str,
}

/// Why [`Inbox::write`] wrote nothing.
enum Write {
    /// `uq_consumed_event_identity` (and only it) refused the dedup row.
    AlreadyConsumed,
    /// Anything else: not acknowledged.
    Failed(TxFailure),
}

/// The most characters of an error kept in `dead_letter.error`.
const ERROR_CHARS: usize = 1000;

/// One consumer's dedup table and effects.
#[derive(Debug, Clone)]
pub struct Inbox {
    db: DatabaseConnection,
    consumer_name: String,
}

impl Inbox {
    /// The inbox of `consumer_name` in `db`.
    pub fn new(db: DatabaseConnection, consumer_name: impl Into<String>) -> Self {
        Self { db, consumer_name: consumer_name.into() }
    }

    /// The dedup identity this inbox records events under.
    pub(crate) fn consumer_name(&self) -> &str {
        &self.consumer_name
    }

    /// Records `event` as consumed, creates its notification job and applies it to the order's
    /// read model (or parks it, see [`model::apply`]), in one transaction.
    ///
    /// `Err` means the message must not be acknowledged: the failure was anything but a
    /// violation of `uq_consumed_event_identity`, or the commit's outcome is unknown (a
    /// redelivery then meets the unique key).
    pub(crate) async fn consume(&self, event: &OrderEvent) -> Result<Consumed, TxFailure> {
        let txn = self.db.begin().await?;
        let consumed = match self.write(&txn, event, Utc::now().trunc_subsecs(6)).await {
            Ok(consumed) => consumed,
            Err(Write::AlreadyConsumed) => {
                txn.rollback().await?;
                return Ok(Consumed::AlreadyConsumed);
            }
            Err(Write::Failed(failure)) => {
                txn.rollback().await?;
                return Err(failure);
            }
        };
        // A failed commit may still have committed: the caller must not acknowledge, and the
        // redelivery will meet the unique key if it did.
        txn.commit().await?;
        Ok(consumed)
    }

    /// [`Inbox::consume`] for several events in one transaction (one durable commit), each in
    /// a savepoint of its own: an event already consumed rolls back only its savepoint and
    /// answers `AlreadyConsumed`, exactly as alone. Any other failure rolls back the whole
    /// transaction and answers `Err` with the index of the event that failed (`None`: the
    /// transaction itself, its commit included): nothing of the batch may be acknowledged, and
    /// the caller handles its events one by one.
    ///
    /// It first tries the whole batch set-based: one transaction of one insert of every dedup row
    /// and one of every job (four round trips however many events, where each event alone costs
    /// four: savepoint, dedup row, job, release). If that insert fails for any reason (an event
    /// already consumed, a duplicate inside the batch, anything else), it is rolled back whole
    /// and the batch goes through the savepoints above, which decide every event exactly as
    /// before; a commit that fails is answered as above.
    pub async fn consume_all(
        &self,
        events: &[OrderEvent],
    ) -> Result<Vec<Consumed>, (Option<usize>, TxFailure)> {
        let whole = |e: sea_orm::DbErr| (None, TxFailure::from(e));
        let now = Utc::now().trunc_subsecs(6);
        // A multi-row insert needs at least one row.
        if !events.is_empty() {
            let txn = self.db.begin().await.map_err(whole)?;
            if self.write_all(&txn, events, now).await.is_ok() {
                txn.commit().await.map_err(whole)?;
                return Ok(vec![Consumed::Committed; events.len()]);
            }
            txn.rollback().await.map_err(whole)?;
        }
        let txn = self.db.begin().await.map_err(whole)?;
        let mut outcomes = Vec::with_capacity(events.len());
        for (index, event) in events.iter().enumerate() {
            let savepoint = txn.begin().await.map_err(whole)?;
            match self.write(&savepoint, event, now).await {
                Ok(consumed) => {
                    savepoint.commit().await.map_err(whole)?;
                    outcomes.push(consumed);
                }
                Err(Write::AlreadyConsumed) => {
                    savepoint.rollback().await.map_err(whole)?;
                    outcomes.push(Consumed::AlreadyConsumed);
                }
                Err(Write::Failed(failure)) => {
                    savepoint.rollback().await.map_err(whole)?;
                    txn.rollback().await.map_err(whole)?;
                    return Err((Some(index), failure));
                }
            }
        }
        // As for one event: a failed commit may still have committed, so nothing is
        // acknowledged and the redeliveries meet the unique key.
        txn.commit().await.map_err(whole)?;
        Ok(outcomes)
    }

    /// Every event's dedup row in one statement, then every job in one, in the caller's
    /// transaction. Any error means "not this way": the caller rolls back and decides event by
    /// event ([`Inbox::write`]).
    async fn write_all(
        &self,
        txn: &DatabaseTransaction,
        events: &[OrderEvent],
        now: DateTime<Utc>,
    ) -> Result<(), sea_orm::DbErr> {
        let claims = events.iter().map(|event| consumed_event::ActiveModel {
            id: NotSet,
            consumer_name: Set(self.consumer_name.clone()),
            event_id: Set(event.event_id.to_string()),
            consumed_at: Set(now),
        });
        consumed_event::Entity::insert_many(claims).exec_without_returning(txn).await?;
        let jobs = events.iter().map(|event| notification_job::ActiveModel {
            consumer_name: Set(self.consumer_name.clone()),
            event_id: Set(event.event_id.to_string()),
            order_id: Set(event.order_id),
            source_version: Set(event.version),
            status: Set("PENDING".to_owned()),
            created_at: Set(now),
        });
        notification_job::Entity::insert_many(jobs).exec_without_returning(txn).await?;
        if !model::apply_all(txn, &self.consumer_name, events, now).await? {
            return Err(sea_orm::DbErr::Custom("the read model is decided event by event".into()));
        }
        if failpoint::hit(failpoint::NON_TARGET_INTEGRITY_OR_DATA_ERROR_WHILE_CLAIMING).is_err() {
            // The failpoint's integrity error lands in the savepoints, event by event.
            return Err(sea_orm::DbErr::Custom("failpoint: decided event by event".into()));
        }
        Ok(())
    }

    /// The dedup row, then the effect and the read model, in the caller's transaction.
    async fn write(
        &self,
        txn: &DatabaseTransaction,
        event: &OrderEvent,
        now: DateTime<Utc>,
    ) -> Result<Consumed, Write> {
        let event_id = event.event_id.to_string();
        let claim = consumed_event::Entity::insert(consumed_event::ActiveModel {
            id: NotSet,
            consumer_name: Set(self.consumer_name.clone()),
            event_id: Set(event_id.clone()),
            consumed_at: Set(now),
        })
        .exec_without_returning(txn)
        .await;
        if let Err(e) = claim {
            if violated_unique_key(&e) == Some(UniqueKey::ConsumedEventIdentity) {
                return Err(Write::AlreadyConsumed);
            }
            return Err(Write::Failed(e.into()));
        }
        let effect = async {
            // The job has the dedup row's identity, (consumer name, event id): each consumer
            // name makes its own job once. It doubles as the idempotency key for whatever sends
            // the notification: a remote side effect is only once if the remote honours it.
            let job = notification_job::ActiveModel {
                consumer_name: Set(self.consumer_name.clone()),
                event_id: Set(event_id.clone()),
                order_id: Set(event.order_id),
                source_version: Set(event.version),
                status: Set("PENDING".to_owned()),
                created_at: Set(now),
            };
            notification_job::Entity::insert(job.clone()).exec_without_returning(txn).await?;
            if failpoint::hit(failpoint::NON_TARGET_INTEGRITY_OR_DATA_ERROR_WHILE_CLAIMING).is_err() {
                // A real integrity error on another key (the job's primary key), so the
                // failure carries the database's own SQLSTATE, vendor code and constraint.
                notification_job::Entity::insert(job).exec_without_returning(txn).await?;
            }
            Ok::<_, TxFailure>(())
        }
        .await;
        if let Err(failure) = effect {
            let integrity_error = failure.db_err().and_then(sea_orm::DbErr::sql_err).is_some();
            if integrity_error
                && failpoint::broken(failpoint::BREAK_CLASSIFIER_ANY_INTEGRITY_ERROR_IS_DUPLICATE)
            {
                return Err(Write::AlreadyConsumed);
            }
            return Err(Write::Failed(failure));
        }
        match model::apply(txn, &self.consumer_name, event, now).await {
            Ok(Outcome::Parked) => Ok(Consumed::Parked),
            Ok(Outcome::Applied | Outcome::Stale) => Ok(Consumed::Committed),
            Err(e) => Err(Write::Failed(e.into())),
        }
    }

    /// Stores an undecodable record in the dead-letter table, in one transaction. A record already
    /// stored there (a redelivery: only a violation of `uq_dead_letter_coordinates` says so)
    /// counts as done.
    pub(crate) async fn dead_letter(&self, record: &PoisonRecord<'_>) -> Result<DeadLettered, TxFailure> {
        let stored = dead_letter::Entity::insert(dead_letter::ActiveModel {
            id: NotSet,
            consumer_name: Set(self.consumer_name.clone()),
            topic: Set(record.topic.to_owned()),
            partition_id: Set(record.partition),
            offset_id: Set(record.offset),
            record_key: Set(record.key.map(<[u8]>::to_vec)),
            payload: Set(record.payload.to_vec()),
            event_id: Set(record.event_id.map(|id| id.chars().take(128).collect())),
            error: Set(record.error.chars().take(ERROR_CHARS).collect()),
            created_at: Set(Utc::now().trunc_subsecs(6)),
        })
        .exec_without_returning(&self.db)
        .await;
        match stored {
            Ok(_) => Ok(DeadLettered::Stored),
            Err(e) if violated_unique_key(&e) == Some(UniqueKey::DeadLetterCoordinates) => {
                Ok(DeadLettered::AlreadyStored)
            }
            Err(e) => Err(e.into()),
        }
    }
}
