//! `spawn_app` for the order service: a [`TestOrder`] on port 0 over a fresh, migrated database,
//! its clients, and the requests tests send it.

use idempost_order::{Application, BatchStats, Settings};
use idempost_proto::v1::{
    self as pb, admin_service_client::AdminServiceClient, order_service_client::OrderServiceClient,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use tonic::transport::Channel;

use crate::db::{Backend, TestDb};
use crate::in_process::InProcess;
use crate::service::{Output, ServiceProcess};

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

/// An order service on port 0 over a fresh, migrated database.
#[derive(Debug)]
pub struct TestOrder {
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

impl TestOrder {
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

    /// How many rows of `table` belong to the event `event_id`.
    pub async fn rows_for_event(&self, table: &str, event_id: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE event_id = ?");
        crate::sql::count(&self.conn, &sql, vec![event_id.into()]).await
    }

    /// `(status, payload)` of the outbox row for `event_id`, if there is one.
    pub async fn outbox_row(&self, event_id: &str) -> Option<(String, Vec<u8>)> {
        let sql = "SELECT status, payload FROM outbox_event WHERE event_id = ?";
        let backend = self.conn.get_database_backend();
        let row = self
            .conn
            .query_one_raw(crate::sql::statement(backend, sql, vec![event_id.into()]))
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

/// An OrderAccepted record as the relay would publish it: a new event id and its payload.
pub fn event_record(order_id: i64) -> (String, Vec<u8>) {
    use prost::Message as _;
    let event_id = uuid::Uuid::now_v7().to_string();
    let payload = order_accepted(order_id, &event_id, 3299).encode_to_vec();
    (event_id, payload)
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

/// An amendment of `order_id` at `expected_version` to one line of `quantity` mugs.
pub fn amend(request_id: &str, order_id: i64, expected_version: i64, quantity: u32) -> pb::AmendOrderRequest {
    pb::AmendOrderRequest {
        tenant_id: 7,
        request_id: request_id.to_owned(),
        order_id,
        expected_version,
        line_items: vec![pb::LineItem { sku: "SKU-BLUE-MUG".to_owned(), quantity, unit_price_minor: 1_000 }],
        customer_id: String::new(),
        event_id: String::new(),
    }
}

/// A cancellation of `order_id` at `expected_version`.
pub fn cancel(request_id: &str, order_id: i64, expected_version: i64) -> pb::CancelOrderRequest {
    pb::CancelOrderRequest {
        tenant_id: 7,
        request_id: request_id.to_owned(),
        order_id,
        expected_version,
        reason: pb::CancelReason::OutOfStock.into(),
        note: "the supplier is out of blue mugs".to_owned(),
        event_id: String::new(),
    }
}

impl TestOrder {
    pub async fn amend(
        &self,
        request: pb::AmendOrderRequest,
    ) -> Result<pb::AmendOrderResponse, tonic::Status> {
        self.client.clone().amend_order(request).await.map(tonic::Response::into_inner)
    }

    pub async fn cancel(
        &self,
        request: pb::CancelOrderRequest,
    ) -> Result<pb::CancelOrderResponse, tonic::Status> {
        self.client.clone().cancel_order(request).await.map(tonic::Response::into_inner)
    }

    /// `(version, status)` of the order row.
    pub async fn order_state(&self, order_id: i64) -> (i64, String) {
        let backend = self.conn.get_database_backend();
        let sql = format!("SELECT version, status FROM orders WHERE id = {order_id}");
        let row = self.conn.query_one_raw(Statement::from_string(backend, sql)).await.unwrap().unwrap();
        (row.try_get_by_index(0).unwrap(), row.try_get_by_index(1).unwrap())
    }

    /// `(event_type, event_version, aggregate_type, aggregate_id, traceparent is set)` of an
    /// outbox row.
    pub async fn outbox_headers(&self, event_id: &str) -> (String, i64, String, String) {
        let sql = "SELECT event_type, event_version, aggregate_type, aggregate_id FROM outbox_event \
                   WHERE event_id = ?";
        let backend = self.conn.get_database_backend();
        let row = self
            .conn
            .query_one_raw(crate::sql::statement(backend, sql, vec![event_id.into()]))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no outbox row {event_id}"));
        (
            row.try_get_by_index(0).unwrap(),
            row.try_get_by_index(1).unwrap(),
            row.try_get_by_index(2).unwrap(),
            row.try_get_by_index(3).unwrap(),
        )
    }
}

/// An order-service process on `db` with `args`, exporting metrics to `endpoint`, started under
/// `prlimit` when `open_files` is given; its public port.
pub async fn order_process(
    db: &TestDb,
    endpoint: String,
    args: &[&str],
    open_files: Option<u64>,
) -> (ServiceProcess, u16) {
    let binary = crate::service::binary("idempost-order");
    let mut all = vec![
        format!("--database-url={}", db.url),
        "--listen=127.0.0.1:0".to_owned(),
        "--admin-listen=127.0.0.1:0".to_owned(),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let program = match open_files {
        Some(limit) => {
            all.splice(0..0, [format!("--nofile={limit}:{limit}"), binary.display().to_string()]);
            std::path::PathBuf::from("prlimit")
        }
        None => binary,
    };
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), ("OTEL_METRIC_EXPORT_INTERVAL", "300".to_owned())];
    let output = if std::env::var_os("TEST_LOG").is_some() { Output::Inherit } else { Output::Discard };
    let ports = tempfile::tempdir().unwrap();
    let mut process = ServiceProcess::start_with_port_file(
        &program,
        "idempost-order",
        &all,
        &env,
        output,
        &ports.path().join("ports"),
    )
    .unwrap();
    let bound = process.listening(std::time::Duration::from_secs(60)).await.unwrap();
    (process, bound.port("listen"))
}
