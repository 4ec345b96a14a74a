//! A short chaos run per database: relays and consumers SIGKILLed at random and the broker
//! restarted on its durable storage while orders arrive; then every event id is checked.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use outpost::verify::{self, BrokerControl, ChaosSettings};

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestDb, on_every_backend};

impl BrokerControl for TestBroker {
    fn restart(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.kill();
            self.run().await;
        })
    }
}

on_every_backend!(a_short_chaos_run_loses_nothing_and_duplicates_nothing);

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
