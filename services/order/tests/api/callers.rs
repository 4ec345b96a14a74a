//! What callers and tenants see when something goes wrong: a stable reason and a correlation id,
//! never the database's text; a tenant's view of its own event without the operators' details;
//! INVALID_ARGUMENT for a window out of range; and refused calls counted per reason.

use std::time::Duration;

use idempost_proto::v1 as pb;
use sea_orm::{ConnectionTrait, Statement};
use tonic::Code;

use crate::helpers::{
    Backend, TestDb, TestOrder, TestService, assert_eventually, connect_order_service, metadata,
    on_every_backend, order, reason, violated_fields,
};
use crate::otlp::start_receiver;
use crate::pki::Pki;
use idempost_testkit::auth::jwt_flags;
use idempost_testkit::auth::{authenticated, operator, tenant, with_token};

on_every_backend!(
    a_database_failure_reaches_a_tenant_as_a_reason_and_a_correlation_id_never_as_database_text,
    a_tenant_sees_its_events_state_without_the_relays_lease_owner_or_error_text,
    out_of_range_windows_are_invalid_arguments_naming_the_field,
);

/// Renames `table` away, so that every query of it fails with the database's own words.
async fn break_table(app: &TestOrder, table: &str) {
    let sql = format!("ALTER TABLE {table} RENAME TO {table}_gone");
    app.conn.execute_raw(Statement::from_string(app.conn.get_database_backend(), sql)).await.unwrap();
}

/// A DATABASE_UNAVAILABLE answer that names no table and carries a correlation id.
fn assert_generic(status: &tonic::Status, table: &str) {
    assert_eq!((status.code(), reason(status).as_str()), (Code::Unavailable, "DATABASE_UNAVAILABLE"));
    let answer = format!("{status:?}").to_lowercase();
    assert!(!answer.contains(table), "the database's text reached the caller: {status:?}");
    let id = metadata(status, "correlation_id").expect("a correlation id");
    assert!(id.len() == 32 && status.message().contains(&id), "{status:?}");
}

async fn a_database_failure_reaches_a_tenant_as_a_reason_and_a_correlation_id_never_as_database_text(
    backend: Backend,
) {
    let (app, pki, _dir) = authenticated(backend, |_| {}).await;
    let seven = tenant(&pki, 7);
    let accepted =
        app.client.clone().submit_order(with_token(order(0, "req-1"), &seven)).await.unwrap().into_inner();
    let mut admin = app.admin.clone();

    break_table(&app, "outbox_event").await;
    let timeline = pb::GetEventTimelineRequest { event_id: accepted.event_id.clone() };
    let failed = admin.get_event_timeline(with_token(timeline, &seven)).await.unwrap_err();
    assert_generic(&failed, "outbox_event");
    let find = pb::FindByBusinessKeyRequest { tenant_id: 0, request_id: "req-1".to_owned() };
    let failed = admin.find_by_business_key(with_token(find, &seven)).await.unwrap_err();
    assert_generic(&failed, "outbox_event");

    break_table(&app, "orders").await;
    let key = pb::ReconcileRequest { tenant_id: 0, request_id: "req-1".to_owned() };
    let failed = app.client.clone().reconcile(with_token(key, &seven)).await.unwrap_err();
    assert_generic(&failed, "orders");
    app.stop().await;
}

async fn a_tenant_sees_its_events_state_without_the_relays_lease_owner_or_error_text(backend: Backend) {
    let (app, pki, _dir) = authenticated(backend, |_| {}).await;
    let (seven, ops) = (tenant(&pki, 7), operator(&pki, "alice"));
    let accepted =
        app.client.clone().submit_order(with_token(order(0, "req-1"), &seven)).await.unwrap().into_inner();
    let sql = format!(
        "UPDATE outbox_event SET status = 'FAILED', attempts = 3, lease_owner = 'relay-7.internal/4242/0badf00d', \
         last_error = 'Broker: Unknown topic or partition at kafka-3.internal:9092', \
         last_redriven_by = 'alice', last_redrive_reason = 'INC-1234 broker outage' WHERE event_id = '{}'",
        accepted.event_id
    );
    app.conn.execute_raw(Statement::from_string(app.conn.get_database_backend(), sql)).await.unwrap();
    let mut admin = app.admin.clone();
    let timeline = || pb::GetEventTimelineRequest { event_id: accepted.event_id.clone() };
    let find = || pb::FindByBusinessKeyRequest { tenant_id: 7, request_id: "req-1".to_owned() };

    let by_event = admin.get_event_timeline(with_token(timeline(), &seven)).await.unwrap().into_inner();
    let by_key = admin.find_by_business_key(with_token(find(), &seven)).await.unwrap().into_inner();
    for seen in [by_event.timeline, by_key.timeline] {
        let outbox = seen.unwrap().outbox.unwrap();
        assert_eq!((outbox.status.as_str(), outbox.attempts), ("FAILED", 3), "the state stays visible");
        assert!(!outbox.last_error.is_empty(), "that publishing failed stays visible");
        for internal in ["kafka-3", "relay-7", "alice", "INC-1234"] {
            assert!(!format!("{outbox:?}").contains(internal), "a tenant saw {internal:?}: {outbox:?}");
        }
    }

    let operators = admin.get_event_timeline(with_token(timeline(), &ops)).await.unwrap().into_inner();
    let outbox = operators.timeline.unwrap().outbox.unwrap();
    assert!(outbox.lease_owner.starts_with("relay-7") && outbox.last_error.contains("kafka-3"));
    assert_eq!(outbox.last_redriven_by, "alice");
    app.stop().await;
}

async fn out_of_range_windows_are_invalid_arguments_naming_the_field(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let mut admin = app.admin.clone();
    let huge = Some(prost_types::Duration { seconds: 10_000_000_000_000, nanos: 0 });

    let backlog = pb::ListBacklogRequest { older_than: huge, ..Default::default() };
    let refused = admin.list_backlog(backlog).await.unwrap_err();
    assert_eq!((refused.code(), reason(&refused).as_str()), (Code::InvalidArgument, "INVALID_REQUEST"));
    assert_eq!(violated_fields(&refused), ["older_than"]);

    let purge =
        pb::PurgeRequest { outbox_older_than: huge, reason: "retention".into(), ..Default::default() };
    let refused = admin.purge(purge).await.unwrap_err();
    assert_eq!((refused.code(), reason(&refused).as_str()), (Code::InvalidArgument, "INVALID_REQUEST"));
    assert_eq!(violated_fields(&refused), ["outbox_older_than"]);

    // A hundred years is still a window.
    let century = Some(prost_types::Duration { seconds: 100 * 365 * 24 * 3600, nanos: 0 });
    admin.list_backlog(pb::ListBacklogRequest { older_than: century, ..Default::default() }).await.unwrap();
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_id_in_use_is_refused_in_the_same_words_whichever_tenant_holds_it() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |_| {}).await;
    let (seven, eight) = (tenant(&pki, 7), tenant(&pki, 8));
    let event_id = uuid::Uuid::now_v7().to_string();
    let with_event =
        |request_id: &str| pb::SubmitOrderRequest { event_id: event_id.clone(), ..order(0, request_id) };
    let mut orders = app.client.clone();
    orders.submit_order(with_token(with_event("first"), &seven)).await.unwrap();

    let own = orders.submit_order(with_token(with_event("second"), &seven)).await.unwrap_err();
    let others = orders.submit_order(with_token(with_event("second"), &eight)).await.unwrap_err();
    for refused in [&own, &others] {
        assert_eq!((refused.code(), reason(refused).as_str()), (Code::AlreadyExists, "EVENT_ID_IN_USE"));
        assert!(!refused.message().contains("another order"), "{refused:?}");
    }
    assert_eq!(own.message(), others.message());
    assert_eq!(app.count("orders").await, 1);
    app.stop().await;
}

/// Refusals are counted per reason in `idempost.calls.refused` (and logged at DEBUG only, with a
/// WARN a minute at most per reason: unit-tested in src/security/refusals.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_calls_are_counted_per_reason() {
    let (endpoint, received, _receiver) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let mut args = vec![
        format!("--database-url={}", db.url),
        "--listen=127.0.0.1:0".to_owned(),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ];
    args.extend(jwt_flags(&pki));
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned())];
    let (mut service, bound) = TestService::spawn_listening("idempost-order", &args, &env).await;
    let (port, admin_port) = (bound.port("listen"), bound.port("admin-listen"));
    let mut orders = connect_order_service(&format!("http://127.0.0.1:{port}")).await;
    let seven = tenant(&pki, 7);

    for i in 0..3 {
        orders.submit_order(order(7, &format!("no-token-{i}"))).await.unwrap_err();
    }
    orders.submit_order(with_token(order(8, "not-mine"), &seven)).await.unwrap_err();
    let mut admin =
        pb::admin_service_client::AdminServiceClient::connect(format!("http://127.0.0.1:{admin_port}"))
            .await
            .unwrap();
    for _ in 0..2 {
        admin.list_backlog(with_token(pb::ListBacklogRequest::default(), &seven)).await.unwrap_err();
    }

    let counted = |reason: &str, value: f64| {
        received.points().iter().any(|p| {
            p.name == "idempost.calls.refused"
                && p.attributes.get("reason").map(String::as_str) == Some(reason)
                && p.value == value
        })
    };
    assert_eventually("each reason is counted", Duration::from_secs(30), || async {
        counted("TOKEN_MISSING", 3.0) && counted("TENANT_MISMATCH", 1.0) && counted("SCOPE_MISSING", 2.0)
    })
    .await;
    service.signal("TERM").await;
    assert!(service.wait(Duration::from_secs(20)).await.success());
}
