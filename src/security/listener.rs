//! One gRPC listener: TLS (or loopback plaintext), a shared concurrency limit shed at once, and
//! a server-side deadline.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tower::layer::util::{Identity, Stack};

use super::ListenerSettings;
use super::admission::CallLimits;
use super::tls::{ReloadingTls, TlsError, TlsFiles};

/// A TLS handshake that has not finished by then is dropped, so slow or idle clients cannot
/// hold handshake slots.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The tonic server every listener is built from: shed past the limit, bounded per call.
pub(crate) type LimitedServer = tonic::transport::Server<Stack<CallLimits, Identity>>;

/// A bound gRPC listener with its security and load settings.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    addr: SocketAddr,
    port: u16,
    tls: Option<ReloadingTls>,
    limits: CallLimits,
    reload_every: Duration,
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
        Self::check_plaintext(addr, settings)?;
        let tls = match (&settings.tls_cert, &settings.tls_key) {
            (Some(cert), Some(key)) => Some(ReloadingTls::load(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: settings.tls_client_ca.clone(),
            })?),
            _ => None,
        };
        if tls.is_none() && !addr.ip().is_loopback() {
            tracing::warn!(%addr, "serving gRPC WITHOUT TLS on a non-loopback address (--allow-plaintext)");
        }
        let bind = |source| ListenerError::Bind { addr, source };
        let tcp = TcpListener::bind(addr).await.map_err(bind)?;
        let port = tcp.local_addr().map_err(bind)?.port();
        Ok(Self {
            tcp,
            addr,
            port,
            tls,
            limits: CallLimits::new(
                settings.max_concurrent_calls.unwrap_or(HEALTH_LIMIT) as usize,
                settings.call_timeout,
            ),
            reload_every: settings.reload_every,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address from the settings.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the listener serves TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A server with this listener's concurrency limit (shared by all its connections; a call
    /// past it is answered RESOURCE_EXHAUSTED at once; health checks are always admitted) and
    /// per-call deadline (a call past it is answered DEADLINE_EXCEEDED).
    pub(crate) fn server(&self) -> LimitedServer {
        // The call timeout is ours, not tonic's `Server::timeout`, which answers CANCELLED.
        tonic::transport::Server::builder().layer(self.limits.clone())
    }

    /// The accepted connections, TLS already negotiated. Handshakes run on their own tasks, so a
    /// slow client delays nobody; certificates are re-read every `reload_every` and on SIGHUP.
    pub(crate) fn incoming(self) -> impl Stream<Item = Result<Connection, std::io::Error>> + Send + 'static {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(accept(self.tcp, self.tls, self.reload_every, tx));
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|conn| (Ok(conn), rx)) })
    }
}

async fn accept(
    tcp: TcpListener,
    tls: Option<ReloadingTls>,
    reload_every: Duration,
    tx: mpsc::Sender<Connection>,
) {
    let mut hangup = match &tls {
        Some(_) => tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        None => None,
    };
    let mut reload = tokio::time::interval(reload_every.max(Duration::from_millis(100)));
    reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = tx.closed() => return,
            accepted = tcp.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    match &tls {
                        None => {
                            if tx.send(Connection::Plain(stream)).await.is_err() {
                                return;
                            }
                        }
                        Some(tls) => {
                            let acceptor = TlsAcceptor::from(tls.current());
                            let tx = tx.clone();
                            tokio::spawn(async move {
                                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                    Ok(Ok(stream)) => {
                                        let _ = tx.send(Connection::Tls(Box::new(stream))).await;
                                    }
                                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                                }
                            });
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

/// An accepted connection: plaintext (loopback, or `--allow-plaintext`) or TLS.
#[derive(Debug)]
pub(crate) enum Connection {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Self::Plain(stream) => stream.connect_info(),
            Self::Tls(stream) => stream.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(stream) => stream.is_write_vectored(),
            Self::Tls(stream) => stream.is_write_vectored(),
        }
    }
}
