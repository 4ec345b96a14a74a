//! A service's `run_until_stopped` running inside the test's own process.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::oneshot;

/// A service running in this process until stopped or dropped.
#[derive(Debug)]
pub struct InProcess {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// How long [`InProcess::stop`] waits for a service to end.
const STOPPED_WITHIN: Duration = Duration::from_secs(60);

impl InProcess {
    /// Spawns `run(shutdown)`; the service must end without error once `shutdown` completes.
    pub fn spawn<Fut, E>(run: impl FnOnce(Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut) -> Self
    where
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Debug,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let service = run(Box::pin(async move {
            let _ = stopped.await;
        }));
        let task = tokio::spawn(async move { service.await.unwrap() });
        Self { stop: Some(stop), task }
    }

    /// Stops the service as SIGTERM would, and waits until it has: at most [`STOPPED_WITHIN`],
    /// more than any service's drain (the relay's within its default lease of 30 s), so a stop
    /// that hangs fails the test by name instead of running into the test's timeout.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let stopped = tokio::time::timeout(STOPPED_WITHIN, &mut self.task).await;
        stopped.unwrap_or_else(|_| panic!("the service did not stop within {STOPPED_WITHIN:?}")).unwrap();
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
