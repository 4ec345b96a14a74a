//! A TLS handshake under bounds: the peer's first bytes must come quickly, then it waits briefly
//! for one of the listener's handshake slots, and the whole must end soon after the accept.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::security::connection::{Admitted, Connection, ConnectionLimits, Io};

/// A TLS handshake that has not finished this long after its connection was accepted is
/// dropped, so slow clients cannot hold handshake slots.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Performs the handshake of `stream` (accepted from `peer` at `accepted`) and hands the
/// connection to `tx`; a peer that misses a bound is closed (its stream dropped).
pub(super) async fn handshake(
    limits: Arc<ConnectionLimits>,
    acceptor: TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    admitted: Admitted,
    first_byte_timeout: Duration,
    tx: mpsc::Sender<Connection>,
) {
    let accepted = Instant::now();
    // Counted against the peer's address from the accept on, silent or not.
    let Ok(share) = limits.handshake_share(&admitted) else { return };
    // A silent connection is closed before it takes one of the listener's slots.
    let mut first = [0u8; 1];
    match tokio::time::timeout(first_byte_timeout, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {}
        Ok(_) => return,
        Err(_) => {
            tracing::debug!(%peer, "no TLS ClientHello within the first-byte timeout");
            return;
        }
    }
    let Ok(slot) = limits.handshake(&admitted).await else { return };
    let handshake = tokio::time::timeout_at(accepted + HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
    drop((share, slot));
    match handshake {
        Ok(Ok(stream)) => {
            let _ = tx.send(admitted.serve(Io::Tls(Box::new(stream)))).await;
        }
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}
