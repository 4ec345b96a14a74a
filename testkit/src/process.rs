//! Child processes started, signalled and reaped: real signals sent with `kill(2)` (through
//! `nix`), never by shelling out to `kill(1)`.

use std::process::ExitStatus;
use std::time::Duration;

pub use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// Sends `signal` to the process `pid`. Whether it was delivered (false once the process is
/// gone).
pub fn send(pid: u32, signal: Signal) -> bool {
    i32::try_from(pid).is_ok_and(|pid| nix::sys::signal::kill(Pid::from_raw(pid), signal).is_ok())
}

/// One running (or exited) child process, killed when dropped.
#[derive(Debug)]
pub struct Process {
    label: String,
    child: tokio::process::Child,
}

impl Process {
    /// Spawns `command` (killed on drop) and names it `label` in messages.
    pub fn spawn(label: &str, command: &mut tokio::process::Command) -> std::io::Result<Self> {
        let child = command.kill_on_drop(true).spawn()?;
        Ok(Self { label: label.to_owned(), child })
    }

    /// The name it was started under.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The OS process id, while it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends `signal`: a real signal, which the process's handlers see. Whether it was delivered.
    pub fn signal(&self, signal: Signal) -> bool {
        self.pid().is_some_and(|pid| send(pid, signal))
    }

    /// Its exit status if it has exited, without waiting.
    pub fn try_exited(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
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
        self.signal(Signal::SIGTERM);
        self.exited(timeout).await
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        if self.terminate(grace).await.is_none() {
            self.kill().await;
        }
    }
}

/// A child run outside any async runtime (a broker, a database server), SIGKILLed and reaped
/// when dropped or [`Guard::kill`]ed, so its port and files are free afterwards.
#[derive(Debug)]
pub struct Guard(Option<std::process::Child>);

impl Guard {
    /// Spawns `command`.
    pub fn spawn(command: &mut std::process::Command) -> std::io::Result<Self> {
        Ok(Self(Some(command.spawn()?)))
    }

    /// Whether it has not been killed yet.
    pub fn is_running(&self) -> bool {
        self.0.is_some()
    }

    /// Its process id while it runs (the bench reads its CPU time from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(std::process::Child::id)
    }

    /// SIGKILL, then waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}
