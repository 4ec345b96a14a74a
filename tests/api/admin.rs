//! The AdminService and `outpostctl` against real databases: every state of an event by its id,
//! the backlog, the audited redrive, and a retention purge that never removes a row still needed.

use std::time::Duration;

use chrono::Utc;
use outpost::proto::v1 as pb;
use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};
use tonic::Code;

use crate::broker::TestBroker;
use crate::helpers::{
    Backend, InProcess, TestApp, assert_eventually, on_every_backend, order, reason, service_binary,
    violated_fields,
};

const WAIT: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// Runs `sql`, written with `?` placeholders, on any backend.
async fn exec(app: &TestApp, sql: &str, values: Vec<Value>) {
    let backend = app.conn.get_database_backend();
    let sql = if backend == DbBackend::Postgres {
        let mut n = 0;
        sql.chars()
            .map(|c| {
                if c == '?' {
                    n += 1;
                    format!("${n}")
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        sql.to_owned()
    };
    app.conn.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.unwrap();
}

fn ago(age: Duration) -> chrono::DateTime<Utc> {
    Utc::now() - chrono::Duration::from_std(age).unwrap()
}

async fn timeline(app: &TestApp, event_id: &str) -> Result<pb::EventTimeline, tonic::Status> {
    let request = pb::GetEventTimelineRequest { event_id: event_id.to_owned() };
    app.admin.clone().get_event_timeline(request).await.map(|r| r.into_inner().timeline.unwrap())
}

async fn backlog(
    app: &TestApp,
    request: pb::ListBacklogRequest,
) -> Result<pb::ListBacklogResponse, tonic::Status> {
    app.admin.clone().list_backlog(request).await.map(tonic::Response::into_inner)
}

async fn redrive(
    app: &TestApp,
    event_id: &str,
    by: &str,
    why: &str,
) -> Result<pb::OutboxRecord, tonic::Status> {
    let request = pb::RedriveRequest {
        event_id: event_id.to_owned(),
        requested_by: by.to_owned(),
        reason: why.to_owned(),
    };
    app.admin.clone().redrive(request).await.map(|r| r.into_inner().outbox.unwrap())
}

async fn purge(app: &TestApp, request: pb::PurgeRequest) -> Result<pb::PurgeResponse, tonic::Status> {
    app.admin.clone().purge(request).await.map(tonic::Response::into_inner)
}

on_every_backend!(
    the_timeline_follows_an_event_from_its_order_to_its_effect,
    the_backlog_lists_one_status_oldest_first_with_counts_for_every_status,
    redrive_returns_only_a_failed_event_to_pending_and_records_who_and_why,
    purge_deletes_only_published_rows_past_retention_and_keeps_dedup_history_for_the_horizon,
);

async fn the_timeline_follows_an_event_from_its_order_to_its_effect(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let accepted = app.submit(order(11, "timeline-1")).await.unwrap();

    // Before the relay runs: the order and a PENDING row, nothing consumed.
    let pending = timeline(&app, &accepted.event_id).await.unwrap();
    assert_eq!(pending.order.as_ref().unwrap().order_id, accepted.order_id);
    assert_eq!(pending.outbox.as_ref().unwrap().status, "PENDING");
    assert!(pending.consumers.is_empty() && pending.notification_job.is_none());

    let broker = TestBroker::start().await;
    let topic = format!("outpost-admin-{}", uuid::Uuid::new_v4().simple());
    broker.create_topic(&topic, 1).await;
    let mut relay_settings = outpost::relay::Settings::new(&app.db.url, broker.address());
    relay_settings.topic = topic.clone();
    relay_settings.max_idle_poll = Duration::from_millis(100);
    let relay = outpost::relay::Application::build(relay_settings).await.unwrap();
    let relay = InProcess::spawn(|shutdown| relay.run_until_stopped(shutdown));
    let mut consumer_settings = outpost::consumer::Settings::new(&app.db.url, broker.address());
    consumer_settings.topic = topic.clone();
    consumer_settings.group_id = Some(format!("admin-{topic}"));
    consumer_settings.shutdown_grace = Duration::from_secs(5);
    let consumer = outpost::consumer::Application::build(consumer_settings).await.unwrap();
    let consumer = InProcess::spawn(|shutdown| consumer.run_until_stopped(shutdown));
    assert_eventually("the event has its effect", WAIT, || async {
        timeline(&app, &accepted.event_id).await.unwrap().notification_job.is_some()
    })
    .await;
    consumer.stop().await;
    relay.stop().await;

    let done = timeline(&app, &accepted.event_id).await.unwrap();
    let order = done.order.as_ref().unwrap();
    assert_eq!((order.tenant_id, order.request_id.as_str(), order.version), (11, "timeline-1", 1));
    let outbox = done.outbox.as_ref().unwrap();
    assert_eq!(outbox.status, "PUBLISHED");
    assert!(outbox.published_at.is_some() && outbox.lease_owner.is_empty());
    let at = outbox.published_to.as_ref().expect("the broker's coordinates are recorded");
    assert_eq!((at.topic.as_str(), at.partition), (topic.as_str(), 0));
    assert_eq!(done.consumers.len(), 1);
    assert!(done.consumers[0].consumed_at.is_some());
    assert_eq!(done.notification_job.as_ref().unwrap().order_id, accepted.order_id);
    assert!(done.dead_letters.is_empty());

    // The business key leads to the same timeline.
    let found = app
        .admin
        .clone()
        .find_by_business_key(pb::FindByBusinessKeyRequest { tenant_id: 11, request_id: "timeline-1".into() })
        .await
        .unwrap()
        .into_inner()
        .timeline
        .unwrap();
    assert_eq!(found, done);

    // And outpostctl shows it, as JSON for scripts and as a table for people.
    let url = format!("--admin-url=http://127.0.0.1:{}", app.admin_port);
    let json = outpostctl(&[&url, "--json", "timeline", &accepted.event_id]).await;
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["outbox"]["status"], "PUBLISHED");
    assert_eq!(json["order"]["orderId"], accepted.order_id);
    assert_eq!(json["consumers"].as_array().unwrap().len(), 1);
    let table = outpostctl(&[&url, "find", "11", "timeline-1"]).await;
    assert!(table.ok && table.stdout.contains(&accepted.event_id) && table.stdout.contains("PUBLISHED"));

    // Unknown and malformed ids get their own answers.
    let unknown = timeline(&app, &uuid::Uuid::now_v7().to_string()).await.unwrap_err();
    assert_eq!((unknown.code(), reason(&unknown).as_str()), (Code::NotFound, "EVENT_NOT_FOUND"));
    let malformed = timeline(&app, "not-an-id").await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&malformed), ["event_id"]);
    let missing = outpostctl(&[&url, "find", "11", "no-such-request"]).await;
    assert!(!missing.ok && missing.stderr.contains("ORDER_NOT_FOUND"), "{}", missing.stderr);
    app.stop().await;
}

async fn the_backlog_lists_one_status_oldest_first_with_counts_for_every_status(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(app.submit(order(12, &format!("backlog-{i}"))).await.unwrap().event_id);
    }
    exec(
        &app,
        "UPDATE outbox_event SET status = 'FAILED', attempts = 10 WHERE event_id = ?",
        vec![ids[2].clone().into()],
    )
    .await;

    let listed = backlog(&app, pb::ListBacklogRequest { limit: 1, ..Default::default() }).await.unwrap();
    assert_eq!(listed.entries.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>(), [ids[0].as_str()]);
    let stats = listed.stats.unwrap();
    assert_eq!((stats.pending, stats.publishing, stats.published, stats.failed), (2, 0, 0, 1));
    assert!(stats.oldest_pending_age.is_some());

    let failed = backlog(&app, pb::ListBacklogRequest { status: "FAILED".into(), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(failed.entries.len(), 1);
    assert_eq!(failed.entries[0].outbox.as_ref().unwrap().attempts, 10);
    let hour = prost_types::Duration { seconds: 3600, nanos: 0 };
    let old =
        backlog(&app, pb::ListBacklogRequest { older_than: Some(hour), ..Default::default() }).await.unwrap();
    assert!(old.entries.is_empty(), "nothing is an hour old");

    let invalid =
        backlog(&app, pb::ListBacklogRequest { status: "DONE".into(), limit: 5000, ..Default::default() })
            .await
            .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&invalid), ["status", "limit"]);

    let url = format!("--admin-url=http://127.0.0.1:{}", app.admin_port);
    let table = outpostctl(&[&url, "backlog"]).await;
    assert!(
        table.ok && table.stdout.contains(&ids[0]) && table.stdout.contains("pending 2"),
        "{}",
        table.stdout
    );
    app.stop().await;
}

async fn redrive_returns_only_a_failed_event_to_pending_and_records_who_and_why(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let failed = app.submit(order(13, "redrive-1")).await.unwrap().event_id;
    let leased = app.submit(order(13, "redrive-2")).await.unwrap().event_id;
    exec(
        &app,
        "UPDATE outbox_event SET status = 'FAILED', attempts = 10, last_error = 'broker said no' WHERE event_id = ?",
        vec![failed.clone().into()],
    )
    .await;
    exec(
        &app,
        "UPDATE outbox_event SET status = 'PUBLISHING', attempts = 1, lease_owner = 'relay-a', lease_until = ? WHERE event_id = ?",
        vec![(Utc::now() + chrono::Duration::minutes(5)).into(), leased.clone().into()],
    )
    .await;

    let unaudited = redrive(&app, &failed, "", " ").await.unwrap_err();
    assert_eq!(unaudited.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&unaudited), ["requested_by", "reason"]);

    let redriven = redrive(&app, &failed, "alice", "topic ACL fixed").await.unwrap();
    assert_eq!((redriven.status.as_str(), redriven.attempts, redriven.redrive_count), ("PENDING", 0, 1));
    assert_eq!(
        (redriven.last_redriven_by.as_str(), redriven.last_redrive_reason.as_str()),
        ("alice", "topic ACL fixed")
    );
    assert!(redriven.last_redriven_at.is_some());
    assert_eq!(redriven.last_error, "broker said no", "the last error stays for the record");

    // A second redrive, and a redrive of a leased event, change nothing.
    let again = redrive(&app, &failed, "alice", "again").await.unwrap_err();
    assert_eq!((again.code(), reason(&again).as_str()), (Code::FailedPrecondition, "NOT_FAILED"));
    let url = format!("--admin-url=http://127.0.0.1:{}", app.admin_port);
    let refused = outpostctl(&[&url, "redrive", &leased, "--reason=just because", "--by=bob"]).await;
    assert!(!refused.ok && refused.stderr.contains("NOT_FAILED"), "{}", refused.stderr);
    let lease = timeline(&app, &leased).await.unwrap().outbox.unwrap();
    assert_eq!(
        (lease.status.as_str(), lease.lease_owner.as_str(), lease.redrive_count),
        ("PUBLISHING", "relay-a", 0)
    );
    let record = timeline(&app, &failed).await.unwrap().outbox.unwrap();
    assert_eq!((record.status.as_str(), record.redrive_count), ("PENDING", 1));
    app.stop().await;
}

async fn purge_deletes_only_published_rows_past_retention_and_keeps_dedup_history_for_the_horizon(
    backend: Backend,
) {
    // A horizon of 14 days (broker retention plus replay window), dedup rows kept 30 days,
    // published rows 1 hour; two rows per batch, so the purge needs several batches.
    let app = TestApp::spawn_with(backend, |s| {
        s.outbox_retention = Duration::from_secs(3600);
        s.consumed_retention = 30 * DAY;
        s.redelivery_horizon = 14 * DAY;
        s.purge_batch_size = 2;
        s.purge_every = Duration::ZERO;
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..9 {
        ids.push(app.submit(order(14, &format!("purge-{i}"))).await.unwrap().event_id);
    }
    let old = ago(Duration::from_secs(2 * 3600));
    let published = "UPDATE outbox_event SET status = 'PUBLISHED', published_at = ? WHERE event_id = ?";
    for id in &ids[0..5] {
        exec(&app, published, vec![old.into(), id.clone().into()]).await;
    }
    exec(&app, published, vec![ago(Duration::from_secs(600)).into(), ids[5].clone().into()]).await;
    // Old rows that still need publishing are never purged, however old.
    let ancient = ago(100 * DAY);
    exec(
        &app,
        "UPDATE outbox_event SET status = 'FAILED', created_at = ? WHERE event_id = ?",
        vec![ancient.into(), ids[6].clone().into()],
    )
    .await;
    exec(
        &app,
        "UPDATE outbox_event SET created_at = ? WHERE event_id = ?",
        vec![ancient.into(), ids[7].clone().into()],
    )
    .await;
    exec(
        &app,
        "UPDATE outbox_event SET status = 'PUBLISHING', lease_owner = 'r', lease_until = ?, created_at = ? WHERE event_id = ?",
        vec![ancient.into(), ancient.into(), ids[8].clone().into()],
    )
    .await;
    // Dedup rows: past retention, inside retention but past the horizon, and fresh.
    let consumed = "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES (?, ?, ?)";
    exec(&app, consumed, vec!["notify".into(), ids[0].clone().into(), ago(40 * DAY).into()]).await;
    exec(&app, consumed, vec!["notify".into(), ids[1].clone().into(), ago(20 * DAY).into()]).await;
    exec(&app, consumed, vec!["notify".into(), ids[2].clone().into(), ago(DAY).into()]).await;

    // A window shorter than the horizon is refused and deletes nothing.
    let week = prost_types::Duration { seconds: 7 * 24 * 3600, nanos: 0 };
    let refused = purge(&app, pb::PurgeRequest { consumed_older_than: Some(week), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(
        (refused.code(), reason(&refused).as_str()),
        (Code::FailedPrecondition, "RETENTION_BELOW_HORIZON")
    );
    assert_eq!(app.count("consumed_event").await, 3);

    let dry = purge(&app, pb::PurgeRequest { dry_run: true, ..Default::default() }).await.unwrap();
    assert_eq!((dry.outbox_rows, dry.consumed_rows), (5, 1));
    assert_eq!(app.count("outbox_event").await, 9);

    let url = format!("--admin-url=http://127.0.0.1:{}", app.admin_port);
    let done = outpostctl(&[&url, "--json", "purge"]).await;
    assert!(done.ok, "{}", done.stderr);
    let done: serde_json::Value = serde_json::from_str(&done.stdout).unwrap();
    assert_eq!((done["outboxRows"].as_u64(), done["consumedRows"].as_u64()), (Some(5), Some(1)));

    let remaining: Vec<String> = futures::future::join_all(ids.iter().map(|id| timeline(&app, id)))
        .await
        .into_iter()
        .map(|t| t.unwrap().outbox.map_or("purged".to_owned(), |o| o.status))
        .collect();
    assert_eq!(
        remaining,
        ["purged", "purged", "purged", "purged", "purged", "PUBLISHED", "FAILED", "PENDING", "PUBLISHING"]
    );
    // The dedup row inside the horizon survives; only the one past retention went.
    assert_eq!(app.count("consumed_event").await, 2);
    assert_eq!(timeline(&app, &ids[1]).await.unwrap().consumers.len(), 1);
    assert!(timeline(&app, &ids[0]).await.unwrap().consumers.is_empty());
    // Orders are the business record and are never purged.
    assert_eq!(app.count("orders").await, 9);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_configured_to_forget_dedup_history_inside_the_horizon_does_not_start() {
    let db = crate::helpers::TestDb::migrated(Backend::Sqlite).await;
    let mut settings = outpost::order::Settings::for_database(&db.url);
    settings.consumed_retention = 7 * DAY;
    settings.redelivery_horizon = 14 * DAY;
    let error = outpost::order::Application::build(settings).await.unwrap_err();
    assert!(error.to_string().contains("shorter than the redelivery horizon"), "{error}");
}

struct Ctl {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn outpostctl(args: &[&str]) -> Ctl {
    let output =
        tokio::process::Command::new(service_binary("outpostctl")).args(args).output().await.unwrap();
    Ctl {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
