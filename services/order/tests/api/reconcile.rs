//! Reconcile: the committed order by its idempotency key, never another tenant's.

use tonic::Code;

use crate::helpers::{Backend, TestOrder, on_every_backend, order, reason, violated_fields};

on_every_backend!(
    reconcile_finds_a_committed_order_by_tenant_and_request_id,
    reconcile_of_an_unknown_request_is_not_found,
    reconcile_never_returns_another_tenants_order,
    reconcile_rejects_an_invalid_key,
);

async fn reconcile_finds_a_committed_order_by_tenant_and_request_id(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(7, "req-1")).await.unwrap();

    let found = app.reconcile(7, "req-1").await.unwrap();

    assert_eq!(found.order_id, accepted.order_id);
    assert_eq!(found.event_id, accepted.event_id);
    assert_eq!(found.version, 1);
    assert_eq!(found.status(), idempost_proto::v1::OrderStatus::Accepted);
    assert_eq!(found.total_minor, accepted.total_minor);
}

async fn reconcile_of_an_unknown_request_is_not_found(backend: Backend) {
    let app = TestOrder::spawn(backend).await;

    let status = app.reconcile(7, "never-sent").await.unwrap_err();

    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(reason(&status), "ORDER_NOT_FOUND");
}

async fn reconcile_never_returns_another_tenants_order(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    app.submit(order(7, "shared-key")).await.unwrap();

    let status = app.reconcile(8, "shared-key").await.unwrap_err();

    assert_eq!(status.code(), Code::NotFound);
}

async fn reconcile_rejects_an_invalid_key(backend: Backend) {
    let app = TestOrder::spawn(backend).await;

    let status = app.reconcile(0, "").await.unwrap_err();

    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&status), ["tenant_id", "request_id"]);
}
