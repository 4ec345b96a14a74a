//! A short chaos run per database: relays and consumers SIGKILLed at random and the broker
//! restarted on its durable storage while orders arrive; then every event id is checked.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use outpost::verify::{self, BrokerControl, ChaosSettings};

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestDb};

impl BrokerControl for TestBroker {
    fn restart(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.kill();
            self.run().await;
        })
    }
}

// Not yet in the default run: in about one run in four, Tansu 0.6 leaves a partition assigned to
// no live member after a killed consumer's session expires (its records stay on the topic,
// unconsumed, until another rebalance). Run it with `cargo nextest run --all-features
// --run-ignored all -E 'test(/chaos/)'`; see the issue note for the evidence.
mod ignored {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "Tansu 0.6 can leave a partition unassigned after a member expires; see the chaos note"]
    async fn mariadb() {
        super::a_short_chaos_run_loses_nothing_and_duplicates_nothing(Backend::MariaDb).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "Tansu 0.6 can leave a partition unassigned after a member expires; see the chaos note"]
    async fn postgres() {
        super::a_short_chaos_run_loses_nothing_and_duplicates_nothing(Backend::Postgres).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "Tansu 0.6 can leave a partition unassigned after a member expires; see the chaos note"]
    async fn sqlite() {
        super::a_short_chaos_run_loses_nothing_and_duplicates_nothing(Backend::Sqlite).await;
    }
}

async fn a_short_chaos_run_loses_nothing_and_duplicates_nothing(backend: Backend) {
    let db = TestDb::migrated(backend).await;
    let mut broker = TestBroker::start().await;
    let logs = tempfile::tempdir().unwrap();
    let settings = crate::verify::settings(&db, &broker, &logs, Vec::new());

    let report = verify::chaos(
        &settings,
        &ChaosSettings { orders: 30, duration: Duration::from_secs(12) },
        &mut broker,
    )
    .await
    .unwrap();

    println!("{}", report.summary());
    if !report.violations.is_empty() {
        let kept = logs.keep();
        panic!("{}the services' logs are kept in {}", report.summary(), kept.display());
    }
    assert_eq!(report.events_checked, 30);
    assert!(report.kills >= 3 && report.broker_restarts >= 1, "{}", report.summary());
}
