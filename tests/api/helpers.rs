//! The harness the cross-service tests share: the test kit's, under the names these tests use,
//! and services as real processes (the test kit's process control).

pub use idempost_testkit::db::{Backend, TestDb};
#[cfg(feature = "failpoints")]
pub use idempost_testkit::failpoint::{arm, hold};
pub use idempost_testkit::in_process::InProcess;
pub use idempost_testkit::on_every_backend;
pub use idempost_testkit::order::{TestOrder, connect_order_service, order, order_accepted};
pub use idempost_testkit::outbox::{OutboxProbe, OutboxState};
pub use idempost_testkit::service::binary as service_binary;
use idempost_testkit::service::{Bound, Output, Signal};
pub use idempost_testkit::status::{metadata, reason, violated_fields};
pub use idempost_testkit::wait::{assert_eventually, eventually};

/// A service running as its own process, killed when dropped: the verifier's process control,
/// so tests and the verifier start, signal and kill services one way. Output is discarded
/// unless `TEST_LOG` is set.
pub struct ServiceProcess(
    idempost_testkit::service::ServiceProcess,
    // Held, never read: the port file's directory lives as long as the process.
    #[allow(dead_code)] Option<tempfile::TempDir>,
);

impl ServiceProcess {
    pub fn spawn(name: &str, args: &[String], env: &[(&str, String)]) -> Self {
        let output = if std::env::var_os("TEST_LOG").is_some() { Output::Inherit } else { Output::Discard };
        Self::start(name, args, env, output)
    }

    /// A service whose output (its logs) goes to `log`, read back with [`ServiceProcess::log`].
    pub fn spawn_logged(
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        log: std::path::PathBuf,
    ) -> Self {
        Self::start(name, args, env, Output::File(log))
    }

    fn start(name: &str, args: &[String], env: &[(&str, String)], output: Output) -> Self {
        let process =
            idempost_testkit::service::ServiceProcess::start(&service_binary(name), name, args, env, output);
        Self(process.unwrap(), None)
    }

    /// A service started with its listeners on port 0 (`args` say so) that writes the ports it
    /// got to a port file: returned once it wrote them, with them. No free port is guessed.
    pub async fn spawn_listening(name: &str, args: &[String], env: &[(&str, String)]) -> (Self, Bound) {
        let output = if std::env::var_os("TEST_LOG").is_some() { Output::Inherit } else { Output::Discard };
        let dir = tempfile::tempdir().unwrap();
        let mut process = idempost_testkit::service::ServiceProcess::start_with_port_file(
            &service_binary(name),
            name,
            args,
            env,
            output,
            &dir.path().join("ports"),
        )
        .unwrap();
        let bound = process.listening(std::time::Duration::from_secs(60)).await.unwrap();
        (Self(process, Some(dir)), bound)
    }

    /// Everything a logged service wrote so far.
    pub fn log(&self) -> String {
        self.0.log()
    }

    /// SIGKILL, and reaped.
    pub async fn kill(&mut self) {
        self.0.kill().await;
    }

    pub fn pid(&self) -> i32 {
        self.0.pid().unwrap() as i32
    }

    /// Sends `signal` (e.g. "KILL", "TERM"): a real signal, not an in-process stop.
    pub async fn signal(&self, signal: &str) {
        let parsed: Signal = format!("SIG{signal}").parse().unwrap_or_else(|_| panic!("no signal {signal}"));
        assert!(self.0.signal(parsed), "SIG{signal} to {} failed", self.pid());
    }

    pub async fn wait(&mut self, timeout: std::time::Duration) -> std::process::ExitStatus {
        self.0.exited(timeout).await.expect("the process did not exit in time")
    }
}
