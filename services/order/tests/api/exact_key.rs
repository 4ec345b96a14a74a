//! The idempotency key and every other identifier compared in SQL are compared byte for byte on
//! every database: no collation makes two keys that differ in case or trailing blanks one key.

use idempost_proto::v1 as pb;
use sea_orm::{ConnectionTrait, Statement};
use tonic::Code;

use crate::helpers::{Backend, TestOrder, on_every_backend, order, reason, violated_fields};

on_every_backend!(
    request_ids_that_differ_only_in_case_are_two_orders_and_each_reconciles_to_its_own,
    a_request_id_with_a_trailing_blank_is_refused_at_the_edge_and_writes_nothing,
    identifiers_compared_in_sql_match_only_their_exact_bytes,
);

async fn request_ids_that_differ_only_in_case_are_two_orders_and_each_reconciles_to_its_own(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;

    let upper = app.submit(order(1, "Req-1")).await.unwrap();
    let lower = app.submit(order(1, "req-1")).await.unwrap();

    assert!(!lower.replayed, "the second key is a new order, not a replay of the first");
    assert_ne!(lower.order_id, upper.order_id);
    assert_ne!(lower.event_id, upper.event_id);
    assert_eq!(app.count("orders").await, 2);
    assert_eq!(app.count("outbox_event").await, 2);
    assert_eq!(app.reconcile(1, "req-1").await.unwrap().order_id, lower.order_id);
    assert_eq!(app.reconcile(1, "Req-1").await.unwrap().order_id, upper.order_id);
    let missing = app.reconcile(1, "REQ-1").await.unwrap_err();
    assert_eq!((missing.code(), reason(&missing).as_str()), (Code::NotFound, "ORDER_NOT_FOUND"));

    // Other content under a key that differs only in case is a third order, not REQUEST_ID_REUSED.
    let mut other = order(1, "REQ-1");
    other.customer_id = "someone-else".to_owned();
    let third = app.submit(other).await.unwrap();
    assert!(!third.replayed);
    let found = app
        .admin
        .clone()
        .find_by_business_key(pb::FindByBusinessKeyRequest { tenant_id: 1, request_id: "req-1".to_owned() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.timeline.unwrap().event_id, lower.event_id);
}

async fn a_request_id_with_a_trailing_blank_is_refused_at_the_edge_and_writes_nothing(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    app.submit(order(1, "req-1")).await.unwrap();

    for request_id in ["req-1 ", " req-1", "req-1\t", "req-1\u{a0}"] {
        let refused = app.submit(order(1, request_id)).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{request_id:?}");
        assert_eq!(reason(&refused), "INVALID_ORDER");
        assert_eq!(violated_fields(&refused), ["request_id"]);
        let refused = app.reconcile(1, request_id).await.unwrap_err();
        assert_eq!((refused.code(), reason(&refused).as_str()), (Code::InvalidArgument, "INVALID_KEY"));
    }
    assert_eq!(app.count("orders").await, 1);
}

/// What the service stores under one spelling is not found under another: each statement counts
/// rows matching a spelling that differs from the stored one only in case or trailing blanks.
async fn identifiers_compared_in_sql_match_only_their_exact_bytes(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(1, "req-1")).await.unwrap();
    let conn = &app.conn;
    let run = |sql: String| async move {
        conn.execute_raw(Statement::from_string(conn.get_database_backend(), sql)).await.unwrap();
    };
    run(format!(
        "UPDATE outbox_event SET lease_owner = 'relay-a/1/00000000/0123456789abcdef', \
         published_topic = 'orders.v1' WHERE event_id = '{}'",
        accepted.event_id
    ))
    .await;
    // Two consumer names that differ only in case each consume the event once.
    for name in ["planner", "Planner"] {
        run(format!(
            "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) \
             VALUES ('{name}', '{}', CURRENT_TIMESTAMP)",
            accepted.event_id
        ))
        .await;
    }
    for name in ["planner", "Planner"] {
        run(format!(
            "INSERT INTO dead_letter (consumer_name, topic, partition_id, offset_id, payload, error, created_at) \
             VALUES ('{name}', 'orders.v1', 0, 7, '', 'bad', CURRENT_TIMESTAMP)"
        ))
        .await;
    }
    // The read model's tables too: each name has its own row for the same order and event.
    for name in ["planner", "Planner"] {
        run(format!(
            "INSERT INTO order_view (consumer_name, order_id, tenant_id, version, status, total_minor, last_event_id, updated_at) \
             VALUES ('{name}', 1, 1, 1, 'ACCEPTED', 100, '{}', CURRENT_TIMESTAMP)",
            accepted.event_id
        ))
        .await;
        run(format!(
            "INSERT INTO parked_event (consumer_name, event_id, order_id, version, event_type, payload, reason, parked_at) \
             VALUES ('{name}', '{}', 1, 3, 't', '', 'gap', CURRENT_TIMESTAMP)",
            accepted.event_id
        ))
        .await;
        run(format!(
            "INSERT INTO gap_release (consumer_name, order_id, from_version, to_version, released_by, reason, released_at) \
             VALUES ('{name}', 1, 2, 2, 'op', 'r', CURRENT_TIMESTAMP)"
        ))
        .await;
    }

    for (what, sql) in [
        ("request_id", "SELECT COUNT(*) FROM orders WHERE request_id IN ('REQ-1', 'req-1 ')"),
        ("customer_id", "SELECT COUNT(*) FROM orders WHERE customer_id IN ('CUSTOMER-42', 'customer-42 ')"),
        ("sku", "SELECT COUNT(*) FROM order_line WHERE sku IN ('sku-tea', 'SKU-TEA ')"),
        (
            "lease token",
            "SELECT COUNT(*) FROM outbox_event WHERE lease_owner IN \
             ('RELAY-A/1/00000000/0123456789ABCDEF', 'relay-a/1/00000000/0123456789abcdef ')",
        ),
        ("topic", "SELECT COUNT(*) FROM outbox_event WHERE published_topic IN ('ORDERS.V1', 'orders.v1 ')"),
        (
            "consumer name",
            "SELECT COUNT(*) FROM consumed_event WHERE consumer_name IN ('PLANNER', 'planner ')",
        ),
        ("dead letter topic", "SELECT COUNT(*) FROM dead_letter WHERE topic IN ('ORDERS.V1', 'orders.v1 ')"),
        ("read model", "SELECT COUNT(*) FROM order_view WHERE consumer_name IN ('PLANNER', 'planner ')"),
        ("parked event", "SELECT COUNT(*) FROM parked_event WHERE consumer_name IN ('PLANNER', 'planner ')"),
        ("gap release", "SELECT COUNT(*) FROM gap_release WHERE consumer_name IN ('PLANNER', 'planner ')"),
    ] {
        assert_eq!(app.scalar_i64(sql).await, 0, "{what} matched another spelling: {sql}");
    }
    assert_eq!(
        app.scalar_i64("SELECT COUNT(*) FROM consumed_event WHERE consumer_name = 'Planner'").await,
        1
    );
}
