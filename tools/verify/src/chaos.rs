//! Chaos mode: orders keep arriving while relays and consumers are SIGKILLed at random and the
//! broker (and, when asked, the database) is restarted; afterwards every event id is checked.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rand::Rng;
use sea_orm::{ConnectionTrait, Statement};

use outpost_client::{SafeSubmitter, SubmitPolicy};
use outpost_proto::v1::{self as pb, order_service_client::OrderServiceClient};

use crate::evidence;
use crate::process::ServiceProcess;
use crate::{Settings, VerifyError};

/// Restarts the broker, on durable storage, when chaos asks for it.
pub trait BrokerControl: Send {
    /// Stops the broker abruptly and starts it again on the same address and storage.
    fn restart(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
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
    /// Deliveries the consumers recognised as already consumed.
    pub duplicates_absorbed: u64,
    /// Event ids checked.
    pub events_checked: u64,
    /// Every violation found; empty when all held.
    pub violations: Vec<String>,
}

impl ChaosReport {
    /// The counts in one line each, for people.
    pub fn summary(&self) -> String {
        format!(
            "kills: {}\nrestarts: {}\nbroker restarts: {}\ndatabase restarts: {}\nduplicates delivered: {}\nduplicates absorbed: {}\nevents checked: {}\nviolations: {}\n",
            self.kills,
            self.restarts,
            self.broker_restarts,
            self.database_restarts,
            self.duplicates_delivered,
            self.duplicates_absorbed,
            self.events_checked,
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

impl Fleet<'_> {
    fn start(&mut self, kind: &str) -> Result<(), VerifyError> {
        self.started += 1;
        let (binary, args) = if kind == "relay" {
            ("outpost-relay", &self.relay_args)
        } else {
            ("outpost-consumer", &self.consumer_args)
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

/// Runs chaos and checks every event. The broker is restarted halfway; the database, when
/// `database` is given, a quarter of the way in. `Err` means chaos could not be carried out;
/// violations are in the report.
pub async fn chaos(
    settings: &Settings,
    chaos: &ChaosSettings,
    broker: &mut dyn BrokerControl,
    mut database: Option<&mut dyn DatabaseControl>,
) -> Result<ChaosReport, VerifyError> {
    std::fs::create_dir_all(&settings.work_dir)?;
    let db = outpost::service::open_database(&settings.database_url, 2)
        .await
        .map_err(|e| VerifyError::Stuck(e.to_string()))?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("outpost-chaos-{run}");
    evidence::create_topic(&settings.brokers, &topic, 3).await.map_err(VerifyError::Broker)?;
    let tenant_id = i64::from(rand::random::<u32>() >> 1) + 1;
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
    let group = format!("--group-id=outpost-chaos-{run}");
    let mut fleet = Fleet {
        settings,
        relay_args: common(&[
            // A delivery timeout far beyond a broker restart: a send of an idempotent producer
            // that times out bumps its epoch, and Tansu 0.6 then fails every client until it is
            // restarted (tansu-storage lite.rs:503). The lease must outlast it.
            "--lease=14s",
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
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let order = settings.launch(
        "outpost-order",
        "chaos-order",
        &[format!("--listen=127.0.0.1:{port}"), "--admin-listen=127.0.0.1:0".to_owned()],
        "",
    )?;
    for kind in ["relay", "relay", "consumer", "consumer"] {
        fleet.start(kind)?;
    }

    // Orders arrive throughout the chaos, through the safe caller protocol.
    let url = format!("http://127.0.0.1:{port}");
    let spacing =
        chaos.duration.checked_div(u32::try_from(chaos.orders.max(1)).unwrap_or(1)).unwrap_or_default();
    let count = chaos.orders;
    let submitter = tokio::spawn(async move {
        let client = loop {
            if let Ok(client) = OrderServiceClient::connect(url.clone()).await {
                break client;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut submitter =
            SafeSubmitter::new(client, SubmitPolicy { max_calls: 20, ..SubmitPolicy::default() });
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
            }
            tokio::time::sleep(spacing).await;
        }
        event_ids
    });

    let mut report = ChaosReport::default();
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
    let event_ids = submitter.await.map_err(|e| VerifyError::Stuck(e.to_string()))?;

    // Calm: the surviving fleet must finish the work.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut done = true;
        for id in &event_ids {
            let rows = evidence::rows(&db, id).await?;
            let state = evidence::outbox_row(&db, id).await?;
            done &= rows.jobs == 1 && state.is_some_and(|s| s.status == "PUBLISHED");
        }
        if done || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let alive = fleet.alive.clone();
    for index in alive {
        let _ = fleet.processes[index].terminate(Duration::from_secs(30)).await;
    }
    let mut order = order;
    let _ = order.terminate(Duration::from_secs(30)).await;

    // The checker.
    let deliveries =
        evidence::read_topic(&settings.brokers, &topic, Duration::from_secs(3), Duration::from_secs(120))
            .await
            .map_err(VerifyError::Broker)?;
    if event_ids.len() < chaos.orders {
        report.violations.push(format!("only {} of {} orders were confirmed", event_ids.len(), chaos.orders));
    }
    for id in &event_ids {
        let rows = evidence::rows(&db, id).await?;
        let state = evidence::outbox_row(&db, id).await?;
        if rows.orders != rows.outbox {
            report
                .violations
                .push(format!("{id}: {} order(s) but {} outbox row(s)", rows.orders, rows.outbox));
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
    let backend = db.get_database_backend();
    let orphans = db
        .query_one_raw(Statement::from_string(
            backend,
            "SELECT COUNT(*) FROM notification_job j LEFT JOIN orders o ON o.acceptance_event_id = j.event_id WHERE o.id IS NULL",
        ))
        .await?
        .and_then(|row| row.try_get_by_index::<i64>(0).ok())
        .unwrap_or_default();
    if orphans > 0 {
        report.violations.push(format!("{orphans} notification job(s) without an order"));
    }
    let distinct: HashSet<&str> = deliveries.iter().map(|d| d.event_id.as_str()).collect();
    report.duplicates_delivered = (deliveries.len() - distinct.len()) as u64;
    report.duplicates_absorbed = fleet
        .processes
        .iter()
        .filter(|p| p.label().contains("consumer"))
        .flat_map(|p| p.log_lines())
        .filter(|l| l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("dedup hit")))
        .count() as u64;
    Ok(report)
}
