//! The admin listener reads no more than it must: a caller without the operator scope is refused
//! an operator's method before its body is read, and no request may declare more than 64 KiB.

use std::time::Duration;

use super::{declaring, raw_connection, status_within};
use crate::helpers::Backend;
use idempost_testkit::auth::{authenticated, operator, tenant};
use idempost_testkit::wait::WAIT;

const PERMISSION_DENIED: &str = "7";
const OUT_OF_RANGE: &str = "11";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operators_method_called_without_the_operator_scope_is_refused_before_its_body_is_read() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |settings| {
        // Far longer than the test waits: only the admission can answer these calls.
        settings.security.listeners.body_timeout = Duration::from_secs(600);
        settings.security.listeners.call_timeout = Duration::from_secs(600);
    })
    .await;
    let token = tenant(&pki, 7);
    let mut connection = raw_connection(app.admin_port).await;
    for method in ["ListBacklog", "Redrive", "Purge", "Replay", "ListAudit"] {
        let path = format!("/idempost.v1.AdminService/{method}");
        let (response, _open) = declaring(&mut connection, &path, Some(&token), 1024 * 1024).await;
        assert_eq!(status_within(response, WAIT).await, PERMISSION_DENIED, "{method}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_request_declaring_more_than_sixty_four_kibibytes_is_refused_before_it_is_read() {
    let (app, pki, _dir) = authenticated(Backend::Sqlite, |settings| {
        settings.security.listeners.body_timeout = Duration::from_secs(600);
        settings.security.listeners.call_timeout = Duration::from_secs(600);
    })
    .await;
    let token = operator(&pki, "alice");
    let mut connection = raw_connection(app.admin_port).await;
    let (response, _open) =
        declaring(&mut connection, "/idempost.v1.AdminService/ListBacklog", Some(&token), 100 * 1024).await;
    assert_eq!(status_within(response, WAIT).await, OUT_OF_RANGE);
}
