//! The server's own limit on a call, answered DEADLINE_EXCEEDED.

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tonic::codegen::http;
use tower::{Layer, Service};

/// Ends a call that has not answered within `limit` with DEADLINE_EXCEEDED, the code gRPC
/// gives a deadline that passed. tonic's own `Server::timeout` answers CANCELLED instead, which
/// callers read as "the client gave up", not as "the server's time was up".
///
/// Like any deadline, it bounds the wait for the answer, not the work: a call ended here may
/// still have taken effect, so the caller treats it as unknown (the safe caller protocol
/// reconciles). A caller's own shorter deadline (`grpc-timeout`) is still enforced by tonic.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    limit: Duration,
}

impl Deadline {
    pub(crate) fn new(limit: Duration) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for Deadline {
    type Service = WithDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithDeadline { inner, limit: self.limit }
    }
}

/// A service behind [`Deadline`].
#[derive(Debug, Clone)]
pub(crate) struct WithDeadline<S> {
    inner: S,
    limit: Duration,
}

impl<S, B, R> Service<http::Request<B>> for WithDeadline<S>
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
        let limit = self.limit;
        let call = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(limit, call).await {
                Ok(answer) => answer,
                Err(_) => {
                    tracing::debug!(?limit, "call ended at the server's call timeout");
                    let status = tonic::Status::deadline_exceeded(format!(
                        "no answer within the server's call timeout ({limit:?}); the call may or may not have taken effect"
                    ));
                    Ok(status.into_http())
                }
            }
        })
    }
}
