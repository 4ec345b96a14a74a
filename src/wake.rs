//! Best-effort wake-ups from the order service to idle relays, so a trickle of orders does not
//! wait out the relay's idle back-off.
//!
//! A wake-up is a UDP datagram sent after a new order commits; commits close together share one
//! (see [`WAKE_GAP`]). It carries no data and decides nothing: a relay that receives it polls the
//! outbox now instead of at the end of its idle wait, and a lost, late or forged datagram changes
//! only *when* the relay polls, never what it claims or publishes. The relay's own polling stays
//! the guarantee.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{Notify, mpsc, watch};

use crate::contract::WAKE_DATAGRAM as WAKE;

/// The least time between two rounds of wake-ups. Under load every order commit asks for one,
/// and a datagram per order cost the order service a send per order (and each relay a
/// receive) while the relays, busy with batches, had no idle wait to end. A relay polls at most
/// once per 10 ms however many arrive, so a round held back by up to this long never makes it
/// poll later than it would have.
const WAKE_GAP: Duration = Duration::from_millis(5);

/// Sends wake-ups to a fixed set of relays. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct WakeSender {
    /// Holds at most one pending round: a wake-up that finds one pending is covered by it, since
    /// that round is sent after it.
    pending: Option<mpsc::Sender<()>>,
}

impl WakeSender {
    /// A sender to `relays`, sending from a task of its own that ends when the last clone is
    /// dropped; with no relays it sends nothing. Fails only if no local UDP socket can be opened.
    /// Must be called inside a Tokio runtime.
    pub fn new(relays: &[SocketAddr]) -> std::io::Result<Self> {
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
        let (pending, rounds) = mpsc::channel(1);
        tokio::spawn(send_rounds(socket, relays.to_vec(), rounds));
        Ok(Self { pending: Some(pending) })
    }

    /// Asks for a round of wake-ups sent after this call, without waiting and without failing:
    /// it is sent at once, or at most [`WAKE_GAP`] after the previous round, and one round
    /// answers every call made before it is sent.
    pub fn wake(&self) {
        if let Some(pending) = &self.pending {
            // Full means a round is pending and not yet sent: it covers this commit too.
            let _ = pending.try_send(());
        }
    }
}

/// One datagram to every relay per pending round, rounds at least [`WAKE_GAP`] apart, until
/// every [`WakeSender`] is dropped. A datagram that cannot be sent only means the relay finds
/// the event at its next poll.
async fn send_rounds(socket: std::net::UdpSocket, relays: Vec<SocketAddr>, mut rounds: mpsc::Receiver<()>) {
    while rounds.recv().await.is_some() {
        for relay in &relays {
            if let Err(error) = socket.send_to(WAKE, relay) {
                tracing::debug!(%relay, %error, "wake-up not sent");
            }
        }
        tokio::time::sleep(WAKE_GAP).await;
    }
}

/// A relay's wake-up port: datagrams arriving on it end the relay's idle wait early.
#[derive(Debug)]
pub struct WakeListener {
    socket: UdpSocket,
    port: u16,
}

impl WakeListener {
    /// Binds `address` (port 0 picks a free port).
    pub async fn bind(address: SocketAddr) -> std::io::Result<Self> {
        let socket = UdpSocket::bind(address).await?;
        let port = socket.local_addr()?.port();
        Ok(Self { socket, port })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Notifies `wake` for every wake-up datagram until `stop` turns true. A flood coalesces
    /// into one pending notification, and the relay limits how often it polls.
    pub async fn run(self, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    async fn relay() -> (UdpSocket, SocketAddr) {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let address = socket.local_addr().unwrap();
        (socket, address)
    }

    /// Waits (in the test's paused time) for one wake-up datagram.
    async fn woken(relay: &UdpSocket) {
        let mut buffer = [0_u8; 64];
        let (n, _) = tokio::time::timeout(Duration::from_secs(60), relay.recv_from(&mut buffer))
            .await
            .expect("no wake-up arrived")
            .unwrap();
        assert_eq!(&buffer[..n], WAKE);
    }

    fn nothing_more(relay: &UdpSocket) {
        let mut buffer = [0_u8; 64];
        let more = relay.try_recv_from(&mut buffer);
        assert!(more.is_err(), "an extra wake-up arrived: {more:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_wake_ups_sends_every_relay_one_datagram() {
        let ((a, a_address), (b, b_address)) = (relay().await, relay().await);
        let sender = WakeSender::new(&[a_address, b_address]).unwrap();
        for _ in 0..1_000 {
            sender.clone().wake();
        }
        woken(&a).await;
        woken(&b).await;
        tokio::time::sleep(WAKE_GAP * 10).await;
        nothing_more(&a);
        nothing_more(&b);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_right_after_a_round_is_sent_once_the_gap_has_passed() {
        let (relay, address) = relay().await;
        let sender = WakeSender::new(&[address]).unwrap();
        sender.wake();
        woken(&relay).await;
        let first = tokio::time::Instant::now();
        sender.wake();
        sender.wake();
        woken(&relay).await;
        assert!(first.elapsed() >= WAKE_GAP, "sent {:?} after the first", first.elapsed());
        tokio::time::sleep(WAKE_GAP * 10).await;
        nothing_more(&relay);
        // A lone wake-up long after the last round goes out at once.
        let lone = tokio::time::Instant::now();
        sender.wake();
        woken(&relay).await;
        assert_eq!(lone.elapsed(), Duration::ZERO);
    }

    #[test]
    fn without_relays_a_wake_up_sends_nothing_and_needs_no_runtime() {
        WakeSender::new(&[]).unwrap().wake();
    }
}
