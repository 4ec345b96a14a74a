//! Group commit: many orders in one transaction, each answered exactly as a transaction of its
//! own would answer it, checked order by order.
//!
//! One writer (one transaction slot), taken by a `holder` order that waits on a lock the test
//! takes on the orders table: everything sent meanwhile waits in the queue and is written as the
//! next batch(es), so these tests know which orders shared a transaction.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use idempost_proto::v1 as pb;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, TransactionTrait};
use tonic::Code;

use crate::helpers::{Backend, TestOrder, assert_eventually, metadata, on_every_backend, order, reason};

on_every_backend!(
    sixty_four_callers_with_distinct_requests_each_get_their_own_order_from_shared_transactions,
    repeats_inside_one_batch_make_one_order_and_one_replay_each,
    one_poisoned_order_per_batch_rolls_back_alone_and_the_rest_commit,
    a_full_queue_refuses_at_once_as_overloaded_and_writes_nothing,
    with_group_commit_off_each_order_still_commits_replays_and_reconciles,
    distinct_orders_in_one_batch_are_written_with_one_insert_per_table_each_under_its_own_id,
    a_poisoned_order_sends_its_batch_back_to_order_by_order_writes_each_decided_as_alone,
);

/// MariaDB and PostgreSQL only: SQLite has one writer at a time, so two transactions never
/// wait for each other, and its busy timeout (5 s) fails a batch only if the batch, not the
/// holder in front of it, meets a write lock held that long, which the test cannot arrange
/// without racing the writer.
mod a_batch_that_loses_a_deadlock_runs_again_whole_with_the_same_ids {
    use crate::helpers::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn mariadb() {
        super::a_batch_that_loses_a_deadlock_runs_again_whole_with_the_same_ids(Backend::MariaDb).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::a_batch_that_loses_a_deadlock_runs_again_whole_with_the_same_ids(Backend::Postgres).await;
    }
}

/// How long a test waits for its orders to reach the writer's queue.
const QUEUED_WITHIN: Duration = Duration::from_secs(60);

/// An order service with one writer taking batches of up to `max_batch`.
async fn one_writer(backend: Backend, max_batch: u16) -> TestOrder {
    TestOrder::spawn_with(backend, |s| {
        s.group_commit.writers = 1;
        s.group_commit.max_batch = max_batch;
        s.security.listeners.max_concurrent_calls = Some(256);
    })
    .await
}

/// The writer's first batch, waiting for a lock the test holds on the orders table.
struct Hold {
    lock: DatabaseTransaction,
    holder: tokio::task::JoinHandle<()>,
    /// Orders the queue had been handed when the hold began.
    offered: u64,
}

/// Takes a lock that every insert into `orders` waits for, sends the `holder` order, and returns
/// once the writer is waiting with it.
async fn hold_first_batch(app: &TestOrder) -> Hold {
    let lock = app.conn.begin().await.unwrap();
    let sql = match app.conn.get_database_backend() {
        // Under REPEATABLE READ a locking read of a missing key locks the gap it would go in:
        // on an empty table, the whole index.
        DbBackend::MySql => "SELECT id FROM orders WHERE tenant_id = 1 AND request_id = 'holder' FOR UPDATE",
        DbBackend::Postgres => "LOCK TABLE orders IN EXCLUSIVE MODE",
        // The one write lock.
        _ => "CREATE TABLE hold_the_writer (x INTEGER)",
    };
    lock.execute_unprepared(sql).await.unwrap();
    let mut client = app.client.clone();
    let holder = tokio::spawn(async move {
        let answer = client.submit_order(order(1, "holder")).await.unwrap().into_inner();
        assert_eq!(answer.outcome(), pb::TransactionOutcome::Committed);
    });
    // The holder's transaction counts as a batch once it holds the one writer's slot (whether
    // it took a free slot or the writer took it from the queue): from then on every order waits.
    assert_eventually("the holder's order holds the writer", Duration::from_secs(10), || async {
        app.batches.snapshot().batches() >= 1
    })
    .await;
    Hold { lock, holder, offered: app.batches.offered() }
}

impl Hold {
    /// Lets the holder's batch go once the queue has been handed `sent` more orders (taken or
    /// refused), and waits for its answer: every one of them is then in the queue or answered,
    /// so the next batch is exactly what gathered, however slowly the callers got there.
    async fn release_when_queued(self, app: &TestOrder, sent: usize) {
        let before = self.offered;
        assert_eventually(
            &format!("{sent} orders reach the writer's queue"),
            QUEUED_WITHIN,
            move || async move { app.batches.offered() - before >= sent as u64 },
        )
        .await;
        self.lock.rollback().await.unwrap();
        self.holder.await.unwrap();
    }
}

/// Sends every request at once while `hold` holds the first batch.
async fn submit_held(
    app: &TestOrder,
    hold: Hold,
    requests: Vec<pb::SubmitOrderRequest>,
) -> Vec<Result<pb::SubmitOrderResponse, tonic::Status>> {
    let sent = requests.len();
    let (answers, ()) = tokio::join!(
        join_all(requests.into_iter().map(|r| app.submit(r))),
        hold.release_when_queued(app, sent)
    );
    answers
}

fn distinct(tenant_id: i64, prefix: &str, count: usize) -> Vec<pb::SubmitOrderRequest> {
    (0..count).map(|i| order(tenant_id, &format!("{prefix}-{i}"))).collect()
}

async fn sixty_four_callers_with_distinct_requests_each_get_their_own_order_from_shared_transactions(
    backend: Backend,
) {
    let app = one_writer(backend, 64).await;
    let hold = hold_first_batch(&app).await;

    let requests = distinct(7, "many", 64);
    let answers = submit_held(&app, hold, requests.clone()).await;

    let mut order_ids = HashMap::new();
    for (request, answer) in requests.iter().zip(answers) {
        let answer = answer.unwrap_or_else(|e| panic!("{}: {e:?}", request.request_id));
        assert_eq!(answer.outcome(), pb::TransactionOutcome::Committed);
        assert!(!answer.replayed);
        let found = app.reconcile(7, &request.request_id).await.unwrap();
        assert_eq!((found.order_id, &found.event_id), (answer.order_id, &answer.event_id));
        let (status, _) = app.outbox_row(&answer.event_id).await.expect("outbox row");
        assert_eq!(status, "PENDING");
        assert!(order_ids.insert(answer.order_id, request.request_id.clone()).is_none(), "one order each");
    }
    assert_eq!(app.count("orders").await, 65);
    assert_eq!(app.count("outbox_event").await, 65);
    assert_eq!(app.count("order_line").await, 130);
    let sizes = app.batches.snapshot();
    assert_eq!(sizes.orders(), 65, "{sizes:?}");
    assert!(sizes.quantile(1.0) > 1, "no two orders shared a transaction: {sizes:?}");
}

async fn repeats_inside_one_batch_make_one_order_and_one_replay_each(backend: Backend) {
    let app = one_writer(backend, 64).await;
    let hold = hold_first_batch(&app).await;
    let shared_event_id = uuid::Uuid::now_v7().to_string();
    let mut different = order(7, "changed");
    different.line_items[0].quantity = 5;
    let mut requests = Vec::new();
    for i in 0..8 {
        // The same request twice: one order, one replay.
        requests.push(order(7, &format!("twice-{i}")));
        requests.push(order(7, &format!("twice-{i}")));
    }
    // The same key with other content: one order, one REQUEST_ID_REUSED.
    requests.push(order(7, "changed"));
    requests.push(different);
    // Two keys with one event id: one order, one EVENT_ID_IN_USE.
    requests.push(pb::SubmitOrderRequest { event_id: shared_event_id.clone(), ..order(7, "event-a") });
    requests.push(pb::SubmitOrderRequest { event_id: shared_event_id.clone(), ..order(7, "event-b") });
    let sent = requests.len();

    let answers = submit_held(&app, hold, requests.clone()).await;

    let mut by_key: HashMap<String, Vec<Result<pb::SubmitOrderResponse, tonic::Status>>> = HashMap::new();
    for (request, answer) in requests.iter().zip(answers) {
        by_key.entry(request.request_id.clone()).or_default().push(answer);
    }
    for i in 0..8 {
        let key = format!("twice-{i}");
        let answers: Vec<_> = by_key[&key].iter().map(|a| a.as_ref().unwrap()).collect();
        let fresh: Vec<_> = answers.iter().filter(|a| !a.replayed).collect();
        assert_eq!(fresh.len(), 1, "{key}: one order, one replay: {answers:?}");
        assert!(answers.iter().all(|a| a.order_id == fresh[0].order_id && a.event_id == fresh[0].event_id));
        assert!(answers.iter().all(|a| a.outcome() == pb::TransactionOutcome::Committed));
        let found = app.reconcile(7, &key).await.unwrap();
        assert_eq!(found.event_id, fresh[0].event_id);
    }

    let changed = &by_key["changed"];
    let committed: Vec<_> = changed.iter().filter_map(|a| a.as_ref().ok()).collect();
    let refused: Vec<_> = changed.iter().filter_map(|a| a.as_ref().err()).collect();
    assert_eq!((committed.len(), refused.len()), (1, 1), "{changed:?}");
    assert!(!committed[0].replayed);
    assert_eq!((refused[0].code(), reason(refused[0]).as_str()), (Code::AlreadyExists, "REQUEST_ID_REUSED"));
    assert_eq!(metadata(refused[0], "event_id").as_deref(), Some(committed[0].event_id.as_str()));
    assert_eq!(app.reconcile(7, "changed").await.unwrap().event_id, committed[0].event_id);

    let event_answers: Vec<_> = ["event-a", "event-b"].iter().map(|k| &by_key[*k][0]).collect();
    let winners: Vec<_> = event_answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    let losers: Vec<_> = event_answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert_eq!((winners.len(), losers.len()), (1, 1), "{event_answers:?}");
    assert_eq!(winners[0].event_id, shared_event_id);
    assert_eq!((losers[0].code(), reason(losers[0]).as_str()), (Code::AlreadyExists, "EVENT_ID_IN_USE"));

    // The holder, eight twice-sent orders, one changed, one of the event-id pair.
    assert_eq!(app.count("orders").await, 11);
    assert_eq!(app.count("outbox_event").await, 11);
    let sizes = app.batches.snapshot();
    assert_eq!(sizes.quantile(1.0), sent, "every repeat was in one batch: {sizes:?}");
}

/// Makes the database refuse any order for customer `poison`: a violation of a constraint that
/// means nothing to the order service (not one of its unique keys).
async fn add_poison_constraint(app: &TestOrder) {
    let sql = match app.conn.get_database_backend() {
        DbBackend::Sqlite => {
            "CREATE TRIGGER poison BEFORE INSERT ON orders WHEN NEW.customer_id = 'poison' \
             BEGIN SELECT RAISE(ABORT, 'poisoned order'); END"
        }
        _ => "ALTER TABLE orders ADD CONSTRAINT ck_test_poison CHECK (customer_id <> 'poison')",
    };
    app.conn.execute_unprepared(sql).await.unwrap();
}

async fn one_poisoned_order_per_batch_rolls_back_alone_and_the_rest_commit(backend: Backend) {
    let app = one_writer(backend, 8).await;
    add_poison_constraint(&app).await;
    let hold = hold_first_batch(&app).await;

    let mut requests = distinct(7, "mixed", 64);
    for request in requests.iter_mut().step_by(8) {
        request.customer_id = "poison".to_owned();
    }
    let answers = submit_held(&app, hold, requests.clone()).await;

    for (request, answer) in requests.iter().zip(answers) {
        let key = &request.request_id;
        if request.customer_id == "poison" {
            let status = answer.expect_err(key);
            assert_eq!((status.code(), reason(&status).as_str()), (Code::Aborted, "ROLLED_BACK"), "{key}");
            assert_eq!(app.reconcile(7, key).await.unwrap_err().code(), Code::NotFound, "{key}");
        } else {
            let answer = answer.unwrap_or_else(|e| panic!("{key}: {e:?}"));
            assert_eq!(answer.outcome(), pb::TransactionOutcome::Committed, "{key}");
            let found = app.reconcile(7, key).await.unwrap();
            assert_eq!((found.order_id, &found.event_id), (answer.order_id, &answer.event_id), "{key}");
            assert!(app.outbox_row(&answer.event_id).await.is_some(), "{key}");
        }
    }
    assert_eq!(app.count("orders").await, 1 + 56);
    assert_eq!(app.count("outbox_event").await, 1 + 56);
    assert_eq!(app.count("order_line").await, 2 * (1 + 56));
    let sizes = app.batches.snapshot();
    assert!(sizes.quantile(1.0) > 1, "no two orders shared a transaction: {sizes:?}");
}

async fn a_full_queue_refuses_at_once_as_overloaded_and_writes_nothing(backend: Backend) {
    let app = TestOrder::spawn_with(backend, |s| {
        s.group_commit.writers = 1;
        s.group_commit.queue = 4;
    })
    .await;
    let hold = hold_first_batch(&app).await;

    // The one slot is busy with the holder: four wait, the rest are refused.
    let requests = distinct(7, "crowd", 10);
    let answers = submit_held(&app, hold, requests.clone()).await;

    let mut committed = 0;
    for (request, answer) in requests.iter().zip(answers) {
        let key = &request.request_id;
        match answer {
            Ok(answer) => {
                assert_eq!(answer.outcome(), pb::TransactionOutcome::Committed, "{key}");
                committed += 1;
            }
            Err(status) => {
                assert_eq!(
                    (status.code(), reason(&status).as_str()),
                    (Code::ResourceExhausted, "OVERLOADED"),
                    "{key}"
                );
                assert!(metadata(&status, "event_id").is_some(), "{key}");
                assert_eq!(app.reconcile(7, key).await.unwrap_err().code(), Code::NotFound, "{key}");
            }
        }
    }
    // The queue's bound waited, and perhaps one more that the writer had already taken out of
    // it to wait for the holder's slot.
    assert!((4..=5).contains(&committed), "{committed} committed");
    assert_eq!(app.count("orders").await, 1 + committed);
}

async fn with_group_commit_off_each_order_still_commits_replays_and_reconciles(backend: Backend) {
    let app =
        TestOrder::spawn_with(backend, |s| s.group_commit.mode = idempost_order::GroupCommitMode::Off).await;

    let answers = join_all((0..16).map(|i| app.submit(order(7, &format!("alone-{}", i % 8))))).await;

    let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(answers.iter().filter(|a| !a.replayed).count(), 8);
    for i in 0..8 {
        let found = app.reconcile(7, &format!("alone-{i}")).await.unwrap();
        assert!(answers.iter().any(|a| a.order_id == found.order_id && !a.replayed));
    }
    assert_eq!(app.count("orders").await, 8);
    assert_eq!(app.batches.snapshot().batches(), 0, "no batch was written");
}

/// An order with `i % 3 + 1` lines of its own (quantities and prices that tell its lines from
/// every other order's).
fn with_own_lines(tenant_id: i64, request_id: &str, i: u32) -> pb::SubmitOrderRequest {
    let line_items = (1..=i % 3 + 1)
        .map(|n| pb::LineItem {
            sku: format!("SKU-{i}-{n}"),
            quantity: n,
            unit_price_minor: i64::from(100 * i + n),
        })
        .collect();
    pb::SubmitOrderRequest { line_items, ..order(tenant_id, request_id) }
}

async fn distinct_orders_in_one_batch_are_written_with_one_insert_per_table_each_under_its_own_id(
    backend: Backend,
) {
    let app = one_writer(backend, 64).await;
    let hold = hold_first_batch(&app).await;

    let requests: Vec<_> = (0..16).map(|i| with_own_lines(7, &format!("set-{i}"), i)).collect();
    let answers = submit_held(&app, hold, requests.clone()).await;

    let mut order_ids = HashMap::new();
    for (request, answer) in requests.iter().zip(answers) {
        let key = &request.request_id;
        let answer = answer.unwrap_or_else(|e| panic!("{key}: {e:?}"));
        assert_eq!(answer.outcome(), pb::TransactionOutcome::Committed, "{key}");
        assert!(!answer.replayed, "{key}");
        let found = app.reconcile(7, key).await.unwrap();
        assert_eq!((found.order_id, &found.event_id), (answer.order_id, &answer.event_id), "{key}");
        let id = answer.order_id;
        // The lines and the outbox row are the ones of this order, under its id.
        let lines = request.line_items.len() as i64;
        let total: i64 = request.line_items.iter().map(|l| i64::from(l.quantity) * l.unit_price_minor).sum();
        let count = format!("SELECT COUNT(*) FROM order_line WHERE order_id = {id}");
        assert_eq!(app.scalar_i64(&count).await, lines, "{key}");
        for (line, line_no) in request.line_items.iter().zip(1..) {
            let line = format!(
                "{count} AND line_no = {line_no} AND sku = '{}' AND quantity = {} AND unit_price_minor = {}",
                line.sku, line.quantity, line.unit_price_minor
            );
            assert_eq!(app.scalar_i64(&line).await, 1, "{key}: {line}");
        }
        assert_eq!((answer.total_minor, found.total_minor), (total, total), "{key}");
        let outbox = format!(
            "SELECT COUNT(*) FROM outbox_event WHERE event_id = '{}' AND aggregate_id = '{id}' AND status = 'PENDING'",
            answer.event_id
        );
        assert_eq!(app.scalar_i64(&outbox).await, 1, "{key}");
        assert!(order_ids.insert(id, key.clone()).is_none(), "one order each");
    }
    assert_eq!(app.count("orders").await, 17);
    assert_eq!(app.count("outbox_event").await, 17);
    let sizes = app.batches.snapshot();
    assert_eq!(sizes.quantile(1.0), 16, "all 16 in one batch: {sizes:?}");
    assert_eq!((sizes.set_written(), sizes.set_fell_back()), (1, 0), "one set-based write: {sizes:?}");
}

async fn a_poisoned_order_sends_its_batch_back_to_order_by_order_writes_each_decided_as_alone(
    backend: Backend,
) {
    let app = one_writer(backend, 64).await;
    add_poison_constraint(&app).await;
    let hold = hold_first_batch(&app).await;

    let mut requests = distinct(7, "fallback", 12);
    requests[5].customer_id = "poison".to_owned();
    // A repeat in the same batch: left out of the set-based write, and still one replay.
    requests.push(order(7, "fallback-3"));
    let sent = requests.len();
    let answers = submit_held(&app, hold, requests.clone()).await;

    let (mut fresh, mut replays) = (HashMap::new(), Vec::new());
    for (request, answer) in requests.iter().zip(answers) {
        let key = &request.request_id;
        if request.customer_id == "poison" {
            let status = answer.expect_err(key);
            assert_eq!((status.code(), reason(&status).as_str()), (Code::Aborted, "ROLLED_BACK"), "{key}");
            assert_eq!(app.reconcile(7, key).await.unwrap_err().code(), Code::NotFound, "{key}");
            continue;
        }
        let answer = answer.unwrap_or_else(|e| panic!("{key}: {e:?}"));
        assert_eq!(answer.outcome(), pb::TransactionOutcome::Committed, "{key}");
        let found = app.reconcile(7, key).await.unwrap();
        assert_eq!((found.order_id, &found.event_id), (answer.order_id, &answer.event_id), "{key}");
        if answer.replayed {
            replays.push((key.clone(), answer.order_id));
        } else {
            assert!(fresh.insert(key.clone(), answer.order_id).is_none(), "{key}: one order");
        }
    }
    assert_eq!(replays.len(), 1, "{replays:?}");
    assert_eq!(fresh.get(&replays[0].0), Some(&replays[0].1), "the replay is of the order written");
    assert_eq!(app.count("orders").await, 1 + 11);
    assert_eq!(app.count("outbox_event").await, 1 + 11);
    let sizes = app.batches.snapshot();
    assert_eq!(sizes.quantile(1.0), sent, "one batch: {sizes:?}");
    assert_eq!(
        (sizes.set_written(), sizes.set_fell_back()),
        (0, 1),
        "one set-based write, fallen back: {sizes:?}"
    );
}

/// Inserts, in `txn`, one outbox row for each event id (no order behind them).
async fn insert_outbox_rows(txn: &DatabaseTransaction, event_ids: &[String]) {
    let values: Vec<String> = event_ids
        .iter()
        .map(|e| {
            format!("('{e}', 'order', '0', 'OrderAccepted', 1, 'x', 'PENDING', 0, '2026-01-01 00:00:00', 0)")
        })
        .collect();
    let sql = format!(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, payload, \
         status, attempts, created_at, redrive_count) VALUES {}",
        values.join(", ")
    );
    txn.execute_unprepared(&sql).await.unwrap();
}

/// Whether a connection to this test's database is inside an INSERT into `outbox_event`: on
/// PostgreSQL, waiting for a lock; on MariaDB, running or waiting (its INNODB_TRX does not
/// list a READ COMMITTED insert waiting for a row lock reliably), which is enough here since
/// the only such insert, the batch's, waits for the rival's row once it reaches it.
async fn inserts_into_outbox(app: &TestOrder) -> bool {
    let sql = match app.conn.get_database_backend() {
        DbBackend::MySql => {
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() \
             AND INFO LIKE 'INSERT INTO `outbox_event`%'"
        }
        _ => {
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO \"outbox_event\"%'"
        }
    };
    app.scalar_i64(sql).await > 0
}

async fn a_batch_that_loses_a_deadlock_runs_again_whole_with_the_same_ids(backend: Backend) {
    // PostgreSQL aborts the first waiter whose check runs while the cycle exists, and each waiter
    // checks once, `deadlock_timeout` after it began to wait. With the server's 1 s, a loaded
    // machine that took longer than that to start the rival's insert let the batch's only check
    // find no cycle yet, and the rival's own check then aborted the rival. So the batch checks
    // after 5 s and the rival never within the test: the batch is the one to lose.
    let app = TestOrder::spawn_with(backend, |s| {
        s.group_commit.writers = 1;
        s.group_commit.max_batch = 64;
        s.security.listeners.max_concurrent_calls = Some(256);
        if backend == Backend::Postgres {
            let separator = if s.database.url.contains('?') { '&' } else { '?' };
            s.database.url = format!("{}{separator}options=-c%20deadlock_timeout%3D5s", s.database.url);
        }
    })
    .await;
    let requests: Vec<_> = (0..16)
        .map(|i| pb::SubmitOrderRequest {
            event_id: uuid::Uuid::now_v7().to_string(),
            ..order(7, &format!("deadlock-{i}"))
        })
        .collect();
    let contested = requests[9].clone();
    // The rival holds the contested order's outbox row, uncommitted, and has written far more
    // than the batch will have (ballast), so that MariaDB picks the batch as the victim. On
    // PostgreSQL the batch, waiting first, is the first to run the deadlock check, and it
    // aborts itself.
    let rival = app.conn.begin().await.unwrap();
    if backend == Backend::Postgres {
        rival.execute_unprepared("SET LOCAL deadlock_timeout = '60s'").await.unwrap();
    }
    let mut rows: Vec<String> = (0..300).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    rows.push(contested.event_id.clone());
    insert_outbox_rows(&rival, &rows).await;
    let hold = hold_first_batch(&app).await;

    let deadlock = async {
        hold.release_when_queued(&app, requests.len()).await;
        // The batch has written its orders and waits (or is about to) for the rival's outbox row.
        assert_eventually("the batch inserts its outbox rows", Duration::from_secs(20), || {
            inserts_into_outbox(&app)
        })
        .await;
        // The rival now wants the contested order's key, which the batch holds: a deadlock.
        // Its insert going through shows that the batch was rolled back, orders and all.
        let sql = format!(
            "INSERT INTO orders (tenant_id, request_id, acceptance_event_id, customer_id, currency, total, version, \
             status, created_at) VALUES (7, '{}', '{}', 'rival', 'EUR', 1, 1, 'ACCEPTED', '2026-01-01 00:00:00')",
            contested.request_id,
            uuid::Uuid::now_v7()
        );
        rival.execute_unprepared(&sql).await.expect("the rival's insert, once the batch lost the deadlock");
        rival.rollback().await.unwrap();
    };
    let (answers, ()) = tokio::join!(join_all(requests.iter().cloned().map(|r| app.submit(r))), deadlock);

    for (request, answer) in requests.iter().zip(answers) {
        let key = &request.request_id;
        let answer = answer.unwrap_or_else(|e| panic!("{key}: {e:?}"));
        assert_eq!(answer.outcome(), pb::TransactionOutcome::Committed, "{key}");
        assert!(!answer.replayed, "{key}");
        assert_eq!(answer.event_id, request.event_id, "{key}: the same event id");
        let found = app.reconcile(7, key).await.unwrap();
        assert_eq!((found.order_id, &found.event_id), (answer.order_id, &answer.event_id), "{key}");
        assert!(app.outbox_row(&answer.event_id).await.is_some(), "{key}");
    }
    assert_eq!(app.count("orders").await, 17);
    assert_eq!(app.count("outbox_event").await, 17);
    let sizes = app.batches.snapshot();
    // One batch of all 16 (a run again is not counted as another), written set-based by its
    // second run.
    assert_eq!(sizes.quantile(1.0), 16, "{sizes:?}");
    assert_eq!((sizes.set_written(), sizes.set_fell_back()), (1, 0), "{sizes:?}");
}

#[cfg(feature = "failpoints")]
mod commit_window {
    use idempost::failpoint::COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION;
    use tonic::Code;

    use super::{distinct, hold_first_batch, one_writer, submit_held};
    use crate::helpers::{Backend, arm, metadata, on_every_backend, reason};

    on_every_backend!(
        a_commit_failure_under_a_batch_makes_every_caller_unknown_and_reconcile_finds_every_order
    );

    async fn a_commit_failure_under_a_batch_makes_every_caller_unknown_and_reconcile_finds_every_order(
        backend: Backend,
    ) {
        let app = one_writer(backend, 64).await;
        // The holder's batch commits as usual; the next one commits and loses the
        // acknowledgement.
        arm(COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION, "1*off->1*return");
        let hold = hold_first_batch(&app).await;

        let requests = distinct(7, "lost-ack", 48);
        let answers = submit_held(&app, hold, requests.clone()).await;

        for (request, answer) in requests.iter().zip(answers) {
            let key = &request.request_id;
            let status = answer.expect_err(key);
            assert_eq!(
                (status.code(), reason(&status).as_str()),
                (Code::Unknown, "OUTCOME_UNKNOWN"),
                "{key}"
            );
            let event_id = metadata(&status, "event_id").expect("the event id to reconcile");
            let found = app.reconcile(7, key).await.unwrap_or_else(|e| panic!("{key}: {e:?}"));
            assert_eq!(found.event_id, event_id, "{key}");
            assert!(app.outbox_row(&event_id).await.is_some(), "{key}");
        }
        assert_eq!(app.count("orders").await, 1 + 48);
        let sizes = app.batches.snapshot();
        assert_eq!(sizes.quantile(1.0), 48, "one batch of all 48: {sizes:?}");
    }
}
