//! Best-effort wake-ups from the order service to idle relays, so a trickle of orders does not
//! wait out the relay's idle back-off.
//!
//! A wake-up is one UDP datagram sent after a new order commits. It carries no data and decides
//! nothing: a relay that receives it polls the outbox now instead of at the end of its idle
//! wait, and a lost, late or forged datagram changes only *when* the relay polls, never what it
//! claims or publishes. The relay's own polling stays the guarantee.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{Notify, watch};

use crate::contract::WAKE_DATAGRAM as WAKE;

/// Sends wake-ups to a fixed set of relays. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct WakeSender {
    inner: Option<Arc<Sender>>,
}

#[derive(Debug)]
struct Sender {
    socket: std::net::UdpSocket,
    relays: Vec<SocketAddr>,
}

impl WakeSender {
    /// A sender to `relays`; with none it sends nothing. Fails only if no local UDP socket can
    /// be opened.
    pub(crate) fn new(relays: &[SocketAddr]) -> std::io::Result<Self> {
        if relays.is_empty() {
            return Ok(Self::default());
        }
        let any: SocketAddr = if relays.iter().all(SocketAddr::is_ipv4) {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = std::net::UdpSocket::bind(any)?;
        socket.set_nonblocking(true)?;
        Ok(Self { inner: Some(Arc::new(Sender { socket, relays: relays.to_vec() })) })
    }

    /// Wakes every relay, without waiting and without failing: a datagram that cannot be sent
    /// only means the relay finds the event at its next poll.
    pub(crate) fn wake(&self) {
        let Some(sender) = &self.inner else { return };
        for relay in &sender.relays {
            if let Err(error) = sender.socket.send_to(WAKE, relay) {
                tracing::debug!(%relay, %error, "wake-up not sent");
            }
        }
    }
}

/// A relay's wake-up port: datagrams arriving on it end the relay's idle wait early.
#[derive(Debug)]
pub(crate) struct WakeListener {
    socket: UdpSocket,
    port: u16,
}

impl WakeListener {
    /// Binds `address` (port 0 picks a free port).
    pub(crate) async fn bind(address: SocketAddr) -> std::io::Result<Self> {
        let socket = UdpSocket::bind(address).await?;
        let port = socket.local_addr()?.port();
        Ok(Self { socket, port })
    }

    /// The bound port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Notifies `wake` for every wake-up datagram until `stop` turns true. A flood coalesces
    /// into one pending notification, and the relay limits how often it polls.
    pub(crate) async fn run(self, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
        let mut buffer = [0_u8; 64];
        while !*stop.borrow() {
            tokio::select! {
                received = self.socket.recv_from(&mut buffer) => match received {
                    Ok((n, _)) if &buffer[..n] == WAKE => wake.notify_one(),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(%error, "wake-up port read failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                changed = stop.changed() => if changed.is_err() { break },
            }
        }
    }
}
