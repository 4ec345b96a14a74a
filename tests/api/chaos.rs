//! A short chaos run per database: relays and consumers SIGKILLed at random and the broker
//! restarted on its durable storage while orders arrive and are amended and cancelled; then every
//! event id is checked, and every order's versions on the topic and in the consumer's read model.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idempost_verify::{self as verify, ChaosReport, ChaosSettings, DatabaseControl};

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestDb, on_every_backend};
use crate::private_db::PrivateServer;

on_every_backend!(a_short_chaos_run_loses_nothing_and_duplicates_nothing);

async fn a_short_chaos_run_loses_nothing_and_duplicates_nothing(backend: Backend) {
    let db = TestDb::migrated(backend).await;
    let report = chaos_on(&db, Duration::from_secs(12), None).await;
    assert!(report.kills >= 3 && report.broker_restarts >= 1, "{}", report.summary());
}

/// Runs chaos with 30 orders (each accepted, amended and cancelled) over `db` and a fresh broker;
/// fails the test, keeping the services' logs, on any violation.
async fn chaos_on(
    db: &TestDb,
    duration: Duration,
    database: Option<&mut dyn DatabaseControl>,
) -> ChaosReport {
    let mut broker = TestBroker::start().await;
    let logs = tempfile::tempdir().unwrap();
    let settings = crate::helpers::verify_settings(db, &broker, &logs, Vec::new());

    let report = verify::chaos(&settings, &ChaosSettings { orders: 30, duration }, &mut broker, database)
        .await
        .unwrap();

    println!("{}", report.summary());
    if !report.violations.is_empty() {
        let kept = logs.keep();
        panic!("{}the services' logs are kept in {}", report.summary(), kept.display());
    }
    // Each order's acceptance, amendment and cancellation; every order's versions 1 to 3.
    assert_eq!((report.events_checked, report.orders_checked, report.versions_checked), (90, 30, 90));
    report
}

impl DatabaseControl for PrivateServer {
    fn restart(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.stop().await;
            // The outage itself is what chaos mode injects: the database stays away this long.
            tokio::time::sleep(Duration::from_secs(3)).await;
            self.resume().await;
        })
    }
}

mod a_chaos_run_with_a_database_restart_loses_nothing_and_duplicates_nothing {
    use crate::helpers::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn mariadb() {
        super::a_chaos_run_with_a_database_restart_loses_nothing_and_duplicates_nothing(Backend::MariaDb)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::a_chaos_run_with_a_database_restart_loses_nothing_and_duplicates_nothing(Backend::Postgres)
            .await;
    }
}

/// The database the services share is stopped and started again (a private server: the
/// machine's shared ones serve other tests) on top of the kills and the broker restart.
async fn a_chaos_run_with_a_database_restart_loses_nothing_and_duplicates_nothing(backend: Backend) {
    let mut server = PrivateServer::start(backend).await;
    let db = server.migrated_database().await;
    let report = chaos_on(&db, Duration::from_secs(16), Some(&mut server)).await;
    assert!(report.database_restarts >= 1 && report.broker_restarts >= 1, "{}", report.summary());
}
