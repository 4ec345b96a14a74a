//! `idempostctl wait`: waits until an event is published, or consumed by a named consumer, for
//! scripts and users' integration tests; the exit code says how the wait ended.

use std::time::Duration;

use idempost_client::{AdminEndpoint, AwaitError};

/// The exit code of a wait whose timeout passed first (the event unknown, or not there yet).
pub(crate) const TIMED_OUT: u8 = 3;
/// The exit code of a wait the event will not reach on its own: FAILED on the order side,
/// dead-lettered or parked by the consumer.
pub(crate) const SET_ASIDE: u8 = 4;

/// What `wait` waits for.
#[derive(Debug, clap::Args)]
pub(crate) struct WaitArgs {
    /// Until the relay published this event (the order service's AdminService).
    #[arg(long, value_name = "EVENT_ID", required_unless_present = "consumed", conflicts_with = "consumed")]
    published: Option<String>,
    /// Until the consumer named by --consumer consumed and applied this event (the consumer's
    /// ConsumerAdminService; needs the operator scope).
    #[arg(long, value_name = "EVENT_ID", requires = "consumer")]
    consumed: Option<String>,
    /// The consumer name (its --consumer-name), with --consumed.
    #[arg(long, value_name = "NAME", requires = "consumed")]
    consumer: Option<String>,
    /// How long to wait in all, such as "30s" or "2m".
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// How a wait that did not reach its goal ended, with its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub(crate) struct WaitEnded {
    error: AwaitError,
}

impl WaitEnded {
    /// 3 when the timeout passed first; 4 when the event was set aside (FAILED, dead-lettered,
    /// parked). A failed call never gets here: it exits 1, as for every other command.
    pub(crate) fn exit_code(&self) -> u8 {
        match self.error {
            AwaitError::TimedOut { .. } => TIMED_OUT,
            _ => SET_ASIDE,
        }
    }
}

/// The admin service that answers a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The order service's AdminService (`--published`).
    Order,
    /// The consumer's ConsumerAdminService (`--consumed`).
    Consumer,
}

impl WaitArgs {
    /// Which service answers this wait: the caller connects to it.
    pub(crate) fn side(&self) -> Side {
        if self.published.is_some() { Side::Order } else { Side::Consumer }
    }
}

impl From<AwaitError> for WaitEnded {
    fn from(error: AwaitError) -> Self {
        Self { error }
    }
}

/// Runs `wait` against `endpoint` (the service [`WaitArgs::side`] names); what to print when
/// the goal was reached. A failed call comes back as `AwaitError::Call`, for the caller to report
/// as every command reports one (exit code 1).
pub(crate) async fn wait(
    endpoint: &AdminEndpoint,
    args: &WaitArgs,
    json: bool,
) -> Result<String, AwaitError> {
    if let Some(event_id) = &args.published {
        let published = idempost_client::await_published(endpoint, event_id, args.timeout).await?;
        return Ok(reached(json, &published.event_id, "published", None));
    }
    let (Some(event_id), Some(name)) = (&args.consumed, &args.consumer) else {
        unreachable!("clap requires --published, or --consumed with --consumer")
    };
    let consumed = idempost_client::await_consumed(endpoint, event_id, name, args.timeout).await?;
    Ok(reached(json, &consumed.event_id, "consumed", Some(&consumed.consumer_name)))
}

fn reached(json: bool, event_id: &str, state: &str, consumer: Option<&str>) -> String {
    if json {
        let mut answer = serde_json::json!({ "eventId": event_id, "state": state.to_ascii_uppercase() });
        if let Some(consumer) = consumer {
            answer["consumerName"] = consumer.into();
        }
        return answer.to_string();
    }
    match consumer {
        Some(consumer) => format!("event {event_id} {state} by {consumer}"),
        None => format!("event {event_id} {state}"),
    }
}
