//! One peer cannot hold what every other peer needs: TLS handshake slots go to clients that
//! speak, each address has its share, the host's own probes have slots of their own, and a
//! connection that never authenticates, or only collects refusals, is closed.

use std::time::Duration;

use futures::future::join_all;
use idempost_testkit::db::{Backend, TestDb};
use idempost_testkit::order::order_process;
use idempost_testkit::otlp::{Received, start_receiver};
use idempost_testkit::peer::{connect_from, host, tls_health_from, tls_probe_from};
use idempost_testkit::pki::Pki;
use idempost_testkit::service::ServiceProcess;
use idempost_testkit::wait::{WAIT, assert_eventually};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::codegen::{Bytes, http};
use tonic_health::pb::health_check_response::ServingStatus;

/// The order service as a process with TLS from `pki`, checking tokens it signs, with `extra`
/// flags; its metrics go to `endpoint`.
async fn tls_order(db: &TestDb, pki: &Pki, endpoint: String, extra: &[&str]) -> (ServiceProcess, u16) {
    let mut flags =
        vec![format!("--tls-cert={}", pki.cert.display()), format!("--tls-key={}", pki.key.display())];
    flags.extend(idempost_testkit::auth::jwt_flags(pki));
    flags.extend(extra.iter().map(|f| (*f).to_owned()));
    order_process(db, endpoint, &flags.iter().map(String::as_str).collect::<Vec<_>>(), None).await
}

/// How many connections the service shed for `reason`, as last exported.
fn shed(received: &Received, reason: &str) -> f64 {
    received
        .points()
        .iter()
        .filter(|p| p.name == "idempost.listener.connections_shed")
        .filter(|p| p.attribute("idempost.shed.reason") == Some(reason))
        .map(|p| p.value)
        .fold(0.0, f64::max)
}

/// How long the server took to close `connection` (end of stream or reset), if within `within`.
async fn closed_after(mut connection: TcpStream, opened: Instant, within: Duration) -> Option<Duration> {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(within, connection.read(&mut byte)).await {
        Ok(Ok(0) | Err(_)) => Some(opened.elapsed()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_connections_from_one_address_leave_tls_handshakes_to_others_and_close_at_the_first_byte_deadline()
 {
    let (endpoint, received, _receiver) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    // The default settings: 64 handshakes per listener, 8 per address, 64 connections per address.
    let (_service, port) = tls_order(&db, &pki, endpoint, &[]).await;

    // Twice the listener's handshake slots in silent connections, all from one address: before,
    // they held every slot for the 10 s handshake timeout and every other client was dropped.
    let opened = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..128 {
        silent.push(connect_from(host(2), port).await.unwrap());
    }
    assert_eq!(
        tls_probe_from(host(3), port, &pki.ca).await,
        Ok(ServingStatus::Serving),
        "a client at another address completes its handshake"
    );
    assert_eq!(
        tls_probe_from(host(1), port, &pki.ca).await,
        Ok(ServingStatus::Serving),
        "the host's own readiness probe completes its handshake"
    );

    // Each silent connection is closed: past its address's shares at once, within them once the
    // first bytes of a ClientHello are overdue (3 s), well before the 10 s handshake timeout.
    let closed = join_all(silent.into_iter().map(|c| closed_after(c, opened, Duration::from_secs(8)))).await;
    let lived: Vec<Duration> = closed.iter().map(|c| c.expect("a silent connection was left open")).collect();
    let longest = lived.iter().max().unwrap();
    assert!(
        *longest >= Duration::from_millis(2500),
        "those within the shares waited for their first bytes: {lived:?}"
    );
    // All but the 8 within the address's handshake share were shed for the address's shares.
    assert_eventually("the shed connections are counted by address", WAIT, || async {
        shed(&received, "address_connections") + shed(&received, "address_handshakes") >= 120.0
    })
    .await;
}

/// A TCP connection from `source` that has sent the first byte of a TLS record and stalls: it
/// holds a handshake slot until the handshake timeout.
async fn stalled_handshake(source: std::net::IpAddr, port: u16) -> TcpStream {
    let mut connection = connect_from(source, port).await.unwrap();
    connection.write_all(&[0x16]).await.unwrap();
    connection
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_handshake_waits_briefly_for_a_slot_and_the_hosts_own_probes_have_slots_of_their_own() {
    let (endpoint, _received, _receiver) = start_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let (_service, port) = tls_order(&db, &pki, endpoint, &["--max-tls-handshakes=2"]).await;

    // Two clients that began a ClientHello and stalled hold both of the listener's slots.
    let mut stalled = vec![stalled_handshake(host(2), port).await, stalled_handshake(host(2), port).await];
    // (Once their first bytes are seen: until then a handshake from elsewhere may go first.)
    assert_eventually("a client past the held slots is closed after its brief wait", WAIT, || async {
        tls_probe_from(host(4), port, &pki.ca).await.is_err()
    })
    .await;
    assert_eq!(
        tls_probe_from(host(1), port, &pki.ca).await,
        Ok(ServingStatus::Serving),
        "the host's own probe is served while the listener's slots are held"
    );

    // A client that finds the slots held waits for one to end instead of being closed at once.
    let (connected, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let ca = pki.ca.clone();
    let waiting = tokio::spawn(async move { tls_health_from(host(3), port, &ca, connected).await });
    heard.recv().await.expect("the waiting client connects");
    drop(stalled.pop());
    assert_eq!(
        waiting.await.unwrap(),
        Ok(ServingStatus::Serving),
        "the waiting client got the slot given back"
    );
}

/// A raw HTTP/2 connection to the service's plaintext `port`, and the task driving it, which
/// ends when the server closes the connection.
async fn raw_connection(port: u16) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (send, driver)
}

/// A call to `path` with an empty message and `token`, if any; its `grpc-status`.
async fn raw_call(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    token: Option<&str>,
) -> Result<String, h2::Error> {
    let mut request = http::Request::post(format!("http://127.0.0.1{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    futures::future::poll_fn(|cx| send.poll_ready(cx)).await?;
    let (response, mut body) = send.send_request(request.body(()).unwrap(), false)?;
    crate::helpers::send_after_headers(&mut body, Bytes::from_static(&[0, 0, 0, 0, 0]), true);
    let response = response.await?;
    if let Some(status) = response.headers().get("grpc-status") {
        return Ok(status.to_str().unwrap().to_owned());
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk?.len());
    }
    let trailers = body.trailers().await?.unwrap_or_default();
    Ok(trailers.get("grpc-status").map(|s| s.to_str().unwrap().to_owned()).unwrap_or_default())
}

const CHECK: &str = "/grpc.health.v1.Health/Check";
const RECONCILE: &str = "/idempost.v1.OrderService/Reconcile";
const OK: &str = "0";
/// A Reconcile with an empty message, once its caller is authenticated.
const INVALID_ARGUMENT: &str = "3";
const UNAUTHENTICATED: &str = "16";

/// The order service as a plaintext loopback process checking tokens `pki` signs, with `extra`
/// flags; its metrics go to `endpoint`.
async fn jwt_order(db: &TestDb, pki: &Pki, endpoint: String, extra: &[&str]) -> (ServiceProcess, u16) {
    let mut flags: Vec<String> = idempost_testkit::auth::jwt_flags(pki).into();
    flags.extend(extra.iter().map(|f| (*f).to_owned()));
    order_process(db, endpoint, &flags.iter().map(String::as_str).collect::<Vec<_>>(), None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_making_only_health_checks_is_closed_at_the_unauthenticated_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let (endpoint, _received, _receiver) = start_receiver().await;
    let (_service, port) = jwt_order(&db, &pki, endpoint, &["--unauthenticated-timeout=2s"]).await;
    let token = idempost_testkit::auth::tenant(&pki, 7);

    // One connection makes an authenticated call once; the other checks health without pause.
    let (mut authenticated, authenticated_driver) = raw_connection(port).await;
    assert_eq!(raw_call(&mut authenticated, RECONCILE, Some(&token)).await.unwrap(), INVALID_ARGUMENT);
    let opened = Instant::now();
    let (mut checking, checking_driver) = raw_connection(port).await;
    let mut checks = 0;
    while let Ok(status) = raw_call(&mut checking, CHECK, None).await {
        assert_eq!(status, OK, "a health check is answered");
        checks += 1;
        assert!(opened.elapsed() < WAIT, "health checks kept the connection open for {checks} checks");
    }
    let lived = opened.elapsed();
    assert!(checks > 0, "no health check was answered");
    assert!(
        lived >= Duration::from_millis(1500),
        "closed after {lived:?}, before its unauthenticated timeout"
    );
    tokio::time::timeout(WAIT, checking_driver)
        .await
        .expect("the server closed the checking connection")
        .unwrap();

    // The authenticated connection stays, past the unauthenticated timeout, for its idle timeout.
    assert!(!authenticated_driver.is_finished(), "the authenticated connection was closed");
    assert_eq!(raw_call(&mut authenticated, RECONCILE, Some(&token)).await.unwrap(), INVALID_ARGUMENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_is_closed_after_its_refused_calls_each_answered() {
    const REFUSED: usize = 8; // the default --max-refused-calls
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path()).unwrap();
    let db = TestDb::migrated(Backend::Sqlite).await;
    let (endpoint, _received, _receiver) = start_receiver().await;
    let (_service, port) = jwt_order(&db, &pki, endpoint, &[]).await;

    let (mut connection, driver) = raw_connection(port).await;
    for call in 1..=REFUSED {
        let status = raw_call(&mut connection, RECONCILE, None).await;
        assert_eq!(status.unwrap(), UNAUTHENTICATED, "refused call {call} is answered");
    }
    tokio::time::timeout(WAIT, driver)
        .await
        .expect("the server closed the connection after its refusals")
        .unwrap();
    assert!(raw_call(&mut connection, CHECK, None).await.is_err(), "the closed connection answered");
}
