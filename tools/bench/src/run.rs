//! The phases of one run, in order, each on a clean database.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::ValueEnum as _;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

use crate::child::{Service, Usage};
use crate::error::BenchError;
use crate::figures::{Drain, EndToEnd, Figures, Point, ServiceUse};
use crate::load::{self, OrderClients};
use crate::measure::{self, Latencies};
use crate::observe::{Observer, Waits};
use crate::phases::{RELAY_STEP_LOG, RelayPhases, Stages};
use crate::plan::{Phase, Plan};
use crate::sql::{self, BenchDatabase};
use crate::sustain::Verdict as _;
use crate::timings;
use crate::{machine, raw, sustain};

mod capacity;
mod ordered;

struct Run<'a> {
    plan: &'a Plan,
    bench: &'a BenchDatabase,
    db: DatabaseConnection,
    figures: Figures,
    topics: Topics,
}

struct Topics {
    raw: String,
    relay: Vec<String>,
    e2e: String,
    floor: String,
    steady: String,
}

/// How a drain's relays meet their backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Claimable before the relays start: the first relay up has it to itself until the others
    /// are, which a long drain does not notice.
    Claimable,
    /// Written held back (`outbox_event.held_back`): the relays start, and once every one has
    /// written its port file every order's first version is released in one statement and the
    /// relays are woken, so that a drain of a few seconds is not decided by which relay started
    /// first.
    HeldBack,
}

/// How long a relay may take to start before the bench gives up.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// One drain of the pre-filled outbox by one or more relays.
struct Drained {
    drain: Drain,
    phases: RelayPhases,
    /// The relays' CPU, summed: published rows do not keep their owner, so the relays are
    /// accounted for together.
    cpu_seconds: f64,
    peak_rss_mib: f64,
}

impl Drained {
    fn usage(&self, phase: String) -> ServiceUse {
        ServiceUse {
            service: "idempost-relay".into(),
            phase,
            events: self.drain.events,
            cpu_seconds: self.cpu_seconds,
            peak_rss_mib: self.peak_rss_mib,
        }
    }
}

fn mib(usage: Usage) -> f64 {
    usage.peak_rss_kib as f64 / 1024.0
}

/// Runs every phase and returns the figures. The bench database is dropped whatever happens.
pub(crate) async fn run(plan: &Plan) -> Result<Figures, BenchError> {
    std::fs::create_dir_all(&plan.out_dir)?;
    let bench = BenchDatabase::create(&plan.database_url).await?;
    println!("bench database {} created and migrated", bench.name);
    let outcome = async {
        let db = sql::connect(&bench.url, 4).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let topics = Topics {
            raw: format!("idempost-bench-raw-{id}"),
            relay: RELAY_PROCESSES.iter().map(|n| format!("idempost-bench-relay{n}-{id}")).collect(),
            e2e: format!("idempost-bench-e2e-{id}"),
            floor: format!("idempost-bench-floor-{id}"),
            steady: format!("idempost-bench-steady-{id}"),
        };
        let named = [&topics.raw, &topics.e2e, &topics.floor, &topics.steady];
        for topic in named.into_iter().chain(&topics.relay) {
            idempost_verify::create_topic(&plan.brokers, topic, plan.partitions)
                .await
                .map_err(BenchError::Stuck)?;
        }
        let mut run = Run { plan, bench: &bench, db, figures: Figures::default(), topics };
        run.figures.machine = machine::describe(&run.db, plan).await;
        run.all().await?;
        run.db.close().await?;
        Ok::<_, BenchError>(run.figures)
    }
    .await;
    let dropped = bench.remove().await;
    let figures = outcome?;
    dropped?;
    Ok(figures)
}

impl Run<'_> {
    async fn all(&mut self) -> Result<(), BenchError> {
        let plan = self.plan;
        if plan.runs(Phase::Consumer) && !plan.runs(Phase::Relay) {
            return Err(BenchError::Stuck(
                "the consumer phase reads what the relay phase published: add relay".into(),
            ));
        }
        if plan.runs(Phase::RawCommit) {
            self.raw_commit().await?;
        }
        if plan.runs(Phase::Submit) {
            self.submit_order().await?;
        }
        if plan.runs(Phase::Group) {
            self.figures.group = crate::group::measure(plan, &self.bench.url, &self.db).await?;
        }
        if plan.runs(Phase::RawInsert) {
            self.raw_insert().await?;
        }
        if plan.runs(Phase::RawProduce) {
            self.raw_produce().await?;
        }
        if plan.runs(Phase::RawClaimMark) {
            self.raw_claim_mark().await?;
        } else if plan.runs(Phase::Relay) {
            step(&format!("pre-filling the outbox with {} events", plan.backlog));
            raw::prefill(&self.db, plan.backlog).await?;
        }
        if plan.runs(Phase::Relay) {
            for (n, processes) in RELAY_PROCESSES.into_iter().enumerate() {
                self.relay(processes, n).await?;
            }
        }
        if plan.runs(Phase::Consumer) {
            self.consumer().await?;
        }
        if plan.runs(Phase::E2e) {
            self.end_to_end().await?;
        }
        if plan.runs(Phase::Floor) {
            self.floor().await?;
        }
        if plan.runs(Phase::SteadyRelay) {
            self.steady_relay().await?;
        }
        if plan.runs(Phase::Steady) {
            self.steady_pipeline().await?;
        }
        if plan.runs(Phase::Ordered) {
            self.ordered().await?;
        }
        if plan.runs(Phase::Soak) {
            let sustained = if self.figures.max_offered > 0.0 {
                self.figures.max_offered
            } else {
                plan.max_offered.unwrap_or(0.0)
            };
            self.figures.soak = Some(crate::soak::run(plan, &plan.soak, sustained).await?);
        }
        if plan.runs(Phase::Shards) {
            self.figures.shards = Some(crate::shards::run(plan).await?);
        }
        // Every phase planned ran: one that fails ends the run without a report.
        self.figures.ran =
            Phase::value_variants().iter().copied().filter(|&phase| plan.runs(phase)).collect();
        Ok(())
    }

    async fn observe(&self, phase: &str) -> Observer {
        step(phase);
        Observer::start(&self.db, &self.bench.name, phase).await
    }

    fn waited(&mut self, waits: Waits) {
        self.figures.waits.push(waits);
    }

    fn common_args(&self, topic: &str) -> Vec<String> {
        vec![
            format!("--database-url={}", self.bench.url),
            format!("--brokers={}", self.plan.brokers),
            format!("--topic={topic}"),
            "--listen=127.0.0.1:0".to_owned(),
        ]
    }

    fn start(&self, binary: &str, label: &str, args: Vec<String>) -> Result<Service, BenchError> {
        Service::start(&self.plan.bin_dir, binary, label, &args, &self.plan.out_dir)
    }

    async fn raw_commit(&mut self) -> Result<(), BenchError> {
        for &c in &self.plan.concurrencies.clone() {
            let observer = self.observe(&format!("raw commit @{c}")).await;
            let result = raw::commit(&self.bench.url, c, self.plan.point).await?;
            self.waited(observer.finish().await);
            self.figures.raw_commit.push(point(c, result));
            sql::truncate_all(&self.db).await?;
        }
        Ok(())
    }

    async fn submit_order(&mut self) -> Result<(), BenchError> {
        let port = free_port()?;
        let mut args = vec![
            format!("--database-url={}", self.bench.url),
            format!("--listen=127.0.0.1:{port}"),
            "--admin-listen=127.0.0.1:0".to_owned(),
        ];
        args.extend(self.plan.order_args.iter().cloned());
        let mut order = self.start("idempost-order", "order-submit", args)?;
        let clients = OrderClients::connect(&format!("http://127.0.0.1:{port}"), 4).await?;
        // One warm-up call: connections are opened lazily.
        clients.submit(0).await?;
        let before = order.usage();
        let mut events = 0;
        for &c in &self.plan.concurrencies.clone() {
            let observer = self.observe(&format!("SubmitOrder @{c}")).await;
            let shared = clients.clone();
            let result = load::closed_loop(c, self.plan.point, move |worker| {
                let clients = shared.clone();
                async move { clients.submit(worker).await.map(|_| ()) }
            })
            .await;
            self.waited(observer.finish().await);
            events += result.ok;
            if let Some(e) = &result.first_error {
                self.figures.notes.push(format!("SubmitOrder @{c}: {} errors, first: {e}", result.errors));
            }
            self.figures.submit.push(point(c, result));
            order.check_alive()?;
        }
        let usage = order.stop().await;
        self.figures.services.push(ServiceUse {
            service: "idempost-order".into(),
            phase: "SubmitOrder".into(),
            events,
            cpu_seconds: usage.cpu_seconds - before.cpu_seconds,
            peak_rss_mib: mib(usage),
        });
        sql::truncate_all(&self.db).await?;
        Ok(())
    }

    async fn raw_insert(&mut self) -> Result<(), BenchError> {
        let observer = self.observe("raw consumer insert").await;
        let result = raw::insert(&self.bench.url, self.plan.point).await?;
        self.waited(observer.finish().await);
        self.figures.raw_insert = point(1, result);
        sql::truncate_all(&self.db).await?;
        Ok(())
    }

    async fn raw_produce(&mut self) -> Result<(), BenchError> {
        step("raw produce");
        // As one relay (two loops of full batches) and as two: does the broker leave room for a
        // second relay?
        for producers in [1, 2] {
            let (confirmed, failed, elapsed) = raw::produce(
                &self.plan.brokers,
                &self.topics.raw,
                producers,
                2,
                RAW_CLAIM_BATCH as usize,
                self.plan.legacy_headers,
                self.plan.point,
            )
            .await?;
            if failed > 0 {
                self.figures.notes.push(format!("raw produce x{producers}: {failed} records not confirmed"));
            }
            let rate = measure::rate(confirmed, elapsed);
            if producers == 1 {
                self.figures.raw_produce = rate;
            } else {
                self.figures.raw_produce_two = rate;
            }
        }
        Ok(())
    }

    async fn raw_claim_mark(&mut self) -> Result<(), BenchError> {
        step(&format!("pre-filling the outbox with {} events", self.plan.backlog));
        raw::prefill(&self.db, self.plan.backlog).await?;
        let observer = self.observe("raw claim+mark").await;
        let mut result = raw::claim_and_mark(&self.bench.url, RAW_CLAIM_BATCH, self.plan.point).await?;
        self.waited(observer.finish().await);
        self.figures.raw_claim_mark = measure::rate(result.marked, result.elapsed);
        self.figures.raw_claim_mark_phases = RelayPhases {
            batches: result.batches,
            claimed: result.marked,
            claim: result.claim.summary(),
            record: result.mark.summary(),
            ..RelayPhases::default()
        };
        raw::reset_outbox(&self.db).await?;
        // Two workers at once, as two relays: does the database side scale out?
        let observer = self.observe("raw claim+mark x2").await;
        let url = self.bench.url.clone();
        let (a, b) = tokio::join!(
            raw::claim_and_mark(&url, RAW_CLAIM_BATCH, self.plan.point),
            raw::claim_and_mark(&url, RAW_CLAIM_BATCH, self.plan.point)
        );
        self.waited(observer.finish().await);
        let (a, b) = (a?, b?);
        self.figures.raw_claim_mark_two = measure::rate(a.marked + b.marked, a.elapsed.max(b.elapsed));
        raw::reset_outbox(&self.db).await?;
        Ok(())
    }

    /// Drains the pre-filled outbox with `processes` relays onto the `n`th relay topic; leaves
    /// every row PENDING again.
    async fn relay(&mut self, processes: usize, n: usize) -> Result<(), BenchError> {
        let topic = self.topics.relay[n].clone();
        let phase = format!("relay x{processes} drain");
        let drained = self.drain(processes, &topic, "relay", &phase, self.plan.backlog).await?;
        self.figures.services.push(drained.usage(format!("drain x{processes} (sum)")));
        self.figures.relay.push((processes, drained.drain));
        self.figures.relay_phases.push((processes, drained.phases));
        raw::reset_outbox(&self.db).await?;
        Ok(())
    }

    /// Starts `processes` relays on `topic` (logs `<label>-x<processes>-<n>.log`), waits until
    /// `target` outbox rows are PUBLISHED (or the drain stalls), and stops them.
    async fn drain(
        &mut self,
        processes: usize,
        topic: &str,
        label: &str,
        phase: &str,
        target: u64,
    ) -> Result<Drained, BenchError> {
        self.drain_from(Start::Claimable, processes, topic, label, phase, target).await
    }

    /// [`Run::drain`] of a backlog `start` says how to meet.
    async fn drain_from(
        &mut self,
        start: Start,
        processes: usize,
        topic: &str,
        label: &str,
        phase: &str,
        target: u64,
    ) -> Result<Drained, BenchError> {
        let observer = self.observe(phase).await;
        let mut started = Instant::now();
        let mut relays = Vec::new();
        let mut logs = Vec::new();
        let mut ready = Vec::new();
        for n in 1..=processes {
            let mut args = self.common_args(topic);
            args.extend(self.plan.relay_args.iter().cloned());
            let label = format!("{label}-x{processes}-{n}");
            logs.push(self.plan.out_dir.join(format!("{label}.log")));
            if start == Start::HeldBack {
                let (wake, ports) = (free_port()?, self.plan.out_dir.join(format!("{label}.ports")));
                // A file left by an earlier run would say "ready" before this relay is.
                let _ = std::fs::remove_file(&ports);
                args.push(format!("--wake-listen=127.0.0.1:{wake}"));
                args.push(format!("--port-file={}", ports.display()));
                ready.push((ports, wake));
            }
            relays.push(Service::start_with_env(
                &self.plan.bin_dir,
                "idempost-relay",
                &label,
                &args,
                &self.plan.out_dir,
                &RELAY_STEP_LOG,
            )?);
        }
        if start == Start::HeldBack {
            self.release_when_ready(&ready, &mut relays).await?;
            started = Instant::now();
        }
        let sql = "SELECT COUNT(*) FROM outbox_event WHERE status = 'PUBLISHED'";
        let complete = self.wait_for(sql, target, &mut relays).await?;
        let wall = started.elapsed();
        let mut usage = Vec::new();
        for relay in relays {
            usage.push(relay.stop().await);
        }
        self.waited(observer.finish().await);
        let (events, per_second) = span_rate(
            &self.db,
            "SELECT COUNT(*), MIN(published_at), MAX(published_at) FROM outbox_event WHERE status = 'PUBLISHED'",
        )
        .await?;
        let logs: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
        Ok(Drained {
            drain: Drain { events, per_second, wall_seconds: wall.as_secs_f64(), complete },
            phases: RelayPhases::from_logs(&logs),
            cpu_seconds: usage.iter().map(|u| u.cpu_seconds).sum(),
            peak_rss_mib: usage.iter().map(|u| mib(*u)).fold(0.0, f64::max),
        })
    }

    /// Waits until every relay of `ready` (its port file, its wake-up port) has written its port
    /// file (connected to the database, created its producer, bound its ports), then releases
    /// every order's first version in one statement and wakes the relays, so that they all meet
    /// the backlog at once.
    async fn release_when_ready(
        &self,
        ready: &[(PathBuf, u16)],
        relays: &mut [Service],
    ) -> Result<(), BenchError> {
        let deadline = Instant::now() + READY_LIMIT;
        while !ready.iter().all(|(ports, _)| ports.exists()) {
            if Instant::now() > deadline {
                return Err(BenchError::Stuck(format!("a relay did not start in {READY_LIMIT:?}")));
            }
            for relay in relays.iter_mut() {
                relay.check_alive()?;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        sql::release_first_versions(&self.db).await?;
        let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
        for (_, wake) in ready {
            socket.send_to(idempost::contract::WAKE_DATAGRAM, ("127.0.0.1", *wake))?;
        }
        Ok(())
    }

    async fn consumer(&mut self) -> Result<(), BenchError> {
        step("raw consume (no database)");
        let (read, elapsed) =
            raw::consume(&self.plan.brokers, &self.topics.relay[0], self.plan.backlog, self.plan.drain_limit)
                .await?;
        self.figures.raw_consume = measure::rate(read.saturating_sub(1), elapsed);
        sql::truncate_all(&self.db).await?;
        let observer = self.observe("consumer drain").await;
        let started = Instant::now();
        let mut args = self.common_args(&self.topics.relay[0]);
        args.push(format!("--group-id=idempost-bench-{}", uuid::Uuid::new_v4().simple()));
        args.extend(self.plan.consumer_args.iter().cloned());
        let consumer = self.start("idempost-consumer", "consumer-drain", args)?;
        let mut services = vec![consumer];
        let complete =
            self.wait_for("SELECT COUNT(*) FROM notification_job", self.plan.backlog, &mut services).await?;
        let wall = started.elapsed();
        let mut usage = Usage::default();
        for service in services {
            usage = service.stop().await;
        }
        self.waited(observer.finish().await);
        let (events, per_second) =
            span_rate(&self.db, "SELECT COUNT(*), MIN(created_at), MAX(created_at) FROM notification_job")
                .await?;
        self.figures.consumer = Drain { events, per_second, wall_seconds: wall.as_secs_f64(), complete };
        self.figures.services.push(ServiceUse {
            service: "idempost-consumer".into(),
            phase: "drain".into(),
            events,
            cpu_seconds: usage.cpu_seconds,
            peak_rss_mib: mib(usage),
        });
        Ok(())
    }

    /// Polls `count_sql` until it reaches `target`, the drain limit passes, nothing moves for
    /// [`STALL`], or a service dies.
    async fn wait_for(
        &self,
        count_sql: &str,
        target: u64,
        services: &mut [Service],
    ) -> Result<bool, BenchError> {
        let deadline = Instant::now() + self.plan.drain_limit;
        let (mut last, mut moved) = (-1, Instant::now());
        loop {
            let n = sql::count(&self.db, count_sql).await?;
            if u64::try_from(n).unwrap_or(0) >= target {
                return Ok(true);
            }
            if n != last {
                (last, moved) = (n, Instant::now());
            }
            if Instant::now() > deadline || moved.elapsed() > STALL {
                return Ok(false);
            }
            for service in services.iter_mut() {
                service.check_alive()?;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn end_to_end(&mut self) -> Result<(), BenchError> {
        sql::truncate_all(&self.db).await?;
        let best_submit = self.figures.submit.iter().map(|p| p.per_second).fold(0.0, f64::max);
        let relay_one = self.figures.relay.first().map_or(0.0, |(_, d)| d.per_second);
        let stages = if let Some(given) = self.plan.max_offered {
            self.figures.notes.push(format!("max offered load = {given:.0}/s, as given (--max-offered)"));
            given
        } else {
            let least = best_submit.min(relay_one).min(self.figures.consumer.per_second);
            self.figures.notes.push(format!(
                "least stage alone = min(best SubmitOrder {best_submit:.0}/s, relay x1 {relay_one:.0}/s, consumer {:.0}/s) = {least:.0}/s",
                self.figures.consumer.per_second
            ));
            least
        };
        self.figures.stages_max = stages;
        if stages < 1.0 {
            self.figures
                .notes
                .push("end to end skipped: a stage measured no throughput (see its log)".into());
            return Ok(());
        }

        let (clients, mut services) = self.start_pipeline(&self.topics.e2e.clone(), "e2e").await?;
        let mut events = 1;
        let max = if self.plan.max_offered.is_some() {
            stages
        } else {
            let sustained = self.sustained(&clients, stages, &mut events, &mut services).await?;
            self.figures.notes.push(format!(
                "max offered load = min(least stage alone {stages:.0}/s, whole pipeline sustained {sustained:.0}/s) = {:.0}/s",
                stages.min(sustained)
            ));
            stages.min(sustained)
        };
        self.figures.max_offered = max;
        let before: Vec<Usage> = services.iter().map(Service::usage).collect();

        let levels = [
            ("25%", max * 0.25, self.plan.e2e),
            ("50%", max * 0.5, self.plan.e2e),
            ("75%", max * 0.75, self.plan.e2e),
            ("trickle", 1.0, self.plan.trickle),
        ];
        for (label, rate, duration) in levels {
            let relay_log = self.plan.out_dir.join("relay-e2e.log");
            let logged_before = RelayPhases::lines(&relay_log);
            let observer = self.observe(&format!("e2e {label} ({rate:.0}/s)")).await;
            let (sent, failed, first_error) = load::open_loop(&clients, rate.max(1.0), duration).await;
            if let Some(e) = first_error {
                self.figures
                    .notes
                    .push(format!("e2e {label}: {failed} SubmitOrder calls failed, first: {e}"));
            }
            events += sent.len() as u64;
            let target = events;
            let _ = self.wait_for("SELECT COUNT(*) FROM notification_job", target, &mut services).await?;
            self.waited(observer.finish().await);
            let committed = self.jobs().await?;
            let mut latencies = Latencies::default();
            let (mut accept, mut relay, mut consume) =
                (Latencies::default(), Latencies::default(), Latencies::default());
            let mut missing = 0;
            let mut level = Vec::with_capacity(sent.len());
            for s in &sent {
                match committed.get(&s.event_id) {
                    Some(&(created, published, consumed)) => {
                        let sent_us = s.at_micros();
                        let ms = (consumed - sent_us) as f64 / 1000.0;
                        latencies.push_ms(ms);
                        level.push((sent_us, ms));
                        accept.push_ms((created - sent_us) as f64 / 1000.0);
                        // A consumer may write its job before the relay's mark lands.
                        if let Some(published) = published {
                            relay.push_ms((published - created) as f64 / 1000.0);
                            consume.push_ms((consumed - published) as f64 / 1000.0);
                        }
                    }
                    None => missing += 1,
                }
            }
            let csv = self.plan.out_dir.join(format!("e2e-{}.csv", label.trim_end_matches('%')));
            if let Err(e) = timings::write(&csv, &sent, &committed) {
                self.figures.notes.push(format!("e2e {label}: could not write {}: {e}", csv.display()));
            }
            let stages =
                Stages { accept: accept.summary(), relay: relay.summary(), consume: consume.summary() };
            let latency = latencies.summary();
            self.figures.e2e.push(EndToEnd {
                label: label.to_owned(),
                offered_per_second: rate,
                accepted: sent.len() as u64,
                failed,
                missing,
                latency,
                tail: timings::bunching(&level, latency.p99),
                stages,
                relay: RelayPhases::from_log_after(&relay_log, logged_before),
            });
        }
        let names = ["idempost-order", "idempost-relay", "idempost-consumer"];
        for ((service, name), before) in services.into_iter().zip(names).zip(before) {
            let usage = service.stop().await;
            self.figures.services.push(ServiceUse {
                service: name.into(),
                phase: "end to end".into(),
                events,
                cpu_seconds: usage.cpu_seconds - before.cpu_seconds,
                peak_rss_mib: mib(usage),
            });
        }
        self.figures.services.sort_by(|a, b| a.service.cmp(&b.service));
        Ok(())
    }

    /// Starts order service, relay (with wake-ups) and consumer on `topic`, sends one warm-up
    /// order through the whole path (so the consumer has joined its group), and returns
    /// clients of the order service and the services, in that order.
    async fn start_pipeline(
        &mut self,
        topic: &str,
        label: &str,
    ) -> Result<(OrderClients, Vec<Service>), BenchError> {
        let port = free_port()?;
        // Wake-ups on, as a deployment that cares about latency runs them.
        let wake = free_port()?;
        let mut order_args = vec![
            format!("--database-url={}", self.bench.url),
            format!("--listen=127.0.0.1:{port}"),
            "--admin-listen=127.0.0.1:0".to_owned(),
            format!("--wake-relays=127.0.0.1:{wake}"),
        ];
        order_args.extend(self.plan.order_args.iter().cloned());
        let mut relay_args = self.common_args(topic);
        relay_args.push(format!("--wake-listen=127.0.0.1:{wake}"));
        relay_args.extend(self.plan.relay_args.iter().cloned());
        let mut consumer_args = self.common_args(topic);
        consumer_args.push(format!("--group-id=idempost-bench-{}", uuid::Uuid::new_v4().simple()));
        consumer_args.extend(self.plan.consumer_args.iter().cloned());
        let mut services = vec![
            self.start("idempost-order", &format!("order-{label}"), order_args)?,
            Service::start_with_env(
                &self.plan.bin_dir,
                "idempost-relay",
                &format!("relay-{label}"),
                &relay_args,
                &self.plan.out_dir,
                &RELAY_STEP_LOG,
            )?,
            self.start("idempost-consumer", &format!("consumer-{label}"), consumer_args)?,
        ];
        let clients = OrderClients::connect(&format!("http://127.0.0.1:{port}"), 4).await?;
        step(&format!("{label}: warm-up order (consumer group join)"));
        clients.submit(0).await?;
        self.wait_for("SELECT COUNT(*) FROM notification_job", 1, &mut services).await?;
        Ok((clients, services))
    }

    /// Searches the highest rate the three services keep up with together (see [`sustain`]),
    /// each probe an open loop of one throughput point's length, the backlog drained after it.
    async fn sustained(
        &mut self,
        clients: &OrderClients,
        upper: f64,
        events: &mut u64,
        services: &mut [Service],
    ) -> Result<f64, BenchError> {
        const JOBS: &str = "SELECT COUNT(*) FROM notification_job";
        let mut probes = Vec::new();
        while let Some(rate) = sustain::next(upper, &probes) {
            let observer = self.observe(&format!("pipeline {rate:.0}/s")).await;
            let jobs_before = sql::count(&self.db, JOBS).await?;
            let started = Instant::now();
            let (sent, failed, first_error) = load::open_loop(clients, rate, self.plan.point).await;
            let jobs_after = sql::count(&self.db, JOBS).await?;
            let probe = sustain::Probe {
                offered: rate,
                sent: sent.len() as u64,
                failed,
                delivered: u64::try_from(jobs_after - jobs_before).unwrap_or(0),
                seconds: started.elapsed().as_secs_f64(),
            };
            *events += probe.sent;
            let drained = self.wait_for(JOBS, *events, services).await?;
            self.waited(observer.finish().await);
            self.figures.notes.push(format!(
                "whole pipeline at {rate:.0}/s: {} accepted, {failed} failed{}, {:.0}/s consumed while it ran: {}",
                probe.sent,
                first_error.map(|e| format!(" (first: {e})")).unwrap_or_default(),
                probe.delivered_per_second(),
                if probe.kept_up() { "kept up" } else { "fell behind" }
            ));
            probes.push(probe);
            if !drained {
                self.figures.notes.push(format!("the pipeline did not drain after the probe at {rate:.0}/s"));
                break;
            }
        }
        self.figures.pipeline = probes.clone();
        Ok(sustain::sustained(&probes))
    }

    /// Every notification job's event id with, in microseconds since the epoch, its outbox
    /// row's `created_at` and `published_at` (none while its mark is still to come) and the
    /// job's `created_at`.
    async fn jobs(&self) -> Result<timings::Committed, BenchError> {
        let backend = self.db.get_database_backend();
        let rows = self
            .db
            .query_all_raw(Statement::from_string(
                backend,
                "SELECT j.event_id, o.created_at, o.published_at, j.created_at \
                 FROM notification_job j JOIN outbox_event o ON o.event_id = j.event_id",
            ))
            .await?;
        let mut jobs = HashMap::with_capacity(rows.len());
        for row in rows {
            let id: String = row.try_get_by_index(0)?;
            let micros = |i| sql::time_at(&row, i).map(|at| at.timestamp_micros());
            jobs.insert(id.trim().to_owned(), (micros(1)?, micros(2).ok(), micros(3)?));
        }
        Ok(jobs)
    }
}

/// The relay drains: this many relay processes each.
const RELAY_PROCESSES: [usize; 3] = [1, 2, 4];

/// Events per claim of the plain-SQL claim+mark: the relay's largest default batch, which its
/// claims grow to while a backlog exists.
const RAW_CLAIM_BATCH: u64 = 500;

/// How long a drain may make no progress before it counts as stuck.
const STALL: Duration = Duration::from_secs(120);

fn step(phase: &str) {
    println!("== {phase} (load {:.2})", crate::observe::load_average());
}

fn point(concurrency: usize, mut result: load::LoopResult) -> Point {
    Point {
        concurrency,
        per_second: measure::rate(result.ok, result.elapsed),
        latency: result.latencies.summary(),
        errors: result.errors,
    }
}

/// Events and their rate between the first and the last timestamp (`COUNT, MIN, MAX`).
async fn span_rate(db: &DatabaseConnection, sql: &str) -> Result<(u64, f64), BenchError> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await?
        .ok_or_else(|| BenchError::Stuck(format!("no answer to {sql}")))?;
    let count = u64::try_from(row.try_get_by_index::<i64>(0)?).unwrap_or(0);
    if count < 2 {
        return Ok((count, 0.0));
    }
    let span = sql::time_at(&row, 2)? - sql::time_at(&row, 1)?;
    let span = span.to_std().unwrap_or_default();
    Ok((count, measure::rate(count - 1, span)))
}

fn free_port() -> Result<u16, BenchError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
