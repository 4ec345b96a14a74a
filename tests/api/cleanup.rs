//! What the relay's cleanup gauges read (`idempost::db::cleanup`, behind
//! `idempost_db_oldest_transaction_age_seconds` and `idempost_db_unremoved_versions`): a session
//! holding a snapshot open shows as the oldest transaction, and the outbox rows deleted while it
//! is held as row versions cleanup has not removed, so the alerts on them name a real cause.

use std::time::Duration;

use sea_orm::{ConnectionTrait as _, IsolationLevel, Statement, TransactionTrait as _};

use crate::helpers::{Backend, OutboxProbe, TestDb, assert_eventually, on_every_backend};
use idempost::db::cleanup::{oldest_transaction_age, unremoved_versions};
use idempost_testkit::wait::WAIT;

/// Outbox rows deleted while the snapshot is held.
const DELETED: u64 = 40;

async fn a_held_snapshot_is_the_oldest_transaction_and_keeps_deleted_rows_unremoved(backend: Backend) {
    let test_db = TestDb::migrated(backend).await;
    let db = test_db.connect().await;
    OutboxProbe { conn: &db }.seed(DELETED as usize).await;
    if backend == Backend::Sqlite {
        // Writers wait for each other instead: nothing to hold back, nothing to report.
        assert_eq!(oldest_transaction_age(&db).await.unwrap(), Duration::ZERO);
        assert_eq!(unremoved_versions(&db).await.unwrap(), 0);
        return;
    }
    let holder = test_db.connect().await;
    let held = holder.begin_with_config(Some(IsolationLevel::RepeatableRead), None).await.unwrap();
    let read = Statement::from_string(db.get_database_backend(), "SELECT COUNT(*) FROM outbox_event");
    held.query_one_raw(read).await.unwrap();

    assert_eventually("the held snapshot is reported as open for 2 s or more", WAIT, || async {
        oldest_transaction_age(&db).await.unwrap() >= Duration::from_secs(2)
    })
    .await;
    db.execute_unprepared("DELETE FROM outbox_event").await.unwrap();
    // PostgreSQL: this table's own dead rows (the statistics arrive within a second or so);
    // MariaDB: the server's history list, which holds at least this delete's undo log.
    let at_least = if backend == Backend::Postgres { DELETED } else { 1 };
    assert_eventually("the deleted rows are reported as not yet removed", WAIT, || async {
        unremoved_versions(&db).await.unwrap() >= at_least
    })
    .await;
    held.rollback().await.unwrap();
}

on_every_backend!(a_held_snapshot_is_the_oldest_transaction_and_keeps_deleted_rows_unremoved);
