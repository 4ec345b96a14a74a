//! AdminService.Replay and `idempostctl replay` against real services: a time range replayed
//! into a new consumer name rebuilds its read model of exactly those orders, one order's
//! versions in order, while the consumer that applied them absorbs the copies as duplicates; a
//! dry run counts and changes nothing; operators only, audited, bounded.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use idempost_proto::v1 as pb;
use idempost_testkit::auth::{authenticated, operator, refusal, tenant, with_token};
use idempost_testkit::consumer::{TestConsumer, consumer_settings};
use idempost_testkit::ordering::{Expected, read_model};
use idempost_testkit::pipeline::Pipeline;
use idempost_testkit::wait::WAIT;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, Statement};
use tonic::Code;

use crate::broker::{TestBroker, read_topic};
use crate::helpers::{
    Backend, TestOrder, assert_eventually, on_every_backend, order, reason, service_binary, violated_fields,
};
use idempost_testkit::order::{amend, cancel};

const PARTITIONS: usize = 3;

/// The orders table as a read model must show it, for `ids`.
async fn orders_as_read_model(conn: &DatabaseConnection, ids: &[i64]) -> BTreeMap<i64, Expected> {
    let backend = conn.get_database_backend();
    let sql = "SELECT id, version, status, total FROM orders";
    let rows = conn.query_all_raw(Statement::from_string(backend, sql)).await.unwrap();
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get_by_index(0).unwrap();
            let expected = Expected {
                version: row.try_get_by_index(1).unwrap(),
                status: row.try_get_by_index(2).unwrap(),
                total: row.try_get_by_index(3).unwrap(),
            };
            (id, expected)
        })
        .filter(|(id, _)| ids.contains(id))
        .collect()
}

/// Submits an order, amends it, and cancels every second one: 2 or 3 versions. Returns the
/// order id and its number of versions.
async fn order_with_changes(app: &TestOrder, key: &str, cancelled: bool) -> (i64, i64) {
    let accepted = app.submit(order(7, key)).await.unwrap();
    let id = accepted.order_id;
    app.amend(amend(&format!("{key}-amend"), id, 1, 3)).await.unwrap();
    if cancelled {
        app.cancel(cancel(&format!("{key}-cancel"), id, 2)).await.unwrap();
        return (id, 3);
    }
    (id, 2)
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn range(from: DateTime<Utc>, to: DateTime<Utc>, dry_run: bool) -> pb::ReplayRequest {
    pb::ReplayRequest {
        created_from: Some(idempost::edge::timestamp(from)),
        created_to: Some(idempost::edge::timestamp(to)),
        dry_run,
        reason: "the billing service starts and needs these orders".to_owned(),
        requested_by: "ops-test".to_owned(),
        list_limit: 100,
        ..Default::default()
    }
}

on_every_backend!(
    a_replayed_time_range_rebuilds_a_new_consumer_names_read_model_and_the_first_consumer_absorbs_it
);

async fn a_replayed_time_range_rebuilds_a_new_consumer_names_read_model_and_the_first_consumer_absorbs_it(
    backend: Backend,
) {
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-replay");
    broker.create_topic(&topic, PARTITIONS as u32).await;
    let pipeline = Pipeline::spawn(backend, &broker.address(), &topic, "first").await;
    let app = &pipeline.order;
    let first = idempost_consumer::Settings::new(&app.db.url, broker.address()).consumer_name;

    let before = app.submit(order(7, "before")).await.unwrap().order_id;
    let from = Utc::now();
    let mut inside = Vec::new();
    for i in 0..4 {
        inside.push(order_with_changes(app, &format!("inside-{i}"), i % 2 == 0).await);
    }
    let to = Utc::now();
    let after = app.submit(order(7, "after")).await.unwrap().order_id;
    let ids: Vec<i64> = inside.iter().map(|(id, _)| *id).collect();
    let in_range: i64 = inside.iter().map(|(_, versions)| versions).sum();
    let mut all = ids.clone();
    all.extend([before, after]);
    let everything = orders_as_read_model(&app.conn, &all).await;
    assert_eventually("the first consumer applied every order", WAIT, || async {
        read_model(&app.conn, &first).await == everything
    })
    .await;

    // The dry run counts and lists, and changes nothing.
    let dry = app.admin.clone().replay(range(from, to, true)).await.unwrap().into_inner();
    assert_eq!((dry.replayed, dry.not_published, dry.purged, dry.audit_id), (in_range as u64, 0, 0, 0));
    assert!(dry.dry_run);
    let listed: Vec<i64> = dry.events.iter().map(|e| e.order_id).collect();
    assert!(listed.iter().all(|id| ids.contains(id)), "only the range's orders are listed: {listed:?}");
    assert_eq!(listed.len() as i64, in_range);
    assert_eq!(app.scalar_i64("SELECT COUNT(*) FROM outbox_event WHERE status <> 'PUBLISHED'").await, 0);
    assert_eq!(app.scalar_i64(REPLAYS).await, 0, "a dry run writes no audit row");

    // A new consumer name that starts at the topic's end: it can only see what is replayed.
    let name = format!("billing-{}", uuid::Uuid::new_v4().simple());
    idempost_testkit::group::commit_end(&broker.address(), &topic, &name, PARTITIONS, WAIT).await;
    let mut settings = consumer_settings(&app.db.url, &broker.address(), &topic, &name);
    settings.consumer_name = name.clone();
    let billing = TestConsumer::spawn(settings).await;
    let duplicates = pipeline.consumer.stats.snapshot().duplicates;

    let url = format!("--admin-url=http://127.0.0.1:{}", app.admin_port);
    let (from_flag, to_flag) = (format!("--from={}", rfc3339(from)), format!("--to={}", rfc3339(to)));
    let args = [&url, "--json", "replay", &from_flag, &to_flag, "--reason=billing starts", "--by=ops-test"];
    let output =
        tokio::process::Command::new(service_binary("idempostctl")).args(args).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["replayed"], in_range, "{answer}");
    assert!(answer["auditId"].as_i64().unwrap() > 0, "{answer}");

    let want = orders_as_read_model(&app.conn, &ids).await;
    assert_eventually("the new consumer name's read model equals the replayed orders", WAIT, || async {
        read_model(&app.conn, &name).await == want
    })
    .await;
    assert_eventually("the first consumer absorbed every copy as a duplicate", WAIT, || async {
        pipeline.consumer.stats.snapshot().duplicates - duplicates == in_range as u64
    })
    .await;
    assert_eq!(read_model(&app.conn, &first).await, everything, "the first consumer's read model changed");
    let parked = format!("SELECT COUNT(*) FROM parked_event WHERE consumer_name = '{name}'");
    assert_eq!(app.scalar_i64(&parked).await, 0, "a replayed version arrived before its predecessor");
    let applied = format!("SELECT COUNT(*) FROM consumed_event WHERE consumer_name = '{name}'");
    assert_eq!(app.scalar_i64(&applied).await, in_range, "the new name applied only the replayed events");

    versions_in_order_on_the_topic(&broker, &topic, &inside, 2 + in_range as usize).await;
    audited(app, in_range).await;
    billing.stop().await;
    pipeline.stop().await;
}

/// Every replayed order's versions reach the topic twice, each time in version order: the first
/// publication, then the replay.
async fn versions_in_order_on_the_topic(
    broker: &TestBroker,
    topic: &str,
    inside: &[(i64, i64)],
    first: usize,
) {
    let all = first + inside.iter().map(|(_, n)| *n as usize).sum::<usize>();
    let records = read_topic(&broker.address(), topic, all, WAIT, Duration::from_secs(1)).await;
    let mut by_order: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for record in &records {
        let version = record.header("event_version").parse().unwrap();
        by_order
            .entry(String::from_utf8_lossy(&record.key).into_owned())
            .or_default()
            .push((record.offset, version));
    }
    for (id, versions) in inside {
        let mut seen = by_order.remove(&id.to_string()).unwrap();
        seen.sort_unstable();
        let seen: Vec<i64> = seen.into_iter().map(|(_, version)| version).collect();
        let once: Vec<i64> = (1..=*versions).collect();
        assert_eq!(seen, [once.clone(), once].concat(), "order {id}'s versions on the topic");
    }
}

/// How many REPLAY rows the audit holds.
const REPLAYS: &str = "SELECT COUNT(*) FROM admin_audit WHERE action = 'REPLAY'";

/// The replay's audit row: who, why, the filter and how many.
async fn audited(app: &TestOrder, replayed: i64) {
    let sql = "SELECT actor, reason, outcome, order_id FROM admin_audit WHERE action = 'REPLAY'";
    let backend = app.conn.get_database_backend();
    let rows = app.conn.query_all_raw(Statement::from_string(backend, sql)).await.unwrap();
    assert_eq!(rows.len(), 1, "one audit row per replay, none for the dry run");
    let row = &rows[0];
    assert_eq!(row.try_get_by_index::<String>(0).unwrap(), "ops-test");
    assert_eq!(row.try_get_by_index::<String>(1).unwrap(), "billing starts");
    let outcome = row.try_get_by_index::<String>(2).unwrap();
    assert!(outcome.starts_with(&format!("replayed {replayed}, ")), "{outcome}");
    assert!(outcome.ends_with("event type any"), "no type filter: {outcome}");
    assert!(!outcome.contains(" -..") && !outcome.contains("..-,"), "the range is recorded: {outcome}");
    assert_eq!(row.try_get_by_index::<Option<i64>>(3).unwrap(), None);
}

/// Sets outbox rows as a relay's confirmed mark would leave them (no relay runs in these tests).
async fn published(app: &TestOrder, which: &str) {
    let sql =
        format!("UPDATE outbox_event SET status = 'PUBLISHED', published_at = created_at WHERE {which}");
    app.conn.execute_raw(Statement::from_string(app.conn.get_database_backend(), sql)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_is_for_operators_only_audited_by_identity_and_says_what_it_cannot_replay() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |_| {}).await;
    let mut admin = app.admin.clone();
    let seven = tenant(&pki, 7);
    let accepted =
        app.client.clone().submit_order(with_token(order(7, "replayed"), &seven)).await.unwrap().into_inner();
    let id = accepted.order_id;
    let by_order = |reason: &str| pb::ReplayRequest {
        order_id: id,
        reason: reason.to_owned(),
        requested_by: "a note".to_owned(),
        ..Default::default()
    };

    let answer = admin.replay(with_token(by_order("mine"), &seven)).await;
    assert_eq!(refusal(answer, &seven), (Code::PermissionDenied, "SCOPE_MISSING".into()));

    let alice = operator(&pki, "alice");
    let refused = admin.replay(with_token(by_order(" "), &alice)).await.unwrap_err();
    assert_eq!(violated_fields(&refused), ["reason"]);
    let unbounded = pb::ReplayRequest { order_id: 0, ..by_order("everything") };
    let refused = admin.replay(with_token(unbounded, &alice)).await.unwrap_err();
    assert_eq!(violated_fields(&refused), ["created_from"]);

    // Still PENDING (no relay runs here): counted, not replayed.
    let answer = admin.replay(with_token(by_order("too early"), &alice)).await.unwrap().into_inner();
    assert_eq!((answer.replayed, answer.not_published), (0, 1));

    published(&app, &format!("event_id = '{}'", accepted.event_id)).await;
    let answer = admin.replay(with_token(by_order("billing starts"), &alice)).await.unwrap().into_inner();
    assert_eq!((answer.replayed, answer.not_published, answer.purged), (1, 0, 0));
    assert_eq!(answer.events[0].event_id, accepted.event_id);
    assert_eq!(app.outbox_row(&accepted.event_id).await.unwrap().0, "PENDING");
    let who = "SELECT COUNT(*) FROM admin_audit WHERE action = 'REPLAY' AND actor = 'alice' \
               AND reason = 'billing starts (requested_by note: a note)' AND outcome LIKE 'replayed 1,%'";
    assert_eq!(app.scalar_i64(who).await, 1, "the token's subject is recorded, the note kept");

    // Retention deleted the row after publication: the dry run says it cannot be replayed.
    let delete = format!("DELETE FROM outbox_event WHERE event_id = '{}'", accepted.event_id);
    app.conn.execute_raw(Statement::from_string(app.conn.get_database_backend(), delete)).await.unwrap();
    let dry = pb::ReplayRequest { dry_run: true, ..by_order("after retention") };
    let answer = admin.replay(with_token(dry, &alice)).await.unwrap().into_inner();
    assert_eq!((answer.replayed, answer.not_published, answer.purged), (0, 0, 1));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_of_more_than_a_thousand_events_is_refused_in_a_dry_run_too() {
    let app = TestOrder::spawn(Backend::Sqlite).await;
    let from = Utc::now();
    for i in 0..1001 {
        let accepted = app.submit(order(7, &format!("bulk-{i}"))).await.unwrap();
        published(&app, &format!("event_id = '{}'", accepted.event_id)).await;
    }
    for dry_run in [true, false] {
        let refused = app.admin.clone().replay(range(from, Utc::now(), dry_run)).await.unwrap_err();
        assert_eq!((refused.code(), reason(&refused)), (Code::FailedPrecondition, "REPLAY_TOO_LARGE".into()));
    }
    assert_eq!(app.scalar_i64("SELECT COUNT(*) FROM outbox_event WHERE status = 'PENDING'").await, 0);
    assert_eq!(app.scalar_i64(REPLAYS).await, 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replaying_one_event_type_gives_a_new_consumer_name_a_gap_it_parks_behind() {
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-replay-type");
    broker.create_topic(&topic, 1).await;
    let pipeline = Pipeline::spawn(Backend::Sqlite, &broker.address(), &topic, "first").await;
    let app = &pipeline.order;
    let (id, _) = order_with_changes(app, "typed", true).await;
    let want = orders_as_read_model(&app.conn, &[id]).await;
    let first = idempost_consumer::Settings::new(&app.db.url, broker.address()).consumer_name;
    assert_eventually("the first consumer applied the order", WAIT, || async {
        read_model(&app.conn, &first).await == want
    })
    .await;
    let name = format!("audit-{}", uuid::Uuid::new_v4().simple());
    idempost_testkit::group::commit_end(&broker.address(), &topic, &name, 1, WAIT).await;
    let mut settings = consumer_settings(&app.db.url, &broker.address(), &topic, &name);
    settings.consumer_name = name.clone();
    let audit = TestConsumer::spawn(settings).await;

    // Only the cancellation (version 3): versions 1 and 2 stay PUBLISHED and are not sent again.
    let cancellations = pb::ReplayRequest {
        order_id: id,
        event_type: "idempost.v1.OrderCancelled".to_owned(),
        reason: "the audit service counts cancellations".to_owned(),
        requested_by: "ops-test".to_owned(),
        ..Default::default()
    };
    let answer = app.admin.clone().replay(cancellations).await.unwrap().into_inner();
    assert_eq!(answer.replayed, 1);
    assert_eq!(
        (answer.events[0].version, answer.events[0].event_type.as_str()),
        (3, "idempost.v1.OrderCancelled")
    );

    let parked = format!("SELECT COUNT(*) FROM parked_event WHERE consumer_name = '{name}' AND version = 3");
    assert_eventually("the new name parks version 3 behind the versions it never saw", WAIT, || async {
        app.scalar_i64(&parked).await == 1
    })
    .await;
    assert!(read_model(&app.conn, &name).await.is_empty(), "nothing applied past the gap");
    let typed = "SELECT COUNT(*) FROM admin_audit WHERE action = 'REPLAY' \
                 AND outcome LIKE '%event type idempost.v1.OrderCancelled' AND order_id IS NOT NULL";
    assert_eq!(app.scalar_i64(typed).await, 1, "the filter is audited");
    audit.stop().await;
    pipeline.stop().await;
}
