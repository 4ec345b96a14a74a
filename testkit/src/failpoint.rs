//! Failpoints armed in the test's own process, for services running in it ([`crate::in_process`]).
//! Failpoints are process-global: each helper refuses to run outside nextest, which gives every
//! test a process of its own.

use tokio::sync::oneshot;

/// Arms a failpoint for this test process. Failpoints are process-global, so this refuses to
/// run outside nextest, which gives each test a process of its own.
pub fn arm(point: &str, actions: &str) {
    assert!(
        std::env::var_os("NEXTEST").is_some(),
        "failpoint tests need a process per test: run them with `cargo nextest run`"
    );
    fail::cfg(point, actions).unwrap();
}

/// Arms `point` to hold the first thread that passes it until the returned [`Held`] lets it go
/// (or is dropped, so a failing test never leaves a thread held); later passes go straight on.
///
/// Unlike a `sleep`, a hold ends when the test has seen what it waited for, not when a guessed
/// time is up: on a loaded machine the other side may not get there within any fixed sleep.
pub fn hold(point: &'static str) -> Held {
    use std::sync::{Mutex, mpsc};
    assert!(
        std::env::var_os("NEXTEST").is_some(),
        "failpoint tests need a process per test: run them with `cargo nextest run`"
    );
    let (reached, reached_rx) = oneshot::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let first = Mutex::new(Some((reached, release_rx)));
    fail::cfg_callback(point, move || {
        let taken = first.lock().unwrap().take();
        if let Some((reached, release)) = taken {
            let _ = reached.send(());
            // Blocks this thread, as the failpoint's `sleep` would, until released or dropped.
            let _ = release.recv();
        }
    })
    .unwrap();
    Held { point, reached: Some(reached_rx), release: Some(release) }
}

/// A thread held at a failpoint by [`hold`].
#[derive(Debug)]
pub struct Held {
    point: &'static str,
    reached: Option<oneshot::Receiver<()>>,
    release: Option<std::sync::mpsc::Sender<()>>,
}

impl Held {
    /// Waits until a thread is held at the point, failing the test with `what` after `timeout`.
    pub async fn reached(&mut self, what: &str, timeout: std::time::Duration) {
        let reached = self.reached.take().expect("waited for the hold once");
        let arrived = tokio::time::timeout(timeout, reached).await;
        assert!(matches!(arrived, Ok(Ok(()))), "timed out after {timeout:?} waiting until {what}");
    }

    /// Lets the held thread go on.
    pub fn release(self) {}
}

impl Drop for Held {
    fn drop(&mut self) {
        // A closed channel ends the hold.
        drop(self.release.take());
        fail::remove(self.point);
    }
}
