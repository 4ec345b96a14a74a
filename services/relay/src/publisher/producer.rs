//! A librdkafka producer whose delivery reports answer each record's own channel, served by a
//! thread of its own that polls without spinning.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message as _, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};
use tokio::sync::oneshot;

/// How long each poll of the serving thread lasts. rust-rdkafka's `poll` keeps polling until
/// its deadline with the time left cut to whole milliseconds, so the last millisecond before the
/// deadline is a loop of zero-timeout polls. Its `FutureProducer` polls for 100 ms at a time, so
/// that loop spun once per poll in every relay, idle or busy: a fixed cost each further relay
/// added (figures in `docs/design/relay-lease.md`). Longer polls spin that much less often.
/// Reports are handled as they arrive however long a poll lasts; this bounds only how long the
/// thread of a dropped producer lingers.
const POLL: Duration = Duration::from_secs(1);

/// How soon a record refused for a full local queue is offered again.
const QUEUE_FULL_RETRY: Duration = Duration::from_millis(10);

/// Where the broker put a record.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placed {
    pub(super) partition: i32,
    pub(super) offset: i64,
}

type Report = Result<Placed, KafkaError>;

/// Hands each delivery report to the channel its record was sent with.
struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<oneshot::Sender<Report>>;

    fn delivery(&self, result: &DeliveryResult<'_>, answer: Self::DeliveryOpaque) {
        let report = match result {
            Ok(message) => Ok(Placed { partition: message.partition(), offset: message.offset() }),
            Err((error, _)) => Err(error.clone()),
        };
        // Nobody listening means the publish gave up waiting: nothing to tell.
        let _ = answer.send(report);
    }
}

/// A producer and the thread that serves its reports; dropping it stops the thread within
/// [`POLL`], and the last of the two to let go destroys the client.
pub(super) struct ConfirmingProducer {
    producer: Arc<BaseProducer<Reports>>,
    stop: Arc<AtomicBool>,
}

impl ConfirmingProducer {
    /// A producer with `config`, its reports served from now on.
    pub(super) fn new(config: &ClientConfig) -> Result<Self, KafkaError> {
        let producer: Arc<BaseProducer<Reports>> = Arc::new(config.create_with_context(Reports)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (serving, stopping) = (Arc::clone(&producer), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("delivery reports".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    serving.poll(POLL);
                }
            })
            .map_err(|e| KafkaError::ClientCreation(format!("no thread for delivery reports: {e}")))?;
        Ok(Self { producer, stop })
    }

    /// Enqueues a record and resolves with the broker's verdict on it (or librdkafka's, when it
    /// gave up: `delivery.timeout.ms`, a purge). A record refused for a full local queue is
    /// offered again until `queue_by`, never after it.
    pub(super) async fn send(
        &self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
        headers: OwnedHeaders,
        queue_by: tokio::time::Instant,
    ) -> Report {
        let (answer, verdict) = oneshot::channel();
        let mut record =
            BaseRecord::with_opaque_to(topic, Box::new(answer)).key(key).payload(payload).headers(headers);
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), refused))
                    if tokio::time::Instant::now() < queue_by =>
                {
                    record = refused;
                    tokio::time::sleep(QUEUE_FULL_RETRY).await;
                }
                Err((error, _)) => return Err(error),
            }
        }
        // The sender is dropped unanswered only if the client went away with the record in it,
        // which this producer's own reference prevents.
        verdict.await.unwrap_or(Err(KafkaError::Canceled))
    }

    /// librdkafka's fatal error, if the client has one.
    pub(super) fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.producer.client().fatal_error()
    }
}

impl Drop for ConfirmingProducer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
