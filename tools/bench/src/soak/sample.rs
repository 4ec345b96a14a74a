//! One sample of the soak: the lags of the events created in a window, read back from the
//! timestamps the services store, and the state of the relay, the database and the machine.

use std::path::PathBuf;
use std::time::Instant;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbErr};

use super::server::{self, Cleanup, Sizes};
use super::{Stage, Window};
use crate::child::Service;
use crate::measure::Latencies;
use crate::phases::RelayPhases;
use crate::sql;

/// Publish and consume lags of the events created in a window, and how many were created and
/// how many not yet published.
#[derive(Debug, Default)]
pub(super) struct Lags {
    pub(super) publish: Latencies,
    pub(super) consume: Latencies,
    pub(super) events: u64,
    pub(super) unpublished: u64,
}

/// The lags of every event created in `[from, to)`, as of `now`: creation (the order service's
/// stamp, taken before its transaction) to the relay's `published_at` and to the consumer's
/// job. An event not yet published or consumed counts with its age, a lower bound of its lag,
/// so a stalled stage shows instead of vanishing from the percentiles.
pub(super) async fn lags(
    db: &DatabaseConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Lags, DbErr> {
    let backend = db.get_database_backend();
    let rows = db
        .query_all_raw(sql::statement(
            backend,
            "SELECT o.created_at, o.published_at, j.created_at FROM outbox_event o \
             LEFT JOIN notification_job j ON j.event_id = o.event_id \
             WHERE o.created_at >= ? AND o.created_at < ?",
            vec![from.into(), to.into()],
        ))
        .await?;
    let mut lags = Lags::default();
    for row in rows {
        let created = sql::time_at(&row, 0)?;
        let published = sql::time_at(&row, 1).ok();
        let consumed = sql::time_at(&row, 2).ok();
        let ms = |at: Option<DateTime<Utc>>| {
            (at.unwrap_or(now) - created).num_microseconds().unwrap_or(0) as f64 / 1000.0
        };
        lags.events += 1;
        lags.unpublished += u64::from(published.is_none());
        lags.publish.push_ms(ms(published));
        lags.consume.push_ms(ms(consumed));
    }
    Ok(lags)
}

/// What a sample compares with the one before it.
pub(super) struct Sampler {
    relay_log: PathBuf,
    logged: usize,
    services: [f64; 3],
    server: f64,
    machine: (u64, u64),
    server_pid: Option<u32>,
    taken: Instant,
}

impl Sampler {
    /// Starts counting from now.
    pub(super) fn new(relay_log: PathBuf, services: &[Service], server_pid: Option<u32>) -> Self {
        let mut sampler = Self {
            logged: RelayPhases::lines(&relay_log),
            relay_log,
            services: [0.0; 3],
            server: 0.0,
            machine: (0, 0),
            server_pid,
            taken: Instant::now(),
        };
        sampler.cpu(services);
        sampler
    }

    /// CPU in cores since the last call: each service, the server, the machine.
    fn cpu(&mut self, services: &[Service]) -> [f64; 5] {
        let seconds = self.taken.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
        self.taken = Instant::now();
        let mut out = [0.0; 5];
        for (i, service) in services.iter().take(3).enumerate() {
            let now = service.usage().cpu_seconds;
            out[i] = (now - self.services[i]) / seconds;
            self.services[i] = now;
        }
        let server = self.server_pid.map_or(0.0, server::cpu_seconds);
        out[3] = (server - self.server) / seconds;
        self.server = server;
        let machine = server::machine_ticks();
        let (busy, total) =
            (machine.0.saturating_sub(self.machine.0), machine.1.saturating_sub(self.machine.1));
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        out[4] = if total == 0 { 0.0 } else { busy as f64 / total as f64 * cores };
        self.machine = machine;
        out
    }

    /// One sample of the window `[from, to)`, `at` seconds into the load.
    pub(super) async fn take(
        &mut self,
        db: &DatabaseConnection,
        services: &[Service],
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        at: f64,
        stage: Stage,
    ) -> Result<(Window, Lags), DbErr> {
        let sampled_at = at + super::WINDOW.as_secs_f64();
        let mut lags = lags(db, from, to, Utc::now()).await?;
        let relay = RelayPhases::from_log_after(&self.relay_log, self.logged);
        self.logged = RelayPhases::lines(&self.relay_log);
        let backlog = sql::count(db, "SELECT COUNT(*) FROM outbox_event WHERE status <> 'PUBLISHED'").await?;
        let oldest = idempost::db::cleanup::oldest_transaction_age(db).await?;
        let window = Window {
            at,
            sampled_at,
            stage: Some(stage),
            events: lags.events,
            unpublished: lags.unpublished,
            publish: lags.publish.summary(),
            consume: lags.consume.summary(),
            claim: relay.claim,
            mark: relay.record,
            batches: relay.batches,
            backlog,
            cleanup: Cleanup::read(db).await?,
            sizes: Sizes::read(db).await?,
            oldest_transaction: oldest.as_secs_f64(),
            cpu: self.cpu(services),
            load: crate::observe::load_average(),
        };
        Ok((window, lags))
    }
}
