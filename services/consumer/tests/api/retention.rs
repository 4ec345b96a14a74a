//! The dedup history's retention in keyset batches: a purge continues after the last row it took,
//! within one run and from one periodic run to the next, and still deletes exactly the
//! consumed_event rows past the window; what became eligible behind its cursor goes on the next
//! full pass.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait as _, Condition, ConnectionTrait as _, DatabaseConnection, Value};

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestDb, assert_eventually, on_every_backend};
use idempost::db::purge::{self, Cursor};
use idempost::entity::consumed_event::{self, Column};
use idempost_testkit::consumer::{TestConsumer, consumer_settings};
use idempost_testkit::wait::WAIT;

on_every_backend!(
    a_keyset_purge_of_dedup_rows_continues_after_its_cursor_and_only_a_pass_from_the_head_takes_rows_behind_it,
    the_periodic_purge_deletes_exactly_the_dedup_rows_past_retention_over_many_batches_and_runs,
);

const DAY: Duration = Duration::from_secs(24 * 3600);

fn ago(age: Duration) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::from_std(age).unwrap()
}

/// A dedup row of `event_id`, committed at `at`.
async fn consumed(db: &DatabaseConnection, event_id: &str, at: DateTime<Utc>) {
    let sql = "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES ('notify', ?, ?)";
    let values: Vec<Value> = vec![event_id.to_owned().into(), at.into()];
    let statement = idempost_testkit::sql::statement(db.get_database_backend(), sql, values);
    db.execute_raw(statement).await.unwrap();
}

/// Which of `event_ids` still have a dedup row.
async fn kept(db: &DatabaseConnection, event_ids: &[String]) -> Vec<String> {
    let sql = "SELECT COUNT(*) FROM consumed_event WHERE event_id = ?";
    let mut kept = Vec::new();
    for id in event_ids {
        if idempost_testkit::sql::count(db, sql, vec![id.clone().into()]).await > 0 {
            kept.push(id.clone());
        }
    }
    kept
}

fn event_ids(count: usize) -> Vec<String> {
    (0..count).map(|_| uuid::Uuid::now_v7().to_string()).collect()
}

async fn a_keyset_purge_of_dedup_rows_continues_after_its_cursor_and_only_a_pass_from_the_head_takes_rows_behind_it(
    backend: Backend,
) {
    let test_db = TestDb::migrated(backend).await;
    let db = test_db.connect().await;
    let ids = event_ids(6);
    // Three rows of one consumer batch (one time for all: ties that a batch of 2 splits), one a
    // second later, one inside the window.
    let committed = ago(40 * DAY);
    for id in &ids[0..3] {
        consumed(&db, id, committed).await;
    }
    consumed(&db, &ids[3], committed + chrono::Duration::seconds(1)).await;
    consumed(&db, &ids[4], ago(20 * DAY)).await;
    let purge = async |after: &mut Option<Cursor<i64>>| {
        purge::delete_in_batches::<consumed_event::Entity, i64>(
            &db,
            Condition::all().add(Column::ConsumedAt.lt(ago(30 * DAY))),
            Column::Id,
            Column::ConsumedAt,
            2,
            false,
            after,
        )
        .await
        .unwrap()
    };

    let mut after = None;
    assert_eq!(purge(&mut after).await, 4, "batches of 2 over a tie of 3 take every eligible row once");
    assert_eq!(kept(&db, &ids).await, ids[4..5].to_vec());
    // A row that became eligible behind the cursor (committed later, stamped earlier): a later run
    // after the cursor leaves it, a pass from the head takes it.
    consumed(&db, &ids[5], committed - chrono::Duration::seconds(1)).await;
    let cursor = after.clone();
    assert_eq!(purge(&mut after).await, 0);
    assert_eq!(after, cursor, "a run that found nothing leaves the cursor where it was");
    assert_eq!(purge(&mut None).await, 1);
    assert_eq!(kept(&db, &ids).await, ids[4..5].to_vec(), "the row inside the window stays");
    db.close().await.unwrap();
}

async fn the_periodic_purge_deletes_exactly_the_dedup_rows_past_retention_over_many_batches_and_runs(
    backend: Backend,
) {
    let test_db = TestDb::migrated(backend).await;
    let db = test_db.connect().await;
    // Retention needs no broker: the consumer's broker address refuses connections, and its
    // purges run all the same.
    let broker = TestBroker::reserve();
    let topic = idempost_testkit::topic::unique("idempost-retention");
    let group = format!("retention-{}", uuid::Uuid::new_v4().simple());
    // Dedup rows kept 30 days past a horizon of 14, two per statement, a run every 50 ms: a full
    // pass from the head every purge::FULL_PASS_EVERY runs, about a second apart.
    let mut settings = consumer_settings(&test_db.url, &broker.address(), &topic, &group);
    settings.consumed_retention = 30 * DAY;
    settings.redelivery_horizon = 14 * DAY;
    settings.purge_batch_size = 2;
    settings.purge_every = Duration::from_millis(50);
    let consumer = TestConsumer::spawn(settings).await;

    let ids = event_ids(9);
    let old = ago(40 * DAY);
    for (i, id) in ids[0..7].iter().enumerate() {
        consumed(&db, id, old + chrono::Duration::seconds(i64::try_from(i).unwrap())).await;
    }
    consumed(&db, &ids[7], ago(20 * DAY)).await;
    assert_eventually("the seven rows past retention are purged", WAIT, || async {
        kept(&db, &ids[0..7]).await.is_empty()
    })
    .await;
    // Committed now, stamped before where the runs stopped: behind their cursor.
    consumed(&db, &ids[8], old - chrono::Duration::seconds(60)).await;
    assert_eventually("a full pass purges the row behind the cursor", WAIT, || async {
        kept(&db, &ids[8..9]).await.is_empty()
    })
    .await;
    assert_eq!(kept(&db, &ids).await, ids[7..8].to_vec(), "the row inside the window stays");
    consumer.stop().await;
    db.close().await.unwrap();
}
