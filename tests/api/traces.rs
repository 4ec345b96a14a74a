//! One trace per event, across three real service processes, received by an in-process OTLP
//! receiver; and the metrics next to it.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sea_orm::ConnectionTrait as _;

use crate::broker::{TestBroker, read_topic};
use crate::helpers::{Backend, TestDb, TestService, assert_eventually, connect_order_service, order};
use crate::otlp::{ReceivedSpan, start_receiver};

use idempost_testkit::wait::WAIT;
const SERVER: i32 = 2;
const PRODUCER: i32 = 4;
const CONSUMER: i32 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_transition_of_an_event_lands_in_one_trace_across_the_three_services() {
    let (endpoint, received, _receiver) = start_receiver().await;
    let db = TestDb::migrated(Backend::MariaDb).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 3).await;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned()),
    ];
    let database = format!("--database-url={}", db.url);
    let (mut order_service, order_bound) = TestService::spawn_listening(
        "idempost-order",
        &[database.clone(), "--listen=127.0.0.1:0".to_owned(), "--admin-listen=127.0.0.1:0".to_owned()],
        &env,
    )
    .await;
    let order_port = order_bound.port("listen");
    let common = [
        database.clone(),
        format!("--brokers={}", broker.address()),
        format!("--topic={topic}"),
        "--listen=127.0.0.1:0".to_owned(),
    ];
    let relay_args: Vec<String> =
        common.iter().cloned().chain(["--max-idle-poll=100ms".to_owned()]).collect();
    let mut relay = TestService::spawn("idempost-relay", &relay_args, &env);
    let mut consumer = TestService::spawn("idempost-consumer", &common, &env);

    let url = format!("http://127.0.0.1:{order_port}");
    let mut client = connect_order_service(&url).await;

    // The first order arrives with the caller's own trace context: the event must join it.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut first = tonic::Request::new(order(7, "traced-0"));
    first
        .metadata_mut()
        .insert("traceparent", format!("00-{caller_trace}-00f067aa0ba902b7-01").parse().unwrap());
    let mut event_ids = vec![client.submit_order(first).await.unwrap().into_inner().event_id];
    for i in 1..5 {
        event_ids
            .push(client.submit_order(order(7, &format!("traced-{i}"))).await.unwrap().into_inner().event_id);
    }
    let conn = db.connect().await;
    let count_jobs = || async {
        let row = conn
            .query_one_raw(sea_orm::Statement::from_string(
                conn.get_database_backend(),
                "SELECT COUNT(*) FROM notification_job",
            ))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index::<i64>(0).unwrap()
    };
    assert_eventually("five notification jobs exist", WAIT, || async { count_jobs().await == 5 }).await;

    // Deliver the first event again, headers and all, as a redelivery would.
    let records = read_topic(&broker.address(), &topic, 5, WAIT, Duration::ZERO).await;
    let again = records.iter().find(|r| r.header("event_id") == event_ids[0]).unwrap();
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", broker.address()).create().unwrap();
    let mut headers = OwnedHeaders::new();
    for (key, value) in &again.headers {
        headers = headers.insert(Header { key, value: Some(value) });
    }
    producer
        .send(
            FutureRecord::to(&topic).key(&again.key).payload(&again.value).headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    assert_eventually("the duplicate's dedup hit is traced", WAIT, || async {
        received.spans().iter().any(|s| s.has_event("dedup hit"))
    })
    .await;
    assert_eventually("metrics arrive", WAIT, || async {
        let names: HashSet<String> = received.points().into_iter().map(|p| p.name).collect();
        [
            "idempost.relay.publish.latency",
            "idempost.consumer.latency",
            "idempost.consumer.duplicates",
            "idempost.outbox.backlog",
        ]
        .iter()
        .all(|n| names.contains(*n))
    })
    .await;

    // SIGTERM flushes what is still buffered.
    for service in [&mut order_service, &mut relay, &mut consumer] {
        service.signal("TERM").await;
        assert!(service.wait(Duration::from_secs(20)).await.success());
    }

    let spans = received.spans();
    for (i, event_id) in event_ids.iter().enumerate() {
        let mine: Vec<&ReceivedSpan> =
            spans.iter().filter(|s| s.attribute("idempost.event_id") == Some(event_id.as_str())).collect();
        let traces: HashSet<&str> = mine.iter().map(|s| s.trace_id.as_str()).collect();
        assert_eq!(traces.len(), 1, "one trace for event {event_id}: {mine:#?}");
        let trace_id = *traces.iter().next().unwrap();
        if i == 0 {
            assert_eq!(trace_id, caller_trace, "the caller's trace context was continued: {mine:#?}");
        }
        let in_trace: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.trace_id == trace_id).collect();
        assert!(
            in_trace.iter().all(|s| s.attribute("idempost.event_id") == Some(event_id.as_str())),
            "{in_trace:#?}"
        );
        let find = |service: &str, name: &str| -> &ReceivedSpan {
            in_trace
                .iter()
                .find(|s| s.service == service && s.name == name)
                .unwrap_or_else(|| panic!("no {service} span `{name}` for {event_id}: {in_trace:#?}"))
        };
        let rpc = find("idempost-order", "idempost.v1.OrderService/SubmitOrder");
        let transaction = find("idempost-order", "order transaction");
        let relayed = find("idempost-relay", "outbox relay");
        let send = find("idempost-relay", &format!("send {topic}"));
        let process: Vec<&&ReceivedSpan> = in_trace
            .iter()
            .filter(|s| s.service == "idempost-consumer" && s.name == format!("process {topic}"))
            .collect();
        assert!(!process.is_empty(), "no consumer span for {event_id}");

        assert_eq!(rpc.kind, SERVER);
        assert_eq!(rpc.attribute("rpc.system"), Some("grpc"));
        assert!(transaction.has_event("transaction committed"), "{transaction:?}");
        assert_eq!(transaction.attribute("db.system.name"), Some("mysql"));
        assert!(
            relayed.has_event("claimed; PUBLISHING") && relayed.has_event("marked PUBLISHED"),
            "{relayed:?}"
        );
        assert!(relayed.attributes.contains_key("lease_owner"));
        assert_eq!(send.kind, PRODUCER);
        assert_eq!(send.attribute("messaging.message.id"), Some(event_id.as_str()));
        assert_eq!(send.attribute("messaging.system"), Some("kafka"));
        assert!(send.has_event("broker confirmed"));
        let first_delivery =
            process.iter().find(|s| s.has_event("dedup miss")).expect("the first delivery committed");
        assert_eq!(first_delivery.kind, CONSUMER);
        assert_eq!(first_delivery.attribute("messaging.message.id"), Some(event_id.as_str()));
        assert!(
            first_delivery.has_event("received") && first_delivery.has_event("offset stored"),
            "{first_delivery:?}"
        );

        // Causal order, by parentage and by time.
        assert_eq!(transaction.parent_span_id, rpc.span_id);
        assert_eq!(relayed.parent_span_id, transaction.span_id, "the relay continues the stored context");
        assert_eq!(send.parent_span_id, relayed.span_id);
        assert_eq!(
            first_delivery.parent_span_id, send.span_id,
            "the consumer continues the traceparent header"
        );
        let starts = [rpc, transaction, relayed, send, first_delivery].map(|s| s.start_unix_nano);
        assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");

        if i == 0 {
            assert!(
                process.iter().any(|s| s.has_event("dedup hit")),
                "the redelivery shows in the same trace"
            );
        }
    }

    let points = received.points();
    let latest = |name: &str| points.iter().rfind(|p| p.name == name).cloned().unwrap();
    let publish = latest("idempost.relay.publish.latency");
    assert_eq!(publish.service, "idempost-relay");
    assert!(
        publish.count >= 5 && publish.value > 0.0 && publish.value / (publish.count as f64) < 60.0,
        "{publish:?}"
    );
    let consume = latest("idempost.consumer.latency");
    assert!(consume.count >= 5 && consume.value >= 0.0, "{consume:?}");
    assert!(latest("idempost.consumer.duplicates").value >= 1.0);
    assert!(points.iter().any(|p| p.name == "idempost.relay.published" && p.value >= 5.0));
    assert!(points.iter().any(|p| p.name == "idempost.outbox.oldest_pending_age" && p.value >= 0.0));
}

crate::helpers::on_every_backend!(a_tracestate_longer_than_its_column_is_shortened_and_the_order_commits);

/// With tracing on, a caller's `tracestate` of 24 members (959 characters) is stored with the
/// first 12 (479 characters): whole members, dropped from the end, within the 512-character
/// column. The order commits at once, and its event still joins the caller's trace.
async fn a_tracestate_longer_than_its_column_is_shortened_and_the_order_commits(backend: Backend) {
    let (endpoint, _received, _receiver) = start_receiver().await;
    let db = TestDb::migrated(backend).await;
    let args = [
        format!("--database-url={}", db.url),
        "--listen=127.0.0.1:0".to_owned(),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ];
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)];
    let (mut service, bound) = TestService::spawn_listening("idempost-order", &args, &env).await;
    let port = bound.port("listen");
    let mut client = connect_order_service(&format!("http://127.0.0.1:{port}")).await;

    let members: Vec<String> = (0..24).map(|i| format!("vendor{i:02}={}", "x".repeat(30))).collect();
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let mut request = tonic::Request::new(order(7, "long-tracestate"));
    let metadata = request.metadata_mut();
    metadata.insert("traceparent", format!("00-{caller_trace}-b7ad6b7169203331-01").parse().unwrap());
    metadata.insert("tracestate", members.join(",").parse().unwrap());
    let accepted = client.submit_order(request).await.expect("the order commits").into_inner();

    let conn = db.connect().await;
    let row = conn
        .query_one_raw(sea_orm::Statement::from_string(
            conn.get_database_backend(),
            format!(
                "SELECT traceparent, tracestate FROM outbox_event WHERE event_id = '{}'",
                accepted.event_id
            ),
        ))
        .await
        .unwrap()
        .expect("the outbox row");
    let (traceparent, tracestate): (String, String) =
        (row.try_get_by_index(0).unwrap(), row.try_get_by_index(1).unwrap());
    assert!(traceparent.contains(caller_trace), "{traceparent}");
    assert_eq!(tracestate, members[..12].join(","));
    service.signal("TERM").await;
    assert!(service.wait(Duration::from_secs(20)).await.success());
}
