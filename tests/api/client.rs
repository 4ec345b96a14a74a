//! The safe caller protocol against a real server: every path keeps the ids it started with.

use idempost_client::{Confirmation, SafeSubmitError, SafeSubmitter, SubmitPolicy};
use tonic::Code;

use crate::helpers::{Backend, TestOrder, on_every_backend, order};
use idempost_testkit::order::{amend, cancel};

fn submitter(app: &TestOrder) -> SafeSubmitter {
    let policy =
        SubmitPolicy { initial_backoff: std::time::Duration::from_millis(5), ..SubmitPolicy::default() };
    SafeSubmitter::new(app.client.clone(), policy)
}

on_every_backend!(the_safe_submitter_commits_once_and_reports_a_replay_the_second_time);

async fn the_safe_submitter_commits_once_and_reports_a_replay_the_second_time(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let mut submitter = submitter(&app);

    let first = submitter.submit(order(7, "req-1")).await.unwrap();
    let second = submitter.submit(order(7, "req-1")).await.unwrap();

    assert_eq!(first.confirmation, Confirmation::Committed);
    assert_eq!(second.confirmation, Confirmation::Replayed);
    assert_eq!(second.event_id, first.event_id);
    assert_eq!(app.count("orders").await, 1);
}

on_every_backend!(the_safe_submitter_amends_and_cancels_and_does_not_retry_a_version_conflict);

async fn the_safe_submitter_amends_and_cancels_and_does_not_retry_a_version_conflict(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let mut submitter = submitter(&app);
    let order_id = submitter.submit(order(7, "req-1")).await.unwrap().order_id;

    let amended = submitter.amend(amend("amend-1", order_id, 1, 3)).await.unwrap();
    let replayed = submitter.amend(amend("amend-1", order_id, 1, 3)).await.unwrap();
    let conflict = submitter.amend(amend("amend-2", order_id, 1, 4)).await.unwrap_err();
    let cancelled = submitter.cancel(cancel("cancel-1", order_id, 2)).await.unwrap();

    assert_eq!((amended.confirmation, amended.version, amended.calls), (Confirmation::Committed, 2, 1));
    assert_eq!((replayed.confirmation, &replayed.event_id), (Confirmation::Replayed, &amended.event_id));
    let SafeSubmitError::Rejected(status) = conflict else {
        panic!("expected a rejection, got {conflict:?}")
    };
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!((cancelled.confirmation, cancelled.version), (Confirmation::Committed, 3));
    assert_eq!(app.count("outbox_event").await, 3);
}

#[tokio::test]
async fn the_safe_submitter_does_not_retry_a_rejected_order() {
    let app = TestOrder::spawn(Backend::Sqlite).await;

    let error = submitter(&app).submit(order(0, "req-1")).await.unwrap_err();

    let SafeSubmitError::Rejected(status) = error else { panic!("expected a rejection, got {error:?}") };
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[cfg(feature = "failpoints")]
mod faults {
    use idempost::failpoint::{
        BEFORE_ORDER_TRANSACTION_COMMIT, COMMIT_FAILS_WITHOUT_COMMITTING,
        COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION,
    };
    use idempost_client::Confirmation;
    use idempost_proto::v1 as pb;

    use super::submitter;
    use crate::helpers::{Backend, TestOrder, arm, on_every_backend, order};
    use idempost_testkit::order::cancel;

    on_every_backend!(
        after_an_unknown_outcome_of_a_change_the_submitter_reconciles_and_finds_it,
        after_an_unknown_outcome_the_submitter_reconciles_and_finds_the_committed_order,
        after_an_unknown_outcome_that_did_not_commit_the_submitter_resubmits_with_the_same_ids,
        after_a_rollback_the_submitter_resubmits_with_the_same_ids,
    );

    async fn after_an_unknown_outcome_of_a_change_the_submitter_reconciles_and_finds_it(backend: Backend) {
        let app = TestOrder::spawn(backend).await;
        let order_id = app.submit(order(7, "req-1")).await.unwrap().order_id;
        arm(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*return");
        let event_id = uuid::Uuid::now_v7().to_string();
        let request =
            pb::CancelOrderRequest { event_id: event_id.clone(), ..cancel("cancel-1", order_id, 1) };

        let confirmed = submitter(&app).cancel(request).await.unwrap();

        assert_eq!(confirmed.confirmation, Confirmation::Reconciled);
        assert_eq!(
            (confirmed.calls, confirmed.version),
            (2, 2),
            "one cancel with an unknown outcome, one reconcile"
        );
        assert_eq!(confirmed.event_id, event_id);
        assert_eq!(app.count("outbox_event").await, 2);
    }

    async fn after_an_unknown_outcome_the_submitter_reconciles_and_finds_the_committed_order(
        backend: Backend,
    ) {
        let app = TestOrder::spawn(backend).await;
        arm(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*return");
        let event_id = uuid::Uuid::now_v7().to_string();

        let confirmed = submitter(&app)
            .submit(pb::SubmitOrderRequest { event_id: event_id.clone(), ..order(7, "req-1") })
            .await
            .unwrap();

        assert_eq!(confirmed.confirmation, Confirmation::Reconciled);
        assert_eq!(confirmed.calls, 2, "one submit with an unknown outcome, one reconcile");
        assert_eq!(confirmed.event_id, event_id);
        assert_eq!(app.count("orders").await, 1);
        assert_eq!(app.count("outbox_event").await, 1);
    }

    async fn after_an_unknown_outcome_that_did_not_commit_the_submitter_resubmits_with_the_same_ids(
        backend: Backend,
    ) {
        let app = TestOrder::spawn(backend).await;
        arm(COMMIT_FAILS_WITHOUT_COMMITTING, "1*return");

        let confirmed = submitter(&app).submit(order(7, "req-1")).await.unwrap();

        assert_eq!(confirmed.confirmation, Confirmation::Committed);
        assert_eq!(confirmed.calls, 3, "submit (unknown), reconcile (not found), submit again");
        let found = app.reconcile(7, "req-1").await.unwrap();
        assert_eq!(found.event_id, confirmed.event_id);
        assert_eq!(app.count("orders").await, 1);
        assert_eq!(app.count("outbox_event").await, 1);
    }

    async fn after_a_rollback_the_submitter_resubmits_with_the_same_ids(backend: Backend) {
        let app = TestOrder::spawn(backend).await;
        arm(BEFORE_ORDER_TRANSACTION_COMMIT, "2*return");
        let event_id = uuid::Uuid::now_v7().to_string();

        let confirmed = submitter(&app)
            .submit(pb::SubmitOrderRequest { event_id: event_id.clone(), ..order(7, "req-1") })
            .await
            .unwrap();

        assert_eq!(confirmed.confirmation, Confirmation::Committed);
        assert_eq!(confirmed.calls, 3);
        assert_eq!(confirmed.event_id, event_id);
        assert_eq!(app.count("outbox_event").await, 1);
    }
}
