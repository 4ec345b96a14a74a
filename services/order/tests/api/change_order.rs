//! AmendOrder and CancelOrder: each change commits the next version of the order with exactly one
//! outbox event, idempotently by `(tenant_id, request_id)` in the tenant's one key space, and a
//! refused change writes nothing and says why.

use std::sync::Arc;

use futures::future::join_all;
use idempost_proto::v1::{self as pb, OrderAmended, OrderCancelled};
use prost::Message;

use tonic::Code;

use crate::helpers::{
    Backend, TestOrder, amend, cancel, metadata, on_every_backend, order, reason, violated_fields,
};

on_every_backend!(
    an_amendment_and_a_cancellation_each_commit_the_next_version_with_one_outbox_row,
    a_replayed_change_returns_the_original_answer_even_after_the_order_moved_on,
    a_key_used_by_any_operation_is_request_id_reused_for_every_other_content,
    refused_changes_write_nothing_and_name_the_reason,
    concurrent_amends_of_one_order_have_exactly_one_winner_per_version_and_lose_no_update,
    the_timeline_shows_every_version_of_the_order_with_its_events_state,
);

async fn an_amendment_and_a_cancellation_each_commit_the_next_version_with_one_outbox_row(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(7, "submit-1")).await.unwrap();
    let order_id = accepted.order_id;

    let amended = app
        .amend(pb::AmendOrderRequest {
            customer_id: "customer-43".into(),
            ..amend("amend-1", order_id, 1, 3)
        })
        .await
        .unwrap();

    assert_eq!(amended.outcome(), pb::TransactionOutcome::Committed);
    assert!(!amended.replayed);
    assert_eq!((amended.order_id, amended.version, amended.total_minor), (order_id, 2, 3_000));
    assert_eq!(app.order_state(order_id).await, (2, "ACCEPTED".to_owned()));
    assert_eq!(app.count("outbox_event").await, 2);
    let (event_type, version, aggregate_type, aggregate_id) = app.outbox_headers(&amended.event_id).await;
    assert_eq!(
        (event_type.as_str(), version, aggregate_type.as_str(), aggregate_id),
        ("idempost.v1.OrderAmended", 2, "order", order_id.to_string())
    );
    let (status, payload) = app.outbox_row(&amended.event_id).await.unwrap();
    assert_eq!(status, "PENDING");
    let event = OrderAmended::decode(payload.as_slice()).unwrap();
    assert_eq!(
        (event.event_id.as_str(), event.event_version, event.order_id),
        (amended.event_id.as_str(), 2, order_id)
    );
    assert_eq!((event.tenant_id, event.request_id.as_str()), (7, "amend-1"));
    assert_eq!((event.customer_id.as_str(), event.currency.as_str()), ("customer-43", "EUR"));
    assert_eq!(event.line_items, amend("amend-1", order_id, 1, 3).line_items);
    assert_eq!(event.total_minor, 3_000);
    assert_eq!(event.amended_at, amended.amended_at);
    assert_eq!(app.count("order_line").await, 1, "the lines were replaced");

    // Only the customer: the lines stay, and the snapshot still carries them.
    let customer_only = pb::AmendOrderRequest {
        line_items: Vec::new(),
        customer_id: "customer-44".into(),
        ..amend("amend-2", order_id, 2, 1)
    };
    let second = app.amend(customer_only).await.unwrap();
    assert_eq!((second.version, second.total_minor), (3, 3_000));
    let event = OrderAmended::decode(app.outbox_row(&second.event_id).await.unwrap().1.as_slice()).unwrap();
    assert_eq!(
        (event.customer_id.as_str(), event.line_items.len(), event.total_minor),
        ("customer-44", 1, 3_000)
    );

    let cancelled = app.cancel(cancel("cancel-1", order_id, 3)).await.unwrap();

    assert_eq!(cancelled.outcome(), pb::TransactionOutcome::Committed);
    assert_eq!((cancelled.order_id, cancelled.version), (order_id, 4));
    assert_eq!(app.order_state(order_id).await, (4, "CANCELLED".to_owned()));
    assert_eq!(app.count("outbox_event").await, 4, "one event per change");
    let (event_type, version, _, _) = app.outbox_headers(&cancelled.event_id).await;
    assert_eq!((event_type.as_str(), version), ("idempost.v1.OrderCancelled", 4));
    let event =
        OrderCancelled::decode(app.outbox_row(&cancelled.event_id).await.unwrap().1.as_slice()).unwrap();
    assert_eq!((event.event_version, event.order_id, event.request_id.as_str()), (4, order_id, "cancel-1"));
    assert_eq!(event.reason(), pb::CancelReason::OutOfStock);
    assert_eq!((event.note.as_str(), event.total_minor), ("the supplier is out of blue mugs", 3_000));
    assert_eq!(event.cancelled_at, cancelled.cancelled_at);

    // Reconcile finds every operation by its key, with the version it made and the order's now.
    for (key, operation, version, event_id) in [
        ("submit-1", pb::OrderOperation::Submit, 1, &accepted.event_id),
        ("amend-1", pb::OrderOperation::Amend, 2, &amended.event_id),
        ("cancel-1", pb::OrderOperation::Cancel, 4, &cancelled.event_id),
    ] {
        let found = app.reconcile(7, key).await.unwrap();
        assert_eq!(found.operation(), operation, "{key}");
        assert_eq!((found.order_id, found.version, found.current_version), (order_id, version, 4), "{key}");
        assert_eq!(&found.event_id, event_id, "{key}");
        assert_eq!(found.status(), pb::OrderStatus::Cancelled, "{key}");
        assert_eq!(found.accepted_at, accepted.accepted_at, "{key}");
    }
    assert_eq!(app.reconcile(7, "cancel-1").await.unwrap().committed_at, cancelled.cancelled_at);
    app.stop().await;
}

async fn a_replayed_change_returns_the_original_answer_even_after_the_order_moved_on(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(7, "submit-1")).await.unwrap();
    let order_id = accepted.order_id;
    let amended = app.amend(amend("amend-1", order_id, 1, 3)).await.unwrap();

    let again = app.amend(amend("amend-1", order_id, 1, 3)).await.unwrap();
    // A new event id for the same change: the change happened once, under the first.
    let with_new_event_id = app
        .amend(pb::AmendOrderRequest {
            event_id: uuid::Uuid::now_v7().to_string(),
            ..amend("amend-1", order_id, 1, 3)
        })
        .await
        .unwrap();
    let cancelled = app.cancel(cancel("cancel-1", order_id, 2)).await.unwrap();
    // Once the order moved on (and even once it is cancelled), the replay is still a replay.
    let late = app.amend(amend("amend-1", order_id, 1, 3)).await.unwrap();
    let cancel_again = app.cancel(cancel("cancel-1", order_id, 2)).await.unwrap();
    // And the original submission too, though its lines were replaced since.
    let resubmitted = app.submit(order(7, "submit-1")).await.unwrap();

    for replay in [&again, &with_new_event_id, &late] {
        assert!(replay.replayed);
        assert_eq!(replay.outcome(), pb::TransactionOutcome::Committed);
        assert_eq!((replay.event_id.as_str(), replay.version), (amended.event_id.as_str(), 2));
        assert_eq!((replay.total_minor, replay.amended_at), (amended.total_minor, amended.amended_at));
    }
    assert!(cancel_again.replayed);
    assert_eq!((cancel_again.event_id.as_str(), cancel_again.version), (cancelled.event_id.as_str(), 3));
    assert_eq!(cancel_again.cancelled_at, cancelled.cancelled_at);
    assert!(resubmitted.replayed);
    assert_eq!((resubmitted.event_id.as_str(), resubmitted.version), (accepted.event_id.as_str(), 1));
    assert_eq!(resubmitted.total_minor, accepted.total_minor);
    assert_eq!(app.count("outbox_event").await, 3, "replays write nothing");
    assert_eq!(app.order_state(order_id).await, (3, "CANCELLED".to_owned()));
    app.stop().await;
}

async fn a_key_used_by_any_operation_is_request_id_reused_for_every_other_content(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(7, "submit-1")).await.unwrap();
    let order_id = accepted.order_id;
    let amended = app.amend(amend("amend-1", order_id, 1, 3)).await.unwrap();

    let refusals = [
        // Other lines, another expected version, a cancellation, under the amendment's key.
        (app.amend(amend("amend-1", order_id, 1, 4)).await.unwrap_err(), &amended.event_id),
        (app.amend(amend("amend-1", order_id, 2, 3)).await.unwrap_err(), &amended.event_id),
        // The customer set to "-", where the amendment kept the customer (an empty customer_id).
        (
            app.amend(pb::AmendOrderRequest { customer_id: "-".into(), ..amend("amend-1", order_id, 1, 3) })
                .await
                .unwrap_err(),
            &amended.event_id,
        ),
        (app.cancel(cancel("amend-1", order_id, 2)).await.unwrap_err(), &amended.event_id),
        // A submission under a change's key, and changes under a submission's.
        (app.submit(order(7, "amend-1")).await.unwrap_err(), &amended.event_id),
        (app.amend(amend("submit-1", order_id, 2, 3)).await.unwrap_err(), &accepted.event_id),
        (app.cancel(cancel("submit-1", order_id, 2)).await.unwrap_err(), &accepted.event_id),
    ];

    for (i, (status, holder)) in refusals.iter().enumerate() {
        assert_eq!(status.code(), Code::AlreadyExists, "{i}: {status:?}");
        assert_eq!(reason(status), "REQUEST_ID_REUSED", "{i}");
        assert_eq!(metadata(status, "event_id").as_ref(), Some(*holder), "{i}");
        assert_eq!(metadata(status, "tenant_id").as_deref(), Some("7"), "{i}");
    }
    // Another tenant has a key space of its own.
    let other = app.submit(order(8, "amend-1")).await.unwrap();
    assert!(!other.replayed);
    // The event id of one operation is no other's.
    let reused_event = app
        .amend(pb::AmendOrderRequest {
            event_id: accepted.event_id.clone(),
            ..amend("amend-2", order_id, 2, 5)
        })
        .await
        .unwrap_err();
    assert_eq!(
        (reused_event.code(), reason(&reused_event).as_str()),
        (Code::AlreadyExists, "EVENT_ID_IN_USE")
    );
    let reused_event = app
        .submit(pb::SubmitOrderRequest { event_id: amended.event_id.clone(), ..order(7, "submit-2") })
        .await
        .unwrap_err();
    assert_eq!(
        (reused_event.code(), reason(&reused_event).as_str()),
        (Code::AlreadyExists, "EVENT_ID_IN_USE")
    );
    assert_eq!(app.order_state(order_id).await, (2, "ACCEPTED".to_owned()));
    assert_eq!(app.count("outbox_event").await, 3, "two for tenant 7, one for tenant 8");
    assert_eq!(app.count("orders").await, 2);
    app.stop().await;
}

async fn refused_changes_write_nothing_and_name_the_reason(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let order_id = app.submit(order(7, "submit-1")).await.unwrap().order_id;
    let elsewhere = app.submit(order(8, "submit-8")).await.unwrap().order_id;

    let ahead = app.amend(amend("amend-ahead", order_id, 5, 3)).await.unwrap_err();
    assert_eq!((ahead.code(), reason(&ahead).as_str()), (Code::FailedPrecondition, "VERSION_CONFLICT"));
    assert_eq!(metadata(&ahead, "current_version").as_deref(), Some("1"));
    assert_eq!(metadata(&ahead, "request_id").as_deref(), Some("amend-ahead"));
    assert!(metadata(&ahead, "event_id").is_some());
    app.amend(amend("amend-1", order_id, 1, 3)).await.unwrap();
    let stale = app.cancel(cancel("cancel-stale", order_id, 1)).await.unwrap_err();
    assert_eq!((stale.code(), reason(&stale).as_str()), (Code::FailedPrecondition, "VERSION_CONFLICT"));
    assert_eq!(metadata(&stale, "current_version").as_deref(), Some("2"));

    for status in [
        app.amend(amend("amend-missing", order_id + 1_000, 1, 3)).await.unwrap_err(),
        // Another tenant's order is no order of this tenant's.
        app.amend(amend("amend-elsewhere", elsewhere, 1, 3)).await.unwrap_err(),
        app.cancel(cancel("cancel-elsewhere", elsewhere, 1)).await.unwrap_err(),
    ] {
        assert_eq!(
            (status.code(), reason(&status).as_str()),
            (Code::NotFound, "ORDER_NOT_FOUND"),
            "{status:?}"
        );
    }

    app.cancel(cancel("cancel-1", order_id, 2)).await.unwrap();
    for status in [
        app.amend(amend("amend-late", order_id, 3, 3)).await.unwrap_err(),
        app.cancel(cancel("cancel-twice", order_id, 3)).await.unwrap_err(),
    ] {
        assert_eq!(
            (status.code(), reason(&status).as_str()),
            (Code::FailedPrecondition, "ORDER_CANCELLED"),
            "{status:?}"
        );
        assert_eq!(metadata(&status, "current_version").as_deref(), Some("3"));
    }

    let empty = app
        .amend(pb::AmendOrderRequest { line_items: Vec::new(), ..amend("amend-empty", order_id, 3, 1) })
        .await
        .unwrap_err();
    assert_eq!((empty.code(), reason(&empty).as_str()), (Code::InvalidArgument, "INVALID_ORDER"));
    assert_eq!(violated_fields(&empty), ["line_items"]);
    let unspecified = pb::CancelOrderRequest {
        reason: pb::CancelReason::Unspecified.into(),
        expected_version: 0,
        order_id: 0,
        ..cancel("cancel-bad", order_id, 3)
    };
    let invalid = app.cancel(unspecified).await.unwrap_err();
    assert_eq!(violated_fields(&invalid), ["reason", "order_id", "expected_version"]);

    assert_eq!(app.order_state(order_id).await, (3, "CANCELLED".to_owned()));
    assert_eq!(app.order_state(elsewhere).await, (1, "ACCEPTED".to_owned()));
    assert_eq!(app.count("outbox_event").await, 4, "two submissions, one amendment, one cancellation");
    assert_eq!(app.count("order_version").await, 4);
    for refused in
        ["amend-ahead", "cancel-stale", "amend-missing", "amend-late", "cancel-twice", "amend-empty"]
    {
        assert_eq!(app.reconcile(7, refused).await.unwrap_err().code(), Code::NotFound, "{refused}");
    }
    app.stop().await;
}

/// Callers racing each version of one order.
const RACERS: u32 = 16;
const ROUNDS: i64 = 3;

async fn concurrent_amends_of_one_order_have_exactly_one_winner_per_version_and_lose_no_update(
    backend: Backend,
) {
    let app = Arc::new(TestOrder::spawn(backend).await);
    let order_id = app.submit(order(7, "submit-1")).await.unwrap().order_id;

    let mut last_winner = None;
    for round in 1..=ROUNDS {
        // Every racer read version `round` and changes it to its own quantity.
        let answers = join_all((1..=RACERS).map(|racer| {
            let app = Arc::clone(&app);
            tokio::spawn(async move {
                let request = amend(&format!("race-{round}-{racer}"), order_id, round, racer);
                (racer, app.amend(request).await)
            })
        }))
        .await;

        let mut winners = Vec::new();
        for answer in answers {
            match answer.unwrap() {
                (racer, Ok(won)) => winners.push((racer, won)),
                (racer, Err(status)) => {
                    assert_eq!(
                        reason(&status),
                        "VERSION_CONFLICT",
                        "round {round}, racer {racer}: {status:?}"
                    );
                    assert_eq!(metadata(&status, "current_version"), Some((round + 1).to_string()));
                }
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one winner, got {winners:?}");
        let (racer, won) = winners.remove(0);
        assert_eq!(won.version, round + 1);
        last_winner = Some((racer, won));
    }

    let (racer, won) = last_winner.unwrap();
    assert_eq!(app.order_state(order_id).await, (ROUNDS + 1, "ACCEPTED".to_owned()));
    assert_eq!(app.count("order_version").await, ROUNDS + 1, "one row per version");
    assert_eq!(app.count("outbox_event").await, ROUNDS + 1, "one event per version");
    // No lost update: the order holds exactly what the last winner wrote.
    let lines = format!("FROM order_line WHERE order_id = {order_id}");
    assert_eq!(app.scalar_i64(&format!("SELECT COUNT(*) {lines}")).await, 1);
    assert_eq!(app.scalar_i64(&format!("SELECT COUNT(*) {lines} AND quantity = {racer}")).await, 1);
    assert_eq!(
        app.scalar_i64(&format!("SELECT total FROM orders WHERE id = {order_id}")).await,
        won.total_minor
    );
    // Every version's event exists once, numbered 1..=ROUNDS + 1.
    let versions = app
        .scalar_i64(&format!(
            "SELECT COUNT(DISTINCT event_version) FROM outbox_event WHERE aggregate_id = '{order_id}'"
        ))
        .await;
    assert_eq!(versions, ROUNDS + 1);
}

async fn the_timeline_shows_every_version_of_the_order_with_its_events_state(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(7, "submit-1")).await.unwrap();
    let amended = app.amend(amend("amend-1", accepted.order_id, 1, 3)).await.unwrap();
    let cancelled = app.cancel(cancel("cancel-1", accepted.order_id, 2)).await.unwrap();

    let found = app
        .admin
        .clone()
        .find_by_business_key(pb::FindByBusinessKeyRequest { tenant_id: 7, request_id: "amend-1".into() })
        .await
        .unwrap()
        .into_inner()
        .timeline
        .unwrap();
    let by_event = app
        .admin
        .clone()
        .get_event_timeline(pb::GetEventTimelineRequest { event_id: cancelled.event_id.clone() })
        .await
        .unwrap()
        .into_inner()
        .timeline
        .unwrap();

    assert_eq!(found.event_id, amended.event_id);
    assert_eq!(found.outbox.as_ref().unwrap().status, "PENDING");
    assert_eq!(by_event.event_id, cancelled.event_id);
    for timeline in [&found, &by_event] {
        let order = timeline.order.as_ref().unwrap();
        assert_eq!(
            (order.order_id, order.version, order.status.as_str()),
            (accepted.order_id, 3, "CANCELLED")
        );
        assert_eq!(order.request_id, "submit-1");
        let events: Vec<_> = timeline
            .order_events
            .iter()
            .map(|e| {
                (
                    e.version,
                    e.event_id.as_str(),
                    e.event_type.as_str(),
                    e.operation.as_str(),
                    e.outbox_status.as_str(),
                )
            })
            .collect();
        assert_eq!(
            events,
            [
                (1, accepted.event_id.as_str(), "idempost.v1.OrderAccepted", "SUBMIT", "PENDING"),
                (2, amended.event_id.as_str(), "idempost.v1.OrderAmended", "AMEND", "PENDING"),
                (3, cancelled.event_id.as_str(), "idempost.v1.OrderCancelled", "CANCEL", "PENDING"),
            ]
        );
        assert_eq!(timeline.order_events[1].request_id, "amend-1");
        assert_eq!(timeline.order_events[2].committed_at, cancelled.cancelled_at);
    }
    app.stop().await;
}

#[cfg(feature = "failpoints")]
mod faults {
    use idempost::failpoint::{
        BEFORE_ORDER_TRANSACTION_COMMIT, COMMIT_FAILS_WITHOUT_COMMITTING,
        COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION,
    };
    use idempost_proto::v1 as pb;
    use tonic::Code;

    use crate::helpers::{Backend, TestOrder, arm, metadata, on_every_backend, order, reason};
    use crate::helpers::{amend, cancel};

    on_every_backend!(
        a_change_rolled_back_before_commit_wrote_nothing_and_commits_when_retried_with_the_same_ids,
        a_change_whose_commit_was_acknowledged_but_lost_is_unknown_and_reconcile_finds_it,
        a_change_whose_commit_failed_is_unknown_never_rolled_back_and_reconcile_finds_nothing,
    );

    async fn a_change_rolled_back_before_commit_wrote_nothing_and_commits_when_retried_with_the_same_ids(
        backend: Backend,
    ) {
        let app = TestOrder::spawn(backend).await;
        let order_id = app.submit(order(7, "submit-1")).await.unwrap().order_id;
        arm(BEFORE_ORDER_TRANSACTION_COMMIT, "1*return");
        let event_id = uuid::Uuid::now_v7().to_string();
        let request =
            pb::AmendOrderRequest { event_id: event_id.clone(), ..amend("amend-1", order_id, 1, 3) };

        let status = app.amend(request.clone()).await.unwrap_err();

        assert_eq!((status.code(), reason(&status).as_str()), (Code::Aborted, "ROLLED_BACK"));
        assert_eq!(metadata(&status, "event_id"), Some(event_id.clone()));
        assert_eq!(app.order_state(order_id).await, (1, "ACCEPTED".to_owned()));
        assert_eq!(app.count("outbox_event").await, 1);
        assert_eq!(app.count("order_line").await, 2, "the old lines are back");
        let retried = app.amend(request).await.unwrap();
        assert!(!retried.replayed);
        assert_eq!((retried.event_id, retried.version), (event_id, 2));
        assert_eq!(app.count("outbox_event").await, 2);
        app.stop().await;
    }

    async fn a_change_whose_commit_was_acknowledged_but_lost_is_unknown_and_reconcile_finds_it(
        backend: Backend,
    ) {
        let app = TestOrder::spawn(backend).await;
        let order_id = app.submit(order(7, "submit-1")).await.unwrap().order_id;
        arm(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*return");
        let event_id = uuid::Uuid::now_v7().to_string();
        let request =
            pb::CancelOrderRequest { event_id: event_id.clone(), ..cancel("cancel-1", order_id, 1) };

        let status = app.cancel(request.clone()).await.unwrap_err();

        assert_eq!((status.code(), reason(&status).as_str()), (Code::Unknown, "OUTCOME_UNKNOWN"));
        let found = app.reconcile(7, "cancel-1").await.unwrap();
        assert_eq!(found.operation(), pb::OrderOperation::Cancel);
        assert_eq!(
            (found.event_id.as_str(), found.version, found.current_version),
            (event_id.as_str(), 2, 2)
        );
        assert_eq!(found.status(), pb::OrderStatus::Cancelled);
        let again = app.cancel(request).await.unwrap();
        assert!(again.replayed);
        assert_eq!(app.count("outbox_event").await, 2);
        app.stop().await;
    }

    async fn a_change_whose_commit_failed_is_unknown_never_rolled_back_and_reconcile_finds_nothing(
        backend: Backend,
    ) {
        let app = TestOrder::spawn(backend).await;
        let order_id = app.submit(order(7, "submit-1")).await.unwrap().order_id;
        arm(COMMIT_FAILS_WITHOUT_COMMITTING, "1*return");
        let request = amend("amend-1", order_id, 1, 3);

        let status = app.amend(request.clone()).await.unwrap_err();

        assert_eq!((status.code(), reason(&status).as_str()), (Code::Unknown, "OUTCOME_UNKNOWN"));
        assert_eq!(app.reconcile(7, "amend-1").await.unwrap_err().code(), Code::NotFound);
        assert_eq!(app.order_state(order_id).await, (1, "ACCEPTED".to_owned()));
        let retried = app.amend(request).await.unwrap();
        assert_eq!(retried.version, 2);
        assert_eq!(app.count("outbox_event").await, 2);
        app.stop().await;
    }
}

/// `idempostctl` with `args`: (success, stdout, stderr).
async fn idempostctl(args: &[String]) -> (bool, String, String) {
    let binary = crate::helpers::service_binary("idempostctl");
    let output = tokio::process::Command::new(binary).args(args).output().await.unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (output.status.success(), text(output.stdout), text(output.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempostctl_amends_and_cancels_an_order_with_the_safe_caller_protocol_and_lists_every_version() {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let order_id = app.submit(order(7, "submit-1")).await.unwrap().order_id;
    let urls = [
        format!("--order-url=http://127.0.0.1:{}", app.port),
        format!("--admin-url=http://127.0.0.1:{}", app.admin_port),
    ];
    let ctl = |rest: &[&str]| {
        let mut args = urls.to_vec();
        args.extend(rest.iter().map(|arg| (*arg).to_owned()));
        idempostctl_owned(args)
    };
    let order = order_id.to_string();

    let amend_args = ["--json", "amend", "7", &order, "--expected-version=1", "--request-id=ctl-amend-1"];
    let amend_args = [&amend_args[..], &["--line=SKU-BLUE-MUG:3:1000", "--customer-id=customer-43"]].concat();
    let (ok, amended, stderr) = ctl(&amend_args).await;
    assert!(ok, "{stderr}");
    let amended: serde_json::Value = serde_json::from_str(&amended).unwrap();
    assert_eq!((amended["version"].as_i64(), amended["confirmation"].as_str()), (Some(2), Some("committed")));
    // The same command again is a replay, not a second change.
    let (ok, again, _) = ctl(&amend_args).await;
    assert!(ok);
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!((again["confirmation"].as_str(), &again["eventId"]), (Some("replayed"), &amended["eventId"]));
    // A stale version is refused, naming the current one.
    let stale =
        ["cancel", "7", &order, "--expected-version=1", "--request-id=ctl-cancel-0", "--reason=other"];
    let (ok, _, stderr) = ctl(&stale).await;
    assert!(!ok && stderr.contains("VERSION_CONFLICT") && stderr.contains("current version 2"), "{stderr}");
    let cancel = [
        "cancel",
        "7",
        &order,
        "--expected-version=2",
        "--request-id=ctl-cancel-1",
        "--reason=customer-request",
        "--note=asked by phone",
    ];
    let (ok, cancelled, stderr) = ctl(&cancel).await;
    assert!(ok && cancelled.contains("cancelled: now version 3"), "{cancelled}{stderr}");

    let (ok, table, stderr) = ctl(&["find", "7", "ctl-cancel-1"]).await;
    assert!(ok, "{stderr}");
    for expected in ["every version of the order", "v1", "v2", "v3", "SUBMIT", "AMEND", "CANCEL", "CANCELLED"]
    {
        assert!(table.contains(expected), "{expected} missing from:\n{table}");
    }
    assert_eq!(app.order_state(order_id).await, (3, "CANCELLED".to_owned()));
    assert_eq!(app.count("outbox_event").await, 3);
    app.stop().await;
}

async fn idempostctl_owned(args: Vec<String>) -> (bool, String, String) {
    idempostctl(&args).await
}
