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
//! This process acts with the operator's token for whoever can reach it, so it answers only
//! ([`admission`]): on a loopback address, over HTTP/1.1 ([`http`]); to requests naming it as
//! their `Host` (no DNS rebinding) and, when they say where they come from, coming from its own
//! origin (no other site's page); the page's static files to anyone, and calls only as gRPC-Web
//! POSTs within a session. A session is had by exchanging the console key, a random secret printed
//! in the URL's fragment (which the browser never sends in a request or a Referer), once: the page
//! sends it to `/session` and gets an HttpOnly, SameSite=Strict cookie that lasts an hour, and the
//! key is spent ([`session`]). Pressing Enter in the console's terminal prints a new URL. Every
//! answer carries a strict Content-Security-Policy.

mod admission;
mod assets;
mod http;
mod proxy;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use idempost_proto::v1::{
    admin_service_server::AdminServiceServer, consumer_admin_service_server::ConsumerAdminServiceServer,
};

pub(crate) use proxy::Upstream;

/// Requests served at once; more are refused as busy.
const MAX_CONCURRENT: usize = 64;

/// The largest call message the page may send: its requests carry ids, filters and reasons.
const MAX_CALL_BYTES: usize = 64 * 1024;

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
    let hosts = vec![address.to_string(), format!("localhost:{}", address.port())];
    let site = Arc::new(admission::Site::new(hosts, address.port(), MAX_CONCURRENT));
    let admin = AdminServiceServer::new(proxy::AdminProxy(admin)).max_decoding_message_size(MAX_CALL_BYTES);
    let consumer = ConsumerAdminServiceServer::new(proxy::ConsumerAdminProxy(consumer))
        .max_decoding_message_size(MAX_CALL_BYTES);
    let calls = tonic::service::Routes::new(admin)
        .add_service(consumer)
        .into_axum_router()
        .layer(tonic_web::GrpcWebLayer::new());
    let router = calls
        .merge(assets::router(args.jaeger_url.as_deref()))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&site), admission::guard));
    print_url(&site, address);
    println!(
        "(the key in the URL is good for one browser session of {} min; press Enter here for a new URL, \
         Ctrl-C to stop)",
        session::SESSION_LIFETIME.as_secs() / 60
    );
    // A thread of its own: a read of standard input cannot be cancelled, and a runtime waits for
    // its blocking reads when it shuts down.
    std::thread::spawn(move || new_urls_on_enter(&site, address));
    let stopped = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    http::serve(listener, router, stopped).await;
    Ok(())
}

fn print_url(site: &admission::Site, address: SocketAddr) {
    println!("idempostctl console: open http://{address}/#key={}", site.issue_key());
}

/// Prints a new URL for each line read from standard input, until it ends.
fn new_urls_on_enter(site: &admission::Site, address: SocketAddr) {
    for line in std::io::stdin().lines() {
        if line.is_err() {
            return;
        }
        print_url(site, address);
    }
}
