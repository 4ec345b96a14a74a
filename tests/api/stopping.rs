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
