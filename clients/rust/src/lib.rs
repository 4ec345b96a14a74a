//! Idempost's Rust client: the safe caller protocol for `SubmitOrder`, `AmendOrder` and
//! `CancelOrder`, connecting to any Idempost listener (TLS, bearer tokens), and waiting for an
//! event in a user's own tests ([`await_published`], [`await_consumed`]).
//!
//! Send; on an UNKNOWN outcome or a transport error, Reconcile by `(tenant_id, request_id)`;
//! if the write is found, use it; if not, send it again with the same ids. Ids never change
//! between attempts, so no path can create a second order, a second change or a second event.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::codegen::http::Uri;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use idempost_proto::v1::{self as pb, order_service_client::OrderServiceClient};
use idempost_proto::{ERROR_DOMAIN, EventId};

mod awaiting;
mod backoff;

pub use awaiting::{
    AdminEndpoint, AwaitError, CALL_WAIT, Consumed, Published, await_consumed, await_published,
};
pub use backoff::Backoff;

/// How hard the submitter tries.
#[derive(Debug, Clone)]
pub struct SubmitPolicy {
    /// Most calls (submits and reconciles together) before giving up.
    pub max_calls: u32,
    /// Wait before the second call; doubled after each further failure.
    pub initial_backoff: Duration,
    /// Longest wait between calls.
    pub max_backoff: Duration,
    /// Deadline of each call.
    pub call_timeout: Duration,
}

impl Default for SubmitPolicy {
    fn default() -> Self {
        Self {
            max_calls: 8,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            call_timeout: Duration::from_secs(10),
        }
    }
}

/// How the write's committed state was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// The call answered COMMITTED for a new order or change.
    Committed,
    /// The call answered that an identical earlier call had committed it.
    Replayed,
    /// An attempt's outcome was unknown and Reconcile found the write.
    Reconciled,
}

/// A committed write (an order, or a change of one), however its commit was learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmedOrder {
    /// The server-assigned order id.
    pub order_id: i64,
    /// The id of the event committed with the write (the acceptance, amendment or
    /// cancellation): the one the caller fixed before the first attempt.
    pub event_id: String,
    /// The order's version the write made (1 for a submission).
    pub version: i64,
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
    policy: SubmitPolicy,
    token: Option<BearerToken>,
}

impl SafeSubmitter {
    /// A submitter over an existing client.
    pub fn new(client: OrderServiceClient<Channel>, policy: SubmitPolicy) -> Self {
        Self { client, policy, token: None }
    }

    /// A submitter of the order service at `url` that sends `token` with every call (the
    /// server takes the tenant from it: requests may leave `tenant_id` at 0). The token travels
    /// only over TLS or to a loopback address: see [`connect_with_token`].
    pub async fn connect(
        url: &str,
        tls: &ClientTls,
        token: Option<BearerToken>,
        policy: SubmitPolicy,
    ) -> Result<Self, ClientError> {
        let channel = connect_with_token(url, tls, token.as_ref()).await?;
        Ok(Self { client: OrderServiceClient::new(channel), policy, token })
    }

    /// Submits `request` until its outcome is known or the policy's calls run out.
    ///
    /// An empty `event_id` is filled in once, before the first attempt, and reused by every
    /// retry.
    pub async fn submit(
        &mut self,
        request: pb::SubmitOrderRequest,
    ) -> Result<ConfirmedOrder, SafeSubmitError> {
        self.run(request).await
    }

    /// Amends an order with the same protocol as [`Self::submit`]: its outcome is known, or
    /// the calls ran out. A refusal (VERSION_CONFLICT, ORDER_CANCELLED, ORDER_NOT_FOUND) is
    /// [`SafeSubmitError::Rejected`]: read the order, decide, and send a new change with a new
    /// request id.
    pub async fn amend(&mut self, request: pb::AmendOrderRequest) -> Result<ConfirmedOrder, SafeSubmitError> {
        self.run(request).await
    }

    /// Cancels an order with the same protocol as [`Self::amend`].
    pub async fn cancel(
        &mut self,
        request: pb::CancelOrderRequest,
    ) -> Result<ConfirmedOrder, SafeSubmitError> {
        self.run(request).await
    }

    /// The safe caller protocol for any write `W`: the ids are fixed before the first call and
    /// never change; an unknown outcome is reconciled by `(tenant_id, request_id)` before
    /// anything is sent again.
    async fn run<W: Write>(&mut self, mut request: W) -> Result<ConfirmedOrder, SafeSubmitError> {
        if request.event_id().is_empty() {
            *request.event_id() = EventId::new().to_string();
        }
        let key = request.key();
        let mut calls = 0;
        let mut reconcile_first = false;
        let backoff = Backoff::new(self.policy.initial_backoff, self.policy.max_backoff);
        // Failed calls since the last fresh start; a "not found" starts the waits over.
        let mut failures = 0;
        loop {
            calls += 1;
            let failure = if reconcile_first {
                match self.client.reconcile(self.deadline(key.clone())).await {
                    Ok(found) => return reconciled(found.into_inner(), W::OPERATION, calls),
                    Err(status) if status.code() == Code::NotFound => {
                        // Not committed: the same ids may be sent again.
                        reconcile_first = false;
                        failures = 0;
                        continue;
                    }
                    Err(status) => status,
                }
            } else {
                let call = self.deadline(request.clone());
                match W::send(&mut self.client, call).await {
                    Ok(answer) => {
                        let (order_id, event_id, version, replayed) = W::committed(answer.into_inner());
                        let confirmation =
                            if replayed { Confirmation::Replayed } else { Confirmation::Committed };
                        return Ok(ConfirmedOrder { order_id, event_id, version, confirmation, calls });
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
                let event_id = request.event_id().clone();
                return Err(SafeSubmitError::GaveUp { calls, event_id, last: failure });
            }
            tracing::debug!(calls, error = %failure, reconcile_first, "retrying");
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

/// What Reconcile found under the key of a write of `operation`. A key that another operation
/// used means this write never committed under it (the server would have answered
/// REQUEST_ID_REUSED): a rejection, not a confirmation.
fn reconciled(
    found: pb::ReconcileResponse,
    operation: pb::OrderOperation,
    calls: u32,
) -> Result<ConfirmedOrder, SafeSubmitError> {
    // A server older than the operation field sends UNSPECIFIED, and had submissions only.
    let used_by = match found.operation() {
        pb::OrderOperation::Unspecified => pb::OrderOperation::Submit,
        used_by => used_by,
    };
    if used_by != operation {
        return Err(SafeSubmitError::Rejected(Status::already_exists(format!(
            "the request id was used by {} (event {}), not by this {}",
            used_by.as_str_name(),
            found.event_id,
            operation.as_str_name()
        ))));
    }
    Ok(ConfirmedOrder {
        order_id: found.order_id,
        event_id: found.event_id,
        version: found.version,
        confirmation: Confirmation::Reconciled,
        calls,
    })
}

/// A write the safe caller protocol can send: SubmitOrder, AmendOrder or CancelOrder.
trait Write: Clone + Send + Sync + 'static {
    /// The answer on OK.
    type Answer;
    /// What Reconcile reports for a key this write used.
    const OPERATION: pb::OrderOperation;
    /// The idempotency key to reconcile by.
    fn key(&self) -> pb::ReconcileRequest;
    /// The event id, fixed before the first attempt.
    fn event_id(&mut self) -> &mut String;
    /// Sends the write once.
    fn send(
        client: &mut OrderServiceClient<Channel>,
        request: tonic::Request<Self>,
    ) -> impl Future<Output = Result<tonic::Response<Self::Answer>, Status>> + Send;
    /// Order id, event id, version and `replayed` of a committed answer.
    fn committed(answer: Self::Answer) -> (i64, String, i64, bool);
}

/// The parts of [`Write`] every request spells the same way.
macro_rules! write_request {
    ($request:ty, $answer:ty, $operation:expr, $method:ident) => {
        impl Write for $request {
            type Answer = $answer;
            const OPERATION: pb::OrderOperation = $operation;

            fn key(&self) -> pb::ReconcileRequest {
                pb::ReconcileRequest { tenant_id: self.tenant_id, request_id: self.request_id.clone() }
            }

            fn event_id(&mut self) -> &mut String {
                &mut self.event_id
            }

            fn send(
                client: &mut OrderServiceClient<Channel>,
                request: tonic::Request<Self>,
            ) -> impl Future<Output = Result<tonic::Response<Self::Answer>, Status>> + Send {
                client.$method(request)
            }

            fn committed(answer: Self::Answer) -> (i64, String, i64, bool) {
                (answer.order_id, answer.event_id, answer.version, answer.replayed)
            }
        }
    };
}

write_request!(pb::SubmitOrderRequest, pb::SubmitOrderResponse, pb::OrderOperation::Submit, submit_order);
write_request!(pb::AmendOrderRequest, pb::AmendOrderResponse, pb::OrderOperation::Amend, amend_order);
write_request!(pb::CancelOrderRequest, pb::CancelOrderResponse, pb::OrderOperation::Cancel, cancel_order);

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
    /// A bearer token would travel in plaintext to a host other than this one.
    #[error(
        "refusing to send the bearer token in plaintext to {url}: use an https:// URL with a CA file, \
         or a loopback address"
    )]
    PlaintextToken {
        /// The service's URL.
        url: String,
    },
    /// A CA file names the server to trust, but the URL is plaintext.
    #[error("a CA file is set but {url} is plaintext (http://): use https://")]
    PlaintextWithCa {
        /// The service's URL.
        url: String,
    },
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

/// `url` with its scheme settled: as written when it has one; without one (`host:port`),
/// `https://` when TLS or a token is configured, `http://` otherwise.
pub fn settled_url(url: &str, tls: &ClientTls, token: bool) -> String {
    if url.contains("://") {
        url.to_owned()
    } else if tls.ca_file.is_some() || token {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    }
}

/// Whether `url` names this host: `localhost` or a loopback address.
fn is_loopback(url: &Uri) -> bool {
    let host = url.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A connected channel to `url`: TLS when `tls` names a CA file (the server's certificate must
/// match the URL's host), plaintext otherwise. A URL without a scheme gets one by
/// [`settled_url`]; a CA file with an `http://` URL is refused rather than ignored.
pub async fn connect(url: &str, tls: &ClientTls) -> Result<Channel, ClientError> {
    let url = settled_url(url, tls, false);
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| ClientError::Read { path: path.to_owned(), source })
    };
    let failed = |source| ClientError::Connect { url: url.clone(), source };
    let mut endpoint = Channel::from_shared(url.clone()).map_err(|_| ClientError::InvalidUrl(url.clone()))?;
    if let Some(ca) = &tls.ca_file {
        if endpoint.uri().scheme_str() != Some("https") {
            return Err(ClientError::PlaintextWithCa { url: url.clone() });
        }
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint.tls_config(config).map_err(failed)?;
    }
    endpoint.connect().await.map_err(failed)
}

/// [`connect`] for a client that sends `token` on the channel: the token travels only over TLS
/// (`https://`) or to a loopback address, and a URL without a scheme defaults to `https://`.
/// Any other URL is refused before a connection is opened.
pub async fn connect_with_token(
    url: &str,
    tls: &ClientTls,
    token: Option<&BearerToken>,
) -> Result<Channel, ClientError> {
    connect(&token_url(url, tls, token)?, tls).await
}

/// The URL a client that sends `token` may connect to: `url` with its scheme settled
/// ([`settled_url`]), or [`ClientError::PlaintextToken`] when the token would travel in plaintext
/// to a host other than this one. Checks only; connects nowhere.
pub fn token_url(url: &str, tls: &ClientTls, token: Option<&BearerToken>) -> Result<String, ClientError> {
    let url = settled_url(url, tls, token.is_some());
    if token.is_some() {
        let uri: Uri = url.parse().map_err(|_| ClientError::InvalidUrl(url.clone()))?;
        if uri.scheme_str() != Some("https") && !is_loopback(&uri) {
            return Err(ClientError::PlaintextToken { url });
        }
    }
    Ok(url)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    fn status(code: Code, reason: &str) -> Status {
        let mut details = ErrorDetails::new();
        details.set_error_info(reason, ERROR_DOMAIN, std::collections::HashMap::new());
        Status::with_error_details(code, "refused", details)
    }

    #[test]
    fn a_url_without_a_scheme_is_https_when_tls_or_a_token_is_configured() {
        let plain = ClientTls::default();
        let ca = ClientTls { ca_file: Some("ca.pem".into()), identity: None };
        assert_eq!(settled_url("db:50051", &plain, false), "http://db:50051");
        assert_eq!(settled_url("db:50051", &plain, true), "https://db:50051");
        assert_eq!(settled_url("db:50051", &ca, false), "https://db:50051");
        assert_eq!(settled_url("http://db:50051", &plain, true), "http://db:50051", "as written");
    }

    #[test]
    fn loopback_is_localhost_or_a_loopback_address() {
        let loopback = |url: &str| is_loopback(&url.parse::<Uri>().unwrap());
        for url in ["http://127.0.0.1:1", "http://127.8.9.10:1", "http://[::1]:1", "http://LocalHost:1"] {
            assert!(loopback(url), "{url}");
        }
        for url in ["http://10.0.0.1:1", "http://[::2]:1", "http://localhost.example:1", "http://db:1"] {
            assert!(!loopback(url), "{url}");
        }
    }

    #[tokio::test]
    async fn a_token_is_refused_in_plaintext_to_another_host_before_any_connection() {
        let token = BearerToken::new("a.b.c").unwrap();
        let refused = connect_with_token("http://192.0.2.1:50051", &ClientTls::default(), Some(&token)).await;
        assert!(matches!(refused, Err(ClientError::PlaintextToken { .. })), "{refused:?}");
        let ca = ClientTls { ca_file: Some("ca.pem".into()), identity: None };
        let refused = connect("http://192.0.2.1:50051", &ca).await;
        assert!(matches!(refused, Err(ClientError::PlaintextWithCa { .. })), "{refused:?}");
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
