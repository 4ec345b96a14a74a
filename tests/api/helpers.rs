//! Fresh databases, a running order service on port 0, services as real processes (the
//! verifier's process control), and assertions over what was stored.

use std::sync::LazyLock;

use idempost::order::{Application, BatchStats, Settings};
use idempost_migration::{Migrator, MigratorTrait};
use idempost_proto::v1::{
    self as pb, admin_service_client::AdminServiceClient, order_service_client::OrderServiceClient,
};
use idempost_verify::process::{Bound, Output, Signal};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic_types::StatusExt;
use uuid::Uuid;

/// A client of the order service at `url`, retried while the process is still starting.
pub async fn connect_order_service(url: &str) -> OrderServiceClient<Channel> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Ok(client) = OrderServiceClient::connect(url.to_owned()).await {
            return client;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the order service at {url} never accepted connections"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Logs stay silent unless `TEST_LOG` is set.
static TRACING: LazyLock<()> = LazyLock::new(|| {
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter("info,idempost=debug").with_test_writer().try_init();
    }
});

/// The three databases every order-service test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    MariaDb,
    Postgres,
    Sqlite,
}

/// Generates one `#[tokio::test]` per backend for each named `async fn(Backend)`.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use $crate::helpers::Backend;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mariadb() {
                super::$name(Backend::MariaDb).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$name(Backend::Postgres).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(Backend::Sqlite).await;
            }
        }
    )*};
}
pub(crate) use on_every_backend;

fn server_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// A database made for one test, migrated, and dropped by the test script's clean-up.
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// An empty, unmigrated database.
    pub async fn empty(backend: Backend) -> Self {
        LazyLock::force(&TRACING);
        let name = format!("idempost_t_{}", Uuid::new_v4().simple());
        match backend {
            Backend::MariaDb => {
                let server = server_url("IDEMPOST_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306");
                admin(&format!("{server}/mysql"), &format!("CREATE DATABASE {name}")).await;
                Self { url: format!("{server}/{name}"), _dir: None }
            }
            Backend::Postgres => {
                let server = server_url("IDEMPOST_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432");
                admin(&format!("{server}/postgres"), &format!("CREATE DATABASE {name}")).await;
                Self { url: format!("{server}/{name}"), _dir: None }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}/idempost.db?mode=rwc", dir.path().display());
                Self { url, _dir: Some(dir) }
            }
        }
    }

    /// A fresh database with every migration applied.
    pub async fn migrated(backend: Backend) -> Self {
        let db = Self::empty(backend).await;
        let conn = db.connect().await;
        Migrator::up(&conn, None).await.unwrap();
        conn.close().await.unwrap();
        db
    }

    /// The database at `url` (on a server a test started itself), migrated.
    pub async fn migrated_at(url: String) -> Self {
        LazyLock::force(&TRACING);
        let db = Self { url, _dir: None };
        let conn = db.connect().await;
        Migrator::up(&conn, None).await.unwrap();
        conn.close().await.unwrap();
        db
    }

    pub async fn connect(&self) -> DatabaseConnection {
        idempost::db::connect(&self.url, 4).await.unwrap()
    }
}

async fn admin(url: &str, sql: &str) {
    let conn = idempost::db::connect(url, 1).await.unwrap();
    conn.execute_unprepared(sql).await.unwrap();
    conn.close().await.unwrap();
}

/// A service's `run_until_stopped` running in this process until stopped or dropped.
pub struct InProcess {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// How long [`InProcess::stop`] waits for a service to end.
const STOPPED_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

impl InProcess {
    /// Spawns `run(shutdown)`; the service must end without error once `shutdown` completes.
    pub fn spawn<Fut, E>(
        run: impl FnOnce(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> Fut,
    ) -> Self
    where
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Debug,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let service = run(Box::pin(async move {
            let _ = stopped.await;
        }));
        let task = tokio::spawn(async move { service.await.unwrap() });
        Self { stop: Some(stop), task }
    }

    /// Stops the service as SIGTERM would, and waits until it has: at most [`STOPPED_WITHIN`],
    /// more than any service's drain (the relay's within its default lease of 30 s), so a stop
    /// that hangs fails the test by name instead of running into the test's timeout.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let stopped = tokio::time::timeout(STOPPED_WITHIN, &mut self.task).await;
        stopped.unwrap_or_else(|_| panic!("the service did not stop within {STOPPED_WITHIN:?}")).unwrap();
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// An order service on port 0 over a fresh, migrated database.
pub struct TestApp {
    pub db: TestDb,
    pub conn: DatabaseConnection,
    pub port: u16,
    pub admin_port: u16,
    pub client: OrderServiceClient<Channel>,
    pub admin: AdminServiceClient<Channel>,
    /// The sizes of the group-commit batches the service wrote.
    pub batches: BatchStats,
    server: Option<InProcess>,
}

impl TestApp {
    pub async fn spawn(backend: Backend) -> Self {
        Self::spawn_with(backend, |_| {}).await
    }

    /// An order service whose settings `adjust` changed first.
    pub async fn spawn_with(backend: Backend, adjust: impl FnOnce(&mut Settings)) -> Self {
        Self::spawn_on(TestDb::migrated(backend).await, adjust).await
    }

    /// An order service over `db`, whose settings `adjust` changed first.
    pub async fn spawn_on(db: TestDb, adjust: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = Settings::for_database(&db.url);
        adjust(&mut settings);
        let app = Application::build(settings).await.unwrap();
        let (port, admin_port, batches) = (app.port(), app.admin_port(), app.batch_sizes());
        let server = InProcess::spawn(|shutdown| app.run_until_stopped(shutdown));
        let client = OrderServiceClient::connect(format!("http://127.0.0.1:{port}")).await.unwrap();
        let admin = AdminServiceClient::connect(format!("http://127.0.0.1:{admin_port}")).await.unwrap();
        let conn = db.connect().await;
        Self { db, conn, port, admin_port, client, admin, batches, server: Some(server) }
    }

    pub fn channel_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.channel_url()).unwrap().connect().await.unwrap()
    }

    pub async fn submit(
        &self,
        request: pb::SubmitOrderRequest,
    ) -> Result<pb::SubmitOrderResponse, tonic::Status> {
        self.client.clone().submit_order(request).await.map(tonic::Response::into_inner)
    }

    pub async fn reconcile(
        &self,
        tenant_id: i64,
        request_id: &str,
    ) -> Result<pb::ReconcileResponse, tonic::Status> {
        let request = pb::ReconcileRequest { tenant_id, request_id: request_id.to_owned() };
        self.client.clone().reconcile(request).await.map(tonic::Response::into_inner)
    }

    /// Stops the server as SIGTERM would, and waits until it has.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
    }

    pub async fn count(&self, table: &str) -> i64 {
        self.scalar_i64(&format!("SELECT COUNT(*) FROM {table}")).await
    }

    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        let row = self
            .conn
            .query_one_raw(Statement::from_string(self.conn.get_database_backend(), sql.to_owned()))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index::<i64>(0).unwrap()
    }

    /// `(status, payload)` of the outbox row for `event_id`, if there is one.
    pub async fn outbox_row(&self, event_id: &str) -> Option<(String, Vec<u8>)> {
        let backend = self.conn.get_database_backend();
        let placeholder = if backend == DbBackend::Postgres { "$1" } else { "?" };
        let sql = format!("SELECT status, payload FROM outbox_event WHERE event_id = {placeholder}");
        let row = self
            .conn
            .query_one_raw(Statement::from_sql_and_values(backend, sql, [event_id.into()]))
            .await
            .unwrap()?;
        Some((row.try_get_by_index(0).unwrap(), row.try_get_by_index(1).unwrap()))
    }
}

/// A valid two-line order.
pub fn order(tenant_id: i64, request_id: &str) -> pb::SubmitOrderRequest {
    pb::SubmitOrderRequest {
        tenant_id,
        request_id: request_id.to_owned(),
        customer_id: "customer-42".to_owned(),
        currency: "EUR".to_owned(),
        line_items: vec![
            pb::LineItem { sku: "SKU-RED-MUG".to_owned(), quantity: 2, unit_price_minor: 1_250 },
            pb::LineItem { sku: "SKU-TEA".to_owned(), quantity: 1, unit_price_minor: 799 },
        ],
        event_id: String::new(),
    }
}

/// The `OrderAccepted` event a relay would publish for order `order_id` of tenant 7 (request
/// `req-<order_id>`, the lines of [`order`]), as tests that produce records by hand need it.
pub fn order_accepted(order_id: i64, event_id: &str, total_minor: i64) -> pb::OrderAccepted {
    pb::OrderAccepted {
        event_id: event_id.to_owned(),
        event_version: 1,
        order_id,
        tenant_id: 7,
        request_id: format!("req-{order_id}"),
        customer_id: "c".to_owned(),
        currency: "EUR".to_owned(),
        line_items: order(7, "x").line_items,
        total_minor,
        accepted_at: None,
    }
}

/// The `ErrorInfo.reason` of a status, and its metadata value for `key`.
pub fn reason(status: &tonic::Status) -> String {
    status.get_details_error_info().map(|info| info.reason).unwrap_or_default()
}

pub fn metadata(status: &tonic::Status, key: &str) -> Option<String> {
    status.get_details_error_info().and_then(|info| info.metadata.get(key).cloned())
}

/// The fields a status's BadRequest details name.
pub fn violated_fields(status: &tonic::Status) -> Vec<String> {
    status
        .get_details_bad_request()
        .map(|bad| bad.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

/// Arms a failpoint for this test process. Failpoints are process-global, so this refuses to
/// run outside nextest, which gives each test a process of its own.
#[cfg(feature = "failpoints")]
pub fn arm(point: &str, actions: &str) {
    assert!(
        std::env::var_os("NEXTEST").is_some(),
        "failpoint tests need a process per test: run them with `cargo nextest run`"
    );
    fail::cfg(point, actions).unwrap();
}

/// Arms `point` to hold the first thread that passes it until the returned [`Held`] lets it go
/// (or is dropped, so a failing test never leaves a thread held); later passes go straight on.
///
/// Unlike a `sleep`, a hold ends when the test has seen what it waited for, not when a guessed
/// time is up: on a loaded machine the other side may not get there within any fixed sleep.
#[cfg(feature = "failpoints")]
pub fn hold(point: &'static str) -> Held {
    use std::sync::{Mutex, mpsc};
    assert!(
        std::env::var_os("NEXTEST").is_some(),
        "failpoint tests need a process per test: run them with `cargo nextest run`"
    );
    let (reached, reached_rx) = oneshot::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let first = Mutex::new(Some((reached, release_rx)));
    fail::cfg_callback(point, move || {
        let taken = first.lock().unwrap().take();
        if let Some((reached, release)) = taken {
            let _ = reached.send(());
            // Blocks this thread, as the failpoint's `sleep` would, until released or dropped.
            let _ = release.recv();
        }
    })
    .unwrap();
    Held { point, reached: Some(reached_rx), release: Some(release) }
}

/// A thread held at a failpoint by [`hold`].
#[cfg(feature = "failpoints")]
pub struct Held {
    point: &'static str,
    reached: Option<oneshot::Receiver<()>>,
    release: Option<std::sync::mpsc::Sender<()>>,
}

#[cfg(feature = "failpoints")]
impl Held {
    /// Waits until a thread is held at the point, failing the test with `what` after `timeout`.
    pub async fn reached(&mut self, what: &str, timeout: std::time::Duration) {
        let reached = self.reached.take().expect("waited for the hold once");
        let arrived = tokio::time::timeout(timeout, reached).await;
        assert!(matches!(arrived, Ok(Ok(()))), "timed out after {timeout:?} waiting until {what}");
    }

    /// Lets the held thread go on.
    pub fn release(self) {}
}

#[cfg(feature = "failpoints")]
impl Drop for Held {
    fn drop(&mut self) {
        // A closed channel ends the hold.
        drop(self.release.take());
        fail::remove(self.point);
    }
}

/// Polls `check` until it holds, failing the test with `what` after `timeout`.
pub async fn assert_eventually<F, Fut>(what: &str, timeout: std::time::Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(eventually(timeout, check).await, "timed out after {timeout:?} waiting until {what}");
}

/// Whether `check` holds within `timeout`, polled every 50 ms: for a test that reports what it
/// saw when it does not. A check still running at the deadline counts as not holding, so a
/// check that never returns (a call without a deadline of its own) fails the wait instead of
/// hanging the test.
pub async fn eventually<F, Fut>(timeout: std::time::Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if tokio::time::timeout_at(deadline, check()).await.unwrap_or(false) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// One outbox row as the relay left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxState {
    pub status: String,
    pub attempts: i32,
    pub lease_owner: Option<String>,
    pub last_error: Option<String>,
    pub published: bool,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
}

/// Reads outbox rows and seeds backlogs with plain SQL, as an operator would see them.
pub struct OutboxProbe<'a> {
    pub conn: &'a DatabaseConnection,
}

impl OutboxProbe<'_> {
    fn placeholder(&self, n: usize) -> String {
        idempost_testkit::sql::placeholder(self.conn.get_database_backend(), n)
    }

    pub async fn state(&self, event_id: &str) -> OutboxState {
        let sql = format!(
            "SELECT status, attempts, lease_owner, last_error, published_at IS NOT NULL, published_partition, \
             published_offset FROM outbox_event WHERE event_id = {}",
            self.placeholder(1)
        );
        let backend = self.conn.get_database_backend();
        let row = self
            .conn
            .query_one_raw(Statement::from_sql_and_values(backend, sql, [event_id.into()]))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no outbox row {event_id}"));
        OutboxState {
            status: row.try_get_by_index(0).unwrap(),
            attempts: row.try_get_by_index(1).unwrap(),
            lease_owner: row.try_get_by_index(2).unwrap(),
            last_error: row.try_get_by_index(3).unwrap(),
            published: row.try_get_by_index::<bool>(4).unwrap(),
            partition: row.try_get_by_index(5).unwrap(),
            offset: row.try_get_by_index(6).unwrap(),
        }
    }

    /// How many rows have `status`.
    pub async fn count_with_status(&self, status: &str) -> i64 {
        let backend = self.conn.get_database_backend();
        let sql = format!("SELECT COUNT(*) FROM outbox_event WHERE status = {}", self.placeholder(1));
        let row = self
            .conn
            .query_one_raw(Statement::from_sql_and_values(backend, sql, [status.into()]))
            .await
            .unwrap()
            .unwrap();
        row.try_get_by_index::<i64>(0).unwrap()
    }

    /// Writes `count` PENDING events directly (the relay publishes payloads verbatim, so any
    /// bytes do) and returns their ids, oldest first.
    pub async fn seed(&self, count: usize) -> Vec<String> {
        let backend = self.conn.get_database_backend();
        let mut ids = Vec::with_capacity(count);
        let created = chrono::Utc::now();
        for chunk_start in (0..count).step_by(100) {
            let chunk = (chunk_start..count.min(chunk_start + 100)).collect::<Vec<_>>();
            let mut values = Vec::new();
            let mut rows = Vec::new();
            for i in chunk {
                let id = uuid::Uuid::now_v7().to_string();
                let n = values.len();
                rows.push(format!(
                    "({}, 'order', {}, 'idempost.v1.OrderAccepted', 1, {}, 'PENDING', 0, {})",
                    self.placeholder(n + 1),
                    self.placeholder(n + 2),
                    self.placeholder(n + 3),
                    self.placeholder(n + 4)
                ));
                values.push(id.clone().into());
                values.push(format!("{}", 100_000 + i).into());
                values.push(format!("payload-{i}").into_bytes().into());
                values.push((created + chrono::Duration::microseconds(i as i64)).into());
                ids.push(id);
            }
            let sql = format!(
                "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
                 payload, status, attempts, created_at) VALUES {}",
                rows.join(", ")
            );
            self.conn.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.unwrap();
        }
        ids
    }
}

/// A service binary of this workspace, built next to the test binary (scripts/test builds
/// them with the same features before running the tests).
pub fn service_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(std::path::Path::parent).unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --all-features --bins` first",
        path.display()
    );
    path
}

/// A service running as its own process, killed when dropped: the verifier's process control,
/// so tests and the verifier start, signal and kill services one way. Output is discarded
/// unless `TEST_LOG` is set.
pub struct ServiceProcess(
    idempost_verify::process::ServiceProcess,
    // Held, never read: the port file's directory lives as long as the process.
    #[allow(dead_code)] Option<tempfile::TempDir>,
);

impl ServiceProcess {
    pub fn spawn(name: &str, args: &[String], env: &[(&str, String)]) -> Self {
        let output = if std::env::var_os("TEST_LOG").is_some() { Output::Inherit } else { Output::Discard };
        Self::start(name, args, env, output)
    }

    /// A service whose output (its logs) goes to `log`, read back with [`ServiceProcess::log`].
    pub fn spawn_logged(
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        log: std::path::PathBuf,
    ) -> Self {
        Self::start(name, args, env, Output::File(log))
    }

    fn start(name: &str, args: &[String], env: &[(&str, String)], output: Output) -> Self {
        let process =
            idempost_verify::process::ServiceProcess::start(&service_binary(name), name, args, env, output);
        Self(process.unwrap(), None)
    }

    /// A service started with its listeners on port 0 (`args` say so) that writes the ports it
    /// got to a port file: returned once it wrote them, with them. No free port is guessed.
    pub async fn spawn_listening(name: &str, args: &[String], env: &[(&str, String)]) -> (Self, Bound) {
        let output = if std::env::var_os("TEST_LOG").is_some() { Output::Inherit } else { Output::Discard };
        let dir = tempfile::tempdir().unwrap();
        let mut process = idempost_verify::process::ServiceProcess::start_with_port_file(
            &service_binary(name),
            name,
            args,
            env,
            output,
            &dir.path().join("ports"),
        )
        .unwrap();
        let bound = process.listening(std::time::Duration::from_secs(60)).await.unwrap();
        (Self(process, Some(dir)), bound)
    }

    /// Everything a logged service wrote so far.
    pub fn log(&self) -> String {
        self.0.log()
    }

    /// SIGKILL, and reaped.
    pub async fn kill(&mut self) {
        self.0.kill().await;
    }

    pub fn pid(&self) -> i32 {
        self.0.pid().unwrap() as i32
    }

    /// Sends `signal` (e.g. "KILL", "TERM"): a real signal, not an in-process stop.
    pub async fn signal(&self, signal: &str) {
        let parsed: Signal = format!("SIG{signal}").parse().unwrap_or_else(|_| panic!("no signal {signal}"));
        assert!(self.0.signal(parsed), "SIG{signal} to {} failed", self.pid());
    }

    pub async fn wait(&mut self, timeout: std::time::Duration) -> std::process::ExitStatus {
        self.0.exited(timeout).await.expect("the process did not exit in time")
    }
}
