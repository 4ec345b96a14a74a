//! The operators' console (`idempostctl console`) in a real browser: Debian's Chromium driven by
//! playwright-core (tools/idempostctl/console/test/browser.mjs, run by node) against a real order
//! service (TLS, JWT, traced), relay and consumer on MariaDB with a broker. The operator finds an
//! event's timeline, sees a FAILED event, redrives it with a reason and sees it PUBLISHED; a
//! console whose token the services refuse says so. Screenshots of every page land in
//! `<target>/debug/test-output/console/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use idempost::security::AuthSettings;
use idempost_client::{BearerToken, ClientTls};
use idempost_proto::v1::{self as pb, order_service_client::OrderServiceClient};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sea_orm::{ConnectionTrait as _, Statement};
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::broker::TestBroker;
use crate::helpers::{
    Backend, InProcess, OutboxProbe, TestDb, TestService, assert_eventually, order, service_binary,
};
use crate::otlp::start_receiver;
use crate::pki::{AUDIENCE, ISSUER, Pki, token_from_unknown_key};

use idempost_testkit::wait::WAIT;
const OPERATOR: &str = "alice@ops";
const REASON: &str = "producer limit raised to 1 MB";
const REPLAY_REASON: &str = "the billing service needs this order again";

/// The console's package: its node_modules (scripts/common.sh, ensure_console) and browser script.
fn console_package() -> PathBuf {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/idempostctl/console");
    assert!(
        package.join("node_modules/playwright-core").exists(),
        "{} has no node_modules: scripts/test installs them (ensure_console in scripts/common.sh: npm ci there, \
         and Debian's chromium with apt-get)",
        package.display()
    );
    package
}

/// Where the screenshots go: beside the test binaries, so every run leaves the latest.
fn output_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let dir = profile.join("test-output/console");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A channel to `url`, once the service listening there answers the TLS handshake.
async fn connected(url: &str, tls: &ClientTls) -> Channel {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match idempost_client::connect(url, tls).await {
            Ok(channel) => return channel,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("{url} never answered: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `idempostctl console` with `args` after the global flags, and the URL it printed.
async fn console(global: &[String], token_file: &Path, log: PathBuf) -> (TestService, String) {
    let mut args = global.to_vec();
    args.extend([
        format!("--token-file={}", token_file.display()),
        "console".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
        "--jaeger-url=http://localhost:16686/".to_owned(),
    ]);
    started_console(&args, log).await
}

/// `idempostctl` started with `args`, and the URL the console printed.
async fn started_console(args: &[String], log: PathBuf) -> (TestService, String) {
    let process = TestService::spawn_logged("idempostctl", args, &[], log);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(line) = process.log().lines().find(|l| l.contains("open http://")) {
            let url = line.split_once("open ").unwrap().1.trim().to_owned();
            return (process, url);
        }
        assert!(tokio::time::Instant::now() < deadline, "the console printed no URL: {}", process.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the browser script with `settings`, calls `after_backlog` once it reported the backlog
/// (then lets it go on), and returns its steps by name.
async fn browse(settings: &Value, after_backlog: impl AsyncFnOnce()) -> serde_json::Map<String, Value> {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
    let script = console_package().join("test/browser.mjs");
    let mut child = tokio::process::Command::new("node")
        .arg(&script)
        .arg(settings.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut after_backlog = Some(after_backlog);
    let mut steps = serde_json::Map::new();
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let step: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            let name = step["step"].as_str().unwrap().to_owned();
            if name == "backlog" {
                if let Some(after) = after_backlog.take() {
                    after().await;
                }
                input.write_all(b"go\n").await.unwrap();
            }
            steps.insert(name, step);
        }
    };
    tokio::time::timeout(WAIT * 3, read).await.expect("the browser script finished in time");
    let status = child.wait().await.unwrap();
    let mut errors = String::new();
    stderr.read_to_string(&mut errors).await.unwrap();
    assert!(status.success(), "the browser script failed: {steps:#?}\n{errors}");
    steps
}

fn texts(value: &Value) -> String {
    value.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect::<Vec<_>>().join("\n")
}

/// An order whose event is larger than the first relay's producer accepts (message.max.bytes
/// 1000): the event, not the broker, is to blame, so it ends FAILED.
fn large_order(request_id: &str) -> pb::SubmitOrderRequest {
    let line =
        |i: usize| pb::LineItem { sku: format!("SKU-BULK-{i:04}"), quantity: 1, unit_price_minor: 100 };
    pb::SubmitOrderRequest { line_items: (0..60).map(line).collect(), ..order(7, request_id) }
}

fn relay_settings(db: &TestDb, broker: &TestBroker, topic: &str) -> idempost_relay::Settings {
    let mut settings = idempost_relay::Settings::new(&db.url, broker.address());
    settings.kafka.topic = topic.to_owned();
    settings.max_idle_poll = Duration::from_millis(100);
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_finds_a_timeline_and_redrives_a_failed_event_in_the_console_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let (endpoint, _received, _receiver) = start_receiver().await;
    let db = TestDb::migrated(Backend::MariaDb).await;
    let conn = db.connect().await;
    let probe = OutboxProbe { conn: &conn };
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-console");
    broker.create_topic(&topic, 1).await;

    // The order service as an operator runs it: TLS, JWT, traces exported.
    let path = |p: &Path| p.display().to_string();
    let (_order_service, bound) = TestService::spawn_listening(
        "idempost-order",
        &[
            format!("--database-url={}", db.url),
            "--listen=127.0.0.1:0".to_owned(),
            "--admin-listen=127.0.0.1:0".to_owned(),
            format!("--tls-cert={}", path(&pki.cert)),
            format!("--tls-key={}", path(&pki.key)),
            format!("--auth-jwks={}", path(&pki.jwks)),
            format!("--auth-issuer={ISSUER}"),
            format!("--auth-audience={AUDIENCE}"),
        ],
        &[
            ("IDEMPOST_AUTH", "jwt".to_owned()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ],
    )
    .await;
    let (port, admin_port) = (bound.port("listen"), bound.port("admin-listen"));
    let tls = ClientTls { ca_file: Some(pki.ca.clone()), identity: None };
    let mut orders = OrderServiceClient::new(connected(&format!("https://localhost:{port}"), &tls).await);
    let shop = BearerToken::new(&pki.token(json!({ "sub": "shop-7", "tenant_id": 7 })).unwrap()).unwrap();
    let mut changes = orders.clone();
    let mut submit = async |request: pb::SubmitOrderRequest| {
        let mut request = tonic::Request::new(request);
        shop.apply(&mut request);
        orders.submit_order(request).await.unwrap().into_inner()
    };
    let mut accepted = Vec::new();
    for i in 0..3 {
        accepted.push(submit(order(7, &format!("console-{i}"))).await);
    }
    let large = submit(large_order("console-large")).await;
    // The first order is amended and cancelled: its timeline shows three versions.
    let amend = idempost_testkit::order::amend("console-0-amend", accepted[0].order_id, 1, 3);
    let mut amend = tonic::Request::new(amend);
    shop.apply(&mut amend);
    let amended = changes.amend_order(amend).await.unwrap().into_inner();
    let mut cancel =
        tonic::Request::new(idempost_testkit::order::cancel("console-0-cancel", accepted[0].order_id, 2));
    shop.apply(&mut cancel);
    let cancelled = changes.cancel_order(cancel).await.unwrap().into_inner();

    // The consumer, on TLS with JWT too; a first relay whose producer refuses the large event.
    let mut consumer = idempost_consumer::Settings::new(&db.url, broker.address());
    consumer.kafka.topic = topic.clone();
    consumer.group_id = Some(format!("console-{topic}"));
    consumer.security.tls_cert = Some(pki.cert.clone());
    consumer.security.tls_key = Some(pki.key.clone());
    consumer.auth = AuthSettings::jwt(&pki.jwks, ISSUER, AUDIENCE);
    let consumer = idempost_consumer::Application::build(consumer).await.unwrap();
    let consumer_port = consumer.port();
    let consumer = InProcess::spawn(|shutdown| consumer.run_until_stopped(shutdown));
    let mut refusing = relay_settings(&db, &broker, &topic);
    refusing.kafka.options = vec![("message.max.bytes".into(), "1000".into())];
    refusing.max_attempts = 2;
    let relay = idempost_relay::Application::build(refusing).await.unwrap();
    let relay = InProcess::spawn(|shutdown| relay.run_until_stopped(shutdown));
    assert_eventually("the large event is FAILED and the others PUBLISHED", WAIT, || async {
        probe.state(&large.event_id).await.status == "FAILED"
            && probe.count_with_status("PUBLISHED").await == 5
    })
    .await;
    assert_eventually("the consumer made the five effects", WAIT, || async {
        let sql = "SELECT COUNT(*) FROM notification_job";
        let row = conn.query_one_raw(Statement::from_string(conn.get_database_backend(), sql)).await;
        row.unwrap().unwrap().try_get_by_index::<i64>(0).unwrap() == 5
    })
    .await;
    // A record the consumer cannot decode: it sets it aside as a dead letter.
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", broker.address()).create().unwrap();
    let junk = FutureRecord::to(&topic).key("junk").payload("not an event");
    producer.send(junk, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
    assert_eventually("the consumer dead-lettered the junk", WAIT, || async {
        let sql = "SELECT COUNT(*) FROM dead_letter";
        let row = conn.query_one_raw(Statement::from_string(conn.get_database_backend(), sql)).await;
        row.unwrap().unwrap().try_get_by_index::<i64>(0).unwrap() == 1
    })
    .await;
    relay.stop().await;
    // Orders keep coming while no relay runs: a backlog for the console to show.
    for i in 0..5 {
        submit(order(7, &format!("console-waiting-{i}"))).await;
    }

    // Two consoles: the operator's, and one with a token from a key the services do not trust.
    let operator = pki.token(json!({ "sub": OPERATOR, "scope": "openid idempost:admin" })).unwrap();
    let stranger =
        token_from_unknown_key("stranger", json!({ "sub": OPERATOR, "scope": "idempost:admin" })).unwrap();
    let (operator_file, stranger_file) = (dir.path().join("operator.jwt"), dir.path().join("stranger.jwt"));
    std::fs::write(&operator_file, &operator).unwrap();
    std::fs::write(&stranger_file, &stranger).unwrap();
    let global = [
        format!("--admin-url=https://localhost:{admin_port}"),
        format!("--consumer-admin-url=https://localhost:{consumer_port}"),
        format!("--ca-file={}", path(&pki.ca)),
    ];
    let (console_process, url) = console(&global, &operator_file, dir.path().join("console.log")).await;
    let (refused_process, refused_url) =
        console(&global, &stranger_file, dir.path().join("refused.log")).await;

    let out = output_dir();
    let published = &accepted[0];
    let mut relay = None;
    // Once the operator saw the backlog, the producer limit is raised: a relay that publishes the
    // waiting events, and the FAILED one once it is redriven.
    let start_relay = async || {
        let settings = relay_settings(&db, &broker, &topic);
        let started = idempost_relay::Application::build(settings).await.unwrap();
        relay = Some(InProcess::spawn(|shutdown| started.run_until_stopped(shutdown)));
    };
    let steps = browse(
        &json!({
        "url": url,
        "refusedUrl": refused_url,
        "outDir": out,
        "published": { "eventId": published.event_id, "tenantId": 7, "requestId": "console-0" },
        "failed": large.event_id,
        "reason": REASON,
        "waiting": 5,
        "replay": { "orderId": published.order_id, "reason": REPLAY_REASON },
        }),
        start_relay,
    )
    .await;

    let backlog = &steps["backlog"];
    let csp = backlog["csp"].as_str().unwrap();
    assert!(csp.contains("default-src 'self'") && csp.contains("script-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert!(
        !backlog["address"].as_str().unwrap().contains("key="),
        "the key left the address bar: {backlog}"
    );
    assert_eq!((&backlog["pending"], &backlog["failed"]), (&json!("5"), &json!("1")), "{backlog}");

    let timeline = &steps["timeline"];
    assert_eq!(timeline["status"], "PUBLISHED", "{timeline}");
    let rows = texts(&timeline["rows"]);
    for what in ["order", "outbox", "consumed", "effect"] {
        assert!(rows.contains(what), "the timeline has no {what} row:\n{rows}");
    }
    let stored = "SELECT traceparent FROM outbox_event WHERE event_id = ?";
    let stored = conn
        .query_one_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            stored,
            [published.event_id.clone().into()],
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<Option<String>>(0)
        .unwrap()
        .expect("the traced SubmitOrder stored its trace context");
    let trace_id = stored.split('-').nth(1).unwrap();
    assert_eq!(timeline["traceId"], trace_id, "{timeline}");
    assert_eq!(timeline["traceHref"], format!("http://localhost:16686/trace/{trace_id}"));
    assert_eq!(steps["find"]["eventId"], published.event_id.as_str(), "found by tenant and request id");
    // Every version of the order, by event id and by key, each with its event's state on both sides.
    let applied = format!("applied by {}", idempost_consumer::DEFAULT_CONSUMER_NAME);
    let expected: Vec<Value> = [
        ("v1", "SUBMIT", &published.event_id),
        ("v2", "AMEND", &amended.event_id),
        ("v3", "CANCEL", &cancelled.event_id),
    ]
    .iter()
    .map(|(version, operation, event_id)| json!([version, operation, event_id, "PUBLISHED", applied]))
    .collect();
    for step in ["timeline", "find"] {
        assert_eq!(steps[step]["versions"], json!(expected), "{step}: {}", steps[step]);
    }

    let failed = &steps["failed"];
    assert_eq!(failed["failedRows"], 1, "{failed}");
    let letters = texts(&failed["deadLetters"]);
    assert!(
        letters.contains(idempost_consumer::DEFAULT_CONSUMER_NAME)
            && letters.contains(&format!("{topic}/0/")),
        "{letters}"
    );
    assert!(failed["letterPayload"].as_str().unwrap().contains("not a valid"), "{failed}");
    let payload = failed["payload"].as_str().unwrap();
    assert!(
        payload.contains("\"requestId\": \"console-large\"") && payload.contains("SKU-BULK-0059"),
        "{payload}"
    );

    let redriven = &steps["redriven"];
    assert!(redriven["refusedEmpty"].as_str().unwrap().contains("reason is required"), "{redriven}");
    let logged = texts(&redriven["logged"]);
    assert!(logged.contains(OPERATOR) && logged.contains(REASON), "who redrove what: {logged}");
    let republished = &steps["republished"];
    assert_eq!(republished["status"], "PUBLISHED", "{republished}");
    assert!(texts(&republished["rows"]).contains(&format!("#1 by {OPERATOR}: {REASON}")), "{republished}");
    let state = probe.state(&large.event_id).await;
    assert!(state.published && state.status == "PUBLISHED", "{state:?}");
    let audit = "SELECT last_redriven_by, last_redrive_reason FROM outbox_event WHERE event_id = ?";
    let audit = conn
        .query_one_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            audit,
            [large.event_id.clone().into()],
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(audit.try_get_by_index::<String>(0).unwrap(), OPERATOR, "the token's subject, not the page");
    assert_eq!(audit.try_get_by_index::<String>(1).unwrap(), REASON);

    let purge = &steps["purge"];
    assert_eq!((&purge["purgeDisabledFirst"], &purge["purgeEnabledAfter"]), (&json!(true), &json!(true)));
    let purge_rows = texts(&purge["rows"]);
    assert!(purge_rows.contains("outbox_event") && purge_rows.contains("consumed_event"), "{purge_rows}");
    let rows = "SELECT COUNT(*) FROM outbox_event";
    let rows = conn.query_one_raw(Statement::from_string(conn.get_database_backend(), rows)).await;
    assert_eq!(rows.unwrap().unwrap().try_get_by_index::<i64>(0).unwrap(), 11, "a dry run deleted nothing");

    let replay = &steps["replay"];
    assert_eq!((&replay["replayDisabledFirst"], &replay["replayEnabledAfter"]), (&json!(true), &json!(true)));
    let counts = texts(&replay["dryCounts"]);
    assert!(counts.lines().any(|l| l.starts_with("would replay") && l.trim_end().ends_with('3')), "{counts}");
    assert_eq!(replay["dryListed"], 3, "{replay}");
    assert!(replay["done"].as_str().unwrap().starts_with("Replayed 3 events"), "{replay}");
    let audit = "SELECT actor, reason, order_id, outcome FROM admin_audit WHERE action = 'REPLAY'";
    let audit = conn
        .query_one_raw(Statement::from_string(conn.get_database_backend(), audit))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(audit.try_get_by_index::<String>(0).unwrap(), OPERATOR, "the token's subject, not the page");
    assert_eq!(audit.try_get_by_index::<String>(1).unwrap(), REPLAY_REASON);
    assert_eq!(audit.try_get_by_index::<Option<i64>>(2).unwrap(), Some(published.order_id));
    let outcome = audit.try_get_by_index::<String>(3).unwrap();
    assert!(outcome.starts_with("replayed 3, "), "{outcome}");
    assert_eventually("the replayed versions are published again", WAIT, || async {
        probe.count_with_status("PUBLISHED").await == 11
    })
    .await;

    let refused = steps["refused"]["banner"].as_str().unwrap();
    assert!(refused.contains("Unauthenticated") && refused.contains("TOKEN_INVALID"), "{refused}");
    assert!(refused.contains("--token-file"), "the banner says what to do: {refused}");
    let reloaded = &steps["reloaded"];
    assert_eq!(reloaded["banner"], false, "a reload keeps the session: {reloaded}");
    let spent = steps["spent"]["banner"].as_str().unwrap();
    assert!(spent.contains("CONSOLE_KEY_SPENT") && spent.contains("press Enter"), "{spent}");
    let keyless = steps["keyless"]["banner"].as_str().unwrap();
    assert!(keyless.contains("CONSOLE_SESSION_MISSING") && keyless.contains("press Enter"), "{keyless}");
    assert_eq!(steps["done"]["problems"], json!([]), "the browser saw errors or requests elsewhere");

    for (process, token) in [(&console_process, &operator), (&refused_process, &stranger)] {
        assert!(!process.log().contains(token.as_str()), "the console printed its token");
    }
    for page in [
        "backlog",
        "timeline",
        "failed",
        "redriven",
        "timeline-redriven",
        "purge",
        "replay",
        "backlog-drained",
        "refused",
    ] {
        assert!(out.join(format!("{page}.png")).exists(), "no screenshot of {page}");
    }
    println!("screenshots in {}", out.display());
    relay.expect("the relay started after the backlog was shown").stop().await;
    consumer.stop().await;
}

#[tokio::test]
async fn the_console_refuses_to_listen_beyond_loopback() {
    let output = tokio::process::Command::new(service_binary("idempostctl"))
        .args(["console", "--listen=0.0.0.0:0"])
        .env_remove("IDEMPOST_TOKEN")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("loopback only"), "{stderr}");
}

#[tokio::test]
async fn the_committed_console_bundle_is_built_from_the_sources_as_they_are() {
    let package = console_package();
    let output = tokio::process::Command::new("node")
        .arg(package.join("build.mjs"))
        .arg("--check")
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// Where a console sends its calls in the access tests: a listener that counts the connections
/// made to it and never answers, so that any call the console forwards shows as a connection.
struct Upstream {
    address: std::net::SocketAddr,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Upstream {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&connections);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(stream);
            }
        });
        Self { address, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A console (no token: the upstream is a loopback listener) that calls `upstream` for both
/// services, its address (`127.0.0.1:port`) and the key its URL carries.
async fn console_calling(upstream: &Upstream, log: PathBuf) -> (TestService, String, String) {
    let url = format!("http://{}", upstream.address);
    let args = [
        format!("--admin-url={url}"),
        format!("--consumer-admin-url={url}"),
        "console".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
    ];
    let (process, printed) = started_console(&args, log).await;
    let (origin, key) = printed.split_once("/#key=").unwrap();
    (process, origin.trim_start_matches("http://").to_owned(), key.to_owned())
}

/// One HTTP/1.1 exchange on a connection of its own: the answer's status line and headers.
async fn http1(address: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut answer)).await.expect("answered in time").unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.split_once("\r\n\r\n").map_or(answer.clone(), |(head, _)| head.to_owned())
}

/// A request to the console at `address` from its own page, with `headers` (each `name: value`).
fn request(method: &str, address: &str, path: &str, headers: &[&str], body: &[u8]) -> String {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nOrigin: http://{address}\r\nConnection: close\r\n"
    );
    for header in headers {
        request.push_str(&format!("{header}\r\n"));
    }
    // Bodies here are gRPC-Web frames of empty messages: five bytes, all zero but the flag's.
    request.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    request.push_str(&String::from_utf8_lossy(body));
    request
}

/// The exchange of the printed key for a session: the answer's head.
async fn exchange(address: &str, key: &str) -> String {
    let header = format!("x-idempost-console-key: {key}");
    http1(address, &request("POST", address, "/session", &[&header], b"")).await
}

/// An HTTP/2 GET with prior knowledge (h2c) of `path` with a plain `host` header: what a local
/// process that knows no key tries. `None` when the console does not speak HTTP/2 or answers
/// anything but 200.
async fn h2c_get(address: &str, path: &str) -> Option<hyper::StatusCode> {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.ok()?;
        tokio::spawn(connection);
        let get = hyper::Request::get(format!("http://{address}{path}"))
            .header("host", address)
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .unwrap();
        let answer = sender.send_request(get).await.ok()?;
        Some(answer.status()).filter(|status| *status == hyper::StatusCode::OK)
    };
    tokio::time::timeout(Duration::from_secs(5), attempt).await.ok().flatten()
}

const CALLS: [&str; 5] = [
    "/idempost.v1.AdminService/ListBacklog",
    "/idempost.v1.AdminService/Purge",
    "/idempost.v1.AdminService/Redrive",
    "/idempost.v1.AdminService/Replay",
    "/idempost.v1.ConsumerAdminService/ReleaseParkedGap",
];

/// A gRPC-Web frame holding an empty message.
const EMPTY_FRAME: &[u8] = &[0, 0, 0, 0, 0];

fn status_of(head: &str) -> &str {
    head.split(' ').nth(1).unwrap_or_default()
}

#[tokio::test]
async fn a_console_call_without_a_session_over_h2c_or_by_get_head_or_keyless_post_reaches_no_service() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let (_console, address, key) = console_calling(&upstream, dir.path().join("console.log")).await;
    let grpc_web = "Content-Type: application/grpc-web+proto";

    for call in CALLS {
        assert_eq!(h2c_get(&address, call).await, None, "h2c GET {call} was answered OK");
        for method in ["GET", "HEAD"] {
            let head = http1(&address, &request(method, &address, call, &[grpc_web], b"")).await;
            assert_eq!(status_of(&head), "405", "{method} {call}: {head}");
        }
        let keyless = http1(&address, &request("POST", &address, call, &[grpc_web], EMPTY_FRAME)).await;
        assert!(keyless.contains("grpc-status: 16"), "a keyless POST {call} is UNAUTHENTICATED: {keyless}");
        let with_key = format!("x-idempost-console-key: {key}");
        let key_only = request("POST", &address, call, &[grpc_web, &with_key], EMPTY_FRAME);
        assert!(http1(&address, &key_only).await.contains("grpc-status: 16"), "the key is not a session");
    }
    assert_eq!(upstream.connections(), 0, "a refused request reached the service");

    // The same console forwards a call within a session, but only as gRPC-Web: the refusals
    // above were the console's, and the upstream would have seen a forwarded call.
    let exchanged = exchange(&address, &key).await;
    let cookie = exchanged
        .lines()
        .find_map(|line| line.strip_prefix("set-cookie: "))
        .unwrap_or_else(|| panic!("no session cookie: {exchanged}"));
    let session = format!("Cookie: {}", cookie.split(';').next().unwrap());
    let plain_grpc = "Content-Type: application/grpc";
    let head =
        http1(&address, &request("POST", &address, CALLS[0], &[plain_grpc, &session], EMPTY_FRAME)).await;
    assert_eq!(status_of(&head), "415", "{head}");
    let head = http1(&address, &request("GET", &address, CALLS[0], &[grpc_web, &session], b"")).await;
    assert_eq!(status_of(&head), "405", "{head}");
    assert_eq!(upstream.connections(), 0, "a refused request reached the service");
    let call = request("POST", &address, CALLS[0], &[grpc_web, &session], EMPTY_FRAME);
    let forwarded = tokio::spawn({
        let address = address.clone();
        async move { http1(&address, &call).await }
    });
    assert_eventually("the call within a session reaches the service", WAIT, || async {
        upstream.connections() > 0
    })
    .await;
    forwarded.abort();
}

#[tokio::test]
async fn the_console_key_is_exchanged_once_for_a_strict_session_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let (_console, address, key) = console_calling(&upstream, dir.path().join("console.log")).await;

    let first = exchange(&address, &key).await;
    assert_eq!(status_of(&first), "204", "{first}");
    let cookie = first.lines().find_map(|line| line.strip_prefix("set-cookie: ")).unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=3600"] {
        assert!(cookie.split("; ").any(|a| a == attribute), "the cookie lacks {attribute}: {cookie}");
    }
    let port = address.rsplit_once(':').unwrap().1;
    assert!(cookie.starts_with(&format!("idempost_console_{port}=")), "{cookie}");

    let second = exchange(&address, &key).await;
    assert_eq!(status_of(&second), "403", "{second}");
    assert!(!second.contains("set-cookie"), "a spent key made a session: {second}");
    let guessed = exchange(&address, "0123456789abcdef").await;
    assert_eq!(status_of(&guessed), "403", "{guessed}");
    // The page itself still loads without any key or session.
    let page = http1(&address, &request("GET", &address, "/", &[], b"")).await;
    assert_eq!(status_of(&page), "200", "{page}");
    assert_eq!(upstream.connections(), 0);
}

#[tokio::test]
async fn a_silent_or_slow_connection_to_the_console_is_closed_and_an_oversized_head_refused() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let (_console, address, _) = console_calling(&upstream, dir.path().join("console.log")).await;

    // The console's head timeout is 10 s (tools/idempostctl/src/console/http.rs).
    let closed_in_time = async |mut stream: tokio::net::TcpStream| {
        let started = tokio::time::Instant::now();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the connection was still open after 20 s");
        started.elapsed()
    };
    let silent = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow.write_all(format!("GET / HTTP/1.1\r\nHost: {address}\r\n").as_bytes()).await.unwrap();
    let (silent, slow) = tokio::join!(closed_in_time(silent), closed_in_time(slow));
    for (which, elapsed) in [("silent", silent), ("slow", slow)] {
        assert!(elapsed >= Duration::from_secs(8), "the {which} connection closed after {elapsed:?}");
    }

    let oversized = format!("X-Padding: {}", "a".repeat(32 * 1024));
    let head = http1(&address, &request("GET", &address, "/", &[&oversized], b"")).await;
    assert_eq!(status_of(&head), "431", "{head}");
}

#[tokio::test]
async fn enter_in_the_consoles_terminal_prints_a_new_url_whose_key_replaces_the_unused_one() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
    let upstream = Upstream::start().await;
    let url = format!("--admin-url=http://{}", upstream.address);
    let consumer_url = format!("--consumer-admin-url=http://{}", upstream.address);
    let mut child = tokio::process::Command::new(service_binary("idempostctl"))
        .args([url.as_str(), consumer_url.as_str(), "console", "--listen=127.0.0.1:0"])
        .env_remove("IDEMPOST_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut terminal = child.stdin.take().unwrap();
    let mut printed = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next_url = async || loop {
        let line = tokio::time::timeout(WAIT, printed.next_line()).await.unwrap().unwrap().unwrap();
        if let Some((_, url)) = line.split_once("open http://") {
            let (address, key) = url.split_once("/#key=").unwrap();
            return (address.to_owned(), key.to_owned());
        }
    };
    let (address, first) = next_url().await;

    terminal.write_all(b"\n").await.unwrap();
    let (same_address, second) = next_url().await;

    assert_eq!(same_address, address);
    assert_ne!(first, second);
    let replaced = exchange(&address, &first).await;
    assert_eq!(status_of(&replaced), "403", "the unused key was replaced: {replaced}");
    let exchanged = exchange(&address, &second).await;
    assert_eq!(status_of(&exchanged), "204", "{exchanged}");
}
