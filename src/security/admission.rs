//! Admission control for one listener: at most N calls at once, the rest refused at the door.

use std::sync::Arc;
use std::task::{Context, Poll};

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
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl Admission {
    pub(crate) fn new(limit: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(limit)), limit }
    }
}

impl<S> Layer<S> for Admission {
    type Service = Admitted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admitted { inner, admission: self.clone() }
    }
}

/// A service behind [`Admission`].
#[derive(Debug, Clone)]
pub(crate) struct Admitted<S> {
    inner: S,
    admission: Admission,
}

impl<S, B, R> Service<http::Request<B>> for Admitted<S>
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
        if request.uri().path().starts_with(HEALTH_PATH) {
            return Box::pin(self.inner.call(request));
        }
        match Arc::clone(&self.admission.permits).try_acquire_owned() {
            Ok(permit) => {
                let call = self.inner.call(request);
                Box::pin(async move {
                    let answer = call.await;
                    drop(permit);
                    answer
                })
            }
            Err(_) => {
                let limit = self.admission.limit;
                tracing::debug!(limit, "call refused: the listener is at its concurrency limit");
                let mut details = ErrorDetails::new();
                details.set_error_info(
                    "OVERLOADED",
                    crate::order::ERROR_DOMAIN,
                    std::collections::HashMap::new(),
                );
                let status = tonic::Status::with_error_details(
                    tonic::Code::ResourceExhausted,
                    format!(
                        "{limit} calls are already running on this listener; nothing was done: retry after a backoff"
                    ),
                    details,
                );
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}
