//! The TypeScript client (clients/typescript) against a real order service with TLS and JWT on
//! MariaDB: its tests run under node's own test runner (`node --test`) as a subprocess, and this
//! side checks what the database holds afterwards. Faults are armed here (failpoints are
//! process-global and the service runs in this process) or made by stopping a private MariaDB.

use std::path::PathBuf;

use serde_json::json;

#[cfg(feature = "failpoints")]
use tonic_health::pb::health_check_response::ServingStatus;

#[cfg(feature = "failpoints")]
use crate::helpers::assert_eventually;
use crate::helpers::{Backend, InProcess, TestDb};
use crate::pki::{AUDIENCE, ISSUER, Pki};
use idempost_testkit::node::{SLOW_WAIT, node_test};

/// An order service with TLS and JWT over `db`, the CA and token files the node tests use, and
/// the ids of the order under test.
struct Service {
    db: TestDb,
    server: InProcess,
    port: u16,
    vars: Vec<(&'static str, String)>,
    event_id: String,
    ca: PathBuf,
    _dir: tempfile::TempDir,
}

impl Service {
    async fn start(db: TestDb) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::make(dir.path()).unwrap();
        let jwks = pki.jwks.clone();
        let (db, server, port, _) = idempost_testkit::auth::tls_service_on(db, &pki, |s| {
            s.security.auth = idempost::security::AuthSettings::jwt(jwks, ISSUER, AUDIENCE)
        })
        .await;
        let token_file = |tenant_id: i64| {
            let token =
                pki.token(json!({ "sub": format!("ts-{tenant_id}"), "tenant_id": tenant_id })).unwrap();
            let path = dir.path().join(format!("tenant-{tenant_id}.jwt"));
            std::fs::write(&path, token).unwrap();
            path.display().to_string()
        };
        let event_id = uuid::Uuid::now_v7().to_string();
        let vars = vec![
            ("IDEMPOST_TS_TARGET", format!("localhost:{port}")),
            ("IDEMPOST_TS_CA_FILE", pki.ca.display().to_string()),
            ("IDEMPOST_TS_TOKEN_FILE", token_file(7)),
            ("IDEMPOST_TS_OTHER_TENANT_TOKEN_FILE", token_file(8)),
            ("IDEMPOST_TS_REQUEST_ID", "req-ts-1".to_owned()),
            ("IDEMPOST_TS_EVENT_ID", event_id.clone()),
            ("IDEMPOST_TS_AMEND_EVENT_ID", uuid::Uuid::now_v7().to_string()),
        ];
        Self { db, server, port, vars, event_id, ca: pki.ca.clone(), _dir: dir }
    }

    /// Waits until the order service's health (over TLS) reports `expected`.
    #[cfg(feature = "failpoints")]
    async fn assert_health(&self, what: &str, expected: ServingStatus) {
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let tls = idempost_client::ClientTls { ca_file: Some(self.ca.clone()), identity: None };
        let url = format!("https://localhost:{}", self.port);
        let status = || async {
            let channel = idempost_client::connect(&url, &tls).await.ok()?;
            let request = HealthCheckRequest { service: "idempost.v1.OrderService".to_owned() };
            Some(HealthClient::new(channel).check(request).await.ok()?.into_inner().status())
        };
        assert_eventually(what, SLOW_WAIT, || async { status().await == Some(expected) }).await;
    }

    /// Runs `test/service/faults.test.ts` expecting `write`, `calls` and `outcome`.
    async fn submit_through_fault(&self, expect: serde_json::Value) {
        let mut vars = self.vars.clone();
        vars.push(("IDEMPOST_TS_EXPECT", expect.to_string()));
        node_test("test/service/faults.test.ts", &vars).await;
    }

    /// Orders committed in tenant 7 as `(request_id, acceptance_event_id)`, and outbox rows.
    async fn stored(&self) -> (Vec<(String, String)>, i64) {
        use sea_orm::ConnectionTrait;
        let conn = self.db.connect().await;
        let rows = conn
            .query_all_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::MySql,
                "SELECT request_id, acceptance_event_id FROM orders WHERE tenant_id = 7 ORDER BY id",
            ))
            .await
            .unwrap();
        let orders = rows
            .iter()
            .map(|row| (row.try_get_by_index(0).unwrap(), row.try_get_by_index(1).unwrap()))
            .collect();
        let outbox = conn
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::MySql,
                "SELECT COUNT(*) FROM outbox_event",
            ))
            .await
            .unwrap()
            .unwrap()
            .try_get_by_index::<i64>(0)
            .unwrap();
        conn.close().await.unwrap();
        (orders, outbox)
    }

    /// Exactly the order under test committed, once, under the event id fixed before its first
    /// attempt, with its one outbox row.
    async fn assert_one_order(&self) {
        let (orders, outbox) = self.stored().await;
        assert_eq!(orders, [("req-ts-1".to_owned(), self.event_id.clone())]);
        assert_eq!(outbox, 1, "one outbox row with the order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_typescript_client_passes_its_unit_tests() {
    node_test("test/unit.test.ts", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_typescript_client_commits_replays_reconciles_and_is_refused_another_tenant_over_tls_with_a_token()
 {
    let service = Service::start(TestDb::migrated(Backend::MariaDb).await).await;

    node_test("test/service/outcomes.test.ts", &service.vars).await;

    service.assert_one_order().await;
    service.server.stop().await;
}

/// The order under test's `(version, status)` and its outbox rows' `(event_type, event_version)`.
async fn order_history(db: &TestDb) -> ((i64, String), Vec<(String, i64)>) {
    use sea_orm::ConnectionTrait;
    let conn = db.connect().await;
    let query = |sql: &str| sea_orm::Statement::from_string(sea_orm::DbBackend::MySql, sql.to_owned());
    let order = conn
        .query_one_raw(query(
            "SELECT version, status FROM orders WHERE tenant_id = 7 AND request_id = 'req-ts-1'",
        ))
        .await
        .unwrap()
        .expect("the order under test committed");
    let events = conn
        .query_all_raw(query("SELECT event_type, event_version FROM outbox_event ORDER BY event_version"))
        .await
        .unwrap();
    conn.close().await.unwrap();
    let order = (order.try_get_by_index(0).unwrap(), order.try_get_by_index(1).unwrap());
    let events = events
        .iter()
        .map(|row| (row.try_get_by_index(0).unwrap(), row.try_get_by_index(1).unwrap()))
        .collect();
    (order, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_typescript_client_amends_and_cancels_an_order_and_is_refused_a_stale_version_and_a_change_after_cancel()
 {
    let service = Service::start(TestDb::migrated(Backend::MariaDb).await).await;

    node_test("test/service/changes.test.ts", &service.vars).await;

    let (order, events) = order_history(&service.db).await;
    assert_eq!(
        order,
        (3, "CANCELLED".to_owned()),
        "amended to 2, cancelled at 3; the refusals wrote nothing"
    );
    let types = [
        idempost::contract::EVENT_TYPE,
        idempost::contract::ORDER_AMENDED_EVENT_TYPE,
        idempost::contract::ORDER_CANCELLED_EVENT_TYPE,
    ];
    assert_eq!(events, types.iter().zip(1..).map(|(t, v)| ((*t).to_owned(), v)).collect::<Vec<_>>());
    service.server.stop().await;
}

#[cfg(feature = "failpoints")]
mod faults {
    use idempost::failpoint::{
        BEFORE_ORDER_TRANSACTION_COMMIT, COMMIT_FAILS_WITHOUT_COMMITTING,
        COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION,
    };
    use serde_json::json;
    use tonic_health::pb::health_check_response::ServingStatus;

    use super::Service;
    use crate::helpers::{Backend, TestDb, arm};
    use crate::private_db::PrivateServer;

    async fn mariadb_service() -> Service {
        Service::start(TestDb::migrated(Backend::MariaDb).await).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn after_an_unknown_outcome_that_committed_the_typescript_client_reconciles_and_finds_the_order() {
        let service = mariadb_service().await;
        arm(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*return");

        service
            .submit_through_fault(json!({
                "calls": ["submit UNKNOWN OUTCOME_UNKNOWN", "reconcile OK"],
                "outcome": "reconciled",
            }))
            .await;

        service.assert_one_order().await;
        service.server.stop().await;
    }

    /// The submission passes the failpoint (`1*off`); the amendment's commit succeeds but its
    /// answer is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn after_an_unknown_outcome_of_an_amendment_that_committed_the_typescript_client_reconciles_and_finds_the_change()
     {
        let service = mariadb_service().await;
        arm(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*off->1*return");

        service
            .submit_through_fault(json!({
                "write": "amend",
                "calls": ["amend UNKNOWN OUTCOME_UNKNOWN", "reconcile OK"],
                "outcome": "reconciled",
            }))
            .await;

        let (order, events) = super::order_history(&service.db).await;
        assert_eq!((order.0, events.len()), (2, 2), "the amendment committed once: {events:?}");
        service.server.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn after_an_unknown_outcome_that_did_not_commit_the_typescript_client_resubmits_with_the_same_ids()
    {
        let service = mariadb_service().await;
        arm(COMMIT_FAILS_WITHOUT_COMMITTING, "1*return");

        service
            .submit_through_fault(json!({
                "calls": ["submit UNKNOWN OUTCOME_UNKNOWN", "reconcile NOT_FOUND ORDER_NOT_FOUND", "submit OK"],
                "outcome": "committed",
            }))
            .await;

        service.assert_one_order().await;
        service.server.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn after_a_rollback_the_typescript_client_resubmits_at_once_with_the_same_ids() {
        let service = mariadb_service().await;
        arm(BEFORE_ORDER_TRANSACTION_COMMIT, "2*return");

        service
            .submit_through_fault(json!({
                "calls": ["submit ABORTED ROLLED_BACK", "submit ABORTED ROLLED_BACK", "submit OK"],
                "outcome": "committed",
            }))
            .await;

        service.assert_one_order().await;
        service.server.stop().await;
    }

    /// Not a failpoint: the database really stops (a private MariaDB), so no transaction can
    /// begin and the service answers UNAVAILABLE DATABASE_UNAVAILABLE; the client resubmits
    /// (never Reconcile: nothing was written), gives up, and once the database is back the same
    /// ids commit the order once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn while_the_database_is_down_the_typescript_client_resubmits_and_later_commits_with_the_same_ids()
    {
        let mut database = PrivateServer::start(Backend::MariaDb).await;
        let service = Service::start(database.migrated_database().await).await;
        database.stop().await;
        service.assert_health("the order service is NOT_SERVING", ServingStatus::NotServing).await;

        service
            .submit_through_fault(json!({
                "calls": ["submit UNAVAILABLE DATABASE_UNAVAILABLE", "submit UNAVAILABLE DATABASE_UNAVAILABLE"],
                "outcome": "gave_up",
                "maxCalls": 2,
            }))
            .await;
        database.resume().await;
        service.assert_health("the order service is SERVING again", ServingStatus::Serving).await;
        service.submit_through_fault(json!({ "calls": ["submit OK"], "outcome": "committed" })).await;

        service.assert_one_order().await;
        service.server.stop().await;
    }
}

/// Records a relay published in each CloudEvents content mode, read from the broker with kafkajs
/// and parsed with the npm `cloudevents` package's `Kafka.toEvent` (test/service/cloudevents.test.ts),
/// the data decoded with the generated stubs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_typescript_cloudevents_sdk_reads_binary_and_structured_records_from_the_broker() {
    use idempost_testkit::cloudevents::{PublishedTopic, published_in};
    let broker = crate::broker::TestBroker::start().await;
    let binary = published_in(&broker, idempost_relay::CloudEventsMode::Binary).await;
    let structured = published_in(&broker, idempost_relay::CloudEventsMode::Structured).await;
    let expected = |topic: &PublishedTopic| -> serde_json::Value {
        topic
            .events
            .iter()
            .map(|e| json!({"id": e.event_id, "type": e.event_type, "orderId": e.order_id.to_string(), "version": e.version.to_string()}))
            .collect()
    };
    let vars = [
        ("IDEMPOST_CE_BROKERS", broker.address()),
        (
            "IDEMPOST_CE_TOPICS",
            json!({
                "binary": {"topic": binary.name, "events": expected(&binary)},
                "structured": {"topic": structured.name, "events": expected(&structured)},
            })
            .to_string(),
        ),
    ];
    node_test("test/service/cloudevents.test.ts", &vars).await;
    binary.app.stop().await;
    structured.app.stop().await;
}

/// The hooks for users' own tests: `awaitPublished` and `awaitConsumed`, run by node's test
/// runner (`clients/typescript/test/service/await.test.ts`) against the services started here.
mod awaiting {
    use idempost::security::AuthSettings;
    use idempost_consumer::DEFAULT_CONSUMER_NAME;
    use idempost_testkit::auth::{authenticated, operator, tenant, with_token};
    use idempost_testkit::consumer::{TestConsumer, consumer_settings};
    use idempost_testkit::node::node_test;
    use idempost_testkit::pki::{AUDIENCE, ISSUER};
    use idempost_testkit::relay::{TestRelay, relay_defaults};
    use idempost_testkit::set_aside::{dead_letter, fail_event};

    use crate::broker::TestBroker;
    use crate::helpers::{Backend, order};

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_typescript_client_awaits_publication_and_consumption_and_each_way_a_wait_ends() {
        let (app, pki, dir) = authenticated(Backend::MariaDb, |_| {}).await;
        let broker = TestBroker::start().await;
        let topic = idempost_testkit::topic::unique("idempost-await");
        broker.create_topic(&topic, 1).await;
        let token_file = |name: &str, token: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, token).unwrap();
            path.display().to_string()
        };
        let own = tenant(&pki, 1);
        let submit = |request_id: &str| {
            let mut client = app.client.clone();
            let request = with_token(order(1, request_id), &own);
            async move { client.submit_order(request).await.unwrap().into_inner().event_id }
        };
        // Both committed before a relay runs: the first flows once it starts, the second was
        // given up (FAILED), which no relay touches.
        let (flowing, failed) = (submit("ts-await-1").await, submit("ts-await-2").await);
        fail_event(&app.conn, &failed).await;
        let dead = dead_letter(&app.conn, DEFAULT_CONSUMER_NAME, &topic).await;
        let relay = TestRelay::spawn(relay_defaults(&app.db.url, &broker.address(), &topic)).await;
        let mut settings = consumer_settings(&app.db.url, &broker.address(), &topic, "await-ts");
        settings.auth = AuthSettings::jwt(pki.jwks.clone(), ISSUER, AUDIENCE);
        let consumer = TestConsumer::spawn(settings).await;

        let vars = [
            ("IDEMPOST_TS_ADMIN_TARGET", format!("127.0.0.1:{}", app.admin_port)),
            ("IDEMPOST_TS_CONSUMER_TARGET", format!("127.0.0.1:{}", consumer.port)),
            ("IDEMPOST_TS_TOKEN_FILE", token_file("own", own.clone())),
            ("IDEMPOST_TS_OTHER_TENANT_TOKEN_FILE", token_file("other", tenant(&pki, 2))),
            ("IDEMPOST_TS_OPERATOR_TOKEN_FILE", token_file("ops", operator(&pki, "ops"))),
            ("IDEMPOST_TS_CONSUMER_NAME", DEFAULT_CONSUMER_NAME.to_owned()),
            ("IDEMPOST_TS_EVENT_ID", flowing),
            ("IDEMPOST_TS_FAILED_EVENT_ID", failed),
            ("IDEMPOST_TS_DEAD_EVENT_ID", dead),
        ];
        node_test("test/service/await.test.ts", &vars).await;
        consumer.stop().await;
        relay.stop().await;
        app.stop().await;
    }
}
