//! The safe caller protocol for `SubmitOrder`, for Rust callers.
//!
//! Submit; on an UNKNOWN outcome or a transport error, Reconcile by `(tenant_id, request_id)`;
//! if the order is found, use it; if not, resubmit with the same ids. Ids never change between
//! attempts, so no path can create a second order or a second event.

use std::time::Duration;

use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::domain::EventId;
use crate::order::ERROR_DOMAIN;
use crate::proto::v1::{self as pb, order_service_client::OrderServiceClient};

/// How hard the submitter tries.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Most calls (submits and reconciles together) before giving up.
    pub max_calls: u32,
    /// Wait before the second call; doubled after each further failure.
    pub initial_backoff: Duration,
    /// Longest wait between calls.
    pub max_backoff: Duration,
    /// Deadline of each call.
    pub call_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_calls: 8,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            call_timeout: Duration::from_secs(10),
        }
    }
}

/// How the order's committed state was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// SubmitOrder answered COMMITTED for a new order.
    Committed,
    /// SubmitOrder answered that an identical earlier submission had committed it.
    Replayed,
    /// An attempt's outcome was unknown and Reconcile found the order.
    Reconciled,
}

/// A committed order, however its commit was learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmedOrder {
    /// The server-assigned order id.
    pub order_id: i64,
    /// The acceptance event's id: the one the caller fixed before the first attempt.
    pub event_id: String,
    /// How the commit was learned.
    pub confirmation: Confirmation,
    /// Calls made, submits and reconciles together.
    pub calls: u32,
}

/// The submitter stopped without a committed order.
#[derive(Debug, thiserror::Error)]
pub enum SafeSubmitError {
    /// The server refused the order for a reason retrying cannot fix (invalid input, a request
    /// id reused for other content, ...). Nothing was written by this submission.
    #[error("rejected: {0}")]
    Rejected(Status),
    /// Every allowed call failed. The order may exist: reconcile later with the same ids.
    #[error("gave up after {calls} calls; last error: {last}")]
    GaveUp {
        /// Calls made.
        calls: u32,
        /// The event id to reuse when trying again.
        event_id: String,
        /// The last error seen.
        last: Status,
    },
}

/// What to do after a failed call.
enum Next {
    /// Nothing was written: submit again with the same ids.
    Resubmit,
    /// The outcome is unknown: ask Reconcile first.
    Reconcile,
    /// Retrying cannot help.
    GiveUp,
}

/// Classifies a SubmitOrder failure. Anything not known to be safe is treated as unknown:
/// reconciling is always safe, resubmitting blindly is not.
fn next_after_submit(status: &Status) -> Next {
    let reason =
        status.get_details_error_info().filter(|info| info.domain == ERROR_DOMAIN).map(|info| info.reason);
    match (status.code(), reason.as_deref()) {
        (Code::Aborted, Some("ROLLED_BACK")) | (Code::Unavailable, Some("DATABASE_UNAVAILABLE")) => {
            Next::Resubmit
        }
        (
            Code::InvalidArgument
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented,
            _,
        ) => Next::GiveUp,
        _ => Next::Reconcile,
    }
}

/// Submits orders with the safe caller protocol.
#[derive(Debug, Clone)]
pub struct SafeSubmitter {
    client: OrderServiceClient<Channel>,
    policy: RetryPolicy,
}

impl SafeSubmitter {
    /// A submitter over an existing client.
    pub fn new(client: OrderServiceClient<Channel>, policy: RetryPolicy) -> Self {
        Self { client, policy }
    }

    /// Submits `request` until its outcome is known or the policy's calls run out.
    ///
    /// An empty `event_id` is filled in once, before the first attempt, and reused by every
    /// retry.
    pub async fn submit(
        &mut self,
        mut request: pb::SubmitOrderRequest,
    ) -> Result<ConfirmedOrder, SafeSubmitError> {
        if request.event_id.is_empty() {
            request.event_id = EventId::new().to_string();
        }
        let key =
            pb::ReconcileRequest { tenant_id: request.tenant_id, request_id: request.request_id.clone() };
        let mut calls = 0;
        let mut reconcile_first = false;
        let mut backoff = self.policy.initial_backoff;
        loop {
            calls += 1;
            let failure = if reconcile_first {
                match self.client.reconcile(self.deadline(key.clone())).await {
                    Ok(found) => {
                        let found = found.into_inner();
                        return Ok(ConfirmedOrder {
                            order_id: found.order_id,
                            event_id: found.event_id,
                            confirmation: Confirmation::Reconciled,
                            calls,
                        });
                    }
                    Err(status) if status.code() == Code::NotFound => {
                        // Not committed: the same ids may be submitted again.
                        reconcile_first = false;
                        backoff = self.policy.initial_backoff;
                        continue;
                    }
                    Err(status) => status,
                }
            } else {
                match self.client.submit_order(self.deadline(request.clone())).await {
                    Ok(accepted) => {
                        let accepted = accepted.into_inner();
                        let confirmation =
                            if accepted.replayed { Confirmation::Replayed } else { Confirmation::Committed };
                        return Ok(ConfirmedOrder {
                            order_id: accepted.order_id,
                            event_id: accepted.event_id,
                            confirmation,
                            calls,
                        });
                    }
                    Err(status) => {
                        match next_after_submit(&status) {
                            Next::GiveUp => return Err(SafeSubmitError::Rejected(status)),
                            Next::Reconcile => reconcile_first = true,
                            Next::Resubmit => {}
                        }
                        status
                    }
                }
            };
            if calls >= self.policy.max_calls {
                return Err(SafeSubmitError::GaveUp { calls, event_id: request.event_id, last: failure });
            }
            tracing::debug!(calls, error = %failure, reconcile_first, "retrying submission");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.policy.max_backoff);
        }
    }

    fn deadline<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.policy.call_timeout);
        request
    }
}
