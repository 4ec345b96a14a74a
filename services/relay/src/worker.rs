//! One relay step (claim, publish, mark or release) and the polling loop around it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use chrono::Utc;
use futures::future::join_all;
use opentelemetry::KeyValue;
use sea_orm::DbErr;
use tokio::sync::{Notify, Semaphore, watch};
use tracing::{Instrument as _, Span};

use super::budget::{AdaptiveBatch, MIN_RECORD_TIME, StepBudget};
use super::health::Vitals;
use super::lease::WorkerId;
use super::outbox::{Blame, ClaimedEvent, Delivery, Fenced, Outbox, Released, RetryPolicy};
use super::publisher::Publisher;
use super::step::{StepOutcome, StepReport};
use idempost::db;
use idempost::failpoint;
use idempost::telemetry::{self, metrics};

/// How a relay claims.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Most events one claim takes; [`Relay::run`] adapts its claims up to this size.
    pub batch_size: u64,
    /// How long a claim is leased.
    pub lease: Duration,
    /// Longest the publishing of a batch may take, queue wait included.
    pub delivery_timeout: Duration,
    /// Time the lease keeps to spare after a step has ended.
    pub lease_margin: Duration,
    /// Retry timing after failed publishes.
    pub retry: RetryPolicy,
    /// Longest wait between polls of an empty outbox.
    pub max_idle_poll: Duration,
}

/// A relay worker: one worker id, one publisher; every claim gets its own lease token, so any
/// number of loops may step one `Relay` at once.
#[derive(Debug)]
pub struct Relay<P> {
    outbox: Outbox,
    publisher: Arc<P>,
    owner: WorkerId,
    tuning: Tuning,
    wake: Arc<Notify>,
    vitals: Arc<Vitals>,
    /// One turn per producer of the publisher (its lanes): each producer holds one batch at a
    /// time. The loops of this worker claim and mark in parallel, but hand a producer a batch
    /// only once its previous one is confirmed (see [`BATCHES_IN_THE_PRODUCER`]). Shared by
    /// the relays of a fleet's shards ([`Producers`]): the semaphores are fair, so the
    /// shards' batches take turns at each producer and a hot shard cannot starve the others.
    producer_turns: Arc<[Semaphore]>,
    /// The lane the next loop started by [`Relay::run`] publishes through.
    next_lane: AtomicUsize,
    /// Whether a loop started the claims' sweep ([`sweep`]): one per worker, whatever its loops.
    sweeping: AtomicBool,
}

/// Batches one producer holds at once. librdkafka's idempotent producer sends one
/// produce request per partition at a time (it counts in-flight *messages* against its limit of
/// five requests), and while a request is out its broker thread wakes without sleeping for every
/// queued record whose `linger.ms` has passed: records handed over early only wait, and the
/// waiting spins a core for as long as the broker takes to answer. Profiled with four relays on
/// one broker, that spinning was most of the relays' CPU, taken from the broker. More batches in
/// flight come from more producers (lanes), each with its own connection and its own one request
/// per partition: the broker then works on several batches of one relay at once, as it does for
/// several relays.
const BATCHES_IN_THE_PRODUCER: usize = 1;

/// Batches in a row whose every publish failed, with the broker answering errors, after which
/// the producer is replaced (Tansu 0.6, for one, answers UNKNOWN_SERVER_ERROR to every produce
/// of a producer whose epoch a timed-out send bumped).
const REBUILD_AFTER_FAILED_BATCHES: u32 = 3;

/// A publisher and its producers' turns, shared by the workers of a fleet's shards.
#[derive(Debug)]
pub(crate) struct Producers<P> {
    publisher: Arc<P>,
    turns: Arc<[Semaphore]>,
}

impl<P: Publisher> Producers<P> {
    pub(crate) fn new(publisher: P) -> Self {
        let turns = (0..publisher.lanes().max(1)).map(|_| Semaphore::new(BATCHES_IN_THE_PRODUCER)).collect();
        Self { publisher: Arc::new(publisher), turns }
    }
}

impl<P: Publisher> Relay<P> {
    /// A worker with a fresh worker id.
    pub fn new(outbox: Outbox, publisher: P, tuning: Tuning) -> Self {
        Self::on(outbox, &Producers::new(publisher), tuning)
    }

    /// A worker over `outbox` with a fresh worker id that publishes through `producers`,
    /// taking turns at them with every other worker made on them (a fleet's shards).
    pub(crate) fn on(outbox: Outbox, producers: &Producers<P>, tuning: Tuning) -> Self {
        let (publisher, turns) = (Arc::clone(&producers.publisher), Arc::clone(&producers.turns));
        Self::sharing(outbox, publisher, turns, tuning)
    }

    fn sharing(outbox: Outbox, publisher: Arc<P>, producer_turns: Arc<[Semaphore]>, tuning: Tuning) -> Self {
        Self {
            outbox,
            publisher,
            owner: WorkerId::generate(),
            tuning,
            wake: Arc::new(Notify::new()),
            vitals: Arc::default(),
            producer_turns,
            next_lane: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
        }
    }

    /// Progress of this worker's step loops, for its health check.
    pub(crate) fn vitals(&self) -> Arc<Vitals> {
        Arc::clone(&self.vitals)
    }

    /// Producers replaced inside this process since the worker started.
    pub fn producer_rebuilds(&self) -> u64 {
        self.vitals.rebuilds()
    }

    /// Notifying this ends an idle wait early (see the `wake` module); it never skips a poll.
    pub(crate) fn wake_handle(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// This worker's id: the prefix of every lease token its claims write.
    pub fn owner(&self) -> &WorkerId {
        &self.owner
    }

    /// The publisher this worker publishes through.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// The outbox this worker relays.
    pub(crate) fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Claims a batch, publishes it outside any transaction, and records each outcome under the
    /// claim's fence. Errs only when the claim itself fails.
    ///
    /// The whole step stays inside the lease minus the margin ([`StepBudget`]): a record not
    /// handed to the producer in time counts as failed, one handed over waits for the
    /// producer's verdict (a record still without one at the settle deadline is left to its
    /// lease), and marks and releases not done by the end are left unrecorded (their leases
    /// expire; the events are published again).
    pub async fn step(&self) -> Result<StepOutcome, DbErr> {
        self.step_of(self.tuning.batch_size, 0).await
    }

    /// [`Relay::step`] claiming at most `batch_size` events, published through producer `lane`.
    async fn step_of(&self, batch_size: u64, lane: usize) -> Result<StepOutcome, DbErr> {
        if failpoint::hit(failpoint::AFTER_COMMIT_BEFORE_RELAY_CLAIM).is_err() {
            return Ok(StepOutcome::Idle);
        }
        let tuning = &self.tuning;
        let budget = StepBudget::lenient(tuning.lease, tuning.delivery_timeout, tuning.lease_margin);
        // Before the claim, so that the database's lease starts no earlier than this.
        let started = tokio::time::Instant::now();
        let claimed = self.outbox.claim(&self.owner, self.tuning.lease, batch_size).await?;
        let claim_took = started.elapsed();
        if claimed.is_empty() {
            return Ok(StepOutcome::Idle);
        }
        metrics().claimed.add(claimed.len() as u64, &[]);
        // One span per event, continuing the trace of the SubmitOrder that wrote it: a batch
        // claim serves many traces, so each event gets its own record of it.
        let spans: Vec<Span> = claimed.iter().map(|event| self.event_span(event)).collect();
        let mut report = StepReport { claimed: claimed.len(), ..StepReport::default() };
        if failpoint::hit(failpoint::DURING_CONCURRENT_CLAIM).is_err() {
            // As if the worker died here: the leases run out and another worker takes over.
            return Ok(StepOutcome::Worked(report));
        }
        // Counted from before the claim, so that a step stalled after its claim (a paused
        // process, a starved thread) finds its budget spent and publishes nothing: a late copy
        // of an event that another relay has published since, with the order's later versions
        // after it, would put an old version on the topic after newer ones.
        let deadlines = Deadlines {
            hand_over_by: started + budget.hand_over,
            settle_by: started + budget.settle,
            hand_over: budget.hand_over,
        };
        let sends = self.sends(&claimed, &spans, lane, &deadlines);
        let publishing = tokio::time::Instant::now();
        let results = self.in_the_producers_turn(lane, sends, &deadlines).await;
        report.claim_time = claim_took;
        report.publish_time = publishing.elapsed();
        let mut confirmed = Vec::with_capacity(claimed.len());
        let mut failed = Vec::new();
        for ((event, result), span) in claimed.iter().zip(results).zip(&spans) {
            match result {
                Sent::Confirmed(delivery) => {
                    let latency = (Utc::now() - event.created_at).to_std().unwrap_or_default();
                    metrics().publish_latency.record(latency.as_secs_f64(), &[]);
                    if failpoint::hit(failpoint::AFTER_BROKER_CONFIRM_BEFORE_MARK_PUBLISHED).is_err() {
                        report.unrecorded += 1;
                        continue;
                    }
                    confirmed.push((event, delivery, span));
                }
                Sent::Failed(error, blame) => failed.push((event, error, blame, span)),
                Sent::Unsettled => span.in_scope(|| self.unsettled(event, &mut report)),
            }
        }
        let recording = tokio::time::Instant::now();
        // The rest of `lease - margin`, but never less than the least time to record: a step
        // stalled past its budget (a paused process) still writes its outcomes, each fenced by
        // its claim, so a late one changes nothing once another claim holds the event.
        let record_by = (started + budget.whole).max(recording + MIN_RECORD_TIME);
        self.release_failed(&failed, record_by, &mut report).await;
        self.mark_confirmed(&confirmed, record_by, &mut report).await;
        report.record_time = recording.elapsed();
        Ok(StepOutcome::Worked(report))
    }

    /// One send per event, not yet started, each waiting for its verdict until the settle
    /// deadline. Sends are queued in claim order, so one key's records keep their order on the
    /// partition; the verdicts are awaited together. Every record is built here, before the
    /// producer's turn, so that the turn hands librdkafka the whole batch in one burst.
    fn sends<'a>(
        &'a self,
        claimed: &'a [ClaimedEvent],
        spans: &'a [Span],
        lane: usize,
        deadlines: &Deadlines,
    ) -> Vec<impl Future<Output = Sent> + 'a> {
        let Deadlines { hand_over_by, settle_by, .. } = *deadlines;
        claimed
            .iter()
            .zip(spans)
            .map(move |(event, span)| {
                let publish = span
                    .in_scope(|| self.publisher.publish(event, lane, hand_over_by))
                    .instrument(span.clone());
                async move {
                    match tokio::time::timeout_at(settle_by, publish).await {
                        Ok(Ok(delivery)) => Sent::Confirmed(delivery),
                        Ok(Err(e)) => {
                            let blame = if e.broker_unavailable() { Blame::Broker } else { Blame::Event };
                            Sent::Failed(e.to_string(), blame)
                        }
                        Err(_) => Sent::Unsettled,
                    }
                }
            })
            .collect()
    }

    /// Runs `sends` together once producer `lane` is free (see [`BATCHES_IN_THE_PRODUCER`]),
    /// and holds the turn until every verdict is in or the settle deadline passed, so that the
    /// next batch never queues behind records of this one. Waiting for the turn is queue wait:
    /// a batch whose turn comes after the hand-over deadline is handed nothing and fails as a
    /// whole (never sent, so released at once). The semaphore is never closed.
    async fn in_the_producers_turn(
        &self,
        lane: usize,
        sends: Vec<impl Future<Output = Sent>>,
        deadlines: &Deadlines,
    ) -> Vec<Sent> {
        let hand_over_by = deadlines.hand_over_by;
        match tokio::time::timeout_at(
            hand_over_by,
            self.producer_turns[lane % self.producer_turns.len()].acquire(),
        )
        .await
        {
            // Checked here, not left to the sends: their first poll hands each record to
            // librdkafka.
            Ok(turn) if tokio::time::Instant::now() < hand_over_by => {
                let results = join_all(sends).await;
                drop(turn);
                results
            }
            _ => sends.iter().map(|_| not_handed_over(deadlines.hand_over)).collect(),
        }
    }

    /// A record handed to the producer that has no verdict at the settle deadline: librdkafka
    /// may still send it, so releasing it could let another claim publish it and its order's
    /// later versions before this copy lands. Left leased; the lease ends after librdkafka has
    /// given up on it.
    fn unsettled(&self, event: &ClaimedEvent, report: &mut StepReport) {
        report.unsettled += 1;
        tracing::warn!(
            idempost.event_id = %event.event_id,
            lease_owner = %event.lease_token,
            "no verdict from the producer by the settle deadline; left to its lease, not released, \
             since the record may still reach the broker"
        );
    }

    /// Failed events go back in one statement, each row under its own claim fence.
    async fn release_failed(
        &self,
        failed: &[(&ClaimedEvent, String, Blame, &Span)],
        record_by: tokio::time::Instant,
        report: &mut StepReport,
    ) {
        let failures: Vec<(&ClaimedEvent, &str, Blame)> =
            failed.iter().map(|(event, error, blame, _)| (*event, error.as_str(), *blame)).collect();
        match record(record_by, || self.outbox.release_all(&failures, &self.tuning.retry)).await {
            Ok(outcomes) => {
                for ((event, error, blame, span), outcome) in failed.iter().zip(outcomes) {
                    span.in_scope(|| self.released(event, error, *blame, outcome, report));
                }
            }
            Err(e) => {
                for (event, _, _, span) in failed {
                    span.in_scope(|| self.unrecorded(event, report, &e));
                }
            }
        }
    }

    /// Every confirmed event of the batch is marked in one statement, each row under its own
    /// claim fence.
    async fn mark_confirmed(
        &self,
        confirmed: &[(&ClaimedEvent, Delivery, &Span)],
        record_by: tokio::time::Instant,
        report: &mut StepReport,
    ) {
        let marks: Vec<_> = confirmed
            .iter()
            .map(|(event, delivery, _)| (event.event_id.as_str(), &event.lease_token, delivery))
            .collect();
        match record(record_by, || self.outbox.mark_all_published(&marks)).await {
            Ok(outcomes) => {
                let marked =
                    confirmed.iter().zip(&outcomes).filter(|(_, outcome)| **outcome == Fenced::Done(()));
                if let Some(oldest) = marked.map(|((event, _, _), _)| event.created_at).min() {
                    self.outbox.marked_through(oldest);
                }
                for ((event, delivery, span), outcome) in confirmed.iter().zip(outcomes) {
                    span.in_scope(|| self.marked(event, delivery, outcome, report));
                }
            }
            Err(e) => {
                for (event, _, span) in confirmed {
                    span.in_scope(|| self.unrecorded(event, report, &e));
                }
            }
        }
    }

    fn event_span(&self, event: &ClaimedEvent) -> Span {
        let span = tracing::info_span!(
            "outbox relay",
            idempost.event_id = %event.event_id,
            lease_owner = %event.lease_token,
            attempts = event.attempts,
            trace_id = tracing::field::Empty,
        );
        telemetry::follow(
            &span,
            telemetry::context_from(event.traceparent.as_deref(), event.tracestate.as_deref()),
        );
        span.in_scope(|| {
            tracing::info!(
                lease_owner = %event.lease_token,
                lease_until = %event.lease_until,
                attempts = event.attempts,
                "claimed; PUBLISHING"
            );
        });
        span
    }

    /// Records one fenced mark's outcome.
    fn marked(
        &self,
        event: &ClaimedEvent,
        delivery: &Delivery,
        outcome: Fenced<()>,
        report: &mut StepReport,
    ) {
        match outcome {
            Fenced::Done(()) => {
                report.published += 1;
                metrics().published.add(1, &[]);
                tracing::info!(
                    idempost.event_id = %event.event_id,
                    messaging.destination.name = %delivery.topic,
                    messaging.destination.partition.id = delivery.partition,
                    messaging.kafka.offset = delivery.offset,
                    "marked PUBLISHED"
                );
            }
            Fenced::LeaseLost => self.lease_lost(event, report, "after the broker confirmed"),
        }
    }

    /// Records one fenced release's outcome.
    fn released(
        &self,
        event: &ClaimedEvent,
        error: &str,
        blame: Blame,
        outcome: Fenced<Released>,
        report: &mut StepReport,
    ) {
        match outcome {
            Fenced::Done(Released::RetryAt(at)) if blame == Blame::Broker => {
                report.released += 1;
                metrics().releases.add(1, &[]);
                tracing::warn!(
                    idempost.event_id = %event.event_id,
                    retry_at = %at,
                    error,
                    "broker unavailable; released to PENDING with backoff, the attempt not counted"
                );
            }
            Fenced::Done(Released::RetryAt(at)) => {
                report.released += 1;
                metrics().releases.add(1, &[]);
                tracing::warn!(
                    idempost.event_id = %event.event_id,
                    attempts = event.attempts,
                    retry_at = %at,
                    error,
                    "publish failed; released to PENDING with backoff"
                );
            }
            Fenced::Done(Released::Failed) => {
                report.failed += 1;
                metrics().failed.add(1, &[]);
                tracing::error!(
                    idempost.event_id = %event.event_id,
                    attempts = event.attempts,
                    error,
                    "publish failed for the last allowed time; FAILED until redriven"
                );
            }
            Fenced::LeaseLost => self.lease_lost(event, report, "after the publish failed"),
        }
    }

    fn lease_lost(&self, event: &ClaimedEvent, report: &mut StepReport, when: &str) {
        report.lease_lost += 1;
        metrics().lease_losses.add(1, &[]);
        tracing::warn!(
            idempost.event_id = %event.event_id,
            lease_owner = %event.lease_token,
            "lease lost {when}; another claim owns the event now, so it is left alone"
        );
    }

    fn unrecorded(&self, event: &ClaimedEvent, report: &mut StepReport, error: &DbErr) {
        report.unrecorded += 1;
        tracing::error!(
            idempost.event_id = %event.event_id,
            %error,
            "could not record the outcome; the lease will expire and the event be published again"
        );
    }

    /// Steps until `stop` turns true: at once again after a batch, backing off up to
    /// `max_idle_poll` while the outbox is empty or the database fails, unless a wake-up ends
    /// the wait early (at most one poll per 10 ms however many arrive). A step in progress
    /// always finishes, so a stop never abandons a confirmed publish before its mark.
    ///
    /// Each loop publishes through a producer (lane) of its own while the publisher has one
    /// to spare; loops beyond that share them in turn. A producer that turned fatal, or whose
    /// every publish the broker answered with an error for [`REBUILD_AFTER_FAILED_BATCHES`] of
    /// its loop's batches in a row, is replaced between steps (its failed publishes were
    /// already released, as any failed publish is). Ends early with an error only when no
    /// replacement can be made.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) -> Result<(), PublisherFailed> {
        let lane = self.next_lane.fetch_add(1, Ordering::Relaxed) % self.producer_turns.len();
        let shortest = Duration::from_millis(10).min(self.tuning.max_idle_poll);
        let mut idle = shortest;
        let mut batch = AdaptiveBatch::new(self.tuning.batch_size);
        // Counted per loop, so per lane: another lane's confirms say nothing of this producer.
        let mut failed_batches = 0;
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            tokio::spawn(sweep(self.outbox.clone(), stop.clone()));
        }
        tracing::info!(lease_owner = %self.owner, lane, "relay started");
        while !*stop.borrow() {
            let polled_at = tokio::time::Instant::now();
            let step = self.step_of(batch.size(), lane).await;
            let claimed = match &step {
                Ok(StepOutcome::Worked(report)) => report.claimed as u64,
                _ => 0,
            };
            batch.after(claimed, polled_at.elapsed(), self.tuning.delivery_timeout);
            self.vitals.stepped(&step);
            failed_batches = failed_in_a_row(failed_batches, &step);
            match self.publisher.recover(lane, failed_batches >= REBUILD_AFTER_FAILED_BATCHES) {
                Ok(None) => {}
                Ok(Some(reason)) => {
                    failed_batches = 0;
                    self.vitals.rebuilt();
                    metrics().producer_rebuilds.add(1, &[]);
                    tracing::warn!(
                        %reason,
                        "Kafka producer rebuilt; the events it failed were released and are retried with the new one"
                    );
                }
                Err(reason) => {
                    tracing::error!(%reason, "the publisher failed for good; stopping so a fresh relay can take over");
                    return Err(PublisherFailed(reason));
                }
            }
            let wait = match step {
                Ok(StepOutcome::Worked(report)) => {
                    // One line per batch under its own target, so the phases of a drain can be
                    // measured (`RUST_LOG=idempost_relay::step=debug`) without per-event logs.
                    tracing::debug!(
                        target: "idempost_relay::step",
                        claimed = report.claimed,
                        published = report.published,
                        lease_lost = report.lease_lost,
                        claim_ms = report.claim_time.as_secs_f64() * 1e3,
                        publish_ms = report.publish_time.as_secs_f64() * 1e3,
                        record_ms = report.record_time.as_secs_f64() * 1e3,
                        "relay step"
                    );
                    idle = shortest;
                    continue;
                }
                Ok(StepOutcome::Idle) => idle,
                // A lock conflict was undone by the server and says nothing about the outbox:
                // claim again after a short jittered wait, not after the idle back-off, which
                // may have grown to `max_idle_poll` and would hold the waiting events that long.
                Err(e) if db::lock_conflict(&e).is_some() => {
                    metrics().relay_lock_conflicts.add(1, &[KeyValue::new("idempost.relay.phase", "claim")]);
                    tracing::warn!(error = %e, "claim met a lock conflict; claiming again shortly");
                    tokio::time::sleep(db::LockConflict::backoff(1)).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed; backing off");
                    idle
                }
            };
            idle = (idle * 2).min(self.tuning.max_idle_poll);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.wake.notified() => {
                    metrics().wakeups.add(1, &[]);
                    tokio::time::sleep_until(polled_at + shortest).await;
                }
                changed = stop.changed() => if changed.is_err() { break },
            }
        }
        tracing::info!(lease_owner = %self.owner, "relay stopped claiming");
        Ok(())
    }
}

/// Every sweep interval until `stop`, looks for claimable rows behind where the claims of
/// `outbox` start reading and lowers the starts to them ([`Outbox::sweep_claims`]): in a task of
/// its own, so that its walk over the whole ranges never delays a claim. What it finds is
/// counted: a row found often means a lookback shorter than the order service's transactions.
async fn sweep(outbox: Outbox, mut stop: watch::Receiver<bool>) {
    let every = outbox.claim_window().sweep_interval;
    // Both reads at 0 from the start: a counter never added to is not exported, and the alert on
    // steady finds (IdempostRelaySweepFindsSteadily) would read nothing to compare with.
    for read in ["due", "expired"] {
        metrics().claim_sweep_finds.add(0, &[KeyValue::new("idempost.relay.claim_read", read)]);
    }
    while !*stop.borrow() {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            changed = stop.changed() => if changed.is_err() { break } else { continue },
        }
        match outbox.sweep_claims().await {
            Ok(swept) => {
                for (read, found) in [("due", swept.due), ("expired", swept.expired)] {
                    if found {
                        metrics()
                            .claim_sweep_finds
                            .add(1, &[KeyValue::new("idempost.relay.claim_read", read)]);
                        tracing::info!(
                            read,
                            "the sweep found a claimable row behind the claims' start; claiming from it"
                        );
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "the claims' sweep failed; trying again next interval"),
        }
    }
}

/// Batches in a row claimed and then nothing of them confirmed (every publish failed), after
/// `step`, from `before` such batches.
fn failed_in_a_row(before: u32, step: &Result<StepOutcome, DbErr>) -> u32 {
    match step {
        Ok(StepOutcome::Worked(report)) if report.published > 0 => 0,
        Ok(StepOutcome::Worked(report))
            if report.claimed > 0
                && report.lease_lost == 0
                && report.unrecorded == 0
                && report.unsettled == 0 =>
        {
            before + 1
        }
        _ => before,
    }
}

/// What became of one record of a step.
#[derive(Debug)]
enum Sent {
    /// Where the broker put it.
    Confirmed(Delivery),
    /// Why it was not published, and whom that is blamed on; it can no longer reach the broker
    /// by this step.
    Failed(String, Blame),
    /// Handed to the producer, with no verdict by the settle deadline.
    Unsettled,
}

/// The deadlines of one step's publishing ([`StepBudget`], counted from before the claim).
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    hand_over_by: tokio::time::Instant,
    settle_by: tokio::time::Instant,
    /// The hand-over budget, for the error of a batch not handed over.
    hand_over: Duration,
}

/// A batch whose producer's turn came too late: none of it was sent, and the broker (busy with
/// the batches before it), not the record, is slow.
fn not_handed_over(budget: Duration) -> Sent {
    Sent::Failed(
        format!(
            "not handed to the producer within the delivery timeout ({budget:?}, claim and queue wait included)"
        ),
        Blame::Broker,
    )
}

/// `write` unless `deadline` passes first: a step never acts on its events after its budget.
///
/// A write that lost a lock conflict (a deadlock, a lock-wait timeout, SQLite's busy timeout) was
/// undone by the server, so it runs again while the budget lasts: every row it changes is fenced
/// by its claim's token, so running it again can only do what the first run would have done.
/// Giving up at the first conflict would leave the leases to expire and the events to be
/// published a second time.
async fn record<T, W, F>(deadline: tokio::time::Instant, mut write: W) -> Result<T, DbErr>
where
    W: FnMut() -> F,
    F: std::future::Future<Output = Result<T, DbErr>>,
{
    let attempts = async {
        let mut retry = 0;
        loop {
            match write().await {
                Err(e) if db::lock_conflict(&e).is_some() => {
                    retry += 1;
                    metrics().relay_lock_conflicts.add(1, &[KeyValue::new("idempost.relay.phase", "record")]);
                    // A warning and a count (`idempost.relay.lock_conflicts`, which the tests
                    // check): the relay's statements are meant never to wait on each other, so a
                    // conflict here is worth seeing.
                    tracing::warn!(error = %e, retry, "recording outcomes met a lock conflict; running it again");
                    tokio::time::sleep(db::LockConflict::backoff(retry)).await;
                }
                done => return done,
            }
        }
    };
    tokio::time::timeout_at(deadline, attempts).await.unwrap_or_else(|_| {
        Err(DbErr::Custom("the step's lease budget ran out before its outcomes were recorded".into()))
    })
}

/// The publisher hit an unrecoverable error; its leases will expire and another relay (or this
/// one, restarted) publishes the events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Kafka producer failed for good: {0}")]
pub struct PublisherFailed(pub(crate) String);

#[cfg(test)]
mod tests;
