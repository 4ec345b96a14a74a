//! The consumer against real databases and a real broker: one notification job per event,
//! however often the event is delivered, and no acknowledgement before the local commit.

use std::time::Duration;

use idempost_consumer as consumer;
use rdkafka::ClientConfig;
use sea_orm::{ConnectionTrait, Statement};

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestOrder, TestService, assert_eventually, on_every_backend, order};
use idempost_testkit::broker::produce;
use idempost_testkit::consumer::{TestConsumer, consumer_settings, fast_group_options};
use idempost_testkit::order::event_record;
use idempost_testkit::relay::{TestRelay, relay_defaults};

use idempost_testkit::wait::WAIT;

fn topic() -> String {
    idempost_testkit::topic::unique("idempost-test")
}

/// Produces OrderAccepted records for orders `1..=count`, the event of order `copy_of` twice in a
/// row (as a relay's republish would put it), and answers the event ids in order.
async fn produce_events(brokers: &str, topic: &str, count: i64, copy_of: Option<i64>) -> Vec<String> {
    let mut ids = Vec::new();
    for order_id in 1..=count {
        let (event_id, payload) = event_record(order_id);
        produce(brokers, topic, &order_id.to_string(), &payload, Some(&event_id)).await;
        if copy_of == Some(order_id) {
            produce(brokers, topic, &order_id.to_string(), &payload, Some(&event_id)).await;
        }
        ids.push(event_id);
    }
    ids
}

on_every_backend!(
    a_batch_of_new_events_takes_one_insert_per_table_and_a_batch_holding_a_consumed_one_is_decided_event_by_event,
    a_redelivered_event_yields_one_job_and_the_duplicate_branch_really_runs,
    records_fetched_together_commit_together_with_one_job_each_and_a_copy_among_them_is_absorbed,
    a_failure_on_another_constraint_is_not_acknowledged_and_leaves_no_consumed_row,
    a_poison_record_is_dead_lettered_and_later_records_are_still_processed,
    two_consumers_in_one_group_share_the_partitions_and_no_event_yields_two_jobs,
    offsets_of_committed_work_are_committed_on_shutdown,
    two_consumer_names_on_one_database_each_make_their_own_job_once,
    jobs_made_before_the_upgrade_are_kept_and_belong_to_the_consumer_that_made_them,
    the_timeline_tables_gain_an_event_id_index_that_the_migration_can_take_back,
    a_replay_by_a_new_group_makes_no_new_effect_and_no_new_dead_letter_and_commits_past_the_end,
    a_consumer_killed_and_restarted_three_times_under_load_consumes_everything_soon_after_its_last_start,
    a_static_member_that_stops_leaves_the_group_and_another_instance_takes_over,
);

// What only a failpoint can stage: not compiled without them, so no test passes untested.
#[cfg(feature = "failpoints")]
on_every_backend!(
    a_consumer_killed_after_its_commit_and_before_the_offset_commit_deduplicates_the_redelivery,
);

async fn a_redelivered_event_yields_one_job_and_the_duplicate_branch_really_runs(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let (event_id, payload) = event_record(42);
    for _ in 0..3 {
        produce(&broker.address(), &topic, "42", &payload, Some(&event_id)).await;
    }

    let consumer = TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g1")).await;
    assert_eventually("all three deliveries are handled", WAIT, || async {
        let stats = consumer.stats.snapshot();
        stats.consumed + stats.duplicates >= 3
    })
    .await;

    let stats = consumer.stats.snapshot();
    assert_eq!(app.rows_for_event("consumed_event", &event_id).await, 1);
    assert_eq!(app.rows_for_event("notification_job", &event_id).await, 1);
    assert_eq!((stats.consumed, stats.duplicates), (1, 2), "{stats:?}");
    assert!(stats.handled > 1, "handle attempts exceed consumed rows: the duplicates really arrived");
    consumer.stop().await;
}

async fn records_fetched_together_commit_together_with_one_job_each_and_a_copy_among_them_is_absorbed(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    // Everything is on the topic before the consumer starts, so its first fetch brings many.
    let ids = produce_events(&broker.address(), &topic, 40, Some(20)).await;

    let consumer = TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g1")).await;
    assert_eventually("all 41 deliveries are handled", WAIT, || async {
        let stats = consumer.stats.snapshot();
        stats.consumed + stats.duplicates >= 41
    })
    .await;

    let stats = consumer.stats.snapshot();
    assert_eq!((stats.consumed, stats.duplicates), (40, 1), "{stats:?}");
    assert!(stats.batched > 1, "records were committed together: {stats:?}");
    assert_eq!(app.count("consumed_event").await, 40);
    assert_eq!(app.count("notification_job").await, 40);
    for event_id in &ids {
        assert_eq!(app.rows_for_event("notification_job", event_id).await, 1);
    }
    consumer.stop().await;
}

#[cfg(feature = "failpoints")]
async fn a_consumer_killed_after_its_commit_and_before_the_offset_commit_deduplicates_the_redelivery(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let (event_id, payload) = event_record(42);
    produce(&broker.address(), &topic, "42", &payload, Some(&event_id)).await;
    let args = vec![
        format!("--database-url={}", app.db.url),
        format!("--brokers={}", broker.address()),
        format!("--topic={topic}"),
        "--group-id=g1".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
    ]
    .into_iter()
    .chain(fast_group_options().into_iter().map(|(k, v)| format!("--kafka-option={k}={v}")))
    .collect::<Vec<_>>();

    // The consumer commits, then hangs before storing the offset; it is killed there.
    let hung = TestService::spawn(
        "idempost-consumer",
        &args,
        &[("FAILPOINTS", "AFTER_CONSUMER_COMMIT_BEFORE_MESSAGE_ACK=sleep(600000)".into())],
    );
    assert_eventually("the first consumer committed its transaction", WAIT, || async {
        app.rows_for_event("consumed_event", &event_id).await == 1
    })
    .await;
    hung.signal("KILL").await;

    let consumer = TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g1")).await;
    assert_eventually("the event is redelivered and recognised", WAIT, || async {
        consumer.stats.snapshot().duplicates == 1
    })
    .await;
    assert_eq!(app.rows_for_event("consumed_event", &event_id).await, 1);
    assert_eq!(app.rows_for_event("notification_job", &event_id).await, 1);
    assert_eq!(consumer.stats.snapshot().consumed, 0);
    consumer.stop().await;
}

async fn a_failure_on_another_constraint_is_not_acknowledged_and_leaves_no_consumed_row(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let (event_id, payload) = event_record(42);
    // A job row for the event already exists without a consumed_event row: the job insert hits
    // notification_job's primary key, which is not uq_consumed_event_identity.
    app.conn
        .execute_unprepared(&format!(
            "INSERT INTO notification_job (consumer_name, event_id, order_id, source_version, status, created_at) \
             VALUES ('{}', '{event_id}', 1, 1, 'PENDING', '2026-01-01 00:00:00')",
            consumer::DEFAULT_CONSUMER_NAME
        ))
        .await
        .unwrap();
    produce(&broker.address(), &topic, "42", &payload, Some(&event_id)).await;

    let consumer = TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g1")).await;
    assert_eventually("the message fails repeatedly", WAIT, || async {
        consumer.stats.snapshot().failures >= 3
    })
    .await;
    let stats = consumer.stats.snapshot();
    assert_eq!((stats.consumed, stats.duplicates), (0, 0), "never taken for already consumed: {stats:?}");
    assert_eq!(app.rows_for_event("consumed_event", &event_id).await, 0, "the dedup row was rolled back");

    // Not acknowledged: once the conflict is cleared, the same delivery succeeds.
    app.conn
        .execute_unprepared(&format!("DELETE FROM notification_job WHERE event_id = '{event_id}'"))
        .await
        .unwrap();
    assert_eventually("the retried message commits", WAIT, || async {
        consumer.stats.snapshot().consumed == 1
    })
    .await;
    assert_eq!(app.rows_for_event("consumed_event", &event_id).await, 1);
    consumer.stop().await;
    // A value too long for its column is refused at start-up now (see
    // settings_that_would_break_a_guarantee_are_refused_at_start_up); classify::* shows such an
    // error is never taken for the named key.
}

async fn a_poison_record_is_dead_lettered_and_later_records_are_still_processed(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let poison = b"\xff\xfe not a protobuf message".to_vec();
    produce(&broker.address(), &topic, "13", &poison, Some("poison-1")).await;
    let (event_id, payload) = event_record(42);
    produce(&broker.address(), &topic, "42", &payload, Some(&event_id)).await;

    let consumer = TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g1")).await;
    assert_eventually("the record after the poison is consumed", WAIT, || async {
        app.rows_for_event("notification_job", &event_id).await == 1
    })
    .await;

    assert_eq!(consumer.stats.snapshot().dead_lettered, 1);
    let backend_kind = app.conn.get_database_backend();
    let row = app
        .conn
        .query_one_raw(Statement::from_string(
            backend_kind,
            "SELECT topic, partition_id, offset_id, payload, event_id, error, consumer_name FROM dead_letter",
        ))
        .await
        .unwrap()
        .expect("a dead letter");
    assert_eq!(row.try_get_by_index::<String>(0).unwrap(), topic);
    assert_eq!(row.try_get_by_index::<i32>(1).unwrap(), 0);
    assert_eq!(row.try_get_by_index::<i64>(2).unwrap(), 0);
    assert_eq!(row.try_get_by_index::<Vec<u8>>(3).unwrap(), poison, "raw bytes kept");
    assert_eq!(row.try_get_by_index::<Option<String>>(4).unwrap().as_deref(), Some("poison-1"));
    assert!(!row.try_get_by_index::<String>(5).unwrap().is_empty());
    assert_eq!(row.try_get_by_index::<String>(6).unwrap(), consumer::DEFAULT_CONSUMER_NAME);
    consumer.stop().await;
}

async fn two_consumers_in_one_group_share_the_partitions_and_no_event_yields_two_jobs(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 4).await;
    let first =
        TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "shared")).await;
    let second =
        TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "shared")).await;
    assert_eventually("both instances hold partitions", WAIT, || async {
        let (a, b) = (first.stats.snapshot(), second.stats.snapshot());
        a.assigned_partitions > 0
            && b.assigned_partitions > 0
            && a.assigned_partitions + b.assigned_partitions == 4
    })
    .await;

    let mut ids = Vec::new();
    for order_id in 1..=40 {
        let (event_id, payload) = event_record(order_id);
        produce(&broker.address(), &topic, &order_id.to_string(), &payload, Some(&event_id)).await;
        // Every fourth event is delivered twice.
        if order_id % 4 == 0 {
            produce(&broker.address(), &topic, &order_id.to_string(), &payload, Some(&event_id)).await;
        }
        ids.push(event_id);
    }
    assert_eventually("forty jobs exist", WAIT, || async { app.count("notification_job").await == 40 }).await;

    assert_eq!(app.count("consumed_event").await, 40);
    for id in &ids {
        assert_eq!(app.rows_for_event("notification_job", id).await, 1);
    }
    let (a, b) = (first.stats.snapshot(), second.stats.snapshot());
    assert_eq!(a.consumed + b.consumed, 40, "{a:?} {b:?}");
    assert!(a.handled > 0 && b.handled > 0, "both instances took partitions: {a:?} {b:?}");
    first.stop().await;
    second.stop().await;
}

async fn offsets_of_committed_work_are_committed_on_shutdown(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    for order_id in 1..=5 {
        let (event_id, payload) = event_record(order_id);
        produce(&broker.address(), &topic, &order_id.to_string(), &payload, Some(&event_id)).await;
    }
    let first = TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g1")).await;
    assert_eventually("five events are consumed", WAIT, || async { first.stats.snapshot().consumed == 5 })
        .await;
    first.stop().await;

    let (event_id, payload) = event_record(6);
    produce(&broker.address(), &topic, "6", &payload, Some(&event_id)).await;
    let second = TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g1")).await;
    assert_eventually("the new event is consumed", WAIT, || async {
        app.rows_for_event("notification_job", &event_id).await == 1
    })
    .await;

    let stats = second.stats.snapshot();
    assert_eq!((stats.handled, stats.duplicates), (1, 0), "nothing committed was redelivered: {stats:?}");
    second.stop().await;
}

async fn two_consumer_names_on_one_database_each_make_their_own_job_once(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 2).await;
    let ids = produce_events(&broker.address(), &topic, 10, Some(5)).await;

    let mut consumers = Vec::new();
    for name in ["planner-a", "planner-b"] {
        let mut settings =
            consumer_settings(&app.db.url, &broker.address(), &topic, &format!("group-{name}"));
        settings.consumer_name = name.to_owned();
        consumers.push(TestConsumer::spawn(settings).await);
    }
    assert_eventually("each consumer handled all eleven deliveries", WAIT, || async {
        consumers.iter().all(|c| {
            let stats = c.stats.snapshot();
            stats.consumed + stats.duplicates >= 11
        })
    })
    .await;

    // Not `failures == 0`: one failed handling was seen once in a full run on MariaDB, most
    // likely the two names' transactions deadlocking on the gap locks that the locked read and
    // upsert of `order_view` take for the same orders; the failed batch is handled again,
    // unacknowledged until it commits. What the names must not share is the effect: each
    // consumes every event once and absorbs the one duplicate.
    for consumer in &consumers {
        let stats = consumer.stats.snapshot();
        assert_eq!((stats.consumed, stats.duplicates), (10, 1), "{stats:?}");
    }
    assert_eq!(app.count("notification_job").await, 20);
    assert_eq!(app.count("consumed_event").await, 20);
    for event_id in &ids {
        for name in ["planner-a", "planner-b"] {
            let jobs = app
                .scalar_i64(&format!(
                    "SELECT COUNT(*) FROM notification_job j JOIN consumed_event c \
                     ON c.consumer_name = j.consumer_name AND c.event_id = j.event_id \
                     WHERE j.consumer_name = '{name}' AND j.event_id = '{event_id}'"
                ))
                .await;
            assert_eq!(jobs, 1, "{name} made one job for {event_id}, with its dedup row");
        }
    }
    for consumer in consumers {
        consumer.stop().await;
    }
}

async fn jobs_made_before_the_upgrade_are_kept_and_belong_to_the_consumer_that_made_them(backend: Backend) {
    use idempost_migration::{Migrator, MigratorTrait};

    let db = crate::helpers::TestDb::empty(backend).await;
    let conn = db.connect().await;
    let before = Migrator::migrations()
        .iter()
        .position(|m| m.name() == "m20261203_000002_effect_per_consumer")
        .expect("the migration is known");
    Migrator::up(&conn, Some(u32::try_from(before).unwrap())).await.unwrap();
    let at =
        if backend == Backend::MariaDb { "'2026-01-01 00:00:00'" } else { "'2026-01-01 00:00:00+00:00'" };
    let (consumed, purged) = ("00000000-0000-7000-8000-000000000001", "00000000-0000-7000-8000-000000000002");
    conn.execute_unprepared(&format!(
        "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES ('planner-x', '{consumed}', {at})"
    ))
    .await
    .unwrap();
    for (order_id, event_id) in [(1, consumed), (2, purged)] {
        conn.execute_unprepared(&format!(
            "INSERT INTO notification_job (event_id, order_id, source_version, status, created_at) \
             VALUES ('{event_id}', {order_id}, 1, 'PENDING', {at})"
        ))
        .await
        .unwrap();
    }

    Migrator::up(&conn, None).await.unwrap();

    let backend_kind = conn.get_database_backend();
    let rows = conn
        .query_all_raw(Statement::from_string(
            backend_kind,
            "SELECT consumer_name, event_id, order_id FROM notification_job ORDER BY order_id",
        ))
        .await
        .unwrap();
    let rows: Vec<(String, String, i64)> = rows
        .iter()
        .map(|r| {
            (r.try_get_by_index(0).unwrap(), r.try_get_by_index(1).unwrap(), r.try_get_by_index(2).unwrap())
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("planner-x".to_owned(), consumed.to_owned(), 1),
            (consumer::DEFAULT_CONSUMER_NAME.to_owned(), purged.to_owned(), 2)
        ],
        "both jobs kept; each names the consumer whose dedup row committed with it"
    );
    // The key is now the dedup identity: another consumer's job for the same event fits, the
    // same consumer's second job does not.
    let job = |name: &str| {
        format!(
            "INSERT INTO notification_job (consumer_name, event_id, order_id, source_version, status, created_at) \
             VALUES ('{name}', '{consumed}', 1, 1, 'PENDING', {at})"
        )
    };
    conn.execute_unprepared(&job("planner-y")).await.unwrap();
    conn.execute_unprepared(&job("planner-x")).await.unwrap_err();
    conn.close().await.unwrap();
}

async fn the_timeline_tables_gain_an_event_id_index_that_the_migration_can_take_back(backend: Backend) {
    use idempost_migration::{Migrator, MigratorTrait, SchemaManager};

    const INDEXES: [(&str, &str); 3] = [
        ("consumed_event", "idx_consumed_event_event_id"),
        ("notification_job", "idx_notification_job_event_id"),
        ("dead_letter", "idx_dead_letter_event_id"),
    ];
    async fn present(conn: &sea_orm::DatabaseConnection) -> Vec<bool> {
        let manager = SchemaManager::new(conn);
        let mut present = Vec::new();
        for (table, index) in INDEXES {
            present.push(manager.has_index(table, index).await.unwrap());
        }
        present
    }
    let db = crate::helpers::TestDb::migrated(backend).await;
    let conn = db.connect().await;
    assert_eq!(present(&conn).await, [true; 3], "migrated: every timeline table has its index");

    if backend == Backend::Sqlite {
        // The timeline's own lookups (filter and order as in services/consumer/src/admin.rs) use them.
        for (sql, index) in [
            ("SELECT * FROM consumed_event WHERE event_id = 'x' ORDER BY consumed_at", INDEXES[0].1),
            (
                "SELECT * FROM notification_job WHERE event_id = 'x' ORDER BY created_at, consumer_name",
                INDEXES[1].1,
            ),
            ("SELECT * FROM dead_letter WHERE event_id = 'x' ORDER BY id", INDEXES[2].1),
        ] {
            let plan = conn
                .query_all_raw(Statement::from_string(
                    sea_orm::DbBackend::Sqlite,
                    format!("EXPLAIN QUERY PLAN {sql}"),
                ))
                .await
                .unwrap();
            let plan: Vec<String> = plan.iter().map(|r| r.try_get("", "detail").unwrap()).collect();
            assert!(plan.iter().any(|step| step.contains(index)), "{sql}: {plan:?}");
        }
    }

    // Back to just before this migration, whatever came after it.
    idempost_testkit::db::migrate_back_before(&conn, "m20261203_000003_event_id_lookup").await;
    assert_eq!(present(&conn).await, [false; 3], "down removes what up added");
    Migrator::up(&conn, None).await.unwrap();
    assert_eq!(present(&conn).await, [true; 3], "and up adds them again");
    conn.close().await.unwrap();
}

/// The group's committed offset and the high watermark of every partition of `topic`.
async fn committed_and_end(brokers: &str, topic: &str, group: &str) -> Vec<(i32, i64, i64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};

    let (brokers, topic, group) = (brokers.to_owned(), topic.to_owned(), group.to_owned());
    tokio::task::spawn_blocking(move || {
        let reader: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let timeout = Duration::from_secs(10);
        let partitions = reader.fetch_metadata(Some(&topic), timeout).unwrap().topics()[0].partitions().len();
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(&topic, i32::try_from(partition).unwrap());
        }
        let committed = reader.committed_offsets(list, timeout).unwrap();
        committed
            .elements()
            .iter()
            .map(|e| {
                let offset = match e.offset() {
                    Offset::Offset(o) => o,
                    other => panic!("partition {} has no committed offset: {other:?}", e.partition()),
                };
                let (_, end) = reader.fetch_watermarks(&topic, e.partition(), timeout).unwrap();
                (e.partition(), offset, end)
            })
            .collect()
    })
    .await
    .unwrap()
}

async fn a_replay_by_a_new_group_makes_no_new_effect_and_no_new_dead_letter_and_commits_past_the_end(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 1).await;
    let (first, payload) = event_record(1);
    produce(&broker.address(), &topic, "1", &payload, Some(&first)).await;
    produce(&broker.address(), &topic, "13", b"\xff\xfe not a protobuf message", Some("poison-1")).await;
    for order_id in 2..=3 {
        let (event_id, payload) = event_record(order_id);
        produce(&broker.address(), &topic, &order_id.to_string(), &payload, Some(&event_id)).await;
    }

    let original = TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g1")).await;
    assert_eventually("the first pass consumed three events and set one record aside", WAIT, || async {
        let stats = original.stats.snapshot();
        stats.consumed == 3 && stats.dead_lettered == 1
    })
    .await;
    original.stop().await;

    // An operator's replay: a new group, the same consumer name, from the beginning.
    let replay =
        TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, "g-replay")).await;
    assert_eventually("the replay handled all four records again", WAIT, || async {
        let stats = replay.stats.snapshot();
        stats.duplicates == 3 && stats.dead_letter_duplicates == 1
    })
    .await;
    let stats = replay.stats.snapshot();
    replay.stop().await;

    assert_eq!((stats.consumed, stats.dead_lettered, stats.failures), (0, 0, 0), "{stats:?}");
    assert_eq!(app.count("notification_job").await, 3, "no new effect");
    assert_eq!(app.count("consumed_event").await, 3);
    assert_eq!(app.count("dead_letter").await, 1, "no new dead letter");
    for (partition, committed, end) in committed_and_end(&broker.address(), &topic, "g-replay").await {
        assert_eq!(committed, end, "partition {partition}: the replay committed past its last record");
    }
}

/// Runs the consumer binary with `args` and answers its exit status and stderr.
async fn start_up_output(args: &[String]) -> (std::process::ExitStatus, String) {
    let output = tokio::process::Command::new(crate::helpers::service_binary("idempost-consumer"))
        .env(idempost::failpoint::ALLOW_FAILPOINTS, "1")
        .args(args)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("IDEMPOST_KAFKA_OPTIONS")
        .output();
    let output = tokio::time::timeout(WAIT, output).await.expect("the consumer exits at once").unwrap();
    (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test]
async fn settings_that_would_break_a_guarantee_are_refused_at_start_up() {
    let db = tempfile::tempdir().unwrap();
    let base = vec![
        format!("--database-url=sqlite://{}/consumer.db?mode=rwc", db.path().display()),
        // Nothing listens here: a refused setting must stop the consumer before it connects.
        format!("--brokers=127.0.0.1:{}", idempost_testkit::ports::free_port()),
        "--listen=127.0.0.1:0".to_owned(),
    ];
    for (extra, says) in [
        (format!("--consumer-name={}", "n".repeat(129)), "--consumer-name must have 1 to 128 characters"),
        ("--kafka-option=enable.partition.eof=true".to_owned(), "enable.partition.eof must stay false"),
        ("--kafka-option=enable.auto.commit=false".to_owned(), "enable.auto.commit must stay true"),
        ("--kafka-option=auto.offset.reset=latest".to_owned(), "auto.offset.reset must be earliest"),
        (
            "--kafka-option=enable.auto.offset.store=TRUE".to_owned(),
            "enable.auto.offset.store must stay false",
        ),
    ] {
        let mut args = base.clone();
        args.push(extra.clone());
        let (status, stderr) = start_up_output(&args).await;
        assert!(!status.success(), "{extra} was accepted");
        assert!(stderr.contains("invalid settings") && stderr.contains(says), "{extra}: {stderr}");
    }
}

/// Starts the consumer binary with `args`, as an operator's supervisor would.
fn consumer_process(args: &[String]) -> TestService {
    TestService::spawn("idempost-consumer", args, &[])
}

async fn a_consumer_killed_and_restarted_three_times_under_load_consumes_everything_soon_after_its_last_start(
    backend: Backend,
) {
    use std::os::unix::process::ExitStatusExt as _;

    const ORDERS: i64 = 2_000;
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 3).await;
    let relay = TestRelay::spawn(relay_defaults(&app.db.url, &broker.address(), &topic)).await;

    // A fixed health port: the default instance name (host and port) is the same at every start,
    // as it is for a supervised process with its configured port.
    let args = vec![
        format!("--database-url={}", app.db.url),
        format!("--brokers={}", broker.address()),
        format!("--topic={topic}"),
        "--group-id=g1".to_owned(),
        format!("--listen=127.0.0.1:{}", idempost_testkit::ports::free_port()),
    ];
    let mut consumer = consumer_process(&args);

    // The load: 2,000 orders from 8 concurrent callers following the caller protocol (a
    // ROLLED_BACK answer is retried with the same ids), while the consumer is killed.
    let load = {
        let client = app.client.clone();
        tokio::spawn(async move {
            let callers = (0..8).map(|caller| {
                let policy = idempost_client::SubmitPolicy { max_calls: 20, ..Default::default() };
                let mut submitter = idempost_client::SafeSubmitter::new(client.clone(), policy);
                tokio::spawn(async move {
                    for i in (caller..ORDERS).step_by(8) {
                        submitter.submit(order(7, &format!("load-{i}"))).await.unwrap();
                    }
                })
            });
            for caller in futures::future::join_all(callers).await {
                caller.unwrap();
            }
        })
    };

    let jobs = || async { app.count("notification_job").await };
    let mut last_start = tokio::time::Instant::now();
    for kill in 1..=3 {
        // Each incarnation makes progress of its own before it is killed.
        let before = jobs().await;
        assert_eventually(&format!("incarnation {kill} makes 200 new jobs"), WAIT, || async {
            jobs().await >= (before + 200).min(ORDERS)
        })
        .await;
        consumer.signal("KILL").await;
        let status = consumer.wait(WAIT).await;
        assert_eq!(status.signal(), Some(9), "incarnation {kill} was SIGKILLed: {status:?}");
        consumer = consumer_process(&args);
        last_start = tokio::time::Instant::now();
    }
    let killed_at = jobs().await;
    assert!(killed_at < ORDERS, "the last kill came before everything was consumed ({killed_at} jobs)");

    // What "soon" is about: a restarted member that had to wait for its old one to be dropped
    // sat on an empty assignment for minutes. So the last incarnation must be consuming again
    // within 60 s of its start; how long the rest takes depends on how fast the callers submit
    // on a loaded machine, which is not this test's question.
    let remaining = tokio::time::Duration::from_secs(60).saturating_sub(last_start.elapsed());
    assert_eventually("the last incarnation consumes within 60 s of its start", remaining, || async {
        jobs().await > killed_at
    })
    .await;
    tokio::time::timeout(WAIT, load).await.expect("the load finished").unwrap();
    assert_eventually("every order has its job", WAIT, || async { jobs().await == ORDERS }).await;
    assert_eq!(app.count("consumed_event").await, ORDERS, "one dedup row per event");
    assert_eq!(app.count("notification_job").await, ORDERS, "one effect per event");
    consumer.signal("TERM").await;
    assert!(consumer.wait(WAIT).await.success());
    relay.stop().await;
}

async fn a_static_member_that_stops_leaves_the_group_and_another_instance_takes_over(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = topic();
    broker.create_topic(&topic, 2).await;
    let static_member = |instance: &str| {
        let mut settings = consumer_settings(&app.db.url, &broker.address(), &topic, "g1");
        settings.membership = consumer::Membership::Static;
        settings.instance_name = Some(instance.to_owned());
        // Tansu pauses static joins and syncs for 3 s each: the session must outlast both.
        settings.kafka.options = vec![("heartbeat.interval.ms".into(), "500".into())];
        settings
    };
    produce_events(&broker.address(), &topic, 4, None).await;
    let first = TestConsumer::spawn(static_member("first")).await;
    assert_eventually("the first instance consumed four events", WAIT, || async {
        first.stats.snapshot().consumed == 4
    })
    .await;
    first.stop().await;

    // Had the first instance stayed in the group, Tansu would keep its partitions (and its
    // leadership) until it came back under its name.
    let (event_id, payload) = event_record(5);
    produce(&broker.address(), &topic, "5", &payload, Some(&event_id)).await;
    let second = TestConsumer::spawn(static_member("second")).await;
    assert_eventually("another instance consumed the new event", WAIT, || async {
        app.rows_for_event("notification_job", &event_id).await == 1
    })
    .await;
    let stats = second.stats.snapshot();
    assert_eq!(stats.assigned_partitions, 2, "it holds both partitions: {stats:?}");
    assert_eq!(app.count("notification_job").await, 5);
    second.stop().await;
}

/// The consumer writes a batch of new events with one insert per table; a batch that holds an
/// event already consumed falls back to deciding each event in a savepoint of its own, so the
/// consumed one is absorbed and the others still commit.
async fn a_batch_of_new_events_takes_one_insert_per_table_and_a_batch_holding_a_consumed_one_is_decided_event_by_event(
    backend: Backend,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use idempost_consumer::{Consumed, Inbox, OrderEvent, decode};

    let app = TestOrder::spawn(backend).await;
    let mut db = app.db.connect().await;
    let inserts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&inserts);
    db.set_metric_callback(move |info| {
        if info.statement.sql.trim_start().to_uppercase().starts_with("INSERT") {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let inbox = Inbox::new(db, "planner");
    let event = |order_id: i64| -> OrderEvent {
        let (event_id, payload) = event_record(order_id);
        decode(Some(&payload), |name| (name == "event_id").then(|| event_id.clone())).unwrap()
    };

    let first: Vec<OrderEvent> = (1..=3).map(event).collect();
    assert_eq!(inbox.consume_all(&first).await.unwrap(), [Consumed::Committed; 3]);
    assert_eq!(
        inserts.swap(0, Ordering::SeqCst),
        3,
        "one insert of the dedup rows, one of the jobs, one upsert of the read model"
    );

    let again = vec![event(4), first[1].clone(), event(5)];
    let outcomes = inbox.consume_all(&again).await.unwrap();
    assert_eq!(outcomes, [Consumed::Committed, Consumed::AlreadyConsumed, Consumed::Committed]);
    assert!(inserts.load(Ordering::SeqCst) > 2, "the batch was decided event by event");
    assert_eq!(app.count("notification_job").await, 5, "one job per event, the copy absorbed");
    assert_eq!(app.count("consumed_event").await, 5);
}
