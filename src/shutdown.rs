//! The shutdown signals every service waits for, caught from the first line of `main`.

use std::future::Future;

use tokio::signal::unix::{Signal, SignalKind, signal as unix_signal};

/// SIGTERM and SIGINT (Ctrl-C), caught from the moment [`Signals::install`] returns: from then on
/// neither kills the process, whether it is still starting or already serving. SIGHUP is caught
/// too, and never stops anything: operators send it to have certificates, the JWKS and the order
/// service's shard map re-read, and its default action (terminate) would otherwise kill every
/// process that has none of a TLS listener, a JWKS or a shard map, the only parts that listen for
/// it themselves.
#[derive(Debug)]
pub struct Signals {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
}

impl Signals {
    /// Installs the handlers; the first line of every service's `main`.
    ///
    /// If a handler cannot be installed the process is not stoppable gracefully, so that is a
    /// start-up failure and panics.
    #[allow(clippy::expect_used)] // start-up only
    pub fn install() -> Self {
        Self {
            terminate: unix_signal(SignalKind::terminate()).expect("install the SIGTERM handler"),
            interrupt: unix_signal(SignalKind::interrupt()).expect("install the SIGINT handler"),
            hangup: unix_signal(SignalKind::hangup()).expect("install the SIGHUP handler"),
        }
    }

    /// Runs start-up `work` unless a signal comes first: then `work` is dropped where it stands
    /// (nothing was taken yet, so nothing needs draining) and the answer is `None`.
    pub async fn unless_stopped<T>(&mut self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            done = work => Some(done),
            () = self.received() => {
                tracing::info!("shutdown requested during start-up; stopping without serving");
                None
            }
        }
    }

    /// Completes on the next SIGTERM or SIGINT (never on SIGHUP): what a running service drains on.
    pub async fn recv(mut self) {
        self.received().await;
    }

    async fn received(&mut self) {
        loop {
            tokio::select! {
                _ = self.terminate.recv() => return,
                _ = self.interrupt.recv() => return,
                _ = self.hangup.recv() => tracing::info!(
                    "SIGHUP received: certificates, the JWKS and the shard map (order service, relay fleet) are re-read where configured; nothing stops"
                ),
            }
        }
    }
}

/// Completes on SIGTERM or SIGINT, caught from this call on: for embedding, where the caller's
/// own start-up is already done.
pub async fn signal() {
    Signals::install().recv().await;
}
