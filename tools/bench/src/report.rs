//! The figures of one run: the printed table, the JSON file, and the targets met or missed.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::figures::{Drain, Figures, Point};
use crate::measure::Percentiles;
use crate::phases::RelayPhases;
use crate::plan::Phase;
use crate::sustain::Verdict as _;
use crate::timings;

mod capacity;
mod ordered;

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
        self.relay_of(1)
    }

    fn relay_of(&self, processes: usize) -> f64 {
        self.relay.iter().find(|(n, _)| *n == processes).map_or(0.0, |(_, d)| d.per_second)
    }

    /// (name, value, target, met) of the targets whose phases all ran: a phase that did not run
    /// measured 0, which would read as a target missed (or, as the broker's room for two relays,
    /// as one that does not apply).
    fn targets(&self) -> Vec<(String, String, String, bool)> {
        let mut out = Vec::new();
        let ran = |phases: &[Phase]| phases.iter().all(|&phase| self.ran(phase));
        if ran(&[Phase::Submit, Phase::RawCommit]) {
            let submit = ratio(self.submit_at(16), self.raw_commit_at(16));
            out.push((
                "SubmitOrder@16 / raw commit@16".into(),
                format!("{submit:.2}"),
                ">= 0.70".into(),
                submit >= 0.7,
            ));
        }
        if ran(&[Phase::Relay, Phase::RawProduce, Phase::RawClaimMark]) {
            let relay_limit = self.raw_produce.min(self.raw_claim_mark);
            let relay = ratio(self.relay_one(), relay_limit);
            out.push((
                "relay x1 / min(raw produce, raw claim+mark)".into(),
                format!("{relay:.2}"),
                ">= 0.80".into(),
                relay >= 0.8,
            ));
        }
        if ran(&[Phase::Relay, Phase::RawProduce]) {
            // Two relays can only beat one by 1.3 where the broker takes 1.3 times as much from
            // two producers as from one; otherwise the broker is the bound and the target does
            // not apply.
            let two = ratio(self.relay_of(2), self.relay_one());
            let room = ratio(self.raw_produce_two, self.raw_produce);
            out.push((
                format!("relay x2 / relay x1 (raw produce x2/x1 {room:.2})"),
                format!("{two:.2}"),
                ">= 1.30 if room".into(),
                two >= 1.3 || (room < 1.3 && two >= 0.9 * room),
            ));
        }
        if ran(&[Phase::Relay]) {
            let trouble: u64 = self
                .relay_phases
                .iter()
                .map(|(_, p)| p.lock_conflicts + p.deadlock_lines + p.lease_lost)
                .sum();
            out.push((
                "relay drains: lock conflicts + lease losses".into(),
                trouble.to_string(),
                "0".into(),
                trouble == 0,
            ));
        }
        if ran(&[Phase::Consumer, Phase::RawInsert]) {
            let consumer = ratio(self.consumer.per_second, self.raw_insert.per_second);
            out.push((
                "consumer / raw insert".into(),
                format!("{consumer:.2}"),
                ">= 0.70".into(),
                consumer >= 0.7,
            ));
        }
        if let Some(e) = self.e2e.iter().find(|e| e.label == "25%") {
            out.push((
                "e2e at 25% p50 / p99".into(),
                format!("{:.1} / {:.1} ms", e.latency.p50, e.latency.p99),
                "<= 50 / 250 ms".into(),
                e.latency.p50 <= 50.0 && e.latency.p99 <= 250.0 && e.missing == 0,
            ));
        }
        if let Some(e) = self.e2e.iter().find(|e| e.label == "50%") {
            out.push((
                "e2e at 50% p99".into(),
                format!("{:.1} ms", e.latency.p99),
                "<= 250 ms".into(),
                e.latency.p99 <= 250.0 && e.missing == 0,
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
        out.extend(ordered::targets(self));
        out.extend(self.soak.iter().flat_map(crate::soak::targets));
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
        let raw =
            [Phase::RawCommit, Phase::RawProduce, Phase::Consumer, Phase::RawClaimMark, Phase::RawInsert];
        if raw.into_iter().any(|phase| self.ran(phase)) {
            self.machine_limits(&mut t);
        }
        if self.ran(Phase::Submit) {
            self.submit_table(&mut t);
        }
        t.push_str(&crate::group::table(&self.group, &self.raw_commit));
        if self.ran(Phase::Relay) {
            self.relay_table(&mut t);
        }
        if self.ran(Phase::Consumer) {
            self.consumer_table(&mut t);
        }
        if self.ran(Phase::E2e) {
            self.end_to_end_table(&mut t);
        }
        t.push_str(&capacity::table(self));
        t.push_str(&ordered::table(self));
        if let Some(soak) = &self.soak {
            t.push_str(&crate::soak::table(soak));
        }
        if let Some(shards) = &self.shards {
            t.push_str(&crate::shards::table(shards));
        }
        if !self.services.is_empty() {
            self.services_table(&mut t);
        }
        if !self.waits.is_empty() {
            self.waits_table(&mut t);
        }
        let targets = self.targets();
        if !targets.is_empty() {
            let _ = writeln!(t, "\ntargets");
            for (name, value, target, met) in targets {
                let _ = writeln!(t, "  {name:<44} {value:>16}  target {target:<15} {}", verdict(met));
            }
        }
        if !self.notes.is_empty() {
            let _ = writeln!(t, "\nnotes");
            for n in &self.notes {
                let _ = writeln!(t, "  - {n}");
            }
        }
        t
    }

    /// The raw figures of the phases that ran: what the machine does with no Idempost code.
    fn machine_limits(&self, t: &mut String) {
        let _ = writeln!(t, "\nmachine limits (plain SQL / bare producer, no Idempost code)");
        if self.ran(Phase::RawCommit) {
            for p in &self.raw_commit {
                let _ = writeln!(
                    t,
                    "  raw order+outbox commit @{:<3} {:>9.0} tx/s   p50 {:>7.2} p95 {:>7.2} p99 {:>7.2} ms",
                    p.concurrency, p.per_second, p.latency.p50, p.latency.p95, p.latency.p99
                );
            }
        }
        if self.ran(Phase::RawProduce) {
            let _ = writeln!(
                t,
                "  raw confirmed produce        {:>9.0} rec/s (idempotent, acks=all, 2 batches of 500 in flight, as 1 relay)",
                self.raw_produce
            );
            let _ = writeln!(
                t,
                "  raw confirmed produce x2     {:>9.0} rec/s (two such producers at once, as 2 relays)",
                self.raw_produce_two
            );
        }
        if self.ran(Phase::Consumer) {
            let _ = writeln!(
                t,
                "  raw consume, no database     {:>9.0} rec/s (one consumer, same topic; not a target input)",
                self.raw_consume
            );
        }
        if self.ran(Phase::RawClaimMark) {
            let raw = &self.raw_claim_mark_phases;
            let _ = writeln!(
                t,
                "  raw claim+mark (1 worker)    {:>9.0} ev/s   {} batches of {:.0}: claim p50 {:.1} p95 {:.1} ms, mark p50 {:.1} p95 {:.1} ms",
                self.raw_claim_mark,
                raw.batches,
                raw.mean_batch(),
                raw.claim.p50,
                raw.claim.p95,
                raw.record.p50,
                raw.record.p95
            );
            let _ = writeln!(t, "  raw claim+mark x2 (2 workers) {:>8.0} ev/s", self.raw_claim_mark_two);
        }
        if self.ran(Phase::RawInsert) {
            let _ = writeln!(
                t,
                "  raw consumer insert tx @1    {:>9.0} tx/s   p50 {:>7.2} p95 {:>7.2} p99 {:>7.2} ms",
                self.raw_insert.per_second,
                self.raw_insert.latency.p50,
                self.raw_insert.latency.p95,
                self.raw_insert.latency.p99
            );
        }
    }

    /// SubmitOrder at each concurrency.
    fn submit_table(&self, t: &mut String) {
        let _ = writeln!(t, "\nSubmitOrder over gRPC (idempost-order, 16 db connections)");
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
    }

    /// The relay drains and their batches.
    fn relay_table(&self, t: &mut String) {
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
        let _ = writeln!(t, "  per batch, from the relays' logs (ms; p50 / p95):");
        for (n, p) in &self.relay_phases {
            let _ = writeln!(
                t,
                "    x{n}: {:>5} batches of {:>5.0}  claim {:>6.1} / {:>6.1}  publish {:>6.1} / {:>6.1}  mark {:>6.1} / {:>6.1}  lock conflicts {}, deadlock lines {}, leases lost {}",
                p.batches,
                p.mean_batch(),
                p.claim.p50,
                p.claim.p95,
                p.publish.p50,
                p.publish.p95,
                p.record.p50,
                p.record.p95,
                p.lock_conflicts,
                p.deadlock_lines,
                p.lease_lost
            );
        }
    }

    /// The consumer drain.
    fn consumer_table(&self, t: &mut String) {
        let _ = writeln!(t, "\nconsumer: a pre-filled topic");
        let _ = writeln!(
            t,
            "  1 consumer process           {:>9.0} ev/s   {} events, {:.1} s from start{}",
            self.consumer.per_second,
            self.consumer.events,
            self.consumer.wall_seconds,
            if self.consumer.complete { "" } else { "  (INCOMPLETE: timed out)" }
        );
    }

    /// The end-to-end levels, the pipeline probes that set them, and where their time went.
    fn end_to_end_table(&self, t: &mut String) {
        let _ = writeln!(
            t,
            "\nend to end: SubmitOrder sent -> notification_job written (max offered load {:.0}/s)",
            self.max_offered
        );
        if !self.pipeline.is_empty() {
            let _ = writeln!(
                t,
                "  the whole pipeline's sustained rate (least stage alone {:.0}/s; probes of an open loop each):",
                self.stages_max
            );
        }
        for p in &self.pipeline {
            let _ = writeln!(
                t,
                "  probe    {:>7.1}/s offered  {:>7.1}/s consumed meanwhile  ({} accepted, {} failed): {}",
                p.offered,
                p.delivered_per_second(),
                p.sent,
                p.failed,
                if p.kept_up() { "kept up" } else { "fell behind" }
            );
        }
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
        let _ = writeln!(
            t,
            "  stages (ms, p50 / p99): sent -> order stamped | stamped -> published | published -> consumed"
        );
        for e in &self.e2e {
            let s = &e.stages;
            let _ = writeln!(
                t,
                "  {:<8} {:>8.1} / {:>8.1} | {:>8.1} / {:>8.1} | {:>8.1} / {:>8.1}",
                e.label, s.accept.p50, s.accept.p99, s.relay.p50, s.relay.p99, s.consume.p50, s.consume.p99
            );
        }
        let _ = writeln!(
            t,
            "  events over the p99: the share of them sent within the worst {:.0} s (and when those began)",
            timings::BUNCH_SECONDS
        );
        for e in &self.e2e {
            if let Some(tail) = e.tail {
                let _ = writeln!(
                    t,
                    "  {:<8} {:>5.0} %  (from {:.1} s into the level)",
                    e.label,
                    tail.share * 100.0,
                    tail.from_seconds
                );
            }
        }
        let _ = writeln!(t, "  the relay's batches (ms, p50 / p95):");
        for e in &self.e2e {
            let p = &e.relay;
            let _ = writeln!(
                t,
                "  {:<8} {:>5} batches of {:>5.1}  claim {:>6.1} / {:>6.1}  publish {:>6.1} / {:>6.1}  mark {:>6.1} / {:>6.1}",
                e.label,
                p.batches,
                p.mean_batch(),
                p.claim.p50,
                p.claim.p95,
                p.publish.p50,
                p.publish.p95,
                p.record.p50,
                p.record.p95
            );
        }
    }

    /// Each service's CPU and memory per phase.
    fn services_table(&self, t: &mut String) {
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
    }

    /// Lock and connection waits per phase.
    fn waits_table(&self, t: &mut String) {
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
    }

    /// The same figures as JSON.
    pub(crate) fn json(&self) -> Value {
        let point = |p: &Point| {
            json!({"concurrency": p.concurrency, "perSecond": p.per_second, "errors": p.errors,
                   "p50Ms": p.latency.p50, "p95Ms": p.latency.p95, "p99Ms": p.latency.p99, "samples": p.latency.samples})
        };
        let percentiles = |p: &Percentiles| json!({"p50Ms": p.p50, "p95Ms": p.p95, "p99Ms": p.p99});
        let phases = |p: &RelayPhases| {
            json!({"batches": p.batches, "meanBatch": p.mean_batch(), "claim": percentiles(&p.claim),
                   "publish": percentiles(&p.publish), "record": percentiles(&p.record),
                   "lockConflicts": p.lock_conflicts, "deadlockLines": p.deadlock_lines, "leaseLost": p.lease_lost})
        };
        let drain = |d: &Drain| json!({"events": d.events, "perSecond": d.per_second, "wallSeconds": d.wall_seconds, "complete": d.complete});
        json!({
            "machine": self.machine.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "raw": {
                "orderOutboxCommit": self.raw_commit.iter().map(point).collect::<Vec<_>>(),
                "confirmedProducePerSecond": self.raw_produce,
                "confirmedProduceTwoProducersPerSecond": self.raw_produce_two,
                "claimAndMarkPerSecond": self.raw_claim_mark,
                "claimAndMark": phases(&self.raw_claim_mark_phases),
                "claimAndMarkTwoWorkersPerSecond": self.raw_claim_mark_two,
                "consumeWithoutDatabasePerSecond": self.raw_consume,
                "consumerInsert": point(&self.raw_insert),
            },
            "submitOrder": self.submit.iter().map(point).collect::<Vec<_>>(),
            "groupCommit": crate::group::json(&self.group, &self.raw_commit),
            "relay": self.relay.iter().map(|(n, d)| json!({"processes": n, "drain": drain(d)})).collect::<Vec<_>>(),
            "relayBatches": self.relay_phases.iter().map(|(n, p)| json!({"processes": n, "batches": phases(p)})).collect::<Vec<_>>(),
            "consumer": drain(&self.consumer),
            "maxOfferedPerSecond": self.max_offered,
            "leastStageAlonePerSecond": self.stages_max,
            "pipelineProbes": self.pipeline.iter().map(|p| json!({
                "offeredPerSecond": p.offered, "accepted": p.sent, "failed": p.failed,
                "consumedMeanwhilePerSecond": p.delivered_per_second(), "keptUp": p.kept_up()})).collect::<Vec<_>>(),
            "endToEnd": self.e2e.iter().map(|e| json!({
                "label": e.label, "offeredPerSecond": e.offered_per_second, "accepted": e.accepted,
                "failed": e.failed, "notConsumed": e.missing,
                "p50Ms": e.latency.p50, "p95Ms": e.latency.p95, "p99Ms": e.latency.p99,
                "stages": {"accept": percentiles(&e.stages.accept), "relay": percentiles(&e.stages.relay),
                           "consume": percentiles(&e.stages.consume)},
                "overP99": e.tail.map(|b| json!({"shareInWorstStretch": b.share, "stretchSeconds": timings::BUNCH_SECONDS,
                                                  "fromSeconds": b.from_seconds})),
                "relayBatches": phases(&e.relay)})).collect::<Vec<_>>(),
            "capacity": capacity::json(self),
            "ordered": ordered::json(self),
            "soak": self.soak.as_ref().map(crate::soak::json),
            "shards": self.shards.as_ref().map(crate::shards::json),
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

    /// Throughputs to chart: (label, Idempost or raw, per second).
    pub(crate) fn chart_bars(&self) -> Vec<(String, bool, f64)> {
        let mut bars = vec![
            ("raw commit @16".to_owned(), false, self.raw_commit_at(16)),
            ("SubmitOrder @16".to_owned(), true, self.submit_at(16)),
            ("raw produce".to_owned(), false, self.raw_produce),
            ("raw produce x2".to_owned(), false, self.raw_produce_two),
            ("raw claim+mark".to_owned(), false, self.raw_claim_mark),
            ("raw claim+mark x2".to_owned(), false, self.raw_claim_mark_two),
        ];
        for (n, d) in &self.relay {
            bars.push((format!("relay x{n}"), true, d.per_second));
        }
        bars.push(("raw insert".to_owned(), false, self.raw_insert.per_second));
        bars.push(("consumer".to_owned(), true, self.consumer.per_second));
        bars
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::ValueEnum as _;

    use super::*;
    use crate::figures::{EndToEnd, ServiceUse};
    use crate::observe::Waits;

    fn point(concurrency: usize) -> Point {
        Point { concurrency, per_second: 1000.0, ..Point::default() }
    }

    /// Figures of every phase, each with something in it.
    fn every_phase() -> Figures {
        Figures {
            ran: Phase::value_variants().to_vec(),
            machine: vec![("cpus".into(), "2".into())],
            raw_commit: vec![point(1), point(16)],
            raw_produce: 5000.0,
            raw_produce_two: 6000.0,
            raw_insert: point(1),
            raw_claim_mark: 4000.0,
            raw_claim_mark_two: 5000.0,
            raw_consume: 9000.0,
            submit: vec![point(1), point(16)],
            relay: vec![(1, Drain { events: 10, per_second: 3500.0, wall_seconds: 1.0, complete: true })],
            relay_phases: vec![(1, RelayPhases::default())],
            consumer: Drain { events: 10, per_second: 800.0, wall_seconds: 1.0, complete: true },
            max_offered: 500.0,
            e2e: vec![EndToEnd { label: "25%".into(), ..EndToEnd::default() }],
            soak: Some(crate::soak::Soak::default()),
            shards: Some(crate::shards::Shards::default()),
            services: vec![ServiceUse {
                service: "idempost-relay".into(),
                phase: "drain x1".into(),
                ..ServiceUse::default()
            }],
            waits: vec![Waits { phase: "relay x1".into(), ..Waits::default() }],
            notes: vec!["a note".into()],
            ..Figures::default()
        }
    }

    /// The headings of the sections of phases that are not the soak's or the shards'.
    const OTHER_HEADINGS: [&str; 9] = [
        "machine limits",
        "raw confirmed produce",
        "raw claim+mark",
        "SubmitOrder over gRPC",
        "relay: drain",
        "consumer: a pre-filled topic",
        "end to end",
        "services (real processes",
        "lock and connection waits",
    ];

    #[test]
    fn a_run_of_every_phase_reports_every_section_and_target() {
        let table = every_phase().table();
        for heading in
            OTHER_HEADINGS.iter().chain(&["\nsoak:", "\nrelay over shards", "\ntargets", "\nnotes"])
        {
            assert!(table.contains(heading), "{heading:?} is missing:\n{table}");
        }
        for target in [
            "SubmitOrder@16",
            "relay x1 / min",
            "relay x2 / relay x1",
            "relay drains",
            "consumer / raw insert",
        ] {
            assert!(table.contains(target), "{target:?} is missing:\n{table}");
        }
    }

    #[test]
    fn a_soak_run_reports_the_soak_and_no_section_of_a_phase_that_did_not_run() {
        let figures = Figures {
            ran: vec![Phase::Soak],
            machine: vec![("cpus".into(), "2".into())],
            soak: Some(crate::soak::Soak::default()),
            ..Figures::default()
        };
        let table = figures.table();
        assert!(table.starts_with("machine\n  cpus"), "{table}");
        assert!(table.contains("\nsoak:"), "{table}");
        for heading in
            OTHER_HEADINGS.iter().chain(&["relay over shards", "SubmitOrder@16", "relay x2 / relay x1"])
        {
            assert!(!table.contains(heading), "{heading:?} is in a soak run's report:\n{table}");
        }
    }

    #[test]
    fn a_shards_run_reports_the_shards_and_no_section_of_a_phase_that_did_not_run() {
        let figures = Figures {
            ran: vec![Phase::Shards],
            shards: Some(crate::shards::Shards::default()),
            ..Figures::default()
        };
        let table = figures.table();
        assert!(table.contains("\nrelay over shards"), "{table}");
        for heading in OTHER_HEADINGS.iter().chain(&["\nsoak:", "\ntargets"]) {
            assert!(!table.contains(heading), "{heading:?} is in a shards run's report:\n{table}");
        }
    }

    #[test]
    fn a_target_is_judged_only_when_every_phase_it_compares_ran() {
        // The README's runs: no raw phases, so the raw consume line is the machine limits' only.
        let figures =
            Figures { ran: vec![Phase::Submit, Phase::Relay, Phase::Consumer, Phase::E2e], ..every_phase() };
        let names: Vec<String> = figures.targets().into_iter().map(|(name, ..)| name).collect();
        assert!(names.contains(&"relay drains: lock conflicts + lease losses".to_owned()), "{names:?}");
        for compared_with_raw in
            ["SubmitOrder@16", "relay x1 / min", "relay x2 / relay x1", "consumer / raw insert"]
        {
            assert!(!names.iter().any(|name| name.starts_with(compared_with_raw)), "{names:?}");
        }
        let table = figures.table();
        let limits = table.split("\nmachine limits").nth(1).unwrap().split("\n\n").next().unwrap();
        assert_eq!(limits.lines().filter(|line| line.starts_with("  raw ")).count(), 1, "{table}");
        assert!(limits.contains("raw consume, no database"), "{table}");
    }
}
