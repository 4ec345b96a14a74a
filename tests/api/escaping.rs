//! Text from callers and from the topic never reaches a log line, a span or an operator's
//! terminal as it came: an event id that does not parse is recorded as its length, free text is
//! escaped and bounded (`idempost::telemetry::logged`), and `idempostctl` prints what the servers
//! send (a dead letter's error) with its control characters escaped.

use std::time::Duration;

use idempost_proto::v1::{self as pb, admin_service_client::AdminServiceClient};
use sea_orm::{ConnectionTrait as _, Value};
use tonic::Code;

use crate::broker::TestBroker;
use crate::helpers::{
    Backend, InProcess, TestDb, TestService, assert_eventually, connect_order_service, order, service_binary,
    violated_fields,
};
use crate::otlp::start_receiver;
use idempost_testkit::wait::WAIT;

/// What a forged log line and a terminal escape look like inside caller text.
const FORGED: &str = "\n2026-12-06T00:00:00.000000Z  INFO forged: all is well\u{1b}[2J\u{1b}[31m";
/// The bound of one text field in a log line or a span attribute (`TEXT_BOUND`).
const BOUND: usize = 512;

/// `bytes` of caller text: the forgery, repeated. 48 KiB: as much as the admin listener decodes
/// (64 KiB a request) leaves room for, so that the handler, not the decode limit, answers.
fn hostile(bytes: usize) -> String {
    FORGED.repeat(bytes / FORGED.len() + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_id_and_a_reason_of_48_kib_with_newlines_and_escapes_reach_no_log_line_or_span_as_they_came()
{
    let (endpoint, received, _receiver) = start_receiver().await;
    let db = TestDb::migrated(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ("RUST_LOG", "info,idempost=debug,idempost_order=debug".to_owned()),
        // The log's own colours would be terminal escapes too: without them, any escape in the
        // log came from the caller.
        ("NO_COLOR", "1".to_owned()),
    ];
    let args = [
        format!("--database-url={}", db.url),
        "--listen=127.0.0.1:0".into(),
        "--admin-listen=127.0.0.1:0".into(),
    ];
    let (service, bound) =
        TestService::spawn_listening_logged("idempost-order", &args, &env, dir.path().join("order.log"))
            .await;
    let mut admin = AdminServiceClient::connect(format!("http://127.0.0.1:{}", bound.port("admin-listen")))
        .await
        .unwrap();
    let url = format!("http://127.0.0.1:{}", bound.port("listen"));
    let submitted = connect_order_service(&url).await.submit_order(order(3, "escaping-1")).await.unwrap();
    let event_id = submitted.into_inner().event_id;

    // An event id of 48 KiB: refused as invalid by the handler (so its span was made and
    // recorded), and recorded on the span as its length only.
    let id = hostile(48 * 1024);
    let refused =
        admin.get_event_timeline(pb::GetEventTimelineRequest { event_id: id.clone() }).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "the handler must answer, not a decode limit");
    assert_eq!(violated_fields(&refused), ["event_id"]);
    // A redrive whose reason is the same 48 KiB: accepted, and logged escaped and bounded.
    let conn = db.connect().await;
    let failed = "UPDATE outbox_event SET status = 'FAILED' WHERE event_id = ?";
    conn.execute_raw(idempost_testkit::sql::statement(
        conn.get_database_backend(),
        failed,
        vec![Value::from(event_id.clone())],
    ))
    .await
    .unwrap();
    let redrive = pb::RedriveRequest {
        event_id: event_id.clone(),
        requested_by: "ops".into(),
        reason: hostile(48 * 1024),
    };
    admin.redrive(redrive).await.unwrap();

    assert_eventually("both calls' spans are exported", WAIT, || async {
        let methods: Vec<String> =
            received.spans().iter().filter_map(|s| s.attribute("rpc.method").map(str::to_owned)).collect();
        methods.iter().any(|m| m == "GetEventTimeline") && methods.iter().any(|m| m == "Redrive")
    })
    .await;
    let spans = received.spans();
    let timeline = spans.iter().find(|s| s.attribute("rpc.method") == Some("GetEventTimeline")).unwrap();
    assert_eq!(
        timeline.attribute("idempost.event_id"),
        Some(format!("invalid ({} bytes)", id.len()).as_str())
    );
    for span in &spans {
        for (key, value) in &span.attributes {
            assert!(value.len() <= BOUND, "span {} attribute {key} holds {} bytes", span.name, value.len());
            assert!(
                !value.contains('\n') && !value.contains('\u{1b}'),
                "span {} attribute {key}: {value}",
                span.name
            );
        }
    }

    let log = service.log();
    assert!(log.contains("redriven: FAILED -> PENDING"), "the redrive was logged:\n{log}");
    let escapes: Vec<&str> = log.lines().filter(|line| line.contains('\u{1b}')).collect();
    assert!(escapes.is_empty(), "no terminal escape reaches the log: {escapes:?}");
    assert!(
        !log.lines().any(|line| line.contains("forged: all is well") && !line.contains("redriven")),
        "no forged line"
    );
    let redriven = log.lines().find(|line| line.contains("redriven: FAILED -> PENDING")).unwrap();
    assert!(redriven.len() < 4 * BOUND, "the reason is bounded in the log line ({} bytes)", redriven.len());
    assert!(redriven.contains("\\u{1b}[2J") && redriven.contains("\\n"), "and escaped: {redriven}");
    drop(service);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempostctl_prints_a_dead_letters_ansi_escapes_escaped() {
    let db = TestDb::migrated(Backend::Sqlite).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-escaping");
    broker.create_topic(&topic, 1).await;
    let mut settings = idempost_consumer::Settings::new(&db.url, broker.address());
    settings.kafka.topic = topic;
    settings.shutdown_grace = Duration::from_secs(5);
    let consumer = idempost_consumer::Application::build(settings).await.unwrap();
    let port = consumer.port();
    let service = InProcess::spawn(|shutdown| consumer.run_until_stopped(shutdown));
    let conn = db.connect().await;
    let insert = "INSERT INTO dead_letter (consumer_name, topic, partition_id, offset_id, payload, error, created_at) \
                  VALUES ('notify', 't', 0, 7, ?, ?, ?)";
    let error = "bad record\u{1b}]0;owned\u{7}\u{1b}[2J\rfake prompt$ ";
    let values = vec![Value::from(b"x".to_vec()), Value::from(error), Value::from(chrono::Utc::now())];
    conn.execute_raw(idempost_testkit::sql::statement(conn.get_database_backend(), insert, values))
        .await
        .unwrap();

    let output = tokio::process::Command::new(service_binary("idempostctl"))
        .args([format!("--consumer-admin-url=http://127.0.0.1:{port}"), "dead-letters".to_owned()])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("bad record\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\rfake prompt$"), "{stdout}");
    assert!(
        !stdout.chars().any(|c| c.is_control() && c != '\n'),
        "no control character but newlines: {stdout:?}"
    );
    service.stop().await;
}
