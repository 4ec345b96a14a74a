//! The shutdown signal every service waits for.

/// Completes on SIGTERM or Ctrl-C (SIGINT).
///
/// If a handler cannot be installed the process is not stoppable gracefully, so that is a
/// start-up failure and panics.
#[allow(clippy::expect_used)] // start-up only
pub async fn signal() {
    let ctrl_c = async {
        tokio::signal::ctrl_c().await.expect("install the Ctrl-C handler");
    };
    #[cfg(unix)]
    let terminate = async {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install the SIGTERM handler")
            .recv()
            .await;
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
