//! One order in a transaction of its own: the write path without group commit, and the one
//! group commit falls back to for an order that must not wait for a batch.

use chrono::{DateTime, Utc};
use opentelemetry::KeyValue;
use sea_orm::{DatabaseConnection, DatabaseTransaction, TransactionTrait};

use super::accepting::{
    LOCK_CONFLICT_RETRIES, SubmitError, Submitted, accepted, decide_clash, find, insert_order, rolled_back,
    unknown,
};
use crate::db::{LockConflict, TxFailure, UniqueKey, lock_conflict, violated_unique_key};
use crate::domain::{EventId, SubmitOrder};
use crate::failpoint;
use crate::telemetry::{TraceHeaders, metrics};

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
        // A deadlock or lock-wait-timeout victim was rolled back by the server (and then by us,
        // confirmed): nothing of it remains, so it runs again with the same ids before the
        // caller hears ROLLED_BACK.
        let mut retries = 0;
        loop {
            match self.attempt(submit, event_id, accepted_at, trace).await {
                Err(SubmitError::RolledBack { event_id, cause }) => {
                    let Some(conflict) = cause.db_err().and_then(lock_conflict) else {
                        // Final, and already logged.
                        return Err(SubmitError::RolledBack { event_id, cause });
                    };
                    if retries == LOCK_CONFLICT_RETRIES {
                        return Err(rolled_back(event_id, cause));
                    }
                    retries += 1;
                    metrics().order_lock_retries.add(1, &[KeyValue::new("reason", conflict.as_str())]);
                    let wait = LockConflict::backoff(retries);
                    tracing::warn!(
                        reason = conflict.as_str(),
                        retry = retries,
                        ?wait,
                        error = %cause,
                        "order transaction lost a lock conflict and was rolled back; retrying with the same ids"
                    );
                    tokio::time::sleep(wait).await;
                }
                outcome => return outcome,
            }
        }
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
        let txn = match self.db.begin().await {
            Ok(txn) => txn,
            // No transaction began, so nothing can have been written.
            Err(e) => {
                let cause = TxFailure::from(e);
                tracing::warn!(outcome = "UNAVAILABLE", error = %cause, "no transaction began; nothing written");
                return Err(SubmitError::Unavailable { event_id, cause });
            }
        };
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

        if let Err(injected) = failpoint::hit(failpoint::COMMIT_FAILS_WITHOUT_COMMITTING) {
            let _ = txn.rollback().await;
            return Err(unknown(event_id, injected.into()));
        }
        if let Err(e) = txn.commit().await {
            // The server may have committed and only the acknowledgement was lost. Never turn
            // this into ROLLED_BACK: a later rollback cannot prove the commit did not happen.
            return Err(unknown(event_id, e.into()));
        }
        failpoint::hit(failpoint::COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION)
            .map_err(|injected| unknown(event_id, injected.into()))?;

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
            Some(key @ (UniqueKey::OrdersTenantRequest | UniqueKey::OrdersAcceptanceEvent)) => {
                self.replay(submit, event_id, key).await
            }
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
