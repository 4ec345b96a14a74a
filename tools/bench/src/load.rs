//! Load shapes: a closed loop of N workers for a while, and an open loop at a fixed rate.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tonic::transport::Channel;

use idempost_proto::v1::order_service_client::OrderServiceClient;

use crate::error::BenchError;
use crate::measure::Latencies;
use crate::payload;

/// What a closed loop did.
#[derive(Debug, Default)]
pub(crate) struct LoopResult {
    /// Operations that succeeded.
    pub(crate) ok: u64,
    /// Operations that failed.
    pub(crate) errors: u64,
    /// The first failure, for the report.
    pub(crate) first_error: Option<String>,
    /// Latency of every successful operation.
    pub(crate) latencies: Latencies,
    /// From start until the last operation in flight finished.
    pub(crate) elapsed: Duration,
}

/// Runs `concurrency` workers, each calling `op` back to back until `duration` passed.
pub(crate) async fn closed_loop<F, Fut>(concurrency: usize, duration: Duration, op: F) -> LoopResult
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut result = LoopResult::default();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match op(worker).await {
                        Ok(()) => {
                            result.ok += 1;
                            result.latencies.push(t.elapsed());
                        }
                        Err(e) => {
                            result.errors += 1;
                            result.first_error.get_or_insert_with(|| e.to_string());
                            // A failing backend must not turn the loop into a busy spin.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                result
            })
        })
        .collect();
    let mut total = LoopResult::default();
    for worker in workers {
        match worker.await {
            Ok(result) => {
                total.ok += result.ok;
                total.errors += result.errors;
                total.latencies.extend(result.latencies);
                if total.first_error.is_none() {
                    total.first_error = result.first_error;
                }
            }
            Err(e) => {
                total.errors += 1;
                total.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    total.elapsed = started.elapsed();
    total
}

/// gRPC clients of the order service: one HTTP/2 connection per 16 concurrent callers, as a
/// client library's channel pool would have.
#[derive(Debug, Clone)]
pub(crate) struct OrderClients(Vec<OrderServiceClient<Channel>>);

impl OrderClients {
    /// Connects `connections` channels to `url`, waiting up to 30 s for the service to listen.
    pub(crate) async fn connect(url: &str, connections: usize) -> Result<Self, BenchError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut clients = Vec::new();
        while clients.len() < connections.max(1) {
            match Channel::from_shared(url.to_owned())
                .map_err(|e| BenchError::Settings(e.to_string()))?
                .connect()
                .await
            {
                Ok(channel) => clients.push(OrderServiceClient::new(channel)),
                Err(e) if Instant::now() > deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(Self(clients))
    }

    /// Submits one new order through the `n`th client; returns its event id.
    pub(crate) async fn submit(&self, n: usize) -> Result<String, BenchError> {
        let mut client = self.0[n % self.0.len()].clone();
        let request = payload::request(format!("bench-{}", uuid::Uuid::now_v7()));
        Ok(client.submit_order(request).await?.into_inner().event_id)
    }

    /// Submits one new order through the `n`th client; returns its order id.
    pub(crate) async fn submit_for_id(&self, n: usize) -> Result<i64, BenchError> {
        let mut client = self.0[n % self.0.len()].clone();
        let request = payload::request(format!("bench-{}", uuid::Uuid::now_v7()));
        Ok(client.submit_order(request).await?.into_inner().order_id)
    }

    /// Amends `order_id` at `expected_version` through the `n`th client; returns the event id
    /// and the order's new version.
    pub(crate) async fn amend(
        &self,
        n: usize,
        order_id: i64,
        expected_version: i64,
    ) -> Result<(String, i64), BenchError> {
        let mut client = self.0[n % self.0.len()].clone();
        let request =
            payload::amend_request(format!("bench-{}", uuid::Uuid::now_v7()), order_id, expected_version);
        let response = client.amend_order(request).await?.into_inner();
        Ok((response.event_id, response.version))
    }
}

/// One order of an open loop: when it was sent and the event id it got.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub(crate) at: SystemTime,
    pub(crate) event_id: String,
}

impl Sent {
    /// When it was sent, in microseconds since the Unix epoch (the database's timestamps are
    /// compared in the same unit).
    pub(crate) fn at_micros(&self) -> i64 {
        self.at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
    }
}

/// Sends orders at `per_second` for `duration`, each on schedule whatever the previous ones do.
/// Returns the accepted ones, and how many failed.
pub(crate) async fn open_loop(
    clients: &OrderClients,
    per_second: f64,
    duration: Duration,
) -> (Vec<Sent>, u64, Option<String>) {
    let tasks = scheduled(per_second, duration, |i| {
        let clients = clients.clone();
        async move {
            let at = SystemTime::now();
            clients.submit(i as usize).await.map(|event_id| Sent { at, event_id })
        }
    })
    .await;
    gather(tasks).await
}

/// Sends AmendOrder calls at `per_second` for `duration`, going round `orders` (each at version
/// 1 when the loop starts), each call on schedule. An order's calls wait for its previous one to
/// answer (a call needs the version the previous one made), so a call is sent, and its time
/// taken, once its order is free. Returns the accepted ones, and how many failed.
pub(crate) async fn amend_loop(
    clients: &OrderClients,
    orders: &[i64],
    per_second: f64,
    duration: Duration,
) -> (Vec<Sent>, u64, Option<String>) {
    let versions: Arc<Vec<(i64, tokio::sync::Mutex<i64>)>> =
        Arc::new(orders.iter().map(|&id| (id, tokio::sync::Mutex::new(1))).collect());
    let tasks = scheduled(per_second, duration, |i| {
        let clients = clients.clone();
        let versions = Arc::clone(&versions);
        async move {
            let Some((order_id, version)) = versions.get(i as usize % versions.len().max(1)) else {
                return Err(BenchError::Stuck("no orders to amend".into()));
            };
            let mut version = version.lock().await;
            let at = SystemTime::now();
            let (event_id, new_version) = clients.amend(i as usize, *order_id, *version).await?;
            *version = new_version;
            Ok(Sent { at, event_id })
        }
    })
    .await;
    gather(tasks).await
}

/// Waits for every task of an open loop: the accepted calls, how many failed, the first failure.
async fn gather(
    tasks: Vec<tokio::task::JoinHandle<Result<Sent, BenchError>>>,
) -> (Vec<Sent>, u64, Option<String>) {
    let mut sent = Vec::new();
    let mut failed = 0;
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(s)) => sent.push(s),
            Ok(Err(e)) => {
                failed += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    (sent, failed, first_error)
}

/// Spawns `op(i)` at `per_second` for `duration`, each on schedule whatever the previous ones do
/// (an open loop); returns the tasks in order.
pub(crate) async fn scheduled<F, Fut>(
    per_second: f64,
    duration: Duration,
    mut op: F,
) -> Vec<tokio::task::JoinHandle<Fut::Output>>
where
    F: FnMut(u64) -> Fut,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let period = Duration::from_secs_f64(1.0 / per_second.max(0.01));
    let total = (duration.as_secs_f64() * per_second).round().max(1.0) as u64;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..total {
        tokio::time::sleep_until(start + period.mul_f64(i as f64)).await;
        tasks.push(tokio::spawn(op(i)));
    }
    tasks
}
