//! The consumer's side of the database: dedup row and local effect in one transaction.

use chrono::{SubsecRound, Utc};
use sea_orm::{ActiveValue::NotSet, ActiveValue::Set, DatabaseConnection, EntityTrait, TransactionTrait};

use super::decode::OrderAcceptedEvent;
use crate::db::{TxFailure, UniqueKey, violated_unique_key};
use crate::entity::{consumed_event, dead_letter, notification_job};
use crate::failpoint;

/// What handling an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// The dedup row and the notification job committed together.
    Committed,
    /// `uq_consumed_event_identity` already held this (consumer, event): nothing was written.
    AlreadyConsumed,
}

/// A record that could not be decoded, with its coordinates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoisonRecord<'a> {
    /// Topic it came from.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// The record key, raw.
    pub key: Option<&'a [u8]>,
    /// The record value, raw.
    pub payload: &'a [u8],
    /// The `event_id` header, if any.
    pub event_id: Option<&'a str>,
    /// Why it could not be handled.
    pub error: &'a str,
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
    pub fn consumer_name(&self) -> &str {
        &self.consumer_name
    }

    /// Records `event` as consumed and creates its notification job, in one transaction.
    ///
    /// `Err` means the message must not be acknowledged: the failure was anything but a
    /// violation of `uq_consumed_event_identity`, or the commit's outcome is unknown (a
    /// redelivery then meets the unique key).
    pub async fn consume(&self, event: &OrderAcceptedEvent) -> Result<Consumed, TxFailure> {
        let now = Utc::now().trunc_subsecs(6);
        let event_id = event.event_id.to_string();
        let txn = self.db.begin().await?;
        let claim = consumed_event::Entity::insert(consumed_event::ActiveModel {
            id: NotSet,
            consumer_name: Set(self.consumer_name.clone()),
            event_id: Set(event_id.clone()),
            consumed_at: Set(now),
        })
        .exec_without_returning(&txn)
        .await;
        if let Err(e) = claim {
            txn.rollback().await?;
            if violated_unique_key(&e) == Some(UniqueKey::ConsumedEventIdentity) {
                return Ok(Consumed::AlreadyConsumed);
            }
            return Err(e.into());
        }
        let effect = async {
            // The event id doubles as the job's idempotency key for whatever sends the
            // notification: a remote side effect is only once if the remote honours it.
            let job = notification_job::ActiveModel {
                event_id: Set(event_id.clone()),
                order_id: Set(event.order_id),
                source_version: Set(event.version),
                status: Set("PENDING".to_owned()),
                created_at: Set(now),
            };
            notification_job::Entity::insert(job.clone()).exec_without_returning(&txn).await?;
            if failpoint::hit(failpoint::NON_TARGET_INTEGRITY_OR_DATA_ERROR_WHILE_CLAIMING).is_err() {
                // A real integrity error on another key (the job's primary key), so the
                // failure carries the database's own SQLSTATE, vendor code and constraint.
                notification_job::Entity::insert(job).exec_without_returning(&txn).await?;
            }
            Ok::<_, TxFailure>(())
        }
        .await;
        if let Err(failure) = effect {
            txn.rollback().await?;
            let integrity_error = failure.db_err().and_then(sea_orm::DbErr::sql_err).is_some();
            if integrity_error
                && failpoint::broken(failpoint::BREAK_CLASSIFIER_ANY_INTEGRITY_ERROR_IS_DUPLICATE)
            {
                return Ok(Consumed::AlreadyConsumed);
            }
            return Err(failure);
        }
        // A failed commit may still have committed: the caller must not acknowledge, and the
        // redelivery will meet the unique key if it did.
        txn.commit().await?;
        Ok(Consumed::Committed)
    }

    /// Stores an undecodable record in the dead-letter table, in one transaction. A record already
    /// stored there (a redelivery) counts as done.
    pub async fn dead_letter(&self, record: &PoisonRecord<'_>) -> Result<(), TxFailure> {
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
            Ok(_) => Ok(()),
            Err(e) if violated_unique_key(&e) == Some(UniqueKey::DeadLetterCoordinates) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
