//! One write transaction of the order service, whatever it writes (a submission, an amendment, a
//! cancellation): how it begins, how it commits through the commit-window failpoints, and how a
//! lock-conflict victim runs again. Every write answers with the same outcomes because every
//! write goes through these.

use idempost_proto::EventId;
use opentelemetry::KeyValue;
use sea_orm::{DatabaseConnection, DatabaseTransaction, DbBackend, IsolationLevel, TransactionTrait};

use super::accepting::{LOCK_CONFLICT_RETRIES, SubmitError, rolled_back, unknown};
use idempost::db::{LockConflict, TxFailure, commit_refused, lock_conflict};
use idempost::failpoint;
use idempost::telemetry::metrics;

/// Begins a transaction (at `isolation`, or the session's); UNAVAILABLE when none began, which
/// means nothing can have been written.
pub(super) async fn begin(
    db: &DatabaseConnection,
    isolation: Option<IsolationLevel>,
    event_id: EventId,
) -> Result<DatabaseTransaction, SubmitError> {
    db.begin_with_config(isolation, None).await.map_err(|e| {
        let cause = TxFailure::from(e);
        tracing::warn!(outcome = "UNAVAILABLE", error = %cause, "no transaction began; nothing written");
        SubmitError::Unavailable { event_id, cause }
    })
}

/// Commits `txn` through the commit-window failpoints: any failure from here on is UNKNOWN, but
/// for a COMMIT the server refused as a deadlock (a confirmed rollback, answered as the unlogged
/// `RolledBack` of a lock-conflict victim, so [`rerun_lock_conflicts`] runs it again).
pub(super) async fn commit(txn: DatabaseTransaction, event_id: EventId) -> Result<(), SubmitError> {
    if let Err(injected) = failpoint::hit(failpoint::COMMIT_FAILS_WITHOUT_COMMITTING) {
        let _ = txn.rollback().await;
        return Err(unknown(event_id, injected.into()));
    }
    if let Err(e) = txn.commit().await {
        let cause = TxFailure::from(e);
        if cause.db_err().and_then(commit_refused).is_some() {
            // The server's own answer that it rolled the transaction back (on Galera: another
            // node committed the same rows first): a lock-conflict victim, run again.
            return Err(SubmitError::RolledBack { event_id, cause });
        }
        // The server may have committed and only the acknowledgement was lost. Never turn
        // this into ROLLED_BACK: a later rollback cannot prove the commit did not happen.
        return Err(unknown(event_id, cause));
    }
    failpoint::hit(failpoint::COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION)
        .map_err(|injected| unknown(event_id, injected.into()))
}

/// READ COMMITTED on MariaDB/MySQL, so that a read after a key clash or a lost compare-and-set
/// sees the row that another transaction committed while this one waited for its lock
/// (REPEATABLE READ would read an older snapshot), and inserts take no gap locks. PostgreSQL's
/// default is READ COMMITTED; SQLite has one writer at a time.
pub(super) fn read_committed(db: &DatabaseConnection) -> Option<IsolationLevel> {
    (db.get_database_backend() == DbBackend::MySql).then_some(IsolationLevel::ReadCommitted)
}

/// Runs one write transaction (`attempt`) again after it lost a lock conflict: a deadlock or
/// lock-wait-timeout victim was rolled back by the server (and then by us, confirmed), so nothing
/// of it remains and it runs again with the same ids before the caller hears ROLLED_BACK. An
/// attempt answers a lock-conflict victim as an unlogged `RolledBack`; every other answer is
/// final.
pub(super) async fn rerun_lock_conflicts<T, F>(mut attempt: impl FnMut() -> F) -> Result<T, SubmitError>
where
    F: Future<Output = Result<T, SubmitError>>,
{
    let mut retries = 0;
    loop {
        match attempt().await {
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
