//! The database stopped for 20 s during load and started again, on a private MariaDB or
//! PostgreSQL server: the order service answers UNAVAILABLE (nothing written) or an exact
//! outcome, never a bare INTERNAL; the relay and the consumer keep running and resume by
//! themselves; every service's health says NOT_SERVING meanwhile and SERVING after; no event is
//! lost and none has a second effect.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempost_relay as relay;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::broker::{TestBroker, read_topic};
use crate::helpers::{
    Backend, InProcess, OutboxProbe, TestOrder, assert_eventually, metadata, order, reason,
};
use crate::private_db::PrivateServer;
use idempost_testkit::broker::produce;
use idempost_testkit::consumer::TestConsumer;
use idempost_testkit::consumer::consumer_settings;
use idempost_testkit::health::assert_health;
use idempost_testkit::relay::relay_settings;

const OUTAGE: Duration = Duration::from_secs(20);

mod a_database_outage_during_load_is_survived_by_every_service {
    use crate::helpers::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn mariadb() {
        super::a_database_outage_during_load_is_survived_by_every_service(Backend::MariaDb).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::a_database_outage_during_load_is_survived_by_every_service(Backend::Postgres).await;
    }
}

/// One SubmitOrder answer: the request id, the status code and the reason.
type Answer = (String, Code, String);

async fn a_database_outage_during_load_is_survived_by_every_service(backend: Backend) {
    let mut server = PrivateServer::start(backend).await;
    let app = TestOrder::spawn_on(server.migrated_database().await, |_| {}).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 2).await;
    let mut settings = relay_settings(&app.db.url, &broker.address(), &topic);
    settings.max_attempts = 1_000;
    let relay = relay::Application::build(settings).await.unwrap();
    let relay_port = relay.port();
    let relay = InProcess::spawn(|shutdown| relay.run_until_stopped(shutdown));
    let mut settings = consumer_settings(&app.db.url, &broker.address(), &topic, "outage");
    // A member that stopped polling for 10 s would be put out of its group: the consumer must
    // keep polling while it waits for the database.
    settings.kafka.options.push(("max.poll.interval.ms".into(), "10000".into()));
    // Retries of a record in hand wait up to 8 s, plus the failed attempt itself: without
    // polling in between, more than the 10 s allowed.
    settings.backoff_max = Duration::from_secs(8);
    let consumer = TestConsumer::spawn(settings).await;
    for (port, service) in [(app.port, "idempost.v1.OrderService"), (relay_port, ""), (consumer.port, "")] {
        assert_health("every service is SERVING", port, service, ServingStatus::Serving).await;
    }

    // The consumer must keep its partitions throughout: it holds them all (the only member),
    // and had it stopped polling for 10 s it would have been put out of the group and lost
    // them, if only for the moment of rejoining.
    assert_eventually("the consumer holds both partitions", WAIT_DRAIN, || async {
        consumer.stats.snapshot().assigned_partitions == 2
    })
    .await;
    let (stop_sampling, sampling_stopped) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn({
        let stats = Arc::clone(&consumer.stats);
        async move {
            let mut fewest = u64::MAX;
            while !*sampling_stopped.borrow() {
                fewest = fewest.min(stats.snapshot().assigned_partitions);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            fewest
        }
    });

    // Load: one caller submitting new orders back to back, through the whole outage.
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let (stop_load, load_stopped) = tokio::sync::watch::channel(false);
    let load = tokio::spawn({
        let (client, answers) = (app.client.clone(), Arc::clone(&answers));
        async move {
            let mut i = 0;
            while !*load_stopped.borrow() {
                i += 1;
                let request_id = format!("load-{i}");
                let answer = client.clone().submit_order(order(7, &request_id)).await;
                let (code, why) = match &answer {
                    Ok(_) => (Code::Ok, String::new()),
                    Err(status) => (status.code(), reason(status)),
                };
                answers.lock().unwrap().push((request_id, code, why));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let committed_so_far = || answers.lock().unwrap().iter().filter(|(_, code, _)| *code == Code::Ok).count();
    assert_eventually("the load has committed orders before the outage", WAIT_DRAIN, || async {
        committed_so_far() >= 20
    })
    .await;

    server.stop().await;
    let stopped_at = tokio::time::Instant::now();
    assert_health(
        "the order service is NOT_SERVING",
        app.port,
        "idempost.v1.OrderService",
        ServingStatus::NotServing,
    )
    .await;
    assert_health("the relay is NOT_SERVING", relay_port, "", ServingStatus::NotServing).await;
    assert_health("the consumer is NOT_SERVING", consumer.port, "", ServingStatus::NotServing).await;
    // A copy of a published event reaches the consumer while its database is away, so it has
    // a record in hand to retry (the relay publishes nothing new meanwhile).
    let published = read_topic(&broker.address(), &topic, 1, WAIT_DRAIN, Duration::ZERO).await;
    let copy = &published[0];
    let key = String::from_utf8_lossy(&copy.key).into_owned();
    produce(&broker.address(), &topic, &key, &copy.value, Some(copy.header("event_id"))).await;
    tokio::time::sleep_until(stopped_at + OUTAGE).await;
    server.resume().await;
    for (port, service) in [(app.port, "idempost.v1.OrderService"), (relay_port, ""), (consumer.port, "")] {
        assert_health("every service is SERVING again", port, service, ServingStatus::Serving).await;
    }
    let before = committed_so_far();
    assert_eventually("the load commits orders again after the outage", WAIT_DRAIN, || async {
        committed_so_far() >= before + 20
    })
    .await;
    stop_load.send(true).unwrap();
    load.await.unwrap();

    let answers = answers.lock().unwrap().clone();
    let mut committed = 0;
    for (request_id, code, why) in &answers {
        let found = app.reconcile(7, request_id).await;
        match (code, why.as_str()) {
            (Code::Ok, _) => {
                committed += 1;
                assert!(found.is_ok(), "{request_id} was committed");
            }
            (Code::Unavailable, "DATABASE_UNAVAILABLE") | (Code::Aborted, "ROLLED_BACK") => {
                let status = found.unwrap_err();
                assert_eq!(
                    status.code(),
                    Code::NotFound,
                    "{request_id} answered {code:?}: nothing was written"
                );
            }
            (Code::Unknown, "OUTCOME_UNKNOWN") => {}
            _ => panic!("{request_id} got {code:?} {why:?}: not an exact outcome"),
        }
    }
    let unavailable = answers.iter().filter(|(_, code, _)| *code == Code::Unavailable).count();
    assert!(unavailable > 0, "the outage really reached callers: {answers:?}");
    assert!(committed > 0 && answers.last().is_some_and(|(_, code, _)| *code == Code::Ok), "{answers:?}");
    let _ = metadata;

    // Every committed order is published and has exactly one effect.
    let orders = app.count("orders").await;
    let probe = OutboxProbe { conn: &app.conn };
    assert_eq!(app.count("outbox_event").await, orders, "one outbox row per order");
    assert_eventually("every event is published and consumed once", WAIT_DRAIN, || async {
        probe.count_with_status("PUBLISHED").await == orders
            && app.count("consumed_event").await == orders
            && app.count("notification_job").await == orders
    })
    .await;
    assert_eq!(
        app.scalar_i64(
            "SELECT COUNT(*) FROM notification_job j LEFT JOIN orders o ON o.acceptance_event_id = j.event_id WHERE o.id IS NULL"
        )
        .await,
        0,
        "no effect without an order"
    );
    stop_sampling.send(true).unwrap();
    assert_eq!(
        sampler.await.unwrap(),
        2,
        "the consumer kept polling, and its partitions, through the outage"
    );
    // Both kept running through the outage: each stops now, on request, without an error.
    relay.stop().await;
    consumer.service.stop().await;
    app.stop().await;
}

const WAIT_DRAIN: Duration = Duration::from_secs(90);
