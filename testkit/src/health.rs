//! The gRPC health protocol as a probe asks it.

use std::time::Duration;

use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::wait::{WAIT, assert_eventually};

/// The status a health endpoint on `port` reports for `service`, if it answers at all.
pub async fn health(port: u16, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .ok()?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest { service: service.to_owned() })
        .await
        .ok()?
        .into_inner();
    Some(answer.status())
}

/// Waits until the endpoint on `port` reports `expected` for `service`.
pub async fn assert_health(what: &str, port: u16, service: &str, expected: ServingStatus) {
    assert_eventually(what, WAIT, || async { health(port, service).await == Some(expected) }).await;
}
