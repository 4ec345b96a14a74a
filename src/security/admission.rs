//! The admission of one listener's calls, in one tower layer, in this order:
//! 1. health checks are always admitted (an orchestrator must not restart a busy instance for
//!    being busy); `Health/Watch` streams up to the listener's bound and their connection's,
//!    since each lives as long as its connection;
//! 2. on a connection kept past the listener's limits, nothing else is;
//! 3. every other call but reflection is authenticated from its `authorization` header alone,
//!    before it holds anything: a caller without a valid token, or without the operator scope
//!    for a method that needs it, is answered at once, its body never read;
//! 4. one of the listener's permits and one of its connection's, or RESOURCE_EXHAUSTED at once;
//! 5. every request body, health's too, must arrive within the body timeout, and every answer
//!    but a Watch's must be delivered within the call timeout: a reader that does not take its
//!    answer then loses its permits and its connection.
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::codegen::{Bytes, http};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower::{Layer, Service};

use super::auth::{AuthError, Authenticator};
use super::connection::{ConnectionInfo, ConnectionState, InFlight};
use super::refusals::note_refusal;

const HEALTH_PATH: &str = "/grpc.health.v1.Health/";
const WATCH_PATH: &str = "/grpc.health.v1.Health/Watch";
/// Reflection answers what the services are, never data: it is not authenticated.
const REFLECTION_PATH: &str = "/grpc.reflection.";

/// An answer that was ready just before the call timeout still gets this long to be delivered,
/// so that a handler finishing late does not cost its caller the connection.
const LEAST_DELIVERY: Duration = Duration::from_secs(1);

/// What a call is, by its path: how it is admitted and how long it may live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `Health/Watch`: lives as long as its connection.
    Watch,
    /// `Health/Check`: no token, no permit.
    Health,
    /// Reflection: no token, a permit.
    Reflection,
    /// Everything else: a token and a permit.
    Call,
}

impl Kind {
    fn of(path: &str) -> Self {
        if path == WATCH_PATH {
            Self::Watch
        } else if path.starts_with(HEALTH_PATH) {
            Self::Health
        } else if path.starts_with(REFLECTION_PATH) {
            Self::Reflection
        } else {
            Self::Call
        }
    }
}

/// The call limits of one listener and its callers' authentication.
///
/// An admitted call that has not answered within the call timeout ends DEADLINE_EXCEEDED, the
/// code gRPC gives a deadline that passed. tonic's own `Server::timeout` answers CANCELLED
/// instead, which callers read as "the client gave up", not as "the server's time was up". Like
/// any deadline, it bounds the wait for the answer, not the work: a call ended here may still
/// have taken effect, so the caller treats it as unknown (the safe caller protocol reconciles).
/// A caller's own shorter deadline (`grpc-timeout`) is still enforced by tonic. The same
/// deadline bounds the answer's delivery: a caller that does not read it (an HTTP/2 window left
/// at zero) must not keep the permits of a call that is over.
#[derive(Debug, Clone)]
pub(crate) struct CallLimits {
    permits: Arc<Semaphore>,
    limit: usize,
    watches: Arc<Semaphore>,
    timeout: Duration,
    body_timeout: Duration,
    /// The methods (`/package.Service/Method`, or `/package.Service/` for all of a service's)
    /// that only operators may call.
    operator_only: &'static [&'static str],
}

impl CallLimits {
    pub(crate) fn new(limit: usize, watches: usize, timeout: Duration, body_timeout: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            watches: Arc::new(Semaphore::new(watches)),
            timeout,
            body_timeout,
            operator_only: &[],
        }
    }

    /// Refuses `methods` to callers without the operator scope at the door, before their
    /// request bodies are read.
    pub(crate) fn operators_only(&mut self, methods: &'static [&'static str]) {
        self.operator_only = methods;
    }

    /// Most calls the listener runs at once, and the longest one may run.
    pub(crate) fn bounds(&self) -> (usize, Duration) {
        (self.limit, self.timeout)
    }

    /// The layer admitting calls within these limits for callers `auth` accepts.
    pub(crate) fn admitting(&self, auth: &Authenticator) -> Admission {
        Admission { limits: self.clone(), auth: auth.clone() }
    }

    fn needs_operator(&self, path: &str) -> bool {
        self.operator_only
            .iter()
            .any(|method| path == *method || (method.ends_with('/') && path.starts_with(method)))
    }
}

/// The answer to a call refused at the door.
type Refusal = Box<http::Response<Body>>;

/// RESOURCE_EXHAUSTED with reason OVERLOADED: nothing was done.
fn overloaded(what: &str) -> Refusal {
    tracing::debug!(what, "call refused at a concurrency limit");
    let mut details = ErrorDetails::new();
    details.set_error_info("OVERLOADED", idempost_proto::ERROR_DOMAIN, std::collections::HashMap::new());
    let message = format!("{what}; nothing was done: retry after a backoff");
    Box::new(tonic::Status::with_error_details(tonic::Code::ResourceExhausted, message, details).into_http())
}

/// The caller's refusal (UNAUTHENTICATED or PERMISSION_DENIED with its reason): nothing was
/// done.
fn refused(why: AuthError) -> Refusal {
    note_refusal(why);
    let mut details = ErrorDetails::new();
    details.set_error_info(why.reason(), idempost_proto::ERROR_DOMAIN, std::collections::HashMap::new());
    Box::new(tonic::Status::with_error_details(why.code(), why.to_string(), details).into_http())
}

/// The layer built by [`CallLimits::admitting`].
#[derive(Debug, Clone)]
pub struct Admission {
    limits: CallLimits,
    auth: Authenticator,
}

impl<S> Layer<S> for Admission {
    type Service = Limited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Limited { inner, admission: self.clone() }
    }
}

/// A service behind [`Admission`].
#[derive(Debug, Clone)]
pub struct Limited<S> {
    inner: S,
    admission: Admission,
}

/// What an admitted call holds until its answer has been sent.
#[derive(Debug, Default)]
struct Held {
    connection: Option<Arc<ConnectionState>>,
    _in_flight: Option<InFlight>,
    _permits: Vec<OwnedSemaphorePermit>,
}

impl<S> Limited<S> {
    /// Admits `request` (see the module's order), or the answer that refuses it.
    fn admit(&self, kind: Kind, request: &mut http::Request<Body>) -> Result<Held, Refusal> {
        let limits = &self.admission.limits;
        let connection = request.extensions().get::<ConnectionInfo>().map(|info| Arc::clone(&info.state));
        let mut held = Held { _in_flight: None, connection: connection.clone(), _permits: Vec::new() };
        match kind {
            Kind::Watch => {
                let watch = Arc::clone(&limits.watches).try_acquire_owned();
                held._permits.push(watch.map_err(|_| overloaded("too many health Watch streams are open"))?);
                if let Some(connection) = &connection {
                    let watch = Arc::clone(&connection.watches).try_acquire_owned();
                    held._permits.push(watch.map_err(|_| {
                        overloaded("too many health Watch streams are open on this connection")
                    })?);
                }
                return Ok(held);
            }
            Kind::Health => return Ok(held),
            Kind::Reflection | Kind::Call => {}
        }
        if connection.as_ref().is_some_and(|c| c.health_only) {
            return Err(overloaded("the service is at its connection limit and answers health checks only"));
        }
        if kind == Kind::Call {
            let authorization = request.headers().get(http::header::AUTHORIZATION);
            let caller = self.admission.auth.authenticate_header(authorization.map(|v| v.as_bytes()));
            // A caller refused for its token is counted against its connection, never as its
            // activity; an authenticated one keeps its connection open.
            let caller = caller.map_err(|why| {
                let mut answer = refused(why);
                if let Some(last) = connection.as_ref().and_then(|c| c.refused()) {
                    answer.extensions_mut().insert(last);
                }
                answer
            })?;
            held._in_flight = connection.as_ref().map(|c| c.begin());
            if limits.needs_operator(request.uri().path()) {
                caller.require_operator().map_err(refused)?;
            }
            request.extensions_mut().insert(caller);
        }
        let listener = Arc::clone(&limits.permits).try_acquire_owned();
        let limit = limits.limit;
        held._permits.push(
            listener
                .map_err(|_| overloaded(&format!("{limit} calls are already running on this listener")))?,
        );
        if let Some(connection) = connection {
            let permit = Arc::clone(&connection.calls).try_acquire_owned();
            held._permits
                .push(permit.map_err(|_| overloaded("too many calls are running on this connection"))?);
        }
        Ok(held)
    }
}

impl<S> Service<http::Request<Body>> for Limited<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let kind = Kind::of(request.uri().path());
        let held = match self.admit(kind, &mut request) {
            Ok(held) => held,
            Err(refusal) => return Box::pin(std::future::ready(Ok(*refusal))),
        };
        let (timeout, body_timeout) = (self.admission.limits.timeout, self.admission.limits.body_timeout);
        let request = request.map(|body| Body::new(BodyDeadline::new(body, body_timeout)));
        let call = self.inner.call(request);
        if kind == Kind::Watch {
            // A Watch lives as long as its connection allows.
            return Box::pin(async move { Ok(call.await?.map(|body| Holding::until_sent(body, held))) });
        }
        let deadline = Instant::now() + timeout;
        Box::pin(async move {
            let answer = match tokio::time::timeout_at(deadline, call).await {
                Ok(answer) => answer?,
                Err(_) => {
                    tracing::debug!(?timeout, "call ended at the server's call timeout");
                    let status = tonic::Status::deadline_exceeded(format!(
                        "no answer within the server's call timeout ({timeout:?}); the call may or may not have taken effect"
                    ));
                    status.into_http()
                }
            };
            let deliver_by = deadline.max(Instant::now() + LEAST_DELIVERY);
            Ok(answer.map(|body| Holding::delivered_by(body, held, deliver_by)))
        })
    }
}

/// A response body that keeps what its call holds until it has been sent (or dropped), or, when
/// it has a delivery deadline, until then at the latest: past it the holdings are released and
/// the call's connection closed, which resets its stream. The deadline is kept by a timer task
/// of its own, since a body whose reader gives no flow-control window is never polled again.
struct Holding {
    body: Body,
    held: Arc<Mutex<Option<Held>>>,
    expiry: Option<AbortHandle>,
}

impl Holding {
    fn until_sent(body: Body, held: Held) -> Body {
        Body::new(Self { body, held: Arc::new(Mutex::new(Some(held))), expiry: None })
    }

    fn delivered_by(body: Body, held: Held, deadline: Instant) -> Body {
        if http_body::Body::is_end_stream(&body) {
            // Headers only (every refusal and error): no flow control can hold them back.
            return Self::until_sent(body, held);
        }
        let held = Arc::new(Mutex::new(Some(held)));
        let expiry = tokio::spawn(expire_at(deadline, Arc::clone(&held))).abort_handle();
        Body::new(Self { body, held, expiry: Some(expiry) })
    }

    /// Gives back what the call holds: its answer was sent, or will never be.
    fn release(&mut self) {
        if let Some(expiry) = self.expiry.take() {
            expiry.abort();
        }
        drop(take(&self.held));
    }
}

fn take(held: &Mutex<Option<Held>>) -> Option<Held> {
    held.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// Releases what an undelivered answer holds at `deadline`, and closes its connection.
async fn expire_at(deadline: Instant, held: Arc<Mutex<Option<Held>>>) {
    tokio::time::sleep_until(deadline).await;
    let Some(held) = take(&held) else { return };
    tracing::debug!("answer not delivered within the call timeout; permits released, connection closed");
    if let Some(connection) = &held.connection {
        connection.close();
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.release();
    }
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.expiry.is_some() && this.held.lock().unwrap_or_else(PoisonError::into_inner).is_none() {
            return Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(
                "the answer was not delivered within the server's call timeout",
            ))));
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.release();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that must be complete within its deadline: a caller that sends headers and
/// then stalls holds its permits no longer than that.
struct BodyDeadline {
    body: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl BodyDeadline {
    fn new(body: Body, timeout: Duration) -> Self {
        Self { body, deadline: Box::pin(tokio::time::sleep(timeout)), timeout }
    }
}

impl http_body::Body for BodyDeadline {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let timeout = this.timeout;
                tracing::debug!(?timeout, "request body incomplete at the body timeout");
                Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(format!(
                    "the request body did not arrive within {timeout:?}; nothing was done"
                )))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
