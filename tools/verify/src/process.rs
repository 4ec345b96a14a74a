//! Service processes started, signalled and killed as real OS processes: the one way the
//! verifier and the end-to-end tests run `outpost-order`, `outpost-relay` and
//! `outpost-consumer` out of process, with their JSON logs kept as evidence when asked.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Where a process's output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Nowhere.
    Discard,
    /// To this process's own stdout and stderr.
    Inherit,
    /// Into this file, stdout and stderr (where the logs go) together, read back with
    /// [`ServiceProcess::log`] (or [`ServiceProcess::log_lines`] with `OUTPOST_LOG_FORMAT=json`).
    File(PathBuf),
}

/// One running (or exited) service process, killed when dropped.
#[derive(Debug)]
pub struct ServiceProcess {
    label: String,
    child: tokio::process::Child,
    log: Option<PathBuf>,
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
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .env("OUTPOST_AUTH", "none")
            // The services under test are failpoint builds, which refuse to start without it.
            .env(outpost::failpoint::ALLOW_FAILPOINTS, "1")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            // A secret file inherited from the caller would contradict the URL `env` gives.
            .env_remove("OUTPOST_DATABASE_URL_FILE")
            .stdin(Stdio::null())
            .kill_on_drop(true);
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
        Ok(Self { label: label.to_owned(), child: command.spawn()?, log })
    }

    /// The name it was started under.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The OS process id, while it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends `signal` (`TERM`, `KILL`, …) with kill(1): a real signal, not an in-process stop.
    /// Whether it was delivered.
    pub async fn signal(&self, signal: &str) -> bool {
        let Some(pid) = self.pid() else { return false };
        let sent =
            tokio::process::Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
        sent.await.is_ok_and(|status| status.success())
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub async fn exited(&mut self, timeout: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait()).await.ok().and_then(Result::ok)
    }

    /// SIGKILL, then reaps it: no handler runs, nothing is flushed.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then waits up to `timeout` for the drain.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.signal("TERM").await;
        self.exited(timeout).await
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
                let about = line["fields"]["outpost.event_id"].as_str() == Some(event_id)
                    || line["span"]["outpost.event_id"].as_str() == Some(event_id);
                message.starts_with(prefix) && about
            })
            .collect()
    }
}
