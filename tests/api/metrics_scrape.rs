//! The services' Prometheus `/metrics` listeners, scraped while events flow through three real
//! service processes (a real database, the real broker): the counters move with the events, the
//! exposition passes `promtool check metrics`, every metric the Grafana dashboard, the alert rules
//! and the KEDA example name is in the live scrape, and the listener refuses what is no scrape.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::broker::TestBroker;
use crate::helpers::{
    TestDb, TestService, assert_eventually, connect_order_service, on_every_backend, order,
};
use crate::pki::Pki;
use idempost_testkit::db::Backend;
use idempost_testkit::wait::WAIT;

/// How many orders the test submits.
const ORDERS: usize = 5;

/// What only a relay fleet (`--shard-map-file`) reports, which the one-database relay here does
/// not: `services/relay/tests/api/dead_relay.rs` reads them from a fleet relay's scrape.
const FLEET_ONLY: [&str; 1] = ["idempost_relay_shard_unowned"];

/// The status and body of one raw HTTP/1.1 exchange on a fresh connection (the listener closes
/// it after one answer).
async fn exchange(addr: SocketAddr, request: &str) -> (u16, String) {
    exchange_on(TcpStream::connect(addr).await.unwrap(), request).await
}

async fn exchange_on(
    mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    request: &str,
) -> (u16, String) {
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer))
        .await
        .expect("the metrics listener closes the connection after its answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

async fn scrape(addr: SocketAddr) -> String {
    let (status, body) = exchange(addr, "GET /metrics HTTP/1.1\r\nHost: scrape\r\n\r\n").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// `(name, value)` of every sample of an exposition.
fn samples(text: &str) -> Vec<(String, f64)> {
    series(text).map(|(series, value)| (series.split('{').next().unwrap().to_owned(), value)).collect()
}

/// Every sample's series (name and labels) and value.
fn series(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines().filter(|line| !line.starts_with('#') && !line.trim().is_empty()).map(|line| {
        let (series, value) = line.rsplit_once(' ').unwrap();
        (series, value.parse().unwrap())
    })
}

/// The label names of every sample.
fn label_names(text: &str) -> BTreeSet<String> {
    series(text)
        .filter_map(|(series, _)| series.split_once('{'))
        .flat_map(|(_, labels)| {
            labels.split(',').filter_map(|pair| pair.split_once('=')).map(|(name, _)| name.to_owned())
        })
        .collect()
}

/// The sum of every sample of `name`.
fn total(text: &str, name: &str) -> f64 {
    samples(text).into_iter().filter(|(n, _)| n == name).map(|(_, v)| v).sum()
}

/// The `idempost_…` metric and label names a PromQL expression reads.
fn metric_names(expression: &str) -> BTreeSet<String> {
    expression
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("idempost_"))
        .map(str::to_owned)
        .collect()
}

/// Every PromQL expression of the dashboard, the alert rules and the KEDA example.
fn deployed_queries() -> Vec<(String, String)> {
    let deploy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut queries = Vec::new();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(deploy.join("grafana/idempost.json")).unwrap())
            .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let title = panel["title"].as_str().unwrap();
            queries.push((format!("dashboard panel {title}"), target["expr"].as_str().unwrap().to_owned()));
        }
    }
    // The rules and the ScaledObject are YAML; their expressions sit on `expr:` and `query:` lines.
    for (file, key) in [("prometheus/alerts.yaml", "expr:"), ("kubernetes/relay-autoscaling.yaml", "query:")]
    {
        let text = std::fs::read_to_string(deploy.join(file)).unwrap();
        for line in text.lines().map(str::trim).filter(|line| line.starts_with(key)) {
            queries.push((file.to_owned(), line[key.len()..].trim().to_owned()));
        }
    }
    assert!(queries.len() >= 15, "the dashboard, the rules and the KEDA query were all read: {queries:?}");
    queries
}

/// `promtool check metrics` (the Debian `prometheus` package, scripts/common.sh ensure_promtool):
/// the exposition parses and its names follow the Prometheus conventions.
fn promtool_check_metrics(text: &str) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("promtool cannot run ({e}): scripts/test installs it (ensure_promtool)"));
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn every_service_serves_the_metrics_its_dashboard_and_alerts_read(backend: Backend) {
    let db = TestDb::migrated(backend).await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-metrics");
    broker.create_topic(&topic, 3).await;
    let database = format!("--database-url={}", db.url);
    let metrics = "--metrics-listen=127.0.0.1:0".to_owned();
    let order_args = [
        database.clone(),
        "--listen=127.0.0.1:0".to_owned(),
        "--admin-listen=127.0.0.1:0".to_owned(),
        metrics.clone(),
        // A request head must arrive within this, and a whole exchange within the call timeout:
        // the slow client below is cut off quickly.
        "--body-timeout=1s".to_owned(),
        "--call-timeout=5s".to_owned(),
    ];
    let (_order, order_bound) = TestService::spawn_listening("idempost-order", &order_args, &[]).await;
    let common = [
        database.clone(),
        format!("--brokers={}", broker.address()),
        format!("--topic={topic}"),
        "--listen=127.0.0.1:0".to_owned(),
        metrics.clone(),
    ];
    let relay_args: Vec<String> =
        common.iter().cloned().chain(["--max-idle-poll=100ms".to_owned()]).collect();
    let (_relay, relay_bound) = TestService::spawn_listening("idempost-relay", &relay_args, &[]).await;
    let consumer_args: Vec<String> =
        common.iter().cloned().chain([format!("--group-id={topic}-group")]).collect();
    let (_consumer, consumer_bound) =
        TestService::spawn_listening("idempost-consumer", &consumer_args, &[]).await;
    let [order_metrics, relay_metrics, consumer_metrics] =
        [&order_bound, &relay_bound, &consumer_bound].map(|bound| bound.addr("metrics-listen").unwrap());

    let mut client = connect_order_service(&format!("http://{}", order_bound.addr("listen").unwrap())).await;
    for i in 0..ORDERS {
        client.submit_order(order(11, &format!("scraped-{i}"))).await.unwrap();
    }
    let sent = ORDERS as f64;
    assert_eventually("the relay's scrape counts every event claimed and published", WAIT, || async {
        let text = scrape(relay_metrics).await;
        total(&text, "idempost_relay_published_total") == sent
            && total(&text, "idempost_relay_claimed_total") == sent
    })
    .await;
    assert_eventually("the consumer's scrape counts every event consumed, end to end", WAIT, || async {
        let text = scrape(consumer_metrics).await;
        total(&text, "idempost_consumer_consumed_total") == sent
            && total(&text, "idempost_end_to_end_latency_seconds_count") == sent
    })
    .await;
    assert_eventually(
        "nothing is left to claim, by the order service's and the relay's gauges",
        WAIT,
        || async {
            let (order_text, relay_text) = (scrape(order_metrics).await, scrape(relay_metrics).await);
            [&order_text, &relay_text].iter().all(|text| {
                samples(text).iter().any(|(n, v)| n == "idempost_outbox_claimable" && *v == 0.0)
                    && samples(text)
                        .iter()
                        .any(|(n, v)| n == "idempost_outbox_oldest_claimable_age_seconds" && *v == 0.0)
            })
        },
    )
    .await;
    // Without a shard map the order service's claimable gauges carry no shard label, as one
    // database's always did: dashboards and alerts written for it read the same series.
    let order_text = scrape(order_metrics).await;
    let claimable: Vec<_> =
        series(&order_text).filter(|(series, _)| series.starts_with("idempost_outbox_")).collect();
    assert!(
        claimable.len() >= 2 && claimable.iter().all(|(s, _)| !s.contains("idempost_shard")),
        "{order_text}"
    );
    assert_eventually("the consumer's group has no lag left", WAIT, || async {
        let text = scrape(consumer_metrics).await;
        samples(&text).iter().any(|(n, v)| n == "idempost_consumer_lag" && *v == 0.0)
            && samples(&text).iter().any(|(n, v)| n == "idempost_consumer_parked" && *v == 0.0)
    })
    .await;

    let mut scraped = BTreeSet::new();
    for addr in [order_metrics, relay_metrics, consumer_metrics] {
        let text = scrape(addr).await;
        promtool_check_metrics(&text);
        scraped.extend(samples(&text).into_iter().map(|(name, _)| name));
        scraped.extend(label_names(&text));
    }
    let missing: Vec<String> = deployed_queries()
        .into_iter()
        .flat_map(|(source, query)| {
            metric_names(&query)
                .into_iter()
                .filter(|name| !scraped.contains(name) && !FLEET_ONLY.contains(&name.as_str()))
                .map(move |name| format!("{source}: {name}"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "metrics or labels named by deploy/ but absent from the live scrape:\n{}",
        missing.join("\n")
    );

    // What is no scrape is refused, and a client that never finishes its request is cut off.
    assert_eq!(exchange(order_metrics, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n").await.0, 404);
    assert_eq!(
        exchange(order_metrics, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").await.0,
        405
    );
    assert_eq!(
        exchange(order_metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc").await.0,
        400
    );
    let mut slow = TcpStream::connect(order_metrics).await.unwrap();
    slow.write_all(b"GET /metr").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest))
        .await
        .expect("an unfinished request head is cut off at the body timeout (1 s)")
        .unwrap();
}

on_every_backend!(every_service_serves_the_metrics_its_dashboard_and_alerts_read);

/// A TLS client as Prometheus is one: trusting `ca`, offering HTTP/1.1 only.
fn scraper_tls(ca: &std::path::Path) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_metrics_listener_serves_the_services_certificate_to_an_http_1_1_scraper() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let args = [
        format!("--database-url={}", db.url),
        "--listen=127.0.0.1:0".to_owned(),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--metrics-listen=127.0.0.1:0".to_owned(),
        "--auth=none".to_owned(),
        format!("--tls-cert={}", pki.cert.display()),
        format!("--tls-key={}", pki.key.display()),
    ];
    let (_order, bound) = TestService::spawn_listening("idempost-order", &args, &[]).await;
    let addr = bound.addr("metrics-listen").unwrap();

    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = scraper_tls(&pki.ca).connect(name, tcp).await.expect("the service's certificate, for HTTP/1.1");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (status, body) = exchange_on(tls, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        total(&body, "idempost_calls_refused_total") == 0.0
            && body.contains("# TYPE idempost_calls_refused_total counter"),
        "{body}"
    );

    // Plaintext on the TLS listener gets no answer: the handshake fails and the connection closes.
    let (status, _) = exchange(addr, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert_eq!(status, 0, "no HTTP answer over plaintext");
}
