//! `verify` against each real database and a real broker: every invariant holds with evidence
//! of the duplicates and of the order's versions in order, and each deliberately broken
//! guarantee fails its own invariant.

use idempost_verify::{self as verify, Break, Report};

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestDb, on_every_backend, verify_settings};

async fn verify_with(backend: Backend, breaks: Vec<Break>) -> Report {
    let db = TestDb::migrated(backend).await;
    let broker = TestBroker::start().await;
    let logs = tempfile::tempdir().unwrap();
    let settings = verify_settings(&db, &broker, &logs, breaks);
    let report = verify::run(&settings).await.unwrap();
    if std::env::var_os("TEST_LOG").is_some() {
        eprintln!("{}", report.to_yaml());
    }
    report
}

on_every_backend!(verify_passes_every_invariant_with_evidence_of_the_duplicates);

async fn verify_passes_every_invariant_with_evidence_of_the_duplicates(backend: Backend) {
    let report = verify_with(backend, Vec::new()).await;

    assert!(report.not_taken.is_empty(), "paths not taken {:?}:\n{}", report.not_taken, report.to_yaml());
    assert!(report.passed(), "{}", report.to_yaml());
    assert_eq!(report.injections.len(), 7, "one injection per commit window");
    assert!(report.counts.broker_deliveries_for_event > 1, "the duplicate really reached the broker");
    assert!(report.counts.consumer_handle_attempts > report.counts.consumed_event_rows);
    let yaml = report.to_yaml();
    assert!(yaml.starts_with("repeatableDeliveryVerification:\n"));
    assert!(!yaml.contains(": FAIL"));
    // The order is amended and cancelled too: its three versions reach the topic in order and the
    // consumer's read model ends where the order table is.
    for invariant in ["everyOrdersVersionsInOrderOnTheTopic", "readModelEqualsOrderTable"] {
        assert_eq!(report.invariant(invariant), Some(true), "{yaml}");
    }
    assert!(yaml.contains("1 order(s), 3 version(s) checked"), "{yaml}");
}

async fn only(broken: Break, invariant: &str) {
    let report = verify_with(Backend::MariaDb, vec![broken]).await;
    // A run that never took the broken path cannot show that the break is caught.
    assert!(report.not_taken.is_empty(), "paths not taken {:?}:\n{}", report.not_taken, report.to_yaml());
    assert_eq!(report.invariant(invariant), Some(false), "{}", report.to_yaml());
    assert!(!report.passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_classifier_that_takes_any_integrity_error_for_a_duplicate_is_caught() {
    only(Break::Classifier, "onlyTargetUniqueConflictMeansAlreadyConsumed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mark_without_the_owner_condition_is_caught() {
    only(Break::MarkWithoutOwner, "staleLeaseOwnerChangesNothing").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_offset_committed_before_the_local_commit_is_caught() {
    only(Break::OffsetBeforeCommit, "everyDeliveryHandledBeforeAcknowledged").await;
}
