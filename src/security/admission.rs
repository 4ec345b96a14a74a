//! The admission of one listener's calls, in one tower layer, in this order:
//! 1. health checks are always admitted (an orchestrator must not restart a busy instance for
//!    being busy); `Health/Watch` streams up to their own bound, since each lives as long as its
//!    connection;
//! 2. on a connection kept past the listener's limits, nothing else is;
//! 3. every other call is authenticated from its `authorization` header alone, before it holds
//!    anything: a caller without a valid token is answered at once, its body never read;
//! 4. one of the listener's permits and one of its connection's, or RESOURCE_EXHAUSTED at once;
//! 5. its request body must arrive within the body timeout, its answer within the call timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::{Bytes, http};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower::{Layer, Service};

use super::auth::{AuthError, Authenticator};
use super::connection::{ConnectionInfo, InFlight};
use super::refusals::note_refusal;

const HEALTH_PATH: &str = "/grpc.health.v1.Health/";
const WATCH_PATH: &str = "/grpc.health.v1.Health/Watch";
/// Reflection answers what the services are, never data: it is not authenticated.
const REFLECTION_PATH: &str = "/grpc.reflection.";

/// The call limits of one listener and its callers' authentication.
///
/// An admitted call that has not answered within the call timeout ends DEADLINE_EXCEEDED, the
/// code gRPC gives a deadline that passed. tonic's own `Server::timeout` answers CANCELLED
/// instead, which callers read as "the client gave up", not as "the server's time was up". Like
/// any deadline, it bounds the wait for the answer, not the work: a call ended here may still
/// have taken effect, so the caller treats it as unknown (the safe caller protocol reconciles).
/// A caller's own shorter deadline (`grpc-timeout`) is still enforced by tonic.
#[derive(Debug, Clone)]
pub(crate) struct CallLimits {
    permits: Arc<Semaphore>,
    limit: usize,
    watches: Arc<Semaphore>,
    timeout: Duration,
    body_timeout: Duration,
}

impl CallLimits {
    pub(crate) fn new(limit: usize, watches: usize, timeout: Duration, body_timeout: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            watches: Arc::new(Semaphore::new(watches)),
            timeout,
            body_timeout,
        }
    }

    /// Most calls the listener runs at once, and the longest one may run.
    pub(crate) fn bounds(&self) -> (usize, Duration) {
        (self.limit, self.timeout)
    }

    /// The layer admitting calls within these limits for callers `auth` accepts.
    pub(crate) fn admitting(&self, auth: &Authenticator) -> Admission {
        Admission { limits: self.clone(), auth: auth.clone() }
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

/// The caller's refusal (UNAUTHENTICATED with its reason): nothing was done.
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
    _in_flight: Option<InFlight>,
    _permits: Vec<OwnedSemaphorePermit>,
}

impl<S> Limited<S> {
    /// Admits `request` (see the module's order), or the answer that refuses it.
    fn admit(&self, request: &mut http::Request<Body>) -> Result<Held, Refusal> {
        let limits = &self.admission.limits;
        let connection = request.extensions().get::<ConnectionInfo>().map(|info| Arc::clone(&info.state));
        let mut held = Held { _in_flight: connection.as_ref().map(|c| c.begin()), _permits: Vec::new() };
        let path = request.uri().path();
        if path == WATCH_PATH {
            let watch = Arc::clone(&limits.watches).try_acquire_owned();
            held._permits.push(watch.map_err(|_| overloaded("too many health Watch streams are open"))?);
            return Ok(held);
        }
        if path.starts_with(HEALTH_PATH) {
            return Ok(held);
        }
        if connection.as_ref().is_some_and(|c| c.health_only) {
            return Err(overloaded("the service is at its connection limit and answers health checks only"));
        }
        if !path.starts_with(REFLECTION_PATH) {
            let authorization = request.headers().get(http::header::AUTHORIZATION);
            let caller = self.admission.auth.authenticate_header(authorization.map(|v| v.as_bytes()));
            request.extensions_mut().insert(caller.map_err(refused)?);
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
        let held = match self.admit(&mut request) {
            Ok(held) => held,
            Err(refusal) => return Box::pin(std::future::ready(Ok(*refusal))),
        };
        if request.uri().path().starts_with(HEALTH_PATH) {
            // Checks answer at once; a Watch lives as long as its connection allows.
            let call = self.inner.call(request);
            return Box::pin(async move { Ok(call.await?.map(|body| Body::new(Holding { body, held }))) });
        }
        let (timeout, body_timeout) = (self.admission.limits.timeout, self.admission.limits.body_timeout);
        let request = request.map(|body| Body::new(BodyDeadline::new(body, body_timeout)));
        let call = self.inner.call(request);
        Box::pin(async move {
            let answer = match tokio::time::timeout(timeout, call).await {
                Ok(answer) => answer?,
                Err(_) => {
                    tracing::debug!(?timeout, "call ended at the server's call timeout");
                    let status = tonic::Status::deadline_exceeded(format!(
                        "no answer within the server's call timeout ({timeout:?}); the call may or may not have taken effect"
                    ));
                    status.into_http()
                }
            };
            Ok(answer.map(|body| Body::new(Holding { body, held })))
        })
    }
}

/// A response body that keeps what its call holds until it has been sent (or dropped).
struct Holding {
    body: Body,
    held: Held,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.held = Held::default();
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
