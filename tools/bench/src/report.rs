//! The figures of one run: the printed table, the JSON file, and the targets met or missed.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::measure::Percentiles;
use crate::observe::Waits;

/// A throughput with its latencies.
#[derive(Debug, Clone, Default)]
pub(crate) struct Point {
    pub(crate) concurrency: usize,
    pub(crate) per_second: f64,
    pub(crate) latency: Percentiles,
    pub(crate) errors: u64,
}

/// Draining a fixed amount of work.
#[derive(Debug, Clone, Default)]
pub(crate) struct Drain {
    pub(crate) events: u64,
    /// From the first to the last event's database timestamp.
    pub(crate) per_second: f64,
    /// From the process start until the last event, seconds.
    pub(crate) wall_seconds: f64,
    pub(crate) complete: bool,
}

/// One end-to-end load level.
#[derive(Debug, Clone, Default)]
pub(crate) struct EndToEnd {
    pub(crate) label: String,
    pub(crate) offered_per_second: f64,
    pub(crate) accepted: u64,
    pub(crate) failed: u64,
    pub(crate) missing: u64,
    pub(crate) latency: Percentiles,
}

/// CPU and memory of one service over one phase.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServiceUse {
    pub(crate) service: String,
    pub(crate) phase: String,
    pub(crate) events: u64,
    pub(crate) cpu_seconds: f64,
    pub(crate) peak_rss_mib: f64,
}

impl ServiceUse {
    fn cpu_per_1000(&self) -> f64 {
        if self.events == 0 { 0.0 } else { self.cpu_seconds * 1000.0 / self.events as f64 }
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Figures {
    pub(crate) machine: Vec<(String, String)>,
    pub(crate) raw_commit: Vec<Point>,
    pub(crate) raw_produce: f64,
    pub(crate) raw_insert: Point,
    pub(crate) raw_claim_mark: f64,
    pub(crate) raw_consume: f64,
    pub(crate) submit: Vec<Point>,
    pub(crate) group: Vec<crate::group::GroupPoint>,
    pub(crate) relay: Vec<(usize, Drain)>,
    pub(crate) consumer: Drain,
    pub(crate) max_offered: f64,
    pub(crate) e2e: Vec<EndToEnd>,
    pub(crate) services: Vec<ServiceUse>,
    pub(crate) waits: Vec<Waits>,
    pub(crate) notes: Vec<String>,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

impl Figures {
    fn raw_commit_at(&self, c: usize) -> f64 {
        self.raw_commit.iter().find(|p| p.concurrency == c).map_or(0.0, |p| p.per_second)
    }

    fn submit_at(&self, c: usize) -> f64 {
        self.submit.iter().find(|p| p.concurrency == c).map_or(0.0, |p| p.per_second)
    }

    fn relay_one(&self) -> f64 {
        self.relay.iter().find(|(n, _)| *n == 1).map_or(0.0, |(_, d)| d.per_second)
    }

    /// (name, value, target, met)
    fn targets(&self) -> Vec<(String, String, String, bool)> {
        let mut out = Vec::new();
        let submit = ratio(self.submit_at(16), self.raw_commit_at(16));
        out.push((
            "SubmitOrder@16 / raw commit@16".into(),
            format!("{submit:.2}"),
            ">= 0.70".into(),
            submit >= 0.7,
        ));
        let relay_limit = self.raw_produce.min(self.raw_claim_mark);
        let relay = ratio(self.relay_one(), relay_limit);
        out.push((
            "relay x1 / min(raw produce, raw claim+mark)".into(),
            format!("{relay:.2}"),
            ">= 0.80".into(),
            relay >= 0.8,
        ));
        let consumer = ratio(self.consumer.per_second, self.raw_insert.per_second);
        out.push((
            "consumer / raw insert".into(),
            format!("{consumer:.2}"),
            ">= 0.70".into(),
            consumer >= 0.7,
        ));
        if let Some(e) = self.e2e.iter().find(|e| e.label == "25%") {
            out.push((
                "e2e at 25% p50 / p99".into(),
                format!("{:.1} / {:.1} ms", e.latency.p50, e.latency.p99),
                "<= 50 / 250 ms".into(),
                e.latency.p50 <= 50.0 && e.latency.p99 <= 250.0 && e.missing == 0,
            ));
        }
        if let Some(e) = self.e2e.iter().find(|e| e.label == "trickle") {
            out.push((
                "e2e trickle p50".into(),
                format!("{:.1} ms", e.latency.p50),
                "<= 50 ms".into(),
                e.latency.p50 <= 50.0 && e.missing == 0,
            ));
        }
        let mut services: Vec<&str> = self.services.iter().map(|s| s.service.as_str()).collect();
        services.dedup();
        for service in services {
            let peak = self
                .services
                .iter()
                .filter(|s| s.service == service)
                .map(|s| s.peak_rss_mib)
                .fold(0.0, f64::max);
            out.push((
                format!("peak RSS {service}"),
                format!("{peak:.1} MiB"),
                "<= 64 MiB".into(),
                peak <= 64.0,
            ));
        }
        out
    }

    /// The table printed at the end of a run (and pasted into the README).
    pub(crate) fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "machine");
        for (k, v) in &self.machine {
            let _ = writeln!(t, "  {k:<22} {v}");
        }
        let _ = writeln!(t, "\nmachine limits (plain SQL / bare producer, no Outpost code)");
        for p in &self.raw_commit {
            let _ = writeln!(
                t,
                "  raw order+outbox commit @{:<3} {:>9.0} tx/s   p50 {:>7.2} p95 {:>7.2} p99 {:>7.2} ms",
                p.concurrency, p.per_second, p.latency.p50, p.latency.p95, p.latency.p99
            );
        }
        let _ = writeln!(
            t,
            "  raw confirmed produce        {:>9.0} rec/s (idempotent, acks=all, batches of 100)",
            self.raw_produce
        );
        let _ = writeln!(
            t,
            "  raw consume, no database     {:>9.0} rec/s (one consumer, same topic; not a target input)",
            self.raw_consume
        );
        let _ = writeln!(t, "  raw claim+mark (1 worker)    {:>9.0} ev/s", self.raw_claim_mark);
        let _ = writeln!(
            t,
            "  raw consumer insert tx @1    {:>9.0} tx/s   p50 {:>7.2} p95 {:>7.2} p99 {:>7.2} ms",
            self.raw_insert.per_second,
            self.raw_insert.latency.p50,
            self.raw_insert.latency.p95,
            self.raw_insert.latency.p99
        );
        let _ = writeln!(t, "\nSubmitOrder over gRPC (outpost-order, 16 db connections)");
        for p in &self.submit {
            let _ = writeln!(
                t,
                "  concurrency {:<3}             {:>9.0} orders/s p50 {:>7.2} p95 {:>7.2} p99 {:>7.2} ms{}",
                p.concurrency,
                p.per_second,
                p.latency.p50,
                p.latency.p95,
                p.latency.p99,
                if p.errors > 0 { format!("  ({} errors)", p.errors) } else { String::new() }
            );
        }
        t.push_str(&crate::group::table(&self.group, &self.raw_commit));
        let _ = writeln!(t, "\nrelay: drain of a pre-filled backlog");
        for (n, d) in &self.relay {
            let _ = writeln!(
                t,
                "  {n} relay process(es)         {:>9.0} ev/s   {} events, {:.1} s from start{}",
                d.per_second,
                d.events,
                d.wall_seconds,
                if d.complete { "" } else { "  (INCOMPLETE: timed out)" }
            );
        }
        let _ = writeln!(t, "\nconsumer: a pre-filled topic");
        let _ = writeln!(
            t,
            "  1 consumer process           {:>9.0} ev/s   {} events, {:.1} s from start{}",
            self.consumer.per_second,
            self.consumer.events,
            self.consumer.wall_seconds,
            if self.consumer.complete { "" } else { "  (INCOMPLETE: timed out)" }
        );
        let _ = writeln!(
            t,
            "\nend to end: SubmitOrder sent -> notification_job written (max offered load {:.0}/s)",
            self.max_offered
        );
        for e in &self.e2e {
            let _ = writeln!(
                t,
                "  {:<8} {:>7.1}/s offered  p50 {:>8.1} p95 {:>8.1} p99 {:>8.1} ms  ({} accepted, {} failed, {} not consumed)",
                e.label,
                e.offered_per_second,
                e.latency.p50,
                e.latency.p95,
                e.latency.p99,
                e.accepted,
                e.failed,
                e.missing
            );
        }
        let _ = writeln!(t, "\nservices (real processes; /proc/PID/stat and VmHWM)");
        for s in &self.services {
            let _ = writeln!(
                t,
                "  {:<17} {:<20} {:>7} events  {:>7.2} CPU s  {:>6.3} CPU s/1000  peak RSS {:>6.1} MiB",
                s.service,
                s.phase,
                s.events,
                s.cpu_seconds,
                s.cpu_per_1000(),
                s.peak_rss_mib
            );
        }
        let _ = writeln!(t, "\nlock and connection waits per phase (server view of the bench database)");
        let _ = writeln!(
            t,
            "  {:<22} {:>9} {:>9} {:>6} {:>6} {:>7} {:>6} {:>6}",
            "phase", "lockwaits", "lock ms", "conns", "busy", "meanbsy", "lockwt", "load"
        );
        for w in &self.waits {
            let _ = writeln!(
                t,
                "  {:<22} {:>9} {:>9} {:>6} {:>6} {:>7.1} {:>6} {:>6.2}",
                w.phase,
                w.row_lock_waits,
                w.row_lock_ms,
                w.peak_connections,
                w.peak_busy,
                w.mean_busy,
                w.peak_lock_waiting,
                w.load_at_start
            );
        }
        let _ = writeln!(t, "\ntargets");
        for (name, value, target, met) in self.targets() {
            let _ = writeln!(t, "  {name:<44} {value:>16}  target {target:<15} {}", verdict(met));
        }
        if !self.notes.is_empty() {
            let _ = writeln!(t, "\nnotes");
            for n in &self.notes {
                let _ = writeln!(t, "  - {n}");
            }
        }
        t
    }

    /// The same figures as JSON.
    pub(crate) fn json(&self) -> Value {
        let point = |p: &Point| {
            json!({"concurrency": p.concurrency, "perSecond": p.per_second, "errors": p.errors,
                   "p50Ms": p.latency.p50, "p95Ms": p.latency.p95, "p99Ms": p.latency.p99, "samples": p.latency.samples})
        };
        let drain = |d: &Drain| json!({"events": d.events, "perSecond": d.per_second, "wallSeconds": d.wall_seconds, "complete": d.complete});
        json!({
            "machine": self.machine.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "raw": {
                "orderOutboxCommit": self.raw_commit.iter().map(point).collect::<Vec<_>>(),
                "confirmedProducePerSecond": self.raw_produce,
                "claimAndMarkPerSecond": self.raw_claim_mark,
                "consumeWithoutDatabasePerSecond": self.raw_consume,
                "consumerInsert": point(&self.raw_insert),
            },
            "submitOrder": self.submit.iter().map(point).collect::<Vec<_>>(),
            "groupCommit": crate::group::json(&self.group, &self.raw_commit),
            "relay": self.relay.iter().map(|(n, d)| json!({"processes": n, "drain": drain(d)})).collect::<Vec<_>>(),
            "consumer": drain(&self.consumer),
            "maxOfferedPerSecond": self.max_offered,
            "endToEnd": self.e2e.iter().map(|e| json!({
                "label": e.label, "offeredPerSecond": e.offered_per_second, "accepted": e.accepted,
                "failed": e.failed, "notConsumed": e.missing,
                "p50Ms": e.latency.p50, "p95Ms": e.latency.p95, "p99Ms": e.latency.p99})).collect::<Vec<_>>(),
            "services": self.services.iter().map(|s| json!({
                "service": s.service, "phase": s.phase, "events": s.events, "cpuSeconds": s.cpu_seconds,
                "cpuSecondsPer1000": s.cpu_per_1000(), "peakRssMiB": s.peak_rss_mib})).collect::<Vec<_>>(),
            "waits": self.waits.iter().map(|w| json!({
                "phase": w.phase, "rowLockWaits": w.row_lock_waits, "rowLockMs": w.row_lock_ms,
                "peakConnections": w.peak_connections, "peakBusyConnections": w.peak_busy,
                "meanBusyConnections": w.mean_busy, "peakLockWaiting": w.peak_lock_waiting,
                "loadAverageAtStart": w.load_at_start})).collect::<Vec<_>>(),
            "ratios": {
                "submitOrder16OverRawCommit16": ratio(self.submit_at(16), self.raw_commit_at(16)),
                "relayOverMinRawProduceClaimMark": ratio(self.relay_one(), self.raw_produce.min(self.raw_claim_mark)),
                "consumerOverRawInsert": ratio(self.consumer.per_second, self.raw_insert.per_second),
            },
            "targets": self.targets().into_iter().map(|(name, value, target, met)| json!({
                "name": name, "value": value, "target": target, "met": met})).collect::<Vec<_>>(),
            "notes": self.notes,
        })
    }

    /// Throughputs to chart: (label, Outpost or raw, per second).
    pub(crate) fn chart_bars(&self) -> Vec<(String, bool, f64)> {
        let mut bars = vec![
            ("raw commit @16".to_owned(), false, self.raw_commit_at(16)),
            ("SubmitOrder @16".to_owned(), true, self.submit_at(16)),
            ("raw produce".to_owned(), false, self.raw_produce),
            ("raw claim+mark".to_owned(), false, self.raw_claim_mark),
        ];
        for (n, d) in &self.relay {
            bars.push((format!("relay x{n}"), true, d.per_second));
        }
        bars.push(("raw insert".to_owned(), false, self.raw_insert.per_second));
        bars.push(("consumer".to_owned(), true, self.consumer.per_second));
        bars
    }
}
