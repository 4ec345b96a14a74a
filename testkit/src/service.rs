//! Service processes started, signalled and killed as real OS processes: the one way the
//! verifier and the end-to-end tests run `idempost-order`, `idempost-relay` and
//! `idempost-consumer` out of process, with their JSON logs kept as evidence when asked. The
//! process control itself is the test kit's; what is Idempost's here is the environment the
//! services start in.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

pub use crate::ports::Bound;
use crate::ports::wait_for_port_file;
use crate::process::Process;
pub use crate::process::Signal;
use serde_json::Value;

/// Where a process's output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Nowhere.
    Discard,
    /// To this process's own stdout and stderr.
    Inherit,
    /// Into this file, stdout and stderr (where the logs go) together, read back with
    /// [`ServiceProcess::log`] (or [`ServiceProcess::log_lines`] with `IDEMPOST_LOG_FORMAT=json`).
    File(PathBuf),
}

/// One running (or exited) service process, killed when dropped.
#[derive(Debug)]
pub struct ServiceProcess {
    process: Process,
    log: Option<PathBuf>,
    port_file: Option<PathBuf>,
}

impl ServiceProcess {
    /// Starts `program` with `args` and then `env` set (after the defaults, so `env` wins).
    ///
    /// The fleet runs on loopback: no caller authentication and no OTLP export unless `env`
    /// asks for them. `label` names the process in reports.
    pub fn start(
        program: &Path,
        label: &str,
        args: &[String],
        env: &[(&str, String)],
        output: Output,
    ) -> std::io::Result<Self> {
        Self::spawn(program, label, args, env, output, None)
    }

    /// [`ServiceProcess::start`] for a service that writes its bound addresses to `port_file`
    /// (`IDEMPOST_PORT_FILE`), so it can listen on port 0: [`ServiceProcess::listening`] reads
    /// them. A file left from an earlier process is removed first.
    pub fn start_with_port_file(
        program: &Path,
        label: &str,
        args: &[String],
        env: &[(&str, String)],
        output: Output,
        port_file: &Path,
    ) -> std::io::Result<Self> {
        match std::fs::remove_file(port_file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Self::spawn(program, label, args, env, output, Some(port_file))
    }

    fn spawn(
        program: &Path,
        label: &str,
        args: &[String],
        env: &[(&str, String)],
        output: Output,
        port_file: Option<&Path>,
    ) -> std::io::Result<Self> {
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .env("IDEMPOST_AUTH", "none")
            // The services under test are failpoint builds, which refuse to start without it.
            .env(idempost::failpoint::ALLOW_FAILPOINTS, "1")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            // A secret file inherited from the caller would contradict the URL `env` gives.
            .env_remove("IDEMPOST_DATABASE_URL_FILE")
            .env_remove("IDEMPOST_PORT_FILE")
            .stdin(Stdio::null());
        let log = match output {
            Output::Discard => {
                command.stdout(Stdio::null()).stderr(Stdio::null());
                None
            }
            Output::Inherit => None,
            Output::File(path) => {
                let file = std::fs::File::create(&path)?;
                command.stdout(file.try_clone()?).stderr(file);
                Some(path)
            }
        };
        for (key, value) in env {
            command.env(key, value);
        }
        if let Some(port_file) = port_file {
            command.env("IDEMPOST_PORT_FILE", port_file);
        }
        let port_file = port_file.map(Path::to_owned);
        Ok(Self { process: Process::spawn(label, &mut command)?, log, port_file })
    }

    /// The addresses it bound, once it wrote them (started with
    /// [`ServiceProcess::start_with_port_file`]); an error if it exits or `timeout` passes first.
    pub async fn listening(&mut self, timeout: Duration) -> Result<Bound, String> {
        let Some(path) = self.port_file.clone() else {
            return Err(format!("{} was started without a port file", self.label()));
        };
        let label = self.label().to_owned();
        let process = &mut self.process;
        let alive = || match process.try_exited() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{label} exited ({status}) before it was listening")),
            Err(e) => Err(format!("{label}: {e}")),
        };
        wait_for_port_file(&path, timeout, alive).await
    }

    /// The name it was started under.
    pub fn label(&self) -> &str {
        self.process.label()
    }

    /// The OS process id, while it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Sends `signal` (SIGTERM, SIGKILL, SIGSTOP, …): a real signal, not an in-process stop.
    /// Whether it was delivered.
    pub fn signal(&self, signal: Signal) -> bool {
        self.process.signal(signal)
    }

    /// Its exit status if it has exited, without waiting.
    pub fn try_exited(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.process.try_exited()
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub async fn exited(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.process.exited(timeout).await
    }

    /// SIGKILL, then reaps it: no handler runs, nothing is flushed.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }

    /// SIGTERM, then waits up to `timeout` for the drain.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.process.terminate(timeout).await
    }

    /// Everything it wrote so far (nothing unless started with [`Output::File`]).
    pub fn log(&self) -> String {
        self.log.as_ref().and_then(|log| std::fs::read_to_string(log).ok()).unwrap_or_default()
    }

    /// Every JSON log line so far.
    pub fn log_lines(&self) -> Vec<Value> {
        self.log().lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
    }

    /// Log lines whose message starts with `prefix` and that name `event_id`.
    pub fn lines_about(&self, prefix: &str, event_id: &str) -> Vec<Value> {
        self.log_lines()
            .into_iter()
            .filter(|line| {
                let message = line["fields"]["message"].as_str().unwrap_or_default();
                let about = line["fields"]["idempost.event_id"].as_str() == Some(event_id)
                    || line["span"]["idempost.event_id"].as_str() == Some(event_id);
                message.starts_with(prefix) && about
            })
            .collect()
    }
}

/// A service binary of this workspace, built next to the test binary (scripts/test builds
/// them with the same features before running the tests).
pub fn binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(std::path::Path::parent).unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --all-features --bins` first",
        path.display()
    );
    path
}

/// A service binary of this workspace running as its own process, as the tests start it, killed
/// when dropped: [`ServiceProcess`] with the binary found beside the test, so tests and the
/// verifier start, signal and kill services one way. Output is discarded
/// unless `TEST_LOG` is set.
#[derive(Debug)]
pub struct TestService(
    ServiceProcess,
    // Held, never read: the port file's directory lives as long as the process.
    #[allow(dead_code)] Option<tempfile::TempDir>,
);

impl TestService {
    pub fn spawn(name: &str, args: &[String], env: &[(&str, String)]) -> Self {
        let output = if std::env::var_os("TEST_LOG").is_some() { Output::Inherit } else { Output::Discard };
        Self::start(name, args, env, output)
    }

    /// A service whose output (its logs) goes to `log`, read back with [`TestService::log`].
    pub fn spawn_logged(
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        log: std::path::PathBuf,
    ) -> Self {
        Self::start(name, args, env, Output::File(log))
    }

    fn start(name: &str, args: &[String], env: &[(&str, String)], output: Output) -> Self {
        let process = ServiceProcess::start(&binary(name), name, args, env, output);
        Self(process.unwrap(), None)
    }

    /// A service started with its listeners on port 0 (`args` say so) that writes the ports it
    /// got to a port file: returned once it wrote them, with them. No free port is guessed.
    pub async fn spawn_listening(name: &str, args: &[String], env: &[(&str, String)]) -> (Self, Bound) {
        let output = if std::env::var_os("TEST_LOG").is_some() { Output::Inherit } else { Output::Discard };
        Self::listening_with(name, args, env, output).await
    }

    /// [`TestService::spawn_listening`] with its output (its logs) in `log`, read back with
    /// [`TestService::log`].
    pub async fn spawn_listening_logged(
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        log: std::path::PathBuf,
    ) -> (Self, Bound) {
        Self::listening_with(name, args, env, Output::File(log)).await
    }

    async fn listening_with(
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        output: Output,
    ) -> (Self, Bound) {
        let dir = tempfile::tempdir().unwrap();
        let mut process = ServiceProcess::start_with_port_file(
            &binary(name),
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
