//! The Kafka side: receive, handle in one transaction, store the offset only after it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::watch;

use idempost_client::Backoff;
use tracing::{Instrument as _, Span};

use super::decode::{OrderEvent, decode};
use super::inbox::{Consumed, DeadLettered, Inbox, PoisonRecord};
use idempost::db::TxFailure;
use idempost::edge::recorded_event_id;
use idempost::failpoint;
use idempost::telemetry::{self, metrics};

/// A header's value as text.
fn header(message: &BorrowedMessage<'_>, name: &str) -> Option<String> {
    message.headers().and_then(|headers| {
        headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

/// Counts of what the consumer did since it started.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    assigned_partitions: AtomicU64,
    handled: AtomicU64,
    consumed: AtomicU64,
    duplicates: AtomicU64,
    dead_lettered: AtomicU64,
    dead_letter_duplicates: AtomicU64,
    parked: AtomicU64,
    failures: AtomicU64,
    batched: AtomicU64,
}

/// A point-in-time copy of [`ConsumerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Partitions this consumer holds now.
    pub assigned_partitions: u64,
    /// Deliveries handled (each attempt counts, retries included).
    pub handled: u64,
    /// Events whose dedup row and effect committed.
    pub consumed: u64,
    /// Deliveries of events already consumed: the duplicate branch.
    pub duplicates: u64,
    /// Records stored in the dead-letter table.
    pub dead_lettered: u64,
    /// Deliveries of records already in the dead-letter table: acknowledged without a new row.
    pub dead_letter_duplicates: u64,
    /// Events parked (recorded, not applied to the read model): a version that skips ahead, or
    /// a type this consumer does not know.
    pub(crate) parked: u64,
    /// Attempts that failed and were not acknowledged.
    pub failures: u64,
    /// Deliveries handled in a transaction together with others (a subset of `handled`).
    pub batched: u64,
}

impl ConsumerStats {
    /// The counts now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            assigned_partitions: get(&self.assigned_partitions),
            handled: get(&self.handled),
            consumed: get(&self.consumed),
            duplicates: get(&self.duplicates),
            dead_lettered: get(&self.dead_lettered),
            dead_letter_duplicates: get(&self.dead_letter_duplicates),
            parked: get(&self.parked),
            failures: get(&self.failures),
            batched: get(&self.batched),
        }
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Commits the offsets of finished work before partitions are taken away, so the next owner
/// starts after it; unfinished work has no stored offset and is redelivered.
#[derive(Debug, Default)]
pub(crate) struct CommitOnRevoke {
    pub(crate) stats: std::sync::Arc<ConsumerStats>,
    closing: AtomicBool,
    /// Between an assignment and the next revocation: this client's group was formed when it
    /// last heard (see [`crate::rejoin`]).
    assigned: AtomicBool,
}

impl CommitOnRevoke {
    pub(crate) fn new(stats: std::sync::Arc<ConsumerStats>) -> Self {
        Self { stats, closing: AtomicBool::new(false), assigned: AtomicBool::new(false) }
    }

    /// Whether this client holds an assignment (possibly empty) that no revocation has ended:
    /// its group was formed when it last synced.
    pub(crate) fn assigned(&self) -> bool {
        self.assigned.load(Ordering::Relaxed)
    }

    /// Call once the stored offsets are committed and right before the client is closed: a
    /// revocation served by the close then commits nothing. librdkafka 2.12 aborts the process
    /// (`rd_kafka_cgrp_terminated: assert: !rd_kafka_assignment_in_progress`) when a commit
    /// request reaches a closing group in the same pass as the LeaveGroup answer that lets it
    /// terminate; a commit from the revocation callback is such a request (seen on a consumer
    /// closed while it was rejoining after a broker restart).
    pub(crate) fn closing(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }
}

impl ClientContext for CommitOnRevoke {}

impl ConsumerContext for CommitOnRevoke {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            // Closing: the offsets were committed before the close began, nothing is stored since.
            if !self.closing.load(Ordering::Relaxed) {
                commit_stored(consumer, "revoke");
            }
            self.stats.assigned_partitions.store(0, Ordering::Relaxed);
            self.assigned.store(false, Ordering::Relaxed);
            tracing::info!(partitions = ?partition_list(partitions), "partitions revoked");
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            self.stats.assigned_partitions.store(partitions.count() as u64, Ordering::Relaxed);
            self.assigned.store(true, Ordering::Relaxed);
            tracing::info!(partitions = ?partition_list(partitions), "partitions assigned");
        }
    }
}

fn partition_list(list: &TopicPartitionList) -> Vec<i32> {
    list.elements().iter().map(|e| e.partition()).collect()
}

/// Commits the stored offsets (those of committed work) now.
pub(crate) fn commit_stored<C: Consumer<CommitOnRevoke>>(consumer: &C, when: &str) {
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) => tracing::debug!(when, "offsets committed"),
        // Nothing finished since the last commit.
        Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => {
            tracing::warn!(when, error = %e, "offset commit failed; the work since the last commit will be redelivered")
        }
    }
}

/// A fatal error of the Kafka client: it can never consume again.
#[derive(Debug)]
pub(crate) struct Fatal {
    /// librdkafka's code and reason.
    pub(crate) reason: String,
    /// The broker fenced this static member: another member joined under its instance id.
    pub(crate) fenced: bool,
}

/// Receives and handles records until `stop` turns true.
#[allow(missing_debug_implementations)] // the librdkafka handle has no Debug
pub(crate) struct Worker<'a> {
    pub(crate) consumer: &'a StreamConsumer<CommitOnRevoke>,
    pub(crate) inbox: &'a Inbox,
    pub(crate) stats: &'a ConsumerStats,
    pub(crate) backoff_max: Duration,
    pub(crate) group: &'a str,
    pub(crate) batch_size: usize,
}

impl Worker<'_> {
    /// Handles the records already fetched (up to `batch_size`) in one transaction, and stores
    /// their offsets, in order, only after it committed. A batch that fails is handled again
    /// one record at a time: a record whose handling fails is retried in place with backoff,
    /// and the records after it wait, so offsets never pass an unhandled record; on stop it is
    /// left unacknowledged for redelivery.
    ///
    /// Returns when `stop` turns true (`None`), or when the Kafka client reported a fatal error
    /// and can never consume again (`Some`): the caller replaces it, or stops when it was fenced.
    pub(crate) async fn run(&self, mut stop: watch::Receiver<bool>) -> Option<Fatal> {
        let mut receive_failures = 0;
        while !*stop.borrow() {
            let received = tokio::select! {
                received = self.consumer.recv() => received,
                changed = stop.changed() => { if changed.is_err() { break } continue }
            };
            match received {
                Ok(message) => {
                    receive_failures = 0;
                    let mut batch = vec![message];
                    // Only what librdkafka has already fetched: a batch never waits to fill.
                    while batch.len() < self.batch_size {
                        match self.consumer.recv().now_or_never() {
                            Some(Ok(message)) => batch.push(message),
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "receive failed");
                                break;
                            }
                            None => break,
                        }
                    }
                    self.handle_batch(&batch, &mut stop).await;
                }
                Err(e) => {
                    if let Some(fatal) = self.fatal_error(&e) {
                        return Some(fatal);
                    }
                    tracing::warn!(error = %e, "receive failed");
                    receive_failures += 1;
                    tokio::time::sleep(self.backoff().delay(receive_failures)).await;
                }
            }
        }
        None
    }

    /// The waits between retries of a failed receive or handling: 100 ms, doubled up to
    /// `backoff_max`.
    fn backoff(&self) -> Backoff {
        Backoff::new(Duration::from_millis(100), self.backoff_max)
    }

    /// Why the client can never consume again, if it cannot.
    fn fatal_error(&self, error: &KafkaError) -> Option<Fatal> {
        if let Some((code, reason)) = self.consumer.client().fatal_error() {
            let fenced = code == RDKafkaErrorCode::FencedInstanceId;
            return Some(Fatal { reason: format!("{code:?}: {reason}"), fenced });
        }
        matches!(error, KafkaError::MessageConsumptionFatal(_))
            .then(|| Fatal { reason: error.to_string(), fenced: false })
    }

    /// Pauses (or resumes) fetching for every partition this consumer holds. While a record's
    /// handling is retried the consumer keeps polling, so it stays in its group however long the
    /// database is away, and a pause keeps that polling from fetching more records.
    fn pause_fetching(&self, paused: bool) {
        let outcome = self.consumer.assignment().and_then(|assigned| {
            if paused { self.consumer.pause(&assigned) } else { self.consumer.resume(&assigned) }
        });
        if let Err(e) = outcome {
            tracing::warn!(error = %e, paused, "could not pause or resume fetching");
        }
    }

    /// Waits `wait` (or until `stop`) while polling the client: group heartbeats, rebalances and
    /// the poll interval stay served. Fetching is paused, so a record is not expected; should
    /// one come from a partition assigned meanwhile, it is sought back to and fetched again
    /// after the resume, never skipped.
    async fn wait_polling(&self, wait: Duration, stop: &mut watch::Receiver<bool>) {
        let until = tokio::time::sleep(wait);
        tokio::pin!(until);
        loop {
            tokio::select! {
                () = &mut until => return,
                _ = stop.changed() => return,
                received = self.consumer.recv() => match received {
                    Ok(message) => {
                        let (topic, partition, offset) = (message.topic().to_owned(), message.partition(), message.offset());
                        drop(message);
                        let mut list = TopicPartitionList::new();
                        list.add_partition(&topic, partition);
                        let sought = self.consumer.pause(&list).and_then(|()| {
                            self.consumer.seek(&topic, partition, Offset::Offset(offset), Duration::ZERO)
                        });
                        if let Err(e) = sought {
                            tracing::error!(error = %e, partition, offset, "could not seek back to a record received while paused");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "poll while waiting to retry"),
                },
            }
        }
    }

    async fn handle_batch(&self, batch: &[BorrowedMessage<'_>], stop: &mut watch::Receiver<bool>) {
        let spans: Vec<Span> = batch.iter().map(|message| self.process_span(message)).collect();
        let received = std::time::Instant::now();
        let mut done = 0;
        if batch.len() > 1 && !failpoint::broken(failpoint::BREAK_OFFSET_COMMIT_BEFORE_LOCAL_COMMIT) {
            done = self.consume_together(batch, &spans, received).await;
        }
        // One at a time: single records, batches with an undecodable record, and whatever a
        // failed batch left.
        for (message, span) in batch.iter().zip(spans).skip(done) {
            if !self.handle_in_span(message, received, stop).instrument(span).await {
                return;
            }
        }
    }

    /// Consumes a batch of decodable records in one transaction; answers how many records from
    /// the front are done (their offsets stored), 0 when the batch must be handled one by one.
    async fn consume_together(
        &self,
        batch: &[BorrowedMessage<'_>],
        spans: &[Span],
        received: std::time::Instant,
    ) -> usize {
        let mut events = Vec::with_capacity(batch.len());
        for (message, span) in batch.iter().zip(spans) {
            match decode(message.payload(), |name| header(message, name)) {
                Ok(event) => {
                    span.record("idempost.event_id", tracing::field::display(event.event_id));
                    span.record("messaging.message.id", tracing::field::display(event.event_id));
                    events.push(event);
                }
                Err(_) => return 0,
            }
        }
        match self.inbox.consume_all(&events).await {
            Ok(outcomes) => {
                for (index, ((message, event), outcome)) in
                    batch.iter().zip(&events).zip(outcomes).enumerate()
                {
                    ConsumerStats::bump(&self.stats.handled);
                    ConsumerStats::bump(&self.stats.batched);
                    let acknowledged = spans[index].in_scope(|| {
                        self.consumed(message, event, outcome, received).is_ok() && self.store_offset(message)
                    });
                    if !acknowledged {
                        return index;
                    }
                }
                batch.len()
            }
            Err((at, failure)) => {
                let (message, span) = match at {
                    Some(index) => (&batch[index], &spans[index]),
                    None => (&batch[0], &spans[0]),
                };
                ConsumerStats::bump(&self.stats.handled);
                ConsumerStats::bump(&self.stats.failures);
                span.in_scope(|| {
                    tracing::warn!(
                        topic = message.topic(),
                        partition = message.partition(),
                        offset = message.offset(),
                        error = %failure,
                        batch = batch.len(),
                        "handling failed; not acknowledged; the batch is handled again one record at a time"
                    );
                });
                0
            }
        }
    }

    /// Stores the offset of a record whose handling committed; false if it could not be.
    fn store_offset(&self, message: &BorrowedMessage<'_>) -> bool {
        // Stored, not committed: the auto-commit (and the commits on revoke and shutdown) send
        // only offsets stored here, after the local commit.
        match self.consumer.store_offset_from_message(message) {
            Ok(()) => {
                tracing::info!(
                    offset = message.offset(),
                    "offset stored; it goes out with the next offset commit"
                );
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not store the offset; the record will be redelivered");
                false
            }
        }
    }

    /// A consumer span continuing the trace whose `traceparent` the relay put in the headers.
    fn process_span(&self, message: &BorrowedMessage<'_>) -> Span {
        let span = tracing::info_span!(
            "process",
            otel.name = format!("process {}", message.topic()),
            otel.kind = "consumer",
            otel.status_code = tracing::field::Empty,
            messaging.system = "kafka",
            messaging.operation.type = "process",
            messaging.operation.name = "process",
            messaging.destination.name = message.topic(),
            messaging.destination.partition.id = message.partition(),
            messaging.kafka.offset = message.offset(),
            messaging.consumer.group.name = self.group,
            messaging.message.id = tracing::field::Empty,
            idempost.event_id = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        );
        // A binary-mode record without the legacy headers carries its trace in `ce_*` alone.
        let traceparent = header(message, "traceparent").or_else(|| header(message, "ce_traceparent"));
        let tracestate = header(message, "tracestate").or_else(|| header(message, "ce_tracestate"));
        telemetry::follow(&span, telemetry::context_from(traceparent.as_deref(), tracestate.as_deref()));
        span.in_scope(|| {
            tracing::info!(partition = message.partition(), offset = message.offset(), "received")
        });
        span
    }

    /// Handles one record until it is done (true) or `stop` turns true first (false).
    async fn handle_in_span(
        &self,
        message: &BorrowedMessage<'_>,
        received: std::time::Instant,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        if failpoint::broken(failpoint::BREAK_OFFSET_COMMIT_BEFORE_LOCAL_COMMIT) {
            let _ = self.consumer.store_offset_from_message(message);
            commit_stored(self.consumer, "before the local commit (broken on purpose)");
        }
        let mut failures = 0;
        let mut paused = false;
        loop {
            ConsumerStats::bump(&self.stats.handled);
            match self.handle(message, received).await {
                Ok(()) => {
                    // A record whose offset could not be stored is still done: it is simply
                    // redelivered and deduplicated.
                    self.store_offset(message);
                    if paused {
                        self.pause_fetching(false);
                    }
                    return true;
                }
                Err(failure) => {
                    ConsumerStats::bump(&self.stats.failures);
                    failures += 1;
                    tracing::warn!(
                        topic = message.topic(),
                        partition = message.partition(),
                        offset = message.offset(),
                        error = %failure,
                        retry_in = ?self.backoff().delay(failures),
                        "handling failed; not acknowledged"
                    );
                }
            }
            if !paused {
                self.pause_fetching(true);
                paused = true;
            }
            self.wait_polling(self.backoff().delay(failures), stop).await;
            if *stop.borrow() {
                return false;
            }
        }
    }

    async fn handle(
        &self,
        message: &BorrowedMessage<'_>,
        received: std::time::Instant,
    ) -> Result<(), TxFailure> {
        let decoded = decode(message.payload(), |name| header(message, name));
        if let Ok(event) = &decoded {
            let span = Span::current();
            span.record("idempost.event_id", tracing::field::display(event.event_id));
            span.record("messaging.message.id", tracing::field::display(event.event_id));
        }
        match decoded {
            Ok(event) => {
                let outcome = self.inbox.consume(&event).await?;
                self.consumed(message, &event, outcome, received)?;
            }
            Err(poison) => {
                let record = PoisonRecord {
                    topic: message.topic(),
                    partition: message.partition(),
                    offset: message.offset(),
                    key: message.key(),
                    payload: message.payload().unwrap_or_default(),
                    event_id: poison.event_id.as_deref(),
                    error: &poison.reason,
                };
                if self.inbox.dead_letter(&record).await? == DeadLettered::AlreadyStored {
                    ConsumerStats::bump(&self.stats.dead_letter_duplicates);
                    tracing::info!(
                        idempost.event_id = %poison.event_id.as_deref().map_or_else(|| "-".to_owned(), recorded_event_id),
                        topic = message.topic(),
                        partition = message.partition(),
                        offset = message.offset(),
                        "undecodable record already dead-lettered; acknowledged without a new row"
                    );
                    return Ok(());
                }
                ConsumerStats::bump(&self.stats.dead_lettered);
                metrics().dead_letters.add(1, &[]);
                tracing::error!(
                    idempost.event_id = %poison.event_id.as_deref().map_or_else(|| "-".to_owned(), recorded_event_id),
                    topic = message.topic(),
                    partition = message.partition(),
                    offset = message.offset(),
                    error = %telemetry::logged(&poison.to_string()),
                    "undecodable record dead-lettered"
                );
            }
        }
        Ok(())
    }

    /// Counts and logs what the inbox did with one event. `Err` only from the failpoint between
    /// the local commit and the acknowledgement.
    fn consumed(
        &self,
        message: &BorrowedMessage<'_>,
        event: &OrderEvent,
        outcome: Consumed,
        received: std::time::Instant,
    ) -> Result<(), failpoint::Injected> {
        match outcome {
            Consumed::Committed => {
                ConsumerStats::bump(&self.stats.consumed);
                metrics().consumed.add(1, &[]);
                metrics().consume_latency.record(received.elapsed().as_secs_f64(), &[]);
                if let Some(age) = since_creation(message) {
                    metrics().end_to_end_latency.record(age, &[]);
                }
                tracing::info!(
                    idempost.event_id = %event.event_id,
                    messaging.message.id = %event.event_id,
                    order_id = event.order_id,
                    partition = message.partition(),
                    offset = message.offset(),
                    "dedup miss: consumed_event row and notification job committed"
                );
                failpoint::hit(failpoint::AFTER_CONSUMER_COMMIT_BEFORE_MESSAGE_ACK)?;
            }
            Consumed::Parked => {
                ConsumerStats::bump(&self.stats.parked);
                metrics().consumed.add(1, &[]);
                tracing::warn!(
                    idempost.event_id = %event.event_id,
                    messaging.message.id = %event.event_id,
                    order_id = event.order_id,
                    event_version = event.version,
                    event_type = %telemetry::logged(&event.event_type),
                    partition = message.partition(),
                    offset = message.offset(),
                    "dedup miss: recorded and parked until the order's gap is filled or released"
                );
                failpoint::hit(failpoint::AFTER_CONSUMER_COMMIT_BEFORE_MESSAGE_ACK)?;
            }
            Consumed::AlreadyConsumed => {
                ConsumerStats::bump(&self.stats.duplicates);
                metrics().duplicates.add(1, &[]);
                tracing::info!(
                    idempost.event_id = %event.event_id,
                    messaging.message.id = %event.event_id,
                    partition = message.partition(),
                    offset = message.offset(),
                    "dedup hit: already consumed; acknowledged without effect"
                );
            }
        }
        Ok(())
    }
}

/// Seconds from the event's creation (its `ce_time` header, which the relay writes in the
/// CloudEvents binary mode) to now, by this host's clock; `None` for a record without it (the
/// structured mode, records written before). A creation time ahead of this clock counts as 0.
fn since_creation(message: &BorrowedMessage<'_>) -> Option<f64> {
    let header = message.headers()?.iter().find(|header| header.key == "ce_time")?;
    let created = chrono::DateTime::parse_from_rfc3339(std::str::from_utf8(header.value?).ok()?).ok()?;
    Some((chrono::Utc::now() - created.to_utc()).to_std().unwrap_or_default().as_secs_f64())
}
