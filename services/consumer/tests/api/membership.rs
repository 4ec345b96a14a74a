//! Static membership that cannot fight itself: a second live consumer under an instance name
//! already in use stops at start-up with an error naming it, and static membership is never
//! named after a port picked at random. Real consumer processes, a real Tansu broker.
//!
//! Tansu 0.6 never answers FENCED_INSTANCE_ID (a second member joining under a known instance id
//! is handed the first one's member id), so what stops the second instance here is the
//! consumer's own instance lock in its database, not the broker.

use tonic_health::pb::health_check_response::ServingStatus;

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestOrder, TestService, assert_eventually, service_binary};
use idempost_testkit::broker::produce;
use idempost_testkit::health::assert_health;
use idempost_testkit::order::event_record;
use idempost_testkit::ports::free_port;

use idempost_testkit::wait::WAIT;

/// Runs the consumer binary with `args` to its end: (exit status, stderr).
async fn run_to_exit(args: &[String]) -> (std::process::ExitStatus, String) {
    let output = tokio::process::Command::new(service_binary("idempost-consumer"))
        .args(args)
        .env("IDEMPOST_AUTH", "none")
        // A failpoints build (the suite's) refuses to start without it.
        .env(idempost::failpoint::ALLOW_FAILPOINTS, "1")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("IDEMPOST_KAFKA_OPTIONS")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(WAIT, output).await.expect("the consumer stopped by itself").unwrap();
    (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_consumer_under_an_instance_name_in_use_stops_naming_it_and_the_first_keeps_consuming() {
    let app = TestOrder::spawn(Backend::MariaDb).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 1).await;
    let args = |port: u16| {
        vec![
            format!("--database-url={}", app.db.url),
            format!("--brokers={}", broker.address()),
            format!("--topic={topic}"),
            "--group-id=g1".to_owned(),
            "--membership=static".to_owned(),
            "--instance-name=notification-planner-0".to_owned(),
            format!("--listen=127.0.0.1:{port}"),
            "--kafka-option=heartbeat.interval.ms=500".to_owned(),
        ]
    };
    let first_port = free_port();
    let mut first = TestService::spawn("idempost-consumer", &args(first_port), &[]);
    assert_health("the first instance serves", first_port, "", ServingStatus::Serving).await;

    let (status, stderr) = run_to_exit(&args(free_port())).await;
    assert!(!status.success(), "the second instance under the same name ran: {status:?}");
    assert!(
        stderr.contains("another consumer instance") && stderr.contains("`notification-planner-0`"),
        "the error names the duplicate instance: {stderr}"
    );

    let (event_id, payload) = event_record(31);
    produce(&broker.address(), &topic, "31", &payload, Some(&event_id)).await;
    assert_eventually("the first instance still consumes", WAIT, || async {
        app.count("notification_job").await == 1
    })
    .await;
    first.signal("TERM").await;
    assert!(first.wait(WAIT).await.success(), "the first instance stops cleanly");
    app.stop().await;
}

#[tokio::test]
async fn static_membership_on_a_port_picked_at_start_without_a_name_is_refused_at_start_up() {
    let db = tempfile::tempdir().unwrap();
    let (status, stderr) = run_to_exit(&[
        format!("--database-url=sqlite://{}/consumer.db?mode=rwc", db.path().display()),
        format!("--brokers=127.0.0.1:{}", free_port()),
        "--membership=static".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
    ])
    .await;
    assert!(!status.success(), "{status:?}");
    assert!(stderr.contains("--instance-name"), "the error says what to set: {stderr}");
}

/// MariaDB's `GET_LOCK` names are server-wide: two deployments in two databases of one server,
/// each with an instance `pod-0` of a group `g1` (each with its own broker), are not duplicates
/// of each other, and both run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_of_one_name_in_two_databases_of_one_mariadb_server_both_run() {
    let (first_app, second_app) =
        (TestOrder::spawn(Backend::MariaDb).await, TestOrder::spawn(Backend::MariaDb).await);
    let (first_broker, second_broker) = (TestBroker::start().await, TestBroker::start().await);
    let topic = idempost_testkit::topic::unique("idempost-test");
    let args = |app: &TestOrder, broker: &TestBroker, port: u16| {
        vec![
            format!("--database-url={}", app.db.url),
            format!("--brokers={}", broker.address()),
            format!("--topic={topic}"),
            "--group-id=g1".to_owned(),
            "--membership=static".to_owned(),
            "--instance-name=pod-0".to_owned(),
            format!("--listen=127.0.0.1:{port}"),
        ]
    };
    let mut running = Vec::new();
    for (app, broker) in [(&first_app, &first_broker), (&second_app, &second_broker)] {
        broker.create_topic(&topic, 1).await;
        let port = free_port();
        running.push(TestService::spawn("idempost-consumer", &args(app, broker, port), &[]));
        assert_health("the instance serves", port, "", ServingStatus::Serving).await;
    }
    for (app, broker, key) in [(&first_app, &first_broker, "41"), (&second_app, &second_broker, "42")] {
        let (event_id, payload) = event_record(key.parse().unwrap());
        produce(&broker.address(), &topic, key, &payload, Some(&event_id)).await;
        assert_eventually("each deployment's instance consumes its own events", WAIT, || async {
            app.count("notification_job").await == 1
        })
        .await;
    }
    for mut service in running {
        service.signal("TERM").await;
        assert!(service.wait(WAIT).await.success(), "each instance stops cleanly");
    }
    first_app.stop().await;
    second_app.stop().await;
}
