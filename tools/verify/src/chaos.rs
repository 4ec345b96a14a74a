//! Chaos mode: orders keep arriving, and are amended and cancelled, while relays and consumers
//! are SIGKILLed at random and the broker (and, when asked, the database) is restarted;
//! afterwards every event id is checked, and every order's versions on the topic and in the
//! consumer's read model.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rand::Rng;
use sea_orm::{ConnectionTrait, Statement};

use idempost_client::{SafeSubmitter, SubmitPolicy};
use idempost_consumer::DEFAULT_CONSUMER_NAME;
use idempost_proto::v1::{self as pb, order_service_client::OrderServiceClient};

use crate::error::VerifyError;
use crate::evidence::{self, Record};
use crate::ordering;
use crate::process::ServiceProcess;
use crate::settings::Settings;

/// Restarts the broker, on durable storage, when chaos asks for it.
pub trait BrokerControl: Send {
    /// Stops the broker abruptly and starts it again on the same address and storage.
    fn restart(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The test kit's per-test broker: killed with SIGKILL and started again on its storage.
impl BrokerControl for idempost_testkit::broker::TestBroker {
    fn restart(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.kill();
            self.run().await;
        })
    }
}

/// Restarts the database the services share, when chaos asks for it.
pub trait DatabaseControl: Send {
    /// Stops the database (abruptly or not, as the operator's command does) and starts it
    /// again on the same address and data; returns once it was started again.
    fn restart(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// How much chaos.
#[derive(Debug, Clone)]
pub struct ChaosSettings {
    /// Orders to submit.
    pub orders: usize,
    /// How long processes are killed and the broker restarted.
    pub duration: Duration,
}

/// What chaos did and what the checker found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChaosReport {
    /// SIGKILLs sent to relays and consumers.
    pub kills: u64,
    /// Processes started again after a kill.
    pub restarts: u64,
    /// Broker restarts.
    pub broker_restarts: u64,
    /// Database restarts.
    pub database_restarts: u64,
    /// Records on the topic beyond one per event.
    pub duplicates_delivered: u64,
    /// Records on the topic beyond one per event whose event still has exactly one effect (one
    /// consumed row, one job): read from the database and the topic, not from the logs.
    pub duplicates_absorbed: u64,
    /// Event ids checked (each order's acceptance, amendment and cancellation).
    pub events_checked: u64,
    /// Orders whose versions on the topic and read model were checked.
    pub orders_checked: u64,
    /// Versions of those orders checked (the sum of their versions in the order table).
    pub versions_checked: u64,
    /// Every violation found; empty when all held.
    pub violations: Vec<String>,
}

impl ChaosReport {
    /// The counts in one line each, for people.
    pub fn summary(&self) -> String {
        format!(
            "kills: {}\nrestarts: {}\nbroker restarts: {}\ndatabase restarts: {}\nduplicates delivered: {}\nduplicates absorbed: {}\nevents checked: {}\norders checked in order: {} ({} versions)\nviolations: {}\n",
            self.kills,
            self.restarts,
            self.broker_restarts,
            self.database_restarts,
            self.duplicates_delivered,
            self.duplicates_absorbed,
            self.events_checked,
            self.orders_checked,
            self.versions_checked,
            if self.violations.is_empty() { "none".to_owned() } else { self.violations.join("; ") }
        )
    }
}

struct Fleet<'a> {
    settings: &'a Settings,
    relay_args: Vec<String>,
    consumer_args: Vec<String>,
    processes: Vec<ServiceProcess>,
    alive: Vec<usize>,
    started: u64,
}

impl<'a> Fleet<'a> {
    /// No process yet: relays and consumers of `topic`, the consumers in the group of `run`.
    fn new(settings: &'a Settings, topic: &str, run: &str) -> Self {
        let common = |extra: &[&str]| -> Vec<String> {
            [
                format!("--brokers={}", settings.brokers),
                format!("--topic={topic}"),
                "--listen=127.0.0.1:0".to_owned(),
            ]
            .into_iter()
            .chain(extra.iter().map(|s| (*s).to_owned()))
            .collect()
        };
        let group = format!("--group-id=idempost-chaos-{run}");
        Fleet {
            settings,
            relay_args: common(&[
                // A delivery timeout far beyond a broker restart: a send of an idempotent producer
                // that times out bumps its epoch, and Tansu 0.6 then fails every client until it is
                // restarted (tansu-storage lite.rs:503). The lease must outlast it.
                "--lease=24s",
                "--delivery-timeout=10s",
                "--lease-margin=2s",
                "--max-idle-poll=100ms",
                "--backoff-base=100ms",
                "--backoff-max=1s",
                "--max-attempts=1000",
            ]),
            consumer_args: common(&[
                &group,
                "--backoff-max=500ms",
                &format!("--kafka-option=session.timeout.ms={}", CONSUMER_SESSION.as_millis()),
                "--kafka-option=heartbeat.interval.ms=500",
            ]),
            processes: Vec::new(),
            alive: Vec::new(),
            started: 0,
        }
    }

    fn start(&mut self, kind: &str) -> Result<(), VerifyError> {
        self.started += 1;
        let (binary, args) = if kind == "relay" {
            ("idempost-relay", &self.relay_args)
        } else {
            ("idempost-consumer", &self.consumer_args)
        };
        let label = format!("chaos-{kind}-{}", self.started);
        let process = self.settings.launch(binary, &label, args, "")?;
        self.processes.push(process);
        self.alive.push(self.processes.len() - 1);
        Ok(())
    }

    /// Starts every process in `pending` whose time has come; returns how many.
    fn restart_due(
        &mut self,
        pending: &mut Vec<(tokio::time::Instant, &str)>,
        now: tokio::time::Instant,
    ) -> Result<u64, VerifyError> {
        let mut started = 0;
        let mut index = 0;
        while index < pending.len() {
            if pending[index].0 <= now {
                let (_, kind) = pending.swap_remove(index);
                self.start(kind)?;
                started += 1;
            } else {
                index += 1;
            }
        }
        Ok(started)
    }
}

/// The consumers' Kafka session timeout: how long the group waits before expiring a killed one.
const CONSUMER_SESSION: Duration = Duration::from_secs(6);

/// Writes each order makes: its submission, an amendment and a cancellation.
const WRITES_PER_ORDER: usize = 3;

/// Runs chaos and checks every event and every order. The broker is restarted halfway; the
/// database, when `database` is given, a quarter of the way in. `Err` means chaos could not be
/// carried out; violations are in the report.
pub async fn chaos(
    settings: &Settings,
    chaos: &ChaosSettings,
    broker: &mut dyn BrokerControl,
    database: Option<&mut dyn DatabaseControl>,
) -> Result<ChaosReport, VerifyError> {
    std::fs::create_dir_all(&settings.work_dir)?;
    let db = idempost::service::open_database(&settings.database_url, 2)
        .await
        .map_err(|e| VerifyError::Stuck(e.to_string()))?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("idempost-chaos-{run}");
    evidence::create_topic(&settings.brokers, &topic, 3).await.map_err(VerifyError::Broker)?;
    let tenant_id = i64::from(rand::random::<u32>() >> 1) + 1;
    let mut fleet = Fleet::new(settings, &topic, &run);
    let mut order = settings.launch(
        "idempost-order",
        "chaos-order",
        &["--listen=127.0.0.1:0".to_owned(), "--admin-listen=127.0.0.1:0".to_owned()],
        "",
    )?;
    let bound = order.listening(Duration::from_secs(60)).await.map_err(VerifyError::Stuck)?;
    let port = bound.port("listen");
    for kind in ["relay", "relay", "consumer", "consumer"] {
        fleet.start(kind)?;
    }
    let spacing =
        chaos.duration.checked_div(u32::try_from(chaos.orders.max(1)).unwrap_or(1)).unwrap_or_default();
    let writes = tokio::spawn(workload(format!("http://127.0.0.1:{port}"), tenant_id, chaos.orders, spacing));

    let mut report = ChaosReport::default();
    storm(&mut fleet, chaos, broker, database, &mut report).await?;
    let event_ids = writes.await.map_err(|e| VerifyError::Stuck(e.to_string()))?;
    calm(&db, &event_ids, tenant_id).await?;
    let alive = fleet.alive.clone();
    for index in alive {
        let _ = fleet.processes[index].terminate(Duration::from_secs(30)).await;
    }
    let _ = order.terminate(Duration::from_secs(30)).await;

    let deliveries =
        evidence::read_topic(&settings.brokers, &topic, Duration::from_secs(3), Duration::from_secs(120))
            .await
            .map_err(VerifyError::Broker)?;
    let expected = chaos.orders * WRITES_PER_ORDER;
    if event_ids.len() < expected {
        report.violations.push(format!("only {} of {expected} writes were confirmed", event_ids.len()));
    }
    check_events(&db, &event_ids, &deliveries, &mut report).await?;
    let orders = ordering::check_orders(&db, &deliveries, tenant_id, DEFAULT_CONSUMER_NAME).await?;
    (report.orders_checked, report.versions_checked) = (orders.orders, orders.versions);
    report.violations.extend(orders.violations);
    let distinct: HashSet<&str> = deliveries.iter().map(|d| d.event_id.as_str()).collect();
    report.duplicates_delivered = (deliveries.len() - distinct.len()) as u64;
    report.duplicates_absorbed = absorbed(&db, &deliveries).await?;
    Ok(report)
}

/// Submits `count` orders of `tenant_id` through the safe caller protocol, `spacing` apart, and
/// amends (version 2) then cancels (version 3) each; returns the event ids of the confirmed writes.
async fn workload(url: String, tenant_id: i64, count: usize, spacing: Duration) -> Vec<String> {
    let client = loop {
        if let Ok(client) = OrderServiceClient::connect(url.clone()).await {
            break client;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut submitter = SafeSubmitter::new(client, SubmitPolicy { max_calls: 20, ..SubmitPolicy::default() });
    let mut event_ids = Vec::new();
    for i in 0..count {
        let request = pb::SubmitOrderRequest {
            tenant_id,
            request_id: format!("chaos-{i}"),
            customer_id: "chaos".into(),
            currency: "EUR".into(),
            line_items: vec![pb::LineItem { sku: "CHAOS".into(), quantity: 1, unit_price_minor: 100 }],
            event_id: String::new(),
        };
        if let Ok(confirmed) = submitter.submit(request).await {
            event_ids.push(confirmed.event_id);
            let amend = pb::AmendOrderRequest {
                tenant_id,
                request_id: format!("chaos-{i}-amend"),
                order_id: confirmed.order_id,
                expected_version: 1,
                line_items: vec![pb::LineItem { sku: "CHAOS".into(), quantity: 2, unit_price_minor: 100 }],
                ..Default::default()
            };
            let cancel = pb::CancelOrderRequest {
                tenant_id,
                request_id: format!("chaos-{i}-cancel"),
                order_id: confirmed.order_id,
                expected_version: 2,
                reason: pb::CancelReason::CustomerRequest.into(),
                ..Default::default()
            };
            if let Ok(amended) = submitter.amend(amend).await {
                event_ids.push(amended.event_id);
                if let Ok(cancelled) = submitter.cancel(cancel).await {
                    event_ids.push(cancelled.event_id);
                }
            }
        }
        tokio::time::sleep(spacing).await;
    }
    event_ids
}

/// For `chaos.duration`: a random relay or consumer is SIGKILLed every 0.8 to 2.5 s and comes
/// back after a delay; the broker is restarted halfway, the database (if given) a quarter of the
/// way in. Returns once every killed process is running again.
async fn storm(
    fleet: &mut Fleet<'_>,
    chaos: &ChaosSettings,
    broker: &mut dyn BrokerControl,
    mut database: Option<&mut dyn DatabaseControl>,
    report: &mut ChaosReport,
) -> Result<(), VerifyError> {
    let started = tokio::time::Instant::now();
    let mut next_broker_restart = started + chaos.duration / 2;
    let mut next_database_restart = started + chaos.duration / 4;
    // Killed processes come back after a delay, as under an orchestrator's restart back-off.
    let mut restarts: Vec<(tokio::time::Instant, &str)> = Vec::new();
    while started.elapsed() < chaos.duration {
        let pause = Duration::from_millis(rand::rng().random_range(800..2500));
        tokio::time::sleep(pause).await;
        report.restarts += fleet.restart_due(&mut restarts, tokio::time::Instant::now())?;
        if tokio::time::Instant::now() >= next_broker_restart {
            broker.restart().await;
            report.broker_restarts += 1;
            next_broker_restart += chaos.duration;
            continue;
        }
        if let Some(database) = database.as_deref_mut()
            && tokio::time::Instant::now() >= next_database_restart
        {
            database.restart().await;
            report.database_restarts += 1;
            next_database_restart += chaos.duration;
            continue;
        }
        if fleet.alive.is_empty() {
            continue;
        }
        let victim = fleet.alive.remove(rand::rng().random_range(0..fleet.alive.len()));
        fleet.processes[victim].kill().await;
        report.kills += 1;
        let (kind, delay) = if fleet.processes[victim].label().contains("relay") {
            ("relay", Duration::ZERO)
        } else {
            // A consumer comes back only after the group expired its killed member. A join is
            // what tells the other members to rebalance: Tansu 0.6 does not bump the group's
            // generation when it expires a member, so a rebalance caused by an expiry alone
            // never reaches the members that stayed, and the dead member's partitions would
            // wait for the next join.
            ("consumer", CONSUMER_SESSION + Duration::from_secs(2))
        };
        restarts.push((tokio::time::Instant::now() + delay, kind));
    }
    if let Some(last) = restarts.iter().map(|(at, _)| *at).max() {
        tokio::time::sleep_until(last).await;
    }
    report.restarts += fleet.restart_due(&mut restarts, tokio::time::Instant::now())?;
    Ok(())
}

/// Calm: the surviving fleet must finish the work: every event PUBLISHED with its one job, and
/// the read model of every order of `tenant_id` at the order table's version and status. Gives
/// up after two minutes; the checks then say what is missing.
async fn calm(
    db: &sea_orm::DatabaseConnection,
    event_ids: &[String],
    tenant_id: i64,
) -> Result<(), VerifyError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let states = ordering::order_states(db, tenant_id, DEFAULT_CONSUMER_NAME).await?;
        let mut done = ordering::read_model_differences(&states).is_empty();
        for id in event_ids {
            let rows = evidence::rows(db, id).await?;
            let state = evidence::outbox_row(db, id).await?;
            done &= rows.jobs == 1 && state.is_some_and(|s| s.status == "PUBLISHED");
        }
        if done || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every event id: a version of an order if and only if an outbox row; PUBLISHED; exactly one
/// consumed_event and one notification_job; and no job anywhere without a version of an order.
async fn check_events(
    db: &sea_orm::DatabaseConnection,
    event_ids: &[String],
    deliveries: &[Record],
    report: &mut ChaosReport,
) -> Result<(), VerifyError> {
    for id in event_ids {
        let rows = evidence::rows(db, id).await?;
        let state = evidence::outbox_row(db, id).await?;
        if rows.versions != rows.outbox {
            let (versions, outbox) = (rows.versions, rows.outbox);
            report.violations.push(format!("{id}: {versions} order version(s) but {outbox} outbox row(s)"));
        }
        if state.as_ref().is_none_or(|s| s.status != "PUBLISHED") {
            report.violations.push(format!("{id}: outbox {:?}", state.map(|s| s.status)));
        }
        if rows.consumed != 1 || rows.jobs != 1 {
            let copies: Vec<String> = deliveries
                .iter()
                .filter(|d| &d.event_id == id)
                .map(|d| format!("{}/{}", d.delivery.partition, d.delivery.offset))
                .collect();
            report.violations.push(format!(
                "{id}: {} consumed row(s), {} job(s); on the topic at {copies:?}",
                rows.consumed, rows.jobs
            ));
        }
        report.events_checked += 1;
    }
    let orphans = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT COUNT(*) FROM notification_job j LEFT JOIN order_version v ON v.event_id = j.event_id \
             WHERE v.order_id IS NULL",
        ))
        .await?
        .and_then(|row| row.try_get_by_index::<i64>(0).ok())
        .unwrap_or_default();
    if orphans > 0 {
        report.violations.push(format!("{orphans} notification job(s) without a version of an order"));
    }
    Ok(())
}

/// Copies on the topic beyond the first of each event that still has exactly one effect: the
/// duplicates the consumers absorbed.
async fn absorbed(
    db: &sea_orm::DatabaseConnection,
    deliveries: &[evidence::Record],
) -> Result<u64, VerifyError> {
    let mut copies: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for record in deliveries {
        *copies.entry(record.event_id.as_str()).or_default() += 1;
    }
    let mut absorbed = 0;
    for (event_id, copies) in copies {
        let rows = evidence::rows(db, event_id).await?;
        if rows.consumed == 1 && rows.jobs == 1 {
            absorbed += copies - 1;
        }
    }
    Ok(absorbed)
}
