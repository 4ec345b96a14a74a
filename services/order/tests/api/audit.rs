//! The one audit table of operators' writes, `admin_audit`, in a deployment that already had the
//! two tables it replaces: the migration copies their rows, and the order service serves them.

use idempost_migration::{Migrator, MigratorTrait};
use idempost_proto::v1 as pb;
use sea_orm::{ConnectionTrait as _, Statement};

use crate::helpers::{Backend, TestDb, TestOrder, on_every_backend};

on_every_backend!(the_audit_migration_copies_the_replays_and_gap_releases_already_recorded);

async fn the_audit_migration_copies_the_replays_and_gap_releases_already_recorded(backend: Backend) {
    let db = TestDb::empty(backend).await;
    let conn = db.connect().await;
    let before = Migrator::migrations()
        .iter()
        .position(|m| m.name() == "m20261206_000004_admin_audit")
        .expect("the migration is known");
    Migrator::up(&conn, Some(u32::try_from(before).unwrap())).await.unwrap();
    let at =
        if backend == Backend::MariaDb { "'2026-12-01 10:00:00'" } else { "'2026-12-01 10:00:00+00:00'" };
    for sql in [
        format!(
            "INSERT INTO replay_audit (requested_by, reason, order_id, event_type, replayed, not_published, purged, replayed_at) \
             VALUES ('alice', 'billing starts', 42, NULL, 3, 1, 0, {at})"
        ),
        format!(
            "INSERT INTO gap_release (consumer_name, order_id, from_version, to_version, released_by, reason, released_at) \
             VALUES ('planner', 7, 2, 3, 'bob', 'v2 and v3 lost (ticket 9)', {at})"
        ),
    ] {
        conn.execute_unprepared(&sql).await.unwrap();
    }

    Migrator::up(&conn, None).await.unwrap();

    let rows = conn
        .query_all_raw(Statement::from_string(
            conn.get_database_backend(),
            "SELECT action, actor, reason, order_id, consumer_name, outcome FROM admin_audit ORDER BY id",
        ))
        .await
        .unwrap();
    let rows: Vec<(String, String, String, i64, Option<String>, String)> = rows
        .iter()
        .map(|r| {
            (
                r.try_get_by_index(0).unwrap(),
                r.try_get_by_index(1).unwrap(),
                r.try_get_by_index(2).unwrap(),
                r.try_get_by_index(3).unwrap(),
                r.try_get_by_index(4).unwrap(),
                r.try_get_by_index(5).unwrap(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str(), rows[0].2.as_str(), rows[0].3, rows[0].4.as_deref()),
        ("REPLAY", "alice", "billing starts", 42, None)
    );
    assert!(rows[0].5.starts_with("replayed 3, not published 1, purged 0"), "{}", rows[0].5);
    assert_eq!(
        (rows[1].0.as_str(), rows[1].1.as_str(), rows[1].2.as_str(), rows[1].3, rows[1].4.as_deref()),
        ("RELEASE_GAP", "bob", "v2 and v3 lost (ticket 9)", 7, Some("planner"))
    );
    assert!(rows[1].5.starts_with("versions 2..=3 given up"), "{}", rows[1].5);
    // The old tables stay, rows and all: a service of the previous release still writes them.
    let kept = conn
        .query_one_raw(Statement::from_string(
            conn.get_database_backend(),
            "SELECT COUNT(*) FROM replay_audit",
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.try_get_by_index::<i64>(0).unwrap(), 1);
    conn.close().await.unwrap();

    // The order service serves the copied rows, and adds its own after them.
    let app = TestOrder::spawn_on(db, |_| {}).await;
    let page = pb::ListAuditRequest { action: "REPLAY".into(), ..Default::default() };
    let records = app.admin.clone().list_audit(page).await.unwrap().into_inner().records;
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].actor.as_str(), records[0].order_id), ("alice", 42));
    assert!(
        records[0].recorded_at.is_some_and(|t| t.seconds == 1_796_119_200),
        "{:?}",
        records[0].recorded_at
    );
    let unknown = pb::ListAuditRequest { action: "DELETE".into(), ..Default::default() };
    let refused = app.admin.clone().list_audit(unknown).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    app.stop().await;
}
