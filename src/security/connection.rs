//! Accepted connections and what bounds them: how many one listener keeps open, how many TLS
//! handshakes run at once, the process's open-file limit, and how long one may sit idle.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use opentelemetry::KeyValue;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::settings::ListenerSettings;
use crate::telemetry::metrics;

/// Connections a listener keeps past its limits for health checks only, so that probes still
/// get an answer while callers are shed.
const HEALTH_ONLY_CONNECTIONS: usize = 8;

/// A health-only connection is closed this long after its last check.
const HEALTH_ONLY_IDLE: Duration = Duration::from_secs(5);

/// Most health `Watch` streams one connection keeps open: a client watches a few services at
/// most, and each stream lives as long as its connection.
const WATCHES_PER_CONNECTION: usize = 4;

/// New connections are shed once the process holds this share (in tenths) of its open-file
/// limit, keeping the rest for its database and broker connections, files and health probes.
const DESCRIPTOR_SHED_TENTHS: u64 = 9;

/// Why a new connection was not served in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shed {
    /// The listener holds `--max-connections` already.
    Connections,
    /// The process is near its open-file limit.
    Descriptors,
    /// `--max-tls-handshakes` are under way.
    Handshakes,
}

impl Shed {
    fn as_str(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::Descriptors => "descriptors",
            Self::Handshakes => "handshakes",
        }
    }

    /// Counts one connection shed for this reason, `health_only` when it was kept for health
    /// checks instead of closed.
    pub(crate) fn count(self, health_only: bool) {
        let action = if health_only { "health_only" } else { "closed" };
        metrics().connections_shed.add(
            1,
            &[
                KeyValue::new("idempost.shed.reason", self.as_str()),
                KeyValue::new("idempost.shed.action", action),
            ],
        );
        tracing::debug!(reason = self.as_str(), action, "connection shed");
    }
}

/// The connection bounds of one listener.
#[derive(Debug)]
pub(crate) struct ConnectionLimits {
    connections: Arc<Semaphore>,
    health_only: Arc<Semaphore>,
    handshakes: Arc<Semaphore>,
    /// The first descriptor number at which new connections are shed, if the limit is finite.
    shed_from_descriptor: Option<u64>,
    calls_per_connection: usize,
    idle_timeout: Duration,
}

impl ConnectionLimits {
    pub(crate) fn new(settings: &ListenerSettings, calls_per_connection: usize) -> Self {
        Self {
            connections: Arc::new(Semaphore::new(settings.max_connections as usize)),
            health_only: Arc::new(Semaphore::new(HEALTH_ONLY_CONNECTIONS)),
            handshakes: Arc::new(Semaphore::new(settings.max_tls_handshakes as usize)),
            shed_from_descriptor: descriptor_limit().map(|limit| limit / 10 * DESCRIPTOR_SHED_TENTHS),
            calls_per_connection,
            idle_timeout: settings.idle_timeout,
        }
    }

    /// Admits a new connection in full, for health checks only, or not at all (it is then
    /// dropped, which closes it).
    pub(crate) fn admit(&self, stream: &TcpStream) -> Result<Admitted, Shed> {
        let shed = if self.descriptors_left(stream) {
            match Arc::clone(&self.connections).try_acquire_owned() {
                Ok(permit) => {
                    let state = ConnectionState::new(self.calls_per_connection, false);
                    return Ok(Admitted { permit, state, idle_timeout: self.idle_timeout });
                }
                Err(_) => Shed::Connections,
            }
        } else {
            Shed::Descriptors
        };
        match Arc::clone(&self.health_only).try_acquire_owned() {
            Ok(permit) => {
                shed.count(true);
                let state = ConnectionState::new(0, true);
                Ok(Admitted { permit, state, idle_timeout: HEALTH_ONLY_IDLE })
            }
            Err(_) => {
                shed.count(false);
                Err(shed)
            }
        }
    }

    /// A slot for one TLS handshake, if one is free.
    pub(crate) fn handshake(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.handshakes).try_acquire_owned().ok()
    }

    /// The kernel gives a new socket the lowest free descriptor number, so a number at the
    /// threshold means at least that many descriptors are open.
    fn descriptors_left(&self, stream: &TcpStream) -> bool {
        use std::os::fd::AsRawFd as _;
        let number = u64::try_from(stream.as_raw_fd()).unwrap_or(u64::MAX);
        self.shed_from_descriptor.is_none_or(|threshold| number < threshold)
    }
}

/// The process's open-file limit (the soft `RLIMIT_NOFILE`), if it has one.
fn descriptor_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// A connection let in, with the permit it holds until it closes.
#[derive(Debug)]
pub(crate) struct Admitted {
    permit: OwnedSemaphorePermit,
    state: Arc<ConnectionState>,
    idle_timeout: Duration,
}

impl Admitted {
    /// The connection as the server reads it, over `io`.
    pub(crate) fn serve(self, io: Io) -> Connection {
        let tcp = match &io {
            Io::Plain(stream) => stream.connect_info(),
            Io::Tls(stream) => stream.get_ref().0.connect_info(),
        };
        Connection {
            io,
            info: ConnectionInfo { tcp, state: self.state },
            idle: Box::pin(tokio::time::sleep(self.idle_timeout)),
            idle_timeout: self.idle_timeout,
            _permit: self.permit,
        }
    }
}

/// What every call on one connection shares: its own call permits, whether it serves health
/// checks only, and when it last had nothing in flight.
#[derive(Debug)]
pub struct ConnectionState {
    /// This connection's share of its listener's calls.
    pub calls: Arc<Semaphore>,
    /// Accepted past a limit: only health checks are answered on it.
    pub health_only: bool,
    /// This connection's share of its listener's health `Watch` streams.
    pub watches: Arc<Semaphore>,
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// Set by [`ConnectionState::close`]; the reader to wake for it.
    closing: AtomicBool,
    reader: AtomicWaker,
}

impl ConnectionState {
    fn new(calls: usize, health_only: bool) -> Arc<Self> {
        Arc::new(Self {
            calls: Arc::new(Semaphore::new(calls)),
            health_only,
            watches: Arc::new(Semaphore::new(WATCHES_PER_CONNECTION)),
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            closing: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        })
    }

    /// Closes the connection at once: its reads end, and the server drops it with every stream
    /// on it (how a stream whose answer its reader never takes is reset).
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.reader.wake();
    }

    /// Whether [`ConnectionState::close`] was called; otherwise the reader is woken when it is.
    fn closed(&self, cx: &mut Context<'_>) -> bool {
        self.reader.register(cx.waker());
        self.closing.load(Ordering::SeqCst)
    }

    /// Marks a request in flight until the returned guard is dropped (when its answer is sent).
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// When the connection may be closed for idleness: `None` while a request is in flight.
    fn idle_deadline(&self, idle_timeout: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(*self.idle_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner) + idle_timeout)
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
pub struct InFlight(Arc<ConnectionState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the server knows of a connection in every request's extensions: its peer and its state.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    #[allow(dead_code)] // the peer, for whoever reads the extensions
    pub tcp: TcpConnectInfo,
    pub state: Arc<ConnectionState>,
}

/// The transport of an accepted connection: plaintext (loopback, or `--allow-plaintext`) or TLS.
#[derive(Debug)]
pub(crate) enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An accepted connection: closed (its reads end) once it has been idle for its idle timeout.
#[derive(Debug)]
pub struct Connection {
    io: Io,
    info: ConnectionInfo,
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    /// Whether the connection has been idle too long; otherwise the idle timer is re-armed (and
    /// wakes the reader when it fires).
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        while self.idle.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            match self.info.state.idle_deadline(self.idle_timeout) {
                Some(deadline) if deadline <= now => return true,
                Some(deadline) => self.idle.as_mut().reset(deadline),
                None => self.idle.as_mut().reset(now + self.idle_timeout),
            }
        }
        false
    }
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.info.state.closed(cx) || this.idle_expired(cx) {
            // The end of the stream: the server closes a connection with nothing in flight.
            return Poll::Ready(Ok(()));
        }
        match &mut this.io {
            Io::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(stream) => stream.is_write_vectored(),
            Io::Tls(stream) => stream.is_write_vectored(),
        }
    }
}
