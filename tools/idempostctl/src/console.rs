//! `idempostctl console`: the operators' console in a browser, served from this process on
//! loopback.
//!
//! A same-origin proxy, not gRPC-Web on the services: the page (TypeScript on the generated
//! stubs, `console/`) calls AdminService and ConsumerAdminService here as gRPC-Web (tonic-web),
//! and each call is made again to the real service over gRPC, with TLS and the operator's token
//! exactly as the other commands make it ([`proxy`]). So the token stays in this process (never
//! in the browser's storage or a URL), the services' listeners keep speaking only gRPC, and the
//! page needs nothing from anywhere but this origin.
//!
//! This process acts with the operator's token for whoever can reach it, so it answers only:
//! on a loopback address; to requests naming it as their `Host` (no DNS rebinding) and, when
//! they say where they come from, coming from its own origin (no other site's page); and, for
//! calls, carrying the console key, a random secret made at start and printed in the URL's
//! fragment (which the browser never sends in a request or a Referer), so another local user
//! cannot use it either. Every answer carries a strict Content-Security-Policy.

mod assets;
mod proxy;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use idempost_proto::v1::{
    admin_service_server::AdminServiceServer, consumer_admin_service_server::ConsumerAdminServiceServer,
};
use tokio::sync::Semaphore;
use tonic_types::{ErrorDetails, StatusExt as _};

pub(crate) use proxy::Upstream;

/// The header that carries the console key on every call.
const KEY_HEADER: &str = "x-idempost-console-key";

/// Requests served at once; more wait in the kernel's backlog or are refused as busy.
const MAX_CONCURRENT: usize = 64;

/// What `idempostctl console` needs besides the global flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ConsoleArgs {
    /// Where the console listens: a loopback address only (it acts with your token).
    #[arg(long, env = "IDEMPOST_CONSOLE_LISTEN", default_value = "127.0.0.1:8485")]
    listen: SocketAddr,
    /// Jaeger's UI, such as http://localhost:16686: an event's trace id links to
    /// <URL>/trace/<trace id>.
    #[arg(long, env = "IDEMPOST_JAEGER_URL")]
    jaeger_url: Option<String>,
}

/// Why the console did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConsoleError {
    #[error(
        "the console listens on loopback only (it acts with your token and has no login of its own), not on {0}"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

/// What every request is checked against.
#[derive(Debug)]
struct Site {
    /// `Host` values that name this console.
    hosts: Vec<String>,
    key: String,
    permits: Arc<Semaphore>,
}

/// Serves the console until Ctrl-C, after printing its URL on standard output.
pub(crate) async fn serve(
    args: &ConsoleArgs,
    admin: Upstream,
    consumer: Upstream,
) -> Result<(), ConsoleError> {
    if !args.listen.ip().is_loopback() {
        return Err(ConsoleError::NotLoopback(args.listen));
    }
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.map_err(|e| ConsoleError::Listen(args.listen, e))?;
    let address = listener.local_addr().map_err(|e| ConsoleError::Listen(args.listen, e))?;
    let key = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let site = Arc::new(Site {
        hosts: vec![address.to_string(), format!("localhost:{}", address.port())],
        key: key.clone(),
        permits: Arc::new(Semaphore::new(MAX_CONCURRENT)),
    });
    let calls = tonic::service::Routes::new(AdminServiceServer::new(proxy::AdminProxy(admin)))
        .add_service(ConsumerAdminServiceServer::new(proxy::ConsumerAdminProxy(consumer)))
        .into_axum_router()
        .layer(tonic_web::GrpcWebLayer::new());
    let router = calls
        .merge(assets::router(args.jaeger_url.as_deref()))
        .layer(axum::middleware::from_fn_with_state(site, guard));
    println!("idempostctl console: open http://{address}/#key={key}");
    println!("(the key in the URL lets your browser use this console; stop it with Ctrl-C)");
    let stopped = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    axum::serve(listener, router)
        .with_graceful_shutdown(stopped)
        .await
        .map_err(|e| ConsoleError::Listen(address, e))
}

/// Admits a request (see the module's documentation) and puts the security headers on its answer.
async fn guard(State(site): State<Arc<Site>>, request: Request, next: Next) -> Response {
    let Ok(_permit) = site.permits.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the console is busy").into_response();
    };
    let mut response = match refusal(&site, &request) {
        None => next.run(request).await,
        Some(refusal) => refusal,
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, assets::CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Why `request` is not served, as the answer to it; `None` when it is admitted.
fn refusal(site: &Site, request: &Request) -> Option<Response> {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if !site.hosts.iter().any(|known| known == host) {
        return Some((StatusCode::MISDIRECTED_REQUEST, "not this console's address").into_response());
    }
    if let Some(origin) = headers.get(header::ORIGIN)
        && origin.to_str().ok() != Some(format!("http://{host}").as_str())
    {
        return Some((StatusCode::FORBIDDEN, "not this console's page").into_response());
    }
    if request.method() == Method::GET || request.method() == Method::HEAD {
        return None;
    }
    let key = headers.get(KEY_HEADER).map(HeaderValue::as_bytes).unwrap_or_default();
    if same(key, site.key.as_bytes()) {
        return None;
    }
    // An answer the page's gRPC-Web client reads like any refusal.
    let details = ErrorDetails::with_error_info("CONSOLE_KEY_MISSING", "idempost.v1", []);
    let status = tonic::Status::with_error_details(
        tonic::Code::Unauthenticated,
        "this page has no console key: open the URL that idempostctl console printed",
        details,
    );
    let mut refusal: Response = status.into_http();
    refusal
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc-web+proto"));
    Some(refusal)
}

/// Compares secrets in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn site() -> Site {
        Site {
            hosts: vec!["127.0.0.1:8485".into(), "localhost:8485".into()],
            key: "k3y".into(),
            permits: Arc::new(Semaphore::new(1)),
        }
    }

    fn request(method: Method, headers: &[(&str, &str)]) -> Request {
        let mut request =
            axum::http::Request::builder().method(method).uri("/idempost.v1.AdminService/Purge");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn only_requests_for_this_console_from_its_page_with_its_key_are_served() {
        let site = site();
        let refused = |method, headers: &[(&str, &str)]| refusal(&site, &request(method, headers));
        let host = ("host", "127.0.0.1:8485");
        assert!(refused(Method::GET, &[host]).is_none(), "the page itself needs no key");
        assert!(refused(Method::GET, &[("host", "localhost:8485")]).is_none());
        let elsewhere = refused(Method::GET, &[("host", "rebound.example:8485")]).unwrap();
        assert_eq!(elsewhere.status(), StatusCode::MISDIRECTED_REQUEST);
        let other_page =
            refused(Method::POST, &[host, ("origin", "http://evil.example"), (KEY_HEADER, "k3y")]);
        assert_eq!(other_page.unwrap().status(), StatusCode::FORBIDDEN);
        let keyless = refused(Method::POST, &[host, ("origin", "http://127.0.0.1:8485")]).unwrap();
        assert_eq!(keyless.headers()["grpc-status"], "16", "refused as a gRPC call: UNAUTHENTICATED");
        assert!(refused(Method::POST, &[host, (KEY_HEADER, "k3z")]).is_some());
        let keyed = [host, ("origin", "http://127.0.0.1:8485"), (KEY_HEADER, "k3y")];
        assert!(refused(Method::POST, &keyed).is_none());
    }

    #[test]
    fn only_the_same_key_matches() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd") && !same(b"abc", b"ab") && !same(b"", b"a"));
    }
}
