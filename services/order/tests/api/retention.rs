//! The outbox's retention in keyset batches: a purge continues after the last row it took, within
//! one run and from one periodic run to the next, and still deletes exactly the PUBLISHED rows
//! past the window; what became eligible behind its cursor goes on the next full pass.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait as _, Condition, ConnectionTrait as _, Value};

use crate::helpers::{Backend, TestOrder, assert_eventually, on_every_backend, order};
use idempost::db::purge::{self, Cursor};
use idempost::entity::outbox_event::{self, Column};
use idempost_testkit::wait::WAIT;

on_every_backend!(
    a_keyset_purge_continues_after_its_cursor_and_only_a_pass_from_the_head_takes_rows_behind_it,
    the_periodic_purge_deletes_exactly_the_published_rows_past_retention_over_many_batches_and_runs,
);

fn ago(age: Duration) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::from_std(age).unwrap()
}

async fn exec(app: &TestOrder, sql: &str, values: Vec<Value>) {
    let statement = idempost_testkit::sql::statement(app.conn.get_database_backend(), sql, values);
    app.conn.execute_raw(statement).await.unwrap();
}

/// Marks `event_id` PUBLISHED at `at`, as the relay's mark does.
async fn published(app: &TestOrder, event_id: &str, at: DateTime<Utc>) {
    let sql = "UPDATE outbox_event SET status = 'PUBLISHED', published_at = ? WHERE event_id = ?";
    exec(app, sql, vec![at.into(), event_id.to_owned().into()]).await;
}

async fn submitted(app: &TestOrder, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..count {
        ids.push(app.submit(order(21, &format!("retention-{i}"))).await.unwrap().event_id);
    }
    ids
}

/// Which of `ids` still have an outbox row.
async fn kept(app: &TestOrder, ids: &[String]) -> Vec<String> {
    let mut kept = Vec::new();
    for id in ids {
        if app.rows_for_event("outbox_event", id).await > 0 {
            kept.push(id.clone());
        }
    }
    kept
}

async fn a_keyset_purge_continues_after_its_cursor_and_only_a_pass_from_the_head_takes_rows_behind_it(
    backend: Backend,
) {
    let app = TestOrder::spawn_with(backend, |s| s.purge_every = Duration::ZERO).await;
    let ids = submitted(&app, 6).await;
    // Three rows published in one mark (one time for all: ties that a batch of 2 splits), one a
    // second later, one inside the window, one never published.
    let marked = ago(Duration::from_secs(2 * 3600));
    for id in &ids[0..3] {
        published(&app, id, marked).await;
    }
    published(&app, &ids[3], marked + chrono::Duration::seconds(1)).await;
    published(&app, &ids[4], ago(Duration::from_secs(600))).await;
    let eligible = || {
        Condition::all()
            .add(Column::Status.eq("PUBLISHED"))
            .add(Column::PublishedAt.lt(ago(Duration::from_secs(3600))))
    };
    let purge = async |after: &mut Option<Cursor<String>>| {
        purge::delete_in_batches::<outbox_event::Entity, String>(
            &app.conn,
            eligible(),
            Column::EventId,
            Column::PublishedAt,
            2,
            false,
            after,
        )
        .await
        .unwrap()
    };

    let mut after = None;
    assert_eq!(purge(&mut after).await, 4, "batches of 2 over a tie of 3 take every eligible row once");
    assert!(after.is_some());
    assert_eq!(kept(&app, &ids).await, ids[4..].to_vec());
    // A row that became eligible behind the cursor: a later run after it leaves it, a pass from
    // the head takes it.
    published(&app, &ids[4], marked - chrono::Duration::seconds(1)).await;
    let cursor = after.clone();
    assert_eq!(purge(&mut after).await, 0);
    assert_eq!(after, cursor, "a run that found nothing leaves the cursor where it was");
    assert_eq!(purge(&mut None).await, 1);
    assert_eq!(kept(&app, &ids).await, ids[5..].to_vec(), "the unpublished row stays");
    app.stop().await;
}

async fn the_periodic_purge_deletes_exactly_the_published_rows_past_retention_over_many_batches_and_runs(
    backend: Backend,
) {
    // Published rows kept an hour, two per statement, a run every 50 ms: a full pass from the head
    // every purge::FULL_PASS_EVERY runs, about a second apart.
    let app = TestOrder::spawn_with(backend, |s| {
        s.outbox_retention = Duration::from_secs(3600);
        s.purge_batch_size = 2;
        s.purge_every = Duration::from_millis(50);
    })
    .await;
    let ids = submitted(&app, 11).await;
    let old = ago(Duration::from_secs(3 * 3600));
    for (i, id) in ids[0..7].iter().enumerate() {
        published(&app, id, old + chrono::Duration::seconds(i64::try_from(i).unwrap())).await;
    }
    published(&app, &ids[7], ago(Duration::from_secs(600))).await;
    published(&app, &ids[8], ago(Duration::from_secs(600))).await;
    let ancient = ago(Duration::from_secs(100 * 24 * 3600));
    let failed = "UPDATE outbox_event SET status = 'FAILED', created_at = ? WHERE event_id = ?";
    exec(&app, failed, vec![ancient.into(), ids[9].clone().into()]).await;
    assert_eventually("the seven rows past retention are purged", WAIT, || async {
        kept(&app, &ids[0..7]).await.is_empty()
    })
    .await;
    // Published late, and stamped before where the runs stopped: behind their cursor.
    published(&app, &ids[8], old - chrono::Duration::seconds(60)).await;
    assert_eventually("a full pass purges the row behind the cursor", WAIT, || async {
        kept(&app, &ids[8..9]).await.is_empty()
    })
    .await;
    assert_eq!(
        kept(&app, &ids).await,
        ids[7..].iter().filter(|id| **id != ids[8]).cloned().collect::<Vec<_>>(),
        "inside the window, FAILED and PENDING rows stay"
    );
    assert_eq!(app.count("orders").await, 11, "orders are never purged");
    app.stop().await;
}
