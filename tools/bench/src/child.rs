//! The services as real child processes, and what the kernel says they used.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use idempost_testkit::process::Process;

use crate::error::BenchError;

/// CPU time and peak memory of one process, from `/proc/PID/stat` and `/proc/PID/status`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    /// User plus system CPU seconds.
    pub(crate) cpu_seconds: f64,
    /// `VmHWM`: the peak resident set, in KiB.
    pub(crate) peak_rss_kib: u64,
}

impl Usage {
    /// Reads the usage of `pid` now.
    pub(crate) fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may hold spaces; fields count from after its closing parenthesis.
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
        let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let peak_rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        Some(Self { cpu_seconds: ticks as f64 / clock_ticks(), peak_rss_kib })
    }
}

/// Kernel clock ticks per second for `/proc` times (USER_HZ), which is 100 on Linux.
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// A running service.
#[derive(Debug)]
pub(crate) struct Service {
    process: Process,
    pid: u32,
}

impl Service {
    /// Starts `binary` from `bin_dir` with `args`; its stderr goes to `log_dir/label.log`.
    pub(crate) fn start(
        bin_dir: &Path,
        binary: &str,
        label: &str,
        args: &[String],
        log_dir: &Path,
    ) -> Result<Self, BenchError> {
        Self::start_with_env(bin_dir, binary, label, args, log_dir, &[])
    }

    /// [`Service::start`] with extra environment variables (they win over the bench's own).
    pub(crate) fn start_with_env(
        bin_dir: &Path,
        binary: &str,
        label: &str,
        args: &[String],
        log_dir: &Path,
        env: &[(&str, &str)],
    ) -> Result<Self, BenchError> {
        let path: PathBuf = bin_dir.join(binary);
        let log = std::fs::File::create(log_dir.join(format!("{label}.log")))?;
        let mut command = tokio::process::Command::new(&path);
        command
            .args(args)
            // Per-event info logs are the services' default; the bench keeps warnings only, as
            // a production deployment with a log pipeline would be tuned, and says so.
            .env("RUST_LOG", std::env::var("IDEMPOST_BENCH_SERVICE_LOG").unwrap_or_else(|_| "warn".into()))
            // Loopback only: the bench measures the pipeline, not token checks.
            .env("IDEMPOST_AUTH", "none")
            // It drives up to 64 concurrent callers at a 16-connection pool to measure queueing;
            // the default limit (the pool size) would shed them instead.
            .env("IDEMPOST_MAX_CONCURRENT_CALLS", "1024")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let process = Process::spawn(label, &mut command)
            .map_err(|e| BenchError::Stuck(format!("cannot start {}: {e}", path.display())))?;
        let pid = process.pid().ok_or_else(|| BenchError::Stuck(format!("{label} exited at once")))?;
        Ok(Self { process, pid })
    }

    /// CPU and peak memory so far; read before stopping the process.
    pub(crate) fn usage(&self) -> Usage {
        Usage::of(self.pid).unwrap_or_default()
    }

    /// Fails if the process has exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.process.try_exited()? {
            None => Ok(()),
            Some(status) => Err(BenchError::Stuck(format!(
                "{} exited ({status}); see its log in the output directory",
                self.process.label()
            ))),
        }
    }

    /// Reads the usage, then SIGKILL and reaps it: no handler runs, as in a crash.
    pub(crate) async fn kill(mut self) -> Usage {
        let usage = self.usage();
        self.process.kill().await;
        usage
    }

    /// Reads the usage, then SIGTERM and waits for the drain (SIGKILL after 20 s).
    pub(crate) async fn stop(mut self) -> Usage {
        let usage = self.usage();
        self.process.stop(Duration::from_secs(20)).await;
        usage
    }
}
