//! The limits of one listener, in one tower layer: at most N calls at once (the rest refused at
//! the door) and a server-side deadline on each admitted call.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Semaphore;
use tonic::codegen::http;
use tonic_types::{ErrorDetails, StatusExt as _};
use tower::{Layer, Service};

/// Health checks are always admitted: an orchestrator must not restart a busy instance for
/// being busy, which would only move its load elsewhere.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

/// Admits calls while one of the listener's permits is free; a call past the limit is answered
/// RESOURCE_EXHAUSTED (reason OVERLOADED) at once, before any handler or database work.
///
/// An admitted call that has not answered within `timeout` ends DEADLINE_EXCEEDED, the code gRPC
/// gives a deadline that passed. tonic's own `Server::timeout` answers CANCELLED instead, which
/// callers read as "the client gave up", not as "the server's time was up". Like any deadline, it
/// bounds the wait for the answer, not the work: a call ended here may still have taken effect,
/// so the caller treats it as unknown (the safe caller protocol reconciles). A caller's own
/// shorter deadline (`grpc-timeout`) is still enforced by tonic.
#[derive(Debug, Clone)]
pub(crate) struct CallLimits {
    permits: Arc<Semaphore>,
    limit: usize,
    timeout: Duration,
}

impl CallLimits {
    pub(crate) fn new(limit: usize, timeout: Duration) -> Self {
        Self { permits: Arc::new(Semaphore::new(limit)), limit, timeout }
    }

    /// RESOURCE_EXHAUSTED with reason OVERLOADED: nothing was done.
    fn overloaded(&self) -> tonic::Status {
        let limit = self.limit;
        tracing::debug!(limit, "call refused: the listener is at its concurrency limit");
        let mut details = ErrorDetails::new();
        details.set_error_info("OVERLOADED", crate::contract::ERROR_DOMAIN, std::collections::HashMap::new());
        tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            format!(
                "{limit} calls are already running on this listener; nothing was done: retry after a backoff"
            ),
            details,
        )
    }
}

impl<S> Layer<S> for CallLimits {
    type Service = Limited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Limited { inner, limits: self.clone() }
    }
}

/// A service behind [`CallLimits`].
#[derive(Debug, Clone)]
pub(crate) struct Limited<S> {
    inner: S,
    limits: CallLimits,
}

impl<S, B, R> Service<http::Request<B>> for Limited<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let permit = if request.uri().path().starts_with(HEALTH_PATH) {
            None
        } else {
            match Arc::clone(&self.limits.permits).try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => return Box::pin(std::future::ready(Ok(self.limits.overloaded().into_http()))),
            }
        };
        let timeout = self.limits.timeout;
        let call = self.inner.call(request);
        Box::pin(async move {
            let answer = match tokio::time::timeout(timeout, call).await {
                Ok(answer) => answer,
                Err(_) => {
                    tracing::debug!(?timeout, "call ended at the server's call timeout");
                    let status = tonic::Status::deadline_exceeded(format!(
                        "no answer within the server's call timeout ({timeout:?}); the call may or may not have taken effect"
                    ));
                    Ok(status.into_http())
                }
            };
            drop(permit);
            answer
        })
    }
}
