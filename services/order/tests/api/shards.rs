//! The order service over a shard map (`--shard-map-file`): each tenant's calls on its own
//! shard's database, found again there by Reconcile and the admin service, a shard added by
//! SIGHUP served without a restart, and `idempost-migrate` migrating every shard of the map.
//! Two databases on one server make the two shards.

use idempost_testkit::db::migrate_shards;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idempost_order::{Application, ReloadError, Settings, ShardError, StartupError};
use idempost_proto::v1 as pb;
use idempost_testkit::in_process::InProcess;
use idempost_testkit::process::{Signal, send};
use idempost_testkit::service::{Output, ServiceProcess};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

mod audit;
mod claimable;

use crate::helpers::{
    Backend, TestDb, TestOrder, amend, assert_eventually, connect_order_service, on_every_backend, order,
    service_binary, violated_fields,
};

on_every_backend!(
    calls_of_two_tenants_land_on_their_own_shards_and_are_found_there,
    a_shard_added_to_the_map_is_served_after_sighup,
    a_reload_that_would_leave_a_tenants_orders_behind_keeps_the_running_map,
    a_shard_whose_order_ids_are_outside_its_block_is_refused_at_start,
    a_burst_of_two_tenants_orders_lands_each_on_its_own_shard_with_group_commit_on,
);

/// Tenant 8 is on shard "b"; every other tenant on "a", the default.
const TENANT_ON_A: i64 = 7;
const TENANT_ON_B: i64 = 8;

async fn calls_of_two_tenants_land_on_their_own_shards_and_are_found_there(backend: Backend) {
    let (a, b) = (TestDb::empty(backend).await, TestDb::empty(backend).await);
    let dir = tempfile::tempdir().unwrap();
    let map = write_map(dir.path(), &a.url, Some((&b.url, &[TENANT_ON_B])));
    let report = migrate_shards(&map);
    assert!(report.contains(r#"shard "a" (1 of 2): migrated; next order id 1"#), "{report}");
    assert!(report.contains(r#"shard "b" (2 of 2): migrated; next order id 1099511627776"#), "{report}");
    let app = TestOrder::spawn_on(a, |s| s.shard_map_file = Some(map.clone())).await;
    let b_conn = b.connect().await;

    let on_a = app.submit(order(TENANT_ON_A, "r-1")).await.unwrap();
    let on_b = app.submit(order(TENANT_ON_B, "r-1")).await.unwrap();

    assert_eq!(orders_of(&app.conn, TENANT_ON_A).await, 1);
    assert_eq!(orders_of(&app.conn, TENANT_ON_B).await, 0);
    assert_eq!(orders_of(&b_conn, TENANT_ON_B).await, 1);
    assert_eq!(orders_of(&b_conn, TENANT_ON_A).await, 0);
    assert!(on_a.order_id < 1 << 40, "shard a's ids are its block's: {}", on_a.order_id);
    assert!((1 << 40..2 << 40).contains(&on_b.order_id), "shard b's ids are its block's: {}", on_b.order_id);
    assert_eq!(app.reconcile(TENANT_ON_A, "r-1").await.unwrap().order_id, on_a.order_id);
    assert_eq!(app.reconcile(TENANT_ON_B, "r-1").await.unwrap().order_id, on_b.order_id);
    let mut change = amend("r-2", on_b.order_id, 1, 3);
    change.tenant_id = TENANT_ON_B;
    assert_eq!(app.client.clone().amend_order(change).await.unwrap().into_inner().version, 2);
    assert_eq!(outbox_rows(&b_conn).await, 2);
    let asked = pb::GetEventTimelineRequest { event_id: on_b.event_id.clone() };
    let timeline = app.admin.clone().get_event_timeline(asked).await.unwrap().into_inner().timeline.unwrap();
    assert_eq!(timeline.order.unwrap().order_id, on_b.order_id);
    let asked = pb::ListOrderEventsRequest { order_id: on_b.order_id, ..Default::default() };
    let events = app.admin.clone().list_order_events(asked).await.unwrap().into_inner();
    assert_eq!(events.total, 2);
    let asked = pb::ReplayRequest {
        order_id: on_b.order_id,
        dry_run: true,
        reason: "shard test".to_owned(),
        requested_by: "test".to_owned(),
        ..Default::default()
    };
    let replay = app.admin.clone().replay(asked).await.unwrap().into_inner();
    assert_eq!(replay.replayed + replay.not_published, 2, "{replay:?}");
    let backlog = |shard: &str| pb::ListBacklogRequest { shard: shard.to_owned(), ..Default::default() };
    let on_b_listed = app.admin.clone().list_backlog(backlog("b")).await.unwrap().into_inner();
    let default_listed = app.admin.clone().list_backlog(backlog("")).await.unwrap().into_inner();
    assert_eq!(on_b_listed.entries.len(), 2);
    assert_eq!(
        default_listed.entries.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(),
        [on_a.event_id.as_str()]
    );
    let unknown = app.admin.clone().list_backlog(backlog("nope")).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument);
    assert_eq!(violated_fields(&unknown), ["shard"]);
    app.stop().await;
}

async fn a_shard_added_to_the_map_is_served_after_sighup(backend: Backend) {
    let (a, b) = (TestDb::empty(backend).await, TestDb::empty(backend).await);
    let dir = tempfile::tempdir().unwrap();
    let map = write_map(dir.path(), &a.url, None);
    migrate_shards(&map);
    let app = TestOrder::spawn_on(a, |s| s.shard_map_file = Some(map.clone())).await;
    app.submit(order(TENANT_ON_A, "before")).await.unwrap();
    // Shard b gets its first order from a service of its own, so that the main service's
    // Reconcile can tell when it reads b without writing anything while it does not yet.
    let only_b = dir.path().join("only-b.json");
    let text = format!(
        r#"{{"default": "b", "shards": [{{"name": "b", "number": 1, "database_url": {:?}}}]}}"#,
        b.url
    );
    std::fs::write(&only_b, text).unwrap();
    migrate_shards(&only_b);
    let seeder = TestOrder::spawn_on(TestDb::migrated_at(b.url.clone()).await, |s| {
        s.shard_map_file = Some(only_b.clone());
    })
    .await;
    let seeded = seeder.submit(order(TENANT_ON_B, "seeded")).await.unwrap();
    seeder.stop().await;
    assert_eq!(app.reconcile(TENANT_ON_B, "seeded").await.unwrap_err().code(), tonic::Code::NotFound);

    write_map(dir.path(), &app.db.url, Some((&b.url, &[TENANT_ON_B])));
    assert!(send(std::process::id(), Signal::SIGHUP));

    assert_eventually("the reloaded map sends tenant 8 to shard b", Duration::from_secs(20), || async {
        app.reconcile(TENANT_ON_B, "seeded").await.is_ok_and(|found| found.order_id == seeded.order_id)
    })
    .await;
    app.submit(order(TENANT_ON_B, "after")).await.unwrap();
    let b_conn = b.connect().await;
    assert_eq!(orders_of(&b_conn, TENANT_ON_B).await, 2);
    assert_eq!(orders_of(&app.conn, TENANT_ON_B).await, 0);
    assert_eq!(orders_of(&app.conn, TENANT_ON_A).await, 1);
    app.stop().await;
}

async fn a_reload_that_would_leave_a_tenants_orders_behind_keeps_the_running_map(backend: Backend) {
    let (a, b) = (TestDb::empty(backend).await, TestDb::empty(backend).await);
    let dir = tempfile::tempdir().unwrap();
    migrate_shards(&write_map(dir.path(), &a.url, Some((&b.url, &[]))));
    // The service starts on shard a alone.
    let map = write_map(dir.path(), &a.url, None);
    let mut settings = Settings::for_database(&a.url);
    settings.shard_map_file = Some(map.clone());
    let app = Application::build(settings).await.unwrap();
    let (reload, port) = (app.shard_map_reload(), app.port());
    let server = InProcess::spawn(|shutdown| app.run_until_stopped(shutdown));
    let client = connect_order_service(&format!("http://127.0.0.1:{port}")).await;
    client.clone().submit_order(order(TENANT_ON_A, "before")).await.unwrap();
    let a_conn = a.connect().await;

    write_map(dir.path(), &a.url, Some((&b.url, &[TENANT_ON_A, TENANT_ON_B])));
    let refused = reload.reload().await.unwrap_err();

    assert!(
        matches!(&refused, ReloadError::TenantLeavesOrders { tenant: TENANT_ON_A, from, to } if from == "a" && to == "b"),
        "{refused}"
    );
    client.clone().submit_order(order(TENANT_ON_B, "still-on-a")).await.unwrap();
    assert_eq!(orders_of(&a_conn, TENANT_ON_B).await, 1, "the running map stays: tenant 8 is still on a");
    let renumbered = map_text_renumbered(&std::fs::read_to_string(&map).unwrap());
    std::fs::write(&map, renumbered).unwrap();
    assert!(matches!(reload.reload().await.unwrap_err(), ReloadError::Redefined(name) if name == "a"));
    server.stop().await;
}

async fn a_shard_whose_order_ids_are_outside_its_block_is_refused_at_start(backend: Backend) {
    // Migrated as lone databases, not through the map: b's ids start at 1, inside shard 0's block.
    let (a, b) = (TestDb::migrated(backend).await, TestDb::migrated(backend).await);
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::for_database(&a.url);
    settings.shard_map_file = Some(write_map(dir.path(), &a.url, Some((&b.url, &[TENANT_ON_B]))));

    let error = Application::build(settings).await.unwrap_err();

    assert!(
        matches!(&error, StartupError::Shard(ShardError::OrderIds { shard, .. }) if shard == "b"),
        "{error}"
    );
    assert!(error.to_string().contains("idempost-migrate --shard-map-file"), "{error}");
}

/// Only PostgreSQL drops a database under its open connections (`WITH (FORCE)`): one shard's
/// database gone while the other's answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_shards_database_down_fails_its_tenants_only_and_health_stays_serving() {
    let (a, b) = (TestDb::empty(Backend::Postgres).await, TestDb::empty(Backend::Postgres).await);
    let dir = tempfile::tempdir().unwrap();
    let map = write_map(dir.path(), &a.url, Some((&b.url, &[TENANT_ON_B])));
    migrate_shards(&map);
    let (endpoint, received, _receiver) = crate::otlp::start_receiver().await;
    let (_service, port) = order_process_on_map(&map, endpoint, dir.path()).await;
    let url = format!("http://127.0.0.1:{port}");
    let client = connect_order_service(&url).await;
    client.clone().submit_order(order(TENANT_ON_B, "before")).await.unwrap();

    let (server, name) = b.url.rsplit_once('/').unwrap();
    let admin = idempost::db::connect(&format!("{server}/postgres"), 1).await.unwrap();
    admin.execute_unprepared(&format!("DROP DATABASE {name} WITH (FORCE)")).await.unwrap();

    assert_eventually("shard b is reported down", Duration::from_secs(30), || async {
        received.points().iter().any(|p| {
            p.name == "idempost.order.shard.down"
                && p.attribute("idempost.shard") == Some("b")
                && p.value == 1.0
        })
    })
    .await;
    let mut health = HealthClient::new(Channel::from_shared(url).unwrap().connect().await.unwrap());
    let status =
        health.check(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner().status();
    assert_eq!(status, ServingStatus::Serving);
    client.clone().submit_order(order(TENANT_ON_A, "a-answers")).await.unwrap();
    let refused = client.clone().submit_order(order(TENANT_ON_B, "b-is-gone")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
}

#[test]
fn idempost_migrate_stops_at_the_first_shard_that_fails_and_names_the_shards_not_reached() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = |name: &str| format!("sqlite://{}?mode=rwc", dir.path().join(name).display());
    let map = dir.path().join("map.json");
    let text = format!(
        r#"{{"default": "a", "shards": [
            {{"name": "a", "number": 0, "database_url": {:?}}},
            {{"name": "b", "number": 1, "database_url_file": "missing.url"}},
            {{"name": "c", "number": 2, "database_url": {:?}}}]}}"#,
        sqlite("a.db"),
        sqlite("c.db"),
    );
    std::fs::write(&map, text).unwrap();

    let output = std::process::Command::new(service_binary("idempost-migrate"))
        .arg("--shard-map-file")
        .arg(&map)
        .arg("up")
        .output()
        .unwrap();

    let (printed, said) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "{printed}{said}");
    assert!(printed.contains(r#"shard "a" (1 of 3): migrated"#), "{printed}");
    assert!(said.contains(r#"shard "b": "#) && said.contains("missing.url"), "{said}");
    assert!(said.contains(r#"not run on the shards after it: ["c"]"#), "{said}");
    assert!(!dir.path().join("c.db").exists(), "shard c was not touched");
}

/// An order-service process on the map at `map`, exporting metrics to `endpoint`; its public port.
async fn order_process_on_map(map: &Path, endpoint: String, dir: &Path) -> (ServiceProcess, u16) {
    let args = [
        format!("--shard-map-file={}", map.display()),
        "--listen=127.0.0.1:0".to_owned(),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ];
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned())];
    let output = if std::env::var_os("TEST_LOG").is_some() { Output::Inherit } else { Output::Discard };
    let binary = service_binary("idempost-order");
    let mut process = ServiceProcess::start_with_port_file(
        &binary,
        "idempost-order",
        &args,
        &env,
        output,
        &dir.join("ports"),
    )
    .unwrap();
    let bound = process.listening(Duration::from_secs(60)).await.unwrap();
    (process, bound.port("listen"))
}

async fn a_burst_of_two_tenants_orders_lands_each_on_its_own_shard_with_group_commit_on(backend: Backend) {
    let (a, b) = (TestDb::empty(backend).await, TestDb::empty(backend).await);
    let dir = tempfile::tempdir().unwrap();
    let map = write_map(dir.path(), &a.url, Some((&b.url, &[TENANT_ON_B])));
    migrate_shards(&map);
    // One writer per shard: orders that arrive while it is busy share its next transaction.
    let app = TestOrder::spawn_on(a, |s| {
        s.shard_map_file = Some(map.clone());
        s.group_commit.writers = 1;
    })
    .await;
    let b_conn = b.connect().await;

    let calls = (0..40).map(|i| {
        let tenant = if i % 2 == 0 { TENANT_ON_A } else { TENANT_ON_B };
        app.submit(order(tenant, &format!("burst-{i}")))
    });
    let answers = futures::future::join_all(calls).await;

    for (i, answer) in answers.into_iter().enumerate() {
        let order_id = answer.unwrap().order_id;
        let block = if i % 2 == 0 { 1..1 << 40 } else { 1 << 40..2 << 40 };
        assert!(block.contains(&order_id), "order {i} got id {order_id}, outside its shard's block");
    }
    assert_eq!(orders_of(&app.conn, TENANT_ON_A).await, 20);
    assert_eq!(orders_of(&app.conn, TENANT_ON_B).await, 0);
    assert_eq!(orders_of(&b_conn, TENANT_ON_B).await, 20);
    assert_eq!(outbox_rows(&b_conn).await, 20);
    app.stop().await;
}

/// The map with shard "a" numbered 5: the same name for another block of order ids.
fn map_text_renumbered(text: &str) -> String {
    text.replace(r#""name": "a", "number": 0"#, r#""name": "a", "number": 5"#)
}

/// Writes `map.json` in `dir`: shard "a" (number 0, the default, its URL inline) and, when
/// given, shard "b" (number 1, its URL in a file beside the map) holding `tenants`.
fn write_map(dir: &Path, a: &str, b: Option<(&str, &[i64])>) -> PathBuf {
    let mut shards = vec![format!(r#"{{"name": "a", "number": 0, "database_url": {a:?}}}"#)];
    if let Some((b, tenants)) = b {
        std::fs::write(dir.join("b.url"), format!("{b}\n")).unwrap();
        shards.push(format!(
            r#"{{"name": "b", "number": 1, "database_url_file": "b.url", "tenants": {tenants:?}}}"#
        ));
    }
    let path = dir.join("map.json");
    std::fs::write(&path, format!(r#"{{"default": "a", "shards": [{}]}}"#, shards.join(", "))).unwrap();
    path
}

async fn orders_of(conn: &DatabaseConnection, tenant: i64) -> i64 {
    idempost_testkit::sql::count(conn, "SELECT COUNT(*) FROM orders WHERE tenant_id = ?", vec![tenant.into()])
        .await
}

async fn outbox_rows(conn: &DatabaseConnection) -> i64 {
    idempost_testkit::sql::count(conn, "SELECT COUNT(*) FROM outbox_event", vec![]).await
}
