//! Service processes the verifier starts, crashes and restarts, with their JSON logs as evidence.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

/// One running (or exited) service process.
#[derive(Debug)]
pub(crate) struct ServiceProcess {
    pub(crate) label: String,
    child: tokio::process::Child,
    log: PathBuf,
}

impl ServiceProcess {
    /// Starts `binary` from `bin_dir` with `args`, the failpoints in `failpoints` (`NAME=ACTION;…`)
    /// and JSON logs written to `log_dir/label.log`.
    pub(crate) fn start(
        bin_dir: &Path,
        binary: &str,
        label: &str,
        args: &[String],
        failpoints: &str,
        log_dir: &Path,
    ) -> std::io::Result<Self> {
        let log = log_dir.join(format!("{label}.log"));
        let stderr = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(bin_dir.join(binary))
            .args(args)
            .env("FAILPOINTS", failpoints)
            .env("OUTPOST_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            // The fleet runs on loopback only: no caller authentication.
            .env("OUTPOST_AUTH", "none")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self { label: label.to_owned(), child, log })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub(crate) async fn exited(&mut self, timeout: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait()).await.ok().and_then(Result::ok)
    }

    /// SIGKILL: no handler runs, nothing is flushed.
    pub(crate) async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then waits for the drain.
    pub(crate) async fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(pid) = self.pid() {
            let _ = tokio::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        }
        self.exited(timeout).await
    }

    /// Every JSON log line so far.
    pub(crate) fn log_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Log lines whose message starts with `prefix` and that name `event_id`.
    pub(crate) fn lines_about(&self, prefix: &str, event_id: &str) -> Vec<Value> {
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
