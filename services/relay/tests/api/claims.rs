//! Claims read from where the process's claims left off (MariaDB/MySQL, PostgreSQL), and the
//! sweep finds what falls behind: an event is claimed late at worst, never left. SQLite's claims
//! read from the head, so there every event is claimed at once and the sweep finds nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use idempost_relay::{
    Blame, ClaimWindow, ClaimedEvent, Fenced, Outbox, Released, RetryPolicy, Swept, WorkerId,
};
use sea_orm::{ConnectionTrait as _, DatabaseConnection};

use crate::broker::TestBroker;
use crate::helpers::{Backend, OutboxProbe, TestOrder, TestService, assert_eventually, on_every_backend};
use idempost_testkit::relay::{TestRelay, relay_args, relay_settings};
use idempost_testkit::wait::WAIT;

on_every_backend!(
    a_retry_released_after_the_claims_moved_on_is_found_by_the_sweep_and_claimed_next,
    an_event_committed_later_than_the_lookback_is_found_by_the_sweep_and_claimed_next,
    a_lease_that_expired_while_no_claim_looked_is_found_by_the_sweep_and_claimed_next,
    a_relay_restarted_mid_backlog_reads_both_ranges_from_their_head,
    a_relay_publishes_an_event_committed_behind_its_claims_and_counts_the_sweep_that_found_it,
    versions_written_long_ago_follow_their_predecessors_marks_without_waiting_for_a_sweep,
);

const LEASE: Duration = Duration::from_secs(30);

/// The default lookback, and a sweep that the tests run themselves.
fn window() -> ClaimWindow {
    ClaimWindow { lookback: Duration::from_secs(5), sweep_interval: Duration::from_secs(3600) }
}

/// A PENDING event of an order of its own, created at `created_at` (as the order service's clock
/// says when its transaction began); its id.
async fn insert_event(conn: &DatabaseConnection, created_at: DateTime<Utc>) -> String {
    let order = uuid::Uuid::now_v7().to_string();
    insert_version(conn, &order, 1, false, created_at).await
}

/// Version `version` of order `order`, PENDING, held back or not, created at `created_at`; its id.
async fn insert_version(
    conn: &DatabaseConnection,
    order: &str,
    version: i64,
    held_back: bool,
    created_at: DateTime<Utc>,
) -> String {
    let backend = conn.get_database_backend();
    let id = uuid::Uuid::now_v7().to_string();
    let sql = "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
               payload, status, attempts, held_back, created_at) \
               VALUES (?, 'order', ?, 'idempost.v1.OrderAccepted', ?, ?, 'PENDING', 0, ?, ?)";
    let values = vec![
        id.clone().into(),
        order.into(),
        version.into(),
        b"payload".to_vec().into(),
        held_back.into(),
        created_at.into(),
    ];
    conn.execute_raw(idempost_testkit::sql::statement(backend, sql, values)).await.unwrap();
    id
}

fn ids(events: &[ClaimedEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event_id.as_str()).collect()
}

/// Waits until the database's clock has passed `at`.
async fn until_database_clock_passes(conn: &DatabaseConnection, at: DateTime<Utc>) {
    assert_eventually("the database clock passes the moment", WAIT, || async {
        idempost::db::now(conn).await.unwrap() > at
    })
    .await;
}

/// An event created a minute before `now`: older than any lookback the tests use, as the
/// event of a transaction that committed long after it began.
async fn a_minute_before(conn: &DatabaseConnection) -> DateTime<Utc> {
    idempost::db::now(conn).await.unwrap() - chrono::Duration::seconds(60)
}

/// On MariaDB/MySQL and PostgreSQL, `event` is behind the claims' start: the claim passes it
/// by, the sweep finds it (`found`), and the next claim takes it. On SQLite the claim takes it
/// at once and the sweep finds nothing.
async fn claimed_only_after_the_sweep(backend: Backend, outbox: &Outbox, event: &str, found: Swept) {
    let worker = WorkerId::generate();
    if backend == Backend::Sqlite {
        assert_eq!(ids(&outbox.claim(&worker, LEASE, 10).await.unwrap()), [event], "read from the head");
        assert_eq!(outbox.sweep_claims().await.unwrap(), Swept::default());
        return;
    }
    assert!(
        outbox.claim(&worker, LEASE, 10).await.unwrap().is_empty(),
        "the claim does not read behind its start"
    );
    assert_eq!(outbox.sweep_claims().await.unwrap(), found, "the sweep finds the event behind the start");
    assert_eq!(ids(&outbox.claim(&worker, LEASE, 10).await.unwrap()), [event], "the next claim takes it");
    assert_eq!(outbox.sweep_claims().await.unwrap(), Swept::default(), "nothing is left behind");
}

async fn a_retry_released_after_the_claims_moved_on_is_found_by_the_sweep_and_claimed_next(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let outbox = Outbox::new(app.db.connect().await).with_claim_window(window());
    let worker = WorkerId::generate();
    let retried = insert_event(&app.conn, a_minute_before(&app.conn).await).await;
    let first = outbox.claim(&worker, LEASE, 1).await.unwrap();
    assert_eq!(ids(&first), [retried.as_str()]);
    let newer = insert_event(&app.conn, idempost::db::now(&app.conn).await.unwrap()).await;
    assert_eq!(ids(&outbox.claim(&worker, LEASE, 1).await.unwrap()), [newer.as_str()], "the claims move on");

    let retry = RetryPolicy {
        max_attempts: 12,
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(1),
    };
    let released = outbox.release_all(&[(&first[0], "refused", Blame::Event)], &retry).await.unwrap();
    let [Fenced::Done(Released::RetryAt(retry_at))] = released[..] else {
        panic!("the failed publish is released for a retry: {released:?}");
    };
    until_database_clock_passes(&app.conn, retry_at).await;
    claimed_only_after_the_sweep(backend, &outbox, &retried, Swept { due: true, expired: false }).await;
}

async fn an_event_committed_later_than_the_lookback_is_found_by_the_sweep_and_claimed_next(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let outbox = Outbox::new(app.db.connect().await).with_claim_window(window());
    let newer = insert_event(&app.conn, idempost::db::now(&app.conn).await.unwrap()).await;
    assert_eq!(ids(&outbox.claim(&WorkerId::generate(), LEASE, 10).await.unwrap()), [newer.as_str()]);
    let late = insert_event(&app.conn, a_minute_before(&app.conn).await).await;
    claimed_only_after_the_sweep(backend, &outbox, &late, Swept { due: true, expired: false }).await;
}

async fn a_lease_that_expired_while_no_claim_looked_is_found_by_the_sweep_and_claimed_next(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let window = ClaimWindow { lookback: Duration::from_secs(1), ..window() };
    let outbox = Outbox::new(app.db.connect().await).with_claim_window(window);
    let event = insert_event(&app.conn, idempost::db::now(&app.conn).await.unwrap()).await;
    let brief = outbox.claim(&WorkerId::generate(), Duration::from_millis(200), 10).await.unwrap();
    assert_eq!(ids(&brief), [event.as_str()]);
    // No claim looks while the lease runs out and a lookback more passes.
    until_database_clock_passes(&app.conn, brief[0].lease_until + chrono::Duration::milliseconds(1500)).await;
    claimed_only_after_the_sweep(backend, &outbox, &event, Swept { due: false, expired: true }).await;
    let probe = OutboxProbe { conn: &app.conn };
    assert_eq!(probe.state(&event).await.attempts, 2, "claimed again, each claim counted");
}

async fn a_relay_restarted_mid_backlog_reads_both_ranges_from_their_head(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let window = ClaimWindow { lookback: Duration::from_secs(1), ..window() };
    let before = Outbox::new(app.db.connect().await).with_claim_window(window);
    let worker = WorkerId::generate();
    let expiring = insert_event(&app.conn, a_minute_before(&app.conn).await).await;
    let brief = before.claim(&worker, Duration::from_millis(200), 1).await.unwrap();
    assert_eq!(ids(&brief), [expiring.as_str()]);
    let newer = insert_event(&app.conn, idempost::db::now(&app.conn).await.unwrap()).await;
    assert_eq!(ids(&before.claim(&worker, LEASE, 1).await.unwrap()), [newer.as_str()]);
    let late = insert_event(&app.conn, a_minute_before(&app.conn).await).await;
    until_database_clock_passes(&app.conn, brief[0].lease_until + chrono::Duration::milliseconds(1500)).await;
    if backend != Backend::Sqlite {
        assert!(before.claim(&worker, LEASE, 10).await.unwrap().is_empty(), "both are behind its starts");
    }

    // A new process knows nothing of the old one's position: its first claim reads from the head.
    let restarted = Outbox::new(app.db.connect().await).with_claim_window(window);
    let claimed = restarted.claim(&WorkerId::generate(), LEASE, 10).await.unwrap();
    assert_eq!(
        ids(&claimed),
        [expiring.as_str(), late.as_str()],
        "the expired lease and the late event (oldest first), without a sweep"
    );
}

/// A relay process with a short lookback and sweep interval publishes an event committed behind
/// its claims, and counts the sweep that found it (`idempost.relay.claim_sweep_finds`).
async fn a_relay_publishes_an_event_committed_behind_its_claims_and_counts_the_sweep_that_found_it(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let probe = OutboxProbe { conn: &app.conn };
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 1).await;
    let mut args = relay_args(&relay_settings(&app.db.url, &broker.address(), &topic));
    args.extend(["--claim-lookback=1s".to_owned(), "--claim-sweep-interval=500ms".to_owned()]);
    let (endpoint, received, _receiver) = crate::otlp::start_receiver().await;
    let env = [
        ("NO_COLOR", "1".to_owned()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned()),
    ];
    let logs = tempfile::tempdir().unwrap();
    let mut relay = TestService::spawn_logged("idempost-relay", &args, &env, logs.path().join("relay.log"));
    probe.seed(3).await;
    assert_eventually("the first events are published", WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 3
    })
    .await;
    let late = insert_event(&app.conn, a_minute_before(&app.conn).await).await;
    assert_eventually("the late event is published", WAIT, || async { probe.state(&late).await.published })
        .await;

    relay.signal("TERM").await;
    assert!(relay.wait(Duration::from_secs(40)).await.success(), "the relay exits 0 after SIGTERM");
    let found: f64 = received
        .points()
        .iter()
        .filter(|p| {
            p.name == "idempost.relay.claim_sweep_finds"
                && p.attribute("idempost.relay.claim_read") == Some("due")
        })
        .map(|p| p.value)
        .fold(0.0, f64::max);
    if backend == Backend::Sqlite {
        assert_eq!(found, 0.0, "SQLite's claims read from the head; nothing is behind them");
    } else {
        assert!(found >= 1.0, "the sweep found the late event and counted it: {}", relay.log());
    }
}

/// An order's versions written a minute ago, the later ones held back, while the relay's claims
/// have moved on to newer events: each mark releases the next version behind the claims' start,
/// and the relay reads from there again at once, not at its next sweep (an hour away here).
async fn versions_written_long_ago_follow_their_predecessors_marks_without_waiting_for_a_sweep(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let probe = OutboxProbe { conn: &app.conn };
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 1).await;
    let written = a_minute_before(&app.conn).await;
    let order = uuid::Uuid::now_v7().to_string();
    let mut versions = vec![insert_version(&app.conn, &order, 1, false, written).await];
    for version in 2..=4 {
        let created_at = written + chrono::Duration::milliseconds(version);
        versions.push(insert_version(&app.conn, &order, version, true, created_at).await);
    }
    insert_event(&app.conn, idempost::db::now(&app.conn).await.unwrap()).await;
    let mut settings = relay_settings(&app.db.url, &broker.address(), &topic);
    settings.claim_sweep_interval = Duration::from_secs(3600);
    let relay = TestRelay::spawn(settings).await;
    assert_eventually("every version and the newer event are published", WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 5
    })
    .await;
    relay.stop().await;
    let offsets: Vec<Option<i64>> = futures::future::join_all(versions.iter().map(|id| probe.state(id)))
        .await
        .into_iter()
        .map(|s| s.offset)
        .collect();
    assert!(offsets.windows(2).all(|pair| pair[0] < pair[1]), "the versions in order: {offsets:?}");
}

/// The pages InnoDB touched for `select`, as MariaDB's `ANALYZE FORMAT=JSON` reports them for
/// its one table.
async fn pages_read(conn: &DatabaseConnection, select: &str) -> u64 {
    let sql = format!("ANALYZE FORMAT=JSON {select}");
    let row = conn
        .query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::MySql, sql))
        .await
        .unwrap()
        .unwrap();
    let analyzed: serde_json::Value =
        serde_json::from_str(&row.try_get_by_index::<String>(0).unwrap()).unwrap();
    let table = &analyzed["query_block"]["nested_loop"][0]["table"];
    table["r_engine_stats"]["pages_accessed"]
        .as_u64()
        .unwrap_or_else(|| panic!("no page count in {analyzed}"))
}

/// InnoDB skips a delete-marked index entry that every reader can see before it checks the
/// range, so a range read walks every dead entry after its end. While a snapshot is held and
/// purge removes nothing, the rows retention deleted are such a run: in ascending
/// `idx_outbox_ready` they came right after the due range, and every claim walked them all
/// (docs/design/relay-lease.md, "Claims under a held snapshot"). The index is rebuilt by its
/// migration on the populated outbox, as an existing deployment gets it.
#[tokio::test]
async fn on_mariadb_the_due_read_stops_at_its_range_however_many_deleted_rows_a_held_snapshot_keeps() {
    use idempost_migration::{Migrator, MigratorTrait as _};
    use sea_orm::{DbBackend, IsolationLevel, Statement, TransactionTrait as _};

    let app = TestOrder::spawn(Backend::MariaDb).await;
    let sql = |text: &str| Statement::from_string(DbBackend::MySql, text.to_owned());
    // 20,000 rows published an hour ago, as retention finds them.
    app.conn
        .execute_raw(sql(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
             payload, status, attempts, created_at, published_at) \
             SELECT UUID(), 'order', UUID(), 'idempost.v1.OrderAccepted', 1, 'payload', 'PUBLISHED', 1, \
             UTC_TIMESTAMP(6) - INTERVAL 1 HOUR + INTERVAL seq MICROSECOND, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR \
             FROM seq_1_to_20000",
        ))
        .await
        .unwrap();
    let due = insert_event(&app.conn, idempost::db::now(&app.conn).await.unwrap()).await;
    // The index rebuilt under a populated outbox, as an existing deployment migrates.
    let directions = || async {
        let rows = app
            .conn
            .query_all_raw(sql(
                "SELECT COLLATION FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() \
                 AND TABLE_NAME = 'outbox_event' AND INDEX_NAME = 'idx_outbox_ready' ORDER BY SEQ_IN_INDEX",
            ))
            .await
            .unwrap();
        rows.iter().map(|row| row.try_get_by_index::<String>(0).unwrap()).collect::<Vec<_>>().concat()
    };
    idempost_testkit::db::migrate_back_before(&app.conn, "m20261207_000001_ready_descending").await;
    assert_eq!(directions().await, "AAAA");
    Migrator::up(&app.conn, None).await.unwrap();
    assert_eq!(directions().await, "DDAA", "status and held_back descending, then created_at, event_id");
    let rows = app.conn.query_one_raw(sql("SELECT COUNT(*) FROM outbox_event")).await.unwrap().unwrap();
    assert_eq!(rows.try_get_by_index::<i64>(0).unwrap(), 20_001, "the migration keeps every row");
    // A report's snapshot, then retention: purge may remove none of the deleted rows' entries.
    let reporter = app.db.connect().await;
    let report = reporter.begin_with_config(Some(IsolationLevel::RepeatableRead), None).await.unwrap();
    report.query_one_raw(sql("SELECT 1 FROM outbox_event LIMIT 1")).await.unwrap();
    let deleted =
        app.conn.execute_raw(sql("DELETE FROM outbox_event WHERE status = 'PUBLISHED'")).await.unwrap();
    assert_eq!(deleted.rows_affected(), 20_000);

    let inside = pages_read(
        &app.conn,
        "SELECT COUNT(*) FROM outbox_event FORCE INDEX (idx_outbox_ready) WHERE status = 'PUBLISHED'",
    )
    .await;
    assert!(inside >= 20, "the deleted rows' entries are kept while the snapshot is held ({inside} pages)");
    let due_read = pages_read(
        &app.conn,
        "SELECT event_id FROM outbox_event FORCE INDEX (idx_outbox_ready) \
         WHERE status = 'PENDING' AND held_back = FALSE AND created_at >= UTC_TIMESTAMP(6) - INTERVAL 5 SECOND \
         ORDER BY created_at, event_id LIMIT 250",
    )
    .await;
    assert!(
        due_read <= 5,
        "the due read walked {due_read} pages for one event (the deleted rows' run: {inside})"
    );
    let claimed = Outbox::new(app.db.connect().await).claim(&WorkerId::generate(), LEASE, 250).await.unwrap();
    assert_eq!(ids(&claimed), [due.as_str()]);
    report.rollback().await.unwrap();
}
