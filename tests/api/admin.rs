//! The AdminService, the consumer's ConsumerAdminService and `idempostctl` against real
//! databases: every state of an event by its id, joined from the order side and the consumer side
//! (also when the consumer has a database of its own), the backlog, the audited redrive, and
//! retention purges on both sides that never remove a row still needed.

use std::time::Duration;

use chrono::Utc;
use idempost_proto::v1::{self as pb, consumer_admin_service_client::ConsumerAdminServiceClient};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, Value};
use tonic::Code;
use tonic::transport::Channel;

use crate::broker::TestBroker;
use crate::helpers::{
    Backend, InProcess, TestDb, TestOrder, assert_eventually, on_every_backend, order, reason,
    service_binary, violated_fields,
};

use idempost_testkit::wait::WAIT;
const DAY: Duration = Duration::from_secs(24 * 3600);

/// Runs `sql`, written with `?` placeholders, on the order service's database.
async fn exec(app: &TestOrder, sql: &str, values: Vec<Value>) {
    exec_on(&app.conn, sql, values).await;
}

/// Runs `sql`, written with `?` placeholders, on any backend.
async fn exec_on(conn: &DatabaseConnection, sql: &str, values: Vec<Value>) {
    let statement = idempost_testkit::sql::statement(conn.get_database_backend(), sql, values);
    conn.execute_raw(statement).await.unwrap();
}

/// A consumer running in this process over `database_url`, with a client of its
/// ConsumerAdminService.
struct ConsumerSide {
    port: u16,
    admin: ConsumerAdminServiceClient<Channel>,
    service: InProcess,
}

impl ConsumerSide {
    async fn start(
        database_url: &str,
        broker: &TestBroker,
        topic: &str,
        adjust: impl FnOnce(&mut idempost_consumer::Settings),
    ) -> Self {
        let mut settings = idempost_consumer::Settings::new(database_url, broker.address());
        settings.kafka.topic = topic.to_owned();
        settings.group_id = Some(format!("admin-{topic}"));
        settings.shutdown_grace = Duration::from_secs(5);
        adjust(&mut settings);
        let consumer = idempost_consumer::Application::build(settings).await.unwrap();
        let port = consumer.port();
        let service = InProcess::spawn(|shutdown| consumer.run_until_stopped(shutdown));
        let admin = ConsumerAdminServiceClient::connect(format!("http://127.0.0.1:{port}")).await.unwrap();
        Self { port, admin, service }
    }

    async fn timeline(&self, event_id: &str) -> pb::ConsumerTimeline {
        let request = pb::GetConsumerTimelineRequest { event_id: event_id.to_owned() };
        self.admin.clone().get_consumer_timeline(request).await.unwrap().into_inner().timeline.unwrap()
    }

    async fn purge(
        &self,
        request: pb::PurgeConsumedRequest,
    ) -> Result<pb::PurgeConsumedResponse, tonic::Status> {
        self.admin.clone().purge_consumed(request).await.map(tonic::Response::into_inner)
    }

    /// `idempostctl` flags for the order service of `app` and this consumer.
    fn ctl_urls(&self, app: &TestOrder) -> [String; 2] {
        [
            format!("--admin-url=http://127.0.0.1:{}", app.admin_port),
            format!("--consumer-admin-url=http://127.0.0.1:{}", self.port),
        ]
    }

    async fn stop(self) {
        self.service.stop().await;
    }
}

fn topic() -> String {
    idempost_testkit::topic::unique("idempost-admin")
}

fn ago(age: Duration) -> chrono::DateTime<Utc> {
    Utc::now() - chrono::Duration::from_std(age).unwrap()
}

async fn timeline(app: &TestOrder, event_id: &str) -> Result<pb::EventTimeline, tonic::Status> {
    let request = pb::GetEventTimelineRequest { event_id: event_id.to_owned() };
    app.admin.clone().get_event_timeline(request).await.map(|r| r.into_inner().timeline.unwrap())
}

async fn backlog(
    app: &TestOrder,
    request: pb::ListBacklogRequest,
) -> Result<pb::ListBacklogResponse, tonic::Status> {
    app.admin.clone().list_backlog(request).await.map(tonic::Response::into_inner)
}

async fn redrive(
    app: &TestOrder,
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

async fn purge(app: &TestOrder, request: pb::PurgeRequest) -> Result<pb::PurgeResponse, tonic::Status> {
    app.admin.clone().purge(request).await.map(tonic::Response::into_inner)
}

/// The order side's audit rows of `action`, newest first, as (actor, reason, event id).
async fn audit(app: &TestOrder, action: &str) -> Vec<(String, String, String)> {
    let request = pb::ListAuditRequest { action: action.to_owned(), ..Default::default() };
    let rows = app.admin.clone().list_audit(request).await.unwrap().into_inner().records;
    rows.into_iter().map(|r| (r.actor, r.reason, r.event_id)).collect()
}

on_every_backend!(
    the_timeline_follows_an_event_from_its_order_to_its_effect,
    the_backlog_lists_one_status_oldest_first_with_the_counts_that_need_attention,
    a_held_back_change_is_listed_and_aged_in_its_place_among_the_pending,
    redrive_returns_only_a_failed_event_to_pending_and_records_who_and_why,
    purge_deletes_only_published_rows_past_retention_and_keeps_dedup_history_for_the_horizon,
);

async fn the_timeline_follows_an_event_from_its_order_to_its_effect(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(11, "timeline-1")).await.unwrap();
    // A second version of the order: the timeline of either event lists both, each with its state.
    let amend = idempost_testkit::order::amend("timeline-amend-1", accepted.order_id, 1, 3);
    let amended = app.amend(pb::AmendOrderRequest { tenant_id: 11, ..amend }).await.unwrap();

    // Before the relay runs: the order and a PENDING row, nothing consumed.
    let pending = timeline(&app, &accepted.event_id).await.unwrap();
    assert_eq!(pending.order.as_ref().unwrap().order_id, accepted.order_id);
    assert_eq!(pending.outbox.as_ref().unwrap().status, "PENDING");

    // The consumer shares the order service's database here (the default deployment); its
    // records still come from its own ConsumerAdminService, never from the AdminService.
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let consumer = ConsumerSide::start(&app.db.url, &broker, &topic, |_| {}).await;
    let nothing = consumer.timeline(&accepted.event_id).await;
    assert!(nothing.consumers.is_empty() && nothing.notification_jobs.is_empty());
    let relay = start_relay(&app, &broker, &topic).await;
    assert_eventually("both events of the order have their effect", WAIT, || async {
        !consumer.timeline(&accepted.event_id).await.notification_jobs.is_empty()
            && !consumer.timeline(&amended.event_id).await.notification_jobs.is_empty()
    })
    .await;
    relay.stop().await;

    let done = timeline(&app, &accepted.event_id).await.unwrap();
    let order = done.order.as_ref().unwrap();
    assert_eq!((order.tenant_id, order.request_id.as_str(), order.version), (11, "timeline-1", 2));
    let outbox = done.outbox.as_ref().unwrap();
    assert_eq!(outbox.status, "PUBLISHED");
    assert!(outbox.published_at.is_some() && outbox.lease_owner.is_empty());
    let at = outbox.published_to.as_ref().expect("the broker's coordinates are recorded");
    assert_eq!((at.topic.as_str(), at.partition), (topic.as_str(), 0));
    #[allow(deprecated)]
    let consumer_parts = (&done.consumers, &done.notification_job, &done.dead_letters);
    assert!(
        consumer_parts.0.is_empty() && consumer_parts.1.is_none() && consumer_parts.2.is_empty(),
        "the AdminService reads the order database only"
    );
    let consumed = consumer.timeline(&accepted.event_id).await;
    assert_eq!(consumed.consumers.len(), 1);
    assert!(consumed.consumers[0].consumed_at.is_some());
    assert_eq!(consumed.notification_jobs[0].order_id, accepted.order_id);
    assert!(consumed.dead_letters.is_empty());

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

    // And idempostctl joins both sides, as JSON for scripts and as a table for people.
    let [url, consumer_url] = consumer.ctl_urls(&app);
    let json = idempostctl(&[&url, &consumer_url, "--json", "timeline", &accepted.event_id]).await;
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["outbox"]["status"], "PUBLISHED");
    assert_eq!(json["order"]["orderId"], accepted.order_id);
    assert_eq!(json["consumers"].as_array().unwrap().len(), 1);
    assert_eq!(json["notificationJob"]["orderId"], accepted.order_id);
    assert!(json["consumerSideUnavailable"].is_null());
    // Every version of the order, with its event's state on both sides.
    let applied = format!("applied by {}", idempost_consumer::DEFAULT_CONSUMER_NAME);
    let versions: Vec<_> = json["orderEvents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["version"].as_i64(),
                e["eventId"].as_str(),
                e["outboxStatus"].as_str(),
                e["consumerState"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        versions,
        [
            (Some(1), Some(accepted.event_id.as_str()), Some("PUBLISHED"), Some(applied.as_str())),
            (Some(2), Some(amended.event_id.as_str()), Some("PUBLISHED"), Some(applied.as_str())),
        ]
    );
    let table = idempostctl(&[&url, &consumer_url, "find", "11", "timeline-1"]).await;
    assert!(table.ok && table.stdout.contains(&accepted.event_id) && table.stdout.contains("PUBLISHED"));
    assert!(table.stdout.contains("notification job"), "{}", table.stdout);
    let rows: Vec<_> = table.stdout.lines().filter(|l| l.contains(&applied)).collect();
    assert!(
        rows.len() == 2 && rows[0].contains(&accepted.event_id) && rows[1].contains(&amended.event_id),
        "every version's row says the consumer applied it:\n{}",
        table.stdout
    );
    consumer.stop().await;

    // With the consumer gone, the order side is shown alone, saying so.
    let alone = idempostctl(&[&url, &consumer_url, "timeline", &accepted.event_id]).await;
    assert!(alone.ok && alone.stdout.contains("PUBLISHED"), "{}", alone.stderr);
    assert!(alone.stdout.contains("consumer side") && !alone.stdout.contains("notification job"));

    // Unknown and malformed ids get their own answers.
    let unknown = timeline(&app, &uuid::Uuid::now_v7().to_string()).await.unwrap_err();
    assert_eq!((unknown.code(), reason(&unknown).as_str()), (Code::NotFound, "EVENT_NOT_FOUND"));
    let malformed = timeline(&app, "not-an-id").await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&malformed), ["event_id"]);
    let missing = idempostctl(&[&url, "find", "11", "no-such-request"]).await;
    assert!(!missing.ok && missing.stderr.contains("ORDER_NOT_FOUND"), "{}", missing.stderr);
    app.stop().await;
}

/// A change written while its order's previous version was unpublished waits `held_back`; the
/// backlog reads the two kinds of PENDING row as separate ranges of one index, and still lists
/// and ages them as one, oldest first.
async fn a_held_back_change_is_listed_and_aged_in_its_place_among_the_pending(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(12, "held-accepted")).await.unwrap();
    let amend = idempost_testkit::order::amend("held-amend", accepted.order_id, 1, 3);
    let amended = app.amend(pb::AmendOrderRequest { tenant_id: 12, ..amend }).await.unwrap();
    let other = app.submit(order(12, "held-other")).await.unwrap().event_id;
    let held = app
        .conn
        .query_one_raw(idempost_testkit::sql::statement(
            app.conn.get_database_backend(),
            "SELECT held_back FROM outbox_event WHERE event_id = ?",
            vec![amended.event_id.clone().into()],
        ))
        .await
        .unwrap()
        .unwrap();
    assert!(held.try_get_by_index::<bool>(0).unwrap(), "the amendment waits behind version 1");

    let listed = |limit| backlog(&app, pb::ListBacklogRequest { limit, ..Default::default() });
    let ids = |response: pb::ListBacklogResponse| -> Vec<String> {
        response.entries.into_iter().map(|e| e.event_id).collect()
    };
    assert_eq!(ids(listed(2).await.unwrap()), [accepted.event_id.clone(), amended.event_id.clone()]);
    assert_eq!(ids(listed(3).await.unwrap()), [accepted.event_id.clone(), amended.event_id.clone(), other]);

    // The held-back row made the oldest waiting one: it leads the listing and ages the backlog.
    exec(
        &app,
        "UPDATE outbox_event SET created_at = ? WHERE event_id = ?",
        vec![ago(Duration::from_secs(2 * 3600)).into(), amended.event_id.clone().into()],
    )
    .await;
    let response = listed(1).await.unwrap();
    let age = response.stats.as_ref().unwrap().oldest_pending_age.unwrap();
    assert!(age.seconds >= 2 * 3600 - 60, "the oldest waiting row is the held-back one: {age:?}");
    assert_eq!(ids(response), std::slice::from_ref(&amended.event_id));
    let hour = prost_types::Duration { seconds: 3600, nanos: 0 };
    let old =
        backlog(&app, pb::ListBacklogRequest { older_than: Some(hour), ..Default::default() }).await.unwrap();
    assert_eq!(ids(old), [amended.event_id]);
    app.stop().await;
}

async fn start_relay(app: &TestOrder, broker: &TestBroker, topic: &str) -> InProcess {
    let mut relay_settings = idempost_relay::Settings::new(&app.db.url, broker.address());
    relay_settings.kafka.topic = topic.to_owned();
    relay_settings.max_idle_poll = Duration::from_millis(100);
    let relay = idempost_relay::Application::build(relay_settings).await.unwrap();
    InProcess::spawn(|shutdown| relay.run_until_stopped(shutdown))
}

async fn the_backlog_lists_one_status_oldest_first_with_the_counts_that_need_attention(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
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
    assert_eq!((stats.pending, stats.publishing, stats.failed), (2, 0, 1));
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
    let table = idempostctl(&[&url, "backlog"]).await;
    assert!(
        table.ok && table.stdout.contains(&ids[0]) && table.stdout.contains("pending 2"),
        "{}",
        table.stdout
    );
    app.stop().await;
}

async fn redrive_returns_only_a_failed_event_to_pending_and_records_who_and_why(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
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
    let refused = idempostctl(&[&url, "redrive", &leased, "--reason=just because", "--by=bob"]).await;
    assert!(!refused.ok && refused.stderr.contains("NOT_FAILED"), "{}", refused.stderr);
    let lease = timeline(&app, &leased).await.unwrap().outbox.unwrap();
    assert_eq!(
        (lease.status.as_str(), lease.lease_owner.as_str(), lease.redrive_count),
        ("PUBLISHING", "relay-a", 0)
    );
    let record = timeline(&app, &failed).await.unwrap().outbox.unwrap();
    assert_eq!((record.status.as_str(), record.redrive_count), ("PENDING", 1));

    // It fails again and is redriven again: the row keeps the last redrive, the audit both.
    exec(&app, "UPDATE outbox_event SET status = 'FAILED' WHERE event_id = ?", vec![failed.clone().into()])
        .await;
    let twice = redrive(&app, &failed, "carol", "broker quota raised").await.unwrap();
    assert_eq!((twice.redrive_count, twice.last_redrive_reason.as_str()), (2, "broker quota raised"));
    let who = |by: &str, why: &str| (by.to_owned(), why.to_owned(), failed.clone());
    assert_eq!(
        audit(&app, "REDRIVE").await,
        [who("carol", "broker quota raised"), who("alice", "topic ACL fixed")],
        "one audit row per redrive, newest first; refused redrives leave none"
    );
    app.stop().await;
}

async fn purge_deletes_only_published_rows_past_retention_and_keeps_dedup_history_for_the_horizon(
    backend: Backend,
) {
    // Published rows kept 1 hour on the order side; on the consumer side (here on the same
    // database) a horizon of 14 days (broker retention plus replay window) and dedup rows kept 30
    // days. Two rows per batch on both sides, so each purge needs several batches.
    let app = TestOrder::spawn_with(backend, |s| {
        s.outbox_retention = Duration::from_secs(3600);
        s.purge_batch_size = 2;
        s.purge_every = Duration::ZERO;
    })
    .await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let consumer = ConsumerSide::start(&app.db.url, &broker, &topic, |s| {
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
    let refused = consumer
        .purge(pb::PurgeConsumedRequest { consumed_older_than: Some(week), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(
        (refused.code(), reason(&refused).as_str()),
        (Code::FailedPrecondition, "RETENTION_BELOW_HORIZON")
    );
    assert_eq!(app.count("consumed_event").await, 3);
    // The order side leaves the consumer's rows to the consumer, and says so.
    #[allow(deprecated)]
    let elsewhere = pb::PurgeRequest {
        consumed_older_than: Some(week),
        reason: "dedup too".into(),
        ..Default::default()
    };
    let elsewhere = purge(&app, elsewhere).await.unwrap_err();
    assert_eq!(elsewhere.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&elsewhere), ["consumed_older_than"]);

    // A purge needs a reason, in a dry run too.
    let unexplained =
        purge(&app, pb::PurgeRequest { dry_run: true, ..Default::default() }).await.unwrap_err();
    assert_eq!(unexplained.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&unexplained), ["reason"]);
    let dry = pb::PurgeRequest { dry_run: true, reason: "counting first".into(), ..Default::default() };
    let dry = purge(&app, dry).await.unwrap();
    assert_eq!(dry.outbox_rows, 5);
    assert!(audit(&app, "PURGE").await.is_empty(), "a dry run writes no audit row");
    let dry = consumer.purge(pb::PurgeConsumedRequest { dry_run: true, ..Default::default() }).await.unwrap();
    assert_eq!(dry.consumed_rows, 1);
    assert_eq!(dry.redelivery_horizon.map(|h| h.seconds), Some(14 * 24 * 3600));
    assert_eq!((app.count("outbox_event").await, app.count("consumed_event").await), (9, 3));

    let [url, consumer_url] = consumer.ctl_urls(&app);
    let unexplained = idempostctl(&[&url, &consumer_url, "purge"]).await;
    assert!(!unexplained.ok && unexplained.stderr.contains("--reason"), "{}", unexplained.stderr);
    let done =
        idempostctl(&[&url, &consumer_url, "--json", "purge", "--reason=retention review (ticket 7)"]).await;
    assert!(done.ok, "{}", done.stderr);
    let done: serde_json::Value = serde_json::from_str(&done.stdout).unwrap();
    assert_eq!((done["outboxRows"].as_u64(), done["consumedRows"].as_u64()), (Some(5), Some(1)));
    // Both sides audited it (here in one database, each side's row of its own action).
    let why = "retention review (ticket 7)".to_owned();
    assert_eq!(
        audit(&app, "PURGE").await,
        [("unauthenticated (--auth none)".to_owned(), why.clone(), String::new())]
    );
    let shown = idempostctl(&[&consumer_url, "audit", "--consumer", "--action=PURGE_CONSUMED"]).await;
    assert!(shown.ok, "{}", shown.stderr);
    assert!(
        shown.stdout.contains("PURGE_CONSUMED")
            && shown.stdout.contains(&why)
            && shown.stdout.contains("1 eligible"),
        "{}",
        shown.stdout
    );

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
    assert_eq!(consumer.timeline(&ids[1]).await.consumers.len(), 1);
    assert!(consumer.timeline(&ids[0]).await.consumers.is_empty());
    // Orders are the business record and are never purged.
    assert_eq!(app.count("orders").await, 9);
    consumer.stop().await;
    app.stop().await;
}

on_every_backend!(a_consumer_on_its_own_database_answers_for_its_tables_and_idempostctl_joins_both_sides);

/// The consumer has a database of its own: the order side knows nothing of the consumer's
/// tables, the consumer serves them, and `idempostctl` still shows one timeline and purges both.
async fn a_consumer_on_its_own_database_answers_for_its_tables_and_idempostctl_joins_both_sides(
    backend: Backend,
) {
    let app = TestOrder::spawn_with(backend, |s| s.purge_every = Duration::ZERO).await;
    let own = TestDb::migrated(backend).await;
    assert_ne!(own.url, app.db.url);
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let consumer = ConsumerSide::start(&own.url, &broker, &topic, |s| {
        s.redelivery_horizon = Duration::from_secs(3600);
        s.consumed_retention = Duration::from_secs(2 * 3600);
        s.purge_every = Duration::ZERO;
    })
    .await;
    let relay = start_relay(&app, &broker, &topic).await;
    let accepted = app.submit(order(15, "own-db-1")).await.unwrap();
    assert_eventually("the event has its effect in the consumer's database", WAIT, || async {
        !consumer.timeline(&accepted.event_id).await.notification_jobs.is_empty()
    })
    .await;
    relay.stop().await;

    // Each side's tables hold only that side's rows.
    let own_conn = own.connect().await;
    let count = |table: &'static str| {
        let conn = &own_conn;
        async move {
            let sql = format!("SELECT COUNT(*) FROM {table}");
            let row = conn.query_one_raw(Statement::from_string(conn.get_database_backend(), sql)).await;
            row.unwrap().unwrap().try_get_by_index::<i64>(0).unwrap()
        }
    };
    assert_eq!((count("consumed_event").await, count("notification_job").await), (1, 1));
    assert_eq!((count("orders").await, count("outbox_event").await), (0, 0));
    assert_eq!((app.count("consumed_event").await, app.count("notification_job").await), (0, 0));

    // idempostctl joins the order side's order and outbox row with the consumer side's records.
    let [url, consumer_url] = consumer.ctl_urls(&app);
    let joined = idempostctl(&[&url, &consumer_url, "--json", "timeline", &accepted.event_id]).await;
    assert!(joined.ok, "{}", joined.stderr);
    let joined: serde_json::Value = serde_json::from_str(&joined.stdout).unwrap();
    assert_eq!(joined["eventId"], accepted.event_id.as_str());
    assert_eq!(joined["order"]["orderId"], accepted.order_id);
    assert_eq!(joined["outbox"]["status"], "PUBLISHED");
    assert_eq!(joined["consumers"][0]["consumerName"], idempost_consumer::DEFAULT_CONSUMER_NAME);
    assert_eq!(joined["notificationJobs"][0]["orderId"], accepted.order_id);

    // A dead letter exists only in the consumer's database, and still shows on its event.
    let dead_event = uuid::Uuid::now_v7().to_string();
    exec_on(
        &own_conn,
        "INSERT INTO dead_letter (consumer_name, topic, partition_id, offset_id, payload, event_id, error, created_at) \
         VALUES ('notification-planner', ?, 0, 99, ?, ?, 'cannot decode', ?)",
        vec![topic.clone().into(), b"junk".to_vec().into(), dead_event.clone().into(), Utc::now().into()],
    )
    .await;
    let dead = idempostctl(&[&url, &consumer_url, "--json", "timeline", &dead_event]).await;
    assert!(dead.ok, "{}", dead.stderr);
    let dead: serde_json::Value = serde_json::from_str(&dead.stdout).unwrap();
    assert!(dead["order"].is_null() && dead["outbox"].is_null());
    assert_eq!(dead["deadLetters"][0]["error"], "cannot decode");
    let listed = idempostctl(&[&url, &consumer_url, "dead-letters"]).await;
    assert!(listed.ok && listed.stdout.contains(&dead_event), "{}", listed.stdout);
    let unknown = idempostctl(&[&url, &consumer_url, "timeline", &uuid::Uuid::now_v7().to_string()]).await;
    assert!(!unknown.ok && unknown.stderr.contains("EVENT_NOT_FOUND"), "{}", unknown.stderr);

    // The purge reaches the consumer's own database: a dedup row past its retention goes, the
    // fresh one stays, and the order side (nothing published long enough ago) deletes nothing.
    exec_on(
        &own_conn,
        "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES ('notify', ?, ?)",
        vec![uuid::Uuid::now_v7().to_string().into(), ago(Duration::from_secs(3 * 3600)).into()],
    )
    .await;
    let purged = idempostctl(&[&url, &consumer_url, "--json", "purge", "--reason=retention"]).await;
    assert!(purged.ok, "{}", purged.stderr);
    let purged: serde_json::Value = serde_json::from_str(&purged.stdout).unwrap();
    assert_eq!((purged["outboxRows"].as_u64(), purged["consumedRows"].as_u64()), (Some(0), Some(1)));
    assert_eq!(count("consumed_event").await, 1);
    assert_eq!(consumer.timeline(&accepted.event_id).await.consumers.len(), 1, "the fresh row stays");
    consumer.stop().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_configured_to_forget_dedup_history_inside_the_horizon_does_not_start() {
    let db = TestDb::migrated(Backend::Sqlite).await;
    let mut settings = idempost_consumer::Settings::new(&db.url, TestBroker::reserve().address());
    settings.consumed_retention = 7 * DAY;
    settings.redelivery_horizon = 14 * DAY;
    let error = idempost_consumer::Application::build(settings).await.unwrap_err();
    assert!(error.to_string().contains("shorter than the redelivery horizon"), "{error}");
}

struct Ctl {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn idempostctl(args: &[&str]) -> Ctl {
    let output =
        tokio::process::Command::new(service_binary("idempostctl")).args(args).output().await.unwrap();
    Ctl {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
