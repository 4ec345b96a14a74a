//! The README demo's client.
//!
//! `demo secure-setup DIR`: makes what the secure demo needs, on the spot: a CA, a certificate for
//! localhost and 127.0.0.1 with its key, a JWKS with a fresh signing key, a token for tenant 1
//! (`tenant.jwt`) and an operator token (`operator.jwt`).
//! `demo submit GRPC_URL [CA_FILE TOKEN_FILE]`: submits a few orders to a running order service
//! (over TLS, with the token, when given) and prints what the service answered, including a
//! replay, an invalid order, a reused request id, a call without a token and one for another
//! tenant; then amends one order, is refused a stale amendment, and cancels it.
//! `demo show DATABASE_URL BROKERS TOPIC COUNT`: waits until COUNT outbox events are PUBLISHED,
//! then prints every version of every order with its outbox row, and the records on the topic.
#![allow(clippy::expect_used)] // a demo: failing loudly is the point

use std::time::Duration;

use idempost_client::{BearerToken, ClientTls, SafeSubmitter, SubmitPolicy};
use idempost_proto::v1::{self as pb, order_service_client::OrderServiceClient};
// The same certificate and token maker the security tests use.
use idempost_testkit::pki;
use sea_orm::{ConnectionTrait, Statement};
use tonic_types::StatusExt;

fn order(request_id: &str, sku: &str, quantity: u32) -> pb::SubmitOrderRequest {
    pb::SubmitOrderRequest {
        tenant_id: 1,
        request_id: request_id.to_owned(),
        customer_id: "ada@example.com".to_owned(),
        currency: "EUR".to_owned(),
        line_items: vec![
            pb::LineItem { sku: sku.to_owned(), quantity, unit_price_minor: 1_250 },
            pb::LineItem { sku: "SKU-TEA-LOOSE".to_owned(), quantity: 1, unit_price_minor: 799 },
        ],
        event_id: String::new(),
    }
}

fn show(label: &str, answer: Result<tonic::Response<pb::SubmitOrderResponse>, tonic::Status>) {
    match answer {
        Ok(ok) => {
            let ok = ok.into_inner();
            println!(
                "{label:<44} OK {:?} replayed={} order_id={} event_id={} total={}",
                ok.outcome(),
                ok.replayed,
                ok.order_id,
                ok.event_id,
                ok.total_minor
            );
        }
        Err(status) => {
            let reason = status.get_details_error_info().map(|i| i.reason).unwrap_or_default();
            println!("{label:<44} {:?} reason={reason}: {}", status.code(), status.message());
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["secure-setup", dir] => secure_setup(std::path::Path::new(dir)),
        ["submit", address] => submit(address, None).await,
        ["submit", address, ca_file, token_file] => submit(address, Some((ca_file, token_file))).await,
        ["show", database_url, brokers, topic, count] => {
            let count = count.parse().expect("COUNT is a number");
            print_rows(database_url, count).await;
            print_records(brokers, topic, count).await;
            print_jobs(database_url, count).await;
        }
        _ => eprintln!(
            "usage: demo secure-setup DIR | demo submit GRPC_URL [CA_FILE TOKEN_FILE] | demo show DATABASE_URL BROKERS TOPIC COUNT"
        ),
    }
}

fn secure_setup(dir: &std::path::Path) {
    let pki = pki::Pki::make(dir).expect("certificates and keys are made");
    let tenant = pki.token(serde_json::json!({ "sub": "demo-shop", "tenant_id": 1 })).expect("a token");
    let operator =
        pki.token(serde_json::json!({ "sub": "demo-operator", "scope": "idempost:admin" })).expect("a token");
    std::fs::write(dir.join("tenant.jwt"), tenant).expect("the token is written");
    std::fs::write(dir.join("operator.jwt"), operator).expect("the token is written");
    println!("{}\n{}", pki::ISSUER, pki::AUDIENCE);
}

/// `message` with the token, when there is one.
fn authorized<T>(token: &Option<BearerToken>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        token.apply(&mut request);
    }
    request
}

async fn submit(address: &str, secure: Option<(&&str, &&str)>) {
    let address = address.to_owned();
    let tls = ClientTls { ca_file: secure.map(|(ca, _)| (**ca).into()), identity: None };
    let token = secure.map(|(_, token)| {
        let token = std::fs::read_to_string(token).expect("the token file is readable");
        BearerToken::new(&token).expect("a token a header can carry")
    });
    // The service may still be starting: try for a few seconds.
    let mut channel = None;
    for _ in 0..50 {
        match idempost_client::connect_with_token(&address, &tls, token.as_ref()).await {
            Ok(c) => {
                channel = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let mut client = OrderServiceClient::new(channel.expect("the order service answers"));
    match &secure {
        Some((ca, _)) => {
            println!("Submitting to the order service at {address} (TLS, CA {ca}, tenant 1's token)\n")
        }
        None => println!("Submitting to the order service at {address}\n"),
    }

    let run = std::process::id();
    let first = format!("demo-{run}-1");
    show("new order", client.submit_order(authorized(&token, order(&first, "SKU-RED-MUG", 2))).await);
    show(
        "same order again (a client retry)",
        client.submit_order(authorized(&token, order(&first, "SKU-RED-MUG", 2))).await,
    );
    show(
        "same request id, different content",
        client.submit_order(authorized(&token, order(&first, "SKU-RED-MUG", 5))).await,
    );
    let mut invalid = order(&format!("demo-{run}-2"), "SKU-RED-MUG", 0);
    invalid.currency = "euro".to_owned();
    show("invalid order (quantity 0, currency euro)", client.submit_order(authorized(&token, invalid)).await);
    if token.is_some() {
        let second = format!("demo-{run}-4");
        show("no token", client.submit_order(order(&second, "SKU-RED-MUG", 1)).await);
        let mut elsewhere = order(&second, "SKU-RED-MUG", 1);
        elsewhere.tenant_id = 2;
        show("tenant 1's token, tenant_id 2", client.submit_order(authorized(&token, elsewhere)).await);
    }

    match client
        .reconcile(authorized(&token, pb::ReconcileRequest { tenant_id: 1, request_id: first.clone() }))
        .await
    {
        Ok(found) => {
            let found = found.into_inner();
            println!(
                "{:<44} OK order_id={} event_id={} status={:?}",
                "reconcile the first request",
                found.order_id,
                found.event_id,
                found.status()
            );
        }
        Err(status) => {
            println!("{:<44} {:?}: {}", "reconcile the first request", status.code(), status.message())
        }
    }

    let mut submitter = SafeSubmitter::connect(&address, &tls, token.clone(), SubmitPolicy::default())
        .await
        .expect("the order service answers");
    let confirmed = submitter.submit(order(&format!("demo-{run}-3"), "SKU-BLUE-MUG", 1)).await;
    show_confirmed("safe submitter (submit/reconcile protocol)", &confirmed);
    let Ok(accepted) = confirmed else { return };
    change_order(&mut submitter, run, accepted.order_id).await;
}

/// The order's life after acceptance: amended to version 2, a stale amendment refused, cancelled
/// at version 3, each with the safe caller protocol.
async fn change_order(submitter: &mut SafeSubmitter, run: u32, order_id: i64) {
    let amend = pb::AmendOrderRequest {
        tenant_id: 1,
        request_id: format!("demo-{run}-amend"),
        order_id,
        expected_version: 1,
        line_items: vec![pb::LineItem {
            sku: "SKU-BLUE-MUG".to_owned(),
            quantity: 3,
            unit_price_minor: 1_250,
        }],
        customer_id: String::new(),
        event_id: String::new(),
    };
    show_confirmed("amend it at version 1 (3 blue mugs)", &submitter.amend(amend.clone()).await);
    let stale = pb::AmendOrderRequest { request_id: format!("demo-{run}-stale"), ..amend };
    show_confirmed("amend it again, still expecting version 1", &submitter.amend(stale).await);
    let cancel = pb::CancelOrderRequest {
        tenant_id: 1,
        request_id: format!("demo-{run}-cancel"),
        order_id,
        expected_version: 2,
        reason: pb::CancelReason::CustomerRequest.into(),
        note: "changed their mind".to_owned(),
        event_id: String::new(),
    };
    show_confirmed("cancel it at version 2", &submitter.cancel(cancel).await);
}

fn show_confirmed(
    label: &str,
    answer: &Result<idempost_client::ConfirmedOrder, idempost_client::SafeSubmitError>,
) {
    match answer {
        Ok(confirmed) => println!(
            "{label:<44} {:?} after {} call(s): order_id={} version={} event_id={}",
            confirmed.confirmation,
            confirmed.calls,
            confirmed.order_id,
            confirmed.version,
            confirmed.event_id
        ),
        Err(idempost_client::SafeSubmitError::Rejected(status)) => {
            let info = status.get_details_error_info();
            let reason = info.as_ref().map(|i| i.reason.clone()).unwrap_or_default();
            let current = info.and_then(|i| i.metadata.get("current_version").cloned()).unwrap_or_default();
            println!("{label:<44} {:?} reason={reason} current_version={current}", status.code());
        }
        Err(e) => println!("{label:<44} {e}"),
    }
}

async fn print_rows(database_url: &str, count: i64) {
    let db = idempost::db::connect(database_url, 1).await.expect("the database opens");
    let backend = db.get_database_backend();
    for _ in 0..300 {
        let published = db
            .query_one_raw(Statement::from_string(
                backend,
                "SELECT COUNT(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            ))
            .await
            .expect("the outbox reads")
            .and_then(|row| row.try_get_by_index::<i64>(0).ok())
            .unwrap_or(0);
        if published >= count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sql = "SELECT v.order_id, v.request_id, v.version, e.event_id, e.status, e.published_partition, \
               e.published_offset FROM order_version v JOIN outbox_event e ON e.event_id = v.event_id \
               ORDER BY v.order_id, v.version";
    let rows = db.query_all_raw(Statement::from_string(backend, sql)).await.expect("the rows read");
    println!(
        "\nevery version of every order joined to its outbox event (one transaction wrote each pair; the relay marked them):"
    );
    println!(
        "{:<9}{:<20}{:<9}{:<38}{:<12}partition/offset",
        "order_id", "request_id", "version", "event_id", "status"
    );
    for row in rows {
        let get = |i: usize| -> String {
            row.try_get_by_index::<i64>(i)
                .map(|v| v.to_string())
                .or_else(|_| row.try_get_by_index::<String>(i))
                .unwrap_or_default()
        };
        let place = |i: usize| row.try_get_by_index::<Option<i32>>(i).ok().flatten().map(i64::from);
        let offset = row.try_get_by_index::<Option<i64>>(6).ok().flatten();
        let at = match (place(5), offset) {
            (Some(p), Some(o)) => format!("{p}/{o}"),
            _ => "-".to_owned(),
        };
        println!("{:<9}{:<20}{:<9}{:<38}{:<12}{at}", get(0), get(1), get(2), get(3), get(4));
    }
}

/// Waits for the consumer's notification jobs and prints them with their dedup rows.
async fn print_jobs(database_url: &str, count: i64) {
    let db = idempost::db::connect(database_url, 1).await.expect("the database opens");
    let backend = db.get_database_backend();
    // An event the consumer cannot apply is set aside as a dead letter: either way it is done.
    let count_sql = "SELECT (SELECT COUNT(*) FROM notification_job) + (SELECT COUNT(*) FROM dead_letter)";
    for _ in 0..300 {
        let jobs = db
            .query_one_raw(Statement::from_string(backend, count_sql))
            .await
            .expect("the jobs read")
            .and_then(|row| row.try_get_by_index::<i64>(0).ok())
            .unwrap_or(0);
        if jobs >= count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sql = "SELECT j.event_id, j.order_id, j.status, c.consumer_name FROM notification_job j \
               JOIN consumed_event c ON c.consumer_name = j.consumer_name AND c.event_id = j.event_id ORDER BY j.order_id";
    let rows = db.query_all_raw(Statement::from_string(backend, sql)).await.expect("the jobs read");
    println!("\nnotification jobs (one per event, committed with its consumed_event row):");
    for row in rows {
        let text = |i: usize| row.try_get_by_index::<String>(i).unwrap_or_default();
        let order_id = row.try_get_by_index::<i64>(1).unwrap_or_default();
        println!("event {} order {order_id} {} (consumer {})", text(0), text(2), text(3));
    }
}

/// Reads the topic from the start, as any Kafka consumer would, and decodes each OrderAccepted.
async fn print_records(brokers: &str, topic: &str, count: i64) {
    use prost::Message as _;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Headers, Message};

    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("idempost-demo-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("a consumer");
    consumer.subscribe(&[topic]).expect("subscribed");
    println!("\nrecords on Kafka topic {topic}:");
    for _ in 0..count {
        let Ok(Ok(message)) = tokio::time::timeout(Duration::from_secs(10), consumer.recv()).await else {
            println!("(no more records within 10 s)");
            break;
        };
        let header = |name: &str| {
            message
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        let payload = message.payload().unwrap_or_default();
        let (event_id, fact) = match header("event_type").as_str() {
            "idempost.v1.OrderAmended" => {
                let e = pb::OrderAmended::decode(payload).expect("an OrderAmended");
                let fact = format!(
                    "order {} v{} amended: {} {} in {} line(s)",
                    e.order_id,
                    e.event_version,
                    e.total_minor,
                    e.currency,
                    e.line_items.len()
                );
                (e.event_id, fact)
            }
            "idempost.v1.OrderCancelled" => {
                let e = pb::OrderCancelled::decode(payload).expect("an OrderCancelled");
                let fact = format!(
                    "order {} v{} cancelled: {:?} ({})",
                    e.order_id,
                    e.event_version,
                    e.reason(),
                    e.note
                );
                (e.event_id, fact)
            }
            _ => {
                let e = pb::OrderAccepted::decode(payload).expect("an OrderAccepted");
                let fact = format!(
                    "order {} v{} of tenant {} accepted: {} {} in {} line(s)",
                    e.order_id,
                    e.event_version,
                    e.tenant_id,
                    e.total_minor,
                    e.currency,
                    e.line_items.len()
                );
                (e.event_id, fact)
            }
        };
        println!(
            "partition {} offset {}: key={} event_id={} (header {}) {fact}",
            message.partition(),
            message.offset(),
            String::from_utf8_lossy(message.key().unwrap_or_default()),
            event_id,
            if header("event_id") == event_id { "matches" } else { "differs" },
        );
    }
}
