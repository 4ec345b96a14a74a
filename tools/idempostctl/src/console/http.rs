//! The console's HTTP server: HTTP/1.1 only (a browser needs nothing else from loopback, and a
//! second protocol would be a second way past the admission checks), with every connection
//! bounded in time and size so that a slow or silent local peer holds little for long.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::Service as _;

/// How long a request head may take to arrive, counted from the connection's start or from the
/// end of its previous answer: a silent connection, or one idle between requests, is closed then.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one request may take once its head arrived, reading its body and forwarding the call
/// included: longer than a forwarded call's own deadline, so that its answer is the one seen.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest request head read (the page's requests fit in a fraction); a longer one is answered
/// 431 and its connection closed.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The most request headers read.
const MAX_HEADERS: usize = 48;

/// Connections open at once; the next one waits in the kernel's backlog until one closes.
const MAX_CONNECTIONS: usize = 128;

/// How long accepting pauses after it failed.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How long a connection is kept: then it is asked to close after its current answer (a browser
/// opens another), so that a peer that never reads its answers holds its connection no longer.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(5 * 60);

/// Serves `router` on `listener` until `stopped` completes; connections still open then end at
/// their own deadlines or with the process.
pub(super) async fn serve(listener: TcpListener, router: Router, stopped: impl Future<Output = ()>) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut stopped = std::pin::pin!(stopped);
    loop {
        let Ok(permit) = Arc::clone(&connections).acquire_owned().await else { return };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stopped => return,
        };
        let Ok((stream, _)) = accepted else {
            // Out of descriptors, most likely: accepting again at once would spin.
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            continue;
        };
        let router = router.clone();
        tokio::spawn(async move {
            serve_one(TokioIo::new(stream), router).await;
            drop(permit);
        });
    }
}

async fn serve_one(io: TokioIo<tokio::net::TcpStream>, router: Router) {
    let answer = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let mut router = router.clone();
        async move {
            let answered = tokio::time::timeout(REQUEST_TIMEOUT, router.call(request)).await;
            Ok::<Response, Infallible>(match answered {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => (StatusCode::REQUEST_TIMEOUT, "the request took too long").into_response(),
            })
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    // Errors are a peer that went silent, spoke another protocol or sent too much: nothing to
    // report beyond closing its connection.
    let mut connection = std::pin::pin!(http.serve_connection(io, answer));
    tokio::select! {
        _ = connection.as_mut() => return,
        () = tokio::time::sleep(MAX_CONNECTION_AGE) => connection.as_mut().graceful_shutdown(),
    }
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, connection).await;
}
