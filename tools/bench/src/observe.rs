//! What the database server saw during a phase: row-lock waits and busy connections.

use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio::sync::watch;

use crate::sql::{self, LockCounters};

/// Lock waits and connection use of one phase.
#[derive(Debug, Clone, Default)]
pub(crate) struct Waits {
    pub(crate) phase: String,
    /// `Innodb_row_lock_waits` delta (PostgreSQL: deadlocks).
    pub(crate) row_lock_waits: i64,
    /// `Innodb_row_lock_time` delta, ms.
    pub(crate) row_lock_ms: i64,
    /// Most connections to the bench database at one sample.
    pub(crate) peak_connections: i64,
    /// Most of them running a statement at one sample.
    pub(crate) peak_busy: i64,
    /// Mean of them running a statement.
    pub(crate) mean_busy: f64,
    /// Most waiting for a lock at one sample.
    pub(crate) peak_lock_waiting: i64,
    /// `/proc/loadavg` (1 min) when the phase started.
    pub(crate) load_at_start: f64,
}

/// Samples the server every 250 ms until dropped through [`Observer::finish`].
#[derive(Debug)]
pub(crate) struct Observer {
    phase: String,
    before: LockCounters,
    load: f64,
    stop: watch::Sender<bool>,
    sampler: tokio::task::JoinHandle<(i64, i64, f64, i64)>,
    db: DatabaseConnection,
    name: String,
}

impl Observer {
    pub(crate) async fn start(db: &DatabaseConnection, name: &str, phase: &str) -> Self {
        let before = LockCounters::read(db, name).await.unwrap_or_default();
        let (stop, mut stopped) = watch::channel(false);
        let (sampling, database) = (db.clone(), name.to_owned());
        let sampler = tokio::spawn(async move {
            let (mut peak, mut peak_busy, mut busy_sum, mut samples, mut peak_lock) = (0, 0, 0i64, 0i64, 0);
            loop {
                if let Ok((all, busy, locked)) = sql::connections(&sampling, &database).await {
                    peak = peak.max(all);
                    peak_busy = peak_busy.max(busy);
                    peak_lock = peak_lock.max(locked);
                    busy_sum += busy;
                    samples += 1;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = stopped.changed() => break,
                }
            }
            let mean = if samples == 0 { 0.0 } else { busy_sum as f64 / samples as f64 };
            (peak, peak_busy, mean, peak_lock)
        });
        Self {
            phase: phase.to_owned(),
            before,
            load: load_average(),
            stop,
            sampler,
            db: db.clone(),
            name: name.to_owned(),
        }
    }

    pub(crate) async fn finish(self) -> Waits {
        let _ = self.stop.send(true);
        let (peak_connections, peak_busy, mean_busy, peak_lock_waiting) =
            self.sampler.await.unwrap_or_default();
        let after = LockCounters::read(&self.db, &self.name).await.unwrap_or_default().since(self.before);
        Waits {
            phase: self.phase,
            row_lock_waits: after.waits,
            row_lock_ms: after.wait_ms,
            peak_connections,
            peak_busy,
            mean_busy,
            peak_lock_waiting,
            load_at_start: self.load,
        }
    }
}

/// The one-minute load average.
pub(crate) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}
