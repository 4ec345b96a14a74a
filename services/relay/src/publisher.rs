//! Publishing to a Kafka-protocol broker, and the contract every publisher keeps.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use tracing::Instrument as _;

pub use self::cloudevents::CloudEventsMode;
use self::cloudevents::encode;
use self::producer::{ConfirmingProducer, Placed};
use super::outbox::{ClaimedEvent, Delivery};
use idempost::{failpoint, telemetry};

mod cloudevents;
mod producer;

/// Publishes one outbox event.
///
/// Contract: `publish` returns `Ok` only after the broker accepted the record at the configured
/// acknowledgement level. Any rejection, timeout or unknown result is an `Err`, and the caller
/// must then not mark the event PUBLISHED. It resolves only once the record can no longer reach
/// the broker by this publish (confirmed, refused, or given up by the client), so that the caller
/// may hand the event to another claim; a caller that stops waiting earlier leaves the event to
/// its lease.
pub trait Publisher: Send + Sync {
    /// Publishes `event` through producer `lane` (counted modulo [`Publisher::lanes`]) and waits
    /// for the verdict on it. The record is handed to the client before `hand_over_by` or not
    /// at all (an `Err`).
    fn publish(
        &self,
        event: &ClaimedEvent,
        lane: usize,
        hand_over_by: tokio::time::Instant,
    ) -> impl Future<Output = Result<Delivery, PublishError>> + Send;

    /// Producers this publisher sends through, each with a connection of its own: the relay
    /// hands each of them one batch at a time (see [`super::worker`]).
    fn lanes(&self) -> usize {
        1
    }

    /// A reason this publisher can never publish again, if it has one (librdkafka's idempotent
    /// producer raises such fatal errors).
    fn fatal_error(&self) -> Option<String> {
        None
    }

    /// Replaces `lane`'s client when it can never publish again (a fatal error), or, when
    /// `rejecting`, when the broker answered its every publish since its last confirm with an
    /// error. `Ok(Some(why))` when it replaced the client, `Ok(None)` when nothing needed
    /// replacing, `Err` when a client is unusable and cannot be replaced: the relay then stops.
    /// Callers call it between batches, after every failed publish of the old client was
    /// released.
    fn recover(&self, lane: usize, rejecting: bool) -> Result<Option<String>, String> {
        let _ = (lane, rejecting);
        self.fatal_error().map_or(Ok(None), Err)
    }
}

/// The broker did not confirm a record.
#[derive(Debug, thiserror::Error)]
#[error("publish of {event_id} not confirmed: {source}")]
pub struct PublishError {
    /// The event.
    pub(crate) event_id: String,
    /// What the client reported.
    #[source]
    pub(crate) source: KafkaError,
}

impl PublishError {
    /// Whether the broker as a whole, not this record, is to blame: nothing reached a broker that
    /// could take it (unreachable, timed out, no leader, too few replicas, the local queue full).
    /// Such a failure says nothing about the event, so it must not spend the event's attempts;
    /// a record the broker refused (too large, invalid, not authorized, ...) does.
    pub(crate) fn broker_unavailable(&self) -> bool {
        use rdkafka::types::RDKafkaErrorCode as Code;
        let code = match &self.source {
            KafkaError::MessageProduction(code) => *code,
            _ => return false,
        };
        matches!(
            code,
            Code::MessageTimedOut
                | Code::AllBrokersDown
                | Code::BrokerTransportFailure
                | Code::BrokerDestroy
                | Code::Resolve
                | Code::OperationTimedOut
                | Code::QueueFull
                | Code::PurgeQueue
                | Code::PurgeInflight
                | Code::LeaderNotAvailable
                | Code::NotLeaderForPartition
                | Code::PreferredLeaderNotAvailable
                | Code::RequestTimedOut
                | Code::BrokerNotAvailable
                | Code::NetworkException
                | Code::NotEnoughReplicas
                | Code::NotEnoughReplicasAfterAppend
                | Code::KafkaStorageError
        )
    }
}

/// The producer's settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ProducerConfigError {
    /// A setting would weaken the delivery guarantee.
    #[error("kafka option `{key}={value}` is not allowed: {why}")]
    Weakens {
        /// The option.
        key: String,
        /// Its value.
        value: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// librdkafka refused the configuration.
    #[error("invalid kafka producer configuration: {0}")]
    Client(#[from] KafkaError),
}

/// A confirmed publisher over librdkafka's idempotent producers with `acks=all` (one per lane),
/// which replaces a producer inside the process when it turns fatal or only gets errors (see
/// [`Publisher::recover`]).
pub struct KafkaPublisher {
    config: ClientConfig,
    /// One producer per lane. A broker serves one produce request per partition of a producer
    /// at a time, so a second producer is what lets one relay keep the broker as busy as two
    /// relays would (see `docs/design/relay-lease.md`, batches in flight).
    lanes: Vec<RwLock<Arc<ProducerSlot>>>,
    topic: String,
    /// How records carry the CloudEvents attributes.
    mode: CloudEventsMode,
    /// Whether binary-mode records also carry the project's own headers that a `ce_*` header
    /// repeats (see [`cloudevents::encode`]).
    legacy_headers: bool,
}

/// One librdkafka producer; `poisoned` stands in for a fatal error a test injects.
struct ProducerSlot {
    client: ConfirmingProducer,
    poisoned: AtomicBool,
    /// Publishes the broker answered with an error since this producer's last confirm.
    rejected_in_a_row: AtomicU64,
}

impl ProducerSlot {
    fn fatal_error(&self) -> Option<String> {
        if self.poisoned.load(Ordering::Relaxed) {
            return Some(format!(
                "{:?}: injected at {}",
                RDKafkaErrorCode::Fatal,
                failpoint::RELAY_PRODUCER_FATAL
            ));
        }
        self.client.fatal_error().map(|(code, reason)| format!("{code:?}: {reason}"))
    }
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher").field("topic", &self.topic).finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A producer for `topic` at `brokers`.
    ///
    /// `options` pass through to librdkafka (SASL, TLS, batching, ...), except that none may turn
    /// off idempotence or lower `acks` below `all`. `delivery_timeout` bounds each publish,
    /// retries included (`delivery.timeout.ms`).
    pub fn new(
        brokers: &str,
        topic: impl Into<String>,
        delivery_timeout: Duration,
        options: &[(String, String)],
    ) -> Result<Self, ProducerConfigError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("delivery.timeout.ms", delivery_timeout.as_millis().to_string())
            .set("linger.ms", "5");
        for (key, value) in options {
            let refused = match key.as_str() {
                "enable.idempotence" if value != "true" => Some("idempotence keeps retries from duplicating"),
                "acks" | "request.required.acks" if value != "all" && value != "-1" => {
                    Some("only acks=all makes a confirm mean the record is replicated")
                }
                "delivery.timeout.ms" | "message.timeout.ms" => Some("set it with --delivery-timeout"),
                _ => None,
            };
            if let Some(why) = refused {
                return Err(ProducerConfigError::Weakens { key: key.clone(), value: value.clone(), why });
            }
            config.set(key, value);
        }
        let producer = Self::create(&config)?;
        Ok(Self {
            config,
            lanes: vec![RwLock::new(producer)],
            topic: topic.into(),
            mode: CloudEventsMode::default(),
            legacy_headers: true,
        })
    }

    /// This publisher writing its records in CloudEvents `mode` (binary unless told).
    #[must_use]
    pub fn with_cloudevents_mode(mut self, mode: CloudEventsMode) -> Self {
        self.mode = mode;
        self
    }

    /// This publisher leaving out of binary-mode records the project's own headers that a
    /// `ce_*` header repeats (`event_id`, `event_type`, `aggregate_id`, `traceparent`,
    /// `tracestate`) unless `legacy_headers`.
    #[must_use]
    pub fn with_legacy_headers(mut self, legacy_headers: bool) -> Self {
        self.legacy_headers = legacy_headers;
        self
    }

    /// This publisher with `producers` producers (at least one), each a lane of its own.
    pub fn with_producers(mut self, producers: usize) -> Result<Self, ProducerConfigError> {
        while self.lanes.len() < producers {
            self.lanes.push(RwLock::new(Self::create(&self.config)?));
        }
        Ok(self)
    }

    fn create(config: &ClientConfig) -> Result<Arc<ProducerSlot>, KafkaError> {
        Ok(Arc::new(ProducerSlot {
            client: ConfirmingProducer::new(config)?,
            poisoned: AtomicBool::new(false),
            rejected_in_a_row: AtomicU64::new(0),
        }))
    }

    /// The producer of `lane` in use now; a publish keeps it alive until its verdict, even if
    /// another task replaces it meanwhile.
    fn current(&self, lane: usize) -> Arc<ProducerSlot> {
        let slot = &self.lanes[lane % self.lanes.len()];
        Arc::clone(&slot.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Replaces the producer of `lane` when it is fatal or, when `rejecting`, got only errors
    /// since its last confirm; answers why it did.
    fn recover_lane(
        &self,
        lane: &RwLock<Arc<ProducerSlot>>,
        rejecting: bool,
    ) -> Result<Option<String>, String> {
        let mut producer = lane.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Checked under the write lock: when several step loops share this publisher, only the
        // first to see the bad producer replaces it.
        let rejected = producer.rejected_in_a_row.load(Ordering::Relaxed);
        let why = match producer.fatal_error() {
            Some(fatal) => format!("fatal error: {fatal}"),
            None if rejecting && rejected > 0 => {
                format!("the broker answered the last {rejected} publishes with errors and confirmed none")
            }
            None => return Ok(None),
        };
        let fresh = Self::create(&self.config).map_err(|e| format!("{why}; a new producer failed: {e}"))?;
        // The old client is destroyed on its own reports thread (which joins librdkafka's
        // threads), not here on a runtime worker.
        *producer = fresh;
        Ok(Some(why))
    }

    /// What a send's outcome means for the caller, recorded on its span.
    fn verdict(
        &self,
        producer: &ProducerSlot,
        sent: Result<Placed, KafkaError>,
        span: &tracing::Span,
        event_id: String,
    ) -> Result<Delivery, PublishError> {
        match sent {
            Ok(delivery) => {
                producer.rejected_in_a_row.store(0, Ordering::Relaxed);
                span.record("messaging.destination.partition.id", delivery.partition);
                span.record("messaging.kafka.offset", delivery.offset);
                span.in_scope(|| {
                    tracing::info!(
                        partition = delivery.partition,
                        offset = delivery.offset,
                        "broker confirmed"
                    );
                });
                Ok(Delivery {
                    topic: self.topic.clone(),
                    partition: delivery.partition,
                    offset: delivery.offset,
                })
            }
            Err(source) => {
                if answered_by_broker(&source) {
                    producer.rejected_in_a_row.fetch_add(1, Ordering::Relaxed);
                }
                span.record("otel.status_code", "ERROR");
                span.in_scope(|| tracing::warn!(error = %source, "publish not confirmed"));
                Err(PublishError { event_id, source })
            }
        }
    }
}

/// Whether the broker itself answered with `error` (as opposed to a local timeout, a lost
/// connection or a queue limit, which librdkafka reports with codes from -199 to -100).
fn answered_by_broker(error: &KafkaError) -> bool {
    error.rdkafka_error_code().is_some_and(|code| code as i32 > -100)
}

impl Publisher for KafkaPublisher {
    /// Builds the record (span, headers) at once and enqueues it on the returned future's first
    /// poll: a step that calls `publish` for its whole batch before polling any of them hands
    /// librdkafka the batch in one burst, well inside `linger.ms`, so no record of it waits in
    /// the producer's queue for the next produce request (see [`super::worker`]).
    fn publish<'s, 'e>(
        &'s self,
        event: &'e ClaimedEvent,
        lane: usize,
        hand_over_by: tokio::time::Instant,
    ) -> impl Future<Output = Result<Delivery, PublishError>> + Send + use<'s, 'e> {
        // A producer span in the event's own trace; its context travels in `traceparent`, so the
        // consumer continues the same trace.
        let span = tracing::info_span!(
            "send",
            otel.name = format!("send {}", self.topic),
            otel.kind = "producer",
            otel.status_code = tracing::field::Empty,
            messaging.system = "kafka",
            messaging.operation.type = "send",
            messaging.operation.name = "send",
            messaging.destination.name = %self.topic,
            messaging.message.id = %event.event_id,
            messaging.kafka.message.key = %event.aggregate_id,
            messaging.destination.partition.id = tracing::field::Empty,
            messaging.kafka.offset = tracing::field::Empty,
            idempost.event_id = %event.event_id,
            trace_id = tracing::field::Empty,
        );
        telemetry::record_trace_id(&span);
        let mut trace_headers = Vec::new();
        telemetry::inject_into(&span, |key, value| trace_headers.push((key.to_owned(), value)));

        let record = encode(event, self.mode, self.legacy_headers, &trace_headers);
        let producer = self.current(lane);
        if failpoint::hit(failpoint::RELAY_PRODUCER_FATAL).is_err() {
            producer.poisoned.store(true, Ordering::Relaxed);
        }
        let refused = failpoint::argument(failpoint::RELAY_PUBLISH_REJECTED_FOR_AGGREGATE)
            .is_some_and(|aggregate| aggregate == event.aggregate_id);
        let event_id = event.event_id.clone();
        async move {
            // The delivery report, not the enqueue, is the confirmation: `send` resolves only
            // when librdkafka has the broker's answer for this record, or gave up on it.
            let sent = if producer.poisoned.load(Ordering::Relaxed) {
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fatal))
            } else if refused {
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::InvalidRecord))
            } else {
                producer
                    .client
                    .send(
                        &self.topic,
                        event.aggregate_id.as_bytes(),
                        &record.value,
                        record.headers,
                        hand_over_by,
                    )
                    .instrument(span.clone())
                    .await
            };
            self.verdict(&producer, sent, &span, event_id)
        }
    }

    fn lanes(&self) -> usize {
        self.lanes.len()
    }

    fn fatal_error(&self) -> Option<String> {
        (0..self.lanes.len()).find_map(|lane| self.current(lane).fatal_error())
    }

    fn recover(&self, lane: usize, rejecting: bool) -> Result<Option<String>, String> {
        self.recover_lane(&self.lanes[lane % self.lanes.len()], rejecting)
    }
}
