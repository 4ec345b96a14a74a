//! One order in a transaction of its own: the write path without group commit, and the one
//! group commit falls back to for an order that must not wait for a batch.

use chrono::{DateTime, Utc};
use idempost_proto::EventId;
use sea_orm::{DatabaseConnection, DatabaseTransaction};

use super::accepting::{
    SubmitError, Submitted, accepted, decide_clash, find, insert_order, rolled_back, unknown,
};
use super::transaction::{begin, commit, rerun_lock_conflicts};
use idempost::db::{TxFailure, UniqueKey, lock_conflict, violated_unique_key};
use idempost::domain::SubmitOrder;
use idempost::failpoint;
use idempost::telemetry::TraceHeaders;

/// Writes each order in a transaction of its own on the primary.
#[derive(Debug, Clone)]
pub(super) struct Alone {
    db: DatabaseConnection,
}

impl Alone {
    pub(super) fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    /// Writes one order in a transaction of its own, running it again after a lost lock
    /// conflict.
    pub(super) async fn submit_alone(
        &self,
        submit: &SubmitOrder,
        event_id: EventId,
        accepted_at: DateTime<Utc>,
        trace: &TraceHeaders,
    ) -> Result<Submitted, SubmitError> {
        rerun_lock_conflicts(|| self.attempt(submit, event_id, accepted_at, trace)).await
    }

    /// One run of the order transaction. A lock-conflict victim comes back as an unlogged
    /// `RolledBack` (the caller decides whether it is final); every other outcome is final.
    async fn attempt(
        &self,
        submit: &SubmitOrder,
        event_id: EventId,
        accepted_at: DateTime<Utc>,
        trace: &TraceHeaders,
    ) -> Result<Submitted, SubmitError> {
        let txn = begin(&self.db, None, event_id).await?;
        let written = async {
            let order_id = insert_order(&txn, submit, event_id, accepted_at, trace).await?;
            failpoint::hit(failpoint::BEFORE_ORDER_TRANSACTION_COMMIT)?;
            Ok::<_, TxFailure>(order_id)
        }
        .await;
        let order_id = match written {
            Ok(order_id) => order_id,
            Err(cause) => return self.after_failed_write(txn, submit, event_id, cause).await,
        };

        commit(txn, event_id).await?;
        tracing::info!(
            order_id,
            outcome = "COMMITTED",
            "transaction committed; order ACCEPTED, outbox event PENDING"
        );
        Ok(accepted(submit, event_id, accepted_at, order_id))
    }

    /// Rolls back after a failed write and decides what the failure means.
    async fn after_failed_write(
        &self,
        txn: DatabaseTransaction,
        submit: &SubmitOrder,
        event_id: EventId,
        cause: TxFailure,
    ) -> Result<Submitted, SubmitError> {
        if let Err(e) = txn.rollback().await {
            tracing::warn!(error = %e, "rollback failed; outcome unknown");
            return Err(unknown(event_id, cause));
        }
        match cause.db_err().and_then(violated_unique_key) {
            // SQLite reports only one violated index, and names the event id key when both
            // keys clash. Either way the decision below rests on the stored row that holds
            // this request's key, never on a guess from some other constraint.
            Some(key) if key.is_order_key() => self.replay(submit, event_id, key).await,
            // Logged by `submit` once it knows whether the transaction runs again.
            _ if cause.db_err().and_then(lock_conflict).is_some() => {
                Err(SubmitError::RolledBack { event_id, cause })
            }
            _ => Err(rolled_back(event_id, cause)),
        }
    }

    /// Answers a submission that clashed with a committed order: a replay when an order with
    /// the same key and the same content exists.
    async fn replay(
        &self,
        submit: &SubmitOrder,
        event_id: EventId,
        clash: UniqueKey,
    ) -> Result<Submitted, SubmitError> {
        let existing = find(&self.db, submit.tenant_id, &submit.request_id)
            .await
            .map_err(|e| rolled_back(event_id, e.into()))?;
        decide_clash(submit, event_id, clash, existing)
    }
}
