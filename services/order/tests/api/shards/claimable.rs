//! The order service's claimable gauge over a shard map: one value per shard, named by
//! `idempost.shard`, so that every shard's waiting events are seen with every relay down.

use std::time::Duration;

use super::{TENANT_ON_A, TENANT_ON_B, order_process_on_map, write_map};
use crate::helpers::{Backend, TestDb, assert_eventually, connect_order_service, on_every_backend, order};
use idempost_testkit::db::migrate_shards;

on_every_backend!(the_order_service_reports_each_shards_claimable_events_under_its_name);

async fn the_order_service_reports_each_shards_claimable_events_under_its_name(backend: Backend) {
    let (a, b) = (TestDb::empty(backend).await, TestDb::empty(backend).await);
    let dir = tempfile::tempdir().unwrap();
    let map = write_map(dir.path(), &a.url, Some((&b.url, &[TENANT_ON_B])));
    migrate_shards(&map);
    let (endpoint, received, _receiver) = crate::otlp::start_receiver().await;
    let (_service, port) = order_process_on_map(&map, endpoint, dir.path()).await;
    let client = connect_order_service(&format!("http://127.0.0.1:{port}")).await;
    // No relay runs: every event stays claimable, one on "a" and two on "b".
    client.clone().submit_order(order(TENANT_ON_A, "a-1")).await.unwrap();
    for request in ["b-1", "b-2"] {
        client.clone().submit_order(order(TENANT_ON_B, request)).await.unwrap();
    }

    let claimable = |shard: &str, value: f64| {
        received.points().iter().any(|p| {
            p.name == "idempost.outbox.claimable"
                && p.attribute("idempost.shard") == Some(shard)
                && p.value == value
        })
    };
    assert_eventually(
        "each shard's claimable events are reported under its name",
        Duration::from_secs(30),
        || async { claimable("a", 1.0) && claimable("b", 2.0) },
    )
    .await;
    let points = received.points();
    let mut values = points.iter().filter(|p| p.name == "idempost.outbox.claimable");
    assert!(
        values.all(|p| p.attribute("idempost.shard").is_some()),
        "with a map, every value names its shard"
    );
    assert!(
        received.points().iter().any(|p| {
            p.name == "idempost.outbox.oldest_claimable_age"
                && p.attribute("idempost.shard") == Some("b")
                && p.value > 0.0
        }),
        "the oldest claimable event's age is per shard too"
    );
}
