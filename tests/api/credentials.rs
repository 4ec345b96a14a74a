//! Credentials that cannot be left in force or leak: JWKS revocation on a running service, and
//! the clients' refusal to send a token in plaintext to another host.

use std::time::Duration;

use std::net::{IpAddr, TcpListener};

use idempost::security::AuthSettings;
use idempost_client::{BearerToken, ClientError, ClientTls, Confirmation, SafeSubmitter, SubmitPolicy};
use idempost_proto::v1 as pb;
use serde_json::json;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::broker::TestBroker;
use crate::helpers::{
    Backend, OutboxProbe, TestDb, TestOrder, TestService, assert_eventually, connect_order_service, order,
    reason, service_binary,
};
use crate::otlp::start_receiver;
use crate::pki::{AUDIENCE, ISSUER, Pki};
use idempost_testkit::auth::jwt_flags;
use idempost_testkit::health::assert_health;
use idempost_testkit::python::run_python;

use idempost_testkit::wait::WAIT;

/// Replaces `path` with `contents` by renaming a staged file into place, as deployment tools do.
fn publish(path: &std::path::Path, contents: &[u8]) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, contents).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_emptied_jwks_revokes_every_key_of_a_running_service_and_a_broken_one_keeps_the_last_good_keys() {
    let (endpoint, received, _receiver) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let mut args = vec![
        format!("--database-url={}", db.url),
        "--listen=127.0.0.1:0".to_owned(),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--reload-every=100ms".to_owned(),
    ];
    args.extend(jwt_flags(&pki));
    let (_service, bound) = TestService::spawn_listening(
        "idempost-order",
        &args,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned())],
    )
    .await;
    let port = bound.port("listen");
    let client = connect_order_service(&format!("http://127.0.0.1:{port}")).await;
    let token = pki.token(json!({ "sub": "svc-tenant-7", "tenant_id": 7 })).unwrap();
    // A Reconcile of an unknown key: NOT_FOUND once the token is accepted, else its refusal.
    let ask = || {
        let (mut client, token) = (client.clone(), token.clone());
        async move {
            let mut request =
                tonic::Request::new(pb::ReconcileRequest { tenant_id: 0, request_id: "r".into() });
            BearerToken::new(&token).unwrap().apply(&mut request);
            let status = client.reconcile(request).await.unwrap_err();
            (status.code(), reason(&status))
        }
    };
    let gauge = |name: &'static str, value: f64, from: usize| {
        received.points().iter().skip(from).any(|p| p.name == name && p.value == value)
    };
    assert_eq!(ask().await.0, Code::NotFound, "the published key is trusted");
    assert_eventually("one signature key is in force", WAIT, || async {
        gauge("idempost.auth.jwks.keys", 1.0, 0)
    })
    .await;

    // Half a document: refused, said so in a gauge, and the key read before stays in force.
    publish(&pki.jwks, b"{\"keys\": [");
    assert_eventually("the broken file is reported stale", WAIT, || async {
        gauge("idempost.auth.jwks.stale", 1.0, 0)
    })
    .await;
    assert_eq!(ask().await.0, Code::NotFound, "the last good key still verifies");

    // An explicitly empty key set: every key is revoked at the next check, health still answers.
    let seen = received.points().len();
    publish(&pki.jwks, br#"{"keys": []}"#);
    assert_eventually("the revoked key verifies nothing", WAIT, || async {
        ask().await == (Code::Unauthenticated, "TOKEN_INVALID".to_owned())
    })
    .await;
    assert_eventually("no key is in force and the file is not stale", WAIT, || async {
        gauge("idempost.auth.jwks.keys", 0.0, seen) && gauge("idempost.auth.jwks.stale", 0.0, seen)
    })
    .await;
    assert_health("health answers without a key", port, "", ServingStatus::Serving).await;
}

/// A rotation whose new JWKS also lists a key this build cannot read (a key type from a later
/// standard, a key missing a coordinate) still brings the new key into force on a running
/// service, and retires the old one: the unreadable keys are skipped one by one, not the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rotated_jwks_with_a_key_this_service_cannot_read_still_puts_its_other_keys_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let mut pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let mut args = vec![
        format!("--database-url={}", db.url),
        "--listen=127.0.0.1:0".to_owned(),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--reload-every=100ms".to_owned(),
    ];
    args.extend(jwt_flags(&pki));
    let (_service, bound) = TestService::spawn_listening("idempost-order", &args, &[]).await;
    let client = connect_order_service(&format!("http://127.0.0.1:{}", bound.port("listen"))).await;
    // A Reconcile of an unknown key: NOT_FOUND once the token is accepted, else its refusal.
    let ask = |token: String| {
        let mut client = client.clone();
        async move {
            let mut request =
                tonic::Request::new(pb::ReconcileRequest { tenant_id: 0, request_id: "r".into() });
            BearerToken::new(&token).unwrap().apply(&mut request);
            client.reconcile(request).await.unwrap_err().code()
        }
    };
    let claims = json!({ "sub": "svc-tenant-7", "tenant_id": 7 });
    let old = pki.token(claims.clone()).unwrap();
    assert_eq!(ask(old.clone()).await, Code::NotFound, "the first key is trusted");

    let unreadable = vec![
        json!({ "kty": "AKP", "alg": "ML-DSA-44", "kid": "from-a-later-standard", "pub": "AAAA" }),
        json!({ "kty": "EC", "crv": "P-256", "kid": "missing-y", "x": "AAAA" }),
    ];
    pki.rotate_beside("key-2", unreadable).unwrap();
    let new = pki.token(claims).unwrap();
    assert_eventually("the new key verifies", WAIT, || async { ask(new.clone()).await == Code::NotFound })
        .await;
    assert_eq!(ask(old).await, Code::Unauthenticated, "the rotated-out key verifies nothing");
}

/// An address of this machine that is not loopback: the one its default route leaves from.
/// Connecting a UDP socket sends nothing.
fn non_loopback_ip() -> IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket.connect("192.0.2.1:9").expect("this machine has a route off loopback");
    let ip = socket.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "{ip} is loopback");
    ip
}

/// `idempostctl` with `args`, and IDEMPOST_TOKEN set to `token`: (success, stderr).
async fn idempostctl(args: &[String], token: &str) -> (bool, String) {
    let output = tokio::process::Command::new(service_binary("idempostctl"))
        .args(args)
        .env_remove("IDEMPOST_TOKEN_FILE")
        .env("IDEMPOST_TOKEN", token)
        .output()
        .await
        .unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// An order service on loopback plaintext that checks bearer tokens, and the keys to sign them.
async fn authenticated(dir: &std::path::Path) -> (TestOrder, Pki) {
    let pki = Pki::make(dir).unwrap();
    let jwks = pki.jwks.clone();
    let app = TestOrder::spawn_with(Backend::Sqlite, |settings| {
        settings.security.auth = AuthSettings::jwt(jwks, ISSUER, AUDIENCE);
    })
    .await;
    (app, pki)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_client_refuses_to_send_a_token_in_plaintext_to_another_host_and_connects_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let token = pki.token(json!({ "sub": "ops", "scope": "idempost:admin", "tenant_id": 7 })).unwrap();
    let token_file = dir.path().join("token.jwt");
    std::fs::write(&token_file, &token).unwrap();
    // A real port on another address of this machine: whatever connects to it is queued.
    let listener = TcpListener::bind((non_loopback_ip(), 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    let url = format!("http://{address}");

    let refused = SafeSubmitter::connect(
        &url,
        &ClientTls::default(),
        Some(BearerToken::new(&token).unwrap()),
        SubmitPolicy::default(),
    )
    .await
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(refused, ClientError::PlaintextToken { .. }), "{refused}");
    assert!(refused.to_string().contains(&url), "the error names the URL: {refused}");

    for (setting, flag) in [("--admin-url", "backlog"), ("--consumer-admin-url", "dead-letters")] {
        let (ok, stderr) = idempostctl(&[format!("{setting}={url}"), flag.to_owned()], &token).await;
        assert!(!ok, "idempostctl {setting}={url} {flag} succeeded");
        assert!(stderr.contains(setting), "the error names {setting}: {stderr}");
        assert!(stderr.contains("plaintext"), "{stderr}");
        assert!(!stderr.contains(&token), "idempostctl printed the token");
    }

    let args =
        [format!("--target={address}"), format!("--token-file={}", token_file.display()), "submit".into()];
    // No order on standard input: a submitter that went ahead would exit 0.
    let python = run_python("submit.py", &args, "").await;
    assert_eq!(python.status.code(), Some(2), "{python}");
    assert!(python.stderr.contains("--ca-file"), "the error names --ca-file: {python}");
    assert!(!python.stderr.contains(&token), "submit.py printed the token");

    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("a client connected to {address} anyway: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_still_travels_in_plaintext_to_a_loopback_address() {
    let dir = tempfile::tempdir().unwrap();
    let (app, pki) = authenticated(dir.path()).await;
    let tenant = pki.token(json!({ "sub": "svc-tenant-7", "tenant_id": 7 })).unwrap();
    let operator = pki.token(json!({ "sub": "ops", "scope": "idempost:admin" })).unwrap();

    let mut submitter = SafeSubmitter::connect(
        &format!("http://127.0.0.1:{}", app.port),
        &ClientTls::default(),
        Some(BearerToken::new(&tenant).unwrap()),
        SubmitPolicy::default(),
    )
    .await
    .unwrap();
    let confirmed = submitter.submit(order(0, "loopback-rust")).await.unwrap();
    assert_eq!(confirmed.confirmation, Confirmation::Committed);

    let (ok, stderr) = idempostctl(
        &[format!("--admin-url=http://localhost:{}", app.admin_port), "backlog".into()],
        &operator,
    )
    .await;
    assert!(ok, "idempostctl over loopback plaintext: {stderr}");

    let token_file = dir.path().join("tenant.jwt");
    std::fs::write(&token_file, &tenant).unwrap();
    let args = [
        format!("--target=127.0.0.1:{}", app.port),
        format!("--token-file={}", token_file.display()),
        "submit".to_owned(),
    ];
    let mut order = idempost_testkit::python::order_json("loopback-python", None);
    order["tenant_id"] = 0.into();
    let python = run_python("submit.py", &args, &format!("{order}\n")).await;
    assert!(python.status.success(), "{python}");
    assert_eq!(app.count("orders").await, 2, "both clients' orders committed");
    app.stop().await;
}

/// The NUL-separated command line of process `pid`, as every user of the host can read it.
fn command_line(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn services_read_their_database_url_and_kafka_options_from_files_kept_off_their_command_lines() {
    let db = TestDb::migrated(Backend::MariaDb).await;
    let conn = db.connect().await;
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let url_file = dir.path().join("database-url");
    std::fs::write(&url_file, format!("{}\n", db.url)).unwrap();
    let kafka_file = dir.path().join("kafka.properties");
    std::fs::write(
        &kafka_file,
        "# a dead member leaves after seconds\nsession.timeout.ms=6000\nheartbeat.interval.ms=500\n",
    )
    .unwrap();
    let from_file = format!("--database-url-file={}", url_file.display());
    let kafka = format!("--kafka-option-file={}", kafka_file.display());
    let (brokers, topic_flag) = (format!("--brokers={}", broker.address()), format!("--topic={topic}"));

    let order_args = [from_file.clone(), "--listen=127.0.0.1:0".into(), "--admin-listen=127.0.0.1:0".into()];
    let (order_service, order_bound) = TestService::spawn_listening("idempost-order", &order_args, &[]).await;
    let port = order_bound.port("listen");
    // The relay takes the file's name from the environment.
    let relay_args = [brokers.clone(), topic_flag.clone(), kafka.clone(), "--listen=127.0.0.1:0".into()];
    let relay = TestService::spawn(
        "idempost-relay",
        &relay_args,
        &[("IDEMPOST_DATABASE_URL_FILE", url_file.display().to_string())],
    );
    let consumer_args =
        [from_file, brokers, topic_flag, kafka, "--group-id=g1".into(), "--listen=127.0.0.1:0".into()];
    let consumer = TestService::spawn("idempost-consumer", &consumer_args, &[]);

    let mut client = connect_order_service(&format!("http://127.0.0.1:{port}")).await;
    let accepted = client.submit_order(order(7, "from-files")).await.unwrap().into_inner();
    let probe = OutboxProbe { conn: &conn };
    assert_eventually("the event is published and consumed", Duration::from_secs(60), || async {
        probe.state(&accepted.event_id).await.status == "PUBLISHED"
            && scalar(
                &conn,
                &format!("SELECT COUNT(*) FROM consumed_event WHERE event_id = '{}'", accepted.event_id),
            )
            .await
                == 1
    })
    .await;
    for process in [&order_service, &relay, &consumer] {
        let line = command_line(process.pid());
        assert!(!line.is_empty() && !line.contains(&db.url), "a database URL on a command line: {line}");
    }

    // A line that is not KEY=VALUE stops the relay at start-up (the line is named, not shown).
    std::fs::write(&kafka_file, "sasl.username=idempost\nhunter2\n").unwrap();
    let mut refused = TestService::spawn(
        "idempost-relay",
        &[
            format!("--database-url-file={}", url_file.display()),
            format!("--kafka-option-file={}", kafka_file.display()),
        ],
        &[],
    );
    assert!(!refused.wait(WAIT).await.success(), "a bad Kafka option file was accepted");
}

async fn scalar(conn: &sea_orm::DatabaseConnection, sql: &str) -> i64 {
    use sea_orm::ConnectionTrait as _;
    let row =
        conn.query_one_raw(sea_orm::Statement::from_string(conn.get_database_backend(), sql)).await.unwrap();
    row.and_then(|row| row.try_get_by_index::<i64>(0).ok()).unwrap_or(0)
}

/// The pids of this process's children now.
#[cfg(feature = "failpoints")]
fn children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // stat: `pid (comm) state ppid ...`; comm may hold spaces, so split after its `)`.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)) == Some(me.as_str())
        })
        .collect()
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_verifier_gives_its_services_the_database_url_through_the_environment_not_their_command_lines() {
    use std::collections::HashMap;

    let db = TestDb::migrated(Backend::Sqlite).await;
    let broker = TestBroker::start().await;
    let logs = tempfile::tempdir().unwrap();
    let settings = crate::helpers::verify_settings(&db, &broker, &logs, Vec::new());
    let run =
        tokio::spawn(async move { idempost_verify::run(&settings).await.map(|report| report.passed()) });
    // Every child's command line, read while it runs.
    let mut seen: HashMap<i32, String> = HashMap::new();
    while !run.is_finished() {
        for pid in children() {
            let line = command_line(pid);
            if line.contains("idempost-") {
                seen.entry(pid).or_insert(line);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(run.await.unwrap().ok(), Some(true), "the verifier passes");
    assert!(
        ["idempost-order", "idempost-relay", "idempost-consumer"]
            .iter()
            .all(|b| seen.values().any(|l| l.contains(b))),
        "every kind of service was seen: {seen:?}"
    );
    for line in seen.values() {
        assert!(!line.contains(&db.url), "a database URL on a command line: {line}");
    }
}
