//! `outbox_event.successor_version`: a change whose previous version is unpublished writes that
//! version's row (so that a Galera cluster certifies it against the relay's mark of it), added
//! by a migration that leaves a populated outbox as it was and runs beside a running service.

use idempost_migration::{Migrator, MigratorTrait};
use sea_orm::ConnectionTrait as _;

use crate::helpers::{Backend, TestOrder, amend, on_every_backend, order};

on_every_backend!(
    the_successor_migration_keeps_a_populated_outbox_and_a_change_then_writes_its_unpublished_previous_version
);

async fn the_successor_migration_keeps_a_populated_outbox_and_a_change_then_writes_its_unpublished_previous_version(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let waiting = app.submit(order(7, "successor-waiting")).await.unwrap().order_id;
    let published = app.submit(order(7, "successor-published")).await.unwrap().order_id;
    app.conn
        .execute_unprepared(&format!(
            "UPDATE outbox_event SET status = 'PUBLISHED' WHERE aggregate_id = '{published}' AND event_version = 1"
        ))
        .await
        .unwrap();

    // The outbox as the previous release left it, then the migration while the service runs.
    idempost_testkit::db::migrate_back_before(&app.conn, "m20261206_000006_successor_version").await;
    Migrator::up(&app.conn, None).await.unwrap();
    assert_eq!(app.count("outbox_event").await, 2, "the migration keeps every row");
    assert_eq!(
        app.scalar_i64("SELECT COUNT(*) FROM outbox_event WHERE successor_version IS NULL").await,
        2,
        "and changes none"
    );

    for (n, id) in [waiting, published].into_iter().enumerate() {
        let amended = app.amend(amend(&format!("successor-amend-{n}"), id, 1, 3)).await.unwrap();
        assert_eq!(amended.version, 2);
    }
    let app_ref = &app;
    let count = |id: i64, condition: &str| {
        let sql = format!("SELECT COUNT(*) FROM outbox_event WHERE aggregate_id = '{id}' AND {condition}");
        async move { app_ref.scalar_i64(&sql).await }
    };
    assert_eq!(
        (
            count(waiting, "event_version = 1 AND successor_version = 2").await,
            count(waiting, "event_version = 2 AND held_back").await
        ),
        (1, 1),
        "a change whose previous version is unpublished records itself on that version's row and is held back"
    );
    assert_eq!(
        (count(published, "successor_version IS NOT NULL").await, count(published, "held_back").await),
        (0, 0),
        "a change whose previous version is published writes nothing there and is not held back"
    );
    app.stop().await;
}
