//! The capacity phases: the raw-pipeline floor's sustained rate (see [`crate::floor`]) and the
//! steady rate with a bounded backlog (see [`crate::steady`]), relay alone and whole pipeline.

use std::time::Instant;

use super::{Run, step};
use crate::child::{Service, Usage};
use crate::error::BenchError;
use crate::figures::ServiceUse;
use crate::floor::{self, Role};
use crate::load;
use crate::sql;
use crate::steady;
use crate::sustain::{self, Verdict as _};

const JOBS: &str = "SELECT COUNT(*) FROM notification_job";

/// The upper bound of a search when no stage was measured and none was given.
const DEFAULT_UPPER: f64 = 2_000.0;

impl Run<'_> {
    /// The first rate a search offers: `--max-offered`, else `measured` if any, else a default.
    fn upper(&mut self, measured: f64, what: &str) -> f64 {
        let upper = self.plan.max_offered.unwrap_or(if measured >= 1.0 { measured } else { DEFAULT_UPPER });
        self.figures.notes.push(format!("{what}: searched from {upper:.0}/s"));
        upper
    }

    fn start_floor_part(&self, role: Role) -> Result<Service, BenchError> {
        let exe = std::env::current_exe()?;
        let dir = exe.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        let binary = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let args = vec![
            format!("--floor-role={}", role.name()),
            format!("--database-url={}", self.bench.url),
            format!("--brokers={}", self.plan.brokers),
            format!("--floor-topic={}", self.topics.floor),
        ];
        Service::start(&dir, &binary, &format!("floor-{}", role.name()), &args, &self.plan.out_dir)
    }

    /// The raw pipeline's sustained rate, searched as the pipeline's is ([`sustain`]), with the
    /// CPU its parts used per event.
    pub(super) async fn floor(&mut self) -> Result<(), BenchError> {
        sql::truncate_all(&self.db).await?;
        let pipeline = sustain::sustained(&self.figures.pipeline);
        let upper = self.upper(pipeline.max(self.figures.stages_max), "raw-pipeline floor");
        let writer = sql::connect(&self.bench.url, 16).await?;
        let mut parts = vec![self.start_floor_part(Role::Relay)?, self.start_floor_part(Role::Consumer)?];
        step("raw floor: warm-up order (consumer group join)");
        floor::offer(&writer, 1.0, std::time::Duration::from_secs(1)).await;
        self.wait_for(JOBS, 1, &mut parts).await?;
        let before: Vec<Usage> = parts.iter().map(Service::usage).collect();
        let own_before = Usage::of(std::process::id()).unwrap_or_default();
        let mut events = 1;
        let mut probes = Vec::new();
        while let Some(rate) = sustain::next(upper, &probes) {
            let observer = self.observe(&format!("raw floor {rate:.0}/s")).await;
            let jobs_before = sql::count(&self.db, JOBS).await?;
            let started = Instant::now();
            let (sent, failed) = floor::offer(&writer, rate, self.plan.point).await;
            let jobs_after = sql::count(&self.db, JOBS).await?;
            let probe = sustain::Probe {
                offered: rate,
                sent,
                failed,
                delivered: u64::try_from(jobs_after - jobs_before).unwrap_or(0),
                seconds: started.elapsed().as_secs_f64(),
            };
            events += sent;
            let drained = self.wait_for(JOBS, events, &mut parts).await?;
            self.waited(observer.finish().await);
            probes.push(probe);
            if !drained {
                self.figures
                    .notes
                    .push(format!("the raw floor did not drain after the probe at {rate:.0}/s"));
                break;
            }
        }
        let own = Usage::of(std::process::id()).unwrap_or_default();
        self.figures.services.push(ServiceUse {
            service: "raw writer (bench process)".into(),
            phase: "raw floor".into(),
            events,
            cpu_seconds: own.cpu_seconds - own_before.cpu_seconds,
            peak_rss_mib: 0.0,
        });
        for ((part, before), role) in parts.into_iter().zip(before).zip([Role::Relay, Role::Consumer]) {
            let usage = part.stop().await;
            self.figures.services.push(ServiceUse {
                service: format!("raw {}", role.name()),
                phase: "raw floor".into(),
                events,
                cpu_seconds: usage.cpu_seconds - before.cpu_seconds,
                peak_rss_mib: usage.peak_rss_kib as f64 / 1024.0,
            });
        }
        writer.close().await?;
        self.figures.floor = probes;
        sql::truncate_all(&self.db).await?;
        Ok(())
    }

    /// The relay alone: plain SQL order transactions at the offered rate, one relay publishing.
    pub(super) async fn steady_relay(&mut self) -> Result<(), BenchError> {
        sql::truncate_all(&self.db).await?;
        let relay_one = self.figures.relay.first().map_or(0.0, |(_, d)| d.per_second);
        let upper = self.upper(relay_one, "steady rate, relay alone");
        let writer = sql::connect(&self.bench.url, 16).await?;
        let mut args = self.common_args(&self.topics.steady);
        args.extend(self.plan.relay_args.iter().cloned());
        let mut relay = vec![self.start("idempost-relay", "relay-steady", args)?];
        let backlog = "SELECT COUNT(*) FROM outbox_event WHERE status <> 'PUBLISHED'";
        let published = "SELECT COUNT(*) FROM outbox_event WHERE status = 'PUBLISHED'";
        let mut events = 0;
        let mut probes = Vec::new();
        while let Some(rate) = sustain::next(upper, &probes) {
            let observer = self.observe(&format!("steady, relay alone, {rate:.0}/s")).await;
            let before = sql::count(&self.db, backlog).await?;
            let started = Instant::now();
            let (sent, failed) = floor::offer(&writer, rate, self.plan.steady).await;
            let probe = self.steady_probe(rate, sent, failed, before, backlog, started).await?;
            events += sent;
            let drained = self.wait_for(published, events, &mut relay).await?;
            self.waited(observer.finish().await);
            probes.push(probe);
            if !drained {
                break;
            }
        }
        for service in relay {
            service.stop().await;
        }
        writer.close().await?;
        self.figures.steady_relay = probes;
        sql::truncate_all(&self.db).await?;
        Ok(())
    }

    /// The whole pipeline: SubmitOrder at the offered rate, order service, relay and consumer.
    pub(super) async fn steady_pipeline(&mut self) -> Result<(), BenchError> {
        sql::truncate_all(&self.db).await?;
        let pipeline = sustain::sustained(&self.figures.pipeline);
        let upper = self.upper(pipeline.max(self.figures.stages_max), "steady rate, whole pipeline");
        // A topic of its own: the relay-alone probes published to `topics.steady`, and a consumer
        // reading those too counted their jobs against this phase's orders (a negative backlog,
        // every probe "steady").
        let topic = format!("{}-pipeline", self.topics.steady);
        idempost_verify::create_topic(&self.plan.brokers, &topic, self.plan.partitions)
            .await
            .map_err(BenchError::Stuck)?;
        let (clients, mut services) = self.start_pipeline(&topic, "steady").await?;
        // Accepted orders not yet consumed.
        let backlog = "SELECT (SELECT COUNT(*) FROM orders) - (SELECT COUNT(*) FROM notification_job)";
        let mut events = 1;
        let mut probes = Vec::new();
        while let Some(rate) = sustain::next(upper, &probes) {
            let observer = self.observe(&format!("steady, pipeline, {rate:.0}/s")).await;
            let before = sql::count(&self.db, backlog).await?;
            let started = Instant::now();
            let (sent, failed, _) = load::open_loop(&clients, rate, self.plan.steady).await;
            let sent = sent.len() as u64;
            let probe = self.steady_probe(rate, sent, failed, before, backlog, started).await?;
            events += sent;
            let drained = self.wait_for(JOBS, events, &mut services).await?;
            self.waited(observer.finish().await);
            probes.push(probe);
            if !drained {
                break;
            }
        }
        for service in services {
            service.stop().await;
        }
        self.figures.steady_pipeline = probes;
        sql::truncate_all(&self.db).await?;
        Ok(())
    }

    async fn steady_probe(
        &mut self,
        rate: f64,
        sent: u64,
        failed: u64,
        before: i64,
        backlog: &str,
        started: Instant,
    ) -> Result<steady::Probe, BenchError> {
        let after = sql::count(&self.db, backlog).await?;
        let probe = steady::Probe {
            offered: rate,
            sent,
            failed,
            backlog_before: u64::try_from(before).unwrap_or(0),
            backlog_after: u64::try_from(after).unwrap_or(0),
            seconds: started.elapsed().as_secs_f64(),
        };
        self.figures.notes.push(format!(
            "steady probe at {rate:.0}/s: {sent} written, {failed} failed, backlog {before} -> {after} ({:+.0}/s): {}",
            probe.growth_per_second(),
            if probe.kept_up() { "steady" } else { "growing" }
        ));
        Ok(probe)
    }
}
