//! Another session holding a snapshot open, as a report, a `pg_dump` or a forgotten transaction
//! does: a REPEATABLE READ transaction that has read the outbox. On PostgreSQL its snapshot
//! (`backend_xmin`) keeps VACUUM from removing any row version dead after it; on MariaDB/MySQL
//! its read view (opened by the first read, as `START TRANSACTION WITH CONSISTENT SNAPSHOT`
//! opens it at once) keeps purge from removing any undo log after it, so the history list
//! grows.

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, IsolationLevel, Statement,
    TransactionTrait,
};

use crate::sql;

/// Takes a snapshot at `taken` after `started` and releases it at `released` after it, on a task
/// of its own.
pub(super) fn schedule(
    url: String,
    started: tokio::time::Instant,
    (taken, released): (std::time::Duration, std::time::Duration),
) -> tokio::task::JoinHandle<Result<(), DbErr>> {
    tokio::spawn(async move {
        tokio::time::sleep_until(started + taken).await;
        println!("== soak: another session takes a snapshot and holds it");
        let held = Held::take(&url).await?;
        tokio::time::sleep_until(started + released).await;
        println!("== soak: the snapshot is released");
        held.release().await
    })
}

/// The session and its open transaction; [`Held::release`] ends both.
pub(super) struct Held {
    db: DatabaseConnection,
    txn: DatabaseTransaction,
}

impl Held {
    /// Opens the transaction on a connection of its own and reads one outbox row.
    pub(super) async fn take(url: &str) -> Result<Self, DbErr> {
        let db = sql::connect(url, 1).await?;
        let txn = db.begin_with_config(Some(IsolationLevel::RepeatableRead), None).await?;
        let backend = db.get_database_backend();
        txn.query_one_raw(Statement::from_string(backend, "SELECT 1 FROM outbox_event LIMIT 1")).await?;
        Ok(Self { db, txn })
    }

    /// Ends the transaction (nothing was written) and closes the session.
    pub(super) async fn release(self) -> Result<(), DbErr> {
        self.txn.rollback().await?;
        self.db.close().await
    }
}
