//! Accepted connections and what bounds them: how many one listener keeps open, and one peer
//! address of them, how many TLS handshakes run at once, the process's open-file limit, how long
//! one may sit idle or unauthenticated, and how many of its calls may be refused.

mod by_address;

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
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

use self::by_address::{AddressSlot, ByAddress, Kind};
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

/// TLS handshakes from this host's own loopback address (its probes, its sidecars) run on slots
/// of their own, so that peers elsewhere holding the listener's cannot fail a readiness probe.
const LOOPBACK_HANDSHAKES: usize = 8;

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
    /// `--max-tls-handshakes` are under way, and none ended within the brief wait for one.
    Handshakes,
    /// The peer's address holds `--max-connections-per-address` already.
    AddressConnections,
    /// The peer's address has `--max-tls-handshakes-per-address` under way.
    AddressHandshakes,
}

impl Shed {
    fn as_str(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::Descriptors => "descriptors",
            Self::Handshakes => "handshakes",
            Self::AddressConnections => "address_connections",
            Self::AddressHandshakes => "address_handshakes",
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
    loopback_handshakes: Arc<Semaphore>,
    by_address: Arc<ByAddress>,
    /// The first descriptor number at which new connections are shed, if the limit is finite.
    shed_from_descriptor: Option<u64>,
    calls_per_connection: usize,
    timeouts: Timeouts,
    max_refused_calls: u32,
    handshake_slot_wait: Duration,
}

/// How long a connection may go without an authenticated call in flight.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    /// Since its last authenticated call ended.
    idle: Duration,
    /// Since it opened, while it has made none.
    unauthenticated: Duration,
}

impl ConnectionLimits {
    pub(crate) fn new(settings: &ListenerSettings, calls_per_connection: usize) -> Self {
        Self {
            connections: Arc::new(Semaphore::new(settings.max_connections as usize)),
            health_only: Arc::new(Semaphore::new(HEALTH_ONLY_CONNECTIONS)),
            handshakes: Arc::new(Semaphore::new(settings.max_tls_handshakes as usize)),
            loopback_handshakes: Arc::new(Semaphore::new(LOOPBACK_HANDSHAKES)),
            by_address: ByAddress::new(
                settings.max_connections_per_address,
                settings.max_tls_handshakes_per_address,
            ),
            shed_from_descriptor: descriptor_limit().map(|limit| limit / 10 * DESCRIPTOR_SHED_TENTHS),
            calls_per_connection,
            timeouts: Timeouts {
                idle: settings.idle_timeout,
                unauthenticated: settings.unauthenticated_timeout,
            },
            max_refused_calls: settings.max_refused_calls,
            handshake_slot_wait: settings.tls_handshake_slot_wait,
        }
    }

    /// Admits a new connection from `peer` in full, for health checks only, or not at all (it is
    /// then dropped, which closes it). An address at its own cap is closed at once: the slots
    /// kept for health checks are not for the peer that filled its share.
    pub(crate) fn admit(&self, stream: &TcpStream, peer: SocketAddr) -> Result<Admitted, Shed> {
        let source = by_address::source(peer.ip());
        let address = match source {
            Some(ip) => match self.by_address.take(ip, Kind::Connection) {
                Some(slot) => Some(slot),
                None => {
                    Shed::AddressConnections.count(false);
                    return Err(Shed::AddressConnections);
                }
            },
            None => None,
        };
        let shed = if self.descriptors_left(stream) {
            match Arc::clone(&self.connections).try_acquire_owned() {
                Ok(permit) => {
                    let state =
                        ConnectionState::new(self.calls_per_connection, false, self.max_refused_calls);
                    let held = Held { _permit: permit, _address: address };
                    return Ok(Admitted { held, state, timeouts: self.timeouts, source });
                }
                Err(_) => Shed::Connections,
            }
        } else {
            Shed::Descriptors
        };
        match Arc::clone(&self.health_only).try_acquire_owned() {
            Ok(permit) => {
                shed.count(true);
                let state = ConnectionState::new(0, true, self.max_refused_calls);
                let held = Held { _permit: permit, _address: address };
                let timeouts = Timeouts { idle: HEALTH_ONLY_IDLE, unauthenticated: HEALTH_ONLY_IDLE };
                Ok(Admitted { held, state, timeouts, source })
            }
            Err(_) => {
                shed.count(false);
                Err(shed)
            }
        }
    }

    /// This connection's share of its address's TLS handshakes, taken when it is accepted and
    /// held until its handshake ends (none for this host's loopback address).
    pub(crate) fn handshake_share(&self, admitted: &Admitted) -> Result<Option<AddressSlot>, Shed> {
        let Some(ip) = admitted.source else { return Ok(None) };
        match self.by_address.take(ip, Kind::Handshake) {
            Some(slot) => Ok(Some(slot)),
            None => {
                Shed::AddressHandshakes.count(false);
                Err(Shed::AddressHandshakes)
            }
        }
    }

    /// A slot for one TLS handshake, waiting briefly for one to end when all are taken; this
    /// host's loopback address draws on slots of its own.
    pub(crate) async fn handshake(&self, admitted: &Admitted) -> Result<OwnedSemaphorePermit, Shed> {
        let slots = match admitted.source {
            Some(_) => &self.handshakes,
            None => &self.loopback_handshakes,
        };
        match tokio::time::timeout(self.handshake_slot_wait, Arc::clone(slots).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => {
                Shed::Handshakes.count(false);
                Err(Shed::Handshakes)
            }
        }
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

/// What an open connection holds until it closes: its listener's permit and its address's.
#[derive(Debug)]
struct Held {
    _permit: OwnedSemaphorePermit,
    _address: Option<AddressSlot>,
}

/// A connection let in, with what it holds until it closes.
#[derive(Debug)]
pub(crate) struct Admitted {
    held: Held,
    state: Arc<ConnectionState>,
    timeouts: Timeouts,
    /// The peer's address as the per-address caps count it (`None`: this host's loopback).
    source: Option<IpAddr>,
}

impl Admitted {
    /// The connection as the server reads it, over `io`.
    pub(crate) fn serve(self, io: Io) -> Connection {
        let tcp = match &io {
            Io::Plain(stream) => stream.connect_info(),
            Io::Tls(stream) => stream.get_ref().0.connect_info(),
        };
        let first_deadline = self.state.idle_deadline(self.timeouts).unwrap_or_else(Instant::now);
        Connection {
            io,
            info: ConnectionInfo { tcp, state: self.state },
            idle: Box::pin(tokio::time::sleep_until(first_deadline)),
            timeouts: self.timeouts,
            wrote_since_refusals: false,
            answered_since_refusals: false,
            _held: self.held,
        }
    }
}

/// What every call on one connection shares: its own call permits, whether it serves health
/// checks only, when it last had no authenticated call in flight (or opened, if it never had
/// one), and how many of its calls were refused.
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
    /// Whether an authenticated call has begun on it.
    authenticated: AtomicBool,
    refused: AtomicU32,
    max_refused: u32,
    /// Set once the answer to the last allowed refusal was queued: the connection closes once it
    /// is written.
    refused_enough: AtomicBool,
    /// Set by [`ConnectionState::close`]; the reader to wake for it.
    closing: AtomicBool,
    reader: AtomicWaker,
}

impl ConnectionState {
    fn new(calls: usize, health_only: bool, max_refused: u32) -> Arc<Self> {
        Arc::new(Self {
            calls: Arc::new(Semaphore::new(calls)),
            health_only,
            watches: Arc::new(Semaphore::new(WATCHES_PER_CONNECTION)),
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            authenticated: AtomicBool::new(false),
            refused: AtomicU32::new(0),
            max_refused,
            refused_enough: AtomicBool::new(false),
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

    /// Marks an authenticated call in flight until the returned guard is dropped (when its
    /// answer is sent). Only these keep a connection open: health checks, reflection and refused
    /// calls cost a peer without a token nothing, so they must not buy it a connection either.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.authenticated.store(true, Ordering::SeqCst);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// Counts a call refused for its caller's credentials. The one that reaches the connection's
    /// bound gets a [`LastRefusal`] for its answer: the connection closes once that is written.
    pub fn refused(self: &Arc<Self>) -> Option<LastRefusal> {
        let last = self.refused.fetch_add(1, Ordering::SeqCst) + 1 == self.max_refused;
        last.then(|| LastRefusal { _closes: Arc::new(Closer(Arc::clone(self))) })
    }

    /// When the connection may be closed for idleness: `None` while an authenticated call is in
    /// flight. One that never had one may stay only its unauthenticated timeout from its opening.
    fn idle_deadline(&self, timeouts: Timeouts) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let timeout = match self.authenticated.load(Ordering::SeqCst) {
            true => timeouts.idle,
            false => timeouts.unauthenticated.min(timeouts.idle),
        };
        Some(*self.idle_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner) + timeout)
    }
}

/// Carried in the extensions of the answer to a connection's last allowed refusal. The server
/// drops an answer's head once it has queued its frame, so the writes after that carry it, and
/// the connection's reads end once they are flushed.
#[derive(Debug, Clone)]
pub struct LastRefusal {
    _closes: Arc<Closer>,
}

#[derive(Debug)]
struct Closer(Arc<ConnectionState>);

impl Drop for Closer {
    fn drop(&mut self) {
        tracing::debug!(refused = self.0.max_refused, "connection closed after its refused calls");
        self.0.refused_enough.store(true, Ordering::SeqCst);
        self.0.reader.wake();
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

/// An accepted connection: closed (its reads end) once it has been idle for its idle timeout,
/// unauthenticated for its unauthenticated timeout, or has answered its last allowed refusal.
#[derive(Debug)]
pub struct Connection {
    io: Io,
    info: ConnectionInfo,
    idle: Pin<Box<Sleep>>,
    timeouts: Timeouts,
    /// What was written, and then flushed, after its refusals reached their bound: the last
    /// refusal's answer, which the server would drop unsent if its reads ended first.
    wrote_since_refusals: bool,
    answered_since_refusals: bool,
    _held: Held,
}

impl Connection {
    /// Whether the connection has been idle too long; otherwise the idle timer is re-armed (and
    /// wakes the reader when it fires).
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        while self.idle.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            match self.info.state.idle_deadline(self.timeouts) {
                Some(deadline) if deadline <= now => return true,
                Some(deadline) => self.idle.as_mut().reset(deadline),
                None => self.idle.as_mut().reset(now + self.timeouts.idle),
            }
        }
        false
    }

    /// Notes `written` bytes: those written after the last allowed refusal's answer was queued
    /// carry it.
    fn wrote(&mut self, written: &Poll<std::io::Result<usize>>) {
        if matches!(written, Poll::Ready(Ok(n)) if *n > 0)
            && self.info.state.refused_enough.load(Ordering::SeqCst)
        {
            self.wrote_since_refusals = true;
        }
    }

    /// Notes a flush: once the last allowed refusal's answer is out, the reader is woken to end
    /// the connection.
    fn flushed(&mut self, flushed: &Poll<std::io::Result<()>>) {
        if self.wrote_since_refusals
            && !self.answered_since_refusals
            && matches!(flushed, Poll::Ready(Ok(())))
        {
            self.answered_since_refusals = true;
            self.info.state.reader.wake();
        }
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
        if this.info.state.closed(cx) || this.answered_since_refusals || this.idle_expired(cx) {
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
        let this = self.get_mut();
        let written = match &mut this.io {
            Io::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        };
        this.wrote(&written);
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let flushed = match &mut this.io {
            Io::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        };
        this.flushed(&flushed);
        flushed
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
        let this = self.get_mut();
        let written = match &mut this.io {
            Io::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        };
        this.wrote(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(stream) => stream.is_write_vectored(),
            Io::Tls(stream) => stream.is_write_vectored(),
        }
    }
}
