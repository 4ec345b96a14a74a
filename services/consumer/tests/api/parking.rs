//! The consumer's read model applies each order's events in version order: a dead-lettered or
//! unknown event parks the later events of its own order only, and an operator's release of the
//! gap applies them in order.

use std::time::Duration;

use idempost_proto::v1::{self as pb, consumer_admin_service_client::ConsumerAdminServiceClient};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sea_orm::{ConnectionTrait as _, DbBackend, Statement};
use tonic::transport::Channel;

use crate::broker::TestBroker;
use crate::helpers::{Backend, InProcess, TestOrder, assert_eventually, on_every_backend};
use idempost_testkit::ordering::{change_payload, expected, read_model};

use idempost_testkit::wait::WAIT;

/// A consumer in this process and a client of its ConsumerAdminService.
struct Consumer {
    admin: ConsumerAdminServiceClient<Channel>,
    service: InProcess,
    name: String,
}

impl Consumer {
    async fn start(app: &TestOrder, broker: &TestBroker, topic: &str) -> Self {
        let group = format!("parking-{}", uuid::Uuid::new_v4().simple());
        let settings =
            idempost_testkit::consumer::consumer_settings(&app.db.url, &broker.address(), topic, &group);
        let name = settings.consumer_name.clone();
        let consumer = idempost_consumer::Application::build(settings).await.unwrap();
        let port = consumer.port();
        let service = InProcess::spawn(|shutdown| consumer.run_until_stopped(shutdown));
        let admin = ConsumerAdminServiceClient::connect(format!("http://127.0.0.1:{port}")).await.unwrap();
        Self { admin, service, name }
    }

    async fn parked(&self, order_id: i64) -> Vec<(i64, String)> {
        let request = pb::ListParkedEventsRequest { order_id, ..Default::default() };
        let reply = self.admin.clone().list_parked_events(request).await.unwrap().into_inner();
        reply.parked_events.into_iter().map(|p| (p.event_version, p.event_type)).collect()
    }

    async fn release(
        &self,
        order_id: i64,
        reason: &str,
    ) -> Result<pb::ReleaseParkedGapResponse, tonic::Status> {
        let request = pb::ReleaseParkedGapRequest { order_id, reason: reason.to_owned() };
        self.admin.clone().release_parked_gap(request).await.map(tonic::Response::into_inner)
    }

    /// The consumer's audit rows about `order_id`, newest first.
    async fn audit(&self, order_id: i64) -> Vec<pb::AuditRecord> {
        let request = pb::ConsumerAdminServiceListAuditRequest { order_id, ..Default::default() };
        self.admin.clone().list_audit(request).await.unwrap().into_inner().records
    }
}

/// Publishes version `version` of `order_id` as the relay would: key, value and headers.
/// `event_type` overrides the type (and `payload` the value) the version would have.
async fn publish(
    producer: &FutureProducer,
    topic: &str,
    (order_id, version, last): (i64, i64, i64),
    event_type: Option<&str>,
    payload: Option<&[u8]>,
) -> String {
    let event_id = uuid::Uuid::now_v7().to_string();
    // Both given: no payload of the version's own is made (none can be for the last versions).
    let (event_type, value) = match (event_type, payload) {
        (Some(event_type), Some(payload)) => (event_type.to_owned(), payload.to_vec()),
        _ => {
            let (known_type, known_payload) = change_payload(order_id, version, last, &event_id);
            (event_type.unwrap_or(known_type).to_owned(), payload.map_or(known_payload, <[u8]>::to_vec))
        }
    };
    let (key, version_text) = (order_id.to_string(), version.to_string());
    let headers = OwnedHeaders::new()
        .insert(Header { key: "event_id", value: Some(event_id.as_str()) })
        .insert(Header { key: "event_type", value: Some(event_type.as_str()) })
        .insert(Header { key: "event_version", value: Some(version_text.as_str()) })
        .insert(Header { key: "aggregate_type", value: Some("order") })
        .insert(Header { key: "aggregate_id", value: Some(key.as_str()) });
    let record = FutureRecord::to(topic).key(&key).payload(&value).headers(headers);
    producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
    event_id
}

fn producer(broker: &TestBroker) -> FutureProducer {
    ClientConfig::new().set("bootstrap.servers", broker.address()).create().unwrap()
}

async fn count(app: &TestOrder, sql: &str) -> i64 {
    app.scalar_i64(sql).await
}

on_every_backend!(
    a_dead_lettered_event_parks_the_later_events_of_its_order_only_and_a_release_applies_them_in_order,
    an_unknown_event_type_is_parked_not_dead_lettered_and_a_parked_type_the_consumer_now_knows_is_applied,
);

/// Proof (c): order 1's version 2 is poison (dead-lettered), so its versions 3 and 4 park while
/// order 2's three versions apply. The operator lists them and releases the gap: version 2 is
/// given up (audited with the reason), and 3 then 4 apply.
async fn a_dead_lettered_event_parks_the_later_events_of_its_order_only_and_a_release_applies_them_in_order(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 2).await;
    let producer = producer(&broker);
    publish(&producer, &topic, (1, 1, 4), None, None).await;
    publish(&producer, &topic, (1, 2, 4), None, Some(b"\xff not protobuf")).await;
    publish(&producer, &topic, (1, 3, 4), None, None).await;
    publish(&producer, &topic, (1, 4, 4), None, None).await;
    for version in 1..=3 {
        publish(&producer, &topic, (2, version, 3), None, None).await;
    }
    let consumer = Consumer::start(&app, &broker, &topic).await;

    assert_eventually("order 2 applied and order 1's versions 3 and 4 parked", WAIT, || async {
        let model = read_model(&app.conn, &consumer.name).await;
        model.get(&2) == Some(&expected(2, 3)) && consumer.parked(1).await.len() == 2
    })
    .await;
    assert_eq!(count(&app, "SELECT COUNT(*) FROM dead_letter").await, 1, "version 2 is dead-lettered");
    let model = read_model(&app.conn, &consumer.name).await;
    assert_eq!(model.get(&1), Some(&expected(1, 1)), "order 1 stays at version 1");
    let parked: Vec<i64> = consumer.parked(1).await.into_iter().map(|(version, _)| version).collect();
    assert_eq!(parked, vec![3, 4]);
    assert!(consumer.parked(2).await.is_empty());

    let refused = consumer.release(1, " ").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "a release needs a reason");
    let released = consumer.release(1, "v2 is lost for good (ticket 42)").await.unwrap();
    assert_eq!((released.released_from_version, released.released_to_version), (2, 2));
    assert_eq!(released.applied_versions, vec![3, 4]);
    assert_eq!((released.read_model_version, released.still_parked), (4, 0));
    let model = read_model(&app.conn, &consumer.name).await;
    assert_eq!(model.get(&1), Some(&expected(1, 4)));
    let audit = consumer.audit(1).await;
    let row: Vec<_> =
        audit.iter().map(|r| (r.action.as_str(), r.reason.as_str(), r.consumer_name.as_str())).collect();
    assert_eq!(
        row,
        [("RELEASE_GAP", "v2 is lost for good (ticket 42)", consumer.name.as_str())],
        "the release is audited"
    );
    assert!(audit[0].outcome.starts_with("versions 2..=2 given up"), "{}", audit[0].outcome);
    assert_eq!(audit[0].actor, "unauthenticated (--auth none)");
    let again = consumer.release(1, "again").await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "nothing is parked any more");
    assert_eq!(consumer.audit(1).await.len(), 1, "a refused release writes no audit row");
    consumer.service.stop().await;
}

/// Proof (d): a type this consumer does not know (as a new event type reaches a consumer not yet
/// upgraded) is parked, never dead-lettered, and holds back its order's later versions; a
/// release gives it up and applies them. An event parked by an older consumer under a type this
/// one knows (`OrderAmended`, parked by a consumer that predates it) is applied by this one.
async fn an_unknown_event_type_is_parked_not_dead_lettered_and_a_parked_type_the_consumer_now_knows_is_applied(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 1).await;
    let producer = producer(&broker);
    publish(&producer, &topic, (3, 1, 3), None, None).await;
    let shipped =
        publish(&producer, &topic, (3, 2, 3), Some("idempost.v1.OrderShipped"), Some(b"from the future"))
            .await;
    publish(&producer, &topic, (3, 3, 3), None, None).await;
    publish(&producer, &topic, (5, 1, 3), None, None).await;
    let consumer = Consumer::start(&app, &broker, &topic).await;

    assert_eventually("order 3's versions 2 and 3 parked, order 5 applied", WAIT, || async {
        consumer.parked(3).await.len() == 2 && read_model(&app.conn, &consumer.name).await.contains_key(&5)
    })
    .await;
    assert_eq!(count(&app, "SELECT COUNT(*) FROM dead_letter").await, 0, "nothing is dead-lettered");
    assert_eq!(consumer.parked(3).await[0], (2, "idempost.v1.OrderShipped".to_owned()));
    let released = consumer.release(3, "OrderShipped is not needed by this read model").await.unwrap();
    assert_eq!((released.released_from_version, released.released_to_version), (2, 2));
    assert_eq!(released.applied_versions, vec![3]);
    // The event given up is kept, payload and all, as a dead letter saying why.
    let letters = app
        .conn
        .query_all_raw(Statement::from_string(
            app.conn.get_database_backend(),
            "SELECT event_id, payload, error FROM dead_letter",
        ))
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "the given-up event is a dead letter");
    let (event_id, payload, error): (String, Vec<u8>, String) = (
        letters[0].try_get_by_index(0).unwrap(),
        letters[0].try_get_by_index(1).unwrap(),
        letters[0].try_get_by_index(2).unwrap(),
    );
    assert_eq!((event_id.as_str(), payload.as_slice()), (shipped.as_str(), &b"from the future"[..]));
    assert!(
        error.contains("OrderShipped is not needed by this read model"),
        "the dead letter says why: {error}"
    );
    let audit = consumer.audit(3).await;
    assert_eq!(audit.len(), 1);
    assert_eq!((audit[0].action.as_str(), audit[0].event_id.as_str()), ("RELEASE_GAP", shipped.as_str()));
    let model = read_model(&app.conn, &consumer.name).await;
    assert_eq!(model.get(&3).map(|m| m.version), Some(3));

    // Order 5's version 2 parked by a consumer that did not know OrderAmended yet.
    let event_id = uuid::Uuid::now_v7().to_string();
    let (event_type, payload) = change_payload(5, 2, 3, &event_id);
    let backend = app.conn.get_database_backend();
    let p = |n: usize| if backend == DbBackend::Postgres { format!("${n}") } else { "?".to_owned() };
    let sql = format!(
        "INSERT INTO parked_event (consumer_name, event_id, order_id, version, event_type, payload, reason, parked_at) \
         VALUES ({}, {}, 5, 2, {}, {}, 'unknown to the old consumer', {})",
        p(1),
        p(2),
        p(3),
        p(4),
        p(5)
    );
    let values: Vec<sea_orm::Value> = vec![
        consumer.name.clone().into(),
        event_id.into(),
        event_type.into(),
        payload.into(),
        chrono::Utc::now().into(),
    ];
    app.conn.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.unwrap();
    publish(&producer, &topic, (5, 3, 3), None, None).await;
    assert_eventually("order 5's parked version 2 applies, then 3 follows", WAIT, || async {
        read_model(&app.conn, &consumer.name).await.get(&5) == Some(&expected(5, 3))
    })
    .await;
    assert!(consumer.parked(5).await.is_empty());
    consumer.service.stop().await;
}

/// Anyone who can produce to the topic can claim any version. An unknown-type record claiming
/// version `i64::MAX`, released twice by an operator (the gap before it, then the record itself),
/// leaves the read model at `i64::MAX`; a later record of that order is absorbed as stale instead
/// of overflowing the next-version arithmetic, and the consumer goes on applying other orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_claiming_the_last_possible_version_cannot_overflow_the_read_models_arithmetic() {
    let app = TestOrder::spawn(Backend::Sqlite).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 1).await;
    let producer = producer(&broker);
    publish(&producer, &topic, (9, 1, 3), None, None).await;
    publish(&producer, &topic, (9, i64::MAX, i64::MAX), Some("idempost.v1.OrderShipped"), Some(b"?")).await;
    let consumer = Consumer::start(&app, &broker, &topic).await;
    assert_eventually("the last possible version is parked", WAIT, || async {
        consumer.parked(9).await == vec![(i64::MAX, "idempost.v1.OrderShipped".to_owned())]
    })
    .await;

    let gap = consumer.release(9, "the versions before it never existed").await.unwrap();
    assert_eq!((gap.released_from_version, gap.released_to_version), (2, i64::MAX - 1));
    let head = consumer.release(9, "and it is not ours either").await.unwrap();
    assert_eq!((head.released_from_version, head.released_to_version), (i64::MAX, i64::MAX));
    let nothing = consumer.release(9, "nothing is left to give up").await.unwrap_err();
    assert_eq!(nothing.code(), tonic::Code::FailedPrecondition, "{nothing:?}");

    // Alone, so that it is consumed one record at a time, the path that compares it with the
    // model's next version (a batch's set-based path finds it stale first).
    let late = publish(&producer, &topic, (9, 2, 3), None, None).await;
    let consumed = format!("SELECT COUNT(*) FROM consumed_event WHERE event_id = '{late}'");
    assert_eventually("the late version 2 is consumed", WAIT, || async { count(&app, &consumed).await == 1 })
        .await;
    publish(&producer, &topic, (11, 1, 3), None, None).await;
    assert_eventually("the consumer goes on to the next order", WAIT, || async {
        read_model(&app.conn, &consumer.name).await.contains_key(&11)
    })
    .await;
    assert_eq!(read_model(&app.conn, &consumer.name).await.get(&9).map(|m| m.version), Some(i64::MAX));
    assert!(consumer.parked(9).await.is_empty(), "the late version 2 is absorbed, not parked");
    consumer.service.stop().await;
}
