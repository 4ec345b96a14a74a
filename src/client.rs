//! The safe caller protocol for `SubmitOrder`, for Rust callers.
//!
//! Submit; on an UNKNOWN outcome or a transport error, Reconcile by `(tenant_id, request_id)`;
//! if the order is found, use it; if not, resubmit with the same ids. Ids never change between
//! attempts, so no path can create a second order or a second event.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::backoff::Backoff;
use crate::contract::ERROR_DOMAIN;
use crate::domain::EventId;
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
        // Refused before any transaction began (the database was unreachable) or at the
        // listener's door before any handler ran (OVERLOADED): nothing was written.
        (Code::Aborted, Some("ROLLED_BACK"))
        | (Code::Unavailable, Some("DATABASE_UNAVAILABLE"))
        | (Code::ResourceExhausted, Some("OVERLOADED")) => Next::Resubmit,
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
    token: Option<BearerToken>,
}

impl SafeSubmitter {
    /// A submitter over an existing client.
    pub fn new(client: OrderServiceClient<Channel>, policy: RetryPolicy) -> Self {
        Self { client, policy, token: None }
    }

    /// Sends `token` with every call. The server takes the tenant from it: requests may leave
    /// `tenant_id` at 0.
    pub fn with_token(mut self, token: BearerToken) -> Self {
        self.token = Some(token);
        self
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
        let backoff = Backoff::new(self.policy.initial_backoff, self.policy.max_backoff);
        // Failed calls since the last fresh start; a "not found" starts the waits over.
        let mut failures = 0;
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
                        failures = 0;
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
            failures += 1;
            tokio::time::sleep(backoff.delay(failures)).await;
        }
    }

    fn deadline<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.policy.call_timeout);
        if let Some(token) = &self.token {
            token.apply(&mut request);
        }
        request
    }
}

/// A client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A CA, certificate, key or token file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token holds characters a header cannot carry (the token is not repeated here).
    #[error("the bearer token is not a valid header value")]
    InvalidToken,
    /// Not a URL.
    #[error("{0} is not a valid URL")]
    InvalidUrl(String),
    /// The connection or the TLS settings failed.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// The service's URL.
        url: String,
        /// Why.
        source: tonic::transport::Error,
    },
}

/// A bearer token sent as `authorization: Bearer <token>`. Its `Debug` output never shows it.
#[derive(Clone)]
pub struct BearerToken(MetadataValue<Ascii>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl BearerToken {
    /// The token as issued (a JWT), surrounding white space removed.
    pub fn new(token: &str) -> Result<Self, ClientError> {
        let mut value = MetadataValue::try_from(format!("Bearer {}", token.trim()))
            .map_err(|_| ClientError::InvalidToken)?;
        value.set_sensitive(true);
        Ok(Self(value))
    }

    /// The token from `file` if given, else from the environment variable `env`; `None` when
    /// neither is set.
    pub fn from_file_or_env(file: Option<&Path>, env: &str) -> Result<Option<Self>, ClientError> {
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ClientError::Read { path: path.to_owned(), source })?;
            return Self::new(&text).map(Some);
        }
        match std::env::var(env) {
            Ok(token) if !token.trim().is_empty() => Self::new(&token).map(Some),
            _ => Ok(None),
        }
    }

    /// Adds the token to `request`.
    pub fn apply<T>(&self, request: &mut tonic::Request<T>) {
        request.metadata_mut().insert("authorization", self.0.clone());
    }
}

/// How a client trusts and identifies itself to a TLS listener.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// PEM CA bundle that signed the server's certificate. With it, the URL should be `https://`.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for listeners that require mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// A connected channel to `url`: TLS when `tls` names a CA file (the server's certificate must
/// match the URL's host), plaintext otherwise.
pub async fn connect(url: &str, tls: &ClientTls) -> Result<Channel, ClientError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| ClientError::Read { path: path.to_owned(), source })
    };
    let failed = |source| ClientError::Connect { url: url.to_owned(), source };
    let mut endpoint =
        Channel::from_shared(url.to_owned()).map_err(|_| ClientError::InvalidUrl(url.to_owned()))?;
    if let Some(ca) = &tls.ca_file {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint.tls_config(config).map_err(failed)?;
    }
    endpoint.connect().await.map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    fn status(code: Code, reason: &str) -> Status {
        let mut details = ErrorDetails::new();
        details.set_error_info(reason, ERROR_DOMAIN, std::collections::HashMap::new());
        Status::with_error_details(code, "refused", details)
    }

    #[test]
    fn only_refusals_known_to_have_written_nothing_are_resubmitted_at_once() {
        let next = |code, reason| next_after_submit(&status(code, reason));
        assert!(matches!(next(Code::Aborted, "ROLLED_BACK"), Next::Resubmit));
        assert!(matches!(next(Code::ResourceExhausted, "OVERLOADED"), Next::Resubmit));
        // Exhausted for any other reason may have run: reconcile first.
        assert!(matches!(next(Code::ResourceExhausted, "SOMETHING_ELSE"), Next::Reconcile));
        assert!(matches!(next(Code::Cancelled, ""), Next::Reconcile));
        assert!(matches!(next(Code::Unauthenticated, "TOKEN_EXPIRED"), Next::GiveUp));
        assert!(matches!(next(Code::PermissionDenied, "TENANT_MISMATCH"), Next::GiveUp));
    }
}
