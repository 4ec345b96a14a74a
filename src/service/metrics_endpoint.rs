//! The `/metrics` listener: Prometheus text exposition over HTTP/1.1 on a listener of its own,
//! with the TLS, plaintext policy and connection bounds of the gRPC listeners.
//!
//! A scrape is one `GET /metrics` with no body. Each connection serves one request and closes
//! (no keep-alive), its request head must arrive within the body timeout and fit in a small
//! buffer, and the whole exchange must end within the call timeout: a slow or idle peer holds one
//! connection permit for a bounded time and a bounded buffer, never more. Scrapes are not
//! authenticated (like health checks): the metrics carry counts and ages, no tenant's data; mutual
//! TLS (`--tls-client-ca`) restricts who may scrape.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tonic::transport::server::Connected as _;

use super::ReadyError;
use crate::security::{Listener, ListenerSettings};
use crate::telemetry::exposition;

/// The one path served.
pub const METRICS_PATH: &str = "/metrics";

/// Scrapes rendered at once; past it a scrape is answered 503 at once. Prometheus scrapes each
/// target from one series of requests, so a few cover several Prometheus servers.
const CONCURRENT_SCRAPES: usize = 4;

/// The largest request head read (hyper's smallest read buffer); a longer one is refused.
const MAX_HEAD_BYTES: usize = 8 * 1024;

/// The most request headers read; a request with more is refused.
const MAX_HEADERS: usize = 32;

/// How long a connection may take, from the settings every listener of the service shares.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    head: Duration,
    exchange: Duration,
}

/// A bound `/metrics` listener with the settings it serves by.
#[derive(Debug)]
pub struct MetricsListener {
    listener: Listener,
    bound: SocketAddr,
    deadlines: Deadlines,
}

impl MetricsListener {
    /// Binds `addr` (the service's `--metrics-listen`) with the service's listener `settings`;
    /// `None` when the flag is unset.
    pub async fn bind(
        addr: Option<SocketAddr>,
        settings: &ListenerSettings,
    ) -> Result<Option<Self>, ReadyError> {
        let Some(addr) = addr else { return Ok(None) };
        let listener = Listener::bind_http1(addr, settings).await?;
        let bound = SocketAddr::new(addr.ip(), listener.port());
        let deadlines = Deadlines { head: settings.body_timeout, exchange: settings.call_timeout };
        Ok(Some(Self { listener, bound, deadlines }))
    }

    /// The port file's line for it: `metrics-listen` and the bound address.
    pub fn port_file_line(&self) -> (&'static str, SocketAddr) {
        ("metrics-listen", self.bound)
    }

    /// Serves `/metrics` until `stop` turns true.
    pub fn serve(self, stop: watch::Receiver<bool>) -> JoinHandle<()> {
        serve(self.listener, self.deadlines, stop)
    }
}

/// Serves `/metrics` on `listener` until `stop` turns true; a connection still open then ends at
/// its own deadline.
fn serve(listener: Listener, deadlines: Deadlines, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let scrapes = Arc::new(Semaphore::new(CONCURRENT_SCRAPES));
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(listener.incoming());
        loop {
            let connection = tokio::select! {
                next = incoming.next() => match next {
                    Some(Ok(connection)) => connection,
                    Some(Err(_)) => continue,
                    None => return,
                },
                _ = stop.wait_for(|stop| *stop) => return,
            };
            tokio::spawn(serve_one(connection, deadlines, Arc::clone(&scrapes)));
        }
    })
}

async fn serve_one(connection: crate::security::Connection, deadlines: Deadlines, scrapes: Arc<Semaphore>) {
    // A connection kept past the listener's limits is meant for health checks only.
    let shed = connection.connect_info().state.health_only;
    let answer = hyper::service::service_fn(move |request: Request<Incoming>| {
        let scrapes = Arc::clone(&scrapes);
        async move { Ok::<_, Infallible>(answer(&request, shed, &scrapes)) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(deadlines.head)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        .keep_alive(false);
    let exchange = http.serve_connection(TokioIo::new(connection), answer);
    match tokio::time::timeout(deadlines.exchange, exchange).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "metrics connection ended in error"),
        Err(_) => tracing::debug!("metrics connection ended at the call timeout"),
    }
}

/// The answer to one request: the exposition for `GET /metrics`, a refusal otherwise.
fn answer(request: &Request<Incoming>, shed: bool, scrapes: &Semaphore) -> Response<Full<Bytes>> {
    if shed {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "the listener is at its connection limit");
    }
    if request.uri().path() != METRICS_PATH {
        return plain(StatusCode::NOT_FOUND, "only /metrics is served here");
    }
    if request.method() != Method::GET {
        let mut refused = plain(StatusCode::METHOD_NOT_ALLOWED, "a scrape is a GET");
        refused.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET"));
        return refused;
    }
    let sized = request.headers().get(header::CONTENT_LENGTH).is_some_and(|n| n.as_bytes() != b"0");
    if sized || request.headers().contains_key(header::TRANSFER_ENCODING) {
        // The body is never read: the connection closes after this answer.
        return plain(StatusCode::BAD_REQUEST, "a scrape has no body");
    }
    let Ok(_permit) = scrapes.try_acquire() else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "too many scrapes at once; try again");
    };
    match exposition::render() {
        Some(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(exposition::CONTENT_TYPE));
            response
        }
        None => plain(StatusCode::SERVICE_UNAVAILABLE, "metrics are not collected in this process"),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain"));
    response
}
