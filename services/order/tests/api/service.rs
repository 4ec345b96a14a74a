//! The service around the RPCs: start-up checks, health, reflection, commit-window faults.

use idempost::service::ReadyError;
use idempost_order::{Application, Settings, StartupError};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::helpers::{Backend, TestDb, TestOrder, on_every_backend};

on_every_backend!(a_service_started_on_an_unmigrated_database_says_so_and_does_not_start);

async fn a_service_started_on_an_unmigrated_database_says_so_and_does_not_start(backend: Backend) {
    let db = TestDb::empty(backend).await;

    let error = Application::build(Settings::for_database(&db.url)).await.unwrap_err();

    assert!(matches!(error, StartupError::Ready(ReadyError::Schema(_))), "{error:?}");
    assert!(error.to_string().contains("idempost-migrate up"), "{error}");
}

#[tokio::test]
async fn health_reports_the_order_service_serving_and_reflection_lists_it() {
    let app = TestOrder::spawn(Backend::Sqlite).await;
    let mut health = HealthClient::new(app.channel().await);

    let answer = health
        .check(HealthCheckRequest { service: "idempost.v1.OrderService".to_owned() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.status(), ServingStatus::Serving);

    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(app.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers =
        reflection.server_reflection_info(futures::stream::iter([request])).await.unwrap().into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"idempost.v1.OrderService".to_owned()), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health".to_owned()), "{names:?}");
}

#[tokio::test]
async fn stopping_the_service_finishes_and_releases_the_port() {
    let app = TestOrder::spawn(Backend::Sqlite).await;
    let endpoint = tonic::transport::Endpoint::from_shared(app.channel_url()).unwrap();

    app.stop().await;

    assert!(endpoint.connect().await.is_err(), "nothing listens after the service stopped");
}

#[cfg(feature = "failpoints")]
mod commit_windows {
    use idempost::failpoint::{
        BEFORE_ORDER_TRANSACTION_COMMIT, COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION,
    };
    use idempost_proto::v1 as pb;
    use tonic::Code;

    use crate::helpers::{Backend, TestOrder, arm, metadata, on_every_backend, order, reason};

    on_every_backend!(
        a_failure_before_commit_is_rolled_back_and_leaves_neither_row,
        a_commit_whose_acknowledgement_is_lost_is_unknown_and_reconcile_finds_it,
    );

    async fn a_failure_before_commit_is_rolled_back_and_leaves_neither_row(backend: Backend) {
        let app = TestOrder::spawn(backend).await;
        arm(BEFORE_ORDER_TRANSACTION_COMMIT, "1*return");
        let event_id = uuid::Uuid::now_v7().to_string();
        let request = pb::SubmitOrderRequest { event_id: event_id.clone(), ..order(7, "req-1") };

        let status = app.submit(request.clone()).await.unwrap_err();

        assert_eq!(status.code(), Code::Aborted);
        assert_eq!(reason(&status), "ROLLED_BACK");
        assert_eq!(metadata(&status, "event_id").as_deref(), Some(event_id.as_str()));
        assert_eq!(app.count("orders").await, 0);
        assert_eq!(app.count("order_line").await, 0);
        assert_eq!(app.count("outbox_event").await, 0);

        // Safe to retry with the same ids: the order then commits under the same event id.
        let retried = app.submit(request).await.unwrap();
        assert!(!retried.replayed);
        assert_eq!(retried.event_id, event_id);
    }

    async fn a_commit_whose_acknowledgement_is_lost_is_unknown_and_reconcile_finds_it(backend: Backend) {
        let app = TestOrder::spawn(backend).await;
        arm(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*return");

        let status = app.submit(order(7, "req-1")).await.unwrap_err();

        assert_eq!(status.code(), Code::Unknown);
        assert_eq!(reason(&status), "OUTCOME_UNKNOWN");
        let event_id = metadata(&status, "event_id").expect("the unknown outcome names its event id");
        let found = app.reconcile(7, "req-1").await.unwrap();
        assert_eq!(found.event_id, event_id);
        assert_eq!(app.outbox_row(&event_id).await.unwrap().0, "PENDING");
        assert_eq!(app.count("orders").await, 1);
    }
}
