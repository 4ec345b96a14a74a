//! Waiting for one event in a user's own integration tests: until the relay published it
//! (AdminService.AwaitPublished), or until a named consumer is done with it
//! (ConsumerAdminService.AwaitConsumed), with a timeout. Each call waits on the server for at
//! most [`CALL_WAIT`]; longer timeouts call again, so no call outlives a listener's call timeout.

use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use idempost_proto::v1::{
    self as pb, admin_service_client::AdminServiceClient,
    consumer_admin_service_client::ConsumerAdminServiceClient,
};

use crate::{BearerToken, ClientError, ClientTls};

/// The longest one call asks the server to wait (the servers' own maximum).
pub const CALL_WAIT: Duration = Duration::from_secs(10);

/// How much longer than its wait a call may take before the client gives up on it: the server's
/// last read of its database, and the network.
const CALL_GRACE: Duration = Duration::from_secs(5);

/// An admin endpoint (the order service's `--admin-listen`, or a consumer's `--listen`) and the
/// token to present there.
#[derive(Debug, Clone)]
pub struct AdminEndpoint {
    channel: Channel,
    token: Option<BearerToken>,
}

impl AdminEndpoint {
    /// An endpoint over a channel already connected.
    pub fn new(channel: Channel, token: Option<BearerToken>) -> Self {
        Self { channel, token }
    }

    /// Connects to `url` as [`crate::connect_with_token`] does.
    pub async fn connect(
        url: &str,
        tls: &ClientTls,
        token: Option<BearerToken>,
    ) -> Result<Self, ClientError> {
        let channel = crate::connect_with_token(url, tls, token.as_ref()).await?;
        Ok(Self { channel, token })
    }

    fn request<T>(&self, message: T, wait: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(wait + CALL_GRACE);
        if let Some(token) = &self.token {
            token.apply(&mut request);
        }
        request
    }
}

/// The event reached the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The event awaited.
    pub event_id: String,
    /// `PUBLISHED`, or empty when retention already purged the row after publication.
    pub outbox_status: String,
}

/// The consumer committed the event's effect and applied it to its read model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    /// The event awaited.
    pub event_id: String,
    /// The consumer name that consumed it.
    pub consumer_name: String,
}

/// How a wait ended other than by reaching its goal.
#[derive(Debug, thiserror::Error)]
pub enum AwaitError {
    /// The timeout passed first. `last_state` is what was seen last: `UNKNOWN` (the order side
    /// knows no such event, or it is another tenant's), `PENDING` or `PUBLISHING` on the order
    /// side; `NOT_CONSUMED` on the consumer side.
    #[error("event {event_id} was still {last_state} after {timeout:?}")]
    TimedOut {
        /// The event awaited.
        event_id: String,
        /// The timeout given.
        timeout: Duration,
        /// What was seen last.
        last_state: String,
    },
    /// The relay gave up on the event (FAILED): it waits for an operator's redrive.
    #[error("event {event_id} is FAILED: the relay gave up; an operator may redrive it")]
    Failed {
        /// The event awaited.
        event_id: String,
    },
    /// The consumer set a record of the event aside as undecodable.
    #[error("event {event_id} was dead-lettered by {consumer_name}: {error}")]
    DeadLettered {
        /// The event awaited.
        event_id: String,
        /// The consumer.
        consumer_name: String,
        /// The consumer's decode error.
        error: String,
    },
    /// The consumer recorded the event but parked it (a missing earlier version of its order, or
    /// a type it does not know); it may still be applied later.
    #[error("event {event_id} is parked by {consumer_name}: {reason}")]
    Parked {
        /// The event awaited.
        event_id: String,
        /// The consumer.
        consumer_name: String,
        /// Why it waits.
        reason: String,
    },
    /// A call failed (refused, invalid, unavailable): its status as the server gave it.
    #[error("{0}")]
    Call(#[from] tonic::Status),
}

/// Waits up to `timeout` until the relay published `event_id`: [`AwaitError::Failed`] when the
/// relay gave up, [`AwaitError::TimedOut`] when the timeout passed first. An event not committed
/// yet is waited for; without the operator scope another tenant's event reads as unknown.
pub async fn await_published(
    admin: &AdminEndpoint,
    event_id: &str,
    timeout: Duration,
) -> Result<Published, AwaitError> {
    let mut client = AdminServiceClient::new(admin.channel.clone());
    let waiting = Waiting::new(timeout);
    loop {
        let wait = waiting.next_wait();
        let ask = pb::AwaitPublishedRequest { event_id: event_id.to_owned(), wait: proto_duration(wait) };
        let reply = client.await_published(admin.request(ask, wait)).await?.into_inner();
        match reply.state() {
            pb::PublishState::Published => {
                return Ok(Published { event_id: event_id.to_owned(), outbox_status: reply.outbox_status });
            }
            pb::PublishState::Failed => return Err(AwaitError::Failed { event_id: event_id.to_owned() }),
            _ => {}
        }
        let last_state = if reply.known { reply.outbox_status } else { "UNKNOWN".to_owned() };
        waiting.again(event_id, last_state, reply.retry_after).await?;
    }
}

/// Waits up to `timeout` until the consumer named `consumer_name` (empty: the one serving
/// `consumer`) consumed `event_id` and applied it: [`AwaitError::DeadLettered`] or
/// [`AwaitError::Parked`] when it set the event aside, [`AwaitError::TimedOut`] when the timeout
/// passed first. Needs the operator scope (the consumer's tables do not know tenants).
pub async fn await_consumed(
    consumer: &AdminEndpoint,
    event_id: &str,
    consumer_name: &str,
    timeout: Duration,
) -> Result<Consumed, AwaitError> {
    let mut client = ConsumerAdminServiceClient::new(consumer.channel.clone());
    let waiting = Waiting::new(timeout);
    loop {
        let wait = waiting.next_wait();
        let ask = pb::AwaitConsumedRequest {
            event_id: event_id.to_owned(),
            consumer_name: consumer_name.to_owned(),
            wait: proto_duration(wait),
        };
        let reply = client.await_consumed(consumer.request(ask, wait)).await?.into_inner();
        let (event_id, consumer_name) = (event_id.to_owned(), reply.consumer_name.clone());
        match reply.state() {
            pb::ConsumeState::Consumed => return Ok(Consumed { event_id, consumer_name }),
            pb::ConsumeState::DeadLettered => {
                return Err(AwaitError::DeadLettered { event_id, consumer_name, error: reply.detail });
            }
            pb::ConsumeState::Parked => {
                return Err(AwaitError::Parked { event_id, consumer_name, reason: reply.detail });
            }
            _ => {}
        }
        waiting.again(&event_id, "NOT_CONSUMED".to_owned(), reply.retry_after).await?;
    }
}

/// One wait's clock: how long the next call may wait, and whether to call again.
struct Waiting {
    timeout: Duration,
    until: Instant,
}

impl Waiting {
    fn new(timeout: Duration) -> Self {
        Self { timeout, until: Instant::now() + timeout }
    }

    /// What is left, up to [`CALL_WAIT`]; never zero, which would ask for the server's maximum.
    fn next_wait(&self) -> Duration {
        self.until.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(1), CALL_WAIT)
    }

    /// After a call that ended still waiting: [`AwaitError::TimedOut`] once the timeout passed,
    /// else a pause when the server asked for one.
    async fn again(
        &self,
        event_id: &str,
        last_state: String,
        retry_after: Option<prost_types::Duration>,
    ) -> Result<(), AwaitError> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AwaitError::TimedOut {
                event_id: event_id.to_owned(),
                timeout: self.timeout,
                last_state,
            });
        }
        if let Some(pause) = retry_after.and_then(|d| Duration::try_from(d).ok()) {
            tokio::time::sleep(pause.min(left)).await;
        }
        Ok(())
    }
}

fn proto_duration(wait: Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(wait).ok()
}
