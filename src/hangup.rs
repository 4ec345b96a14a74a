//! SIGHUP as a request to re-read something (the order service's and the relay fleet's shard
//! map): one loop that runs a reload on each SIGHUP until the service stops.

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Runs `on_hangup` on every SIGHUP until `stop` turns true (or its sender is gone); `what` names
/// what a SIGHUP re-reads, for the warning when SIGHUP cannot be listened for. SIGHUPs that
/// arrive during a run are taken once it is done.
///
/// Listens from this call on, not from the task's first run: a SIGHUP sent once the caller has
/// returned (a service answering calls) is always taken, never the default action's, which
/// would end the process.
pub fn every_hangup<F, Fut>(
    what: &'static str,
    mut stop: watch::Receiver<bool>,
    mut on_hangup: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let hangups = signal(SignalKind::hangup());
    tokio::spawn(async move {
        let Ok(mut hangups) = hangups else {
            tracing::warn!("cannot listen for SIGHUP: {what} is read at start-up only");
            return;
        };
        loop {
            tokio::select! {
                Some(()) = hangups.recv() => on_hangup().await,
                () = stopped(&mut stop) => return,
            }
        }
    })
}

/// Completes once `stop` is true or its sender is gone. Answers nothing: the watch's guard is
/// not `Send`, and a select's output lives across the reload's awaits.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use tokio::sync::{mpsc, watch};

    use super::every_hangup;

    /// Raises SIGHUP at this very process. nextest runs each test in a process of its own; under
    /// `cargo test` the other tests of this binary that listen for SIGHUP (the JWKS and
    /// certificate re-reads) would take it too, which only makes them re-read an unchanged file.
    fn raise_hangup() {
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::HUP)
            .expect("raise SIGHUP");
    }

    #[tokio::test]
    async fn a_sighup_raised_before_the_task_first_runs_is_taken_and_the_stop_watch_ends_the_loop() {
        let (stop, stopped) = watch::channel(false);
        let (ran, mut runs) = mpsc::unbounded_channel();
        let task = every_hangup("the test's file", stopped, move || {
            let ran = ran.clone();
            async move {
                let _ = ran.send(());
            }
        });
        // On this single-threaded runtime the task has not run yet: were the handler installed by
        // the task, this SIGHUP would end the test process.
        raise_hangup();
        tokio::time::timeout(Duration::from_secs(10), runs.recv())
            .await
            .expect("the SIGHUP was taken")
            .expect("the loop is alive");
        let _ = stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the loop ended")
            .expect("the loop did not panic");
        assert!(runs.try_recv().is_err(), "one SIGHUP, one run");
    }

    #[tokio::test]
    async fn a_stop_watch_already_true_ends_the_loop_without_a_run() {
        let (_stop, stopped) = watch::channel(true);
        let task = every_hangup("the test's file", stopped, || async { panic!("no SIGHUP was sent") });
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the loop ended")
            .expect("the loop did not panic");
    }
}
