//! One gRPC listener: TLS (or loopback plaintext), bounded connections, callers authenticated
//! before they hold anything, a shared concurrency limit shed at once, and a server-side
//! deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tower::layer::util::{Identity, Stack};

use super::admission::{Admission, CallLimits};
use super::auth::Authenticator;
use super::connection::{Connection, ConnectionLimits, Io};
use super::settings::ListenerSettings;
use super::tls::{Alpn, ReloadingTls, TlsError, TlsFiles};

mod handshake;

/// The concurrency limit of a listener whose service set none (the health listeners).
const HEALTH_LIMIT: u32 = 16;

/// A listener refused to start.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// Plaintext on an address other hosts can reach.
    #[error(
        "{addr} is not a loopback address and no --tls-cert/--tls-key is set: serve TLS, or pass --allow-plaintext if something in front of the service encrypts"
    )]
    PlaintextNotLoopback {
        /// The listen address.
        addr: SocketAddr,
    },
    /// The TLS files could not be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address from the settings.
        addr: SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
}

/// The tonic server every listener is built from: callers authenticated first, shed past the
/// limits, bounded per call.
pub(crate) type LimitedServer = tonic::transport::Server<Stack<Admission, Identity>>;

/// A bound gRPC listener with its security and load settings.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    port: u16,
    tls: Option<ReloadingTls>,
    limits: CallLimits,
    connections: ConnectionLimits,
    http2: Http2,
    reload_every: Duration,
    tls_first_byte_timeout: Duration,
}

/// The HTTP/2 settings of a listener's connections.
#[derive(Debug, Clone, Copy)]
struct Http2 {
    max_concurrent_streams: u32,
    keepalive_interval: Duration,
    keepalive_timeout: Duration,
    max_connection_age: Duration,
    /// How long a connection past its age may take to finish its calls: one call timeout.
    max_connection_age_grace: Duration,
}

impl Listener {
    /// Refuses plaintext on an address other hosts can reach, unless `allow_plaintext` says
    /// something in front encrypts. It reads only the settings, so a service checks it before
    /// connecting to anything: a policy error must not wait behind a database or a broker.
    pub fn check_plaintext(addr: SocketAddr, settings: &ListenerSettings) -> Result<(), ListenerError> {
        let tls = settings.tls_cert.is_some() && settings.tls_key.is_some();
        if tls || addr.ip().is_loopback() || settings.allow_plaintext {
            Ok(())
        } else {
            Err(ListenerError::PlaintextNotLoopback { addr })
        }
    }

    /// Checks the plaintext policy, loads the TLS files and binds `addr` (port 0 picks a free
    /// port).
    pub async fn bind(addr: SocketAddr, settings: &ListenerSettings) -> Result<Self, ListenerError> {
        Self::bind_for(addr, settings, Alpn::H2).await
    }

    /// [`Listener::bind`] for an HTTP/1.1 server (the `/metrics` listeners): the same TLS files,
    /// plaintext policy and connection bounds, with `http/1.1` offered in the TLS handshake.
    pub async fn bind_http1(addr: SocketAddr, settings: &ListenerSettings) -> Result<Self, ListenerError> {
        Self::bind_for(addr, settings, Alpn::Http1).await
    }

    async fn bind_for(
        addr: SocketAddr,
        settings: &ListenerSettings,
        alpn: Alpn,
    ) -> Result<Self, ListenerError> {
        Self::check_plaintext(addr, settings)?;
        let tls = match (&settings.tls_cert, &settings.tls_key) {
            (Some(cert), Some(key)) => Some(ReloadingTls::load(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: settings.tls_client_ca.clone(),
                alpn,
            })?),
            _ => None,
        };
        if tls.is_none() && !addr.ip().is_loopback() {
            tracing::warn!(%addr, "serving gRPC WITHOUT TLS on a non-loopback address (--allow-plaintext)");
        }
        let bind = |source| ListenerError::Bind { addr, source };
        let tcp = TcpListener::bind(addr).await.map_err(bind)?;
        let port = tcp.local_addr().map_err(bind)?.port();
        let calls = settings.max_concurrent_calls.unwrap_or(HEALTH_LIMIT);
        // By default one connection may take all but an eighth of the listener's calls: a
        // single busy client is not slowed, and never shuts every other connection out.
        let per_connection = settings
            .max_calls_per_connection
            .unwrap_or_else(|| calls.saturating_sub((calls / 8).max(1)).max(1));
        Ok(Self {
            tcp,
            port,
            tls,
            limits: CallLimits::new(
                calls as usize,
                settings.max_watch_streams as usize,
                settings.call_timeout,
                settings.body_timeout,
            ),
            connections: ConnectionLimits::new(settings, per_connection as usize),
            http2: Http2 {
                max_concurrent_streams: settings.max_concurrent_streams,
                keepalive_interval: settings.keepalive_interval,
                keepalive_timeout: settings.keepalive_timeout,
                max_connection_age: settings.max_connection_age,
                max_connection_age_grace: settings.call_timeout,
            },
            reload_every: settings.reload_every,
            tls_first_byte_timeout: settings.tls_first_byte_timeout,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Most calls this listener runs at once, and the longest one may run before it ends
    /// DEADLINE_EXCEEDED: what a long poll sizes its waits by.
    pub fn call_limits(&self) -> (usize, Duration) {
        self.limits.bounds()
    }

    /// Refuses `methods` (`/package.Service/Method`, or `/package.Service/` for every method
    /// of a service) to callers without the operator scope before their request bodies are
    /// read.
    pub fn operators_only(mut self, methods: &'static [&'static str]) -> Self {
        self.limits.operators_only(methods);
        self
    }

    /// Whether the listener serves TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A server that refuses callers `auth` does not accept before they hold anything, with this
    /// listener's concurrency limits (a call past them is answered RESOURCE_EXHAUSTED at once;
    /// health checks are always admitted), body and call deadlines, and HTTP/2 bounds.
    pub fn server(&self, auth: &Authenticator) -> LimitedServer {
        let http2 = self.http2;
        // The call timeout is ours, not tonic's `Server::timeout`, which answers CANCELLED.
        tonic::transport::Server::builder()
            .max_concurrent_streams(http2.max_concurrent_streams)
            .http2_keepalive_interval(Some(http2.keepalive_interval))
            .http2_keepalive_timeout(Some(http2.keepalive_timeout))
            .max_connection_age(http2.max_connection_age)
            .max_connection_age_grace(http2.max_connection_age_grace)
            .layer(self.limits.admitting(auth))
    }

    /// The accepted connections, TLS already negotiated. Handshakes run on their own tasks, so a
    /// slow client delays nobody; certificates are re-read every `reload_every` and on SIGHUP.
    pub fn incoming(self) -> impl Stream<Item = Result<Connection, std::io::Error>> + Send + 'static {
        let (tx, rx) = mpsc::channel(64);
        let timing = Timing { reload_every: self.reload_every, first_byte: self.tls_first_byte_timeout };
        tokio::spawn(accept(self.tcp, self.tls, Arc::new(self.connections), timing, tx));
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|conn| (Ok(conn), rx)) })
    }
}

/// How often an accept loop re-reads its TLS files, and how soon a TLS client's first bytes must
/// arrive.
#[derive(Debug, Clone, Copy)]
struct Timing {
    reload_every: Duration,
    first_byte: Duration,
}

async fn accept(
    tcp: TcpListener,
    tls: Option<ReloadingTls>,
    limits: Arc<ConnectionLimits>,
    timing: Timing,
    tx: mpsc::Sender<Connection>,
) {
    let mut hangup = match &tls {
        Some(_) => tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        None => None,
    };
    let mut reload = tokio::time::interval(timing.reload_every.max(Duration::from_millis(100)));
    reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = tx.closed() => return,
            accepted = tcp.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Past a limit the stream is dropped here, which closes it.
                    let Ok(admitted) = limits.admit(&stream, peer) else { continue };
                    let _ = stream.set_nodelay(true);
                    match &tls {
                        None => {
                            if tx.send(admitted.serve(Io::Plain(stream))).await.is_err() {
                                return;
                            }
                        }
                        Some(tls) => {
                            let acceptor = TlsAcceptor::from(tls.current());
                            tokio::spawn(handshake::handshake(
                                Arc::clone(&limits),
                                acceptor,
                                stream,
                                peer,
                                admitted,
                                timing.first_byte,
                                tx.clone(),
                            ));
                        }
                    }
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = reload.tick(), if tls.is_some() => if let Some(tls) = &tls { tls.reload() },
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => {
                if let Some(tls) = &tls {
                    tls.reload();
                }
            }
        }
    }
}
