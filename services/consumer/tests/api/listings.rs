//! The bound of the consumer's dead-letter listing: an answer stops at its byte budget with a
//! token that reaches every record, and payloads come only when asked for.

use idempost_proto::v1::{self as pb, consumer_admin_service_client::ConsumerAdminServiceClient};
use prost::Message as _;
use sea_orm::ConnectionTrait as _;
use tonic::Code;

use crate::broker::TestBroker;
use crate::helpers::{Backend, TestOrder, on_every_backend};
use idempost_testkit::consumer::{TestConsumer, consumer_settings};

on_every_backend!(
    dead_letters_answer_within_their_byte_budget_with_a_token_that_reaches_every_record,
    parked_events_answer_within_their_byte_budget_with_a_token_that_reaches_every_event,
);

async fn list(
    admin: &ConsumerAdminServiceClient<tonic::transport::Channel>,
    request: pb::ListDeadLettersRequest,
) -> Result<pb::ListDeadLettersResponse, tonic::Status> {
    admin.clone().list_dead_letters(request).await.map(tonic::Response::into_inner)
}

async fn dead_letters_answer_within_their_byte_budget_with_a_token_that_reaches_every_record(
    backend: Backend,
) {
    // The order service's harness makes the migrated database the consumer shares.
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-dead-letters");
    broker.create_topic(&topic, 1).await;
    let group = format!("listings-{}", uuid::Uuid::new_v4().simple());
    let consumer =
        TestConsumer::spawn(consumer_settings(&app.db.url, &broker.address(), &topic, &group)).await;
    let admin =
        ConsumerAdminServiceClient::connect(format!("http://127.0.0.1:{}", consumer.port)).await.unwrap();

    // 2.4 MB of records, as a consumer sets aside what it cannot read: twelve of 200 KiB (forty of
    // 60 KiB on MariaDB, whose BLOB column holds 64 KiB).
    let bytes = if backend == Backend::MariaDb { 60 * 1024 } else { 200 * 1024 };
    let count = u8::try_from(12 * 200 * 1024 / bytes).unwrap();
    let backend = app.conn.get_database_backend();
    let mut events = Vec::new();
    for i in 0..count {
        let event_id = uuid::Uuid::now_v7().to_string();
        let sql = "INSERT INTO dead_letter (consumer_name, topic, partition_id, offset_id, payload, event_id, error, \
                   created_at) VALUES ('notify', ?, 0, ?, ?, ?, 'cannot decode', ?)";
        let values = vec![
            topic.clone().into(),
            i64::from(i).into(),
            vec![i; bytes].into(),
            event_id.clone().into(),
            chrono::Utc::now().into(),
        ];
        app.conn.execute_raw(idempost_testkit::sql::statement(backend, sql, values)).await.unwrap();
        events.push(event_id);
    }
    let ask = |page_token: String, include_payloads| pb::ListDeadLettersRequest {
        limit: 1000,
        include_payloads,
        page_token,
        ..Default::default()
    };

    // Without asking (as every client older than the flag), no payloads: all in one answer.
    let all = list(&admin, ask(String::new(), false)).await.unwrap();
    assert_eq!(all.dead_letters.iter().map(|d| d.event_id.clone()).collect::<Vec<_>>(), events);
    assert!(all.dead_letters.iter().all(|d| d.payload.is_empty()));
    assert!(all.next_page_token.is_empty() && all.encoded_len() < 64 * 1024);

    // With payloads, every answer within 1 MiB, and the tokens reach every record once, whole.
    let (mut seen, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = list(&admin, ask(token, true)).await.unwrap();
        pages += 1;
        assert!(page.encoded_len() <= 1024 * 1024, "page {pages}: {} bytes", page.encoded_len());
        for d in &page.dead_letters {
            let i = u8::try_from(seen.len()).unwrap();
            assert_eq!(d.payload, vec![i; bytes], "record {i}'s payload is whole");
            seen.push(d.event_id.clone());
        }
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, events);
    assert!(pages >= 3, "2.4 MB take at least three pages of 1 MiB: {pages}");

    // The limit ends a page too; a token that is not one is refused.
    let first =
        list(&admin, pb::ListDeadLettersRequest { limit: 5, ..ask(String::new(), false) }).await.unwrap();
    let rest = list(&admin, ask(first.next_page_token.clone(), false)).await.unwrap();
    assert_eq!((first.dead_letters.len(), rest.dead_letters.len()), (5, events.len() - 5));
    let bad = list(&admin, ask("x".into(), false)).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    consumer.stop().await;
    app.stop().await;
}

/// A consumer (of a fresh topic) over the database of a fresh order service, and a client of its
/// ConsumerAdminService.
async fn consumer_of(
    app: &TestOrder,
    broker: &TestBroker,
) -> (TestConsumer, ConsumerAdminServiceClient<tonic::transport::Channel>, String) {
    let topic = idempost_testkit::topic::unique("idempost-parked");
    broker.create_topic(&topic, 1).await;
    let group = format!("listings-{}", uuid::Uuid::new_v4().simple());
    let settings = consumer_settings(&app.db.url, &broker.address(), &topic, &group);
    let name = settings.consumer_name.clone();
    let consumer = TestConsumer::spawn(settings).await;
    let admin =
        ConsumerAdminServiceClient::connect(format!("http://127.0.0.1:{}", consumer.port)).await.unwrap();
    (consumer, admin, name)
}

async fn parked_events_answer_within_their_byte_budget_with_a_token_that_reaches_every_event(
    backend: Backend,
) {
    let app = TestOrder::spawn(backend).await;
    let broker = TestBroker::start().await;
    let (consumer, admin, name) = consumer_of(&app, &broker).await;

    // 1,000 parked events with the longest reason kept (1,000 characters of four bytes each):
    // about 4 MB of answer, written as the consumer parks them (two versions of 500 orders).
    let reason = "\u{1d11e}".repeat(1000);
    let backend = app.conn.get_database_backend();
    let mut expected = Vec::new();
    for orders in (1..=500i64).collect::<Vec<_>>().chunks(50) {
        let mut values = Vec::<sea_orm::Value>::new();
        for &order_id in orders {
            for version in [3i64, 4] {
                let event_id = uuid::Uuid::now_v7().to_string();
                values.extend([
                    name.clone().into(),
                    event_id.clone().into(),
                    order_id.into(),
                    version.into(),
                    b"value".to_vec().into(),
                    reason.clone().into(),
                    chrono::Utc::now().into(),
                ]);
                expected.push((order_id, version, event_id));
            }
        }
        let rows = vec!["(?, ?, ?, ?, 'idempost.v1.OrderAmended', ?, ?, ?)"; orders.len() * 2].join(", ");
        let sql = format!(
            "INSERT INTO parked_event (consumer_name, event_id, order_id, version, event_type, payload, reason, \
             parked_at) VALUES {rows}"
        );
        app.conn.execute_raw(idempost_testkit::sql::statement(backend, &sql, values)).await.unwrap();
    }

    let (mut seen, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let request = pb::ListParkedEventsRequest { limit: 1000, page_token: token, ..Default::default() };
        let page = admin.clone().list_parked_events(request).await.unwrap().into_inner();
        pages += 1;
        assert!(page.encoded_len() <= 1024 * 1024, "page {pages}: {} bytes", page.encoded_len());
        assert!(page.parked_events.iter().all(|p| p.reason == reason));
        seen.extend(page.parked_events.into_iter().map(|p| (p.order_id, p.event_version, p.event_id)));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, expected);
    assert!(pages >= 4, "about 4 MB take at least four pages of 1 MiB: {pages}");
    consumer.stop().await;
    app.stop().await;
}
