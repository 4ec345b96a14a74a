//! The soak's run on its private server: the floor at the soak's rate, then the whole pipeline
//! through the three stages, sampled every [`WINDOW`].

use std::time::{Duration, Instant};

use chrono::Utc;
use idempost_testkit::private_db::PrivateServer;
use sea_orm::DatabaseConnection;

use super::hold;
use super::retention::{self, PURGE_LOG};
use super::sample::{self, Sampler};
use super::{Soak, Stage, StageLatency, WINDOW, server, stage_at};
use crate::child::Service;
use crate::error::BenchError;
use crate::floor::{self, Role};
use crate::load::{self, OrderClients};
use crate::measure::{Latencies, Percentiles};
use crate::phases::RELAY_STEP_LOG;
use crate::plan::Plan;
use crate::sql::{self, BenchDatabase};

const JOBS: &str = "SELECT COUNT(*) FROM notification_job";

/// Retention at Idempost's default horizons scaled down, one day to 60/7 s (the outbox's 7 days
/// to 60 s): outbox rows 60 s after publishing, the redelivery horizon 120 s (14 days), dedup
/// rows 257 s (30 days). Each service purges every 10 s (the default hour would scale to 0.4 s,
/// a statement of 100 rows; 10 s makes each purge delete a few thousand, in the default batches
/// of 500, once per sample).
const ORDER_RETENTION: [&str; 2] = ["--outbox-retention=60s", "--purge-every=10s"];
const CONSUMER_RETENTION: [&str; 3] =
    ["--redelivery-horizon=120s", "--consumed-retention=257s", "--purge-every=10s"];

/// How long the floor runs at the soak's rate (at most one stage).
const FLOOR: Duration = Duration::from_secs(60);

/// How long the pipeline may take to catch up after the load ends.
const DRAIN: Duration = Duration::from_secs(300);

/// The soak's database on the private server, and what it runs there.
pub(super) struct Session<'a> {
    plan: &'a Plan,
    url: String,
    db: DatabaseConnection,
    server_pid: Option<u32>,
    server_settings: String,
    id: String,
}

impl<'a> Session<'a> {
    pub(super) async fn open(
        plan: &'a Plan,
        bench: &BenchDatabase,
        server: &PrivateServer,
    ) -> Result<Self, BenchError> {
        Ok(Self {
            plan,
            url: bench.url.clone(),
            db: sql::connect(&bench.url, 4).await?,
            server_pid: server.pid(),
            server_settings: server.settings(),
            id: uuid::Uuid::new_v4().simple().to_string(),
        })
    }

    pub(super) async fn close(self) {
        let _ = self.db.close().await;
    }

    async fn topic(&self, name: &str) -> Result<String, BenchError> {
        let topic = format!("idempost-bench-soak-{name}-{}", self.id);
        idempost_verify::create_topic(&self.plan.brokers, &topic, self.plan.partitions)
            .await
            .map_err(BenchError::Stuck)?;
        Ok(topic)
    }

    /// The floor, then the soak.
    pub(super) async fn soak(
        &mut self,
        shape: &crate::plan::SoakShape,
        rate: f64,
        rate_source: String,
    ) -> Result<Soak, BenchError> {
        let mut settings = vec![("server command line".to_owned(), self.server_settings.clone())];
        settings.extend(server::settings(&self.db).await);
        let floor_for = FLOOR.min(shape.stage);
        step(&format!("soak: raw floor at {rate:.0}/s for {floor_for:?}"));
        let floor = self.floor(rate, floor_for).await?;
        sql::truncate_all(&self.db).await?;
        let mut soak = Soak {
            settings,
            rate,
            rate_source,
            stage_seconds: shape.stage.as_secs_f64(),
            hold_seconds: shape.hold.as_secs_f64(),
            retention: format!(
                "order service {}; consumer {}",
                ORDER_RETENTION.join(" "),
                CONSUMER_RETENTION.join(" ")
            ),
            floor,
            ..Soak::default()
        };
        self.stages(shape, &mut soak).await?;
        Ok(soak)
    }

    /// The raw pipeline's parts (see [`crate::floor`]) at `rate` for `duration`: their publish
    /// and consume lags.
    async fn floor(&self, rate: f64, duration: Duration) -> Result<(Percentiles, Percentiles), BenchError> {
        let topic = self.topic("floor").await?;
        let exe = std::env::current_exe()?;
        let dir = exe.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        let binary = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut parts = Vec::new();
        for role in [Role::Relay, Role::Consumer] {
            let args = vec![
                format!("--floor-role={}", role.name()),
                format!("--database-url={}", self.url),
                format!("--brokers={}", self.plan.brokers),
                format!("--floor-topic={topic}"),
            ];
            parts.push(Service::start(
                &dir,
                &binary,
                &format!("soak-floor-{}", role.name()),
                &args,
                &self.plan.out_dir,
            )?);
        }
        let writer = sql::connect(&self.url, 16).await?;
        floor::offer(&writer, 1.0, Duration::from_secs(1)).await;
        self.wait_for(1, &mut parts, DRAIN).await?;
        let from = Utc::now();
        let (sent, _) = floor::offer(&writer, rate, duration).await;
        let to = Utc::now();
        self.wait_for(1 + sent, &mut parts, DRAIN).await?;
        let mut lags = sample::lags(&self.db, from, to, Utc::now()).await?;
        for part in parts {
            part.stop().await;
        }
        writer.close().await?;
        Ok((lags.publish.summary(), lags.consume.summary()))
    }

    /// Polls the jobs until there are `target`, `limit` passes or a service dies.
    async fn wait_for(
        &self,
        target: u64,
        services: &mut [Service],
        limit: Duration,
    ) -> Result<bool, BenchError> {
        let deadline = Instant::now() + limit;
        loop {
            if u64::try_from(sql::count(&self.db, JOBS).await?).unwrap_or(0) >= target {
                return Ok(true);
            }
            if Instant::now() > deadline {
                return Ok(false);
            }
            for service in services.iter_mut() {
                service.check_alive()?;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Order service and consumer (their retention runs logged), relay (its batches logged),
    /// with retention on; one warm-up order through the whole path.
    async fn start_pipeline(&self, topic: &str) -> Result<(OrderClients, Vec<Service>), BenchError> {
        let free = || Ok::<_, BenchError>(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
        let (port, wake) = (free()?, free()?);
        let mut order = vec![
            format!("--database-url={}", self.url),
            format!("--listen=127.0.0.1:{port}"),
            "--admin-listen=127.0.0.1:0".to_owned(),
            format!("--wake-relays=127.0.0.1:{wake}"),
        ];
        order.extend(ORDER_RETENTION.map(str::to_owned));
        order.extend(self.plan.order_args.iter().cloned());
        let common = [
            format!("--database-url={}", self.url),
            format!("--brokers={}", self.plan.brokers),
            format!("--topic={topic}"),
            "--listen=127.0.0.1:0".to_owned(),
        ];
        let mut relay = common.to_vec();
        relay.push(format!("--wake-listen=127.0.0.1:{wake}"));
        relay.extend(self.plan.relay_args.iter().cloned());
        let mut consumer = common.to_vec();
        consumer.push(format!("--group-id=idempost-bench-soak-{}", self.id));
        consumer.extend(CONSUMER_RETENTION.map(str::to_owned));
        consumer.extend(self.plan.consumer_args.iter().cloned());
        let (bin, out) = (&self.plan.bin_dir, &self.plan.out_dir);
        let mut services = vec![
            Service::start_with_env(bin, "idempost-order", "soak-order", &order, out, &PURGE_LOG)?,
            Service::start_with_env(bin, "idempost-relay", "soak-relay", &relay, out, &RELAY_STEP_LOG)?,
            Service::start_with_env(bin, "idempost-consumer", "soak-consumer", &consumer, out, &PURGE_LOG)?,
        ];
        let clients = OrderClients::connect(&format!("http://127.0.0.1:{port}"), 4).await?;
        step("soak: warm-up order (consumer group join)");
        clients.submit(0).await?;
        self.wait_for(1, &mut services, DRAIN).await?;
        Ok((clients, services))
    }

    /// The three stages under load, sampled every window; then the drain.
    async fn stages(&self, shape: &crate::plan::SoakShape, soak: &mut Soak) -> Result<(), BenchError> {
        let topic = self.topic("pipeline").await?;
        let (clients, mut services) = self.start_pipeline(&topic).await?;
        let total = shape.total();
        let rate = soak.rate;
        step(&format!(
            "soak: {rate:.0}/s for {total:?}: {:?}, held {:?}, {:?}",
            shape.stage, shape.hold, shape.stage
        ));
        let server_before = self.server_pid.map_or(0.0, server::cpu_seconds);
        let started = (Utc::now(), tokio::time::Instant::now());
        let load = tokio::spawn(async move { load::open_loop(&clients, rate, total).await });
        let holder = hold::schedule(self.url.clone(), started.1, shape.held());
        let pooled = self.sample_stages(&mut services, started, shape, soak).await?;
        let (sent, failed, first_error) =
            load.await.map_err(|e| BenchError::Stuck(format!("the soak's load: {e}")))?;
        holder.await.map_err(|e| BenchError::Stuck(format!("the snapshot holder: {e}")))??;
        if let Some(e) = first_error {
            soak.notes.push(format!("{failed} SubmitOrder calls failed, first: {e}"));
        }
        (soak.accepted, soak.failed) = (sent.len() as u64, failed);
        if !self.wait_for(1 + soak.accepted, &mut services, DRAIN).await? {
            soak.notes.push(format!("the pipeline did not catch up within {DRAIN:?} after the load"));
        }
        let mut cpu = [0.0; 4];
        for (i, service) in services.into_iter().enumerate() {
            cpu[i] = service.stop().await.cpu_seconds;
        }
        cpu[3] = self.server_pid.map_or(0.0, server::cpu_seconds) - server_before;
        let per_1000 = 1000.0 / (soak.accepted.max(1) as f64);
        soak.cpu_per_1000 = cpu.map(|seconds| seconds * per_1000);
        let logs = ["soak-order.log", "soak-consumer.log"].map(|log| self.plan.out_dir.join(log));
        let end = soak.windows.last().map_or(0.0, |w| w.sampled_at);
        soak.purges = retention::read(&logs.each_ref().map(|p| p.as_path()), started.0, end);
        soak.stages = summarise(&soak.windows, pooled);
        soak.recovered_after = recovered_after(soak);
        Ok(())
    }

    /// Samples every window of the load that began at `started` (the clock and the timer) into
    /// `soak.windows`; returns each stage's lags pooled.
    async fn sample_stages(
        &self,
        services: &mut [Service],
        (t0, started): (chrono::DateTime<Utc>, tokio::time::Instant),
        shape: &crate::plan::SoakShape,
        soak: &mut Soak,
    ) -> Result<Vec<(Stage, Latencies, Latencies)>, BenchError> {
        let total = shape.total();
        let mut sampler = Sampler::new(self.plan.out_dir.join("soak-relay.log"), services, self.server_pid);
        let mut pooled: Vec<(Stage, Latencies, Latencies)> =
            Stage::ALL.iter().map(|s| (*s, Latencies::default(), Latencies::default())).collect();
        let windows = (total.as_secs_f64() / WINDOW.as_secs_f64()).ceil() as u32;
        for k in 1..=windows {
            // The window's events had a whole window to get through before they are judged.
            tokio::time::sleep_until(started + WINDOW * (k + 1)).await;
            let (from, to) = (WINDOW * (k - 1), (WINDOW * k).min(total));
            let stage_of = stage_at(from.as_secs_f64() + WINDOW.as_secs_f64() / 2.0, shape);
            let at = |d: Duration| t0 + chrono::Duration::from_std(d).unwrap_or_default();
            let (window, lags) =
                sampler.take(&self.db, services, (at(from), at(to)), to.as_secs_f64(), stage_of).await?;
            println!("{}", super::report::progress(&window));
            if let Some((_, publish, consume)) = pooled.iter_mut().find(|(s, _, _)| *s == stage_of) {
                publish.extend(lags.publish);
                consume.extend(lags.consume);
            }
            soak.windows.push(window);
            for service in services.iter_mut() {
                service.check_alive()?;
            }
        }
        Ok(pooled)
    }
}

/// Each stage's pooled latencies and its worst windows.
fn summarise(
    windows: &[super::Window],
    pooled: Vec<(Stage, Latencies, Latencies)>,
) -> Vec<(Stage, StageLatency)> {
    pooled
        .into_iter()
        .map(|(stage, mut publish, mut consume)| {
            let of_stage = || windows.iter().filter(move |w| w.stage == Some(stage));
            let most = |f: fn(&super::Window) -> f64| of_stage().map(f).fold(0.0, f64::max);
            let median = |f: fn(&super::Window) -> f64| {
                let mut values = Latencies::default();
                of_stage().filter(|w| w.batches > 0).for_each(|w| values.push_ms(f(w)));
                values.percentile(50.0)
            };
            (
                stage,
                StageLatency {
                    publish: publish.summary(),
                    consume: consume.summary(),
                    worst_publish_p99: most(|w| w.publish.p99),
                    worst_consume_p99: most(|w| w.consume.p99),
                    claim_p50: median(|w| w.claim.p50),
                    mark_p50: median(|w| w.mark.p50),
                    peak_backlog: of_stage().map(|w| w.backlog).max().unwrap_or(0),
                },
            )
        })
        .collect()
}

/// Seconds from the release until the first window whose publish p99 was within 1.5x the
/// baseline's again (counted to that window's end).
fn recovered_after(soak: &Soak) -> Option<f64> {
    let baseline = soak.stages.iter().find(|(s, _)| *s == Stage::Baseline)?.1.publish.p99;
    let released_at = soak.stage_seconds + soak.hold_seconds;
    soak.windows
        .iter()
        .filter(|w| w.stage == Some(Stage::Released) && w.events > 0)
        .find(|w| w.publish.p99 <= 1.5 * baseline)
        .map(|w| w.at - released_at)
}

fn step(what: &str) {
    println!("== {what} (load {:.2})", crate::observe::load_average());
}
