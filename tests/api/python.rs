//! The Python clients (clients/python) against a real order service, relay and broker: the safe
//! caller protocol from another language, and OrderAccepted decoded by confluent-kafka. MariaDB,
//! the reference database, is enough: the clients only see gRPC and Kafka.

use std::collections::BTreeSet;
use std::time::Duration;

use sea_orm::ConnectionTrait;
use serde_json::{Value, json};

use crate::broker::{TestBroker, free_port};
use crate::helpers::{Backend, InProcess, OutboxProbe, TestOrder, assert_eventually};
use idempost_testkit::python::{PythonRun, order_json, run_python, text};

use idempost_testkit::wait::WAIT;

/// `submit.py submit` against `target` with each order on a line of its standard input.
async fn submit_to(target: &str, extra: &[&str], orders: &[Value]) -> PythonRun {
    let mut args = vec![format!("--target={target}"), "--initial-backoff=0.005".to_owned()];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    args.push("submit".to_owned());
    let stdin = orders.iter().map(|order| format!("{order}\n")).collect::<String>();
    run_python("submit.py", &args, &stdin).await
}

async fn submit(app: &TestOrder, orders: &[Value]) -> PythonRun {
    submit_to(&format!("127.0.0.1:{}", app.port), &[], orders).await
}

/// `submit.py amend` or `submit.py cancel` against `app` with each change on a line of its
/// standard input.
async fn change(app: &TestOrder, command: &str, changes: &[Value]) -> PythonRun {
    let args = [
        format!("--target=127.0.0.1:{}", app.port),
        "--initial-backoff=0.005".to_owned(),
        command.to_owned(),
    ];
    let stdin = changes.iter().map(|change| format!("{change}\n")).collect::<String>();
    run_python("submit.py", &args, &stdin).await
}

/// An amendment of `order_id` at `expected_version` as proto JSON (64-bit integers as strings).
fn amend_json(request_id: &str, order_id: i64, expected_version: i64, event_id: Option<&str>) -> Value {
    let mut amend = json!({
        "tenant_id": 7,
        "request_id": request_id,
        "order_id": order_id.to_string(),
        "expected_version": expected_version.to_string(),
        "line_items": [{"sku": "SKU-BLUE-MUG", "quantity": 3, "unit_price_minor": 1000}],
    });
    if let Some(event_id) = event_id {
        amend["event_id"] = event_id.into();
    }
    amend
}

fn cancel_json(request_id: &str, order_id: i64, expected_version: i64) -> Value {
    json!({
        "tenant_id": 7,
        "request_id": request_id,
        "order_id": order_id.to_string(),
        "expected_version": expected_version.to_string(),
        "reason": "CANCEL_REASON_CUSTOMER_REQUEST",
        "note": "changed their mind",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_client_amends_and_cancels_replays_a_change_and_stops_at_a_version_conflict() {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let submitted = submit(&app, &[order_json("req-py-1", None)]).await;
    let order_id = submitted.result()["order_id"].as_i64().unwrap();
    let event_id = uuid::Uuid::now_v7().to_string();

    let amended = change(&app, "amend", &[amend_json("amend-py-1", order_id, 1, Some(&event_id))]).await;
    let replayed = change(&app, "amend", &[amend_json("amend-py-1", order_id, 1, None)]).await;
    let conflict = change(&app, "amend", &[amend_json("amend-py-2", order_id, 1, None)]).await;
    let cancelled = change(&app, "cancel", &[cancel_json("cancel-py-1", order_id, 2)]).await;
    let found = reconcile(&app, "cancel-py-1").await;

    assert!(amended.status.success(), "{amended}");
    let result = amended.result();
    assert_eq!((text(&result["confirmation"]), text(&result["event_id"])), ("committed", event_id.as_str()));
    assert_eq!((result["order_id"].as_i64(), result["version"].as_i64()), (Some(order_id), Some(2)));
    assert_eq!(amended.calls(), ["amend OK"], "{amended}");
    assert!(replayed.status.success(), "{replayed}");
    assert_eq!(text(&replayed.result()["confirmation"]), "replayed");
    assert_eq!(text(&replayed.result()["event_id"]), event_id, "the original change's event");
    assert!(!conflict.status.success(), "{conflict}");
    let refused = conflict.result();
    assert_eq!(
        (text(&refused["status"]), text(&refused["code"]), text(&refused["reason"])),
        ("rejected", "FAILED_PRECONDITION", "VERSION_CONFLICT"),
        "{conflict}"
    );
    assert_eq!(conflict.calls().len(), 1, "a refusal is not retried: {conflict}");
    assert!(cancelled.status.success(), "{cancelled}");
    assert_eq!(cancelled.result()["version"].as_i64(), Some(3));
    assert!(found.status.success(), "{found}");
    let found = found.result();
    assert_eq!((text(&found["operation"]), found["version"].as_i64()), ("ORDER_OPERATION_CANCEL", Some(3)));
    assert_eq!(
        (text(&found["order_status"]), found["current_version"].as_i64()),
        ("ORDER_STATUS_CANCELLED", Some(3))
    );
    assert_eq!(app.count("outbox_event").await, 3);
}

async fn reconcile(app: &TestOrder, request_id: &str) -> PythonRun {
    let args = [
        format!("--target=127.0.0.1:{}", app.port),
        "reconcile".to_owned(),
        "--tenant-id=7".to_owned(),
        format!("--request-id={request_id}"),
    ];
    run_python("submit.py", &args, "").await
}

/// Orders committed under `request_id` with `event_id` as their acceptance event.
async fn orders_with(app: &TestOrder, request_id: &str, event_id: &str) -> i64 {
    app.scalar_i64(&format!(
        "SELECT COUNT(*) FROM orders WHERE tenant_id = 7 AND request_id = '{request_id}' \
         AND acceptance_event_id = '{event_id}'"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_submitter_commits_once_replays_with_the_same_event_id_and_reconciles() {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let event_id = uuid::Uuid::now_v7().to_string();

    let first = submit(&app, &[order_json("req-py-1", Some(&event_id))]).await;
    let replay = submit(&app, &[order_json("req-py-1", None)]).await;
    let found = reconcile(&app, "req-py-1").await;
    let missing = reconcile(&app, "req-py-never-sent").await;

    assert!(first.status.success(), "{first}");
    let committed = first.result();
    assert_eq!((text(&committed["status"]), text(&committed["confirmation"])), ("confirmed", "committed"));
    assert_eq!(text(&committed["event_id"]), event_id, "the event id the caller fixed");
    assert_eq!(committed["calls"], 1);
    let order_id = committed["order_id"].as_i64().unwrap();

    assert!(replay.status.success(), "{replay}");
    let replayed = replay.result();
    assert_eq!(text(&replayed["confirmation"]), "replayed", "{replay}");
    assert_eq!(text(&replayed["event_id"]), event_id, "a replay answers with the original event id");
    assert_eq!(replayed["order_id"], order_id);

    assert!(found.status.success(), "{found}");
    let found = found.result();
    assert_eq!(text(&found["status"]), "found");
    assert_eq!((found["order_id"].as_i64(), text(&found["event_id"])), (Some(order_id), event_id.as_str()));
    assert_eq!(found["total_minor"], 2 * 1250 + 799);
    assert_eq!(text(&found["order_status"]), "ORDER_STATUS_ACCEPTED");
    assert!(found["accepted_at"].is_string(), "{found}");

    assert!(!missing.status.success(), "{missing}");
    assert_eq!(text(&missing.result()["status"]), "not_found", "{missing}");

    assert_eq!(app.count("orders").await, 1);
    assert_eq!(orders_with(&app, "req-py-1", &event_id).await, 1);
    let (status, _) = app.outbox_row(&event_id).await.expect("the event committed with its order");
    assert_eq!(status, "PENDING");
    assert_eq!(app.count("outbox_event").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_submitter_stops_at_a_refusal_after_one_call_and_writes_nothing() {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let mut invalid = order_json("req-py-invalid", None);
    invalid["tenant_id"] = 0.into();
    let mut other_content = order_json("req-py-1", None);
    other_content["currency"] = "USD".into();

    let run = submit(&app, &[order_json("req-py-1", None), invalid, other_content]).await;

    assert!(!run.status.success(), "a refused order makes the run fail: {run}");
    let results = run.of_type("result");
    assert_eq!(results.len(), 3, "{run}");
    assert_eq!(text(&results[0]["status"]), "confirmed", "{run}");
    let refusals = results[1..]
        .iter()
        .map(|r| (text(&r["status"]), text(&r["code"]), text(&r["reason"]), r["calls"].as_i64()))
        .collect::<Vec<_>>();
    assert_eq!(
        refusals,
        [
            ("rejected", "INVALID_ARGUMENT", "INVALID_ORDER", Some(1)),
            ("rejected", "ALREADY_EXISTS", "REQUEST_ID_REUSED", Some(1)),
        ],
        "{run}"
    );
    assert_eq!(run.calls().len(), 3, "no refusal is retried: {run}");
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox_event").await, 1);
}

#[tokio::test]
async fn a_python_submitter_that_cannot_reach_the_service_only_reconciles_and_gives_up_with_its_event_id() {
    let event_id = uuid::Uuid::now_v7().to_string();
    let nothing_listens = format!("127.0.0.1:{}", free_port());

    let run = submit_to(
        &nothing_listens,
        &["--max-calls=3", "--call-timeout=2"],
        &[order_json("req-py-1", Some(&event_id))],
    )
    .await;

    assert!(!run.status.success(), "{run}");
    let result = run.result();
    assert_eq!((text(&result["status"]), text(&result["code"])), ("gave_up", "UNAVAILABLE"), "{run}");
    assert_eq!(text(&result["event_id"]), event_id, "the event id to reuse later");
    assert_eq!(
        run.calls(),
        ["submit UNAVAILABLE", "reconcile UNAVAILABLE", "reconcile UNAVAILABLE"],
        "after a transport error the outcome is unknown: never resubmit before Reconcile says NOT_FOUND"
    );
}

#[cfg(feature = "failpoints")]
mod faults {
    use idempost::failpoint::{
        BEFORE_ORDER_TRANSACTION_COMMIT, COMMIT_FAILS_WITHOUT_COMMITTING,
        COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION,
    };

    use std::collections::BTreeSet;

    use super::{PythonRun, amend_json, change, order_json, orders_with, submit, text};
    use crate::helpers::{Backend, TestOrder, arm};

    /// Submits one order with a fixed event id after arming `point`, and checks that the order
    /// committed once under that event id, whatever happened on the way.
    async fn submit_through(point: &str, actions: &str) -> PythonRun {
        let app = TestOrder::spawn(Backend::MariaDb).await;
        arm(point, actions);
        let event_id = uuid::Uuid::now_v7().to_string();

        let run = submit(&app, &[order_json("req-py-1", Some(&event_id))]).await;

        assert!(run.status.success(), "{run}");
        assert_eq!(text(&run.result()["event_id"]), event_id, "{run}");
        assert_eq!(app.count("orders").await, 1);
        assert_eq!(orders_with(&app, "req-py-1", &event_id).await, 1);
        assert_eq!(app.count("outbox_event").await, 1);
        assert_eq!(run.sent_event_ids(), BTreeSet::from([event_id]), "every submit sent the same id: {run}");
        run
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn after_an_unknown_outcome_that_committed_the_python_submitter_reconciles_and_finds_the_order() {
        let run = submit_through(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*return").await;

        assert_eq!(run.calls(), ["submit UNKNOWN OUTCOME_UNKNOWN", "reconcile OK"], "{run}");
        assert_eq!(text(&run.result()["confirmation"]), "reconciled");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn after_an_unknown_outcome_of_an_amendment_the_python_client_reconciles_and_finds_the_change() {
        let app = TestOrder::spawn(Backend::MariaDb).await;
        let order_id = app.submit(crate::helpers::order(7, "req-py-1")).await.unwrap().order_id;
        arm(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*return");
        let event_id = uuid::Uuid::now_v7().to_string();

        let run = change(&app, "amend", &[amend_json("amend-py-1", order_id, 1, Some(&event_id))]).await;

        assert!(run.status.success(), "{run}");
        assert_eq!(run.calls(), ["amend UNKNOWN OUTCOME_UNKNOWN", "reconcile OK"], "{run}");
        let result = run.result();
        assert_eq!(
            (text(&result["confirmation"]), text(&result["event_id"])),
            ("reconciled", event_id.as_str())
        );
        assert_eq!(result["version"].as_i64(), Some(2));
        assert_eq!(app.count("outbox_event").await, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn after_an_unknown_outcome_that_did_not_commit_the_python_submitter_resubmits_with_the_same_ids() {
        let run = submit_through(COMMIT_FAILS_WITHOUT_COMMITTING, "1*return").await;

        assert_eq!(
            run.calls(),
            ["submit UNKNOWN OUTCOME_UNKNOWN", "reconcile NOT_FOUND ORDER_NOT_FOUND", "submit OK"],
            "{run}"
        );
        assert_eq!(text(&run.result()["confirmation"]), "committed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn after_a_rollback_the_python_submitter_resubmits_with_the_same_ids() {
        let run = submit_through(BEFORE_ORDER_TRANSACTION_COMMIT, "2*return").await;

        assert_eq!(
            run.calls(),
            ["submit ABORTED ROLLED_BACK", "submit ABORTED ROLLED_BACK", "submit OK"],
            "a confirmed rollback is resubmitted at once, without Reconcile: {run}"
        );
        assert_eq!(text(&run.result()["confirmation"]), "committed");
    }
}

/// `consume.py` on `topic` in consumer group `group`.
async fn consume(broker: &TestBroker, topic: &str, group: &str, extra: &[&str]) -> PythonRun {
    let mut args = vec![
        format!("--brokers={}", broker.address()),
        format!("--topic={topic}"),
        format!("--group-id={group}"),
        "-X".to_owned(),
        "session.timeout.ms=6000".to_owned(),
    ];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    run_python("consume.py", &args, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_consumer_decodes_every_event_the_relay_publishes_and_commits_its_offsets() {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 3).await;
    let mut relay_settings = idempost_relay::Settings::new(&app.db.url, broker.address());
    relay_settings.kafka.topic = topic.clone();
    relay_settings.max_idle_poll = Duration::from_millis(100);
    let relay = idempost_relay::Application::build(relay_settings).await.unwrap();
    let relay = InProcess::spawn(|shutdown| relay.run_until_stopped(shutdown));
    let probe = OutboxProbe { conn: &app.conn };

    let orders = (0..5).map(|i| order_json(&format!("req-py-{i}"), None)).collect::<Vec<_>>();
    let submitted = submit(&app, &orders).await;
    assert!(submitted.status.success(), "{submitted}");
    let accepted = submitted.of_type("result");
    assert_eq!(accepted.len(), 5, "{submitted}");
    assert_eventually("the relay published all five events", WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 5
    })
    .await;

    let first = consume(&broker, &topic, "py-group", &["--max-events=5", "--timeout=60"]).await;

    assert!(first.status.success(), "{first}");
    let events = first.of_type("event");
    assert_eq!(events.len(), 5, "{first}");
    let consumed = events.iter().map(|event| text(&event["event_id"]).to_owned()).collect::<BTreeSet<_>>();
    let expected =
        accepted.iter().map(|result| text(&result["event_id"]).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(consumed, expected, "every submitted event, decoded: {first}");
    for event in &events {
        let event_id = text(&event["event_id"]);
        let result = accepted.iter().find(|result| result["event_id"] == event["event_id"]).unwrap();
        let order_id = result["order_id"].as_i64().unwrap();
        assert_eq!(text(&event["header_event_id"]), event_id, "the event_id header repeats the payload's");
        assert_eq!(text(&event["event_type"]), "idempost.v1.OrderAccepted");
        assert_eq!(text(&event["key"]), order_id.to_string(), "the record key is the order id");
        assert_eq!(event["order_id"], order_id);
        assert_eq!(event["request_id"], result["request_id"]);
        assert_eq!(
            (&event["tenant_id"], text(&event["customer_id"]), text(&event["currency"])),
            (&json!(7), "customer-42", "EUR")
        );
        assert_eq!(event["line_items"], order_json("x", None)["line_items"]);
        assert_eq!((&event["total_minor"], &event["event_version"]), (&json!(3299), &json!(1)));
        assert!(event["accepted_at"].is_string(), "{event}");
        let stored = probe.state(event_id).await;
        assert_eq!(
            (stored.partition, stored.offset),
            (event["partition"].as_i64().map(|p| p as i32), event["offset"].as_i64()),
            "the record the relay recorded for {event_id}"
        );
    }

    // The group's offsets were committed: the same group now reads only what is published later.
    let later = submit(&app, &[order_json("req-py-later", None)]).await;
    let later_event = text(&later.result()["event_id"]).to_owned();
    assert_eventually("the relay published the later event", WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 6
    })
    .await;
    let second = consume(&broker, &topic, "py-group", &["--timeout=15"]).await;

    assert!(second.status.success(), "{second}");
    let again =
        second.of_type("event").iter().map(|event| text(&event["event_id"]).to_owned()).collect::<Vec<_>>();
    assert_eq!(again, [later_event], "only the event published after the commits: {second}");
    assert!(second.of_type("undecodable").is_empty() && first.of_type("undecodable").is_empty());
    relay.stop().await;
}

/// A relay run with `--legacy-headers false` writes `ce_id` and `ce_type` without the `event_id`
/// and `event_type` headers they repeat: `consume.py` states the event id and type from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_consumer_reads_the_event_id_and_type_of_records_without_the_legacy_headers() {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 3).await;
    let mut relay_settings = idempost_relay::Settings::new(&app.db.url, broker.address());
    relay_settings.kafka.topic = topic.clone();
    relay_settings.max_idle_poll = Duration::from_millis(100);
    relay_settings.legacy_headers = false;
    let relay = idempost_relay::Application::build(relay_settings).await.unwrap();
    let relay = InProcess::spawn(|shutdown| relay.run_until_stopped(shutdown));
    let probe = OutboxProbe { conn: &app.conn };
    let mut expected = BTreeSet::new();
    for i in 0..3 {
        expected.insert(
            app.submit(crate::helpers::order(7, &format!("req-py-lean-{i}"))).await.unwrap().event_id,
        );
    }
    assert_eventually("the relay published all three events", WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 3
    })
    .await;

    let run = consume(&broker, &topic, "py-lean", &["--max-events=3", "--timeout=60"]).await;

    assert!(run.status.success(), "{run}");
    let events = run.of_type("event");
    let stated =
        events.iter().map(|event| text(&event["header_event_id"]).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(stated, expected, "the event id from ce_id: {run}");
    for event in &events {
        assert_eq!(event["header_event_id"], event["event_id"], "ce_id repeats the payload's id: {run}");
        assert_eq!(text(&event["event_type"]), "idempost.v1.OrderAccepted", "from ce_type: {run}");
    }
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_submitter_speaks_tls_and_carries_its_token_which_names_the_tenant() {
    use crate::pki::{AUDIENCE, ISSUER, Pki};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let jwks = pki.jwks.clone();
    let (db, server, port, _) = idempost_testkit::auth::tls_service(Backend::MariaDb, &pki, |s| {
        s.security.auth = idempost::security::AuthSettings::jwt(jwks, ISSUER, AUDIENCE)
    })
    .await;
    let target = format!("localhost:{port}");
    let token_file = |tenant_id: i64| {
        let token = pki.token(json!({ "sub": format!("py-{tenant_id}"), "tenant_id": tenant_id })).unwrap();
        let path = dir.path().join(format!("tenant-{tenant_id}.jwt"));
        std::fs::write(&path, &token).unwrap();
        (path.display().to_string(), token)
    };
    let ((seven, seven_token), (eight, eight_token)) = (token_file(7), token_file(8));
    let ca = pki.ca.display().to_string();
    let mut mine = order_json("req-py-tls", None);
    mine["tenant_id"] = 0.into();

    let run = submit_to(&target, &["--ca-file", &ca, "--token-file", &seven], &[mine]).await;
    assert!(run.status.success(), "{run}");
    let mut printed = run.to_string();
    let stored = run.of_type("result")[0]["event_id"].as_str().unwrap().to_owned();
    let tenant = crate::helpers::TestDb::connect(&db)
        .await
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::MySql,
            format!("SELECT tenant_id FROM orders WHERE acceptance_event_id = '{stored}'"),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap();
    assert_eq!(tenant, 7, "tenant_id 0 took the token's tenant");

    let run =
        submit_to(&target, &["--ca-file", &ca, "--token-file", &eight], &[order_json("req-py-8", None)])
            .await;
    let result = &run.of_type("result")[0];
    assert_eq!(
        (text(&result["code"]), text(&result["reason"])),
        ("PERMISSION_DENIED", "TENANT_MISMATCH"),
        "{run}"
    );
    printed.push_str(&run.to_string());
    let run = submit_to(&target, &["--ca-file", &ca], &[order_json("req-py-none", None)]).await;
    let result = &run.of_type("result")[0];
    assert_eq!(
        (text(&result["code"]), text(&result["reason"])),
        ("UNAUTHENTICATED", "TOKEN_MISSING"),
        "{run}"
    );
    printed.push_str(&run.to_string());
    for token in [&seven_token, &eight_token] {
        assert!(!printed.contains(token.as_str()), "the submitter printed its token");
    }
    server.stop().await;
}

/// The token of a consumer that would cross the network unencrypted is refused before a client is
/// made, as `submit.py` refuses a plaintext non-loopback target: no `--ca-file` (or a
/// `-X security.protocol=SASL_PLAINTEXT` over one) and a broker that is not on this host. The
/// broker address is a documentation address (TEST-NET-1): nothing listens there, and the
/// refusal must come before any attempt to reach it.
#[tokio::test]
async fn the_python_consumer_refuses_to_send_its_token_in_the_clear_to_a_broker_off_this_host() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token.jwt");
    let token = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ0In0.c2VjcmV0LXBhcnQ";
    std::fs::write(&token_file, token).unwrap();
    let token_arg = format!("--token-file={}", token_file.display());
    let remote = "192.0.2.1:9092";
    for extra in [vec![], vec!["-X", "security.protocol=SASL_PLAINTEXT", "--ca-file=/dev/null"]] {
        let mut args =
            vec![format!("--brokers=127.0.0.1:9,{remote}"), token_arg.clone(), "--timeout=30".to_owned()];
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let run = run_python("consume.py", &args, "").await;
        assert_eq!(run.status.code(), Some(2), "refused at start, {extra:?}: {run}");
        assert!(
            run.stderr.contains(&format!("refusing to send the token over plaintext to {remote}")),
            "the refusal names the remote broker, {extra:?}: {run}"
        );
        assert!(!run.stderr.contains("127.0.0.1:9"), "only the remote broker is named: {run}");
        assert!(!run.stderr.contains("c2VjcmV0"), "the token never reaches the terminal: {run}");
        assert!(run.lines.is_empty(), "nothing was consumed: {run}");
    }
}

/// Records a relay published in each CloudEvents content mode, read from the broker with
/// confluent-kafka and parsed with the official `cloudevents` package's Kafka binding
/// (`cloudevents_read.py`): id, type, source, subject and a payload that decodes to the message the
/// type names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_cloudevents_sdk_reads_binary_and_structured_records_and_their_payloads_decode() {
    let broker = TestBroker::start().await;
    for mode in [idempost_relay::CloudEventsMode::Binary, idempost_relay::CloudEventsMode::Structured] {
        let topic = idempost_testkit::cloudevents::published_in(&broker, mode).await;
        let args = [
            format!("--brokers={}", broker.address()),
            format!("--topic={}", topic.name),
            "--max-records=4".to_owned(),
            "--timeout=60".to_owned(),
        ];
        let run = run_python("cloudevents_read.py", &args, "").await;
        assert!(run.status.success(), "{mode:?}: {run}");
        let read = run.of_type("cloudevent");
        assert_eq!(read.len(), 4, "{mode:?}: every record parses as a CloudEvent: {run}");
        let mode_name = format!("{mode:?}").to_lowercase();
        for event in &topic.events {
            let line = read
                .iter()
                .find(|line| line["id"] == event.event_id.as_str())
                .unwrap_or_else(|| panic!("{mode:?}: no CloudEvent with id {}: {run}", event.event_id));
            assert_eq!(text(&line["mode"]), mode_name);
            assert_eq!(text(&line["specversion"]), "1.0");
            assert_eq!(text(&line["source"]), idempost::contract::CLOUDEVENTS_SOURCE);
            assert_eq!(text(&line["ce_type"]), event.event_type);
            assert_eq!(text(&line["subject"]), event.order_id.to_string());
            assert_eq!(text(&line["key"]), event.order_id.to_string(), "the key stays the order id");
            assert_eq!(text(&line["datacontenttype"]), idempost::contract::CONTENT_TYPE);
            assert!(line["time"].as_str().is_some_and(|t| t.starts_with("20")), "{line}");
            let data = &line["data"];
            assert_eq!(
                text(&data["message"]),
                event.event_type,
                "the data decodes to the message its type names"
            );
            assert_eq!(text(&data["event_id"]), event.event_id);
            assert_eq!(data["order_id"].as_i64(), Some(event.order_id));
            assert_eq!(data["event_version"].as_i64(), Some(event.version));
        }
        topic.app.stop().await;
    }
}

/// The hooks for users' own tests: `await_event.py` (its functions, run as a user's script
/// would) waits until an event is published or consumed, against real services.
mod awaiting {
    use idempost::security::AuthSettings;
    use idempost_consumer::DEFAULT_CONSUMER_NAME;
    use idempost_testkit::auth::{authenticated, operator, tenant, with_token};
    use idempost_testkit::consumer::{TestConsumer, consumer_settings};
    use idempost_testkit::pipeline::Pipeline;
    use idempost_testkit::pki::{AUDIENCE, ISSUER};
    use idempost_testkit::python::{PythonRun, run_python};
    use idempost_testkit::set_aside::{dead_letter, fail_event};

    use crate::broker::TestBroker;
    use crate::helpers::{Backend, order};

    async fn await_event(target: u16, token_file: Option<&std::path::Path>, command: &[&str]) -> PythonRun {
        let mut args = vec![format!("--target=127.0.0.1:{target}")];
        args.extend(token_file.map(|file| format!("--token-file={}", file.display())));
        args.extend(command.iter().map(|arg| (*arg).to_owned()));
        run_python("await_event.py", &args, "").await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_python_test_awaits_an_event_until_published_and_until_consumed() {
        let broker = TestBroker::start().await;
        let topic = idempost_testkit::topic::unique("idempost-await");
        broker.create_topic(&topic, 1).await;
        let pipeline = Pipeline::spawn(Backend::MariaDb, &broker.address(), &topic, "await-py").await;
        let event_id = pipeline.order.submit(order(7, "py-1")).await.unwrap().event_id;

        let published =
            await_event(pipeline.order.admin_port, None, &["published", &event_id, "--timeout=60"]).await;
        let consumed = await_event(
            pipeline.consumer.port,
            None,
            &["consumed", &event_id, "--consumer", DEFAULT_CONSUMER_NAME, "--timeout=60"],
        )
        .await;

        assert!(published.status.success(), "{published}");
        assert_eq!(published.result()["outcome"], "published");
        assert_eq!(published.result()["event_id"], event_id.as_str());
        assert!(consumed.status.success(), "{consumed}");
        assert_eq!(consumed.result()["outcome"], "consumed");
        assert_eq!(consumed.result()["consumer_name"], DEFAULT_CONSUMER_NAME);
        pipeline.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_python_wait_times_out_ends_at_failed_or_dead_lettered_and_hides_another_tenants_event() {
        let (app, pki, dir) = authenticated(Backend::MariaDb, |_| {}).await;
        let broker = TestBroker::start().await;
        let topic = idempost_testkit::topic::unique("idempost-await");
        broker.create_topic(&topic, 1).await;
        let mut settings = consumer_settings(&app.db.url, &broker.address(), &topic, "await-py-2");
        settings.auth = AuthSettings::jwt(pki.jwks.clone(), ISSUER, AUDIENCE);
        let consumer = TestConsumer::spawn(settings).await;
        let token = |name: &str, token: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, token).unwrap();
            path
        };
        let (own, other, ops) = (
            token("own", tenant(&pki, 1)),
            token("other", tenant(&pki, 2)),
            token("ops", operator(&pki, "ops")),
        );
        let request = with_token(order(1, "py-2"), &std::fs::read_to_string(&own).unwrap());
        let event_id = app.client.clone().submit_order(request).await.unwrap().into_inner().event_id;
        let dead = dead_letter(&app.conn, DEFAULT_CONSUMER_NAME, &topic).await;

        // No relay runs: the owner's wait times out on PENDING, the other tenant's on UNKNOWN.
        let pending = await_event(app.admin_port, Some(&own), &["published", &event_id, "--timeout=1"]).await;
        let hidden =
            await_event(app.admin_port, Some(&other), &["published", &event_id, "--timeout=1"]).await;
        fail_event(&app.conn, &event_id).await;
        let failed = await_event(app.admin_port, Some(&own), &["published", &event_id, "--timeout=60"]).await;
        let still_hidden =
            await_event(app.admin_port, Some(&other), &["published", &event_id, "--timeout=1"]).await;
        let consumed = ["consumed", dead.as_str(), "--consumer", DEFAULT_CONSUMER_NAME, "--timeout=60"];
        let dead_lettered = await_event(consumer.port, Some(&ops), &consumed).await;
        let not_an_operator = await_event(consumer.port, Some(&own), &consumed).await;

        assert_eq!(pending.status.code(), Some(3), "{pending}");
        assert_eq!(
            (&pending.result()["outcome"], &pending.result()["last_state"]),
            (&"timed_out".into(), &"PENDING".into())
        );
        for hidden in [&hidden, &still_hidden] {
            assert_eq!(hidden.status.code(), Some(3), "{hidden}");
            assert_eq!(hidden.result()["last_state"], "UNKNOWN", "{hidden}");
        }
        assert_eq!(failed.status.code(), Some(4), "{failed}");
        assert_eq!(failed.result()["outcome"], "failed");
        assert_eq!(dead_lettered.status.code(), Some(4), "{dead_lettered}");
        assert_eq!(
            (&dead_lettered.result()["outcome"], &dead_lettered.result()["error"]),
            (&"dead_lettered".into(), &"cannot decode".into())
        );
        assert_eq!(not_an_operator.status.code(), Some(1), "{not_an_operator}");
        assert_eq!(not_an_operator.result()["code"], "PERMISSION_DENIED");
        consumer.stop().await;
        app.stop().await;
    }
}
