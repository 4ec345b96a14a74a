//! Starting and stopping. A service sent SIGTERM while it is still starting (here, connecting
//! to a database that accepts the connection and never answers) exits 0 instead of dying by the
//! signal.

use tokio::net::TcpListener;

use crate::helpers::TestService;

use idempost_testkit::wait::WAIT;

/// A "database" that accepts connections and never says a word: a service connecting to it is
/// stuck in start-up until its connect timeout.
struct SilentDatabase {
    listener: TcpListener,
    held: Vec<tokio::net::TcpStream>,
}

impl SilentDatabase {
    async fn start() -> Self {
        Self { listener: TcpListener::bind("127.0.0.1:0").await.unwrap(), held: Vec::new() }
    }

    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/idempost", self.listener.local_addr().unwrap().port())
    }

    /// Waits until the service opened a connection: it is connecting, so still starting.
    async fn connected(&mut self) {
        let (stream, _) = tokio::time::timeout(WAIT, self.listener.accept())
            .await
            .expect("the service connects to the database")
            .unwrap();
        self.held.push(stream);
    }
}

async fn sigterm_during_start_up_exits_zero(name: &str, args: impl FnOnce(&str) -> Vec<String>) {
    let mut database = SilentDatabase::start().await;
    let mut service = TestService::spawn(name, &args(&database.url()), &[]);
    database.connected().await;

    service.signal("TERM").await;

    let status = service.wait(WAIT).await;
    assert!(status.success(), "{name} stopped during start-up exits 0, not by the signal: {status:?}");
}

#[tokio::test]
async fn the_order_service_sent_sigterm_while_connecting_to_its_database_exits_zero() {
    sigterm_during_start_up_exits_zero("idempost-order", |url| {
        vec![
            format!("--database-url={url}"),
            "--auth=none".to_owned(),
            "--listen=127.0.0.1:0".to_owned(),
            "--admin-listen=127.0.0.1:0".to_owned(),
        ]
    })
    .await;
}

#[tokio::test]
async fn the_relay_sent_sigterm_while_connecting_to_its_database_exits_zero() {
    sigterm_during_start_up_exits_zero("idempost-relay", |url| {
        vec![
            format!("--database-url={url}"),
            format!("--brokers=127.0.0.1:{}", crate::broker::free_port()),
            "--listen=127.0.0.1:0".to_owned(),
        ]
    })
    .await;
}

#[tokio::test]
async fn the_consumer_sent_sigterm_while_connecting_to_its_database_exits_zero() {
    sigterm_during_start_up_exits_zero("idempost-consumer", |url| {
        vec![
            format!("--database-url={url}"),
            format!("--brokers=127.0.0.1:{}", crate::broker::free_port()),
            "--auth=none".to_owned(),
            "--listen=127.0.0.1:0".to_owned(),
        ]
    })
    .await;
}

/// SIGHUP, which operators send to have certificates and keys re-read, stops no service, even
/// one with neither TLS nor a JWKS (which would otherwise leave the signal's default action,
/// terminate, in place): each logs it, keeps answering its health check, and still drains on
/// SIGTERM with exit status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_stops_no_service_without_tls_or_a_jwks() {
    let db = crate::helpers::TestDb::migrated(crate::helpers::Backend::Sqlite).await;
    let broker = crate::broker::TestBroker::start().await;
    let database = format!("--database-url={}", db.url);
    let brokers = format!("--brokers={}", broker.address());
    let logs = tempfile::tempdir().unwrap();
    let services: [(&str, Vec<String>); 3] = [
        (
            "idempost-order",
            vec![
                database.clone(),
                "--auth=none".into(),
                "--listen=127.0.0.1:0".into(),
                "--admin-listen=127.0.0.1:0".into(),
            ],
        ),
        ("idempost-relay", vec![database.clone(), brokers.clone(), "--listen=127.0.0.1:0".into()]),
        ("idempost-consumer", vec![database, brokers, "--auth=none".into(), "--listen=127.0.0.1:0".into()]),
    ];
    for (name, args) in services {
        let log = logs.path().join(format!("{name}.log"));
        let (mut service, bound) = TestService::spawn_listening_logged(name, &args, &[], log).await;
        for _ in 0..2 {
            let logged = service.log().matches("SIGHUP received").count();
            service.signal("HUP").await;
            crate::helpers::assert_eventually(&format!("{name} logs the SIGHUP"), WAIT, || async {
                service.log().matches("SIGHUP received").count() > logged
            })
            .await;
        }
        let port = bound.port("listen");
        let answered = idempost_testkit::health::health(port, "").await;
        assert!(answered.is_some(), "{name} still answers its health check after two SIGHUPs");
        service.signal("TERM").await;
        let status = service.wait(WAIT).await;
        assert!(status.success(), "{name} drains on SIGTERM after SIGHUP: {status:?}");
    }
}

/// A binary built with failpoints obeys `FAILPOINTS`, which can break its guarantees: without the
/// test-only switch it refuses to start, whatever else it was given.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn a_failpoints_build_started_without_the_test_switch_refuses_to_start_and_says_why() {
    let auth = "--auth=none";
    for (name, args) in [
        ("idempost-order", vec![auth, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0"]),
        ("idempost-relay", vec!["--listen=127.0.0.1:0"]),
        ("idempost-consumer", vec![auth, "--listen=127.0.0.1:0"]),
    ] {
        let output = tokio::process::Command::new(crate::helpers::service_binary(name))
            .args(args)
            .arg("--database-url=sqlite::memory:")
            .env_remove(idempost::failpoint::ALLOW_FAILPOINTS)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .output();
        let output = tokio::time::timeout(WAIT, output).await.expect("it exits at once").unwrap();

        assert!(!output.status.success(), "{name} started: {:?}", output.status);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("failpoints") && stderr.contains(idempost::failpoint::ALLOW_FAILPOINTS),
            "{name} names the feature and the switch: {stderr}"
        );
    }
}
