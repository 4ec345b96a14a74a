//! SubmitOrder: one transaction for the order and its event, and an exact answer.

use futures::future::join_all;
use idempost_proto::v1::{self as pb, OrderAccepted};
use prost::Message;
use sea_orm::ConnectionTrait;
use tonic::Code;

use crate::helpers::{Backend, TestOrder, metadata, on_every_backend, order, reason, violated_fields};

on_every_backend!(
    a_new_order_commits_the_order_and_a_pending_outbox_row_with_one_event_id,
    resubmitting_the_same_order_replays_it_and_writes_nothing_new,
    the_same_request_id_with_different_content_is_rejected_and_changes_nothing,
    fifty_concurrent_submissions_of_one_request_make_one_order_and_one_event,
    reusing_an_event_id_for_another_request_is_an_error_not_a_replay,
    invalid_orders_are_rejected_naming_the_field_and_write_nothing,
);

async fn a_new_order_commits_the_order_and_a_pending_outbox_row_with_one_event_id(backend: Backend) {
    let app = TestOrder::spawn(backend).await;

    let accepted = app.submit(order(7, "req-1")).await.unwrap();

    assert_eq!(accepted.outcome(), pb::TransactionOutcome::Committed);
    assert!(!accepted.replayed);
    assert_eq!(accepted.total_minor, 2 * 1_250 + 799);
    assert_eq!(accepted.version, 1);
    let stored_event_id: String = app
        .conn
        .query_one_raw(sea_orm::Statement::from_string(
            app.conn.get_database_backend(),
            format!("SELECT acceptance_event_id FROM orders WHERE id = {}", accepted.order_id),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index(0)
        .unwrap();
    assert_eq!(stored_event_id, accepted.event_id);
    assert_eq!(app.count("order_line").await, 2);

    let (status, payload) = app.outbox_row(&accepted.event_id).await.expect("outbox row");
    assert_eq!(status, "PENDING");
    let event = OrderAccepted::decode(payload.as_slice()).unwrap();
    assert_eq!(event.event_id, accepted.event_id);
    assert_eq!(event.order_id, accepted.order_id);
    assert_eq!(event.tenant_id, 7);
    assert_eq!(event.request_id, "req-1");
    assert_eq!(event.customer_id, "customer-42");
    assert_eq!(event.currency, "EUR");
    assert_eq!(event.line_items, order(7, "req-1").line_items);
    assert_eq!(event.total_minor, accepted.total_minor);
    assert_eq!(event.event_version, 1);
    // The snapshot, the stored row and the answer carry one timestamp, to the microsecond.
    assert_eq!(event.accepted_at, accepted.accepted_at);
    assert_eq!(accepted.accepted_at.unwrap().nanos % 1_000, 0);
    let reconciled = app.reconcile(7, "req-1").await.unwrap();
    assert_eq!(reconciled.accepted_at, accepted.accepted_at);
}

async fn resubmitting_the_same_order_replays_it_and_writes_nothing_new(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let first = app.submit(order(7, "req-1")).await.unwrap();

    let again = app.submit(order(7, "req-1")).await.unwrap();
    // With the caller's own event id, which matches: still a replay.
    let with_event_id = app
        .submit(pb::SubmitOrderRequest { event_id: first.event_id.clone(), ..order(7, "req-1") })
        .await
        .unwrap();
    // With a new event id for the same request: the acceptance happened once, under the first.
    let with_new_event_id = app
        .submit(pb::SubmitOrderRequest { event_id: uuid::Uuid::now_v7().to_string(), ..order(7, "req-1") })
        .await
        .unwrap();

    for replay in [&again, &with_event_id, &with_new_event_id] {
        assert!(replay.replayed);
        assert_eq!(replay.outcome(), pb::TransactionOutcome::Committed);
        assert_eq!(replay.order_id, first.order_id);
        assert_eq!(replay.event_id, first.event_id);
        assert_eq!(replay.accepted_at, first.accepted_at);
    }
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox_event").await, 1);
}

async fn the_same_request_id_with_different_content_is_rejected_and_changes_nothing(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let first = app.submit(order(7, "req-1")).await.unwrap();

    let mut changed = order(7, "req-1");
    changed.line_items[0].quantity = 3;
    let status = app.submit(changed).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    assert_eq!(reason(&status), "REQUEST_ID_REUSED");
    assert_eq!(metadata(&status, "event_id").as_deref(), Some(first.event_id.as_str()));

    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox_event").await, 1);
    assert_eq!(
        app.count("order_line WHERE line_no = 1 AND quantity = 2").await,
        1,
        "the stored order is unchanged"
    );
}

async fn fifty_concurrent_submissions_of_one_request_make_one_order_and_one_event(backend: Backend) {
    // All fifty admitted at once (the default limit is the pool size): the race is on the key.
    let app = TestOrder::spawn_with(backend, |s| s.security.listeners.max_concurrent_calls = Some(64)).await;

    // No caller event id: every attempt makes its own, so agreement below is the server's doing.
    let answers = join_all((0..50).map(|_| app.submit(order(7, "contended")))).await;

    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    let fresh = answers.iter().filter(|a| !a.replayed).count();
    assert_eq!(fresh, 1, "exactly one submission commits; the rest are replays");
    let event_id = &answers[0].event_id;
    assert!(answers.iter().all(|a| &a.event_id == event_id && a.order_id == answers[0].order_id));
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox_event").await, 1);
    assert!(app.outbox_row(event_id).await.is_some());
}

async fn reusing_an_event_id_for_another_request_is_an_error_not_a_replay(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let first = app.submit(order(7, "req-1")).await.unwrap();

    // uq_orders_acceptance_event is violated, not uq_orders_tenant_request: not "already accepted".
    let reused = pb::SubmitOrderRequest { event_id: first.event_id.clone(), ..order(7, "req-2") };
    let status = app.submit(reused).await.unwrap_err();

    assert_eq!(status.code(), Code::AlreadyExists);
    assert_eq!(reason(&status), "EVENT_ID_IN_USE");
    assert_eq!(app.reconcile(7, "req-2").await.unwrap_err().code(), Code::NotFound);
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox_event").await, 1);
}

async fn invalid_orders_are_rejected_naming_the_field_and_write_nothing(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let line = |sku: &str, quantity, unit_price_minor| pb::LineItem {
        sku: sku.to_owned(),
        quantity,
        unit_price_minor,
    };
    let cases: Vec<(&str, pb::SubmitOrderRequest)> = vec![
        ("tenant_id", pb::SubmitOrderRequest { tenant_id: 0, ..order(7, "r") }),
        ("tenant_id", pb::SubmitOrderRequest { tenant_id: -3, ..order(7, "r") }),
        ("request_id", order(7, "")),
        ("request_id", order(7, "has space")),
        ("request_id", order(7, &"x".repeat(129))),
        ("request_id", order(7, "naïve")),
        ("customer_id", pb::SubmitOrderRequest { customer_id: String::new(), ..order(7, "r") }),
        ("currency", pb::SubmitOrderRequest { currency: "eur".to_owned(), ..order(7, "r") }),
        ("currency", pb::SubmitOrderRequest { currency: "XYZ".to_owned(), ..order(7, "r") }),
        ("line_items", pb::SubmitOrderRequest { line_items: vec![], ..order(7, "r") }),
        ("line_items", pb::SubmitOrderRequest { line_items: vec![line("A", 1, 1); 101], ..order(7, "r") }),
        (
            "line_items[1].quantity",
            pb::SubmitOrderRequest { line_items: vec![line("A", 1, 1), line("B", 0, 1)], ..order(7, "r") },
        ),
        (
            "line_items[0].quantity",
            pb::SubmitOrderRequest { line_items: vec![line("A", 10_001, 1)], ..order(7, "r") },
        ),
        (
            "line_items[0].unit_price_minor",
            pb::SubmitOrderRequest { line_items: vec![line("A", 1, -5)], ..order(7, "r") },
        ),
        ("line_items[0].sku", pb::SubmitOrderRequest { line_items: vec![line("", 1, 1)], ..order(7, "r") }),
        ("customer_id", pb::SubmitOrderRequest { customer_id: "c".repeat(129), ..order(7, "r") }),
        (
            "line_items[0].sku",
            pb::SubmitOrderRequest { line_items: vec![line(&"s".repeat(65), 1, 1)], ..order(7, "r") },
        ),
        ("event_id", pb::SubmitOrderRequest { event_id: "not-a-uuid".to_owned(), ..order(7, "r") }),
        (
            "event_id",
            pb::SubmitOrderRequest {
                event_id: uuid::Uuid::now_v7().to_string().to_uppercase(),
                ..order(7, "r")
            },
        ),
    ];
    assert!(cases.len() >= 10);

    for (field, request) in cases {
        let status = app.submit(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert_eq!(reason(&status), "INVALID_ORDER");
        assert!(violated_fields(&status).iter().any(|f| f == field), "{field} not named in {status:?}");
        assert!(status.message().contains(field), "{field} not in message {:?}", status.message());
    }

    // A request over the size limit is refused before it is decoded.
    let huge = pb::SubmitOrderRequest { customer_id: "c".repeat(100_000), ..order(7, "r") };
    assert_eq!(app.submit(huge).await.unwrap_err().code(), Code::OutOfRange);

    assert_eq!(app.count("orders").await, 0);
    assert_eq!(app.count("outbox_event").await, 0);
}

/// SQLite is the one backend on which a test can make the order transaction lose a lock conflict
/// without changing a shared server's settings: another connection holds the write lock for
/// longer than the order service's 5 s busy timeout. The service runs as a process exporting its
/// metrics, so the test sees the retry counted instead of guessing when it happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_transaction_that_timed_out_on_a_lock_runs_again_with_the_same_ids_and_commits() {
    use sea_orm::TransactionTrait as _;
    use std::time::Duration;

    let (endpoint, received, _receiver) = crate::otlp::start_receiver().await;
    let db = crate::helpers::TestDb::migrated(Backend::Sqlite).await;
    let (_service, port) = idempost_testkit::order::order_process(&db, endpoint, &[], None).await;
    let client = crate::helpers::connect_order_service(&format!("http://127.0.0.1:{port}")).await;
    let other = db.connect().await;
    let holding = other.begin().await.unwrap();
    holding.execute_unprepared("CREATE TABLE lock_holder (x INTEGER)").await.unwrap();
    let mut request = order(7, "req-locked");
    request.event_id = uuid::Uuid::new_v4().to_string();
    let event_id = request.event_id.clone();
    let mut submitter = client.clone();
    let submitting = tokio::spawn(async move { submitter.submit_order(request).await });

    // The first run fails after the 5 s busy timeout and is counted as a lock-conflict retry;
    // without the retry the caller would have its ROLLED_BACK answer by then.
    let retried = || {
        received
            .points()
            .iter()
            .filter(|p| p.name == "idempost.order.lock_conflict_retries")
            .map(|p| p.value)
            .fold(0.0, f64::max)
    };
    crate::helpers::assert_eventually(
        "the transaction runs again after the busy timeout",
        Duration::from_secs(60),
        || {
            let retries = retried();
            async move { retries >= 1.0 }
        },
    )
    .await;
    assert!(!submitting.is_finished(), "the call ended while the lock was still held");
    holding.rollback().await.unwrap();

    let accepted = submitting.await.unwrap().unwrap().into_inner();
    assert_eq!(accepted.outcome(), pb::TransactionOutcome::Committed);
    assert_eq!(accepted.event_id, event_id, "the retry reused the caller's event id");
    assert_eq!(rows(&other, "orders").await, 1);
    assert_eq!(rows(&other, "outbox_event").await, 1);
}

async fn rows(conn: &sea_orm::DatabaseConnection, table: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {table}");
    let row = conn.query_one_raw(sea_orm::Statement::from_string(conn.get_database_backend(), sql));
    row.await.unwrap().unwrap().try_get_by_index::<i64>(0).unwrap()
}
